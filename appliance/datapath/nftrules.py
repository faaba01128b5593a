"""Bridge mode's gate in nftables' bridge family, rendered and parsed (pure).

What it owns
    The table `bridge santhrottle` and the `nft -f` texts that build it,
    move members and remove it; the parsers of `nft list` (text: chains)
    and `nft -j list` (JSON: members and counters).  datapath/nftgate.py
    runs them.  Bridge mode uses it instead of ipset + iptables because a
    bridged packet reaches a bridge-family chain without br_netfilter,
    which costs every bridged packet a pass through iptables' hooks
    (docs/bridge.md, "What the gate costs").

Layout (as `nft list table bridge santhrottle` prints it)::

    map santhrottle-all  { typeof ip daddr : meta priority }   # per mode, IPv4
    map santhrottle-ack  { ... }
    map santhrottle-read { ... }
    set santhrottle-counted  { typeof ip daddr; counter }      # every IPv4 member
    map santhrottle-all6 { typeof ip6 daddr : meta priority }  # per mode, IPv6
    map santhrottle-ack6 { ... }
    map santhrottle-read6 { ... }
    set santhrottle-counted6 { typeof ip6 daddr; counter }     # every IPv6 member
    chain delay {
        tcp sport != { 3260, 4420 } return
        meta priority set ip daddr map @santhrottle-all ip daddr @santhrottle-counted
        meta priority set ip6 daddr map @santhrottle-all6 ip6 daddr @santhrottle-counted6
        @ih,0,8 & 0x0 == 0x0 meta priority set ip daddr map @santhrottle-read ...
        @ih,0,8 & 0x0 == 0x0 meta priority set ip6 daddr map @santhrottle-read6 ...
        @ih,0,8 & 0x0 == 0x0 return
        tcp flags ack / fin,syn,rst,ack meta priority set ip daddr map @santhrottle-ack ...
        tcp flags ack / fin,syn,rst,ack meta priority set ip6 daddr map @santhrottle-ack6 ...
    }
    chain postrouting {           # only while somebody is delayed: idle costs nothing
        type filter hook postrouting priority 0; policy accept;
        oifname "PORT" meta l4proto tcp jump delay
    }

    A member is a map element `IP : 5374:K`: the map lookup writes HTB's
    classid into skb->priority, as ipset's skbprio does on a target host,
    and a miss ends the rule.  A map holds one family (names.py: an IPv6
    initiator is in its mode's santhrottle-MODE6), and in a bridge-family
    chain `ip daddr` matches only IPv4 frames and `ip6 daddr` only IPv6
    ones (nft puts a `meta protocol` check it does not list in front), so
    every mode has a rule per family, side by side.  `@ih,0,8` loads the
    TCP payload's first byte: the load fails on an empty payload, so the
    rule matches exactly the packets that carry data (read mode) and the
    RETURN after it leaves pure ACKs for ack mode.  A map element's
    counters would restart with every class change (an element's value
    changes by delete + add), so the counters sit on santhrottle-counted
    (-counted6 for IPv6), whose element stays while the initiator is a
    member in any mode; its lookup comes after the map's and counts only
    the packets given a class.  A table from before IPv6 (the IPv4 maps
    only) gains the IPv6 maps and set from render_ensure and the IPv6
    rules from render_reconcile (the chain differs: rebuilt in one
    transaction, the members stay).

Worked example
    render_ops([("add", "santhrottle-all", "10.0.0.3", 0x20)], {}) ->
    "add element bridge santhrottle santhrottle-all { 10.0.0.3 : 5374:20 }"
    and the same IP into santhrottle-counted; a second add to 0x6000 on
    that membership deletes the element and adds it with 5374:6000 in the
    same transaction, and leaves santhrottle-counted alone.
    ("add", "santhrottle-all6", "fd00::3", 0x20) does the same in
    santhrottle-all6 and santhrottle-counted6; ("add", "santhrottle-all",
    "fd00::3", 0x20) is an error (the set name decides the family).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from santhrottle.appliance.datapath.members import KernelMembers, Op
from santhrottle.appliance.datapath.names import (
    FAMILIES,
    FAMILY_SETS,
    ROOT_MAJOR,
    SET_FAMILY,
    SET_MODE,
    SET_PREFIX,
    DatapathError,
    family,
    minor_classid,
    set_name,
)

FAMILY = "bridge"
TABLE = "santhrottle"
QUALIFIED = f"{FAMILY} {TABLE}"
CHAIN = "delay"
HOOK_CHAIN = "postrouting"
# Per address family (4, 6): the destination the rules look up, the counted set, and
# the declarations of a family's maps and counted set.
DADDR = {4: "ip daddr", 6: "ip6 daddr"}
COUNTED_SETS = {4: f"{SET_PREFIX}counted", 6: f"{SET_PREFIX}counted6"}
COUNTED, COUNTED6 = COUNTED_SETS[4], COUNTED_SETS[6]
_COUNTED_NAMES = frozenset(COUNTED_SETS.values())
MAP_DECLS = {fam: f"typeof {DADDR[fam]} : meta priority" for fam in FAMILIES}
COUNTED_DECLS = {fam: f"typeof {DADDR[fam]}; counter;" for fam in FAMILIES}
HOOK_DECL = "type filter hook postrouting priority 0; policy accept;"
PAYLOAD = "@ih,0,8 & 0x0 == 0x0"  # the TCP payload's first byte exists
PURE_ACK_FLAGS = "tcp flags ack / fin,syn,rst,ack"


@dataclass
class NftState:
    """What `nft -j list table bridge santhrottle` showed."""

    table: bool = False
    maps: set[str] = field(default_factory=set)  # the mode maps that exist (set names)
    counted: set[str] = field(default_factory=set)  # the counted sets that exist
    chains: set[str] = field(default_factory=set)
    # ip -> (mode, HTB minor, packets, bytes)
    members: dict[str, tuple[str, int, int, int]] = field(default_factory=dict)


# ------------------------------------------------------------------ rules
def _count(mode: str, fam: int) -> str:
    """Mode's lookup for one address family, counted after a hit."""
    daddr, mapped = DADDR[fam], FAMILY_SETS[fam][mode]
    return f"meta priority set {daddr} map @{mapped} {daddr} @{COUNTED_SETS[fam]}"


