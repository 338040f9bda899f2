"""Every fixed name the operator shares with Kubernetes, torchrun and its users.

One module so that a label key or a condition reason is spelled once; the pure
modules (render, plan, status) and the Kubernetes wiring all import from here.
"""

from __future__ import annotations

from ddpjob_rdzv import contract
from ddpjob_rdzv.contract import fast_tier, progress_record

# --- API -------------------------------------------------------------------
GROUP = "ddpjob.io"  # API group of the DDPJob custom resource
VERSION = "v1alpha1"  # served and stored version (alpha: fields may still change)
API_VERSION = f"{GROUP}/{VERSION}"  # apiVersion written in manifests and ownerReferences
KIND = "DDPJob"  # kind of the custom resource
PLURAL = "ddpjobs"  # URL path segment and first part of the CRD name
SINGULAR = "ddpjob"  # name kubectl accepts for one object
SHORT_NAMES = ["ddpj"]  # `kubectl get ddpj`
CATEGORIES = ["all"]  # `kubectl get all` lists DDPJobs next to their pods
CRD_NAME = f"{PLURAL}.{GROUP}"  # metadata.name of the CustomResourceDefinition

# --- Labels and annotations --------------------------------------------------
LABEL_APP_NAME = "app.kubernetes.io/name"  # recommended label: the application
LABEL_INSTANCE = "app.kubernetes.io/instance"  # recommended label: this job's name
LABEL_COMPONENT = "app.kubernetes.io/component"  # recommended label: the role of the object
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"  # recommended label: who writes the object
LABEL_JOB_NAME = f"{GROUP}/job-name"  # selects every object of one job; with LABEL_COMPONENT=node, its node pods
LABEL_NODE_INDEX = f"{GROUP}/node-index"  # the node index 0..replicas-1 of a pod
# On node pods of a job whose rendezvous is an etcd of its own choosing (rdzvEndpoints): what the
# chart's shared etcd admits (etcd-networkpolicy.yaml). Reserved: podOverrides may not set it.
LABEL_ETCD_CLIENT = f"{GROUP}/etcd-client"

APP_NAME = "ddpjob"  # value of LABEL_APP_NAME
COMPONENT_NODE = "node"  # value of LABEL_COMPONENT on node pods
COMPONENT_RENDEZVOUS = "rendezvous"  # value of LABEL_COMPONENT on the headless Service
MANAGED_BY = "ddpjob-operator"  # value of LABEL_MANAGED_BY

# --- Pods ------------------------------------------------------------------
CONTAINER_NAME = "trainer"  # the one container of a node pod
RDZV_PORT_NAME = "rdzv"  # name of the c10d rendezvous port on Service and container
DEFAULT_RDZV_PORT = 29400  # torchrun's conventional c10d rendezvous port
DEFAULT_ETCD_PORT = 2379  # etcd client port, used when an endpoint has no port
SNAPSHOT_VOLUME = "snapshots"  # pod volume name of spec.snapshot.volume
SHM_VOLUME = "dshm"  # pod volume name of the memory-backed /dev/shm
SHM_MOUNT_PATH = "/dev/shm"  # where DataLoader workers and NCCL put shared memory
RDZV_SECRET_VOLUME = "rdzv-credentials"  # pod volume name of spec.elasticPolicy.rdzvSecretName
RDZV_SECRET_MOUNT_PATH = "/etc/ddpjob/rdzv"  # read-only mount of that Secret; rdzv_conf points here
ZYGOTE_VOLUME = "zygote"  # pod volume name of the fork server's emptyDir (fastRestart, module jobs)
ZYGOTE_MOUNT_PATH = "/run/ddpjob-zygote"  # where the trainer container alone mounts it
COMPONENT_ETCD = "etcd"  # value of LABEL_COMPONENT on a job's managed etcd pod and Service
ETCD_CONTAINER = "etcd"  # the one container of the managed etcd pod
MANAGED_ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.21"  # default managed etcd (3.5: the last with the v2 API)
# Every pod the operator renders runs as this non-root uid/gid unless spec.podOverrides says
# otherwise: the trainer and operator images' USER (Dockerfile), and distroless's "nonroot"
# account, which the etcd image (distroless static, no USER of its own) carries too.
POD_UID = 65532  # runAsUser (Pod Security "restricted" wants non-root)
POD_GID = 65532  # runAsGroup and fsGroup: volumes become group-writable for the non-root user

