"""Soft prompts on a frozen CLIP: ``[SOS] ctx_1..ctx_n <class name> . [EOS]`` (CoOp-style).

Only the context vectors are inputs that can carry gradients; the SOS, class-name, period and EOS
embeddings are computed once per class list and kept as constant tensors (CoOp's buffers). The text pass
composes the text tower's submodules because ``CLIPTextModel`` refuses ``inputs_embeds`` in
transformers 5: ``embeddings(inputs_embeds=…)`` -> causal mask -> ``encoder`` -> ``final_layer_norm`` ->
pool at the EOS position -> ``text_projection``.

Exact shortcut: the tower is causal and pools at EOS, so tokens after the last EOS of a batch never
influence a feature. Sequences are therefore built only up to the batch's last EOS (about 10-20
positions instead of 77), which gives the features of the full-length pass (up to float rounding).

Shapes: C classes, D text width, E embedding (projection) size, n context length, K context blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from transformers.masking_utils import create_causal_mask

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
    """

    def __init__(self, clip: FrozenCLIP, classnames: Sequence[str], template: str = "a photo of a {}.") -> None:
        if isinstance(classnames, str):
            raise TypeError("PromptedCLIP: classnames must be a sequence of names, not one string")
        classnames = [str(name) for name in classnames]
        if not classnames:
            raise ValueError("PromptedCLIP: the class list is empty; pass at least one class name")
        if template.count("{}") != 1:
            raise ValueError(f"PromptedCLIP: template {template!r} must contain exactly one '{{}}'")
        self.clip = clip
        self.classnames = classnames
        self.template = template
        self.device = clip.device
        tok = clip.tokenizer
        if tok.bos_token_id is None or tok.eos_token_id is None:
            raise ValueError(f"the tokenizer of {clip.source!r} has no BOS/EOS token; not a CLIP tokenizer")
        # Class-name tokens: "<name>." followed by EOS. Tokenizing the name alone gives the same ids
        # as inside "<context words> <name>." for CLIP's BPE (it splits on whitespace first).
        suffix_ids = [self._token_ids(f"{name}.", what=f"class name {name!r}") + [tok.eos_token_id]
                      for name in classnames]
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
        ids = torch.tensor(self._token_ids(text, what=f"init text {text!r}"), device=self.device)
        weight = self.clip.model.text_model.embeddings.token_embedding.weight
        return weight[ids].detach().float().cpu().clone()

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
        raise ValueError(f"a context block must be [n, {width}] or [{num_classes}, n, {width}]; "
                         f"got {tuple(block.shape)}")

    #: Pad every sequence to the encoder's full context (77) instead of cutting it after the batch's last
    #: EOS. Same features, much slower: only for the naive path of benchmarks and for tests.
    full_length_text: bool = False

    def _encode(self, contexts: Sequence[Tensor]) -> Tensor:
        """Class features for G contexts, each Tensor[C, n_g, D], in one text pass -> Tensor[G, C, E]."""
        num_classes, suffix_len = self.suffix_embeds.shape[:2]
        longest = max(ctx.shape[1] for ctx in contexts)
        if 1 + longest + suffix_len > self.clip.max_text_length:
            raise ValueError(
                f"{longest} context tokens + class name {self._longest_class!r} exceed the text encoder's "
                f"context of {self.clip.max_text_length} tokens; use fewer context tokens or shorter names"
            )
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
        with self.clip.autocast():
            hidden = text.embeddings(inputs_embeds=embeds)
            mask = create_causal_mask(config=text.config, inputs_embeds=hidden, attention_mask=None, cache=None)
            hidden = text.encoder(inputs_embeds=hidden, attention_mask=mask, is_causal=True).last_hidden_state
            # LayerNorm is per token, so pooling first is exact and skips the other positions.
            pooled = text.final_layer_norm(hidden[torch.arange(hidden.shape[0], device=self.device), eos_pos])
            features = self.clip.model.text_projection(pooled)
        return F.normalize(features.float(), dim=-1).view(len(contexts), num_classes, -1)

    def text_features(self, blocks: Sequence[Tensor]) -> Tensor:
        """L2-normalised class features for K context blocks -> Tensor[K, C, E] float32.

        Block k is Tensor[n_k, D] (shared context) or Tensor[C, n_k, D] (class-specific). Gradients flow
        into the blocks only (the tower is frozen). All K*C sequences go through one text pass.
        """
        if len(blocks) == 0:
            raise ValueError("text_features: no context block given")
        return self._encode([self._class_contexts(block) for block in blocks])

    def text_features_stacked(self, contexts: Tensor) -> Tensor:
        """Class features for G independent versions of one block, in one text pass -> Tensor[G, C, E].

        ``contexts`` is Tensor[G, n, D] (G shared contexts) or Tensor[G, C, n, D] (G class-specific ones);
        row g of the result depends on ``contexts[g]`` only (used to tune G per-image prompts at once).
        """
        if contexts.dim() not in (3, 4):
            raise ValueError(f"text_features_stacked expects [G, n, D] or [G, C, n, D], got {tuple(contexts.shape)}")
        return self._encode([self._class_contexts(ctx) for ctx in contexts.unbind(0)])

    def hard_prompt_features(self) -> Tensor:
        """Features of ``template.format(name)`` through ``get_text_features`` -> Tensor[C, E], cached."""
        if self._hard_features is None:
            texts = [self.template.format(name) for name in self.classnames]
            tokens = self.clip.tokenizer(texts, padding=True, return_tensors="pt")
            if tokens["input_ids"].shape[1] > self.clip.max_text_length:
                raise ValueError(f"a zero-shot prompt of template {self.template!r} exceeds the text encoder's "
                                 f"context of {self.clip.max_text_length} tokens; shorten the class names")
            with torch.no_grad(), self.clip.autocast():
                out = self.clip.model.get_text_features(
                    input_ids=tokens["input_ids"].to(self.device),
                    attention_mask=tokens["attention_mask"].to(self.device),
                )
            self._hard_features = F.normalize(out.pooler_output.float(), dim=-1)
        return self._hard_features

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
        outputs = []
        with torch.no_grad(), self.clip.autocast():
            for chunk in pixel_values.split(chunk_size):
                out = self.clip.model.get_image_features(pixel_values=chunk.to(self.device))
                outputs.append(out.pooler_output.float())
        return F.normalize(torch.cat(outputs), dim=-1)

    @property
    def logit_scale(self) -> Tensor:
        """exp(logit_scale) of the checkpoint, a float32 scalar tensor."""
        return self.clip.model.logit_scale.detach().float().exp()

    def logits(self, image_features: Tensor, text_features: Tensor) -> Tensor:
        """Tensor[B, E] x Tensor[K, C, E] -> Tensor[B, C]: mean over K of exp(logit_scale) * cos."""
        return self.logit_scale * torch.einsum("be,kce->bc", image_features, text_features) / text_features.shape[0]
