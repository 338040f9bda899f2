"""How one pod maps onto this machine (pure): volumes, cluster DNS, the image's commands, env.

* volumes: a ``persistentVolumeClaim`` becomes one directory per claim shared by every pod
  (the snapshot volume must be shared across nodes and survive pod replacement); an
  ``emptyDir`` one directory per pod. Env values and args under a container's mountPaths
  are rewritten to those directories (there is no mount namespace).
* DNS: ``*.svc``, ``*.svc.cluster.local`` and ``<pod>.<service>[.<ns>]`` names in env values
  and args become the address the pod's network resolves them to (.network: each pod's own
  loopback address), so the c10d endpoint ``mlp-node-0.mlp.<ns>.svc.cluster.local:PORT`` resolves.
* the placement (:class:`Placement`): what the kubelet adds for one pod on one node: its
  address, the claims' directories (a bound PersistentVolume's hostPath), env of its own.
* env ``valueFrom.fieldRef`` (the downward API) reads the pod: metadata.name/namespace/uid,
  spec.nodeName/serviceAccountName, status.podIP/hostIP.
* the image: ``torchrun``/``python`` resolve to the Python environment the node maps the pod's
  ``image`` to (``images``, made by ddpjob_sandbox.images, e.g. plain torch without ddpjob),
  else to this interpreter's virtualenv. The process inherits this machine's environment
  (PATH, HOME) minus torchrun and ddpjob variables, then gets the pod's env on top, like an
  image's env under a container's; a mapped image also loses PYTHONPATH and the virtualenv's
  variables, which would bring this machine's packages into it.
* the termination message file: ``terminationMessagePath`` is a per-pod file, and env
  values naming that path point there.
"""
from __future__ import annotations

import dataclasses
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddpjob_sandbox.node.network import LOOPBACK_RESOLVER, Resolve
from ddpjob_sandbox.pod_status import LOOPBACK

NODE_ENV = "SANDBOX_NODE"  # marks every process this agent started (teardown safety net)
POD_ENV = "SANDBOX_POD_UID"  # marks every process of one pod (the container's boundary)
DEFAULT_TERMINATION_PATH = "/dev/termination-log"  # the API's default terminationMessagePath
# Variables of this machine that would fight the pod's own: torchrun flags, ddpjob settings.
DROPPED_ENV_PREFIXES = ("PET_", "DDPJOB_", "TORCHELASTIC_", "KUBECONFIG", POD_ENV, NODE_ENV)
VENV_COMMANDS = ("torchrun", "python", "python3")  # found in the image's environment, not on PATH
# What makes a Python find another environment's packages: no container inherits them.
FOREIGN_PYTHON_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")

