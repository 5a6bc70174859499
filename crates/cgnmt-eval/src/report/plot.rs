//! `cgnmt plot`: attention heatmaps with gate bars, and training curves.

use super::*;

#[derive(Debug, Clone)]
pub struct PlotAttentionOptions {
    /// Translation dump (`cgnmt translate --dump`), JSON lines.
    pub dump: PathBuf,
    /// Sentence id (0-based, the record's `id`).
    pub id: usize,
    /// Output file, .png or .svg.
    pub output: PathBuf,
}

/// `cgnmt plot training`: loss per token and dev BLEU against the step.
#[derive(Debug, Clone)]
pub struct PlotTrainingOptions {
    /// Training log (`train.log`, JSON lines).
    pub log: PathBuf,
    /// Output file, .png or .svg.
    pub output: PathBuf,
}

/// The `plot` subcommands.
#[derive(Debug, Clone)]
pub enum PlotCmd {
    /// Attention heatmap with gate values of one translation (paper Fig. 6).
    Attention(PlotAttentionOptions),
    /// Training curves: loss per token and dev BLEU against the step.
    Training(PlotTrainingOptions),
}

/// `cgnmt plot …`: figures.
#[derive(Debug, Clone)]
pub struct PlotOptions {
    /// The figure.
    pub cmd: PlotCmd,
}

/// Runs `cgnmt plot …`.
pub fn run_plot(args: &PlotOptions) -> anyhow::Result<()> {
    run_plot_to(args, &mut std::io::stdout().lock())
}

/// Like [`run_plot`] but writes its one-line report to `o`.
pub fn run_plot_to(args: &PlotOptions, o: &mut dyn Write) -> anyhow::Result<()> {
    match &args.cmd {
        PlotCmd::Attention(a) => {
            crate::plot::format_of(&a.output)?;
            let records = crate::analysis::read_dump(&a.dump)?;
            if records.is_empty() {
                return Err(EvalError::EmptyFile {
                    path: a.dump.clone(),
                }
                .into());
            }
            let rec = records.iter().find(|r| r.id == Some(a.id)).ok_or_else(|| {
                let max = records.iter().filter_map(|r| r.id).max().unwrap_or(0);
                anyhow::anyhow!(
                    "{}: no record with id {} (ids go up to {max})",
                    a.dump.display(),
                    a.id
                )
            })?;
            let fig = crate::plot::AttentionFigure::from_record(rec)
                .with_context(|| format!("{}", a.dump.display()))?;
            crate::plot::save(&fig, &a.output)?;
            writeln!(o, "wrote {}", a.output.display())?;
        }
        PlotCmd::Training(a) => {
            crate::plot::format_of(&a.output)?;
            let log = crate::analysis::read_training_log(&a.log)?;
            if log.steps.is_empty() && log.evals.is_empty() {
                bail!(
                    "{}: no training (`step`) or evaluation (`eval`) lines",
                    a.log.display()
                );
            }
            let title = a
                .log
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            let fig = crate::plot::TrainingFigure { log, title };
            crate::plot::save(&fig, &a.output)?;
            writeln!(o, "wrote {}", a.output.display())?;
        }
    }
    o.flush()?;
    Ok(())
}
