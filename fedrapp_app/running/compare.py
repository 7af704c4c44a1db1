"""``fedrapp-sim --compare``: which server rule on this setting, in one command.

The setting is the one a run would have (the app's defaults and ``-c``). none-fed, FedAvg, FedRAPP and FedRAPP's trust
option run on it (and the setting's own rule, when ``-c`` names another) over ``--seeds`` (default 0, 1, 2), each
run in this process through the bench machinery (``bench.compare``, ``bench.grid``): the ServerApp body, strategy
and ClientApp of ``flwr run``, with the same results, but without a SuperLink and a Ray start per run, and with the
rendered and embedded batches of a seed shared by its rules. One page and one figure say each rule's gain over
none-fed, paired by seed, with its 95% interval. Ctrl-C stops it; the same command resumes it (finished runs kept).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fedrapp_app.config import ConfigError, RunConfig

if TYPE_CHECKING:  # the bench (torch, matplotlib) is imported when a comparison runs, not when fedrapp-sim starts
    from fedrapp_app.bench.grid import BenchRunner
    from fedrapp_app.bench.schema import BenchSpec


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_compare(
    setting: Mapping[str, Any], seeds: Sequence[int], check: bool = False, given: Mapping[str, Any] | None = None
) -> int:
    """Check, run (or resume) and report the comparison on ``setting`` (a full run config, ``num-clients``
    resolved) over ``seeds``; the exit status (0 done, 1 a run failed, 2 bad input, 130 interrupted). ``check``:
    everything before the first run, then nothing. ``given``: the keys the user gave with ``-c``, which the page
    calls the user's setting (default: every key of ``setting`` that differs from the defaults)."""
    from fedrapp_app.bench.compare import (
        FIGURE,
        compare_spec,
        console_lines,
        rule_results,
        user_keys,
        write_compare_page,
        write_given,
    )
    from fedrapp_app.bench.estimate import GPU_CLASSES, cell_estimate, host_gpu_class
    from fedrapp_app.bench.grid import BenchRunner, format_duration, print_failures
    from fedrapp_app.bench.report import write_report
    from fedrapp_app.bench.schema import BenchError
    from fedrapp_app.bench.stats import settings_of
    from fedrapp_app.recording.runlock import check_writable
    from fedrapp_app.running.preflight import PreflightError, preflight

    try:
        spec = compare_spec(setting, seeds)
        runner = BenchRunner(spec)
        check_writable(runner.bench_dir, str(setting.get("output-dir", "")))
        runner.check()
        _check_same_setting(runner, spec)
        findings = [preflight(RunConfig.from_run_config(_first_cell(spec, seed))) for seed in seeds]
    except (BenchError, ConfigError, PreflightError, OSError) as err:
        print(f"fedrapp-sim: {err}", file=sys.stderr)
        return 2
    for line in findings[0].lines() if check else ():
        print(f"fedrapp-sim: {line}")
    for warning in findings[0].warnings():
        print(f"fedrapp-sim: warning: {warning}", file=sys.stderr, flush=True)
    labels = list(dict.fromkeys(m.labels["rule"] for cell in spec.cells for m in cell.memberships))
    pending = runner.pending()
    print(
        f"fedrapp-sim: comparing {', '.join(labels)} on this setting over seeds {', '.join(map(str, seeds))}: "
        f"{len(spec.cells)} runs in this process ({len(spec.cells) - len(pending)} finished before) in "
        f"{runner.bench_dir}",
        flush=True,
    )
    gpu = GPU_CLASSES.get(host_gpu_class() or "")  # None: the runs go on this host's CPU
    minutes = [cell_estimate(cell.overrides, gpu) for cell in pending]
    if pending and all(isinstance(m, tuple) for m in minutes):
        print(
            f"fedrapp-sim: about {format_duration(60 * sum(m[0] for m in minutes))} for the {len(pending)} runs to go "
            f"({estimate_basis(gpu.name if gpu else None, _load(), os.cpu_count() or 1)}; the progress lines tell "
            "as they go)",
            flush=True,
        )
    if check:
        print("fedrapp-sim: --check: nothing started")
        return 0
    write_given(runner.bench_dir, user_keys(setting) if given is None else given)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        runner.run(threads=None)  # torch's own threads: the runs go one after the other
    except KeyboardInterrupt:
        print(
            f"\nfedrapp-sim: interrupted; {len(runner.rows)} of {len(spec.cells)} runs are finished in "
            f"{runner.bench_dir}: the same command resumes the comparison",
            file=sys.stderr,
        )
        return 130
    except BenchError as err:
        print(f"fedrapp-sim: {err}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    if runner.rows:
        write_report(runner.bench_dir)  # curves and every number, under report/
        page = write_compare_page(runner.bench_dir)
        rows = [row for row in runner.rows if row["key"] in {cell.key for cell in spec.cells}]
        print("fedrapp-sim: online accuracy (%), mean ± std over the seeds; gain over none-fed, paired by seed [95%]:")
        print("\n".join(console_lines(rule_results(settings_of(rows), rows))))
        print(f"fedrapp-sim: the comparison in {page} (figure {page.parent / FIGURE})")
    return print_failures(
        runner.failures, f"fedrapp-sim: {len(runner.failures)} run(s) failed (the same command retries them):"
    )


def estimate_basis(gpu: str | None, load: float | None, cores: int) -> str:
    """What the time estimate assumes, in words: the measured costs on ``gpu`` (None: a 2-core CPU) with nothing
    else running; where the host's 1-minute ``load`` already fills half its ``cores`` or more, that it is busy and
    the runs will take longer (they share the cores; the estimate is not scaled, the slowdown is not linear)."""
    where = f"{gpu} to itself" if gpu else "2 quiet CPU cores"
    words = f"estimated for {where}: fedrapp_app/bench/estimate.py"
    if gpu is None and load is not None and load >= cores / 2:
        words += f"; this host's load is {load:.1f} on {cores} cores, so expect longer"
    return words


def _load() -> float | None:
    """The host's 1-minute load average, None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _check_same_setting(runner: BenchRunner, spec: BenchSpec) -> None:
    """``BenchError`` when the folder holds runs of another setting (a run-name given to two settings): one page
    would mix them."""
    from fedrapp_app.bench.schema import BenchError

    ours = {cell.key for cell in spec.cells}
    foreign = [row["id"] for row in runner.rows if row["key"] not in ours]
    if foreign:
        raise BenchError(
            f"{runner.bench_dir} holds {len(foreign)} run(s) of another setting (e.g. {foreign[0]}): give this "
            "comparison a run-name of its own (or leave run-name out: each setting gets its folder), or delete "
            "that folder to start over"
        )


def _first_cell(spec: BenchSpec, seed: int) -> dict[str, Any]:
    """The overrides of the grid's first run on ``seed`` (every rule of a seed reads the same streams)."""
    return next(cell.overrides for cell in spec.cells if cell.overrides.get("seed", 0) == seed)
