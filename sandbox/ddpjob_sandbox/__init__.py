"""ddpjob_sandbox: a cluster on one machine, for the tests and the benchmarks (not for users).

Why a top-level folder, not tests/support/: the benchmarks (bench/) run the same machinery as
the tests, and a benchmark importing the test suite made bench depend on tests. Both now
import this package; the tests keep what only tests need (pytest fixtures in
tests/cluster/conftest.py and tests/support/fixtures.py, assertions in
tests/support/elastic_checks.py, scenarios beside the tests that use them). Why not installed:
nothing here ships; the Docker image and the wheels leave it out. pytest finds it through
``pythonpath`` in pyproject.toml, ``python -m bench`` through bench/__init__.py; it imports the
product packages (installed), never tests/.

Roles, one module each; each imports only modules below it in this list (and the product
packages), never tests/:

    metrics           following the trainer's metrics file: waits that read top to bottom
    operator_process  the real operator as a local subprocess logged in to the control plane
    control_plane/    a real control plane (etcd, kube-apiserver, controller manager, scheduler) as
                      local processes from the pinned binaries in .cluster/bin/ (make cluster)
    node/             the node agent: a kubelet that runs the pods as local process trees
                      (launch: volumes, DNS, env; container: process lifecycle; reporting: status)
    scripted          the kubelet's status writes played by a script, for pods nothing runs
    readers           what a user reads of a job: its pods, status, conditions, Events
    examples          the shipped example manifests, at test speed; kubectl apply
    torchrun          bare torchrun agents on loopback, the baseline the sandbox is measured against
    etcd              a real etcd on free loopback ports: the pinned 3.6, or Debian's 3.4 for torch's v2 backend
    client            KubeClient over HTTP, and kubectl, as any API client
    pod_status        what a kubelet reports: running / terminated / waiting bodies, conditions
    images            container images as local Python environments (one with torch and no ddpjob)
    jobs              the one DDPJob builder: make_spec, make_ddpjob (stored), make_manifest (applied)
    procs             processes: new-session start, marker-based /proc scan (ddpjob run's own),
                      group kill, who listens on a port
    binaries          where the pinned builds (.cluster/bin/) and Debian's etcd 3.4 are; the
                      command that provides a missing one
"""
