//! `cgnmt aer`: alignment error rate (AER, and SAER from soft attention) against gold sure/possible links.

use super::*;

/// `cgnmt aer`: alignment error rate of predicted links (and soft AER of attention matrices).
#[derive(Debug, Clone)]
pub struct AerOptions {
    /// Gold alignments (`.talp`: `i-j` sure, `i?j` possible, 0-based).
    pub gold: PathBuf,
    /// Predicted alignments (`.talp`). Without it, --soft's row-wise argmax links are scored.
    pub pred: Option<PathBuf>,
    /// Soft alignments, JSONL: one `{"attention": [[weight per source word] per target word]}`
    /// per sentence pair (extra keys ignored). Gold links `i-j` must then have i = source,
    /// j = target.
    pub soft: Option<PathBuf>,
    /// Optional whitespace-tokenised sentences of the first-named language, to check that
    /// every link's first index is in range.
    pub first_text: Option<PathBuf>,
    /// Optional whitespace-tokenised sentences of the second language (second index).
    pub second_text: Option<PathBuf>,
    /// JSON output.
    pub json: bool,
}

/// Runs `cgnmt aer`.
pub fn run_aer(args: &AerOptions) -> anyhow::Result<()> {
    run_aer_to(args, &mut std::io::stdout().lock())
}

/// Like [`run_aer`] but writes to `o`.
pub fn run_aer_to(args: &AerOptions, o: &mut dyn Write) -> anyhow::Result<()> {
    let gold = aer::read_gold(&args.gold)?;
    if gold.is_empty() {
        return Err(EvalError::EmptyFile {
            path: args.gold.clone(),
        }
        .into());
    }
    let soft = match &args.soft {
        Some(p) => {
            let s = aer::read_soft_jsonl(p)?;
            if s.len() != gold.len() {
                return Err(EvalError::LineCountMismatch {
                    a: args.gold.clone(),
                    a_lines: gold.len(),
                    b: p.clone(),
                    b_lines: s.len(),
                }
                .into());
            }
            Some(s)
        }
        None => None,
    };
    let (pred, pred_name) = match (&args.pred, &soft) {
        (Some(p), _) => (aer::read_pred(p)?, p.clone()),
        (None, Some(s)) => (aer::argmax_links(s), PathBuf::from("<argmax of --soft>")),
        (None, None) => bail!("give --pred and/or --soft"),
    };
    if pred.len() != gold.len() {
        return Err(EvalError::LineCountMismatch {
            a: args.gold.clone(),
            a_lines: gold.len(),
            b: pred_name,
            b_lines: pred.len(),
        }
        .into());
    }
    if let (Some(f), Some(s)) = (&args.first_text, &args.second_text) {
        let fl = crate::io::read_lines(f)?;
        let sl = crate::io::read_lines(s)?;
        if fl.len() != sl.len() {
            return Err(EvalError::LineCountMismatch {
                a: f.clone(),
                a_lines: fl.len(),
                b: s.clone(),
                b_lines: sl.len(),
            }
            .into());
        }
        let lens: Vec<(usize, usize)> = fl
            .iter()
            .zip(&sl)
            .map(|(a, b)| (a.split_whitespace().count(), b.split_whitespace().count()))
            .collect();
        aer::validate_ranges(&aer::gold_as_links(&gold), &lens, &args.gold)?;
        if let Some(p) = &args.pred {
            aer::validate_ranges(&pred, &lens, p)?;
        }
    }
    let soft_name = args
        .soft
        .as_deref()
        .unwrap_or(Path::new(""))
        .display()
        .to_string();
    let (v, text) = aer_report(&gold, &pred, soft.as_deref(), &soft_name)?;
    if args.json {
        writeln!(o, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        write!(o, "{text}")?;
    }
    o.flush()?;
    Ok(())
}

/// Corpus AER of `pred` against `gold` (and soft AER of the attention matrices `soft`, named `soft_name` in
/// errors): the JSON record `aer --json` prints, and its text lines.
pub fn aer_report(
    gold: &[aer::GoldLinks],
    pred: &[Vec<aer::Link>],
    soft: Option<&[Vec<Vec<f64>>]>,
    soft_name: &str,
) -> anyhow::Result<(serde_json::Value, String)> {
    use std::fmt::Write as _;
    let r = aer::aer(gold, pred).context("computing AER")?;
    let s = match soft {
        Some(m) => Some(aer::saer(gold, m).with_context(|| {
            format!(
                "soft AER of {soft_name} (rows = target words, columns = source words; gold i-j = \
                 source-target)"
            )
        })?),
        None => None,
    };
    let mut v = json!({
        "precision": r.precision,
        "recall": r.recall,
        "aer": r.aer,
        "a": r.a,
        "s": r.s,
        "p": r.p,
        "a_and_s": r.a_and_s,
        "a_and_p": r.a_and_p,
        "sentences": gold.len(),
    });
    if let Some(s) = &s {
        v["saer"] = json!(s.saer);
        v["saer_macro"] = json!(s.macro_saer);
        v["sum_ma"] = json!(s.totals.sum_ma);
        v["sum_ma_ms"] = json!(s.totals.sum_ma_ms);
        v["sum_ma_mp"] = json!(s.totals.sum_ma_mp);
    }
    let mut text = String::new();
    writeln!(
            text,
            "AER = {:.2}% (precision {:.2}%, recall {:.2}%; |A| = {}, |S| = {}, |P| = {}, |A∩S| = {}, |A∩P| = {}; {} sentences)",
            100.0 * r.aer,
            100.0 * r.precision,
            100.0 * r.recall,
            r.a,
            r.s,
            r.p,
            r.a_and_s,
            r.a_and_p,
            gold.len()
        )?;
    if let Some(s) = &s {
        writeln!(
                text,
                "SAER = {:.2}% (micro; macro {:.2}%; |M_A| = {:.4}, |M_A·M_S| = {:.4}, |M_A·M_P| = {:.4})",
                100.0 * s.saer,
                100.0 * s.macro_saer,
                s.totals.sum_ma,
                s.totals.sum_ma_ms,
                s.totals.sum_ma_mp
            )?;
    }
    Ok((v, text))
}
