"""A word-level CLIP-style tokenizer for closed vocabularies (the testbed world, test fixtures).

Saved in the standard Hugging Face layout, so ``AutoTokenizer.from_pretrained(folder)`` loads it the
same way as a Hub checkpoint's tokenizer. The end-of-text token gets the highest id: Hugging Face CLIP
falls back to legacy pooling (argmax of the ids) when ``eos_token_id == 2``, and with EOS highest that
fallback still pools at the right place.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, UNK, BOS, EOS = "<|pad|>", "<|unk|>", "<|startoftext|>", "<|endoftext|>"


def words_of(texts: Iterable[str]) -> list[str]:
    """Sorted set of the lower-cased words and punctuation marks in ``texts`` (the tokenizer's split)."""
    pre = pre_tokenizers.Whitespace()
    words: set[str] = set()
    for text in texts:
        words.update(piece for piece, _ in pre.pre_tokenize_str(text.lower()))
    return sorted(words)


def build_word_tokenizer(words: Iterable[str], max_length: int) -> PreTrainedTokenizerFast:
    """Word-level tokenizer: ids ``[PAD, UNK, *sorted(words), BOS, EOS]``; adds BOS/EOS around each text."""
    vocab_words = sorted(set(words) - {PAD, UNK, BOS, EOS})
    if not vocab_words:
        raise ValueError("build_word_tokenizer: the vocabulary is empty; pass the world's words")
    vocab = {tok: i for i, tok in enumerate([PAD, UNK, *vocab_words, BOS, EOS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", special_tokens=[(BOS, vocab[BOS]), (EOS, vocab[EOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        model_max_length=max_length,
    )


def save_word_tokenizer(words: Iterable[str], max_length: int, folder: str | Path) -> PreTrainedTokenizerFast:
    """Build a word-level tokenizer and save it to ``folder`` (tokenizer.json + tokenizer_config.json)."""
    tokenizer = build_word_tokenizer(words, max_length)
    tokenizer.save_pretrained(str(folder))
    return tokenizer
