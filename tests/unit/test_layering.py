"""Dependency arrows point one way (STYLE.md): checked on the source, import by import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "renderctl"


def imported_roots(path: Path) -> set[str]:
    """Top-level package names a module imports, anywhere in it (lazy imports included)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


CORE = sorted(p for p in PKG.rglob("*.py") if "cli" not in p.relative_to(PKG).parts)
NOT_RENDER = sorted(p for p in CORE if "render" not in p.relative_to(PKG).parts
                    and p.name != "worker.py")


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(PKG)))
def test_the_core_never_imports_the_cli_libraries(path: Path) -> None:
    assert imported_roots(path) & {"typer", "rich", "click"} == set()


@pytest.mark.parametrize("path", NOT_RENDER, ids=lambda p: str(p.relative_to(PKG)))
def test_only_renderers_and_the_worker_import_reportlab_or_pypdf(path: Path) -> None:
    assert imported_roots(path) & {"reportlab", "pypdf"} == set()


def test_the_cli_does_not_import_renderer_modules_at_module_level() -> None:
    # `renderctl --help` must start fast: the CLI may import renderers only inside commands.
    for path in (PKG / "cli").glob("*.py"):
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in top if isinstance(n, ast.ImportFrom)}
        assert not {m for m in names if m.startswith(("reportlab", "pypdf",
                                                      "renderctl.render.invoice",
                                                      "renderctl.render.report",
                                                      "renderctl.render.pdfops"))}, path
