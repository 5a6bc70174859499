//! Translation and alignment metrics, computed as `cgnmt score`, `cgnmt compare` and `cgnmt aer` compute them
//! (the same code): BLEU as sacreBLEU 2.x and NIST mteval-v11b compute it, chrF and chrF++, sentence-level
//! BLEU and chrF as sacreBLEU's `sentence_bleu` / `sentence_chrf`, paired significance tests (one run a side,
//! or several seeds a side), and the alignment error rate. Python's `cgnmt.metrics` holds them.
//!
//! `refs` is a list of reference streams, as in sacreBLEU (`[refs_a, refs_b]` for two references per
//! sentence); a plain list of strings is one reference stream.

use std::path::{Path, PathBuf};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use cgnmt_eval::report::{MetricOptions, TestArg};
use cgnmt_eval::significance::{DEFAULT_AR_TRIALS, DEFAULT_BS_SAMPLES, DEFAULT_SEED};

use crate::convert::{f64_field, field, json_to_py, repr_of, usize_field, Lines};
use crate::errors::{guarded, py_err_any};

/// References: several streams, or one.
#[derive(FromPyObject)]
pub enum Refs {
    Streams(Vec<Vec<String>>),
    One(Vec<String>),
}

impl Refs {
    fn streams(self) -> Vec<Vec<String>> {
        match self {
            Refs::Streams(s) => s,
            Refs::One(s) => vec![s],
        }
    }
}

/// The metric options of the command line (`score`, `compare`).
fn metric_options(
    tokenize: Option<&str>,
    lowercase: bool,
    smooth: Option<&str>,
    smooth_value: Option<f64>,
    mteval: bool,
    cased: bool,
) -> PyResult<MetricOptions> {
    use clap::ValueEnum;
    let tokenize = tokenize
        .map(|t| {
            cgnmt_eval::report::TokenizeArg::from_str(t, false)
                .map_err(|_| PyValueError::new_err(format!("unknown tokenize {t:?}")))
        })
        .transpose()?;
    let smooth = smooth
        .map(|t| {
            cgnmt_eval::report::SmoothArg::from_str(t, false)
                .map_err(|_| PyValueError::new_err(format!("unknown smooth {t:?}")))
        })
        .transpose()?;
    Ok(MetricOptions {
        tokenize,
        lowercase,
        lc_c: false,
        smooth,
        smooth_value,
        mteval_v11b: mteval,
        cased,
    })
}

/// References as streams (`refs[k][line]`), each as long as the hypotheses.
fn check_refs(hyps: &[String], refs: &[Vec<String>]) -> PyResult<()> {
    if refs.is_empty() {
        return Err(PyValueError::new_err("no references"));
    }
    for (k, r) in refs.iter().enumerate() {
        if r.len() != hyps.len() {
            return Err(PyValueError::new_err(format!(
                "reference stream {k} has {} lines, the hypotheses {}",
                r.len(),
                hyps.len()
            )));
        }
    }
    Ok(())
}

/// A score's signature as an object (sacreBLEU's `metric.get_signature()`): its fields in order (`nrefs`,
/// `case`, `eff`, `tok`, `smooth`, `version` for BLEU), `str()` the usual `key:value|...` line,
/// `format(short=True)` sacreBLEU's abbreviated one.
#[pyclass(frozen, module = "cgnmt.metrics")]
pub struct Signature {
    fields: Vec<(String, String)>,
}

#[pymethods]
impl Signature {
    #[new]
    fn new(text: &str) -> PyResult<Self> {
        let fields = text
            .split('|')
            .map(|part| {
                part.split_once(':')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .ok_or_else(|| {
                        PyValueError::new_err(format!(
                            "signature {text:?}: {part:?} is not key:value"
                        ))
                    })
            })
            .collect::<PyResult<_>>()?;
        Ok(Signature { fields })
    }

