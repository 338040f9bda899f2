"""The local launch of each node: the Pods' launch plan, moved onto this machine.

Pure. `ddpjob_operator.render.launch.launch_plan` gives the command and environment a
Pod gets; here the rendezvous host becomes 127.0.0.1, the rendezvous id is made
unique per run, and every path under `spec.snapshot.mountPath` (in env values
and args) is rewritten to the run's local snapshot directory.

c10d: in a cluster only node 0's hostname matches the endpoint, so node 0 hosts
the rendezvous store. On loopback every agent matches it and whichever binds
the port first becomes the host (then killing "node 1" can take the store
down with it); the launch plan's `is_host` (as in the Pods) keeps it on node 0. With
`rdzvStore: pod` the store is a local process instead (the store pod's command,
listening on loopback) and every agent is a client, as in the Pods.

Nothing a run opens listens beyond loopback (docs/security.md): LOOPBACK_ENV binds ddpjob's own
listeners (the store, each agent's liveness beacon and node 0's c10d store, the progress
endpoint, rank 0's worker store) to 127.0.0.1, gives torchrun 127.0.0.1 as the node's address
(its MASTER_ADDR) and keeps the process group's gloo and NCCL sockets on the loopback interface.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Mapping

from ddpjob_rdzv import C10D_BACKEND_NAME, contract

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.launch import WORK_DIR_NAME, launch_plan, merged_env, working_dir, workers_per_node
from ddpjob_operator.render.store_pod import store_command
from ddpjob_operator.api.spec import DDPJobSpec

LOOPBACK = "127.0.0.1"  # every local node reaches the c10d store of node 0 here
LOOPBACK_INTERFACE = "lo"  # Linux's loopback interface, for gloo's and NCCL's socket choice
# Set on every local node over the launch plan and spec.env (a run must not listen beyond this machine):
LOOPBACK_ENV = {
    C.ENV_LISTEN_HOST: LOOPBACK,  # ddpjob's own listeners (ddpjob_trainer/listen.py)
    "PET_LOCAL_ADDR": LOOPBACK,  # torchrun's node address: MASTER_ADDR and the rendezvous' node names
    "GLOO_SOCKET_IFNAME": LOOPBACK_INTERFACE,  # gloo binds the address of its interface
    "NCCL_SOCKET_IFNAME": LOOPBACK_INTERFACE,  # NCCL's bootstrap and socket transport likewise
}
ENV_METRICS_FILE = contract.METRICS_FILE_ENV  # the trainer's metrics path (default: <snapshot dir>/metrics.jsonl)
METRICS_NAME = "metrics.jsonl"  # the trainer's default metrics file name in the snapshot dir
TRAINER_PACKAGE = "ddpjob_trainer"  # a module job under it joins the process group through ddpjob_trainer.dist

# Rendezvous timeouts for local runs. Agents on one machine start together and
# talk over loopback, so waiting 30 s in last call for stragglers (torch's
# default) only slows every restart; measured here: ~7-15 s per elastic event
# with these, ~45 s with the defaults. joinSeconds and closeSeconds are kept.
FAST_RDZV_TIMEOUTS = {"last_call_seconds": 3, "keep_alive_interval_seconds": 2, "keep_alive_max_attempts": 3}


@dataclass(frozen=True)
class LocalNode:
    """One node's torchrun agent: its argv and the environment the launch plan gives it."""

    index: int
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None = None  # the working directory (None: the caller's)


@dataclass(frozen=True)
class LocalPlan:
    """Everything a local run starts, and what it changed from the spec (to print)."""

    job: str
    rdzv_id: str
    spec: DDPJobSpec
    nodes: list[LocalNode]
    snapshot_dir: Path | None
    metrics_file: Path
    notes: list[str] = field(default_factory=list)
    store: LocalNode | None = None  # the rendezvous store process (rdzvStore: pod), index -1

    @property
    def replicas(self) -> int:
        """The nodes that train at first (0..replicas-1); `nodes` beyond them are the warm spares."""
        return self.spec.desired_replicas

    @property
    def spares(self) -> list[int]:
        """The indices of the spare nodes the run starts with (spec.elasticPolicy.spareReplicas)."""
        return [node.index for node in self.nodes[self.replicas:]]


def localize(value: str, mount_path: str | None, local_dir: Path | None) -> str:
    """`value` with a leading `mount_path` (the path itself or below it) replaced by `local_dir`."""
    if not mount_path or local_dir is None:
        return value
    root = mount_path.rstrip("/") or "/"
    if value == root:
        return str(local_dir)
    prefix = root if root.endswith("/") else root + "/"
    if value.startswith(prefix):
        return str(local_dir / value[len(prefix):])
    return value


