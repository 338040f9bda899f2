"""scripts/cluster/build-binaries.py: the wrapper module it builds Kubernetes through.

Pure checks of what it derives from a release's go.mod; the build itself is `make
cluster-binaries` (its time and memory are in the README's Testing part).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster" / "build-binaries.py"
_spec = importlib.util.spec_from_file_location("build_binaries", SCRIPT)
build_binaries = importlib.util.module_from_spec(_spec)
sys.modules["build_binaries"] = build_binaries  # dataclasses look their module up there
_spec.loader.exec_module(build_binaries)

KUBERNETES_GOMOD = """\
module k8s.io/kubernetes

go 1.26.0

godebug default=go1.26

require (
\tk8s.io/api v0.0.0
\tk8s.io/streaming v0.0.0
\tsigs.k8s.io/yaml v1.6.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/streaming => ./staging/src/k8s.io/streaming
)

replace github.com/example/fork => github.com/other/fork v1.0.0
"""


def test_the_staging_modules_are_read_from_the_release_go_mod():
    assert build_binaries.staging_modules(KUBERNETES_GOMOD) == ["k8s.io/api", "k8s.io/streaming"]


def test_a_go_mod_without_staging_replaces_is_refused_by_name():
    with pytest.raises(ValueError, match=r"no `replace X => \./staging/src/X` line"):
        build_binaries.staging_modules("module k8s.io/kubernetes\n\ngo 1.26.0\n")


def test_the_wrapper_replaces_each_staging_module_by_its_published_tag():
    build = build_binaries.Build(name="kubernetes-v1.37.2", require={"k8s.io/kubernetes": "v1.37.2"},
                                 binaries={}, replace={"k8s.io/api": "v0.37.2"},
                                 go_mod_extra=["godebug default=go1.26"])
    assert build_binaries.wrapper_gomod(build, "1.26.8").splitlines() == [
        "module ddpjob.local/cluster-binaries/kubernetes-v1.37.2", "", "go 1.26.8", "godebug default=go1.26",
        "", "require (", "\tk8s.io/kubernetes v1.37.2", ")",
        "", "replace (", "\tk8s.io/api => k8s.io/api v0.37.2", ")",
    ]
