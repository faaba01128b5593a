"""The manual's sessions with the kernel are what the command line prints.

A block marked `<!-- replayed: kernel -->` (docs/operate.md: pin and unpin without the
daemon, datapath show, cleanup) is run as tests/unit/test_docs_sessions.py runs the
daemon's, here on the kernel: a scratch network namespace of its own (`stdoc-PID`,
printed as the examples' `stdoc`) with the device `eth1`, the data path applied in it
with pfifo leaves (this host's kernel may have no netem; the examples say so), the
commands in the page's order through the real command line.  SANTHROTTLE_DOCS_WRITE=1
writes the outputs.
"""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from santhrottle.appliance import datapath as dp
from tests.unit.docs_blocks import PAGES, commands
from tests.unit.test_docs_sessions import (
    READ,
    WRITE,
    _terminal,  # noqa: F401  (the fixture)
    _write,
    matches,
    run_main,
)

NETNS, DEVICE = "stdoc", "eth1"  # as the examples name them
SCRATCH = f"stdoc-{os.getpid()}"  # the namespace made here, for NETNS


def _kernel_sessions():
    for page in PAGES:
        cmds = [c for b in READ[page] if b.mark == "kernel" for c in commands(b)]
        if cmds:
            yield page, cmds


RUNS = list(_kernel_sessions())


@pytest.fixture
def stdoc():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    subprocess.run(["ip", "netns", "add", SCRATCH], check=True)
    try:
        subprocess.run(
            ["ip", "-n", SCRATCH, "link", "add", DEVICE, "type", "veth", "peer", "eth1p"],
            check=True,
        )
        subprocess.run(["ip", "-n", SCRATCH, "link", "set", DEVICE, "up"], check=True)
        with dp.Datapath(dp.DatapathSpec((DEVICE,), leaf="pfifo"), netns=SCRATCH) as d:
            d.apply()
        yield SCRATCH
    finally:
        subprocess.run(["ip", "netns", "del", SCRATCH], check=False)


def test_the_manual_has_a_kernel_session():
    assert RUNS


@pytest.mark.parametrize("page,cmds", RUNS, ids=[p.name for p, _c in RUNS])
def test_a_kernel_session_prints_what_the_manual_shows(page, cmds, stdoc, _terminal):  # noqa: F811
    wrong, writes = [], []
    for c in cmds:
        argv = [SCRATCH if a == NETNS else a for a in shlex.split(c.argv)]
        assert argv[0] == "santhrottle" and SCRATCH in argv, c.argv
        got = [ln.replace(SCRATCH, NETNS) for ln in run_main(argv[1:])]
        if not matches(c.output, got):
            wrong.append(f"{c.block.where(c.offset)}: $ {c.argv}\n" + "\n".join(got))
            if "..." not in c.output:
                writes.append((c, got))
    if WRITE and writes:
        _write(page, writes)
        pytest.skip(f"wrote {len(writes)} outputs into {page.name}: read them and commit")
    assert not wrong, "\n\n".join(wrong)
