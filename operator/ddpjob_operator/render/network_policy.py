"""The job's NetworkPolicy (pure): only the job's node pods reach its pods; the operator reaches the progress port.

Why: torch's rendezvous state is a pickle every agent loads, so whoever can write the
rendezvous store runs code in the job. The c10d TCPStore (in the store pod, or in node 0's
agent) has no authentication and listens on every interface; a managed etcd has no auth
either. The policy ``<job>`` (spec.networkPolicy.enabled, on by default) is owned by the
job, so garbage collection deletes it with the job. It selects every pod of the job (node
pods, the c10d store pod and the managed etcd pod all carry app.kubernetes.io/name,
instance and managed-by) and admits:

  * from the job's node pods: every port. DDP needs that: torchrun's agents pick the
    workers' MASTER_PORT at random, and NCCL and gloo pick their ports at random too, so
    no list of ports would do;
  * from the operator's pods (:class:`OperatorPeer`, from --operator-pod-selector and
    --operator-namespace): the trainer's progress port only (live progress).

Nothing else gets in; connections from the pod's own node (kubelet probes) are always
allowed by NetworkPolicy's rules. Egress is left open: trainers read data and write logs
to places the operator cannot know (object stores, experiment trackers, an external etcd,
DNS), and a wrong guess would break training where a missing rule only widens reach.
The policy works only where the network plugin enforces NetworkPolicy (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.names import network_policy_name
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.render.common import common_labels, companion_metadata, selector_labels

# Set by the API server on every namespace (Kubernetes >= 1.21): selects a namespace by name.
LABEL_NAMESPACE_NAME = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class OperatorPeer:
    """Where the operator's pods run, as a NetworkPolicy peer.

    Attributes:
        pod_labels: labels every operator pod carries, as (key, value) pairs.
        namespace: the operator's namespace; "" when unknown (then a pod with these labels
            in any namespace matches).
    """

    pod_labels: tuple[tuple[str, str], ...] = ((C.LABEL_APP_NAME, C.OPERATOR_APP_NAME),)
    namespace: str = ""

    def peer(self) -> dict[str, Any]:
        """The `from` entry: a namespaceSelector (an empty one matches every namespace) and a podSelector."""
        namespaces = {"matchLabels": {LABEL_NAMESPACE_NAME: self.namespace}} if self.namespace else {}
        return {"namespaceSelector": namespaces, "podSelector": {"matchLabels": dict(self.pod_labels)}}


def requested(body: Mapping[str, Any]) -> bool:
    """The body asks for a NetworkPolicy (read before validation, to decide what to observe)."""
    return ((body.get("spec") or {}).get("networkPolicy") or {}).get("enabled", True) is not False


def job_pods_selector(job: str) -> dict[str, Any]:
    """Every pod the operator runs for the job: node pods, the c10d store pod and the managed etcd pod
    (which lacks the job-name label); managed-by keeps out pods of a Helm release of the same name."""
    return {"matchLabels": {C.LABEL_APP_NAME: C.APP_NAME, C.LABEL_INSTANCE: job, C.LABEL_MANAGED_BY: C.MANAGED_BY}}


def render_network_policy(ref: JobRef, operator: OperatorPeer) -> dict[str, Any]:
    """The job's NetworkPolicy; see the module docstring for what it admits and why."""
    return {
        "apiVersion": C.NETWORKING_API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": companion_metadata(ref, network_policy_name(ref.name), common_labels(ref.name)),
        "spec": {
            "podSelector": job_pods_selector(ref.name),
            "policyTypes": ["Ingress"],  # egress stays open (see the module docstring)
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": selector_labels(ref.name)}}]},
                {"from": [operator.peer()], "ports": [{"protocol": "TCP", "port": C.PROGRESS_PORT}]},
            ],
        },
    }
