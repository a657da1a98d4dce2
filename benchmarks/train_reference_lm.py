"""Trains the reference code LM (issue 6) on the Python source installed on this machine.

  python benchmarks/train_reference_lm.py --seconds 240      # on the GPU machine

Corpus: the standard library and site-packages of the running interpreter
(code nobody here wrote), deduplicated, split by content hash (2% held out),
the training side capped at --max-train-mb. Tokenizer: the committed
byte-level BPE (kvjax/assets/code_bpe_4096.json). Training mixes in the
retrieval tasks (a constant defined far back and asked for at the end; a
random token span repeated) so the model can do them. Writes the checkpoint
(bf16, kvjax format), held-out tokens for evaluation, the loss curve (JSON +
PNG) and the corpus manifest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import string
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from kvjax.models import checkpoint  # noqa: E402
from kvjax.models.decoder import Decoder  # noqa: E402
from kvjax.quality import corpus, reference_lm, tokenizer as tok_lib  # noqa: E402


def build_streams(tok, max_train_mb: float, max_heldout_tokens: int):
  roots = corpus.default_roots()
  files = corpus.collect(roots)
  train, held = corpus.split(files)
  train.sort(key=lambda f: f.digest)  # a deterministic, package-independent subset
  budget, kept = max_train_mb * 1e6, []
  for f in train:
    if budget <= 0:
      break
    kept.append(f)
    budget -= len(f.text.encode("utf-8"))
  eos = tok.token_to_id(tok_lib.EOS)

  def stream(fs, cap=None):
    out = []
    for enc in tok.encode_batch([f.text for f in fs]):
      out.extend(enc.ids)
      out.append(eos)
      if cap and len(out) >= cap:
        break
    return np.asarray(out[:cap] if cap else out, np.int32)

  info = corpus.manifest(roots, kept, held)
  info["train_total_files_before_cap"] = len(train)
  return stream(kept), stream(sorted(held, key=lambda f: f.path), max_heldout_tokens), info


class Batcher:
  """Random windows of the training stream, with retrieval tasks mixed in."""

  def __init__(self, stream, tok, seed, task_frac=0.3):
    self.stream, self.tok, self.task_frac = stream, tok, task_frac
    self.rng = np.random.default_rng(seed)
    self.vocab = np.arange(2, tok.get_vocab_size())

  def passkey(self, ids):
    name = "KEY_" + "".join(self.rng.choice(list(string.ascii_uppercase), 6))
    value = str(self.rng.integers(10000, 100000))
    head = self.tok.encode(f"{name} = {value}\n").ids
    tail = self.tok.encode(f"\nassert {name} == {value}\n").ids
    t = len(ids)
    at = int(self.rng.uniform(0, 0.9) * (t - len(head) - len(tail)))
    ids[at:at + len(head)] = head
    ids[t - len(tail):] = tail

  def recall(self, ids):
    t = len(ids)
    span = int(self.rng.integers(8, min(65, t // 4)))
    pattern = self.rng.choice(self.vocab, span)
    first = int(self.rng.integers(0, t // 2 - span))
    ids[first:first + span] = pattern
    ids[t - span:] = pattern

  def __call__(self, batch, context):
    starts = self.rng.integers(0, len(self.stream) - context - 1, batch)
    x = np.stack([self.stream[s:s + context + 1] for s in starts]).copy()
    for row in x:
      u = self.rng.uniform()
      if u < self.task_frac / 2:
        self.passkey(row)
      elif u < self.task_frac:
        self.recall(row)
    return x


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--seconds", type=float, default=240.0, help="training time budget")
  p.add_argument("--max-steps", type=int, default=100000)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--context", type=int, default=4096)
  p.add_argument("--long-context", type=int, default=8192, help="context of the final phase")
  p.add_argument("--long-frac", type=float, default=0.25, help="fraction of the time at --long-context")
  p.add_argument("--lr", type=float, default=2e-3)
  p.add_argument("--max-train-mb", type=float, default=200.0)
  p.add_argument("--max-heldout-tokens", type=int, default=2_000_000)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--small", action="store_true", help="a tiny model and run, for CPU smoke tests")
  p.add_argument("--out", default=reference_lm.CHECKPOINT_DIR)
  p.add_argument("--results", default="benchmarks/results/reference_lm_train.json")
  args = p.parse_args(argv)

  t0 = time.perf_counter()
  tok = tok_lib.load(reference_lm.TOKENIZER_PATH)
  train, held, info = build_streams(tok, args.max_train_mb, args.max_heldout_tokens)
  print(f"corpus: {info['train']['files']} train files ({info['train']['bytes'] / 1e6:.1f} MB, "
        f"{len(train) / 1e6:.1f}M tokens), {info['heldout']['files']} held out ({len(held)} tokens); "
        f"{time.perf_counter() - t0:.0f} s", flush=True)
  cfg = reference_lm.reference_config()
  if args.small:
    cfg = cfg.replace(num_layers=2, embed_dim=64, hidden_dim=128, head_dim=32, dtype="float32")
  model = Decoder(cfg, rngs=nnx.Rngs(args.seed))
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
  sched = optax.warmup_cosine_decay_schedule(0.0, args.lr, 200, 20000, args.lr * 0.05)
  opt = nnx.Optimizer(model, optax.chain(optax.clip_by_global_norm(1.0),
                                         optax.adamw(sched, b2=0.95, weight_decay=0.1)), wrt=nnx.Param)

  @nnx.jit
  def step(model, opt, batch):
    def loss_fn(m):
      logits, _ = m(batch[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    return loss

  @nnx.jit
  def eval_loss(model, batch):
    logits, _ = model(batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

  batcher = Batcher(train, tok, args.seed)
  curve, tokens_seen, i = [], 0, 0
  t_train = time.perf_counter()
  long_at = args.seconds * (1 - args.long_frac)
  while i < args.max_steps:
    elapsed = time.perf_counter() - t_train
    if elapsed > args.seconds:
      break
    long = elapsed > long_at
    ctx = args.long_context if long else args.context
    b = max(1, args.batch * args.context // ctx)
    loss = step(model, opt, jnp.asarray(batcher(b, ctx)))
    tokens_seen += b * ctx
    i += 1
    if i % 25 == 0 or i == 1:
      loss = float(loss)
      curve.append({"step": i, "seconds": round(time.perf_counter() - t_train, 2), "context": ctx,
                    "tokens": tokens_seen, "loss": loss})
      print(f"step {i} ctx {ctx} loss {loss:.3f} {curve[-1]['seconds']:.0f}s", flush=True)
  train_seconds = time.perf_counter() - t_train
  # held-out loss at the training context
  rng = np.random.default_rng(1)
  ctx = min(args.context, len(held) - 2)
  starts = rng.integers(0, len(held) - ctx - 1, 8)
  hb = jnp.asarray(np.stack([held[s:s + ctx + 1] for s in starts]))
  held_loss = float(np.mean([float(eval_loss(model, hb[j:j + 2])) for j in range(0, 8, 2)]))
  print(f"held-out loss {held_loss:.3f} (ppl {np.exp(held_loss):.2f}) after {i} steps, "
        f"{tokens_seen / 1e6:.1f}M tokens, {train_seconds:.0f} s", flush=True)

  os.makedirs(args.out, exist_ok=True)
  checkpoint.save(model, args.out, metadata={"trained_by": "benchmarks/train_reference_lm.py"})
  np.save(os.path.join(args.out, "heldout_tokens.npy"), held.astype(np.uint16))
  result = {"command": "python benchmarks/train_reference_lm.py " + " ".join(argv or sys.argv[1:]),
            "args": vars(args), "params": n_params, "steps": i, "tokens_seen": tokens_seen,
            "train_seconds": train_seconds, "heldout_loss": held_loss,
            "heldout_tokens_sha1": hashlib.sha1(held.astype(np.uint16).tobytes()).hexdigest(),
            "device": str(jax.devices()[0]), "jax": jax.__version__, "corpus": info, "curve": curve}
  os.makedirs(os.path.dirname(args.results) or ".", exist_ok=True)
  with open(args.results, "w") as f:
    json.dump(result, f, indent=1)
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([c["tokens"] / 1e6 for c in curve], [c["loss"] for c in curve])
    ax.set_xlabel("training tokens (M)")
    ax.set_ylabel("train loss (nats/token)")
    ax.set_title(f"reference LM ({n_params / 1e6:.1f}M params), held-out {held_loss:.2f}")
    fig.tight_layout()
    fig.savefig(os.path.splitext(args.results)[0] + ".png", dpi=100)
  except ImportError:
    pass
  print(json.dumps({k: result[k] for k in ("params", "steps", "tokens_seen", "heldout_loss")}))


if __name__ == "__main__":
  main()
