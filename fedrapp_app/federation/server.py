"""ServerApp: validate the config, connect to the clients, run rounds until the streams end, write results.

``run_server(grid, run_config)`` is the whole ServerApp body; ``flwr run`` calls it through ``app`` and the
benchmark runner and tests call it with an in-process grid, so every path runs the same code.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedrapp_app.aggregation import find_rule
from fedrapp_app.config import RESUMABLE_KEYS, ConfigError, RunConfig
from fedrapp_app.federation.errors import describe
from fedrapp_app.federation.exchange import send_and_collect
from fedrapp_app.federation.population import Population
from fedrapp_app.federation.records import Outcome, scored_fields
from fedrapp_app.federation.strategy import ClientRow, PersonalizedPromptStrategy, RoundReport, count_nodes
from fedrapp_app.methods import find_method
from fedrapp_app.privacy.ledger import PrivacyLedger
from fedrapp_app.recording.checkpoint import CLIENT_STATE_DIR, SERVER_FILE, ServerCheckpoint, new_run_token
from fedrapp_app.recording.results import SITTING_OUT, RunRecorder, clear_results, unmoved_warning, unscored_samples
from fedrapp_app.recording.runlock import (
    RESUME_WAIT_SECONDS,
    check_not_taken,
    check_writable,
    release_on_signal,
    run_lock,
)
from fedrapp_app.registry.entry_points import provenance_of

log = logging.getLogger("flwr.fedrapp")

#: Consecutive rounds without a single valid reply after which the run stops (an error if nothing was scored).
MAX_IDLE_ROUNDS = 3
#: Consecutive rounds whose server rule failed after which the run fails (a plugin rule that never works).
MAX_RULE_FAILURES = 3


def run_dir_of(config: RunConfig, start: float | None = None) -> Path:
    """Absolute results folder: ``output-dir/run-name`` (a timestamp is added to derived names), always one folder
    inside output-dir (the config refuses a run-name that is a path; a derived name's parts lose their separators)."""
    name = config.run_name()
    if not config["run-name"]:
        name = name.replace("/", "-").replace("\\", "-") + time.strftime(
            "-%Y%m%d-%H%M%S", time.localtime(start or time.time())
        )
    if Path(name).name != name or name in (".", ".."):  # RunConfig refused it already; a caller may skip RunConfig
        raise ConfigError(f"run-name {name!r} is not one folder name inside output-dir")
    return (Path(str(config["output-dir"])).expanduser() / name).resolve()


#: Peers a row keeps by weight: a federation of N clients would write N² weights per round otherwise.
MAX_ROW_PEERS = 32


def top_peers(weights: np.ndarray, k: int = MAX_ROW_PEERS) -> tuple[dict[int, float], float]:
    """The ``k`` largest positive weights of a row of the peer-weight matrix [N] as ``{peer: weight}``, and the
    weight of the positive ones left out (0 when none is)."""
    positive = np.flatnonzero(weights > 0)
    if len(positive) > k:
        kept = positive[np.argpartition(weights[positive], -k)[-k:]]
        kept.sort()
    else:
        kept = positive
    rest = float(weights[positive].sum() - weights[kept].sum()) if len(positive) > k else 0.0
    return {int(j): float(weights[j]) for j in kept}, rest


def _row(row: ClientRow, report: RoundReport) -> dict[str, Any]:
    """One JSONL row: the client's upload and report metrics plus the rule's diagnostics for it."""
    out: dict[str, Any] = {"client": row.client_id, "node": row.node_id, "status": row.status}
    if row.held_out:
        out["held_out"] = True  # scored; its upload never reached the rule (population.py)
    if row.reason:
        out["reason"] = row.reason
    if row.skipped:
        out.update(skipped=len(row.skipped), skipped_samples=row.skipped)
    if row.dp_epsilon is not None:  # under dp: the client's privacy loss after this round's release
        out["dp_epsilon"] = row.dp_epsilon
    out.update({key.replace("-", "_"): value for key, value in row.where.items()})
    if row.upload is None:
        return out
    u, c = row.upload, row.client_id
    # under dp the report holds no label-derived field: the client keeps those (recording/outcomes.py)
    scored, report_metrics = scored_fields(u.report, row.outcome or Outcome(), u.num_examples)
    out.update(num_examples=u.num_examples, h_pre=u.h_pre, h_post=u.h_post, **scored)
    out["upload_bytes"] = u.upload_bytes  # the prompt and any payload the rule read
    if row.download_bytes is not None:
        out["download_bytes"] = row.download_bytes  # what it was sent: the prompt, probes and any payload
    if u.h_own is not None:  # the own last tuned prompt on the batch (report-own-prompt)
        out["h_own"] = u.h_own
    if u.v_pre is not None and u.v_own is not None:  # the neighbour votes for the received and the own prompt
        out.update(v_pre=u.v_pre, v_own=u.v_own)
    if u.h_probe is not None:  # the probe the rule sent, against the own prompt (FedRAPP's trust probe)
        out.update(h_probe=u.h_probe, hm_probe=u.hm_probe)
    if report.rule_error:
        out["rule_error"] = report.rule_error
    if report.output is not None:
        d = report.output.diagnostics
        peers, rest = top_peers(d.peer_weights[c])
        out.update(
            update_norm=float(d.update_norm[c]),
            informative=bool(d.informative[c]),
            r=float(d.r[c]),
            mu=float(d.mu[c]),
            gamma=float(d.gamma[c]),
            peer_weights=peers,
        )
        if d.trust_memory is not None and d.trust_peers is not None:  # FedRAPP's trust option (ours)
            out.update(trust_memory=float(d.trust_memory[c]), trust_peers=float(d.trust_peers[c]))
        if rest > 0:
            out["peer_weights_rest"] = rest
    out["client_metrics"] = report_metrics
    return out


def privacy_ledger(config: RunConfig) -> PrivacyLedger | None:
    """Under ``dp = true``, the ledger of each client's privacy loss (None: off)."""
    if not config["dp"]:
        return None
    return PrivacyLedger.empty(config.num_clients, float(config["dp-delta"]), float(config["dp-clip"]))


def _resumable(config: RunConfig, checkpoint: ServerCheckpoint) -> None:
    """A resumed run must be the same experiment: only ``RESUMABLE_KEYS`` may differ."""
    # num-clients = 0 is resolved by counting the nodes later, then compared (run_server).
    skip = RESUMABLE_KEYS | ({"num-clients"} if not config.num_clients else set())
    changed = sorted(k for k, v in config.values.items() if k not in skip and checkpoint.config.get(k) != v)
    if changed:
        details = ", ".join(f"{k}: {checkpoint.config.get(k)!r} -> {config[k]!r}" for k in changed)
        raise ConfigError(
            f"invalid run config:\n  resume = true, but the run differs from the checkpointed one "
            f"({details}); only {sorted(RESUMABLE_KEYS)} may change"
        )


def finished_already(run_dir: Path, config: RunConfig) -> dict[str, Any] | None:
    """The summary of a run that a resume has nothing to add to (its streams ended, or it ran the rounds now
    asked for), or None."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    if summary.get("status", "finished") != "finished":
        return None
    max_rounds = int(config["num-rounds"])
    if summary.get("stopped") == "streams ended" or (max_rounds and int(summary.get("rounds", 0)) >= max_rounds):
        return summary
    return None


def components(config: RunConfig) -> dict[str, Any]:
    """Where the run's server rule and local method come from (``registry.entry_points.provenance_of``: the
    distribution, its version and the entry point, or a module's file and hash), for config.json, summary.json and
    a bench cell."""
    rule, _ = config.rule_params()
    return {
        "rule": provenance_of(find_rule(rule)),
        "method": provenance_of(find_method(str(config["local-method"]))),
    }


def mark_interrupted(run_dir: Path, why: str, wait: float = 30.0) -> None:
    """Say in ``summary.json`` that the run in ``run_dir`` was stopped, once its processes are gone (the lock is
    free, waiting up to ``wait`` seconds for it): the rows and totals up to its last checkpoint,
    ``status: interrupted`` and ``why``."""
    if not (run_dir / SERVER_FILE).is_file():
        return
    with run_lock(run_dir, wait=wait):
        checkpoint = ServerCheckpoint.load(run_dir)
        recorder = RunRecorder(run_dir, checkpoint.config, resume_after=checkpoint.round)
        if checkpoint.num_samples:
            recorder.expect(int(checkpoint.config.get("num-clients", 0) or 0), checkpoint.num_samples)
        recorder.fail("interrupted", why, {"stopped": "interrupted"})


def run_server(
    grid: Grid,
    run_config: dict[str, Any],
    on_round: Callable[[int, PersonalizedPromptStrategy], None] | None = None,
    *,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run a whole experiment on ``grid``; return the summary (also written to ``summary.json``).

    The server state is checkpointed after every round; ``resume = true`` continues from the checkpoint.
    ``on_round(round, strategy)`` is called after each round (tests and the benchmark runner observe the
    server state through it). The run folder is locked while the run writes it (``fedrapp_app.recording.runlock``); a
    run that fails or is stopped leaves a ``summary.json`` that says so. A new run (no resume) in a folder that holds
    results is refused (``RunFolderTaken``, before anything is written) unless ``overwrite`` (a Python caller's
    explicit choice: the benchmark runner replacing a cell of other settings) removes them first.
    """
    config = RunConfig.from_run_config(run_config)  # fails here, before anything heavy, on a bad config
    start = time.time()
    run_dir = run_dir_of(config, start)
    check_writable(run_dir, str(config["output-dir"]))  # a ConfigError naming the folder and the fix
    # A resume waits (bounded, saying so) for a holder that is still stopping: the ServerApp of the killed run.
    with run_lock(run_dir, wait=RESUME_WAIT_SECONDS if config["resume"] else 0.0):
        if not config["resume"]:
            if overwrite:
                clear_results(run_dir)
            check_not_taken(run_dir)  # a finished run, or one waiting for its resume: never replaced silently
        checkpoint = ServerCheckpoint.load(run_dir) if config["resume"] else None
        if checkpoint is not None:
            _resumable(config, checkpoint)
            done = finished_already(run_dir, config)
            if done is not None:
                log.warning(
                    "run %s already finished (%s, %d rounds): nothing to resume; raise num-rounds to run more "
                    "rounds, or start a new run-name",
                    run_dir,
                    done.get("stopped"),
                    done.get("rounds", 0),
                )
                return done
        resolved = {}
        if not config.num_clients:
            wait = float(config["node-wait-timeout"])
            config = config.with_num_clients(count_nodes(grid, int(config["min-nodes"]), wait))
            resolved["num-clients"] = "0 in the config: one client per SuperNode"
            if checkpoint is not None:
                _resumable(config, checkpoint)
        resumed = checkpoint.round if checkpoint else None
        recorder = RunRecorder(
            run_dir,
            dict(config.values),
            resume_after=resumed,
            started=start,
            components=components(config),
            resolved=resolved,
        )
        try:
            return _run_rounds(grid, config, recorder, checkpoint, start, on_round)
        except BaseException as err:
            status = "failed" if isinstance(err, Exception) else "interrupted"
            recorder.fail(status, describe(err), {"stopped": status})
            raise


def _run_rounds(
    grid: Grid,
    config: RunConfig,
    recorder: RunRecorder,
    checkpoint: ServerCheckpoint | None,
    start: float,
    on_round: Callable[[int, PersonalizedPromptStrategy], None] | None,
) -> dict[str, Any]:
    """Discovery, then rounds until the streams end (or num-rounds, or clients stop answering)."""
    token = checkpoint.token if checkpoint else new_run_token()
    rule, rule_params = config.rule_params()
    strategy = PersonalizedPromptStrategy(
        rule,
        rule_params,
        num_clients=config.num_clients,
        fraction=float(config["fraction"]),
        min_nodes=int(config["min-nodes"]),
        node_wait_timeout=float(config["node-wait-timeout"]),
        seed=int(config["seed"]),
        max_norm_ratio=float(config["max-norm-ratio"]),
        population=Population.of(config),
        privacy=privacy_ledger(config),
        client_config={
            "run-token": token,
            "state-dir": str(recorder.run_dir / CLIENT_STATE_DIR),
            "server-host": socket.gethostname(),
            "own-prompt": config.reports_own_prompt,  # the clients do not need the rule to know
            "method-origin": find_method(str(config["local-method"])).origin,  # named by a node that lacks it
        },
    )
    strategy.summary()
    log.info("results go to %s", recorder.run_dir)
    discovery = time.perf_counter()
    strategy.connect(grid)
    recorder.expect(config.num_clients, strategy.num_samples)  # filled on by later discoveries
    discovery = time.perf_counter() - discovery
    if checkpoint is not None:
        strategy.restore(checkpoint)
    setup_seconds = time.time() - start
    checkpoint_seconds = 0.0

    max_rounds = int(config["num-rounds"]) or None
    round_number, idle, rule_failures = strategy.state.round, 0, 0
    stopped = ""
    while not strategy.finished and (max_rounds is None or round_number < max_rounds):
        round_number += 1
        messages = strategy.configure_train(round_number, ArrayRecord(), ConfigRecord(), grid)
        if not strategy.sampled and not strategy.expects_clients():
            stopped = "no client available"
            log.warning("round %d: no client available; stopping", round_number)
            break
        waited = time.monotonic()
        # No message: every sampled client's node is gone (the strategy waited node-wait-timeout for them).
        replies = send_and_collect(grid, messages, float(config["round-timeout"])) if messages else []
        waited = time.monotonic() - waited
        strategy.aggregate_train(round_number, replies)
        report = strategy.last_report
        rows = [_row(r, report) for r in report.rows]
        timing = {"server_seconds": report.seconds - waited, "aggregate_seconds": report.aggregate_seconds}
        log.info(recorder.record_round(round_number, rows, report.seconds, timing))
        saved = time.perf_counter()
        strategy.checkpoint(token, dict(config.values)).save(recorder.run_dir)
        checkpoint_seconds += time.perf_counter() - saved
        if on_round is not None:
            on_round(round_number, strategy)
        # A round nobody was due in (late joiners to come, held-out visits, drops) is not an idle one.
        sent = [r for r in report.rows if r.status not in SITTING_OUT]  # the rows of clients the round sent to
        idle = 0 if not sent or any(r.status in ("ok", "exhausted", "skipped") for r in sent) else idle + 1
        rule_failures = rule_failures + 1 if report.rule_error else 0
        if rule_failures >= MAX_RULE_FAILURES:
            raise RuntimeError(f"the server rule failed in {rule_failures} rounds in a row: {report.rule_error}")
        if idle >= MAX_IDLE_ROUNDS:
            break

    if idle >= MAX_IDLE_ROUNDS:
        silent = sorted(c for c in strategy.node_of if not strategy.state.exhausted[c])
        stopped = f"no valid reply for {idle} rounds; clients {silent} did not finish their streams"
        if not recorder.seen:
            raise RuntimeError(f"{stopped} and no sample was ever scored: {_last_reasons(recorder.rows)}")
        log.warning("stopping: %s", stopped)
    elif not stopped:
        stopped = "streams ended" if strategy.finished else "num-rounds reached"
    recorder.collect_outcomes()  # under dp: the clients' outcome files on this host (skipped samples among them)
    complete, unscored = unscored_samples(
        config.num_clients, strategy.num_samples, recorder.rows, stopped, capped=stopped == "num-rounds reached"
    )
    summary = recorder.finish(
        {
            "stopped": stopped,
            "complete": complete,
            "unscored": unscored,
            "num_clients": config.num_clients,
            "setup_seconds": setup_seconds,
            "discovery_seconds": discovery,
            "checkpoint_seconds": checkpoint_seconds,
            **(
                {"privacy": (privacy := strategy.privacy.summary()), "noise_seeded": bool(privacy["noise_seeded"])}
                if strategy.privacy is not None
                else {}
            ),  # fmt: skip
        }
    )
    log.info(
        "%s run finished: %d rounds, %d samples, online accuracy micro %.2f%% / macro %.2f%% "
        "(received prompt, before adaptation: %.2f%%); results in %s",
        config["strategy"],
        summary["rounds"],
        summary["samples"],
        100 * summary["micro_accuracy"],
        100 * summary["macro_accuracy"],
        100 * summary["micro_accuracy_received_prompt"],
        recorder.run_dir,
    )
    warning = unmoved_warning(summary)
    if warning:
        log.warning(warning)
    if not complete:
        lost = sum(u["samples"] or 0 for u in unscored.values())
        log.warning(
            "INCOMPLETE run: %d sample(s) of %d client(s) never scored (see 'unscored' in %s)",
            lost,
            len(unscored),
            recorder.summary_path,
        )
    return summary


def _last_reasons(rows: list[dict[str, Any]]) -> str:
    """The distinct reasons of the last round's rows (why nothing could be scored)."""
    last = [r for r in rows if r["round"] == rows[-1]["round"]] if rows else []
    reasons = sorted({f"client {r['client']} {r['status']}: {r.get('reason', '')}" for r in last})
    return "; ".join(reasons) or "see the warnings above"


def one_line(err: ConfigError) -> str:
    """A ``ConfigError``'s message on one line: ``invalid run config: <problem>; <problem>``."""
    head, *problems = [line.strip() for line in str(err).splitlines() if line.strip()]
    return head + (" " + "; ".join(problems) if problems else "")


class _NoTracebackForConfigErrors(logging.Filter):
    """Flower logs an exception that ends a ServerApp with its traceback ("Simulation raised an exception", then
    every frame). A ``ConfigError`` is the user's input, not a bug, and :func:`main` has already logged it as one
    line naming the key and the fix: its record keeps Flower's line but loses the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ConfigError):
            record.exc_info = None
            record.exc_text = None
        return True


_QUIET = _NoTracebackForConfigErrors()

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower entry point (``server_app:app``). A bad run config (or a run folder that cannot be written) is logged
    as one ERROR line and fails the run, before anything heavy starts."""
    flower_log = logging.getLogger("flwr")
    if _QUIET not in flower_log.filters:
        flower_log.addFilter(_QUIET)
    try:
        with release_on_signal():  # SIGINT/SIGTERM (Flower's when the SuperLink dies): the run folder is freed first
            run_server(grid, dict(context.run_config))
    except ConfigError as err:
        log.error("%s", one_line(err))
        raise
