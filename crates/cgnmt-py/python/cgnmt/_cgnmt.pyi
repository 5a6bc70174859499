"""Type stubs of the native module `cgnmt._cgnmt` (the Rust half of the package; use the `cgnmt` module)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

__version__: str

class Translator:
    def __init__(
        self,
        model_dirs: Sequence[str],
        int8: bool = False,
        shortlist: Optional[str] = None,
        shortlist_frequent: int = 100,
        shortlist_per_word: int = 50,
    ) -> None: ...
    def notes(self) -> List[str]: ...
    def decoding_settings(self) -> Optional[Dict[str, Any]]: ...
    def model_dirs(self) -> List[str]: ...
    def translate(
        self,
        sentences: Sequence[str],
        beam: int = 10,
        nbest: int = 1,
        length_norm: bool = False,
        length_penalty: Optional[float] = None,
        coverage_penalty: Optional[float] = None,
        context_scale: Tuple[float, float] = (1.0, 1.0),
        pretokenized: bool = False,
        record: bool = False,
        batch: int = 32,
        max_input_words: int = 200,
        truncate_long: bool = False,
        word_scores: bool = False,
        alignment: Optional[str] = None,
        target_prefix: Optional[Sequence[str]] = None,
        constraints: Optional[Sequence[Sequence[str]]] = None,
        avoid: Optional[Sequence[Sequence[str]]] = None,
        max_decoding_length: Optional[int] = None,
        min_decoding_length: Optional[int] = None,
    ) -> List[Dict[str, Any]]: ...
    def align(
        self, sources: Sequence[str], targets: Sequence[str], batch: int = 32
    ) -> List[Tuple[List[Tuple[int, int]], bytes, Tuple[int, int], bytes]]: ...
    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        pretokenized: bool = False,
        context_scale: Tuple[float, float] = (1.0, 1.0),
        batch: int = 32,
    ) -> List[Tuple[List[str], bytes, float]]: ...
    def source_vocabulary(self) -> List[str]: ...
    def target_vocabulary(self) -> List[str]: ...
    def info(self) -> Dict[str, Any]: ...

def model_info(model_dir: str) -> Dict[str, Any]: ...
def config_info(config: Optional[str] = None, set: Sequence[str] = ...) -> Tuple[str, List[Tuple[str, int]]]: ...
def train(
    out: str,
    config: Optional[str] = None,
    set: Sequence[str] = ...,
    resume: bool = False,
    quiet: bool = False,
    init: Optional[str] = None,
) -> str: ...
def select(
    run: str,
    tune: bool = False,
    last: int = 4,
    tolerance: float = 1.0,
    beam: int = 10,
    length_penalty: float = 0.0,
    coverage_penalty: float = 0.0,
    dev_sentences: int = 0,
    prepared: Optional[str] = None,
) -> str: ...
def bleu(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    mteval: bool = False,
    lowercase: bool = False,
    tokenize: Optional[str] = None,
    smooth: Optional[str] = None,
    smooth_value: Optional[float] = None,
    cased: bool = False,
) -> str: ...
def sentence_bleu(
    hyp: str,
    refs: Sequence[str],
    lowercase: bool = False,
    tokenize: Optional[str] = None,
    smooth: Optional[str] = None,
    smooth_value: Optional[float] = None,
    effective_order: bool = True,
) -> str: ...
def chrf(
    hyps: Sequence[str], refs: Sequence[Sequence[str]], plus_plus: bool = False, lowercase: bool = False
) -> str: ...
def compare(
    baseline: Sequence[str],
    system: Sequence[str],
    refs: Sequence[Sequence[str]],
    test: str = "all",
    metric: str = "bleu",
    mteval: bool = False,
    lowercase: bool = False,
    tokenize: Optional[str] = None,
    seed: int = ...,
    bs_samples: int = ...,
    ar_trials: int = ...,
) -> str: ...
def compare_runs(
    baseline_runs: Sequence[Sequence[str]],
    system_runs: Sequence[Sequence[str]],
    refs: Sequence[Sequence[str]],
    metric: str,
    mteval: bool,
    lowercase: bool,
    tokenize: Optional[str],
    seed: int,
    bs_samples: int,
) -> str: ...
def aer(
    gold: Sequence[str],
    pred: Optional[Sequence[str]] = None,
    soft: Optional[Sequence[Sequence[Sequence[float]]]] = None,
) -> str: ...
def set_threads(n: int) -> None: ...
def _panic_for_test() -> None: ...
