"""Retrieval tasks where aggressive KV quantization fails first (DESIGN.md section 7).

Tokenizer-agnostic: builders take held-out token ids or an `encode` callable
and return `Example`s (ids plus a mask of the positions whose next token is
scored). The same builders make training examples, so the reference LM
learns the tasks.

* exact recall: a span of random tokens early in the context, repeated at the
  end; scored on predicting repeat tokens 2..m (the first is unguessable);
* passkey / dict lookup: ``NAME = 48213`` defined near the start of a code
  context, asked for at the end (``assert NAME == ``); scored on the answer.
"""

from __future__ import annotations

import dataclasses
import string
from typing import Callable, Sequence

import numpy as np

__all__ = ["Example", "recall_example", "passkey_example", "score"]


@dataclasses.dataclass(frozen=True)
class Example:
  ids: np.ndarray  # [T] int32 token ids
  target: np.ndarray  # [T] bool: score the prediction of ids[t + 1] made at position t


def _window(stream: np.ndarray, length: int, rng: np.random.Generator) -> np.ndarray:
  if len(stream) < length:
    raise ValueError(f"token stream ({len(stream)} tokens) shorter than the context ({length})")
  start = rng.integers(0, len(stream) - length + 1)
  return np.asarray(stream[start:start + length], np.int32)


def recall_example(stream: np.ndarray, context: int, span: int, vocab: Sequence[int],
                   rng: np.random.Generator) -> Example:
  """Held-out code of `context` tokens with a random `span` inserted early and repeated at the end."""
  if not 2 <= span <= context // 4:
    raise ValueError(f"span must be in [2, context/4 = {context // 4}], got {span}")
  ids = _window(stream, context, rng).copy()
  pattern = rng.choice(np.asarray(vocab, np.int32), size=span)
  first = rng.integers(0, context // 2 - span)
  ids[first:first + span] = pattern
  ids[context - span:] = pattern
  target = np.zeros(context, bool)
  target[context - span:context - 1] = True  # predicts repeat tokens 2..span
  return Example(ids=ids, target=target)


def _name(rng: np.random.Generator) -> str:
  letters = rng.choice(list(string.ascii_lowercase), size=6)
  return "KEY_" + "".join(letters).upper()


def passkey_example(filler: str, encode: Callable[[str], Sequence[int]], context: int,
                    rng: np.random.Generator, depth: float | None = None) -> Example:
  """A constant defined at relative `depth` of a code context and asked for at its end.

  Args:
    filler: held-out source text (long enough to fill `context` tokens).
    encode: text -> token ids.
    context: total tokens of the example.
    depth: where the definition sits, as a fraction of the context (random in
      [0, 0.2] when None: "far back").
  """
  name = _name(rng)
  value = str(rng.integers(10000, 100000))
  head = encode(f"{name} = {value}\n")
  # Split where a byte-level BPE splits words (before the space), so the
  # tokens equal those of the whole line "assert NAME == VALUE".
  question = encode(f"\nassert {name} ==")
  answer = encode(f" {value}")
  tail = encode("\n")
  fill = list(encode(filler))
  need = context - len(head) - len(question) - len(answer) - len(tail)
  if need < 1 or len(fill) < need:
    raise ValueError(f"filler gives {len(fill)} tokens; the context needs {need} > 0")
  depth = rng.uniform(0.0, 0.2) if depth is None else depth
  if not 0 <= depth <= 1:
    raise ValueError(f"depth must be in [0, 1], got {depth}")
  start = rng.integers(0, len(fill) - need + 1)
  fill = fill[start:start + need]
  at = int(depth * need)
  ids = fill[:at] + list(head) + fill[at:] + list(question) + list(answer) + list(tail)
  ids = np.asarray(ids, np.int32)
  target = np.zeros(len(ids), bool)
  a0 = len(ids) - len(tail) - len(answer)
  target[a0 - 1:a0 - 1 + len(answer)] = True
  return Example(ids=ids, target=target)


def score(logits: np.ndarray, example: Example) -> tuple[float, bool]:
  """(token accuracy on the scored positions, all of them right) from logits [T, V]."""
  pred = np.asarray(logits).argmax(-1)
  pos = np.nonzero(example.target)[0]
  hits = pred[pos] == example.ids[pos + 1]
  return float(hits.mean()), bool(hits.all())
