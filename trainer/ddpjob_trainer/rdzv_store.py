"""The old name of `python -m ddpjob_trainer.store_server`, kept working.

Store pods of jobs created before the rename run `python -m ddpjob_trainer.rdzv_store`
inside the user's image; an image built from a newer ddpjob_trainer must still start them.
"""
from ddpjob_trainer.store_server import main

if __name__ == "__main__":
    raise SystemExit(main())
