"""The node's progress record (ddpjob_trainer/report/record.py): written to the termination
message after each snapshot and never torn, served at GET /progress, built through the contract.

The kubelet reads the file when the container exits, so what matters is that at every
moment the file holds one complete record: the previous or the new one.
"""
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from ddpjob_rdzv.contract import progress_record
from ddpjob_trainer import DoNotRetry, Job, Trainer, TrainerConfig
from ddpjob_trainer.examples.mlp import fault_injection, make_dataset, mse
from ddpjob_rdzv.contract import PROGRESS_PORT_ENV, TERMINATION_LOG_ENV
from ddpjob_trainer.report.record import DEFAULT_PATH, RECORD_BYTES, ProgressReport, default_path, progress_port
from ddpjob_trainer.report.server import MAX_CONNECTIONS, READ_TIMEOUT_SECONDS
from ddpjob_sandbox.procs import free_port
from tests.support.listeners import listeners

DATA = make_dataset(96, seed=5)


def kubelet_file(directory):
    """The kubelet creates the (empty) file before the container starts."""
    path = directory / "termination-log"
    path.touch()
    return path


def record_in(path):
    """The record in the file, which must pass the contract the operator applies."""
    parsed = progress_record.parse(path.read_text())
    assert isinstance(parsed, progress_record.Record), parsed
    return parsed.data


def write_progress(directory, step, epoch=0):
    progress = {"epoch": epoch, "step": step, "time": f"2026-11-23T01:00:{step:02d}Z",
                "path": str(directory / f"s{step}.pt"), "samples_consumed": 8 * step}
    (directory / "progress.json").write_text(json.dumps(progress))
    os.utime(directory / "progress.json", ns=(step * 10**9, step * 10**9))  # mtime moves even within a tick
    return progress


def test_a_refresh_copies_progress_json_verbatim_into_the_record(tmp_path):
    message = kubelet_file(tmp_path)
    progress = write_progress(tmp_path, 12, epoch=1)
    report = ProgressReport(message, tmp_path / "progress.json", node="3")
    report.resumed(8, "2026-11-23T00:59:00Z")
    record = record_in(message)
    assert record["snapshot"] == progress
    assert record["node"] == "3" and record["version"] == 1
    assert record["resume"]["fromStep"] == 8 and record["resume"]["fromSnapshotTime"] == "2026-11-23T00:59:00Z"
    assert record["resume"]["firstStepTime"] is None and record["resume"]["time"]


def test_the_first_step_time_is_recorded_once(tmp_path):
    message = kubelet_file(tmp_path)
    report = ProgressReport(message, None)
    report.resumed(None, None)
    report.stepped()
    first = record_in(message)["resume"]["firstStepTime"]
    report.stepped()
    report.refresh(force=True)
    assert first is not None and record_in(message)["resume"]["firstStepTime"] == first


def test_a_newer_snapshot_is_picked_up_by_a_forced_refresh_but_polls_are_rate_limited(tmp_path):
    message = kubelet_file(tmp_path)
    write_progress(tmp_path, 4)
    report = ProgressReport(message, tmp_path / "progress.json")
    report.resumed(None, None)
    write_progress(tmp_path, 8)
    report.refresh()  # within POLL_SECONDS of the last read: no file system access
    assert record_in(message)["snapshot"]["step"] == 4
    report.refresh(force=True)
    assert record_in(message)["snapshot"]["step"] == 8


def test_the_file_is_never_truncated_so_a_shorter_record_leaves_valid_json(tmp_path):
    message = kubelet_file(tmp_path)
    message.write_text(json.dumps({"kind": "ddpjob.progress", "error": "x" * 3000}))  # a predecessor's record
    report = ProgressReport(message, None)
    report.resumed(None, None)
    assert message.stat().st_size >= 3000
    record = record_in(message)
    assert "error" not in record and record["resume"]["fromStep"] is None
    assert len(message.read_bytes()) >= RECORD_BYTES


