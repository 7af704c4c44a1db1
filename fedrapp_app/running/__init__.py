"""Starting and stopping a run: ``fedrapp-sim``.

- ``launch``: ``fedrapp-sim``, ``flwr run`` in Flower's simulation engine, contained and checked.
- ``preflight``: the checks before a start (the model, the data, the pool; light imports, seconds).
- ``processes``: every process of a launch, found by a mark in its environment, and stopped.
"""
