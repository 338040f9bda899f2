"""One reconciliation pass as pure functions: observed state in, status + Events + actions out.

Tiers (tests/operator/test_import_layers.py): shared types and rules (actions, observed,
failure, budget, conditions, creation) <- policies (capacity, topology, progress, stuck,
managed_etcd, last_valid, avoided_nodes, hang, straggler) <- plan, status <- reconcile. Nothing here performs I/O; controller/ and local/ execute the result.
"""
