"""What users write and read: the DDPJob model, its names and constants, and the CRD made from it.

Imports nothing from the other rooms (see ddpjob_operator/__init__.py).
"""
