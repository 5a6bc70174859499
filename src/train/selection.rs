//! Model selection on dev: which model a training run ships, and with which decoding penalties.
//!
//! The rules (used by `cgnmt demo`, `cgnmt average --run` and `reproduce` rows with `choose = true`):
//! - **The converged tail.** Of a run's kept checkpoints (`ckpt-STEP/`, `train.keep_checkpoints`), an average
//!   takes only those whose dev score at their evaluation (`train.select_by`) is within a tolerance (default
//!   [`DEFAULT_TOLERANCE`] points) of the run's best. A checkpoint saved between evaluations has no dev score
//!   and is left out. Early checkpoints of a short run, far below the best, so never enter the average.
//! - **Candidates scored on dev.** `best/` (the best evaluation), the average of the tail (when it has two
//!   or more checkpoints) and the parameters' moving average (`smoothed/`, `train.exponential_smoothing`)
//!   are decoded on the whole dev set with the same settings; another candidate replaces `best/` only when
//!   it scores strictly higher, so the shipped model never scores below `best/` on dev.
//! - **Penalties chosen on dev.** The chosen model decodes dev over a small grid of GNMT length (α) and
//!   coverage (β) penalties ([`PENALTY_GRID`]); the recipe's own pair is scored first and another pair
//!   replaces it only when strictly better.
//!
//! Everything here is deterministic for a given run: the same run gives the same choice on any machine
//! that trained it to the same parameters.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};

use crate::config::SelectBy;
use crate::decode::beam_search::DecodeOptions;
use crate::decode::translate::Pipeline;
use crate::model::store;
use crate::train::checkpoint::{self, EvalRecord};

/// How far (in points of the selection score) below the run's best dev score a kept checkpoint may be and
/// still enter the average.
pub const DEFAULT_TOLERANCE: f64 = 1.0;

/// The (length penalty α, coverage penalty β) pairs tried on dev; `(0, 0)` is the paper's plain beam search.
pub const PENALTY_GRID: [(f64, f64); 10] = [
    (0.0, 0.0),
    (1.0, 0.0),
    (1.0, 0.2),
    (1.0, 0.4),
    (1.5, 0.0),
    (1.5, 0.2),
    (1.5, 0.4),
    (2.0, 0.0),
    (2.0, 0.2),
    (2.0, 0.4),
];

/// The dev score `by` names in an evaluation record (`None` when the record predates it).
fn score_of(r: &EvalRecord, by: SelectBy) -> Option<f64> {
    match by {
        SelectBy::Bleu => Some(r.dev_bleu),
        SelectBy::SmoothedBleu => r.dev_bleu_smoothed,
        SelectBy::Chrf => r.dev_chrf,
    }
}

fn metric_name(by: SelectBy) -> &'static str {
    match by {
        SelectBy::Bleu => "dev BLEU",
        SelectBy::SmoothedBleu => "smoothed dev BLEU",
        SelectBy::Chrf => "dev chrF",
    }
}

/// One kept checkpoint and its dev score at its evaluation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TailEntry {
    pub dir: PathBuf,
    pub step: u64,
    /// The selection score of the evaluation at `step` (`None`: saved between evaluations).
    pub score: Option<f64>,
    pub taken: bool,
}

/// The converged-tail rule applied to a run's kept checkpoints.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Tail {
    pub entries: Vec<TailEntry>,
    /// The run's best selection score and the update that scored it.
    pub best: f64,
    pub best_step: u64,
    pub tolerance: f64,
    pub metric: &'static str,
}

impl Tail {
    /// The checkpoints the rule takes, oldest first.
    pub fn taken(&self) -> Vec<PathBuf> {
        self.entries
            .iter()
            .filter(|e| e.taken)
            .map(|e| e.dir.clone())
            .collect()
    }