def test_a_record_is_one_write_at_offset_zero(tmp_path, monkeypatch):
    """A kill can only land before or after the single pwrite: the file holds one whole record."""
    message = kubelet_file(tmp_path)
    report = ProgressReport(message, None)
    report.resumed(None, None)
    before = message.read_bytes()
    writes = []
    real_pwrite = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: writes.append((len(data), offset)) or real_pwrite(fd, data, offset))
    monkeypatch.setattr(os, "truncate", lambda *a: pytest.fail("the record must never be truncated"))
    monkeypatch.setattr(os, "ftruncate", lambda *a: pytest.fail("the record must never be truncated"))
    report.failed(ValueError("boom"))
    assert writes == [(len(before), 0)]
    assert record_in(message)["error"] == "ValueError: boom"


def test_an_unwritable_path_turns_reporting_off_silently(tmp_path):
    report = ProgressReport(tmp_path / "missing-dir" / "termination-log", None)
    report.resumed(None, None)
    report.stepped()
    assert not report.enabled and not (tmp_path / "missing-dir").exists()


def test_a_missing_file_is_never_created_only_a_kubelet_makes_it(tmp_path):
    report = ProgressReport(tmp_path / "termination-log", None)
    report.resumed(None, None)
    assert not report.enabled and not (tmp_path / "termination-log").exists()


def test_the_env_variable_names_the_path_and_the_default_is_used_only_when_the_kubelet_made_it(tmp_path):
    assert default_path({TERMINATION_LOG_ENV: str(tmp_path / "t")}) == str(tmp_path / "t")
    expected = DEFAULT_PATH if os.path.isfile(DEFAULT_PATH) else None
    assert default_path({}) == expected


def test_a_progress_json_the_contract_refuses_is_not_copied_and_the_last_good_snapshot_stays(tmp_path, caplog):
    message = kubelet_file(tmp_path)
    good = write_progress(tmp_path, 4)
    report = ProgressReport(message, tmp_path / "progress.json")
    report.resumed(None, None)
    (tmp_path / "progress.json").write_text(json.dumps({**good, "step": "8a"}))
    os.utime(tmp_path / "progress.json", ns=(9 * 10**9, 9 * 10**9))
    with caplog.at_level(logging.WARNING, logger="ddpjob_trainer.report.record"):
        report.refresh(force=True)
    assert record_in(message)["snapshot"] == good
    assert f'not reporting {tmp_path / "progress.json"}: snapshot.step ("8a") must be an integer from 0 to ' \
           "9007199254740991" in caplog.text


class BadDataset(DoNotRetry):
    reason = "BadDataset"


def test_a_do_not_retry_error_sets_fatal_with_its_reason_and_message(tmp_path):
    message = kubelet_file(tmp_path)
    report = ProgressReport(message, None, port=0)
    try:
        report.resumed(None, None)
        assert "fatal" not in record_in(message)
        report.failed(BadDataset("shard 3: checksum mismatch"))
        record = record_in(message)
        assert record["fatal"] == {"reason": "BadDataset", "message": "shard 3: checksum mismatch"}
        assert record["error"] == "BadDataset: shard 3: checksum mismatch"
        assert fetch(report.port)[1]["fatal"]["reason"] == "BadDataset", "served over HTTP too"
    finally:
        report.close()


def test_fatal_outlives_the_worker_a_later_worker_of_the_same_container_keeps_it(tmp_path):
    """torchrun restarts failed workers in the same container; the next one must not erase
    the first one's "do not retry" before the container exits."""
    message = kubelet_file(tmp_path)
    first = ProgressReport(message, None)
    first.resumed(None, None)
    first.failed(DoNotRetry("no tokenizer gpt9", reason="MissingTokenizer"))
    second = ProgressReport(message, None)
    second.resumed(None, None)
    assert record_in(message)["fatal"] == {"reason": "MissingTokenizer", "message": "no tokenizer gpt9"}
    assert "error" not in record_in(message), "the error is the current worker's own"


