# The lab: Debian's real kernel under QEMU/TCG (vagrant/qemu/README.md).
# Included by the top Makefile; VENV / VPY come from there. The runner is the lab kit's
# (vagrant/labkit), installed in the project's venv by `make setup`.
LAB_PY = $(VPY)
LAB := vagrant/qemu/lab.py
# The known plant of make lab, lab-ci, lab-plant and lab-auto-fit (report.py's PAPER_ARRAY).
LAB_PLANT := c_ms=2,m_ms=5

.PHONY: lab-deps lab-up lab lab-light lab-nvme lab-curves lab-curves-nvme lab-ipv6 lab-tlp lab-nullb lab-test lab-ci lab-faults lab-plant lab-auto-fit lab-auto-fit-host lab-bridge lab-groups lab-levels lab-fleet lab-wire-corpus lab-run lab-clean

# apt-get install what the lab needs on the host (root; idempotent), with the
# known plant's nbdkit (lab.py --array nbd; docs/lab.md).
lab-deps: setup
	$(LAB_PY) $(LAB) --array nbd deps

# deps + Debian's kernel + initramfs + guest venv, all cached.
lab-up: setup
	$(LAB_PY) $(LAB) up

# The main job: the method paper's closed-loop experiment on the real kernel and the
# known plant (nbdkit on the host, C = 2 ms, m = 5 ms; 12 writers from 3 hosts, the
# 256 kB/s reader, T = 10, 15, 20 ms, the controller with the product's defaults and
# the best static delay beside it), with the report (vagrant/experiments/report.py
# --paper; docs/lab.md). The null_blk experiment of before: make lab-nullb.
lab: setup
	$(VPY) vagrant/experiments/report.py --paper $(ARGS)

# make lab with NVMe/TCP hosts (docs/lab.md, "NVMe/TCP hosts"): the reader and the three
# writer hosts are NVMe/TCP hosts of nvmet subsystems on the same VG and known plant, the
# bridge phases' resource their nvmet ports; no curves (make lab-curves-nvme).
# ARGS=--nvme-quickack: the hosts ACK at once ("Tail-loss probes with NVMe/TCP hosts").
lab-nvme: setup
	$(VPY) vagrant/experiments/report.py --paper --protocol nvme --no-curves --timeout 5400 $(ARGS)

# The data path's throttle curves (docs/datapath.md, "Throttle curves"): one initiator on
# the unthrottled disk, 64k qd1 and 256k qd4, reads (`read` mode) and writes (`all`, `ack`),
# 0-20 ms, target retransmissions per point; results/datapath-lab.json, -nvme.json.
# ARGS='--quick' for 4 delays of 64k qd1; ARGS='--repeat 3' for the fastest of three runs.
CURVES := read/read,all/write,ack/write
lab-curves: setup
	$(LAB_PY) $(LAB) run --timeout 3600 vagrant/experiments/datapath_lab.py sweep \
		--no-overhead --curves $(CURVES) $(ARGS)

lab-curves-nvme: setup
	$(LAB_PY) $(LAB) run --timeout 3600 vagrant/experiments/datapath_lab.py sweep \
		--protocol nvme --no-overhead --curves $(CURVES) $(ARGS)

# The lab's IPv6 initiators (topology.py --ipv6): an iSCSI initiator and the NVMe/TCP host
# in fd00:5374::/64 come up, and fio moves data over them; no santhrottled, ~3 min.
lab-ipv6: setup
	$(LAB_PY) $(LAB) run --timeout 900 vagrant/experiments/ipv6_lab.py \
		--out $(CURDIR)/results/ipv6-lab.json $(ARGS)

# Where the target's tail-loss probes come from: the paper's reader over iSCSI and over
# NVMe/TCP (with and without the host's quickack route), captured at the target, no
# santhrottled (docs/lab.md, "Tail-loss probes with NVMe/TCP hosts").
lab-tlp: setup
	$(LAB_PY) $(LAB) run --timeout 900 vagrant/experiments/tlp_lab.py \
		--out $(CURDIR)/results/tlp-lab.json $(ARGS)

