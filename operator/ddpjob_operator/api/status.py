"""The DDPJob status: the schema of .status, which decide/status.py computes and the operator writes.

The CRD's status schema and the reference's status section are generated from these models
(api/crd.py). Every string and list is bounded (constants "What a pod or the cluster can grow
in the status"): the API server refuses a longer one, and decide/bounds.py cuts the status to
these same bounds before it is written.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.base import ApiModel, KubeObject

Name = Annotated[str, Field(max_length=C.MAX_NAME_CHARS)]
PodName = Annotated[str, Field(max_length=C.MAX_POD_NAME_CHARS)]
Uid = Annotated[str, Field(max_length=C.MAX_UID_CHARS)]
Word = Annotated[str, Field(max_length=C.MAX_WORD_CHARS)]
Time = Annotated[str, Field(max_length=C.MAX_TIME_CHARS, json_schema_extra={"format": "date-time"})]


class Condition(ApiModel):
    """A Kubernetes-style condition."""

    type: Word = Field(description=("Running, Restarting, Succeeded, Failed, Suspended, InvalidSpec, "
                                   "NodesUnschedulable, PodCreateFailed or NetworkPolicyReady."))
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: Word = Field("", description="CamelCase reason of the last transition.")
    message: str = Field("", max_length=C.MAX_CONDITION_MESSAGE_CHARS, description="Human-readable details.")
    last_transition_time: Time | None = Field(None, description="When status last changed.")


class LastSnapshot(ApiModel):
    """The newest complete snapshot, from <snapshot dir>/progress.json."""

    epoch: int | None = Field(None, description="Epoch of the snapshot.")
    step: int | None = Field(None, description="Global optimizer step of the snapshot.")
    time: Time | None = Field(None, description="When it was written.")
    path: str | None = Field(None, max_length=C.MAX_SNAPSHOT_PATH_CHARS, description=(
        "Where it is, inside the snapshot volume."))


class TrainingProgress(ApiModel):
    """Live training figures from the nodes' heartbeats (the progress endpoint; docs/hangs.md)."""

    step: int | None = Field(None, description="The highest training step any node reported.")
    step_seconds: float | None = Field(None, description="Median recent step time over the nodes.")
    advanced_time: Time | None = Field(None, description=(
        "When the operator saw the step advance (or this run start): the hang clock runs from here."))
    run: Word | None = Field(None, description="Start time of the run polled (a new run restarts the hang clock).")
    hang_timeout_seconds: float | None = Field(None, description="The hang timeout in force (0: off).")
    slowest_node: Word | None = Field(None, description="Node index of the slowest node.")
    slowdown: float | None = Field(None, description=(
        "Step time of the group over what it would be if the slowest node kept pace with the median node."))
    slow_since: Time | None = Field(None, description="Since when slowestNode has been over stragglerPolicy.threshold.")
    reported_straggler: Word | None = Field(None, description=(
        "The slow node last reported in a Straggler Event (one Event per slow spell)."))


class InvalidProgressRecord(ApiModel):
    """A refused progress record (status.invalidProgressRecords): the pod, the field, and when it was reported."""

    pod: PodName | None = Field(None, description="Pod name.")
    pod_uid: Uid | None = Field(None, alias="podUID", description="Pod uid.")
    field: str | None = Field(None, max_length=C.MAX_RECORD_FIELD_CHARS, description=(
        "The record's field that broke the contract, e.g. snapshot.step (an unknown key is cut short)."))
    time: Time | None = Field(None, description=(
        "When it was reported in a Warning Event (a pod's endpoint gets at most one a minute)."))


