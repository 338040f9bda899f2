"""Runs every benchmark module in ``bench/`` (or those named on the command line) and prints their tables."""
import importlib
import pkgutil
import sys

import bench


def main(argv: list[str]) -> int:
    names = argv or sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        if not hasattr(module, "main"):
            continue
        print(f"\n== bench.{name} ==", flush=True)
        module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