def render_chain_rules(ports: Sequence[int]) -> list[str]:
    """The delay chain's rules exactly as `nft list` prints them."""
    sports = ", ".join(str(p) for p in ports)
    port_rule = (
        f"tcp sport != {{ {sports} }} return"
        if len(ports) > 1
        else f"tcp sport != {ports[0]} return"
    )
    return [
        port_rule,
        *(_count("all", fam) for fam in FAMILIES),
        *(f"{PAYLOAD} {_count('read', fam)}" for fam in FAMILIES),
        f"{PAYLOAD} return",
        *(f"{PURE_ACK_FLAGS} {_count('ack', fam)}" for fam in FAMILIES),
    ]


def jump_rule(device: str) -> str:
    return f'oifname "{device}" meta l4proto tcp jump {CHAIN}'


def render_ensure(state: NftState) -> tuple[str, list[str]]:
    """(nft input that adds what is missing of the table, its maps and counted sets
    (both families) and the delay chain; the names it creates).  '' when nothing is
    missing.  A table from before IPv6 gains the IPv6 maps and counted set."""
    lines, created = [], []
    if not state.table:
        lines.append(f"add table {QUALIFIED}")
    for fam in FAMILIES:
        for name in FAMILY_SETS[fam].values():
            if name not in state.maps:
                lines.append(f"add map {QUALIFIED} {name} {{ {MAP_DECLS[fam]}; }}")
                created.append(name)
        counted = COUNTED_SETS[fam]
        if counted not in state.counted:
            lines.append(f"add set {QUALIFIED} {counted} {{ {COUNTED_DECLS[fam]} }}")
            created.append(counted)
    if CHAIN not in state.chains:
        lines.append(f"add chain {QUALIFIED} {CHAIN}")
    return _text(lines), created


def render_reconcile(
    ports: Sequence[int],
    rules: Sequence[str] | None,
    jumps: Sequence[str] | None,
    devices: Sequence[str],
    active: bool,
) -> str | None:
    """The delay chain with these ports, and the jumps iff active (jumps None: the hook
    chain does not exist); None: nothing to do."""
    want = render_chain_rules(ports)
    lines = []
    if rules is None or list(rules) != want:
        if rules is not None:
            lines.append(f"flush chain {QUALIFIED} {CHAIN}")
        else:
            lines.append(f"add chain {QUALIFIED} {CHAIN}")
        lines += [f"add rule {QUALIFIED} {CHAIN} {r}" for r in want]
    jt = render_jumps(devices, active, jumps)
    if jt:
        lines += jt.splitlines()
    return _text(lines) or None


