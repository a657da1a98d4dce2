"""A byte-level BPE tokenizer for Python source (Hugging Face `tokenizers`).

Trained on the corpus's training files (never the held-out ones); byte-level,
so any text round-trips. Special tokens: ``<pad>`` (0) and ``<eos>`` (1),
which separates files in the training stream.
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["train", "load", "PAD", "EOS"]

PAD, EOS = "<pad>", "<eos>"


def train(texts: Iterable[str], vocab_size: int = 4096):
  """Trains byte-level BPE on `texts`; returns a `tokenizers.Tokenizer`."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  if vocab_size < 300:
    raise ValueError(f"vocab_size must be >= 300 (256 bytes + specials + merges), got {vocab_size}")
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(texts, trainer=trainer)
  return tok


def load(path: str):
  from tokenizers import Tokenizer
  return Tokenizer.from_file(path)
