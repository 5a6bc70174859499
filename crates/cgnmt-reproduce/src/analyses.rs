//! What the report shows, computed from the run files: each run's scores, each row's mean ± sd and its
//! significance against its baseline, the stability of the ranking, and the paper's analyses. Everything here
//! is written to `results.json`; the report is rendered from that structure only.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use cgnmt_eval::analysis::{self, word_count, DumpRecord, LengthGroups};
use cgnmt_eval::bleu::{corpus_bleu, BleuOptions};
use cgnmt_eval::significance::{self, Metric};
use serde::{Deserialize, Serialize};

use super::plan::slug;
use super::{read_result, run_child, Clock, RunResult, Setup, Task, Timing};
pub use crate::results::*;
use cgnmt::model::store;
use cgnmt::train::checkpoint;

/// Bootstrap resamples and randomisation trials of the significance tests.
pub const BOOTSTRAP_SAMPLES: usize = 1000;
pub const AR_TRIALS: usize = 10000;

/// Score a finished run's test output and read its training state.
pub fn score_run(
    s: &Setup,
    t: &Task,
    run: &Path,
    best: &Path,
    timing: &Timing,
) -> Result<RunResult> {
    let hyps = cgnmt_data::corpus::read_lines(&t.dir.join("test.hyp"))?;
    let refs = read_refs(s)?;
    let v11b = corpus_bleu(&hyps, &refs, &BleuOptions::mteval_v11b())?;
    let sacre_opts = BleuOptions::sacrebleu();
    let sacre = corpus_bleu(&hyps, &refs, &sacre_opts)?;
    let chrf = cgnmt_eval::chrf::corpus_chrf(&hyps, &refs, &cgnmt_eval::chrf::ChrfOptions::chrf())?;
    let last = store::complete_dir(&run.join("last"))
        .with_context(|| format!("{}: no complete checkpoint", run.display()))?;
    let state = checkpoint::load_state(&last)?;
    let lm = store::load(best, DType::F32, &Device::Cpu)?;
    let ref_words = refs
        .iter()
        .map(|r| r.iter().map(|l| word_count(l)).sum::<usize>() as f64)
        .sum::<f64>()
        / refs.len() as f64;
    let mut extra = vec![];
    for x in &s.extra_tests {
        let hyps = cgnmt_data::corpus::read_lines(&t.dir.join(format!("test-{}.hyp", x.name)))?;
        let refs = x
            .refs
            .iter()
            .map(|p| Ok(cgnmt_data::corpus::read_lines(p)?))
            .collect::<Result<Vec<_>>>()?;
        extra.push(super::TestScore {
            name: x.name.clone(),
            bleu: corpus_bleu(&hyps, &refs, &BleuOptions::mteval_v11b())?.score,
            sacrebleu: corpus_bleu(&hyps, &refs, &sacre_opts)?.score,
            chrf: cgnmt_eval::chrf::corpus_chrf(
                &hyps,
                &refs,
                &cgnmt_eval::chrf::ChrfOptions::chrf(),
            )?
            .score,
            hyp_words: hyps.iter().map(|l| word_count(l)).sum(),
            ref_words: refs
                .iter()
                .map(|r| r.iter().map(|l| word_count(l)).sum::<usize>() as f64)
                .sum::<f64>()
                / refs.len() as f64,
        });
    }
    Ok(RunResult {
        extra,
        system: t.system.name.clone(),
        seed: t.seed,
        dir: t
            .dir
            .strip_prefix(&s.out)
            .unwrap_or(&t.dir)
            .display()
            .to_string(),
        fingerprint: t.fingerprint.clone(),
        steps: state.step,
        epochs: state.epoch,
        best_step: state.best_step,
        best_dev_bleu: state.best_bleu,
        params: cgnmt::model::init::count(&lm.varmap),
        train_seconds: timing.train_seconds,
        decode_seconds: timing.decode_seconds,
        bleu: v11b.score,
        sacrebleu: sacre.score,
        sacrebleu_signature: sacre_opts.signature(refs.len()),
        chrf: chrf.score,
        hyp_words: hyps.iter().map(|l| word_count(l)).sum(),
        ref_words,
        dev_curve: state.history.iter().map(|e| (e.step, e.dev_bleu)).collect(),
    })
}

/// The test references, `refs[k][line]`.
pub fn read_refs(s: &Setup) -> Result<Vec<Vec<String>>> {
    s.test_refs
        .iter()
        .map(|p| Ok(cgnmt_data::corpus::read_lines(p)?))
        .collect()
}

