"""Corpus collection and the retrieval task builders."""


import numpy as np
import pytest

from kvjax.quality import corpus, tasks


def encode(text):  # a byte tokenizer
  return list(text.encode("utf-8"))


def test_corpus_collect_split_manifest(tmp_path):
  for i in range(40):
    d = tmp_path / f"pkg{i % 3}"
    d.mkdir(exist_ok=True)
    (d / f"m{i}.py").write_text(f"x = {i}\n")
  (tmp_path / "pkg0" / "dup.py").write_text("x = 1\n")  # same content as m1: deduplicated
  (tmp_path / "pkg0" / "bad.py").write_bytes(b"\xff\xfe")  # not UTF-8: skipped
  (tmp_path / "kvjax").mkdir()
  (tmp_path / "kvjax" / "own.py").write_text("ours = True\n")  # this project: excluded
  files = corpus.collect([str(tmp_path)])
  assert len(files) == 40
  assert [f.path for f in files] == sorted(f.path for f in files)
  train, held = corpus.split(files, heldout_percent=20)
  assert len(train) + len(held) == 40 and held
  again = corpus.split(corpus.collect([str(tmp_path)]), heldout_percent=20)
  assert [f.path for f in again[1]] == [f.path for f in held]
  info = corpus.manifest([str(tmp_path)], train, held)
  assert info["train"]["files"] == len(train) and len(info["heldout"]["list_sha1"]) == 40
  with pytest.raises(ValueError, match="heldout_percent must be in"):
    corpus.split(files, 0)
  with pytest.raises(ValueError, match="is not a directory"):
    corpus.collect([str(tmp_path / "nope")])


def test_recall_example_repeats_the_span():
  rng = np.random.default_rng(0)
  stream = np.arange(5000) % 200
  ex = tasks.recall_example(stream, 512, 16, range(300, 400), rng)
  assert ex.ids.shape == (512,) and ex.target.sum() == 15
  tail = ex.ids[-16:]
  assert all(300 <= t < 400 for t in tail)
  starts = [i for i in range(0, 256) if np.array_equal(ex.ids[i:i + 16], tail)]
  assert starts
  # a perfect copier scores 1.0
  logits = np.zeros((512, 400))
  logits[np.arange(511), ex.ids[1:]] = 1.0
  assert tasks.score(logits, ex) == (1.0, True)
  with pytest.raises(ValueError, match="span must be in"):
    tasks.recall_example(stream, 512, 200, range(300, 400), rng)


def test_passkey_example_answer_positions():
  rng = np.random.default_rng(1)
  filler = "def f(x):\n    return x + 1\n" * 200
  ex = tasks.passkey_example(filler, encode, 1024, rng, depth=0.1)
  assert ex.ids.shape == (1024,)
  text = bytes(ex.ids.tolist()).decode()
  name = text.split(" = ")[0].split("\n")[-1][-10:]
  value = text.split(f"{name} = ")[1].split("\n")[0]
  assert text.endswith(f"assert {name} == {value}\n")
  pos = np.nonzero(ex.target)[0]
  assert bytes(ex.ids[pos + 1].tolist()).decode() == " " + value
  assert text.index(f"{name} = ") < 0.2 * 1024
  with pytest.raises(ValueError, match="the context needs"):
    tasks.passkey_example("x", encode, 1024, rng)
