"""The lab kit: santhrottle's QEMU lab and the kit its experiments measure with.

An installed package (vagrant/pyproject.toml), editable in the project's venv (`make
setup`) and in the lab's guest venv (labkit.images.guest_venv), so that the runner on
the host, the experiments in the guest and the tests import it by name.

On the host, the runner (`vagrant/qemu/lab.py`, labkit.cli)
    images      what a guest boots: host packages, Debian's kernel, the initramfs,
                the guest venv, all cached (a public API other guest builders reuse)
    qemu        one boot: the disks, the shares, QEMU, the command's result
    plant       the known plant (nbdkit + vagrant/qemu/lqarray.py): for a guest, or
                as a loop device of the host's own kernel
    cli         lab.py's subcommands

The rooms are cut by job; each module's header says what it owns.
"""
