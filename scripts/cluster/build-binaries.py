#!/usr/bin/env python3
"""Builds the pinned Kubernetes control plane, etcd and helm from their Go modules.

The cluster test tier (tests/cluster/) and `make cluster` run a real
kube-apiserver, kube-controller-manager, kube-scheduler and etcd as local
processes (the way controller-runtime's envtest does), so they need those
binaries at one known release. Nothing of theirs is committed: this script
builds each missing binary once into a cache outside the clone, keyed by
version, and links it into .cluster/bin/. A fresh clone on the same machine, or
a second `make setup`, finds the cache and costs seconds.

Only the standard library and a Go toolchain are needed.

Usage: scripts/cluster/build-binaries.py [--cache DIR] [--link DIR] [--only NAME] [--kubernetes-version V]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# The newest Kubernetes release that builds with Go 1.26 (its go.mod says go 1.26.0).
KUBERNETES_VERSION = "v1.37.2"
# The newest etcd 3.6 patch release the Go module proxy serves.
ETCD_VERSION = "v3.6.16"
HELM_VERSION = "v3.22.0"

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = Path(os.environ.get("DDPJOB_CACHE", Path.home() / ".cache" / "ddpjob"))
DEFAULT_LINK_DIR = REPO / ".cluster" / "bin"

# A staging module as k8s.io/kubernetes's own go.mod replaces it:
#   k8s.io/api => ./staging/src/k8s.io/api
_STAGING_REPLACE = re.compile(r"^\s*(?:replace\s+)?(\S+)\s+=>\s+\./staging/src/(\S+)\s*$")


@dataclass(frozen=True)
class Build:
    """One `go build` of main packages from one pinned release.

    name is the cache folder (e.g. kubernetes-v1.37.2); binaries maps each
    output name to its main package.
    """

    name: str
    require: dict[str, str]
    binaries: dict[str, str]
    ldflags: list[str] = field(default_factory=list)
    replace: dict[str, str] = field(default_factory=dict)
    go_mod_extra: list[str] = field(default_factory=list)


def kubernetes_build(go: str, version: str = KUBERNETES_VERSION) -> Build:
    """The four Kubernetes binaries, with the staging modules replaced by their tags.

    k8s.io/kubernetes requires its staging modules (k8s.io/api, ...) at v0.0.0
    and points them at ./staging with `replace`; a dependency's replace lines are
    ignored by Go, so ours must name the published tag of each (v1.37.2 ->
    v0.37.2). They are read from the release's own go.mod, so a new staging
    module in a later release needs no edit here.
    """
    gomod = _download_gomod(go, "k8s.io/kubernetes", version)
    staging_tag = "v0." + version.split(".", 1)[1]
    major, minor = version.lstrip("v").split(".")[:2]
    stamps = {"gitVersion": version, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean"}
    # kubectl reports its own version from component-base and the client
    # library's from client-go; both default to v0.0.0-master otherwise.
    ldflags = [
        f"-X {pkg}.{key}={value}"
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for key, value in stamps.items()
    ]
    return Build(
        name=f"kubernetes-{version}",
        require={"k8s.io/kubernetes": version},
        binaries={b: f"k8s.io/kubernetes/cmd/{b}" for b in
                  ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")},
        ldflags=ldflags,
        replace={module: staging_tag for module in staging_modules(gomod)},
        # The release's `godebug` line sets the runtime defaults it was tested with.
        go_mod_extra=[line for line in gomod.splitlines() if line.startswith("godebug ")],
    )


def etcd_build() -> Build:
    """etcd (the server's main package is go.etcd.io/etcd/server/v3) and etcdctl."""
    return Build(
        name=f"etcd-{ETCD_VERSION}",
        require={"go.etcd.io/etcd/server/v3": ETCD_VERSION, "go.etcd.io/etcd/etcdctl/v3": ETCD_VERSION},
        binaries={"etcd": "go.etcd.io/etcd/server/v3", "etcdctl": "go.etcd.io/etcd/etcdctl/v3"},
        # No -X: etcd's version number is a constant of go.etcd.io/etcd/api/v3/version, so
        # `etcd --version` reads 3.6.16 as built; only the commit (GitSHA) would be a variable.
    )


def helm_build() -> Build:
    return Build(
        name=f"helm-{HELM_VERSION}",
        require={"helm.sh/helm/v3": HELM_VERSION},
        binaries={"helm": "helm.sh/helm/v3/cmd/helm"},
        ldflags=[f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
                 "-X helm.sh/helm/v3/internal/version.gitTreeState=clean"],
    )


def staging_modules(gomod: str) -> list[str]:
    """The modules a Kubernetes go.mod points at ./staging/src/, in file order.

    Raises:
        ValueError: the go.mod replaces none (the release layout changed).
    """
    modules = []
    for line in gomod.splitlines():
        match = _STAGING_REPLACE.match(line)
        if match and match.group(1) == match.group(2):
            modules.append(match.group(1))
    if not modules:
        raise ValueError("k8s.io/kubernetes go.mod: no `replace X => ./staging/src/X` line found")
    return modules


def wrapper_gomod(build: Build, go_directive: str) -> str:
    """The go.mod of the throwaway module that builds one release."""
    lines = [f"module ddpjob.local/cluster-binaries/{build.name}", "", f"go {go_directive}"]
    lines += build.go_mod_extra
    lines += ["", "require ("] + [f"\t{m} {v}" for m, v in build.require.items()] + [")"]
    if build.replace:
        lines += ["", "replace ("] + [f"\t{m} => {m} {v}" for m, v in build.replace.items()] + [")"]
    return "\n".join(lines) + "\n"


def _download_gomod(go: str, module: str, version: str) -> str:
    out = _run([go, "mod", "download", "-json", f"{module}@{version}"], cwd=tempfile.gettempdir())
    return Path(json.loads(out)["GoMod"]).read_text()


def _go_directive(go: str) -> str:
    # The local toolchain's version (go1.26.8 -> 1.26.8) so GOTOOLCHAIN=local never fetches another.
    return _run([go, "env", "GOVERSION"]).strip().removeprefix("go")


def _run(argv: list[str], cwd: str | Path | None = None, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"build-binaries: `{' '.join(argv)}` failed ({result.returncode}):\n"
                         f"{result.stderr[-4000:]}")
    return result.stdout


def build_missing(build: Build, go: str, cache: Path) -> Path:
    """Builds the binaries of one release unless its cache folder has them all."""
    bin_dir = cache / "bin" / build.name
    if all((bin_dir / b).is_file() for b in build.binaries):
        return bin_dir
    work = cache / "build" / build.name
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(wrapper_gomod(build, _go_directive(go)))
    env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS="-mod=mod -buildvcs=false")
    # Build into a fresh folder and rename it into place: a build killed half way
    # leaves no folder that looks complete.
    staging = Path(tempfile.mkdtemp(prefix=f".{build.name}-", dir=cache / "bin"))
    print(f"build-binaries: building {build.name} ({', '.join(build.binaries)}) into {bin_dir}", flush=True)
    for binary, package in build.binaries.items():
        _run([go, "build", "-trimpath", "-ldflags", " ".join(["-s", "-w", *build.ldflags]),
              "-o", str(staging / binary), package], cwd=work, env=env)
    staging.chmod(0o755)  # mkdtemp made it private; the binaries are for every user of the machine
    if bin_dir.exists():
        shutil.rmtree(bin_dir)
    staging.rename(bin_dir)
    return bin_dir


