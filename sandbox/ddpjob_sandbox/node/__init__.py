"""A one-machine "node" for end-to-end runs: a kubelet stand-in that runs the emulator's pods
as local processes.

The API emulator stores pods but runs none. :class:`NodeAgent` plays the kubelet of a single
node: it polls the pods of one namespace and, for each new pod, starts its container's
command as a local process with the pod's environment, then reports back through the API
what a kubelet reports (phase, podIP, the container's running/terminated state with the exit
code and termination message). With it the real operator, real torchrun and the real trainer
run a DDPJob end to end on loopback.

    launch     a pod -> argv, env, working directory on this machine (volumes, DNS, image; pure)
    container  one pod's process tree: started as a session, stopped whole, exit code, message
    reporting  the API side: finalizer, Node objects, status writes that keep others' conditions
    agent      NodeAgent, the loop that ties them, and the fault tools tests use

On loopback every c10d agent would find its own address in the endpoint; the rendered
``is_host`` in PET_RDZV_CONF (launch.hosts_c10d_store) says who hosts the store: nobody with
the store pod (the default), node 0 with ``rdzvStore: node``. :meth:`NodeAgent.pod_listening_on`
tells which pod really listens.

Opt-in, for capacity and node faults: :meth:`NodeAgent.hold_unscheduled` keeps a pod Pending
with the scheduler's PodScheduled False / Unschedulable until :meth:`NodeAgent.release`;
``bind_nodes=True`` gives each pod a Node of its own and :meth:`NodeAgent.node_down` kills that
machine (Node NotReady, processes gone, the kubelet silent). Conditions others set on a pod
(DisruptionTarget) survive the agent's status writes, as they do a kubelet's.

Only ``restartPolicy: Never`` (what the operator renders), one container, literal env values
and claim/emptyDir volumes are supported; anything else leaves the pod Pending with a
``CreateContainerConfigError`` waiting reason naming what is unsupported.
"""
from ddpjob_sandbox.node.agent import NodeAgent, running_node_agent

__all__ = ["NodeAgent", "running_node_agent"]
