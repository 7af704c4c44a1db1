"""What the conformance kit's cost check measures, on every registered rule: a round's time beside FedRAPP's.

    python benchmarks/rule_cost.py                 # the built-ins and the installed plugins, 6 and 48 clients
    python benchmarks/rule_cost.py --rules fedavg krum plugin_rules:quadratic --tries 9

Each rule runs as the kit's ``cost`` check runs it (``conformance.round_costs``): rounds of N clients that all
reply, on prompts of ``COST_DIM`` entries, the best of ``--tries`` counting, FedRAPP's best of three rounds just
before as the machine's yardstick. Printed per rule and N: both, their ratio, the kit's budget
(``cost_budget(N)``) and how much of it the rule uses. The budget is meant to pass every built-in with room to
spare on a loaded machine and to fail a rule that sleeps or loops over pairs of clients in Python.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from fedrapp_app.aggregation import BoundRule, find_rule
from fedrapp_app.aggregation.fedrapp import FEDRAPP
from fedrapp_app.plugins import RULES, names
from fedrapp_app.plugins.conformance import COST_CLIENTS, COST_DIM, cost_budget, round_costs
from fedrapp_app.registry.parameters import build_params

#: Parameters a rule needs to run (the domain oracle: a client -> domain map, 2 domains).
NEEDS = {"domain-oracle": lambda n: {"groups": tuple(int(i) for i in np.arange(n) % 2)}}


def measure(name: str, n: int, tries: int) -> tuple[float, float]:
    """(the rule's best round, FedRAPP's best round) in seconds at ``n`` clients."""
    found = find_rule(name).target
    params = build_params(found.params, NEEDS[name](n) if name in NEEDS else {}, f"server rule {name!r}")
    reference = BoundRule("fedrapp", FEDRAPP, FEDRAPP.params())
    return round_costs(BoundRule(name, found, params), reference, n, tries=tries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", nargs="*", help="names or module:attribute (default: every registered rule)")
    parser.add_argument("--clients", type=int, nargs="*", default=list(COST_CLIENTS))
    parser.add_argument("--tries", type=int, default=5, help="rounds of each; the best counts (default 5)")
    args = parser.parse_args(argv)
    rules = args.rules or names(RULES)
    load = os.getloadavg()[0]
    print(f"prompts of {COST_DIM} entries; best of {args.tries}; load average {load:.2f}; {os.cpu_count()} cores")
    print(f"{'rule':<32} {'N':>3} {'rule s':>9} {'FedRAPP s':>9} {'ratio':>7} {'budget s':>9} {'used':>6}")
    worst = 0.0
    for name in rules:
        measure(name, 6, 1)  # first calls (imports, caches) are not a round's cost
        for n in args.clients:
            best, ref = measure(name, n, args.tries)
            used = best / cost_budget(n)
            if ":" not in name:
                worst = max(worst, used)
            print(f"{name:<32} {n:>3} {best:>9.5f} {ref:>9.5f} {best / ref:>7.2f} {cost_budget(n):>9.3f} {used:>6.1%}")
    print(f"the most of its budget a registered rule used: {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
