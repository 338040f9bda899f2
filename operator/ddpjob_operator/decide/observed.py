"""What one pass observed, read once into typed, read-only views (pure).

The only module of decide/ that reads Pod dicts: `view_pod` takes every fact a decision
uses out of a Pod as the API returned it (labels, phase, conditions, the trainer
container's state, its progress records), and `Observed` holds a pass's whole
observation with the node pods sorted once, as JobSet sorts its child Jobs into
active / successful / failed. Policies read `Observed` and `PodView`, never a dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Iterable, Mapping

from ddpjob_rdzv.contract import progress_record

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import parse_time
from ddpjob_operator.api.names import managed_etcd_name, pod_name, rdzv_store_name

Pod = Mapping[str, Any]
Node = Mapping[str, Any]
ACTIVE_PHASES = ("Pending", "Running", "Unknown")  # a pod in these may still do work
# The pod conditions and trainer ports a decision reads; a view keeps no other (the cache holds a
# view of every pod that carries the operator's label, and whoever may create pods can add those).
READ_CONDITIONS = ("Ready", "PodScheduled", "DisruptionTarget")
READ_PORTS = (C.PROGRESS_PORT_NAME,)


@dataclass(frozen=True)
class PodView:
    """One observed pod: what the decisions read, taken from the dict once.

    Times are parsed (None when the API left them out); `exit_code`, `finished_at`,
    `termination` and `waiting` are the trainer container's (its current state).
    """

    name: str
    uid: str = ""
    index: int | None = None  # ddpjob.io/node-index; None when absent or malformed
    generation: int = 0  # ddpjob.io/rdzv-generation; pods made before generations existed are 0
    component: str = ""  # app.kubernetes.io/component: node, rdzv-store, etcd
    controller_uid: str = ""  # uid of its controlling ownerReference ('' when none)
    phase: str = "Pending"  # status.phase; a pod without status is Pending (just created)
    created_at: datetime | None = None
    deletion_at: datetime | None = None  # metadata.deletionTimestamp: it is going away
    node_name: str = ""  # spec.nodeName ('' while unscheduled)
    ip: str = ""  # status.podIP
    ports: Mapping[str, int] = field(default_factory=dict)  # the trainer container's named ports
    ready: bool = False  # the Ready condition is True
    conditions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # by type
    status_reason: str | None = None  # status.reason (Evicted, ...)
    status_message: str = ""
    exit_code: int | None = None
    finished_at: datetime | None = None
    termination_reason: str | None = None  # OOMKilled, Error, ...
    termination_message: str = ""
    waiting: Mapping[str, Any] = field(default_factory=dict)  # the container's waiting state
    progress: tuple[dict[str, Any], ...] = ()  # valid progress records in its current and previous terminations
    record_problems: tuple[progress_record.Invalid, ...] = ()  # records there that the contract refused
    termination_holds_record: bool = False  # the current termination message is a record (valid or not)
    record: Mapping[str, Any] = field(default_factory=dict)  # the current termination's valid record ({}: none)
    preflight_failure: str | None = None  # the pre-flight init container failed: its message (render/preflight.py)

    @property
    def fatal(self) -> Mapping[str, str] | None:
        """`fatal` {reason, message} of the current record: the worker raised DoNotRetry."""
        return self.record.get("fatal")

    @property
    def deleting(self) -> bool:
        """It has a deletionTimestamp: it must not be counted or reused."""
        return self.deletion_at is not None

    @property
    def active(self) -> bool:
        """Not deleting and not finished: it may still do work."""
        return not self.deleting and self.phase in ACTIVE_PHASES

    @property
    def running_ready(self) -> bool:
        """Running with the Ready condition True (its agent is in the rendezvous)."""
        return self.active and self.phase == "Running" and self.ready

    @property
    def is_store(self) -> bool:
        """The job's dedicated c10d store pod."""
        return self.component == C.COMPONENT_RDZV_STORE

    @property
    def reason(self) -> str | None:
        """The Pod's status reason, else the container's termination reason."""
        return self.status_reason or self.termination_reason

    def condition(self, type_: str) -> Mapping[str, Any]:
        """The condition of that type ({} when absent)."""
        return self.conditions.get(type_) or {}

    @property
    def disruption(self) -> Mapping[str, Any] | None:
        """DisruptionTarget=True (preempted, drained, tainted away), else None."""
        condition = self.condition("DisruptionTarget")
        return condition if condition.get("status") == "True" else None


