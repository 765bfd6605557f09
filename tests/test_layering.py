"""The layering rules of CONTRIBUTING.md, read from the imports of every module:
``collectives/`` and ``pallas_kernels/`` never import ``jaxsmp``; ``jaxsmp/pipeline/``
and ``jaxsmp/context/`` never import ``jaxsmp.train``; no two modules import each other,
directly or round a longer cycle, at any depth (an import inside a function counts)."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
RULES = [("collectives", "jaxsmp"), ("pallas_kernels", "jaxsmp"),
         ("jaxsmp/pipeline", "jaxsmp.train"), ("jaxsmp/context", "jaxsmp.train")]
OURS = ("jaxsmp", "collectives", "pallas_kernels")


def imports(path: Path) -> list[tuple[str, list[str] | None]]:
    """``(module, names)`` of every import in ``path`` at any depth (relative imports
    resolved; ``names`` None for a plain ``import module``)."""
    package = ".".join(path.relative_to(ROOT).parent.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            found.append((module, [a.name for a in node.names]))
    return found


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth, and every ``module.name`` it takes."""
    names = set()
    for module, taken in imports(path):
        names |= {module} | {f"{module}.{name}" for name in taken or ()}
    return names


def violations(directory: Path, forbidden: str) -> list[str]:
    return sorted(f"{path.relative_to(ROOT)} imports {name}"
                  for path in directory.rglob("*.py") for name in imported(path)
                  if name == forbidden or name.startswith(forbidden + "."))


@pytest.mark.parametrize("directory, forbidden", RULES, ids=lambda r: str(r))
def test_a_package_never_imports_what_its_layer_forbids(directory, forbidden):
    assert violations(ROOT / directory, forbidden) == []


def unit(name: str) -> str:
    """The architecture table's unit of a module name or path: ``collectives``,
    ``pallas_kernels``, a ``jaxsmp`` subpackage or root module, or ``jaxsmp`` itself."""
    parts = name.replace("/", ".").removesuffix(".py").split(".")
    return parts[1] if parts[0] == "jaxsmp" and len(parts) > 1 else parts[0]


def architecture_table() -> dict[str, set[str] | None]:
    """docs/architecture.md's table: unit -> the units it may import (None: any)."""
    allowed = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = line.split("|")
        if len(cells) != 5 or not cells[1].strip().startswith("`"):
            continue
        units = [unit(u.strip("/")) for u in re.findall(r"`([^`]+)`", cells[1])]
        may = (None if "everything" in cells[3]
               else {unit(u) for u in re.findall(r"`([^`]+)`", cells[3])})
        allowed.update({u: may for u in units})
    return allowed


def imported_units(path: Path) -> set[str]:
    """The units ``path`` imports at any depth: ``from a import b`` counts ``a.b`` where
    that is a module, else ``a`` (``from jaxsmp import step`` uses the front)."""
    names = set()
    for module, taken in imports(path):
        names |= {module} if taken is None else {
            f"{module}.{name}" if _is_module(f"{module}.{name}") else module for name in taken}
    return {unit(n) if n != "jaxsmp" else "jaxsmp" for n in names if n.split(".")[0] in OURS}


def _is_module(name: str) -> bool:
    base = ROOT / Path(*name.split("."))
    return base.is_dir() or base.with_suffix(".py").exists()


def architecture_violations(table: dict) -> list[str]:
    found = []
    for path in (p for package in OURS for p in (ROOT / package).rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.name == "__main__.py" or relative == Path("jaxsmp/__init__.py"):
            continue  # entry points and the package's front: anything
        own = unit(str(relative))
        assert own in table, f"{relative}: no row of docs/architecture.md's table"
        may = table[own]
        found += [f"{relative} imports {u}" for u in imported_units(path)
                  if u != own and may is not None and u not in may]
    return sorted(found)


def test_every_import_is_one_the_architecture_table_allows():
    assert architecture_violations(architecture_table()) == []


def test_the_table_check_sees_an_import_the_table_does_not_list():
    table = architecture_table()
    assert table["pipeline"] == {"checks", "nn", "pallas_kernels"}
    assert table["cli"] is None and table["collectives"] == set()
    narrowed = {**table, "plan": table["plan"] - {"train"}}
    assert "jaxsmp/plan/memory.py imports train" in architecture_violations(narrowed)


def test_the_check_sees_plain_relative_and_nested_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    pkg = tmp_path / "jaxsmp" / "pipeline"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("import jaxsmp.train.step\n")
    (pkg / "b.py").write_text("def f():\n    from ..train import options\n")
    (pkg / "c.py").write_text("from jaxsmp.nn import param\nfrom . import a\n")
    assert violations(pkg, "jaxsmp.train") == [
        "jaxsmp/pipeline/a.py imports jaxsmp.train.step",
        "jaxsmp/pipeline/b.py imports jaxsmp.train",
        "jaxsmp/pipeline/b.py imports jaxsmp.train.options"]


PACKAGES = ("jaxsmp", "collectives", "pallas_kernels")


def module_file(name: str) -> Path | None:
    base = ROOT / Path(*name.split("."))
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.exists()),
                None)


def module_imports(path: Path) -> set[Path]:
    """The modules ``path`` imports at any depth: for ``from a import b`` the module
    ``a.b`` if it is one, else ``a``. Package ``__init__`` files are left out: they
    gather a package's names, and every module of the package reaches them."""
    found = set()
    for name in imported(path):
        parent, _, last = name.rpartition(".")
        f = module_file(name) or (module_file(parent) if parent and last else None)
        if f is not None and f.name != "__init__.py" and f != path:
            found.add(f)
    return found


def import_cycles(files: list[Path]) -> list[list[str]]:
    """Strongly connected groups of more than one module in the import graph."""
    graph = {f: module_imports(f) for f in files if f.name != "__init__.py"}
    order, low, stack, cycles = {}, {}, [], []

    def visit(v):  # Tarjan's algorithm
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group = [stack.pop()]
            while group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(str(f.relative_to(ROOT)) for f in group))
    for v in graph:
        if v not in order:
            visit(v)
    return cycles


def test_no_module_imports_itself_round_a_cycle():
    files = [f for package in PACKAGES for f in (ROOT / package).rglob("*.py")]
    assert import_cycles(files) == []


def test_the_cycle_check_sees_an_import_inside_a_function(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    pkg = tmp_path / "jaxsmp" / "pipeline"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from jaxsmp.pipeline.a import f\n")
    (pkg / "a.py").write_text("from jaxsmp.pipeline.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from jaxsmp.pipeline import a\n")
    (pkg / "c.py").write_text("from jaxsmp.pipeline import a\n")
    assert import_cycles(list(pkg.glob("*.py"))) == [
        ["jaxsmp/pipeline/a.py", "jaxsmp/pipeline/b.py"]]
