"""Warm ClientApps on a SuperNode: ``fedrapp-superexec``, an executor for ``--isolation process`` SuperNodes.

Flower 1.42 starts a new ``flwr-clientapp`` process for every message a SuperNode receives, so a deployed
client imports torch and transformers and loads its model again every round. ``fedrapp-superexec`` takes
the place of Flower's ``flower-superexec`` and serves the ClientApp tasks of each run in one long-lived
worker process instead (model loaded once per node per run), with Flower's own task protocol.

Modules, by role: ``version`` (the supported Flower versions, checked first), ``cli`` (options),
``executor`` (the task loop), ``pool`` (the workers: start, dispatch, replace), ``worker`` (serving a task
in a worker), ``runtime`` (the Runtime API client and heartbeat), ``recovery`` (answering a dead worker's
task), ``protocol`` (executor <-> worker messages), ``preload`` (what the worker server imports once).

Beside it: ``link`` (``fedrapp-link``: the certificate check before a SuperLink starts, and the bounded wait for a
SuperLink to listen) and ``loopback`` (a whole deployment on one machine, for the tests and benchmarks).
"""
