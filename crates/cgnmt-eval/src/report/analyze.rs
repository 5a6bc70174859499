//! `cgnmt analyze`: the paper's analyses: BLEU by length group (Figure 7), gate value against sentence-BLEU gain
//! (Table 6), context scaling.

use super::*;

/// BLEU flavour of the analyses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BleuFlavour {
    /// NIST mteval-v11b.pl (the paper's metric: its tokenisation, shortest reference, no
    /// smoothing).
    #[value(name = "mteval-v11b")]
    MtevalV11b,
    /// sacreBLEU default (13a tokenisation, closest reference, exp smoothing).
    #[value(name = "sacrebleu")]
    Sacrebleu,
}

/// Corpus-BLEU options of `analyze lengths` and `analyze context-scaling`.
#[derive(Debug, Clone)]
pub struct AnalysisBleuOptions {
    /// BLEU flavour.
    pub bleu: BleuFlavour,
    /// Case-sensitive BLEU (default: case-insensitive, as in the paper).
    pub cased: bool,
}

impl AnalysisBleuOptions {
    /// The BLEU options these flags describe.
    pub fn options(&self) -> BleuOptions {
        let mut o = match self.bleu {
            BleuFlavour::MtevalV11b => BleuOptions::mteval_v11b(),
            BleuFlavour::Sacrebleu => BleuOptions::sacrebleu(),
        };
        o.lowercase = !self.cased;
        o
    }
}

/// `NAME=FILE` on the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedFile {
    /// The name.
    pub name: String,
    /// The file.
    pub path: PathBuf,
}

pub fn parse_named_file(s: &str) -> Result<NamedFile, String> {
    match s.split_once('=') {
        Some((n, p)) if !n.trim().is_empty() && !p.is_empty() => Ok(NamedFile {
            name: n.trim().to_string(),
            path: PathBuf::from(p),
        }),
        _ => Err(format!("expected NAME=FILE, got `{s}`")),
    }
}

/// `A,B=FILE` on the command line (source scale, target scale, outputs).
#[derive(Debug, Clone, PartialEq)]
pub struct ScaledRun {
    /// Scale of the source context.
    pub a: f64,
    /// Scale of the target context.
    pub b: f64,
    /// The outputs decoded with these scales.
    pub path: PathBuf,
}

pub fn parse_scaled_run(s: &str) -> Result<ScaledRun, String> {
    let bad = || format!("expected A,B=FILE (e.g. 1.0,0.5=out.txt), got `{s}`");
    let (ab, p) = s.split_once('=').ok_or_else(bad)?;
    let (a, b) = ab.split_once(',').ok_or_else(bad)?;
    let num = |x: &str| {
        x.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(bad)
    };
    if p.is_empty() {
        return Err(bad());
    }
    Ok(ScaledRun {
        a: num(a)?,
        b: num(b)?,
        path: PathBuf::from(p),
    })
}

/// `cgnmt analyze lengths`: BLEU and mean output length per source-length group (paper Fig. 7).
#[derive(Debug, Clone)]
pub struct LengthsOptions {
    /// Source file (one sentence per line, words separated by spaces).
    pub src: PathBuf,
    /// Reference file (repeat `-r` for several references).
    pub refs: Vec<PathBuf>,
    /// System outputs as NAME=FILE (repeat for several systems).
    pub systems: Vec<NamedFile>,
    /// Bucket edges in source words (buckets <e1, e1-e2, …, ≥en).
    pub edges: Vec<usize>,
    /// BLEU configuration.
    pub bleu: AnalysisBleuOptions,
    /// JSON output.
    pub json: bool,
    /// Also draw the chart (BLEU and output length per group) to this .png or .svg file.
    pub plot: Option<PathBuf>,
}

/// `cgnmt analyze gates`: mean gate value per sentence against the sentence-BLEU improvement
/// over a baseline, with Pearson correlations (paper Table 6).
#[derive(Debug, Clone)]
pub struct GatesOptions {
    /// Source file (one sentence per line; its word counts define "long" sentences).
    pub src: PathBuf,
    /// Reference file (repeat `-r` for several references).
    pub refs: Vec<PathBuf>,
    /// Baseline outputs.
    pub baseline: PathBuf,
    /// Outputs of the gated system.
    pub system: PathBuf,
    /// Translation dump of the gated system (`cgnmt translate --dump`), JSON lines with `gates`.
    pub dump: PathBuf,
    /// Sentences with at least this many source words are "long".
    pub long: usize,
    /// Case-sensitive sentence BLEU (default: case-insensitive).
    pub cased: bool,
    /// JSON output (with the per-sentence values).
    pub json: bool,
}

/// `cgnmt analyze context-scaling`: translation length and BLEU of outputs decoded with the
/// source context scaled by a and the target context by b (paper Fig. 2a / Table 1).
#[derive(Debug, Clone)]
pub struct ContextScalingOptions {
    /// Source file.
    pub src: PathBuf,
    /// Reference file (repeat `-r` for several references).
    pub refs: Vec<PathBuf>,
    /// Outputs of one setting as A,B=FILE, e.g. `--run 1.0,0.5=out.b05.txt` (repeat).
    pub runs: Vec<ScaledRun>,
    /// BLEU configuration.
    pub bleu: AnalysisBleuOptions,
    /// JSON output.
    pub json: bool,
    /// Also draw the chart (length ratio and BLEU per setting) to this .png or .svg file.
    pub plot: Option<PathBuf>,
}

