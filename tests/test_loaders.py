"""Checkpoint loading: logits equal Hugging Face transformers' PyTorch models (fixtures written by
tests/fixtures/make_hf_fixtures.py), through the uncached forward, the cached prefill + decode
path and the gemma-library tree; bad checkpoints fail naming the tensor."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from kvjax import formats
from kvjax.models import config_from_hf, loaders

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
NAMES = ["gemma", "gemma2", "gemma3", "llama"]
F32 = formats.KVFormat(name="f32", key=formats.Passthrough(dtype="float32"),
                       value=formats.Passthrough(dtype="float32"))


def expected(name):
  e = load_file(os.path.join(FIX, name, "expected.safetensors"))
  return jnp.asarray(e["input_ids"]), e["logits"]


def tensors(name):
  from safetensors import safe_open
  with safe_open(os.path.join(FIX, name, "model.safetensors"), "numpy") as f:
    return {k: f.get_tensor(k) for k in f.keys()}


def cached_logits(model, ids, fmt, prefill=8):
  """Prefill `prefill` tokens, then decode the rest one at a time; logits of every position."""
  b, t = ids.shape
  caches = model.init_cache(b, t, fmt)
  run = jax.jit(lambda c, x: model(x, c))
  out, caches = run(caches, ids[:, :prefill])
  outs = [out]
  for i in range(prefill, t):
    lg, caches = run(caches, ids[:, i:i + 1])
    outs.append(lg)
  return np.asarray(jnp.concatenate(outs, 1))


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(name):
  model = loaders.load_hf(os.path.join(FIX, name))
  ids, want = expected(name)
  got = np.asarray(model(ids)[0])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # f32 vs f32
  np.testing.assert_allclose(cached_logits(model, ids, F32), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gemma2", "llama"])
def test_bf16_cache_decode_close_to_transformers(name):
  model = loaders.load_hf(os.path.join(FIX, name))
  ids, want = expected(name)
  got = cached_logits(model, ids, formats.bf16())
  np.testing.assert_allclose(got, want, rtol=0, atol=3e-2 * np.abs(want).max())
  np.testing.assert_allclose(got[:, :8], np.asarray(model(ids)[0])[:, :8], atol=1e-5)  # prefill: unquantized


def to_gemma_tree(t, cfg, transpose_gating):
  """The gemma library's layout, written out from its einsum shapes (gm/nn/_modules.py)."""
  n, k, h, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.embed_dim
  heads = lambda w, m: w.reshape(m, h, d).transpose(0, 2, 1)  # [m*H, D] -> [m, D, H]
  tree = {"embedder": {"input_embedding": t["model.embed_tokens.weight"]},
          "final_norm": {"scale": t["model.norm.weight"]}}
  for i in range(cfg.num_layers):
    p = f"model.layers.{i}."
    gate, up = t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"]  # [F, D]
    layer = {
        "attn": {"q_einsum": {"w": heads(t[p + "self_attn.q_proj.weight"], n)},
                 "kv_einsum": {"w": np.stack([heads(t[p + "self_attn.k_proj.weight"], k),
                                              heads(t[p + "self_attn.v_proj.weight"], k)])},
                 "attn_vec_einsum": {"w": t[p + "self_attn.o_proj.weight"].T.reshape(n, h, d)}},
        "pre_attention_norm": {"scale": t[p + "input_layernorm.weight"]},
        "mlp": {"gating_einsum": np.stack([gate, up]) if transpose_gating
                else np.stack([gate.T, up.T]),
                "linear": t[p + "mlp.down_proj.weight"].T}}
    if cfg.use_post_attn_norm:
      layer["post_attention_norm"] = {"scale": t[p + "post_attention_layernorm.weight"]}
      layer["pre_ffw_norm"] = {"scale": t[p + "pre_feedforward_layernorm.weight"]}
      layer["post_ffw_norm"] = {"scale": t[p + "post_feedforward_layernorm.weight"]}
    else:
      layer["pre_ffw_norm"] = {"scale": t[p + "post_attention_layernorm.weight"]}
    if cfg.use_qk_norm:
      layer["attn"]["_query_norm"] = {"scale": t[p + "self_attn.q_norm.weight"]}
      layer["attn"]["_key_norm"] = {"scale": t[p + "self_attn.k_norm.weight"]}
    tree[f"layer_{i}"] = layer
  return tree


