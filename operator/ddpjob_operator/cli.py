"""The ddpjob command line: check and preview a DDPJob without a cluster.

    ddpjob validate JOB.yaml   every broken rule (field and cross-field), with its path, value and rule;
                               --max-replicas N applies the operator's cap (default: its default)
    ddpjob render JOB.yaml     the Service and Pods the operator would create (a dry run)
    ddpjob run JOB.yaml        run the job here, one local torchrun agent per node (see local/)

Bad input (a missing or binary file, invalid YAML, a document that is not a mapping, an
invalid job, a busy rendezvous port, an env entry with valueFrom) gets one clear message on
stderr and a non-zero exit, never a traceback: 1 when the job breaks a rule (every broken rule
is listed), 2 when the input cannot be read or run here (see EXIT_*).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from ddpjob_operator.api import constants
from ddpjob_operator.local import command as local_run
from ddpjob_operator.render.objects import wanted_objects
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec, MAX_REPLICAS
from ddpjob_operator.api.validation import InvalidSpecError, MAX_DEPTH, parse_job
from ddpjob_operator.decide.creation import job_errors

# Exit codes: 1 = the job is invalid, 2 = the input could not be read at all.
EXIT_INVALID = 1
EXIT_BAD_INPUT = 2
# Stands in for the uid the API server assigns; rendered pods use it as the rdzv id.
DRY_RUN_UID = "dry-run-uid"
DISTRIBUTION = "ddpjob-operator"  # the package `ddpjob --version` reports (pyproject.toml's name)


class BadInput(Exception):
    """The input is not a DDPJob document we can read; the message says why and what to do."""


def load_job(path: str) -> dict[str, Any]:
    """The DDPJob document in ``path`` (a file, or - for stdin).

    A file of one document is the job, whatever its kind (validation then names a wrong kind
    or apiVersion); from several documents the one with kind DDPJob is taken.
    """
    documents = _documents(_read_text(path), path)
    if len(documents) == 1:
        job = documents[0]
        if not isinstance(job, dict):
            raise BadInput(f"{path} must hold a DDPJob: a mapping with apiVersion, kind, metadata and spec, "
                           f"not {_yaml_kind(job)}")
        return job
    jobs = [d for d in documents if isinstance(d, dict) and d.get("kind") == constants.KIND]
    if len(jobs) != 1:
        raise BadInput(f"{path} must hold exactly one document with kind: {constants.KIND} (found {len(jobs)})")
    return jobs[0]


def _read_text(path: str) -> str:
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path} is not a YAML text file: byte {e.start} (0x{data[e.start]:02x}) is not UTF-8") from None


class _KubectlLoader(yaml.SafeLoader):
    """PyYAML reading a file into what kubectl sends the API server.

    kubectl decodes YAML with go-yaml into untyped values, which keeps timestamps as strings
    (`2024-01-01` stays text), then encodes JSON with Go's encoder, which writes a whole float
    as an integer (`replicas: 2.0` arrives as 2). Without these two, `ddpjob validate` would
    refuse files the cluster accepts.
    """


_KubectlLoader.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _go_json_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float | int:
    value = loader.construct_yaml_float(node)
    return int(value) if value.is_integer() and abs(value) < 1e21 else value  # Go writes 1e21 up as 1e+21


_KubectlLoader.add_constructor("tag:yaml.org,2002:float", _go_json_float)


def _documents(text: str, path: str) -> list[Any]:
    try:
        return [d for d in yaml.load_all(text, Loader=_KubectlLoader) if d is not None]
    except yaml.YAMLError as e:
        raise BadInput(f"{path} is not valid YAML: {_yaml_problem(e)}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise BadInput(f"{path} is nested too deeply to read (a DDPJob is at most "
                       f"{MAX_DEPTH} levels deep)") from None


def _yaml_kind(value: Any) -> str:
    """What a parsed YAML document is, in YAML's words."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__} scalar"


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's problem and position on one line (its own text quotes the source over several)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark else problem


def validate(path: str, max_replicas: int) -> int:
    job = load_job(path)
    errors = job_errors(job, max_replicas)
    for error in errors:
        print(f"{path}: {error.message}", file=sys.stderr)
    if not errors:
        print(f"{path}: valid")
    return EXIT_INVALID if errors else 0


def parse_or_report(job: dict[str, Any], path: str) -> tuple[JobRef, DDPJobSpec] | None:
    """The parsed job, or None after printing every invalid field (one line each, prefixed by the file)."""
    try:
        return parse_job(job)
    except InvalidSpecError as e:
        for error in e.errors:
            print(f"{path}: {error.message}", file=sys.stderr)
        return None


def render(path: str, namespace: str | None) -> int:
    job = load_job(path)
    metadata = job.setdefault("metadata", {})
    if isinstance(metadata, dict):  # else validation reports it
        metadata.setdefault("uid", DRY_RUN_UID)
        if namespace:
            metadata["namespace"] = namespace
    parsed = parse_or_report(job, path)
    if parsed is None:
        return EXIT_INVALID
    ref, spec = parsed
    # The list the operator's plan creates from; the NetworkPolicy admits the operator's pods as
    # the chart's defaults select them, and the budget counts every pod Ready.
    text = yaml.safe_dump_all([o.body() for o in wanted_objects(ref, spec)], sort_keys=False)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `ddpjob render job.yaml | head`: the reader has what it wanted
        sys.stderr.close()
    return 0


def run(args: argparse.Namespace) -> int:
    job = load_job(args.job)
    parsed = parse_or_report(job, args.job)
    if parsed is None:
        return EXIT_INVALID
    ref, spec = parsed
    try:
        return local_run.execute(ref.name, spec, args, sys.stdout)
    except local_run.LocalRunError as e:
        raise BadInput(str(e)) from None


def version() -> str:
    """The installed ddpjob-operator version ("unknown" when run from a source tree, uninstalled)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def plain(text: str) -> str:
    """Docstring text without its reST markup (``code``, :func:`name`), as --help prints it."""
    return re.sub(r"(?::\w+:)?`+([^`]+)`+", r"\1", text)


def _max_replicas(text: str) -> int:
    """--max-replicas, bounded as the operator bounds its own flag."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"({value}) must be 1..{MAX_REPLICAS}, the CRD's own maximum")
    return value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="ddpjob", description=plain(__doc__.split("\n\n")[0]))
    top.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = top.add_subparsers(dest="command", required=True)
    check = commands.add_parser("validate", help="report every broken rule of a DDPJob")
    check.add_argument("job", help="DDPJob YAML file, or - for stdin")
    check.add_argument("--max-replicas", type=_max_replicas, default=constants.DEFAULT_MAX_REPLICAS, metavar="N",
                       help="the operator's --max-replicas: refuse replicas, minReplicas or maxReplicas above N "
                            "(default: %(default)s, the operator's default)")
    check.add_argument("--version", action="version", version=f"ddpjob {version()}")
    preview = commands.add_parser(
        "render", help="print the Services, Pods, NetworkPolicy and PodDisruptionBudget the operator would create")
    preview.add_argument("job", help="DDPJob YAML file, or - for stdin")
    preview.add_argument("--namespace", help="namespace to render into (default: the file's, else default)")
    local = commands.add_parser("run", help="run the job on this machine: one local torchrun agent per node")
    local_run.add_arguments(local)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "validate":
            return validate(args.job, args.max_replicas)
        if args.command == "run":
            return run(args)
        return render(args.job, args.namespace)
    except BadInput as e:
        print(f"ddpjob: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT

if __name__ == "__main__":
    sys.exit(main())
