"""The package's layers: the product never imports its test support, and the math modules stay free of Flower."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fedrapp_app"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports (absolute names; ``from . import x`` resolved against its package)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def product_files() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "testing" not in p.relative_to(PACKAGE).parts]


def test_nothing_in_the_product_imports_the_test_support():
    offenders = [
        str(p.relative_to(PACKAGE.parent))
        for p in product_files()
        if any(m == "fedrapp_app.testing" or m.startswith("fedrapp_app.testing.") for m in imported_modules(p))
    ]
    assert not offenders, f"the product imports fedrapp_app.testing: {offenders}"
    assert (PACKAGE / "testing" / "cuda_emulation.py").is_file() and not (
        PACKAGE / "engine" / "cuda_emulation.py"
    ).exists()


def test_the_server_rules_are_numpy_math():
    """Rules are math: no torch anywhere, and FedRAPP's rule and its trust layer without Flower either, so they are
    tested (and read) on their own. (robust.py reuses Flower's own numpy implementations of Krum and the trimmed
    mean.)"""
    for path in (PACKAGE / "aggregation").glob("*.py"):
        heavy = {m for m in imported_modules(path) if m.split(".")[0] in ("torch", "transformers")}
        if path.name in ("fedrapp.py", "trust.py", "common.py"):
            heavy |= {m for m in imported_modules(path) if m.split(".")[0] == "flwr"}
        assert not heavy, f"{path.name} imports {sorted(heavy)}"
