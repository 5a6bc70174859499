"""Translation and alignment metrics, computed as ``cgnmt score``, ``cgnmt compare`` and ``cgnmt aer`` compute
them (the same code): BLEU as sacreBLEU 2.x and NIST mteval-v11b (the paper's metric), chrF and chrF++, paired
significance tests, and the alignment error rate.

``refs`` is a list of reference streams, as in sacreBLEU (``[refs_a, refs_b]`` for two references per
sentence); a plain list of strings is one reference stream.

    >>> from cgnmt import metrics
    >>> metrics.bleu(["the cat sat"], [["the cat sat"]]).score
    100.0
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _cgnmt

__all__ = ["AERScore", "BLEUScore", "CHRFScore", "Comparison", "RunsComparison", "Signature", "aer", "bleu",
           "chrf", "compare", "compare_runs", "sentence_bleu", "sentence_chrf"]

Refs = Union[Sequence[str], Sequence[Sequence[str]]]


def _streams(refs: Refs) -> List[List[str]]:
    if isinstance(refs, str):
        raise TypeError("refs must be a list of reference streams (or one stream), not a string")
    refs = list(refs)
    if refs and isinstance(refs[0], str):
        return [list(refs)]
    return [list(r) for r in refs]


def _lines(name: str, xs: Sequence[str]) -> List[str]:
    if isinstance(xs, str):
        raise TypeError(f"{name} must be a list of sentences, not a single string")
    return list(xs)


class Signature:
    """A score's signature as an object (sacreBLEU's ``metric.get_signature()``): its fields in order
    (``nrefs``, ``case``, ``eff``, ``tok``, ``smooth``, ``version`` for BLEU), ``str()`` the usual
    ``key:value|...`` line, ``format(short=True)`` sacreBLEU's abbreviated one."""

    _SHORT = {"nrefs": "#", "case": "c", "eff": "e", "tok": "tok", "smooth": "s", "version": "v"}

    def __init__(self, text: str) -> None:
        self.fields: Dict[str, str] = {}
        for part in text.split("|"):
            key, sep, value = part.partition(":")
            if not sep:
                raise ValueError(f"signature {text!r}: {part!r} is not key:value")
            self.fields[key] = value

    def __getitem__(self, key: str) -> str:
        return self.fields[key]

    def format(self, short: bool = False) -> str:
        return "|".join(f"{self._SHORT.get(k, k) if short else k}:{v}" for k, v in self.fields.items())

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return f"Signature({self.format()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Signature) and self.fields == other.fields


@dataclass(frozen=True)
class BLEUScore:
    """Corpus BLEU on the 0–100 scale with its parts: clipped n-gram ``counts`` and ``totals`` (n = 1..4),
    ``precisions``, the brevity penalty ``bp``, the output's and references' lengths, and the ``signature``
    (``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:…`` or mteval-v11b's). ``str()`` gives the line
    ``cgnmt score`` prints."""

    score: float
    counts: List[int]
    totals: List[int]
    precisions: List[float]
    bp: float
    sys_len: int
    ref_len: int
    signature: str

    def get_signature(self) -> Signature:
        """The signature as an object (sacreBLEU's name)."""
        return Signature(self.signature)

    def __str__(self) -> str:
        ratio = self.sys_len / self.ref_len if self.ref_len else 0.0
        p = self.precisions
        return (
            f"BLEU|{self.signature} = {self.score:.2f} {p[0]:.1f}/{p[1]:.1f}/{p[2]:.1f}/{p[3]:.1f} "
            f"(BP = {self.bp:.3f} ratio = {ratio:.3f} hyp_len = {self.sys_len} ref_len = {self.ref_len})"
        )


