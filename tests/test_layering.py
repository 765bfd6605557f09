"""The layering rules of CONTRIBUTING.md, read from the imports of every module:
``collectives/`` and ``pallas_kernels/`` never import ``jaxsmp``; ``jaxsmp/pipeline/``
and ``jaxsmp/context/`` never import ``jaxsmp.train``."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
RULES = [("collectives", "jaxsmp"), ("pallas_kernels", "jaxsmp"),
         ("jaxsmp/pipeline", "jaxsmp.train"), ("jaxsmp/context", "jaxsmp.train")]


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT).parent.parts)
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            names |= {module} | {f"{module}.{a.name}" for a in node.names}
    return names


def violations(directory: Path, forbidden: str) -> list[str]:
    return sorted(f"{path.relative_to(ROOT)} imports {name}"
                  for path in directory.rglob("*.py") for name in imported(path)
                  if name == forbidden or name.startswith(forbidden + "."))


@pytest.mark.parametrize("directory, forbidden", RULES, ids=lambda r: str(r))
def test_a_package_never_imports_what_its_layer_forbids(directory, forbidden):
    assert violations(ROOT / directory, forbidden) == []


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
