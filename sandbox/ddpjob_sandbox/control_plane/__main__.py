"""``python -m ddpjob_sandbox.control_plane up|down|status [--dir .cluster]``: what ``make cluster`` runs.

``up`` returns once the API server answers /readyz and the controller manager and the
scheduler /healthz, and prints how to use it; ``down`` stops every process it started.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddpjob_sandbox.control_plane import DEFAULT_BIN_DIR, REPO
from ddpjob_sandbox.control_plane.runner import ControlPlaneError, down, new_layout, running, up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpjob_sandbox.control_plane", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=REPO / ".cluster", help="state folder (default: .cluster/)")
    parser.add_argument("--bin-dir", type=Path, default=DEFAULT_BIN_DIR)
    args = parser.parse_args(argv)
    root = args.dir.resolve()
    if args.command == "down":
        stopped = down(root)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    alive = running(root)
    if args.command == "status":
        print(f"running: {', '.join(alive) or 'nothing'}")
        return 0 if alive else 1
    if alive:
        print(f"already running ({', '.join(alive)}); `make cluster-down` stops it", file=sys.stderr)
        return 0
    down(root)  # a half-dead earlier cluster: stop what is left before starting anew
    layout = new_layout(root, args.bin_dir)
    try:
        up(layout)
    except ControlPlaneError as e:
        print(f"make cluster: {e}", file=sys.stderr)
        return 1
    print(f"cluster up: {layout.apiserver_url}\n  export KUBECONFIG={layout.kubeconfig('admin')}\n"
          f"  {layout.bin_dir / 'kubectl'} get --raw /readyz\nlogs in {layout.logs}; `make cluster-down` stops it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
