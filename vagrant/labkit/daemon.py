"""The daemon harness: santhrottled as an experiment runs it, its config through the schema.

What it owns
    config_text(tables)  a config as TOML from {table: {key: value}} ({"resources":
                         {"labvg": {"threshold": "10ms"}}} is [resources.labvg]),
                         checked by the product's own parser (santhrottle.appliance.
                         config: the schema's keys, kinds and cross-field rules)
                         before any daemon starts: a key the schema does not know,
                         or a bad value, is one ConfigError line naming it.
    Daemon               one santhrottled: write its file, start it as the systemd
                         unit does (its Nice=, or the experiment's; in a network
                         namespace with `ip netns exec` where asked), wait until its
                         control socket answers a status (its first discovery takes
                         longer than one request under a slow emulation), talk to it
                         (request, status, the sampler's status row, pin as an admin
                         would with the CLI), read its CPU, kill -9 it, stop it
                         (SIGTERM to our own child, by PID) and clean up after it
                         (`santhrottle cleanup`, or `--delays-only` as ExecStopPost).
    The control socket's client is the product's (santhrottle.appliance.daemon),
    imported here and nowhere else in the kit.

Worked example
    d = Daemon("10ms", target_config(t, SOCK, state, threshold="10ms"), out)
    d.start()          # out/santhrottle-10ms.toml, out/santhrottled-10ms.log
    d.status()["resources"][0]["delay_class"] -> 4
    d.stop()           # SIGTERM, then `santhrottle cleanup --config ...`
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labkit import speed

BIN = Path(sys.executable).parent
CHECKOUT = Path(__file__).resolve().parents[2]
UNIT = CHECKOUT / "systemd" / "santhrottled.service"
# The daemon answers once its first discovery is done; under emulation on a busy host
# that takes longer than one request's timeout.
FIRST_STATUS_S = 90.0
START_S = 90.0  # for the control socket to appear (bridge mode sets the bridge up first)
STOP_S = 60.0
REQUEST_S = 2.0
# What the sampler keeps of each status (status_row): the resources' state, the delayed
# initiators' classes and the counters the report reads.
RESOURCE_FIELDS = (
    "resource",
    "read_latency_ewma_s",
    "delay_class",
    "members",
    "mode",
    # the sensor's totals since the start (in bridge mode the wire's): a window's mean
    # read latency is the difference of read_time_s over that of reads_completed
    "reads_completed",
    "read_time_s",
    # the written bytes the controller saw in its last sample (the writers' rhythm, its
    # holds and the futile delay's test read them), and its futile delay's releases
    "write_bytes_per_second",
    "futile_releases",
    "futile_released_s",
)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    raise TypeError(f"no TOML for {v!r}")


def config_text(tables: dict[str, dict[str, Any]], path: str = "lab.toml") -> str:
    """TOML from {table: {key: value}}; a value that is a dict is a sub-table
    ([resources.NAME], [groups.NAME], [hosts.NAME]); None values are left out.  Checked
    by the product's parser: raises its ConfigError (one line) on anything it refuses."""
    from santhrottle.appliance.config import parse_config

    lines: list[str] = []
    for table, keys in tables.items():
        plain = {k: v for k, v in keys.items() if not isinstance(v, dict) and v is not None}
        subs = {k: v for k, v in keys.items() if isinstance(v, dict)}
        if plain or not subs:
            lines.append(f"[{table}]")
            lines += [f"{k} = {_toml(v)}" for k, v in plain.items()]
        for name, sub in subs.items():
            lines.append(f"[{table}.{name}]")
            lines += [f"{k} = {_toml(v)}" for k, v in sub.items() if v is not None]
    text = "\n".join(lines) + "\n"
    parse_config(text, path)
    return text


