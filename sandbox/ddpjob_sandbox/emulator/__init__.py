"""A Kubernetes API server for tests and benchmarks: kmock's ``KubernetesEmulator`` plus the API conventions
that kopf, kubectl and the ddpjob operator rely on.

The stock emulator (kmock 0.8) stores objects and streams watch events, but treats every
write as a plain dict merge. This subclass keeps its storage (``emulator.objects`` with full
history, one ``aiobus.Bus`` per resource for watch fan-out, discovery, error rendering) and
replaces only how writes and reads are interpreted, following the API conventions
(https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md):

* server-filled metadata on create: ``uid``, ``resourceVersion`` (one monotonic counter for
  the whole server, like etcd's revision), ``creationTimestamp``, ``generation``, ``generateName``;
* ``409 AlreadyExists`` on a duplicate create, ``409 Conflict`` when a write carries a stale
  ``metadata.resourceVersion`` (optimistic concurrency), ``422`` when a JSON-patch ``test`` fails;
* ``generation`` bumps when anything outside ``metadata`` and ``status`` changes;
* merge-patch, strategic-merge-patch (treated as merge-patch) and JSON-patch; PUT (replace);
* the ``status`` subresource (main-resource writes keep ``status``, status writes keep the rest)
  and the ``scale`` subresource (``autoscaling/v1`` Scale mapped onto the paths in the CRD);
* ``deletionTimestamp`` + finalizers: DELETE of an object with finalizers only marks it, and it
  disappears when the last finalizer is removed;
* background cascade deletion through ``ownerReferences`` (the garbage collector);
* label selectors (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``, ``a notin (x,y)``)
  and equality field selectors on any dotted path (``metadata.name``, ``involvedObject.uid``...)
  on list and watch;
* watch resumption from a ``resourceVersion`` (events replayed from a bounded log, 410 Gone
  when it is older than the log) and ``timeoutSeconds``;
* ``/api/v1/namespaces`` (which kmock's URL parser cannot read) with namespaces created
  implicitly on first use, as if an admin had created them;
* built-in resource discovery (kmock's bundled list) so kubectl and kopf find pods, services,
  events (core/v1 and events.k8s.io/v1), namespaces and CRDs;
* creates refused on a test's request (``refuse_creates``), as an admission plugin refuses them
  (a ResourceQuota answers 403 Forbidden "exceeded quota: ..."), with every create counted
  (``create_attempts``) so a test can tell how often a client retried.

Not emulated: admission plugins (but see ``refuse_creates``), schema validation, defaulting, the kubelet (pods never run here: the
node agent in ddpjob_sandbox.node runs them, or a test reports their status through
ddpjob_sandbox.scripted), server-side apply, field managers, ``deletecollection``, chunked
lists. Pod grace periods are opt-in (``graceful_pod_deletion``); otherwise a pod without
finalizers disappears at once.

    common     API errors, timestamps, well-known resources, dotted paths
    patches    merge patch and JSON patch
    selectors  label and field selectors
    writes     create, update, patch, scale, delete, garbage collection (a mixin)
    reads      list, get, watch with resumption (a mixin)
    server     KubeEmulator: state, CRD registration, request routing, discovery
"""
from ddpjob_sandbox.emulator.common import Refusal, quota_refusal
from ddpjob_sandbox.emulator.server import KubeEmulator

__all__ = ["KubeEmulator", "Refusal", "quota_refusal"]
