"""cgnmt: context-gated neural machine translation (Tu et al., TACL 2017) from Python.

Translate with attention-based RNN models (GroundHog / RNNsearch with context gates) trained by cgnmt, and
inspect what no other toolkit exposes: each target word's attention over the source and the context gate's
values, as NumPy arrays. Align sentence pairs from attention, score translations (BLEU as sacreBLEU and NIST
mteval-v11b compute it, chrF, significance tests, AER) and train models, in-process.

    >>> import cgnmt
    >>> tr = cgnmt.Translator("runs/demo/model-improved/best")
    >>> out = tr.translate(["我赢了。"], beam=10, return_attention=True, return_gates=True)
    >>> out[0].text, out[0].attention.shape, out[0].gates
    ('I won.', (4, 4), array([...], dtype=float32))

Every call releases the GIL while it works (a ``Translator`` can be shared by Python threads) and stops at its
next batch on Ctrl-C. Errors are Python exceptions: ``FileNotFoundError`` for a missing model directory or
file, ``ValueError`` for a bad option or input, ``RuntimeError`` for a failure inside the library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from os import PathLike, fspath
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _cgnmt, metrics

# The version is the crates' (Cargo.toml), the one place it is written; `_cgnmt.__version__` adds the commit.
__version__: str = _cgnmt.__version__.split()[0]
__all__ = [
    "Alignment",
    "Hypothesis",
    "Model",
    "Score",
    "ScoringResult",
    "TrainSummary",
    "Translation",
    "TranslationResult",
    "TranslationStats",
    "Translator",
    "align",
    "metrics",
    "select",
    "set_threads",
    "train",
]

PathType = Union[str, "PathLike[str]"]


def _f32(buf: bytes, shape: Optional[Tuple[int, ...]] = None) -> np.ndarray:
    a = np.frombuffer(buf, dtype="<f4").astype(np.float32)
    return a.reshape(shape) if shape is not None else a


def _sentences(name: str, xs: Sequence[str]) -> List[str]:
    if isinstance(xs, (str, bytes)):
        raise TypeError(f"{name} must be a list of sentences, not a single string")
    out = list(xs)
    for i, x in enumerate(out):
        if not isinstance(x, str):
            raise TypeError(f"{name}[{i}] is {type(x).__name__}, not str")
    return out


def _phrase_lists(name: str, xs: Optional[Sequence[Sequence[str]]]) -> Optional[List[List[str]]]:
    if xs is None:
        return None
    if isinstance(xs, (str, bytes)):
        raise TypeError(f"{name} must be one list of phrases per sentence, not a single string")
    return [_sentences(f"{name}[{i}]", x) for i, x in enumerate(xs)]


def _alignment(r: Mapping[str, Any], mode: Optional[str]) -> Any:
    """A native translation's word alignment as :class:`Translation` holds it (``None`` when not asked)."""
    if mode is None:
        return None
    if "alignment_soft" in r:
        rows = r["alignment_soft"]
        return np.asarray(rows, dtype=np.float64).reshape(len(rows), -1)
    return [(int(i), int(j)) for (i, j) in r["alignment"]]


@dataclass(frozen=True)
class Hypothesis:
    """One hypothesis of a sentence's n-best list: its post-processed text, its model tokens and its total
    log-probability (the search's ranking applies the length and coverage penalties on top of it)."""

    text: str
    tokens: List[str]
    score: float


