# Entry points. `make demo` and `make test` are the two commands of README.md.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV        ?= .venv
CACHE       ?= $(CURDIR)/.cache
BASE_IMAGE  ?= local/bookworm-systemd
# The host's Python, never the controller venv's (PATH below puts it first, and a recursive
# make inherits that PATH): a step that runs beside the venv's build (make -j2) must never
# pick up a half-built .venv/bin/python3 without pip.
PYTHON      ?= $(shell PATH="$$(printf %s "$$PATH" | tr : '\n' | grep -vxF '$(CURDIR)/$(VENV)/bin' | paste -sd:)" \
                 python3 -c "import sys; print(sys.executable)")

export DEPLOY_CACHE_DIR := $(CACHE)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# The venvs are installed without bytecode (--no-compile, below): Python compiles what it imports on
# first use and keeps it. A PYTHONDONTWRITEBYTECODE in the caller's environment (some machine images
# set it) would make every process compile all it imports again, every time (what that cost:
# docs/performance.md, "Bytecode on the controller"). The targets below keep the bytecode.
unexport PYTHONDONTWRITEBYTECODE

TOOLS_VENV  := $(CACHE)/venvs/transformers-cpu
WHEELHOUSE  := $(CACHE)/wheelhouse/transformers-cpu
TINY_MODEL  := $(CACHE)/models/tiny-qwen3.5
CPU_LOCK    := roles/ml_env/files/locks/transformers-cpu.txt
# The gateway's lock (smg, roles/gateway) and its wheelhouse; the fleet scenario installs it offline.
GW_LOCK       := roles/ml_env/files/locks/smg-1.13.0.txt
GW_WHEELHOUSE := $(CACHE)/wheelhouse/smg-1.13.0
# The baked rehearsal image is tagged with the hash of what bakes it (the ml_env role, its locks,
# the bake playbook, the group_vars it reads) and the base image's build id (tools/mlenv-image-id),
# so a change to any of them bakes a new image.
MLENV_REPO := local/bookworm-systemd-mlenv
export MLENV_IMAGE := $(MLENV_REPO):$(shell tools/mlenv-image-id)

.PHONY: help demo test quick test-setup prereqs setup collections image image-mlenv wheelhouse tools-venv gateway-venv model sim-up sim-down prometheus \
        sglang-check-venv sglang-check-newest engine-flags lint pytest molecule reliability clean tiny-model-train

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16

demo: setup sim-up model ## set up, deploy to the local sim host, print the gate report
	ansible-playbook deploy.yml -l sim
	ansible-playbook playbooks/status.yml -l sim

