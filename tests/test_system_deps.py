"""Every program a test runs is installed by the project's own files.

CI runs on a machine that may have had programs installed by hand, so a green run
can hide a missing install step (etcdctl did: 7 tests failed on a fresh clone).
This reads the code of the tests, the sandbox and the benchmarks for the programs they start and checks each one is
either in the venv (a pip dependency) or in scripts/install-system-deps.sh.
"""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSTALL_SCRIPT = ROOT / "scripts" / "install-system-deps.sh"
SCANNED = ("tests", "bench", "sandbox")
SUBPROCESS_CALLS = {"run", "Popen", "check_call", "check_output", "call", "create_subprocess_exec"}


def system_programs() -> set[str]:
    listed = subprocess.run(["bash", str(INSTALL_SCRIPT), "--list"], capture_output=True, text=True, check=True)
    return set(listed.stdout.split())


def _program_name(node: ast.AST) -> str | None:
    """The bare program name a literal argv starts with, if it is one."""
    if isinstance(node, ast.List | ast.Tuple) and node.elts:
        node = node.elts[0]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        name = node.value
        if name and "/" not in name and " " not in name and not name.startswith("-"):
            return name
    return None


def programs_called(path: Path) -> set[str]:
    """Programs named in ``shutil.which("x")``, or as argv[0] of a subprocess call
    or of a list assigned to a name that is later passed to one."""
    tree = ast.parse(path.read_text(), filename=str(path))
    argv_lists = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if (name := _program_name(node.value)) and isinstance(node.value, ast.List):
                argv_lists[node.targets[0].id] = name
    found = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        first = node.args[0]
        if node.func.attr == "which" or (node.func.attr in SUBPROCESS_CALLS and isinstance(first, ast.List)):
            if name := _program_name(first):
                found.add(name)
        elif node.func.attr in SUBPROCESS_CALLS and isinstance(first, ast.Name) and first.id in argv_lists:
            found.add(argv_lists[first.id])
    return found


def test_the_scanner_finds_a_program_started_through_an_argv_variable(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('import subprocess\ncommand = ["etcdctl", "get"]\nsubprocess.run(command)\n')
    assert programs_called(sample) == {"etcdctl"}


def test_every_program_a_test_runs_is_installed_by_the_project():
    venv_bin = Path(sys.executable).parent
    provided = system_programs() | {"bash", "sh", "python", "python3"}
    missing = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for program in programs_called(path) - provided:
                if not (venv_bin / program).exists():
                    missing.setdefault(program, []).append(str(path.relative_to(ROOT)))
    assert not missing, f"programs the tests run that no install step provides: {missing}; add them to {INSTALL_SCRIPT.name}"


def test_the_install_script_lists_etcd_and_its_client_separately():
    assert {"etcd", "etcdctl"} <= system_programs()
