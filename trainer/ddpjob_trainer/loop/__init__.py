"""The Trainer's loop parts that are not the loop: its configuration, the RNG streams it saves
and restores per rank, and the sampler that resumes mid-epoch at any world size.

    config.py   TrainerConfig and its rules (torch-free)
    rng.py      seeding, saving and restoring every RNG a step draws from
    sampler.py  ResumableSampler (also for a loop of your own under Job)
"""
