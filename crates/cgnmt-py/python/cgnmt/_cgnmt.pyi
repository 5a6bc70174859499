"""Type stubs of the native module `cgnmt._cgnmt` (the whole package; `cgnmt` and `cgnmt.metrics` re-export it).

Checked against the module by mypy's stubtest (`.ci/run`): every name, signature and default here is the
module's own."""

from os import PathLike
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union, final

import numpy as np
import numpy.typing as npt

__version__: str
__all__ = [
    "__version__", "Translator", "align", "TranslationIterator", "Translation", "Hypothesis", "Score", "Alignment",
    "TranslationResult", "ScoringResult", "TranslationStats", "Model", "TrainSummary", "prepare", "train", "select",
    "set_threads", "_panic_for_test", "Signature", "BLEUScore", "CHRFScore", "Comparison", "RunsComparison",
    "AERScore", "bleu", "sentence_bleu", "chrf", "sentence_chrf", "compare", "compare_runs", "aer",
]

_Path = Union[str, PathLike[str]]
_Sentence = Union[str, Sequence[str]]
_Refs = Union[Sequence[str], Sequence[Sequence[str]]]

@final
class Hypothesis:
    @property
    def text(self) -> str: ...
    @property
    def tokens(self) -> List[str]: ...
    @property
    def score(self) -> float: ...

@final
class Translation:
    @property
    def text(self) -> str: ...
    @property
    def tokens(self) -> List[str]: ...
    @property
    def source_tokens(self) -> List[str]: ...
    @property
    def score(self) -> Optional[float]: ...
    @property
    def hypotheses(self) -> List[Hypothesis]: ...
    @property
    def attention(self) -> Optional[npt.NDArray[np.float32]]: ...
    @property
    def gates(self) -> Optional[npt.NDArray[np.float32]]: ...
    @property
    def coverage(self) -> Optional[npt.NDArray[np.float32]]: ...
    @property
    def word_scores(self) -> Optional[npt.NDArray[np.float64]]: ...
    @property
    def word_gates(self) -> Optional[npt.NDArray[np.float32]]: ...
    @property
    def alignment(self) -> Optional[Union[List[Tuple[int, int]], npt.NDArray[np.float64]]]: ...
    @property
    def unmet_constraints(self) -> int: ...

@final
class Score:
    @property
    def tokens(self) -> List[str]: ...
    @property
    def token_scores(self) -> npt.NDArray[np.float32]: ...
    @property
    def score(self) -> float: ...

@final
class Alignment:
    @property
    def links(self) -> List[Tuple[int, int]]: ...
    @property
    def attention(self) -> Optional[npt.NDArray[np.float64]]: ...
    @property
    def gates(self) -> Optional[npt.NDArray[np.float32]]: ...

@final
class TranslationResult:
    @property
    def hypotheses(self) -> List[List[str]]: ...
    @property
    def scores(self) -> List[float]: ...
    @property
    def attention(self) -> List[List[List[float]]]: ...
    def __getitem__(self, key: str, /) -> Any: ...

@final
class ScoringResult:
    @property
    def tokens(self) -> List[str]: ...
    @property
    def log_probs(self) -> List[float]: ...

@final
class TranslationStats:
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_examples(self) -> int: ...
    @property
    def total_time_in_ms(self) -> float: ...

@final
class TranslationIterator:
    def __iter__(self) -> TranslationIterator: ...
    def __next__(self) -> TranslationResult: ...

