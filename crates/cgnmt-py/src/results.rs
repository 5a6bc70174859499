//! What translating, scoring and aligning return: `Translation` (with its `Hypothesis` list), `Score`,
//! `Alignment`, and CTranslate2's `TranslationResult`, `ScoringResult` and `TranslationStats`. Arrays are NumPy
//! arrays; every class is read-only and shows its fields in its `repr`.

use pyo3::prelude::*;

use cgnmt::decode::alignment::{AlignmentMode, WordLevel};
use cgnmt::decode::translate::Translation as Decoded;

use crate::convert::{f32_array, f64_array, f64_matrix, repr_of};

/// One hypothesis of a sentence's n-best list: its post-processed text, its model tokens and its total
/// log-probability (the search's ranking applies the length and coverage penalties on top of it).
#[pyclass(frozen, get_all, module = "cgnmt")]
#[derive(Clone)]
pub struct Hypothesis {
    pub text: String,
    pub tokens: Vec<String>,
    pub score: f64,
}

#[pymethods]
impl Hypothesis {
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(slf.as_any(), "Hypothesis", &["text", "tokens", "score"])
    }

    fn __eq__(&self, other: &Self) -> bool {
        (&self.text, &self.tokens, self.score) == (&other.text, &other.tokens, other.score)
    }
}

/// One sentence's translation.
///
/// `text` is the best hypothesis post-processed (subwords merged, detokenised); `tokens` its model tokens;
/// `source_tokens` the source as the model saw it; `score` its log-probability (`None` for an empty input);
/// `hypotheses` the n-best list, best first.
///
/// With `return_attention`: `attention`, float32 `[target, source]`: one row per emitted word (the final EOS
/// included when the search emitted it), one column per source token plus EOS; each row sums to 1. With
/// `return_gates`: `gates`, float32 `[len(tokens)]`: the context gate's mean value in the transition that read
/// each output word (empty for an ungated model). With `return_coverage`: `coverage`, float32 `[source + 1]`:
/// the coverage model's final value per source position (empty without coverage).
///
/// Over words (subword pieces merged, as `cgnmt align` merges them; the words of the tokenised source and
/// output, as `cgnmt translate --alignment` counts them): with `return_word_scores`, `word_scores`, float64
/// `[output words]`, each word's log-probability (its pieces' sum), and `word_gates`, float32, each word's mean
/// gate value (`None` for an ungated model); with `alignment="hard"` or a probability, `alignment`, `(source
/// word, output word)` links; with `alignment="soft"`, `alignment` is the float64 `[output words, source
/// words]` matrix.
///
/// `unmet_constraints`: how many of the sentence's positive constraints its output does not contain (0 unless
/// they could not all be met within the length limit).
#[pyclass(frozen, get_all, module = "cgnmt")]
pub struct Translation {
    pub text: String,
    pub tokens: Vec<String>,
    pub source_tokens: Vec<String>,
    pub score: Option<f64>,
    pub hypotheses: Vec<Hypothesis>,
    pub attention: Option<PyObject>,
    pub gates: Option<PyObject>,
    pub coverage: Option<PyObject>,
    pub word_scores: Option<PyObject>,
    pub word_gates: Option<PyObject>,
    pub alignment: Option<PyObject>,
    pub unmet_constraints: usize,
}

#[pymethods]
impl Translation {
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(
            slf.as_any(),
            "Translation",
            &["text", "tokens", "source_tokens", "score", "hypotheses"],
        )
    }
}

/// What a translation call returns beyond the text (`translate`'s `return_…` and `alignment` options).
#[derive(Clone, Copy, Default)]
pub struct Wanted {
    pub attention: bool,
    pub gates: bool,
    pub coverage: bool,
    pub word_scores: bool,
    pub alignment: Option<AlignmentMode>,
}

impl Wanted {
    /// Whether the search must record attention, gates and coverage.
    pub fn record(&self) -> bool {
        self.attention
            || self.gates
            || self.coverage
            || self.word_scores
            || self.alignment.is_some()
    }
}

impl Translation {
    /// The Python view of the library's translation `t` by the translator `tr`.
    pub fn of(py: Python<'_>, tr: &cgnmt::Translator, t: &Decoded, w: Wanted) -> PyResult<Self> {
        let hypotheses: Vec<Hypothesis> = t
            .hyps
            .iter()
            .map(|h| Hypothesis {
                text: tr.hypothesis_text(h),
                tokens: tr.model().tgt_vocab.decode(&h.tokens),
                score: h.score,
            })
            .collect();
        let none = cgnmt::decode::beam_search::Hypothesis::default();
        let best = t.hyps.first().unwrap_or(&none);
        let vector = |on: bool, v: &[f32]| on.then(|| f32_array(py, v, &[v.len()])).transpose();
        let attention = if w.attention {
            let cols = best.attention.first().map_or(0, Vec::len);
            let shape = [best.attention.len(), cols];
            Some(f32_array(py, &best.attention.concat(), &shape)?)
        } else {
            None
        };
        let (mut word_scores, mut word_gates, mut alignment) = (None, None, None);
        if w.word_scores || w.alignment.is_some() {
            let words = WordLevel::of(&t.src_tokens, &t.tokens, best);
            if w.word_scores {
                let s = &words.word_scores;
                word_scores = Some(f64_array(py, s, &[s.len()])?);
                let gated = !matches!(tr.model().model.gate, cgnmt::model::gate::Gate::None);
                word_gates = vector(gated, &words.word_gates)?;
            }
            alignment = match w.alignment {
                Some(AlignmentMode::Soft) => Some(f64_matrix(py, &words.attention)?),
                Some(a) => Some(words.links(a).into_pyobject(py)?.into_any().unbind()),
                None => None,
            };
        }
        Ok(Translation {
            text: t.text.clone(),
            tokens: t.tokens.clone(),
            source_tokens: t.src_tokens.clone(),
            score: hypotheses.first().map(|h| h.score),
            attention,
            gates: vector(w.gates, &best.gates)?,
            coverage: vector(w.coverage, &best.coverage)?,
            word_scores,
            word_gates,
            alignment,
            unmet_constraints: best.unmet_constraints,
            hypotheses,
        })
    }
}

