"""The mangle rules, rendered and parsed (pure): exactly as `iptables -t mangle -S` prints them.

What it owns
    The chain SANTHROTTLE, the jump into it (one per egress device), and
    the iptables-restore texts that reconcile or remove them.  Installed
    with `iptables-restore --noflush` (datapath/mangle.py), which works
    with the nf_tables and the legacy backend alike.  The same chain and
    jumps go into ip6tables (family 6) with the IPv6 sets
    (santhrottle-all6, ...) and the pure-ACK test for an IPv6 header; the
    jump matches the one list:set gate in both.

Layout::

    -A POSTROUTING -o DEV -p tcp
       -m set --match-set santhrottle-members dst ! --update-counters -j SANTHROTTLE
    -A SANTHROTTLE -p tcp -m multiport ! --sports 3260,4420 -j RETURN
    -A SANTHROTTLE -j SET --map-set santhrottle-all dst --map-prio
    -A SANTHROTTLE -p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK ACK
       -m set --match-set santhrottle-ack dst ! --update-counters
       -m bpf --bytecode "<payload == 0>" -j SET --map-set santhrottle-ack dst --map-prio
    -A SANTHROTTLE -m set --match-set santhrottle-read dst ! --update-counters
       -m bpf --bytecode "<payload == 0>" -j RETURN
    -A SANTHROTTLE -j SET --map-set santhrottle-read dst --map-prio

Idle costs nothing per packet
    The jump exists only while somebody is throttled: it goes in with the
    first member and out with the last (datapath/actuator.py).  Idle, no
    rule of ours sees a packet; the chain stays, holding the storage ports
    (its first rule), so an idle data path still names them.  While the
    jump exists a packet to a non-member stops at it: one list:set match
    (the gate: datapath/sets.py).  SET --map-prio writes the member's
    skbprio into skb->priority; HTB puts a packet whose priority is
    5374:K straight into class 5374:K (no filters), anything else into its
    direct queue.

Modes (what is delayed for a member)
    all   every packet from a storage port: throttles writes (and reads).
    ack   pure ACKs only (TCP payload == 0, xt_bpf): the 2010 method; it
          slows writes only when the initiator is window-limited, because
          the cumulative ACK also rides on the undelayed R2T / SCSI
          Response PDUs (docs/datapath.md).
    read  payload packets only: throttles reads.

Worked example
    render_rules_restore(["eth1"], (3260,), True, jumps=[], chain_rules=None)
    -> "*mangle", ":SANTHROTTLE - [0:0]", the jump for eth1 (-I: first in
    POSTROUTING), the five chain rules, "COMMIT"; the same call with what
    it installed read back -> None (nothing to do); render_jumps(["eth1"],
    False, that jump) -> "*mangle", "-D" of the jump, "COMMIT".
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from santhrottle.appliance.datapath.names import CHAIN, FAMILY_SETS, MEMBERS_SET

# Exact pure-ACK test (TCP payload == 0) as xt_bpf bytecode, IPv4:
#   ldb [9]; jne #6 -> 0; ldxb 4*([0]&0xf); ldh [2]; sub x; st M0;
#   ldb [x+12]; and #0xf0; rsh #2; tax; ld M0; sub x; jeq #0 -> 1 else 0
# i.e. ip.tot_len - ihl*4 - tcp.doff*4 == 0.  xt_bpf cannot be negated: the
# read rule follows a RETURN for these packets.
PURE_ACK_BPF = (
    "15,48 0 0 9,21 0 12 6,177 0 0 0,40 0 0 2,28 0 0 0,2 0 0 0,80 0 0 12,84 0 0 240,"
    "116 0 0 2,7 0 0 0,96 0 0 0,28 0 0 0,21 0 1 0,6 0 0 1,6 0 0 0"
)
# The same for an IPv6 packet whose next header is TCP (no extension headers:
# storage traffic carries none; a packet with one is not a pure ACK to us):
#   ldb [6]; jne #6 -> 0; ldh [4]; st M0; ldb [52]; and #0xf0; rsh #2; tax;
#   ld M0; sub x; jeq #0 -> 1 else 0
# i.e. ip6.payload_len - tcp.doff*4 == 0.
PURE_ACK_BPF6 = (
    "13,48 0 0 6,21 0 10 6,40 0 0 4,2 0 0 0,48 0 0 52,84 0 0 240,116 0 0 2,7 0 0 0,"
    "96 0 0 0,28 0 0 0,21 0 1 0,6 0 0 1,6 0 0 0"
)
PURE_ACK_BPFS = {4: PURE_ACK_BPF, 6: PURE_ACK_BPF6}
# The flags iptables -S prints for "pure ACK": ACK set, FIN/SYN/RST clear.
PURE_ACK_FLAGS = "--tcp-flags FIN,SYN,RST,ACK ACK"


def member_match(name: str) -> str:
    """A set match that leaves the member counters alone (only the SET
    targets count, so a member's counters are the packets it had delayed)."""
    return f"-m set --match-set {name} dst ! --update-counters"


def render_chain_rules(ports: Sequence[int], family: int = 4) -> list[str]:
    """The chain's rules exactly as `iptables -t mangle -S SANTHROTTLE` (family 4)
    or `ip6tables ...` (family 6) prints them."""
    bpf = f'-m bpf --bytecode "{PURE_ACK_BPFS[family]}"'
    names = FAMILY_SETS[family]

    def mapset(mode: str) -> str:
        return f"-j SET --map-set {names[mode]} dst --map-prio"

    ack, read = member_match(names["ack"]), member_match(names["read"])
    sp = ",".join(str(p) for p in ports)
    return [
        f"-A {CHAIN} -p tcp -m multiport ! --sports {sp} -j RETURN",
        f"-A {CHAIN} {mapset('all')}",
        f"-A {CHAIN} -p tcp -m tcp {PURE_ACK_FLAGS} {ack} {bpf} {mapset('ack')}",
        f"-A {CHAIN} {read} {bpf} -j RETURN",
        f"-A {CHAIN} {mapset('read')}",
    ]


def jump_rule(device: str) -> str:
    """The one rule outside our chain, as -S prints it: the gate."""
    return f"-A POSTROUTING -o {device} -p tcp {member_match(MEMBERS_SET)} -j {CHAIN}"


def _jump_lines(devices: Sequence[str], active: bool, jumps: Sequence[str]) -> list[str]:
    """-D / -I lines: exactly one jump on each of `devices` when active (other
    devices' jumps left alone); none anywhere when not (nobody is a member)."""
    body: list[str] = []
    if not active:
        return ["-D" + j[2:] for j in jumps]
    for dev in devices:
        want = jump_rule(dev)
        kept = False
        for j in jumps:
            if parse_jump_device(j) != dev:
                continue
            if j == want and not kept:
                kept = True
            else:
                body.append("-D" + j[2:])
        if not kept:
            body.append("-I" + want[2:])  # first in POSTROUTING: no earlier ACCEPT hides it
    return body


def _restore_text(body: Sequence[str]) -> str | None:
    return "\n".join(["*mangle", *body, "COMMIT"]) + "\n" if body else None


def render_rules_restore(
    devices: Sequence[str],
    ports: Sequence[int],
    active: bool,
    jumps: Sequence[str],
    chain_rules: Sequence[str] | None,
    family: int = 4,
) -> str | None:
    """iptables-restore --noflush input reconciling the mangle table, or None
    when it already is as wanted: the chain with these ports, and the jumps
    (render_jumps).  `jumps`: the POSTROUTING rules (as -S prints them) that
    jump to our chain; `chain_rules`: our chain's rules, None when it does
    not exist; family 6: ip6tables-restore's."""
    want_rules = render_chain_rules(ports, family)
    chain_ok = chain_rules is not None and list(chain_rules) == want_rules
    body: list[str] = [] if chain_ok else [f":{CHAIN} - [0:0]"]  # creates it, or flushes it
    body += _jump_lines(devices, active, jumps)
    if not chain_ok:
        body += want_rules
    return _restore_text(body)


def render_jumps(devices: Sequence[str], active: bool, jumps: Sequence[str]) -> str | None:
    """The jumps alone (the chain exists): one on each device while somebody
    is throttled (active), none at all otherwise; None: nothing to change."""
    return _restore_text(_jump_lines(devices, active, jumps))


def render_rules_cleanup(jumps: Sequence[str], chain_exists: bool) -> str | None:
    if not jumps and not chain_exists:
        return None
    lines = ["*mangle"]
    lines += ["-D" + j[2:] for j in jumps]
    if chain_exists:
        lines += [f":{CHAIN} - [0:0]", f"-X {CHAIN}"]
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def parse_mangle_rules(text: str) -> tuple[list[str], list[str] | None]:
    """From `iptables -t mangle -S`: (POSTROUTING jumps to our chain, our
    chain's rules or None when the chain does not exist)."""
    jumps: list[str] = []
    rules: list[str] = []
    exists = False
    for line in text.splitlines():
        line = line.strip()
        if line == f"-N {CHAIN}":
            exists = True
        elif line.startswith("-A POSTROUTING ") and line.endswith(f"-j {CHAIN}"):
            jumps.append(line)
        elif line.startswith(f"-A {CHAIN} "):
            rules.append(line)
    return jumps, (rules if exists else None)


def parse_backend(version_text: str) -> str:
    """'iptables v1.8.9 (nf_tables)' -> 'nf_tables'; '(legacy)' -> 'legacy'."""
    m = re.search(r"\((nf_tables|legacy)\)", version_text)
    if m:
        return m.group(1)
    if re.search(r"iptables v1\.[0-7]\.", version_text):
        return "legacy"  # before 1.8 there was only x_tables
    return "unknown"


def parse_jump_device(jump: str) -> str | None:
    m = re.search(r"(?:^| )-o (\S+)", jump)
    return m.group(1) if m else None


def parse_rule_ports(rules: Sequence[str]) -> tuple[int, ...] | None:
    """The storage ports our chain's first rule names (None: not there)."""
    for r in rules:
        m = re.search(r"--sports (\S+)", r)
        if m:
            return tuple(int(p) for p in m.group(1).split(","))
    return None
