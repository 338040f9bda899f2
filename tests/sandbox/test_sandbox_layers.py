"""ddpjob_sandbox stays a component: it never imports the tests or pytest, and its modules
depend one way, in the order its __init__ lists them (a module imports only those below it)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import ddpjob_sandbox

ROOT = Path(ddpjob_sandbox.__file__).parent
# The roles as the package docstring lists them, top (most dependent) first.
ORDER = re.findall(r"^    (\w+)/?\s{2,}", ddpjob_sandbox.__doc__, re.MULTILINE)


def role_of(module: str) -> str | None:
    """The role (first part after ddpjob_sandbox) of a dotted module, None outside the package."""
    parts = module.split(".")
    return parts[1] if parts[0] == "ddpjob_sandbox" and len(parts) > 1 else None


def imports_of(path: Path) -> list[tuple[str, int]]:
    """(dotted module, line) of every absolute import in the file, TYPE_CHECKING ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module, node.lineno))
    return found


MODULES = sorted(p for p in ROOT.rglob("*.py") if p != ROOT / "__init__.py")


def test_the_docstring_lists_every_role_once():
    roles = {p.relative_to(ROOT).parts[0].removesuffix(".py") for p in MODULES}
    assert sorted(ORDER) == sorted(roles)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_imports_neither_the_tests_nor_pytest_nor_a_role_above_its_own(path):
    own = path.relative_to(ROOT).parts[0].removesuffix(".py")
    for module, line in imports_of(path):
        where = f"{path.relative_to(ROOT)}:{line} imports {module}"
        assert module.split(".")[0] not in ("tests", "pytest"), where
        role = role_of(module)
        if role is not None and role != own:
            assert ORDER.index(role) > ORDER.index(own), f"{where}, which is not below {own} in the list"
