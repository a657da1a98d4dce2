"""CPU smoke test of benchmarks/decode_kernels.py's pieces (head shapes, inputs, result files); the
timing itself needs a GPU."""

import json
import os
import sys

import jax
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import decode_kernels  # noqa: E402
import decode_report  # noqa: E402
import kernel_variants  # noqa: E402


def test_head_shapes_validate():
  g = kernel_variants.SHAPES["gemma2_2b"]
  assert (g.rep, g.head_dim, g.softcap) == (2, 256, 50.0)
  with pytest.raises(ValueError, match="multiple of k_heads"):
    kernel_variants.HeadShape(6, 4, 128)
  with pytest.raises(ValueError, match="head_dim must be a positive int, got 0"):
    kernel_variants.HeadShape(8, 4, 0)
  with pytest.raises(ValueError, match="softcap"):
    kernel_variants.HeadShape(8, 4, 128, softcap=-1.0)


def test_gemma_inputs_and_window_bytes(monkeypatch):
  monkeypatch.setattr(decode_kernels, "SHAPE", kernel_variants.SHAPES["gemma2_2b"])
  key = jax.random.PRNGKey(0)
  length, nb, _, caches, q = decode_kernels.cache_sets("fp8_e4m3", 2, 1024, key)
  assert q.shape == (2, 8, 1, 256) and caches[0].k.codes.shape == (2, 4, 1024, 256)
  monkeypatch.setattr(decode_kernels, "WINDOW", 256)
  _, nb_window, _, _, _ = decode_kernels.cache_sets("fp8_e4m3", 2, 1024, key)
  assert nb_window == pytest.approx(nb * 256 / length)  # a window reads only its blocks
  assert decode_kernels.kernel_options({"num_warps": 4}) == {"logit_softcap": 50.0, "window": 256,
                                                             "num_warps": 4}


def test_merge_plot_and_summary(tmp_path, capsys):
  rows = [dict(impl=i, format=f, batch=8, context=c, us=us, bytes_read=1, tbps=1.0, frac_roofline=0.5)
          for i, f, c, us in (("torch_sdpa", "bf16", 4096, 40.0), ("kvjax", "fp8_e4m3", 4096, 20.0),
                              ("torch_sdpa", "bf16", 32768, 240.0), ("kvjax", "fp8_e4m3", 32768, 160.0))]
  meta = {"stream_tbps": 4.5, "head_shape": {"n_heads": 8, "k_heads": 4, "head_dim": 256, "softcap": 50.0}}
  a, b = tmp_path / "a.json", tmp_path / "b.json"
  decode_report.save(str(a), meta, rows)
  decode_report.save(str(b), meta, [dict(rows[1], us=10.0)])  # later files win per row
  out = tmp_path / "m.json"
  decode_report.merge_and_plot([str(a), str(b)], str(out))
  merged = json.load(open(out))["rows"]
  assert len(merged) == 4 and [r["us"] for r in merged if r["impl"] == "kvjax" and r["context"] == 4096] == [10.0]
  assert (tmp_path / "m.png").stat().st_size > 0
  text = capsys.readouterr().out
  assert "4.00x" in text and "1.50x" in text  # 40 / 10 and 240 / 160 against torch SDPA


