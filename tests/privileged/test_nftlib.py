"""datapath/nftlib.py on the host kernel: libnftables in the process does what `nft` does,
in the namespace it was made for and nowhere else; a refused command is one line."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from santhrottle.appliance.datapath import nftlib
from santhrottle.appliance.datapath.names import DatapathError

pytestmark = pytest.mark.privileged

TABLE = "table bridge stnftlib { map m { typeof ip daddr : meta priority; }; }"


def _nft(ns: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "nft", *args], capture_output=True, text=True, timeout=30
    )


@pytest.fixture
def ns():
    if not shutil.which("nft"):
        pytest.skip("no nft (nftables) on this host")
    name = f"stnl-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_the_library_changes_the_namespace_it_was_made_for_as_nft_does(ns):
    lib = nftlib.load(f"/run/netns/{ns}")
    if lib is None:
        pytest.skip(f"{nftlib.SONAME} cannot be loaded here")
    assert lib.run(TABLE) == ""
    lib.run("add element bridge stnftlib m { 10.0.0.3 : 5374:20 }")
    lib.run(
        "delete element bridge stnftlib m { 10.0.0.3 }\n"
        "add element bridge stnftlib m { 10.0.0.3 : 5374:21 }"
    )
    assert (
        "stnftlib"
        not in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    ), "nothing in our own namespace"
    for args, json_out in (
        (("list", "ruleset", "bridge"), False),
        (("-j", "list", "ruleset", "bridge"), True),
    ):
        by_nft = _nft(ns, *args)
        assert by_nft.returncode == 0, by_nft.stderr
        assert lib.run("list ruleset bridge", json_out=json_out) == by_nft.stdout
    assert "10.0.0.3 : 5374:21" in _nft(ns, "list", "table", "bridge", "stnftlib").stdout


def test_a_refused_transaction_is_one_line_and_changes_nothing(ns):
    lib = nftlib.load(f"/run/netns/{ns}")
    if lib is None:
        pytest.skip(f"{nftlib.SONAME} cannot be loaded here")
    lib.run(TABLE)
    with pytest.raises(DatapathError) as e:  # the second line names a table that is not there
        lib.run(
            "add element bridge stnftlib m { 10.0.0.3 : 5374:20 }\n"
            "add element bridge nosuch m { 10.0.0.4 : 5374:20 }"
        )
    msg = str(e.value)
    assert msg.startswith("nft -f failed: ") and "\n" not in msg
    assert "10.0.0.3" not in _nft(ns, "list", "table", "bridge", "stnftlib").stdout, (
        "all or nothing"
    )


def test_a_namespace_keeps_its_context_and_one_made_again_gets_its_own(ns):
    path = f"/run/netns/{ns}"
    lib = nftlib.load(path)
    if lib is None:
        pytest.skip(f"{nftlib.SONAME} cannot be loaded here")
    assert nftlib.load(path) is lib, "made once per namespace"
    lib.run(TABLE)
    del lib
    subprocess.run(["ip", "netns", "del", ns], check=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    again = nftlib.load(path)
    assert again is not None
    again.run(TABLE)  # into the new namespace, where the table is not yet
    again.run("add element bridge stnftlib m { 10.0.0.9 : 5374:2 }")
    assert "10.0.0.9" in _nft(ns, "list", "table", "bridge", "stnftlib").stdout
