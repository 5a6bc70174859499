//! `report.md` and a self-contained `report.html` (figures embedded) from [`Results`], and the report's
//! figures. Both documents are rendered from one list of blocks, so they say the same thing.

use std::fmt::Write as _;

use anyhow::Result;
use cgnmt_eval::plot::{CategoryFigure, CategoryPanel, StepCurvesFigure};

use super::analyses::{FigureRef, Results, Row};
use super::{fmt_duration, write_atomic, Setup};

enum Block {
    H(u8, String),
    P(String),
    List(Vec<String>),
    Table(Vec<String>, Vec<Vec<String>>),
    Img(String, String),
    Code(String),
}

fn f2(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{v:.2}"))
}

fn signed(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{v:+.2}"))
}

fn pval(p: f64) -> String {
    if p < 0.001 {
        format!("{p:.1e}")
    } else {
        format!("{p:.3}")
    }
}

/// Render the figures of the results into `OUT/figures` (`OUT/figures-seeds-1-2` for a part of the plan's seeds)
/// and list them in `r.figures`.
pub fn figures(s: &Setup, r: &mut Results) -> Result<()> {
    let dir = s.out.join(s.figures_dir_name());
    std::fs::create_dir_all(&dir)?;
    let add = |file: String, caption: String, r: &mut Results| {
        r.figures.push(FigureRef { file, caption });
    };
    // Every system's dev BLEU, mean over seeds at each evaluation every seed reached, on one chart.
    let series: Vec<(String, Vec<(f64, f64)>)> = r
        .systems
        .iter()
        .filter_map(|sys| {
            let runs: Vec<_> = r.runs.iter().filter(|x| x.system == sys.name).collect();
            let first = runs.first()?;
            let pts = first
                .dev_curve
                .iter()
                .filter_map(|&(st, _)| {
                    let v: Vec<f64> = runs
                        .iter()
                        .filter_map(|x| x.dev_curve.iter().find(|p| p.0 == st).map(|p| p.1))
                        .collect();
                    (v.len() == runs.len())
                        .then(|| (st as f64, v.iter().sum::<f64>() / v.len() as f64))
                })
                .collect();
            Some((sys.name.clone(), pts))
        })
        .collect();
    if !series.is_empty() {
        let fig = StepCurvesFigure {
            title: "Dev BLEU during training".into(),
            y_desc: "dev BLEU (mean over seeds)".into(),
            series,
        };
        cgnmt_eval::plot::save(&fig, &dir.join("training.png"))?;
        add(
            "training.png".into(),
            "Dev BLEU against updates, mean over seeds, of every system.".into(),
            r,
        );
    }
    if !r.context_scaling.is_empty() {
        let cats: Vec<String> = r.context_scaling[0]
            .scaling
            .runs
            .iter()
            .map(|x| cgnmt_eval::analysis::scale_label(x.a, x.b))
            .collect();
        let series = |f: &dyn Fn(&cgnmt_eval::analysis::ScalingRun) -> Option<f64>| {
            r.context_scaling
                .iter()
                .map(|c| {
                    (
                        c.system.clone(),
                        c.scaling.runs.iter().map(f).collect::<Vec<_>>(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let fig = CategoryFigure {
            panels: vec![
                CategoryPanel {
                    title: "Output length / reference length".into(),
                    x_desc: "(a, b) = (source scale, target scale)".into(),
                    y_desc: "length ratio".into(),
                    categories: cats.clone(),
                    series: series(&|x| x.ratio_ref),
                },
                CategoryPanel {
                    title: "BLEU".into(),
                    x_desc: "(a, b) = (source scale, target scale)".into(),
                    y_desc: "BLEU".into(),
                    categories: cats,
                    series: series(&|x| Some(x.bleu)),
                },
            ],
            panel_size: (620, 460),
        };
        cgnmt_eval::plot::save(&fig, &dir.join("context-scaling.png"))?;
        add(
            "context-scaling.png".into(),
            "Decoding with the source context scaled by a and the target context by b (paper Figure 2).".into(),
            r,
        );
    }
    if let Some(g) = &r.length_groups {
        cgnmt_eval::plot::save(
            &cgnmt_eval::plot::length_groups_figure(g),
            &dir.join("length-groups.png"),
        )?;
        add(
            "length-groups.png".into(),
            "BLEU and output length by source length (paper Figure 7).".into(),
            r,
        );
    }
    if !r.gate_histogram.is_empty() {
        let cats: Vec<String> = (0..20)
            .map(|k| format!("{:.2}", (k as f64 + 0.5) / 20.0))
            .collect();
        let fig = CategoryFigure {
            panels: vec![CategoryPanel {
                title: "Gate values of the target words".into(),
                x_desc: "mean gate value (bin centre)".into(),
                y_desc: "fraction of words".into(),
                categories: cats,
                series: r
                    .gate_histogram
                    .iter()
                    .map(|h| {
                        (
                            h.system.clone(),
                            h.fractions.iter().map(|&x| Some(x)).collect(),
                        )
                    })
                    .collect(),
            }],
            panel_size: (1000, 460),
        };
        cgnmt_eval::plot::save(&fig, &dir.join("gate-histogram.png"))?;
        add(
            "gate-histogram.png".into(),
            "Distribution of the gate value (mean over the gate's dimensions) per output word."
                .into(),
            r,
        );
    }
    Ok(())
}

fn row_cells(r: &Row) -> Vec<String> {
    let per_seed = r
        .seeds
        .iter()
        .zip(&r.bleu)
        .map(|(s, b)| format!("{b:.2} ({s})"))
        .collect::<Vec<_>>()
        .join(", ");
    let mean_sd = match (r.mean, r.sd) {
        (Some(m), Some(s)) => format!("{m:.2} ± {s:.2}"),
        (Some(m), None) => format!("{m:.2}"),
        _ => "pending".into(),
    };
    let (bs, ar, sign) = match &r.tests {
        Some(t) => (
            pval(t.bootstrap_p),
            pval(t.ar_p),
            format!(
                "{}/{}/{} p={}",
                t.sign.better,
                t.sign.worse,
                t.sign.ties,
                pval(t.sign.p_value)
            ),
        ),
        None => ("–".into(), "–".into(), "–".into()),
    };
    let (welch, spread, verdict) = match &r.tests {
        Some(t) => (
            t.welch_p().map_or("– (one seed)".into(), pval),
            t.seed_level.as_ref().map_or("–".into(), |c| {
                format!("{:.2} / {:.2}", c.sys_s_opt, c.sys_s_sel)
            }),
            match (
                t.significant(),
                t.seed_level.as_ref().and_then(|c| c.runs_needed),
            ) {
                (true, _) => "yes".to_string(),
                (false, Some(n)) if t.bootstrap_p < 0.05 => {
                    format!("no (pooled only; ~{n} seeds a side)")
                }
                (false, Some(n)) => format!("no (~{n} seeds a side)"),
                (false, None) => "no".to_string(),
            },
        ),
        None => ("–".into(), "–".into(), "–".into()),
    };
    vec![
        r.system.clone(),
        r.params
            .map_or("–".into(), |p| format!("{:.2}M", p as f64 / 1e6)),
        mean_sd,
        per_seed,
        f2(r.sacrebleu_mean),
        f2(r.chrf_mean),
        f2(r.length_ratio),
        f2(r.bleu_length_ratio),
        r.baseline.clone().unwrap_or_else(|| "–".into()),
        signed(r.delta),
        bs,
        ar,
        sign,
        welch,
        spread,
        verdict,
        f2(r.paper),
        signed(r.paper_delta),
        r.train_seconds_mean.map_or("–".into(), fmt_duration),
    ]
}

/// `suffix`: the report's name part (empty, or `-seeds-1-2` for a part of the plan's seeds).
fn blocks(r: &Results, suffix: &str) -> Vec<Block> {
    let mut b = vec![];
    title(r, suffix, &mut b);
    main_tables(r, &mut b);
    extra_test_tables(r, &mut b);
    alignment(r, &mut b);
    gates(r, &mut b);
    context_scaling(r, &mut b);
    length_groups(r, &mut b);
    subjective_and_figures(r, &format!("figures{suffix}"), &mut b);
    wall_time(r, &mut b);
    configurations(r, &mut b);
    b
}

/// The report's the title, what the plan is, how it ran and how significance is computed.
fn title(r: &Results, suffix: &str, b: &mut Vec<Block>) {
    use Block::*;
    b.push(H(
        1,
        format!("Reproduction of Tu et al. (2017): {}", r.plan),
    ));
    if r.quick {
        b.push(P("**Quick mode** (`--quick`): a tiny budget for testing the pipeline; the numbers say nothing about the models.".into()));
    }
    b.push(P(r.description.clone()));
    b.push(List(vec![
        format!("Plan: `{}`; seeds {:?}; beam {}; {} test sentences, {} reference(s).", r.plan_file, r.seeds, r.beam, r.test_sentences, r.references),
        format!("Command: `{}`", r.environment.command),
        training_commands(r),
        format!("Report written by cgnmt {} (built from commit `{}`); CPU: {} ({} threads available); written {}.", r.environment.cgnmt_version, r.environment.commit, r.environment.cpu, r.environment.cores, r.environment.date),
        format!("Runs finished: {} of {}.{}", r.runs.len(), r.runs.len() + r.pending.len(), if r.pending.is_empty() { String::new() } else { format!(" Pending: {}.", r.pending.join("; ")) }),
        format!("BLEU is NIST mteval-v11b, case-insensitive (the paper's metric), of each run's best-dev-BLEU model; sacreBLEU (13a, cased) and chrF are shown beside it; the length ratios are the output's words over the reference's, and sacreBLEU's (13a tokens). Every number below is read from the run files (`results{suffix}.json`)."),
    ]));
    b.push(P(format!(
        "Significance against the row's baseline is computed on the pooled outputs: the system's seed s paired with the baseline's seed s, sentence by sentence, over every seed both have: paired bootstrap ({} resamples) and approximate randomisation ({} trials) p-values, and the sign test (sentences better/worse/equal, two-sided binomial p). These measure the test set's sampling only, not the variance between training runs, so a difference is called **significant** only when the seed-level test agrees: Welch's t-test over the seeds' BLEU (each seed one draw of the system, every seed of each side; Clark et al. 2011) must also give p < 0.05. Beside it, s_opt / s_sel: the system's standard deviation across seeds and within the test set (bootstrap, averaged over seeds), and where a difference is not significant, about how many seeds a side would detect one of its size (power 0.8 at 0.05, from the measured s_opt with t quantiles). On synthetic systems that differ only by seed, the pooled bootstrap's false-positive rate at 0.05 was 0.80 and Welch's 0.04 (`crates/cgnmt-eval/tests/seeds_fixtures.rs`). The paper's BLEU is the NIST MT05/06/08 average (4 references, model-spec §9): compare its differences (paper Δ), not its level.",
        super::analyses::BOOTSTRAP_SAMPLES, super::analyses::AR_TRIALS
    )));
}

/// The report's each table of the plan with its rows and its stability check.
fn main_tables(r: &Results, b: &mut Vec<Block>) {
    use Block::*;
    let head: Vec<String> = [
        "system",
        "params",
        "BLEU mean ± sd",
        "per seed (seed)",
        "sacreBLEU",
        "chrF",
        "len ratio (words)",
        "len ratio (BLEU)",
        "baseline",
        "Δ",
        "p bootstrap",
        "p AR",
        "sign test b/w/e p",
        "p Welch (seeds)",
        "s_opt / s_sel",
        "significant",
        "paper BLEU",
        "paper Δ",
        "train time",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    for (id, title) in &r.tables {
        b.push(H(2, title.clone()));
        let rows: Vec<Vec<String>> = r
            .rows
            .iter()
            .filter(|x| &x.table == id)
            .map(row_cells)
            .collect();
        b.push(Table(head.clone(), rows));
        if let Some((_, st)) = r.stability.iter().find(|(t, _)| t == id) {
            b.push(P(format!(
                "Stability: the order of the rows that train by dev BLEU (best of the evaluations so far, mean over seeds) at update {} against update {} (20% more training): Kendall's τ = {}; {}.",
                st.at_step,
                st.final_step,
                st.kendall_tau.map_or("–".into(), |t| format!("{t:.2}")),
                if st.swapped_pairs.is_empty() {
                    "no pair of rows changes order".to_string()
                } else {
                    format!(
                        "pairs that change order: {}",
                        st.swapped_pairs.iter().map(|(a, b)| format!("{a} / {b}")).collect::<Vec<_>>().join("; ")
                    )
                }
            )));
            b.push(Table(
                vec![
                    "system".into(),
                    format!("dev BLEU at {}", st.at_step),
                    format!("dev BLEU at {}", st.final_step),
                ],
                st.rows
                    .iter()
                    .map(|x| {
                        vec![
                            x.system.clone(),
                            format!("{:.2}", x.dev_bleu_at),
                            format!("{:.2}", x.dev_bleu_final),
                        ]
                    })
                    .collect(),
            ));
        }
    }
}

/// The report's the rows on each extra test set (the harder half, say).
fn extra_test_tables(r: &Results, b: &mut Vec<Block>) {
    use Block::*;
    for x in &r.extra_tests {
        b.push(H(
            2,
            format!("Test set {:?}: {} sentences", x.name, x.sentences),
        ));
        let mut what = x.description.clone();
        if x.min_ref_words > 0 {
            what += &format!(
                " (the pairs whose reference has more than {} words)",
                x.min_ref_words
            );
        }
        b.push(P(format!("{what}. The same models as above; BLEU is mteval-v11b, case-insensitive, mean ± sd over seeds; p: paired bootstrap against the row's baseline on the pooled outputs.")));
        b.push(Table(
            [
                "system",
                "BLEU mean ± sd",
                "per seed (seed)",
                "sacreBLEU",
                "chrF",
                "len ratio (words)",
                "len ratio (BLEU)",
                "baseline",
                "Δ",
                "p bootstrap",
            ]
            .iter()
            .map(|x| x.to_string())
            .collect(),
            x.rows
                .iter()
                .map(|w| {
                    vec![
                        w.system.clone(),
                        match (w.mean, w.sd) {
                            (Some(m), Some(s)) => format!("{m:.2} ± {s:.2}"),
                            (Some(m), None) => format!("{m:.2}"),
                            _ => "pending".into(),
                        },
                        w.seeds
                            .iter()
                            .zip(&w.bleu)
                            .map(|(s, b)| format!("{b:.2} ({s})"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        f2(w.sacrebleu_mean),
                        f2(w.chrf_mean),
                        f2(w.length_ratio),
                        f2(w.bleu_length_ratio),
                        w.baseline.clone().unwrap_or_else(|| "–".into()),
                        signed(w.delta),
                        w.bootstrap_p.map_or("–".into(), pval),
                    ]
                })
                .collect(),
        ));
    }
}

/// The report's the alignment quality of attention (paper Table 4).
fn alignment(r: &Results, b: &mut Vec<Block>) {
    use Block::*;
    if !r.alignment.is_empty() {
        b.push(H(
            2,
            "Alignment quality of attention (paper Table 4)".into(),
        ));
        b.push(P("Reference translations force-decoded with each seed's best model; AER of the row-wise argmax links (first maximum on ties) and soft AER (SAER) of the attention matrices against gold Sure/Possible links, mean ± sd over seeds (lower is better).".into()));
        for a in &r.alignment {
            b.push(H(3, format!("{} ({} sentence pairs)", a.name, a.sentences)));
            b.push(Table(
                vec![
                    "system".into(),
                    "AER".into(),
                    "SAER".into(),
                    "per seed AER".into(),
                ],
                a.systems
                    .iter()
                    .map(|x| {
                        let ms = |m: Option<f64>, s: Option<f64>| match (m, s) {
                            (Some(m), Some(s)) => format!("{:.2} ± {:.2}", 100.0 * m, 100.0 * s),
                            (Some(m), None) => format!("{:.2}", 100.0 * m),
                            _ => "pending".into(),
                        };
                        vec![
                            x.system.clone(),
                            ms(x.aer_mean, x.aer_sd),
                            ms(x.saer_mean, x.saer_sd),
                            x.aer
                                .iter()
                                .zip(&x.seeds)
                                .map(|(a, s)| format!("{:.2} ({s})", 100.0 * a))
                                .collect::<Vec<_>>()
                                .join(", "),
                        ]
                    })
                    .collect(),
            ));
        }
    }
}

/// The report's the gate value against translation quality (paper Table 6) and the gate values' means.
fn gates(r: &Results, b: &mut Vec<Block>) {
    use Block::*;
    if let Some(g) = &r.gate_correlation {
        b.push(H(
            2,
            "Gate value and translation quality (paper Table 6)".into(),
        ));
        b.push(P(format!(
            "Pearson correlation between a sentence's mean gate value in {} (seed {}) and its sentence-BLEU improvement over {} (seed {}); sentence BLEU: {}.",
            g.system, g.system_seed, g.baseline, g.baseline_seed, g.signature
        )));
        b.push(Table(
            vec![
                "sentences".into(),
                "n".into(),
                "Pearson r".into(),
                "mean gate".into(),
                "mean improvement".into(),
            ],
            g.correlations
                .iter()
                .map(|c| {
                    vec![
                        c.subset.clone(),
                        c.n.to_string(),
                        c.r.map_or_else(
                            || c.note.clone().unwrap_or_default(),
                            |x| format!("{x:.3}"),
                        ),
                        f2(c.mean_gate.map(|x| x)),
                        f2(c.mean_improvement),
                    ]
                })
                .collect(),
        ));
    }
    if !r.gate_histogram.is_empty() {
        b.push(H(2, "Gate values".into()));
        b.push(Table(
            vec![
                "system".into(),
                "seed".into(),
                "output words".into(),
                "mean gate".into(),
            ],
            r.gate_histogram
                .iter()
                .map(|h| {
                    vec![
                        h.system.clone(),
                        h.seed.to_string(),
                        h.words.to_string(),
                        h.mean.map_or("–".into(), |m| format!("{m:.3}")),
                    ]
                })
                .collect(),
        ));
    }
}

/// The report's context scaling (paper Figure 2 and Table 1).
fn context_scaling(r: &Results, b: &mut Vec<Block>) {
    use Block::*;
    if !r.context_scaling.is_empty() {
        b.push(H(2, "Context scaling (paper Figure 2 and Table 1)".into()));
        b.push(P("Each system's median seed decodes the test set with the source-context terms scaled by a and the target-side terms (word and state) by b.".into()));
        for c in &r.context_scaling {
            b.push(H(3, format!("{} (seed {})", c.system, c.seed)));
            b.push(Table(
                vec![
                    "(a, b)".into(),
                    "BLEU".into(),
                    "output words".into(),
                    "output / reference".into(),
                    "output / source".into(),
                ],
                c.scaling
                    .runs
                    .iter()
                    .map(|x| {
                        vec![
                            cgnmt_eval::analysis::scale_label(x.a, x.b),
                            format!("{:.2}", x.bleu),
                            x.out_words.to_string(),
                            f2(x.ratio_ref),
                            f2(x.ratio_src),
                        ]
                    })
                    .collect(),
            ));
        }
    }
}

/// The report's BLEU by source length (paper Figure 7).
fn length_groups(r: &Results, b: &mut Vec<Block>) {
    use Block::*;
    if let Some(g) = &r.length_groups {
        b.push(H(2, "BLEU by source length (paper Figure 7)".into()));
        let mut head = vec!["source words".to_string(), "sentences".into()];
        let names: Vec<String> = g
            .buckets
            .first()
            .map(|x| x.systems.iter().map(|s| s.name.clone()).collect())
            .unwrap_or_default();
        head.extend(names.iter().map(|n| format!("{n} BLEU")));
        b.push(Table(
            head,
            g.buckets
                .iter()
                .map(|k| {
                    let mut row = vec![k.label.clone(), k.sentences.to_string()];
                    row.extend(k.systems.iter().map(|s| f2(s.bleu)));
                    row
                })
                .collect(),
        ));
    }
}

/// The report's the subjective-evaluation sample (paper Table 3) and the figures.
fn subjective_and_figures(r: &Results, figures_dir: &str, b: &mut Vec<Block>) {
    use Block::*;
    if let Some(sj) = &r.subjective {
        b.push(H(2, "Subjective evaluation sample (paper Table 3)".into()));
        b.push(P(format!(
            "{} test sentences sampled at random (seed 2017), each with the outputs of {} and {} in a random order: `{}` (for raters), `{}` (which output is which). {} of the pairs are identical. To judge them: `cgnmt serve -m MODEL --eval-db judgements.sqlite --eval-pairs {}` and open `/eval`; the table: `cgnmt eval-report judgements.sqlite --key {} --baseline {:?}`.",
            sj.pairs, sj.baseline, sj.system, sj.pairs_file, sj.key_file, sj.identical, sj.pairs_file, sj.key_file, sj.baseline
        )));
    }
    if !r.figures.is_empty() {
        b.push(H(2, "Figures".into()));
        for f in &r.figures {
            b.push(Img(format!("{figures_dir}/{}", f.file), f.caption.clone()));
        }
    }
}

/// The report's the wall time of the invocations and each row's training and decoding time.
fn wall_time(r: &Results, b: &mut Vec<Block>) {
    use Block::*;
    b.push(H(2, "Wall time".into()));
    let work: f64 = r.invocations.iter().map(|i| i.work_seconds).sum();
    let own: f64 = r.invocations.iter().map(|i| i.own_seconds).sum();
    let wall: f64 = r.invocations.iter().map(|i| i.wall_seconds).sum();
    let serial: Vec<_> = r
        .invocations
        .iter()
        .filter(|i| i.jobs == 1 && !i.report_only)
        .collect();
    let serial_over = {
        let w: f64 = serial.iter().map(|i| i.work_seconds).sum();
        let all: f64 = serial.iter().map(|i| i.wall_seconds).sum();
        (w > 0.0).then(|| 100.0 * (all - w) / w)
    };
    b.push(P(format!(
        "{} invocations of `cgnmt reproduce` took {} of wall time; their child processes (training, decoding, aligning) and data preparation {}, and reproduce's own work (scoring, significance tests, analyses, figures) {} ({:.2}% of the work){}.",
        r.invocations.len(),
        fmt_duration(wall),
        fmt_duration(work),
        fmt_duration(own),
        100.0 * own / work.max(1e-9),
        serial_over.map_or(String::new(), |o| format!("; in the invocations that ran one job at a time, wall time exceeded the children's by {o:.2}%"))
    )));
    let interrupted = r.invocations.iter().filter(|i| i.partial).count();
    if interrupted > 0 {
        b.push(P(format!(
            "{interrupted} of these invocations were interrupted; each is counted up to its last finished run \
             (training it had started and not finished is not counted)."
        )));
    }
    b.push(Table(
        vec![
            "system".into(),
            "seeds".into(),
            "updates".into(),
            "training per seed".into(),
            "decoding per seed".into(),
        ],
        r.rows
            .iter()
            .map(|x| {
                vec![
                    x.system.clone(),
                    x.seeds.len().to_string(),
                    x.steps.map_or("–".into(), |s| s.to_string()),
                    x.train_seconds_mean.map_or("–".into(), fmt_duration),
                    x.decode_seconds_mean.map_or("–".into(), fmt_duration),
                ]
            })
            .collect(),
    ));
}

/// The report's the shared and each row's settings.
fn configurations(r: &Results, b: &mut Vec<Block>) {
    use Block::*;
    b.push(H(2, "Configurations".into()));
    b.push(P("Settings shared by every system (on top of the defaults, `configs/paper.toml`'s paper values), then each system's own; each run's resolved configuration is `systems/<row>/seed-<s>/config.toml`.".into()));
    b.push(Code(r.shared_settings.join("\n")));
    b.push(Table(
        vec!["system".into(), "settings".into()],
        r.systems
            .iter()
            .map(|x| vec![x.name.clone(), system_settings(x)])
            .collect(),
    ));
}

/// A row's own settings: its `--set`s, its `prepare` arguments, and how it decodes (another row's models,
/// extra `translate` arguments, an average of checkpoints, an ensemble of the seeds).
fn system_settings(x: &super::plan::SystemSpec) -> String {
    let mut parts = vec![];
    if let Some(f) = &x.from {
        parts.push(format!("the models of {f:?}"));
    }
    if !x.set.is_empty() {
        parts.push(format!("`{}`", x.set.join(" ")));
    }
    if !x.prepare.is_empty() {
        parts.push(format!("prepare `{}`", x.prepare.join(" ")));
    }
    if let Some(n) = x.seeds {
        parts.push(format!("the first {n} seed(s)"));
    }
    if x.choose {
        parts.push(format!(
            "model (best, the average of the converged tail of the last {} kept checkpoints, or the moving \
             average) and length/coverage penalties chosen on dev",
            if x.average > 0 {
                x.average.to_string()
            } else {
                "all".into()
            }
        ));
    } else if x.average > 0 {
        parts.push(format!("average of the last {} checkpoints", x.average));
    }
    if x.ensemble {
        parts.push("ensemble of the seeds".into());
    }
    if !x.decode.is_empty() {
        parts.push(format!("translate `{}`", x.decode.join(" ")));
    }
    if parts.is_empty() {
        "–".into()
    } else {
        parts.join("; ")
    }
}

fn md(blocks: &[Block]) -> String {
    let mut o = String::new();
    let cell = |c: &str| c.replace('|', "\\|").replace('\n', " ");
    for b in blocks {
        match b {
            Block::H(n, t) => {
                let _ = writeln!(o, "{} {t}\n", "#".repeat(*n as usize));
            }
            Block::P(t) => {
                let _ = writeln!(o, "{t}\n");
            }
            Block::List(items) => {
                for i in items {
                    let _ = writeln!(o, "- {i}");
                }
                o.push('\n');
            }
            Block::Table(head, rows) => {
                let _ = writeln!(
                    o,
                    "| {} |",
                    head.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | ")
                );
                let _ = writeln!(o, "|{}", "---|".repeat(head.len()));
                for r in rows {
                    let _ = writeln!(
                        o,
                        "| {} |",
                        r.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | ")
                    );
                }
                o.push('\n');
            }
            Block::Img(file, cap) => {
                let _ = writeln!(o, "![{cap}]({file})\n\n*{cap}*\n");
            }
            Block::Code(t) => {
                let _ = writeln!(o, "```\n{t}\n```\n");
            }
        }
    }
    o
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Escaped text with `code` spans and **bold**.
fn inline(s: &str) -> String {
    let mut out = String::new();
    for (k, part) in esc(s).split('`').enumerate() {
        if k % 2 == 1 {
            let _ = write!(out, "<code>{part}</code>");
        } else {
            for (j, q) in part.split("**").enumerate() {
                if j % 2 == 1 {
                    let _ = write!(out, "<strong>{q}</strong>");
                } else {
                    out.push_str(q);
                }
            }
        }
    }
    out
}

fn html(blocks: &[Block], s: &Setup, title: &str) -> Result<String> {
    let mut o = String::new();
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\n<style>\
body{{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;line-height:1.45;color:#222}}\
table{{border-collapse:collapse;margin:1em 0;font-size:0.9em}}td,th{{border:1px solid #ccc;padding:3px 7px;text-align:left}}\
th{{background:#f3f3f3}}tr:nth-child(even) td{{background:#fafafa}}img{{max-width:100%;border:1px solid #ddd}}\
figure{{margin:1.5em 0}}figcaption{{font-style:italic;color:#555}}code,pre{{background:#f6f6f6}}pre{{padding:0.6em;overflow-x:auto}}\
</style></head><body>\n",
        esc(title)
    );
    for b in blocks {
        match b {
            Block::H(n, t) => {
                let _ = writeln!(o, "<h{n}>{}</h{n}>", inline(t));
            }
            Block::P(t) => {
                let _ = writeln!(o, "<p>{}</p>", inline(t));
            }
            Block::List(items) => {
                o.push_str("<ul>\n");
                for i in items {
                    let _ = writeln!(o, "<li>{}</li>", inline(i));
                }
                o.push_str("</ul>\n");
            }
            Block::Table(head, rows) => {
                o.push_str("<table><thead><tr>");
                for h in head {
                    let _ = write!(o, "<th>{}</th>", inline(h));
                }
                o.push_str("</tr></thead><tbody>\n");
                for r in rows {
                    o.push_str("<tr>");
                    for c in r {
                        let _ = write!(o, "<td>{}</td>", inline(c));
                    }
                    o.push_str("</tr>\n");
                }
                o.push_str("</tbody></table>\n");
            }
            Block::Img(file, cap) => {
                let bytes = std::fs::read(s.out.join(file))?;
                let _ = writeln!(
                    o,
                    "<figure><img alt=\"{}\" src=\"data:image/png;base64,{}\"><figcaption>{}</figcaption></figure>",
                    esc(cap),
                    base64::encode(&bytes),
                    inline(cap)
                );
            }
            Block::Code(t) => {
                let _ = writeln!(o, "<pre><code>{}</code></pre>", esc(t));
            }
        }
    }
    o.push_str("</body></html>\n");
    Ok(o)
}

/// Write `results.json`, `report.md` and `report.html` (for a part of the plan's seeds, `results-seeds-1-2.json`
/// and so on: the whole plan's report is left as it is).
pub fn write(s: &Setup, r: &Results) -> Result<()> {
    write_atomic(
        &s.report_file("results", "json"),
        serde_json::to_string_pretty(r)?.as_bytes(),
    )?;
    let b = blocks(r, &s.report_suffix());
    write_atomic(&s.report_file("report", "md"), md(&b).as_bytes())?;
    let title = format!("Reproduction of Tu et al. (2017): {}", r.plan);
    write_atomic(
        &s.report_file("report", "html"),
        html(&b, s, &title)?.as_bytes(),
    )?;
    Ok(())
}

/// The commands that trained the runs (the invocations that were not `--report-only`, each once, with the
/// commits of their binaries), as recorded in `invocations.jsonl`; records of earlier versions hold none.
fn training_commands(r: &super::analyses::Results) -> String {
    let mut seen: Vec<(String, String)> = vec![];
    for i in r
        .invocations
        .iter()
        .filter(|i| !i.report_only && !i.command.is_empty())
    {
        if !seen.iter().any(|(c, k)| c == &i.command && k == &i.commit) {
            seen.push((i.command.clone(), i.commit.clone()));
        }
    }
    if seen.is_empty() {
        return "Training commands: not recorded (invocations of an earlier version).".into();
    }
    let list: Vec<String> = seen
        .iter()
        .map(|(c, k)| format!("`{c}` (commit `{k}`)"))
        .collect();
    format!("Training commands: {}.", list.join("; "))
}
