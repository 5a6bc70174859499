//! `cgnmt demo`: the README's first command. Prepares Tatoeba zh-en, trains a GRU with a context gate on both
//! sides for a fixed number of updates (the same model on any machine; a time cap is optional), chooses the
//! model and the decoding penalties on dev (`selection`), translates the test set with beam search and
//! prints BLEU and sample translations.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use cgnmt_data::prepare::PrepareOptions;

use cgnmt::config::Config;
use cgnmt::decode::beam_search::DecodeOptions;
use cgnmt::decode::translate::Pipeline;
use cgnmt::model::store;
use cgnmt::train::checkpoint;

/// What `cgnmt demo` runs (its command-line arguments).
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Data directory (default: $CGNMT_DATA or ../shared/data).
    pub data: Option<PathBuf>,
    /// Work directory for prepared data and the model.
    pub out: PathBuf,
    /// Updates to train (the recipe's length: the same model and scores on any machine); `None`: the
    /// recipe's own length ([`Recipe::updates`]).
    pub updates: Option<usize>,
    /// Optional cap on the training time in seconds: a run it stops early is less trained than the recipe,
    /// and says so; `cgnmt demo` again (without the cap) finishes it.
    pub seconds: Option<f64>,
    /// Extra configuration overrides.
    pub sets: Vec<String>,
    /// Dev sentences the model and the penalties are chosen on (evenly spaced; 0: the whole dev set).
    pub selection_sentences: usize,
    /// Training and decoding recipe.
    pub recipe: Recipe,
}

/// The demo's default training length in updates (batches of 64 pairs): about 5 minutes of training on an
/// idle 2-core AVX2 machine, the whole demo under 15 minutes on a busy one.
pub const DEFAULT_UPDATES: usize = 3000;

/// `--recipe best`'s training length: up to ten times the demo's, under an hour on a 2-core AVX2 machine (the
/// demo trains 3,000 updates in 260 s there). Early stopping (`train.patience`, 10 evaluations without a dev
/// BLEU gain) usually ends it sooner: the recorded run stopped at update 15,200 after 34 minutes
/// (`results/recipes/demo-best`).
pub const BEST_UPDATES: usize = 30_000;

/// The demo's recipes (compared in `results/recipes/tatoeba`, the plan `configs/reproduce/recipes.toml`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    /// The paper's: maximum likelihood, separate output embeddings, beam search ranked by total
    /// log-probability.
    Paper,
    /// BPE subwords (6,000 source and 4,000 target types), tied output embeddings, label smoothing 0.1,
    /// recurrent dropout 0.2 and a moving average of the parameters in training; then the model chosen on
    /// dev among `best/`, the average of the converged tail of the last four checkpoints and the moving
    /// average, decoded with GNMT's length and coverage penalties chosen on dev (from α = 1.5, β = 0.2): the
    /// best single model of the recipes compared at equal updates.
    Improved,
    /// The best recipe `configs/reproduce/low-resource.toml` found for small data: the improved recipe (no
    /// addition of that plan — word dropout, BPE-dropout, a smaller BPE vocabulary, a warm-up with inverse
    /// square root decay, token batches — beat it chosen on dev, `results/low-resource/report.md`), trained
    /// up to ten times longer ([`BEST_UPDATES`], under an hour on a 2-core machine, early stopping on dev; the
    /// improved recipe's dev BLEU was still rising at 3,000 updates), chosen on dev the same way.
    Best,
}

impl Recipe {
    /// Kept checkpoints the improved recipe may average (those of the converged tail).
    const AVERAGE: usize = 4;

    fn name(self) -> &'static str {
        match self {
            Recipe::Paper => "paper",
            Recipe::Improved => "improved",
            Recipe::Best => "best",
        }
    }

    /// The recipe's training length when `--updates` does not say.
    pub fn updates(self) -> usize {
        match self {
            Recipe::Paper | Recipe::Improved => DEFAULT_UPDATES,
            Recipe::Best => BEST_UPDATES,
        }
    }

    /// The prepared data's directory name under the demo's directory.
    fn prepared(self) -> &'static str {
        match self {
            Recipe::Paper => "prepared",
            Recipe::Improved | Recipe::Best => "prepared-bpe",
        }
    }

    /// The subword models' sizes (source, target), if any.
    fn subwords(self) -> Option<(usize, usize)> {
        match self {
            Recipe::Paper => None,
            Recipe::Improved | Recipe::Best => Some((6000, 4000)),
        }
    }

    /// Training settings beyond the shared ones.
    fn sets(self) -> Vec<String> {
        match self {
            Recipe::Paper => vec![],
            Recipe::Improved | Recipe::Best => vec![
                "model.tied_output_embeddings=true".into(),
                "train.label_smoothing=0.1".into(),
                "train.recurrent_dropout=0.2".into(),
                "train.exponential_smoothing=0.001".into(),
                format!("train.keep_checkpoints={}", Self::AVERAGE),
            ],
        }
    }

    fn decode(self) -> DecodeOptions {
        match self {
            Recipe::Paper => DecodeOptions::default(),
            Recipe::Improved | Recipe::Best => DecodeOptions {
                length_penalty: 1.5,
                coverage_penalty: 0.2,
                ..Default::default()
            },
        }
    }
}

