"""spec -> the Kubernetes objects a job wants, as plain dicts (pure; imports api/ only).

launch.py is shared with `ddpjob run`: the same torchrun command and environment
run in a Pod and as a local process. common.py holds what every object carries;
kueue.py and preflight.py are parts of a node pod, pdb.py the job's PodDisruptionBudget.
"""
