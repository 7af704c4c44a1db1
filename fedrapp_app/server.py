"""ServerApp: validate the config, connect to the clients, run rounds until the streams end, write results.

``run_server(grid, run_config)`` is the whole ServerApp body; ``flwr run`` calls it through ``app`` and the
benchmark runner and tests call it with an in-process grid, so every path runs the same code.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedrapp_app.checkpoint import CLIENT_STATE_DIR, ServerCheckpoint, new_run_token
from fedrapp_app.config import RESUMABLE_KEYS, ConfigError, RunConfig
from fedrapp_app.results import RunRecorder
from fedrapp_app.strategy import ClientRow, PersonalizedPromptStrategy, RoundReport

log = logging.getLogger("flwr.fedrapp")

#: Consecutive rounds without a single valid reply after which the run stops (an error if nothing was scored).
MAX_IDLE_ROUNDS = 3


def run_dir_of(config: RunConfig, start: float | None = None) -> Path:
    """Absolute results folder: ``output-dir/run-name`` (a timestamp is added to derived names)."""
    name = config.run_name()
    if not config["run-name"]:
        name += time.strftime("-%Y%m%d-%H%M%S", time.localtime(start or time.time()))
    return (Path(str(config["output-dir"])).expanduser() / name).resolve()


def _row(row: ClientRow, report: RoundReport) -> dict[str, Any]:
    """One JSONL row: the client's upload and report metrics plus the rule's diagnostics for it."""
    out: dict[str, Any] = {"client": row.client_id, "node": row.node_id, "status": row.status}
    if row.reason:
        out["reason"] = row.reason
    if row.upload is None:
        return out
    u, c = row.upload, row.client_id
    report_metrics = dict(u.report)
    out.update(
        num_examples=u.num_examples,
        correct=int(report_metrics.pop("correct", 0)),
        correct_before=int(report_metrics.pop("correct-before", 0)),
        h_pre=u.h_pre,
        h_post=u.h_post,
    )
    out["acc"] = out["correct"] / u.num_examples
    out["acc_before"] = out["correct_before"] / u.num_examples
    if report.output is not None:
        d = report.output.diagnostics
        peers = {int(j): float(w) for j, w in enumerate(d.peer_weights[c]) if w > 0}
        out.update(
            update_norm=float(d.update_norm[c]),
            informative=bool(d.informative[c]),
            r=float(d.r[c]),
            mu=float(d.mu[c]),
            gamma=float(d.gamma[c]),
            peer_weights=peers,
        )
    out["client_metrics"] = report_metrics
    return out


def _resumable(config: RunConfig, checkpoint: ServerCheckpoint) -> None:
    """A resumed run must be the same experiment: only ``RESUMABLE_KEYS`` may differ."""
    changed = sorted(k for k, v in config.values.items() if k not in RESUMABLE_KEYS and checkpoint.config.get(k) != v)
    if changed:
        details = ", ".join(f"{k}: {checkpoint.config.get(k)!r} -> {config[k]!r}" for k in changed)
        raise ConfigError(
            f"invalid run config:\n  resume = true, but the run differs from the checkpointed one "
            f"({details}); only {sorted(RESUMABLE_KEYS)} may change"
        )


def run_server(
    grid: Grid,
    run_config: dict[str, Any],
    on_round: Callable[[int, PersonalizedPromptStrategy], None] | None = None,
) -> dict[str, Any]:
    """Run a whole experiment on ``grid``; return the summary (also written to ``summary.json``).

    The server state is checkpointed after every round; ``resume = true`` continues from the checkpoint.
    ``on_round(round, strategy)`` is called after each round (tests and the benchmark runner observe the
    server state through it).
    """
    config = RunConfig.from_run_config(run_config)  # fails here, before anything heavy, on a bad config
    start = time.time()
    run_dir = run_dir_of(config, start)
    checkpoint = ServerCheckpoint.load(run_dir) if config["resume"] else None
    if checkpoint is not None:
        _resumable(config, checkpoint)
    recorder = RunRecorder(run_dir, dict(config.values), resume_after=checkpoint.round if checkpoint else None)
    token = checkpoint.token if checkpoint else new_run_token()
    rule, rule_params = config.rule_params()
    strategy = PersonalizedPromptStrategy(
        rule,
        rule_params,
        num_clients=int(config["num-clients"]),
        fraction=float(config["fraction"]),
        min_nodes=int(config["min-nodes"]),
        node_wait_timeout=float(config["node-wait-timeout"]),
        seed=int(config["seed"]),
        max_norm_ratio=float(config["max-norm-ratio"]),
        client_config={"run-token": token, "state-dir": str(recorder.run_dir / CLIENT_STATE_DIR)},
    )
    strategy.summary()
    log.info("results go to %s", recorder.run_dir)
    strategy.connect(grid)
    if checkpoint is not None:
        strategy.restore(checkpoint)

    max_rounds = int(config["num-rounds"]) or None
    round_number, idle = strategy.state.round, 0
    while not strategy.finished and (max_rounds is None or round_number < max_rounds):
        round_number += 1
        messages = strategy.configure_train(round_number, ArrayRecord(), ConfigRecord(), grid)
        if not messages:
            log.warning("round %d: no client available; stopping", round_number)
            break
        replies = grid.send_and_receive(messages, timeout=float(config["round-timeout"]))
        strategy.aggregate_train(round_number, replies)
        report = strategy.last_report
        rows = [_row(r, report) for r in report.rows]
        log.info(recorder.record_round(round_number, rows, report.seconds))
        strategy.checkpoint(token, dict(config.values)).save(recorder.run_dir)
        if on_round is not None:
            on_round(round_number, strategy)
        idle = 0 if any(r.status in ("ok", "exhausted") for r in report.rows) else idle + 1
        if idle >= MAX_IDLE_ROUNDS:
            break

    if idle >= MAX_IDLE_ROUNDS:
        silent = sorted(c for c in strategy.node_of if not strategy.state.exhausted[c])
        stopped = f"no valid reply for {idle} rounds; clients {silent} did not finish their streams"
        if not recorder.seen:
            raise RuntimeError(f"{stopped} and no sample was ever scored: see the warnings above")
        log.warning("stopping: %s", stopped)
    else:
        stopped = "streams ended" if strategy.finished else "num-rounds reached"
    summary = recorder.finish({"stopped": stopped})
    log.info(
        "FedRAPP run finished: %d rounds, %d samples, online accuracy micro %.2f%% / macro %.2f%% "
        "(received prompt, before adaptation: %.2f%%); results in %s",
        summary["rounds"],
        summary["samples"],
        100 * summary["micro_accuracy"],
        100 * summary["macro_accuracy"],
        100 * summary["micro_accuracy_received_prompt"],
        recorder.run_dir,
    )
    return summary


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower entry point (``server_app:app``)."""
    run_server(grid, dict(context.run_config))
