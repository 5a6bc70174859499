//! `cgnmt eval-report`: the subjective evaluation's report (paper Table 3) from the judgement database of
//! `cgnmt serve --eval-db`: mean adequacy and fluency, better / equal / worse with the sign test
//! (`cgnmt_subjective`).

use std::path::PathBuf;

use anyhow::Result;

/// Arguments of `cgnmt eval-report`.
#[derive(clap::Args, Debug)]
pub struct EvalReportArgs {
    /// The judgement database (`cgnmt serve --eval-db`).
    pub db: PathBuf,
    /// The key file written beside the pairs file (key.jsonl).
    #[arg(long)]
    pub key: PathBuf,
    /// The baseline system (default: the first of the key's two names in alphabetical order).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: EvalReportArgs) -> Result<()> {
    let r = cgnmt_subjective::report_of_store(&a.db, &a.key, a.baseline.as_deref())?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{r}");
    }
    Ok(())
}