    /// The fields, in order, as a dict.
    #[getter]
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.fields {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn __getitem__(&self, key: &str) -> PyResult<String> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(key.to_string()))
    }

    /// The `key:value|...` line; with `short`, sacreBLEU's abbreviated keys (`#`, `c`, `e`, `tok`, `s`, `v`).
    #[pyo3(signature = (short=false))]
    fn format(&self, short: bool) -> String {
        let abbreviation = |k: &str| {
            match k {
                "nrefs" => "#",
                "case" => "c",
                "eff" => "e",
                "smooth" => "s",
                "version" => "v",
                k => k,
            }
            .to_string()
        };
        self.fields
            .iter()
            .map(|(k, v)| format!("{}:{v}", if short { abbreviation(k) } else { k.clone() }))
            .collect::<Vec<_>>()
            .join("|")
    }

    fn __str__(&self) -> String {
        self.format(false)
    }

    fn __repr__(&self) -> String {
        format!("Signature({:?})", self.format(false))
    }

    fn __eq__(&self, other: &Self) -> bool {
        self.fields == other.fields
    }
}

/// Corpus (or sentence) BLEU on the 0–100 scale with its parts: clipped n-gram `counts` and `totals` (n =
/// 1..4), `precisions`, the brevity penalty `bp`, the output's and references' lengths, and the `signature`
/// (`nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:…` or mteval-v11b's). `str()` gives the line `cgnmt
/// score` prints.
#[pyclass(frozen, get_all, module = "cgnmt.metrics")]
pub struct BLEUScore {
    pub score: f64,
    pub counts: Vec<u64>,
    pub totals: Vec<u64>,
    pub precisions: Vec<f64>,
    pub bp: f64,
    pub sys_len: usize,
    pub ref_len: usize,
    pub signature: String,
}

#[pymethods]
impl BLEUScore {
    /// The signature as an object (sacreBLEU's name).
    fn get_signature(&self) -> PyResult<Signature> {
        Signature::new(&self.signature)
    }

    fn __str__(&self) -> String {
        let ratio = if self.ref_len > 0 {
            self.sys_len as f64 / self.ref_len as f64
        } else {
            0.0
        };
        let p = &self.precisions;
        format!(
            "BLEU|{} = {:.2} {:.1}/{:.1}/{:.1}/{:.1} (BP = {:.3} ratio = {ratio:.3} hyp_len = {} ref_len = {})",
            self.signature, self.score, p[0], p[1], p[2], p[3], self.bp, self.sys_len, self.ref_len
        )
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(
            slf.as_any(),
            "BLEUScore",
            &[
                "score",
                "counts",
                "totals",
                "bp",
                "sys_len",
                "ref_len",
                "signature",
            ],
        )
    }
}

impl BLEUScore {
    fn of(b: &cgnmt_eval::bleu::BleuScore) -> PyResult<Self> {
        let v = cgnmt_eval::report::bleu_json(b);
        Ok(BLEUScore {
            score: f64_field(&v, "score")?,
            counts: parsed(&v, "counts")?,
            totals: parsed(&v, "totals")?,
            precisions: parsed(&v, "precisions")?,
            bp: f64_field(&v, "bp")?,
            sys_len: usize_field(&v, "sys_len")?,
            ref_len: usize_field(&v, "ref_len")?,
            signature: parsed(&v, "signature")?,
        })
    }
}

/// A record's field as the type it holds.
fn parsed<T: serde::de::DeserializeOwned>(v: &serde_json::Value, key: &str) -> PyResult<T> {
    serde_json::from_value(field(v, key)?.clone())
        .map_err(|e| PyValueError::new_err(format!("{key}: {e}")))
}

/// chrF (or chrF++) on the 0–100 scale, its `name` (`chrF2`, `chrF2++`) and `signature`.
#[pyclass(frozen, get_all, module = "cgnmt.metrics")]
pub struct CHRFScore {
    pub name: String,
    pub score: f64,
    pub signature: String,
}