    /// One line per kept checkpoint: its score and whether it is averaged, and why.
    pub fn describe(&self) -> String {
        let floor = self.best - self.tolerance;
        let mut s = format!(
            "the run's best {} is {:.2} (update {}); checkpoints within {} of it ({:.2} or more) are averaged:\n",
            self.metric, self.best, self.best_step, self.tolerance, floor
        );
        for e in &self.entries {
            let why = match e.score {
                None => "no evaluation at this update: left out".to_string(),
                Some(v) if e.taken => format!("{v:.2}: averaged"),
                Some(v) => format!("{v:.2}: {:.2} below the best, left out", self.best - v),
            };
            s += &format!("  update {:>7}  {why}\n", e.step);
        }
        s
    }
}

/// The converged tail among the last `last` kept checkpoints of the run in `run` (0: all kept): those whose
/// dev score is within `tolerance` of the run's best.
pub fn converged_tail(run: &Path, last: usize, tolerance: f64) -> Result<Tail> {
    if !(tolerance >= 0.0) {
        bail!("the tolerance must be a non-negative number of points, not {tolerance}");
    }
    let last_dir = store::complete_dir(&run.join("last")).with_context(|| {
        format!(
            "{}: no complete last/ checkpoint (is it a training run directory?)",
            run.display()
        )
    })?;
    let state = checkpoint::load_state(&last_dir)?;
    let by = crate::config::Config::load(Some(&last_dir.join(store::CONFIG_FILE)), &[])?
        .train
        .select_by;
    let (best_step, best) = state
        .history
        .iter()
        .filter_map(|r| score_of(r, by).map(|s| (r.step, s)))
        .fold(None, |acc: Option<(u64, f64)>, (st, s)| match acc {
            Some((_, b)) if b >= s => acc,
            _ => Some((st, s)),
        })
        .with_context(|| {
            format!(
                "{}: the run has no dev evaluation to select checkpoints by",
                run.display()
            )
        })?;
    let kept = checkpoint::kept_checkpoints(run)?;
    let kept = &kept[kept
        .len()
        .saturating_sub(if last == 0 { kept.len() } else { last })..];
    let mut entries = vec![];
    for dir in kept {
        let step: u64 = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("ckpt-"))
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("{}: not a ckpt-STEP directory", dir.display()))?;
        let score = state
            .history
            .iter()
            .rev()
            .find(|r| r.step == step)
            .and_then(|r| score_of(r, by));
        entries.push(TailEntry {
            dir: dir.clone(),
            step,
            score,
            taken: score.is_some_and(|s| s >= best - tolerance),
        });
    }
    Ok(Tail {
        entries,
        best,
        best_step,
        tolerance,
        metric: metric_name(by),
    })
}

/// A dev set as training reads it: the prepared, tokenised source and the detokenised references.
pub struct DevSet {
    pub src: Vec<String>,
    pub refs: Vec<String>,
}

impl DevSet {
    /// `dev.src` and `dev.ref` of a prepared-data directory.
    pub fn load(prepared: &Path) -> Result<DevSet> {
        let read = |f: &str| {
            let p = prepared.join(f);
            cgnmt_data::corpus::read_lines(&p).with_context(|| {
                format!(
                    "{}: model selection needs the dev set ({f}; `cgnmt prepare --dev-src … --dev-tgt …`)",
                    prepared.display()
                )
            })
        };
        let (src, refs) = (read("dev.src")?, read("dev.ref")?);
        if src.len() != refs.len() || src.is_empty() {
            bail!(
                "{}: dev.src has {} lines and dev.ref {}; model selection needs a non-empty, aligned dev set",
                prepared.display(),
                src.len(),
                refs.len()
            );
        }
        Ok(DevSet { src, refs })
    }

    /// `n` evenly spaced sentences (dev sets are often sorted by length; a prefix would hold the shortest);
    /// all when `n` is 0 or at least the set's size.
    pub fn subset(self, n: usize) -> DevSet {
        if n == 0 || n >= self.src.len() {
            return self;
        }
        let pick: Vec<usize> = (0..n).map(|k| k * self.src.len() / n).collect();
        DevSet {
            src: pick.iter().map(|&i| self.src[i].clone()).collect(),
            refs: pick.iter().map(|&i| self.refs[i].clone()).collect(),
        }
    }