def local_spec(spec: DDPJobSpec, *, port: int | None, fast_rendezvous: bool) -> tuple[DDPJobSpec, list[str]]:
    """The spec as a local run uses it, and one note per change (and one saying what "auto" runs).

    Args:
        spec: the parsed spec.
        port: rendezvous port replacing spec.elasticPolicy.rdzvPort (c10d), None to keep it.
        fast_rendezvous: shorten the rendezvous timeouts to FAST_RDZV_TIMEOUTS (never lengthen them).
    """
    ep, notes, update = spec.elastic_policy, [], {}
    if ep.n_proc_per_node == "auto":
        # Resolved by the Pods' rule (launch.workers_per_node), not replaced: said because local
        # nodes share this machine, so N nodes of W workers start N x W processes here.
        notes.append(f'nProcPerNode "auto" -> {workers_per_node(spec)} worker(s) per node, as in the Pods')
    if port is not None and ep.rdzv_backend == "c10d":
        update["rdzv_port"] = port
    if fast_rendezvous:
        timeouts, shortened = _shortened(ep.rdzv_timeouts)
        if shortened:
            update["rdzv_timeouts"] = timeouts
            notes.append("rendezvous timeouts shortened for a local run: " + ", ".join(shortened)
                         + " (--spec-rdzv-timeouts keeps the spec's)")
    if ep.rdzv_backend != "c10d":
        notes.append(f"rdzvBackend {ep.rdzv_backend}: the nodes use the etcd at "
                     f"{','.join(ep.rdzv_endpoints)}, which you run")
    if not update:
        return spec, notes
    return spec.model_copy(update={"elastic_policy": ep.model_copy(update=update)}), notes


def _shortened(timeouts):
    changes, shortened = {}, []
    for name, fast in FAST_RDZV_TIMEOUTS.items():
        current = getattr(timeouts, name)
        if current > fast:
            changes[name] = fast
            shortened.append(f"{_camel(name)} {current} -> {fast}")
    return timeouts.model_copy(update=changes), shortened


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def local_plan(job: str, spec: DDPJobSpec, *, rdzv_id: str, run_dir: Path, torchrun: str,
               port: int | None = None, fast_rendezvous: bool = True,
               fast_restart: bool | None = None, runtime_dir: Path = Path("/tmp")) -> LocalPlan:
    """One LocalNode per desired replica and per spare (spec.elasticPolicy.spareReplicas, indices
    after the replicas, as the spare pods'), from the Pods' launch plan.

    Args:
        job: metadata.name.
        spec: the parsed spec.
        rdzv_id: the rendezvous id, unique per run (a finished id cannot be reused).
        run_dir: the run directory; snapshots go to `run_dir/snapshots`.
        torchrun: path of the torchrun executable that replaces the Pods' `torchrun`.
        port: see local_spec.
        fast_rendezvous: see local_spec.
        fast_restart: spec.elasticPolicy.fastRestart for this run (the Pods' rule,
            render.launch.with_fast_restart); None: the spec's, or on where ddpjob-trainer is
            installed beside `ddpjob` (the nodes' torchrun shares its environment, so the
            requirement the field states is met).
        runtime_dir: where the nodes' fork servers make their 0700 directories (fastRestart), in
            place of the pods' emptyDir: see local_runtime_dir.

    Raises:
        launch.UnsupportedLocalEnvError: a spec.env entry uses valueFrom.
    """
    spec, notes = local_spec(spec, port=port, fast_rendezvous=fast_rendezvous)
    spec = _with_fast_restart(spec, fast_restart, notes)
    notes += exposed_listeners(spec)
    if spec.script:  # before the working directory changes (see local_work_dir)
        spec = spec.model_copy(update={"script": str(Path(spec.script).resolve())})
    mount = spec.snapshot.mount_path if spec.snapshot else None
    snapshot_dir = run_dir / "snapshots" if spec.snapshot else None
    cwd = local_work_dir(spec, run_dir)
    nodes = []
    spares = spec.elastic_policy.spare_replicas
    if spares:
        notes.append(f"{spares} warm spare node(s) ({_indices(spec.desired_replicas, spares)}): they wait outside "
                     "the group and take a lost node's place at once")
    for index in range(spec.desired_replicas + spares):
        launch = launch_plan(job=job, namespace="", uid=rdzv_id, spec=spec, node_index=index,
                             rdzv_host=LOOPBACK, snapshot_dir=str(snapshot_dir) if snapshot_dir else None,
                             zygote_dir=str(runtime_dir))
        env = {name: localize(value, mount, snapshot_dir) for name, value in merged_env(launch, spec.env).items()}
        env.update(LOOPBACK_ENV)
        if snapshot_dir is None:
            # Without a snapshot volume the trainer has no default metrics path; the view needs one.
            env.setdefault(ENV_METRICS_FILE, str(run_dir / METRICS_NAME))
        args = [localize(arg, mount, snapshot_dir) for arg in launch.args]
        nodes.append(LocalNode(index, [torchrun, *args], env, cwd))
    metrics = nodes[0].env.get(ENV_METRICS_FILE) or str(snapshot_dir / METRICS_NAME)
    return LocalPlan(job, rdzv_id, spec, nodes, snapshot_dir, Path(metrics), notes, _store(spec, torchrun))


