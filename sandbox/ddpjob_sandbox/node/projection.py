"""The files a kubelet writes into a pod's volumes from the API: service-account tokens, ConfigMaps,
Secrets and downward-API fields, as it fills ``projected``, ``configMap``, ``secret`` and
``downwardAPI`` volumes before the container starts.

The token comes from the TokenRequest API, bound to the pod (its name and uid), which is the
only token NodeRestriction lets a node ask for. It expires: :meth:`Projector.fill` returns the
shortest lifetime it was given, and the node agent fills the tokens again (``only_tokens``)
before that, as a kubelet renews a token older than 80% of its lifetime. Every file is replaced
whole (a new file renamed over the old), so a reader never sees half a token. Node authorization lets the node read only
the ConfigMaps and Secrets its own pods name.

A process here cannot see a file at /var/run/secrets/kubernetes.io/serviceaccount (there is
no mount namespace), so clients that read that fixed path (kopf's in-cluster login) would not
find it. For a pod that mounts the service account there, :func:`in_cluster_env` gives what a
client uses instead: a kubeconfig beside the token with the same token, CA and namespace, named
by KUBECONFIG, and KUBERNETES_SERVICE_HOST/PORT set to the API server as kube-proxy would route
the ``kubernetes`` Service.
"""
from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.node.launch import UnsupportedPodError, field_ref, Placement, pod_dir

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_TOKEN_SECONDS = 3600  # the API's default expirationSeconds of a projected token


def _write(directory: Path, relative: str, data: bytes) -> None:
    target = (directory / relative).resolve()
    if not target.is_relative_to(directory.resolve()):
        raise UnsupportedPodError(f"projected path {relative!r} leaves its volume")
    target.parent.mkdir(parents=True, exist_ok=True)
    _replace(target, data)


