"""The local-method interface (SPEC §3) and the small pieces every method shares.

A method gets the round's received prompt (K blocks, float32) and a preprocessed unlabeled batch, and
returns an :class:`Adaptation`. Its persistent client state (buffers, optimizer moments, counters) goes
to and from a dict of plain numpy arrays (scalars as 0-d arrays), which is what a Flower ``ArrayRecord``
holds, so the client process may change between rounds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from fedrapp_app.engine.devices import to_device_once, to_host_once
from fedrapp_app.engine.prompts import PromptedCLIP


@dataclass
class Adaptation:
    """What one local step returns (B = batch size)."""

    prompt: list[Tensor]  # tuned blocks P~ (detached, float32, cpu)
    predictions: Tensor  # [B] long: the online prediction, after adaptation
    predictions_before: Tensor  # [B] long: with the received prompt, before adaptation
    h_pre: float  # mean prediction entropy on the batch, received prompt
    h_post: float  # the same after adaptation
    stats: dict[str, float] = field(default_factory=dict)  # method diagnostics
    # The predictions' confidences, for calibration (ECE); None where a method does not give them:
    confidence: Tensor | None = None  # [B] float: the online prediction's probability (its top softmax value)
    confidence_before: Tensor | None = None  # [B] float: the same for the received prompt's prediction
    # With ``own_prompt`` on (ours): the client's own last tuned prompt P~(t-1) scored on this batch, before
    # adaptation. None in its first round (no own prompt yet) and when off.
    h_own: float | None = None  # mean prediction entropy of the own prompt (what FedRAPP's trust option reads)
    hm_pre: float | None = None  # entropy of the batch-mean prediction, received prompt (read by the same)
    hm_own: float | None = None  # the same, own prompt
    v_pre: float | None = None  # neighbour vote for the received prompt against the own one (neighbour_votes)
    v_own: float | None = None  # the same for the own prompt
    predictions_own: Tensor | None = None  # [B] long: its predictions (scored for the analysis only)
    # The prompts the server sent to score beside (FedRAPP's probes), each against the own prompt, by name:
    probes: dict[str, ProbeScore] = field(default_factory=dict)
    # What a prediction step stacked on the method reads (``methods/stacked.py``), so that no tower runs twice:
    features: Tensor | None = None  # [B, E] the batch's image features (original views, L2-normalised)
    text_features: Tensor | None = None  # [K, C, E] the class features of the tuned prompt ``prompt``
    # Arrays uploaded beside the prompt (a method with ``uploads_payload``; Latte: class prototypes), float32 by
    # name, with the names and shapes of ``LocalMethod.payload_template``; validated by the server like a prompt.
    payload: dict[str, np.ndarray] | None = None

    @property
    def probe(self) -> ProbeScore | None:
        """The score of the probe named :data:`PROBE` (FedRAPP's: the paper's prompt), if one was sent."""
        return self.probes.get(PROBE)


#: What an :class:`Adaptation` may report as read off the prompts alone on the batch (the conformance kit
#: recomputes these): ``h_pre`` the received prompt's mean prediction entropy (nats), ``h_post`` the returned
#: prompt's, ``predictions`` the returned prompt's argmax, ``predictions_before`` the received prompt's.
READ_OFF_PROMPTS = frozenset({"h_pre", "h_post", "predictions", "predictions_before"})

#: The name of FedRAPP's trust probe (the paper's prompt) among the prompts a rule sends to score
#: (``LocalMethod.set_probes``; the others: ``federation.records.PROBES``).
PROBE = "probe"


class LocalMethod(ABC):
    """A test-time method: initial prompt, one adaptation step per batch, persistent state as arrays."""

    name: ClassVar[str]
    own: OwnPrompt | None = None  # the own last tuned prompt, where the method keeps it (ours, issue 15)
    #: The method uploads arrays beside its prompt (``Adaptation.payload``; ``payload_template`` says which).
    uploads_payload: ClassVar[bool] = False
    #: Which of its reports are read off the prompts alone (:data:`READ_OFF_PROMPTS`; the conformance kit
    #: recomputes them): a method that predicts otherwise by design (a head's cache, per-image prompts, a fixed
    #: text classifier) leaves out what it computes another way. A property may read the parameters.
    read_off_prompts: frozenset[str] = READ_OFF_PROMPTS

    def payload_template(self, pclip: PromptedCLIP) -> dict[str, np.ndarray]:
        """The arrays the method uploads beside its prompt every round, by name (float32, their values unused):
        the server learns their names and shapes at discovery and refuses an upload that differs. None: {}."""
        return {}

    def receive(self, payload: Mapping[str, np.ndarray]) -> None:
        """Arrays the server's rule sent this client for this round (``RoundOutput.state`` entries
        ``payload.NAME``), given before ``adapt``; a method that expects none ignores them."""
        return None

    def set_probe(self, probe: Sequence[np.ndarray] | None) -> None:
        """A second prompt (K blocks) for this round's ``adapt`` to score against the own one (FedRAPP's probe,
        ours); a method that keeps no own prompt (zero-shot) has nothing to score it against and ignores it."""
        self.set_probes({} if probe is None else {PROBE: probe})

    def set_probes(self, probes: Mapping[str, Sequence[np.ndarray]]) -> None:
        """Prompts (K blocks each, by name) for this round's ``adapt`` to score against the own one, as
        :meth:`set_probe` does for one."""
        if self.own is not None:
            self.own.probes = {
                name: [np.asarray(block, dtype=np.float32) for block in blocks] for name, blocks in probes.items()
            }

    @abstractmethod
    def initial_prompt(self, pclip: PromptedCLIP) -> list[Tensor]:
        """P0: K blocks Tensor[n_k, D] (or [C, n_k, D] with class-specific context) float32 on cpu, identical
        on all clients."""

    @abstractmethod
    def adapt(
        self, pclip: PromptedCLIP, prompt: Sequence[Tensor], pixel_values: Tensor, generator: torch.Generator
    ) -> Adaptation:
        """Adapt on one unlabeled batch Tensor[B, 3, H, W] starting from the received ``prompt``."""

    def state_dict(self) -> dict[str, np.ndarray]:
        """Persistent client state as plain numpy arrays (empty for stateless methods)."""
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` produced; stateless methods accept only an empty dict."""
        if state:
            raise ValueError(f"method {self.name!r} keeps no client state but got keys {sorted(state)}")