class NodeFailure(ApiModel):
    """One failed or disrupted node pod, explained (status.failures)."""

    index: int | None = Field(None, description="Node index of the pod.")
    pod: PodName | None = Field(None, description="Pod name.")
    pod_uid: Uid | None = Field(None, alias="podUID", description="Pod uid (each pod is listed once).")
    node: Name | None = Field(None, description=(
        "The Kubernetes node the pod ran on (absent when it was never scheduled); see status.avoidedNodes."))
    cause: Literal["Error", "OOMKilled", "PermanentExitCode", "DoNotRetry", "Disrupted", "NodeLost", "Deleted",
                   "ImagePull", "Hang", "Straggler", "PreflightFailed", "TrainerNotInImage"] | None = Field(
        None, description=("Error, OOMKilled, PermanentExitCode, DoNotRetry (these count against the budget; the "
                           "last two fail the job: a permanent exit code, or the trainer raised DoNotRetry, whose "
                           "reason is in `reason`), Disrupted, NodeLost or Deleted (deleted by someone while it "
                           "trained, without a DisruptionTarget; all three free), ImagePull, Hang (no step for "
                           "failurePolicy.hangTimeoutSeconds: the group restarted, charged by the progress rule), "
                           "Straggler (a slow node replaced under stragglerPolicy.action Replace; free), "
                           "PreflightFailed (spec.preflight), TrainerNotInImage (the node used ddpjob-trainer, "
                           "which spec.image lacks: fastRestart, etcd-v3 or a ddpjob_trainer module; fails the job)."))
    step: int | None = Field(None, description="Hang: the last training step reached.")
    stalled_nodes: list[Word] = Field(default_factory=list, max_length=C.MAX_STALLED_NODES, description=(
        "Hang: the node indexes whose progress stopped first (every node when all stopped together; "
        f"at most {C.MAX_STALLED_NODES})."))
    exit_code: int | None = Field(None, description="Exit code of torchrun, when it ran.")
    reason: Word | None = Field(None, description=(
        "The most specific reason: the DisruptionTarget condition's, the pod's or the container's."))
    message: str | None = Field(None, max_length=C.MAX_FAILURE_MESSAGE_CHARS, description=(
        "The trainer's error from its progress record, else the end of its log when "
        "failurePolicy.includeLogTail is true, shortened."))
    time: Time | None = Field(None, description="When the container finished (or the failure was seen).")


class AvoidedNode(ApiModel):
    """A node the job's new pods keep off (status.avoidedNodes, docs/cluster.md)."""

    node: Name | None = Field(None, description="The Kubernetes node's name (its kubernetes.io/hostname label).")
    cause: Word | None = Field(None, description=(
        "NodeLost or Straggler (one failure), RepeatedFailures (two pods on it exited with Error or "
        "OOMKilled while no other node failed)."))
    since: Time | None = Field(None, description="When the failure that put it here happened.")


class SnapshotMark(ApiModel):
    """The snapshot the restart budget compares with."""

    step: int | None = Field(None, description="Global step of status.lastSnapshot at the last failure incident.")
    time: Time | None = Field(None, description="Its completion time.")


class LastResume(ApiModel):
    """The newest run of the trainer the operator heard of."""

    time: Time | None = Field(None, description="When its workers started.")
    first_step_time: Time | None = Field(None, description="When it completed its first optimizer step.")
    from_step: int | None = Field(None, description="The snapshot step it resumed from; null: from scratch.")


class Recovery(ApiModel):
    """Figures from the trainer's progress records (polled from running pods and read when a container exits)."""

    last_recovery_seconds: float | None = Field(None, description=(
        "Time to recover from the latest failure incident: lastFailureTime to the first step after it."))
    recovered_failure_time: Time | None = Field(None, description="The incident lastRecoverySeconds is about.")
    lost_seconds: float | None = Field(None, description=(
        "Training time lost so far to restarts (failures and membership changes): for each run after the "
        "first, from the snapshot it resumed from (or the job's start) to its first step. Runs not reported "
        "yet are missing until a container exits."))
    startup_seconds: float | None = Field(None, description=(
        "Start-up of the job's first run: from the job's start to its first step; not counted in lostSeconds."))
    resumed_from_earlier_job: LastResume | None = Field(None, description=(
        "Set once when the job's first run resumed from a snapshot written before the job was created: "
        "an earlier job's, left on the same snapshot volume (a ResumedFromEarlierJob Event says so). "
        "time is that snapshot's completion time."))
    last_resume: LastResume | None = Field(None, description="The newest run seen.")
    accounted_restarts: int | None = Field(None, description="Incidents already judged for progress (bookkeeping).")
    snapshot_at_last_failure: SnapshotMark | None = Field(None, description=(
        "status.lastSnapshot when the last incident was judged; a newer one means progress."))