def test_an_ordinary_error_sets_no_fatal(tmp_path):
    message = kubelet_file(tmp_path)
    report = ProgressReport(message, None)
    report.failed(ValueError("boom"))
    assert "fatal" not in record_in(message) and record_in(message)["error"] == "ValueError: boom"


def test_a_do_not_retry_reason_must_be_an_upper_camel_case_word():
    with pytest.raises(ValueError) as error:
        DoNotRetry("x", reason="bad dataset")
    assert str(error.value) == ('DoNotRetry: fatal.reason ("bad dataset") must be an UpperCamelCase word such as '
                                "BadDataset, at most 64 characters")
    assert DoNotRetry("x").reason == "DoNotRetry" and BadDataset().reason == "BadDataset"


def test_the_termination_message_fits_the_kubelets_4096_bytes_and_the_endpoint_keeps_all(tmp_path):
    message = kubelet_file(tmp_path)
    progress = {"epoch": 0, "step": 1, "time": "2026-11-23T01:00:01Z", "path": "/" + "p" * 1000, "samples_consumed": 8}
    (tmp_path / "progress.json").write_text(json.dumps(progress))
    report = ProgressReport(message, tmp_path / "progress.json", port=0)
    try:
        report.failed(DoNotRetry("\u2603" * 5000))  # 3 bytes a character: ~4.8 KB of record in all
        data = message.read_bytes().rstrip()
        assert len(data) <= progress_record.TERMINATION_MESSAGE_BYTES
        kept = record_in(message)
        assert kept["snapshot"] == progress and kept["fatal"]["message"] == "\u2603" * 600
        assert kept["error"].endswith("..."), "the error is cut to fit, the rest is whole"
        served = fetch(report.port)[1]
        assert served["error"] == "DoNotRetry: " + "\u2603" * 588, "the endpoint is not limited to 4096 bytes"
    finally:
        report.close()


# --- the same record over HTTP ------------------------------------------------------------


def fetch(port, path="/progress"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.status, json.loads(response.read())


def test_the_record_is_served_while_running_and_follows_each_new_snapshot(tmp_path):
    write_progress(tmp_path, 5)
    report = ProgressReport(None, tmp_path / "progress.json", node="1", port=0)  # no kubelet file: HTTP only
    try:
        report.resumed(None, None)
        status, record = fetch(report.port)
        assert status == 200 and record["snapshot"]["step"] == 5 and record["node"] == "1"
        newer = write_progress(tmp_path, 10)
        report.refresh(force=True)
        assert fetch(report.port)[1]["snapshot"] == newer
        with pytest.raises(urllib.error.HTTPError) as other:
            fetch(report.port, "/")
        assert other.value.code == 404
    finally:
        report.close()
    with pytest.raises(OSError):
        fetch(report.port or 1)


def test_a_taken_port_turns_the_endpoint_off_with_a_warning_and_reporting_goes_on(tmp_path, caplog):
    message = kubelet_file(tmp_path)
    write_progress(tmp_path, 5)
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        with caplog.at_level(logging.WARNING, logger="ddpjob_trainer.report.server"):
            report = ProgressReport(message, tmp_path / "progress.json", port=taken.getsockname()[1])
        report.resumed(None, None)
    assert report.port is None
    assert "not serving training progress on port" in caplog.text
    assert record_in(message)["snapshot"]["step"] == 5, "the termination message is still written"


@pytest.mark.parametrize(("value", "port"), [("", None), ("29410", 29410), ("http", None), ("70000", None)])
def test_the_port_comes_from_the_environment_and_nonsense_turns_it_off(value, port):
    assert progress_port({PROGRESS_PORT_ENV: value}) == port


# --- the Trainer writes it ---------------------------------------------------------------


def train(env, directory, message, monkeypatch, restart_count=0, fail_at_step=None, loss_fn=mse, **overrides):
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(message))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    overrides.setdefault("epochs", 2)
    config = TrainerConfig(batch_size=8, snapshot_dir=str(directory), snapshot_every_steps=5,
                           metrics_file=str(directory / "metrics.jsonl"), progress_bar=False, **overrides)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), DATA, config, loss_fn=loss_fn,
                      env=dataclasses.replace(env, restart_count=restart_count),
                      on_step=fault_injection(0.0, fail_at_step, restart_count))
    return trainer.train()


