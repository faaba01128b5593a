#!/bin/sh
# lab-array.sh VG: make VG from the VM's extra disks (whole disks without
# partitions, filesystem or holders: the Vagrantfile's "array" disks).
# Prints "created VG on DISKS"; nothing when VG already exists.
set -eu
vg=$1
if vgs "$vg" >/dev/null 2>&1; then
    exit 0
fi
disks=""
for d in $(lsblk -dn -o NAME,TYPE | awk '$2 == "disk" {print $1}'); do
    [ -z "$(lsblk -n -o NAME "/dev/$d" | sed 1d)" ] || continue   # has partitions
    [ -z "$(lsblk -dn -o FSTYPE "/dev/$d")" ] || continue         # has a filesystem
    [ -z "$(ls "/sys/block/$d/holders")" ] || continue            # in use
    disks="$disks /dev/$d"
done
if [ -z "$disks" ]; then
    echo "no empty disk for VG $vg (the Vagrantfile adds them; see vagrant/README.md)" >&2
    exit 1
fi
# shellcheck disable=SC2086
pvcreate -q $disks
# shellcheck disable=SC2086
vgcreate -q "$vg" $disks
echo "created $vg on$disks"
