"""A one-machine "node" for end-to-end runs: a kubelet stand-in that runs pods as local processes.

Neither the API emulator nor a real control plane without kubelets runs pods.
:class:`NodeAgent` plays the kubelet: on the emulator of a single node serving one namespace,
on a real API server of one registered Node (``node_name``; control_plane.kubelets runs one
per Node). For each new pod it starts its container's command as a local process with the
pod's environment, then reports back through the API what a kubelet reports (phase, podIP, the
container's running/terminated state with the exit code and termination message). With it the
real operator, real torchrun and the real trainer run a DDPJob end to end on loopback.

    agent       NodeAgent, the loop that ties them, and the fault tools tests use
    reporting   the API side: which pods are the node's and how their deletion ends (finalizer
                on the emulator, grace-0 delete on a real API server), Node objects, status
                writes that keep others' conditions
    projection  service-account tokens (TokenRequest), ConfigMaps, Secrets, downward API into
                a pod's volumes, and the in-cluster kubeconfig of a pod that mounts its token
    container   one pod's process tree: started as a session, stopped whole, exit code, message
    launch      a pod -> argv, env, working directory on this machine (volumes, DNS, image; pure)
    network     the imitated pod network: a loopback address per pod, cluster DNS names (pure)

On loopback every c10d agent would find its own address in the endpoint; the rendered
``is_host`` in PET_RDZV_CONF (launch.hosts_c10d_store) says who hosts the store: nobody with
the store pod (the default), node 0 with ``rdzvStore: node``. :meth:`NodeAgent.pod_listening_on`
tells which pod really listens.

Opt-in, for capacity and node faults: :meth:`NodeAgent.hold_unscheduled` keeps a pod Pending
with the scheduler's PodScheduled False / Unschedulable until :meth:`NodeAgent.release`;
``bind_nodes=True`` gives each pod a Node of its own and :meth:`NodeAgent.node_down` kills that
machine (Node NotReady, processes gone, the kubelet silent). Conditions others set on a pod
(DisruptionTarget) survive the agent's status writes, as they do a kubelet's.

A container that exits is started again where the pod's restartPolicy says so (Always, or
OnFailure after a failure), with a kubelet's crash-loop back-off, restartCount and lastState
(agent.Restarts); projected service-account tokens are renewed before they expire. One
container, literal env values and claim/emptyDir/projected volumes are supported; anything else
leaves the pod Pending with a ``CreateContainerConfigError`` waiting reason naming what is
unsupported. Probes are not run (a pod is ready once its process started).
"""
from ddpjob_sandbox.node.agent import NodeAgent, running_node_agent

__all__ = ["NodeAgent", "running_node_agent"]