@final
class Translator:
    def __new__(
        cls,
        model_dir: Union[_Path, Sequence[_Path]],
        threads: int = 0,
        int8: bool = False,
        shortlist: Optional[_Path] = None,
        shortlist_frequent: int = 100,
        shortlist_per_word: int = 50,
    ) -> Translator: ...
    @property
    def model_dirs(self) -> List[str]: ...
    @property
    def decoding_settings(self) -> Optional[Dict[str, Any]]: ...
    @property
    def notes(self) -> List[str]: ...
    def translate(
        self,
        sentences: Sequence[str],
        beam: int = 10,
        nbest: int = 1,
        length_penalty: Optional[float] = None,
        coverage_penalty: Optional[float] = None,
        length_norm: bool = False,
        context_scale: Tuple[float, float] = ...,  # (1.0, 1.0)
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
    ) -> List[Translation]: ...
    def translate_batch(
        self,
        source: Sequence[_Sentence],
        target_prefix: Optional[Sequence[Optional[_Sentence]]] = None,
        max_batch_size: int = 0,
        beam_size: int = 10,
        num_hypotheses: int = 1,
        length_penalty: Optional[float] = None,
        coverage_penalty: Optional[float] = None,
        max_decoding_length: Optional[int] = None,
        min_decoding_length: Optional[int] = None,
        return_scores: bool = True,
        return_attention: bool = False,
    ) -> List[TranslationResult]: ...
    def translate_iterable(
        self,
        source: Iterable[_Sentence],
        max_batch_size: int = 32,
        batch_type: str = "examples",
        **kwargs: Any,
    ) -> TranslationIterator: ...
    def translate_file(
        self, source_path: _Path, output_path: _Path, max_batch_size: int = 32, **kwargs: Any
    ) -> TranslationStats: ...
    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        pretokenized: bool = False,
        context_scale: Tuple[float, float] = ...,  # (1.0, 1.0)
        batch: int = 32,
    ) -> List[Score]: ...
    def score_batch(
        self, source: Sequence[_Sentence], target: Sequence[_Sentence], max_batch_size: int = 0
    ) -> List[ScoringResult]: ...
    def align(
        self, sources: Sequence[str], targets: Sequence[str], soft: bool = False, batch: int = 32
    ) -> List[Alignment]: ...
    def source_vocabulary(self) -> List[str]: ...
    def target_vocabulary(self) -> List[str]: ...
    def info(self) -> Dict[str, Any]: ...

def align(
    model_dir: Union[_Path, Sequence[_Path], Translator],
    sources: Sequence[str],
    targets: Sequence[str],
    **kwargs: Any,
) -> List[Alignment]: ...

@final
class Model:
    def __new__(cls, model_dir: _Path) -> Model: ...
    @property
    def directory(self) -> str: ...
    @property
    def config(self) -> str: ...
    @property
    def source_vocabulary(self) -> List[str]: ...
    @property
    def target_vocabulary(self) -> List[str]: ...
    def info(self) -> Dict[str, Any]: ...

