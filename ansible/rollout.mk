# Rollout: the wheel, the Ansible role, the Vagrantfile (docs/install.md).
# Included by the top Makefile; VENV / VPY / PY come from there.
#
#   make wheel             dist/: sdist + wheel (python -m build), wheelhouse/ (its dependencies)
#                          and santhrottle-wheelhouse.tar (the same, one file for the role)
#   make wheel MYPYC=1 DIST=dist-compiled
#                          the same with the controller's tick compiled by mypyc
#                          (buildsys/compiled.py): a cp311 wheel for the targets' python3.11
#   make man               what the build generates (buildsys/santhrottle_build.py) into
#                          buildsys/generated/: man pages (man -l to read), completions,
#                          the example config
#   make role              the role's files generated from the config schema and the role's
#                          README (buildsys/role_config.py): templates/santhrottle.toml.j2,
#                          meta/argument_specs.yml, vars/main/schema.yml
#   make ansible-lint      ansible-lint, production profile, on ansible/
#   make vagrant-validate  vagrant validate: core config, libvirt and VirtualBox provider blocks
#   make rollout-check     all three
#   make deb               dist-deb/: the Debian package (debian/, built with dpkg-buildpackage:
#                          debhelper, dh-python, pybuild; the controller compiled by mypyc),
#                          its source package, and lintian's report (0 errors, or the
#                          target fails): dist-deb/lintian.txt
#
# The tools install themselves when missing: build (in ROLLOUT_VENV),
# ansible-lint (pip, into .venv), vagrant + vagrant-libvirt (apt, no recommends).
#
# The wheel installs, under its prefix (/usr/local for pip as root, else the venv):
# share/man/man8/santhrottle{,d}.8, share/man/man1/santhrottle-simulate.1,
# share/man/man5/santhrottle.toml.5, share/bash-completion/completions/santhrottle{,d,-simulate},
# share/zsh/site-functions/_santhrottle{,d,-simulate},
# share/santhrottle/{santhrottle.toml.example,systemd/santhrottled.service,grafana/santhrottle.json}.
# The man pages and completions come from the argparse parsers (argparse-manpage, shtab),
# the example config from the config schema, when the sdist/wheel is built.

DIST ?= dist
ROLLOUT_VENV ?= build/rollout-venv
ROLLOUT_PY := $(ROLLOUT_VENV)/bin/python
# The wheelhouse serves the targets' python (Debian 12: 3.11; RHEL 9: python3.11).
WHEELHOUSE_PYTHON ?= 3.11
# The last commit's time (no git: a fixed date): the build's timestamps.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 1700000000)
# 1: the wheel compiles the controller's tick with mypyc (buildsys/compiled.py)
MYPYC ?=
WHEEL_SOURCES := pyproject.toml setup.py README.md LICENSE buildsys/santhrottle_build.py buildsys/manpage.py buildsys/compiled.py \
  systemd/santhrottled.service docs/grafana/santhrottle.json docs/prometheus/santhrottle-rules.yml \
  $(shell git ls-files controller sim appliance bridge 2>/dev/null || find controller sim appliance bridge -type f)
VAGRANT_PKGS := vagrant vagrant-libvirt
VAGRANT_DIR := vagrant
# Validation writes machine state: keep it out of the checkout.
VAGRANT_VALIDATE_ENV := VAGRANT_DOTFILE_PATH=$(CURDIR)/build/vagrant-validate

.PHONY: wheel deb promtool man role ansible-lint vagrant-validate rollout-check

# A reproducible tar of the wheelhouse (sorted, fixed owner and date; POSIX pax, as
# wheel names pass ustar's 100 bytes: charset_normalizer's manylinux wheel), with any
# tar: python's tarfile (GNU tar's --sort is not everywhere, e.g. macOS).
define WHEELHOUSE_TAR
import pathlib, sys, tarfile
src, dest, epoch = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as t:
    for f in sorted(src.glob("*.whl")):
        info = t.gettarinfo(str(f), arcname="./" + f.name)
        info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = epoch, 0, 0, "", "", 0o644
        with open(f, "rb") as fh:
            t.addfile(info, fh)
endef
export WHEELHOUSE_TAR

# The lab test (tests/lab/test_ansible_lab.py) installs the role from dist/; the
# rollout tier reads dist-deb/ (tests/rollout/test_deb.py), the systemd guest
# (tests/systemd_guest/test_package_systemd.py) installs its package.
lab: wheel
test test-rollout lab-test: wheel deb promtool

$(ROLLOUT_PY):
	$(PY) -m venv $(ROLLOUT_VENV)
	$(ROLLOUT_PY) -m pip install -q --upgrade pip build

# Reproducible: the same sources give the same wheel, byte for byte, so the
# role reinstalls (and restarts the daemon) only when the code changed.
# The wheelhouse is also one tar: the role copies one file, not one per wheel.
$(DIST)/.built: $(WHEEL_SOURCES) ansible/rollout.mk | $(ROLLOUT_PY)
	rm -rf $(DIST)
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) SANTHROTTLE_MYPYC=$(MYPYC) $(ROLLOUT_PY) -m build --outdir $(DIST) .
	$(ROLLOUT_PY) -m pip download --quiet --disable-pip-version-check \
	  --only-binary=:all: --python-version $(WHEELHOUSE_PYTHON) \
	  --dest $(DIST)/wheelhouse $(DIST)/santhrottle-*.whl
	rm -f $(DIST)/wheelhouse/santhrottle-*.whl
	$(ROLLOUT_PY) -c "$$WHEELHOUSE_TAR" $(DIST)/wheelhouse $(DIST)/santhrottle-wheelhouse.tar $(SOURCE_DATE_EPOCH)
	@touch $@
	@ls -l $(DIST) $(DIST)/wheelhouse

