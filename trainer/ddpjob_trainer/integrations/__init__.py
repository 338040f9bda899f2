"""Integrations of :class:`ddpjob_trainer.Job` with high-level trainers, each an optional extra.

    lightning   DDPJobCallback for PyTorch Lightning (``pip install 'ddpjob-trainer[lightning]'``)
    huggingface DDPJobCallback for Hugging Face Transformers' Trainer (``pip install 'ddpjob-trainer[huggingface]'``)

Each module imports its framework at import time; nothing here is imported by ``ddpjob_trainer``.
"""