/// Train a small context-gated model on Tatoeba zh-en (the bundled copy when no data directory has it),
/// translate its test set and print BLEU; a second run resumes or reuses the first.
pub fn run(a: DemoOptions) -> Result<()> {
    let files = Tatoeba::resolve(cgnmt_datasets::DataDir::resolve(a.data.clone()))?;
    let prepared = a.out.join(a.recipe.prepared());
    let run = a.out.join(format!("model-{}", a.recipe.name()));
    let updates = a.updates.unwrap_or(a.recipe.updates());
    if updates == 0 {
        anyhow::bail!("--updates must be positive");
    }
    let cap = a.seconds.unwrap_or(0.0);
    if !(cap >= 0.0) {
        anyhow::bail!("--seconds must be a non-negative number of seconds");
    }
    let length = [
        format!("train.max_steps={updates}"),
        format!("train.max_seconds={cap}"),
    ];
    let cfg = config(&a, &prepared, &length)?;
    // Before any parallel work (preparing uses the thread pool too): train.threads sizes the pool.
    cgnmt::kernels::set_threads(cfg.train.threads);
    if !prepared.join("preprocess.json").is_file() {
        eprintln!("== preparing Tatoeba zh-en into {}", prepared.display());
        files.prepare(&prepared, a.recipe)?;
    }
    eprintln!(
        "== training gru + context gate ({:?}), {} recipe, {} updates{} into {}",
        cfg.model.context_gate,
        a.recipe.name(),
        cfg.train.max_steps,
        if cap > 0.0 {
            format!(" (capped at {cap:.0} s)")
        } else {
            String::new()
        },
        run.display()
    );
    let cfg = train_or_reuse(cfg, &run, &length)?;
    let (model_dir, opts) = choose_model(&a, &run, &cfg)?;
    translate_and_score(&files, &model_dir, &opts, &run)
}

/// The bundled data set's files: Tatoeba zh-en from the data directory, or the copy bundled with the
/// repository.
struct Tatoeba {
    train: (PathBuf, PathBuf),
    dev: (PathBuf, PathBuf),
    test: (PathBuf, PathBuf),
}

impl Tatoeba {
    fn resolve(data: cgnmt_datasets::DataDir) -> Result<Self> {
        let tat = |name: &str| data.file(&format!("tatoeba-zh-en/{name}"));
        let files = Tatoeba {
            train: (tat("train.zh")?, tat("train.en")?),
            dev: (tat("dev.zh")?, tat("dev.en")?),
            test: (tat("test.zh")?, tat("test.en")?),
        };
        if !files.train.0.starts_with(&data.root) {
            eprintln!(
                "== no data directory given and {} has no Tatoeba zh-en: using the bundled copy ({})",
                data.root.display(),
                files
                    .train
                    .0
                    .parent()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            );
        }
        Ok(files)
    }

    /// Prepare the corpus into `prepared` as `cgnmt prepare` does, with the recipe's tokenisation.
    fn prepare(&self, prepared: &Path, recipe: Recipe) -> Result<()> {
        let mut p = PrepareOptions::new(&self.train.0, &self.train.1, prepared);
        p.dev_src = Some(self.dev.0.clone());
        p.dev_tgt = Some(self.dev.1.clone());
        p.test_src = Some(self.test.0.clone());
        p.test_tgt = Some(self.test.1.clone());
        (p.src_lang, p.tgt_lang) = ("zh".into(), "en".into());
        p.force = true;
        if let Some((src, tgt)) = recipe.subwords() {
            (p.bpe_src, p.bpe_tgt) = (Some(src), Some(tgt));
        }
        cgnmt_data::prepare::run_prepare(&p)?;
        Ok(())
    }
}

/// The demo's configuration: the small model's sizes and schedule, the run's `length` (updates and time
/// cap), the recipe's settings, then the user's `--set`s.
fn config(a: &DemoOptions, prepared: &Path, length: &[String]) -> Result<Config> {
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
        "train.eval_every=400".into(),
        "train.eval_max_sentences=300".into(),
        "train.eval_beam=5".into(),
    ];
    sets.extend(length.iter().cloned());
    sets.extend(a.recipe.sets());
    sets.extend(a.sets.iter().cloned());
    Ok(Config::load(None, &sets)?)
}