#[pymethods]
impl CHRFScore {
    /// The signature as an object (sacreBLEU's name).
    fn get_signature(&self) -> PyResult<Signature> {
        Signature::new(&self.signature)
    }

    fn __str__(&self) -> String {
        format!("{}|{} = {:.2}", self.name, self.signature, self.score)
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(slf.as_any(), "CHRFScore", &["name", "score", "signature"])
    }
}

/// Corpus BLEU. By default sacreBLEU's (13a tokenisation, mixed case, exp smoothing, closest reference length);
/// `tokenize` one of `13a`, `intl`, `zh`, `char`, `none`, `mteval-v11b`, `mteval-v13a`, `mteval-v13a-intl`,
/// `multi-bleu`; `smooth` one of `exp`, `none`, `floor`, `add-k`. With `mteval=True`, NIST mteval-v11b.pl's
/// BLEU (the paper's metric: its tokenisation, the shortest reference length, no smoothing), case-insensitive
/// unless `lowercase=False`.
#[pyfunction]
#[pyo3(signature = (hyps, refs, mteval=false, lowercase=None, tokenize=None, smooth=None, smooth_value=None))]
pub fn bleu(
    hyps: Lines,
    refs: Refs,
    mteval: bool,
    lowercase: Option<bool>,
    tokenize: Option<String>,
    smooth: Option<String>,
    smooth_value: Option<f64>,
) -> PyResult<BLEUScore> {
    let hyps = hyps.0;
    let refs = refs.streams();
    check_refs(&hyps, &refs)?;
    let o = if mteval {
        if tokenize.is_some() || smooth.is_some() || smooth_value.is_some() {
            return Err(PyValueError::new_err(
                "mteval fixes tokenisation and smoothing; drop tokenize/smooth",
            ));
        }
        metric_options(None, false, None, None, true, lowercase == Some(false))?
    } else {
        let lc = lowercase.unwrap_or(false);
        metric_options(
            tokenize.as_deref(),
            lc,
            smooth.as_deref(),
            smooth_value,
            false,
            false,
        )?
    };
    let opts = o.bleu_options().map_err(py_err_any)?;
    let b = cgnmt_eval::corpus_bleu(&hyps, &refs, &opts)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    BLEUScore::of(&b)
}

/// A sentence-level metric's references, checked: at least one.
fn one_sentence(references: Vec<String>) -> PyResult<Vec<String>> {
    if references.is_empty() {
        return Err(PyValueError::new_err("references: at least one"));
    }
    Ok(references)
}

/// One sentence's BLEU against its references, as sacreBLEU's `sentence_bleu` computes it: 13a tokenisation,
/// exp smoothing and, by default, only the n-gram orders the hypothesis has (`use_effective_order`). Options as
/// `bleu`'s.
#[pyfunction]
#[pyo3(signature = (hypothesis, references, lowercase=false, tokenize=None, smooth=None, smooth_value=None,
    use_effective_order=true))]
pub fn sentence_bleu(
    hypothesis: String,
    references: Lines,
    lowercase: bool,
    tokenize: Option<String>,
    smooth: Option<String>,
    smooth_value: Option<f64>,
    use_effective_order: bool,
) -> PyResult<BLEUScore> {
    let refs = one_sentence(references.0)?;
    let o = metric_options(
        tokenize.as_deref(),
        lowercase,
        smooth.as_deref(),
        smooth_value,
        false,
        false,
    )?;
    let mut opts = o.bleu_options().map_err(py_err_any)?;
    opts.effective_order = use_effective_order;
    let b = cgnmt_eval::sentence_bleu(&hypothesis, &refs, &opts)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    BLEUScore::of(&b)
}