def render_jumps(devices: Sequence[str], active: bool, jumps: Sequence[str] | None) -> str:
    """Active: the hook chain with a jump per device (the ones missing added, others
    removed by rebuilding it).  Not active: no hook chain at all.  jumps None: the hook
    chain does not exist.  '' when nothing is to do."""
    want = [jump_rule(d) for d in devices]
    if not active or not want:
        if jumps is None:
            return ""
        return _text(
            [f"flush chain {QUALIFIED} {HOOK_CHAIN}", f"delete chain {QUALIFIED} {HOOK_CHAIN}"]
        )
    if jumps is not None and list(jumps) == want:
        return ""
    lines = [f"add chain {QUALIFIED} {HOOK_CHAIN} {{ {HOOK_DECL} }}"]
    if jumps:
        lines.append(f"flush chain {QUALIFIED} {HOOK_CHAIN}")
    lines += [f"add rule {QUALIFIED} {HOOK_CHAIN} {r}" for r in want]
    return _text(lines)


def render_chains_cleanup(rules: Sequence[str] | None, jumps: Sequence[str] | None) -> str:
    lines = []
    for name, there in ((HOOK_CHAIN, jumps is not None), (CHAIN, rules is not None)):
        if there:
            lines += [f"flush chain {QUALIFIED} {name}", f"delete chain {QUALIFIED} {name}"]
    return _text(lines)


# ---------------------------------------------------------------- members
def _element(ip: str, minor: int) -> str:
    return f"{ip} : {minor_classid(minor)}"


def render_ops(ops: Sequence[Op], before: Mapping[str, tuple[str, int]]) -> str:
    """One transaction for ops against the membership `before`: a changed class is
    delete + add of the element (nft cannot change a map element's value in place);
    the counted sets gain the new members and lose the ones that left.  An op's set
    name decides its family: an address of the other family is an error."""
    cur = dict(before)
    lines = []
    for op, name, ip, minor in ops:
        mode = _check_op(op, name, ip)
        have = cur.get(ip)
        if have is not None and have[0] == mode:
            lines.append(f"delete element {QUALIFIED} {name} {{ {ip} }}")
            del cur[ip]
        if op == "add":
            lines.append(f"add element {QUALIFIED} {name} {{ {_element(ip, minor)} }}")
            cur[ip] = (mode, minor)
    lines += _counted_lines(before, cur)
    return _text(lines)


def _check_op(op: str, name: str, ip: str) -> str:
    """The op's mode; one line for an op nft would refuse (or not mean)."""
    mode = SET_MODE.get(name)
    if op not in ("add", "del") or mode is None:
        raise DatapathError(
            f"bad member op {op!r} on {name!r}: expected add or del on one of "
            f"{', '.join(sorted(SET_MODE))}"
        )
    fam = SET_FAMILY[name]
    if family(ip) != fam:
        raise DatapathError(
            f"{ip} is not an IPv{fam} address: {name} holds IPv{fam} initiators "
            f"(its IPv{family(ip)} set is {set_name(mode, ip)})"
        )
    return mode


def render_replace(mode: str, members: Mapping[str, int], before: KernelMembers) -> str:
    """Mode's maps (both families) hold exactly `members` (ip -> minor, either family),
    in one transaction; the other maps lose these IPs (an initiator is in one mode at
    most)."""
    maps = {fam: FAMILY_SETS[fam][mode] for fam in FAMILIES}
    lines = [f"flush map {QUALIFIED} {maps[fam]}" for fam in FAMILIES]
    for ip, (m, _) in sorted(before.items()):
        if m != mode and ip in members:
            lines.append(f"delete element {QUALIFIED} {set_name(m, ip)} {{ {ip} }}")
    elems: dict[int, list[str]] = {fam: [] for fam in FAMILIES}
    for ip, minor in sorted(members.items()):
        elems[family(ip)].append(_element(ip, minor))
    for fam in FAMILIES:
        if elems[fam]:
            lines.append(f"add element {QUALIFIED} {maps[fam]} {{ {', '.join(elems[fam])} }}")
    after = {ip: v for ip, v in before.items() if v[0] != mode and ip not in members}
    after.update({ip: (mode, minor) for ip, minor in members.items()})
    return _text(lines + _counted_lines(before, after))


