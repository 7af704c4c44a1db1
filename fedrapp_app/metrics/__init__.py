"""Metrics of a run beyond accuracy, as pure functions over what the clients report.

- ``calibration``: expected calibration error from confidence bins that add up over batches.
- ``switches``: post-switch accuracy, recovery and forgetting from a client's batches on a moving stream.
"""
