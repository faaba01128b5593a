"""The Debian package on a host that runs systemd: installed, started, reloaded, killed,
stopped, removed and purged in the systemd guest (vagrant/qemu/systemd_guest.py).

One boot of a Debian 12 guest with systemd as PID 1 and no network runs
tests/systemd_guest/guest_package.py, which records what each step saw
(package.json); these tests judge it.  The package is dist-deb/'s (`make deb`; `make
test` builds it first).  The lab tier: QEMU/TCG, Debian's kernel; a host without QEMU
or Debian's kernel package skips with the reason.
"""

from __future__ import annotations

import re

import pytest

from .guest import booted

pytestmark = pytest.mark.lab

FAULT_REPS = 1  # guest_package.py's
KERNEL_OBJECTS = re.compile(r"santhrottle|SANTHROTTLE|htb|netem")


@pytest.fixture(scope="module")
def seen() -> dict:
    obs = booted("test_package_systemd")
    print(obs["boot"])
    print(f"steps (name, s): {obs.get('done')}")
    assert not obs.get("errors"), obs.get("errors")
    return obs


def _ok(cmd: dict) -> bool:
    return cmd["rc"] == 0


def _clean(kernel: dict) -> list[str]:
    """What of santhrottle the kernel still holds (the tools' lines naming it)."""
    return [line for text in kernel.values() for line in text.splitlines()
            if KERNEL_OBJECTS.search(line)]  # fmt: skip


def test_the_package_installs_offline_with_its_dependencies(seen):
    i = seen["install"]
    assert _ok(i["apt"]), i["apt"]["out"][-3000:] + i["apt"]["err"][-2000:]
    assert i["status"].startswith("install ok installed"), i["status"]
    # nothing came from the network (the guest has none): every package was in the cache
    # (apt's one "Get:" is the local file's, "Get:1 /path/santhrottle_*.deb")
    assert not re.search(r"^(Get|Err):\d+ (?!/)", i["apt"]["out"], re.M), i["apt"]["out"][-3000:]
    assert "/etc/santhrottle/santhrottle.toml" in i["conffiles"]
    assert "/lib/systemd/system/santhrottled.service" in i["files"]
    # installed, not enabled, not started: it needs a configuration first
    assert (i["enabled"], i["active"]) == ("disabled", "inactive")
    assert _ok(i["verify"]) and "santhrottled" not in i["verify"]["err"], i["verify"]
    # the installed daemon's tick is the compiled one
    assert i["tick_from"].endswith(".so") and "/usr/lib/python3/dist-packages/" in i["tick_from"]
    assert i["man"].startswith("/usr/share/man/man8/santhrottled.8")
    # systemctl show quotes each entry of Documentation=
    assert [d.strip('"') for d in i["help"].split()] == [
        "man:santhrottled(8)", "man:santhrottle(8)", "man:santhrottle.toml(5)"]  # fmt: skip


def test_systemctl_enable_now_starts_the_daemon(seen):
    st = seen["start"]
    assert _ok(st["check"]), st["check"]
    assert _ok(st["enable"]) and st["active"] and st["enabled"] == "enabled", st["enable"]
    assert st["up_s"] is not None and st["threshold_s"] == 0.015
    assert _ok(st["pin"]) and st["pin_in_kernel_s"] is not None, st["pin"]


def test_reload_applies_a_good_file_and_fails_on_a_refused_one(seen):
    r = seen["reload"]
    assert _ok(r["good"]) and r["good_same_pid"] and r["good_seen_s"] is not None, r["good"]
    # a broken file and an empty one: systemctl reload fails, the daemon runs on with
    # the last good configuration
    for refused in (r["broken"], r["empty"]):
        assert refused["reload"]["rc"] not in (0, None), refused["reload"]
        assert refused["same_pid"] and refused["active"] and refused["threshold_s"] == 0.02
        assert "santhrottle.toml" in refused["reload"]["err"] + refused["journal"]
    assert r["after"]["threshold_s"] == 0.02 and r["after"]["pin"]


