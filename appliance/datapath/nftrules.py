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

    map santhrottle-all  { typeof ip daddr : meta priority }   # one per mode
    map santhrottle-ack  { ... }
    map santhrottle-read { ... }
    set santhrottle-counted { typeof ip daddr; counter }       # every member
    chain delay {
        tcp sport != { 3260, 4420 } return
        meta priority set ip daddr map @santhrottle-all ip daddr @santhrottle-counted
        @ih,0,8 & 0x0 == 0x0 meta priority set ip daddr map @santhrottle-read ...
        @ih,0,8 & 0x0 == 0x0 return
        tcp flags ack / fin,syn,rst,ack meta priority set ip daddr map @santhrottle-ack ...
    }
    chain postrouting {           # only while somebody is delayed: idle costs nothing
        type filter hook postrouting priority 0; policy accept;
        oifname "PORT" meta l4proto tcp jump delay
    }

    A member is a map element `IP : 5374:K`: the map lookup writes HTB's
    classid into skb->priority, as ipset's skbprio does on a target host,
    and a miss ends the rule.  `@ih,0,8` loads the TCP payload's first
    byte: the load fails on an empty payload, so the rule matches exactly
    the packets that carry data (read mode) and the RETURN after it leaves
    pure ACKs for ack mode.  A map element's counters would restart with
    every class change (an element's value changes by delete + add), so
    the counters sit on santhrottle-counted, whose element stays while
    the initiator is a member in any mode; its lookup comes after the map's
    and counts only the packets given a class.

Worked example
    render_ops([("add", "santhrottle-all", "10.0.0.3", 0x20)], {}) ->
    "add element bridge santhrottle santhrottle-all { 10.0.0.3 : 5374:20 }"
    and the same IP into santhrottle-counted; a second add to 0x6000 on
    that membership deletes the element and adds it with 5374:6000 in the
    same transaction, and leaves santhrottle-counted alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from santhrottle.appliance.datapath.members import Membership, Op
from santhrottle.appliance.datapath.names import (
    ROOT_MAJOR,
    SET_MODE,
    SET_NAMES,
    SET_PREFIX,
    DatapathError,
    minor_classid,
)

FAMILY = "bridge"
TABLE = "santhrottle"
QUALIFIED = f"{FAMILY} {TABLE}"
CHAIN = "delay"
HOOK_CHAIN = "postrouting"
COUNTED = f"{SET_PREFIX}counted"
MAP_DECL = "typeof ip daddr : meta priority"
COUNTED_DECL = "typeof ip daddr; counter;"
HOOK_DECL = "type filter hook postrouting priority 0; policy accept;"
PAYLOAD = "@ih,0,8 & 0x0 == 0x0"  # the TCP payload's first byte exists
PURE_ACK_FLAGS = "tcp flags ack / fin,syn,rst,ack"


@dataclass
class NftState:
    """What `nft -j list table bridge santhrottle` showed."""

    table: bool = False
    maps: set[str] = field(default_factory=set)  # the mode maps that exist (set names)
    counted: bool = False
    chains: set[str] = field(default_factory=set)
    # ip -> (mode, HTB minor, packets, bytes)
    members: dict[str, tuple[str, int, int, int]] = field(default_factory=dict)


# ------------------------------------------------------------------ rules
def _count(mapped: str) -> str:
    return f"meta priority set ip daddr map @{mapped} ip daddr @{COUNTED}"


def render_chain_rules(ports: Sequence[int]) -> list[str]:
    """The delay chain's rules exactly as `nft list` prints them."""
    sports = ", ".join(str(p) for p in ports)
    port_rule = f"tcp sport != {{ {sports} }} return" if len(ports) > 1 else (
        f"tcp sport != {ports[0]} return"
    )  # fmt: skip
    return [
        port_rule,
        _count(SET_NAMES["all"]),
        f"{PAYLOAD} {_count(SET_NAMES['read'])}",
        f"{PAYLOAD} return",
        f"{PURE_ACK_FLAGS} {_count(SET_NAMES['ack'])}",
    ]


def jump_rule(device: str) -> str:
    return f'oifname "{device}" meta l4proto tcp jump {CHAIN}'


def render_ensure(state: NftState) -> tuple[str, list[str]]:
    """(nft input that adds what is missing of the table, its maps, the counted set
    and the delay chain; the names it creates).  '' when nothing is missing."""
    lines, created = [], []
    if not state.table:
        lines.append(f"add table {QUALIFIED}")
    for name in SET_NAMES.values():
        if name not in state.maps:
            lines.append(f"add map {QUALIFIED} {name} {{ {MAP_DECL}; }}")
            created.append(name)
    if not state.counted:
        lines.append(f"add set {QUALIFIED} {COUNTED} {{ {COUNTED_DECL} }}")
        created.append(COUNTED)
    if CHAIN not in state.chains:
        lines.append(f"add chain {QUALIFIED} {CHAIN}")
    return _text(lines), created


def render_converge(
    ports: Sequence[int], rules: Sequence[str] | None, jumps: Sequence[str] | None,
    devices: Sequence[str], active: bool,
) -> str | None:  # fmt: skip
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
        return _text([f"flush chain {QUALIFIED} {HOOK_CHAIN}",
                      f"delete chain {QUALIFIED} {HOOK_CHAIN}"])  # fmt: skip
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
    santhrottle-counted gains the new members and loses the ones that left."""
    cur = dict(before)
    lines = []
    for op, name, ip, minor in ops:
        mode = SET_MODE[name]
        have = cur.get(ip)
        if have is not None and have[0] == mode:
            lines.append(f"delete element {QUALIFIED} {name} {{ {ip} }}")
            del cur[ip]
        if op == "add":
            lines.append(f"add element {QUALIFIED} {name} {{ {_element(ip, minor)} }}")
            cur[ip] = (mode, minor)
    lines += _counted_lines(before, cur)
    return _text(lines)


def render_replace(mode: str, members: Mapping[str, int], before: Membership) -> str:
    """Mode's map holds exactly `members` (ip -> minor), in one transaction; the
    other maps lose these IPs (an initiator is in one mode at most)."""
    name = SET_NAMES[mode]
    lines = [f"flush map {QUALIFIED} {name}"]
    for ip, (m, _) in sorted(before.items()):
        if m != mode and ip in members:
            lines.append(f"delete element {QUALIFIED} {SET_NAMES[m]} {{ {ip} }}")
    if members:
        elems = ", ".join(_element(ip, minor) for ip, minor in sorted(members.items()))
        lines.append(f"add element {QUALIFIED} {name} {{ {elems} }}")
    after = {ip: v for ip, v in before.items() if v[0] != mode and ip not in members}
    after.update({ip: (mode, minor) for ip, minor in members.items()})
    return _text(lines + _counted_lines(before, after))


def _counted_lines(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    gone = sorted(set(before) - set(after))
    new = sorted(set(after) - set(before))
    out = []
    if gone:
        out.append(f"delete element {QUALIFIED} {COUNTED} {{ {', '.join(gone)} }}")
    if new:
        out.append(f"add element {QUALIFIED} {COUNTED} {{ {', '.join(new)} }}")
    return out


def render_destroy(state: NftState) -> str:
    """Delete the maps, the counted set and then the table (its chains go first:
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
        elif "set" in item and item["set"].get("name") == COUNTED:
            st.counted = True
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