# --- Environment of the trainer --------------------------------------------
# Each name is defined once, in the contract both sides import (ddpjob_rdzv/contract/__init__.py).
ENV_SNAPSHOT_DIR = contract.SNAPSHOT_DIR_ENV  # where the trainer reads and writes snapshots
ENV_JOB_NAME = contract.JOB_NAME_ENV  # metadata.name of the job, for logs and metrics
ENV_NODE_INDEX = contract.NODE_INDEX_ENV  # node index of this pod or local agent
ENV_FAST_SNAPSHOT_ROOT = fast_tier.FAST_ROOT_ENV  # where the fast snapshot tier keeps its copies
ENV_NAMESPACE = contract.NAMESPACE_ENV  # namespace of the job ("" for local runs)
ENV_JOB_UID = contract.JOB_UID_ENV  # metadata.uid of the job (a local run's rendezvous id): the progress record's job
ENV_POD_NAME = contract.POD_NAME_ENV  # the node pod's name (pods only): the progress record's pod
# Where the trainer's own listeners bind (ddpjob_trainer/listen.py): unset in pods (every interface,
# reached at the pod IP); ddpjob run sets loopback.
ENV_LISTEN_HOST = contract.LISTEN_HOST_ENV
ENV_ZYGOTE_SOCKET = contract.ZYGOTE_SOCKET_ENV  # fastRestart: the socket file of the node's worker fork server
# fastRestart: the secret each node's agent makes and hands its workers (never rendered: a pod's spec is readable)
ENV_ZYGOTE_TOKEN = contract.ZYGOTE_TOKEN_ENV
ZYGOTE_MODULE = "ddpjob_trainer.zygote"  # fastRestart: python -m entry point of that server's client (trainer image)
# spec.snapshot.onUnreadable: what the trainer does when no snapshot can be read (Fail, StartOver);
ENV_SNAPSHOT_ON_UNREADABLE = contract.SNAPSHOT_ON_UNREADABLE_ENV

# --- Status ----------------------------------------------------------------
PHASE_PENDING = "Pending"  # accepted; fewer than minReplicas nodes running yet
PHASE_RUNNING = "Running"  # at least minReplicas nodes running
PHASE_RESTARTING = "Restarting"  # a failed node is being replaced (maybe waiting for backoff)
PHASE_SUCCEEDED = "Succeeded"  # every node's torchrun agent exited 0
PHASE_FAILED = "Failed"  # permanent error, restart budget spent, deadline passed or invalid spec
PHASE_SUSPENDED = "Suspended"  # runPolicy.suspend is true; no pods run
FINISHED_PHASES = (PHASE_SUCCEEDED, PHASE_FAILED)  # phases that never change again

COND_RUNNING = "Running"  # True while the phase is Running
COND_RESTARTING = "Restarting"  # True while failed nodes are replaced
COND_SUCCEEDED = "Succeeded"  # True once the job succeeded
COND_FAILED = "Failed"  # True once the job failed
COND_SUSPENDED = "Suspended"  # True while suspended
COND_INVALID_SPEC = "InvalidSpec"  # True when the spec breaks a rule the CRD schema could not check
PHASE_CONDITION = {  # the condition that is True in each phase (Pending has none)
    PHASE_RUNNING: COND_RUNNING,
    PHASE_RESTARTING: COND_RESTARTING,
    PHASE_SUCCEEDED: COND_SUCCEEDED,
    PHASE_FAILED: COND_FAILED,
    PHASE_SUSPENDED: COND_SUSPENDED,
}

