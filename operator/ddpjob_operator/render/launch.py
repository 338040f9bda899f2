"""The launch plan: the exact command and environment of one node's torchrun agent.

Pure and shared: `render.py` puts it into each Pod, `ddpjob run` starts local
processes from it (rendezvous host 127.0.0.1, snapshot dir mapped to a local
directory), so a job behaves the same on a laptop and on a cluster.

torchrun reads every flag from a `PET_<FLAG>` variable (torch/distributed/argparse_util.py),
so the rendezvous settings travel as environment and the command stays
`torchrun -m MODULE ARGS...`, readable in `kubectl describe pod`.

Environment precedence (last wins, in pods as in local runs): the operator's
variables first, then `spec.env`. `spec.env` may override the tuning variables
(PYTHONUNBUFFERED, TORCH_DISABLE_SHARE_RDZV_TCP_STORE); the variables that come
from a spec field (PET_*, DDPJOB_*) are rejected by validation instead, because
a per-pod override would split the rendezvous.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ddpjob_rdzv import C10D_BACKEND_NAME, contract

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.quantity import parse_quantity
from ddpjob_operator.api.spec import ETCD_V3, GPU_RESOURCE, DDPJobSpec, RdzvTimeouts


@dataclass(frozen=True)
class NodeLaunch:
    """What one node runs: command + args, and the operator's environment."""

    command: list[str]
    args: list[str]
    env: dict[str, str]


SHUTDOWN_MARGIN_SECONDS = 2  # torchrun's SIGKILL of its workers comes this long before the pod's


def shutdown_timeout(grace_seconds: int) -> int:
    """torchrun's --shutdown-timeout for a pod grace period: the workers' share of it."""
    return max(1, grace_seconds - SHUTDOWN_MARGIN_SECONDS)


def torchrun_args(spec: DDPJobSpec) -> list[str]:
    """`-m MODULE ARGS...` or `SCRIPT ARGS...` (torchrun's positional part)."""
    head = ["-m", spec.module] if spec.module else [spec.script]
    return [*head, *spec.args]


def workers_per_node(spec: DDPJobSpec) -> str:
    """PET_NPROC_PER_NODE: spec.elasticPolicy.nProcPerNode with "auto" resolved here, for the
    Pods, the sandbox and `ddpjob run` alike (each reads it from this launch plan).

    "auto": one worker per GPU of spec.resources.limits["nvidia.com/gpu"]; without a GPU, the
    whole CPUs of the CPU request (floor, at least 1), 1 without one. torchrun's own "auto"
    is never passed on: without an accelerator it starts one worker per CPU of
    os.sched_getaffinity, every CPU of the node unless the static CPU manager pins the pod
    (a CFS CPU limit does not): 64 workers in a 2Gi pod on a 64-core node. An integer and
    "gpu" (torchrun counts the visible GPUs) pass unchanged.
    """
    nproc = spec.elastic_policy.n_proc_per_node
    if nproc != "auto":
        return str(nproc)
    gpus = _whole(spec.resources.limits.get(GPU_RESOURCE, 0))
    return str(gpus if gpus >= 1 else max(1, _whole(cpu_request(spec))))


def cpu_request(spec: DDPJobSpec) -> int | str:
    """The container's CPU request: requests.cpu, else limits.cpu (the API server copies a limit
    into a missing request), else 0. A LimitRange default is not seen: it is applied at admission."""
    res = spec.resources
    return res.requests.get("cpu", res.limits.get("cpu", 0))


def _whole(quantity: int | str) -> int:
    """The whole units of a quantity, rounded down; 0 for one too large to be a number, which
    the API server refuses in a pod anyway (the render must still answer, not crash)."""
    value = parse_quantity(quantity)
    return int(value) if value.is_finite() else 0


WORK_DIR_NAME = "work"  # <snapshot mountPath>/work: the working directory of script jobs