def test_the_trainer_reports_each_complete_snapshot_and_its_resume(env, tmp_path, monkeypatch):
    message = kubelet_file(tmp_path)
    # The volume snapshot's report: the fast tier (on by default) would resume from step 6 instead.
    with pytest.raises(RuntimeError, match="fail_at_step=7"):
        train(env, tmp_path, message, monkeypatch, fail_at_step=7, fast_snapshot_every_steps=0)
    failed = record_in(message)
    assert failed["snapshot"] == json.loads((tmp_path / "progress.json").read_text())
    assert failed["snapshot"]["step"] == 5  # the last complete snapshot before the failure at step 7
    assert failed["resume"]["fromStep"] is None and failed["resume"]["firstStepTime"] is not None
    assert failed["error"].startswith("RuntimeError: fail_at_step=7")

    result = train(env, tmp_path, message, monkeypatch, restart_count=1, fail_at_step=7, async_snapshot=True,
                   fast_snapshot_every_steps=0)
    done = record_in(message)
    assert done["snapshot"] == json.loads((tmp_path / "progress.json").read_text())
    assert done["snapshot"]["step"] == result.step == 24  # 96 samples / 8 per step * 2 epochs
    assert done["resume"]["fromStep"] == 5
    assert done["resume"]["fromSnapshotTime"] == failed["snapshot"]["time"]
    assert done["resume"]["firstStepTime"] > done["resume"]["time"] > failed["resume"]["firstStepTime"]
    assert "error" not in done


def test_a_do_not_retry_escaping_training_marks_the_record_fatal(env, tmp_path, monkeypatch):
    message = kubelet_file(tmp_path)
    batches = []

    def loss(model, batch):
        batches.append(1)
        if len(batches) == 7:
            raise BadDataset("shard 0: checksum mismatch")
        return mse(model, batch)

    with pytest.raises(BadDataset):
        train(env, tmp_path, message, monkeypatch, loss_fn=loss)
    record = record_in(message)
    assert record["fatal"] == {"reason": "BadDataset", "message": "shard 0: checksum mismatch"}
    assert record["snapshot"]["step"] == 5, "the progress before it is still reported"


def test_only_local_rank_0_reports(env, tmp_path, monkeypatch):
    message = kubelet_file(tmp_path)
    train(dataclasses.replace(env, local_rank=0), tmp_path / "a", message, monkeypatch, epochs=1)
    assert record_in(message)["snapshot"] is not None
    other = tmp_path / "other-log"
    other.touch()
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(other))
    # A second local rank needs a second process; the choice itself is made by the Job every loop
    # (the Trainer included) runs on.
    job = Job.for_loop(rank=1, local_rank=1, world_size=2, restart_count=0, directory=str(tmp_path),
                       metrics_file=None)
    job.resume_at(None)
    job.report.stepped()
    job.close()
    assert other.read_bytes() == b""


def test_the_trainer_serves_its_progress_while_training_and_stops_at_the_end(env, tmp_path, monkeypatch):
    port = free_port()
    monkeypatch.setenv(PROGRESS_PORT_ENV, str(port))
    seen = []

    class Probe(torch.utils.data.Dataset):  # asks the endpoint mid-training, from the data loader
        def __len__(self):
            return len(DATA)

        def __getitem__(self, index):
            if index == 0 and (tmp_path / "progress.json").exists():
                seen.append(fetch(port)[1])
            return DATA[index]

    message = kubelet_file(tmp_path)
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(message))
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    config = TrainerConfig(batch_size=8, epochs=3, snapshot_dir=str(tmp_path), snapshot_every_epochs=1,
                           metrics_file=str(tmp_path / "metrics.jsonl"), progress_bar=False)
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), Probe(), config, loss_fn=mse, env=env).train()
    assert [record["snapshot"]["epoch"] for record in seen] == [1, 2], "each epoch start sees the last snapshot"
    with pytest.raises(OSError):
        fetch(port)