# Reasons (CamelCase, machine-readable) used in conditions and Events.
REASON_CREATED = "Created"  # the job was accepted and its first pods are being created
REASON_RUNNING = "NodesRunning"  # enough nodes run to train
REASON_NODE_FAILED = "NodeFailed"  # a node pod failed with a retryable error
REASON_NODE_DISRUPTED = "NodeDisrupted"  # a node pod was evicted or preempted
REASON_BACKOFF = "BackoffLimitNotElapsed"  # waiting before replacing a failed node
REASON_SUCCEEDED = "AllNodesSucceeded"  # every node exited 0
REASON_PERMANENT_ERROR = "PermanentExitCode"  # a node exited with a code listed as permanent
REASON_RESTARTS_EXHAUSTED = "RestartBudgetExhausted"  # failurePolicy.maxRestarts spent
REASON_TRAINER_NOT_IN_IMAGE = "TrainerNotInImage"  # a node used ddpjob-trainer, which spec.image lacks
REASON_DEADLINE = "DeadlineExceeded"  # runPolicy.activeDeadlineSeconds passed
REASON_SUSPENDED = "Suspended"  # runPolicy.suspend set
REASON_RESUMED = "Resumed"  # runPolicy.suspend cleared
REASON_INVALID_SPEC = "InvalidSpec"  # the spec breaks a validation rule
REASON_SPEC_VALID = "SpecValid"  # a previously invalid spec is valid again

# Messages that go with the reasons ({placeholders} are filled by status.py).
MSG_NODE_COUNTS = "{running} of {desired} node pods running (minReplicas {min}, maxReplicas {max})"
MSG_PENDING = "waiting for nodes: " + MSG_NODE_COUNTS  # REASON_CREATED
MSG_RUNNING = MSG_NODE_COUNTS  # REASON_RUNNING
MSG_WAITING_FOR_REPLACEMENTS = "waiting for replacement nodes: " + MSG_NODE_COUNTS  # REASON_NODE_FAILED
MSG_RESTARTING = ("replacing failed node pods {when}; {restarts} of "  # REASON_NODE_FAILED / REASON_BACKOFF
                  "spec.failurePolicy.maxRestarts ({max}) incidents used")
MSG_NODE_FAILED = "{what}; {restarts} of spec.failurePolicy.maxRestarts ({max}) used"  # REASON_NODE_FAILED
MSG_NODE_DISRUPTED = "{what}; disruptions do not use the restart budget"  # REASON_NODE_DISRUPTED
MSG_PERMANENT_ERROR = "{what}; the code is in spec.failurePolicy.permanentExitCodes"  # REASON_PERMANENT_ERROR
MSG_TRAINER_NOT_IN_IMAGE = (  # REASON_TRAINER_NOT_IN_IMAGE
    "{what}; it needs ddpjob-trainer, which spec.image lacks: install it in the image (pip install "
    "ddpjob-trainer) or turn off what needs it (spec.elasticPolicy.fastRestart, rdzvBackend etcd-v3, a "
    "ddpjob_trainer module); not retried")
MSG_RESTARTS_EXHAUSTED = ("{restarts} failure incidents exceed "  # REASON_RESTARTS_EXHAUSTED
                          "spec.failurePolicy.maxRestarts ({max})")
MSG_DEADLINE = "the job ran longer than spec.runPolicy.activeDeadlineSeconds ({deadline})"  # REASON_DEADLINE
MSG_SUCCEEDED = "training finished: {count} node pod(s) exited 0"  # REASON_SUCCEEDED
MSG_FINISHING = "training finishing: {done} of {total} node pods exited 0"  # REASON_RUNNING, after a success
# A node pod exits 0 only once torchrun saw all of its workers finish, so training is over; the
# others follow within seconds (measured: final snapshot -> last pod exited 2-8 s in the sandbox).
# One still running this long after the first exit waits in torchrun's exit barrier (300 s) or
# restarted a worker: it holds a node for nothing, so it is stopped.
FINISH_GRACE_SECONDS = 15.0
REASON_FINISHING = "WaitingForNodesToFinish"  # training finished; some node pods still run
MSG_FINISHING_WAIT = ("waiting for {count} node pod(s) after training finished: {pods}; those still "  # REASON_FINISHING
                      "running {grace:.0f}s after the first node pod exited 0 are stopped")
