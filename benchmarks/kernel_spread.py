"""How far the golden cells' floats move across the CPU float kernels an x86 machine may pick.

torch's vectorised kernels, its MKL and oneDNN, and numpy's OpenBLAS each choose a code path from the CPU
(``fedrapp_app/testing/kernels.py`` emulates an AVX2 or a pre-AVX machine on this one). The paths group float sums
differently, so the same code gives other last bits, and a few rounds of adaptation compound them. This script runs
the cells of ``tests/trust_golden.py`` (FedRAPP's trust option: the golden record of
``tests/test_trust_switch.py``) once natively and once per emulated profile the CPU allows, each in a fresh
process, and reports, per field, the largest absolute and relative difference between any two of them and against
the recorded golden file; and whether every decision, count and status was identical.

    python benchmarks/kernel_spread.py                       # ~2 min per profile on 2 CPU cores
    python benchmarks/kernel_spread.py --out docs/results/raw/kernel_spread

The tolerances of the golden test (``tests/test_trust_switch.py``, ``SPREAD``) are this spread times a
margin (the test says which).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The emulated profiles, lowest first (``testing/kernels.py``); a CPU runs those up to its own capability.
PROFILES = ("default", "avx2", "avx512")


#: Every variable a profile sets (unset for the native run).
ENV_NAMES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE")


def native_capability() -> str:
    """The capability torch picks on this CPU without the variable (``default``, ``avx2`` or ``avx512``)."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip().lower()


def record_under(profile: str) -> dict[str, Any]:
    """The golden cells run with ``trust = true`` under the kernel ``profile`` (``native``: no variable set), in a
    fresh process (every library reads its variable once, when it loads)."""
    from fedrapp_app.testing.kernels import environment

    variables = {} if profile == "native" else environment(profile)
    code = (
        "import json, sys, torch; sys.path.insert(0, 'tests'); from trust_golden import record; "
        "want = sys.argv[1]; got = torch.backends.cpu.get_cpu_capability().lower(); "
        "assert want == 'native' or got == want, f'torch runs {got} kernels, not {want}'; "
        "print(json.dumps(record({'trust': True})))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES} | variables
    out = subprocess.run(
        [sys.executable, "-c", code, profile], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"the cells failed under {profile}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def leaves(value: Any, path: str = "") -> dict[str, Any]:
    """Every scalar of a nested record by its path; the field name is the last dotted part, list indices dropped."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in leaves(item, f"{path}.{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in leaves(item, f"{path}[{i}]").items()}
    return {path: value}


def field_of(path: str) -> str:
    """``.cells.x.rows[3].peer_weights[2]`` -> ``rows.peer_weights``; checkpoint entries -> ``checkpoint.<sum>``."""
    parts = [p.split("[")[0] for p in path.split(".") if p]
    if "checkpoint" in parts:
        return f"checkpoint.{parts[-1]}"
    if "peer_weights" in parts:  # {peer: weight}
        return "rows.peer_weights"
    return f"rows.{parts[-1]}"


def comparable(cells: dict[str, Any]) -> dict[str, Any]:
    """The part of a record the golden test compares: rows, and the checkpoint's sums (the SHA-256s differ with
    any last bit, so they say only whether two records are identical)."""
    from test_trust_switch import ADDED, DROPPED  # the test's own view of what rows report

    from fedrapp_app.recording.results import SITTING_OUT

    out = {}
    for name, cell in cells.items():
        rows = [
            {k: v for k, v in row.items() if k not in ADDED + DROPPED}
            for row in cell["rows"]
            if row["status"] not in SITTING_OUT
        ]
        sums = {k: {s: v[s] for s in ("sum", "abs_sum")} for k, v in cell["checkpoint"].items()}
        out[name] = {"rows": rows, "checkpoint": sums}
    return out


def spread(a: dict[str, Any], b: dict[str, Any]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Per field, the largest absolute and relative difference of the floats of ``a`` and ``b``; and the paths
    where an exact field (or the structure) differs."""
    from test_trust_switch import EXACT  # a decision, a count or a status: never allowed to differ

    la, lb = leaves(a), leaves(b)
    mismatched = sorted(set(la) ^ set(lb))
    worst: dict[str, dict[str, float]] = {}
    for path in sorted(set(la) & set(lb)):
        x, y = la[path], lb[path]
        name = path.rsplit(".", 1)[-1].split("[")[0]
        if isinstance(x, float) and isinstance(y, float) and name not in EXACT:
            diff = abs(x - y)
            scale = max(abs(x), abs(y))
            entry = worst.setdefault(field_of(path), {"abs": 0.0, "rel": 0.0, "scale": 0.0})
            entry["abs"] = max(entry["abs"], diff)
            entry["rel"] = max(entry["rel"], diff / scale if scale else 0.0)
            entry["scale"] = max(entry["scale"], scale)
        elif x != y:
            mismatched.append(path)
    return worst, mismatched


def merge(into: dict[str, dict[str, float]], other: dict[str, dict[str, float]]) -> None:
    for field, entry in other.items():
        mine = into.setdefault(field, {"abs": 0.0, "rel": 0.0, "scale": 0.0})
        for key in mine:
            mine[key] = max(mine[key], entry[key])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write OUT.json (every number) and OUT.txt (the table)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))

    native = native_capability()
    offered = ("native", *PROFILES[: PROFILES.index(native) + 1])
    from trust_golden import read_record

    golden = comparable(read_record()["cells"])
    records = {}
    for profile in offered:
        print(f"running the golden cells under the {profile} kernels ...", flush=True)
        records[profile] = comparable(record_under(profile))

    pairs: dict[str, Any] = {}
    overall: dict[str, dict[str, float]] = {}
    for x, y in [*itertools.combinations(offered, 2), *((c, "golden") for c in offered)]:
        worst, mismatched = spread(records[x], golden if y == "golden" else records[y])
        pairs[f"{x} vs {y}"] = {"fields": worst, "exact_mismatches": mismatched}
        merge(overall, worst)

    lines = [
        f"torch's CPU capability on this machine: {native}; profiles run: {', '.join(offered)} "
        "(fedrapp_app/testing/kernels.py)",
        "golden record: tests/data/trust_golden.json",
        "",
        "| pair | identical decisions, counts, statuses | largest abs. difference | largest rel. difference |",
        "|---|---|---|---|",
    ]
    for pair, result in pairs.items():
        fields = result["fields"]
        top_abs = max(fields.items(), key=lambda kv: kv[1]["abs"], default=("-", {"abs": 0.0}))
        top_rel = max(fields.items(), key=lambda kv: kv[1]["rel"], default=("-", {"rel": 0.0}))
        same = "yes" if not result["exact_mismatches"] else f"NO: {result['exact_mismatches'][:3]}"
        lines.append(
            f"| {pair} | {same} | {top_abs[1]['abs']:.3g} ({top_abs[0]}) | {top_rel[1]['rel']:.3g} ({top_rel[0]}) |"
        )
    lines += ["", "per field, over every pair:", "", "| field | abs. | rel. | largest magnitude |", "|---|---|---|---|"]
    for field, entry in sorted(overall.items(), key=lambda kv: -kv[1]["abs"]):
        lines.append(f"| {field} | {entry['abs']:.3g} | {entry['rel']:.3g} | {entry['scale']:.3g} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".txt").write_text(text + "\n")
        payload = {"native": native, "capabilities": list(offered), "pairs": pairs, "overall": overall}
        args.out.with_suffix(".json").write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