def view_pod(pod: Pod) -> PodView:
    """Every fact the decisions read from one Pod dict."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    container = _trainer_status(status)
    terminated = (container.get("state") or {}).get("terminated") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []
                  if isinstance(c, Mapping) and c.get("type") in READ_CONDITIONS}
    code = terminated.get("exitCode")
    return PodView(
        name=meta.get("name") or "", uid=meta.get("uid") or "", index=_number(labels.get(C.LABEL_NODE_INDEX)),
        generation=_number(labels.get(C.LABEL_RDZV_GENERATION)) or 0, component=labels.get(C.LABEL_COMPONENT) or "",
        controller_uid=_controller_uid(meta),
        phase=status.get("phase") or "Pending", created_at=parse_time(meta.get("creationTimestamp")),
        deletion_at=parse_time(meta.get("deletionTimestamp")), node_name=spec.get("nodeName") or "",
        ip=status.get("podIP") or "", ports=_ports(spec),
        ready=(conditions.get("Ready") or {}).get("status") == "True", conditions=conditions,
        status_reason=status.get("reason"), status_message=status.get("message") or "",
        exit_code=int(code) if code is not None else None, finished_at=parse_time(terminated.get("finishedAt")),
        termination_reason=terminated.get("reason"), termination_message=terminated.get("message") or "",
        waiting=(container.get("state") or {}).get("waiting") or {}, preflight_failure=_preflight_failure(status),
        **_records(container),
    )


def _preflight_failure(status: Mapping[str, Any]) -> str | None:
    """What the failed pre-flight init container said ('exit code N' when it said nothing); None when it passed or runs."""
    found = next((s for s in status.get("initContainerStatuses") or [] if s.get("name") == C.PREFLIGHT_CONTAINER), {})
    terminated = (found.get("state") or {}).get("terminated") or {}
    if not terminated or terminated.get("exitCode") in (None, 0):
        return None
    return (terminated.get("message") or "").strip() or f"exit code {terminated['exitCode']}"


def view_pods(pods: Iterable[Pod]) -> tuple[PodView, ...]:
    return tuple(view_pod(p) for p in pods)


def claimed(pods: Iterable[PodView], job: str, owner_uid: str) -> tuple[PodView, ...]:
    """The pods of job `job` whose controller is the object with `owner_uid` and whose name is
    one the operator gives (api/names.py). Labels alone claim nothing: anyone who may create
    pods in the namespace can copy a job's labels, and such a pod would otherwise be counted,
    polled for progress, deleted, and its `fatal` record would fail the job. Nor does an
    ownerReference: anyone may write the job's uid into one; a pod so forged claims only if
    it also bears a name the operator creates, which the operator's own create then meets
    (409) and reads, so the two never pass unseen."""
    return tuple(p for p in pods if p.controller_uid == owner_uid and named_by_operator(p, job))


def named_by_operator(pod: PodView, job: str) -> bool:
    """`pod` bears the name the operator gives a pod of its component and index in job `job`."""
    if pod.component == C.COMPONENT_NODE:
        return pod.index is not None and pod.name == pod_name(job, pod.index)
    names = {C.COMPONENT_RDZV_STORE: rdzv_store_name(job), C.COMPONENT_ETCD: managed_etcd_name(job)}
    return pod.component in names and pod.name == names[pod.component]


def controller_of(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference marked controller in an object's metadata (None: none)."""
    owners = meta.get("ownerReferences") or []
    return next((o for o in owners if isinstance(o, Mapping) and o.get("controller")), None)


def _controller_uid(meta: Mapping[str, Any]) -> str:
    return (controller_of(meta) or {}).get("uid") or ""


def _number(raw: Any) -> int | None:
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


