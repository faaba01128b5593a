"""The lab kit: santhrottle's QEMU lab and the kit its experiments measure with.

An installed package (vagrant/pyproject.toml), editable in the project's venv (`make
setup`) and in the lab's guest venv (labkit.images.guest_venv), so that the runner on
the host, the experiments in the guest and the tests import it by name.

On the host: the runner (`vagrant/qemu/lab.py` is labkit.cli)
    host        the lab's settings, the host packages, QEMU, the cache's lock
    images      what a guest boots: Debian's kernel, the initramfs, the guest venv,
                all cached (a public API other guest builders reuse)
    qemu        one boot: the disks, the shares, QEMU, the command's result; its limit
                stretched by the guest's own measure of its speed
    plant       the known plant (nbdkit + vagrant/qemu/lqarray.py): for a guest, or as
                a loop device of the host's own kernel; changed live from the guest
    cli         lab.py's subcommands

In the guest: what the experiments and the lab tests measure with
    topology, fabrics   the storage topology; the fleet lab's second fabric and etcd
    sampler     the one sampler: probes on a fixed period, no burst after a stall
    probes      what it reads (diskstats through the product's parser, ss, nstat, CPU)
    daemon      the daemon harness: configs through the product's schema, start, wait
                for status, talk, stop, clean up
    fio         every fio job; bursts: the paper's on/off schedule
    curves      the data path's throttle curves; autofit: the threshold = "auto" load
    speed       how much slower than an idle host the guest runs: time budgets

Pure
    analysis    windows, the LQ fit, a phase's summary
    regime      the plant slope and thresholds of the paper's regime; CI's threshold
    search      the best static delay's search on the ladder

Each module's header says what it owns.
"""
