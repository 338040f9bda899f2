"""The operator process: kopf wiring and every call to the cluster.

The only room that imports kopf, aiohttp or prometheus_client, and it decides nothing: what to
observe, what to change and when to look again come from decide/ as data. handlers.py only
registers kopf's handlers; state.py is the process's state (memory.py: the API's answers no
watch shows); passes.py schedules each job's passes; job_pass.py is one pass: observe.py reads
(from cache.py's watches, live_progress.py's endpoints), decide.reconcile decides, apply.py
writes through kube.py (create-or-skip on 409, delete-or-skip on 404), events.py posts every
Event; etcd_cleanup.py deletes rendezvous keys outside the pass; metrics.py exports metrics.
"""