/// A row's runs paired with its baseline's of the same seed (seeds both have).
pub(crate) fn paired_by_seed<'a>(
    rs: &[&'a RunResult],
    base: &[&'a RunResult],
) -> Vec<(&'a RunResult, &'a RunResult)> {
    rs.iter()
        .filter_map(|r| base.iter().find(|b| b.seed == r.seed).map(|b| (*r, *b)))
        .collect()
}

/// sacreBLEU's length ratio (13a): the output's tokens over the (closest) reference length.
pub(crate) fn bleu_ratio(hyps: &[String], refs: &[Vec<String>]) -> Result<f64> {
    let b = corpus_bleu(hyps, refs, &BleuOptions::sacrebleu())?;
    Ok(b.sys_len as f64 / (b.ref_len as f64).max(1.0))
}

pub(crate) fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

pub(crate) fn sd(v: &[f64]) -> Option<f64> {
    if v.len() < 2 {
        return None;
    }
    let m = mean(v)?;
    Some((v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt())
}

/// Read every finished run and compute the rows and the analyses.
pub fn collect(s: &Setup, tasks: &[Task], clock: &Clock) -> Result<Results> {
    let mut runs = vec![];
    let mut pending = vec![];
    for t in tasks {
        if super::is_complete(t) {
            // (A plain dump of an earlier version is compressed, so that every record has the same files.)
            super::compress_dump(&t.dir)?;
            runs.push(read_result(t)?);
        } else {
            pending.push(format!("{} seed {}", t.system.name, t.seed));
        }
    }
    let plan = &s.plan;
    let c = Finished {
        s,
        runs: &runs,
        refs: read_refs(s)?,
        src_tok: cgnmt_data::corpus::read_lines(&s.test_src_tok)?,
        dumps_read: Default::default(),
    };
    let metric = Metric::Bleu(BleuOptions::mteval_v11b());
    let rows = plan
        .systems
        .iter()
        .map(|sys| c.row(sys, &metric))
        .collect::<Result<Vec<_>>>()?;
    let extra_tests = super::extra_tests::extra_tables(s, &runs, &metric)?;
    let mut stability = vec![];
    for table in plan.table_ids() {
        // Rows that decode another row's models share its training, hence its dev BLEU: only the rows that
        // train are ordered.
        let names: Vec<&str> = plan
            .systems
            .iter()
            .filter(|x| x.table == table && x.from.is_none())
            .map(|x| x.name.as_str())
            .collect();
        if let Some(st) = stability_of(&names, &|n| c.of(n)) {
            stability.push((table, st));
        }
    }

    let a = &plan.analyses;
    let figures_dir = s.out.join(s.figures_dir_name());
    // Figures are drawn anew each time: none of an earlier report's may linger.
    if figures_dir.exists() {
        std::fs::remove_dir_all(&figures_dir)
            .with_context(|| format!("{}: cannot remove", figures_dir.display()))?;
    }
    std::fs::create_dir_all(&figures_dir)
        .with_context(|| format!("{}: cannot create", figures_dir.display()))?;
    let gate_correlation = match &a.gate_correlation {
        Some(g) => c.gate_correlation(g)?,
        None => None,
    };
    let gate_histogram = match &a.gate_histogram {
        Some(g) => c.gate_histogram(g)?,
        None => vec![],
    };
    let context_scaling = match &a.context_scaling {
        Some(cs) => c.context_scaling(cs, clock)?,
        None => vec![],
    };
    let length_groups = match &a.length_groups {
        Some(l) => c.length_groups(l)?,
        None => None,
    };
    let subjective = match &a.subjective {
        Some(sj) => match (c.median(&sj.baseline), c.median(&sj.system)) {
            (Some(br), Some(sr)) => Some(write_subjective(s, sj, br, sr, &c.refs)?),
            _ => None,
        },
        None => None,
    };
    let mut alignment = vec![];
    for (k, al) in a.alignment.iter().enumerate() {
        alignment.push(align_all(s, k, al, &|n| c.of(n), clock)?);
    }
    let figures = match &a.heatmaps {
        Some(h) => c.heatmaps(h, &figures_dir)?,
        None => vec![],
    };
    let (test_sentences, references) = (c.src_tok.len(), c.refs.len());
    let dumps_read: Vec<String> = c.dumps_read.into_inner().into_iter().collect();
    Ok(Results {
        dumps_read,
        plan: plan.name.clone(),
        description: plan.description.clone(),
        plan_file: s.args.plan.display().to_string(),
        quick: s.args.quick,
        seeds: s.seeds.clone(),
        beam: plan.decode.beam,
        environment: environment(),
        shared_settings: {
            let mut v = plan.train.set.clone();
            if s.args.quick {
                v.extend(plan.quick.set.iter().cloned());
            }
            if let Some(b) = s.args.budget_seconds {
                v.push(format!("train.max_seconds={b}"));
            }
            v
        },
        systems: plan.systems.clone(),
        tables: plan
            .table_ids()
            .into_iter()
            .map(|id| {
                let title = plan
                    .tables
                    .get(&id)
                    .cloned()
                    .unwrap_or_else(|| format!("Table {id}"));
                (id, title)
            })
            .collect(),
        test_sentences,
        references,
        runs,
        pending,
        rows,
        extra_tests,
        stability,
        gate_correlation,
        gate_histogram,
        context_scaling,
        length_groups,
        subjective,
        alignment,
        figures,
        invocations: vec![],
    })
}

/// The finished runs of a plan, with the test set's references and tokenised sources, and the dumps that
/// the analyses read (named in the results).
struct Finished<'a> {
    s: &'a Setup,
    runs: &'a [RunResult],
    refs: Vec<Vec<String>>,
    src_tok: Vec<String>,
    dumps_read: std::cell::RefCell<std::collections::BTreeSet<String>>,
}

impl<'a> Finished<'a> {
    /// A row's runs, by seed.
    fn of(&self, name: &str) -> Vec<&'a RunResult> {
        let mut v: Vec<&RunResult> = self.runs.iter().filter(|r| r.system == name).collect();
        v.sort_by_key(|r| r.seed);
        v
    }

    /// A row's run of median test BLEU (of an even number, the lower; ties by seed), which the analyses read.
    fn median(&self, name: &str) -> Option<&'a RunResult> {
        let mut v = self.of(name);
        v.sort_by(|a, b| a.bleu.total_cmp(&b.bleu).then(a.seed.cmp(&b.seed)));
        v.get(v.len().saturating_sub(1) / 2).copied()
    }

    fn hyps_of(&self, r: &RunResult) -> Result<Vec<String>> {
        Ok(cgnmt_data::corpus::read_lines(
            &self.s.out.join(&r.dir).join("test.hyp"),
        )?)
    }

    fn dump_of(&self, r: &RunResult) -> Result<Vec<DumpRecord>> {
        self.dumps_read.borrow_mut().insert(r.dir.clone());
        let path = super::compress_dump(&self.s.out.join(&r.dir))?;
        let text = cgnmt_data::corpus::read_lines(&path)?.join("\n");
        Ok(analysis::parse_dump(&text, &path)?)
    }

    /// A system's row of its table: the seeds' BLEU, mean ± sd, Δ against its baseline with the
    /// significance tests, the other metrics and the costs.
    fn row(&self, sys: &super::plan::SystemSpec, metric: &Metric) -> Result<Row> {
        let plan = &self.s.plan;
        let rs = self.of(&sys.name);
        let bleu: Vec<f64> = rs.iter().map(|r| r.bleu).collect();
        let m = mean(&bleu);
        let base_rows = sys
            .baseline
            .as_deref()
            .map(|b| self.of(b))
            .unwrap_or_default();
        let base_mean = mean(&base_rows.iter().map(|r| r.bleu).collect::<Vec<_>>());
        let tests = match &sys.baseline {
            Some(_) => {
                self.significance(&paired_by_seed(&rs, &base_rows), (&rs, &base_rows), metric)?
            }
            None => None,
        };
        let paper_delta = match (&sys.baseline, sys.paper) {
            (Some(b), Some(p)) => plan.system(b).and_then(|b| b.paper).map(|bp| p - bp),
            _ => None,
        };
        Ok(Row {
            system: sys.name.clone(),
            table: sys.table.clone(),
            baseline: sys.baseline.clone(),
            seeds: rs.iter().map(|r| r.seed).collect(),
            mean: m,
            sd: sd(&bleu),
            bleu,
            sacrebleu_mean: mean(&rs.iter().map(|r| r.sacrebleu).collect::<Vec<_>>()),
            chrf_mean: mean(&rs.iter().map(|r| r.chrf).collect::<Vec<_>>()),
            length_ratio: mean(
                &rs.iter()
                    .map(|r| r.hyp_words as f64 / r.ref_words.max(1.0))
                    .collect::<Vec<_>>(),
            ),
            bleu_length_ratio: mean(
                &rs.iter()
                    .map(|r| bleu_ratio(&self.hyps_of(r)?, &self.refs))
                    .collect::<Result<Vec<_>>>()?,
            ),
            delta: match (m, base_mean) {
                (Some(a), Some(b)) => Some(a - b),
                _ => None,
            },
            tests,
            paper: sys.paper,
            paper_delta,
            params: rs.first().map(|r| r.params),
            train_seconds_mean: mean(&rs.iter().map(|r| r.train_seconds).collect::<Vec<_>>()),
            decode_seconds_mean: mean(&rs.iter().map(|r| r.decode_seconds).collect::<Vec<_>>()),
            steps: rs.first().map(|r| r.steps),
            median_seed: self.median(&sys.name).map(|r| r.seed),
        })
    }

    /// Paired bootstrap, approximate randomisation and the sign test of a system against its baseline over
    /// the seeds both have (each seed's test sentences are segments of one pooled test), and the seed-level
    /// tests over every seed of each (`all`: the system's runs, the baseline's); `None` without paired seeds.
    fn significance(
        &self,
        paired: &[(&RunResult, &RunResult)],
        all: (&[&RunResult], &[&RunResult]),
        metric: &Metric,
    ) -> Result<Option<Tests>> {
        if paired.is_empty() {
            return Ok(None);
        }
        let (mut sys_stats, mut base_stats) = (vec![], vec![]);
        for (r, b) in paired {
            sys_stats.extend(metric.segment_stats(&self.hyps_of(r)?, &self.refs)?);
            base_stats.extend(metric.segment_stats(&self.hyps_of(b)?, &self.refs)?);
        }
        let bs = significance::paired_bootstrap(
            metric,
            &base_stats,
            &sys_stats,
            BOOTSTRAP_SAMPLES,
            significance::DEFAULT_SEED,
        )?;
        let ar = significance::paired_ar(
            metric,
            &base_stats,
            &sys_stats,
            AR_TRIALS,
            significance::DEFAULT_SEED,
        )?;
        let sign = significance::sign_test(metric, &base_stats, &sys_stats)?;
        let runs = |rs: &[&RunResult]| -> Result<Vec<Vec<Vec<f64>>>> {
            rs.iter()
                .map(|r| Ok(metric.segment_stats(&self.hyps_of(r)?, &self.refs)?))
                .collect()
        };
        let seed_level = if all.0.len() >= 2 && all.1.len() >= 2 {
            Some(cgnmt_eval::seeds::compare_runs(
                metric,
                &runs(all.1)?,
                &runs(all.0)?,
                BOOTSTRAP_SAMPLES,
                significance::DEFAULT_SEED,
            )?)
        } else {
            None
        };
        // Equal corpus scores are no difference; the resampling tests' strict comparison would give them
        // their smallest p-value.
        let same = bs.sys_score == bs.base_score;
        Ok(Some(Tests {
            seeds: paired.iter().map(|p| p.0.seed).collect(),
            segments: sys_stats.len(),
            base_bleu: bs.base_score,
            sys_bleu: bs.sys_score,
            bootstrap_p: if same { 1.0 } else { bs.p_value },
            ar_p: if same { 1.0 } else { ar.p_value },
            sign,
            seed_level,
        }))
    }

    /// Table 6: the gate value against the sentence-BLEU gain over the baseline (the median runs).
    fn gate_correlation(
        &self,
        g: &super::plan::GateCorrelationSpec,
    ) -> Result<Option<GateCorrelationResult>> {
        let (Some(sr), Some(br)) = (self.median(&g.system), self.median(&g.baseline)) else {
            return Ok(None);
        };
        let path = self.s.out.join(&sr.dir).join(super::DUMP_GZ);
        let by_id = analysis::dump_by_id(self.dump_of(sr)?, self.src_tok.len(), &path)?;
        let gates: Vec<Option<f64>> = by_id.iter().map(|d| d.mean_gate()).collect();
        let ga = analysis::gate_analysis(
            &self.src_tok,
            &self.refs,
            &self.hyps_of(br)?,
            &self.hyps_of(sr)?,
            &gates,
            g.long,
            &BleuOptions::sentence(),
        )?;
        Ok(Some(GateCorrelationResult {
            system: g.system.clone(),
            system_seed: sr.seed,
            baseline: g.baseline.clone(),
            baseline_seed: br.seed,
            signature: ga.signature,
            correlations: ga.correlations,
        }))
    }

    /// The distribution of the gate values the median runs emitted, in 20 bins.
    fn gate_histogram(&self, g: &super::plan::SystemsSpec) -> Result<Vec<GateHistogram>> {
        let mut out = vec![];
        for name in &g.systems {
            let Some(r) = self.median(name) else { continue };
            let mut counts = [0usize; 20];
            let mut vals = vec![];
            for d in self.dump_of(r)? {
                for &v in d.gates.iter().filter(|v| v.is_finite()) {
                    counts[((v.clamp(0.0, 1.0) * 20.0) as usize).min(19)] += 1;
                    vals.push(v);
                }
            }
            let n = vals.len();
            out.push(GateHistogram {
                system: name.clone(),
                seed: r.seed,
                fractions: counts.iter().map(|&c| c as f64 / n.max(1) as f64).collect(),
                words: n,
                mean: mean(&vals),
            });
        }
        Ok(out)
    }

    /// The context-scaling table: each median run's test set decoded at every scale of the plan (the
    /// outputs kept, so that a report decodes each once).
    fn context_scaling(
        &self,
        c: &super::plan::ContextScalingSpec,
        clock: &Clock,
    ) -> Result<Vec<ScalingResult>> {
        let s = self.s;
        let mut out = vec![];
        for name in &c.systems {
            let Some(r) = self.median(name) else { continue };
            let dir = s.out.join("analyses/context-scaling").join(format!(
                "{}-seed-{}",
                slug(name),
                r.seed
            ));
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("{}: cannot create", dir.display()))?;
            let mut outs = vec![];
            for &(x, y) in &c.scales {
                let hyps = if x == 1.0 && y == 1.0 {
                    self.hyps_of(r)?
                } else {
                    let p = dir.join(format!("{x}_{y}.hyp"));
                    if !p.is_file() {
                        need_model(s, r)?;
                        let model = best_dir(&s.out.join(&r.dir));
                        run_child(
                            &s.exe,
                            &[
                                "translate".into(),
                                "--quiet".into(),
                                "-m".into(),
                                model.display().to_string(),
                                "--beam".into(),
                                s.plan.decode.beam.to_string(),
                                "--context-scale".into(),
                                format!("{x},{y}"),
                                // Without penalties, whatever the model keeps (its decoding.toml).
                                "--length-penalty".into(),
                                "0".into(),
                                "--coverage-penalty".into(),
                                "0".into(),
                                "-i".into(),
                                s.test_src.display().to_string(),
                                "-o".into(),
                                p.display().to_string(),
                            ],
                            &dir.join("output.log"),
                            s.threads * s.args.jobs,
                            clock,
                            || {},
                        )?;
                    }
                    cgnmt_data::corpus::read_lines(&p)?
                };
                outs.push(((x, y), hyps));
            }
            out.push(ScalingResult {
                system: name.clone(),
                seed: r.seed,
                scaling: analysis::context_scaling(
                    &self.src_tok,
                    &self.refs,
                    &outs,
                    &BleuOptions::mteval_v11b(),
                )?,
            });
        }
        Ok(out)
    }

    /// Figure 7: BLEU by source-length group of the median runs.
    fn length_groups(&self, l: &super::plan::LengthGroupsSpec) -> Result<Option<LengthGroups>> {
        let mut systems = vec![];
        for name in &l.systems {
            if let Some(r) = self.median(name) {
                systems.push((name.clone(), self.hyps_of(r)?));
            }
        }
        if systems.is_empty() {
            return Ok(None);
        }
        Ok(Some(analysis::length_groups(
            &self.src_tok,
            &self.refs,
            &systems,
            &l.edges,
            &BleuOptions::mteval_v11b(),
        )?))
    }

    /// Figure 6: attention and gate heatmaps of the median run, drawn into `figures_dir`.
    fn heatmaps(&self, h: &super::plan::HeatmapSpec, figures_dir: &Path) -> Result<Vec<FigureRef>> {
        let mut figures = vec![];
        let Some(r) = self.median(&h.system) else {
            return Ok(figures);
        };
        let dump = self.dump_of(r)?;
        for &id in &h.sentences {
            let Some(rec) = dump.iter().find(|d| d.id == Some(id)) else {
                continue;
            };
            let mut fig = cgnmt_eval::plot::AttentionFigure::from_record(rec)?;
            fig.title = format!("{} (seed {}), test sentence {id}", h.system, r.seed);
            let file = format!("heatmap-{id}.png");
            cgnmt_eval::plot::save(&fig, &figures_dir.join(&file))?;
            figures.push(FigureRef {
                file,
                caption: format!(
                    "Attention and gate values of {} (seed {}) on test sentence {id} (paper Figure 6).",
                    h.system, r.seed
                ),
            });
        }
        Ok(figures)
    }
}

