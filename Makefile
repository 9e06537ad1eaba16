# Every target bootstraps .venv on first use; editing pyproject.toml reinstalls. Each target
# installs what it needs: `make run` the broker alone, `make demo` the broker and Spark (the
# `analytics` extra), `make docs` MkDocs (the `docs` extra), `make test`, `make bench` and
# `make fuzz` the test tools as well.
VENV := .venv
PYTHON := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.run-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
DOCS_STAMP := $(VENV)/.docs-stamp
STAMP := $(VENV)/.installed-stamp

.PHONY: test bench fuzz run demo cluster docs clean console-vendor

$(RUN_STAMP): pyproject.toml
	test -d $(VENV) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -e .
	touch $@

$(DEMO_STAMP): pyproject.toml
	test -d $(VENV) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[analytics]'
	touch $@

$(DOCS_STAMP): pyproject.toml
	test -d $(VENV) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[docs]'
	touch $@

$(STAMP): pyproject.toml
	test -d $(VENV) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

# Two worker processes, each taking whole test files: most tests wait on real brokers, JVMs and
# disks rather than compute, so two overlap well on two cores. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PYTHON) -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

bench: $(STAMP)
	$(PYTHON) -m bench $(BENCH_ARGS)

# Hostile MQTT, WebSocket and native gRPC traffic against a fresh `sluice serve` while a healthy
# client keeps publishing (3 minutes by default): make fuzz FUZZ_ARGS='--seconds 30 --seed 7'
fuzz: $(STAMP)
	$(PYTHON) -m tests.fuzz.live_fuzz $(FUZZ_ARGS)

# Push subscriptions may call endpoints on this machine (a plain `sluice serve` refuses loopback).
# Sealed 8 MiB segments are tiered to ./tier as Parquet, and the local disk keeps the newest
# 16 MiB of the log (a plain `sluice serve` keeps everything locally and tiers nothing);
# messages are then limited to 4 MiB, half a segment.
# The tests start their README broker with these settings (tests/readme.py, make_run_env).
run: $(RUN_STAMP)
	SLUICE_PUSH_ALLOWED_SINKS="$${SLUICE_PUSH_ALLOWED_SINKS-127.0.0.0/8}" \
	SLUICE_TIER_URL="$${SLUICE_TIER_URL-file://$(CURDIR)/tier}" \
	SLUICE_STORE_SEGMENT_SIZE="$${SLUICE_STORE_SEGMENT_SIZE-8388608}" \
	SLUICE_STORE_RETENTION_MAX_BYTES="$${SLUICE_STORE_RETENTION_MAX_BYTES-16777216}" \
	SLUICE_CORE_MAX_MESSAGE_BYTES="$${SLUICE_CORE_MAX_MESSAGE_BYTES-4194304}" \
	$(VENV)/bin/sluice serve

# A one-member etcd and three nodes on 127.0.0.2-4 (needs etcd: apt-get install -y etcd-server).
cluster: $(RUN_STAMP)
	$(VENV)/bin/sluice dev-cluster $(CLUSTER_ARGS)

demo: $(DEMO_STAMP)
	$(VENV)/bin/sluice demo $(DEMO_ARGS)

# The documentation site from docs/ into site/; --strict makes any warning (a broken link or
# anchor) an error. The settings reference is generated from the code (mkdocs_hooks.py).
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The admin console's browser libraries (preact, htm, uPlot) from the npm registry at the versions
# protocols/admin/console/vendor/package.json pins; needs npm. The copies are committed.
console-vendor:
	protocols/admin/console/vendor/refresh.sh

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