def target_config(
    t: dict, sock: str, state_dir: Path | None, threshold: str | None = None, **controller: Any
) -> dict:
    """santhrottled on the lab target's veth, metrics off; the VG declared with
    `threshold` (None: it only observes what it discovers); `controller`: the
    [controller] keys given (max_delay goes to [datapath]); state_dir None: the
    product's default."""
    max_delay = controller.pop("max_delay", None)
    conf: dict[str, dict] = {
        "daemon": {
            "control_socket": sock,
            "netns": t["netns"],
            "state_dir": None if state_dir is None else str(state_dir),
        },
        "datapath": {
            "devices": [t["veth"]["target"]],
            "max_delay": max_delay,
            "link_speed": "10gbit",
        },
        "metrics": {"port": 0},
    }
    if any(v is not None for v in controller.values()):
        conf["controller"] = controller
    if threshold:
        conf["resources"] = {t["vg"]: {"threshold": threshold}}
    return conf


def bridge_config(bridge: dict, sock: str, state_dir: Path, **datapath: Any) -> dict:
    """santhrottled in bridge mode on one of the lab's bridges (labkit.topology),
    metrics off; the caller adds resources, groups, hosts, fleet."""
    return {
        "daemon": {
            "mode": "bridge",
            "control_socket": sock,
            "netns": bridge["netns"],
            "state_dir": str(state_dir),
        },
        "bridge": {k: bridge[k] for k in ("name", "initiator_port", "array_port")},
        "datapath": {"link_speed": "10gbit", **datapath},
        "metrics": {"port": 0},
    }


def unit_nice(unit: Path = UNIT) -> int:
    """The Nice= of the systemd unit (0 without one)."""
    for line in unit.read_text().splitlines():
        if line.startswith("Nice="):
            return int(line.removeprefix("Nice="))
    return 0


def request(sock: str, cmd: str, timeout_s: float = REQUEST_S, **args: Any) -> Any:
    """One request on a control socket (the product's client); its `data`."""
    from santhrottle.appliance.daemon.control import request as req

    return req(sock, cmd, timeout_s=timeout_s, **args)


def not_answering() -> tuple[type[BaseException], ...]:
    """The errors of a daemon that does not answer (yet)."""
    from santhrottle.appliance.daemon.control.requests import DaemonUnavailable, RemoteError

    return (OSError, DaemonUnavailable, RemoteError)