@dataclass(frozen=True)
class CHRFScore:
    """chrF (or chrF++) on the 0–100 scale, its ``name`` (``chrF2``, ``chrF2++``) and ``signature``."""

    name: str
    score: float
    signature: str

    def get_signature(self) -> Signature:
        """The signature as an object (sacreBLEU's name)."""
        return Signature(self.signature)

    def __str__(self) -> str:
        return f"{self.name}|{self.signature} = {self.score:.2f}"


@dataclass(frozen=True)
class Comparison:
    """A paired significance test of a system against a baseline on one metric: both corpus scores, the
    paired bootstrap (``bootstrap``: the system's mean and 95% interval, ``p_value``), approximate
    randomisation (``ar``: ``p_value``) and the sign test (``sign``: sentences better, worse, tied,
    ``p_value``), each ``None`` when not run, and the metric's ``signature``."""

    metric: str
    signature: str
    baseline_score: float
    score: float
    bootstrap: Optional[Dict[str, Any]]
    ar: Optional[Dict[str, Any]]
    sign: Optional[Dict[str, Any]]
    seed: int
    record: Dict[str, Any]


@dataclass(frozen=True)
class AERScore:
    """Alignment error rate (0–1) with precision, recall and the link counts (``a`` predicted, ``s`` sure,
    ``p`` possible, ``a_and_s``, ``a_and_p``); with soft matrices also ``saer`` (micro) and ``saer_macro``."""

    aer: float
    precision: float
    recall: float
    a: int
    s: int
    p: int
    a_and_s: int
    a_and_p: int
    sentences: int
    saer: Optional[float] = None
    saer_macro: Optional[float] = None


def bleu(
    hyps: Sequence[str],
    refs: Refs,
    mteval: bool = False,
    lowercase: Optional[bool] = None,
    tokenize: Optional[str] = None,
    smooth: Optional[str] = None,
    smooth_value: Optional[float] = None,
) -> BLEUScore:
    """Corpus BLEU. By default sacreBLEU's (13a tokenisation, mixed case, exp smoothing, closest reference
    length); ``tokenize`` one of ``13a``, ``intl``, ``zh``, ``char``, ``none``, ``mteval-v11b``,
    ``mteval-v13a``, ``mteval-v13a-intl``, ``multi-bleu``; ``smooth`` one of ``exp``, ``none``, ``floor``,
    ``add-k``. With ``mteval=True``, NIST mteval-v11b.pl's BLEU (the paper's metric: its tokenisation, the
    shortest reference length, no smoothing), case-insensitive unless ``lowercase=False``."""
    hyps = _lines("hyps", hyps)
    if mteval:
        if tokenize is not None or smooth is not None or smooth_value is not None:
            raise ValueError("mteval fixes tokenisation and smoothing; drop tokenize/smooth")
        r = _cgnmt.bleu(hyps, _streams(refs), True, False, None, None, None, lowercase is False)
    else:
        r = _cgnmt.bleu(
            hyps, _streams(refs), False, bool(lowercase), tokenize, smooth, smooth_value, False
        )
    return _bleu_score(json.loads(r))


def _bleu_score(d: Dict[str, Any]) -> BLEUScore:
    """A score from the JSON that the extension's BLEU functions return."""
    return BLEUScore(
        score=d["score"],
        counts=d["counts"],
        totals=d["totals"],
        precisions=d["precisions"],
        bp=d["bp"],
        sys_len=d["sys_len"],
        ref_len=d["ref_len"],
        signature=d["signature"],
    )


def _one_sentence(hypothesis: str, references: Sequence[str]) -> List[str]:
    """A sentence-level metric's references, checked: one hypothesis (a str), at least one reference."""
    if not isinstance(hypothesis, str):
        raise ValueError("hypothesis: one sentence (a str)")
    refs = _lines("references", references)
    if not refs:
        raise ValueError("references: at least one")
    return refs