class WorkerRestarts(ApiModel):
    """One node pod's torchrun restart count (status.workerRestartsByPod)."""

    pod: PodName | None = Field(None, description="Pod name.")
    pod_uid: Uid | None = Field(None, alias="podUID", description="Pod uid.")
    count: int | None = Field(None, description="TORCHELASTIC_RESTART_COUNT of its newest run of the workers.")


class Finishing(ApiModel):
    """The end of training (status.finishing): a node pod exited 0 while others still ran."""

    since: Time | None = Field(None, description="When the first node pod exited 0.")
    stopped: int | None = Field(None, description=(
        "Node pods still running 15 s after that, stopped by the operator (they would wait in "
        "torchrun's exit barrier)."))


class LastValid(ApiModel):
    """The newest valid spec (status.lastValid): what a job runs with after an invalid edit."""

    generation: int | None = Field(None, description="metadata.generation of that spec.")
    spec: KubeObject = Field(default_factory=dict, description=(
        "The spec as it was then; not kept when its JSON is over 64 KiB."))


class DDPJobStatus(ApiModel):
    """Observed state of a DDPJob, written by the operator."""

    phase: Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"] | None = Field(
        None, description="Pending, Running, Restarting, Succeeded, Failed or Suspended.")
    conditions: list[Condition] = Field(default_factory=list, max_length=C.MAX_CONDITIONS,
                                        description="Current conditions.")
    replicas: int | None = Field(None, description="Node pods that exist and have not finished.")
    ready_replicas: int | None = Field(None, description="Node pods that are running and Ready.")
    ready: Word | None = Field(None, description=(
        "readyReplicas/(spec.replicas + spec.elasticPolicy.spareReplicas), for kubectl get."))
    replica_range: Word | None = Field(None, description=(
        "spec.elasticPolicy minReplicas:maxReplicas, for kubectl get -o wide."))
    selector: str | None = Field(None, max_length=C.MAX_SELECTOR_CHARS, description=(
        "Label selector of the node pods (scale subresource)."))
    restarts: int | None = Field(None, description="Failure incidents recovered from (failurePolicy budget).")
    last_failure_time: Time | None = Field(None, description="Start of the latest failure incident.")
    handled_failures: list[Uid] = Field(default_factory=list, max_length=C.MAX_HANDLED_FAILURES, description=(
        "uids of failed pods already counted, so each failure is counted once."))
    last_snapshot: LastSnapshot | None = Field(None, description="The newest complete snapshot.")
    start_time: Time | None = Field(None, description="When the job (last) started.")
    completion_time: Time | None = Field(None, description="When the job finished.")
    observed_generation: int | None = Field(None, description="metadata.generation this status describes.")
    rendezvous_generation: int | None = Field(None, description=(
        "Whole-group restarts so far (losing the c10d store restarts every node); part of the "
        "rendezvous id (PET_RDZV_ID = <uid>-<generation> once it is above 0) and of the pods' "
        "ddpjob.io/rdzv-generation label, so an old rendezvous is never joined."))
    desired_replicas: int | None = Field(None, description="spec.replicas: node pods wanted.")
    scheduled_replicas: int | None = Field(None, description=(
        "Node pods of the current rendezvous generation bound to a Kubernetes node."))
    running_replicas: int | None = Field(None, description=(
        "Node pods of the current rendezvous generation whose phase is Running."))
    rendezvous_replicas: int | None = Field(None, description=(
        "Node pods of the current rendezvous generation that are Ready: the operator's estimate of "
        "the nodes in the rendezvous (it does not read the rendezvous store itself)."))
    spares: int | None = Field(None, ge=0, description=(
        "Warm spares waiting outside the round (only for a job with spec.elasticPolicy.spareReplicas): "
        "the current generation's Ready node pods beyond maxReplicas, at most spareReplicas. It drops "
        "to 0 when a spare takes a lost node's place, and rises again once the new spare is Ready."))
    unschedulable: list[Annotated[str, Field(max_length=C.MAX_UNSCHEDULABLE_CHARS)]] = Field(
        default_factory=list, max_length=C.MAX_UNSCHEDULABLE, description=(
            "Node pods the scheduler has not placed, each as '<pod>: <scheduler reason>: <message>' "
            f"(at most {C.MAX_UNSCHEDULABLE})."))
    restarts_with_progress: int | None = Field(None, description=(
        "Of status.restarts, incidents after which a newer snapshot was complete: not charged to "
        "failurePolicy.maxRestarts (which limits restarts - restartsWithProgress)."))
    restarts_without_progress: int | None = Field(None, description=(
        "Failure incidents in a row with no newer snapshot (failurePolicy.maxRestartsWithoutProgress)."))
    failures: list[NodeFailure] = Field(default_factory=list, max_length=C.MAX_FAILURES_KEPT, description=(
        f"The newest failed or disrupted node pods (at most {C.MAX_FAILURES_KEPT}), oldest first."))
    recovery: Recovery | None = Field(None, description="Time to recover, time lost, and budget bookkeeping.")
    progress: TrainingProgress | None = Field(None, description=(
        "Live step, step time and the slowest node, from the trainers' heartbeats."))
    avoided_nodes: list[AvoidedNode] = Field(default_factory=list, max_length=C.MAX_AVOIDED_NODES, description=(
        "Nodes that lost a pod to a node-caused failure: every node pod created afterwards carries a "
        f"required node anti-affinity to them, for the rest of the job; at most {C.MAX_AVOIDED_NODES}, oldest "
        "dropped first."))
    invalid_progress_records: list[InvalidProgressRecord] = Field(
        default_factory=list, max_length=C.MAX_RECORD_PROBLEMS_KEPT, description=(
            "Progress records the contract refused, one per pod and field, each reported once in an "
            "InvalidProgressRecord Warning Event; a pod's progress endpoint gets at most one a minute, a "
            "refusal past that is reported once the minute is over if still there. At most "
            f"{C.MAX_RECORD_PROBLEMS_KEPT}, newest kept, dropped with their pod."))
    worker_restarts: int | None = Field(None, description=(
        "torchrun's restarts of the workers inside node pods (elasticPolicy.maxRestarts: a worker failed, "
        "or a node joined or left), from the trainer's records; each counted once."))
    worker_restarts_by_pod: list[WorkerRestarts] = Field(default_factory=list, max_length=C.MAX_WORKER_RESTARTS_BY_POD,
                                                         description=(
        "The newest torchrun restart count of each observed node pod (bookkeeping of workerRestarts)."))
    finishing: Finishing | None = Field(None, description=(
        "The wait for node pods after training finished, and how many were stopped."))
    last_valid: LastValid | None = Field(None, description=(
        "The newest valid spec. After an edit the operator cannot accept (condition InvalidSpec) "
        "the job goes on with it: failed pods are replaced from it and its deadline holds."))


# The status keys as written (camelCase), in the model's order: the one list of them. The CRD's
# status schema and the reference list them in this order, and decide/status.py writes them so
# (a field added to the model is written without another list to extend).
STATUS_FIELDS = tuple(field.alias or name for name, field in DDPJobStatus.model_fields.items())
