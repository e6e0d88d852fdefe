"""The package's shape: every module imports on its own, no import circle, and only the
commands layer reads argv (argparse), prints and exits.

Circles creep in one lazy import at a time and only fail when a module happens to be
imported first, so each module is imported alone in a fresh interpreter's module table,
and the import graph (module-level and function-level imports alike) is checked for
cycles.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "envbuild"
# The standalone smoke payload runs inside images with its own entry point (argparse there).
PAYLOAD = "envbuild.smoke"


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    return names


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The envbuild modules ``name`` imports anywhere in its body (lazily or not)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def test_every_module_imports_on_its_own() -> None:
    names = [n for n in module_names() if not n.endswith("__main__")]
    probe = (
        "import importlib, sys\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    for loaded in [m for m in sys.modules if m == 'envbuild' or m.startswith('envbuild.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print('\\n'.join(failed))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, *names], capture_output=True, text=True,
                          check=True, cwd=PACKAGE.parent, timeout=300)
    assert done.stdout.strip() == "", done.stdout


def test_no_import_circle() -> None:
    known = module_names()
    graph = {name: {t for t in imports_of(name, path, known)
                    # importing a package's __init__ is how a wing is reached, not a cycle
                    if known[t].name != "__init__.py"}
             for name, path in known.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_only_the_commands_layer_reads_argv() -> None:
    known = module_names()
    leaks = []
    for name, path in known.items():
        if name.startswith("envbuild.commands") or name == "envbuild.__main__":
            continue
        if name.startswith(f"{PAYLOAD}.") and name.endswith("__main__"):
            continue  # the payload's own command line
        if any(t.startswith("envbuild.commands") for t in imports_of(name, path, known)):
            leaks.append(f"{name} imports the commands layer")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names)) or \
                    (isinstance(node, ast.ImportFrom) and node.module == "argparse"):
                leaks.append(f"{name} imports argparse")
    assert leaks == []


@pytest.mark.parametrize("limit", [900])
def test_layout_has_wings_and_no_giant_module(limit: int) -> None:
    known = module_names()
    flat = [n for n, p in known.items() if p.parent == PACKAGE and p.name != "__init__.py"]
    wings = {p.parent for p in known.values() if p.parent != PACKAGE}
    assert len(flat) <= 8, flat
    assert len(wings) >= 4, wings
    sizes = {n: len(p.read_text(encoding="utf-8").splitlines()) for n, p in known.items()}
    assert {n: s for n, s in sizes.items() if s > limit} == {}