@pytest.mark.parametrize("name,transpose", [("gemma", False), ("gemma3", True)])
def test_gemma_library_tree_matches_transformers(name, transpose):
  cfg = config_from_hf(os.path.join(FIX, name))
  tree = {"transformer": to_gemma_tree(tensors(name), cfg, transpose)}
  model = loaders.load_gemma_params(tree, cfg, transpose_gating_einsum=transpose)
  ids, want = expected(name)
  np.testing.assert_allclose(np.asarray(model(ids)[0]), want, rtol=1e-4, atol=1e-4)


def _write(tmp_path, t):
  path = str(tmp_path / "model.safetensors")
  save_file(t, path)
  return path


def test_checkpoint_errors_name_the_tensor(tmp_path):
  cfg = config_from_hf(os.path.join(FIX, "gemma"))
  base = {k: v.astype(np.float32) for k, v in tensors("gemma").items()}
  t = dict(base)
  del t["model.layers.1.mlp.up_proj.weight"]
  with pytest.raises(loaders.CheckpointError, match=r"missing .*model\.layers\.1\.mlp\.up_proj\.weight"):
    loaders.load_hf_safetensors(_write(tmp_path, t), cfg)
  t = dict(base, **{"model.layers.0.self_attn.q_proj.weight": np.zeros((64, 60), np.float32)})
  with pytest.raises(loaders.CheckpointError,
                     match=r"'model\.layers\.0\.self_attn\.q_proj\.weight': shape \(64, 60\) .* \(64, 64\)"):
    loaders.load_hf_safetensors(_write(tmp_path, t), cfg)
  t = dict(base, **{"model.norm.weight": np.zeros((64,), np.int32)})
  with pytest.raises(loaders.CheckpointError, match=r"'model\.norm\.weight': dtype int32 is not floating"):
    loaders.load_hf_safetensors(_write(tmp_path, t), cfg)
  t = dict(base, **{"model.layers.0.self_attn.q_proj.bias": np.zeros((64,), np.float32)})
  with pytest.raises(loaders.CheckpointError, match=r"unexpected .*q_proj\.bias"):
    loaders.load_hf_safetensors(_write(tmp_path, t), cfg)
  with pytest.raises(loaders.CheckpointError, match=r"dtype bfloat16 differs from param_dtype float32"):
    loaders.load_hf(os.path.join(FIX, "gemma"), strict_dtype=True)
  # bf16 file, f32 params: cast (default), and the loaded values are the file's.
  m = loaders.load_hf_safetensors(_write(tmp_path, base), cfg, strict_dtype=True)
  np.testing.assert_array_equal(m.embedder.embedding[...], base["model.embed_tokens.weight"])


def test_gemma_tree_errors_name_the_tensor():
  cfg = config_from_hf(os.path.join(FIX, "gemma2"))
  tree = to_gemma_tree(tensors("gemma2"), cfg, True)
  tree["layer_1"]["attn"]["attn_vec_einsum"]["w"] = np.zeros((4, 16, 63), np.float32)
  with pytest.raises(loaders.CheckpointError, match=r"'layer_1/attn/attn_vec_einsum/w': shape \(4, 16, 63\)"):
    loaders.load_gemma_params(tree, cfg)
  del tree["layer_0"]["post_ffw_norm"]
  with pytest.raises(loaders.CheckpointError, match=r"missing .*layer_0/post_ffw_norm/scale"):
    loaders.load_gemma_params(tree, cfg)


def test_config_errors(tmp_path):
  with open(os.path.join(FIX, "llama", "config.json")) as f:
    hf = json.load(f)
  with pytest.raises(NotImplementedError, match="model_type 'mistral'"):
    config_from_hf(dict(hf, model_type="mistral"))
  with pytest.raises(NotImplementedError, match="rope_type 'llama3'"):
    config_from_hf(dict(hf, rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}))
  shutil.copy(os.path.join(FIX, "llama", "config.json"), tmp_path / "config.json")
  with pytest.raises(loaders.CheckpointError, match="no \\*.safetensors"):
    loaders.load_hf(str(tmp_path))
  cfg = config_from_hf(hf)
  assert cfg.norm_style == "llama" and not cfg.tie_embeddings and cfg.rope_base == 5e5
  g3 = config_from_hf(os.path.join(FIX, "gemma3"))
  assert g3.rope(0) == (10_000.0, 1.0) and g3.rope(1) == (1_000_000.0, 8.0) and g3.use_qk_norm
