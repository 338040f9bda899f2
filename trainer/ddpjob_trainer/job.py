"""Bring your own loop: resume and progress reporting for any training script, in a few lines.

A script that keeps its own loop (the PyTorch DDP tutorial's, a research codebase's) adopts
ddpjob's guarantees with one object::

    from ddpjob_trainer import Job

    with Job() as job:                          # the snapshot dir from $DDPJOB_SNAPSHOT_DIR
        state = job.load(map_location=device)   # newest complete snapshot, or None
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        model = DDP(model)
        for epoch in range(job.epoch, epochs):  # job.epoch: where the snapshot resumes (0 fresh)
            for batch in loader:
                ...
                job.step(loss=loss.item())      # progress: status STEP, --kill-node-after, goodput
            job.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                     epoch=epoch + 1)           # rank 0 writes, atomically; the others return

What it does with the rules the operator and ``ddpjob run`` already apply to the Trainer:

* **where**: ``$DDPJOB_SNAPSHOT_DIR`` (the snapshot volume the DDPJob mounts, or the run's
  ``snapshots/`` under ``ddpjob run``), else the ``snapshot_dir`` given;
* **save**: :class:`~ddpjob_trainer.snapshots.store.SnapshotStore` (temp file, fsync, rename,
  sha256 manifest, ``progress.json``); only global rank 0 writes, every other rank returns
  at once, so ``job.save`` may be called on every rank (it needs no collective);
* **load**: the newest snapshot that verifies. With a process group every rank loads the
  one rank 0 chose (one broadcast); without one each rank reads the newest itself;
* **progress**: each node's local-rank-0 worker keeps the progress record the operator polls
  (report/), so failures after progress are not charged to the restart budget;
  rank 0 appends ``start``/``step``/``snapshot``/``done`` lines to the metrics file
  (``$DDPJOB_METRICS_FILE``, else ``<snapshot dir>/metrics.jsonl``) that ``ddpjob run`` follows;
* **failure**: an exception leaving the ``with`` block is recorded in the progress record;
  a :class:`~ddpjob_trainer.errors.DoNotRetry` fails the job at once instead of retrying.

The same object is the lifecycle under every loop: the Trainer (trainer.py) builds its Job from
TrainerConfig (:meth:`Job.for_loop`) and adds only what its loop owns, and under the framework
integrations (integrations/): Lightning
saves its checkpoint dict with :meth:`Job.save`; Hugging Face, whose checkpoint is a directory
it resumes from itself, stores it with :meth:`Job.save_directory` and finds it with
:meth:`Job.latest`, and stops gracefully on SIGTERM with :meth:`Job.watch_stop`,
:meth:`Job.stop_agreed` and :meth:`Job.stop_here`, the ending the Trainer's loop shares.

Torch is the only dependency: the state is anything ``torch.save`` writes and
``torch.load(weights_only=True)`` reads back (see SnapshotStore for the allowed types).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, NoReturn

import torch
import torch.distributed as torch_dist
from ddpjob_rdzv.contract import METRICS_FILE_ENV, NODE_INDEX_ENV, SNAPSHOT_DIR_ENV

from ddpjob_trainer.errors import DoNotRetry
from ddpjob_trainer.report.give_up import give_up
from ddpjob_trainer.report.metrics import MetricsWriter
from ddpjob_trainer.report.record import ProgressReport, default_path, progress_port
from ddpjob_trainer.snapshots.agree import in_group_of_many, latest_agreed, load_agreed
from ddpjob_trainer.snapshots.store import PROGRESS_FILE, SnapshotInfo, SnapshotStore
from ddpjob_trainer.stop import GracefulStop, PeerStopped, StopSignal

log = logging.getLogger(__name__)

METRICS_NAME = "metrics.jsonl"

def resolve_snapshot_dir(default: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Where snapshots go: ``$DDPJOB_SNAPSHOT_DIR``, else ``default``.

    Raises:
        ValueError: neither is set.
    """
    environ = os.environ if environ is None else environ
    found = environ.get(SNAPSHOT_DIR_ENV) or (os.fspath(default) if default is not None else None)
    if not found:
        raise ValueError(f"no snapshot directory: {SNAPSHOT_DIR_ENV} is not set (a DDPJob without spec.snapshot, or "
                         "a script started outside ddpjob); pass Job(snapshot_dir=...)")
    return found