def working_dir(spec: DDPJobSpec) -> str | None:
    """The node container's working directory: `<spec.snapshot.mountPath>/work`, or None (the
    image's own) for a job without a snapshot volume, a `module:` job or a relative `script:`.

    Scripts such as the PyTorch DDP tutorial's save `snapshot.pt` relative to their working
    directory; in the image's it would live and die with the container, so a replaced pod would
    train from epoch 0. On the snapshot volume every node and every replacement sees it, and the
    volume is mounted at the job's own directory (render.node_pod), so it is the job's alone and a
    job applied again under its name resumes from its files. Only an absolute `script:` moves: a
    relative one (and `python -m`'s sys.path) is resolved against the image's working directory,
    which a render cannot know.
    """
    if spec.snapshot is None or not spec.script or not spec.script.startswith("/"):
        return None
    return f"{spec.snapshot.mount_path.rstrip('/')}/{WORK_DIR_NAME}"


def rdzv_conf(backend: str, timeouts: RdzvTimeouts, credentials_dir: str | None = None,
              is_host: bool | None = None, *, allow_insecure_credentials: bool = False,
              replacement_wait: int = 0) -> str:
    """PET_RDZV_CONF, with torch's key names (dynamic_rendezvous.py), plus where the
    etcd credentials are mounted (paths only: a password never appears in env or args),
    for c10d whether this agent hosts the store (see hosts_c10d_store), and the survivors'
    wait for a lost node's replacement when above 0 (only ddpjob's rendezvous reads it)."""
    conf = {
        "join_timeout": timeouts.join_seconds,
        "last_call_timeout": timeouts.last_call_seconds,
        "close_timeout": timeouts.close_seconds,
        "keep_alive_interval": timeouts.keep_alive_interval_seconds,
        "keep_alive_max_attempt": timeouts.keep_alive_max_attempts,
    }
    if backend == "etcd":
        # torch's v2 etcd backend (etcd_rendezvous.py) calls its join timeout "timeout".
        conf["timeout"] = timeouts.join_seconds
    conf.update(credential_conf(backend, credentials_dir, allow_insecure_credentials))
    if is_host is not None and backend == "c10d":
        conf["is_host"] = "true" if is_host else "false"
    if replacement_wait > 0:
        conf[contract.REPLACEMENT_WAIT_CONF] = replacement_wait
    return ",".join(f"{key}={value}" for key, value in conf.items())


def credential_conf(backend: str, credentials_dir: str | None,
                    allow_insecure_credentials: bool = False) -> dict[str, str]:
    """rdzv_conf keys that point the backend at the mounted spec.elasticPolicy.rdzvSecretName."""
    if not credentials_dir:
        return {}
    if backend == ETCD_V3:
        # ddpjob's backend uses whichever of ca.crt, tls.crt, tls.key, username, password the
        # Secret holds (ddpjob_rdzv.settings), so the operator need not read the Secret to render.
        # It refuses a password without ca.crt unless spec.elasticPolicy.rdzvAllowInsecureCredentials.
        conf = {"credentials_dir": credentials_dir}
        if allow_insecure_credentials:
            conf["allow_insecure_credentials"] = "true"
        return conf
    # torch's etcd (v2) backend (etcd_rendezvous.py) knows TLS only, each file by its own key.
    return {"protocol": "https", "cacert": f"{credentials_dir}/ca.crt",
            "cert": f"{credentials_dir}/tls.crt", "key": f"{credentials_dir}/tls.key"}


def rdzv_endpoint_for(spec: DDPJobSpec, rdzv_host: str) -> str:
    """PET_RDZV_ENDPOINT: the c10d store (its pod's Service, or node 0), the managed etcd, or the etcd endpoints."""
    ep = spec.elastic_policy
    if ep.rdzv_backend == "c10d":
        return f"{rdzv_host}:{ep.rdzv_port}"
    if ep.managed_etcd.enabled:  # the operator's own etcd for this job, at rdzv_host
        return f"{rdzv_host}:{C.DEFAULT_ETCD_PORT}"
    # etcd takes exactly one endpoint (validated); the etcd-v3 backend splits on commas.
    return ",".join(ep.rdzv_endpoints)