/// A given translation's score (`Translator.score`): `tokens`, the target as the model's tokens;
/// `token_scores`, float32 `[len(tokens) + 1]`, the natural-log probability of each token and of the final end
/// of sentence; `score`, their sum.
#[pyclass(frozen, get_all, module = "cgnmt")]
pub struct Score {
    pub tokens: Vec<String>,
    pub token_scores: PyObject,
    pub score: f64,
}

#[pymethods]
impl Score {
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(slf.as_any(), "Score", &["tokens", "score"])
    }
}

impl Score {
    pub fn of(py: Python<'_>, s: &cgnmt::Score) -> PyResult<Self> {
        let v = &s.token_scores;
        Ok(Score {
            tokens: s.tokens.clone(),
            token_scores: f32_array(py, v, &[v.len()])?,
            score: s.score,
        })
    }
}

/// A sentence pair's word alignment from attention: `links` as `(source word, target word)` pairs, 0-based
/// (each target word linked to its most attended source word); with `soft=True` also `attention`, float64
/// `[target words, source words]` (rows sum to 1), and `gates`, the mean gate value per target token.
#[pyclass(frozen, get_all, module = "cgnmt")]
pub struct Alignment {
    pub links: Vec<(usize, usize)>,
    pub attention: Option<PyObject>,
    pub gates: Option<PyObject>,
}

#[pymethods]
impl Alignment {
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(slf.as_any(), "Alignment", &["links"])
    }
}

impl Alignment {
    pub fn of(py: Python<'_>, a: &cgnmt::Alignment, soft: bool) -> PyResult<Self> {
        let (attention, gates) = if soft {
            let g = &a.gates;
            (
                Some(f64_matrix(py, &a.attention)?),
                Some(f32_array(py, g, &[g.len()])?),
            )
        } else {
            (None, None)
        };
        Ok(Alignment {
            links: a.links.clone(),
            attention,
            gates,
        })
    }
}

/// One sentence's result of `Translator.translate_batch`, as CTranslate2 names it: `hypotheses` (token lists),
/// `scores` (their log-probabilities, with `return_scores`), `attention` (each hypothesis's target × source
/// weights as nested lists, with `return_attention`). Also readable as `result["hypotheses"]`.
#[pyclass(frozen, get_all, module = "cgnmt")]
pub struct TranslationResult {
    pub hypotheses: Vec<Vec<String>>,
    pub scores: Vec<f64>,
    pub attention: Vec<Vec<Vec<f32>>>,
}

#[pymethods]
impl TranslationResult {
    fn __getitem__<'py>(slf: &Bound<'py, Self>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        match key {
            "hypotheses" | "scores" | "attention" => slf.getattr(key),
            _ => Err(pyo3::exceptions::PyKeyError::new_err(key.to_string())),
        }
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(slf.as_any(), "TranslationResult", &["hypotheses", "scores"])
    }
}

impl TranslationResult {
    /// The CTranslate2 view of a translation: its first `n` hypotheses' tokens, with their scores and the best
    /// one's attention when asked.
    pub fn of(t: &Translation, n: usize, scores: bool, attention: Option<Vec<Vec<f32>>>) -> Self {
        let hyps = &t.hypotheses[..n.min(t.hypotheses.len())];
        TranslationResult {
            hypotheses: if hyps.is_empty() {
                vec![t.tokens.clone()]
            } else {
                hyps.iter().map(|h| h.tokens.clone()).collect()
            },
            scores: if scores {
                hyps.iter().map(|h| h.score).collect()
            } else {
                Vec::new()
            },
            attention: attention.into_iter().collect(),
        }
    }
}

/// One pair's result of `Translator.score_batch`: the target's tokens and their log-probabilities (the last is
/// the end of sentence's).
#[pyclass(frozen, get_all, module = "cgnmt")]
pub struct ScoringResult {
    pub tokens: Vec<String>,
    pub log_probs: Vec<f32>,
}

#[pymethods]
impl ScoringResult {
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(slf.as_any(), "ScoringResult", &["tokens", "log_probs"])
    }
}

/// What `Translator.translate_file` did: output tokens, lines, and the time taken.
#[pyclass(frozen, get_all, module = "cgnmt")]
pub struct TranslationStats {
    pub num_tokens: usize,
    pub num_examples: usize,
    pub total_time_in_ms: f64,
}

#[pymethods]
impl TranslationStats {
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(
            slf.as_any(),
            "TranslationStats",
            &["num_tokens", "num_examples", "total_time_in_ms"],
        )
    }
}