# ----- shared math ----------------------------------------------------------------------------------
def entropy(logits: Tensor) -> Tensor:
    """Prediction entropy of softmax(logits) along the last axis: Tensor[..., C] -> Tensor[...]."""
    log_probs = logits.float().log_softmax(-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def predicted(logits: Tensor) -> tuple[Tensor, Tensor]:
    """(predictions Tensor[B] long, their probabilities under softmax Tensor[B] float32) of logits Tensor[B, C],
    on the cpu, read from the device in one copy."""
    (host,) = to_host_once([logits])
    return host.argmax(-1), host.softmax(-1).amax(-1)


def scored(after: Tensor, before: Tensor) -> dict[str, Tensor]:
    """The :class:`Adaptation` fields read off the logits after and before adaptation (Tensor[B, C] each) in one
    device-to-host copy: ``predictions`` and ``predictions_before`` [B] long, ``confidence`` and
    ``confidence_before`` [B] float32 (the predicted class's probability)."""
    after, before = to_host_once([after, before])
    return {
        "predictions": after.argmax(-1),
        "predictions_before": before.argmax(-1),
        "confidence": after.softmax(-1).amax(-1),
        "confidence_before": before.softmax(-1).amax(-1),
    }


def mean_entropy(logits: Tensor) -> float:
    """Mean prediction entropy over a batch of logits Tensor[B, C]."""
    return float(entropy(logits.detach()).mean())


def initial_context(pclip: PromptedCLIP, text: str, class_specific: bool) -> Tensor:
    """The context of an init text: Tensor[n, D], or Tensor[C, n, D] with one copy per class (CoOp's
    class-specific context, CSC). Every class starts from the same words, so P0 is the same on all clients
    and its class features equal the shared context's."""
    context = pclip.context_from_text(text)
    return context.expand(len(pclip.classnames), *context.shape).clone() if class_specific else context


def check_prompt(prompt: Sequence[Tensor], reference: Sequence[Tensor], method: str) -> list[Tensor]:
    """The received prompt, validated against the method's block shapes, as float32 cpu copies."""
    shapes = [tuple(block.shape) for block in prompt]
    expected = [tuple(block.shape) for block in reference]
    if shapes != expected:
        raise ValueError(f"{method}: the received prompt has blocks {shapes}, expected {expected}")
    blocks = [torch.as_tensor(block).detach().to("cpu", torch.float32).clone() for block in prompt]
    if not all(torch.isfinite(block).all() for block in blocks):
        raise ValueError(f"{method}: the received prompt has non-finite values")
    return blocks


def detached(blocks: Sequence[Tensor]) -> list[Tensor]:
    """Blocks as detached float32 cpu copies (the form an Adaptation carries), read from the device at once."""
    return to_host_once(blocks)


# ----- the own prompt (ours: FedRAPP's trust option, issue 15) ---------------------------------------------
@dataclass(frozen=True)
class OwnScore:
    """The own last tuned prompt P~(t-1) on this round's batch, beside the received prompt (B = batch size)."""

    h_own: float  # mean prediction entropy of the own prompt
    hm_pre: float  # entropy of the batch-mean prediction of the received prompt
    hm_own: float  # the same for the own prompt
    v_pre: float  # the images' neighbours' vote for the received prompt where the two disagree (neighbour_votes)
    v_own: float  # the same for the own prompt
    predictions: Tensor  # [B] long
    stats: dict[str, float]  # for the analysis: the marginal entropies and the agreement with the received prompt
    probes: dict[str, ProbeScore] = field(default_factory=dict)  # the probes the server sent, by name


@dataclass(frozen=True)
class ProbeScore:
    """A probe (a prompt the server sent to score: the paper's prompt) against the own one on this batch."""

    h_probe: float  # mean prediction entropy of the probe
    hm_probe: float  # entropy of its batch-mean prediction
    predictions: Tensor  # [B] long (scored for the analysis only)
    v_probe: float = 0.0  # the images' neighbours' vote for the probe where it and the own prompt disagree
    v_own: float = 0.0  # the same for the own prompt


#: Neighbours per disagreement in :func:`neighbour_votes` (a handful: a batch of 64 holds a few images per class).
NEIGHBOURS = 5


def neighbour_votes(
    features: Tensor, predictions_a: Tensor, predictions_b: Tensor, k: int = NEIGHBOURS
) -> tuple[float, float]:
    """Which of two prompts do the images' neighbours side with where the two disagree? -> (score_a, score_b).

    ``features`` Tensor[B, E] (L2-normalised image features), ``predictions_a`` / ``predictions_b`` Tensor[B] long.
    The images both prompts label alike (the agreement set A) are the referees: each image x on which they differ
    asks its ``k`` most similar images in A (cosine of the frozen image features) and the prompt whose label matches
    a larger share of their (common) labels gets that share. Scores are sums over the disagreements divided by B,
    so score_a − score_b is in [−1, 1]; (0, 0) when the prompts agree everywhere or nowhere. The referees are
    neither prompt's own objective nor the zero-shot prompt: labels propagate from images of the same batch.
    """
    agree = predictions_a == predictions_b
    if bool(agree.all()) or not bool(agree.any()):
        return 0.0, 0.0
    features = features.detach().float()
    ref_features, ref_labels = features[agree], predictions_a[agree]
    similar = (features[~agree] @ ref_features.T).topk(min(k, int(agree.sum())), dim=1).indices  # [|D|, k]
    votes = ref_labels.to(similar.device)[similar]  # [|D|, k]
    batch = predictions_a.shape[0]
    score_a = (votes == predictions_a[~agree].to(votes.device)[:, None]).float().mean(1).sum() / batch
    score_b = (votes == predictions_b[~agree].to(votes.device)[:, None]).float().mean(1).sum() / batch
    return float(score_a), float(score_b)


def batch_marginal_entropy(logits: Tensor) -> float:
    """Entropy of the batch-mean prediction of logits Tensor[B, C] (low when a prompt predicts few classes)."""
    mean = logits.detach().float().softmax(-1).mean(0)
    return float(-(mean * mean.clamp_min(1e-30).log()).sum())


class OwnPrompt:
    """This client's own last tuned prompt, kept in the method's client state (keys ``own.block-k``) so that the
    next round can score it on the new batch (one text pass, no gradient; the image features are the round's).

    It answers "what would this client have predicted had it kept its own prompt?" -- the counterfactual of
    none-fed -- next to the received prompt's H_pre, so that the server can tell whether what it sent beat
    what the client had alone (FedRAPP's trust option, ours). Off (``enabled`` False) it keeps nothing.
    """

    PREFIX = "own."

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.blocks: list[np.ndarray] | None = None  # float32 blocks of P~(t-1)
        self.probes: dict[str, list[np.ndarray]] = {}  # this round's probes (LocalMethod.set_probes), scored beside

    def score(
        self, pclip: PromptedCLIP, received: Sequence[Tensor], features: Tensor, received_logits: Tensor
    ) -> OwnScore | None:
        """Score the kept prompt on image features Tensor[B, E] (None when off or before the first round).

        ``received``: the round's received blocks (the kept ones must have their shapes); ``received_logits``
        Tensor[B, C]: the received prompt's logits on the same features (for the stats).
        """
        if not self.enabled or self.blocks is None:
            return None
        expected = [tuple(b.shape) for b in received]
        kept = [b.shape for b in self.blocks]
        if kept != expected:
            raise ValueError(
                f"the kept own prompt has blocks {kept}, the received prompt {expected}: this client state "
                "belongs to another method or setting"
            )
        for name, blocks in self.probes.items():
            if [b.shape for b in blocks] != expected:
                raise ValueError(
                    f"the {name} has blocks {[b.shape for b in blocks]}, the received prompt {expected}: a probe "
                    "must have the prompt's shapes"
                )
        logits = _scored(pclip, self.blocks, features)
        predictions = logits.argmax(-1).cpu()
        received = received_logits.detach()
        hm_own, hm_pre = batch_marginal_entropy(logits), batch_marginal_entropy(received)
        received_predictions = received.argmax(-1).cpu()
        vote_received, vote_own = neighbour_votes(features.cpu(), received_predictions, predictions)
        probes = {}
        for name, blocks in self.probes.items():
            probe_logits = _scored(pclip, blocks, features)
            probe_predictions = probe_logits.argmax(-1).cpu()
            vote_probe, vote_against = neighbour_votes(features.cpu(), probe_predictions, predictions)
            probes[name] = ProbeScore(
                mean_entropy(probe_logits), batch_marginal_entropy(probe_logits), probe_predictions, vote_probe,
                vote_against,
            )  # fmt: skip
        return OwnScore(
            h_own=mean_entropy(logits),
            hm_pre=hm_pre,
            hm_own=hm_own,
            v_pre=vote_received,
            v_own=vote_own,
            predictions=predictions,
            stats={
                "own_marginal_entropy": hm_own,
                "received_marginal_entropy": hm_pre,
                "own_agreement": float((predictions == received_predictions).float().mean()),
            },
            probes=probes,
        )

    def keep(self, tuned: Sequence[Tensor]) -> None:
        """Remember the round's tuned prompt P~ (detached float32 cpu blocks) for the next round."""
        if self.enabled:
            self.blocks = [np.array(torch.as_tensor(block).detach().cpu().float().numpy()) for block in tuned]

    def state_arrays(self) -> dict[str, np.ndarray]:
        """``own.block-k`` arrays (empty when off or nothing is kept yet)."""
        if not self.enabled or self.blocks is None:
            return {}
        return {f"{self.PREFIX}block-{k}": block.copy() for k, block in enumerate(self.blocks)}

    def load(self, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Take the ``own.`` keys out of ``state``; return the rest (the method's own keys)."""
        mine = {key: value for key, value in state.items() if key.startswith(self.PREFIX)}
        expected = [f"{self.PREFIX}block-{k}" for k in range(len(mine))]
        if sorted(mine) != sorted(expected):
            raise ValueError(f"own-prompt state keys {sorted(mine)}, expected {expected}")
        self.blocks = [np.array(mine[key], dtype=np.float32) for key in expected] if mine else None
        return {key: value for key, value in state.items() if not key.startswith(self.PREFIX)}


def _scored(pclip: PromptedCLIP, blocks: Sequence[np.ndarray], features: Tensor) -> Tensor:
    """Logits Tensor[B, C] of a prompt's float32 ``blocks`` on image features Tensor[B, E] (one text pass, no
    gradient)."""
    with torch.no_grad():
        text = pclip.text_features([torch.from_numpy(block).to(pclip.device) for block in blocks])
        return pclip.logits(features.to(pclip.device, torch.float32), text)


def with_own_score(adaptation: Adaptation, own: OwnScore | None) -> Adaptation:
    """``adaptation`` with the own prompt's score filled in (unchanged when there is none)."""
    if own is not None:
        adaptation.h_own, adaptation.hm_pre, adaptation.hm_own = own.h_own, own.hm_pre, own.hm_own
        adaptation.v_pre, adaptation.v_own = own.v_pre, own.v_own
        adaptation.predictions_own, adaptation.probes = own.predictions, dict(own.probes)
        adaptation.stats.update(own.stats)
    return adaptation


# ----- AdamW state <-> arrays -----------------------------------------------------------------------
_MOMENTS = ("exp_avg", "exp_avg_sq")


def adamw_state_arrays(optimizer: torch.optim.AdamW, params: Sequence[Tensor], prefix: str) -> dict[str, np.ndarray]:
    """The AdamW step counters and moments of ``params`` as arrays ``{prefix}{step|exp_avg|exp_avg_sq}.{k}``."""
    arrays: dict[str, np.ndarray] = {}
    moments: dict[str, Tensor] = {}
    for k, param in enumerate(params):
        state = optimizer.state.get(param)
        if not state:
            continue
        arrays[f"{prefix}step.{k}"] = np.asarray(torch.as_tensor(state["step"]).detach().cpu().numpy())
        moments.update({f"{prefix}{moment}.{k}": state[moment] for moment in _MOMENTS})
    # every moment in one device-to-host copy (float32, as AdamW keeps them for float32 prompts)
    arrays.update(
        {key: value.numpy() for key, value in zip(moments, to_host_once(list(moments.values())), strict=True)}
    )
    return arrays


def load_adamw_state(
    optimizer: torch.optim.AdamW, params: Sequence[Tensor], arrays: dict[str, np.ndarray], prefix: str
) -> None:
    """Put moments saved by :func:`adamw_state_arrays` into a fresh ``optimizer`` over ``params``."""
    saved = [(k, param) for k, param in enumerate(params) if f"{prefix}step.{k}" in arrays]
    host: list[Tensor] = []
    for k, param in saved:
        for moment in _MOMENTS:
            value = torch.from_numpy(np.array(arrays[f"{prefix}{moment}.{k}"], dtype=np.float32))
            if tuple(value.shape) != tuple(param.shape):
                raise ValueError(
                    f"saved optimizer moment {prefix}{moment}.{k} has shape {tuple(value.shape)}, "
                    f"the prompt block has {tuple(param.shape)}"
                )
            host.append(value)
    if not saved:
        return
    moved = iter(to_device_once(host, params[0].device))  # one host-to-device copy for all moments
    for k, param in saved:
        state = {"step": torch.tensor(float(arrays[f"{prefix}step.{k}"]), dtype=torch.float32)}
        state.update({moment: next(moved) for moment in _MOMENTS})
        optimizer.state[param] = state


def check_state_keys(state: dict[str, np.ndarray], allowed_prefixes: Sequence[str], method: str) -> None:
    """Reject state keys a method does not know (a state from another method or version)."""
    unknown = sorted(key for key in state if not key.startswith(tuple(allowed_prefixes)))
    if unknown:
        raise ValueError(f"{method}: unknown client-state keys {unknown}")