# What torch opens itself on every interface, with no address to give it (measured with `ss -ltnp`
# during local runs; docs/security.md): named in the run's output.
NOTE_OWN_PROCESS_GROUP = (
    "a script that calls torch.distributed.init_process_group itself has rank 0's process-group store "
    "(MASTER_PORT) listen on every interface: torch's TCPStore takes no address to bind; ddpjob_trainer's "
    "distributed() and Job keep it on 127.0.0.1 like every other listener of this run")
NOTE_TORCH_C10D_STORE = (
    "node 0's torchrun hosts torch's own c10d store, which listens on every interface (rdzvStore: pod, "
    "or ddpjob-trainer beside ddpjob, keeps it on 127.0.0.1)")


def exposed_listeners(spec: DDPJobSpec) -> list[str]:
    """Notes naming the listeners of this run that torch opens beyond loopback."""
    notes = []
    if not (spec.module or "").startswith(TRAINER_PACKAGE + "."):
        notes.append(NOTE_OWN_PROCESS_GROUP)
    ep = spec.elastic_policy
    if ep.rdzv_backend == "c10d" and ep.store_on_node and not ep.fast_restart:
        notes.append(NOTE_TORCH_C10D_STORE)
    return notes


def _indices(first: int, count: int) -> str:
    return f"node {first}" if count == 1 else f"nodes {first}-{first + count - 1}"


def local_runtime_dir(environ: Mapping[str, str]) -> Path:
    """Where a local run's fork servers make their directories: $XDG_RUNTIME_DIR (the user's
    own, mode 0700) when set, else the system's temporary directory, where another user may
    have made a node's directory first: the server then refuses it and the node's workers start
    fresh (ddpjob_trainer.zygote_checks); the run id's random part makes that a guess."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) if runtime and Path(runtime).is_absolute() else Path(tempfile.gettempdir())


def fast_restart_installed() -> bool:
    """Whether ddpjob-trainer is installed here: torchrun knows --rdzv_backend=ddpjob-c10d (its
    entry point), and the same distribution brings ddpjob_trainer.zygote."""
    return bool(entry_points(group="torchrun.handlers", name=C10D_BACKEND_NAME))


def _with_fast_restart(spec: DDPJobSpec, fast_restart: bool | None, notes: list[str]) -> DDPJobSpec:
    """The spec with elasticPolicy.fastRestart as this run uses it (see local_plan); a note when
    the run turns it on by itself."""
    ep = spec.elastic_policy
    if fast_restart is None:
        fast_restart = ep.fast_restart or fast_restart_installed()
        if fast_restart and not ep.fast_restart:
            notes.append("elasticPolicy.fastRestart on: ddpjob-trainer is installed beside ddpjob")
    if fast_restart == ep.fast_restart:
        return spec
    return spec.model_copy(update={"elastic_policy": ep.model_copy(update={"fast_restart": fast_restart})})


def local_work_dir(spec: DDPJobSpec, run_dir: Path) -> Path | None:
    """The nodes' working directory: the Pods' (render.launch.working_dir) in the run's snapshot
    directory, else `run_dir/work` for a script job; None (the caller's) for a module job.

    Each run has its own, so a script that saves relative to its working directory resumes
    after a node failure but never picks up an earlier run's files (unless --workdir names
    that run). The script path is made absolute first; a module keeps `python -m`'s sys.path.
    """
    if not spec.script:
        return None
    pod_dir = working_dir(spec)
    if pod_dir is not None:
        return Path(localize(pod_dir, spec.snapshot.mount_path, run_dir / "snapshots"))
    return run_dir / WORK_DIR_NAME


def _store(spec: DDPJobSpec, torchrun: str) -> LocalNode | None:
    """The store pod's command (render_store_pod) on loopback, with the nodes' Python."""
    if not spec.elastic_policy.store_on_pod:
        return None
    python = str(Path(torchrun).parent / "python")
    argv = [*store_command(python), "--host", LOOPBACK, "--port", str(spec.elastic_policy.rdzv_port)]
    return LocalNode(-1, argv, {"PYTHONUNBUFFERED": "1"})


def inherited_env(environ: dict[str, str]) -> dict[str, str]:
    """This shell's environment minus what would fight the launch plan.

    A Pod starts from an empty environment; a local node inherits PATH, HOME and
    the virtualenv, but not stray PET_* (torchrun flags) or DDPJOB_* variables.
    """
    return {k: v for k, v in environ.items() if not k.startswith(("PET_", "DDPJOB_", "TORCHELASTIC_"))}


def rdzv_endpoint(plan: LocalPlan) -> str:
    """The PET_RDZV_ENDPOINT every node of the plan uses."""
    return plan.nodes[0].env["PET_RDZV_ENDPOINT"]

