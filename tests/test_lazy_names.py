"""A name imported only under ``if TYPE_CHECKING:`` exists for the type checker alone: used at run
time it is a NameError that mypy cannot see (it reads those imports as real). The command modules
import ``Path``, ``Any`` and the like that way so that `envbuild COMMAND --help` stays cheap
(tests/test_help_fast.py), and each function imports what it uses. Three functions merged from
separate branches used ``Path`` without importing it; this walks every module of the package and
names each such use."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "envbuild"


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _bound(node: ast.AST) -> set[str]:
    """Every name ``node`` binds: imports, assignments, arguments, definitions."""
    names: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
    return names


def _annotations(tree: ast.AST) -> set[int]:
    """The nodes inside annotations (never evaluated: every module has postponed annotations)."""
    inside: set[int] = set()
    for n in ast.walk(tree):
        found: list[ast.expr | None] = []
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = n.args
            found += [n.returns, *(a.annotation for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                                         args.vararg, args.kwarg] if a is not None)]
        elif isinstance(n, ast.AnnAssign):
            found.append(n.annotation)
        for annotation in found:
            if annotation is not None:
                inside.update(id(x) for x in ast.walk(annotation))
    return inside


def runtime_uses_of_type_only_names(source: str) -> list[tuple[int, str]]:
    """(line, name) for each run-time use of a name only a TYPE_CHECKING block imports."""
    tree = ast.parse(source)
    only_typed: set[str] = set()
    for node in tree.body:
        if _is_type_checking(node):
            only_typed |= _bound(node)
    for node in tree.body:
        if not _is_type_checking(node) and isinstance(
                node, (ast.Import, ast.ImportFrom, ast.Assign, ast.FunctionDef, ast.ClassDef)):
            defined = {node.name} if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else _bound(node)
            only_typed -= defined
    if not only_typed:
        return []
    annotations = _annotations(tree)
    found = []
    for node in tree.body:
        if _is_type_checking(node):
            continue
        scopes = [node] if not isinstance(node, ast.ClassDef) else node.body
        for scope in scopes:
            local = _bound(scope) if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
            for n in ast.walk(scope):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in only_typed \
                        and n.id not in local and id(n) not in annotations:
                    found.append((n.lineno, n.id))
    return sorted(set(found))


def test_no_module_uses_a_type_only_name_at_run_time() -> None:
    problems = [f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
                for path in sorted(PACKAGE.rglob("*.py"))
                for line, name in runtime_uses_of_type_only_names(path.read_text(encoding="utf-8"))]
    assert problems == []


def test_the_walk_finds_a_use_the_type_checker_cannot() -> None:
    source = ("from __future__ import annotations\nTYPE_CHECKING = False\nif TYPE_CHECKING:\n"
              "    from pathlib import Path\n\n\ndef f(p: Path) -> Path:\n    return Path(p)\n\n\n"
              "def g(p: str) -> Path:\n    from pathlib import Path\n\n    return Path(p)\n")
    assert runtime_uses_of_type_only_names(source) == [(8, "Path")]