def sentence_bleu(
    hypothesis: str,
    references: Sequence[str],
    lowercase: bool = False,
    tokenize: Optional[str] = None,
    smooth: Optional[str] = None,
    smooth_value: Optional[float] = None,
    use_effective_order: bool = True,
) -> BLEUScore:
    """One sentence's BLEU against its references, as sacreBLEU's ``sentence_bleu`` computes it: 13a
    tokenisation, exp smoothing and, by default, only the n-gram orders the hypothesis has
    (``use_effective_order``). Options as :func:`bleu`'s."""
    refs = _one_sentence(hypothesis, references)
    d = json.loads(
        _cgnmt.sentence_bleu(
            hypothesis, refs, bool(lowercase), tokenize, smooth, smooth_value, bool(use_effective_order)
        )
    )
    return _bleu_score(d)


def sentence_chrf(hypothesis: str, references: Sequence[str], plus_plus: bool = False) -> CHRFScore:
    """One sentence's chrF2 (chrF2++ with ``plus_plus``) against its references, as sacreBLEU's
    ``sentence_chrf`` computes it (the corpus statistic over one sentence)."""
    refs = _one_sentence(hypothesis, references)
    return chrf([hypothesis], [[r] for r in refs], plus_plus=plus_plus)


def chrf(hyps: Sequence[str], refs: Refs, plus_plus: bool = False, lowercase: bool = False) -> CHRFScore:
    """Corpus chrF2 (character 6-grams, β = 2), or chrF2++ (word bigrams too) with ``plus_plus``, as
    sacreBLEU computes it."""
    d = json.loads(_cgnmt.chrf(_lines("hyps", hyps), _streams(refs), plus_plus, lowercase))
    return CHRFScore(name=d["name"], score=d["score"], signature=d["signature"])


def compare(
    baseline: Sequence[str],
    system: Sequence[str],
    refs: Refs,
    test: str = "bootstrap",
    metric: str = "bleu",
    mteval: bool = False,
    lowercase: bool = False,
    seed: Optional[int] = None,
    bs_samples: Optional[int] = None,
    ar_trials: Optional[int] = None,
) -> Comparison:
    """A paired significance test of ``system`` against ``baseline`` (``test``: ``"bootstrap"`` (Koehn
    2004, as sacreBLEU's ``--paired-bs``), ``"ar"`` (approximate randomisation), ``"sign"`` (Collins et al.
    2005) or ``"all"``) on ``metric`` (``"bleu"``, ``"chrf"``, ``"chrf++"``). The seed, resamples and trials
    default to ``cgnmt compare``'s."""
    kw = {}
    if seed is not None:
        kw["seed"] = seed
    if bs_samples is not None:
        kw["bs_samples"] = bs_samples
    if ar_trials is not None:
        kw["ar_trials"] = ar_trials
    records = json.loads(
        _cgnmt.compare(
            _lines("baseline", baseline),
            _lines("system", system),
            _streams(refs),
            test,
            metric,
            mteval,
            lowercase and not mteval,
            None,
            **kw,
        )
    )
    r = records[0]
    row = r["systems"][0]
    return Comparison(
        metric=r["metric"],
        signature=r["signature"],
        baseline_score=r["baseline"]["score"],
        score=row["score"],
        bootstrap=row["bootstrap"],
        ar=row["ar"],
        sign=row["sign"],
        seed=r["seed"],
        record=r,
    )


@dataclass(frozen=True)
class RunsComparison:
    """A system trained with several seeds against a baseline trained with several (Clark et al. 2011):
    each run's corpus score (``base_scores``, ``sys_scores``), their means, MultEval's ``s_opt`` (standard
    deviation across runs) and ``s_sel`` (within the test set) per system, Welch's t-test over the runs
    (``welch``: ``delta``, ``t``, ``df``, ``p_value``; ``None`` with one run a side), the permutation of the
    runs' labels (``permutation``), the bootstrap over runs and sentences (``run_bootstrap``: ``delta``, 95%
    ``ci_low``/``ci_high``, ``p_value``), the paired bootstrap over the runs' pooled sentences
    (``pooled_p``), the runs a side that would detect the difference (``runs_needed``), and ``significant``:
    both the pooled bootstrap and Welch's test below 0.05."""

    metric: str
    base_scores: List[float]
    sys_scores: List[float]
    base_mean: float
    sys_mean: float
    base_s_opt: float
    sys_s_opt: float
    base_s_sel: float
    sys_s_sel: float
    welch: Optional[Dict[str, Any]]
    permutation: Dict[str, Any]
    run_bootstrap: Dict[str, Any]
    pooled_p: float
    runs_needed: Optional[int]
    significant: bool
    record: Dict[str, Any]


