"""The `santhrottle` command line: main.py builds the parser; one module per
group of verbs (daemon.py, datapath.py, sensing.py, simulate.py)."""