class StopVote:
    """Every rank learns at the same optimizer step that one of them was told to stop (SIGTERM),
    for a loop the Trainer does not run (the Trainer's flag rides in its loss all-reduce).

    One all-reduce of the flag per step, on a gloo group of its own: on the CPU, so it never
    waits for a GPU, and apart from the framework's own collectives, so it cannot be ordered
    differently on two ranks. It is started at one step's end and read at the next one's, so no
    step waits for it: the stop lands one step after the signal, on every rank alike. Without
    a process group of more than one rank, the flag is read directly.

    Args:
        stop: the installed StopSignal of this rank.
    """

    def __init__(self, stop: StopSignal):
        self.stop = stop
        # Collective: every rank constructs its vote at the same point (the training's start).
        self.group = torch_dist.new_group(backend="gloo") if in_group_of_many() else None
        self._pending: tuple[torch.Tensor, Any] | None = None

    def agreed(self) -> bool:
        """Whether to stop after this step; every rank calls it once per optimizer step."""
        if self.group is None:
            return self.stop.requested
        agreed = False
        if self._pending is not None:
            flag, work = self._pending
            work.wait()
            agreed = flag.item() > 0
        self._pending = None
        if not agreed:  # the same answer on every rank, so every rank starts the next vote or none does
            flag = torch.tensor([float(self.stop.requested)])
            self._pending = (flag, torch_dist.all_reduce(flag, group=self.group, async_op=True))
        return agreed

    def close(self) -> None:
        """Waits for the vote in flight (every rank started it, so it completes)."""
        if self._pending is not None:
            self._pending[1].wait()
            self._pending = None


def node_report(directory: str | None, local_rank: int) -> ProgressReport:
    """This worker's progress record: written and served by local rank 0 only (the kubelet keeps
    one termination message per container, and the operator polls one port per pod)."""
    progress = os.path.join(directory, PROGRESS_FILE) if directory else None
    first = local_rank == 0
    return ProgressReport(default_path() if first else None, progress, node=os.environ.get(NODE_INDEX_ENV, ""),
                          port=progress_port() if first else None)


