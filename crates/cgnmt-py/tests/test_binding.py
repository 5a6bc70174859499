"""The binding by concept: every public name is the native module's own (no Python wrapper restating its
defaults), results are read-only classes with their fields in their `repr`, and `cgnmt.prepare` prepares data
in-process. The stubs' agreement with the module is checked by mypy's stubtest in `.ci/run`."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import cgnmt
from cgnmt import _cgnmt, metrics
from conftest import DATA


def test_every_public_name_is_the_native_modules_with_its_defaults_in_its_signature():
    for mod in (cgnmt, metrics):
        for name in mod.__all__:
            if name == "metrics":
                continue
            obj = getattr(mod, name)
            assert obj is getattr(_cgnmt, name), name
    # The defaults are read from the native signatures themselves (the one place they are written).
    sig = inspect.signature(cgnmt.Translator.translate)
    assert sig.parameters["beam"].default == 10 and sig.parameters["batch"].default == 32
    assert sig.parameters["length_penalty"].default is None and sig.parameters["long_input"].default == "split"
    assert inspect.signature(cgnmt.Translator.translate_batch).parameters["beam_size"].default == 10
    assert inspect.signature(metrics.compare).parameters["test"].default == "bootstrap"
    assert inspect.signature(cgnmt.select).parameters["last"].default == 4
    # Documented where they are defined.
    for obj in (cgnmt.Translator, cgnmt.Translator.translate, cgnmt.Translation, metrics.bleu, cgnmt.train):
        assert obj.__doc__ and len(obj.__doc__) > 40, obj


def test_results_are_read_only_classes(models, dev_lines):
    tr = cgnmt.Translator(models[0])
    t = tr.translate(dev_lines[:2], beam=3, nbest=2, return_attention=True)[0]
    assert isinstance(t, cgnmt.Translation) and isinstance(t.hypotheses[0], cgnmt.Hypothesis)
    assert repr(t).startswith("Translation(text=") and repr(t.hypotheses[0]).startswith("Hypothesis(text=")
    with pytest.raises(AttributeError):
        t.text = "changed"
    # Arrays are NumPy arrays made once (the same object at each access), copies of the library's values.
    a = t.attention
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and t.attention is a
    np.testing.assert_allclose(a.sum(axis=1), 1.0, atol=1e-5)
    r = tr.translate_batch([dev_lines[0]], beam_size=3)[0]
    assert r["hypotheses"] == r.hypotheses
    with pytest.raises(KeyError):
        r["nothing"]
    b = metrics.bleu(["the cat sat on the mat"], ["the cat sat on the mat"])
    assert b.score == pytest.approx(100.0) and "BLEU|nrefs:1" in str(b) and repr(b).startswith("BLEUScore(score=100.0")


def test_prepare_in_process_and_its_errors(tmp_path):
    out = tmp_path / "prep"
    s = cgnmt.prepare(DATA / "train.zh", DATA / "train.en", out, limit=50, src_vocab_size=100, max_len=20)
    assert s["train"]["pairs_read"] == 50 and s["train"]["pairs_kept"] <= 50
    assert s["src"]["vocab_entries"] <= 102 and (out / "train.src").is_file()
    # The command line's defaults where nothing is given (zh → en, jieba for Chinese).
    assert s["src"]["lang"] == "zh" and s["tgt"]["lang"] == "en"
    with pytest.raises(ValueError, match="not empty|--force|exists"):
        cgnmt.prepare(DATA / "train.zh", DATA / "train.en", out, limit=10)
    with pytest.raises(ValueError, match="tokenizer"):
        cgnmt.prepare(DATA / "train.zh", DATA / "train.en", tmp_path / "x", src_tok="nonsense")
    with pytest.raises(FileNotFoundError):
        cgnmt.prepare(tmp_path / "missing.zh", DATA / "train.en", tmp_path / "y")
