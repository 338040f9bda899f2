"""Reads a running job's progress from its node pods' progress endpoints, treating each answer as hostile.

Termination messages (failure.pod_progress) tell the operator where training stood only
when a container exits. While a job runs, the local-rank-0 worker of each node also serves
its progress record at ``GET /progress`` on the pod's ``progress`` port
(ddpjob_trainer/report/record.py), and each pass of a running job reads it from one node,
so ``status.lastSnapshot``, the STEP column and the recovery figures follow training.

The operator reaches pods the way Prometheus does (pod IP and port); where a NetworkPolicy
forbids that, this finds nothing and the status falls back to termination messages.

Pods run user code, so nothing they answer is trusted. Measured with the plain poll this
replaces (bench/progress_poll.py): a 298 KiB gzip bomb grew the operator by 613 MiB (its
chart limit is 256 Mi) and held a pass 4.8 s despite a 2 s timeout, a 400 MiB body added
388 MiB, and a 302 to another address was followed and its body taken as progress. So:

* redirects are not followed: a 3xx is "no record";
* nothing is decompressed: ``Accept-Encoding: identity`` is asked for, and an answer with
  any other Content-Encoding is refused unread;
* at most MAX_BODY_BYTES are read: a larger Content-Length is refused before reading, and a
  body that passes the cap while it streams in is cut there and its connection closed;
* one deadline, DEADLINE_SECONDS, covers connect, headers and body together, so a pod that
  trickles its answer cannot hold a pass;
* the body must pass the record contract (ddpjob_rdzv/contract/progress_record.py) and name the job
  and pod it was read from where it names any (decide/progress.identity_problem). A refused
  record, an oversized body or a compressed one comes back as a RecordProblem naming the
  pod, which the pass reports once in a Warning Event; the other refusals are only logged
  (at debug level: a pass runs every --progress-poll-seconds).

At most MAX_PODS are asked per pass.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
from ddpjob_rdzv.contract import progress_record

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.observed import PodView, RecordProblem
from ddpjob_operator.decide.progress import identity_problem

log = logging.getLogger("ddpjob_operator")

DEADLINE_SECONDS = 2.0  # per pod, for the whole exchange: a pass must not wait long on a busy or hostile node
MAX_PODS = 2  # the nodes share one snapshot record; a second is asked only when the first gives none
PATH = "/progress"
MAX_BODY_BYTES = progress_record.MAX_RECORD_BYTES  # the contract refuses anything longer anyway
CHUNK_BYTES = 4096  # the body is read this much at a time, the cap checked after each piece
HEADERS = {"Accept": "application/json", "Accept-Encoding": "identity"}  # aiohttp would ask for gzip


@dataclass(frozen=True)
class Fetched:
    """One exchange with a pod's endpoint.

    ``body`` is the whole body when it was read, else None and ``refused`` says why;
    ``problem`` is set when the refusal breaks the record contract (reported in an Event).
    ``bytes_read`` counts the body bytes taken from the connection.
    """

    url: str
    bytes_read: int
    body: bytes | None = None
    refused: str = ""
    problem: progress_record.Invalid | None = None


def progress_urls(pods: Iterable[PodView]) -> list[str]:
    """The progress endpoints of the running node pods, lowest node index first (`pods` come in
    pod order: decide/observed.py)."""
    return [url for _, url in _endpoints(pods)]


def _endpoints(pods: Iterable[PodView]) -> list[tuple[PodView, str]]:
    found = []
    # Lowest index first: the pods come in the observation's pod order (decide/observed.py).
    for pod in (p for p in pods if not p.is_store and p.phase == "Running" and not p.deleting):
        port = pod.ports.get(C.PROGRESS_PORT_NAME)
        if pod.ip and port:
            host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
            found.append((pod, f"http://{host}:{port}{PATH}"))
    return found


def session() -> aiohttp.ClientSession:
    """A client for the endpoints: no keep-alive (a poll every few seconds gains nothing from a
    pool, and every connection ends with its exchange), no decompression, no cookies, no proxy
    from the environment, and a read buffer no larger than the cap."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True, limit=MAX_PODS),
        auto_decompress=False, read_bufsize=MAX_BODY_BYTES, cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False, timeout=aiohttp.ClientTimeout(total=None))  # fetch() holds the one deadline