# A DNS name that only cluster DNS resolves: anything under .svc / .svc.cluster.local.
_SVC_NAME = re.compile(r"(?<![\w.-])[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                       r"\.svc(\.cluster\.local)?(?![\w.-])")


# Volumes whose files the kubelet writes from the API (a pod-local directory here, filled by
# the agent before the container starts: node.projection).
PROJECTED_KINDS = ("projected", "configMap", "secret", "downwardAPI")


class UnsupportedPodError(ValueError):
    """The pod uses something this one-machine node cannot provide."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """What the node decides for one pod beyond the pod's own spec.

    ``claims``: claim name -> directory (the hostPath of the PersistentVolume it is bound to);
    a claim not named uses the node's own shared directory (claim_dir). ``env``: what the
    kubelet adds under the pod's env (the API server's address, the pod's listen address).
    """

    pod_ip: str = LOOPBACK
    host_ip: str = LOOPBACK
    resolve: Resolve = LOOPBACK_RESOLVER
    claims: Mapping[str, Path] = dataclasses.field(default_factory=dict)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)


# A launch outside any node's network (every name and address 127.0.0.1, no claims, no kubelet
# env): the pure tests of the mapping use it. The agent gives each pod its own (NodeAgent.placement).
LOOPBACK_PLACEMENT = Placement()


@dataclasses.dataclass(frozen=True)
class ContainerLaunch:
    """What the node runs for a pod: argv, environment, working directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    termination_log: Path | None = None  # the local file behind terminationMessagePath


def volume_dirs(pod: Mapping[str, Any], root: Path, claims: Mapping[str, Path] | None = None) -> dict[str, Path]:
    """Volume name -> local directory: per claim (``claims``, else the node's shared one), private
    per pod for emptyDir and the kinds the kubelet fills from the API (PROJECTED_KINDS).

    Raises:
        UnsupportedPodError: a volume of another kind (hostPath, csi, ...).
    """
    meta = pod["metadata"]
    dirs = {}
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            dirs[name] = (claims or {}).get(claim) or claim_dir(root, meta["namespace"], claim)
        elif "emptyDir" in volume or any(kind in volume for kind in PROJECTED_KINDS):
            dirs[name] = pod_dir(root, meta) / "volumes" / name
        else:
            kind = next((k for k in volume if k != "name"), "?")
            raise UnsupportedPodError(f"volume {name!r} is a {kind}; the sandbox node supports "
                                      f"persistentVolumeClaim, emptyDir and {', '.join(PROJECTED_KINDS)} only")
    return dirs


def claim_dir(root: Path, namespace: str, claim: str) -> Path:
    """The directory that stands for PersistentVolumeClaim ``claim`` (ReadWriteMany)."""
    return root / "claims" / namespace / claim


def pod_dir(root: Path, meta: Mapping[str, Any]) -> Path:
    """A pod's private directory (like /var/lib/kubelet/pods/<uid>)."""
    return root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"


def mounts(container: Mapping[str, Any], dirs: Mapping[str, Path]) -> list[tuple[str, Path]]:
    """(mountPath, local dir) of each volumeMount, longest path first (the innermost mount wins).

    Raises:
        UnsupportedPodError: a subPath that would leave its volume.
    """
    pairs = []
    for mount in container.get("volumeMounts") or []:
        local = dirs[mount["name"]]
        sub = mount.get("subPath")
        if sub and (sub.startswith("/") or ".." in Path(sub).parts):
            # As the kubelet refuses it: a subPath must stay inside its volume.
            raise UnsupportedPodError(f"volumeMount {mount['name']!r} has subPath {sub!r}: it must be a relative "
                                      "path without '..'")
        pairs.append((mount["mountPath"].rstrip("/") or "/", local / sub if sub else local))
    return sorted(pairs, key=lambda pair: -len(pair[0]))


def localize(value: str, mount_pairs: list[tuple[str, Path]]) -> str:
    """``value`` with a leading mountPath (the path itself or below it) replaced by its directory."""
    for path, local in mount_pairs:
        if value == path:
            return str(local)
        if value.startswith(path + "/"):
            return str(local / value[len(path) + 1:])
    return value


def map_hosts(value: str, namespace: str, services: list[str], resolve: Resolve = LOOPBACK_RESOLVER) -> str:
    """Cluster DNS names inside ``value`` replaced by the address ``resolve`` gives them
    (127.0.0.1 for all by default, as Placement's)."""
    value = _SVC_NAME.sub(lambda m: resolve(m.group(0)), value)
    if services:
        names = "|".join(re.escape(s) for s in services)
        pod_in_service = rf"(?<![\w.-])[a-z0-9]([-a-z0-9]*[a-z0-9])?\.({names})(\.{re.escape(namespace)})?(?![\w.-])"
        value = re.sub(pod_in_service, lambda m: resolve(m.group(0)), value)
    return value


# The downward API's env fields this node can answer; the pod's IP is the placement's.
def field_ref(pod: Mapping[str, Any], path: str, placement: Placement) -> str:
    """The value of an env ``valueFrom.fieldRef.fieldPath``.

    Raises:
        UnsupportedPodError: a field this node does not provide (labels, annotations...).
    """
    meta, spec = pod["metadata"], pod["spec"]
    fields = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName"),
              "status.podIP": placement.pod_ip, "status.hostIP": placement.host_ip}
    if path not in fields:
        raise UnsupportedPodError(f"env fieldRef.fieldPath {path!r} is not provided by the sandbox node "
                                  f"(it provides {', '.join(fields)})")
    return fields[path] or ""