def hosts_c10d_store(node_index: int, spec: DDPJobSpec) -> bool:
    """Whether this node's agent hosts the c10d store: node 0 with `rdzvStore: node`.

    Said explicitly (is_host in the conf) rather than left to torch, which lets every agent
    whose address matches the endpoint try to bind the port and the first one win: on one
    host (ddpjob run, hostNetwork pods on one machine) that can be any node, while the
    operator's whole-group restart rule relies on the store living on node 0. With is_host
    set, node 0 fails loudly if it cannot bind instead of silently becoming a client.
    """
    return node_index == 0 and spec.elastic_policy.store_on_node


def rdzv_id(uid: str, generation: int = 0) -> str:
    """PET_RDZV_ID: the job's uid, suffixed with the rendezvous generation once a whole-group
    restart happened, so the new group never meets a rendezvous state of the old one."""
    return uid if generation <= 0 else f"{uid}-{generation}"


def launch_plan(*, job: str, namespace: str, uid: str, spec: DDPJobSpec, node_index: int,
                rdzv_host: str, snapshot_dir: str | None, rdzv_credentials_dir: str | None = None,
                rdzv_generation: int = 0, zygote_dir: str = C.ZYGOTE_MOUNT_PATH) -> NodeLaunch:
    """The launch of node `node_index`.

    Args:
        job: metadata.name.
        namespace: metadata.namespace ("" for local runs).
        uid: metadata.uid; the rendezvous id, unique per job (a finished id cannot be reused).
        spec: the parsed spec.
        node_index: 0..replicas-1.
        rdzv_host: host of the c10d store (the store pod's Service, or node 0 with rdzvStore: node) or of
            the managed etcd; 127.0.0.1 locally; unused by external etcd backends.
        snapshot_dir: where the snapshot volume is seen (spec.snapshot.mountPath in pods), None for none.
        rdzv_credentials_dir: where spec.elasticPolicy.rdzvSecretName is mounted, None for none.
        rdzv_generation: status.rendezvousGeneration (whole-group restarts so far).
        zygote_dir: where the nodes' fork servers make their directories (fastRestart): the
            pod's emptyDir, or a local run's private runtime directory.
    """
    ep = spec.elastic_policy
    env = {
        "PET_NNODES": f"{spec.min_replicas}:{spec.max_replicas}",
        "PET_NPROC_PER_NODE": workers_per_node(spec),
        "PET_RDZV_BACKEND": ep.rdzv_backend,
        "PET_RDZV_ENDPOINT": rdzv_endpoint_for(spec, rdzv_host),
        "PET_RDZV_ID": rdzv_id(uid, rdzv_generation),
        "PET_RDZV_CONF": rdzv_conf(ep.rdzv_backend, ep.rdzv_timeouts, rdzv_credentials_dir,
                                   hosts_c10d_store(node_index, spec),
                                   allow_insecure_credentials=ep.rdzv_allow_insecure_credentials,
                                   replacement_wait=ep.replacement_wait_seconds if ep.ddpjob_rendezvous else 0),
        "PET_MAX_RESTARTS": str(ep.max_restarts),
        # Measured: sharing the rendezvous TCP store with the workers made gloo worker
        # restarts fail or hang in 4 of 6 runs, 0 of 9 without sharing.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        # Logs reach `kubectl logs` as they are printed, not when a buffer fills or at exit.
        "PYTHONUNBUFFERED": "1",
        C.ENV_JOB_NAME: job,
        C.ENV_NAMESPACE: namespace,
        C.ENV_JOB_UID: uid,  # the progress record names its job, the operator compares (decide/progress.py)
        C.ENV_NODE_INDEX: str(node_index),
        # A stuck collective fails the workers in bounded time (ddpjob_trainer.dist.collective_timeout).
        C.ENV_COLLECTIVE_TIMEOUT: str(spec.failure_policy.collective_timeout_seconds),
    }
    if spec.snapshot is not None:
        # torchrun SIGKILLs its workers this long after forwarding SIGTERM; by default 30 s
        # whatever the pod's grace period. Just inside the grace period, so the agent still
        # exits by itself before the kubelet's SIGKILL.
        env["PET_SHUTDOWN_TIMEOUT"] = str(shutdown_timeout(spec.snapshot.graceful_stop_seconds))
    if snapshot_dir is not None:
        env[C.ENV_SNAPSHOT_DIR] = snapshot_dir
        # Snapshots that exist but cannot be read stop the trainer unless the spec says to start over.
        env[C.ENV_SNAPSHOT_ON_UNREADABLE] = spec.snapshot.on_unreadable if spec.snapshot else "Fail"
    launch = NodeLaunch(command=["torchrun"], args=torchrun_args(spec), env=env)
    return with_fast_restart(launch, spec, node_index, zygote_dir) if ep.fast_restart else launch


