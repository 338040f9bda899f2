"""The corpus of invalid DDPJobs (tests/operator/corpus/*.yaml), read into cases.

Each file is one DDPJob as a user would write it, after a comment header:

    # What is wrong, in a few words.
    # layer: crd | apiserver | operator
    # crd: schema <path> | list-map <path> | cel <message>     (crd cases only)
    # message: <the exact message the operator and `ddpjob validate` print>   (one line each, in order)

`layer` is the earliest layer that must refuse the job: `crd` (our CRD's schema or CEL rules,
at `kubectl apply`), `apiserver` (the API server's own checks, before our CRD runs: routing by
apiVersion/kind, object names, the size of what etcd stores) or `operator` (nothing refuses it
at apply; the operator reports InvalidSpec). `crd` names how the CRD refuses it: a schema error
at a JSON path, a duplicate in a list map, or a CEL rule by its message.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).parent / "corpus"
LAYERS = ("crd", "apiserver", "operator")


@dataclass(frozen=True)
class Case:
    """One corpus file: the job and what must refuse it."""

    name: str  # the file name without .yaml
    path: Path
    about: str
    layer: str
    crd: tuple[str, str] | None  # (schema | list-map | cel, path or message)
    messages: tuple[str, ...]

    def document(self) -> dict[str, Any]:
        """The job as kubectl would send it (a fresh copy on each call)."""
        from ddpjob_operator.cli import load_job

        return load_job(str(self.path))


def _header(path: Path) -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {"about": []}
    for line in path.read_text().splitlines():
        if not line.startswith("# "):
            break
        key, sep, value = line[2:].partition(": ")
        if sep and key in ("layer", "crd", "message"):
            fields.setdefault(key, []).append(value)
        else:
            fields["about"].append(line[2:])
    return fields


def load_case(path: Path) -> Case:
    """A Case from one corpus file; a malformed header fails here, naming the file."""
    fields = _header(path)
    (layer,) = fields.get("layer", [None])
    assert layer in LAYERS, f"{path.name}: layer must be one of {LAYERS}, not {layer!r}"
    crd = None
    if "crd" in fields:
        how, _, what = fields["crd"][0].partition(" ")
        assert how in ("schema", "list-map", "cel") and what, f"{path.name}: bad crd line {fields['crd']}"
        crd = (how, what)
    assert (crd is not None) == (layer == "crd"), f"{path.name}: a crd line goes with layer crd, and only there"
    assert fields.get("message"), f"{path.name}: no message line"
    return Case(path.stem, path, " ".join(fields["about"]), layer, crd, tuple(fields["message"]))


def load_corpus() -> list[Case]:
    """Every case, sorted by file name."""
    return [load_case(p) for p in sorted(CORPUS.glob("*.yaml"))]
