"""Bridge mode's kernel set-up: the bridge itself, and whether nftables' bridge family works.

What it owns
    prepare_bridge(): before the data path is applied, the bridge between
    the initiator-side and the array-side port is made or adopted
    (bridge/netdev.py: STP off, forward delay 0, both ports members, all
    up).  nft_bridge_problem(): whether the namespace's kernel takes the
    gate's table (nftables' bridge family, datapath/nftrules.py), checked
    by `santhrottled --check` with `nft --check` (nothing is installed).

Why nftables' bridge family
    A bridged packet passes the bridge family's postrouting hook on its way
    out of a port, with no br_netfilter: the hook chain of the gate exists
    only while somebody is delayed, so an idle bridge pays nothing, and a
    delayed packet one chain and a map lookup.  br_netfilter + iptables,
    the alternative, costs every bridged packet a pass through iptables'
    hooks as soon as its switch is on, and six times the nftables gate's
    cost per packet while throttling (docs/bridge.md, "What the gate costs").

Errors: DatapathError, one line naming the device or what the kernel lacks.
"""

from __future__ import annotations

from santhrottle.appliance.datapath.host import Host
from santhrottle.appliance.datapath.names import DatapathError
from santhrottle.appliance.datapath.nftrules import NftState, render_ensure, render_reconcile
from santhrottle.bridge import netdev

NO_NFT_BRIDGE = (
    "nftables' bridge family does not work here ({why}): bridge mode needs nf_tables with "
    "CONFIG_NF_TABLES_BRIDGE (`modprobe nf_tables`) and the nft tool"
)


def prepare_bridge(
    host: Host, name: str, initiator_port: str, array_port: str
) -> netdev.BridgeState:
    """Make or adopt the bridge."""
    try:
        return netdev.ensure(host.iproute(), name, initiator_port, array_port)
    except netdev.BridgeError as e:
        raise DatapathError(str(e)) from None
    except OSError as e:  # netlink refused (permissions, a device gone meanwhile)
        raise DatapathError(f"bridge {name}: {e.strerror or e}") from None


def nft_bridge_problem(host: Host) -> str | None:
    """None when the kernel takes the gate's table and rules (checked, not installed: the
    payload test of its rules needs Linux 5.16), else one line."""
    text, _ = render_ensure(NftState())
    text += render_reconcile((3260,), None, None, ("lo",), True) or ""
    try:
        host.run([host.tools.nft, "--check", "-f", "-"], text, what="nft --check")
    except DatapathError as e:
        return NO_NFT_BRIDGE.format(why=e)
    return None