# Every molecule scenario (each folder with a molecule.yml); `make molecule` runs them in
# MOLECULE_LANES lanes at once, the longest first by the last committed run (tools/test-stages).
SCENARIOS      ?= $(sort $(notdir $(patsubst %/molecule.yml,%,$(wildcard molecule/*/molecule.yml))))
MOLECULE_LANES ?= 2
# `make test` runs lint, then pytest, then the scenarios in MOLECULE_LANES lanes. TEST_BESIDE=1
# runs lint and pytest beside the lanes instead, at the lowest CPU priority (tools/test-stages
# --beside: a cgroup of the lowest CPU weight, and nice 19). Not the default, measured on a
# 2-core machine (issue 24): at nice 19 alone the scenarios' converges took 1.5-2.5x as long
# (autogroups gave each session pytest started a share of its own, and its nightly container
# shared the CPU as an equal), about what pytest costs before them; in the cgroup (cpu.shares 2)
# the converges took 1.3x as long, but pytest, starved, failed tests that wait on timeouts.
# (A third lane of scenarios, earlier, stretched adopt's load-sensitive switch gap past its bound.)
TEST_BESIDE    ?= 0
ifeq ($(TEST_BESIDE),1)
TEST_JOBS = tools/test-stages molecule --lanes $(MOLECULE_LANES) \
              --beside "lint=$(MAKE) --no-print-directory lint" \
              --beside "pytest=$(MAKE) --no-print-directory pytest" $(SCENARIOS)
else
TEST_JOBS = tools/test-stages run lint -- $(MAKE) --no-print-directory lint && \
            tools/test-stages run pytest -- $(MAKE) --no-print-directory pytest && \
            tools/test-stages molecule --lanes $(MOLECULE_LANES) $(SCENARIOS)
endif

# The test targets keep the payloads Ansible builds for its modules from one ansible-playbook run to
# the next, keyed by their sources (tools/controller-cache/ansiballz_cache.py; docs/performance.md: a
# no-op deploy of the sim host 28 -> 24 core-seconds). make demo and the benchmarks run a stock Ansible.
TEST_TARGETS := test quick pytest molecule reliability
$(TEST_TARGETS): export ANSIBALLZ_CONTROLLER_CACHE := $(CACHE)/ansiballz
$(TEST_TARGETS): export ANSIBLE_CALLBACK_PLUGINS := $(CURDIR)/tools/controller-cache
$(TEST_TARGETS): export ANSIBLE_CALLBACKS_ENABLED := ansiballz_cache

# Each stage is timed by tools/test-stages; the table (and the 40-minute budget line) is
# printed at the end whether the run passed or not, and the run's exit status is kept.
# The setup's steps run two at a time (downloads, debootstrap and venv builds overlap; each
# target's output is printed whole when it ends). Beside the lanes, lint's and pytest's output is in
# artifacts/make-test/lint.log and pytest.log (their last lines on the console).
test: ## every test: lint, pytest, molecule scenarios, then where the time went
	@tools/test-stages start
	@status=0; \
	tools/test-stages run setup -- $(MAKE) --no-print-directory -j2 --output-sync=target test-setup && \
	$(TEST_JOBS) || status=$$?; \
	tools/test-stages report; exit $$status

# The longest steps first (the baked image, the SGLang check venvs), so that make -j2 starts them
# as soon as what they need is there and the short ones fill the other slot.
test-setup: image-mlenv sglang-check-venv setup tools-venv gateway-venv model ## everything the tests start from

setup: prereqs $(VENV)/.installed collections image wheelhouse prometheus ## host programs, controller venv, collections, base image, wheelhouse, promtool

prereqs: ## docker, debootstrap and rsync (apt, when root) and a running docker daemon
	tools/host-prereqs

# --no-compile, here and in the venvs below: pip byte-compiled every module it installed (the
# ansible package's collections alone are tens of thousands of files), which took longer than
# the install itself; Python compiles what it imports on first use and keeps it. This venv:
# 68 s -> 26 s on the 2-core machine, pip's cache warm (issue 23).
# Then the repository's own package, deploytools (pyproject.toml), editable: filter_plugins/,
# the tools and the tests import it from the venv, and a change to its code needs no reinstall.
# Built with the venv's setuptools (pinned in the lock), without fetching a build environment.
$(VENV)/.installed: requirements/controller.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --no-compile -r requirements/controller.txt
	$(VENV)/bin/pip install -q --no-compile --no-deps --no-build-isolation -e .
	touch $@

collections: $(VENV)/.installed ## make the collections in requirements.yml available (offline-safe)
	ansible-galaxy collection install -r requirements.yml

image: prereqs ## build the local systemd base image if it is missing
	tools/build-base-image $(BASE_IMAGE)

# What the bake needs, not the whole setup: it starts while the other wheelhouses download.
# A new tag (tools/mlenv-image-id) bakes a new image and removes the older bakes no container uses.
image-mlenv: prereqs $(VENV)/.installed collections image $(WHEELHOUSE)/.complete ## bake the rehearsal venv into $$MLENV_IMAGE (other scenarios start from it)
	docker image inspect $(MLENV_IMAGE) >/dev/null 2>&1 || { \
	  ansible-playbook playbooks/bake-sim-image.yml -e bake_image=$(MLENV_IMAGE) -e bake_base_image=$(BASE_IMAGE) && \
	  { docker image ls --format '{{.Repository}}:{{.Tag}}' $(MLENV_REPO) | grep -vxF '$(MLENV_IMAGE)' | \
	    xargs -r docker image rm >/dev/null 2>&1 || true; }; }

# The wheelhouses the tests install from offline, one per lock: the CPU profile's engine, its
# candidate engine version (molecule/rollback upgrades to it and back) and the gateway.
WHEELHOUSE_LOCKS := transformers-cpu transformers-cpu-5.6.2 smg-1.13.0
wheelhouse: $(foreach lock,$(WHEELHOUSE_LOCKS),$(CACHE)/wheelhouse/$(lock)/.complete) ## download the tests' wheels once

$(CACHE)/wheelhouse/%/.complete: roles/ml_env/files/locks/%.txt tools/build-bundle tools/deploytools/build_bundle.py tools/deploytools/lock_file.py
	$(PYTHON) tools/build-bundle --lock $< --out $(@D)
	touch $@

# After prereqs: its apt-get (an update on a machine without package lists) must not race theirs.
prometheus: prereqs ## Debian's prometheus and node_exporter packages unpacked under the cache, pinned by sha256 (tests/monitoring, make lint)
	tools/fetch-prometheus

tools-venv: $(TOOLS_VENV)/.installed ## controller-side venv of the CPU lock (model generator, local server)

GW_VENV := $(CACHE)/venvs/smg
gateway-venv: $(GW_VENV)/.installed ## controller-side venv of the gateway's lock (tests/gateway/test_gateway.py)

$(GW_VENV)/.installed: $(GW_WHEELHOUSE)/.complete
	$(PYTHON) -m venv $(GW_VENV)
	$(GW_VENV)/bin/pip install -q --no-compile --no-index --no-deps --find-links $(GW_WHEELHOUSE) -r $(GW_LOCK)
	touch $@

$(TOOLS_VENV)/.installed: $(WHEELHOUSE)/.complete
	$(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/pip install -q --no-compile --no-index --no-deps --find-links $(WHEELHOUSE) -r $(CPU_LOCK)
	touch $@

# The rehearsal model is trained (so that the gate's correctness probe means something on the CPU)
# and committed: files/models/tiny-qwen3.5, made by `make tiny-model-train` (about 15 minutes of
# two busy cores, an hour when they are shared), copied here so that a fresh machine does not train.
REHEARSAL_MODEL  := files/models/tiny-qwen3.5
REHEARSAL_PROBES := roles/health_gate/files/probes/tiny-rehearsal.json
model: $(TINY_MODEL)/config.json ## the tiny rehearsal model (the committed, trained one) in the cache

$(TINY_MODEL)/config.json: $(wildcard $(REHEARSAL_MODEL)/*)
	rm -rf $(TINY_MODEL) && mkdir -p $(dir $(TINY_MODEL))
	cp -r $(REHEARSAL_MODEL) $(TINY_MODEL)

# The seeded random model of tools/make-tiny-model, taught the chat questions of the rehearsal
# probe set's eval families (tools/probe-set training-items: other questions than the eval's), then
# checked against the eval itself; the result replaces files/models/tiny-qwen3.5 (commit it).
TRAIN_DIR := $(CACHE)/models/tiny-train
tiny-model-train: $(VENV)/.installed $(TOOLS_VENV)/.installed ## train the rehearsal model anew into files/models/tiny-qwen3.5
	rm -rf $(TRAIN_DIR) && mkdir -p $(TRAIN_DIR)-items
	$(VENV)/bin/python tools/probe-set training-items $(REHEARSAL_PROBES) --count 3000 > $(TRAIN_DIR)-items/train.jsonl
	$(VENV)/bin/python tools/probe-set eval-items $(REHEARSAL_PROBES) > $(TRAIN_DIR)-items/eval.jsonl
	$(TOOLS_VENV)/bin/python tools/make-tiny-model --out $(TRAIN_DIR) --train $(TRAIN_DIR)-items/train.jsonl \
	  --steps 1500 --check $(TRAIN_DIR)-items/eval.jsonl
	rm -rf $(REHEARSAL_MODEL) && cp -r $(TRAIN_DIR) $(REHEARSAL_MODEL) && chmod 0644 $(REHEARSAL_MODEL)/*

sim-up: setup ## start the local sim host (systemd container "sim")
	ansible-playbook playbooks/sim-host.yml

sim-down: ## remove the local sim host
	ansible-playbook playbooks/sim-host.yml -e sim_host_state=absent

# ansible-lint's profile and strictness are in .ansible-lint; a key given twice in one YAML mapping
# (a merge key's value overridden included) fails the lint instead of Ansible's warning.
lint: $(VENV)/.installed ## yamllint, ansible-lint (production profile, no warning), argument_specs check, promtool check rules, ruff
	yamllint -s .
	ANSIBLE_DUPLICATE_YAML_DICT_KEY=error ansible-lint
	$$(tools/fetch-prometheus --promtool) check rules roles/monitoring/files/rules/*.yml  # fetched once (make setup)
	$(VENV)/bin/python tools/check-argument-specs
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Three workers on the CI machine's two cores: with two, a quarter of the CPU stayed idle (sampled
# every 5 s: tests that wait on servers, timeouts and subprocesses); with three, 5-15 % idle and the
# whole of tests/ took 422 s against 470-560 s with two (2026-12-05). A file's tests stay on one worker and in order. The
# files are handed out in collection order, which tests/conftest.py makes the slowest first (by
# tests/durations.json), so that no slow file runs alone at the end; --no-loadscope-reorder keeps
# pytest-xdist from ordering them by their number of tests instead.
PYTEST_WORKERS ?= 3
pytest: setup tools-venv gateway-venv sglang-check-venv model ## unit and integration tests (tests/)
	$(VENV)/bin/pytest -q --durations=10 -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

# One check venv per SGLang version with a lock (tests/locks/sglang-check-VERSION.txt); make test
# builds and checks the versions tools/build-sglang-check-venv builds by default (0.5.11, 0.5.17).
sglang-check-venv: $(VENV)/.installed ## controller-side venvs with real SGLang 0.5.11 and 0.5.17 for their own parsers (tests/launch_plan)
	DEPLOY_CACHE_DIR=$(CACHE) tools/build-sglang-check-venv

# The fast inner loop between full runs (README): lint the files that changed since BASE (default
# HEAD: the work tree's changes) and run the test files that name them (tools/quick-tests --list says
# which, and why). Not a substitute for make test: molecule scenarios are named, not run.
BASE ?= HEAD
quick: $(VENV)/.installed ## lint what changed since BASE (default HEAD) and run the tests that cover it
	$(VENV)/bin/python tools/quick-tests --base $(BASE) --workers $(PYTEST_WORKERS)

# The newest SGLang (0.5.23): its check venv and its tests (pytest marker sglang_newest), which
# make pytest deselects. Not part of make test.
SGLANG_NEWEST ?= 0.5.23
sglang-check-newest: $(VENV)/.installed ## build the newest SGLang's check venv (SGLANG_NEWEST) and run its tests; not in make test
	DEPLOY_CACHE_DIR=$(CACHE) tools/build-sglang-check-venv $(SGLANG_NEWEST)
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m sglang_newest tests/launch_plan

# Add an SGLang version (docs/launch-plan.md, "Adding an SGLang version"): build its check venv
# from tests/locks/sglang-check-$(ENGINE_VERSION).txt and write its flag table from its own parser.
engine-flags: $(VENV)/.installed ## write the flag table of SGLang ENGINE_VERSION=X.Y.Z from its own parser
	@test -n "$(ENGINE_VERSION)" || { echo "engine-flags: give the SGLang version, e.g. make engine-flags ENGINE_VERSION=0.5.17" >&2; exit 2; }
	DEPLOY_CACHE_DIR=$(CACHE) tools/build-sglang-check-venv --dump-flags $(ENGINE_VERSION)

molecule: setup model image-mlenv ## all molecule scenarios (MOLECULE_LANES at a time), each action timed
	tools/test-stages start
	@status=0; tools/test-stages molecule --lanes $(MOLECULE_LANES) $(SCENARIOS) || status=$$?; \
	tools/test-stages report; exit $$status

# make test fails when the scenario's rows or outcomes differ from docs/reliability-results.json;
# this target, which writes them anew, does not compare.
reliability: setup model image-mlenv ## bad input, faults, secrets (molecule reliability) -> docs/reliability.md
	RELIABILITY_CHECK_ROWS=0 molecule test -s reliability
	$(VENV)/bin/python tools/reliability-report
	cp artifacts/reliability/results.json docs/reliability-results.json

clean: sim-down ## remove the sim host and local caches
	rm -rf $(CACHE)
