"""The operator process: kopf wiring and every call to the cluster.

The only room that imports kopf, aiohttp or prometheus_client. handlers.py registers
the kopf handlers and runs passes (decide.reconcile), kube.py makes the API calls
(create-or-skip on 409, delete-or-skip on 404), live_progress.py reads the trainers'
progress endpoints, etcd_cleanup.py deletes rendezvous keys, metrics.py exports metrics.
"""