def compare_runs(
    baseline_runs: Sequence[Sequence[str]],
    system_runs: Sequence[Sequence[str]],
    refs: Refs,
    metric: str = "bleu",
    mteval: bool = False,
    lowercase: bool = False,
    seed: Optional[int] = None,
    bs_samples: Optional[int] = None,
) -> RunsComparison:
    """Significance that counts training variance: ``system_runs`` (one output per seed) against
    ``baseline_runs`` on ``metric``, as ``cgnmt compare A1,A2,A3 B1,B2,B3`` reports it. A difference is called
    significant only when the paired bootstrap over the pooled runs and Welch's t-test over the runs' scores
    both give p < 0.05."""
    if isinstance(baseline_runs, (str, bytes)) or isinstance(system_runs, (str, bytes)):
        raise TypeError("baseline_runs and system_runs are lists of outputs, one per seed")
    r = json.loads(
        _cgnmt.compare_runs(
            [_lines(f"baseline_runs[{i}]", x) for i, x in enumerate(baseline_runs)],
            [_lines(f"system_runs[{i}]", x) for i, x in enumerate(system_runs)],
            _streams(refs),
            metric,
            mteval,
            lowercase and not mteval,
            None,
            12345 if seed is None else seed,
            1000 if bs_samples is None else bs_samples,
        )
    )[0]
    c = r["runs"]
    return RunsComparison(
        metric=r["metric"],
        base_scores=c["base_scores"],
        sys_scores=c["sys_scores"],
        base_mean=c["base_mean"],
        sys_mean=c["sys_mean"],
        base_s_opt=c["base_s_opt"],
        sys_s_opt=c["sys_s_opt"],
        base_s_sel=c["base_s_sel"],
        sys_s_sel=c["sys_s_sel"],
        welch=c["welch"],
        permutation=c["permutation"],
        run_bootstrap=c["bootstrap"],
        pooled_p=r["pooled"]["systems"][0]["bootstrap"]["p_value"],
        runs_needed=c["runs_needed"],
        significant=r["significant"],
        record=r,
    )


def aer(
    gold: Sequence[str],
    pred: Optional[Sequence[str]] = None,
    soft: Optional[Sequence[Any]] = None,
) -> AERScore:
    """Alignment error rate of predicted links against gold ones, both as ``.talp`` lines (one per sentence
    pair: ``i-j`` a sure link, ``i?j`` a possible one, 0-based), and, with ``soft`` (per pair a ``[target
    words][source words]`` matrix, e.g. :attr:`cgnmt.Alignment.attention`), the soft AER. Without ``pred``,
    the soft matrices' row-wise argmax links are scored."""
    soft_lists = None if soft is None else [[list(map(float, row)) for row in m] for m in soft]
    d = json.loads(
        _cgnmt.aer(
            _lines("gold", gold),
            None if pred is None else _lines("pred", pred),
            soft_lists,
        )
    )
    return AERScore(
        aer=d["aer"],
        precision=d["precision"],
        recall=d["recall"],
        a=d["a"],
        s=d["s"],
        p=d["p"],
        a_and_s=d["a_and_s"],
        a_and_p=d["a_and_p"],
        sentences=d["sentences"],
        saer=d.get("saer"),
        saer_macro=d.get("saer_macro"),
    )