def _trainer_status(status: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = status.get("containerStatuses") or []
    found = next((s for s in statuses if s.get("name") == C.CONTAINER_NAME), None)
    return found or (statuses[0] if statuses else {})


def _ports(spec: Mapping[str, Any]) -> dict[str, int]:
    container = next((c for c in spec.get("containers") or [] if c.get("name") == C.CONTAINER_NAME), {})
    return {p["name"]: p.get("containerPort") for p in container.get("ports") or [] if p.get("name") in READ_PORTS}


def _records(container: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer's progress records in the container's current and previous terminations,
    parsed once through the contract (ddpjob_rdzv/contract/progress_record.py): the valid ones, the
    refused ones, and the current one."""
    if container.get("name") != C.CONTAINER_NAME:
        return {}
    found = [progress_record.parse(((container.get(key) or {}).get("terminated") or {}).get("message"))
             for key in ("state", "lastState")]
    valid = [dict(f.data) for f in found if isinstance(f, progress_record.Record)]
    current = found[0].data if isinstance(found[0], progress_record.Record) else {}
    return {"progress": tuple(valid), "termination_holds_record": found[0] is not None,
            "record_problems": tuple(f for f in found if isinstance(f, progress_record.Invalid)),
            "record": current}


@dataclass(frozen=True)
class RecordProblem:
    """A progress record that was refused: which pod sent it, where it was found, and why."""

    pod: str  # the pod's name
    uid: str  # the pod's uid: a problem is reported once per pod and field
    source: str  # C.SOURCE_TERMINATION_MESSAGE or C.SOURCE_PROGRESS_ENDPOINT
    invalid: progress_record.Invalid

    @classmethod
    def of(cls, pod: PodView, source: str, invalid: progress_record.Invalid) -> RecordProblem:
        return cls(pod.name, pod.uid, source, invalid)


@dataclass(frozen=True)
class NodeBeat:
    """One node's liveness from a progress record's ``nodes`` (ddpjob_rdzv/contract/progress_record.py)."""

    node: str
    step: int | None = None
    phase: str = "collective"  # "local": one of its ranks is outside the step's collectives
    heartbeat: datetime | None = None
    step_seconds: float | None = None
    data_seconds: float | None = None
    compute_seconds: float | None = None

    @property
    def own_seconds(self) -> float | None:
        """Time per step no peer holds up (input + forward); None when not reported."""
        if self.data_seconds is None and self.compute_seconds is None:
            return None
        return (self.data_seconds or 0.0) + (self.compute_seconds or 0.0)


@dataclass(frozen=True)
class Liveness:
    """The nodes' heartbeats, as one running node's record gathered them this pass.

    Attributes:
        run: when the workers of the polled node started (its record's resume.time): a new
            value means a new run, whose steps start over.
        nodes: one entry per node that beat.
    """

    run: str | None
    nodes: tuple[NodeBeat, ...]

    @property
    def step(self) -> int | None:
        steps = [n.step for n in self.nodes if n.step is not None]
        return max(steps) if steps else None


def liveness_of(live: Iterable[Mapping[str, Any] | RecordProblem]) -> Liveness | None:
    """The first live record's ``nodes`` (None when no record this pass carried any)."""
    for record in live:
        if isinstance(record, RecordProblem) or not record.get("nodes"):
            continue
        beats = tuple(NodeBeat(str(n["node"]), n.get("step"), n.get("phase") or "collective",
                               parse_time(n.get("heartbeat")), n.get("stepSeconds"), n.get("dataSeconds"),
                               n.get("computeSeconds")) for n in record["nodes"])
        return Liveness((record.get("resume") or {}).get("time"), beats)
    return None


def live_fatal(live: Iterable[Mapping[str, Any] | RecordProblem]) -> tuple[str, Mapping[str, str]] | None:
    """(node, fatal) of the first live record whose worker raised DoNotRetry, if any."""
    for record in live:
        if not isinstance(record, RecordProblem) and record.get("fatal"):
            return str(record.get("node") or "?"), record["fatal"]
    return None


def node_state(node: Node | None) -> str:
    """'Ready', 'NotReady', 'Unknown' (the node controller lost its heartbeats) or 'gone'."""
    if node is None:
        return "gone"
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
    return {"True": "Ready", "False": "NotReady"}.get(ready.get("status"), "Unknown")


@dataclass(frozen=True)
class ObservedEtcd:
    """What the pass saw of the job's managed etcd."""

    pod: PodView | None  # the etcd pod, None when it does not exist
    service_exists: bool


BUDGET_COMPARED = ("minAvailable", "selector")  # the budget's fields whose drift is patched back (plan.py)


@dataclass(frozen=True)
class ObservedBudget:
    """The job's PodDisruptionBudget as read this pass: `spec` None when it does not exist."""

    spec: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, budget: Mapping[str, Any] | None, owner_uid: str) -> ObservedBudget | None:
        """The budget as read (None: absent); None when one of that name belongs to someone else,
        who keeps it: the job then goes without one rather than take over a budget it did not make."""
        if budget is None:
            return cls(None)
        if _controller_uid(budget.get("metadata") or {}) != owner_uid:
            return None
        return cls(dict(budget.get("spec") or {}))


@dataclass(frozen=True)
class ObservedPolicy:
    """The job's NetworkPolicy as read this pass (decide/isolation.py).

    Attributes:
        state: C.POLICY_PRESENT, C.POLICY_ABSENT, C.POLICY_FOREIGN (one of that name the job does
            not control), C.POLICY_UNREADABLE (the operator may not list them) or
            C.POLICY_UNCREATABLE (absent, and the operator's create was refused: 403).
        spec: the job's own policy's spec (None unless present).
    """

    state: str
    spec: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, policy: Mapping[str, Any] | None, owner_uid: str, create_refused: bool = False) -> ObservedPolicy:
        """The state of `policy` as read (None: absent); `create_refused`: this namespace refused a create."""
        if policy is None:
            return cls(C.POLICY_UNCREATABLE if create_refused else C.POLICY_ABSENT)
        if _controller_uid(policy.get("metadata") or {}) != owner_uid:
            return cls(C.POLICY_FOREIGN)
        return cls(C.POLICY_PRESENT, dict(policy.get("spec") or {}))


@dataclass(frozen=True)
class Observed:
    """Everything one pass observed, sorted once; every decision reads this.

    Attributes:
        pods: the job's pods (node pods of every generation and the store pod).
        service_exists: the job's headless Service exists.
        live_progress: progress records read from running pods' endpoints this pass.
        managed_etcd: the job's managed etcd (None when it asks for none).
        nodes: Node objects (None: gone) of pods past their deletionTimestamp, by name; a node
            left out is unknown, and its pods are not force-deleted.
        network_policy: the job's NetworkPolicy; None when it was not looked for (turned off, or
            the job finished).
        disruption_budget: the job's PodDisruptionBudget; None when it was not looked for (the
            job finished, or the operator may not read PodDisruptionBudgets).
        store_service_exists: the store pod's Service exists (read apart from the store pod: a
            pass cut short may have created one and not the other).
    """

    pods: tuple[PodView, ...] = ()
    service_exists: bool = True
    live_progress: tuple[Mapping[str, Any] | RecordProblem, ...] = ()  # records, and refused ones
    managed_etcd: ObservedEtcd | None = None
    nodes: Mapping[str, Node | None] = field(default_factory=dict)
    network_policy: ObservedPolicy | None = None
    disruption_budget: ObservedBudget | None = None
    store_service_exists: bool = True

    @cached_property
    def liveness(self) -> Liveness | None:
        """The nodes' heartbeats read this pass (None: no live record carried them)."""
        return liveness_of(self.live_progress)

    @cached_property
    def node_pods(self) -> tuple[PodView, ...]:
        """Every pod but the store pod, of every generation."""
        return tuple(p for p in self.pods if not p.is_store)

    @cached_property
    def store(self) -> PodView | None:
        """The store pod that is not being deleted, if any."""
        return next((p for p in self.pods if p.is_store and not p.deleting), None)

    @cached_property
    def stores(self) -> tuple[PodView, ...]:
        """Every store pod, deleting ones included."""
        return tuple(p for p in self.pods if p.is_store)

    def of_generation(self, generation: int, node_pods: int) -> NodeGroups:
        """The node pods sorted for rendezvous generation `generation` and `node_pods` wanted
        (spec.node_pods: the replicas and the warm spares)."""
        return NodeGroups.sort(self.pods, generation, node_pods)


@dataclass(frozen=True)
class NodeGroups:
    """The pods of one rendezvous generation, sorted once (JobSet's childJobs).

    Attributes:
        live: the pods that still count: this generation's node pods and the store pod.
        stale: node pods of an older generation (they must go, never rejoin).
        current: live node pods with an index below the node pods wanted (replicas + spares), not
            being deleted.
        extra: live node pods at or above that (or without an index), not deleting.
    """

    live: tuple[PodView, ...]
    stale: tuple[PodView, ...]
    current: tuple[PodView, ...]
    extra: tuple[PodView, ...]

    @classmethod
    def sort(cls, pods: Iterable[PodView], generation: int, replicas: int) -> NodeGroups:
        pods = tuple(pods)
        stale = tuple(p for p in pods if not p.is_store and p.index is not None and p.generation < generation)
        live = tuple(p for p in pods if p.is_store or p.index is None or p.generation >= generation)
        nodes = [p for p in live if not p.is_store and not p.deleting]
        current = tuple(p for p in nodes if p.index is not None and p.index < replicas)
        extra = tuple(p for p in nodes if p.index is None or p.index >= replicas)
        return cls(live, stale, current, extra)

    @cached_property
    def running(self) -> tuple[PodView, ...]:
        return tuple(p for p in self.current if p.active and p.phase == "Running")

    @cached_property
    def succeeded(self) -> tuple[PodView, ...]:
        return tuple(p for p in self.current if p.phase == "Succeeded")

    @cached_property
    def failed(self) -> tuple[PodView, ...]:
        return tuple(p for p in self.current if p.phase == "Failed")

    @property
    def training_over(self) -> bool:
        """A node succeeded: training is done and torchrun cannot rejoin a closed rendezvous."""
        return bool(self.succeeded)

    def finished_by(self, when: datetime | None) -> bool:
        """Training was over at `when`: a node pod of the group had exited 0 by then. A failure
        before it was one of training (the others re-formed and finished without the node), one
        at or after it is not (decide/failure.py after_finish). finishedAt has whole seconds, so
        a tie counts as after: the nodes that finished decide. An unknown time: over if any did."""
        return any(when is None or p.finished_at is None or p.finished_at <= when for p in self.succeeded)
