//! `cgnmt align`: word alignments from attention for AER/SAER. Under `mpiexec -n N` (a build with
//! `--features mpi`) each rank force-decodes every N-th pair and rank 0 writes both files in input order, all or
//! nothing, byte for byte what one process writes.

use std::path::PathBuf;

use anyhow::Result;

use cgnmt::atomic_file::write_atomic;

#[derive(clap::Args)]
pub struct AlignArgs {
    /// Model directory (a run directory means its best/ model).
    #[arg(short, long)]
    model: PathBuf,
    /// Source sentences, tokenised with spaces (the gold alignment's tokens).
    #[arg(long)]
    src: PathBuf,
    /// Target (reference) sentences, tokenised with spaces.
    #[arg(long)]
    tgt: PathBuf,
    /// Hard alignment output (`i-j` links, 0-based, one line per pair).
    #[arg(short, long)]
    output: PathBuf,
    /// Also write the word-level attention matrices (and gate values) as JSON lines, for `cgnmt aer --soft`.
    #[arg(long, value_name = "FILE")]
    soft: Option<PathBuf>,
    /// Write links target-first (`j-i`), for gold files whose first index is the target language.
    #[arg(long)]
    target_first: bool,
    #[arg(long, default_value_t = 32)]
    batch: usize,
}

pub fn run(a: AlignArgs, cluster: &cgnmt::cluster::Cluster) -> Result<()> {
    let tr = cgnmt::Translator::open(&[&a.model], &Default::default())?;
    let (src, tgt) = cgnmt_data::corpus::read_parallel(&a.src, &a.tgt)?;
    // This rank's pairs (all of them in one process).
    let mine = cluster.share(src.len());
    let pick = |side: &[String]| -> Vec<String> { mine.iter().map(|&i| side[i].clone()).collect() };
    let res = tr.align(&pick(&src), &pick(&tgt), a.batch)?;
    // Each pair's links line and attention record, in this rank's order.
    let mut lines: Vec<(String, String)> = Vec::with_capacity(res.len());
    for (k, al) in res.iter().enumerate() {
        let links: Vec<String> = al
            .links
            .iter()
            .map(|&(i, j)| {
                if a.target_first {
                    format!("{j}-{i}")
                } else {
                    format!("{i}-{j}")
                }
            })
            .collect();
        let record = if a.soft.is_some() {
            serde_json::json!({"id": mine[k], "attention": al.attention, "gates": al.gates})
                .to_string()
        } else {
            String::new()
        };
        lines.push((links.join(" "), record));
    }
    if std::env::var("CGNMT_INJECT_FAIL_RANK").ok() == Some(cluster.rank().to_string()) {
        anyhow::bail!("injected failure (CGNMT_INJECT_FAIL_RANK) after aligning this rank's share");
    }
    let lines = if cluster.size() > 1 {
        // Rank r aligned pairs r, r + N, r + 2N, …: put them back in input order at rank 0.
        let Some(all) = cluster.gather(serde_json::to_vec(&lines)?) else {
            return Ok(());
        };
        let parts: Vec<Vec<(String, String)>> = all
            .iter()
            .map(|b| serde_json::from_slice(b))
            .collect::<serde_json::Result<_>>()?;
        (0..src.len())
            .map(|i| parts[i % cluster.size()][i / cluster.size()].clone())
            .collect()
    } else {
        lines
    };
    let (mut hard, mut soft) = (String::new(), String::new());
    for (links, record) in &lines {
        hard += links;
        hard.push('\n');
        if a.soft.is_some() {
            soft += record;
            soft.push('\n');
        }
    }
    write_atomic(&a.output, hard.as_bytes())?;
    if let Some(p) = &a.soft {
        write_atomic(p, soft.as_bytes())?;
    }
    eprintln!(
        "aligned {} sentence pairs → {}",
        lines.len(),
        a.output.display()
    );
    Ok(())
}