def _restarted(k: dict) -> None:
    assert k["back_s"] is not None and k["new_pid"] not in (0, k["old_pid"]), k
    assert k["pin_in_kernel_s"] is not None, k


def test_kill_9_is_restarted_with_its_pins(seen):
    k = seen["kill"]
    _restarted(k)
    assert k["restarts"] == 1
    assert k["pins"] == ["10.77.7.7"], k["pins"]


def test_the_fault_rows_under_systemd(seen):
    rows = seen["faults"]
    assert [len(rows[r]) for r in ("kill", "restart", "reload_broken")] == [FAULT_REPS] * 3
    for k in rows["kill"]:
        _restarted(k)
    for r in rows["restart"]:
        assert _ok(r["restart"]), r["restart"]
        _restarted(r)
    for r in rows["reload_broken"]:
        assert r["reload"]["rc"] not in (0, None) and r["same_pid"] and r["active"]
        assert r["threshold_s"] == 0.02
    # one data path all along: one root qdisc, one chain, whatever the restarts
    for k in rows["kill"] + rows["restart"]:
        assert k["kernel"]["tc"].count("qdisc htb") == 1, k["kernel"]["tc"]


def test_the_journal_has_the_audit_trail_with_its_fields(seen):
    """journalctl -u santhrottled: the daemon's lines as journal entries (python3-systemd,
    which the package recommends), the audit trail's records with their SANTHROTTLE_*
    fields: the pin (who, what, done), the refused reload, the pinned initiator's class."""
    j = seen["journal"]
    assert j["entries"] > 0
    for field in ("MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER", "_SYSTEMD_UNIT", "_PID",
                  "SANTHROTTLE_EVENT", "SANTHROTTLE_COMMAND", "SANTHROTTLE_UID"):  # fmt: skip
        assert field in j["fields"], sorted(j["fields"])
    audit = [e for e in j["daemon"] if "SANTHROTTLE_EVENT" in e]
    pins = [e for e in audit if e.get("SANTHROTTLE_COMMAND") == "pin"]
    assert any(e.get("SANTHROTTLE_INITIATOR") == "10.77.7.7" and e.get("SANTHROTTLE_UID") == "0"
               and e.get("SANTHROTTLE_RESULT") == "done" for e in pins), pins  # fmt: skip
    reloads = [e for e in audit if e.get("SANTHROTTLE_COMMAND") == "reload"]
    assert any(e.get("SANTHROTTLE_RESULT") == "refused" for e in reloads), reloads
    assert any(e.get("SANTHROTTLE_RESULT") == "done" for e in reloads), reloads
    classes = [e for e in audit if e.get("SANTHROTTLE_EVENT") == "class"]
    assert any(e.get("SANTHROTTLE_INITIATOR") == "10.77.7.7" for e in classes), classes


def test_stop_leaves_nothing_in_the_kernel(seen):
    st = seen["stop"]
    how = (st.get("result"), st.get("journal"))  # how the daemon ended, what it said
    assert _ok(st["stop"]) and st["active"] == "inactive" and not st["processes"].strip(), how
    assert _clean(st["kernel"]) == [], how


def test_remove_then_purge_leave_nothing_behind(seen):
    rm = seen["remove"]
    assert _ok(rm["apt"]), rm["apt"]["out"][-3000:]
    assert rm["status"].startswith("deinstall ok config-files"), rm["status"]
    assert not rm["processes"].strip() and rm["unit"] != 0
    assert _clean(rm["kernel"]) == []
    # the conffile stays until purge (and the runtime state the unit kept)
    assert set(rm["left"]) <= {"/etc/santhrottle/santhrottle.toml", "/var/lib/santhrottle"}
    assert "/etc/santhrottle/santhrottle.toml" in rm["left"]
    pg = seen["purge"]
    assert _ok(pg["apt"]), pg["apt"]["out"][-3000:]
    assert pg["status"]["rc"] != 0 or "not-installed" in pg["status"]["out"]
    assert pg["left"] == [] and "santhrottled" not in pg["unit_files"]
    assert _clean(pg["kernel"]) == []