def test_profile_trace_parsing(tmp_path):
  """`profile_step.kernel_times` on a synthetic GPU-shaped trace (kernels on a stream track, the
  module track left out) and on a real profiler trace of a jitted function on the CPU."""
  import jax.numpy as jnp
  import profile_step
  meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
          {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #13(Compute)"}},
          {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "XLA Modules"}}]
  x = [("fusion", 0, 3), ("kvjax_flat_decode", 4, 10), ("fusion_1", 15, 2)] * 2
  ev = [{"ph": "X", "pid": 1, "tid": 7, "name": n, "ts": t + 20 * (i // 3), "dur": d}
        for i, (n, t, d) in enumerate(x)]
  ev.append({"ph": "X", "pid": 1, "tid": 8, "name": "jit_run", "ts": 0, "dur": 40})
  ev.append({"ph": "X", "pid": 2, "tid": 9, "name": "host", "ts": 0, "dur": 99})
  got = profile_step.kernel_times({"traceEvents": meta + ev}, steps=2)
  assert list(got["kernels"]) == ["kvjax_flat_decode", "fusion", "fusion_1"]
  assert got["kernels"]["kvjax_flat_decode"] == {"us": 10.0, "calls": 1.0}
  assert got["busy_us"] == 15.0 and got["span_us"] == (37 - 0) / 2
  with pytest.raises(ValueError, match="no trace process named like 'TPU'"):
    profile_step.kernel_times({"traceEvents": meta + ev}, steps=2, process="TPU")
  with pytest.raises(ValueError, match="steps must be >= 1"):
    profile_step.kernel_times({"traceEvents": meta + ev}, steps=0)
  with pytest.raises(ValueError, match="what must be one of"):
    profile_step.profile_point("fp8_e4m3", 1, 512, 1, what="decode")
  f = jax.jit(lambda a: jnp.sin(a) @ a.T)
  a = jnp.ones((64, 64))
  f(a).block_until_ready()
  with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
    f(a).block_until_ready()
  real = profile_step.kernel_times(profile_step._read_trace(str(tmp_path)), 1, process="CPU", thread="")
  assert real["busy_us"] > 0 and real["span_us"] > 0 and real["kernels"]


def test_promote_retires_triton_kivi_rows(tmp_path):
  """`benchmarks/runs/session26_promote.py`: the table's kivi2 / kivi4 `kvjax` rows become `kvjax_triton`, a
  source's renamed rows (and its torch rows) replace the table's per (impl, format, batch, context), other
  impls of a source are dropped, a second run changes nothing, and a source from another card is refused."""
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "runs"))
  import session26_promote as sp
  row = lambda impl, fmt, us, ctx=32768: dict(impl=impl, format=fmt, batch=8, context=ctx, us=us)
  h200 = {"device_kind": "NVIDIA H200", "stream_tbps": 4.4}
  table = {"meta": [[{"device": "cuda:0"}], h200],
           "rows": [row("kvjax", "kivi2", 350.0), row("kvjax", "kivi4", 362.0), row("kvjax", "fp8_e4m3", 141.0),
                    row("torch_sdpa", "bf16", 245.0)]}
  src = {"meta": dict(h200, jax="x"), "rows": [row("sweep:kivi_layout=words", "kivi2", 130.0),
                                              row("sweep:", "kivi2", 352.0), row("torch_sdpa", "bf16", 238.9)]}
  (tmp_path / "s.json").write_text(json.dumps(src))
  sources = (("s.json", {"sweep:kivi_layout=words": "kvjax", "torch_sdpa": "torch_sdpa"}),)
  out = sp.promote(table, sources, str(tmp_path))
  got = {(r["impl"], r["format"]): r["us"] for r in out["rows"]}
  assert got == {("kvjax_triton", "kivi2"): 350.0, ("kvjax_triton", "kivi4"): 362.0, ("kvjax", "kivi2"): 130.0,
                 ("kvjax", "fp8_e4m3"): 141.0, ("torch_sdpa", "bf16"): 238.9}
  assert [r.get("source") for r in out["rows"] if r["impl"] == "kvjax" and r["format"] == "kivi2"] == ["s.json"]
  assert sp.promote(out, sources, str(tmp_path)) == out
  (tmp_path / "h100.json").write_text(json.dumps(dict(src, meta={"device_kind": "NVIDIA H100 80GB HBM3"})))
  with pytest.raises(ValueError, match="h100.json ran on 'NVIDIA H100 80GB HBM3'; expected one of"):
    sp.promote(table, (("h100.json", sources[0][1]),), str(tmp_path))


def test_append_only_wraps_every_set_then_appends():
  """`append_only` over the cache sets (the placed writer, interpreted): each set's lengths wrapped back before
  the capacity in one op (`wrapped`), then one token appended."""
  import jax.numpy as jnp  # noqa: PLC0415
  from pallas_kernels.gpu import write  # noqa: PLC0415

  length, _, ns, caches, q = decode_kernels.cache_sets("fp8_e4m3", 2, 512, jax.random.PRNGKey(0))
  caches = (caches[0].replace(lengths=jnp.full((2,), 511, jnp.int32)),) + caches[1:]  # at the wrap point
  _, new = jax.jit(decode_kernels.append_only(write.append, 2, 512, length))((q, caches))
  assert len(new) == ns and [c.lengths.tolist() for c in new] == [[length + 1] * 2] + [[length + 1] * 2] * (ns - 1)
  assert [c.lengths.tolist() for c in decode_kernels.wrapped(caches, 512, length)][0] == [length] * 2