# A node that exits non-zero after another exited 0 (a replacement that reached the rendezvous
# after torchrun closed it on success exits 1 with RendezvousClosedError) changes nothing: the
# nodes that finished decide the job's result (decide/failure.py after_finish).
REASON_EXITED_AFTER_FINISH = "ExitedAfterFinish"  # a node exited non-zero after training finished; not counted
MSG_EXITED_AFTER_FINISH = ("{what} after training finished; not counted: the nodes that "  # REASON_EXITED_AFTER_FINISH
                           "finished decide the job's result")
REASON_FINISH_STOPPED = "StoppedAfterFinish"  # node pods still running past FINISH_GRACE_SECONDS were deleted
MSG_FINISH_STOPPED = ("stopped {count} node pod(s) still running {grace:.0f}s after training "  # REASON_FINISH_STOPPED
                      "finished: {pods}")
REASON_SCALED = "Scaled"  # spec.replicas changed
REASON_WORKER_RESTART = "WorkersRestarted"  # torchrun restarted a pod's workers (its elasticPolicy.maxRestarts)
MSG_WORKER_RESTART = ("torchrun restarted the workers of node pod {pod} (restart {count} of this container; "  # REASON_WORKER_RESTART
                      "a worker failed, or a node joined or left)")
REASON_RESUMED_FROM_EARLIER_JOB = "ResumedFromEarlierJob"  # the first run resumed from a snapshot older than the job
MSG_RESUMED_FROM_EARLIER_JOB = (  # REASON_RESUMED_FROM_EARLIER_JOB
    "resumed from the snapshot at step {step}, completed {time}, before this job was created: an earlier "
    "job's, on the same snapshot volume; to start from scratch, give the job a new volume or remove its snapshots")
MSG_SCALED = "scaled {direction} from {old} to {new} node(s) (spec.replicas)"  # REASON_SCALED
REASON_POD_DELETED = "NodePodDeleted"  # a node pod was deleted by someone other than the operator
MSG_POD_DELETED = ("node pod {pod} was deleted while training (not by the operator, no DisruptionTarget); "  # REASON_POD_DELETED
                   "it is replaced without using the restart budget")
MSG_SUSPENDED = "spec.runPolicy.suspend is true: node pods are deleted until it is false"  # REASON_SUSPENDED
MSG_SPEC_VALID = "the spec is valid"  # REASON_SPEC_VALID
MSG_INVALID_KEPT = ("{errors}; the job goes on with its last valid spec "  # REASON_INVALID_SPEC, a running job
                    "(generation {generation}) until the spec is fixed")

# Event types (the two Kubernetes knows).
EVENT_NORMAL = "Normal"  # routine progress
EVENT_WARNING = "Warning"  # something needs a person's attention

# --- Rendezvous topology and capacity (topology.py, rdzv_store.py, capacity.py) ------------
LABEL_RDZV_GENERATION = f"{GROUP}/rdzv-generation"  # status.rendezvousGeneration a node pod was made for
COMPONENT_RDZV_STORE = "rdzv-store"  # value of LABEL_COMPONENT on the dedicated c10d store pod and Service
RDZV_STORE_CONTAINER = "store"  # the one container of the store pod
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"  # Kueue: the LocalQueue that admits the pod
LABEL_KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"  # Kueue: pods admitted as one workload
ANNOTATION_KUEUE_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"  # Kueue: pods in that workload
# Kueue's FailureRecoveryPolicy force-deletes a pod stuck terminating on an unreachable node
# only when the pod carries this annotation set to "true" (decide/stuck.py steps aside for it).
ANNOTATION_KUEUE_SAFE_TO_FORCE_DELETE = "kueue.x-k8s.io/safe-to-forcefully-delete"

COND_NODES_UNSCHEDULABLE = "NodesUnschedulable"  # True while node pods wait for capacity past the timeout
REASON_GROUP_RESTART = "GroupRestart"  # the rendezvous store was lost: every node restarts together
REASON_UNSCHEDULABLE = "Unschedulable"  # node pods waited longer than scheduling.pendingTimeoutSeconds
REASON_SCHEDULED = "NodesScheduled"  # every node pod was placed again
MSG_GROUP_RESTART = ("{what}: restarting all node pods together under rendezvous generation "  # REASON_GROUP_RESTART
                     "{generation} from the last snapshot; {budget}")
