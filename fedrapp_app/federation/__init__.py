"""The Flower-facing federation: what a round is on the server and on a client.

- ``server``: the ServerApp's body (rounds until the streams end, results, checkpoints, every ending recorded).
- ``strategy``: the Flower Strategy around the server rules (``fedrapp_app.aggregation``): node discovery,
  sampling, one message per client, reply validation, the rule's round.
- ``client``: the ClientApp's logic (restore state, take the next batch, adapt, reply).
- ``records``: the wire format (prompts as ArrayRecords, the reply's metrics) and reply validation.
- ``population``: who takes part in a round (late joiners, held-out clients, drops) and a newcomer's prompt.
- ``attacks``: poisoned uploads for the robustness experiments.
- ``errors``: a failure as one readable line (``describe``), Flower's error replies cleaned.
- ``inprocess``: an in-process Grid that runs the real ClientApp without Ray (tests, the bench).

``client_app.py`` and ``server_app.py`` at the repository's top are the thin Flower components over this package.
"""
