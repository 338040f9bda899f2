"""`python -m ddpjob_trainer.store_server --port 29400`: ddpjob's c10d rendezvous store.

The store is ddpjob_rdzv/store_program.py, a program that needs only Python and torch: the
operator's store pod runs its text with `python -c` in the job's image (which may not have
ddpjob), and `ddpjob run` likewise. This module runs the same program under its older command,
for store pods rendered before that change and for people who start a store by hand.

torchrun's c10d backend normally runs its TCPStore inside one agent, so losing that node ends
the rendezvous for everyone (measured: the other agents exit within ~2 s). With this store
running apart and every agent started with `is_host=false` in its rdzv conf, the store outlives
any training node, and a lost node is replaced while the others keep their rendezvous.
"""
from __future__ import annotations

from ddpjob_rdzv.store_program import DEFAULT_PORT, main, parse_args

__all__ = ["DEFAULT_PORT", "main", "parse_args"]

if __name__ == "__main__":
    raise SystemExit(main())
