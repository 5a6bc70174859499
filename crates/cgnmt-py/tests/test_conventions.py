"""CTranslate2's names where cgnmt does the same thing: `translate_batch` with CTranslate2's keywords and results,
`translate_iterable` (a stream in, results out in order, a bounded number of sentences held), `translate_file`,
`score_batch`, and the decoding length limits (also the command line's `--max-decoding-length` /
`--min-decoding-length`)."""

from __future__ import annotations

import pytest

import cgnmt

from conftest import run


@pytest.fixture(scope="module")
def tr(models):
    return cgnmt.Translator(models[1])


@pytest.fixture(scope="module")
def lines(dev_lines):
    return [l for l in dev_lines if l][:40]


def test_translate_batch_takes_ctranslate2s_keywords_and_token_lists(tr, lines):
    plain = tr.translate(lines, beam=4, nbest=2)
    tokens = [t.source_tokens for t in plain]
    res = tr.translate_batch(tokens, beam_size=4, num_hypotheses=2, max_batch_size=8, return_attention=True)
    assert len(res) == len(lines)
    for r, p in zip(res, plain):
        assert r.hypotheses == [h.tokens for h in p.hypotheses]
        assert r.scores == pytest.approx([h.score for h in p.hypotheses])
        assert r["hypotheses"] == r.hypotheses and r["scores"] == r.scores
        att = r.attention[0]
        assert len(att) in (len(p.tokens), len(p.tokens) + 1) and len(att[0]) == len(p.source_tokens) + 1
    # Raw strings give the same; no scores unless asked.
    res2 = tr.translate_batch(lines, beam_size=4, num_hypotheses=2, return_scores=False)
    assert [r.hypotheses for r in res2] == [r.hypotheses for r in res]
    assert all(r.scores == [] for r in res2)
    # A target prefix, as token lists; unknown keywords are refused by Python itself.
    # (Each even sentence forced to start with another sentence's first word.)
    prefix = [p.tokens[:1] if k % 2 == 0 and p.tokens else None for k, p in enumerate(plain[1:] + plain[:1])]
    res3 = tr.translate_batch(tokens, target_prefix=prefix, beam_size=4)
    for r, p in zip(res3, prefix):
        if p:
            assert r.hypotheses[0][: len(p)] == p, (r.hypotheses, p)
    with pytest.raises(TypeError):
        tr.translate_batch(tokens, sampling_topk=5)
    with pytest.raises(ValueError):
        tr.translate_batch(tokens, target_prefix=prefix[:3])


def test_decoding_length_limits(tr, lines):
    short = tr.translate_batch(lines, beam_size=3, max_decoding_length=2)
    assert all(len(r.hypotheses[0]) <= 2 for r in short)
    free = tr.translate(lines, beam=3)
    assert any(len(t.tokens) > 2 for t in free)
    long = tr.translate(lines, beam=3, min_decoding_length=8, max_decoding_length=40)
    # (A source of n tokens may output at most 3(n + 1) without a maximum; with one, the minimum holds.)
    assert all(len(t.tokens) >= 8 for t in long)
    with pytest.raises(ValueError, match="min_decoding_length"):
        tr.translate(lines[:2], min_decoding_length=9, max_decoding_length=4)
    with pytest.raises(ValueError, match="max_decoding_length"):
        tr.translate(lines[:2], max_decoding_length=0)


def test_decoding_length_limits_equal_the_command_lines(tr, lines, models, cgnmt_bin, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = run(cgnmt_bin, "translate", "-m", models[1], "-i", src, "-b", "3", "--max-decoding-length", "2")
    assert out.stdout.decode().splitlines() == [t.text for t in tr.translate(lines, beam=3, max_decoding_length=2)]


def test_translate_iterable_streams_in_order_holding_a_bounded_number(tr, lines):
    want = tr.translate_batch(lines * 3, beam_size=2)
    pulled = []

    def source():
        for x in lines * 3:
            pulled.append(x)
            yield x

    it = tr.translate_iterable(source(), max_batch_size=2, beam_size=2)
    first = next(it)
    # Only the first chunk (16 batches of 2) was read before the first result.
    assert len(pulled) == 32
    got = [first, *it]
    assert [r.hypotheses for r in got] == [r.hypotheses for r in want]
    with pytest.raises(ValueError):
        list(tr.translate_iterable(iter(lines), batch_type="tokens"))


def test_translate_file_and_score_batch(tr, lines, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    stats = tr.translate_file(src, out, max_batch_size=4, beam_size=3)
    want = tr.translate(lines, beam=3)
    assert out.read_text(encoding="utf-8").splitlines() == [t.text for t in want]
    assert stats.num_examples == len(lines)
    assert stats.num_tokens == sum(len(t.tokens) for t in want)
    assert stats.total_time_in_ms > 0
    # A gzipped input (with CRLF endings) gives the same lines.
    import gzip

    gz = tmp_path / "in.txt.gz"
    with gzip.open(gz, "wt", encoding="utf-8", newline="") as f:
        f.write("".join(l + "\r\n" for l in lines))
    tr.translate_file(gz, tmp_path / "out-gz.txt", max_batch_size=4, beam_size=3)
    assert (tmp_path / "out-gz.txt").read_text(encoding="utf-8") == out.read_text(encoding="utf-8")
    # Bad UTF-8 is named by line, and leaves no output behind.
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xe6\x88\x91\n\xff\xfe\n")
    with pytest.raises(ValueError, match="line 2"):
        tr.translate_file(bad, tmp_path / "out-bad.txt")
    assert not (tmp_path / "out-bad.txt").exists()
    # A missing input leaves no output behind.
    with pytest.raises(FileNotFoundError):
        tr.translate_file(tmp_path / "missing.txt", tmp_path / "never.txt")
    assert not (tmp_path / "never.txt").exists()
    # score_batch: CTranslate2's names over score().
    hyps = [t.tokens for t in want]
    srcs = [t.source_tokens for t in want]
    scored = tr.score_batch(srcs, hyps)
    plain = tr.score([" ".join(s) for s in srcs], [" ".join(h) for h in hyps], pretokenized=True)
    for a, b in zip(scored, plain):
        assert a.tokens == b.tokens
        assert a.log_probs == pytest.approx([float(x) for x in b.token_scores])
        assert sum(a.log_probs) == pytest.approx(b.score, abs=1e-3)