/// Corpus chrF2 (character 6-grams, β = 2), or chrF2++ (word bigrams too) with `plus_plus`, as sacreBLEU
/// computes it.
#[pyfunction]
#[pyo3(signature = (hyps, refs, plus_plus=false, lowercase=false))]
pub fn chrf(hyps: Lines, refs: Refs, plus_plus: bool, lowercase: bool) -> PyResult<CHRFScore> {
    let hyps = hyps.0;
    let refs = refs.streams();
    check_refs(&hyps, &refs)?;
    let o = metric_options(None, lowercase, None, None, false, false)?;
    let opts = o.chrf_options(plus_plus).map_err(py_err_any)?;
    let c = cgnmt_eval::chrf::corpus_chrf(&hyps, &refs, &opts)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let v = cgnmt_eval::report::chrf_json(&c);
    Ok(CHRFScore {
        name: field(&v, "name")?.as_str().unwrap_or_default().to_string(),
        score: f64_field(&v, "score")?,
        signature: field(&v, "signature")?
            .as_str()
            .unwrap_or_default()
            .to_string(),
    })
}

/// One sentence's chrF2 (chrF2++ with `plus_plus`) against its references, as sacreBLEU's `sentence_chrf`
/// computes it (the corpus statistic over one sentence).
#[pyfunction]
#[pyo3(signature = (hypothesis, references, plus_plus=false))]
pub fn sentence_chrf(
    hypothesis: String,
    references: Lines,
    plus_plus: bool,
) -> PyResult<CHRFScore> {
    let refs = one_sentence(references.0)?;
    chrf(
        Lines(vec![hypothesis]),
        Refs::Streams(refs.into_iter().map(|r| vec![r]).collect()),
        plus_plus,
        false,
    )
}

/// `compare`'s options over in-memory texts for `metric` (`bleu`, `chrf`, `chrf++`).
fn compare_options(
    metric: &str,
    (mteval, lowercase): (bool, bool),
    test: TestArg,
    seed: u64,
    (bs_samples, ar_trials): (usize, usize),
) -> PyResult<cgnmt_eval::report::CompareOptions> {
    use clap::ValueEnum;
    let metric = cgnmt_eval::report::MetricArg::from_str(metric, false).map_err(|_| {
        PyValueError::new_err(format!(
            "metric {metric:?}: one of \"bleu\", \"chrf\", \"chrf++\""
        ))
    })?;
    Ok(cgnmt_eval::report::CompareOptions {
        baseline: PathBuf::from("baseline"),
        systems: vec![PathBuf::from("system")],
        refs: vec![],
        test,
        seed,
        metrics: vec![metric],
        opts: metric_options(None, lowercase && !mteval, None, None, mteval, false)?,
        bs_samples,
        ar_trials,
        json: true,
    })
}

/// The first record of the comparison report that `work` computes (with the GIL released), as JSON.
fn first_record<R>(
    py: Python<'_>,
    work: impl FnOnce() -> anyhow::Result<R> + Send,
) -> PyResult<serde_json::Value>
where
    R: Send,
    serde_json::Value: From<R>,
{
    let report = py.allow_threads(|| guarded(|| work().map_err(py_err_any)))?;
    let records = serde_json::Value::from(report);
    records
        .get(0)
        .cloned()
        .ok_or_else(|| PyValueError::new_err("no comparison"))
}

/// A paired significance test of a system against a baseline on one metric: both corpus scores, the paired
/// bootstrap (`bootstrap`: the system's mean and 95% interval, `p_value`), approximate randomisation (`ar`:
/// `p_value`) and the sign test (`sign`: sentences better, worse, tied, `p_value`), each `None` when not run,
/// the metric's `signature`, and the whole `record` as `cgnmt compare --json` writes it.
#[pyclass(frozen, get_all, module = "cgnmt.metrics")]
pub struct Comparison {
    pub metric: String,
    pub signature: String,
    pub baseline_score: f64,
    pub score: f64,
    pub bootstrap: PyObject,
    pub ar: PyObject,
    pub sign: PyObject,
    pub seed: u64,
    pub record: PyObject,
}

