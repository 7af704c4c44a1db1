"""``fedrapp-plugin new``: write a plugin package -- a server rule or a local method -- that installs and passes its
tests as generated, for its author to edit.

    fedrapp-plugin new my-rule --kind rule        # -> ./fedrapp-my-rule/ (strategy = "my-rule")
    fedrapp-plugin new my-method --kind method    # -> ./fedrapp-my-method/ (local-method = "my-method")
    cd fedrapp-my-rule && pip install -e . && python -m pytest

The package holds a ``pyproject.toml`` with the entry point, the module (a rule: its parameters and round
function; a method: its parameters and ``MethodSpec`` in ``__init__.py``, without torch, and the method in
``method.py``), a test that runs the conformance kit on it (``tests/``) and a README saying how to run it, test it
and use it in a bench grid. docs/extending.md has the contract.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

KINDS = ("rule", "method")
_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")

PYPROJECT = """\
[build-system]
requires = ["hatchling>=1.25"]
build-backend = "hatchling.build"

[project]
name = "{dist}"
version = "0.1.0"
description = "A FedRAPP {kind_text} as a plugin: {name}"
requires-python = ">=3.11"
dependencies = ["fedrapp"]

# The plugin's name (what `{key} = "{name}"` selects) and the object the registry loads.
[project.entry-points."{group}"]
{name} = "{entry}"

[tool.hatch.build.targets.wheel]
packages = ["{module}"]

[tool.pytest.ini_options]
testpaths = ["tests"]
markers = ["slow: the conformance checks that run a small federation (seconds)"]
filterwarnings = ["ignore::DeprecationWarning:flwr.*", "ignore::DeprecationWarning:typer.*"]
"""

RULE_MODULE = '''\
"""{name}: a FedRAPP server rule (docs/extending.md, "Writing a server rule").

Each client that replied is sent (1 - weight) x its own upload + weight x the mean of the uploads; the others are
sent again what they were sent. Edit ``{function}`` to make it yours; ``python -m pytest`` checks it meets the
contract (fedrapp_app.plugins.conformance).
"""

from dataclasses import dataclass

import numpy as np

from fedrapp_app.plugins import UNIT, RuleParams, param, peer_mixing_round, rule, validate_round


@dataclass(frozen=True)
class {params}(RuleParams):
    weight: float = param(0.5, UNIT, "share of the mean of the uploads in what each client is sent")


@rule(params={params})
def {function}(tuned, sent, memory, h_pre, h_post, replied, num_examples, params={params}()):
    """each replying client gets (1 - weight) x its upload + weight x the mean of the uploads."""
    x = validate_round(tuned, sent, memory, h_pre, h_post, replied, num_examples)  # shapes, finite, absent rows

    def mixing(uploads):  # [k, d] uploads of the k clients that replied -> xi [k, k], rows summing to 1
        k = uploads.shape[0]
        return (1.0 - params.weight) * np.eye(k) + params.weight / k

    return peer_mixing_round(x, mixing)  # absent clients untouched; the peer weights for the report
'''

RULE_TEST = '''\
"""{name}'s tests: the conformance kit (every check of the contract), and one of its own math."""

import numpy as np

from fedrapp_app.plugins import make_rule, parametrize_with_checks, synthetic_round


@parametrize_with_checks(rules=["{name}"])
def test_conformance(check):
    check()


def test_weight_zero_sends_each_client_its_own_upload():
    x = synthetic_round(np.random.default_rng(0), 5, 12)
    out = make_rule("{name}", {{"weight": 0.0}})(**x)
    assert np.array_equal(out.personalized[x["replied"]], x["tuned"][x["replied"]])
'''

METHOD_INIT = '''\
"""{name}: a FedRAPP local method (docs/extending.md, "Writing a local method").

This module holds what the registry reads before a run starts, without torch: the parameters and the
``MethodSpec`` the entry point names. The method itself is in ``method.py``.
"""

from dataclasses import dataclass

from fedrapp_app.plugins import POSITIVE, MethodSpec, param


