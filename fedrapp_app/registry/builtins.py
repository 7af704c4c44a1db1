"""The server rules and local methods this project registers (its pyproject.toml's entry points), by name.

The registry finds every rule and method through the entry points (``plugins.py``); these lists name this
project's own, for the docs and help texts that must not depend on what else a machine has installed. A test
checks that they equal the entry points in pyproject.toml.
"""

#: The server rules, as ``strategy`` names them (FedRAPP's trust option is ``fedrapp-trust``, selected by
#: ``trust = true``).
RULES = (
    "fedrapp",
    "none-fed",
    "fedavg",
    "fedamp",
    "fedamp-cos",
    "fedmedian",
    "fedtrimmedavg",
    "krum",
    "domain-oracle",
    "latte",
)
#: The rules the run config selects otherwise than by ``strategy``.
OPTIONS = ("fedrapp-trust",)
#: The local methods.
METHODS = ("adaprompt", "im", "tpt", "tpt-online", "zeroshot", "zeroshot-ensemble", "zero", "tda", "latte")