#[pymethods]
impl Comparison {
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(
            slf.as_any(),
            "Comparison",
            &[
                "metric",
                "baseline_score",
                "score",
                "bootstrap",
                "ar",
                "sign",
            ],
        )
    }
}

fn text_field(v: &serde_json::Value, key: &str) -> PyResult<String> {
    Ok(field(v, key)?.as_str().unwrap_or_default().to_string())
}

/// A paired significance test of `system` against `baseline` (`test`: `"bootstrap"` (Koehn 2004, as
/// sacreBLEU's `--paired-bs`), `"ar"` (approximate randomisation), `"sign"` (Collins et al. 2005) or `"all"`)
/// on `metric` (`"bleu"`, `"chrf"`, `"chrf++"`). The seed, resamples and trials default to `cgnmt compare`'s.
#[pyfunction]
#[pyo3(signature = (baseline, system, refs, test="bootstrap", metric="bleu", mteval=false, lowercase=false,
    seed=None, bs_samples=None, ar_trials=None))]
#[allow(clippy::too_many_arguments)]
pub fn compare(
    py: Python<'_>,
    baseline: Lines,
    system: Lines,
    refs: Refs,
    test: &str,
    metric: &str,
    mteval: bool,
    lowercase: bool,
    seed: Option<u64>,
    bs_samples: Option<usize>,
    ar_trials: Option<usize>,
) -> PyResult<Comparison> {
    let (baseline, system) = (baseline.0, system.0);
    let refs = refs.streams();
    check_refs(&baseline, &refs)?;
    check_refs(&system, &refs)?;
    let test = match test {
        "bootstrap" | "bs" => TestArg::Bs,
        "ar" => TestArg::Ar,
        "sign" => TestArg::Sign,
        "all" => TestArg::All,
        t => {
            return Err(PyValueError::new_err(format!(
                "test {t:?}: one of \"bootstrap\", \"ar\", \"sign\", \"all\""
            )))
        }
    };
    let trials = (
        bs_samples.unwrap_or(DEFAULT_BS_SAMPLES),
        ar_trials.unwrap_or(DEFAULT_AR_TRIALS),
    );
    let opts = compare_options(
        metric,
        (mteval, lowercase),
        test,
        seed.unwrap_or(DEFAULT_SEED),
        trials,
    )?;
    let r = &first_record(py, || {
        cgnmt_eval::report::compare_systems(
            &opts,
            &("baseline".to_string(), baseline),
            &[("system".to_string(), system)],
            &refs,
        )
        .map(|r| r.0)
    })?;
    let row = field(r, "systems")?
        .get(0)
        .ok_or_else(|| PyValueError::new_err("no system"))?;
    Ok(Comparison {
        metric: text_field(r, "metric")?,
        signature: text_field(r, "signature")?,
        baseline_score: f64_field(field(r, "baseline")?, "score")?,
        score: f64_field(row, "score")?,
        bootstrap: json_to_py(py, field(row, "bootstrap")?)?,
        ar: json_to_py(py, field(row, "ar")?)?,
        sign: json_to_py(py, field(row, "sign")?)?,
        seed: field(r, "seed")?.as_u64().unwrap_or_default(),
        record: json_to_py(py, r)?,
    })
}

/// A system trained with several seeds against a baseline trained with several (Clark et al. 2011): each
/// run's corpus score (`base_scores`, `sys_scores`), their means, MultEval's `s_opt` (standard deviation across
/// runs) and `s_sel` (within the test set) per system, Welch's t-test over the runs (`welch`: `delta`, `t`,
/// `df`, `p_value`; `None` with one run a side), the permutation of the runs' labels (`permutation`), the
/// bootstrap over runs and sentences (`run_bootstrap`: `delta`, 95% `ci_low`/`ci_high`, `p_value`), the paired
/// bootstrap over the runs' pooled sentences (`pooled_p`), the runs a side that would detect the difference
/// (`runs_needed`), and `significant`: both the pooled bootstrap and Welch's test below 0.05.
#[pyclass(frozen, get_all, module = "cgnmt.metrics")]
pub struct RunsComparison {
    pub metric: String,
    pub base_scores: Vec<f64>,
    pub sys_scores: Vec<f64>,
    pub base_mean: f64,
    pub sys_mean: f64,
    pub base_s_opt: f64,
    pub sys_s_opt: f64,
    pub base_s_sel: f64,
    pub sys_s_sel: f64,
    pub welch: PyObject,
    pub permutation: PyObject,
    pub run_bootstrap: PyObject,
    pub pooled_p: f64,
    pub runs_needed: Option<u64>,
    pub significant: bool,
    pub record: PyObject,
}

