"""The package's layers: folders on floors that import downwards only, no import cycle, the product never imports
its test support, and the math modules stay free of Flower."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


# --- the package's floors (docs/ARCHITECTURE.md) ---------------------------------------------------------------

#: The package's folders, from the bottom floor up: a folder's modules import from folders on lower floors (and
#: their own folder's) only. ``testing`` is test support, outside the product.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("engine", "registry", "metrics", "privacy"),
    ("methods", "aggregation"),
    ("testbed",),
    ("data",),
    ("config",),
    ("recording",),
    ("federation",),
    ("bench",),
    ("report",),
    ("running",),
    ("deploy", "plugins", "testing"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def module_imports(path: Path) -> set[str]:
    """The package's modules ``path`` imports, anywhere in it (inside functions too): ``from pkg import sub``
    counts as importing ``pkg.sub``, not ``pkg``'s ``__init__``."""
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            known = [".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in MODULES]
            found.update(known[:1])
    return found - {own}


def folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None


def test_at_most_four_modules_stay_at_the_packages_top():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 4, f"modules at the top of fedrapp_app/: {top}; each belongs in a folder named by its role"
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders == {name for floor in FLOORS for name in floor}, "a folder is missing from FLOORS (or gone)"


def test_no_import_cycle_between_modules():
    graph = {name: module_imports(path) for name, path in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep) :] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*path, dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_folders_import_only_from_lower_floors():
    floor_of = {name: i for i, floor in enumerate(FLOORS) for name in floor}
    upward = []
    for name, path in MODULES.items():
        here = folder(name)
        for dep in module_imports(path):
            there = folder(dep)
            if here and there and here != there and floor_of[there] >= floor_of[here]:
                upward.append(f"{name} -> {dep}")
    assert not upward, f"imports up or sideways between floors: {upward}"


def test_old_module_paths_import_with_a_warning_naming_the_new_one():
    import importlib
    import subprocess
    import sys

    import fedrapp_app
    from fedrapp_app.registry import parameters

    sys.modules.pop("fedrapp_app.parameters", None)
    with pytest.warns(DeprecationWarning, match="fedrapp_app.parameters moved to fedrapp_app.registry.parameters"):
        old = importlib.import_module("fedrapp_app.parameters")
    assert old is parameters
    for old_name, new_name in fedrapp_app.MOVED.items():
        assert new_name in MODULES, f"{old_name} points at {new_name}, which does not exist"
    ran = subprocess.run([sys.executable, "-m", "fedrapp_app.launch"], capture_output=True, text=True, timeout=60)
    assert ran.returncode != 0 and "run python -m fedrapp_app.running.launch" in ran.stderr
