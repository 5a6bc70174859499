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

from . import _cgnmt, metrics
from ._cgnmt import (
    Alignment,
    Hypothesis,
    Model,
    Score,
    ScoringResult,
    TrainSummary,
    Translation,
    TranslationResult,
    TranslationStats,
    Translator,
    align,
    prepare,
    select,
    set_threads,
    train,
)

# Every class and function is the native module's, documented and with its defaults where it is defined
# (crates/cgnmt-py/src/); this file only names them. The version is the crates' (Cargo.toml), the one place
# it is written; `_cgnmt.__version__` adds the commit.
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
    "prepare",
    "select",
    "set_threads",
    "train",
]