class Job:
    """The one lifecycle of a training run: snapshots, progress report and metrics, wired once.

    Every loop runs on it: a loop of your own (see the module docstring), the Trainer (trainer.py,
    through :meth:`for_loop`), Lightning and Hugging Face (integrations/).

    Args:
        snapshot_dir: used when ``$DDPJOB_SNAPSHOT_DIR`` is not set (a plain torchrun run).
        keep: complete snapshots kept.
        metrics_file: rank 0's metrics; default ``$DDPJOB_METRICS_FILE``, else
            ``<snapshot dir>/metrics.jsonl``; ``""`` turns them off.
        environ: where to read RANK, LOCAL_RANK, WORLD_SIZE and the snapshot and metrics paths
            (default the process environment; without torchrun: rank 0 of 1). The progress
            record's settings (termination message, port, node index) always come from the
            process environment, as the pod sets them.

    Attributes:
        epoch: the epoch to start at: the loaded snapshot's ``epoch``, else 0.
        global_step: steps done so far (restored from the snapshot, counted by :meth:`step`).
        resumed_from: the SnapshotInfo loaded, None on a fresh start.
        store: the SnapshotStore; None only for a Trainer configured without snapshots.
    """

    def __init__(self, snapshot_dir: str | os.PathLike | None = None, *, keep: int = 2,
                 metrics_file: str | None = None, environ: Mapping[str, str] | None = None):
        environ = os.environ if environ is None else environ
        directory = resolve_snapshot_dir(snapshot_dir, environ)
        if metrics_file is None:
            metrics_file = environ.get(METRICS_FILE_ENV) or os.path.join(directory, METRICS_NAME)
        self._open(rank=int(environ.get("RANK", "0")), local_rank=int(environ.get("LOCAL_RANK", "0")),
                   world_size=int(environ.get("WORLD_SIZE", "1")),
                   restart_count=int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                   directory=directory, metrics_file=metrics_file, keep=keep)

    @classmethod
    def for_loop(cls, *, rank: int, local_rank: int, world_size: int, restart_count: int, directory: str | None,
                 metrics_file: str | None, **store_options: Any) -> Job:
        """The Job of a loop that settles its own configuration (the Trainer: TrainerConfig and
        torchrun's DistEnv) instead of reading the environment: ``directory`` None runs without
        snapshots (a restart trains from scratch), ``metrics_file`` None without metrics, and
        ``store_options`` go to the SnapshotStore (keep, async_save, trusted, on_unreadable)."""
        job = cls.__new__(cls)
        job._open(rank=rank, local_rank=local_rank, world_size=world_size, restart_count=restart_count,
                  directory=directory, metrics_file=metrics_file, **store_options)
        return job

    def _open(self, *, rank: int, local_rank: int, world_size: int, restart_count: int, directory: str | None,
              metrics_file: str | None, **store_options: Any) -> None:
        self.rank, self.local_rank, self.world_size, self.restart_count = rank, local_rank, world_size, restart_count
        self.directory = directory
        self.store = (SnapshotStore(directory, rank=rank, on_saved=self._saved, **store_options)
                      if directory else None)
        self.metrics = MetricsWriter(metrics_file if rank == 0 and metrics_file else None)
        self.report = node_report(directory, local_rank)
        self.epoch = 0
        self.global_step = 0
        self.resumed_from: SnapshotInfo | None = None
        self.stop = StopSignal()  # installed by watch_stop() (or the Trainer's loop), for a graceful stop
        self._vote: StopVote | None = None
        self._reported = False
        self._started = False

    def load(self, map_location: Any = None) -> dict[str, Any] | None:
        """The state of the newest complete snapshot (as saved), or None on a fresh start.

        Sets :attr:`epoch`, :attr:`global_step` and :attr:`resumed_from`. Call it before
        wrapping the model in DDP, on every rank.

        Raises:
            SnapshotsUnreadableError: snapshots exist but none can be read (a DoNotRetry).
        """
        info, state = load_agreed(self.store, self.rank, map_location) if self.store is not None else (None, None)
        self.resume_at(info)
        self._log_resume()
        self.start()
        return state

    def latest(self) -> SnapshotInfo | None:
        """The newest complete snapshot, verified but not loaded, as rank 0 chose it (the same on
        every rank once a process group exists), or None on a fresh start: for a framework that
        resumes from the snapshot's path itself. Sets :attr:`epoch`, :attr:`global_step` and
        :attr:`resumed_from` as :meth:`load` does.

        Raises:
            SnapshotsUnreadableError: snapshots exist but none verifies (a DoNotRetry).
        """
        info = latest_agreed(self.store, self.rank) if self.store is not None else None
        self.resume_at(info)
        self._log_resume()
        self.start()
        return info

    def resume_at(self, info: SnapshotInfo | None) -> None:
        """Training resumes at ``info`` (None: from scratch), wherever the loop found it (the volume,
        or the Trainer's fast tier): sets :attr:`epoch`, :attr:`global_step` and
        :attr:`resumed_from`, and the node's record says where this run of the workers started."""
        if info is not None:
            self.epoch, self.global_step, self.resumed_from = info.epoch, info.step, info
        self._report_resume()

    def _log_resume(self) -> None:
        info = self.resumed_from
        if info is not None and self.rank == 0:
            log.info("resuming from %s: epoch %d, step %d", info.path, info.epoch, info.step)

    def start(self) -> None:
        """Training starts now (once; :meth:`load`, :meth:`latest` and :meth:`step` call it): the
        ``start`` metrics line, which ``read_metrics`` rolls back to."""
        self._report_resume()
        if self._started:
            return
        self._started = True
        self.metrics.write("start", world_size=self.world_size, restart_count=self.restart_count,
                           resume_epoch=self.epoch, resume_step=self.global_step)

    def _report_resume(self) -> None:
        if self._reported:
            return
        self._reported = True
        info = self.resumed_from
        self.report.resumed(info.step if info else None, info.time if info else None, self.restart_count)

    def step(self, loss: float | None = None, epoch: int | None = None) -> None:
        """Reports one optimizer step (call it on every rank after ``optimizer.step()``).

        Args:
            loss: shown by ``ddpjob run``; None when you do not want to sync it.
            epoch: the epoch the step belongs to (default: :attr:`epoch`).
        """
        self.start()
        self.global_step += 1
        fields = {"epoch": self.epoch if epoch is None else epoch, "step": self.global_step,
                  "world_size": self.world_size}
        if loss is not None:
            fields["loss"] = float(loss)
        self.metrics.write("step", **fields)
        self.report.stepped()

    def save(self, state: dict[str, Any], *, epoch: int, step: int | None = None, samples_consumed: int = 0) -> None:
        """Stores ``state`` atomically as the snapshot to resume at ``epoch`` (rank 0; others return).

        Args:
            state: anything ``torch.load(weights_only=True)`` reads back (state dicts, tensors, numbers).
            epoch: the epoch a resume starts at, i.e. epochs completed (``epoch + 1`` after epoch ``epoch``).
            step: the global step (default :attr:`global_step`).
            samples_consumed: samples of ``epoch`` already trained on (a mid-epoch snapshot).

        Raises:
            SnapshotError: the state holds objects a safe load would refuse.
        """
        self.epoch = epoch
        self.store.save(state, epoch=epoch, step=self.global_step if step is None else step,
                        samples_consumed=samples_consumed)

    def save_directory(self, path: str | os.PathLike, *, epoch: int, step: int | None = None) -> None:
        """Takes the checkpoint directory ``path`` in as the snapshot to resume at ``epoch`` (rank 0
        moves it into the snapshot directory, every file's sha256 in the manifest; others return).

        Raises:
            SnapshotError: ``path`` is missing or holds a link or special file.
        """
        self.epoch = epoch
        self.store.save_directory(path, epoch=epoch, step=self.global_step if step is None else step)

    def watch_stop(self) -> None:
        """Turns SIGTERM into a graceful stop until :meth:`unwatch_stop` (call it on every rank, from
        the main thread, where training starts: it makes a process group of its own, a collective)."""
        self.stop.__enter__()
        self._vote = StopVote(self.stop)

    def stop_agreed(self) -> bool:
        """After each optimizer step, on every rank: whether some rank was told to stop, so this
        step's snapshot is the last (the same answer on every rank; False unless watching)."""
        return self._vote is not None and self._vote.agreed()

    def stop_here(self, step: int) -> NoReturn:
        """After the snapshot at ``step`` that the ranks agreed to stop at (:meth:`stop_agreed`, or
        the Trainer's flag in its loss all-reduce): waits for it, tells every node's record, and
        raises GracefulStop (this rank got SIGTERM) or PeerStopped (stop.py). Every rank calls it."""
        self.unwatch_stop()
        self.end_stop(step)

    def end_stop(self, step: int) -> NoReturn:
        """:meth:`stop_here` for a loop that keeps SIGTERM turned into a flag to the end (the
        Trainer's ``with job.stop:``): a second SIGTERM while the snapshot becomes durable is
        caught, not fatal."""
        if self.store is not None:
            self.store.wait()  # rank 0: the snapshot is durable before anyone leaves
        if in_group_of_many():
            torch_dist.barrier()
        self.report.refresh(force=True)  # every node's record names the stop's snapshot
        signalled = self.stop.requested
        self.metrics.write("stop", step=step, signalled=signalled)
        if self.rank == 0:
            log.info("graceful stop: snapshot at step %d complete; %s", step,
                     "exiting" if signalled else "a peer got SIGTERM, restarting without it")
        raise GracefulStop(step) if signalled else PeerStopped(step)

    def unwatch_stop(self, wait: bool = True) -> None:
        """Puts SIGTERM's previous handler back (again: harmless); ``wait`` for the vote in flight,
        which every rank started (not after a failure: a peer may be gone)."""
        vote, self._vote = self._vote, None
        if vote is not None and wait:
            vote.close()
        self.stop.__exit__(None, None, None)

    def close(self) -> None:
        """Waits for the snapshot being written and closes the metrics and the progress endpoint."""
        try:
            if self.store is not None:
                self.store.close()
        finally:
            self.metrics.close()
            self.report.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if error is None:
            self.finish()
        else:
            self.fail(error)

    def finish(self) -> None:
        """Training is over: waits for the last snapshot, writes ``done`` and closes."""
        if self.store is not None:
            self.store.close()
        self.metrics.write("done", epoch=max(self.epoch - 1, 0), step=self.global_step)
        self.close()

    def fail(self, error: BaseException) -> None:
        """Training raised ``error``: the operator sees why (a DoNotRetry fails the job), then closes.
        A graceful stop (GracefulStop, PeerStopped) is no failure: it only closes."""
        self.unwatch_stop(wait=False)
        if isinstance(error, (GracefulStop, PeerStopped)):
            try:
                self.close()
            except Exception:  # keep the stop on top
                log.exception("closing the job after a graceful stop failed")
            return
        self.report.failed(error)
        try:
            self.close()
        except Exception:  # keep the training error on top
            log.exception("closing the job after a training error failed")
        if isinstance(error, DoNotRetry):  # fail the pod now, not after torchrun's restarts (docs/hangs.md)
            give_up(error, written=self.report.enabled)

    def _saved(self, info: SnapshotInfo) -> None:
        self.report.refresh(force=True)  # progress.json is complete now
        self.metrics.write("snapshot", epoch=info.epoch, step=info.step, path=info.path,
                           samples_consumed=info.samples_consumed)
