"""The Debian package `make deb` built (dist-deb/), read back with Debian's tools.

- lintian's report (dist-deb/lintian.txt, written by `make deb`, which fails on an
  error) has no error;
- the package is current: its Python files are the checkout's;
- Depends names Debian 12 packages only, each known to apt here; the fleet's etcd
  client is a suggestion, not a dependency;
- its files are in the standard places: the unit (the project's own), the conffile
  (the example configuration, every key at its default), man pages, bash and zsh
  completions, the dashboard, the alerting rules; the controller's tick compiled;
- the alerting rules pass `promtool check rules` (from Debian's prometheus package,
  unpacked by `make promtool`).

The package installed and run under systemd is tests/systemd_guest/test_package_systemd.py's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from santhrottle.appliance.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
DEB_DIST = ROOT / "dist-deb"
sys.path.insert(0, str(ROOT / "buildsys"))
import compiled  # noqa: E402  (buildsys/compiled.py)

PY = "usr/lib/python3/dist-packages/santhrottle/"
SOURCES = {f"{PY}controller/": "controller/", f"{PY}appliance/": "appliance/",
           f"{PY}bridge/": "bridge/"}  # fmt: skip
# Where each shipped file goes (besides the Python package).
PLACES = {
    "lib/systemd/system/santhrottled.service": ROOT / "systemd" / "santhrottled.service",
    "usr/share/santhrottle/grafana/santhrottle.json": ROOT / "docs/grafana/santhrottle.json",
    "usr/share/santhrottle/prometheus/santhrottle-rules.yml": (
        ROOT / "docs/prometheus/santhrottle-rules.yml"
    ),
    "usr/share/doc/santhrottle/copyright": ROOT / "debian" / "copyright",
}
GENERATED = (
    "etc/santhrottle/santhrottle.toml",
    "usr/bin/santhrottle",
    "usr/bin/santhrottled",
    "usr/bin/santhrottle-simulate",
    "usr/share/man/man8/santhrottle.8.gz",
    "usr/share/man/man8/santhrottled.8.gz",
    "usr/share/man/man1/santhrottle-simulate.1.gz",
    "usr/share/man/man5/santhrottle.toml.5.gz",
    "usr/share/bash-completion/completions/santhrottle",
    "usr/share/bash-completion/completions/santhrottled",
    "usr/share/bash-completion/completions/santhrottle-simulate",
    "usr/share/zsh/vendor-completions/_santhrottle",
    "usr/share/zsh/vendor-completions/_santhrottled",
    "usr/share/zsh/vendor-completions/_santhrottle-simulate",
    "usr/share/santhrottle/santhrottle.toml.example",
)


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=300, check=False, **kw)  # fmt: skip


def _field(control: str, name: str) -> str:
    m = re.search(rf"^{name}: (.*(?:\n .*)*)", control, flags=re.M)
    return " ".join(m.group(1).split()) if m else ""


def _names(relation: str) -> list[str]:
    """Package names of a Depends-like field (alternatives included)."""
    return [re.split(r"[\s(:]", alt.strip())[0] for part in relation.split(",")
            for alt in part.split("|") if alt.strip()]  # fmt: skip


@pytest.fixture(scope="module")
def deb(tmp_path_factory) -> dict:
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed (dpkg)")
    debs = sorted(DEB_DIST.glob("santhrottle_*_*.deb"))
    if len(debs) != 1:
        pytest.fail(f"{DEB_DIST}: need one santhrottle_*.deb, found {debs}: run `make deb`")
    tree = tmp_path_factory.mktemp("deb")
    p = _run(["dpkg-deb", "-R", debs[0], tree])
    assert p.returncode == 0, p.stderr
    files = {str(f.relative_to(tree)): f for f in tree.rglob("*") if f.is_file()}
    return {"path": debs[0], "tree": tree, "files": files,
            "control": (tree / "DEBIAN" / "control").read_text()}  # fmt: skip


def test_lintian_reports_no_error():
    report = DEB_DIST / "lintian.txt"
    if not report.is_file():
        pytest.fail(f"{report} is missing: run `make deb`")
    text = report.read_text()
    assert not re.findall(r"^E: .*$", text, flags=re.M), text
    assert not re.findall(r"^W: .*$", text, flags=re.M), text


def test_the_package_is_the_checkouts(deb):
    stale = []
    for rel, f in deb["files"].items():
        for prefix, folder in SOURCES.items():
            if rel.startswith(prefix) and rel.endswith(".py"):
                src = ROOT / folder / rel[len(prefix) :]
                if not src.is_file() or src.read_bytes() != f.read_bytes():
                    stale.append(rel)
    assert not stale, f"{deb['path'].name} is older than the checkout ({stale[:3]}): make deb"
    shipped = {rel[len(PY) :] for rel in deb["files"] if rel.startswith(PY) and rel.endswith(".py")}
    for prefix, folder in SOURCES.items():
        for src in (ROOT / folder).rglob("*.py"):
            want = prefix[len(PY) :] + str(src.relative_to(ROOT / folder))
            assert want in shipped, f"{want} is not in {deb['path'].name}: make deb"


def test_depends_on_debian_12_packages_only(deb):
    control = deb["control"]
    assert _field(control, "Architecture") not in ("all", "")  # the compiled tick
    depends = _names(_field(control, "Depends"))
    assert {"python3-pyroute2", "python3-prometheus-client", "python3-rtslib-fb",
            "iproute2", "ipset", "iptables"} <= set(depends), depends  # fmt: skip
    assert "python3-etcd3gw" not in depends + _names(_field(control, "Recommends"))
    assert "python3-etcd3gw" in _names(_field(control, "Suggests"))
    if shutil.which("apt-cache") is None:
        pytest.skip("apt-cache is not installed")
    release = Path("/etc/debian_version")
    if not release.exists() or not release.read_text().startswith("12"):
        pytest.skip("not a Debian 12 host: the package's dependencies are bookworm's")
    for name in depends + _names(_field(control, "Recommends")):
        p = _run(["apt-cache", "show", "--no-all-versions", name])
        assert p.returncode == 0 and f"Package: {name}" in p.stdout, (name, p.stderr)
    # the versions the code is tested with are the ones Debian 12 has
    for name, floor in (("python3-pyroute2", "0.7.2"), ("python3-prometheus-client", "0.16")):
        assert f"{name} (>= {floor})" in _field(control, "Depends")


def test_files_are_in_the_standard_places(deb):
    files = deb["files"]
    for rel, src in PLACES.items():
        assert rel in files, rel
        assert files[rel].read_bytes() == src.read_bytes(), rel
    for rel in GENERATED:
        assert rel in files, rel
    assert (deb["tree"] / "DEBIAN" / "conffiles").read_text().split() == [
        "/etc/santhrottle/santhrottle.toml"
    ]
    conf = files["etc/santhrottle/santhrottle.toml"].read_text()
    assert parse_config(conf, "conffile") == parse_config("", "conffile")
    assert not [rel for rel in files if rel.startswith(("usr/local/", "usr/share/zsh/site-"))]
    # the tick compiled, mypyc's library inside the package
    for m in compiled.MODULES:
        assert any(re.fullmatch(rf"{PY}controller/{m}\.cpython-.*\.so", r) for r in files), m
    assert any(re.fullmatch(rf"{PY}controller__mypyc\.cpython-.*\.so", r) for r in files)
    # the unit is installed, not enabled (so not started: it needs a configuration
    # first), and an upgrade restarts it if it runs
    postinst = (deb["tree"] / "DEBIAN" / "postinst").read_text()
    assert "deb-systemd-helper --quiet was-enabled 'santhrottled.service'" in postinst
    assert re.search(r"_dh_action=restart\b", postinst), postinst


def test_the_source_package_carries_the_license(deb):
    (src,) = DEB_DIST.glob("santhrottle_*.tar.xz")
    with tarfile.open(src) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"LICENSE", "debian/copyright", "debian/control", "debian/rules"} <= names
    gpl = Path("/usr/share/common-licenses/GPL-2")
    if gpl.is_file():
        assert (ROOT / "LICENSE").read_bytes() == gpl.read_bytes()


def test_alerting_rules_pass_promtool():
    # `make promtool` unpacks it from Debian's prometheus package into build/tools
    promtool = shutil.which("promtool") or shutil.which("promtool", path=ROOT / "build/tools")
    if promtool is None:
        pytest.skip("promtool is not installed (make promtool: Debian's prometheus, unpacked)")
    rules = ROOT / "docs/prometheus/santhrottle-rules.yml"
    p = _run([promtool, "check", "rules", rules])
    assert p.returncode == 0, p.stdout + p.stderr
    count = rules.read_text().count("- alert: ")
    assert f"SUCCESS: {count} rules found" in p.stdout, p.stdout