class Daemon:
    """One santhrottled of an experiment: its file and log in `workdir`, named `name`."""

    def __init__(
        self,
        name: str,
        config: dict[str, dict],
        workdir: Path,
        nice: int | None = None,
        netns: str | None = None,
        env: dict | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.name, self.config, self.workdir = name, config, Path(workdir)
        self.sock = config["daemon"]["control_socket"]
        self.conf = self.workdir / f"santhrottle-{name}.toml"
        self.log = self.workdir / f"santhrottled-{name}.log"
        self.nice = unit_nice() if nice is None else nice
        self.netns, self.env = netns, env
        self.command = command or [str(BIN / "santhrottled")]  # --profile-daemon: another
        self.proc: subprocess.Popen | None = None

    def write(self, config: dict[str, dict] | None = None) -> Path:
        """The file, checked by the schema (config_text); a new config replaces the old."""
        if config is not None:
            self.config = config
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(config_text(self.config, str(self.conf)))
        return self.conf

    def launch(self) -> None:
        """Write the file and start the process (not waiting for it)."""
        self.write()
        Path(self.sock).parent.mkdir(parents=True, exist_ok=True)
        Path(self.sock).unlink(missing_ok=True)
        nice = self.nice
        cmd = [*self.command, "--config", str(self.conf)]
        if self.netns:  # `ip netns exec` execs the daemon: this PID is the daemon's
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=lambda: os.nice(nice),
            )

    def wait_up(self, start_s: float = START_S, first_status_s: float = FIRST_STATUS_S) -> dict:
        """Until the control socket exists, then until it answers a status; returns it.
        The limits are an idle host's, stretched by the guest's speed (labkit.speed)."""
        assert self.proc is not None
        deadline = time.monotonic() + speed.budget(start_s)
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"santhrottled {self.name} did not start: {self.tail()}")
            time.sleep(0.2)
        deadline = time.monotonic() + speed.budget(first_status_s)
        while True:
            try:
                return request(self.sock, "status", timeout_s=5.0)
            except not_answering() as e:  # not answering yet: again
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"santhrottled {self.name} gave no status in {first_status_s:g} s: {e}"
                    ) from None
                time.sleep(1.0)

    def start(self, start_s: float = START_S) -> dict:
        """launch() and wait_up(); a daemon that does not come up is stopped (our own
        child, by PID) before the RuntimeError goes on."""
        self.launch()
        try:
            return self.wait_up(start_s)
        except BaseException:
            self.stop(cleanup=None)
            raise

    def tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    # ----------------------------------------------------------------- talking
    def request(self, cmd: str, timeout_s: float = REQUEST_S, **args: Any) -> Any:
        return request(self.sock, cmd, timeout_s=timeout_s, **args)

    def status(self, timeout_s: float = REQUEST_S) -> dict:
        return self.request("status", timeout_s=timeout_s)

    def status_row(self) -> dict:
        """What a sample keeps of a status (a probe's read)."""
        st = self.status()
        return {
            "resources": [
                {
                    **{x: r.get(x) for x in RESOURCE_FIELDS},
                    # the recorded name; the daemon's ThresholdView calls it so
                    "threshold_setpoint_fraction": (r.get("threshold") or {}).get(
                        "setpoint_fraction"
                    ),
                }
                for r in st["resources"]
            ],
            "initiators": {i["initiator"]: i["class"] for i in st["initiators"] if i["class"]},
            "overruns": st["counters"]["tick_overruns"],
            "glided": st["counters"]["glided_descents"],
            "unordered": st["counters"]["unordered_descents"],
        }

    def cli(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
        """`santhrottle ARGS --socket SOCK`, as an admin would run it."""
        return subprocess.run(
            [str(BIN / "santhrottle"), *args, "--socket", self.sock],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def pin(self, ip: str, delay_us: int) -> None:
        """Pin one initiator by hand through the running daemon, as an admin would."""
        p = self.cli("pin", ip, "--delay", f"{delay_us}us")
        if p.returncode != 0:
            raise RuntimeError(f"santhrottle pin {ip}: {p.stderr.strip()}")

    def cpu(self) -> dict:
        """The daemon's CPU so far, in seconds: the whole process and its main thread (the
        tick loop; the others run discovery, the control socket and the metrics), and the
        programs it ran."""
        from labkit.probes import proc_cpu

        hz = os.sysconf("SC_CLK_TCK")
        try:
            return {
                "cpu_s": proc_cpu(self.pid) / hz,
                "main_thread_cpu_s": proc_cpu(self.pid, self.pid) / hz,
                # the programs it ran and waited for (tc, ipset, nft ...)
                "children_cpu_s": proc_cpu(self.pid, children=True) / hz,
            }
        except (OSError, IndexError, ValueError) as e:  # gone already: say so
            return {"error": str(e)}

    # ------------------------------------------------------------------- ending
    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # our own child, by PID
        self.proc.wait(timeout=STOP_S)

    def stop(self, cleanup: str | None = "all", timeout_s: float = STOP_S) -> int | None:
        """SIGTERM (our own child, by PID), SIGKILL after timeout_s; then `santhrottle
        cleanup` ("all"), `cleanup --delays-only` ("delays", the unit's ExecStopPost) or
        nothing (None).  Returns the daemon's exit status."""
        code = None
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
        if cleanup:
            self.cleanup(delays_only=cleanup == "delays")
        return code

    def cleanup(self, delays_only: bool = False, timeout_s: float = 150.0) -> int:
        cmd = [
            str(BIN / "santhrottle"),
            "cleanup",
            *(["--delays-only"] if delays_only else []),
            "--config",
            str(self.conf),
        ]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        try:
            return subprocess.run(
                cmd, capture_output=True, timeout=timeout_s, env=self.env
            ).returncode
        except subprocess.TimeoutExpired:
            return -1


def poll_until(
    fn: Callable[[], Any], within_s: float, step_s: float = 0.2
) -> tuple[Any, float | None]:
    """fn() until it returns something true, at most within_s: (that, seconds) or (None, None)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within_s:
        got = fn()
        if got:
            return got, time.monotonic() - t0
        time.sleep(step_s)
    return None, None
