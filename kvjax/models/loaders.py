"""Real checkpoints: Hugging Face safetensors (Gemma 1/2/3, Llama naming) and gemma library trees.

`load_hf(dir)` reads ``config.json`` (-> `config_from_hf`) and every
``*.safetensors`` file in `dir`, maps HF names and ``[out, in]`` layouts to
this package's parameters, and returns a `Decoder`. `load_gemma_params(tree,
cfg)` does the same for the gemma library's parameter tree (``embedder``,
``layer_{i}/attn/{q_einsum,kv_einsum|qkv_einsum,attn_vec_einsum}``, ...).

Every tensor is checked before use: a missing, unexpected, wrongly shaped or
non-floating tensor raises `CheckpointError` naming it. Floating tensors are
cast to the config's ``param_dtype`` (``strict_dtype=True`` refuses instead).
The model is built abstractly (`nnx.eval_shape`), so loading allocates only
the checkpoint's arrays.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any, Callable, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvjax.models.config import DecoderConfig
from kvjax.models.decoder import Decoder

__all__ = ["CheckpointError", "config_from_hf", "hf_entries", "gemma_entries", "load_hf",
           "load_hf_safetensors", "load_gemma_params", "assign"]


class CheckpointError(ValueError):
  """A checkpoint does not fit the model (names the tensor)."""


@dataclasses.dataclass(frozen=True)
class _Entry:
  src: str  # name in the checkpoint
  dst: tuple  # path of the nnx.Param in the Decoder
  shape: tuple  # expected shape in the checkpoint
  fn: Callable = lambda a: a  # checkpoint layout -> ours


# ---- Hugging Face ---------------------------------------------------------------------------

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _rope_params(p: Mapping | None, default_base: float) -> tuple[float, float]:
  if not p:
    return default_base, 1.0
  kind = p.get("rope_type", p.get("type", "default"))
  base = float(p.get("rope_theta", default_base))
  if kind == "default":
    return base, 1.0
  if kind == "linear":
    return base, float(p["factor"])
  raise NotImplementedError(f"rope_type {kind!r} is not supported (only 'default' and 'linear')")


def config_from_hf(hf: Mapping | str, **overrides) -> DecoderConfig:
  """A `DecoderConfig` from a HF ``config.json`` (dict or path) of a Gemma 1/2/3 or Llama model."""
  if isinstance(hf, str):
    with open(hf if hf.endswith(".json") else os.path.join(hf, "config.json")) as f:
      hf = json.load(f)
  if "text_config" in hf:  # Gemma 3 multimodal wrapper: the text decoder
    hf = hf["text_config"]
  mt = hf.get("model_type")
  if mt not in ("gemma", "gemma2", "gemma3_text", "llama"):
    raise NotImplementedError(f"model_type {mt!r} is not supported; expected gemma, gemma2, "
                              "gemma3_text or llama")
  heads = hf["num_attention_heads"]
  layers = hf["num_hidden_layers"]
  kw: dict[str, Any] = dict(
      vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"], hidden_dim=hf["intermediate_size"],
      num_layers=layers, num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      norm_eps=float(hf.get("rms_norm_eps", 1e-6)))
  if hf.get("attention_bias") or hf.get("mlp_bias"):
    raise NotImplementedError("attention_bias / mlp_bias checkpoints are not supported")
  rope = hf.get("rope_parameters") or {}
  theta = float(hf.get("rope_theta", 10_000.0))
  if mt == "llama":
    act = hf.get("hidden_act", "silu")
    if act != "silu":
      raise NotImplementedError(f"hidden_act {act!r} is not supported for llama (expected 'silu')")
    base, factor = _rope_params(rope or hf.get("rope_scaling"), theta)
    if not rope and hf.get("rope_scaling"):
      base = theta
    kw.update(norm_style="llama", activation="silu", scale_embeddings=False,
              tie_embeddings=bool(hf.get("tie_word_embeddings", False)), rope_base=base,
              rope_scale_factor=factor)
    return DecoderConfig(**{**kw, **overrides})
  act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
  if act not in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
    raise NotImplementedError(f"hidden_activation {act!r} is not supported (expected the tanh "
                              "approximation 'gelu_pytorch_tanh')")
  kw.update(norm_style="gemma", activation="gelu_tanh", scale_embeddings=True,
            tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
  if mt == "gemma":
    kw.update(rope_base=_rope_params(rope, theta)[0])
    return DecoderConfig(**{**kw, **overrides})
  types = hf.get("layer_types")
  if types is None:
    pattern = hf.get("sliding_window_pattern", 2 if mt == "gemma2" else 6)
    types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
  kw.update(attention_types=tuple("local" if t == "sliding_attention" else "global" for t in types),
            sliding_window=hf.get("sliding_window"),
            query_pre_attn_scalar=hf.get("query_pre_attn_scalar"),
            attn_logit_softcap=hf.get("attn_logit_softcapping"),
            final_logit_softcap=hf.get("final_logit_softcapping"),
            use_post_attn_norm=True, use_post_ffw_norm=True)
  if mt == "gemma2":
    kw.update(rope_base=_rope_params(rope, theta)[0])
  else:
    if "full_attention" in rope or "sliding_attention" in rope:
      g, l = rope.get("full_attention"), rope.get("sliding_attention")
    else:
      g = rope or dict(hf.get("rope_scaling") or {}, rope_theta=theta)
      l = {"rope_type": "default", "rope_theta": hf.get("rope_local_base_freq", 10_000.0)}
    gb, gf = _rope_params(g, 1_000_000.0)
    lb, lf = _rope_params(l, 10_000.0)
    kw.update(use_qk_norm=True, rope_base=gb, rope_scale_factor=gf, local_rope_base=lb,
              local_rope_scale_factor=lf)
  return DecoderConfig(**{**kw, **overrides})


def hf_entries(cfg: DecoderConfig) -> list[_Entry]:
  """The HF tensors a model with `cfg` needs, with their shapes and layout changes."""
  d, f, n, k, h, v = (cfg.embed_dim, cfg.hidden_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                      cfg.vocab_size)
  t = lambda a: a.T
  out = [_Entry("model.embed_tokens.weight", ("embedder", "embedding"), (v, d)),
         _Entry("model.norm.weight", ("final_norm", "scale"), (d,))]
  if not cfg.tie_embeddings:
    out.append(_Entry("lm_head.weight", ("lm_head",), (v, d), t))
  for i in range(cfg.num_layers):
    p, L = f"model.layers.{i}.", ("layers", i)
    out += [
        _Entry(p + "input_layernorm.weight", L + ("pre_attention_norm", "scale"), (d,)),
        _Entry(p + "self_attn.q_proj.weight", L + ("attn", "q"), (n * h, d), lambda a: a.T.reshape(d, n, h)),
        _Entry(p + "self_attn.k_proj.weight", L + ("attn", "k"), (k * h, d), lambda a: a.T.reshape(d, k, h)),
        _Entry(p + "self_attn.v_proj.weight", L + ("attn", "v"), (k * h, d), lambda a: a.T.reshape(d, k, h)),
        _Entry(p + "self_attn.o_proj.weight", L + ("attn", "o"), (d, n * h), lambda a: a.T.reshape(n, h, d)),
        _Entry(p + "mlp.gate_proj.weight", L + ("mlp", "gate"), (f, d), t),
        _Entry(p + "mlp.up_proj.weight", L + ("mlp", "up"), (f, d), t),
        _Entry(p + "mlp.down_proj.weight", L + ("mlp", "down"), (d, f), t)]
    if cfg.use_qk_norm:
      out += [_Entry(p + "self_attn.q_norm.weight", L + ("attn", "q_norm", "scale"), (h,)),
              _Entry(p + "self_attn.k_norm.weight", L + ("attn", "k_norm", "scale"), (h,))]
    if cfg.use_post_attn_norm:  # Gemma 2/3 naming
      out += [_Entry(p + "post_attention_layernorm.weight", L + ("post_attention_norm", "scale"), (d,)),
              _Entry(p + "pre_feedforward_layernorm.weight", L + ("pre_ffw_norm", "scale"), (d,))]
    else:  # Gemma 1 / Llama: "post_attention_layernorm" is the pre-MLP norm
      out.append(_Entry(p + "post_attention_layernorm.weight", L + ("pre_ffw_norm", "scale"), (d,)))
    if cfg.use_post_ffw_norm:
      out.append(_Entry(p + "post_feedforward_layernorm.weight", L + ("post_ffw_norm", "scale"), (d,)))
  return out


def _read_safetensors(paths: list[str]) -> dict[str, np.ndarray]:
  from safetensors import safe_open
  out = {}
  for path in paths:
    with safe_open(path, framework="numpy") as fh:
      for name in fh.keys():
        out[name] = fh.get_tensor(name)
  return out


def load_hf_safetensors(paths: str | list[str], cfg: DecoderConfig, *, strict_dtype: bool = False,
                        **model_kw) -> Decoder:
  """A `Decoder` with `cfg` and the weights of HF-named safetensors file(s)."""
  paths = [paths] if isinstance(paths, str) else list(paths)
  tensors = _read_safetensors(paths)
  if cfg.tie_embeddings:
    tensors.pop("lm_head.weight", None)  # some tied checkpoints still store it
  tensors = {n: a for n, a in tensors.items() if not n.endswith(_IGNORED_SUFFIXES)}
  return assign(Decoder, cfg, hf_entries(cfg), tensors, source=", ".join(paths),
                strict_dtype=strict_dtype, **model_kw)


def load_hf(directory: str, *, strict_dtype: bool = False, config_overrides: Mapping | None = None,
            **model_kw) -> Decoder:
  """Loads a HF checkpoint directory (``config.json`` + ``*.safetensors``)."""
  cfg = config_from_hf(os.path.join(directory, "config.json"), **(config_overrides or {}))
  files = sorted(f for f in glob.glob(os.path.join(directory, "*.safetensors"))
                 if os.path.basename(f) != "expected.safetensors")
  if not files:
    raise CheckpointError(f"no *.safetensors weights in {directory!r}")
  return load_hf_safetensors(files, cfg, strict_dtype=strict_dtype, **model_kw)


# ---- gemma library --------------------------------------------------------------------------

def _flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, val in tree.items():
    name = f"{prefix}{key}"
    if isinstance(val, Mapping):
      out.update(_flatten(val, name + "/"))
    else:
      out[name] = val
  return out


def gemma_entries(cfg: DecoderConfig, names: set[str],
                  transpose_gating_einsum: bool | None = None) -> list[_Entry]:
  """The gemma-library tensors of `cfg` (``/``-joined names), as present in `names`."""
  d, f, n, k, h, v = (cfg.embed_dim, cfg.hidden_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                      cfg.vocab_size)
  if transpose_gating_einsum is None:
    transpose_gating_einsum = True  # Gemma 2/3 checkpoints: [2, F, D]
    if f == d and "layer_0/mlp/gating_einsum" in names:
      raise CheckpointError("cannot tell the gating_einsum layout when hidden_dim == embed_dim; "
                            "pass transpose_gating_einsum=")
  sw = lambda a: np.swapaxes(a, 0, 1)
  out = [_Entry("embedder/input_embedding", ("embedder", "embedding"), (v, d)),
         _Entry("final_norm/scale", ("final_norm", "scale"), (d,))]
  for i in range(cfg.num_layers):
    p, L = f"layer_{i}/", ("layers", i)
    if p + "attn/qkv_einsum/w" in names:
      out += [_Entry(p + "attn/qkv_einsum/w", L + ("attn", name), (3, n, d, h),
                     (lambda j: lambda a: sw(a[j]))(j)) for j, name in enumerate("qkv")]
    else:
      out += [_Entry(p + "attn/q_einsum/w", L + ("attn", "q"), (n, d, h), sw)]
      out += [_Entry(p + "attn/kv_einsum/w", L + ("attn", name), (2, k, d, h),
                     (lambda j: lambda a: sw(a[j]))(j)) for j, name in enumerate("kv")]
    out.append(_Entry(p + "attn/attn_vec_einsum/w", L + ("attn", "o"), (n, h, d)))
    if cfg.use_qk_norm:
      out += [_Entry(p + "attn/_query_norm/scale", L + ("attn", "q_norm", "scale"), (h,)),
              _Entry(p + "attn/_key_norm/scale", L + ("attn", "k_norm", "scale"), (h,))]
    out += [_Entry(p + "pre_attention_norm/scale", L + ("pre_attention_norm", "scale"), (d,)),
            _Entry(p + "pre_ffw_norm/scale", L + ("pre_ffw_norm", "scale"), (d,)),
            _Entry(p + "mlp/linear", L + ("mlp", "down"), (f, d))]
    if transpose_gating_einsum:
      out += [_Entry(p + "mlp/gating_einsum", L + ("mlp", name), (2, f, d), (lambda j: lambda a: a[j].T)(j))
              for j, name in enumerate(("gate", "up"))]
    else:
      out += [_Entry(p + "mlp/gating_einsum", L + ("mlp", name), (2, d, f), (lambda j: lambda a: a[j])(j))
              for j, name in enumerate(("gate", "up"))]
    if cfg.use_post_attn_norm:
      out.append(_Entry(p + "post_attention_norm/scale", L + ("post_attention_norm", "scale"), (d,)))
    if cfg.use_post_ffw_norm:
      out.append(_Entry(p + "post_ffw_norm/scale", L + ("post_ffw_norm", "scale"), (d,)))
  return out


def load_gemma_params(params: Mapping | str, cfg: DecoderConfig, *, strict_dtype: bool = False,
                      transpose_gating_einsum: bool | None = None, **model_kw) -> Decoder:
  """A `Decoder` from the gemma library's parameter tree (or an orbax checkpoint path of one)."""
  if isinstance(params, str):
    import orbax.checkpoint as ocp
    params = ocp.PyTreeCheckpointer().restore(params)
  if "transformer" in params and len(params) == 1:  # older gemma checkpoints nest the tree
    params = params["transformer"]
  if cfg.tie_embeddings is False:
    raise CheckpointError("gemma library checkpoints tie embeddings; cfg.tie_embeddings is False")
  flat = _flatten(params)
  entries = gemma_entries(cfg, set(flat), transpose_gating_einsum)
  return assign(Decoder, cfg, entries, flat, source="gemma params", strict_dtype=strict_dtype,
                **model_kw)