def half_sent_requests(port: int, count: int) -> list[socket.socket]:
    """Connections that send the start of a request and then nothing (a slow or hostile client)."""
    held = []
    for _ in range(count):
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        client.sendall(b"GET /progress HTTP/1.1\r\nHost: x\r\n")  # no blank line: the request never ends
        held.append(client)
    return held


def serves_http(thread: threading.Thread) -> bool:
    """The thread runs server code: socketserver's or http.server's (a thread per request), or ours."""
    module = getattr(getattr(thread, "_target", None), "__module__", "") or ""
    return module.split(".")[0] in ("socketserver", "http", "ddpjob_trainer")


def test_half_sent_requests_hold_neither_threads_nor_the_endpoint(tmp_path):
    write_progress(tmp_path, 5)
    report = ProgressReport(None, tmp_path / "progress.json", node="1", port=0)
    held = []
    try:
        report.resumed(None, None)
        threads_before = set(threading.enumerate())
        held = half_sent_requests(report.port, 50)
        time.sleep(0.3)  # the server has accepted them
        # Only threads that serve HTTP count: threads left by earlier tests in the same process
        # come and go meanwhile (the whole suite once saw 3 such), a thread per connection is 50.
        serving = [t for t in threading.enumerate() if t not in threads_before and serves_http(t)]
        assert len(serving) <= 1, f"no thread per connection: {serving}"
        started = time.monotonic()
        status, record = fetch(report.port)
        assert status == 200 and record["snapshot"]["step"] == 5
        assert time.monotonic() - started < READ_TIMEOUT_SECONDS, "answered at once, not after the slow ones"
        open_now = [c for c in held if not closed_by_server(c, timeout=0)]
        assert len(open_now) <= MAX_CONNECTIONS, f"{len(open_now)} connections kept open"
    finally:
        for client in held:
            client.close()
        report.close()


def test_a_connection_that_never_finishes_its_request_is_closed_after_the_read_timeout(tmp_path):
    report = ProgressReport(None, None, port=0)
    try:
        report.resumed(None, None)
        [client] = half_sent_requests(report.port, 1)
        started = time.monotonic()
        assert closed_by_server(client, timeout=READ_TIMEOUT_SECONDS + 5)
        assert READ_TIMEOUT_SECONDS - 0.5 <= time.monotonic() - started < READ_TIMEOUT_SECONDS + 1
        client.close()
    finally:
        report.close()


def test_the_endpoint_listens_on_ddpjob_listen_host(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPJOB_LISTEN_HOST", "127.0.0.1")
    report = ProgressReport(None, None, port=0)
    try:
        assert [(s.address, s.port) for s in listeners({os.getpid()}) if s.port == report.port] == \
            [("127.0.0.1", report.port)]
    finally:
        report.close()


def closed_by_server(client: socket.socket, timeout: float) -> bool:
    """Whether the server closed ``client`` (an end of stream or a reset) within ``timeout``."""
    client.settimeout(timeout or 0.01)
    try:
        return client.recv(1) == b""
    except ConnectionResetError:
        return True
    except (socket.timeout, BlockingIOError):
        return False


def test_the_record_names_its_job_and_pod_from_the_rendered_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPJOB_JOB_UID", "6f1c2a9e-0000-4000-8000-000000000001")
    monkeypatch.setenv("DDPJOB_POD_NAME", "mlp-node-1")
    report = ProgressReport(None, None, node="1", port=0)
    try:
        report.resumed(None, None)
        record = fetch(report.port)[1]
        assert (record["jobUID"], record["pod"]) == ("6f1c2a9e-0000-4000-8000-000000000001", "mlp-node-1")
        assert isinstance(progress_record.parse(json.dumps(record)), progress_record.Record)
    finally:
        report.close()
