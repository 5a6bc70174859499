"""`Translator.translate` equals `cgnmt translate`, byte for byte; attention, gates and coverage as arrays;
errors as Python exceptions; threads; Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import cgnmt
from conftest import run


def cli_translate(cgnmt_bin, model_dirs, lines, tmp_path, *flags):
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out, dump = tmp_path / "out.txt", tmp_path / "dump.jsonl"
    args = ["translate", "-q", "-i", inp, "-o", out, "--dump", dump]
    for m in model_dirs:
        args += ["-m", m]
    run(cgnmt_bin, *args, *flags)
    return out.read_bytes(), [json.loads(l) for l in dump.read_text().splitlines()]


def rendered(results, nbest):
    """The output `cgnmt translate` writes for these results."""
    text = ""
    for i, t in enumerate(results):
        if nbest > 1:
            text += "".join(f"{i} ||| {h.text} ||| {h.score:.4f}\n" for h in t.hypotheses)
        else:
            text += t.text + "\n"
    return text.encode("utf-8")


CASES = [
    ("beam 1", {"beam": 1}, ["--beam", "1"]),
    ("beam 5", {"beam": 5}, ["--beam", "5"]),
    ("n-best 3", {"beam": 5, "nbest": 3}, ["--beam", "5", "--nbest", "3"]),
    (
        "penalties",
        {"beam": 5, "length_penalty": 1.0, "coverage_penalty": 0.2},
        ["--beam", "5", "--length-penalty", "1.0", "--coverage-penalty", "0.2"],
    ),
    ("length norm", {"beam": 4, "length_norm": True}, ["--beam", "4", "--length-norm"]),
    ("context scale", {"context_scale": (1.0, 0.5)}, ["--context-scale", "1.0,0.5"]),
    ("int8", {"beam": 5, "int8": True}, ["--beam", "5", "--int8"]),
    ("ensemble", {"beam": 5, "ensemble": True}, ["--beam", "5"]),
]


@pytest.mark.parametrize("name,kw,flags", CASES, ids=[c[0] for c in CASES])
def test_translate_equals_the_command_line_byte_for_byte(
    name, kw, flags, models, dev_lines, cgnmt_bin, tmp_path
):
    kw = dict(kw)
    dirs = [models[0], models[1]] if kw.pop("ensemble", False) else [models[0]]
    tr = cgnmt.Translator(dirs if len(dirs) > 1 else dirs[0], int8=kw.pop("int8", False))
    got = tr.translate(dev_lines, return_attention=True, return_gates=True, return_coverage=True, **kw)
    want, dump = cli_translate(cgnmt_bin, dirs, dev_lines, tmp_path, *flags)
    assert rendered(got, kw.get("nbest", 1)) == want
    assert len(dump) == len(got)
    for t, d in zip(got, dump):
        # The dump's attention rows, gates and coverage are the same float32 values.
        assert t.attention.shape == (len(d["attention"]), len(d["attention"][0]) if d["attention"] else 0)
        np.testing.assert_array_equal(t.attention, np.array(d["attention"], dtype=np.float32).reshape(t.attention.shape))
        np.testing.assert_array_equal(t.gates, np.array(d["gates"], dtype=np.float32))
        np.testing.assert_array_equal(t.coverage, np.array(d["coverage"], dtype=np.float32))
        if t.score is not None:
            assert abs(t.score - d["score"]) < 1e-9


def test_attention_rows_sum_to_one_gates_lie_in_the_unit_interval(models, dev_lines):
    tr = cgnmt.Translator(models[0])
    out = tr.translate(dev_lines, beam=5, return_attention=True, return_gates=True, return_coverage=True)
    assert out[17].text == "" and out[17].score is None and out[17].hypotheses == []
    words = 0
    for t in out:
        if not t.source_tokens:
            continue
        s = len(t.source_tokens) + 1
        assert t.attention.dtype == np.float32 and t.attention.shape[1] == s
        assert t.attention.shape[0] in (len(t.tokens), len(t.tokens) + 1)
        np.testing.assert_allclose(t.attention.sum(axis=1), 1.0, atol=1e-5)
        assert t.gates.shape == (len(t.tokens),)
        assert ((t.gates > 0) & (t.gates < 1)).all()
        assert t.coverage.shape == (s,)
        words += len(t.tokens)
    assert words > 200
    # Without the flags, nothing is recorded.
    plain = tr.translate(dev_lines[:3])
    assert plain[0].attention is None and plain[0].gates is None and plain[0].coverage is None
    assert [p.text for p in plain] == [t.text for t in tr.translate(dev_lines[:3], return_gates=True)]


def test_score_gives_each_hypothesis_the_searchs_log_probability(models, dev_lines):
    lines = [l for l in dev_lines if l.strip()][:30]
    for dirs in ([models[0]], [models[0], models[1]]):
        tr = cgnmt.Translator(dirs if len(dirs) > 1 else dirs[0])
        out = tr.translate(lines, beam=5, nbest=3)
        srcs, tgts, want = [], [], []
        for t in out:
            for h in t.hypotheses:
                srcs.append(" ".join(t.source_tokens))
                tgts.append(" ".join(h.tokens))
                want.append(h.score)
        got = tr.score(srcs, tgts, pretokenized=True, batch=7)
        assert len(got) == len(want) > 60
        for g, w, t in zip(got, want, tgts):
            assert g.tokens == t.split()
            assert g.token_scores.dtype == np.float32 and g.token_scores.shape == (len(g.tokens) + 1,)
            assert (g.token_scores <= 0).all()
            assert abs(g.score - float(g.token_scores.astype(np.float64).sum())) < 1e-4
            assert abs(g.score - w) < 1e-3 * max(1.0, abs(w)), (dirs, t, g.score, w)
        # The best hypothesis scores at least as high as the second (the search ranks by this total).
        best = [tr.score([" ".join(t.source_tokens)] * 2, [" ".join(h.tokens) for h in t.hypotheses[:2]],
                         pretokenized=True) for t in out if len(t.hypotheses) > 1]
        assert all(b[0].score >= b[1].score - 1e-4 for b in best)
    # Raw text goes through the model's tokenisers: the same as the tokens given pretokenised.
    tr = cgnmt.Translator(models[0])
    raw = tr.score(lines[:5], [t.text for t in out[:5]])
    tok = tr.score([" ".join(t.source_tokens) for t in out[:5]], [" ".join(r.tokens) for r in raw],
                   pretokenized=True)
    assert [r.score for r in raw] == [t.score for t in tok]
    with pytest.raises(ValueError, match="2 source sentences but 1 targets"):
        tr.score(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="batch 0"):
        tr.score(["a"], ["b"], batch=0)
    with pytest.raises(ValueError, match="context_scale"):
        tr.score(["a"], ["b"], context_scale=(-1.0, 1.0))


def test_align_equals_the_command_line(models, prepared, cgnmt_bin, tmp_path):
    src = (prepared / "dev.src").read_text(encoding="utf-8").splitlines()[:40]
    tgt = (prepared / "dev.tgt").read_text(encoding="utf-8").splitlines()[:40]
    got = cgnmt.align(models[0], src, tgt, soft=True)
    s, t = tmp_path / "s", tmp_path / "t"
    s.write_text("\n".join(src) + "\n", encoding="utf-8")
    t.write_text("\n".join(tgt) + "\n", encoding="utf-8")
    run(cgnmt_bin, "align", "-m", models[0], "--src", s, "--tgt", t, "-o", tmp_path / "links",
        "--soft", tmp_path / "soft.jsonl")
    lines = (tmp_path / "links").read_text().splitlines()
    soft = [json.loads(l) for l in (tmp_path / "soft.jsonl").read_text().splitlines()]
    assert len(got) == len(lines) == 40
    for a, l, rec in zip(got, lines, soft):
        assert " ".join(f"{i}-{j}" for i, j in a.links) == l
        np.testing.assert_allclose(a.attention, np.array(rec["attention"]), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(a.attention.sum(axis=1), 1.0, atol=1e-5)


def test_model_info_and_vocabularies(models):
    info = cgnmt.Model(models[0]).info()
    assert info["directory"].endswith("best")
    assert "context_gate" in info["config"] and info["total_parameters"] == sum(n for _, n in info["parameters"])
    tr = cgnmt.Translator(models[0])
    assert tr.info()["total_parameters"] == info["total_parameters"]
    assert tr.source_vocabulary()[:2] == ["</s>", "<unk>"]
    assert len(tr.target_vocabulary()) == info["target_vocabulary_size"]
    m = cgnmt.Model(models[0])
    assert m.source_vocabulary == tr.source_vocabulary() and m.target_vocabulary == tr.target_vocabulary()
    assert "source_vocabulary" not in m.info() and "target_vocabulary" not in tr.info()


def test_errors_are_python_exceptions(models, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        cgnmt.Translator(tmp_path / "missing")
    broken = tmp_path / "broken"
    shutil.copytree(models[0] / "best", broken)
    w = broken / "model.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    with pytest.raises(ValueError, match="model.safetensors"):
        cgnmt.Translator(broken)
    (broken / "vocab.src").unlink()
    with pytest.raises(ValueError, match="missing file vocab.src"):
        cgnmt.Translator(broken)
    tr = cgnmt.Translator(models[0])
    for bad, what in [
        ({"beam": 0}, "beam 0"),
        ({"nbest": 20, "beam": 5}, "nbest"),
        ({"length_penalty": -1.0}, "length_penalty"),
        ({"coverage_penalty": float("nan")}, "coverage_penalty"),
        ({"context_scale": (1.0, 5.0)}, "context_scale"),
        ({"batch": 0}, "batch"),
        ({"long_input": "drop"}, "long_input"),
    ]:
        with pytest.raises(ValueError, match=what):
            tr.translate(["你好。"], **bad)
    with pytest.raises(TypeError):
        tr.translate("你好。")
    with pytest.raises(FileNotFoundError):
        cgnmt.Translator(models[0], shortlist=tmp_path / "no-lexicon.tsv")
    with pytest.raises(RuntimeError, match="panicked"):
        cgnmt._cgnmt._panic_for_test()
    with pytest.raises(ValueError, match="source sentences"):
        tr.align(["a b"], [])


def test_two_threads_translating_at_once_give_the_outputs_of_one(models, dev_lines):
    tr = cgnmt.Translator(models[0])
    alone = [t.text for t in tr.translate(dev_lines, beam=5)]
    results = [None, None]

    def work(k):
        results[k] = [t.text for t in tr.translate(dev_lines, beam=5)]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0] == alone and results[1] == alone


def test_ctrl_c_stops_a_long_batch_within_two_seconds(models, dev_lines):
    tr = cgnmt.Translator(models[0])
    many = [l for l in dev_lines if l] * 400  # about 40,000 sentences: far longer than the test waits
    sent = {}

    def interrupt():
        sent["at"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(1.0, interrupt)
    started = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        tr.translate(many, beam=10)
    stopped = time.monotonic()
    timer.join()
    assert "at" in sent, f"the call ended after {stopped - started:.1f} s, before the interrupt"
    assert stopped - sent["at"] < 2.0, f"stopped {stopped - sent['at']:.2f} s after Ctrl-C"
    # The translator still works after an interrupted call.
    assert tr.translate(dev_lines[:2])[0].text


def test_word_scores_alignments_and_prefixes_as_the_command_line_writes_them(models, dev_lines, cgnmt_bin,
                                                                              tmp_path):
    lines = [l for l in dev_lines if l.strip()][:20]
    tr = cgnmt.Translator(models[1])
    out = tr.translate(lines, beam=4, return_word_scores=True, alignment="hard")
    cli, _ = cli_translate(cgnmt_bin, [models[1]], lines, tmp_path, "--beam", "4", "--word-scores",
                           "--alignment", "hard")
    rows = cli.decode("utf-8").splitlines()
    assert len(rows) == len(out) == 20
    for row, t in zip(rows, out):
        text, links, scores, gates = row.split(" ||| ")
        assert text == t.text
        assert links == " ".join(f"{i}-{j}" for i, j in t.alignment)
        words = scores[len("WordScores="):].split(" Score=")[0].split()
        assert t.word_scores.dtype == np.float64 and len(words) == len(t.word_scores) > 0
        assert np.allclose([float(x) for x in words], t.word_scores, atol=6e-5)
        assert np.allclose([float(x) for x in gates[len("WordGates="):].split()], t.word_gates, atol=6e-5)
        # One hard link per output word; the words' scores add up to the tokens' (EOS aside).
        assert [j for _, j in t.alignment] == list(range(len(t.word_scores)))
        assert float(t.word_scores.sum()) <= 0


def test_soft_alignments_and_target_prefixes(models, dev_lines):
    lines = [l for l in dev_lines if l.strip()][:20]
    tr = cgnmt.Translator(models[1])
    out = tr.translate(lines, beam=4)
    soft = tr.translate(lines[:3], alignment="soft")
    for t in soft:
        assert t.alignment.ndim == 2 and np.allclose(t.alignment.sum(axis=1), 1.0)
    plain = tr.translate(lines[:3])
    assert plain[0].word_scores is None and plain[0].alignment is None
    # A target prefix: the outputs start with it, and greedy search forced to its own first token is unchanged.
    src = [" ".join(t.source_tokens) for t in out]
    greedy = tr.translate(src, beam=1, pretokenized=True)
    first = [t.tokens[0] if t.tokens else "" for t in greedy]
    forced = tr.translate(src, beam=1, pretokenized=True, target_prefix=first)
    assert [t.tokens for t in forced] == [t.tokens for t in greedy]
    other = [t.tokens[1] if len(t.tokens) > 1 else "" for t in greedy]
    for t, p in zip(tr.translate(src, beam=4, pretokenized=True, target_prefix=other), other):
        if p:
            assert t.tokens[0] == p
    with pytest.raises(ValueError, match="target prefixes for 20 lines"):
        tr.translate(src, target_prefix=["a"])
    with pytest.raises(ValueError, match="alignment"):
        tr.translate(src, alignment="sometimes")


def constrained(tr, dev_lines):
    """20 sentences' source tokens, one required phrase each (the next sentence's last output token) and one
    avoided (the sentence's own first)."""
    lines = [l for l in dev_lines if l.strip()][:20]
    out = tr.translate(lines, beam=4)
    src = [" ".join(t.source_tokens) for t in out]
    plain = tr.translate(src, beam=4, pretokenized=True)
    cons = [[plain[(k + 1) % 20].tokens[-1]] if plain[(k + 1) % 20].tokens else [] for k in range(20)]
    avoid = [[t.tokens[0]] if t.tokens and [t.tokens[0]] != c else [] for t, c in zip(plain, cons)]
    return lines, out, src, cons, avoid


def test_constraints_equal_the_command_lines_json_input(models, dev_lines, cgnmt_bin, tmp_path):
    tr = cgnmt.Translator(models[1])
    _, _, src, cons, avoid = constrained(tr, dev_lines)
    jl = tmp_path / "in.jsonl"
    jl.write_text("".join(json.dumps({"text": s, "constraints": c, "avoid": a}) + "\n"
                          for s, c, a in zip(src, cons, avoid)), encoding="utf-8")
    p = run(cgnmt_bin, "translate", "-q", "-m", models[1], "-i", jl, "--json-input", "--pretokenized", "--beam", "4")
    assert p.stdout.decode("utf-8").splitlines() == [t.text for t in tr.translate(
        src, beam=4, pretokenized=True, constraints=cons, avoid=avoid)]


def test_constraints_avoided_phrases_and_the_penalties_the_model_keeps(models, dev_lines, tmp_path):
    tr = cgnmt.Translator(models[1])
    assert tr.decoding_settings is None
    lines, out, src, cons, avoid = constrained(tr, dev_lines)
    got = tr.translate(src, beam=4, nbest=2, pretokenized=True, constraints=cons, avoid=avoid)
    for t, c, a in zip(got, cons, avoid):
        assert t.unmet_constraints == 0
        for h in t.hypotheses:
            assert all(w in h.tokens for w in c), (h.tokens, c)
            assert not any(w in h.tokens for w in a), (h.tokens, a)
    with pytest.raises(ValueError, match="line 3: an empty constraint"):
        tr.translate(src, constraints=[[]] * 2 + [[""]] + [[]] * 17)
    with pytest.raises(TypeError, match="one list of phrases per sentence"):
        tr.translate(src, constraints="a")
    # Penalties chosen on dev, kept in the model directory (decoding.toml): the default, an explicit one wins.
    copy = tmp_path / "model"
    shutil.copytree(models[1], copy)
    # (In the model directory the run directory resolves to.)
    resolved = Path(cgnmt.Translator(copy).model_dirs[0])
    (resolved / "decoding.toml").write_text("length_penalty = 2.5\ncoverage_penalty = 0.6\nbeam = 4\n"
                                        "dev_bleu = 10.0\ndev_sentences = 20\n", encoding="utf-8")
    kept = cgnmt.Translator(copy)
    assert kept.decoding_settings["length_penalty"] == 2.5
    want = [t.text for t in tr.translate(lines, beam=4, length_penalty=2.5, coverage_penalty=0.6)]
    assert [t.text for t in kept.translate(lines, beam=4)] == want
    assert [t.text for t in kept.translate(lines, beam=4, length_penalty=0, coverage_penalty=0)] == \
        [t.text for t in out]
