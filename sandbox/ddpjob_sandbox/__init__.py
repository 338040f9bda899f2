"""ddpjob_sandbox: a cluster on one machine, for the tests and the benchmarks (not for users).

Why a top-level folder, not tests/support/: the benchmarks (bench/) run the same machinery as
the tests, and a benchmark importing the test suite made bench depend on tests. Both now
import this package; the tests keep what only tests need (pytest fixtures in
tests/support/fixtures.py, assertions in tests/support/elastic_checks.py, scenarios beside
the tests that use them). Why not installed: nothing here ships; the Docker image and the
wheels leave it out. pytest finds it through ``pythonpath`` in pyproject.toml, ``python -m
bench`` through bench/__init__.py; it imports the product packages (installed), never tests/.

Roles, one module each, dependencies pointing down the list:

    emulator/         the Kubernetes API server (kmock's emulator plus the API conventions)
    client            KubeClient over HTTP, and kubectl, as any API client
    cluster           the emulator served on loopback with the DDPJob CRD and a kubeconfig
    operator_process  the real operator (or any kopf module) as a subprocess logged in to it
    metrics           following the trainer's metrics file: waits that read top to bottom
    torchrun          bare torchrun agents on loopback, the baseline the sandbox is measured against
    etcd              a real etcd on free loopback ports
    procs             processes: new-session start, marker-based /proc scan (ddpjob run's own),
                      group kill, who listens on a port
"""