#[pymethods]
impl RunsComparison {
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(
            slf.as_any(),
            "RunsComparison",
            &[
                "metric",
                "base_scores",
                "sys_scores",
                "pooled_p",
                "significant",
            ],
        )
    }
}

/// Outputs, one per seed: a list of lists of lines.
fn runs(name: &str, x: &Bound<'_, PyAny>, refs: &[Vec<String>]) -> PyResult<Vec<Vec<String>>> {
    if x.is_instance_of::<pyo3::types::PyString>() || x.is_instance_of::<pyo3::types::PyBytes>() {
        return Err(PyTypeError::new_err(
            "baseline_runs and system_runs are lists of outputs, one per seed",
        ));
    }
    let r: Vec<Vec<String>> = x.extract()?;
    if r.is_empty() {
        return Err(PyValueError::new_err(format!("{name}: at least one run")));
    }
    for run in &r {
        check_refs(run, refs)?;
    }
    Ok(r)
}

/// Significance that counts training variance: `system_runs` (one output per seed) against `baseline_runs` on
/// `metric`, as `cgnmt compare A1,A2,A3 B1,B2,B3` reports it. A difference is called significant only when the
/// paired bootstrap over the pooled runs and Welch's t-test over the runs' scores both give p < 0.05.
#[pyfunction]
#[pyo3(signature = (baseline_runs, system_runs, refs, metric="bleu", mteval=false, lowercase=false, seed=None,
    bs_samples=None))]
#[allow(clippy::too_many_arguments)]
pub fn compare_runs(
    py: Python<'_>,
    baseline_runs: &Bound<'_, PyAny>,
    system_runs: &Bound<'_, PyAny>,
    refs: Refs,
    metric: &str,
    mteval: bool,
    lowercase: bool,
    seed: Option<u64>,
    bs_samples: Option<usize>,
) -> PyResult<RunsComparison> {
    let refs = refs.streams();
    let base = runs("baseline_runs", baseline_runs, &refs)?;
    let sys = runs("system_runs", system_runs, &refs)?;
    let trials = (bs_samples.unwrap_or(DEFAULT_BS_SAMPLES), 1);
    let opts = compare_options(
        metric,
        (mteval, lowercase),
        TestArg::Bs,
        seed.unwrap_or(DEFAULT_SEED),
        trials,
    )?;
    let r = &first_record(py, || {
        cgnmt_eval::report::compare_system_runs(
            &opts,
            &("baseline".to_string(), base),
            &[("system".to_string(), sys)],
            &refs,
        )
        .map(|r| r.0)
    })?;
    let c = field(r, "runs")?;
    let pooled = field(field(r, "pooled")?, "systems")?
        .get(0)
        .and_then(|s| s.get("bootstrap"))
        .ok_or_else(|| PyValueError::new_err("no pooled bootstrap"))?;
    Ok(RunsComparison {
        metric: text_field(r, "metric")?,
        base_scores: parsed(c, "base_scores")?,
        sys_scores: parsed(c, "sys_scores")?,
        base_mean: f64_field(c, "base_mean")?,
        sys_mean: f64_field(c, "sys_mean")?,
        base_s_opt: f64_field(c, "base_s_opt")?,
        sys_s_opt: f64_field(c, "sys_s_opt")?,
        base_s_sel: f64_field(c, "base_s_sel")?,
        sys_s_sel: f64_field(c, "sys_s_sel")?,
        welch: json_to_py(py, field(c, "welch")?)?,
        permutation: json_to_py(py, field(c, "permutation")?)?,
        run_bootstrap: json_to_py(py, field(c, "bootstrap")?)?,
        pooled_p: f64_field(pooled, "p_value")?,
        runs_needed: field(c, "runs_needed")?.as_u64(),
        significant: field(r, "significant")?.as_bool().unwrap_or(false),
        record: json_to_py(py, r)?,
    })
}