    /// The pairs whose reference has more than `words` words (split on whitespace): dev's longer sentences,
    /// to choose penalties that do not leave long outputs short. All with `words` 0.
    pub fn longer_than(&self, words: usize) -> Result<DevSet> {
        if words == 0 {
            return Ok(DevSet {
                src: self.src.clone(),
                refs: self.refs.clone(),
            });
        }
        let keep: Vec<usize> = (0..self.refs.len())
            .filter(|&i| self.refs[i].split_whitespace().count() > words)
            .collect();
        if keep.is_empty() {
            bail!(
                "no dev pair has a reference longer than {words} words (of {}): choose a smaller length",
                self.refs.len()
            );
        }
        Ok(DevSet {
            src: keep.iter().map(|&i| self.src[i].clone()).collect(),
            refs: keep.iter().map(|&i| self.refs[i].clone()).collect(),
        })
    }
}

/// How the penalties are chosen on dev (`cgnmt select --tune`): on which pairs, and under which constraint on
/// the output's length.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Tuning {
    /// Choose on the dev pairs whose reference has more than this many words (0: all dev).
    pub longer_than: usize,
    /// Choose among the pairs of the grid whose output/reference length ratio (mteval-v11b tokens, on the
    /// tuning pairs) lies in `[low, high]` (the highest BLEU among them); when none does, the pair whose
    /// ratio lies nearest to the interval. `None`: the highest BLEU.
    pub length_ratio: Option<(f64, f64)>,
}

impl Tuning {
    /// A pair's distance from the length-ratio interval (0 inside it, or without one).
    fn ratio_miss(&self, ratio: f64) -> f64 {
        match self.length_ratio {
            Some((lo, _)) if ratio < lo => lo - ratio,
            Some((_, hi)) if ratio > hi => ratio - hi,
            _ => 0.0,
        }
    }

    /// The grid point chosen: the nearest to the length-ratio interval (0 for every point inside it), then the
    /// highest BLEU; the first (the recipe's own pair) wins ties.
    pub fn choose(&self, grid: &[GridPoint]) -> usize {
        let mut k = 0;
        for (i, g) in grid.iter().enumerate() {
            let (miss, best_miss) = (self.ratio_miss(g.3), self.ratio_miss(grid[k].3));
            if miss < best_miss || (miss == best_miss && g.2 > grid[k].2) {
                k = i;
            }
        }
        k
    }
}

/// One point of the penalty grid: `(α, β, dev BLEU, output/reference length ratio)` on the tuning pairs.
pub type GridPoint = (f64, f64, f64, f64);

/// A model directory loaded once, to decode dev with several settings.
pub struct DevDecoder {
    lm: store::LoadedModel,
    model: crate::model::Model,
}

impl DevDecoder {
    pub fn load(dir: &Path) -> Result<DevDecoder> {
        let lm = store::load(dir, DType::F32, &Device::Cpu)?;
        let model = lm.model.frozen(&lm.varmap)?;
        Ok(DevDecoder { lm, model })
    }

    /// mteval-v11b case-insensitive BLEU of the dev set decoded with `opts`.
    pub fn bleu(&self, dev: &DevSet, opts: &DecodeOptions) -> Result<f64> {
        Ok(self.bleu_and_ratio(dev, opts)?.0)
    }

    /// mteval-v11b case-insensitive BLEU of the dev set decoded with `opts`, and the output/reference length
    /// ratio in its tokens (0 when BLEU cannot be computed).
    pub fn bleu_and_ratio(&self, dev: &DevSet, opts: &DecodeOptions) -> Result<(f64, f64)> {
        let tr = Pipeline::of(&self.model, &self.lm);
        let out = tr.translate(&dev.src, opts, 32, true, |_| {})?;
        let hyps: Vec<String> = out.into_iter().map(|t| t.text).collect();
        let v11b = cgnmt_eval::bleu::BleuOptions::mteval_v11b();
        Ok(
            match cgnmt_eval::bleu::corpus_bleu(&hyps, &[dev.refs.clone()], &v11b) {
                Ok(s) if s.ref_len > 0 => (s.score, s.sys_len as f64 / s.ref_len as f64),
                Ok(s) => (s.score, 0.0),
                Err(_) => (0.0, 0.0),
            },
        )
    }
}

