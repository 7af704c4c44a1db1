"""Soft prompts on a frozen CLIP: ``[SOS] ctx_1..ctx_n <class name> . [EOS]`` (CoOp-style).

Only the context vectors are inputs that can carry gradients; the SOS, class-name, period and EOS
embeddings are computed once per class list and kept as constant tensors (CoOp's buffers). The text pass
composes the text tower's submodules because ``CLIPTextModel`` refuses ``inputs_embeds`` in
transformers 5: ``embeddings(inputs_embeds=…)`` -> causal mask -> ``encoder`` -> ``final_layer_norm`` ->
pool at the EOS position -> ``text_projection``.

Exact shortcut: the tower is causal and pools at EOS, so tokens after the last EOS of a batch never
influence a feature. Sequences are therefore built only up to the batch's last EOS (about 10-20
positions instead of 77), which gives the features of the full-length pass (up to float rounding).

Second exact shortcut, for shared contexts (``[n, D]`` blocks, every method's case): causal attention means
the ``1 + n`` positions ``[SOS] ctx_1..ctx_n`` have the same hidden states in all C sequences of a block.
They are computed once per block, and each class then runs only its own ``<class name> . [EOS]`` tokens,
attending to the block's prefix (keys and values shared, like a KV cache) and to its own earlier tokens.
The class tokens are packed (no padding to the longest name), so a pass over K blocks costs
``K * (1 + n) + K * sum_c s_c`` token rows instead of ``K * C * (1 + n + max_c s_c)``: about 3x fewer for
100 classes. :attr:`PromptedCLIP.shared_prefix` switches it off (tests compare both paths).

Shapes: C classes, D text width, E embedding (projection) size, n context length, K context blocks.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.profiler import record_function
from transformers.masking_utils import create_causal_mask

from fedrapp_app.engine import reuse
from fedrapp_app.engine.images import image_tensor_batch
from fedrapp_app.engine.loading import FrozenCLIP


class PromptedCLIP:
    """Everything that depends on the class names, built once per process and dataset.

    Parameters
    ----------
    clip : the frozen model, tokenizer and image processor.
    classnames : C class names (cleaned by the data layer); at least one.
    template : zero-shot template with one ``{}`` (e.g. ``"a photo of a {}."``), for
        :meth:`hard_prompt_features` only.
    templates : the dataset's template ensemble, for :meth:`ensemble_features` (default: ``template`` alone).
    """

    def __init__(
        self,
        clip: FrozenCLIP,
        classnames: Sequence[str],
        template: str = "a photo of a {}.",
        templates: Sequence[str] = (),
    ) -> None:
        if isinstance(classnames, str):
            raise TypeError("PromptedCLIP: classnames must be a sequence of names, not one string")
        classnames = [str(name) for name in classnames]
        if not classnames:
            raise ValueError("PromptedCLIP: the class list is empty; pass at least one class name")
        if template.count("{}") != 1:
            raise ValueError(f"PromptedCLIP: template {template!r} must contain exactly one '{{}}'")
        templates = tuple(templates) or (template,)
        bad = [t for t in templates if not isinstance(t, str) or t.count("{}") != 1]
        if bad:
            raise ValueError(f"PromptedCLIP: ensemble templates {bad} must each contain exactly one '{{}}'")
        self.clip = clip
        self.classnames = classnames
        self.template = template
        self.templates = templates
        self.device = clip.device
        tok = clip.tokenizer
        if tok.bos_token_id is None or tok.eos_token_id is None:
            raise ValueError(f"the tokenizer of {clip.source!r} has no BOS/EOS token; not a CLIP tokenizer")
        # Class-name tokens: "<name>." followed by EOS. Tokenizing the name alone gives the same ids
        # as inside "<context words> <name>." for CLIP's BPE (it splits on whitespace first).
        suffix_ids = [
            self._token_ids(f"{name}.", what=f"class name {name!r}") + [tok.eos_token_id] for name in classnames
        ]
        self.suffix_lengths = torch.tensor([len(ids) for ids in suffix_ids], device=self.device)  # [C]
        longest = max(range(len(classnames)), key=lambda c: len(suffix_ids[c]))
        if 2 + len(suffix_ids[longest]) > clip.max_text_length:
            raise ValueError(
                f"class name {classnames[longest]!r} is {len(suffix_ids[longest]) - 2} tokens long and does not "
                f"fit the text encoder's context of {clip.max_text_length} tokens with even one context "
                "token; shorten the class name"
            )
        self._longest_class = classnames[longest]
        embedding = clip.model.text_model.embeddings.token_embedding.weight.detach()
        padded = torch.zeros(len(classnames), len(suffix_ids[longest]), dtype=torch.long)
        for c, ids in enumerate(suffix_ids):
            padded[c, : len(ids)] = torch.tensor(ids)
        # Padding rows (id 0) sit after each class's EOS, where the causal mask makes them irrelevant.
        self.suffix_embeds = embedding[padded.to(self.device)].float()  # [C, S, D]
        self.sos_embed = embedding[tok.bos_token_id].float()  # [D]
        self._hard_features: Tensor | None = None
        self._ensemble_features: Tensor | None = None
        # Packed class tokens for the shared-prefix pass: token t belongs to class token_class[t] at offset
        # token_offset[t] of its "<name>. [EOS]" suffix; class c's EOS is packed row eos_rows[c].
        lengths = self.suffix_lengths.cpu()
        self._token_class = torch.repeat_interleave(torch.arange(len(classnames)), lengths).to(self.device)
        starts = torch.cumsum(lengths, 0) - lengths
        self._token_offset = (torch.arange(int(lengths.sum())) - starts.repeat_interleave(lengths)).to(self.device)
        self._eos_rows = (starts + lengths - 1).to(self.device)
        self._packed_suffix = self.suffix_embeds[self._token_class, self._token_offset]  # [T, D]
        self._constant_features: OrderedDict[bytes, Tensor] = OrderedDict()
        self._qkv: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> fused q/k/v projection (frozen)
        # Per-process caches of constants, so that a step copies nothing to the device that it copied before
        # (each blocking copy makes the host wait for a GPU's queue): init-text embeddings by text, and the
        # shared-prefix pass's class-token rows and masks by prefix sizes.
        self._init_contexts: dict[str, Tensor] = {}
        self._prefix_layouts: dict[tuple[int, ...], tuple[Tensor, tuple[Tensor, Tensor, Tensor]]] = {}

    # ----- context blocks -------------------------------------------------------------------------
    def _token_ids(self, text: str, what: str) -> list[int]:
        tok = self.clip.tokenizer
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise ValueError(f"{what} tokenizes to nothing")
        unk = tok.unk_token_id
        if unk is not None and unk not in (tok.eos_token_id, tok.bos_token_id) and unk in ids:
            raise ValueError(f"{what} has words outside the tokenizer's vocabulary ({self.clip.source!r})")
        return ids

    def context_from_text(self, text: str) -> Tensor:
        """Word embeddings of ``text`` (no SOS/EOS): Tensor[n, D] float32 on CPU, n = its token count."""
        if text not in self._init_contexts:
            ids = torch.tensor(self._token_ids(text, what=f"init text {text!r}"), device=self.device)
            weight = self.clip.model.text_model.embeddings.token_embedding.weight
            self._init_contexts[text] = weight[ids].detach().float().cpu()
        return self._init_contexts[text].clone()

    def random_context(self, n_ctx: int, generator: torch.Generator, num_classes: int | None = None) -> Tensor:
        """Random context N(0, 0.02²): Tensor[n_ctx, D], or [C, n_ctx, D] when ``num_classes`` is given."""
        if n_ctx < 1:
            raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
        shape = (n_ctx, self.clip.text_width) if num_classes is None else (num_classes, n_ctx, self.clip.text_width)
        return torch.randn(shape, generator=generator) * 0.02

    # ----- text side ------------------------------------------------------------------------------
    def _class_contexts(self, block: Tensor) -> Tensor:
        """Validate a block ([n, D] shared or [C, n, D] class-specific) -> Tensor[C, n, D] on the device."""
        num_classes, width = len(self.classnames), self.clip.text_width
        if block.dim() == 2 and block.shape[1] == width:
            return block.to(self.device, torch.float32).unsqueeze(0).expand(num_classes, -1, -1)
        if block.dim() == 3 and block.shape[0] == num_classes and block.shape[2] == width:
            return block.to(self.device, torch.float32)
        raise ValueError(
            f"a context block must be [n, {width}] or [{num_classes}, n, {width}]; got {tuple(block.shape)}"
        )

    #: Pad every sequence to the encoder's full context (77) instead of cutting it after the batch's last
    #: EOS. Same features, much slower: only for the naive path of benchmarks and for tests.
    full_length_text: bool = False
    #: Compute the ``[SOS] ctx`` prefix of a shared context once for all classes (exact; see the module doc).
    shared_prefix: bool = True
    #: How many constant (gradient-free) feature sets :meth:`constant_text_features` keeps.
    constant_cache_size: int = 4

    def _check_length(self, longest: int) -> None:
        if 1 + longest + self.suffix_embeds.shape[1] > self.clip.max_text_length:
            raise ValueError(
                f"{longest} context tokens + class name {self._longest_class!r} exceed the text encoder's "
                f"context of {self.clip.max_text_length} tokens; use fewer context tokens or shorter names"
            )

    def _encode(self, contexts: Sequence[Tensor]) -> Tensor:
        """Class features for G contexts, each Tensor[C, n_g, D], in one text pass -> Tensor[G, C, E]."""
        num_classes, suffix_len = self.suffix_embeds.shape[:2]
        longest = max(ctx.shape[1] for ctx in contexts)
        self._check_length(longest)
        # L = 1 + longest + S ends at the batch's last EOS; nothing after it can change a feature.
        length = self.clip.max_text_length if self.full_length_text else 1 + longest + suffix_len
        sos = self.sos_embed.expand(num_classes, 1, -1)
        sequences, eos = [], []
        for ctx in contexts:
            seq = torch.cat([sos, ctx, self.suffix_embeds], dim=1)  # [C, 1 + n + S, D]
            sequences.append(F.pad(seq, (0, 0, 0, length - seq.shape[1])))  # padding lies after every EOS
            eos.append(ctx.shape[1] + self.suffix_lengths)  # position of EOS: 1 + n + s_c - 1
        embeds = torch.cat(sequences)  # [G*C, L, D]
        eos_pos = torch.cat(eos)  # [G*C]
        text = self.clip.model.text_model
        with record_function("fedrapp.text_pass"), self.clip.autocast():
            hidden = text.embeddings(inputs_embeds=embeds)
            mask = create_causal_mask(config=text.config, inputs_embeds=hidden, attention_mask=None, cache=None)
            hidden = text.encoder(inputs_embeds=hidden, attention_mask=mask, is_causal=True).last_hidden_state
            # LayerNorm is per token, so pooling first is exact and skips the other positions.
            pooled = text.final_layer_norm(hidden[torch.arange(hidden.shape[0], device=self.device), eos_pos])
            features = self.clip.model.text_projection(pooled)
        return F.normalize(features.float(), dim=-1).view(len(contexts), num_classes, -1)

    def _encode_shared(self, contexts: Sequence[Tensor]) -> Tensor:
        """Class features for G shared contexts, each Tensor[n_g, D], with one prefix pass per context.

        Returns Tensor[G, C, E]. The rows of a layer are G x P prefix tokens (P = 1 + longest n_g; a shorter
        prefix is padded at its end, where the causal mask hides the padding from its real tokens) followed
        by G x T packed class tokens (T = sum of the C suffix lengths); every per-token op (norms, projections,
        MLP) runs once on all rows, only attention looks at the structure (:meth:`_shared_prefix_attention`).
        """
        text = self.clip.model.text_model
        groups = len(contexts)
        sizes = [1 + ctx.shape[0] for ctx in contexts]  # prefix sizes, on the host: no device sync
        self._check_length(max(sizes) - 1)
        prefix_len = max(sizes)
        suffix, masks = self._prefix_layout(tuple(sizes))
        positions = text.embeddings.position_embedding.weight  # [max_len, D]
        prefix = (
            torch.stack(
                [
                    F.pad(
                        torch.cat([self.sos_embed.unsqueeze(0), ctx.float()]), (0, 0, 0, prefix_len - 1 - ctx.shape[0])
                    )
                    for ctx in contexts
                ]
            )
            + positions[:prefix_len]
        )  # [G, P, D]
        rows = torch.cat([prefix.flatten(0, 1), suffix.flatten(0, 1)])  # [G*P + G*T, D]
        with record_function("fedrapp.text_pass"), self.clip.autocast():
            for index, layer in enumerate(text.encoder.layers):
                attended = self._shared_prefix_attention(
                    index, layer.self_attn, layer.layer_norm1(rows), groups, prefix_len, masks
                )
                rows = rows + layer.self_attn.out_proj(attended)
                rows = rows + layer.mlp(layer.layer_norm2(rows))
            # LayerNorm is per token, so pooling first is exact and skips the other positions.
            eos = rows[groups * prefix_len :].view(groups, -1, rows.shape[-1])[:, self._eos_rows]  # [G, C, D]
            features = self.clip.model.text_projection(text.final_layer_norm(eos))
        return F.normalize(features.float(), dim=-1)

    def _prefix_layout(self, sizes: tuple[int, ...]) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
        """The class-token rows Tensor[G, T, D] (embeddings + positions) and the attention masks of a
        shared-prefix pass whose G prefixes have ``sizes`` tokens; cached (they depend on nothing else)."""
        if sizes not in self._prefix_layouts:
            lengths = torch.tensor(sizes, device=self.device)  # [G]
            positions = self.clip.model.text_model.embeddings.position_embedding.weight.detach()  # [max_len, D]
            # class token t of block g sits at position (1 + n_g) + offset_t
            suffix = self._packed_suffix + positions[lengths.unsqueeze(1) + self._token_offset]  # [G, T, D]
            if len(self._prefix_layouts) >= 8:  # a method uses one or two layouts: bound the cache anyway
                self._prefix_layouts.pop(next(iter(self._prefix_layouts)))
            self._prefix_layouts[sizes] = suffix, self._shared_prefix_masks(lengths, max(sizes))
        return self._prefix_layouts[sizes]

    def _shared_prefix_masks(self, lengths: Tensor, prefix_len: int) -> tuple[Tensor, Tensor, Tensor]:
        """Attention masks of the shared-prefix pass (True = may attend).

        Prefix rows: causal within the block, Tensor[P, P]. Class rows: the block's real prefix,
        Tensor[G, 1, 1, 1, P], and the earlier tokens of their own class, Tensor[S, S] (a class's padding
        slots lie after its EOS, so this causal part never reaches them from a real token).
        """
        suffix_len = self.suffix_embeds.shape[1]
        causal_prefix = torch.ones(prefix_len, prefix_len, dtype=torch.bool, device=self.device).tril()
        visible = torch.arange(prefix_len, device=self.device) < lengths.unsqueeze(1)  # [G, P]
        causal_suffix = torch.ones(suffix_len, suffix_len, dtype=torch.bool, device=self.device).tril()
        return causal_prefix, visible.view(len(lengths), 1, 1, 1, prefix_len), causal_suffix

    def _fused_qkv(self, index: int, attention: torch.nn.Module) -> tuple[Tensor, Tensor]:
        """Layer ``index``'s q, k, v projections as one frozen Tensor[3D, D] weight and Tensor[3D] bias."""
        if index not in self._qkv:
            projections = (attention.q_proj, attention.k_proj, attention.v_proj)
            self._qkv[index] = (
                torch.cat([p.weight for p in projections]).detach(),
                torch.cat([p.bias for p in projections]).detach(),
            )
        return self._qkv[index]

    def _shared_prefix_attention(
        self,
        index: int,
        attention: torch.nn.Module,
        x: Tensor,
        groups: int,
        prefix_len: int,
        masks: tuple[Tensor, Tensor, Tensor],
    ) -> Tensor:
        """CLIP self-attention (before ``out_proj``) of the shared-prefix rows: Tensor[R, D] -> Tensor[R, D].

        Scores, softmax and the weighted sum of values in float32 (autocast is off for them: under bf16/fp16
        autocast an einsum would run in the low dtype); the q/k/v projection follows autocast. The sequences
        are short (about 15 tokens), so these einsums are a small share of the pass's FLOPs.
        """
        num_classes, suffix_len = self.suffix_embeds.shape[:2]
        heads, head_dim, scale = attention.num_heads, attention.head_dim, attention.scale
        causal_prefix, visible, causal_suffix = masks
        qkv = F.linear(x, *self._fused_qkv(index, attention)).float()  # [R, 3D]
        split = groups * prefix_len
        q_p, k_p, v_p = qkv[:split].view(groups, prefix_len, 3, heads, head_dim).unbind(2)  # [G, P, H, h]
        slot = self._token_class * suffix_len + self._token_offset  # [T]: row in the padded [C, S] layout
        padded = qkv.new_zeros(groups, num_classes * suffix_len, qkv.shape[-1])
        padded = padded.index_copy(1, slot, qkv[split:].view(groups, -1, qkv.shape[-1]))
        q_s, k_s, v_s = padded.view(groups, num_classes, suffix_len, 3, heads, head_dim).unbind(3)  # [G, C, S, H, h]
        with self.clip.full_precision():
            # prefix rows: causal attention within their own block
            scores = (torch.einsum("gphd,gqhd->ghpq", q_p, k_p) * scale).masked_fill(~causal_prefix, float("-inf"))
            out_prefix = torch.einsum("ghpq,gqhd->gphd", scores.softmax(-1), v_p).reshape(split, -1)
            # class rows: their block's real prefix, then the earlier tokens of their own class
            to_prefix = (torch.einsum("gcshd,gphd->gchsp", q_s, k_p) * scale).masked_fill(~visible, float("-inf"))
            to_own = (torch.einsum("gcshd,gcthd->gchst", q_s, k_s) * scale).masked_fill(~causal_suffix, float("-inf"))
            weights = torch.cat([to_prefix, to_own], -1).softmax(-1)
            out_suffix = torch.einsum("gchsp,gphd->gcshd", weights[..., :prefix_len], v_p) + torch.einsum(
                "gchst,gcthd->gcshd", weights[..., prefix_len:], v_s
            )
        out_suffix = out_suffix.reshape(groups, num_classes * suffix_len, -1).index_select(1, slot)
        return torch.cat([out_prefix, out_suffix.flatten(0, 1)]).to(x.dtype)

    def text_features(self, blocks: Sequence[Tensor]) -> Tensor:
        """L2-normalised class features for K context blocks -> Tensor[K, C, E] float32.

        Block k is Tensor[n_k, D] (shared context) or Tensor[C, n_k, D] (class-specific). Gradients flow
        into the blocks only (the tower is frozen). All K blocks go through one text pass.
        """
        if len(blocks) == 0:
            raise ValueError("text_features: no context block given")
        contexts = [self._class_contexts(block) for block in blocks]  # validates every block
        if self.shared_prefix and not self.full_length_text and all(block.dim() == 2 for block in blocks):
            return self._encode_shared([block.to(self.device, torch.float32) for block in blocks])
        return self._encode(contexts)

    def constant_text_features(self, blocks: Sequence[Tensor]) -> Tensor:
        """:meth:`text_features` of blocks that need no gradient, cached by content -> Tensor[K, C, E].

        For prompts that recur within a process (AdaPrompt's frozen pseudo-labeller, a prompt that came back
        unchanged): the same blocks give the same features, so a hit returns the stored tensor (bit-identical
        to recomputing it). Keeps the :attr:`constant_cache_size` most recently used entries.
        """
        digest = hashlib.blake2b(digest_size=16)
        digest.update(repr((self.full_length_text, self.shared_prefix)).encode())
        for block in blocks:
            block = torch.as_tensor(block).detach().to("cpu", torch.float32).contiguous()
            digest.update(repr(tuple(block.shape)).encode())
            digest.update(block.numpy().tobytes())
        key = digest.digest()
        if key in self._constant_features:
            self._constant_features.move_to_end(key)
            return self._constant_features[key]
        with torch.no_grad():
            features = self.text_features([torch.as_tensor(block).detach() for block in blocks])
        self._constant_features[key] = features
        while len(self._constant_features) > self.constant_cache_size:
            self._constant_features.popitem(last=False)
        return features

    def text_features_stacked(self, contexts: Tensor) -> Tensor:
        """Class features for G independent versions of one block, in one text pass -> Tensor[G, C, E].

        ``contexts`` is Tensor[G, n, D] (G shared contexts) or Tensor[G, C, n, D] (G class-specific ones);
        row g of the result depends on ``contexts[g]`` only (used to tune G per-image prompts at once).
        """
        if contexts.dim() not in (3, 4):
            raise ValueError(f"text_features_stacked expects [G, n, D] or [G, C, n, D], got {tuple(contexts.shape)}")
        return self.text_features(contexts.unbind(0))

    def hard_prompt_features(self) -> Tensor:
        """Features of ``template.format(name)`` through ``get_text_features`` -> Tensor[C, E], cached."""
        if self._hard_features is None:
            self._hard_features = self._sentence_features(self.template)
        return self._hard_features

    def ensemble_features(self) -> Tensor:
        """CLIP's prompt ensemble over :attr:`templates` -> Tensor[C, E], cached: per class, the mean of the
        L2-normalised features of its sentences, normalised again (Radford et al. 2021, their notebook)."""
        if self._ensemble_features is None:
            stacked = torch.stack([self._sentence_features(template) for template in self.templates])  # [T, C, E]
            self._ensemble_features = F.normalize(stacked.mean(0), dim=-1)
        return self._ensemble_features

    def _sentence_features(self, template: str) -> Tensor:
        """L2-normalised features of ``template.format(name)`` for every class -> Tensor[C, E] (no gradient)."""
        texts = [template.format(name) for name in self.classnames]
        tokens = self.clip.tokenizer(texts, padding=True, return_tensors="pt")
        if tokens["input_ids"].shape[1] > self.clip.max_text_length:
            raise ValueError(
                f"a zero-shot prompt of template {template!r} exceeds the text encoder's "
                f"context of {self.clip.max_text_length} tokens; shorten the class names"
            )
        with torch.no_grad(), self.clip.autocast():
            out = self.clip.model.get_text_features(
                input_ids=tokens["input_ids"].to(self.device),
                attention_mask=tokens["attention_mask"].to(self.device),
            )
        return F.normalize(out.pooler_output.float(), dim=-1)

    # ----- image side -----------------------------------------------------------------------------
    def preprocess(self, images: Sequence[Image.Image]) -> Tensor:
        """PIL images of any size and mode -> Tensor[B, 3, H, W] through the checkpoint's image processor."""
        return image_tensor_batch(self.clip.image_processor, images)

    def image_features(self, pixel_values: Tensor, chunk_size: int = 256) -> Tensor:
        """Frozen image tower: Tensor[B, 3, H, W] -> L2-normalised Tensor[B, E] float32, no gradient.

        Runs in chunks of ``chunk_size`` images to bound memory; callers compute each image once and
        reuse the result.
        """
        if pixel_values.dim() != 4 or pixel_values.shape[1] != 3:
            raise ValueError(f"pixel_values must be [B, 3, H, W], got {tuple(pixel_values.shape)}")

        def tower() -> Tensor:
            outputs = []
            with torch.no_grad(), record_function("fedrapp.image_tower"), self.clip.autocast():
                for chunk in pixel_values.split(chunk_size):
                    out = self.clip.model.get_image_features(pixel_values=chunk.to(self.device))
                    outputs.append(out.pooler_output.float())
            return F.normalize(torch.cat(outputs), dim=-1)

        model = (self.clip.source, str(self.device), self.clip.precision, chunk_size)
        return reuse.image_features(model, pixel_values, tower)  # the tower itself unless the bench keeps outputs

    @property
    def logit_scale(self) -> Tensor:
        """exp(logit_scale) of the checkpoint, a float32 scalar tensor."""
        return self.clip.model.logit_scale.detach().float().exp()

    def logits(self, image_features: Tensor, text_features: Tensor) -> Tensor:
        """Tensor[B, E] x Tensor[K, C, E] -> Tensor[B, C]: mean over K of exp(logit_scale) * cos."""
        return self.logit_scale * torch.einsum("be,kce->bc", image_features, text_features) / text_features.shape[0]