# Work conservation (docs/lab.md, "Work conservation"): the paper's workload, one writer
# job per host, on a light plant (C 2 ms, m 3 ms/IO to start from, the slope moved so
# that the uncontrolled p95 is about 0.6 x 20 ms), T = 20 ms where it stays under 0.8 T,
# then three repetitions of the controlled phase, the observed one, the bridge's and the
# uncontrolled one: the writers' throughput against the uncontrolled phase's, ~30-35 min.
lab-light: setup
	$(VPY) vagrant/experiments/report.py --light $(ARGS)

lab-nullb: setup
	$(VPY) vagrant/experiments/report.py $(ARGS)

# CI's short closed-loop experiment (tests/closed_loop; docs/lab.md), ~3 min.
lab-ci: setup
	$(VPY) -m pytest -rs tests/closed_loop

# Issue 17's fault campaign (vagrant/experiments/faults.py; docs/faults.md): the
# product of HEAD under the closed loop's load, 7 faults x 5 repetitions, 25-40 min.
lab-faults: setup
	$(VPY) vagrant/experiments/faults.py $(ARGS)

# The lab test tier alone, whole: with the runs make test leaves out (SANTHROTTLE_LAB_FULL:
# the role in the QEMU lab, the systemd guest's full runs and fleet pair)
lab-test: setup wheel
	SANTHROTTLE_LAB_FULL=1 $(VPY) -m pytest -m lab -v

# The array as a known plant (docs/lab.md): nbdkit on the host, the LQ line
# L = C + m*Q measured through iSCSI and on the raw device, ~13 min.
# make lab-plant PLANT=c_ms=2,m_ms=5 ARGS='--reps 3 --modes raw,iscsi'
PLANT ?=
lab-plant: setup
	$(LAB_PY) $(LAB) --array nbd:$(or $(PLANT),$(LAB_PLANT)) run --timeout 2400 \
		vagrant/experiments/plant_lab.py $(ARGS)

# threshold = "auto" in the lab (docs/lab.md): the daemon's own LQ fit of the known plant
# (one vCPU, as make lab) while the writers step through 0-12, against the configured C and
# m; three repetitions, each with a fresh daemon, ~10 min.
lab-auto-fit: setup
	$(LAB_PY) $(LAB) --smp 1 --array nbd:$(or $(PLANT),$(LAB_PLANT)) run --timeout 1800 \
		vagrant/experiments/auto_fit_lab.py $(ARGS)

# The same fit on this host's own kernel (docs/lab.md): the plant as a loop device (nbdkit ->
# nbdfuse -> losetup), santhrottled in a namespace of its own, no QEMU; root, ~6 min.
lab-auto-fit-host: setup
	$(VPY) vagrant/experiments/auto_fit_host.py --array nbd:$(or $(PLANT),$(LAB_PLANT)) $(ARGS)

# Bridge mode in the lab (docs/bridge.md): the wire sensor's read latency against the
# target's diskstats and fio (iSCSI and NVMe/TCP, idle and under writers), then the
# per-packet cost of br_netfilter + iptables against nftables' bridge family, ~15 min.
lab-bridge: setup
	$(LAB_PY) $(LAB) --array nbd:$(or $(PLANT),$(LAB_PLANT)) run --timeout 3000 \
		vagrant/experiments/bridge_lab.py $(ARGS)

# Initiator groups in the lab (docs/groups.md, "In the lab"): two reader groups of
# different targets and priorities beside three writers, through the bridge, on an
# array whose idle read is 10 ms; then the simulator on the same plant and streams
# (groups_compare.py), ~12 min.
GROUPS_PLANT := c_ms=10,m_ms=5
lab-groups: setup
	$(LAB_PY) $(LAB) --array nbd:$(or $(PLANT),$(GROUPS_PLANT)) run --timeout 2400 \
		vagrant/experiments/groups_lab.py $(ARGS)
	$(VPY) vagrant/experiments/groups_compare.py