wheel: $(DIST)/.built

# The Debian package, from the checkout's files as they are (tracked and new, not
# ignored) copied to build/deb/santhrottle-VERSION/: dpkg-buildpackage there (its build
# dependencies from debian/control through `apt-get build-dep`, as root), then lintian
# on the .changes. A native package (3.0 (native)): the checkout is its upstream.
DEB_DIST ?= dist-deb
DEB_BUILD := build/deb
DEB_TOOLS := dpkg-dev lintian
# Debian's own tools and python3 only (not a venv's, not pyenv's ahead in PATH)
DEB_ENV := env -u PYTHONPATH -u VIRTUAL_ENV -u PYTHONHOME PATH=/usr/sbin:/usr/bin:/sbin:/bin
DEB_VERSION = $(shell dpkg-parsechangelog -l debian/changelog -S Version)
# What the package is built from (the source package carries the whole checkout).
DEB_SOURCES := $(WHEEL_SOURCES) tests/sim/compiled_decisions.py \
  $(shell git ls-files --cached --others --exclude-standard debian buildsys 2>/dev/null)

define DEB_COPY_TREE
git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do [ -e "$$f" ] && printf '%s\0' "$$f"; done \
  | tar --null -T - -cf - | tar -xf - -C $(1)
endef

$(DEB_DIST)/.built: $(DEB_SOURCES)
	@missing=$$(for p in $(DEB_TOOLS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "deb: apt-get install $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	rm -rf $(DEB_BUILD) $(DEB_DIST)
	mkdir -p $(DEB_BUILD)/santhrottle-$(DEB_VERSION) $(DEB_DIST)
	$(call DEB_COPY_TREE,$(DEB_BUILD)/santhrottle-$(DEB_VERSION))
	cd $(DEB_BUILD)/santhrottle-$(DEB_VERSION) && { dpkg-checkbuilddeps 2>/dev/null || \
	  DEBIAN_FRONTEND=noninteractive apt-get build-dep -y -qq --no-install-recommends . ; }
	cd $(DEB_BUILD)/santhrottle-$(DEB_VERSION) && $(DEB_ENV) dpkg-buildpackage -us -uc
	$(DEB_ENV) lintian --fail-on error --display-info $(DEB_BUILD)/santhrottle_$(DEB_VERSION)_*.changes \
	  > $(DEB_DIST)/lintian.txt 2>&1; status=$$?; cat $(DEB_DIST)/lintian.txt; exit $$status
	cp $(DEB_BUILD)/santhrottle_$(DEB_VERSION)* $(DEB_BUILD)/santhrottle-dbgsym_$(DEB_VERSION)* $(DEB_DIST)/
	@touch $@
	@ls -l $(DEB_DIST)

deb: $(DEB_DIST)/.built

# promtool from Debian's prometheus package, unpacked, not installed (the package
# would run a Prometheus server): the rollout tier checks the alerting rules with it.
PROMTOOL := build/tools/promtool
$(PROMTOOL):
	rm -rf build/tools/prometheus-deb && mkdir -p build/tools/prometheus-deb
	cd build/tools/prometheus-deb && apt-get download -q prometheus && dpkg -x prometheus_*.deb root
	mv build/tools/prometheus-deb/root/usr/bin/promtool $@ && rm -rf build/tools/prometheus-deb
	$@ --version | head -1

promtool: $(PROMTOOL)

man: setup
	$(VPY) buildsys/santhrottle_build.py

role: setup
	$(VPY) buildsys/role_config.py

ansible-lint:
	@test -x $(VENV)/bin/ansible-lint || $(VPY) -m pip install -q ansible-lint
	cd ansible && PATH=$(CURDIR)/$(VENV)/bin:$$PATH ansible-lint

vagrant-validate:
	@missing=$$(for p in $(VAGRANT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "vagrant-validate: apt-get install --no-install-recommends $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	cd $(VAGRANT_DIR) && $(VAGRANT_VALIDATE_ENV) vagrant validate --ignore-provider
	cd $(VAGRANT_DIR) && $(VAGRANT_VALIDATE_ENV) VAGRANT_DEFAULT_PROVIDER=libvirt vagrant validate
	# VirtualBox is not in Debian: a VBoxManage that only answers --version
	# is all `vagrant validate` asks of it before checking the provider block.
	mkdir -p build/vbox-stub
	printf '#!/bin/sh\n[ "$$1" = --version ] && echo 7.0.14r161095\n' >build/vbox-stub/VBoxManage
	chmod +x build/vbox-stub/VBoxManage
	cd $(VAGRANT_DIR) && PATH=$(CURDIR)/build/vbox-stub:$$PATH $(VAGRANT_VALIDATE_ENV) \
	  VAGRANT_DEFAULT_PROVIDER=virtualbox vagrant validate

rollout-check: wheel ansible-lint vagrant-validate