def resolve_command(name: str, bin_dir: Path | None = None) -> str:
    """The executable for a container's command[0]: torchrun/python of the image's environment
    (``bin_dir``, this interpreter's by default), else PATH."""
    bin_dir = Path(sys.executable).parent if bin_dir is None else bin_dir
    if "/" not in name and name in VENV_COMMANDS:
        candidate = bin_dir / name
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name) if "/" not in name else name
    if not found:
        raise UnsupportedPodError(f'command "{name}" is not found in {bin_dir} or on PATH')
    return found


def base_env(environ: Mapping[str, str], image_env: Path | None = None) -> dict[str, str]:
    """This machine's environment as the "image" env: without torchrun, ddpjob and sandbox
    variables; for a mapped image (``image_env``) also without FOREIGN_PYTHON_ENV, and with
    that environment's bin/ first on PATH."""
    env = {k: v for k, v in environ.items() if not k.startswith(DROPPED_ENV_PREFIXES)}
    if image_env is not None:
        env = {k: v for k, v in env.items() if k not in FOREIGN_PYTHON_ENV}
        env["PATH"] = ":".join(p for p in (str(image_env / "bin"), env.get("PATH", "")) if p)
    return env


def container_launch(pod: Mapping[str, Any], root: Path, services: list[str],
                     environ: Mapping[str, str], images: Mapping[str, Path] | None = None, *,
                     placement: Placement = LOOPBACK_PLACEMENT) -> ContainerLaunch:
    """The local launch of a pod's (only) container.

    Args:
        pod: the Pod object.
        root: the node's directory (volumes, logs, working directories).
        services: Service names in the pod's namespace (for ``<pod>.<service>`` names).
        environ: the environment the "image" provides (see base_env).
        images: image name -> the Python environment (a virtualenv's directory) standing for
            it; an image not named runs in this interpreter's environment.
        placement: the pod's address, name resolution, claims and kubelet env on this node.

    Raises:
        UnsupportedPodError: more than one container, a valueFrom other than a provided
            fieldRef, an unsupported volume or a command that is not found.
    """
    spec, meta = pod["spec"], pod["metadata"]
    containers = spec.get("containers") or []
    if len(containers) != 1:
        raise UnsupportedPodError(f"pod has {len(containers)} containers; the sandbox node runs exactly one")
    container = containers[0]
    termination_log = pod_dir(root, meta) / "termination-log"
    # The kubelet bind-mounts one file at terminationMessagePath; here paths naming it move.
    pairs = [(container.get("terminationMessagePath", DEFAULT_TERMINATION_PATH), termination_log),
             *mounts(container, volume_dirs(pod, root, placement.claims))]

    def local(value: str) -> str:
        return map_hosts(localize(value, pairs), meta["namespace"], services, placement.resolve)

    image_env = (images or {}).get(container.get("image", ""))
    env = base_env(environ, image_env)
    env["HOSTNAME"] = spec.get("hostname") or meta["name"]
    env.update(placement.env)
    for entry in container.get("env") or []:
        source = entry.get("valueFrom")
        if source is None:
            env[entry["name"]] = local(entry.get("value") or "")
        elif set(source) == {"fieldRef"}:
            env[entry["name"]] = field_ref(pod, source["fieldRef"]["fieldPath"], placement)
        else:
            raise UnsupportedPodError(f"env {entry['name']} uses valueFrom {', '.join(source)}; the sandbox node "
                                      "takes literal values and fieldRef only")
    command = list(container.get("command") or [])
    if not command:
        raise UnsupportedPodError("container has no command; the sandbox node has no image entrypoint to fall back on")
    bin_dir = image_env / "bin" if image_env is not None else None
    argv = [resolve_command(command[0], bin_dir), *map(local, command[1:]), *map(local, container.get("args") or [])]
    cwd = Path(localize(container["workingDir"], pairs)) if container.get("workingDir") else pod_dir(root, meta) / "cwd"
    return ContainerLaunch(argv, env, cwd, termination_log)
