"""A cluster the tests did not start: whatever API server an admin kubeconfig reaches (a kind or
kubeadm cluster, a managed one), so the cluster tier (tests/cluster/, ``--kubeconfig PATH``) runs
there too.

:class:`ExternalCluster` offers what the tests use of :class:`~ddpjob_sandbox.control_plane.ControlPlane`
that a kubeconfig can give: ``url``, ``kubeconfig`` (for kubectl and helm), ``client(namespace)`` and
``login()`` (for the operator's own client).
What only the sandbox's own control plane has (its PKI, etcd, audit log, its processes: ``layout``)
raises :class:`SandboxOnlyError`, so a test that reaches for it fails naming it instead of passing
on a cluster it never looked at.

The kubeconfig's current context is read the way kubectl reads it (relative paths from the file's
folder; ``*-data`` fields base64), for the logins a platform team hands out: a client certificate,
a bearer token (``token``, ``tokenFile``) or an exec plugin (``aws eks get-token``,
``gke-gcloud-auth-plugin``, ``kubelogin``). Anything else is refused by field, value and rule.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import os
import shutil
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddpjob_sandbox.binaries import DEFAULT_BIN_DIR
from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane.login import ExecToken, Login, LoginError, StaticToken

# The fields of a kubeconfig's cluster and user this client honours; any other one would change
# how kubectl logs in (a proxy, impersonation, another auth scheme) and be ignored here without a word.
CLUSTER_FIELDS = frozenset({"server", "certificate-authority", "certificate-authority-data", "disable-compression",
                            "insecure-skip-tls-verify", "extensions"})
USER_FIELDS = frozenset({"client-certificate", "client-certificate-data", "client-key", "client-key-data",
                         "token", "tokenFile", "exec", "extensions"})


class SandboxOnlyError(RuntimeError):
    """A test asked an external cluster for what only the sandbox's own control plane has."""


def _named(config: dict, section: str, name: Any, kubeconfig: Path) -> dict:
    """The entry ``name`` of the kubeconfig's list ``section`` (contexts, clusters, users)."""
    for entry in config.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry.get(section[:-1]) or {}
    raise LoginError(f"{kubeconfig}: {section} has no entry named {name!r} (current-context "
                     f"{config.get('current-context')!r} leads to it)")


def _refuse_unknown(entry: dict, allowed: frozenset[str], where: str, show_value: bool) -> None:
    """A field this client does not honour, named (with its value where it cannot be a secret)."""
    unknown = sorted(set(entry) - allowed)
    if unknown:
        value = f" ({entry[unknown[0]]!r})" if show_value else ""
        raise LoginError(f"{where}.{unknown[0]}{value} is not supported by the test client: it honours only "
                         f"{', '.join(sorted(allowed))}")


class _Files:
    """Where the ``*-data`` fields are written (ssl reads certificates from files only), and
    where the kubeconfig's relative paths start."""

    def __init__(self, kubeconfig: Path, private: Path):
        self.base, self.private = kubeconfig.parent, private

    def pick(self, entry: dict, key: str, where: str) -> Path | None:
        """The file ``entry[key]`` names, or ``entry[key-data]`` decoded into a private file."""
        if entry.get(f"{key}-data"):
            try:
                data = base64.b64decode(entry[f"{key}-data"], validate=True)
            except (binascii.Error, TypeError):
                raise LoginError(f"{where}.{key}-data must be base64 (kubectl config set --set-raw-bytes "
                                 f"writes it so)") from None
            path = self.private / key
            path.write_bytes(data)
            path.chmod(0o600)
            return path
        if entry.get(key):
            path = self.base / os.path.expanduser(entry[key])
            if not path.is_file():
                raise LoginError(f"{where}.{key} ({entry[key]!r}) names no file (looked at {path})")
            return path
        return None


