"""Runnable example jobs (``torchrun -m ddpjob_trainer.examples.<name>``)."""
