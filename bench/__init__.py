"""Benchmarks: each module ``bench.<name>`` has a ``main()`` that measures side by side and prints a table."""
import sys
from pathlib import Path

# ddpjob_sandbox (the cluster on one machine, shared with the tests) is not installed: it lives in
# sandbox/ beside bench/, where pytest finds it through pyproject's `pythonpath`.
_SANDBOX = str(Path(__file__).resolve().parents[1] / "sandbox")
if _SANDBOX not in sys.path:
    sys.path.insert(0, _SANDBOX)