@dataclass(frozen=True)
class Translation:
    """One sentence's translation.

    ``text`` is the best hypothesis post-processed (subwords merged, detokenised); ``tokens`` its model
    tokens; ``source_tokens`` the source as the model saw it; ``score`` its log-probability (``None`` for an
    empty input); ``hypotheses`` the n-best list, best first.

    With ``return_attention``: ``attention``, float32 ``[target, source]``: one row per emitted word (the
    final EOS included when the search emitted it), one column per source token plus EOS; each row sums
    to 1. With ``return_gates``: ``gates``, float32 ``[len(tokens)]``: the context gate's mean value in the
    transition that read each output word (empty for an ungated model). With ``return_coverage``:
    ``coverage``, float32 ``[source + 1]``: the coverage model's final value per source position (empty
    without coverage).

    Over words (subword pieces merged, as ``cgnmt align`` merges them; the words of the tokenised source
    and output, as ``cgnmt translate --alignment`` counts them): with ``return_word_scores``,
    ``word_scores``, float64 ``[output words]``, each word's log-probability (its pieces' sum), and
    ``word_gates``, float32, each word's mean gate value (``None`` for an ungated model); with
    ``alignment="hard"`` or a probability, ``alignment``, ``(source word, output word)`` links; with
    ``alignment="soft"``, ``alignment`` is the float64 ``[output words, source words]`` matrix.

    ``unmet_constraints``: how many of the sentence's positive constraints its output does not contain (0
    unless they could not all be met within the length limit).
    """

    text: str
    tokens: List[str]
    source_tokens: List[str]
    score: Optional[float]
    hypotheses: List[Hypothesis]
    attention: Optional[np.ndarray] = None
    gates: Optional[np.ndarray] = None
    coverage: Optional[np.ndarray] = None
    word_scores: Optional[np.ndarray] = None
    word_gates: Optional[np.ndarray] = None
    alignment: Optional[Union[List[Tuple[int, int]], np.ndarray]] = None
    unmet_constraints: int = 0


@dataclass(frozen=True)
class Score:
    """A given translation's score (:meth:`Translator.score`): ``tokens``, the target as the model's tokens;
    ``token_scores``, float32 ``[len(tokens) + 1]``, the natural-log probability of each token and of the
    final end of sentence; ``score``, their sum."""

    tokens: List[str]
    token_scores: np.ndarray = field(repr=False)
    score: float


@dataclass(frozen=True)
class Alignment:
    """A sentence pair's word alignment from attention: ``links`` as ``(source word, target word)`` pairs,
    0-based (each target word linked to its most attended source word); with ``soft=True`` also
    ``attention``, float64 ``[target words, source words]`` (rows sum to 1), and ``gates``, the mean gate
    value per target token."""

    links: List[Tuple[int, int]]
    attention: Optional[np.ndarray] = None
    gates: Optional[np.ndarray] = None


@dataclass
class TranslationResult:
    """One sentence's result of :meth:`Translator.translate_batch`, as CTranslate2 names it."""

    hypotheses: List[List[str]]
    scores: List[float] = field(default_factory=list)
    attention: List[Any] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)


@dataclass
class ScoringResult:
    """One pair's result of :meth:`Translator.score_batch`: the target's tokens and their log-probabilities."""

    tokens: List[str]
    log_probs: List[float]


@dataclass
class TranslationStats:
    """What :meth:`Translator.translate_file` did: output tokens, lines, and the time taken."""

    num_tokens: int
    num_examples: int
    total_time_in_ms: float


def _chunks(items: Iterable[Any], n: int) -> Iterator[List[Any]]:
    """``items`` in lists of ``n`` (the last one shorter), read as they are needed."""
    chunk: List[Any] = []
    for x in items:
        chunk.append(x)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _result(t: "Translation", n: int, scores: bool, attention: bool) -> TranslationResult:
    hyps = t.hypotheses[:n] if t.hypotheses else [Hypothesis(text=t.text, tokens=t.tokens, score=t.score)]
    return TranslationResult(
        hypotheses=[list(h.tokens) for h in hyps],
        scores=[float(h.score) for h in hyps if h.score is not None] if scores else [],
        attention=[t.attention.tolist()] if attention and t.attention is not None else [],
    )


