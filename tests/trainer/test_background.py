"""A background job's error reaches the thread that waits for it, once (ddpjob_trainer.snapshots.background)."""
import threading

from ddpjob_trainer.snapshots.background import BackgroundJob


def test_wait_returns_what_the_job_raised_once_and_none_after_a_clean_job():
    job = BackgroundJob("test", daemon=True)
    job.start(lambda: (_ for _ in ()).throw(OSError("No space left")))
    error = job.wait()
    assert isinstance(error, OSError) and str(error) == "No space left"
    assert job.wait() is None, "reported once"
    done = threading.Event()
    job.start(done.set)
    assert job.wait() is None and done.is_set(), "wait returns after the job ran"