# Elastic levels, utilization and metering in the lab (docs/levels.md, "In the lab"): two
# tenant groups with IOPS levels 4/8/16/32 through the bridge on the m = 10 ms plant,
# bursts at QD1 between 1 IO/s, a kill -9 of the daemon, the wire's utilization against
# iostat -x at four loads; then the simulator on the same plant and schedules
# (levels_compare.py), ~10 min. levels_lab.py refuses a plant (PLANT=), levels or
# schedules (ARGS=) whose held level needs a delay over 25 ms (hold_delays(): TCP's
# timers in the guest are not scaled down with the rates).
LEVELS_PLANT := c_ms=10,m_ms=10
lab-levels: setup
	$(LAB_PY) $(LAB) --array nbd:$(or $(PLANT),$(LEVELS_PLANT)) run --timeout 2400 \
		vagrant/experiments/levels_lab.py $(ARGS)
	$(VPY) vagrant/experiments/levels_compare.py

# A fleet in the lab (docs/fleet.md): two bridge appliances on two fabrics, each iSCSI
# initiator on a dm-multipath device over both, a 3-member etcd cluster in namespaces;
# the closed loop (T = 15 ms, lease_ttl 3 s) uncontrolled, one appliance alone on
# fabric A's paths, the fleet; then kill -9 of the leader and a partition of its
# management link under load (vagrant/experiments/fleet_lab.py; results in the run
# dir's work/fleet/fleet-lab.json), ~12 min.
LAB_FLEET_TIMEOUT ?= 2400
lab-fleet: setup
	$(LAB_PY) $(LAB) --smp 2 --array nbd:$(or $(PLANT),$(LAB_PLANT)) run --timeout $(LAB_FLEET_TIMEOUT) \
		vagrant/experiments/fleet_lab.py $(ARGS)

# The wire sensor's corpus (tests/fixtures/wire/corpus/, tests/wire): real iSCSI and
# NVMe/TCP captures on the array side (vagrant/experiments/wire_corpus.py), ~6 min.
lab-wire-corpus:
	$(LAB_PY) $(LAB) run --timeout 3600 vagrant/experiments/wire_corpus.py \
		--out $(CURDIR)/tests/fixtures/wire/corpus $(ARGS)

# Boot and run one script of the checkout inside: make lab-run SCRIPT=path ARGS='...'
lab-run: setup
	@test -n "$(SCRIPT)" || { echo "usage: make lab-run SCRIPT=path/in/checkout [ARGS='...']"; exit 2; }
	$(LAB_PY) $(LAB) run -v $(SCRIPT) $(ARGS)

lab-clean: setup
	$(LAB_PY) $(LAB) clean

# The systemd guest (vagrant/qemu/systemd_guest.py): a Debian 12 root file system built with
# debootstrap (cached with the kernel), booted into systemd as PID 1 with Debian's kernel. Its
# tests (tests/systemd_guest, in make test): the Debian package (make deb) installed offline,
# started, reloaded, killed, stopped, removed and purged under systemd, the fault campaign's
# kill, restart and reload rows, the audit trail's journal fields; then the role's
# tests_*.yml against it, and two guests at once for tests_fleet.yml. Three boots, which
# a session starts beside its other tiers (tests/systemd_guest/conftest.py); make test
# leaves out the role's reload and restart runs and the fleet pair's boot (CI's time
# limit), which lab-systemd runs (SANTHROTTLE_LAB_FULL=1).
.PHONY: lab-systemd lab-systemd-run
lab-systemd: setup deb
	SANTHROTTLE_LAB_FULL=1 $(VPY) -m pytest -v -rs tests/systemd_guest

# Boot it and run one script of the checkout inside: make lab-systemd-run SCRIPT=path ARGS='...'
lab-systemd-run: deb
	@test -n "$(SCRIPT)" || { echo "usage: make lab-systemd-run SCRIPT=path/in/checkout [ARGS='...']"; exit 2; }
	$(VPY) vagrant/qemu/systemd_guest.py --deb $(wildcard dist-deb/santhrottle_*.deb) run -v $(SCRIPT) $(ARGS)