def _counted_lines(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    """The counted sets (each family's) lose the IPs that left and gain the new ones."""
    gone: dict[int, list[str]] = {fam: [] for fam in FAMILIES}
    new: dict[int, list[str]] = {fam: [] for fam in FAMILIES}
    for ip in before:
        if ip not in after:
            gone[family(ip)].append(ip)
    for ip in after:
        if ip not in before:
            new[family(ip)].append(ip)
    out = []
    for verb, ips in (("delete", gone), ("add", new)):
        for fam in FAMILIES:
            if ips[fam]:
                joined = ", ".join(sorted(ips[fam]))
                out.append(f"{verb} element {QUALIFIED} {COUNTED_SETS[fam]} {{ {joined} }}")
    return out


def render_destroy(state: NftState) -> str:
    """Delete the maps, the counted sets and then the table (its chains go first:
    render_chains_cleanup)."""
    if not state.table:
        return ""
    return _text([f"delete table {QUALIFIED}"])


# ---------------------------------------------------------------- parsing
def parse_json(text: str) -> NftState:
    """NftState of `nft -j list table bridge santhrottle` output."""
    try:
        items = json.loads(text).get("nftables", [])
    except (ValueError, AttributeError):
        raise DatapathError("nft -j list: output is not nftables JSON") from None
    st = NftState()
    counters: dict[str, tuple[int, int]] = {}
    values: dict[str, tuple[str, int]] = {}
    root = f"{ROOT_MAJOR:x}:"
    for item in items:
        if not isinstance(item, dict) or len(item) != 1:
            continue
        ((kind, body),) = item.items()
        if not isinstance(body, dict) or body.get("table" if kind != "table" else "name") != TABLE:
            continue  # another table's (or metainfo)
        if kind == "table":
            st.table = True
        elif "chain" in item:
            st.chains.add(item["chain"].get("name", ""))
        elif "map" in item and item["map"].get("name") in SET_MODE:
            name = item["map"]["name"]
            st.maps.add(name)
            for pair in item["map"].get("elem") or []:
                if not (isinstance(pair, list) and len(pair) == 2):
                    continue
                key, val = _elem_key(pair[0]), pair[1]
                if key and isinstance(val, str) and val.startswith(root):
                    values[key] = (SET_MODE[name], int(val[len(root) :], 16))
        elif "set" in item and item["set"].get("name") in _COUNTED_NAMES:
            st.counted.add(item["set"]["name"])
            for e in item["set"].get("elem") or []:
                key = _elem_key(e)
                c = (e.get("elem") or {}).get("counter") if isinstance(e, dict) else None
                if key:
                    counters[key] = (int(c["packets"]), int(c["bytes"])) if c else (0, 0)
    st.members = {ip: (m, minor, *counters.get(ip, (0, 0))) for ip, (m, minor) in values.items()}
    return st


def _elem_key(e: object) -> str | None:
    if isinstance(e, str):
        return e
    if isinstance(e, dict):
        v = (e.get("elem") or {}).get("val")
        return v if isinstance(v, str) else None
    return None


_CHAIN_RE = re.compile(r"^\s*chain (\S+) \{\s*$")
_TABLE_RE = re.compile(r"^table (\S+) (\S+) \{\s*$")


def parse_chains(text: str) -> tuple[list[str] | None, list[str] | None]:
    """(the delay chain's rules, the hook chain's jumps) of our table in `nft list
    ruleset bridge` text; None for a chain that is not there."""
    chains: dict[str, list[str]] = {}
    ours = False
    cur: list[str] | None = None
    for line in text.splitlines():
        t = _TABLE_RE.match(line)
        if t:
            ours = (t.group(1), t.group(2)) == (FAMILY, TABLE)
            continue
        m = _CHAIN_RE.match(line)
        if m and ours:
            cur = chains.setdefault(m.group(1), [])
            continue
        s = line.strip()
        if cur is None:
            continue
        if s == "}":
            cur = None
        elif s and not s.startswith("type "):
            cur.append(s)
    return chains.get(CHAIN), chains.get(HOOK_CHAIN)


def parse_ports(rules: Sequence[str]) -> tuple[int, ...] | None:
    """The storage ports the delay chain's first rule names (None: not there)."""
    for r in rules:
        m = re.match(r"tcp sport != (?:\{ ([\d, ]+) \}|(\d+)) return$", r)
        if m:
            return tuple(int(p) for p in (m.group(1) or m.group(2)).split(","))
    return None


def parse_jump_device(jump: str) -> str | None:
    m = re.match(r'oifname "([^"]+)"', jump)
    return m.group(1) if m else None


def _text(lines: Sequence[str]) -> str:
    return "".join(f"{x}\n" for x in lines)
