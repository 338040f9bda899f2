"""ddpjob's operator and command line, in rooms that follow the data flow.

    api  <-  render  <-  decide  <-  controller | local  <-  cli

api/         What users write and read: constants, generated names (and the one
             63-character rule), the spec model with its CEL rules, their Python twins and
             the parse entry points (validation), the status model, the clock format, and
             the CRD/reference generator.
render/      spec -> the objects a job wants, as plain dicts (pure): the torchrun launch
             plan, node pods and Service, the store pod, the managed etcd, the job's
             NetworkPolicy, labels, Kueue; objects.py lists them all, for the plan and
             `ddpjob render` alike.
decide/      spec + what was observed + the previous status + now -> new status, Events
             and actions (pure). Shared types and rules (actions, observed, failure,
             budget, conditions, creation, phases) at the bottom; one module per policy
             (capacity, topology, progress, stuck, managed_etcd, last_valid, avoided_nodes,
             hang, straggler, isolation, rendezvous_keys) above; plan, status and observation
             (what a pass reads) compose the policies; reconcile is one whole pass.
controller/  The only code that talks to the cluster and the only kopf, aiohttp and
             prometheus importer; it decides nothing: handler registration, the process
             state, pass scheduling, one pass (observe, then apply), API calls, the one
             Event poster, progress polling, etcd key cleanup, metrics, the process.
local/       `ddpjob run`: the same launch plan and failure policy, as local processes.
cli.py       `ddpjob validate | render | run`.

The rule: a room imports only the rooms to its left; controller/ and local/ (the two
executors) never import each other; inside a room a policy imports the room's shared
modules, never a sibling policy. tests/operator/test_import_layers.py enforces it.
Where things go: a new failure cause is a rule in decide/failure.py; a new rendered
object is a module in render/ with a CreateX action in decide/actions.py; a new status
field is a field of api/status.py's model, computed in decide/.
"""
