"""What users write and read: the DDPJob model, its names and constants, and the CRD made from it.

spec.py is the spec model (types, descriptions, defaults, CEL); status.py the status model;
base.py what both share; validation.py the Python twins of the CEL rules, pydantic's errors in
a person's words, and the entry points that read user input (parse_spec, parse_job);
job_ref.py a job's identity; crd.py the CRD and the field reference, generated from the models.
Imports nothing from the other rooms (see ddpjob_operator/__init__.py).
"""
