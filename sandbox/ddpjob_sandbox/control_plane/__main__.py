"""``python -m ddpjob_sandbox.control_plane up|down|status [--dir .cluster]``: what ``make cluster`` runs.

``up`` returns once the API server answers /readyz, the controller manager and the scheduler
/healthz, and the kubelets' three Nodes are Ready (hostPath volumes created), and prints how to
use it; ``down`` stops every process it started, the pods' included.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddpjob_sandbox.control_plane import DEFAULT_BIN_DIR, REPO
from ddpjob_sandbox.control_plane.cluster import down_cluster, up_cluster
from ddpjob_sandbox.control_plane.runner import ControlPlaneError, new_layout, running


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpjob_sandbox.control_plane", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=REPO / ".cluster", help="state folder (default: .cluster/)")
    parser.add_argument("--bin-dir", type=Path, default=DEFAULT_BIN_DIR)
    args = parser.parse_args(argv)
    root = args.dir.resolve()
    if args.command == "down":
        stopped, left = down_cluster(root)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        if left:
            print(f"make cluster-down: processes {left} survived SIGKILL", file=sys.stderr)
        return 1 if left else 0
    alive = running(root)
    if args.command == "status":
        print(f"running: {', '.join(alive) or 'nothing'}")
        return 0 if alive else 1
    if alive:
        print(f"already running ({', '.join(alive)}); `make cluster-down` stops it", file=sys.stderr)
        return 0
    down_cluster(root)  # a half-dead earlier cluster: stop what is left before starting anew
    layout = new_layout(root, args.bin_dir)
    try:
        up_cluster(layout)
    except ControlPlaneError as e:
        print(f"make cluster: {e}", file=sys.stderr)
        return 1
    print(f"cluster up: {layout.apiserver_url}\n  export KUBECONFIG={layout.kubeconfig('admin')}\n"
          f"  {layout.bin_dir / 'kubectl'} get nodes\nlogs in {layout.logs}; `make cluster-down` stops it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
