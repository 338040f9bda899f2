"""The report: what a node tells the operator while it trains, and how it gives up.

    record.py      the node's progress record, written to the termination message (ddpjob_rdzv's
                   progress record is the format both sides check)
    server.py      GET /progress, serving the record's last bytes to the operator's poll
    heartbeats.py  every rank's heartbeat in the process group's store, folded per node
    give_up.py     DoNotRetry: the record gets ``fatal`` and the torchrun agent is stopped
    metrics.py     rank 0's metrics lines (``ddpjob run`` and the benchmarks read them back)

Torch-free: the operator's ``ddpjob run`` imports metrics.py, and a script may call
``do_not_retry`` before anything heavy. This package imports nothing at import time.
"""
