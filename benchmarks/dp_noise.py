"""The noise multiplier a privacy budget needs, PLD (what the product calibrates with) against RDP, and RDP's ε of
PLD's noise: the numbers docs/privacy.md quotes.

    python benchmarks/dp_noise.py                      # 16 uploads, delta 1e-5, epsilon 8 4 2 1
    python benchmarks/dp_noise.py --uploads 80 --epsilons 8 2
"""

from __future__ import annotations

import argparse

import dp_accounting
from dp_accounting import rdp

from fedrapp_app.privacy import accountant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uploads", type=int, default=16)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[8.0, 4.0, 2.0, 1.0])
    args = parser.parse_args()
    print(f"{args.uploads} uploads, delta {args.delta:g}")
    print("| epsilon | z (PLD) | z (RDP) | PLD / RDP | RDP's epsilon at PLD's z |")
    print("|---|---|---|---|---|")
    for epsilon in args.epsilons:
        z = accountant.noise_for_budget(epsilon, args.delta, args.uploads)
        z_rdp = dp_accounting.calibrate_dp_mechanism(
            rdp.RdpAccountant,
            lambda s: dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(s), args.uploads),
            epsilon,
            args.delta,
        )
        loose = accountant.rdp_epsilon({z: args.uploads}, args.delta)
        print(f"| {epsilon:g} | {z:.3f} | {z_rdp:.3f} | {z / z_rdp:.3f} | {loose:.3f} |")


if __name__ == "__main__":
    main()
