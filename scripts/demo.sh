#!/usr/bin/env bash
# The demo (`make demo`): the example DDPJob run on this machine by `ddpjob run`,
# two local torchrun nodes on a loopback c10d rendezvous. A few seconds into
# training node 1's whole process tree is SIGKILLed; the failure policy replaces
# it after its backoff, training resumes from the last snapshot, the job
# finishes, and the summary proves from the metrics that no step ran twice.
#   KILL_AFTER=6 make demo          kill later (seconds after the first step)
#   scripts/demo.sh --port 0        extra arguments go to `ddpjob run`
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/ddpjob run manifests/examples/ddpjob-c10d.yaml --kill-node-after "${KILL_AFTER:-4}" "$@"