/// A candidate model and its dev BLEU.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Scored {
    pub name: String,
    pub dir: PathBuf,
    pub dev_bleu: f64,
    /// Output/reference length ratio on dev (mteval-v11b tokens).
    pub length_ratio: f64,
}

/// Index of the highest score; a later entry replaces an earlier one only when strictly higher, so the
/// first (the reference: `best/`, or the recipe's penalties) wins ties.
pub fn first_best(scores: &[f64]) -> usize {
    let mut k = 0;
    for (i, &s) in scores.iter().enumerate() {
        if s > scores[k] {
            k = i;
        }
    }
    k
}

/// The candidates of a finished run: `best/`, then the average of its converged tail among the last `last`
/// kept checkpoints (written to `RUN/averaged/` when it has two or more), then `smoothed/` if the run has
/// one. Returns them with the tail that was considered.
pub fn candidates(
    run: &Path,
    last: usize,
    tolerance: f64,
) -> Result<(Vec<(String, PathBuf)>, Option<Tail>)> {
    let mut c = vec![("best".to_string(), run.join("best"))];
    let tail = if checkpoint::kept_checkpoints(run)?.is_empty() {
        None
    } else {
        Some(converged_tail(run, last, tolerance)?)
    };
    if let Some(t) = &tail {
        let taken = t.taken();
        if taken.len() >= 2 {
            let out = run.join("averaged");
            crate::train::averaging::average(&taken, &out)?;
            c.push((format!("average of {}", taken.len()), out));
        }
    }
    let smoothed = run.join(crate::train::SMOOTHED_DIR);
    if store::complete_dir(&smoothed).is_some() {
        c.push(("moving average".to_string(), smoothed));
    }
    Ok((c, tail))
}

/// What [`select`] chose, with every score it saw (written as `RUN/selection.json`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Selection {
    /// The kept checkpoints considered for the average, with their dev scores and the rule's verdicts.
    pub tail: Option<Tail>,
    pub candidates: Vec<Scored>,
    pub chosen: usize,
    /// The settings the candidates were compared with.
    pub compared_with: (f64, f64),
    /// `(α, β, dev BLEU, length ratio)` of the chosen model over the grid, on the tuning pairs (empty without
    /// tuning).
    pub grid: Vec<GridPoint>,
    /// How the penalties were chosen (`None` without tuning).
    pub tuning: Option<Tuning>,
    /// The dev pairs the penalties were chosen on.
    pub tuning_sentences: usize,
    pub length_penalty: f64,
    pub coverage_penalty: f64,
    pub dev_sentences: usize,
    pub beam: usize,
}

impl Selection {
    pub fn model(&self) -> &Path {
        &self.candidates[self.chosen].dir
    }

    /// The chosen model's dev BLEU with the chosen penalties.
    pub fn dev_bleu(&self) -> f64 {
        self.grid
            .iter()
            .find(|g| (g.0, g.1) == (self.length_penalty, self.coverage_penalty))
            .map_or(self.candidates[self.chosen].dev_bleu, |g| g.2)
    }

    /// The decoding options chosen (the base options with the chosen penalties).
    pub fn decode_options(&self, base: &DecodeOptions) -> DecodeOptions {
        DecodeOptions {
            length_penalty: self.length_penalty,
            coverage_penalty: self.coverage_penalty,
            ..base.clone()
        }
    }
}