MSG_UNSCHEDULABLE = ("{count} node pod(s) not scheduled for over "  # REASON_UNSCHEDULABLE
                     "spec.scheduling.pendingTimeoutSeconds ({timeout}s); {effect}: {pods}")
MSG_SCHEDULED = "every node pod is scheduled"  # REASON_SCHEDULED

# --- Progress-aware recovery (failure.py, progress.py) ----------------------------------
ENV_TERMINATION_LOG = contract.TERMINATION_LOG_ENV  # where the trainer writes its progress record
TERMINATION_LOG_PATH = "/dev/termination-log"  # the pod's terminationMessagePath (Kubernetes' default)
ENV_PROGRESS_PORT = contract.PROGRESS_PORT_ENV  # the trainer serves its progress record here (GET /progress)
PROGRESS_PORT = 29410  # next to c10d's 29400; a named containerPort, so the operator reads it from the pod
PROGRESS_PORT_NAME = "progress"
PROGRESS_POLL_SECONDS = 30.0  # a running job's progress endpoint is read this often (--progress-poll-seconds)
PROGRESS_RECORD_KIND = progress_record.KIND  # "kind" of the trainer's record (ddpjob_rdzv/contract/progress_record.py)
MAX_FAILURES_KEPT = 10  # status.failures keeps this many newest entries
# status.invalidProgressRecords keeps this many (pod, field) pairs already reported, newest last;
# pruned to observed pods. A pod's progress endpoint gets at most one entry (and one Warning
# Event) per INVALID_RECORD_WARNING_SECONDS, whatever it answers: a fresh unknown key in every
# answer to the poll once grew the status by 24 KiB and posted a 24 KiB Event each time.
MAX_RECORD_PROBLEMS_KEPT = 64
INVALID_RECORD_WARNING_SECONDS = 60.0
SOURCE_TERMINATION_MESSAGE = "termination message"  # where a refused record was found (in Events)
SOURCE_PROGRESS_ENDPOINT = "progress endpoint"  # ... or read from (GET /progress, live_progress.py)

# status.failures[].cause: what a node failure was.
CAUSE_ERROR = "Error"  # the trainer exited non-zero (retryable; counts against the budget)
CAUSE_OOM = "OOMKilled"  # the container hit its memory limit (retryable; counts)
CAUSE_PERMANENT = "PermanentExitCode"  # an exit code in failurePolicy.permanentExitCodes (fails the job)
CAUSE_TRAINER_NOT_IN_IMAGE = REASON_TRAINER_NOT_IN_IMAGE  # the node used ddpjob-trainer, not in spec.image (fails the job)
CAUSE_DO_NOT_RETRY = "DoNotRetry"  # the trainer raised DoNotRetry: its progress record carries fatal (fails the job)
CAUSE_DISRUPTED = "Disrupted"  # evicted, preempted or drained (DisruptionTarget); free
CAUSE_NODE_LOST = "NodeLost"  # lost with its node (taint manager, pod GC, node shutdown); free
CAUSE_DELETED = "Deleted"  # deleted by someone other than the operator while it ran (kubectl delete pod); free
CAUSE_IMAGE_PULL = "ImagePull"  # the image cannot be pulled (fails the job after a bounded wait)
CAUSE_HANG = "Hang"  # no training step for failurePolicy.hangTimeoutSeconds: group restart, charged by progress
CAUSE_PREFLIGHT = "PreflightFailed"  # the pre-flight init container failed (render/preflight.py; retryable, counts)
CAUSE_STRAGGLER = "Straggler"  # a slow node replaced under stragglerPolicy.action Replace (free; its node is avoided)

