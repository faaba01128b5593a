# santhrottle — one front door. CI runs the same targets (.ci/run -> make test).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# Host tools the test tiers use: netns/veth/HTB (iproute2), ipset, iptables, nftables; the
# rollout checks: ansible-core (the lab guest runs the host's), python3-apt, vagrant.
# The wire sensor's bench replays pcaps with tcpreplay; its in-kernel version is a tc
# program built with clang against libbpf's headers (make bpf), whose stack the unit tier
# checks with llvm's objdump (tests/unit/test_bpf_stack.py). The fleet's engine tests
# run a 3-member etcd cluster in namespaces (etcd-server; etcdctl from etcd-client for a
# look by hand). threshold = "auto" is checked on this kernel against the lab's plant as a
# loop device (labkit.plant.HostArray: nbdkit and its python plugin, nbdfuse from
# libnbd-bin, fuse3; fio loads it). The wire sensor is checked against Wireshark's
# dissectors (tshark) on real captures (tests/wire), whose maker also runs a TLS session
# in the lab (openssl). The shell completions are run in bash and zsh (tests/rollout).
# The lab (vagrant/qemu) installs its own packages through `make lab-deps`.
HOST_PKGS := iproute2 ipset iptables nftables kmod ansible-core python3-pip python3-apt vagrant vagrant-libvirt tcpreplay clang libbpf-dev llvm etcd-server etcd-client nbdkit nbdkit-plugin-python libnbd-bin fuse3 fio tshark openssl zsh
APT_STAMP := $(VENV)/.apt-host
VENV_STAMP := $(VENV)/.installed

.PHONY: setup bpf test test-unit test-fuzz test-sim test-rollout test-privileged lint bench bench-compare simulate lab-up lab clean

setup: $(APT_STAMP) $(VENV_STAMP) bpf

# The in-kernel wire sensor (bridge/bpf/wire.bpf.c -> .o, gitignored; the wheel's build
# compiles it too: buildsys/santhrottle_build.py).
BPF_OBJ := bridge/bpf/wire.bpf.o
bpf: $(BPF_OBJ)
$(BPF_OBJ): bridge/bpf/wire.bpf.c buildsys/santhrottle_build.py $(APT_STAMP)
	$(PY) buildsys/santhrottle_build.py --bpf

$(APT_STAMP): Makefile
	@missing=$$(for p in $(HOST_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "setup: apt-get install $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@mkdir -p $(VENV) && touch $@

# The lab kit (vagrant/labkit: the QEMU lab's runner and the experiments' kit) beside
# the project, editable, as the lab's guest venv has it.
$(VENV_STAMP): pyproject.toml vagrant/pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev]' -e vagrant
	@touch $@

# --durations: the run's slowest tests at its end, where a CI log's tail shows them
test: setup
	$(VPY) -m pytest --durations=20

# The tiers one by one (`make test` runs them all): pure logic, the fast loop (the unit
# tests live in tests/unit: collecting that folder alone is quicker); the fuzzers and
# corpus runs of the pure parts (randomized, with fixed seeds and case counts); whole
# simulated scenarios; the rollout tools; the host kernel in network namespaces (root);
# the real kernel under QEMU (lab-test).
test-unit: setup
	$(VPY) -m pytest -m unit tests/unit

test-fuzz: setup
	$(VPY) -m pytest -m fuzz

test-sim: setup
	$(VPY) -m pytest -m sim

test-rollout: setup
	$(VPY) -m pytest -m rollout

test-privileged: setup
	$(VPY) -m pytest -m privileged

# The bridge's hostile tests at the issue's sizes (root; about 12 minutes): 50,000 live
# connections, and initiator addresses churning at 1,000 a minute for 10 minutes (make
# test runs 10,000 connections and the same 10,000 addresses in 30 s)
.PHONY: soak-bridge
soak-bridge: setup
	SANTHROTTLE_LIVE_CONNECTIONS=50000 SANTHROTTLE_CHURN_S=600 \
		$(VPY) -m pytest -s -m privileged tests/privileged/test_bridge_hostile.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@# mypy and lint-imports see the folders as installed: santhrottle.controller, .sim,
	@# .appliance, .bridge (package-dir); mypy checks controller/ and sim/ strictly and
	@# follows appliance/ silently (pyproject's [tool.mypy])
	@mkdir -p build/typecheck/santhrottle && touch build/typecheck/santhrottle/__init__.py
	@for d in controller sim appliance bridge; do ln -sfn ../../../$$d build/typecheck/santhrottle/$$d; done
	MYPYPATH=build/typecheck $(VENV)/bin/mypy --strict -p santhrottle.controller -p santhrottle.sim
	PYTHONPATH=build/typecheck $(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/codespell

bench: setup
	$(VPY) tests/bench/run.py

# The benches side by side against another revision in one run: make bench-compare REV=v0.1
bench-compare: setup
	@test -n "$(REV)" || { echo "usage: make bench-compare REV=<git revision> [ARGS='datapath']"; exit 2; }
	$(VPY) tests/bench/compare.py --against $(REV) $(ARGS)

simulate: setup
	$(VENV)/bin/santhrottle-simulate sim/scenarios/paper.toml --plot results/simulate-paper.png

# The robustness sweep: 200 generated plants, the share meeting the spine's bounds
# per controller variant and the worst cases (sim/sweep.py); a few minutes.
.PHONY: sweep
sweep: setup
	$(VENV)/bin/santhrottle-simulate --sweep 200 --seed 1 --workers 2

clean:
	rm -rf $(VENV) build dist *.egg-info results

# The lab (real Debian kernel under QEMU/TCG): targets live with the lab itself.
-include vagrant/qemu/lab.mk
# Rollout (Ansible role, Vagrantfile, wheel): targets live with the role.
-include ansible/rollout.mk
