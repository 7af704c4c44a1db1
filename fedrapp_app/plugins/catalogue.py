"""``fedrapp-list``: the server rules and local methods installed here, plugins included, with their parameters,
defaults, allowed ranges (where declared), the run-config key that sets each, and where each comes from.

    fedrapp-list              # rules and methods
    fedrapp-list rules        # only the rules (or: methods)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Mapping

from fedrapp_app.config import METHOD_KEYS, RULE_KEYS
from fedrapp_app.registry import entry_points
from fedrapp_app.registry.parameters import allowed_range

#: What ``Rule.newcomer`` means, as fedrapp-list says it (docs/shift.md#populations).
NEWCOMER_TEXT = {
    "sent": "the rule's row for it (P0 for a personalising rule, the global prompt for a global one)",
    "memory-mean": "the mean of the participants' memories",
}
#: Parameters the run sets itself, not a key: what sets them.
SET_BY_THE_RUN = {
    "groups": "the testbed's client -> domain map",
    "own_prompt": "on with report-own-prompt, or with a rule that reads it (trust)",
}


def _parameters(params: type, own_keys: Mapping[str, str], other_key: str) -> list[str]:
    """One line per parameter: ``name = default``, and the config key that sets it."""
    by_param = {param: key for key, param in own_keys.items()}
    lines = []
    for f in dataclasses.fields(params):
        default = f.default if f.default is not dataclasses.MISSING else "(no default)"
        key = by_param.get(f.name)
        where = f'-c "{key}=..."' if key else f"{other_key}='{f.name.replace('_', '-')}=...'"
        where = SET_BY_THE_RUN.get(f.name, where)
        meaning = f.metadata.get("help", "")
        allowed = allowed_range(f)
        in_range = f" in {allowed}" if allowed is not None else ""
        lines.append(
            f"      {f.name.replace('_', '-')} = {default!r}{in_range}  [{where}]" + (f"  {meaning}" if meaning else "")
        )
    return lines or ["      (no parameters)"]


def summary_line(name: str, summary: str) -> str:
    """A rule's or method's one-line summary without a leading repetition of its name (a docstring that starts
    ``"NAME: ..."``, as the examples' do, would read "NAME: NAME: ...")."""
    text = summary.strip()
    return text[len(name) + 1 :].strip() if text.lower().startswith(f"{name.lower()}:") else text


def _section(title: str, group: str, find: Callable, keys: Mapping[str, Mapping[str, str]], other_key: str) -> str:
    out = [f"{title} (entry-point group {group}):"]
    for name in entry_points.names(group):
        try:
            found = find(name)
        except entry_points.PluginError as err:
            out += [f"  {name}", f"      FAILED TO LOAD: {err}"]
            continue
        target = found.target
        selected = getattr(target, "selected_by", "")
        out.append(
            f"  {name}: {summary_line(name, target.summary)}" + (f" [selected by {selected}]" if selected else "")
        )
        out.append(f"      from {found.origin}")
        if getattr(target, "newcomer", None):  # a rule: what a late joiner or a held-out client is sent first
            out.append(f"      a client never seen is sent: {NEWCOMER_TEXT[target.newcomer]}")
        out += _parameters(target.params, keys.get(name, {}), other_key)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedrapp-list", description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=("rules", "methods"), help="list only these")
    args = parser.parse_args(argv)
    from fedrapp_app.aggregation import find_rule
    from fedrapp_app.methods import find_method

    sections = []
    if args.what in (None, "rules"):
        sections.append(
            _section("Server rules (strategy = NAME)", entry_points.RULES, find_rule, RULE_KEYS, "rule-params")
        )
    if args.what in (None, "methods"):
        title = "Local methods (local-method = NAME)"
        sections.append(_section(title, entry_points.METHODS, find_method, METHOD_KEYS, "method-params"))
    print("\n\n".join(sections))
    if args.what in (None, "methods"):
        from fedrapp_app.methods import methods

        heads = sorted(name for name, spec in methods().items() if spec.head)
        print(
            f"\nA training-free head ({', '.join(heads)}) predicts with a prompt-tuning method's tuned prompt: "
            f"local-method = 'adaprompt+{heads[0]}', its parameters prefixed (method-params='{heads[0]}-...')."
        )
    print("\nA module on PYTHONPATH serves too: strategy = 'module:RULE', local-method = 'module:Class'.")
    print("How to add a rule or a method: docs/extending.md.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