# ---- shared: check and assign --------------------------------------------------------------

def _get(obj, path):
  for p in path:
    obj = obj[p] if isinstance(p, int) else getattr(obj, p)
  return obj


def assign(model_cls, cfg: DecoderConfig, entries: list[_Entry], tensors: Mapping[str, Any], *,
           source: str, strict_dtype: bool = False, **model_kw) -> Decoder:
  """Builds ``model_cls(cfg)`` abstractly and fills every parameter from `tensors` via `entries`."""
  model = nnx.eval_shape(lambda: model_cls(cfg, rngs=nnx.Rngs(0), **model_kw))
  pdt = jnp.dtype(cfg.param_dtype)
  needed = {e.src for e in entries}
  missing = sorted(needed - set(tensors))
  if missing:
    more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
    raise CheckpointError(f"{source}: missing tensor(s) {missing[:5]}{more} needed by this config")
  unexpected = sorted(set(tensors) - needed)
  if unexpected:
    more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
    raise CheckpointError(f"{source}: unexpected tensor(s) {unexpected[:5]}{more}: the config does "
                          "not use them (wrong config, or an unsupported feature such as biases)")
  done = set()
  for e in entries:
    a = tensors[e.src]
    dt = jnp.dtype(a.dtype)
    if tuple(a.shape) != tuple(e.shape):
      raise CheckpointError(f"tensor {e.src!r}: shape {tuple(a.shape)} does not match the "
                            f"expected {tuple(e.shape)} for this config")
    if not jnp.issubdtype(dt, jnp.floating):
      raise CheckpointError(f"tensor {e.src!r}: dtype {dt} is not floating point (expected "
                            f"{pdt})")
    if strict_dtype and dt != pdt:
      raise CheckpointError(f"tensor {e.src!r}: dtype {dt} differs from param_dtype {pdt} "
                            "(strict_dtype=True)")
    val = jnp.asarray(e.fn(np.asarray(a)), pdt)
    param = _get(model, e.dst)
    want = tuple(param.get_value().shape)
    if val.shape != want:  # a bug in the mapping, not in the file
      raise AssertionError(f"{e.src} -> {e.dst}: mapped shape {val.shape} != parameter {want}")
    param.set_value(val)
    done.add(e.dst)
  left = [p for p, v in nnx.iter_graph(model) if isinstance(v, nnx.Param) and tuple(p) not in done]
  if left:
    raise CheckpointError(f"{source}: parameters {left[:5]} were not set by the checkpoint")
  return model
