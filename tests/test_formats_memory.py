"""Format validation and byte accounting."""

import pytest

from kvjax import formats, memory
from kvjax.formats import FP8Spec, IntSpec, KIVISpec, KVFormat, Passthrough


def test_invalid_configs_name_argument_value_and_expectation():
  with pytest.raises(ValueError, match=r"KIVISpec.bits must be 2 or 4, got 3"):
    KIVISpec(bits=3)
  with pytest.raises(ValueError, match=r"IntSpec.bits must be 4 or 8, got 2"):
    IntSpec(bits=2)
  with pytest.raises(ValueError, match=r"dtype must be one of \('e4m3', 'e5m2'\), got 'e3m4'"):
    FP8Spec(dtype="e3m4")
  with pytest.raises(ValueError, match=r"granularity must be one of"):
    FP8Spec(granularity="block")
  with pytest.raises(ValueError, match=r"residual length R \(100\) must be a multiple of the key group size G \(32\)"):
    formats.kivi(2, 32, 100)
  with pytest.raises(ValueError, match=r"residual \(R\) must be > 0"):
    formats.kivi(2, 32, 0)
  with pytest.raises(ValueError, match="key.axis must be 'token'"):
    KVFormat(name="x", key=KIVISpec(axis="channel"), value=KIVISpec(axis="channel"), residual=32)
  with pytest.raises(ValueError, match="only used by KIVI"):
    KVFormat(name="x", key=Passthrough(), value=Passthrough(), residual=32)
  with pytest.raises(ValueError, match="unknown format name 'fp9'"):
    formats.preset("fp9")
  with pytest.raises(ValueError, match=r"group_size \(48\) must divide head_dim \(128\)"):
    formats.kivi(2, 48, 96).validate_head_dim(128)
  with pytest.raises(TypeError, match="KVFormat.key must be a QuantSpec"):
    KVFormat(name="x", key="fp8", value=Passthrough())


def test_configs_are_frozen_and_hashable():
  f = formats.preset("kivi2")
  with pytest.raises(Exception):
    f.residual = 64
  assert hash(f) == hash(formats.preset("kivi2"))


@pytest.mark.parametrize("name,expected", [
    ("bf16", 1.0), ("fp8_e4m3", 0.5 + 1 / 128), ("fp8_e4m3_static", 0.5), ("int8", 0.5 + 1 / 128),
    ("int4", 0.25 + 1 / 128), ("kivi4", 0.25 + 4 / 32 / 2), ("kivi2", 0.125 + 4 / 32 / 2),
    ("kivi2_g128", 0.125 + 4 / 128 / 2)])
def test_marginal_bytes_per_token_match_the_formula(name, expected):
  """Codes + bf16 scales (+ KIVI min) per token, relative to bf16's 2 bytes per element."""
  bf = memory.marginal_bytes_per_token(formats.bf16())
  assert memory.marginal_bytes_per_token(formats.preset(name)) / bf == pytest.approx(expected, rel=1e-6)


def test_sequences_that_fit_counts_residual_and_lengths():
  shape = memory.LLAMA3_8B
  kivi = formats.preset("kivi2_g128")
  per_seq = memory.bytes_per_sequence(kivi, 32768, shape)
  # codes+scales for 32k tokens, plus two R x H bf16 residual windows, plus lengths, per layer and head
  expected = shape.num_layers * (shape.num_kv_heads * (32768 * 0.28125 * 128 * 2 + 2 * 128 * 128 * 2) + 4)
  assert per_seq == expected
  assert memory.sequences_that_fit(kivi, 16 << 30, 32768, shape) == (16 << 30) // per_seq
  assert memory.sequences_that_fit(formats.bf16(), 16 << 30, 32768, shape) == 3
  with pytest.raises(ValueError, match="budget_bytes must be >= 0"):
    memory.sequences_that_fit(kivi, -1, 1024)