# --- Hangs and stragglers (decide/hang.py, decide/straggler.py, docs/hangs.md) ---------------
ENV_COLLECTIVE_TIMEOUT = contract.COLLECTIVE_TIMEOUT_ENV  # the process group's timeout (failurePolicy)
HANG_TIMEOUT_FLOOR_SECONDS = 600.0  # the derived hang timeout is never shorter (a slow first epoch, I/O)
HANG_STEP_FACTOR = 20.0  # ... and is this many median step times when that is longer
REASON_HANG = "Hang"  # no node's step advanced for the hang timeout: the group restarts
REASON_STRAGGLER = "Straggler"  # a node stayed slower than stragglerPolicy.threshold for its window
REASON_STRAGGLER_REPLACED = "StragglerReplaced"  # ... and its pod was deleted to be created again
MSG_HANG = ("no training step for {seconds:.0f}s (hang timeout {timeout:.0f}s, {origin}): stuck at step {step}, "  # REASON_HANG
            "progress stopped on node(s) {nodes}; restarting all node pods from the last snapshot (step {snapshot}) "
            "under rendezvous generation {generation}, {budget}")
MSG_STRAGGLER = ("node {node} (pod {pod}) has slowed the group {slowdown:.1f}x for {seconds:.0f}s "  # REASON_STRAGGLER
                 "(spec.stragglerPolicy.threshold {threshold:g}): its own time per step is {own:.3f}s, the "
                 "median node's {median:.3f}s{action}")
MSG_STRAGGLER_REPLACING = "; replacing its pod (not charged to the restart budget)"  # appended under Replace

REASON_NO_PROGRESS = "NoProgress"  # failurePolicy.maxRestartsWithoutProgress passed: a crash loop
REASON_IMAGE_PULL = "ImagePullFailed"  # the trainer image cannot be pulled
REASON_FORCE_DELETED = "ForceDeleted"  # a pod stuck terminating on a NotReady node was force-deleted
REASON_INVALID_PROGRESS_RECORD = "InvalidProgressRecord"  # a progress record broke the contract: ignored
MSG_NO_PROGRESS = ("{count} failure incidents in a row without a newer snapshot (still at step {step}, "  # REASON_NO_PROGRESS
                   "epoch {epoch}) exceed spec.failurePolicy.maxRestartsWithoutProgress ({max}); last: {what}")
MSG_PROGRESS_NOT_CHARGED = "; {count} more after a newer snapshot were not charged"  # appended to MSG_RESTARTS_EXHAUSTED
MSG_IMAGE_PULL = ("node pod {pod} cannot pull image {image} ({reason}: {message}); "  # REASON_IMAGE_PULL
                  "{rule}")
MSG_IMAGE_PULL_TIMEOUT = "still failing spec.failurePolicy.imagePullTimeoutSeconds ({timeout}s) after the pod was created"
MSG_IMAGE_INVALID = "the image name can never be pulled: fix spec.image"
MSG_INVALID_PROGRESS_RECORD = ("node pod {pod}: ignored the progress record in its {source}: "  # REASON_INVALID_PROGRESS_RECORD
                               "{problem}")
MSG_DO_NOT_RETRY = "{what}; its trainer raised DoNotRetry ({reason}): not retried"  # the trainer's own reason
MSG_LOG_TAIL_HIDDEN = ("the trainer's log tail is not copied here (spec.failurePolicy.includeLogTail "  # a failure message
                       "is false): see the pod's logs")
MSG_PREFLIGHT_TAIL_HIDDEN = ("the pre-flight check failed; its log tail is not copied here "  # a PreflightFailed message
                             "(spec.failurePolicy.includeLogTail is false): see the logs of the pod's preflight container")
PREFLIGHT_CONTAINER = "preflight"  # the pre-flight init container of a node pod (spec.preflight)
PREFLIGHT_EXIT_CODE = 86  # its exit code on a failed check: outside 1-2 (errors), 126-127 (shell) and 128+N (signals)

