#!/bin/sh
# modprobe-changed.sh MODULE...: load kernel modules; print "loaded: NAME" for
# each one that was not loaded before (the role's changed_when).  Built-in
# modules never show in /proc/modules and modprobe of one is a no-op.
set -eu
before=" $(cut -d' ' -f1 /proc/modules | tr '\n' ' ') "
modprobe -a "$@"
for m in "$@"; do
    n=$(printf '%s' "$m" | tr - _)
    case "$before" in *" $n "*) continue ;; esac
    if grep -q "^$n " /proc/modules; then
        echo "loaded: $n"
    fi
done
