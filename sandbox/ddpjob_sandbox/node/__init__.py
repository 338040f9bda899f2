"""A one-machine "node" for end-to-end runs: a kubelet stand-in that runs pods as local processes.

A control plane without kubelets runs no pods. :class:`NodeAgent` plays the kubelet of one
registered Node (``node_name``; control_plane.kubelets runs one per Node). For each pod bound to
it, it starts its container's command as a local process with the pod's environment, then
reports back through the API what a kubelet reports (phase, podIP, the container's
running/terminated state with the exit code and termination message). With it the
real operator, real torchrun and the real trainer run a DDPJob end to end on loopback.

    agent       NodeAgent, the loop that ties them, and the fault tools tests use
    reporting   the API side: the Node's pods, how their deletion ends (a grace-0 delete once
                stopped), status writes that keep others' conditions
    projection  service-account tokens (TokenRequest), ConfigMaps, Secrets, downward API into
                a pod's volumes, and the in-cluster kubeconfig of a pod that mounts its token
    container   one pod's process tree: started as a session, stopped whole, exit code, message
    launch      a pod -> argv, env, working directory on this machine (volumes, DNS, image; pure)
    network     the imitated pod network: a loopback address per pod, cluster DNS names (pure)

On loopback every c10d agent would find its own address in the endpoint; the rendered
``is_host`` in PET_RDZV_CONF (launch.hosts_c10d_store) says who hosts the store: nobody with
the store pod (the default), node 0 with ``rdzvStore: node``. :meth:`NodeAgent.pod_listening_on`
tells which pod really listens.

Capacity and node faults are the real control plane's: the scheduler keeps a pod that fits no
Node Pending, and the node controller marks a Node lost (Ready Unknown) once its kubelet stopped
(control_plane.kubelets.Kubelet.stop).
Conditions others set on a pod (DisruptionTarget) survive the agent's status writes, as they do
a kubelet's.

A container that exits is started again where the pod's restartPolicy says so (Always, or
OnFailure after a failure), with a kubelet's crash-loop back-off, restartCount and lastState
(agent.Restarts); projected service-account tokens are renewed before they expire. One
container, literal env values and claim/emptyDir/projected volumes are supported; anything else
leaves the pod Pending with a ``CreateContainerConfigError`` waiting reason naming what is
unsupported. Probes are not run (a pod is ready once its process started).
"""
from ddpjob_sandbox.node.agent import NodeAgent

__all__ = ["NodeAgent"]