def read_login(kubeconfig: Path, private: Path) -> Login:
    """The login of ``kubeconfig``'s current context; ``*-data`` fields are written under ``private``.

    Raises:
        LoginError: the file is missing or not a kubeconfig, names what it lacks, or asks
            for a login this client does not do (naming the field and its value).
    """
    try:
        config = yaml.safe_load(kubeconfig.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise LoginError(f"{kubeconfig}: not a readable kubeconfig: {e}") from None
    if not isinstance(config, dict) or not config.get("current-context"):
        raise LoginError(f"{kubeconfig}: current-context must name the cluster to test (kubectl config "
                         f"use-context NAME --kubeconfig {kubeconfig})")
    context = _named(config, "contexts", config["current-context"], kubeconfig)
    cluster = _named(config, "clusters", context.get("cluster"), kubeconfig)
    user = _named(config, "users", context.get("user"), kubeconfig)
    cluster_at, user_at = f"clusters[{context.get('cluster')}].cluster", f"users[{context.get('user')}].user"
    _refuse_unknown(cluster, CLUSTER_FIELDS, cluster_at, show_value=True)
    _refuse_unknown(user, USER_FIELDS, user_at, show_value=False)
    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise LoginError(f"{cluster_at}.server ({server!r}) must be an http(s) URL")
    files = _Files(kubeconfig, private)
    bearer = (ExecToken(f"{user_at}.exec", user["exec"]) if user.get("exec")
              else StaticToken(value=user["token"]) if user.get("token")
              else StaticToken(path=files.pick(user, "tokenFile", user_at)) if user.get("tokenFile") else None)
    certificate, key = files.pick(user, "client-certificate", user_at), files.pick(user, "client-key", user_at)
    if bool(certificate) != bool(key):
        raise LoginError(f"{user_at}: client-certificate and client-key come together; only "
                         f"{'client-certificate' if certificate else 'client-key'} is set")
    return Login(server.rstrip("/"), files.pick(cluster, "certificate-authority", cluster_at),
                 bool(cluster.get("insecure-skip-tls-verify")), certificate, key, bearer)


@dataclass(frozen=True)
class ExternalCluster:
    """A running cluster reached through an admin kubeconfig; the tests neither start nor stop it."""

    kubeconfig: Path
    access: Login

    @property
    def url(self) -> str:
        return self.access.server

    def login(self) -> Login:
        """How the kubeconfig logs in (what kopf's ConnectionInfo takes), as ControlPlane.login."""
        return self.access

    def client(self, namespace: str = "default") -> KubeClient:
        """A KubeClient logged in as the kubeconfig's user; kubectl runs with the same kubeconfig."""
        pinned = DEFAULT_BIN_DIR / "kubectl"
        return KubeClient(self.url, self.kubeconfig, namespace, ssl_context=self.access.ssl_context(),
                          kubectl=str(pinned) if os.access(pinned, os.X_OK) else "kubectl", bearer=self.access.token)

    @property
    def layout(self):
        raise SandboxOnlyError(f"{self.url} is a cluster the tests did not start: it has no layout (PKI, etcd, "
                               f"audit log, processes); mark the test sandbox_only (tests/cluster/sandbox_only.py)")


def require_admin(cluster: ExternalCluster) -> None:
    """Fails unless the kubeconfig's user may do everything, as the tests do (namespaces, CRDs, Nodes,
    RBAC objects of their own).

    Raises:
        LoginError: the server cannot be reached, or answers that the user is not an admin.
    """
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"verb": "*", "group": "*", "resource": "*"}}}
    try:
        answer = cluster.client().request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    except (ApiError, OSError, ssl.SSLError) as e:
        raise LoginError(f"{cluster.kubeconfig}: {cluster.url} did not answer an access review: {e}") from None
    status = answer.get("status") or {}
    if not status.get("allowed"):
        raise LoginError(
            f"{cluster.kubeconfig}: its user may not do verb * on every resource of {cluster.url} "
            f"({status.get('reason') or status.get('evaluationError') or 'denied'}); the cluster tests create "
            f"namespaces, CRDs and Nodes: use a cluster-admin login")


@contextlib.contextmanager
def external_cluster(kubeconfig: Path) -> Iterator[ExternalCluster]:
    """The cluster of ``kubeconfig``'s current context; the decoded certificates it embeds live in a
    private folder until the block ends.

    Raises:
        LoginError: as :func:`read_login`.
    """
    private = Path(tempfile.mkdtemp(prefix="ddpjob-external-"))  # mode 0700: key material
    try:
        yield ExternalCluster(kubeconfig.resolve(), read_login(kubeconfig.resolve(), private))
    finally:
        shutil.rmtree(private, ignore_errors=True)
