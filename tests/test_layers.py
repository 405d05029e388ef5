"""The package's layers (docs/architecture.md): every module imports only its own layer and the
layers below it, no import loop exists (imports inside functions count too), and the pure core
imports nothing but the standard library. Read from the source with ast: nothing is imported."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "multimaster"

#: lowest first; a module may import its own layer and every layer before it
LAYERS = ["errors", "core", "dialects", "config", "store", "engine", "spark", "ops", "api", "cli"]


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> str | None:
    """The layer of a multimaster module (None: the package's face, multimaster/__init__.py)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every multimaster import in `path`, resolved to absolute names."""
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("multimaster"):
                # `from pkg import sub` imports the submodule when there is one
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    out.append((node.lineno, sub if _exists(sub) else target))
            else:
                out.append((node.lineno, target))
    return out


def _exists(module: str) -> bool:
    p = PKG.parent.joinpath(*module.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


MODULES = {_module(p): p for p in sorted(PKG.rglob("*.py"))}


def test_every_module_is_in_a_known_layer():
    unknown = sorted(m for m in MODULES if _layer(m) is not None and _layer(m) not in LAYERS)
    assert not unknown, f"modules outside every layer of docs/architecture.md: {unknown}"


def test_no_module_imports_a_higher_layer():
    upward = []
    for mod, path in MODULES.items():
        mine = _layer(mod)
        if mine is None:
            continue
        for line, target in _imports(path):
            if not target.startswith("multimaster."):
                continue
            theirs = _layer(target)
            if theirs is not None and LAYERS.index(theirs) > LAYERS.index(mine):
                upward.append(f"{path.relative_to(PKG.parent)}:{line} ({mine}) imports {target} ({theirs})")
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


def test_the_package_face_imports_only_errors_and_config():
    """`import multimaster` stays light: the errors and the topology file's models."""
    targets = {t for _, t in _imports(PKG / "__init__.py") if t.startswith("multimaster")}
    assert all(_layer(t) in ("errors", "core", "dialects", "config") for t in targets), targets


def test_no_import_loop():
    graph = {m: {t for _, t in _imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}
    # a module's package __init__ runs before it: `a.b` importing `a` is not a loop of its own
    for m in graph:
        graph[m] = {t for t in graph[m] if not m.startswith(t + ".")}
    loops = _cycles(graph)
    assert not loops, "import loops:\n" + "\n".join(" -> ".join(c) for c in loops)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if _layer(m) == "core"))
def test_the_core_imports_only_the_standard_library(mod):
    bad = [
        t
        for _, t in _imports(MODULES[mod])
        if t.split(".")[0] not in sys.stdlib_module_names
        and not t.startswith(("multimaster.core", "multimaster.errors"))
        and t != "__future__"
    ]
    assert not bad, f"{mod} imports {bad}: the core is standard library only"


def test_the_checker_sees_an_upward_import(tmp_path):
    """The checks above can fail: a made-up core module importing the engine is caught."""
    fake = PKG / "core" / "_layers_probe.py"
    assert not fake.exists()
    try:
        fake.write_text("from multimaster.engine.site import Site\n")
        mod = _module(fake)
        ups = [t for _, t in _imports(fake) if LAYERS.index(_layer(t)) > LAYERS.index(_layer(mod))]
        assert ups == ["multimaster.engine.site"]
        assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    finally:
        fake.unlink()
