#!/usr/bin/env python3
"""The wire sensor's corpus: real iSCSI and NVMe/TCP captures made in the lab. In the guest.

    python3 vagrant/qemu/lab.py run --timeout 3600 vagrant/experiments/wire_corpus.py \\
        --out /shared/work/wire-corpus [--only iscsi-digests,nvme-plain]
    make lab-wire-corpus           # the same, written to tests/fixtures/wire/corpus/

The topology without the bridge (topology.py: initiators in the initial
namespace, LIO and nvmet in netns tgt, on the unthrottled disk), and per case
tcpdump on the target's veth (the array side: what a bridge's array-side port
sees), whole frames, TCP 3260 and 4420 and ESP, while the real initiators
(open-iscsi, nvme-cli) log in, fio reads and writes, and they log out.  Every
capture starts before the TCP handshake of its sessions, so it holds their
logins and connects; the tests cut it anywhere to start mid-session.

Cases (CASES): open-iscsi with HeaderDigest and DataDigest CRC32C on, one of
them, and off; ImmediateData and InitialR2T in their four combinations; a small
MaxRecvDataSegmentLength on both sides (many Data-In and Data-Out PDUs per
command); several sessions, one target with two LUNs, a SendTargets discovery
(Text PDUs), NOP-Out pings every second, a session that logs out and in again;
nvme-cli NVMe/TCP with two I/O queues (three TCP connections), with and without
header and data digests, a host that disconnects and connects again, one with SQ flow
control off (the target completes reads with a C2HData's SUCCESS flag);
read-heavy and write-heavy fio mixes; and "unmeasurable": a TLS connection on
port 4420 (openssl), an HTTP transfer on port 3260, and an iSCSI session inside
IPsec ESP (ip xfrm, transport mode), beside a plain iSCSI reader.

The LVs are filled first with fio's partly compressible buffers (random bytes
in 1/10 of each block), so reads carry data that is not all zeros, and the
writes likewise: payload that holds byte patterns, while the gzipped captures
stay small.  Each capture is gzipped (mtime 0) to OUT/wire-<case>.pcap.gz with
OUT/wire-<case>.json: what fio did and what was configured.

Then, with --out in the checkout's tests/fixtures/wire/corpus (make lab-wire-corpus),
the in-kernel sensor on this guest's Debian kernel: tests/privileged/test_bridge_kernel.py
and test_bridge_corpus.py (the program loads and gives the Python tracker's counts on
each new capture), their outcome in OUT/corpus.json's "kernel_check" and the log beside
it (--no-kernel-check: not).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from labkit import topology as topo
from labkit.topology import NETNS, sh

HERE = Path(__file__).resolve().parent
DEVICE = topo.VETH_TGT  # the target's veth end facing the initiators

FILTER = "tcp port 3260 or tcp port 4420 or esp"
SECONDS = 3.0
# Random bytes in a twentieth of each buffer (fio --buffer_compress_percentage=95): data
# with byte patterns in it, and captures that gzip to a few hundred KB each.
COMPRESSIBLE = (
    "--buffer_compress_percentage=95",
    "--buffer_compress_chunk=512",
    "--refill_buffers",
)
EXTRA_ADDR = "10.0.0.51"  # in the target's namespace: the unmeasurable servers
EXTRA_INI = "10.0.0.50"  # in the initiators': their clients

# iSCSI defaults of open-iscsi and LIO, as each case starts (restored after it)
ISCSI_DEFAULTS = {
    "node.conn[0].iscsi.HeaderDigest": "None",
    "node.conn[0].iscsi.DataDigest": "None",
    "node.session.iscsi.ImmediateData": "Yes",
    "node.session.iscsi.InitialR2T": "No",
    "node.conn[0].iscsi.MaxRecvDataSegmentLength": "262144",
    "node.conn[0].timeo.noop_out_interval": "5",
}
LIO_DEFAULTS = {
    "InitialR2T": "Yes",
    "ImmediateData": "Yes",
    "MaxRecvDataSegmentLength": "8192",
    "MaxXmitDataSegmentLength": "262144",
}


def job(kind: str, index: int, options: str) -> tuple[str, int, list[str]]:
    """A case's fio job: the kind of export, the index of its session or host, and fio's
    options (space-separated)."""
    return kind, index, options.split()


# name -> what it configures and runs. iscsi: the sessions (indices into the topology's
# LUNs) and node settings; lio: TPG parameters; nvme: the hosts and connect options;
# jobs: (kind, index, fio job); relogin: log the first session (or host) out and in
# again halfway.
CASES: dict[str, dict] = {
    "iscsi-login-default": {
        "iscsi": [0, 1],
        "lun1": True,
        "discovery": True,
        "node": {"node.conn[0].timeo.noop_out_interval": "1"},
        "jobs": [
            job("iscsi", 0, "--rw=randread --bs=4k --iodepth=4 --rate_iops=150"),
            job("iscsi", 1, "--rw=randread --bs=8k --iodepth=1 --rate_iops=40"),
            job("iscsi", 2, "--rw=randwrite --bs=8k --iodepth=2 --rate_iops=30"),
        ],
        "relogin": True,
    },
    "iscsi-digests": {
        "iscsi": [0, 1],
        "node": {
            "node.conn[0].iscsi.HeaderDigest": "CRC32C",
            "node.conn[0].iscsi.DataDigest": "CRC32C",
        },
        "jobs": [
            job("iscsi", 0, "--rw=randread --bs=4k --iodepth=2 --rate_iops=120"),
            job("iscsi", 1, "--rw=randrw --rwmixread=50 --bs=8k --iodepth=2 --rate_iops=60"),
        ],
    },
    "iscsi-header-digest": {
        "iscsi": [0],
        "node": {
            "node.conn[0].iscsi.HeaderDigest": "CRC32C",
            "node.session.iscsi.ImmediateData": "No",
        },
        "jobs": [
            job("iscsi", 0, "--rw=randrw --rwmixread=70 --bs=4k --iodepth=4 --rate_iops=200"),
        ],
    },
    "iscsi-r2t": {  # ImmediateData=No, InitialR2T=Yes: every write waits for an R2T
        "iscsi": [0, 1],
        "node": {"node.session.iscsi.ImmediateData": "No"},
        "jobs": [
            job("iscsi", 0, "--rw=randread --bs=4k --iodepth=1 --rate_iops=150"),
            job("iscsi", 1, "--rw=randwrite --bs=16k --iodepth=4 --rate_iops=60"),
        ],
    },
    "iscsi-immediate": {  # ImmediateData=Yes, InitialR2T=No: immediate and unsolicited data
        "iscsi": [0, 1],
        "lio": {"InitialR2T": "No"},
        "jobs": [
            job("iscsi", 0, "--rw=randread --bs=4k --iodepth=2 --rate_iops=150"),
            job("iscsi", 1, "--rw=randwrite --bs=16k --iodepth=2 --rate_iops=50"),
        ],
    },
    "iscsi-unsolicited": {  # ImmediateData=No, InitialR2T=No: unsolicited Data-Out only
        "iscsi": [0, 1],
        "lio": {"InitialR2T": "No"},
        "node": {"node.session.iscsi.ImmediateData": "No"},
        "jobs": [
            job("iscsi", 0, "--rw=randread --bs=4k --iodepth=2 --rate_iops=150"),
            job("iscsi", 1, "--rw=randwrite --bs=16k --iodepth=2 --rate_iops=50"),
        ],
    },
    "iscsi-small-segments": {  # MaxRecvDataSegmentLength 4096 both ways
        "iscsi": [0, 1],
        "lio": {"MaxRecvDataSegmentLength": "4096", "MaxXmitDataSegmentLength": "4096"},
        "node": {"node.conn[0].iscsi.MaxRecvDataSegmentLength": "4096"},
        "jobs": [
            job("iscsi", 0, "--rw=randread --bs=16k --iodepth=2 --rate_iops=60"),
            job("iscsi", 1, "--rw=randrw --rwmixread=30 --bs=16k --iodepth=2 --rate_iops=60"),
        ],
    },
    "nvme-plain": {
        "nvme": [0, 1],
        "queues": 2,
        "jobs": [
            job("nvme", 0, "--rw=randread --bs=4k --iodepth=4 --rate_iops=200"),
            job("nvme", 1, "--rw=randwrite --bs=16k --iodepth=2 --rate_iops=60"),
        ],
        "relogin": True,
    },
    "nvme-digests": {
        "nvme": [0, 1],
        "queues": 2,
        "connect": ["--hdr-digest", "--data-digest"],
        "jobs": [
            job("nvme", 0, "--rw=randrw --rwmixread=60 --bs=8k --iodepth=4 --rate_iops=150"),
            job("nvme", 1, "--rw=randwrite --bs=16k --iodepth=2 --rate_iops=40"),
        ],
    },
    "nvme-sqflow-off": {  # SQ flow control off: reads complete at a C2HData with SUCCESS
        "nvme": [0],
        "queues": 1,
        "connect": ["--disable-sqflow"],
        "jobs": [
            job("nvme", 0, "--rw=randrw --rwmixread=70 --bs=4k --iodepth=4 --rate_iops=200"),
        ],
    },
    "unmeasurable": {
        "iscsi": [0],
        "tls": True,
        "http": True,
        "ipsec": 1,
        "jobs": [
            job("iscsi", 0, "--rw=randread --bs=4k --iodepth=1 --rate_iops=100"),
            job("iscsi", 1, "--rw=randread --bs=4k --iodepth=1 --rate_iops=100"),
        ],
    },
}


# ------------------------------------------------------------------ target side
def lio_set(t: dict, params: dict[str, str]) -> None:
    """TPG parameters of every target (configfs: not in a network namespace); they apply
    to the logins that follow."""
    from rtslib_fb import TPG, FabricModule, Target

    iscsi = FabricModule("iscsi")
    for x in t["iscsi"]:
        tpg = TPG(Target(iscsi, x["iqn"], mode="lookup"), 1, mode="lookup")
        for k, v in params.items():
            tpg.set_parameter(k, v)


def _first_tpg(t: dict):
    """Target 0's TPG 1 (rtslib's)."""
    from rtslib_fb import TPG, FabricModule, Target

    target = Target(FabricModule("iscsi"), t["iscsi"][0]["iqn"], mode="lookup")
    return TPG(target, 1, mode="lookup")


def lio_second_lun(t: dict) -> None:
    """Target 0 gets LUN 1 too: a 64 MiB ramdisk backstore."""
    from rtslib_fb import LUN, RDMCPStorageObject

    tpg = _first_tpg(t)
    if not any(lun.lun == 1 for lun in tpg.luns):
        LUN(tpg, 1, RDMCPStorageObject("wire_rd1", size=64 << 20))


def lio_drop_second_lun(t: dict) -> None:
    from rtslib_fb import RDMCPStorageObject

    tpg = _first_tpg(t)
    for lun in list(tpg.luns):
        if lun.lun == 1:
            lun.delete()
    with contextlib.suppress(Exception):  # rtslib: RTSLibError when absent
        RDMCPStorageObject("wire_rd1", mode="lookup").delete()


# --------------------------------------------------------------- initiator side
def iscsiadm_node(x: dict) -> list[str]:
    """iscsiadm's node mode on initiator x's target, portal and iface."""
    return ["iscsiadm", "-m", "node", "-T", x["iqn"], "-p", f"{x['portal']}:3260", "-I", x["iface"]]


def node_set(x: dict, settings: dict[str, str]) -> None:
    for k, v in settings.items():
        sh([*iscsiadm_node(x), "-o", "update", "-n", k, "-v", v])


def iscsi_devices(x: dict) -> list[str]:
    for s in topo.iscsi_sessions():
        if s["targetname"] == x["iqn"] and s["devices"]:
            return s["devices"]
    return []


def iscsi_login(x: dict, luns: int = 1) -> list[str]:
    sh([*iscsiadm_node(x), "-l"])
    deadline = time.monotonic() + topo.DEVICE_WAIT_S
    while len(devs := iscsi_devices(x)) < luns:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no block device after the login to {x['iqn']}")
        time.sleep(0.1)
    return devs


def iscsi_logout(x: dict) -> None:
    sh([*iscsiadm_node(x), "-u"], check=False)


def nvme_connect(n: dict, queues: int, extra: list[str]) -> str:
    sh(
        [
            *("nvme", "connect", "-t", "tcp", "-a", n["traddr"], "-s", "4420", "-n", n["nqn"]),
            *("--hostnqn", n["hostnqn"], "--hostid", n["hostid"]),
            *("--host-traddr", n["host_traddr"], "--nr-io-queues", str(queues), *extra),
        ]
    )
    deadline = time.monotonic() + topo.DEVICE_WAIT_S
    while not (dev := topo.nvme_block_device(n["nqn"])):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no NVMe block device for {n['nqn']}")
        time.sleep(0.1)
    return dev


def nvme_disconnect(n: dict) -> None:
    sh(["nvme", "disconnect", "-n", n["nqn"]], check=False)


def fio(dev: str, job: list[str], seconds: float) -> subprocess.Popen:
    return subprocess.Popen(
        [
            *("fio", "--output-format=json", "--name=j", f"--filename={dev}", "--direct=1"),
            *("--ioengine=libaio", "--time_based", f"--runtime={seconds:.1f}", "--size=64m"),
            *COMPRESSIBLE,
            *job,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd="/tmp",
    )


def fio_result(p: subprocess.Popen) -> dict:
    out, _ = p.communicate(timeout=600)
    try:
        job = json.loads(out[out.index("{") :])["jobs"][0]
    except (ValueError, KeyError, IndexError):
        return {"error": "no fio output"}
    return {
        "reads": job["read"]["total_ios"],
        "writes": job["write"]["total_ios"],
        "error": job["error"],
    }


def prefill(t: dict) -> None:
    """Every LV written once with partly random buffers (before any export is used)."""
    for x in t["iscsi"] + t["nvme"]:
        fill = ["--rw=write", "--bs=1m", "--size=64m", "--ioengine=libaio", *COMPRESSIBLE]
        sh(["fio", "--name=fill", f"--filename={x['lv_path']}", "--direct=1", *fill], timeout=600)


# ------------------------------------------------------------------ unmeasurable
def in_tgt(*cmd: str) -> list[str]:
    return ["ip", "netns", "exec", NETNS, *cmd]


@contextlib.contextmanager
def extra_addresses():
    """EXTRA_ADDR on the target's veth, EXTRA_INI on the initiators', routed to each other."""
    sh(in_tgt("ip", "addr", "add", f"{EXTRA_ADDR}/32", "dev", DEVICE))
    sh(["ip", "addr", "add", f"{EXTRA_INI}/32", "dev", topo.VETH_INI])
    sh(in_tgt("ip", "route", "add", f"{EXTRA_INI}/32", "dev", DEVICE))
    sh(["ip", "route", "add", f"{EXTRA_ADDR}/32", "dev", topo.VETH_INI, "src", EXTRA_INI])
    try:
        yield
    finally:
        sh(["ip", "route", "del", f"{EXTRA_ADDR}/32"], check=False)
        sh(in_tgt("ip", "route", "del", f"{EXTRA_INI}/32"), check=False)
        sh(["ip", "addr", "del", f"{EXTRA_INI}/32", "dev", topo.VETH_INI], check=False)
        sh(in_tgt("ip", "addr", "del", f"{EXTRA_ADDR}/32", "dev", DEVICE), check=False)


def tls_session(work: Path, seconds: float) -> list[subprocess.Popen]:
    """openssl s_server on EXTRA_ADDR:4420 and an s_client sending 2 MB through it."""
    key, crt = work / "tls.key", work / "tls.crt"
    sh(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes"),
            *("-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=wire-corpus"),
        ]
    )
    server = _quiet(
        [
            *in_tgt("openssl", "s_server", "-accept", f"{EXTRA_ADDR}:4420"),
            *("-cert", str(crt), "-key", str(key), "-quiet"),
        ]
    )
    time.sleep(1.0)
    blob = work / "tls.blob"
    blob.write_bytes(os.urandom(1 << 20) * 2)
    pipe = f"(cat {blob}; sleep {seconds:.0f}) | openssl s_client -connect {EXTRA_ADDR}:4420 -quiet"
    client = _quiet(["sh", "-c", pipe])
    return [client, server]


def _quiet(cmd: list[str]) -> subprocess.Popen:
    """cmd started, its output discarded."""
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def http_transfer(work: Path) -> list[subprocess.Popen]:
    """An HTTP server on EXTRA_ADDR:3260 and a client fetching 1 MB from it."""
    root = work / "http"
    root.mkdir(exist_ok=True)
    (root / "blob").write_bytes(os.urandom(1 << 20))
    server = _quiet(
        [
            *in_tgt(sys.executable, "-m", "http.server", "--bind", EXTRA_ADDR),
            *("--directory", str(root), "3260"),
        ]
    )
    time.sleep(1.0)
    url = f"http://{EXTRA_ADDR}:3260/blob"
    fetch = f"import urllib.request,sys; urllib.request.urlopen({url!r}).read()"
    client = _quiet([sys.executable, "-c", fetch])
    return [client, server]


def ipsec(x: dict) -> None:
    """ESP in transport mode between initiator x and its portal (static keys, both ends)."""
    ini, tgt = x["initiator_ip"], x["portal"]
    for mod in ("esp4", "xfrm_user", "authenc"):
        sh(["modprobe", mod])
    enc = "0x" + "11" * 16
    auth = "0x" + "22" * 32
    for pre in ([], ["ip", "netns", "exec", NETNS]):
        for src, dst, spi in ((ini, tgt, "0x5301"), (tgt, ini, "0x5302")):
            sa = ["proto", "esp", "spi", spi, "reqid", "1", "mode", "transport"]
            keys = ["enc", "cbc(aes)", enc, "auth", "hmac(sha256)", auth]
            sh([*pre, "ip", "xfrm", "state", "add", "src", src, "dst", dst, *sa, *keys])
    # each end: its way out and its way in through the SA pair
    for pre, out_, in_ in (([], (ini, tgt), (tgt, ini)), (in_tgt(), (tgt, ini), (ini, tgt))):
        for (src, dst), way in ((out_, "out"), (in_, "in")):
            sa = ["src", src, "dst", dst, "proto", "esp", "reqid", "1", "mode", "transport"]
            sh(
                [
                    *pre,
                    "ip",
                    "xfrm",
                    "policy",
                    "add",
                    "src",
                    src,
                    "dst",
                    dst,
                    "dir",
                    way,
                    "tmpl",
                    *sa,
                ]
            )


def ipsec_off() -> None:
    for pre in ([], ["ip", "netns", "exec", NETNS]):
        sh([*pre, "ip", "xfrm", "policy", "flush"], check=False)
        sh([*pre, "ip", "xfrm", "state", "flush"], check=False)


# ----------------------------------------------------------------------- capture
def start_capture(pcap: Path) -> subprocess.Popen:
    p = subprocess.Popen(
        in_tgt("tcpdump", "-i", DEVICE, "-s", "0", "-U", "-w", str(pcap), FILTER),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = p.stderr.readline() if p.stderr else ""
    if "listening" not in line:
        p.kill()
        raise RuntimeError(f"tcpdump: {line.strip()}")
    return p


def stop_capture(p: subprocess.Popen) -> None:
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)  # our own child, by PID
    p.wait(timeout=30)


def run_case(name: str, case: dict, t: dict, out: Path, work: Path, seconds: float) -> dict:
    isc = [t["iscsi"][k] for k in case.get("iscsi", [])]
    nvm = [t["nvme"][k] for k in case.get("nvme", [])]
    ipsec_ini = t["iscsi"][case["ipsec"]] if "ipsec" in case else None
    info: dict = {"case": name, "config": {k: v for k, v in case.items() if k != "jobs"}}
    lio_set(t, {**LIO_DEFAULTS, **case.get("lio", {})})
    for x in t["iscsi"]:
        node_set(x, {**ISCSI_DEFAULTS, **case.get("node", {})})
    if case.get("lun1"):
        lio_second_lun(t)
    pcap = work / f"wire-{name}.pcap"
    helpers: list[subprocess.Popen] = []
    dump = start_capture(pcap)
    try:
        if case.get("discovery"):
            portal = ["-p", f"{isc[0]['portal']}:3260", "-I", isc[0]["iface"]]
            sh(["iscsiadm", "-m", "discovery", "-t", "st", *portal, "-o", "nonpersistent"])
        if ipsec_ini is not None:
            try:
                ipsec(ipsec_ini)
            except Exception as e:  # a kernel without ESP: the case goes on without it
                info["ipsec_error"] = str(e)
                ipsec_off()
                ipsec_ini = None
        devs: dict[str, list[str]] = {"iscsi": [], "nvme": []}
        for k, x in enumerate(isc + ([ipsec_ini] if ipsec_ini else [])):
            devs["iscsi"] += iscsi_login(x, 2 if case.get("lun1") and k == 0 else 1)
        for n in nvm:
            devs["nvme"].append(nvme_connect(n, case.get("queues", 1), case.get("connect", [])))
        if case.get("tls"):
            helpers += tls_session(work, seconds)
        if case.get("http"):
            helpers += http_transfer(work)
        jobs = [
            fio(devs[kind][k], job, seconds) for kind, k, job in case["jobs"] if k < len(devs[kind])
        ]
        info["fio"] = [fio_result(j) for j in jobs]
        if case.get("relogin"):  # the first session (or host) out and in again, and a read
            if isc:
                iscsi_logout(isc[0])
                dev = iscsi_login(isc[0], 2 if case.get("lun1") else 1)[0]
            else:
                nvme_disconnect(nvm[0])
                dev = nvme_connect(nvm[0], case.get("queues", 1), case.get("connect", []))
            job = ["--rw=randread", "--bs=4k", "--iodepth=2", "--rate_iops=100"]
            info["fio"].append(fio_result(fio(dev, job, seconds / 2)))
        for x in isc + ([ipsec_ini] if ipsec_ini else []):
            iscsi_logout(x)
        for n in nvm:
            nvme_disconnect(n)
    finally:
        stop_capture(dump)
        for h in helpers:  # our own children, by PID
            h.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                h.wait(timeout=5)
            if h.poll() is None:
                h.kill()
                h.wait()
        if ipsec_ini is not None:
            ipsec_off()
        for x in isc:
            iscsi_logout(x)
        if case.get("lun1"):
            lio_drop_second_lun(t)
    raw = pcap.read_bytes()
    (out / f"wire-{name}.pcap.gz").write_bytes(gzip.compress(raw, 9, mtime=0))
    pcap.unlink()
    info["pcap_bytes"] = len(raw)
    info["gz_bytes"] = (out / f"wire-{name}.pcap.gz").stat().st_size
    (out / f"wire-{name}.json").write_text(json.dumps(info, indent=1))
    print(
        f"{name}: {info['pcap_bytes']:,} B of frames, {info['gz_bytes']:,} B gzipped, "
        f"fio {info['fio']}",
        flush=True,
    )
    return info


CHECKOUT = HERE.parents[1]
KERNEL_TESTS = ("tests/privileged/test_bridge_kernel.py", "tests/privileged/test_bridge_corpus.py")


def kernel_check(out: Path) -> dict:
    """The wire sensor's kernel tests on this kernel (module header); never raises."""
    log = out / "kernel-check.log"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *KERNEL_TESTS]
    try:
        p = subprocess.run(
            cmd, cwd=CHECKOUT, capture_output=True, text=True, timeout=1800, check=False
        )
        log.write_text(p.stdout + p.stderr)
        tail = (p.stdout.strip().splitlines() or [""])[-1]
        return {"kernel": os.uname().release, "returncode": p.returncode, "summary": tail}
    except (OSError, subprocess.SubprocessError) as e:
        return {"kernel": os.uname().release, "error": str(e)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("/shared/work/wire-corpus"),
        help="where the gzipped captures and their notes go",
    )
    ap.add_argument(
        "--work",
        type=Path,
        default=Path("/shared/work/wire-corpus-work"),
        help="the raw captures and the helpers' files, while they are made",
    )
    ap.add_argument("--only", help="comma-separated cases (default: all)")
    ap.add_argument("--seconds", type=float, default=SECONDS)
    ap.add_argument("--no-kernel-check", action="store_true")
    a = ap.parse_args()
    names = a.only.split(",") if a.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    if topo.status() is not None:
        topo.down()
    t = topo.up(luns=3, nvme=2, disk="fast", lv_size_mib=96, login=False)
    done = {}
    try:
        prefill(t)
        with extra_addresses():
            for n in names:
                done[n] = run_case(n, CASES[n], t, a.out, a.work, a.seconds)
    finally:
        topo.down()
        (a.out / "corpus.json").write_text(json.dumps(done, indent=1))
    print(f"wrote {len(done)} captures to {a.out}", flush=True)
    if not a.no_kernel_check and a.out.resolve() == (CHECKOUT / "tests/fixtures/wire/corpus"):
        done["kernel_check"] = kernel_check(a.out)
        (a.out / "corpus.json").write_text(json.dumps(done, indent=1))
        print(f"kernel check: {done['kernel_check']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
