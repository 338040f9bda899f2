"""The shipped example DDPJobs (manifests/examples/), loaded as a user would apply them, and
at test speed; ``kubectl apply`` of a body, or a body written as a manifest file.

:func:`example_job` names every test-speed override it makes, so a test that uses one says
so; ``ddpjob run`` tests load the example unchanged (:func:`load_example`), as ``ddpjob run``
shortens the timeouts itself.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ddpjob_sandbox.client import KubeClient

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "manifests" / "examples"
C10D_EXAMPLE = EXAMPLES / "ddpjob-c10d.yaml"  # the default example (`make demo` runs it)

# torchrun rendezvous timeouts that make an elastic event cost ~7-15 s instead of ~45 s (the
# example's 30 s last call is paid by every restart); joinSeconds bounds a hang.
FAST_RDZV_TIMEOUTS = {"joinSeconds": 60, "lastCallSeconds": 3, "keepAliveIntervalSeconds": 2,
                      "keepAliveMaxAttempts": 3}



def load_example(file: str = "ddpjob-c10d.yaml") -> dict:
    """An example manifest as shipped (a fresh dict each call)."""
    return yaml.safe_load((EXAMPLES / file).read_text())


def example_job(file: str = "ddpjob-c10d.yaml", *, args: list[str], rdzv_port: int | None = None,
                backoff_seconds: int = 1) -> dict:
    """An example manifest with test-speed overrides, each of which a test must say it uses:

    ``args`` replace the trainer's (fewer samples, --step-sleep, --snapshot-every-steps), a free
    rendezvous port (tests run side by side on one loopback), FAST_RDZV_TIMEOUTS, and a
    ``backoff_seconds`` as the delay of a crash loop's replacements (the example's is 10 s; a
    first incident is replaced at once either way).
    """
    body = load_example(file)
    spec = body["spec"]
    spec["args"] = list(args)
    elastic = spec["elasticPolicy"]
    elastic["rdzvTimeouts"] = dict(FAST_RDZV_TIMEOUTS)
    if rdzv_port is not None:
        elastic["rdzvPort"] = rdzv_port
    spec["failurePolicy"].update(backoffSeconds=backoff_seconds, maxBackoffSeconds=max(2, backoff_seconds))
    return body


def trainer_args(*, epochs: int, samples: int, step_sleep: float, snapshot_every_steps: int,
                 batch_size: int = 32, extra: tuple[str, ...] = ()) -> list[str]:
    """The example trainer's arguments for a short job (no validation, no progress bar)."""
    return ["--epochs", str(epochs), "--samples", str(samples), "--batch-size", str(batch_size),
            "--snapshot-every-epochs", "1", "--snapshot-every-steps", str(snapshot_every_steps),
            "--step-sleep", str(step_sleep), "--val-samples", "0", "--no-progress-bar", *extra]


def write_manifest(body: Mapping[str, Any], path: Path) -> Path:
    """``body`` as a YAML file at ``path``, as a user keeps a manifest (for kubectl or ``ddpjob run``)."""
    path = Path(path)
    path.write_text(yaml.safe_dump(dict(body), sort_keys=False))
    return path


def kubectl_apply(k8s: KubeClient, body: Mapping[str, Any], workdir: Path) -> Path:
    """``kubectl apply -f`` of ``body`` written to a file, as a user applies a manifest."""
    path = write_manifest(body, Path(workdir) / f"{body['metadata']['name']}.yaml")
    k8s.kubectl("apply", "--validate=false", "-f", str(path))
    return path
