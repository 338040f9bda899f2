"""The imitated pod network (pure): a loopback address per pod, and cluster DNS names resolved to it.

There is no CNI, kube-proxy or cluster DNS here, only this machine's loopback. Linux routes the
whole 127.0.0.0/8 to ``lo``, so each pod gets an address of its own there and its listeners bind
only that one (two node pods both serve the progress port 29410 without colliding).

* :func:`pod_ip` is a pure function of the pod's namespace and name, so a name resolves before
  the pod it names has started (a c10d endpoint names node 0, which may start last), and a
  replacement pod of the same name keeps the address, as a StatefulSet's DNS name would.
  127.0.*.* is never handed out: the control plane listens on 127.0.0.1.
* :class:`Resolver` answers what cluster DNS would: ``<hostname>.<subdomain>[.<ns>[.svc[.cluster
  .local]]]`` is the pod with that hostname and subdomain (or, before it exists, the pod named
  ``<hostname>``: the operator names pods after their hostnames); ``<service>.<ns>.svc[.cluster
  .local]`` is one pod the Service selects (the first by name that is not finished or deleted),
  the loopback address when it selects none. There is no load balancing and no port mapping: a
  Service's port must equal its targetPort.
* :data:`LOOPBACK_RESOLVER` is no network at all: every name is 127.0.0.1 (launch.Placement's
  default, for a launch outside a node).
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ddpjob_sandbox.pod_status import LOOPBACK
from ddpjob_trainer.listen import LISTEN_HOST_ENV

CLUSTER_DOMAIN = "cluster.local"
TERMINAL_PHASES = ("Succeeded", "Failed")

Resolve = Callable[[str], str]


def LOOPBACK_RESOLVER(_name: str) -> str:  # noqa: N802 - a constant that happens to be callable
    """Every cluster name is this machine (no pod network: all processes share 127.0.0.1)."""
    return LOOPBACK


def pod_ip(namespace: str, name: str) -> str:
    """The pod's loopback address: 127.a.b.c with a and c in 1..254, from a hash of namespace/name.

    Two pods collide with probability about n^2 / 2^25 for n pods alive at once (1e-4 for 80);
    the kubelet refuses to start a pod whose address another of its running pods holds.
    """
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
    return f"127.{1 + digest[0] % 254}.{digest[1]}.{1 + digest[2] % 254}"


def network_env(address: str) -> dict[str, str]:
    """The stand-in for a pod's network namespace, in the environment its processes start with.

    In a pod, a listener on every interface is reachable at the pod's address only, and the
    pod's own hostname resolves to that address. Here every process shares the machine's
    interfaces and name, so: ddpjob's listeners bind the pod's address only (DDPJOB_LISTEN_HOST,
    ddpjob_trainer/listen.py), and torchrun, which would otherwise publish the machine's name
    (socket.getfqdn()) as the address its peers reach it at, publishes the pod's (PET_LOCAL_ADDR,
    its --local-addr). The pod's own env, set after, wins.
    """
    return {LISTEN_HOST_ENV: address, "PET_LOCAL_ADDR": address}


def selects(selector: Mapping[str, str] | None, labels: Mapping[str, str] | None) -> bool:
    """Whether a Service's equality selector matches ``labels`` (an empty selector matches nothing,
    as a Service without selector has no endpoints the cluster makes)."""
    return bool(selector) and all((labels or {}).get(k) == v for k, v in selector.items())


def _alive(pod: Mapping[str, Any]) -> bool:
    return (not pod["metadata"].get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES)


class Resolver:
    """Cluster DNS for the pods of ``namespace``, from a snapshot of its Services and pods."""

    def __init__(self, namespace: str, services: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]):
        self.namespace = namespace
        self.services = {s["metadata"]["name"]: s for s in services}
        self.pods = sorted(pods, key=lambda p: p["metadata"]["name"])

    @property
    def service_names(self) -> list[str]:
        return sorted(self.services)

    def __call__(self, name: str) -> str:
        labels = name.split(".")
        if labels[-2:] == CLUSTER_DOMAIN.split("."):
            labels = labels[:-2]
        if labels[-1:] == ["svc"]:
            labels = labels[:-1]
            if len(labels) == 2:
                return self.service_ip(labels[1], labels[0])
            if len(labels) == 3:
                return self.hostname_ip(labels[2], labels[0], labels[1])
            return LOOPBACK
        if len(labels) in (2, 3):  # <host>.<subdomain>[.<ns>], the search path of the pod's namespace
            return self.hostname_ip(labels[2] if len(labels) == 3 else self.namespace, labels[0], labels[1])
        return LOOPBACK

    def service_ip(self, namespace: str, service: str) -> str:
        if namespace != self.namespace or service not in self.services:
            return LOOPBACK  # another namespace's names are not looked up: the job's own only
        selector = (self.services[service].get("spec") or {}).get("selector")
        chosen = next((p for p in self.pods if _alive(p) and selects(selector, p["metadata"].get("labels"))), None)
        return pod_ip(namespace, chosen["metadata"]["name"]) if chosen else LOOPBACK

    def hostname_ip(self, namespace: str, hostname: str, subdomain: str) -> str:
        if namespace != self.namespace:
            return pod_ip(namespace, hostname)
        named = next((p for p in self.pods if (p["spec"].get("hostname"), p["spec"].get("subdomain"))
                      == (hostname, subdomain) and _alive(p)), None)
        return pod_ip(namespace, named["metadata"]["name"] if named else hostname)