fn best_dir(run_dir: &Path) -> PathBuf {
    let b = run_dir.join("run/best");
    if b.is_dir() {
        b
    } else {
        run_dir.join("run/last")
    }
}

fn stability_of<'a>(names: &[&str], of: &dyn Fn(&str) -> Vec<&'a RunResult>) -> Option<Stability> {
    let mut rows = vec![];
    let mut final_step = 0;
    for &n in names {
        let rs = of(n);
        if rs.is_empty() {
            return None;
        }
        final_step = final_step.max(rs.iter().map(|r| r.steps).max().unwrap_or(0));
        rows.push((n, rs));
    }
    if rows.len() < 2 || final_step == 0 {
        return None;
    }
    let at_step = (final_step as f64 / 1.2).floor() as u64;
    let best_upto = |r: &RunResult, step: u64| -> f64 {
        r.dev_curve
            .iter()
            .filter(|(s, _)| *s <= step)
            .map(|p| p.1)
            .fold(0.0, f64::max)
    };
    let out: Vec<StabilityRow> = rows
        .iter()
        .map(|(n, rs)| StabilityRow {
            system: n.to_string(),
            dev_bleu_at: mean(&rs.iter().map(|r| best_upto(r, at_step)).collect::<Vec<_>>())
                .unwrap_or(0.0),
            dev_bleu_final: mean(
                &rs.iter()
                    .map(|r| best_upto(r, u64::MAX))
                    .collect::<Vec<_>>(),
            )
            .unwrap_or(0.0),
        })
        .collect();
    let (mut concordant, mut discordant) = (0i64, 0i64);
    let mut swapped = vec![];
    for i in 0..out.len() {
        for j in i + 1..out.len() {
            let a = (out[i].dev_bleu_at - out[j].dev_bleu_at).signum();
            let b = (out[i].dev_bleu_final - out[j].dev_bleu_final).signum();
            if a * b > 0.0 {
                concordant += 1;
            } else if a * b < 0.0 {
                discordant += 1;
                swapped.push((out[i].system.clone(), out[j].system.clone()));
            }
        }
    }
    let pairs = concordant + discordant;
    Some(Stability {
        at_step,
        final_step,
        rows: out,
        kendall_tau: (pairs > 0).then(|| (concordant - discordant) as f64 / pairs as f64),
        swapped_pairs: swapped,
    })
}

