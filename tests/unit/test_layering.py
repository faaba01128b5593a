"""controller/ stays pure (no I/O, no clock: the standard library it may use is listed); the
appliance's imports are absolute; rooms stay small; every package is in the distribution.
Which package imports which is the import contracts' (pyproject.toml's [tool.importlinter],
tests/unit/test_import_contracts.py)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
# What pure control logic may use: no I/O, no clock, no processes, no sockets.
CONTROLLER_ALLOWED = {
    "__future__",
    "bisect",
    "collections",
    "dataclasses",
    "enum",
    "functools",
    "itertools",
    "math",
    "typing",
}
NO_CALLS = {"open", "print", "input", "exec", "eval"}


def imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, "." * node.level + (node.module or "")))
    return out


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", sources("controller"), ids=lambda p: p.name)
def test_controller_is_pure(path):
    for line, name in imports(path):
        if name.startswith("."):
            continue
        assert name.split(".")[0] in CONTROLLER_ALLOWED, f"{path.name}:{line} imports {name}"
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in NO_CALLS, f"{path.name}:{node.lineno} calls {node.func.id}"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            # the module-level RNG is hidden global state
            assert not (node.value.id == "random" and node.attr != "Random"), (
                f"{path.name}:{node.lineno} uses random.{node.attr}"
            )


@pytest.mark.parametrize("path", sources("appliance"), ids=lambda p: str(p.relative_to(ROOT)))
def test_appliance_imports_are_absolute(path):
    """Absolute imports name the room they reach (the import contracts check the rooms)."""
    for line, name in imports(path):
        assert not name.startswith("."), f"{path.relative_to(ROOT)}:{line}: relative import {name}"


def test_the_checks_see_the_code():
    # guard against a glob that silently matches nothing
    assert len(sources("controller")) >= 8


def test_every_code_package_is_in_the_distribution():
    """A subpackage missing from pyproject's `packages` works in the editable
    install and is silently absent from the wheel."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(data["tool"]["setuptools"]["packages"])
    mapping = data["tool"]["setuptools"]["package-dir"]
    found = set()
    for pkg, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([pkg, *rel.parts]))
    assert found == listed


# Small rooms: a module over ~500 lines or a class over ~300 has more than one job.
MODULE_MAX_LINES = 500
CLASS_MAX_LINES = 300
# A room with one job whatever its length, and why (never split only to get under a number).
ONE_JOB = {
    "appliance/config/schema.py": "one table: every configuration key, its Kind, default "
    "and documentation, each written out as the formatter writes it",
}


@pytest.mark.parametrize(
    "path",
    [p for folder in ("appliance", "controller", "sim", "bridge") for p in sources(folder)],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_small_rooms(path):
    text = path.read_text()
    if str(path.relative_to(ROOT)) not in ONE_JOB:
        assert text.count("\n") <= MODULE_MAX_LINES, f"{path.name}: {text.count(chr(10))} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            assert n <= CLASS_MAX_LINES, f"{path.name}: class {node.name} has {n} lines"
