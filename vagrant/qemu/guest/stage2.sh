#!/bin/sh
# santhrottle lab, stage 2: PID 1 in the guest's real root (see
# vagrant/qemu/initramfs/init).  Finishes the mounts, then runs the command
# the host left in /shared/work/cmd as root with /bin/sh, its output going to
# /shared/work/output.log and to the serial console, its exit status to
# /shared/work/status.  Then powers the guest off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=dumb
W=/shared/work

# The host's mounts stage 1 made under /tmp, /run or /dev/shm (a checkout cloned in
# /tmp, a cache there) are moved aside while fresh tmpfs go on those three, then back
# to their paths.
KEEP=/.lab/keep
mkdir -p $KEEP
kept=
for m in $(awk '$2 ~ "^/(tmp|run|dev/shm)/" {print $2}' /proc/mounts); do
    n=$KEEP/$(echo "$m" | tr / _)
    mkdir -p "$n" && mount --move "$m" "$n" && kept="$kept $m"
done
mkdir -p /dev/pts
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 shm /dev/shm
mount -t tmpfs -o mode=0755 run /run
mount -t tmpfs -o mode=1777 tmp /tmp
for m in $kept; do
    mkdir -p "$m" && mount --move "$KEEP/$(echo "$m" | tr / _)" "$m" ||
        echo "lab-stage2: could not put $m back" >/dev/console
done
mkdir -p /run/lock /var/lib /var/log /var/tmp /var/cache
chmod 1777 /var/tmp
ln -sfn /run /var/run
ln -sfn /run/lock /var/lock
modprobe configfs 2>/dev/null
mount -t configfs configfs /sys/kernel/config
hostname lab 2>/dev/null || echo lab >/proc/sys/kernel/hostname
ip link set lo up
[ -f /etc/machine-id ] || : >/etc/machine-id

if [ -f "$W/env" ]; then
    set -a
    . "$W/env"
    set +a
fi
export SANTHROTTLE_IN_GUEST=1 SANTHROTTLE_LAB_WORK=$W
echo "lab-stage2: up after $(cut -d' ' -f1 /proc/uptime) s; running $W/cmd" >/dev/console
cd "${SANTHROTTLE_LAB_CHECKOUT:-/}" || cd /
# Output goes to a file, not a pipe: daemons the command leaves behind
# (iscsid, ...) must not keep the run open.  tail mirrors it to the console.
: >"$W/output.log"
/bin/sh "$W/cmd" </dev/null >>"$W/output.log" 2>&1 &
cmd_pid=$!
tail -n +1 -s 0.2 -f --pid=$cmd_pid "$W/output.log" >/dev/console 2>&1 &
tail_pid=$!
wait $cmd_pid
echo $? >"$W/status.tmp"
wait $tail_pid
mv "$W/status.tmp" "$W/status"
echo "lab-stage2: command finished after $(cut -d' ' -f1 /proc/uptime) s, status $(cat $W/status 2>/dev/null)" >/dev/console
sync
busybox poweroff -f 2>/dev/null
echo o >/proc/sysrq-trigger
sleep 10
