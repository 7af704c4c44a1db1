"""What travels between server and clients, and the checks every client reply must pass.

A prompt is a list of K context blocks; on the wire it is one ``ArrayRecord`` with arrays ``block-0`` …
``block-{K-1}`` (float32); the server works on the flattened float32 vector. A client's train reply is
``{"prompt": ArrayRecord, "metrics": MetricRecord}`` (plus, optionally, ``"notes": ConfigRecord``: text for
the results, such as the files it could not decode); its metrics carry what the server rule may read
(``client-id``, ``h-pre``, ``h-post``, ``num-examples``; optionally ``h-own``, the mean prediction entropy of the
client's own last tuned prompt on the batch, ``hm-pre`` / ``hm-own``, the entropy of the batch-mean prediction
of the received and of the own prompt, and ``v-pre`` / ``v-own``, the neighbour votes for each where the two
disagree, which FedRAPP's trust option reads; with its probe, ``h-probe`` and ``hm-probe``, the entropies of the
probe the server sent beside the prompt) and reporting values that only the
results recorder reads (accuracy counts, timings). A train message holds ``"prompt"`` and ``"config"`` and, when the
server rule asks a client to score a second prompt (FedRAPP's probe), ``"probe"`` (an ArrayRecord like the prompt).

**Payloads: arrays other than a prompt.** A method may upload arrays beside its prompt (Latte: class prototypes
[C, E] and their entropies [C]) and a rule may send each client arrays beside its prompt (Latte: its peers'
prototypes). Both travel as an ArrayRecord ``"payload"`` of float32 arrays by name: in the query reply (the
method's ``payload_template``, whose names and shapes the server then holds every client to), in a train reply
(the method's ``Adaptation.payload``) and in a train message (the rule's ``RoundOutput.state`` entries
``payload.NAME``, row i to client i). An uploaded payload is validated like a prompt: exactly the template's names,
float32, the template's shapes, finite values, and at most :data:`MAX_PAYLOAD_VALUES` values in all; a reply that
fails is rejected, as a bad prompt is. A method never sees a label, so neither does its payload.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from fedrapp_app.aggregation.common import PROBE, PROBES  # noqa: F401 - PROBES: the wire's names
from fedrapp_app.metrics.calibration import Bins, bins_from_metrics

PROMPT = "prompt"
PAYLOAD = "payload"  # optional ArrayRecord: arrays a method uploads or a rule sends beside the prompt
#: The most values a payload may hold (float32: 256 MiB), whatever its template says: one client cannot make the
#: server hold more than that per round.
MAX_PAYLOAD_VALUES = 1 << 26
METRICS = "metrics"
CONFIG = "config"
INFO = "info"
NOTES = "notes"  # optional ConfigRecord of a train reply: text for the results (e.g. undecodable files)
#: Under dp: the noise std of a released vote and of a released entropy (public: the budget, the clip, the prompt's
#: size and the classes fix them), which the trust option reads to tell evidence from noise.
DP_SIGMAS = ("dp-sigma-vote", "dp-sigma-entropy")
#: Optional ArrayRecords of a train message (a rule's probes, ``aggregation.common.PROBES``): prompts to score
#: beside the own prompt; each one's scores come back as ``h-<x>``, ``hm-<x>``, ``v-<x>``, ``v-own-<x>``.
PROBE_METRICS = {PROBE: "probe"}

#: Metrics the server rule reads; everything else in a reply's metrics is for reporting only.
RULE_METRICS = ("client-id", "h-pre", "h-post", "num-examples")
#: Metrics the server rule reads when a reply has them (a reply without them is valid; the rule then sees None):
#: what a client reports about its own last tuned prompt on the batch (FedRAPP's trust option reads them).
OPTIONAL_RULE_METRICS = (
    ("h-own", "hm-pre", "hm-own", "v-pre", "v-own")
    + tuple(f"{kind}-{x}" for x in PROBE_METRICS.values() for kind in ("h", "hm", "v", "v-own"))
    + DP_SIGMAS
)
#: The Upload fields that hold them, in the same order.
OWN_PROMPT_FIELDS = tuple(key.replace("-", "_") for key in OPTIONAL_RULE_METRICS)
#: Those that are neighbour votes, shares of a batch in [0, 1] (the others are entropies, >= 0).
VOTE_METRICS = tuple(key for key in OPTIONAL_RULE_METRICS if key.startswith("v-"))
#: The optional rule metrics that are data (released through the mechanism under dp): all but the public sigmas.
RELEASED_METRICS = tuple(key for key in OPTIONAL_RULE_METRICS if key not in DP_SIGMAS)


# ----- what a private reply may carry (dp = true) -------------------------------------------------------------
#: Under dp, the only metrics a train reply may carry, each with why the server may see it. Everything else a
#: client computes (right predictions, calibration bins, per-domain counts, the method's statistics, skipped samples,
#: timings) stays on the client, in its outcome file (``recording/outcomes.py``). The protected unit is a client's
#: stream of a known length: replacing its images (and labels) by any other stream of that length changes none of the
#: public values below, and the released ones only through the mechanism.
PRIVATE_REPLY_METRICS: dict[str, str] = {
    "client-id": "the client the server sent the message to (the protocol's address)",
    "stream-position": "the batch the server asked for (it sent the position in the message)",
    "remaining-batches": "the stream's length minus the position: the stream's length is public",
    "num-examples": "the batch's size, fixed by batch-size and the stream's length",
    "h-pre": "released through the mechanism: clamped to [0, ln C] and noised",
    "h-post": "released through the mechanism: clamped to [0, ln C] and noised",
    **{key: "released through the mechanism: clamped to its range and noised" for key in RELEASED_METRICS},
    "dp-noise": "the noise multiplier: a function of (epsilon, delta) and the stream's length",
    "dp-rounds": "the releases the noise was calibrated for: the stream's length in batches",
    "dp-sigma-vote": "the noise of a released vote: a function of the budget and the public ranges",
    "dp-sigma-entropy": "the noise of a released entropy: a function of the budget, ln C and the public ranges",
    "dp-seeded": "whether FEDRAPP_DP_SEED seeds the noise: a fact of the client's set-up, not of its data",
    "dp-replayed": "1 when the reply repeats the release of a position asked again (nothing new is released)",
    "exhausted": "the stream ended: its length is public",
    "skipped-batch": "no file of the batch could be decoded: a fact of the storage, not of the images' content",
    "model-loaded": "whether this process loaded the frozen model for this round (a fact of the process)",
    "state-rebuilt": "whether the client lost its state and rebuilt it (a fact of the process)",
    "pid": "the process that served the round (a fact of the deployment)",
}
#: Under dp, the only notes a train reply may carry: where the client ran (facts of the deployment, not the data).
PRIVATE_REPLY_NOTES: dict[str, str] = {
    "host": "the host name the client ran on",
    "ray-node": "the Ray node of the simulation engine",
    "device": "the device the client computed on",
}


def private_reply(metrics: Mapping, notes: Mapping) -> tuple[dict, dict, dict]:
    """(metrics, notes, withheld) of a reply under dp: the allow-listed metrics and notes, and everything else
    (``{"metrics": ..., "notes": ...}``), which the client keeps in its outcome file."""
    withheld = {
        "metrics": {k: v for k, v in metrics.items() if k not in PRIVATE_REPLY_METRICS},
        "notes": {k: v for k, v in notes.items() if k not in PRIVATE_REPLY_NOTES},
    }
    public_metrics = {k: v for k, v in metrics.items() if k in PRIVATE_REPLY_METRICS}
    return public_metrics, {k: v for k, v in notes.items() if k in PRIVATE_REPLY_NOTES}, withheld


def outside_private_reply(content: RecordDict) -> list[str]:
    """The metric and note names of a reply beyond what a private reply may carry (the server refuses those under
    dp: a client of another version, or one that does not filter)."""
    metrics = content.metric_records.get(METRICS)
    notes = content.config_records.get(NOTES)
    extra = [k for k in (metrics or {}) if k not in PRIVATE_REPLY_METRICS]
    return sorted(extra + [f"notes.{k}" for k in (notes or {}) if k not in PRIVATE_REPLY_NOTES])


def probe_metrics(name: str, score) -> dict[str, float]:
    """The metrics of probe ``name`` (a ``methods.base.ProbeScore``) in a train reply."""
    x = PROBE_METRICS[name]
    return {f"h-{x}": score.h_probe, f"hm-{x}": score.hm_probe, f"v-{x}": score.v_probe, f"v-own-{x}": score.v_own}


def prompt_to_record(blocks: Sequence[np.ndarray]) -> ArrayRecord:
    """K blocks (any float dtype, torch or numpy) -> ArrayRecord of float32 arrays ``block-k``."""
    return ArrayRecord({f"block-{k}": Array(np.asarray(b, dtype=np.float32)) for k, b in enumerate(blocks)})


def record_to_prompt(record: ArrayRecord) -> list[np.ndarray]:
    """ArrayRecord ``block-0..K-1`` -> list of K numpy blocks, in order."""
    return [record[f"block-{k}"].numpy() for k in range(len(record))]


def arrays_to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """A dict of numpy arrays (a method's persistent state) -> ArrayRecord, bit-exact."""
    return ArrayRecord({name: Array(np.asarray(a)) for name, a in arrays.items()})


def record_to_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """Inverse of ``arrays_to_record``."""
    return {name: arr.numpy() for name, arr in record.items()}


def flatten(blocks: Sequence[np.ndarray]) -> np.ndarray:
    """K blocks -> one float32 vector [d], d = sum of the block sizes."""
    return np.concatenate([np.asarray(b, dtype=np.float32).ravel() for b in blocks])


def unflatten(vector: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Float vector [d] -> K float32 blocks of the given shapes."""
    sizes = [math.prod(s) for s in shapes]
    if vector.shape != (sum(sizes),):
        raise ValueError(f"prompt vector of shape {vector.shape} does not fit blocks {list(shapes)}")
    parts = np.split(np.asarray(vector, dtype=np.float32), np.cumsum(sizes)[:-1])
    return [p.reshape(s) for p, s in zip(parts, shapes, strict=True)]


@dataclass(frozen=True)
class Upload:
    """A validated train reply: what the server rule may use, plus the reporting metrics."""

    client_id: int
    prompt: np.ndarray  # [d] float32, finite
    h_pre: float
    h_post: float
    num_examples: int
    report: dict[str, float | int | list]
    h_own: float | None = None  # entropy of the client's own last tuned prompt on the batch (when reported)
    hm_pre: float | None = None  # entropy of the received prompt's batch-mean prediction (when reported)
    hm_own: float | None = None  # the same for the own prompt
    v_pre: float | None = None  # neighbour vote for the received prompt against the own one, in [0, 1] (when reported)
    v_own: float | None = None  # the same for the own prompt
    h_probe: float | None = None  # the probe's entropy on the batch (when the server sent one)
    hm_probe: float | None = None  # entropy of the probe's batch-mean prediction
    v_probe: float | None = None  # neighbour vote for the probe against the own prompt, in [0, 1]
    v_own_probe: float | None = None  # the same for the own prompt
    dp_sigma_vote: float | None = None  # under dp: the noise std of a released vote (public)
    dp_sigma_entropy: float | None = None  # the same for an entropy
    payload: dict[str, np.ndarray] | None = None  # arrays uploaded beside the prompt (validated; None: none)

    @property
    def upload_bytes(self) -> int:
        """What the client uploaded for the rule: its prompt and its payload, in bytes (float32)."""
        return int(self.prompt.nbytes + sum(a.nbytes for a in (self.payload or {}).values()))


class RejectedReply(ValueError):
    """A reply that fails validation; its message says why. The round goes on without it."""


def _finite_number(metrics: Mapping, key: str) -> float:
    value = metrics[key]
    if isinstance(value, list) or not math.isfinite(float(value)):
        raise RejectedReply(f"metric {key!r} is not a finite number ({value!r})")
    return float(value)


def payload_shapes(template: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """The names and shapes a method's payload template sets (float32 arrays, :data:`MAX_PAYLOAD_VALUES` at most
    in all); ``ValueError`` for a template that breaks them."""
    shapes = {}
    for name, array in template.items():
        array = np.asarray(array)
        if not name or array.dtype != np.float32:
            raise ValueError(f"payload array {name!r} is {array.dtype}, expected float32 (and a name)")
        shapes[name] = tuple(int(n) for n in array.shape)
    if sum(math.prod(shape) for shape in shapes.values()) > MAX_PAYLOAD_VALUES:
        raise ValueError(f"the payload template holds more than {MAX_PAYLOAD_VALUES} values")
    return shapes


def parse_payload(record: ArrayRecord, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """An uploaded payload, validated like a prompt: the template's names (nothing else), float32, its shapes,
    finite values, within :data:`MAX_PAYLOAD_VALUES`; ``RejectedReply`` says what is wrong."""
    if sorted(record.keys()) != sorted(shapes):
        raise RejectedReply(f"payload arrays {sorted(record.keys())}, expected {sorted(shapes)}")
    total, arrays = 0, {}
    for name, shape in shapes.items():
        array = record[name]
        if array.dtype != "float32" or tuple(array.shape) != tuple(shape):
            raise RejectedReply(f"payload {name} is {array.dtype}{list(array.shape)}, expected float32{list(shape)}")
        total += math.prod(shape)
        if total > MAX_PAYLOAD_VALUES:
            raise RejectedReply(f"the payload holds more than {MAX_PAYLOAD_VALUES} values")
        value = array.numpy()
        if not np.isfinite(value).all():
            raise RejectedReply(f"payload {name} holds NaN or Inf")
        arrays[name] = value
    return arrays


def parse_train_reply(
    content: RecordDict,
    expected_client: int,
    shapes: Sequence[tuple[int, ...]],
    max_norm: float,
    payload: Mapping[str, tuple[int, ...]] | None = None,
) -> Upload:
    """Validate a train reply's content; raise ``RejectedReply`` with the reason when it is malformed.

    Checks: the record names (nothing else), the reported client id (must be the one the message was sent to), the
    required metrics (finite, entropies >= 0, a positive example count), the number, names, shapes and
    dtype (float32) of the prompt blocks, finite values and a norm below ``max_norm``; with ``payload`` (the
    names and shapes of the method's payload template), the payload as :func:`parse_payload` says.
    """
    allowed = {PROMPT, METRICS, NOTES} | ({PAYLOAD} if payload else set())
    extra = sorted(set(content.keys()) - allowed)
    if extra:
        raise RejectedReply(f"unexpected records {extra} (a train reply holds only {sorted(allowed)})")
    if NOTES in content and NOTES not in content.config_records:
        raise RejectedReply(f"{NOTES!r} must be a ConfigRecord")
    if METRICS not in content.metric_records:
        raise RejectedReply(f"no MetricRecord {METRICS!r} in the reply")
    metrics = content.metric_records[METRICS]
    missing = [k for k in RULE_METRICS if k not in metrics]
    if missing:
        raise RejectedReply(f"missing metrics {missing}")
    client = _finite_number(metrics, "client-id")
    if client != expected_client:
        raise RejectedReply(f"reports client-id {client:g}, but the message went to client {expected_client}")
    h_pre, h_post = _finite_number(metrics, "h-pre"), _finite_number(metrics, "h-post")
    if h_pre < 0 or h_post < 0:
        raise RejectedReply(f"negative entropy (h-pre={h_pre}, h-post={h_post})")
    num_examples = _finite_number(metrics, "num-examples")
    if num_examples < 1 or num_examples != int(num_examples):
        raise RejectedReply(f"num-examples must be a positive integer, got {num_examples}")
    own = {}
    for key, field_name in zip(OPTIONAL_RULE_METRICS, OWN_PROMPT_FIELDS, strict=True):
        value = own[field_name] = _finite_number(metrics, key) if key in metrics else None
        if value is not None and key in VOTE_METRICS and not 0 <= value <= 1:
            raise RejectedReply(f"{key}={value} is not a share of the batch in [0, 1]")
        if value is not None and value < 0:
            raise RejectedReply(f"negative entropy ({key}={value})")

    if PROMPT not in content.array_records:
        raise RejectedReply(f"no ArrayRecord {PROMPT!r} in the reply")
    record = content.array_records[PROMPT]
    expected_names = [f"block-{k}" for k in range(len(shapes))]
    if list(record.keys()) != expected_names:
        raise RejectedReply(f"prompt arrays {list(record.keys())}, expected {expected_names}")
    blocks = []
    for name, shape in zip(expected_names, shapes, strict=True):
        array = record[name]
        if array.dtype != "float32" or tuple(array.shape) != tuple(shape):
            raise RejectedReply(f"{name} is {array.dtype}{list(array.shape)}, expected float32{list(shape)}")
        blocks.append(array.numpy())
    vector = flatten(blocks)
    if not np.isfinite(vector).all():
        raise RejectedReply("prompt holds NaN or Inf")
    norm = float(np.linalg.norm(vector.astype(np.float64)))
    if norm > max_norm:
        raise RejectedReply(f"prompt norm {norm:.3g} exceeds the limit {max_norm:.3g}")
    arrays = None
    if payload:
        if PAYLOAD not in content.array_records:
            raise RejectedReply(f"no ArrayRecord {PAYLOAD!r} in the reply (the method's template has one)")
        arrays = parse_payload(content.array_records[PAYLOAD], payload)
    report = {k: v for k, v in metrics.items() if k not in RULE_METRICS + OPTIONAL_RULE_METRICS}
    return Upload(int(client), vector, h_pre, h_post, int(num_examples), report, **own, payload=arrays)


# ----- what the results read besides accuracy (ours) ---------------------------------------------------------
#: Reporting metrics with a shape the server checks: the calibration bins after (``calib-*``) and before
#: (``calib-before-*``) adaptation, and the samples and right predictions per shift domain (``domain-*``; the
#: domains' names travel in the notes, ``domains``).
CALIBRATION_PREFIXES = {"calib": "calibration", "calib-before": "calibration_before"}
OUTCOME_METRICS = tuple(f"{p}-{k}" for p in CALIBRATION_PREFIXES for k in ("n", "correct", "confidence")) + (
    "domain-n",
    "domain-correct",
)


@dataclass(frozen=True)
class Outcome:
    """A reply's calibration bins (None where the method gives no confidences) and ``{domain: (samples,
    right)}`` (empty without shift domains)."""

    calibration: Bins | None = None
    calibration_before: Bins | None = None
    domains: dict[str, tuple[int, int]] = field(default_factory=dict)


def parse_outcome(report: Mapping, domain_names: Sequence[str], num_examples: int) -> Outcome:
    """The checked :class:`Outcome` of a reply's reporting metrics; ``RejectedReply`` says what is malformed
    (the results would otherwise add it up)."""
    bins = {}
    for prefix, name in CALIBRATION_PREFIXES.items():
        keys = {k: f"{prefix}-{k}" for k in ("n", "correct", "confidence")}
        present = [key for key in keys.values() if key in report]
        if not present:
            continue
        try:
            bins[name] = bins_from_metrics({k: report[key] for k, key in keys.items()}, num_examples)
        except (KeyError, ValueError) as err:
            raise RejectedReply(f"{prefix}-*: {err}") from None
    domains: dict[str, tuple[int, int]] = {}
    if "domain-n" in report or "domain-correct" in report or domain_names:
        n, right = report.get("domain-n"), report.get("domain-correct")
        ok = isinstance(n, list) and isinstance(right, list) and len(n) == len(right) == len(domain_names) > 0
        counts = zip(n, right, strict=True) if ok else ()
        ok = ok and all(isinstance(a, int) and isinstance(b, int) and 0 <= b <= a for a, b in counts)
        ok = ok and len(set(domain_names)) == len(domain_names) and sum(n) == num_examples
        if not ok:
            raise RejectedReply(
                f"domain-n={n!r}, domain-correct={right!r} do not fit the notes' domains {list(domain_names)!r} "
                f"and {num_examples} examples"
            )
        domains = {d: (a, b) for d, a, b in zip(domain_names, n, right, strict=True)}
    return Outcome(bins.get("calibration"), bins.get("calibration_before"), domains)


def outcome_fields(outcome: Outcome) -> dict[str, Any]:
    """A row's calibration and shift-domain fields: ``ece`` / ``ece_before`` of the batch and the bins that add
    up to the run's (``calibration`` / ``calibration_before``); ``domains`` ``{name: [samples, right]}`` and
    ``domain`` (the batch's one domain, or ``"mixed"``)."""
    out: dict[str, Any] = {}
    for name, bins in (("calibration", outcome.calibration), ("calibration_before", outcome.calibration_before)):
        if bins is not None:
            out[name] = bins.as_lists()
            out["ece" + name[len("calibration") :]] = bins.ece
    if outcome.domains:
        out["domains"] = {d: list(counts) for d, counts in outcome.domains.items()}
        out["domain"] = next(iter(outcome.domains)) if len(outcome.domains) == 1 else "mixed"
    return out


def scored_fields(report: Mapping[str, Any], outcome: Outcome, num_examples: int) -> tuple[dict[str, Any], dict]:
    """(fields, rest) of a scored reply's reporting metrics: the row fields that come from scoring the predictions
    against the labels (``correct``, ``correct_before``, ``acc``, ``acc_before``, the :func:`outcome_fields`,
    ``acc_own``, ``acc_probe``; only those the metrics hold: none under dp, where they stay on the client), and the
    metrics left for the row's ``client_metrics``."""
    rest = {k: v for k, v in report.items() if k not in OUTCOME_METRICS and k != "skipped"}
    fields: dict[str, Any] = {}
    for key, name, acc in (("correct", "correct", "acc"), ("correct-before", "correct_before", "acc_before")):
        if key in rest:
            fields[name] = int(rest.pop(key))
            fields[acc] = fields[name] / num_examples
    fields.update(outcome_fields(outcome))
    for key, acc in (("correct-own", "acc_own"), (f"correct-{PROBE_METRICS[PROBE]}", "acc_probe")):
        if key in rest:
            fields[acc] = int(rest.pop(key)) / num_examples
    return fields, rest