@dataclass(frozen=True)
class {params}:
    init_text: str = param("a photo of a", help="the words the context starts from (identical on every client)")
    lr: float = param(5e-3, POSITIVE, "AdamW's learning rate")


{spec} = MethodSpec("{module}.method:{cls}", {params}, "one AdamW step per batch on its mean prediction entropy")
'''

METHOD_MODULE = '''\
"""{name}: one AdamW step per batch on the mean prediction entropy of the received prompt, then the batch is
predicted with the tuned prompt. The AdamW moments are its client state. Edit ``adapt`` to make it yours;
``python -m pytest`` checks it meets the contract (fedrapp_app.plugins.conformance)."""

from typing import ClassVar

import numpy as np
import torch

from fedrapp_app.plugins import (
    Adaptation,
    LocalMethod,
    adamw_state_arrays,
    check_prompt,
    check_state_keys,
    detached,
    load_adamw_state,
    mean_entropy,
    scored,
)

from . import {params}


class {cls}(LocalMethod):
    """{name}: entropy minimisation, one AdamW step per batch."""

    name: ClassVar[str] = "{name}"
    Params: ClassVar[type] = {params}
    _OPTIMIZER = "optimizer."

    def __init__(self, params=None):
        self.params = params or {params}()
        self._optimizer_state: dict[str, np.ndarray] = {{}}

    def initial_prompt(self, pclip):
        return [pclip.context_from_text(self.params.init_text)]  # one block [n, D], the same on every client

    def adapt(self, pclip, prompt, pixel_values, generator):
        (received,) = check_prompt(prompt, self.initial_prompt(pclip), self.name)
        features = pclip.image_features(pixel_values)  # [B, E], frozen tower
        context = received.to(pclip.device).requires_grad_(True)
        optimizer = torch.optim.AdamW([context], lr=self.params.lr)
        load_adamw_state(optimizer, [context], self._optimizer_state, self._OPTIMIZER)
        before = pclip.logits(features, pclip.text_features([context]))  # [B, C]
        loss = (-(before.softmax(-1) * before.log_softmax(-1)).sum(-1)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        self._optimizer_state = adamw_state_arrays(optimizer, [context], self._OPTIMIZER)
        with torch.no_grad():
            after = pclip.logits(features, pclip.text_features([context]))
        return Adaptation(
            prompt=detached([context]),
            h_pre=mean_entropy(before),
            h_post=mean_entropy(after),
            stats={{"loss": float(loss.detach())}},
            **scored(after, before.detach()),  # predictions and confidences after and before
        )

    def state_dict(self):
        return {{key: value.copy() for key, value in self._optimizer_state.items()}}

    def load_state_dict(self, state):
        check_state_keys(state, [self._OPTIMIZER], self.name)
        self._optimizer_state = {{key: np.array(value) for key, value in state.items()}}
'''

METHOD_TEST = '''\
"""{name}'s tests: the conformance kit (every check of the contract; the one that runs a small federation is
marked slow), and one of its own."""

import pytest

from fedrapp_app.plugins import method_params, parametrize_with_checks


@parametrize_with_checks(methods=["{name}"])
def test_conformance(check):
    check()


def test_a_bad_learning_rate_is_refused_before_a_run():
    with pytest.raises(ValueError, match="lr = 0.0 is outside its allowed range"):
        method_params("{name}", {{"lr": 0}})
'''

README = """\
# {dist}: a FedRAPP {kind_text} (`{name}`)

Written by `fedrapp-plugin new {name} --kind {kind}`; edit `{edit}` to make it yours.

```bash
pip install -e .                       # {where}
python -m pytest                       # the conformance kit and its own tests (-m "not slow": without the federation)
fedrapp-list {listing}                   # {name}, from {dist} 0.1.0, with its parameters and their ranges
fedrapp-sim -c "{key}='{name}' {params_key}='{example}' num-rounds=3"
```

`fedrapp-sim` runs FedRAPP's app: from this folder it takes the folder FedRAPP was installed from (`pip install -e`;
it prints which), or name that folder first: `fedrapp-sim /path/to/fedrapp -c "..."`.

In a bench grid (`python -m fedrapp_app.bench grid.yaml`), a cell selects it like a built-in:

```yaml
grids:
  main:
    compare: [{axis}]
    axes:
      {axis}:
        builtin: {{{key}: {builtin}}}
        {name}: {{{key}: {name}, {params_key}: "{example}"}}
      seed: [0, 1, 2]
```

The contract, every name `fedrapp_app.plugins` gives, how to test a plugin and what happens when one fails:
FedRAPP's docs/extending.md.
"""


def snake(name: str) -> str:
    return name.replace("-", "_")


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def files(name: str, kind: str) -> dict[str, str]:
    """The plugin package's files (relative path -> text) for ``name`` (kebab-case) of ``kind``."""
    if not _NAME.match(name):
        raise ValueError(f"name {name!r}: use lower-case words joined by '-', e.g. 'my-rule'")
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    dist, module = f"fedrapp-{name}", f"fedrapp_{snake(name)}"
    values = {"name": name, "dist": dist, "module": module, "kind": kind, "params": f"{camel(name)}Params"}
    if kind == "rule":
        values.update(function=snake(name), group="fedrapp.rules", key="strategy", kind_text="server rule")
        values["entry"] = f"{module}:{values['function']}"
        out = {
            f"{module}/__init__.py": RULE_MODULE.format(**values),
            f"tests/test_{module}.py": RULE_TEST.format(**values),
        }
        readme = {"edit": f"{module}/__init__.py", "where": "where the ServerApp runs (the simulation: here)",
                  "listing": "rules", "params_key": "rule-params", "example": "weight=0.3", "axis": "rule",
                  "builtin": "fedavg"}  # fmt: skip
    else:
        spec = snake(name).upper()
        values.update(cls=camel(name), spec=spec, group="fedrapp.methods", key="local-method", kind_text="local method")
        values["entry"] = f"{module}:{spec}"
        out = {
            f"{module}/__init__.py": METHOD_INIT.format(**values),
            f"{module}/method.py": METHOD_MODULE.format(**values),
            f"tests/test_{module}.py": METHOD_TEST.format(**values),
        }
        readme = {"edit": f"{module}/method.py", "where": "where every client runs, and where the ServerApp runs",
                  "listing": "methods", "params_key": "method-params", "example": "lr=0.01", "axis": "method",
                  "builtin": "adaprompt"}  # fmt: skip
    out["pyproject.toml"] = PYPROJECT.format(**values)
    out["README.md"] = README.format(**values, **readme)
    return out


def new(name: str, kind: str, where: Path) -> Path:
    """Write the package for ``name`` into ``where/fedrapp-<name>`` (which must not exist); return that folder."""
    package = files(name, kind)
    root = Path(where) / f"fedrapp-{name}"
    if root.exists():
        raise FileExistsError(f"{root} exists; choose another name or folder (--dir)")
    for relative, text in package.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def main(argv: list[str] | None = None) -> int:
    paragraphs = (__doc__ or "").split("\n\n")
    parser = argparse.ArgumentParser(
        prog="fedrapp-plugin",
        description=textwrap.fill(" ".join(paragraphs[0].split()), 100),  # the first paragraph, whole
        epilog="examples:\n" + textwrap.indent(textwrap.dedent(paragraphs[1]).strip("\n"), "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("new", help="write a plugin package: a server rule or a local method")
    make.add_argument("name", help="the plugin's name, lower-case words joined by '-' (what the run config selects)")
    make.add_argument("--kind", choices=KINDS, required=True, help="a server rule or a local method")
    make.add_argument("--dir", type=Path, default=Path("."), help="where to write fedrapp-<name>/ (default: here)")
    args = parser.parse_args(argv)
    try:
        root = new(args.name, args.kind, args.dir)
    except (ValueError, FileExistsError) as err:
        print(f"fedrapp-plugin: {err}", file=sys.stderr)
        return 2
    print(f"fedrapp-plugin: wrote {root}/ ({', '.join(sorted(files(args.name, args.kind)))})")
    print(f"  next: cd {root} && pip install -e . && python -m pytest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