# --- Bad nodes stay bad (decide/avoided_nodes.py, docs/cluster.md) ---------------------------
# status.avoidedNodes keeps this many nodes, oldest dropped first. Each becomes one value of a
# NotIn expression on every replacement pod: 16 is well above the handful of bad nodes a job
# meets (a job losing more than that has a cluster problem no anti-affinity solves), and keeps
# a pod's affinity small while a long job never fences itself out of a small node pool forever.
MAX_AVOIDED_NODES = 16
# Error or OOMKilled exits on one node count against it only when no other node failed within
# budget.INCIDENT_WINDOW_SECONDS (a crash on every node is the code's fault, not a node's).
AVOID_AFTER_FAILURES = 2  # such lone failures on one node before it is avoided
CAUSE_REPEATED_FAILURES = "RepeatedFailures"  # status.avoidedNodes[].cause of a node that killed AVOID_AFTER_FAILURES pods
REASON_NODE_AVOIDED = "NodeAvoided"  # a node was added to status.avoidedNodes
MSG_NODE_AVOIDED = ("node {node} is avoided for the rest of the job ({cause}): replacement pods carry "  # REASON_NODE_AVOIDED
                    "a required anti-affinity to it")
# A Kueue-queued job's pods carry ANNOTATION_KUEUE_SAFE_TO_FORCE_DELETE, so Kueue's
# FailureRecoveryPolicy may force-delete them; DDPJob's own force-delete waits this much longer
# so Kueue acts first where its (alpha) policy is on, and DDPJob is the fallback where it is off.
KUEUE_FORCE_DELETE_HEAD_START_SECONDS = 300
MSG_KUEUE_HEAD_START = " plus {seconds}s left to Kueue's FailureRecoveryPolicy (spec.scheduling.queueName is set)"
MSG_FORCE_DELETED = ("node pod {pod} was stuck terminating for {seconds:.0f}s on node {node} ({node_state}); "  # REASON_FORCE_DELETED
                     "force-deleted after spec.failurePolicy.forceDeleteTerminatingAfterSeconds ({timeout}s){kueue}")

# --- Rendezvous isolation (render/network_policy.py, docs/security.md) ---------------------
NETWORKING_API_VERSION = "networking.k8s.io/v1"  # apiVersion of the job's NetworkPolicy
POLICY_API_VERSION = "policy/v1"  # apiVersion of the job's PodDisruptionBudget (render/pdb.py)
LABEL_HOSTNAME = "kubernetes.io/hostname"  # the node label that avoided nodes' anti-affinity matches
# The chart's app.kubernetes.io/name on the operator's pods: the default of --operator-pod-selector,
# which picks who may read the trainers' progress port through the job's NetworkPolicy.
OPERATOR_APP_NAME = "ddpjob-operator"

# --- Creating a job's objects (decide/creation.py) ---------------------------------------
COND_POD_CREATE_FAILED = "PodCreateFailed"  # True while the API refuses to create a pod or Service of the job
# The job's NetworkPolicy (decide/isolation.py): the condition, its reasons and messages.
COND_NETWORK_POLICY = "NetworkPolicyReady"  # True while the job's own NetworkPolicy exists as rendered
REASON_NETWORK_POLICY = "NetworkPolicy"  # the Warning Event's reason when the condition needs a person
POLICY_PRESENT = "Present"  # observed: the job's own policy exists
POLICY_ABSENT = "Missing"  # observed: none of that name (created first, the pods after it)
POLICY_FOREIGN = "ForeignObject"  # observed: one of that name the job does not control (pods wait)
POLICY_UNREADABLE = "ListForbidden"  # the operator may not list NetworkPolicies there: the job runs without
POLICY_UNCREATABLE = "CreateForbidden"  # the operator may not create one there: the job runs without
REASON_POLICY_DRIFTED = "Drifted"  # someone edited it: its spec is put back
REASON_POLICY_DISABLED = "Disabled"  # spec.networkPolicy.enabled is false
MSG_POLICY_PRESENT = "NetworkPolicy {name} admits only the job's pods, and the operator on the progress port"
MSG_POLICY_ABSENT = ("NetworkPolicy {name} does not exist: the operator creates it, and the job's pods only "
                     "once it did")
MSG_POLICY_FOREIGN = ("NetworkPolicy {name} exists but the job does not control it: the operator leaves it alone "
                      "and creates no pod until it is deleted or renamed")
MSG_POLICY_UNREADABLE = ("the operator may not list NetworkPolicies in namespace {namespace}: the job runs without "
                         "{name}, reachable by any pod; grant list, watch and create on networking.k8s.io "
                         "networkpolicies (the chart does)")