def _replace(target: Path, data: bytes, mode: int = 0o644) -> None:
    """Writes ``target`` whole: a reader sees the old file or the new one, never a mix; made
    with ``mode`` from the start (a kubeconfig holds the token)."""
    tmp = target.with_name(f".{target.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as out:
        out.write(data)
    tmp.replace(target)


def _items(data: Mapping[str, bytes], items: list[dict] | None, what: str) -> dict[str, bytes]:
    """Path -> bytes: every key under its own name, or only the listed items under their paths."""
    if not items:
        return dict(data)
    chosen = {}
    for item in items:
        if item["key"] not in data:
            raise UnsupportedPodError(f"{what} has no key {item['key']!r}")
        chosen[item["path"]] = data[item["key"]]
    return chosen


class Projector:
    """Fills one pod's API-backed volumes through the node's client (the node's own rights)."""

    def __init__(self, client: KubeClient):
        self.client = client

    def token(self, pod: Mapping[str, Any], source: Mapping[str, Any]) -> tuple[bytes, float]:
        """A token for the pod's service account, bound to the pod, and how long it is valid (s)."""
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName") or "default"
        spec: dict[str, Any] = {"expirationSeconds": source.get("expirationSeconds", DEFAULT_TOKEN_SECONDS),
                                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                                   "uid": meta["uid"]}}
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        path = (f"/api/v1/namespaces/{urllib.parse.quote(meta['namespace'])}/serviceaccounts/"
                f"{urllib.parse.quote(account)}/token")
        asked = time.time()
        answer = self.client.request("POST", path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                                   "spec": spec})
        expires = answer["status"].get("expirationTimestamp")
        lifetime = (datetime.datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp() - asked if expires
                    else float(spec["expirationSeconds"]))
        return answer["status"]["token"].encode(), lifetime

    def _object_data(self, kind: str, name: str, namespace: str, optional: bool) -> dict[str, bytes] | None:
        plural = "configmaps" if kind == "configMap" else "secrets"
        try:
            body = self.client.request("GET", f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/{plural}/"
                                              f"{urllib.parse.quote(name)}")
        except ApiError as e:
            if e.status == 404 and optional:
                return None
            raise UnsupportedPodError(f"{kind} {name!r} cannot be read: {e}") from None
        if kind == "configMap":
            return {k: v.encode() for k, v in (body.get("data") or {}).items()}
        return {k: base64.b64decode(v) for k, v in (body.get("data") or {}).items()}

    def _source_files(self, pod: Mapping[str, Any], source: Mapping[str, Any],
                      placement: Placement) -> dict[str, bytes]:
        namespace = pod["metadata"]["namespace"]
        for kind, key in (("configMap", "name"), ("secret", "secretName")):
            if kind in source:
                ref = source[kind]
                name = ref.get(key) or ref.get("name")
                data = self._object_data(kind, name, namespace, bool(ref.get("optional")))
                return {} if data is None else _items(data, ref.get("items"), f"{kind} {name!r}")
        if "downwardAPI" in source:
            files = {}
            for item in source["downwardAPI"].get("items") or []:
                if "fieldRef" not in item:
                    raise UnsupportedPodError(f"downwardAPI item {item.get('path')!r}: only fieldRef is provided")
                files[item["path"]] = field_ref(pod, item["fieldRef"]["fieldPath"], placement).encode()
            return files
        raise UnsupportedPodError(f"projected source {', '.join(source)} is not provided by the sandbox node")

    def fill(self, pod: Mapping[str, Any], dirs: Mapping[str, Path], placement: Placement, *,
             only_tokens: bool = False) -> float | None:
        """Writes the files of every API-backed volume of ``pod`` into its directory in ``dirs``
        (``only_tokens``: only the service-account tokens, renewed); returns the lifetime in
        seconds of the shortest-lived token written, None without one.

        Raises:
            UnsupportedPodError: a source this node cannot provide, or an object it cannot read.
            ApiError: the TokenRequest was refused.
        """
        shortest: float | None = None
        for volume in pod["spec"].get("volumes") or []:
            if "projected" in volume:
                sources = volume["projected"].get("sources") or []
            elif "configMap" in volume or "secret" in volume:
                sources = [{k: v for k, v in volume.items() if k != "name"}]
            elif "downwardAPI" in volume:
                sources = [{"downwardAPI": volume["downwardAPI"]}]
            else:
                continue
            directory = dirs[volume["name"]]
            directory.mkdir(parents=True, exist_ok=True)
            for source in sources:
                if "serviceAccountToken" in source:
                    token, lifetime = self.token(pod, source["serviceAccountToken"])
                    shortest = lifetime if shortest is None else min(shortest, lifetime)
                    _write(directory, source["serviceAccountToken"]["path"], token)
                elif not only_tokens:
                    for relative, data in self._source_files(pod, source, placement).items():
                        _write(directory, relative, data)
        return shortest


def service_account_dir(pod: Mapping[str, Any], dirs: Mapping[str, Path]) -> Path | None:
    """The local directory mounted at the service-account path, if the container mounts one."""
    for mount in pod["spec"]["containers"][0].get("volumeMounts") or []:
        if mount["mountPath"].rstrip("/") == SERVICE_ACCOUNT_DIR and mount["name"] in dirs:
            return dirs[mount["name"]]
    return None


def in_cluster_env(pod: Mapping[str, Any], account_dir: Path, root: Path, api_url: str) -> dict[str, str]:
    """KUBECONFIG (a kubeconfig with the projected token, CA and namespace) and
    KUBERNETES_SERVICE_HOST/PORT: how a process here finds the API server from inside the pod."""
    url = urllib.parse.urlsplit(api_url)
    token = (account_dir / "token").read_text().strip()
    kubeconfig = pod_dir(root, pod["metadata"]) / "kubeconfig"
    kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    # JSON is YAML: every value quoted right, whatever the paths hold. Written again with each
    # renewed token (a client that logs in again on a 401 reads the new one), whole each time.
    _replace(kubeconfig, json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "in-cluster",
        "clusters": [{"name": "in-cluster", "cluster": {"server": api_url,
                                                        "certificate-authority": str(account_dir / "ca.crt")}}],
        "users": [{"name": "service-account", "user": {"token": token}}],
        "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "service-account",
                                                        "namespace": pod["metadata"]["namespace"]}}]},
                                    indent=2).encode(), mode=0o600)
    return {"KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": url.hostname or "",
            "KUBERNETES_SERVICE_PORT": str(url.port or 443)}
