"""santhrottled, in rooms:

core/     the daemon itself: the tick and the convergence (loop.py's Daemon and its
          public methods), the runtime state (pins, pause, overrides, adoption) and its
          file, reload, groups, hosts, counters, the fleet's side of the tick
control/  the control socket: the server, the client, the requests and the commands
status/   what the daemon shows: the status view and the Prometheus metrics
main.py   the entry point that wires them (nothing imports it); sdnotify.py

The import direction is main -> control -> status -> core (the contracts in
.importlinter).
"""
