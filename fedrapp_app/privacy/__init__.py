"""Client-level differential privacy of every upload (ours; docs/privacy.md), in numpy and
``dp-accounting``:

- ``mechanism``: clip the prompt update, bound the scalars, add Gaussian noise calibrated to one noise multiplier.
- ``accountant``: ε of a client's uploads at the run's δ (PLD; RDP as a looser bound), and the noise a budget needs.
- ``upload``: a client's side: its release, its release log (each position released once), and its exact prompt
  put back in its share of what it is sent.
- ``ledger``: the server's side: each client's ε after each round (each position counted once), checkpointed.
- ``leakage``: what an honest-but-curious server infers from the uploads (the benchmark's attack).
"""