class Translator:
    """A trained model (or an ensemble of models sharing vocabularies) opened for translation.

    ``model_dir`` is a model directory written by ``cgnmt train`` (a run directory means its ``best/``
    model), or a list of them for an ensemble (log-probabilities averaged at every step). ``threads``: the
    threads of the matrix products (0: the physical cores; process-wide). ``int8``: the decoder's per-step
    products in 8-bit integers (faster, approximate; x86-64 with AVX2). ``shortlist``: a lexicon from
    ``cgnmt shortlist``, to decode each batch over the most frequent target words and each source word's
    most probable translations (faster, approximate).

    Raises ``FileNotFoundError`` when a directory or the lexicon is missing, ``ValueError`` when a model
    directory is damaged or an ensemble's models do not share vocabularies.
    """

    def __init__(
        self,
        model_dir: Union[PathType, Sequence[PathType]],
        threads: int = 0,
        int8: bool = False,
        shortlist: Optional[PathType] = None,
        shortlist_frequent: int = 100,
        shortlist_per_word: int = 50,
    ) -> None:
        dirs = [model_dir] if isinstance(model_dir, (str, PathLike)) else list(model_dir)
        if threads < 0:
            raise ValueError(f"threads {threads}: 0 (the physical cores) or more")
        if threads:
            _cgnmt.set_threads(threads)
        self._inner = _cgnmt.Translator(
            [fspath(d) for d in dirs],
            int8,
            None if shortlist is None else fspath(shortlist),
            shortlist_frequent,
            shortlist_per_word,
        )

    @property
    def model_dirs(self) -> List[str]:
        """The directories of the models read (a run directory's ``best/``), the first one first."""
        return [fspath(d) for d in self._inner.model_dirs()]

    @property
    def decoding_settings(self) -> Optional[Dict[str, Any]]:
        """The decoding settings chosen on dev that the (first) model keeps (``decoding.toml``, written by
        ``cgnmt select --tune`` and the demo): ``length_penalty``, ``coverage_penalty``, ``beam``,
        ``dev_bleu``, ``dev_sentences``; ``None`` when it keeps none. :meth:`translate` decodes with its
        penalties unless given others."""
        return self._inner.decoding_settings()

    @property
    def notes(self) -> List[str]:
        """What opening noticed: int8 unavailable on this CPU, a shortlist that matches nothing."""
        return list(self._inner.notes())

    def translate(
        self,
        sentences: Sequence[str],
        beam: int = 10,
        nbest: int = 1,
        length_penalty: Optional[float] = None,
        coverage_penalty: Optional[float] = None,
        length_norm: bool = False,
        context_scale: Tuple[float, float] = (1.0, 1.0),
        pretokenized: bool = False,
        return_attention: bool = False,
        return_gates: bool = False,
        return_coverage: bool = False,
        batch: int = 32,
        max_input_words: int = 200,
        long_input: str = "split",
        return_word_scores: bool = False,
        alignment: Optional[str] = None,
        target_prefix: Optional[Sequence[str]] = None,
        constraints: Optional[Sequence[Sequence[str]]] = None,
        avoid: Optional[Sequence[Sequence[str]]] = None,
        max_decoding_length: Optional[int] = None,
        min_decoding_length: Optional[int] = None,
    ) -> List[Translation]:
        """Translate ``sentences`` (raw text, or whitespace-tokenised with ``pretokenized``): one
        :class:`Translation` per sentence, in order; an empty sentence gives an empty translation.

        ``beam``: the beam size (1: greedy). ``nbest``: hypotheses per sentence (at most ``beam``).
        ``length_penalty``: GNMT's α (0: rank by total log-probability, GroundHog's way);
        ``coverage_penalty``: GNMT's β; ``None`` (the default) takes the value chosen on dev that the model
        keeps (:attr:`decoding_settings`), else 0. ``length_norm``: rank by log-probability per word instead.
        ``context_scale``: ``(a, b)`` scales the source-context terms by ``a`` and the target-side terms by
        ``b`` at every step (the paper's Figure 2). ``batch``: sentences decoded together.
        ``max_input_words``: a longer input (in model tokens) is translated in pieces (``long_input =
        "split"``) or cut (``"truncate"``); 0: no limit.
        ``return_word_scores``: each output word's log-probability and mean gate value; ``alignment``:
        ``"hard"``, ``"soft"`` or a probability (e.g. ``"0.2"``), the word alignment from attention (see
        :class:`Translation`). ``target_prefix``: one string per sentence (empty for none), the words each
        output must start with (raw text, or tokens with ``pretokenized``); the search goes on from them.
        ``constraints``: one list of phrases per sentence (empty for none) that its output must contain, each
        once, in any order (lexically constrained decoding by dynamic beam allocation, the beam fixed);
        ``avoid``: one list of phrases per sentence that its output must never contain. An output that could
        not meet all its constraints within the length limit has ``unmet_constraints`` > 0.
        ``max_decoding_length``: at most this many output tokens (``None``: three times the source's tokens plus
        one); ``min_decoding_length``: no end of sentence before this many (``None``: half the source's tokens
        plus one; never above the maximum).

        Raises ``ValueError`` for an option out of its range (a beam of 0, a negative penalty, a context scale
        outside [0, 4]).
        """
        if long_input not in ("split", "truncate"):
            raise ValueError(f'long_input {long_input!r}: "split" or "truncate"')
        record = return_attention or return_gates or return_coverage
        raw = self._inner.translate(
            _sentences("sentences", sentences),
            beam,
            nbest,
            length_norm,
            None if length_penalty is None else float(length_penalty),
            None if coverage_penalty is None else float(coverage_penalty),
            (float(context_scale[0]), float(context_scale[1])),
            pretokenized,
            record,
            batch,
            max_input_words,
            long_input == "truncate",
            return_word_scores,
            None if alignment is None else str(alignment),
            None if target_prefix is None else _sentences("target_prefix", target_prefix),
            _phrase_lists("constraints", constraints),
            _phrase_lists("avoid", avoid),
            max_decoding_length,
            min_decoding_length,
        )
        out = []
        for r in raw:
            hyps = [Hypothesis(text=t, tokens=list(k), score=s) for (t, k, s) in r["hypotheses"]]
            out.append(
                Translation(
                    text=r["text"],
                    tokens=list(r["tokens"]),
                    source_tokens=list(r["source_tokens"]),
                    score=hyps[0].score if hyps else None,
                    hypotheses=hyps,
                    attention=_f32(r["attention"], tuple(r["attention_shape"]))
                    if return_attention
                    else None,
                    gates=_f32(r["gates"]) if return_gates else None,
                    coverage=_f32(r["coverage"]) if return_coverage else None,
                    word_scores=np.asarray(r["word_scores"], dtype=np.float64)
                    if return_word_scores
                    else None,
                    word_gates=None
                    if not return_word_scores or r["word_gates"] is None
                    else np.asarray(r["word_gates"], dtype=np.float32),
                    alignment=_alignment(r, alignment),
                    unmet_constraints=int(r["unmet_constraints"]),
                )
            )
        return out

    def translate_batch(
        self,
        source: Sequence[Union[str, Sequence[str]]],
        target_prefix: Optional[Sequence[Optional[Union[str, Sequence[str]]]]] = None,
        max_batch_size: int = 0,
        beam_size: int = 10,
        num_hypotheses: int = 1,
        length_penalty: Optional[float] = None,
        coverage_penalty: Optional[float] = None,
        max_decoding_length: Optional[int] = None,
        min_decoding_length: Optional[int] = None,
        return_scores: bool = True,
        return_attention: bool = False,
    ) -> List["TranslationResult"]:
        """CTranslate2's ``Translator.translate_batch``: ``source`` is a list of token lists (the model's tokens,
        as CTranslate2 takes them) or of raw strings; ``target_prefix`` one token list (or ``None``) per
        sentence. Returns one :class:`TranslationResult` per sentence: ``hypotheses`` (``num_hypotheses``
        token lists), ``scores`` (their log-probabilities, with ``return_scores``), ``attention`` (each
        hypothesis's target × source weights, with ``return_attention``). ``length_penalty`` is GNMT's α
        (``None``: the model's, as in :meth:`translate`); ``max_batch_size`` 0 decodes 32 at a time."""
        tokens = bool(source) and not isinstance(source[0], str)
        if tokens and any(isinstance(x, str) for x in source):
            raise ValueError("source: all token lists or all strings, not both")
        sentences = [" ".join(x) if tokens else x for x in source]
        prefix = None
        if target_prefix is not None:
            if len(target_prefix) != len(sentences):
                raise ValueError(
                    f"target_prefix: {len(target_prefix)} entries for {len(sentences)} sentences"
                )
            prefix = [
                "" if p is None else (p if isinstance(p, str) else " ".join(p)) for p in target_prefix
            ]
            if not tokens and any(p is not None and not isinstance(p, str) for p in target_prefix):
                raise ValueError("target_prefix: strings for string sources, token lists for token lists")
        out = self.translate(
            sentences,
            beam=beam_size,
            nbest=num_hypotheses,
            length_penalty=length_penalty,
            coverage_penalty=coverage_penalty,
            pretokenized=tokens,
            return_attention=return_attention,
            batch=max_batch_size or 32,
            target_prefix=prefix,
            max_decoding_length=max_decoding_length,
            min_decoding_length=min_decoding_length,
        )
        return [_result(t, num_hypotheses, return_scores, return_attention) for t in out]

    def translate_iterable(
        self,
        source: Iterable[Union[str, Sequence[str]]],
        max_batch_size: int = 32,
        batch_type: str = "examples",
        **kwargs: Any,
    ) -> Iterator["TranslationResult"]:
        """CTranslate2's ``translate_iterable``: translate a stream of sentences (raw strings or token lists) and
        yield one :class:`TranslationResult` per sentence, in order, holding only ``16 · max_batch_size``
        sentences at a time (a file of any length in bounded memory). ``kwargs`` as :meth:`translate_batch`."""
        if batch_type != "examples":
            raise ValueError('batch_type: only "examples" (sentences per batch)')
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size {max_batch_size}: it must be at least 1")
        for chunk in _chunks(source, 16 * max_batch_size):
            yield from self.translate_batch(chunk, max_batch_size=max_batch_size, **kwargs)

    def translate_file(
        self,
        source_path: PathType,
        output_path: PathType,
        max_batch_size: int = 32,
        **kwargs: Any,
    ) -> "TranslationStats":
        """CTranslate2's ``translate_file``: translate the raw text lines of ``source_path`` (UTF-8, plain) into
        ``output_path``, one line per input line (the best hypothesis, detokenised), streaming with
        :meth:`translate_iterable`. The output is written to a temporary file and renamed into place when every
        line is done (nothing partial is left). Returns the counts and the time taken."""
        import os
        import tempfile
        import time

        start = time.perf_counter()
        out_path = fspath(output_path)
        directory = os.path.dirname(os.path.abspath(out_path))
        n = tokens = 0
        fd, tmp = tempfile.mkstemp(prefix=".cgnmt-", dir=directory)
        try:
            with open(fspath(source_path), encoding="utf-8") as src, os.fdopen(fd, "w", encoding="utf-8") as dst:
                lines = (line.rstrip("\n").rstrip("\r") for line in src)
                for r in self._texts(lines, max_batch_size, kwargs):
                    dst.write(r.text + "\n")
                    n += 1
                    tokens += len(r.tokens)
            os.replace(tmp, out_path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return TranslationStats(
            num_tokens=tokens, num_examples=n, total_time_in_ms=1000 * (time.perf_counter() - start)
        )

    def _texts(
        self, lines: Iterable[str], max_batch_size: int, kwargs: Mapping[str, Any]
    ) -> Iterator[Translation]:
        """:meth:`translate` over a stream of raw lines, ``16 · max_batch_size`` at a time, in order."""
        opts = dict(kwargs)
        if "beam_size" in opts:
            opts["beam"] = opts.pop("beam_size")
        for chunk in _chunks(lines, 16 * max_batch_size):
            yield from self.translate(chunk, batch=max_batch_size, **opts)

    def score_batch(
        self,
        source: Sequence[Union[str, Sequence[str]]],
        target: Sequence[Union[str, Sequence[str]]],
        max_batch_size: int = 0,
    ) -> List["ScoringResult"]:
        """CTranslate2's ``score_batch``: each target's tokens and their log-probabilities given its source (token
        lists, or raw strings, on both sides alike); see :meth:`score`."""
        tokens = bool(source) and not isinstance(source[0], str)
        join = (lambda x: " ".join(x)) if tokens else (lambda x: x)
        scores = self.score(
            [join(x) for x in source],
            [join(x) for x in target],
            pretokenized=tokens,
            batch=max_batch_size or 32,
        )
        return [ScoringResult(tokens=s.tokens, log_probs=[float(x) for x in s.token_scores]) for s in scores]

    def align(
        self, sources: Sequence[str], targets: Sequence[str], soft: bool = False, batch: int = 32
    ) -> List[Alignment]:
        """Word alignments of the first model for sentence pairs tokenised with spaces (see :func:`align`)."""
        raw = self._inner.align(
            _sentences("sources", sources), _sentences("targets", targets), batch
        )
        out = []
        for links, att, shape, gates in raw:
            out.append(
                Alignment(
                    links=[tuple(l) for l in links],
                    attention=_f32(att, tuple(shape)).astype(np.float64) if soft else None,
                    gates=_f32(gates) if soft else None,
                )
            )
        return out

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        pretokenized: bool = False,
        context_scale: Tuple[float, float] = (1.0, 1.0),
        batch: int = 32,
    ) -> List[Score]:
        """Score given translations: each target's log-probability given its source, word by word, by
        forced decoding (with an ensemble, the mean of its models' log-probabilities). Raw text on both sides
        goes through the model's tokenisers and subwords; with ``pretokenized`` both are split on whitespace
        and taken as the model's tokens (as ``Translation.tokens``). A hypothesis of :meth:`translate` scores
        here its ``score`` (the search's total log-probability, before penalties)."""
        raw = self._inner.score(
            _sentences("sources", sources),
            _sentences("targets", targets),
            pretokenized,
            tuple(context_scale),
            batch,
        )
        return [Score(tokens=list(t), token_scores=_f32(lp), score=total) for t, lp, total in raw]

    def source_vocabulary(self) -> List[str]:
        """The source vocabulary, by id (``</s>`` and ``<unk>`` first)."""
        return list(self._inner.source_vocabulary())

    def target_vocabulary(self) -> List[str]:
        """The target vocabulary, by id (``</s>`` and ``<unk>`` first)."""
        return list(self._inner.target_vocabulary())

    def info(self) -> Dict[str, Any]:
        """The first model's directory, configuration (TOML text) and parameter counts per component."""
        d = _info(self._inner.info())
        d.pop("source_vocabulary")
        d.pop("target_vocabulary")
        return d


