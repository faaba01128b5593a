"""santhrottle.appliance: the deployable daemon and its OS adapters, in rooms.

    cli/       the `santhrottle` command line
    daemon/    santhrottled: loop, control socket, metrics, entry point
    datapath/  tc tree per device, member sets and their gate, rules, glide planner
    sensing/   diskstats, LVM, LIO (rtslib-fb), nvmet, sock_diag
    fleet/     several appliances, one array: membership, leaders, decisions (etcd)
    config/    the one home of every key, default and bound
    units.py   the one parser of durations and rates
    netns.py   entering a network namespace, one thread at a time

Imports go cli -> daemon -> datapath / sensing -> config -> units, never back
(tests/unit/test_layering.py); the CLI never imports daemon/main.py.
"""