/// Score the candidates on dev with `base` and keep the best (`best/` unless another is strictly better),
/// then, with `tune`, choose the chosen model's penalties on dev from [`PENALTY_GRID`] (`base`'s own pair
/// unless another is better by the tuning's rule, [`Tuning::choose`]). `say` receives a line per result as it
/// comes.
pub fn select(
    cands: &[(String, PathBuf)],
    dev: &DevSet,
    base: &DecodeOptions,
    tune: Option<&Tuning>,
    mut say: impl FnMut(&str),
) -> Result<Selection> {
    // The tuning pairs, checked before any decoding.
    let tuning_set = match tune {
        Some(t) if t.longer_than > 0 => Some(dev.longer_than(t.longer_than)?),
        _ => None,
    };
    let mut scored = vec![];
    let mut chosen_decoder = None;
    let mut best_score = f64::NEG_INFINITY;
    for (name, dir) in cands {
        let d = DevDecoder::load(dir)?;
        let (bleu, length_ratio) = d.bleu_and_ratio(dev, base)?;
        say(&format!(
            "  {name:<16} {bleu:6.2}  (length ratio {length_ratio:.3}; {})",
            dir.display()
        ));
        if scored.is_empty() || bleu > best_score {
            best_score = bleu;
            chosen_decoder = Some(d);
        }
        scored.push(Scored {
            name: name.clone(),
            dir: dir.clone(),
            dev_bleu: bleu,
            length_ratio,
        });
    }
    let chosen = first_best(&scored.iter().map(|s| s.dev_bleu).collect::<Vec<_>>());
    let base_pair = (base.length_penalty, base.coverage_penalty);
    let mut grid = vec![];
    let (mut alpha, mut beta) = base_pair;
    let tuning_sentences = tuning_set.as_ref().map_or(dev.src.len(), |t| t.src.len());
    if let Some(t) = tune {
        let d = chosen_decoder.expect("at least one candidate");
        let on = tuning_set.as_ref().unwrap_or(dev);
        say(&format!(
            "  the length and coverage penalties of {} (BLEU and output/reference length on {}{}):",
            scored[chosen].name,
            if t.longer_than > 0 {
                format!(
                    "the {tuning_sentences} dev pairs longer than {} words",
                    t.longer_than
                )
            } else {
                "dev".to_string()
            },
            t.length_ratio.map_or(String::new(), |(lo, hi)| format!(
                "; the length ratio to lie in [{lo}, {hi}]"
            ))
        ));
        let own = if tuning_set.is_some() {
            d.bleu_and_ratio(on, base)?
        } else {
            (scored[chosen].dev_bleu, scored[chosen].length_ratio)
        };
        grid.push((base_pair.0, base_pair.1, own.0, own.1));
        for &(a, b) in PENALTY_GRID.iter().filter(|&&p| p != base_pair) {
            let opts = DecodeOptions {
                length_penalty: a,
                coverage_penalty: b,
                ..base.clone()
            };
            let (bleu, ratio) = d.bleu_and_ratio(on, &opts)?;
            say(&format!(
                "  α {a:.1}  β {b:.1}   {bleu:6.2}  (length ratio {ratio:.3})"
            ));
            grid.push((a, b, bleu, ratio));
        }
        let k = t.choose(&grid);
        (alpha, beta) = (grid[k].0, grid[k].1);
    }
    Ok(Selection {
        tail: None,
        candidates: scored,
        chosen,
        compared_with: base_pair,
        grid,
        tuning: tune.copied(),
        tuning_sentences: if tune.is_some() { tuning_sentences } else { 0 },
        length_penalty: alpha,
        coverage_penalty: beta,
        dev_sentences: dev.src.len(),
        beam: base.beam,
    })
}

/// File a run's selection is written to.
pub const SELECTION_FILE: &str = "selection.json";