/// Alignment error rate (0–1) with precision, recall and the link counts (`a` predicted, `s` sure, `p`
/// possible, `a_and_s`, `a_and_p`); with soft matrices also `saer` (micro) and `saer_macro`.
#[pyclass(frozen, get_all, module = "cgnmt.metrics")]
pub struct AERScore {
    pub aer: f64,
    pub precision: f64,
    pub recall: f64,
    pub a: usize,
    pub s: usize,
    pub p: usize,
    pub a_and_s: usize,
    pub a_and_p: usize,
    pub sentences: usize,
    pub saer: Option<f64>,
    pub saer_macro: Option<f64>,
}

#[pymethods]
impl AERScore {
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(
            slf.as_any(),
            "AERScore",
            &["aer", "precision", "recall", "sentences", "saer"],
        )
    }
}

/// Alignment error rate of predicted links against gold ones, both as `.talp` lines (one per sentence pair:
/// `i-j` a sure link, `i?j` a possible one, 0-based), and, with `soft` (per pair a `[target words][source
/// words]` matrix, e.g. `cgnmt.Alignment.attention`), the soft AER. Without `pred`, the soft matrices' row-wise
/// argmax links are scored.
#[pyfunction]
#[pyo3(signature = (gold, pred=None, soft=None))]
pub fn aer(
    gold: Lines,
    pred: Option<Lines>,
    soft: Option<Vec<Vec<Vec<f64>>>>,
) -> PyResult<AERScore> {
    use cgnmt_eval::aer as A;
    let value_err = |e: cgnmt_eval::EvalError| PyValueError::new_err(e.to_string());
    let gold = A::parse_gold(&(gold.0.join("\n") + "\n"), Path::new("gold")).map_err(value_err)?;
    let pred = match (pred, &soft) {
        (Some(p), _) => {
            A::parse_pred(&(p.0.join("\n") + "\n"), Path::new("pred")).map_err(value_err)?
        }
        (None, Some(s)) => A::argmax_links(s),
        (None, None) => return Err(PyValueError::new_err("give pred and/or soft")),
    };
    if pred.len() != gold.len() || soft.as_ref().is_some_and(|s| s.len() != gold.len()) {
        return Err(PyValueError::new_err(format!(
            "{} gold sentences, {} predicted{}",
            gold.len(),
            pred.len(),
            soft.as_ref()
                .map_or(String::new(), |s| format!(", {} soft", s.len()))
        )));
    }
    let (v, _) = cgnmt_eval::report::aer_report(&gold, &pred, soft.as_deref(), "soft")
        .map_err(py_err_any)?;
    Ok(AERScore {
        aer: f64_field(&v, "aer")?,
        precision: f64_field(&v, "precision")?,
        recall: f64_field(&v, "recall")?,
        a: usize_field(&v, "a")?,
        s: usize_field(&v, "s")?,
        p: usize_field(&v, "p")?,
        a_and_s: usize_field(&v, "a_and_s")?,
        a_and_p: usize_field(&v, "a_and_p")?,
        sentences: usize_field(&v, "sentences")?,
        saer: v.get("saer").and_then(serde_json::Value::as_f64),
        saer_macro: v.get("saer_macro").and_then(serde_json::Value::as_f64),
    })
}