MSG_POLICY_UNCREATABLE = ("the operator may not create NetworkPolicy {name} in namespace {namespace}: the job runs "
                          "without it, reachable by any pod; grant create on networking.k8s.io networkpolicies "
                          "(the chart does)")
MSG_POLICY_DRIFTED = "NetworkPolicy {name} was edited: the operator puts its spec back"
MSG_POLICY_DISABLED = ("spec.networkPolicy.enabled is false: the operator makes no NetworkPolicy {name}; "
                       "isolate the job's pods with one of your own")
REASON_POD_CREATE_FAILED = "PodCreateFailed"  # the Warning Event's reason; the condition's is the API's (Forbidden, ...)
REASON_CREATES_SUCCEED = "CreateSucceeded"  # PodCreateFailed went False: creates succeed again
REASON_API_UNREACHABLE = "NoAnswer"  # PodCreateFailed's reason when the API server did not answer at all
MSG_POD_CREATE_FAILED = ("creating {kind} {name} failed ({answer}): {message}; "  # REASON_POD_CREATE_FAILED
                         "the operator retries with a growing delay")
MSG_CREATES_SUCCEED = "no create of the job's pods or Services is failing"  # REASON_CREATES_SUCCEED
RULE_MAX_REPLICAS = "must be <= {limit}, the operator's --max-replicas setting"  # a FieldError rule (InvalidSpec)
# --max-replicas: node pods one job may ask for; half the CRD's fixed spec.MAX_REPLICAS (1000), so a
# dozen of the largest jobs can be reconciled at once within the chart's 256Mi (see docs/install.md).
DEFAULT_MAX_REPLICAS = 500

# --- What a pod or the cluster can grow in the status (decide/bounds.py, docs/security.md) -----------
# Each is a maxItems/maxLength of the status schema (api/status.py), so the API server refuses more,
# and decide/bounds.py cuts every status to them before it is written (newest entries kept, a
# string's end replaced by "..."), so the write never meets the refusal. Past etcd's object limit
# (1.5 MiB) a status write fails for good and the job is no longer reconciled.
MAX_NAME_CHARS = 253  # an object or Kubernetes node name (a DNS subdomain)
MAX_POD_NAME_CHARS = 63  # a pod's name: the operator's names fit a DNS label (api/names.py)
MAX_UID_CHARS = 40  # a uid (36 characters)
MAX_TIME_CHARS = 64  # an RFC 3339 time (at most 35 characters)
MAX_WORD_CHARS = 128  # a reason, cause, condition type, node index or count such as "3/4"
MAX_SELECTOR_CHARS = 1024  # status.selector: the node pods' label selector (job name and fixed labels)
MAX_CONDITION_MESSAGE_CHARS = 4096  # conditions[].message: every validation error, or the unschedulable pods
MAX_CONDITIONS = 16  # conditions[]: one per type, and there are eight
MAX_FAILURE_MESSAGE_CHARS = 1024  # failures[].message (failure.py keeps 300 characters of a log tail)
MAX_STALLED_NODES = 32  # failures[].stalledNodes: stalled node indexes kept (the Hang Event names them too)
MAX_HANDLED_FAILURES = 2048  # handledFailures: failed pods still observed; 2x the CRD's 1000 replicas
MAX_UNSCHEDULABLE = 32  # unschedulable[]: pending pods listed (their count is desiredReplicas - scheduledReplicas)
MAX_UNSCHEDULABLE_CHARS = 512  # one '<pod>: <scheduler reason>: <message>' entry
MAX_WORKER_RESTARTS_BY_POD = 1024  # workerRestartsByPod: observed node pods (the CRD allows 1000 replicas)
MAX_RECORD_FIELD_CHARS = progress_record.MAX_FIELD_CHARS  # invalidProgressRecords[].field (an unknown key cut)
MAX_SNAPSHOT_PATH_CHARS = progress_record.MAX_PATH_CHARS  # lastSnapshot.path, as the record contract allows
# An Event's message: the note of events.k8s.io/v1 may hold 1 KB, and client-go cuts to it too.
MAX_EVENT_MESSAGE_CHARS = 1024
