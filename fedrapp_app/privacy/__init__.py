"""Client-level differential privacy of every upload (ours, issue 38; docs/privacy.md), in numpy and
``dp-accounting``:

- ``mechanism``: clip the prompt update, bound the scalars, add Gaussian noise calibrated to one noise multiplier.
- ``accountant``: ε of a client's uploads at the run's δ (RDP), and the noise a budget needs.
- ``upload``: a client's side: its release, and its exact prompt put back in its share of what it is sent.
- ``ledger``: the server's side: each client's ε after each round, checkpointed.
- ``leakage``: what an honest-but-curious server infers from the uploads (the benchmark's attack).
"""