async def read_live_progress(pods: Iterable[PodView],
                             deadline: float = DEADLINE_SECONDS) -> list[dict[str, Any] | RecordProblem]:
    """The progress record of the first running node that serves a valid one, after a
    RecordProblem for each node on the way that served a refused one ([] when none answered)."""
    found: list[dict[str, Any] | RecordProblem] = []
    async with session() as client:
        for pod, url in _endpoints(pods)[:MAX_PODS]:
            fetched = await fetch(client, url, deadline)
            # Parsed on the event loop: the body is at most MAX_BODY_BYTES (24 KiB). Measured on a
            # loaded 2-core machine: 27 us for a typical 300-byte record, 3.8 ms for the costliest
            # (11 KiB, 128 `nodes` entries; ~10x json.loads), at most twice a pass. A thread would
            # hold the GIL as long and add a hop.
            parsed = progress_record.parse(fetched.body) if fetched.body is not None else fetched.problem
            if isinstance(parsed, progress_record.Record):
                parsed = identity_problem(parsed.data, pod) or parsed
            if isinstance(parsed, progress_record.Record):
                return found + [dict(parsed.data)]
            if isinstance(parsed, progress_record.Invalid):
                found.append(RecordProblem.of(pod, C.SOURCE_PROGRESS_ENDPOINT, parsed))
            log.debug("No progress record from %s: %s", url, fetched.refused or (parsed and parsed.message)
                      or "not a progress record")
    return found


async def fetch(client: aiohttp.ClientSession, url: str, deadline: float = DEADLINE_SECONDS) -> Fetched:
    """GET ``url`` under the rules above; never raises for what the other end does."""
    counted = [0]  # body bytes read so far, still known when the deadline cancels the read
    try:
        return await asyncio.wait_for(_exchange(client, url, counted), deadline)
    except asyncio.TimeoutError:
        return Fetched(url, counted[0], refused=f"no complete answer within {deadline:g} s")
    except (aiohttp.ClientError, OSError) as error:
        return Fetched(url, counted[0], refused=f"{type(error).__name__}: {error}")


async def _exchange(client: aiohttp.ClientSession, url: str, counted: list[int]) -> Fetched:
    async with client.get(url, allow_redirects=False, headers=HEADERS) as response:
        refused = _refusal(response)
        if refused is not None:
            response.close()  # the body is never read: drop the connection with it
            return refused
        pieces = []
        while piece := await response.content.read(CHUNK_BYTES):
            counted[0] += len(piece)
            if counted[0] > MAX_BODY_BYTES:
                response.close()  # stop here: the rest is never read
                return _over_cap(url, counted[0], f"over {MAX_BODY_BYTES} bytes")
            pieces.append(piece)
        return Fetched(url, counted[0], body=b"".join(pieces))


def _refusal(response: aiohttp.ClientResponse) -> Fetched | None:
    """Why the answer is refused from its status line and headers alone; None to read the body."""
    url = str(response.url)
    if 300 <= response.status < 400:
        return Fetched(url, 0, refused=f"HTTP {response.status}: redirects are not followed")
    if response.status != 200:
        return Fetched(url, 0, refused=f"HTTP {response.status}")
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        problem = progress_record.Invalid("Content-Encoding", progress_record.shorten(f'"{encoding}"'),
                                          "must be identity: the operator does not decompress")
        return Fetched(url, 0, refused=problem.message, problem=problem)
    if response.content_length is not None and response.content_length > MAX_BODY_BYTES:
        return _over_cap(url, 0, f"{response.content_length} bytes")
    return None


def _over_cap(url: str, read: int, size: str) -> Fetched:
    problem = progress_record.Invalid("record", size, f"must be at most {MAX_BODY_BYTES} bytes")
    return Fetched(url, read, refused=problem.message, problem=problem)
