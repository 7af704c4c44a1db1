"""``trust = true`` is the variant of FedRAPP's trust option chosen in issue 15, bit for bit.

The option had sixteen ``trust-*`` knobs until commit 9c3f0c6; the product keeps the chosen setting behind one
switch. ``tests/data/trust_golden.json`` holds the rows and the checkpoint of small cells run on 9c3f0c6 with the
chosen knobs spelled out (``tests/trust_golden.py`` says how it was made); this test runs the same cells with
``trust = true`` on the code as it is now and compares them.
"""

from __future__ import annotations

import json
from pathlib import Path

from trust_golden import CELLS, record

GOLDEN = Path(__file__).parent / "data" / "trust_golden.json"
#: What the clients no longer report: the neighbour votes of the probe, which only unchosen variants read.
DROPPED = ("v_probe", "v_own_probe")


def test_the_trust_switch_gives_the_chosen_variants_rows_and_state_bit_for_bit():
    golden = json.loads(GOLDEN.read_text())
    assert golden["commit"] == "9c3f0c6" and set(golden["cells"]) == set(CELLS)
    now = record({"trust": True})
    for name, old in golden["cells"].items():
        rows = [{k: v for k, v in row.items() if k not in DROPPED} for row in old["rows"]]
        assert now[name]["rows"] == rows, name
        assert now[name]["checkpoint"] == old["checkpoint"], name
        # the cells exercise what the option does: both trusts move, and absent clients keep theirs
        memory = {row["trust_memory"] for row in rows}
        peers = {row["trust_peers"] for row in rows}
        assert len(memory) > 2 and len(peers) > 1, name
