"""Runs every benchmark module in ``bench/`` (or those named on the command line) and prints their tables.

    python -m bench                                   # all of them
    python -m bench operator_scale --jobs 100,300     # one, with its own flags after its name
"""
import importlib
import inspect
import pkgutil
import sys

import bench


def main(argv: list[str]) -> int:
    names = [a for a in argv if not a.startswith("-")][:1] if any(a.startswith("-") for a in argv) else argv
    flags = argv[1:] if names and len(argv) > 1 and argv[1].startswith("-") else []
    names = names or sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        if not hasattr(module, "main"):
            continue
        print(f"\n== bench.{name} ==", flush=True)
        if flags and inspect.signature(module.main).parameters:
            module.main(flags)
        else:
            module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
