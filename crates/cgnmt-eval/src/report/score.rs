//! `cgnmt score`: corpus and sentence BLEU / chrF of a hypothesis file against one or more references.

use super::*;

/// `cgnmt score`: corpus (or per-sentence) BLEU / chrF / chrF++ of a hypothesis file.
#[derive(Debug, Clone)]
pub struct ScoreOptions {
    /// Reference file (repeat `-r` for several references).
    pub refs: Vec<PathBuf>,
    /// Hypothesis file (default: standard input).
    pub input: Option<PathBuf>,
    /// Metric.
    pub metric: MetricArg,
    /// Metric configuration.
    pub opts: MetricOptions,
    /// Print one score per segment (sentence BLEU with effective order, as sacreBLEU's
    /// `sentence_bleu`; sentence chrF).
    pub sentence: bool,
    /// JSON output (one object; with --sentence one object per line).
    pub json: bool,
    /// Decimals in the human-readable output.
    pub width: usize,
}

/// Reads the references and the hypothesis (file or stdin) and checks the line counts.
pub fn read_inputs(
    refs: &[PathBuf],
    input: Option<&Path>,
) -> anyhow::Result<(Vec<String>, Vec<Vec<String>>)> {
    let (hyps, hyp_name) = match input {
        Some(p) => (read_nonempty_lines(p)?, p.to_path_buf()),
        None => {
            let h = read_stdin_lines()?;
            if h.is_empty() {
                return Err(EvalError::EmptyFile {
                    path: PathBuf::from("<stdin>"),
                }
                .into());
            }
            (h, PathBuf::from("<stdin>"))
        }
    };
    let mut rs = Vec::with_capacity(refs.len());
    for r in refs {
        let lines = read_nonempty_lines(r)?;
        if lines.len() != hyps.len() {
            return Err(EvalError::LineCountMismatch {
                a: hyp_name,
                a_lines: hyps.len(),
                b: r.clone(),
                b_lines: lines.len(),
            }
            .into());
        }
        rs.push(lines);
    }
    Ok((hyps, rs))
}

pub fn bleu_json(b: &BleuScore) -> serde_json::Value {
    json!({
        "name": "BLEU",
        "score": b.score,
        "counts": b.counts,
        "totals": b.totals,
        "precisions": b.precisions,
        "bp": b.bp,
        "sys_len": b.sys_len,
        "ref_len": b.ref_len,
        "signature": b.signature,
    })
}

pub fn chrf_json(c: &ChrfScore) -> serde_json::Value {
    json!({ "name": c.name, "score": c.score, "signature": c.signature })
}

pub fn bleu_line(b: &BleuScore, w: usize) -> String {
    let ratio = if b.ref_len > 0 {
        b.sys_len as f64 / b.ref_len as f64
    } else {
        0.0
    };
    format!(
        "BLEU|{} = {:.w$} {:.1}/{:.1}/{:.1}/{:.1} (BP = {:.3} ratio = {:.3} hyp_len = {} ref_len = {})",
        b.signature,
        b.score,
        b.precisions[0],
        b.precisions[1],
        b.precisions[2],
        b.precisions[3],
        b.bp,
        ratio,
        b.sys_len,
        b.ref_len
    )
}

/// Runs `cgnmt score`.
pub fn run_score(args: &ScoreOptions) -> anyhow::Result<()> {
    run_score_to(args, &mut std::io::stdout().lock())
}

/// Like [`run_score`] but writes to `o`.
pub fn run_score_to(args: &ScoreOptions, o: &mut dyn Write) -> anyhow::Result<()> {
    let (hyps, refs) = read_inputs(&args.refs, args.input.as_deref())?;
    let w = args.width;
    match args.metric {
        MetricArg::Bleu => {
            let mut opts = args.opts.bleu_options()?;
            if args.sentence {
                opts.effective_order = true;
                for (i, h) in hyps.iter().enumerate() {
                    let r: Vec<String> = refs.iter().map(|r| r[i].clone()).collect();
                    let b = sentence_bleu(h, &r, &opts)?;
                    if args.json {
                        writeln!(o, "{}", bleu_json(&b))?;
                    } else {
                        writeln!(o, "{}", bleu_line(&b, w))?;
                    }
                }
            } else {
                let b = corpus_bleu(&hyps, &refs, &opts)?;
                if args.json {
                    writeln!(o, "{}", serde_json::to_string_pretty(&bleu_json(&b))?)?;
                } else {
                    writeln!(o, "{}", bleu_line(&b, w))?;
                }
            }
        }
        MetricArg::Chrf | MetricArg::ChrfPlusPlus => {
            let opts = args
                .opts
                .chrf_options(args.metric == MetricArg::ChrfPlusPlus)?;
            let scores: Vec<ChrfScore> = if args.sentence {
                let mut v = Vec::with_capacity(hyps.len());
                for (i, h) in hyps.iter().enumerate() {
                    let r: Vec<String> = refs.iter().map(|r| r[i].clone()).collect();
                    v.push(sentence_chrf(h, &r, &opts)?);
                }
                v
            } else {
                vec![corpus_chrf(&hyps, &refs, &opts)?]
            };
            for c in &scores {
                if args.json && !args.sentence {
                    writeln!(o, "{}", serde_json::to_string_pretty(&chrf_json(c))?)?;
                } else if args.json {
                    writeln!(o, "{}", chrf_json(c))?;
                } else {
                    writeln!(o, "{}|{} = {:.w$}", c.name, c.signature, c.score)?;
                }
            }
        }
    }
    o.flush()?;
    Ok(())
}
