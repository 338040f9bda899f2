"""Tests of ddpjob_operator, in folders that mirror its rooms.

    api/         spec model, CRD and its CEL rules, generated names
    render/      spec -> Service and Pod dicts (golden files in golden/)
    decide/      failure, budget, status, plan, topology, capacity, stuck pods (pure, fixed clock)
    controller/  one controller module each, no API server (their I/O: tests/cluster/controller): the passes'
                 scheduling and the policy-first apply, metrics, main's flags, the progress poll,
                 etcd cleanup rules

The operator as a whole (every room through kopf, the helm-installed chart on the real control
plane) is tests/cluster/e2e/'s. Here: cli.py's tests, the import-layer rules, and the pure tests'
pod builders.
"""
