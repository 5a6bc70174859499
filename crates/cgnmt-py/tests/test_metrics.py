"""`cgnmt.metrics` equals the command line (`cgnmt score`, `compare`, `aer`) and the oracle values of the
shared fixtures (sacreBLEU 2.6.0, NIST mteval-v11b.pl, an independent AER scorer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cgnmt import metrics
from conftest import run


def lines(p: Path):
    return p.read_text(encoding="utf-8").split("\n")[:-1]


def test_bleu_and_chrf_equal_the_cli_and_sacrebleu(fixtures_dir, cgnmt_bin):
    d = fixtures_dir / "bleu" / "gt22-multiref"
    exp = json.loads((d / "expected.json").read_text())
    hyps, r1, r2 = lines(d / "hyp.txt"), lines(d / "ref1.txt"), lines(d / "ref2.txt")
    refs = [r1, r2]
    args = ["-r", d / "ref1.txt", "-r", d / "ref2.txt", "-i", d / "hyp.txt", "--json"]
    cli = json.loads(run(cgnmt_bin, "score", *args).stdout)
    b = metrics.bleu(hyps, refs)
    assert (b.score, b.counts, b.totals, b.sys_len, b.ref_len, b.signature) == (
        cli["score"], cli["counts"], cli["totals"], cli["sys_len"], cli["ref_len"], cli["signature"]
    )
    e = exp["bleu"]["13a"]
    assert abs(b.score - e["score"]) <= 0.01 and b.counts == e["counts"] and b.totals == e["totals"]
    assert str(b).startswith("BLEU|nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp")
    # NIST mteval-v11b, case-insensitive: the paper's metric.
    cli = json.loads(run(cgnmt_bin, "score", *args, "--mteval-v11b").stdout)
    m = metrics.bleu(hyps, refs, mteval=True)
    assert m.score == cli["score"] and m.signature == cli["signature"]
    want = exp["mteval-v11b"]["uncased"]["bleu_x100"]
    assert abs(m.score - want) <= 0.01, (m.score, want)
    cased = metrics.bleu(hyps, refs, mteval=True, lowercase=False)
    assert abs(cased.score - exp["mteval-v11b"]["cased"]["bleu_x100"]) <= 0.01
    # chrF2 and chrF2++.
    for pp, metric in [(False, "chrf"), (True, "chrf++")]:
        cli = json.loads(run(cgnmt_bin, "score", *args, "--metric", metric).stdout)
        c = metrics.chrf(hyps, refs, plus_plus=pp)
        assert (c.score, c.name, c.signature) == (cli["score"], cli["name"], cli["signature"])
    # Lower-cased, another tokeniser: still the CLI's.
    cli = json.loads(run(cgnmt_bin, "score", *args, "-lc", "--tokenize", "intl").stdout)
    assert metrics.bleu(hyps, refs, lowercase=True, tokenize="intl").score == cli["score"]
    with pytest.raises(ValueError, match="tokenize"):
        metrics.bleu(hyps, refs, tokenize="moses")
    with pytest.raises(ValueError, match="lines"):
        metrics.bleu(hyps[:-1], refs)


def test_compare_equals_the_cli_and_sacrebleus_paired_tests(fixtures_dir, cgnmt_bin):
    d = fixtures_dir / "significance" / "gt22-zh-en"
    base, sys1, ref = lines(d / "baseline.txt"), lines(d / "system1.txt"), lines(d / "ref1.txt")
    cli = json.loads(
        run(cgnmt_bin, "compare", d / "baseline.txt", d / "system1.txt", "-r", d / "ref1.txt", "--json").stdout
    )["results"][0]
    c = metrics.compare(base, sys1, [ref], test="all")
    row = cli["systems"][0]
    assert (c.baseline_score, c.score, c.signature) == (cli["baseline"]["score"], row["score"], cli["signature"])
    assert c.bootstrap == row["bootstrap"] and c.ar == row["ar"] and c.sign == row["sign"]
    # The fixture's decision: +0.14 BLEU is not significant.
    assert c.bootstrap["p_value"] > 0.05 and c.ar["p_value"] > 0.05
    only = metrics.compare(base, sys1, [ref], test="sign")
    assert only.sign == row["sign"] and only.bootstrap is None and only.ar is None
    with pytest.raises(ValueError, match="test"):
        metrics.compare(base, sys1, [ref], test="t-test")


def test_aer_equals_the_cli_and_the_independent_scorer(fixtures_dir, cgnmt_bin):
    d = fixtures_dir / "aer" / "hansards-en-fr-eflomal"
    exp = json.loads((d / "expected.json").read_text())
    gold, pred = lines(d / "gold.talp"), lines(d / "pred.talp")
    cli = json.loads(run(cgnmt_bin, "aer", "--gold", d / "gold.talp", "--pred", d / "pred.talp", "--json").stdout)
    a = metrics.aer(gold, pred)
    assert (a.aer, a.precision, a.recall, a.a, a.s, a.p) == (
        cli["aer"], cli["precision"], cli["recall"], cli["a"], cli["s"], cli["p"]
    )
    want = exp["predictions"]["pred.talp"]
    assert abs(a.aer - want["aer"]) < 1e-9
    assert (a.a, a.s, a.p, a.a_and_s, a.a_and_p) == tuple(
        want["counts"][k] for k in ("A", "S", "P", "A_and_S", "A_and_P")
    )
    with pytest.raises(ValueError, match="gold:1"):
        metrics.aer(["1-2 3x4"], ["1-2"])
    # Soft AER (micro and macro) and the argmax links' AER on the toy matrices of the fixture.
    toy = json.loads((fixtures_dir / "aer" / "saer-toy" / "expected.json").read_text())
    sents = toy["sentences"]
    s = metrics.aer([x["gold"] for x in sents], soft=[x["attention"] for x in sents])
    assert abs(s.saer - toy["corpus"]["saer"]) < 1e-12
    assert abs(s.saer_macro - toy["corpus"]["saer_macro_mean_of_sentences"]) < 1e-12
    assert abs(s.aer - toy["corpus"]["hard_argmax"]["aer"]) < 1e-12


def test_compare_runs_counts_the_seeds_as_the_cli_does(tatoeba, cgnmt_bin):
    # The deep plan's committed per-seed outputs: GRU and GRU + both gates, 3 seeds each.
    from conftest import REPO

    d = REPO / "results" / "deep" / "systems"
    runs = {s: [d / s / f"seed-{k}" / "test.hyp" for k in (1, 2, 3)] for s in ("gru-chosen-on-dev", "gru-both-chosen-on-dev")}
    ref = tatoeba / "test.en"
    cli = json.loads(run(cgnmt_bin, "compare", ",".join(map(str, runs["gru-chosen-on-dev"])),
                         ",".join(map(str, runs["gru-both-chosen-on-dev"])), "-r", ref, "--test", "bs", "--json").stdout)
    rec = cli["results"][0]
    c = metrics.compare_runs([lines(p) for p in runs["gru-chosen-on-dev"]],
                             [lines(p) for p in runs["gru-both-chosen-on-dev"]], [lines(ref)])
    assert c.record["runs"] == rec["runs"] and c.significant == rec["significant"]
    assert len(c.base_scores) == len(c.sys_scores) == 3
    # The pooled bootstrap calls +1.2 BLEU significant; over three seeds a side Welch's test does not.
    assert c.sys_mean - c.base_mean > 1.0 and c.pooled_p < 0.01
    assert c.welch["p_value"] > 0.05 and not c.significant
    assert c.permutation["splits"] == 20 and c.permutation["p_value"] >= 0.1
    assert c.runs_needed > 3
    with pytest.raises(TypeError, match="one per seed"):
        metrics.compare_runs("a", [["b"]], [["c"]])


def test_sentence_bleu_and_chrf_equal_sacrebleu_on_the_fixtures(fixtures_dir):
    """sacreBLEU's `sentence_bleu` (its default and four variants) and `sentence_chrf` on 20 segments with one and
    two references (`shared/fixtures/bleu/sentence-bleu`), and the signature as an object."""
    import json

    from cgnmt.metrics import Signature, sentence_bleu, sentence_chrf

    d = fixtures_dir / "bleu" / "sentence-bleu"
    exp = json.loads((d / "expected.json").read_text(encoding="utf-8"))
    hyps = (d / "hyp.txt").read_text(encoding="utf-8").splitlines()
    r1 = (d / "ref1.txt").read_text(encoding="utf-8").splitlines()
    r2 = (d / "ref2.txt").read_text(encoding="utf-8").splitlines()
    variants = {
        "default": {},
        "exp_no_effective_order": {"use_effective_order": False},
        "floor_0.1": {"smooth": "floor", "smooth_value": 0.1},
        "add-k_1": {"smooth": "add-k", "smooth_value": 1},
        "none": {"smooth": "none"},
        "lowercase": {"lowercase": True},
    }
    checked = 0
    for i, seg in enumerate(exp["segments"]):
        for key, refs in (("ref1", [r1[i]]), ("ref1+ref2", [r1[i], r2[i]])):
            for name, e in seg[key].items():
                if name == "chrf":
                    got = sentence_chrf(hyps[i], refs).score
                    want = e if isinstance(e, (int, float)) else e["score"]
                    assert got == pytest.approx(want, abs=1e-9), (i, key, name)
                    checked += 1
                    continue
                if name not in variants:
                    continue
                b = sentence_bleu(hyps[i], refs, **variants[name])
                assert b.score == pytest.approx(e["score"], abs=1e-9), (i, key, name, b, e)
                if name != "add-k_1":
                    # (sacreBLEU reports add-k's counts and totals with k added from the 2-grams on.)
                    assert b.counts == e["counts"] and b.totals == e["totals"], (i, key, name)
                assert (b.sys_len, b.ref_len) == (e["sys_len"], e["ref_len"])
                checked += 1
    assert checked == 20 * 2 * 7
    # The signature as an object: sacreBLEU's fields but the version.
    sig = sentence_bleu(hyps[0], [r1[0]]).get_signature()
    want = Signature(exp["default_signature"])
    assert [k for k in sig.fields] == [k for k in want.fields]
    assert {k: v for k, v in sig.fields.items() if k != "version"} == {
        k: v for k, v in want.fields.items() if k != "version"
    }
    assert str(sig) == sentence_bleu(hyps[0], [r1[0]]).signature
    assert sig.format(short=True).startswith("#:1|c:mixed|e:yes|tok:13a|s:exp|v:")
    assert sig["eff"] == "yes" and sentence_bleu(hyps[0], [r1[0]], use_effective_order=False).get_signature()["eff"] == "no"
    with pytest.raises(ValueError):
        sentence_bleu(hyps[0], [])
    with pytest.raises(ValueError):
        Signature("nrefs")
