"""The optional pre-flight check (pure): an init container that fails fast on a bad node.

With ``spec.preflight.enabled`` every node pod first runs the container ``preflight`` (the
trainer image, ``python -c`` with the script below: torch-free, so it takes well under a
second). It checks what a node can break before the pod joins the rendezvous:

  * the snapshot volume is writable (a file is written, fsynced and removed);
  * the GPUs the pod asked for (``resources.limits["nvidia.com/gpu"]``) are visible: the
    NVIDIA device plugin exposes exactly the allocated devices as ``/dev/nvidiaN``.

A failure exits non-zero with one line saying what failed (the kubelet keeps the log tail as
the termination message), so the pod fails before torchrun starts and before any other node
waits in the rendezvous for it. The operator reads the init container's state
(decide/observed.py), reports the cause ``PreflightFailed`` and, when the node failed alone,
keeps the job off that node (decide/avoided_nodes.py).
"""

from __future__ import annotations

from typing import Any

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.quantity import parse_quantity
from ddpjob_operator.api.spec import GPU_RESOURCE, DDPJobSpec

# argv: [snapshot dir or "", expected GPUs]. Exit code C.PREFLIGHT_EXIT_CODE, one line to stderr.
SCRIPT = f"""
import os, re, sys
snapshots, gpus, problems = sys.argv[1], int(sys.argv[2]), []
if snapshots:
    probe = os.path.join(snapshots, ".preflight-" + os.uname().nodename)
    try:
        with open(probe, "w") as f:
            f.write("ok"); f.flush(); os.fsync(f.fileno())
        os.remove(probe)
    except OSError as e:
        problems.append(f"snapshot volume {{snapshots}} is not writable ({{e}})")
seen = len([d for d in os.listdir("/dev") if re.fullmatch(r"nvidia[0-9]+", d)])
if seen < gpus:
    problems.append(f"{{seen}} GPU(s) visible as /dev/nvidiaN, {{gpus}} expected (resources.limits nvidia.com/gpu)")
if problems:
    print("preflight failed: " + "; ".join(problems), file=sys.stderr)
    sys.exit({C.PREFLIGHT_EXIT_CODE})
""".strip()


def expected_gpus(spec: DDPJobSpec) -> int:
    """GPUs the pod asked for (0 without an nvidia.com/gpu limit)."""
    return int(parse_quantity(spec.resources.limits.get(GPU_RESOURCE, 0)))


def preflight_container(spec: DDPJobSpec, mounts: list[dict[str, Any]], security: dict[str, Any]) -> dict[str, Any]:
    """The init container; `mounts` and `security` are the trainer container's, so it sees what the trainer will."""
    snapshots = spec.snapshot.mount_path if spec.snapshot else ""
    container: dict[str, Any] = {
        "name": C.PREFLIGHT_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-c", SCRIPT, snapshots, str(expected_gpus(spec))],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
        "securityContext": security,
    }
    # The same resources: the device plugin allocates GPUs to an init container only when it
    # asks for them (and the app container reuses them), and the pod's request is unchanged.
    resources = {k: dict(v) for k, v in (("limits", spec.resources.limits),
                                         ("requests", spec.resources.requests)) if v}
    if resources:
        container["resources"] = resources
    return container
