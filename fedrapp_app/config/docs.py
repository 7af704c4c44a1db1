"""The run config's documents, written from the groups' keys (``schema.KEYS``): the README's table of everyday keys,
docs/configuration.md (every key, by group) and ``pyproject.toml``'s ``[tool.flwr.app.config]`` block.

    python -m fedrapp_app.config --sync        # rewrite all three (after adding or changing a key)
    python -m fedrapp_app.config               # print the README's table (--pyproject: the block)

A test checks that the three agree with the code.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from fedrapp_app.config.keys import Key, toml_literal
from fedrapp_app.config.schema import EVERYDAY, GROUPS, KEYS


def markdown_table(keys: tuple[Key, ...] | None = None) -> str:
    """A configuration table of ``keys`` (default: the everyday keys, the README's table)."""
    rows = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    for k in EVERYDAY if keys is None else keys:
        text = k.help.replace("|", "\\|")
        rows.append(f"| `{k.name}` | `{toml_literal(k.default)}` | {k.allowed()} | {text} |")
    return "\n".join(rows)


def _wrapped(text: str, width: int = 115) -> str:
    """A paragraph of the page as lines of at most ``width`` characters (words kept whole)."""
    return "\n".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False))


def reference_page() -> str:
    """docs/configuration.md: every key, by group (``python -m fedrapp_app.config --sync`` writes it)."""
    parts = [
        "# Configuration reference",
        "",
        "<!-- Generated from fedrapp_app/config/ by `python -m fedrapp_app.config --sync`; do not edit. -->",
        "",
        _wrapped(
            "Every key of a run, by group. The keys in **bold** are the everyday ones: the README shows them and "
            "`pyproject.toml` lists them first, with their meaning; the others follow there without comments. "
            "All of them are set the same way, for `fedrapp-sim` and plain `flwr run` alike: "
            '`-c "key=value key2=value2"` (strings in single quotes: `-c "strategy=\'fedavg\'"`) or '
            "`-c file.toml` (one file, its keys at the top level, as in `pyproject-run.toml`). Flower refuses a "
            "key that is not declared in `[tool.flwr.app.config]`, which is why every key is declared there. A bad "
            "value, an unknown key or two keys that contradict each other fail before any model or data is loaded, "
            "with one message naming the key and the fix."
        ),
        "",
        _wrapped(
            "A developer who adds or changes a key edits its group's module in `fedrapp_app/config/` (`run.py`, "
            "`data.py`, ...: the key, its default, range and meaning, and the checks that involve it) and runs "
            "`python -m fedrapp_app.config --sync`, which rewrites this page, the README's table and "
            "`pyproject.toml`'s block (a test checks that the three agree with the code)."
        ),
        "",
    ]
    for name, purpose in GROUPS:
        keys = tuple(k for k in KEYS if k.group == name)
        parts += [f"## {name[0].upper()}{name[1:]}: {purpose}", "", markdown_table(keys), ""]
    text = "\n".join(parts)
    for k in EVERYDAY:
        text = text.replace(f"| `{k.name}` |", f"| **`{k.name}`** |", 1)
    return text


def pyproject_block() -> str:
    """The ``[tool.flwr.app.config]`` table (``python -m fedrapp_app.config --pyproject`` prints it)."""
    lines = [
        "[tool.flwr.app.config]",
        '# Override any key with `flwr run . -c "key=value ..."` or `-c file.toml` (also `fedrapp-sim -c ...`).',
        "# ---- the everyday keys (the README's table), by group",
    ]
    for name, _ in GROUPS:
        everyday = [k for k in EVERYDAY if k.group == name]
        lines += [f"# {name}"] if everyday else []
        for k in everyday:
            assignment = f"{k.name} = {toml_literal(k.default)}"
            lines.append(assignment.ljust(max(len(assignment) + 2, 30)) + f"# {k.help}")
    lines.append("# ---- the advanced keys, by group: docs/configuration.md says what each does")
    for name, _ in GROUPS:
        advanced = [k for k in KEYS if k.group == name and not k.everyday]
        lines += [f"# {name}"] if advanced else []
        lines += [f"{k.name} = {toml_literal(k.default)}" for k in advanced]
    return "\n".join(lines)


def sync_docs(root: Path) -> None:
    """Rewrite README.md's configuration table, docs/configuration.md and pyproject.toml's config block from
    ``KEYS`` (for developers who add or change a key: ``python -m fedrapp_app.config --sync``; a test checks that
    they agree)."""
    import re

    readme = root / "README.md"
    table = re.compile(r"\| key \| default \| allowed \| meaning \|\n\|---\|---\|---\|---\|\n(\|.*\|\n)+")
    readme.write_text(table.sub(lambda _: markdown_table() + "\n", readme.read_text()))
    (root / "docs" / "configuration.md").write_text(reference_page())
    pyproject = root / "pyproject.toml"
    block = re.compile(r"\[tool\.flwr\.app\.config\]\n.*?\n\n", re.S)
    pyproject.write_text(block.sub(lambda _: pyproject_block() + "\n\n", pyproject.read_text()))


def main() -> None:
    """``--sync`` rewrites the three documents; else print the README's table (``--pyproject``: the block)."""
    if "--sync" in sys.argv:
        sync_docs(Path(__file__).resolve().parents[2])
    else:
        print(pyproject_block() if "--pyproject" in sys.argv else markdown_table())
