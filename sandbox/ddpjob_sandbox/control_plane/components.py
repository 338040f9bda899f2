"""The command lines of etcd, kube-apiserver, kube-controller-manager and kube-scheduler.

Pure: each function turns a :class:`Layout` (where the files are, which ports) into an argv,
so a test reads the flags without starting anything. Everything listens on 127.0.0.1 only.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddpjob_sandbox.control_plane.pki import CLUSTER_DNS

# Addresses the API server hands out to Services; nothing routes them (no kube-proxy here),
# they only have to be valid and not overlap the machine's own networks.
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

# The controllers the operator's behaviour depends on, by their names in kube-controller-manager
# --help: owner references (garbage collector), Deployments for the chart's operator,
# PodDisruptionBudgets, NotReady nodes tainted and their pods evicted, service-account tokens
# for the operator's pod (and the kube-root-ca.crt ConfigMap its projected token volume reads),
# PersistentVolumeClaims bound for the shared snapshot volume.
CONTROLLERS = (
    "garbage-collector-controller",
    "deployment-controller",
    "replicaset-controller",
    "disruption-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "persistentvolume-binder-controller",
    "namespace-controller",
    "endpointslice-controller",
)

# The admission plugins the API server of a kubeadm cluster runs, PodSecurity and
# ServiceAccount among them, so a pod the operator renders is judged as it would be there.
ADMISSION_PLUGINS = (
    "NamespaceLifecycle", "LimitRanger", "ServiceAccount", "NodeRestriction", "PodSecurity", "Priority",
    "DefaultTolerationSeconds", "DefaultStorageClass", "StorageObjectInUseProtection", "RuntimeClass",
    "MutatingAdmissionWebhook", "ValidatingAdmissionPolicy", "ValidatingAdmissionWebhook", "ResourceQuota",
)

# Every request at Metadata level: who did what to which object, without bodies, so a test can
# count the operator's requests without a log the size of the objects.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
"""


# What CoreDNS's ClusterRole (system:coredns) grants, bound to the imitated DNS's user
# (pki.CLUSTER_DNS): a kubelet may list only its own pods, so it cannot resolve names itself.
CLUSTER_DNS_ROLE = CLUSTER_DNS.user
CLUSTER_DNS_RBAC = (
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": CLUSTER_DNS_ROLE},
     "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch", "get"]},
               {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": CLUSTER_DNS_ROLE},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_DNS_ROLE},
     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": CLUSTER_DNS.user}]},
)


@dataclass(frozen=True)
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


# How long the node-lifecycle controller waits for a Node's Lease or status before it marks the
# Node Unknown and taints it unreachable: a kubelet's default, four of its 10 s heartbeats
# (control_plane.kubelets.HEARTBEAT_SECONDS), what `make cluster` runs with.
NODE_MONITOR_GRACE_SECONDS = 40


@dataclass(frozen=True)
class Layout:
    """Where one control plane keeps its state: binaries, certificates, data, logs; how soon
    a silent Node counts as lost (the test tier's kubelets beat faster, so it waits less); and
    any flags a test's own API server needs beside the standard ones."""

    root: Path
    bin_dir: Path
    ports: Ports
    node_monitor_grace_seconds: int = NODE_MONITOR_GRACE_SECONDS
    apiserver_flags: tuple[str, ...] = ()  # appended to kube-apiserver's (a test's own cluster)

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.etcd}"

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    def kubeconfig(self, stem: str) -> Path:
        """The kubeconfig of one client certificate; ``admin`` is the user's."""
        return self.root / "kubeconfig" if stem == "admin" else self.root / "kubeconfigs" / f"{stem}.kubeconfig"


def etcd_argv(layout: Layout) -> list[str]:
    peer = f"http://127.0.0.1:{layout.ports.etcd_peer}"
    return [
        str(layout.bin_dir / "etcd"), "--name=control-plane", f"--data-dir={layout.root / 'etcd'}",
        f"--listen-client-urls={layout.etcd_url}", f"--advertise-client-urls={layout.etcd_url}",
        f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=control-plane={peer}",
        # A throwaway cluster: losing the last writes at a power cut costs nothing, and
        # skipping fsync makes the API server's writes several times faster on a busy disk.
        "--unsafe-no-fsync", "--log-level=warn",
    ]


def apiserver_argv(layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        str(layout.bin_dir / "kube-apiserver"),
        f"--etcd-servers={layout.etcd_url}",
        "--bind-address=127.0.0.1", f"--secure-port={layout.ports.apiserver}", "--advertise-address=127.0.0.1",
        # The API server publishes its advertise address as the endpoint of the `kubernetes`
        # Service; an endpoint may not be a loopback address, so it publishes none.
        "--endpoint-reconciler-type=none",
        f"--cert-dir={layout.root / 'apiserver-certs'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        "--authorization-mode=Node,RBAC",
        f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--allow-privileged=true",
        f"--audit-policy-file={layout.root / 'audit-policy.yaml'}", f"--audit-log-path={layout.audit_log}",
        "--profiling=false",
        *layout.apiserver_flags,
    ]


def _served_component(layout: Layout, binary: str, stem: str, port: int) -> list[str]:
    """Flags the controller manager and the scheduler share: who they are, where they serve /healthz."""
    kubeconfig = layout.kubeconfig(stem)
    return [
        str(layout.bin_dir / binary), f"--kubeconfig={kubeconfig}",
        # Delegated authn/authz of their own /metrics; without these they warn and allow nothing.
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1", f"--secure-port={port}", f"--cert-dir={layout.root / (stem + '-certs')}",
        # One instance: no leader election, so it starts work at once instead of after a lease.
        "--leader-elect=false",
    ]


def controller_manager_argv(layout: Layout) -> list[str]:
    pki = layout.pki
    return _served_component(layout, "kube-controller-manager", "kube-controller-manager",
                             layout.ports.controller_manager) + [
        f"--controllers={','.join(CONTROLLERS)}",
        # Each controller acts as its own service account, as in a kubeadm cluster, so RBAC
        # denials show up the same way.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        f"--node-monitor-grace-period={layout.node_monitor_grace_seconds}s",
    ]


def scheduler_argv(layout: Layout) -> list[str]:
    return _served_component(layout, "kube-scheduler", "kube-scheduler", layout.ports.scheduler)


def kubeconfig_text(pki: Path, server: str, stem: str) -> str:
    """A kubeconfig for ``server`` that logs in with the client certificate ``pki/<stem>.crt``."""
    return f"""\
apiVersion: v1
kind: Config
current-context: ddpjob-sandbox
clusters:
- name: ddpjob-sandbox
  cluster:
    server: {server}
    certificate-authority: {pki / 'ca.crt'}
users:
- name: {stem}
  user:
    client-certificate: {pki / (stem + '.crt')}
    client-key: {pki / (stem + '.key')}
contexts:
- name: ddpjob-sandbox
  context:
    cluster: ddpjob-sandbox
    user: {stem}
    namespace: default
"""
