"""`ddpjob run`: a DDPJob as local torchrun agents, one per node, on this machine.

Each node starts from the launch plan the operator puts into its Pods
(`ddpjob_operator.render.launch`): the same command, args and environment, with the
rendezvous on loopback and the snapshot volume mapped to a local directory.
Node failures go through the operator's failure policy (`ddpjob_operator.decide.failure`).

    plan     the spec -> one local launch per node (pure)
    policy   node exits -> replace after backoff, or fail the job (pure, failure.py)
    state    metrics lines and runner events -> what the view shows (pure)
    view     the state -> a table (pure), drawn live on a TTY or as plain lines
    procs    starting, killing and stopping a node's whole process tree
    journal  events.jsonl (what the runner did), following the metrics file, the timeline files
    runner   the loop that ties them together, and the run directory
    summary  what the metrics prove at the end (via ddpjob_trainer.report.metrics.read_metrics)
    timeline the run on its clock from events.jsonl and the metrics (pure), written by
             journal as timeline.json; timeline_plot draws it (matplotlib, the [plot] extra)

Nothing here imports torch: the nodes are separate processes.
"""
