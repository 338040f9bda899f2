# Two commands on a fresh machine: `make demo` runs the example job locally,
# `make test` installs what is missing and runs the test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
UV_INSTALL := $(VENV)/bin/uv pip install --compile-bytecode --python $(PY)
PYTEST_ARGS ?=

.PHONY: setup test soak bench demo crd manifests lock clean cluster-binaries cluster cluster-down

# constraints.txt pins every distribution, transitive ones included (the images install with it
# too): without it a new release of a dependency's dependency changed what the tests ran with.
# uv installs the lock: it hard-links each distribution from its cache (~/.cache/uv), so a fresh
# clone's venv (5 GB with torch's CUDA build) takes about 30 s where pip, copying it all, took about
# 3 minutes (README, Quickstart: What `make setup` costs). --compile-bytecode: where
# PYTHONDONTWRITEBYTECODE is set (as on the CI machines) nothing else would, and every process then
# compiled torch from source, twice the CPU of its import.
$(STAMP): requirements-test.txt constraints.txt rdzv/pyproject.toml trainer/pyproject.toml operator/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt uv
	$(UV_INSTALL) -q -r requirements-test.txt -c constraints.txt
	$(UV_INSTALL) -q -c constraints.txt -e rdzv -e trainer -e "operator[controller,local]"
	touch $@

setup: $(STAMP) cluster-binaries
	scripts/install-system-deps.sh

# A real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler),
# kubectl and helm at pinned releases, built from their Go modules into a cache outside
# the clone ($$DDPJOB_CACHE, default ~/.cache/ddpjob) and linked into .cluster/bin/.
# The first build takes long (see README, Quickstart: What `make setup` costs); later ones find the cache.
cluster-binaries:
	$(PYTHON) scripts/cluster/build-binaries.py

# `make cluster` starts that control plane as local processes with its state in .cluster/
# and returns once it is healthy; `make cluster-down` stops every process it started.
cluster: $(STAMP) cluster-binaries
	PYTHONPATH=sandbox $(PY) -m ddpjob_sandbox.control_plane up

cluster-down:
	PYTHONPATH=sandbox $(PY) -m ddpjob_sandbox.control_plane down

# Two pytest-xdist workers: the suite waits on timers (rendezvous last calls, backoffs) as much as
# it computes, so a serial run left about half of a 2-core machine idle (README, Quickstart).
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

soak: setup
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

bench: setup
	$(PY) -m bench

demo: setup
	scripts/demo.sh

clean:
	rm -rf $(VENV) runs

# Resolves requirements-test.txt afresh (in a scratch venv) and rewrites constraints.txt; run it
# after changing a pin or a dependency. tests/charts/test_dockerfile.py fails when the test
# environment or the Dockerfile strays from constraints.txt.
lock:
	scripts/lock.sh $(PYTHON)

# manifests/install.yaml = the chart's CRDs + its templates rendered with
# default values; a test fails when it drifts from the chart. The CRD comes
# first: it is generated from the pydantic model into the chart.
manifests: crd
	$(PY) scripts/generate-manifests.py

# The CRD is generated from the pydantic model (operator/ddpjob_operator/api/spec.py);
# tests/operator/api/test_crd.py fails when the checked-in files drift from it.
crd: $(STAMP)
	$(PY) -m ddpjob_operator.api.crd
	$(PY) -m ddpjob_operator.api.crd --reference > docs/reference.md
	$(PY) -m ddpjob_operator.api.crd --status-reference > docs/status.md
