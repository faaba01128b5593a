"""Target-host sensors: diskstats, LVM, LIO, nvmet, connected initiators."""
