//! `cgnmt align`: word alignments from attention for AER/SAER. Under `mpiexec -n N` (a build with
//! `--features mpi`) each rank force-decodes every N-th pair and rank 0 writes both files in input order, all or
//! nothing, byte for byte what one process writes.

use std::path::PathBuf;

use anyhow::Result;
use candle_core::{DType, Device};

use crate::atomic_file::write_atomic;
use crate::train::checkpoint;

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

pub fn run(a: AlignArgs, cluster: &crate::cluster::Cluster) -> Result<()> {
    use cgnmt_data::bpe::word_index_of_subwords;
    let dir = checkpoint::resolve_model_dir(&a.model);
    let lm = checkpoint::load(&dir, DType::F32, &Device::Cpu)?;
    let (src, tgt) = cgnmt_data::corpus::read_parallel(&a.src, &a.tgt)?;
    // Tokens as given; BPE (if the model has it) applied word by word and mapped back afterwards.
    let words = |l: &String| -> Vec<String> { l.split_whitespace().map(str::to_string).collect() };
    let (mut sids, mut tids, mut smap, mut tmap) = (vec![], vec![], vec![], vec![]);
    // This rank's pairs (all of them in one process).
    let mine = cluster.share(src.len());
    for &i in &mine {
        let (sw, tw) = (words(&src[i]), words(&tgt[i]));
        let st = lm.preprocess.src_bpe_apply(&sw);
        let tt = lm.preprocess.tgt_bpe_apply(&tw);
        smap.push(word_index_of_subwords(&st));
        tmap.push(word_index_of_subwords(&tt));
        sids.push(lm.src_vocab.encode(&st));
        tids.push(lm.tgt_vocab.encode(&tt));
    }
    let res = crate::decode::alignment::force_decode_all(
        &lm.model.frozen(&lm.varmap)?,
        &sids,
        &tids,
        lm.tgt_vocab.eos(),
        a.batch,
    )?;
    // Each pair's links line and attention record, in this rank's order.
    let mut lines: Vec<(String, String)> = Vec::with_capacity(res.len());
    for (k, (att, gates)) in res.iter().enumerate() {
        let m = crate::decode::alignment::to_words(att, &smap[k], &tmap[k]);
        let links: Vec<String> = crate::decode::alignment::argmax_links(&m)
            .into_iter()
            .map(|(i, j)| {
                if a.target_first {
                    format!("{j}-{i}")
                } else {
                    format!("{i}-{j}")
                }
            })
            .collect();
        let record = if a.soft.is_some() {
            serde_json::json!({"id": mine[k], "attention": m, "gates": gates}).to_string()
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
