"""Bridge mode's kernel set-up: the bridge itself, and bridged packets into iptables.

What it owns
    prepare_bridge(): before the data path is applied, the bridge between
    the initiator-side and the array-side port is made or adopted
    (bridge/netdev.py: STP off, forward delay 0, both ports members, all
    up) and br_netfilter's switch is turned on in the namespace, so the
    packets the bridge forwards traverse iptables' mangle POSTROUTING,
    where the physdev jump (rules.py) sends those to the initiators into
    the SANTHROTTLE chain.

Why br_netfilter and iptables
    The data path's sets, chain and classes are the target-host mode's
    (datapath.md): the same rules serve both modes, with one jump that
    matches the bridge port instead of the egress device. The switch
    (net.bridge.bridge-nf-call-iptables) costs every bridged IPv4 packet a
    pass through netfilter's hooks, which the jump's gate keeps to one
    rule while nobody is delayed (docs/bridge.md, measured costs).

    The switch is left on at stop: a bridge whose packets stop reaching
    iptables while an admin's own rules expect them would be a surprise,
    and the chain's jumps are gone by then.

Errors: DatapathError, one line naming the device or the missing module.
"""

from __future__ import annotations

import os
from pathlib import Path

from santhrottle.appliance.datapath.host import Host
from santhrottle.appliance.datapath.names import DatapathError
from santhrottle.bridge import netdev

NF_CALL_IPTABLES = "sys/net/bridge/bridge-nf-call-iptables"  # under /proc
NO_BR_NETFILTER = (
    "br_netfilter is not loaded (no /proc/{path}): `modprobe br_netfilter`, or add it to "
    "/etc/modules-load.d; bridged packets cannot reach the delay classes without it"
)


def prepare_bridge(
    host: Host, name: str, initiator_port: str, array_port: str, proc_root: str = "/proc"
) -> netdev.BridgeState:
    """Make or adopt the bridge, then let its packets reach iptables."""
    try:
        state = netdev.ensure(host.iproute(), name, initiator_port, array_port)
    except netdev.BridgeError as e:
        raise DatapathError(str(e)) from None
    except OSError as e:  # netlink refused (permissions, a device gone meanwhile)
        raise DatapathError(f"bridge {name}: {e.strerror or e}") from None
    enable_br_netfilter(host, proc_root)
    return state


def br_netfilter_loaded(host: Host, proc_root: str = "/proc") -> bool:
    """Whether host's namespace has br_netfilter's switch (the module is loaded)."""
    with host.inside():  # /proc/sys/net is the opening thread's namespace's
        return os.path.exists(Path(proc_root) / NF_CALL_IPTABLES)


def enable_br_netfilter(host: Host, proc_root: str = "/proc") -> None:
    path = Path(proc_root) / NF_CALL_IPTABLES
    with host.inside():
        try:
            with open(path, "w") as f:
                f.write("1\n")
        except FileNotFoundError:
            raise DatapathError(NO_BR_NETFILTER.format(path=NF_CALL_IPTABLES)) from None
        except OSError as e:
            raise DatapathError(f"cannot write {path}: {e.strerror or e}") from None