/// The `analyze` subcommands.
#[derive(Debug, Clone)]
pub enum AnalyzeCmd {
    /// BLEU and mean output length by source-length group (paper Fig. 7).
    Lengths(LengthsOptions),
    /// Gate values against sentence-BLEU improvement over a baseline (paper Table 6).
    Gates(GatesOptions),
    /// Translation length ratio and BLEU under context scaling (paper Fig. 2a / Table 1).
    ContextScaling(ContextScalingOptions),
}

/// `cgnmt analyze …`: the paper's analyses.
#[derive(Debug, Clone)]
pub struct AnalyzeOptions {
    /// The analysis.
    pub cmd: AnalyzeCmd,
}

/// `cgnmt plot attention`: attention heatmap (with gate values) of one translation (Fig. 6).
/// Reads the source and references and checks that they are parallel.
pub(super) fn read_src_refs(
    src: &Path,
    refs: &[PathBuf],
) -> anyhow::Result<(Vec<String>, Vec<Vec<String>>)> {
    let s = read_nonempty_lines(src)?;
    let mut rs = Vec::with_capacity(refs.len());
    for r in refs {
        rs.push(read_parallel(r, src, s.len())?);
    }
    Ok((s, rs))
}

/// Reads `path` and checks it has `n` lines like `like`.
pub(super) fn read_parallel(path: &Path, like: &Path, n: usize) -> anyhow::Result<Vec<String>> {
    let lines = crate::io::read_lines(path)?;
    if lines.len() != n {
        return Err(EvalError::LineCountMismatch {
            a: like.to_path_buf(),
            a_lines: n,
            b: path.to_path_buf(),
            b_lines: lines.len(),
        }
        .into());
    }
    Ok(lines)
}

pub(super) fn check_plot_path(p: &Option<PathBuf>) -> anyhow::Result<()> {
    if let Some(p) = p {
        crate::plot::format_of(p)?;
    }
    Ok(())
}

pub(super) fn opt(v: Option<f64>, w: usize, prec: usize) -> String {
    match v {
        Some(x) => format!("{x:>w$.prec$}"),
        None => format!("{:>w$}", "-"),
    }
}

/// Runs `cgnmt analyze …`.
pub fn run_analyze(args: &AnalyzeOptions) -> anyhow::Result<()> {
    run_analyze_to(args, &mut std::io::stdout().lock())
}

/// Like [`run_analyze`] but writes to `o`.
pub fn run_analyze_to(args: &AnalyzeOptions, o: &mut dyn Write) -> anyhow::Result<()> {
    match &args.cmd {
        AnalyzeCmd::Lengths(a) => run_lengths_to(a, o),
        AnalyzeCmd::Gates(a) => run_gates_to(a, o),
        AnalyzeCmd::ContextScaling(a) => run_context_scaling_to(a, o),
    }
}

