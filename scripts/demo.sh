#!/usr/bin/env bash
# The demo (`make demo`): the example DDPJob run on this machine by `ddpjob run`,
# two local torchrun nodes on a loopback c10d rendezvous. A few seconds into
# training node 1's whole process tree is SIGKILLed; the failure policy replaces
# it after its backoff, training resumes from the newest copy of the state (the
# fast snapshot tier's, in /dev/shm, after every step), the job finishes, and the
# summary proves from the metrics that no step ran twice in the effective history.
# The last line counts, from the same metrics, the steps trained twice at each
# resume: the work a kill cost (at most the step in flight).
#   KILL_AFTER=6 make demo          kill later (seconds after the first step)
#   scripts/demo.sh --port 0        extra arguments go to `ddpjob run`
set -euo pipefail
cd "$(dirname "$0")/.."
output=$(mktemp)
trap 'rm -f "$output"' EXIT
# tee: the run shows as it happens, and its summary names the metrics file read below.
.venv/bin/ddpjob run manifests/examples/ddpjob-c10d.yaml --kill-node-after "${KILL_AFTER:-4}" "$@" | tee "$output"
metrics=$(sed -n 's/^summary of \(.*\):$/\1/p' "$output" | tail -n 1)
[ -n "$metrics" ] || exit 0  # no summary (no metrics written): `ddpjob run` said why
.venv/bin/python - "$metrics" <<'EOF'
import sys

from ddpjob_trainer.report.metrics import redone_per_resume

resumes = redone_per_resume(sys.argv[1])
counts = [len(steps) for _, steps in resumes]
each = "; ".join(f"resumed at step {start.get('resume_step')}: {len(steps)}"
                 + (f" (step {', '.join(map(str, steps))})" if steps else "") for start, steps in resumes)
print(f"steps trained twice: {sum(counts)} over {len(resumes)} resume(s), at most {max(counts, default=0)} "
      f"at one resume" + (f" [{each}]" if resumes else ""))
EOF
