"""One reconciliation pass as pure functions: observed state in, status + Events + actions out.

Tiers (tests/operator/test_import_layers.py): shared types and rules (actions, observed,
failure, budget, conditions, creation, bounds, phases) <- policies (capacity, topology,
progress, stuck, managed_etcd, last_valid, avoided_nodes, hang, straggler, isolation,
rendezvous_keys) <- plan, status, observation <- reconcile. Every decision of a pass is
here, as data: what to observe (observation), whether a job is finished or trains (phases),
the actions with every requeue (the progress poll's too) and the rendezvous keys to delete.
Nothing here performs I/O; controller/ and local/ execute the result.
"""
