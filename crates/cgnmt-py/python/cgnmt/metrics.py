"""Translation and alignment metrics, computed as ``cgnmt score``, ``cgnmt compare`` and ``cgnmt aer`` compute
them (the same code): BLEU as sacreBLEU 2.x and NIST mteval-v11b (the paper's metric), chrF and chrF++, paired
significance tests, and the alignment error rate.

``refs`` is a list of reference streams, as in sacreBLEU (``[refs_a, refs_b]`` for two references per
sentence); a plain list of strings is one reference stream.

    >>> from cgnmt import metrics
    >>> round(metrics.bleu(["the cat sat on the mat"], [["the cat sat on the mat"]]).score, 2)
    100.0
"""

from ._cgnmt import (
    AERScore,
    BLEUScore,
    CHRFScore,
    Comparison,
    RunsComparison,
    Signature,
    aer,
    bleu,
    chrf,
    compare,
    compare_runs,
    sentence_bleu,
    sentence_chrf,
)

__all__ = ["AERScore", "BLEUScore", "CHRFScore", "Comparison", "RunsComparison", "Signature", "aer", "bleu",
           "chrf", "compare", "compare_runs", "sentence_bleu", "sentence_chrf"]