def _info(raw: Mapping[str, Any]) -> Dict[str, Any]:
    d = dict(raw)
    d["directory"] = fspath(d["directory"])
    d["parameters"] = [(str(k), int(n)) for k, n in d["parameters"]]
    return d


class Model:
    """A model directory, read for its description (no decoding): ``Model(dir).info()``, its ``config``
    (TOML text) and its vocabularies (``source_vocabulary``, ``target_vocabulary``: the tokens by id,
    ``</s>`` and ``<unk>`` first)."""

    def __init__(self, model_dir: PathType) -> None:
        raw = _info(_cgnmt.model_info(fspath(model_dir)))
        self.source_vocabulary: List[str] = list(raw.pop("source_vocabulary"))
        self.target_vocabulary: List[str] = list(raw.pop("target_vocabulary"))
        self._info = raw
        self.directory: str = raw["directory"]
        self.config: str = raw["config"]

    def info(self) -> Dict[str, Any]:
        """``directory``, ``config`` (TOML), ``parameters`` (per component), ``total_parameters`` and the
        vocabularies' sizes."""
        return dict(self._info)


def align(
    model_dir: Union[PathType, Translator],
    sources: Sequence[str],
    targets: Sequence[str],
    soft: bool = False,
    batch: int = 32,
) -> List[Alignment]:
    """Word alignments from attention (as ``cgnmt align``): force-decode each ``target`` given its
    ``source`` (both tokenised with spaces, a gold alignment's tokens; a BPE model's subwords are mapped back
    to them) and link every target word to its most attended source word. With ``soft``, each pair's
    word-level attention matrix and gate values too (for soft AER)."""
    tr = model_dir if isinstance(model_dir, Translator) else Translator(model_dir)
    return tr.align(sources, targets, soft=soft, batch=batch)


