"""Storage formats for keys and values: frozen, validated configs.

A `KVFormat` pairs one `QuantSpec` for keys with one for values and, for
KIVI, the length `residual` of the full-precision window. Specs say *how* to
quantize; `kvjax.quant` does it. All configs are hashable so they can be static
arguments of jitted functions and static fields of pytrees.

Conventions (see DESIGN.md section 3):
  * arrays are head-major ``[..., S, H]``: tokens on axis -2, channels on -1;
  * `scale` always multiplies: ``x ~= code * scale (+ zero)``; it is never an
    inverse and never an absmax;
  * sub-byte codes are packed planar (see `kvjax.packing`).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Union

import jax.numpy as jnp
import ml_dtypes
import numpy as np

__all__ = [
    "Passthrough", "FP8Spec", "IntSpec", "KIVISpec", "QuantSpec", "KVFormat",
    "bf16", "fp8", "int8", "int4", "kivi", "preset", "PRESETS",
]

_frozen = dataclasses.dataclass(frozen=True, kw_only=True, slots=True)

FP8_DTYPES = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
SCALE_DTYPES = ("bfloat16", "float16", "float32")
Granularity = Literal["tensor", "head", "channel", "token"]
GRANULARITIES = ("tensor", "head", "channel", "token")


def _check_choice(name: str, value, choices) -> None:
  if value not in choices:
    raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def _check_scale_dtype(scale_dtype: str) -> None:
  _check_choice("scale_dtype", scale_dtype, SCALE_DTYPES)


@_frozen
class Passthrough:
  """No quantization: store the activations as `dtype` (the bf16 baseline)."""

  dtype: str = "bfloat16"

  def __post_init__(self):
    _check_choice("dtype", self.dtype, ("bfloat16", "float16", "float32"))

  @property
  def bits(self) -> int:
    return np.dtype(ml_dtypes.bfloat16 if self.dtype == "bfloat16" else self.dtype).itemsize * 8


@_frozen
class FP8Spec:
  """FP8 storage: ``q = clip(x / scale, -max, max).astype(fp8)``.

  Attributes:
    dtype: "e4m3" (float8_e4m3fn, max 448) or "e5m2" (max 57344).
    granularity: "tensor", "head" or "channel": one static scale per tensor,
      per KV head or per (KV head, channel), from calibration (unit scales when
      none is given, only safe with e5m2); "token": one scale per (KV head,
      token) computed on the fly when the token is written.
    scale_dtype: dtype of stored per-token scales.
  """

  dtype: str = "e4m3"
  granularity: Granularity = "token"
  scale_dtype: str = "bfloat16"

  def __post_init__(self):
    _check_choice("dtype", self.dtype, tuple(FP8_DTYPES))
    _check_choice("granularity", self.granularity, GRANULARITIES)
    _check_scale_dtype(self.scale_dtype)

  @property
  def bits(self) -> int:
    return 8

  @property
  def static(self) -> bool:
    return self.granularity != "token"

  @property
  def max(self) -> float:
    return FP8_MAX[self.dtype]


@_frozen
class IntSpec:
  """Symmetric integer codes, one scale per token: ``scale = absmax / qmax``.

  INT8 codes are int8 in [-127, 127]. INT4 codes in [-7, 7] are stored biased
  (``code + 8``) as nibbles packed two per byte along head_dim.
  """

  bits: int = 8
  scale_dtype: str = "bfloat16"

  def __post_init__(self):
    if self.bits not in (4, 8):
      raise ValueError(f"IntSpec.bits must be 4 or 8, got {self.bits!r}")
    _check_scale_dtype(self.scale_dtype)

  @property
  def qmax(self) -> int:
    return 2 ** (self.bits - 1) - 1


@_frozen
class KIVISpec:
  """KIVI asymmetric b-bit codes over groups of `group_size` elements.

  ``axis="token"`` (keys): a group is G consecutive tokens of one channel.
  ``axis="channel"`` (values): a group is G consecutive channels of a token.
  Per group: ``scale = (max - min) / (2^b - 1)``, ``code = round(clip((x -
  min) / scale, 0, 2^b - 1))``, dequantized as ``code * scale + min``. The
  stored min is rounded down and the stored scale up (in `scale_dtype`), so
  every element lies inside the representable range and the error is at most
  half a stored step.
  """

  bits: int = 2
  group_size: int = 32
  axis: Literal["token", "channel"] = "token"
  scale_dtype: str = "bfloat16"

  def __post_init__(self):
    if self.bits not in (2, 4):
      raise ValueError(f"KIVISpec.bits must be 2 or 4, got {self.bits!r}")
    if not isinstance(self.group_size, int) or self.group_size < 1:
      raise ValueError(f"KIVISpec.group_size must be a positive int, got {self.group_size!r}")
    _check_choice("axis", self.axis, ("token", "channel"))
    _check_scale_dtype(self.scale_dtype)

  @property
  def qmax(self) -> int:
    return 2 ** self.bits - 1


QuantSpec = Union[Passthrough, FP8Spec, IntSpec, KIVISpec]


@_frozen
class KVFormat:
  """How a KV cache stores keys and values.

  Attributes:
    name: label used in tables and results files.
    key: spec for keys. A KIVI key spec must group along tokens.
    value: spec for values. A KIVI value spec must group along channels.
    residual: R, the KIVI full-precision window (0 for other formats). Keys
      are quantized R tokens at a time (R % G == 0); the last R values stay in
      full precision.
    residual_dtype: dtype of the full-precision window.
    sink: the first `sink` tokens of every sequence are also kept in full
      precision (attention sinks, StreamingLLM / IntactKV); 0 disables. They
      are still quantized in place (and still enter the statistics of their
      KIVI key group), but attention reads the full-precision copy.
  """

  name: str
  key: QuantSpec
  value: QuantSpec
  residual: int = 0
  residual_dtype: str = "bfloat16"
  sink: int = 0

  def __post_init__(self):
    for role, spec in (("key", self.key), ("value", self.value)):
      if not isinstance(spec, (Passthrough, FP8Spec, IntSpec, KIVISpec)):
        raise TypeError(f"KVFormat.{role} must be a QuantSpec, got {type(spec).__name__}")
    if not isinstance(self.residual, int) or self.residual < 0:
      raise ValueError(f"KVFormat.residual must be an int >= 0, got {self.residual!r}")
    if isinstance(self.key, KIVISpec) and self.key.axis != "token":
      raise ValueError(f"KIVI keys are grouped along tokens: key.axis must be 'token', got {self.key.axis!r}")
    if isinstance(self.value, KIVISpec) and self.value.axis != "channel":
      raise ValueError(f"KIVI values are grouped along channels: value.axis must be 'channel', got {self.value.axis!r}")
    if self.is_kivi:
      if self.residual == 0:
        raise ValueError("KVFormat.residual (R) must be > 0 for KIVI formats, got 0")
      if not (isinstance(self.key, KIVISpec) and isinstance(self.value, KIVISpec)):
        raise ValueError("KIVI formats need KIVI specs for both key and value")
      g = self.key.group_size
      if self.residual % g:
        raise ValueError(
            f"residual length R ({self.residual}) must be a multiple of the key group size G ({g})")
      per_byte = 8 // self.key.bits
      if self.residual % per_byte:
        raise ValueError(f"residual length R ({self.residual}) must be a multiple of {per_byte} "
                         f"(codes per byte at {self.key.bits} bits)")
    elif self.residual:
      raise ValueError(f"KVFormat.residual is only used by KIVI formats; got {self.residual} for {self.name!r}")
    _check_choice("residual_dtype", self.residual_dtype, ("bfloat16", "float16", "float32"))
    if not isinstance(self.sink, int) or self.sink < 0:
      raise ValueError(f"KVFormat.sink must be an int >= 0, got {self.sink!r}")

  @property
  def is_kivi(self) -> bool:
    return isinstance(self.key, KIVISpec) or isinstance(self.value, KIVISpec)

  @property
  def has_static_scales(self) -> bool:
    return any(isinstance(s, FP8Spec) and s.static for s in (self.key, self.value))

  def validate_head_dim(self, head_dim: int) -> None:
    """Checks that the format can store vectors of `head_dim` channels."""
    for role, spec in (("key", self.key), ("value", self.value)):
      if isinstance(spec, KIVISpec) and spec.axis == "channel" and head_dim % spec.group_size:
        raise ValueError(f"{role} group_size ({spec.group_size}) must divide head_dim ({head_dim})")
      packs_channels = isinstance(spec, IntSpec) or (isinstance(spec, KIVISpec) and spec.axis == "channel")
      if packs_channels and spec.bits < 8 and head_dim % (8 // spec.bits):
        raise ValueError(f"head_dim ({head_dim}) must be a multiple of {8 // spec.bits} to pack "
                         f"{spec.bits}-bit {role} codes")

def bf16() -> KVFormat:
  return KVFormat(name="bf16", key=Passthrough(), value=Passthrough())


def fp8(dtype: str = "e4m3", key_granularity: Granularity = "token",
        value_granularity: Granularity = "token", name: str | None = None) -> KVFormat:
  """FP8 keys and values. Static granularities take scales from calibration."""
  if name is None:
    name = f"fp8_{dtype}" + ("" if key_granularity == value_granularity == "token"
                             else f"_{key_granularity}_{value_granularity}")
  return KVFormat(name=name, key=FP8Spec(dtype=dtype, granularity=key_granularity),
                  value=FP8Spec(dtype=dtype, granularity=value_granularity))


def int8() -> KVFormat:
  return KVFormat(name="int8", key=IntSpec(bits=8), value=IntSpec(bits=8))


def int4() -> KVFormat:
  return KVFormat(name="int4", key=IntSpec(bits=4), value=IntSpec(bits=4))


def kivi(bits: int = 2, group_size: int = 32, residual: int = 128,
         name: str | None = None, sink: int = 0) -> KVFormat:
  """KIVI: per-channel keys and per-token values, `bits` wide, R full-precision (+ `sink` first tokens)."""
  name = name or f"kivi{bits}_g{group_size}_r{residual}" + (f"_sink{sink}" if sink else "")
  return KVFormat(name=name, key=KIVISpec(bits=bits, group_size=group_size, axis="token"),
                  value=KIVISpec(bits=bits, group_size=group_size, axis="channel"),
                  residual=residual, sink=sink)


PRESETS = {
    "bf16": bf16,
    "fp8_e4m3": lambda: fp8("e4m3"),
    "fp8_e5m2": lambda: fp8("e5m2"),
    "fp8_e4m3_static": lambda: fp8("e4m3", "channel", "head", name="fp8_e4m3_static"),
    "int8": int8,
    "int4": int4,
    "kivi4": lambda: kivi(4, 32, 128, name="kivi4"),
    "kivi2": lambda: kivi(2, 32, 128, name="kivi2"),
    "kivi2_g128": lambda: kivi(2, 128, 128, name="kivi2_g128"),
}


def preset(name: str) -> KVFormat:
  """Returns a named format: one of `PRESETS`."""
  if name not in PRESETS:
    raise ValueError(f"unknown format name {name!r}; expected one of {sorted(PRESETS)}")
  return PRESETS[name]()