/// A blinded sample for the subjective evaluation (paper Table 3): `pairs.jsonl` shows each sampled source
/// with its reference and the two systems' outputs in a random order; `key.jsonl` says which is which.
fn write_subjective(
    s: &Setup,
    sj: &super::plan::SubjectiveSpec,
    base: &RunResult,
    sys: &RunResult,
    refs: &[Vec<String>],
) -> Result<SubjectiveResult> {
    let src = cgnmt_data::corpus::read_lines(&s.test_src)?;
    let bh = cgnmt_data::corpus::read_lines(&s.out.join(&base.dir).join("test.hyp"))?;
    let sh = cgnmt_data::corpus::read_lines(&s.out.join(&sys.dir).join("test.hyp"))?;
    let (pairs, mut key) = cgnmt_subjective::blind_sample(
        &src,
        refs,
        &cgnmt_subjective::SystemOutputs {
            name: &sj.baseline,
            lines: &bh,
        },
        &cgnmt_subjective::SystemOutputs {
            name: &sj.system,
            lines: &sh,
        },
        sj.sentences,
        2017,
    )?;
    for k in &mut key {
        k.seeds = Some(if k.systems[0] == sj.baseline {
            [base.seed, sys.seed]
        } else {
            [sys.seed, base.seed]
        });
    }
    let identical = pairs
        .iter()
        .filter(|p| p.outputs[0] == p.outputs[1])
        .count();
    let dir = s.out.join("subjective");
    std::fs::create_dir_all(&dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let pairs = cgnmt_subjective::to_jsonl(&pairs);
    let key = cgnmt_subjective::to_jsonl(&key);
    super::write_atomic(&dir.join("pairs.jsonl"), pairs.as_bytes())?;
    super::write_atomic(&dir.join("key.jsonl"), key.as_bytes())?;
    Ok(SubjectiveResult {
        baseline: sj.baseline.clone(),
        system: sj.system.clone(),
        pairs: pairs.lines().count(),
        identical,
        pairs_file: "subjective/pairs.jsonl".into(),
        key_file: "subjective/key.jsonl".into(),
    })
}

/// A run's alignment error rates on one gold set (cached beside its raw alignments, which are not kept under
/// version control).
#[derive(Serialize, Deserialize)]
struct AlignmentScores {
    aer: f64,
    saer: f64,
}

/// An analysis that decodes needs the run's model; a kept record whose checkpoints are gone says so.
fn need_model(s: &Setup, r: &RunResult) -> Result<()> {
    let dir = s.out.join(&r.dir);
    if store::complete_dir(&best_dir(&dir)).is_none() {
        bail!(
            "{}: an analysis needs this run's model, but its checkpoints are not here (a kept record); \
             train the row again with --only {:?}",
            dir.display(),
            r.system
        );
    }
    Ok(())
}

/// One alignment analysis's gold set: the sentence files and the links (source index first).
pub(super) struct GoldSet {
    src: PathBuf,
    tgt: PathBuf,
    links: Vec<cgnmt_eval::aer::GoldLinks>,
}

/// Read an alignment analysis's files from the data directory; a missing or malformed one is an error
/// naming the analysis (checked before any training, so that a plan does not fail after hours).
pub(super) fn gold_set(s: &Setup, al: &super::plan::AlignmentSpec) -> Result<GoldSet> {
    let file = |rel: &str| -> Result<PathBuf> {
        s.data
            .file(rel)
            .with_context(|| format!("analyses.alignment {:?}", al.name))
    };
    let (src, tgt) = (file(&al.src)?, file(&al.tgt)?);
    let gold = file(&al.gold)?;
    let mut links = cgnmt_eval::aer::read_gold(&gold)
        .with_context(|| format!("analyses.alignment {:?}", al.name))?;
    if al.target_first {
        for g in &mut links {
            g.sure = g.sure.iter().map(|&(a, b)| (b, a)).collect();
            g.possible = g.possible.iter().map(|&(a, b)| (b, a)).collect();
        }
    }
    Ok(GoldSet { src, tgt, links })
}

/// Where a run's alignment on the `k`-th gold set is kept, named by its fingerprint (a run trained further
/// is aligned again): the scores (`.json`, kept under version control) and the raw links and matrices.
fn alignment_stem(s: &Setup, k: usize, system: &str, seed: u64, fingerprint: &str) -> PathBuf {
    s.out
        .join("analyses/alignment")
        .join(k.to_string())
        .join(format!("{}-seed-{seed}-{fingerprint}", slug(system)))
}

/// `stem` with `suffix` appended.
fn suffixed(stem: &Path, suffix: &str) -> PathBuf {
    let mut p = stem.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

fn cached_scores(stem: &Path) -> Option<AlignmentScores> {
    std::fs::read_to_string(suffixed(stem, ".json"))
        .ok()
        .and_then(|t| serde_json::from_str::<AlignmentScores>(&t).ok())
}

/// Force-decode the gold set with the model in `run_dir` (unless its matrices are there already), score the
/// attention and cache the scores. The `align` child writes to `log`.
fn align_and_score(
    s: &Setup,
    gold: &GoldSet,
    stem: &Path,
    run_dir: &Path,
    log: &Path,
    threads: usize,
    clock: &Clock,
) -> Result<AlignmentScores> {
    let dir = stem.parent().expect("a stem has a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let soft = suffixed(stem, ".soft.jsonl");
    if !soft.is_file() {
        run_child(
            &s.exe,
            &[
                "align".into(),
                "-m".into(),
                best_dir(run_dir).display().to_string(),
                "--src".into(),
                gold.src.display().to_string(),
                "--tgt".into(),
                gold.tgt.display().to_string(),
                "-o".into(),
                suffixed(stem, ".talp").display().to_string(),
                "--soft".into(),
                soft.display().to_string(),
            ],
            log,
            threads,
            clock,
            || {},
        )?;
    }
    let m = cgnmt_eval::aer::read_soft_jsonl(&soft)?;
    let hard = cgnmt_eval::aer::argmax_links(&m);
    let scores = AlignmentScores {
        aer: cgnmt_eval::aer::aer(&gold.links, &hard)?.aer,
        saer: cgnmt_eval::aer::saer(&gold.links, &m)?.saer,
    };
    super::write_atomic(
        &suffixed(stem, ".json"),
        serde_json::to_string(&scores)?.as_bytes(),
    )?;
    Ok(scores)
}

/// Align a run that has just trained, on every gold set whose analysis lists its row, while its
/// checkpoints are sure to be here: the queue calls this before the run's record is complete, so an
/// invocation stopped later loses no alignment (the report then reads the cached scores).
pub(super) fn align_trained_run(
    s: &Setup,
    t: &Task,
    clock: &Clock,
    progress: &mut dyn FnMut(u64, &str),
) -> Result<()> {
    if t.system.from.is_some() {
        return Ok(());
    }
    for (k, al) in s.plan.analyses.alignment.iter().enumerate() {
        if !al.systems.contains(&t.system.name) {
            continue;
        }
        let stem = alignment_stem(s, k, &t.system.name, t.seed, &t.fingerprint);
        if cached_scores(&stem).is_some() {
            continue;
        }
        progress(t.config.train.max_steps as u64, "aligning");
        let gold = gold_set(s, al)?;
        align_and_score(
            s,
            &gold,
            &stem,
            &t.dir,
            &t.dir.join("output.log"),
            s.threads,
            clock,
        )?;
    }
    Ok(())
}

/// Remove a row's cached alignments (every seed, every gold set): `--only` trains the row again with the same
/// fingerprint, so its old scores would otherwise be read for the new models.
pub(super) fn forget_alignments(s: &Setup, system: &str) -> Result<()> {
    let prefix = format!("{}-seed-", slug(system));
    let Ok(sets) = std::fs::read_dir(s.out.join("analyses/alignment")) else {
        return Ok(());
    };
    for set in sets.flatten() {
        let Ok(files) = std::fs::read_dir(set.path()) else {
            continue;
        };
        for f in files.flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            // `<slug>-seed-<seed>-<fingerprint>.<suffix>`: the rest is a seed and a hex fingerprint, so that
            // row "GRU seed 1"'s files are not row "GRU"'s.
            let ours = name.strip_prefix(&prefix).is_some_and(|rest| {
                let mut parts = rest.splitn(2, '-');
                let seed = parts.next().unwrap_or("");
                !seed.is_empty()
                    && seed.bytes().all(|b| b.is_ascii_digit())
                    && parts.next().is_some_and(|fp| {
                        fp.split('.').next().is_some_and(|h| {
                            !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit())
                        })
                    })
            });
            if ours {
                std::fs::remove_file(f.path())
                    .with_context(|| format!("{}: cannot remove", f.path().display()))?;
            }
        }
    }
    Ok(())
}

/// The `k`-th alignment analysis over every finished seed of its listed rows: AER of the row-wise argmax
/// links (first maximum on ties) and soft AER of the attention matrices, each run's scores read from its cache
/// (written when the run was trained) or made now from its model.
fn align_all<'a>(
    s: &Setup,
    k: usize,
    al: &super::plan::AlignmentSpec,
    of: &dyn Fn(&str) -> Vec<&'a RunResult>,
    clock: &Clock,
) -> Result<AlignmentResult> {
    let gold = gold_set(s, al)?;
    let log = s
        .out
        .join("analyses/alignment")
        .join(k.to_string())
        .join("output.log");
    let mut systems = vec![];
    for name in &al.systems {
        let (mut seeds, mut aers, mut saers) = (vec![], vec![], vec![]);
        for r in of(name) {
            let stem = alignment_stem(s, k, name, r.seed, &r.fingerprint);
            let scores = match cached_scores(&stem) {
                Some(c) => c,
                None => {
                    if !suffixed(&stem, ".soft.jsonl").is_file() {
                        need_model(s, r)?;
                    }
                    align_and_score(
                        s,
                        &gold,
                        &stem,
                        &s.out.join(&r.dir),
                        &log,
                        s.threads * s.args.jobs,
                        clock,
                    )?
                }
            };
            seeds.push(r.seed);
            aers.push(scores.aer);
            saers.push(scores.saer);
        }
        systems.push(AlignmentSystem {
            system: name.clone(),
            seeds,
            aer_mean: mean(&aers),
            aer_sd: sd(&aers),
            saer_mean: mean(&saers),
            saer_sd: sd(&saers),
            aer: aers,
            saer: saers,
        });
    }
    Ok(AlignmentResult {
        name: al.name.clone(),
        sentences: gold.links.len(),
        systems,
    })
}