@dataclass(frozen=True)
class TrainSummary:
    """What a training run left: its directory, parameter count, updates, epochs, best dev BLEU and the step
    that reached it, its evaluation history, and the whole training state (``state``)."""

    run_dir: str
    parameters: int
    steps: int
    epochs: int
    best_dev_bleu: Optional[float]
    best_step: int
    history: List[Dict[str, Any]] = field(default_factory=list)
    state: Dict[str, Any] = field(default_factory=dict)


def _settings(set: Union[None, Mapping[str, Any], Sequence[str]]) -> List[str]:
    if set is None:
        return []
    if isinstance(set, Mapping):
        out = []
        for k, v in set.items():
            if isinstance(v, bool):
                v = "true" if v else "false"
            elif isinstance(v, (int, float)):
                v = repr(v)
            elif isinstance(v, (str, PathLike)):
                v = json.dumps(fspath(v))
            else:
                raise TypeError(f"{k}: a bool, number, string or path, not {type(v).__name__}")
            out.append(f"{k}={v}")
        return out
    if isinstance(set, str):
        raise TypeError("set must be a dict or a list of 'section.key=value' strings")
    return list(set)


def train(
    config: Optional[PathType] = None,
    set: Union[None, Mapping[str, Any], Sequence[str]] = None,
    out: PathType = "runs/model",
    resume: bool = False,
    quiet: bool = False,
    init: Optional[PathType] = None,
) -> TrainSummary:
    """Train a model in this process, as ``cgnmt train`` does (the same progress output, or none with
    ``quiet``): the TOML ``config`` (the defaults without one) with ``set`` overrides (a dict such as
    ``{"train.max_steps": 3000, "data.prepared": "runs/prep"}`` or ``section.key=value`` strings), into the
    run directory ``out``; with ``resume``, continue the run in ``out`` from its last checkpoint; with
    ``init`` (a model directory), fine-tune that model: its parameters and vocabularies, a fresh optimiser, on
    data prepared with ``cgnmt prepare --like DIR`` (the configuration's ``[model]``, if any, must be the
    model's). Ctrl-C stops it after the update in progress with its checkpoint saved (``resume=True``
    continues)."""
    raw = json.loads(
        _cgnmt.train(
            fspath(out),
            None if config is None else fspath(config),
            _settings(set),
            resume,
            quiet,
            None if init is None else fspath(init),
        )
    )
    st = raw["state"]
    return TrainSummary(
        run_dir=fspath(raw["run_dir"]),
        parameters=raw["parameters"],
        steps=st["step"],
        epochs=st["epoch"],
        best_dev_bleu=st.get("best_bleu"),
        best_step=st["best_step"],
        history=list(st.get("history", [])),
        state=st,
    )


def select(
    run: PathType,
    tune: bool = False,
    last: int = 4,
    tolerance: float = 1.0,
    beam: int = 10,
    length_penalty: float = 0.0,
    coverage_penalty: float = 0.0,
    dev_sentences: int = 0,
    prepared: Optional[PathType] = None,
) -> Dict[str, Any]:
    """Choose a finished run's model on dev, as ``cgnmt select``: ``best/``, the average of its converged
    tail (the last ``last`` kept checkpoints within ``tolerance`` BLEU of its best) or the moving average;
    with ``tune``, also its length and coverage penalties. Returns the selection record (also written to
    ``RUN/selection.json``): every candidate's dev BLEU, the chosen one and the penalties."""
    return json.loads(
        _cgnmt.select(
            fspath(run),
            tune,
            last,
            tolerance,
            beam,
            length_penalty,
            coverage_penalty,
            dev_sentences,
            None if prepared is None else fspath(prepared),
        )
    )


def set_threads(n: int) -> None:
    """The threads of the library's matrix products and row loops (0: the physical cores; process-wide)."""
    _cgnmt.set_threads(n)
