"""The human output of `santhrottle datapath show`: the data path's status as lines and tables.

What it owns
    Turning datapath/show.py's status (plain data: the tree, the gate's
    chain in iptables and ip6tables or nftables' bridge family, the sets,
    the members, the busy classes) into what an admin reads.  Plain
    formatting: nothing here talks to the kernel (cli/datapath.py does).

Worked example
    print_status(st) of a data path with one IPv4 and one IPv6 member ->
    "santhrottle data path on eth1; iptables nf_tables backend", the tc
    line, "iptables: chain SANTHROTTLE (5 rules, ports 3260,4420), ...",
    "ip6tables: chain SANTHROTTLE (5 rules), ...", the sets, and a member
    table whose initiator column is as wide as its longest address.
"""

from __future__ import annotations

from typing import Any

from santhrottle.appliance.cli.common import column_width, ip_key
from santhrottle.appliance.units import fmt_bit_rate, fmt_us


def _gate(st: dict[str, Any]) -> str:
    if st.get("gate") == "nft":
        return "gate: nftables' bridge family"
    return f"iptables {st['backend']} backend"


def print_status(st: dict[str, Any]) -> None:
    from santhrottle.appliance.datapath.names import classid  # the CLI imports it late

    where = f" (netns {st['netns']})" if st["netns"] else ""
    if (
        not st["chain"]["exists"]
        and not st["installed_devices"]
        and not any(v is not None for v in st["sets"].values())
    ):
        print(f"santhrottle data path: not applied{where}; {_gate(st)}")
        return
    print(f"santhrottle data path on {st['device'] or '?'}{where}; {_gate(st)}")
    c = st["classes"]
    if c:
        step = f"{fmt_us(c['step_us'])} steps" if c["step_us"] else f"{c['leaf']} leaves"
        link = f", {fmt_bit_rate(c['link_bits_s'])}" if c["link_bits_s"] else ""
        print(
            f"  tc: htb {c['root']} root, {c['classes']} delay classes of {step}"
            f" (max class {c['max_class']}), unthrottled: HTB {c['default']} queue{link}"
        )
        gl = c.get("glides") or []
        if gl:
            busy = [
                f"{g['leaf']} {g['state']} at "
                f"{fmt_us(g['delay_us']) if g['delay_us'] is not None else '-'}"
                f" ({len(g['members'])} initiators)"
                for g in gl
                if g["members"]
            ]
            print(
                f"  glide leaves: {len(gl)} (lowered delays keep each initiator's packets in "
                f"order){'; ' + ', '.join(busy) if busy else ''}"
            )
    else:
        print("  tc: no santhrottle qdisc tree")
    ch = st["chain"]
    nft = st.get("gate") == "nft"
    tool, chain = (
        ("nft", "table bridge santhrottle, chain delay")
        if nft
        else ("iptables", "chain SANTHROTTLE")
    )
    if ch["exists"]:
        jumps = "; ".join(j.replace("-A ", "", 1) for j in ch["jumps"]) or "no jump (idle)"
        print(
            f"  {tool}: {chain} ({len(ch['rules'])} rules, ports "
            f"{','.join(map(str, ch['ports']))}), {jumps}"
        )
    else:
        print(f"  {tool}: no {chain}")
    ch6 = st.get("chain6")
    if ch6 is not None:  # the target host's IPv6 side: the same chain in ip6tables
        jumps6 = "; ".join(j.replace("-A ", "", 1) for j in ch6["jumps"]) or "no jump (idle)"
        state6 = f"{len(ch6['rules'])} rules" if ch6["exists"] else "missing"
        print(f"  ip6tables: chain SANTHROTTLE ({state6}), {jumps6}")
    sets = ", ".join(f"{name} {'missing' if n is None else n}" for name, n in st["sets"].items())
    print(f"  sets: {sets}")
    if st["members"]:
        _print_members(st["members"])
    if c and c.get("counters"):
        busy_classes = {k: v for k, v in c["counters"].items() if v["packets"]}
        if busy_classes:
            print(f"  {'class':<10} {'delay':>7} {'packets':>10} {'bytes':>12}")
            for k, v in sorted(busy_classes.items(), key=lambda kv: int(kv[0])):
                ds = c.get("delays_us")
                delay = fmt_us(ds[int(k)]) if ds and int(k) < len(ds) else "-"
                name = classid(int(k))
                if k == "0":
                    delay, name = "none", "direct"
                print(f"  {name:<10} {delay:>7} {v['packets']:>10} {v['bytes']:>12}")


def _print_members(members: list[dict[str, Any]]) -> None:
    """The member table, IPv4 then IPv6, numerically; the initiator column as wide
    as its longest address (an IPv6 one is up to 39 characters)."""
    rows = sorted(members, key=lambda m: ip_key(m["ip"]))
    w = column_width((m["ip"] for m in rows), "initiator")
    head = ("initiator", "mode", "class", "delay", "packets", "bytes")
    print(f"  {head[0]:<{w}} {head[1]:<4} {head[2]:>5} {head[3]:>7} {head[4]:>10} {head[5]:>12}")
    for m in rows:
        delay = fmt_us(m["delay_us"]) if m["delay_us"] is not None else "-"
        print(
            f"  {m['ip']:<{w}} {m['mode']:<4} {m['class']:>5} {delay:>7} "
            f"{m['packets']:>10} {m['bytes']:>12}"
        )