fn environment() -> Environment {
    // The commit the binary was built from (see build.rs), not the checkout's at the time of the report.
    let commit = cgnmt::COMMIT.to_string();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    Environment {
        commit,
        cpu,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cgnmt_version: cgnmt::VERSION.into(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        date,
    }
}

/// Add this invocation to `invocations.jsonl` and the results.
pub fn finish(s: &Setup, mut r: Results, mut inv: Invocation) -> Result<Results> {
    inv.jobs = s.args.jobs;
    let p = s.out.join("invocations.jsonl");
    super::append_line(&p, &serde_json::to_string(&inv)?)?;
    let text =
        std::fs::read_to_string(&p).with_context(|| format!("{}: cannot read", p.display()))?;
    r.invocations = latest_invocations(&text);
    Ok(r)
}

/// The invocation log's last line of each invocation (lines without an id, from earlier versions, stand alone).
pub fn latest_invocations(text: &str) -> Vec<Invocation> {
    let mut out: Vec<Invocation> = vec![];
    for inv in text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str::<Invocation>(l).ok())
    {
        match out
            .iter_mut()
            .find(|o| !inv.id.is_empty() && o.id == inv.id)
        {
            Some(o) => *o = inv,
            None => out.push(inv),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(system: &str, seed: u64, curve: &[(u64, f64)]) -> RunResult {
        RunResult {
            system: system.into(),
            seed,
            dir: String::new(),
            fingerprint: String::new(),
            steps: curve.last().map_or(0, |p| p.0),
            epochs: 1,
            best_step: 0,
            best_dev_bleu: None,
            params: 0,
            train_seconds: 0.0,
            decode_seconds: 0.0,
            bleu: 0.0,
            sacrebleu: 0.0,
            sacrebleu_signature: String::new(),
            chrf: 0.0,
            hyp_words: 0,
            ref_words: 0.0,
            dev_curve: curve.to_vec(),
            extra: vec![],
        }
    }

    #[test]
    fn stability_compares_the_order_at_five_sixths_with_the_end() {
        let runs = [
            run("A", 1, &[(500, 10.0), (1000, 12.0), (1200, 12.5)]),
            run("A", 2, &[(500, 10.0), (1000, 14.0), (1200, 13.0)]),
            run("B", 1, &[(500, 11.0), (1000, 12.0), (1200, 16.0)]),
            run("C", 1, &[(500, 1.0), (1000, 2.0), (1200, 3.0)]),
        ];
        let of = |n: &str| runs.iter().filter(|r| r.system == n).collect::<Vec<_>>();
        let st = stability_of(&["A", "B", "C"], &of).unwrap();
        assert_eq!((st.at_step, st.final_step), (1000, 1200));
        // A: best up to 1000 is 12 and 14 (mean 13), at the end 12.5 and 14 (13.25); B: 12 then 16.
        assert_eq!(st.rows[0].dev_bleu_at, 13.0);
        assert_eq!(st.rows[0].dev_bleu_final, 13.25);
        assert_eq!(st.rows[1].dev_bleu_at, 12.0);
        assert_eq!(st.rows[1].dev_bleu_final, 16.0);
        assert_eq!(st.swapped_pairs, vec![("A".to_string(), "B".to_string())]);
        assert!((st.kendall_tau.unwrap() - 1.0 / 3.0).abs() < 1e-12);
        // A row without a finished run gives no stability check.
        assert!(stability_of(&["A", "D"], &of).is_none());
    }

    #[test]
    fn the_invocation_log_keeps_each_invocations_last_line() {
        let line = |id: &str, partial: bool, wall: f64| {
            serde_json::to_string(&Invocation {
                id: id.into(),
                partial,
                wall_seconds: wall,
                work_seconds: wall,
                own_seconds: 0.0,
                jobs: 2,
                report_only: false,
                command: String::new(),
                commit: String::new(),
            })
            .unwrap()
        };
        let text = [
            r#"{"wall_seconds":5.0,"work_seconds":4.0,"report_only":true}"#.to_string(),
            line("a", true, 10.0),
            line("a", true, 20.0),
            line("b", true, 7.0),
            line("a", false, 30.0),
            "not json".into(),
        ]
        .join("\n");
        let v = latest_invocations(&text);
        assert_eq!(v.len(), 3);
        assert_eq!((v[0].id.as_str(), v[0].wall_seconds), ("", 5.0));
        assert_eq!(
            (v[1].id.as_str(), v[1].wall_seconds, v[1].partial),
            ("a", 30.0, false)
        );
        assert_eq!((v[2].id.as_str(), v[2].partial), ("b", true));
    }

    #[test]
    fn sample_sd() {
        assert_eq!(sd(&[1.0]), None);
        assert!((sd(&[1.0, 2.0, 3.0]).unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(mean(&[]), None);
    }
}