fn run_lengths_to(args: &LengthsOptions, o: &mut dyn Write) -> anyhow::Result<()> {
    check_plot_path(&args.plot)?;
    crate::analysis::check_edges(&args.edges)?;
    let (src, refs) = read_src_refs(&args.src, &args.refs)?;
    let mut systems = Vec::with_capacity(args.systems.len());
    for s in &args.systems {
        if systems
            .iter()
            .any(|(n, _): &(String, Vec<String>)| *n == s.name)
        {
            bail!("system name `{}` given twice", s.name);
        }
        systems.push((
            s.name.clone(),
            read_parallel(&s.path, &args.src, src.len())?,
        ));
    }
    let opts = args.bleu.options();
    let g = crate::analysis::length_groups(&src, &refs, &systems, &args.edges, &opts)?;
    if args.json {
        let mut v = serde_json::to_value(&g)?;
        v["src"] = json!(args.src.display().to_string());
        v["systems"] = json!(args
            .systems
            .iter()
            .map(|s| json!({"name": s.name, "file": s.path.display().to_string()}))
            .collect::<Vec<_>>());
        writeln!(o, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        writeln!(o, "BLEU|{} by source length (words)", g.signature)?;
        let mut head = format!(
            "{:<8} {:>6} {:>8} {:>8}",
            "length", "sents", "src_len", "ref_len"
        );
        let widths: Vec<usize> = systems
            .iter()
            .map(|(n, _)| n.chars().count().max(13))
            .collect();
        for ((n, _), w) in systems.iter().zip(&widths) {
            head.push_str(&format!(" | {n:^w$}"));
        }
        writeln!(o, "{head}")?;
        let mut sub = format!("{:<8} {:>6} {:>8} {:>8}", "", "", "", "");
        for w in &widths {
            sub.push_str(&format!(" | {:>6} {:>w2$}", "BLEU", "len", w2 = w - 7));
        }
        writeln!(o, "{sub}")?;
        for b in &g.buckets {
            let mut line = format!(
                "{:<8} {:>6} {} {}",
                b.label,
                b.sentences,
                opt(b.mean_src_len, 8, 2),
                opt(b.mean_ref_len, 8, 2)
            );
            for (s, w) in b.systems.iter().zip(&widths) {
                line.push_str(&format!(
                    " | {} {}",
                    opt(s.bleu, 6, 2),
                    opt(s.mean_len, w - 7, 2)
                ));
            }
            writeln!(o, "{line}")?;
        }
    }
    if let Some(p) = &args.plot {
        crate::plot::save(&crate::plot::length_groups_figure(&g), p)?;
        eprintln!("wrote {}", p.display());
    }
    o.flush()?;
    Ok(())
}

fn run_gates_to(args: &GatesOptions, o: &mut dyn Write) -> anyhow::Result<()> {
    let (src, refs) = read_src_refs(&args.src, &args.refs)?;
    let base = read_parallel(&args.baseline, &args.src, src.len())?;
    let sys = read_parallel(&args.system, &args.src, src.len())?;
    let records = crate::analysis::read_dump(&args.dump)?;
    let records = crate::analysis::dump_by_id(records, src.len(), &args.dump)?;
    let gates: Vec<Option<f64>> = records.iter().map(|r| r.mean_gate()).collect();
    if gates.iter().all(|g| g.is_none()) {
        bail!(
            "{}: no record has gate values (`gates` is empty everywhere): was the dump written by a model without a context gate?",
            args.dump.display()
        );
    }
    let mut opts = BleuOptions::sentence();
    opts.lowercase = !args.cased;
    let a = crate::analysis::gate_analysis(&src, &refs, &base, &sys, &gates, args.long, &opts)?;
    if args.json {
        let mut v = serde_json::to_value(&a)?;
        v["baseline"] = json!(args.baseline.display().to_string());
        v["system"] = json!(args.system.display().to_string());
        v["dump"] = json!(args.dump.display().to_string());
        writeln!(o, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        writeln!(
            o,
            "Mean gate value per sentence vs sentence-BLEU improvement of {} over {}",
            args.system.display(),
            args.baseline.display()
        )?;
        writeln!(o, "sentence BLEU|{}", a.signature)?;
        writeln!(
            o,
            "{:<14} {:>6} {:>10} {:>11} {:>10}",
            "sentences", "n", "mean gate", "mean ΔBLEU", "pearson r"
        )?;
        for c in &a.correlations {
            writeln!(
                o,
                "{:<14} {:>6} {} {} {}",
                c.subset,
                c.n,
                opt(c.mean_gate, 10, 4),
                match c.mean_improvement {
                    Some(x) => format!("{x:>+11.2}"),
                    None => format!("{:>11}", "-"),
                },
                match (c.r, &c.note) {
                    (Some(r), _) => format!("{r:>10.4}"),
                    (None, Some(n)) => format!("{:>10}  ({n})", "-"),
                    (None, None) => format!("{:>10}", "-"),
                }
            )?;
        }
        let missing = gates.iter().filter(|g| g.is_none()).count();
        if missing > 0 {
            writeln!(o, "({missing} sentences without gate values are left out)")?;
        }
    }
    o.flush()?;
    Ok(())
}

fn run_context_scaling_to(args: &ContextScalingOptions, o: &mut dyn Write) -> anyhow::Result<()> {
    check_plot_path(&args.plot)?;
    let (src, refs) = read_src_refs(&args.src, &args.refs)?;
    let mut runs = Vec::with_capacity(args.runs.len());
    for r in &args.runs {
        runs.push(((r.a, r.b), read_parallel(&r.path, &args.src, src.len())?));
    }
    let opts = args.bleu.options();
    let c = crate::analysis::context_scaling(&src, &refs, &runs, &opts)?;
    if args.json {
        let mut v = serde_json::to_value(&c)?;
        if let Some(arr) = v["runs"].as_array_mut() {
            for (x, r) in arr.iter_mut().zip(&args.runs) {
                x["file"] = json!(r.path.display().to_string());
            }
        }
        writeln!(o, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        writeln!(o, "Context scaling: source context × a, target context × b")?;
        writeln!(o, "BLEU|{}", c.signature)?;
        writeln!(
            o,
            "{:<14} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7}  file",
            "(a, b)", "out_words", "src_words", "ref_words", "out/src", "out/ref", "BLEU"
        )?;
        for (r, a) in c.runs.iter().zip(&args.runs) {
            writeln!(
                o,
                "{:<14} {:>9} {:>9} {:>9.1} {} {} {:>7.2}  {}",
                crate::analysis::scale_label(r.a, r.b),
                r.out_words,
                r.src_words,
                r.ref_words,
                opt(r.ratio_src, 8, 3),
                opt(r.ratio_ref, 8, 3),
                r.bleu,
                a.path.display()
            )?;
        }
    }
    if let Some(p) = &args.plot {
        crate::plot::save(&crate::plot::context_scaling_figure(&c), p)?;
        eprintln!("wrote {}", p.display());
    }
    o.flush()?;
    Ok(())
}