@final
class TrainSummary:
    @property
    def run_dir(self) -> str: ...
    @property
    def parameters(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def epochs(self) -> int: ...
    @property
    def best_dev_bleu(self) -> Optional[float]: ...
    @property
    def best_step(self) -> int: ...
    @property
    def history(self) -> List[Dict[str, Any]]: ...
    @property
    def state(self) -> Dict[str, Any]: ...

def prepare(
    src: _Path,
    tgt: _Path,
    out: _Path,
    dev_src: Optional[_Path] = None,
    dev_tgt: Optional[_Path] = None,
    test_src: Optional[_Path] = None,
    test_tgt: Optional[_Path] = None,
    src_lang: Optional[str] = None,
    tgt_lang: Optional[str] = None,
    src_tok: Optional[str] = None,
    tgt_tok: Optional[str] = None,
    lowercase: Optional[bool] = None,
    src_vocab_size: Optional[int] = None,
    tgt_vocab_size: Optional[int] = None,
    max_len: Optional[int] = None,
    bpe_src: Optional[int] = None,
    bpe_tgt: Optional[int] = None,
    limit: Optional[int] = None,
    force: Optional[bool] = None,
    like: Optional[_Path] = None,
    alignment: Optional[_Path] = None,
) -> Dict[str, Any]: ...
def train(
    config: Optional[_Path] = None,
    set: Union[None, Mapping[str, Any], Sequence[str]] = None,
    out: _Path = ...,
    resume: bool = False,
    quiet: bool = False,
    init: Optional[_Path] = None,
) -> TrainSummary: ...
def select(
    run: _Path,
    tune: bool = False,
    last: int = 4,
    tolerance: float = 1.0,
    beam: int = 10,
    length_penalty: float = 0.0,
    coverage_penalty: float = 0.0,
    dev_sentences: int = 0,
    prepared: Optional[_Path] = None,
    tune_longer_than: int = 0,
    length_ratio: Optional[Tuple[float, float]] = None,
) -> Dict[str, Any]: ...
def set_threads(n: int) -> None: ...
def _panic_for_test() -> None: ...

@final
class Signature:
    def __new__(cls, text: str) -> Signature: ...
    @property
    def fields(self) -> Dict[str, str]: ...
    def __getitem__(self, key: str, /) -> str: ...
    def format(self, short: bool = False) -> str: ...

@final
class BLEUScore:
    @property
    def score(self) -> float: ...
    @property
    def counts(self) -> List[int]: ...
    @property
    def totals(self) -> List[int]: ...
    @property
    def precisions(self) -> List[float]: ...
    @property
    def bp(self) -> float: ...
    @property
    def sys_len(self) -> int: ...
    @property
    def ref_len(self) -> int: ...
    @property
    def signature(self) -> str: ...
    def get_signature(self) -> Signature: ...

@final
class CHRFScore:
    @property
    def name(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def signature(self) -> str: ...
    def get_signature(self) -> Signature: ...

@final
class Comparison:
    @property
    def metric(self) -> str: ...
    @property
    def signature(self) -> str: ...
    @property
    def baseline_score(self) -> float: ...
    @property
    def score(self) -> float: ...
    @property
    def bootstrap(self) -> Optional[Dict[str, Any]]: ...
    @property
    def ar(self) -> Optional[Dict[str, Any]]: ...
    @property
    def sign(self) -> Optional[Dict[str, Any]]: ...
    @property
    def seed(self) -> int: ...
    @property
    def record(self) -> Dict[str, Any]: ...

@final
class RunsComparison:
    @property
    def metric(self) -> str: ...
    @property
    def base_scores(self) -> List[float]: ...
    @property
    def sys_scores(self) -> List[float]: ...
    @property
    def base_mean(self) -> float: ...
    @property
    def sys_mean(self) -> float: ...
    @property
    def base_s_opt(self) -> float: ...
    @property
    def sys_s_opt(self) -> float: ...
    @property
    def base_s_sel(self) -> float: ...
    @property
    def sys_s_sel(self) -> float: ...
    @property
    def welch(self) -> Optional[Dict[str, Any]]: ...
    @property
    def permutation(self) -> Dict[str, Any]: ...
    @property
    def run_bootstrap(self) -> Dict[str, Any]: ...
    @property
    def pooled_p(self) -> float: ...
    @property
    def runs_needed(self) -> Optional[int]: ...
    @property
    def significant(self) -> bool: ...
    @property
    def record(self) -> Dict[str, Any]: ...

@final
class AERScore:
    @property
    def aer(self) -> float: ...
    @property
    def precision(self) -> float: ...
    @property
    def recall(self) -> float: ...
    @property
    def a(self) -> int: ...
    @property
    def s(self) -> int: ...
    @property
    def p(self) -> int: ...
    @property
    def a_and_s(self) -> int: ...
    @property
    def a_and_p(self) -> int: ...
    @property
    def sentences(self) -> int: ...
    @property
    def saer(self) -> Optional[float]: ...
    @property
    def saer_macro(self) -> Optional[float]: ...

def bleu(
    hyps: Sequence[str],
    refs: _Refs,
    mteval: bool = False,
    lowercase: Optional[bool] = None,
    tokenize: Optional[str] = None,
    smooth: Optional[str] = None,
    smooth_value: Optional[float] = None,
) -> BLEUScore: ...
def sentence_bleu(
    hypothesis: str,
    references: Sequence[str],
    lowercase: bool = False,
    tokenize: Optional[str] = None,
    smooth: Optional[str] = None,
    smooth_value: Optional[float] = None,
    use_effective_order: bool = True,
) -> BLEUScore: ...
def chrf(hyps: Sequence[str], refs: _Refs, plus_plus: bool = False, lowercase: bool = False) -> CHRFScore: ...
def sentence_chrf(hypothesis: str, references: Sequence[str], plus_plus: bool = False) -> CHRFScore: ...
def compare(
    baseline: Sequence[str],
    system: Sequence[str],
    refs: _Refs,
    test: str = "bootstrap",
    metric: str = "bleu",
    mteval: bool = False,
    lowercase: bool = False,
    seed: Optional[int] = None,
    bs_samples: Optional[int] = None,
    ar_trials: Optional[int] = None,
) -> Comparison: ...
def compare_runs(
    baseline_runs: Sequence[Sequence[str]],
    system_runs: Sequence[Sequence[str]],
    refs: _Refs,
    metric: str = "bleu",
    mteval: bool = False,
    lowercase: bool = False,
    seed: Optional[int] = None,
    bs_samples: Optional[int] = None,
) -> RunsComparison: ...
def aer(
    gold: Sequence[str],
    pred: Optional[Sequence[str]] = None,
    soft: Optional[Sequence[Any]] = None,
) -> AERScore: ...
