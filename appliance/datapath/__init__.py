"""The throttle data path: netem delay classes, skbinfo ipsets, static mangle rules.

The room's modules and what each owns are listed in actuator.py's header;
docs/datapath.md is the manual.  The public names are re-exported here.
"""

from santhrottle.appliance.datapath.actuator import ApplyReport, CleanupReport, Datapath
from santhrottle.appliance.datapath.glide import GlidePlanner, LeafState
from santhrottle.appliance.datapath.host import Host, Tools, module_available
from santhrottle.appliance.datapath.members import Member
from santhrottle.appliance.datapath.names import (
    DatapathError,
    ForeignQdisc,
    NetemMissing,
    NotApplied,
)
from santhrottle.appliance.datapath.show import discover, glide_status, status, with_gate
from santhrottle.appliance.datapath.spec import DatapathSpec

__all__ = [
    "ApplyReport",
    "CleanupReport",
    "Datapath",
    "DatapathError",
    "DatapathSpec",
    "ForeignQdisc",
    "GlidePlanner",
    "Host",
    "LeafState",
    "Member",
    "NetemMissing",
    "NotApplied",
    "Tools",
    "discover",
    "glide_status",
    "module_available",
    "status",
    "with_gate",
]