def zygote_socket(base_dir: str, rendezvous_id: str, node_index: int) -> str:
    """DDPJOB_ZYGOTE_SOCKET: ``<base_dir>/ddpjob-zygote-<rdzv id>-<node>/socket``.

    A socket file, not an abstract name: an abstract name has no permissions and is listed to
    every local user, so any of them (and any container of the pod) could have the server fork
    code as its user. The fork server creates the directory with mode 0700 and refuses one it
    finds of another user, another mode or a link (ddpjob_trainer.zygote_checks). ``base_dir``
    is the pod's emptyDir (ZYGOTE_MOUNT_PATH), or a local run's private runtime directory.
    The sandbox's pods and `ddpjob run`'s nodes share one machine: the rendezvous id keeps jobs
    (and whole-group restarts) apart, the node index the nodes of one job; a replacement node
    reuses its index's directory once the old node's server has left with its agent. A path
    longer than a socket address holds is reached through /proc/self/fd by the trainer.
    """
    return f"{base_dir.rstrip('/')}/ddpjob-zygote-{rendezvous_id}-{node_index}/socket"


def forks_workers(spec: DDPJobSpec) -> bool:
    """Whether the nodes' workers fork from a per-node server: fastRestart, module jobs only."""
    return spec.elastic_policy.fast_restart and bool(spec.module)


def with_fast_restart(launch: NodeLaunch, spec: DDPJobSpec, node_index: int,
                      zygote_dir: str = C.ZYGOTE_MOUNT_PATH) -> NodeLaunch:
    """`launch` as spec.elasticPolicy.fastRestart runs it (ddpjob-trainer in the image).

    c10d becomes ddpjob-c10d: torch's c10d handler, registered by ddpjob-trainer's torchrun
    entry point, whose re-rendezvous completes once every node with a live heartbeat joined
    (ddpjob_trainer.rendezvous.early); etcd-v3 does so already, torch's etcd has no such hook.
    A module job's worker becomes `-m ddpjob_trainer.zygote MODULE ARGS`: a client of the
    node's fork server, which imported torch once (ddpjob_trainer.zygote), at its socket under
    ``zygote_dir`` (zygote_socket). A script job keeps fresh workers: the server runs modules only.
    """
    env, args = dict(launch.env), list(launch.args)
    if spec.elastic_policy.rdzv_backend == "c10d":
        env["PET_RDZV_BACKEND"] = C10D_BACKEND_NAME
    if forks_workers(spec):
        args = ["-m", C.ZYGOTE_MODULE, *args[1:]]  # drops torchrun's own "-m"; MODULE stays first
        env[C.ENV_ZYGOTE_SOCKET] = zygote_socket(zygote_dir, env["PET_RDZV_ID"], node_index)
    return NodeLaunch(command=launch.command, args=args, env=env)


class UnsupportedLocalEnvError(ValueError):
    """A spec.env entry refers to the cluster (valueFrom) and cannot run locally."""


def merged_env(launch: NodeLaunch, user_env: list[Mapping[str, Any]] | list[Any]) -> dict[str, str]:
    """The launch env with spec.env applied last (last wins), for local processes.

    Raises:
        UnsupportedLocalEnvError: for an entry with valueFrom (secrets and fields exist
            only in a cluster).
    """
    env = dict(launch.env)
    for i, entry in enumerate(user_env):
        item = entry if isinstance(entry, Mapping) else entry.model_dump(by_alias=True, exclude_none=True)
        if item.get("valueFrom"):
            raise UnsupportedLocalEnvError(
                f"spec.env[{i}] ({item['name']}) uses valueFrom, which only a cluster can resolve; "
                "give it a literal value for local runs")
        env[item["name"]] = item.get("value") or ""
    return env
