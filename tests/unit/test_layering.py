"""controller/ stays pure; imports go appliance -> bridge -> controller, never back."""

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
    "heapq",
    "itertools",
    "math",
    "random",  # seeded instances only (simulator noise); never the global one
    "tomllib",  # parses text handed in; the caller reads the file
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


@pytest.mark.parametrize("path", sources("bridge"), ids=lambda p: p.name)
def test_bridge_imports_controller_only(path):
    for line, name in imports(path):
        assert not name.startswith("santhrottle.appliance"), f"{path.name}:{line}"


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
