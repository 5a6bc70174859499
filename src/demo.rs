//! `cgnmt demo`: the README's first command. Prepares Tatoeba zh-en, trains a GRU with a context gate on both
//! sides for a time budget, translates the test set with beam search and prints BLEU and sample translations.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use clap::Parser;

use crate::beam_search::DecodeOptions;
use crate::checkpoint;
use crate::config::Config;
use crate::translate::Translator;

/// Arguments of `cgnmt demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Data directory (default: $CGNMT_DATA or ../shared/data).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Work directory for prepared data and the model.
    #[arg(long, default_value = "runs/demo")]
    pub out: PathBuf,
    /// Training time budget in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub seconds: f64,
    /// Extra configuration overrides.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
}

/// Train a small context-gated model on Tatoeba zh-en (the bundled copy when no data directory has it),
/// translate its test set and print BLEU; a second run resumes or reuses the first.
pub fn run(a: DemoArgs) -> Result<()> {
    let data = crate::datasets::DataDir::resolve(a.data);
    let tat = |name: &str| data.file(&format!("tatoeba-zh-en/{name}"));
    let (train_zh, train_en) = (tat("train.zh")?, tat("train.en")?);
    let (dev_zh, dev_en) = (tat("dev.zh")?, tat("dev.en")?);
    let (test_zh, test_en) = (tat("test.zh")?, tat("test.en")?);
    if !train_zh.starts_with(&data.root) {
        eprintln!(
            "== no data directory given and {} has no Tatoeba zh-en: using the bundled copy ({})",
            data.root.display(),
            train_zh
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
    }
    let prepared = a.out.join("prepared");
    if !prepared.join("preprocess.json").is_file() {
        eprintln!("== preparing Tatoeba zh-en into {}", prepared.display());
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            a: cgnmt_data::prepare::PrepareArgs,
        }
        let s = |p: &Path| p.display().to_string();
        let p = P::try_parse_from([
            "prepare".to_string(),
            "--src".into(),
            s(&train_zh),
            "--tgt".into(),
            s(&train_en),
            "--dev-src".into(),
            s(&dev_zh),
            "--dev-tgt".into(),
            s(&dev_en),
            "--test-src".into(),
            s(&test_zh),
            "--test-tgt".into(),
            s(&test_en),
            "--src-lang".into(),
            "zh".into(),
            "--tgt-lang".into(),
            "en".into(),
            "--out".into(),
            s(&prepared),
            "--force".into(),
        ])?;
        cgnmt_data::prepare::run_prepare(&p.a)?;
    }
    let run = a.out.join("model");
    let mut sets = vec![
        format!("data.prepared={:?}", prepared.display().to_string()),
        "data.src_vocab_size=8000".into(),
        "data.tgt_vocab_size=6000".into(),
        "model.embedding_dim=128".into(),
        "model.hidden_dim=256".into(),
        "model.attention_dim=256".into(),
        "train.batch_size=64".into(),
        "train.optimizer=adam".into(),
        "train.learning_rate=0.003".into(),
        format!("train.max_seconds={}", a.seconds),
        "train.eval_every=400".into(),
        "train.eval_max_sentences=300".into(),
        "train.eval_beam=5".into(),
    ];
    sets.extend(a.sets);
    let cfg = Config::load(None, &sets)?;
    eprintln!(
        "== training gru + context gate ({:?}) for up to {:.0} s into {}",
        cfg.model.context_gate,
        a.seconds,
        run.display()
    );
    let resume = run.join("last").exists();
    let (cfg, finished) = if resume {
        let dir = checkpoint::complete_dir(&run.join("last")).context("incomplete checkpoint")?;
        let finished = checkpoint::load_state(&dir)?.finished;
        if finished {
            eprintln!(
                "(a finished run exists in {}; delete it to train again)",
                run.display()
            );
        }
        (
            Config::load(Some(&dir.join(checkpoint::CONFIG_FILE)), &[])?,
            finished,
        )
    } else {
        (cfg, false)
    };
    if !finished {
        crate::train::train(cfg, &run, resume, false)?;
    }
    let lm = checkpoint::load(&run.join("best"), DType::F32, &Device::Cpu)?;
    let src = cgnmt_data::corpus::read_lines(&test_zh)?;
    let refs = cgnmt_data::corpus::read_lines(&test_en)?;
    eprintln!("== translating {} test sentences (beam 10)", src.len());
    let model = lm.model.frozen(&lm.varmap)?;
    let tr = Translator::of(&model, &lm);
    let pb = indicatif::ProgressBar::new(src.len() as u64);
    let t0 = std::time::Instant::now();
    let out = tr.translate(&src, &DecodeOptions::default(), 32, false, |d| {
        pb.set_position(d as u64)
    })?;
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let hyps: Vec<String> = out.iter().map(|t| t.text.clone()).collect();
    let hyp_path = a.out.join("test.hyp.en");
    crate::atomic_file::write_atomic(&hyp_path, (hyps.join("\n") + "\n").as_bytes())?;
    let v11b = cgnmt_eval::bleu::corpus_bleu(
        &hyps,
        &[refs.clone()],
        &cgnmt_eval::bleu::BleuOptions::mteval_v11b(),
    )?;
    let sacre = cgnmt_eval::bleu::corpus_bleu(
        &hyps,
        &[refs.clone()],
        &cgnmt_eval::bleu::BleuOptions::sacrebleu(),
    )?;
    println!("\nSample translations (test set):");
    for i in [0usize, 7, 42, 300, 1000, 2000] {
        if i < src.len() {
            println!(
                "  src: {}\n  ref: {}\n  hyp: {}\n",
                src[i], refs[i], hyps[i]
            );
        }
    }
    println!(
        "decoded {} sentences in {:.1} s ({:.1} sent/s); output in {}",
        src.len(),
        secs,
        src.len() as f64 / secs,
        hyp_path.display()
    );
    println!(
        "Tatoeba zh-en test BLEU (mteval-v11b, case-insensitive): {:.2}",
        v11b.score
    );
    println!(
        "Tatoeba zh-en test BLEU (sacreBLEU 13a, cased):          {:.2}  {}",
        sacre.score, sacre.signature
    );
    Ok(())
}
