"""kvjax's own checkpoint format: ``config.json`` (a `DecoderConfig`) + ``model.safetensors``.

Tensor names are the module paths of the `Decoder`'s parameters joined with
dots (``layers.0.attn.q``); parameters are stored in `dtype` (bf16 by
default, to ship small) and cast to the config's ``param_dtype`` at load.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvjax.models.config import DecoderConfig
from kvjax.models.decoder import Decoder

__all__ = ["save", "load"]


def _flat(state) -> dict[str, jax.Array]:
  out = {}
  for path, leaf in nnx.to_flat_state(state):
    out[".".join(str(p) for p in path)] = leaf.get_value() if hasattr(leaf, "get_value") else leaf.value
  return out


def save(model: Decoder, directory: str, *, dtype=jnp.bfloat16, metadata: dict | None = None) -> None:
  """Writes `model` to `directory` (created if needed)."""
  from safetensors.numpy import save_file
  os.makedirs(directory, exist_ok=True)
  cfg = dataclasses.asdict(model.cfg)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump({"kvjax_decoder_config": cfg, **(metadata or {})}, f, indent=1)
  tensors = {k: np.asarray(jnp.asarray(v, dtype).astype(jnp.float32) if dtype == jnp.bfloat16 else v)
             for k, v in _flat(nnx.state(model, nnx.Param)).items()}
  if dtype == jnp.bfloat16:  # safetensors.numpy has no bf16: store the bf16 bits as uint16
    tensors = {k: np.asarray(v, np.float32).astype(jnp.bfloat16).view(np.uint16) for k, v in tensors.items()}
  save_file(tensors, os.path.join(directory, "model.safetensors"),
            metadata={"dtype": "bfloat16" if dtype == jnp.bfloat16 else str(np.dtype(dtype))})


def load(directory: str, **config_overrides) -> Decoder:
  """Reads a checkpoint written by `save`; `config_overrides` replace config fields (e.g. dtype)."""
  from safetensors import safe_open
  with open(os.path.join(directory, "config.json")) as f:
    raw = json.load(f)
  if "kvjax_decoder_config" not in raw:
    raise ValueError(f"{directory}/config.json has no 'kvjax_decoder_config' entry: not a kvjax checkpoint")
  fields = raw["kvjax_decoder_config"]
  if fields.get("attention_types") is not None:
    fields["attention_types"] = tuple(fields["attention_types"])
  cfg = DecoderConfig(**{**fields, **config_overrides})
  model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  with safe_open(os.path.join(directory, "model.safetensors"), framework="numpy") as f:
    stored = f.metadata().get("dtype", "float32")
    tensors = {k: f.get_tensor(k) for k in f.keys()}
  want = _flat(nnx.state(model, nnx.Param))
  missing, unexpected = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
  if missing or unexpected:
    raise ValueError(f"checkpoint {directory} does not match the config: missing {missing[:5]}, "
                     f"unexpected {unexpected[:5]}")
  values = {}
  for name, spec in want.items():
    a = tensors[name]
    a = jnp.asarray(a.view(jnp.bfloat16)) if stored == "bfloat16" else jnp.asarray(a)
    if a.shape != spec.shape:
      raise ValueError(f"tensor {name}: checkpoint shape {a.shape} != model shape {spec.shape}")
    values[name] = a.astype(spec.dtype)
  state = nnx.state(model, nnx.Param)
  flat = [(path, values[".".join(str(p) for p in path)]) for path, _ in nnx.to_flat_state(state)]
  graphdef, _, rest = nnx.split(model, nnx.Param, ...)
  params = nnx.from_flat_state(flat)
  rest = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype) if hasattr(s, "shape") else s, rest)
  return nnx.merge(graphdef, params, rest)