/// Choose a finished run's model (and with `tune` its penalties) on dev, printing every candidate's score,
/// the tail rule's reasons and the choice to stderr; writes the selection to `record`.
pub fn choose_for_run(
    run: &Path,
    last: usize,
    tolerance: f64,
    base: &DecodeOptions,
    tune: Option<&Tuning>,
    dev_sentences: usize,
    prepared: Option<&Path>,
    record: &Path,
) -> Result<Selection> {
    let last_dir = store::complete_dir(&run.join("last")).with_context(|| {
        format!(
            "{}: no complete last/ checkpoint (not a training run?)",
            run.display()
        )
    })?;
    if store::complete_dir(&run.join("best")).is_none() {
        bail!("{}: no best/ model (has the run finished?)", run.display());
    }
    let prepared = match prepared {
        Some(p) => p.to_path_buf(),
        None => {
            crate::config::Config::load(Some(&last_dir.join(store::CONFIG_FILE)), &[])?
                .data
                .prepared
        }
    };
    let (cands, tail) = candidates(run, last, tolerance)?;
    if let Some(t) = &tail {
        eprint!(
            "== the last {} kept checkpoints: {}",
            t.entries.len(),
            t.describe()
        );
    }
    let dev = DevSet::load(&prepared)?.subset(dev_sentences);
    eprintln!(
        "== choosing the model on dev ({} sentences, beam {}, α = {}, β = {}; dev BLEU):",
        dev.src.len(),
        base.beam,
        base.length_penalty,
        base.coverage_penalty
    );
    let mut sel = select(&cands, &dev, base, tune, |l| eprintln!("{l}"))?;
    sel.tail = tail;
    let chosen = &sel.candidates[sel.chosen];
    eprintln!(
        "   chosen: {} ({:.2}){}",
        chosen.name,
        chosen.dev_bleu,
        if sel.chosen == 0 {
            " — no other candidate scores higher than best/ on dev".to_string()
        } else {
            format!(
                " — {:+.2} over best/ on dev",
                chosen.dev_bleu - sel.candidates[0].dev_bleu
            )
        }
    );
    if tune.is_some() {
        let ratio = sel
            .grid
            .iter()
            .find(|g| (g.0, g.1) == (sel.length_penalty, sel.coverage_penalty))
            .map_or(0.0, |g| g.3);
        eprintln!(
            "   chosen: α = {}, β = {} (BLEU {:.2}, length ratio {ratio:.3}){}",
            sel.length_penalty,
            sel.coverage_penalty,
            sel.dev_bleu(),
            if (sel.length_penalty, sel.coverage_penalty) == sel.compared_with {
                " — no other pair of the grid is better"
            } else {
                ""
            }
        );
    }
    crate::atomic_file::write_atomic(record, serde_json::to_string_pretty(&sel)?.as_bytes())?;
    if tune.is_some() {
        // The penalties travel with the chosen model: every front end decodes it with them by default.
        crate::decode::settings::DecodingSettings {
            length_penalty: sel.length_penalty,
            coverage_penalty: sel.coverage_penalty,
            beam: sel.beam,
            dev_bleu: sel.dev_bleu(),
            dev_sentences: sel.tuning_sentences,
        }
        .write(sel.model(), "cgnmt select --tune")?;
        eprintln!(
            "   written to {}",
            sel.model()
                .join(crate::decode::settings::SETTINGS_FILE)
                .display()
        );
    }
    Ok(sel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_keep_the_reference() {
        assert_eq!(first_best(&[20.0, 20.0, 19.0]), 0);
        assert_eq!(first_best(&[20.0, 20.5, 20.5]), 1);
        assert_eq!(first_best(&[20.0, 19.0, 21.0]), 2);
    }

    #[test]
    fn a_length_ratio_interval_comes_before_bleu() {
        let grid = [
            (0.0, 0.0, 30.0, 0.90),
            (1.0, 0.0, 29.0, 0.96),
            (1.5, 0.0, 29.5, 1.00),
            (2.0, 0.0, 29.5, 1.04),
            (2.0, 0.4, 31.0, 1.10),
        ];
        // Without an interval: the highest BLEU; within one: the highest BLEU inside it, the first on ties.
        assert_eq!(Tuning::default().choose(&grid), 4);
        let t = Tuning {
            longer_than: 6,
            length_ratio: Some((0.95, 1.05)),
        };
        assert_eq!(t.choose(&grid), 2);
        // None inside: the nearest to it (BLEU breaks ties of distance).
        let outside = [
            (0.0, 0.0, 30.0, 0.80),
            (1.0, 0.0, 25.0, 0.92),
            (2.0, 0.0, 28.0, 1.08),
        ];
        assert_eq!(t.choose(&outside), 1);
        let exact = Tuning {
            longer_than: 0,
            length_ratio: Some((1.0, 1.0)),
        };
        assert_eq!(
            exact.choose(&[(0.0, 0.0, 30.0, 0.5), (1.0, 0.0, 31.0, 1.5)]),
            1
        );
        // The recipe's own pair (the first) wins a tie.
        assert_eq!(t.choose(&[(0.0, 0.0, 30.0, 1.0), (1.0, 0.0, 30.0, 1.0)]), 0);
    }
}
