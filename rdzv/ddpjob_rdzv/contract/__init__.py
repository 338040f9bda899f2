"""The contract between the operator and the trainer: what one side renders or writes and the other reads.

Both sides import it, so a name or a rule cannot drift apart: the operator renders these
environment variables into every node pod (render/launch.py, ``ddpjob run``'s local plan) and the
trainer reads them; the trainer writes the progress record (:mod:`.progress_record`) and the
operator parses it. Plain Python, torch-free, like the whole distribution.

Environment variables, each rendered by the operator and read by the trainer:
"""
from __future__ import annotations

import os
from collections.abc import Mapping

SNAPSHOT_DIR_ENV = "DDPJOB_SNAPSHOT_DIR"  # the snapshot volume's mount: where the trainer reads and writes snapshots
METRICS_FILE_ENV = "DDPJOB_METRICS_FILE"  # ddpjob run: where rank 0 writes metrics (default <snapshot dir>/metrics.jsonl)
JOB_NAME_ENV = "DDPJOB_JOB_NAME"  # metadata.name of the job, for logs and metrics
NODE_INDEX_ENV = "DDPJOB_NODE_INDEX"  # this pod's (or local agent's) node index: the record's ``node``
NAMESPACE_ENV = "DDPJOB_NAMESPACE"  # the job's namespace ("" for local runs): the rendezvous keys' prefix
JOB_UID_ENV = "DDPJOB_JOB_UID"  # metadata.uid of the job (a local run's rendezvous id): the record's ``jobUID``
POD_NAME_ENV = "DDPJOB_POD_NAME"  # the node pod's name (pods only): the record's ``pod``
# Where ddpjob's own listeners bind (:func:`listen_host`; the trainer's, ddpjob_trainer/listen.py, and
# the operator's /healthz and /metrics): unset in pods (every interface, reached at the pod IP);
# ddpjob run sets loopback; the sandbox's kubelets set each pod's own loopback address.
LISTEN_HOST_ENV = "DDPJOB_LISTEN_HOST"
ZYGOTE_SOCKET_ENV = "DDPJOB_ZYGOTE_SOCKET"  # fastRestart: the socket file of the node's worker fork server
# "1" on a warm spare node (elasticPolicy.spareReplicas): its agent joins the rendezvous only once a
# group trains, so it waits outside the group and never takes a place in the first round
# (ddpjob_trainer/rendezvous/early.py; the ddpjob-c10d and etcd-v3 backends)
SPARE_ENV = "DDPJOB_SPARE"
# fastRestart: the secret each node's agent makes and hands its workers (never rendered: a pod's
# spec is readable; ddpjob run's local plan sets it per agent)
ZYGOTE_TOKEN_ENV = "DDPJOB_ZYGOTE_TOKEN"
# spec.snapshot.onUnreadable: what the trainer does when no snapshot can be read (Fail, StartOver)
SNAPSHOT_ON_UNREADABLE_ENV = "DDPJOB_SNAPSHOT_ON_UNREADABLE"
TERMINATION_LOG_ENV = "DDPJOB_TERMINATION_LOG"  # where the trainer writes its progress record (the pod's terminationMessagePath)
PROGRESS_PORT_ENV = "DDPJOB_PROGRESS_PORT"  # the trainer serves its progress record here (GET /progress)
COLLECTIVE_TIMEOUT_ENV = "DDPJOB_COLLECTIVE_TIMEOUT_SECONDS"  # the process group's timeout (spec.failurePolicy)

# A key of --rdzv_conf (PET_RDZV_CONF) that the operator renders from
# spec.elasticPolicy.replacementWaitSeconds and ddpjob's rendezvous reads (the ddpjob-c10d and
# etcd-v3 backends, ddpjob_trainer/rendezvous/early.py; torch's own handlers ignore it): after
# this node's agent noticed a peer lost, its next round waits up to this many seconds for the
# size of the round before the loss, so the replacement joins in the survivors' one pause instead
# of a second restart after a stretch at reduced size. 0 (or absent): complete at once, smaller.
REPLACEMENT_WAIT_CONF = "replacement_wait"
MAX_REPLACEMENT_WAIT_SECONDS = 300  # the field's upper bound: longer, a replacement is not "coming"


def listen_host(environ: Mapping[str, str] = os.environ) -> str:
    """The address ddpjob's listeners bind: $DDPJOB_LISTEN_HOST, "" (every interface) when unset."""
    return environ.get(LISTEN_HOST_ENV, "").strip()


def replacement_wait_seconds(conf: Mapping[str, object]) -> int:
    """REPLACEMENT_WAIT_CONF from a --rdzv_conf mapping, checked: an integer from 0 to
    MAX_REPLACEMENT_WAIT_SECONDS (absent or empty: 0).

    Raises:
        ValueError: naming the key, the value and the rule.
    """
    raw = conf.get(REPLACEMENT_WAIT_CONF)
    if raw is None or raw == "":
        return 0
    text = str(raw).strip()
    # ASCII digits only ("²" is a digit to str.isdigit), and few of them: int() of a long string is slow.
    if not (text.isascii() and text.isdigit() and len(text) <= 4) or int(text) > MAX_REPLACEMENT_WAIT_SECONDS:
        shown = text if len(text) <= 40 else text[:40] + "..."  # the answer stays short whatever was given
        raise ValueError(f"rdzv_conf {REPLACEMENT_WAIT_CONF} ({shown!r}) must be an integer number of seconds "
                         f"from 0 to {MAX_REPLACEMENT_WAIT_SECONDS}")
    return int(text)
