"""Scoring through the quantized cache equals the plain forward pass for a bf16 cache."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from kvjax import formats
from kvjax.models.decoder import Decoder
from kvjax.quality import evaluate, reference_lm


def _model():
  cfg = reference_lm.reference_config(num_layers=2, embed_dim=64, hidden_dim=128, head_dim=32,
                                      vocab_size=300, dtype="float32")
  return Decoder(cfg, rngs=nnx.Rngs(0))


def test_score_tail_bf16_matches_uncached_forward():
  model = _model()
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 96), 0, 300)
  nll, hit = evaluate.score_tail(model, tokens, 64, formats.bf16(), chunk=32)
  logits, _ = model(tokens)
  ref = optax.softmax_cross_entropy_with_integer_labels(logits[:, 63:-1], tokens[:, 64:])
  np.testing.assert_allclose(nll, np.asarray(ref), rtol=2e-2, atol=2e-2)  # bf16 cache rounding
  assert hit.shape == (2, 32)
  # R = 32 so that 64 of the 96 tokens are quantized: with the preset's R = 128 every token stays in the
  # bf16 residual window, and on some CPUs (session 18's AMD EPYC) the score is then bit-equal to bf16's
  kivi, _ = evaluate.score_tail(model, tokens, 64, formats.kivi(2, 32, 32, name="kivi2_r32"), chunk=32)
  assert np.isfinite(kivi).all() and np.abs(kivi - nll).max() > 0  # quantization is visible


def test_calibrate_model_scales_and_cost():
  model = _model()
  tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 64), 0, 300)
  fmt = formats.preset("fp8_e4m3_static")
  scales, info = evaluate.calibrate_model(model, tokens, fmt, margin=2.0, chunk=32)
  assert scales.k.shape == (2, 1, 2, 1, 32) and scales.v.shape == (2, 1, 2, 1, 1)
  assert np.all(np.asarray(scales.k) > 0) and info["tokens"] == 128 and info["seconds"] >= 0
  nll, _ = evaluate.score_tail(model, tokens, 48, fmt, scales=scales, chunk=16)
  assert np.isfinite(nll).all()


def test_mixed_precision_from_sensitivity():
  from kvjax.quality import mixed
  model = _model()
  tokens = jax.random.randint(jax.random.PRNGKey(3), (2, 160), 0, 300)
  low, high = formats.kivi(2, 32, 32), formats.kivi(4, 32, 32)
  sens = mixed.layer_sensitivity(model, tokens, 128, low, chunk=64)
  assert sens.shape == (2,) and np.isfinite(sens).all()
  fmts = mixed.assign_formats(sens, high, low, num_high=1)
  assert fmts[int(np.argmax(sens))] == high and fmts.count(low) == 1
  caches = model.init_cache(2, 192, fmts)
  assert [c.fmt for c in caches] == list(fmts)
  nll, _ = evaluate.score_tail(model, tokens, 128, fmts, chunk=64)
  assert np.isfinite(nll).all()
  import pytest
  with pytest.raises(ValueError, match="one per layer"):
    model.init_cache(2, 192, (low,))
  with pytest.raises(ValueError, match="num_high must be in"):
    mixed.assign_formats(sens, high, low, 3)