def link(bin_dir: Path, names: list[str], link_dir: Path) -> None:
    """Points link_dir/<name> at the cached binary (replacing an older link)."""
    link_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = link_dir / name
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to(bin_dir / name)


def find_go() -> str:
    for candidate in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and Path(candidate).is_file():
            return candidate
    raise SystemExit("build-binaries: no Go toolchain (set GO=/path/to/go or put go on PATH); "
                     "Go >= 1.26 builds Kubernetes " + KUBERNETES_VERSION)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--link", type=Path, default=DEFAULT_LINK_DIR)
    parser.add_argument("--only", choices=["kubernetes", "etcd", "helm"], action="append")
    parser.add_argument("--kubernetes-version", default=KUBERNETES_VERSION, help=(
        "another Kubernetes release to build (e.g. an older one to qualify: link it into its own --link "
        "directory and point the cluster tier at it with DDPJOB_CLUSTER_BIN)"))
    args = parser.parse_args(argv)
    go = find_go()
    (args.cache / "bin").mkdir(parents=True, exist_ok=True)
    factories = {"etcd": etcd_build, "helm": helm_build, "kubernetes": lambda: kubernetes_build(go, args.kubernetes_version)}
    for key in args.only or list(factories):
        build = factories[key]()
        link(build_missing(build, go, args.cache), list(build.binaries), args.link)
    print(f"build-binaries: {', '.join(sorted(p.name for p in args.link.iterdir()))} in {args.link}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
