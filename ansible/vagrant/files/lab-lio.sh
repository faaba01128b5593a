#!/bin/sh
# lab-lio.sh IQN BACKSTORE DEVICE PORTAL_IP...: one iSCSI target, one LUN, open to
# every initiator (demo mode: generated ACLs, no CHAP; the lab's private
# networks only), listening on PORTAL_IP:3260 for each PORTAL_IP (one per
# fabric in the fleet lab). Saved for the next boot.
set -eu
iqn=$1 name=$2 dev=$3
shift 3
targetcli set global auto_add_default_portal=false >/dev/null
targetcli /backstores/block create name="$name" dev="$dev"
targetcli /iscsi create "$iqn"
targetcli "/iscsi/$iqn/tpg1/luns" create "/backstores/block/$name"
for ip in "$@"; do
    targetcli "/iscsi/$iqn/tpg1/portals" create "$ip" 3260
done
targetcli "/iscsi/$iqn/tpg1" set attribute authentication=0 generate_node_acls=1 \
    demo_mode_write_protect=0 cache_dynamic_acls=1
targetcli saveconfig