/// Train the run in `run`, resume it, or reuse it when it finished with the updates asked for. Returns the
/// run's configuration.
fn train_or_reuse(cfg: Config, run: &Path, length: &[String]) -> Result<Config> {
    let resume = run.join("last").exists();
    let (cfg, finished) = if resume {
        let dir = store::complete_dir(&run.join("last")).context("incomplete checkpoint")?;
        let state = checkpoint::load_state(&dir)?;
        // The saved run's configuration with this command's length: a finished run that reached the updates
        // asked for is reused; one that has fewer (a time cap stopped it, or more were asked for) goes on.
        let cfg = Config::load(Some(&dir.join(store::CONFIG_FILE)), length)?;
        let finished = state.finished
            && (state.step >= cfg.train.max_steps as u64 || stopped_early(&cfg, &state));
        if finished {
            eprintln!(
                "(a run finished at update {} exists in {}; delete it to train again)",
                state.step,
                run.display()
            );
        } else {
            eprintln!(
                "(resuming the run in {} at update {})",
                run.display(),
                state.step
            );
        }
        (cfg, finished)
    } else {
        (cfg, false)
    };
    if finished {
        return Ok(cfg);
    }
    let s = cgnmt::train::train(cfg.clone(), run, resume, false)?;
    if stopped_early(&cfg, &s.state) {
        eprintln!(
            "(training stopped early at update {} of {}: no dev BLEU improvement in {} evaluations, \
             train.patience; the model is chosen from this run)",
            s.state.step, cfg.train.max_steps, cfg.train.patience
        );
    } else if (s.state.step as usize) < cfg.train.max_steps {
        eprintln!(
            "warning: the time cap stopped training at update {} of {} ({:.0}%): this model is less trained \
             than the recipe and will score lower; run the same command without --seconds to finish it",
            s.state.step,
            cfg.train.max_steps,
            100.0 * s.state.step as f64 / cfg.train.max_steps as f64
        );
    }
    Ok(cfg)
}

/// Whether a run stopped before its updates because dev BLEU stopped improving (`train.patience`), not
/// because a time cap stopped it.
fn stopped_early(cfg: &Config, state: &checkpoint::TrainState) -> bool {
    cfg.train.patience > 0 && state.evals_without_improvement >= cfg.train.patience as u64
}

/// The model and decoding options the recipe translates with: the paper's best dev checkpoint, or the
/// improved recipe's model and penalties chosen on dev.
fn choose_model(a: &DemoOptions, run: &Path, cfg: &Config) -> Result<(PathBuf, DecodeOptions)> {
    let opts = a.recipe.decode();
    Ok(match a.recipe {
        Recipe::Paper => (run.join("best"), opts),
        Recipe::Improved | Recipe::Best => {
            let sel = cgnmt::train::selection::choose_for_run(
                run,
                Recipe::AVERAGE,
                cgnmt::train::selection::DEFAULT_TOLERANCE,
                &opts,
                Some(&cgnmt::train::selection::Tuning::default()),
                a.selection_sentences,
                Some(&cfg.data.prepared),
                &run.join(cgnmt::train::selection::SELECTION_FILE),
            )?;
            let opts = sel.decode_options(&opts);
            (sel.model().to_path_buf(), opts)
        }
    })
}

/// Translate the test set with the model in `model_dir` into `run/test.hyp.en`, print sample translations,
/// the speed and the scores (BLEU, and on the harder half).
fn translate_and_score(
    files: &Tatoeba,
    model_dir: &Path,
    opts: &DecodeOptions,
    run: &Path,
) -> Result<()> {
    let lm = store::load(model_dir, DType::F32, &Device::Cpu)?;
    let src = cgnmt_data::corpus::read_lines(&files.test.0)?;
    let refs = cgnmt_data::corpus::read_lines(&files.test.1)?;
    eprintln!(
        "== translating {} test sentences with {} (beam 10{})",
        src.len(),
        model_dir.display(),
        if opts.length_penalty > 0.0 || opts.coverage_penalty > 0.0 {
            format!(
                ", length penalty α = {}, coverage penalty β = {}",
                opts.length_penalty, opts.coverage_penalty
            )
        } else {
            String::new()
        }
    );
    let model = lm.model.frozen(&lm.varmap)?;
    let tr = Pipeline::of(&model, &lm);
    let pb = indicatif::ProgressBar::new(src.len() as u64);
    let t0 = std::time::Instant::now();
    let out = tr.translate(&src, opts, 32, false, |d| pb.set_position(d as u64))?;
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let hyps: Vec<String> = out.iter().map(|t| t.text.clone()).collect();
    let hyp_path = run.join("test.hyp.en");
    cgnmt::atomic_file::write_atomic(&hyp_path, (hyps.join("\n") + "\n").as_bytes())?;
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
    // The harder half: the pairs whose reference is longer than the median (6 words).
    let long: Vec<usize> = (0..refs.len())
        .filter(|&i| refs[i].split_whitespace().count() > 6)
        .collect();
    let pick = |v: &[String]| long.iter().map(|&i| v[i].clone()).collect::<Vec<_>>();
    let long_bleu = cgnmt_eval::bleu::corpus_bleu(
        &pick(&hyps),
        &[pick(&refs)],
        &cgnmt_eval::bleu::BleuOptions::mteval_v11b(),
    )?;
    let words = |v: &[String]| {
        v.iter()
            .map(|l| l.split_whitespace().count())
            .sum::<usize>() as f64
    };
    println!(
        "  on its {} pairs longer than 6 words (mteval-v11b):       {:.2}  (output/reference words {:.2})",
        long.len(),
        long_bleu.score,
        words(&pick(&hyps)) / words(&pick(&refs)).max(1.0)
    );
    Ok(())
}
