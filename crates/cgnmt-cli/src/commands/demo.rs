//! `cgnmt demo`: the README's first command: prepare Tatoeba zh-en, train a small context-gated model, choose
//! it and its penalties on dev, translate the test set and print BLEU (`cgnmt_reproduce::demo`).

use std::path::PathBuf;

use anyhow::Result;
use cgnmt_reproduce::demo;

/// Arguments of `cgnmt demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Data directory (default: $CGNMT_DATA or ../shared/data).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Work directory for prepared data and the model.
    #[arg(long, default_value = "runs/demo")]
    pub out: PathBuf,
    /// Updates to train (the recipe's length: the same model and scores on any machine) [default: 3,000;
    /// 30,000 with --recipe best].
    #[arg(long)]
    pub updates: Option<usize>,
    /// Optional cap on the training time in seconds: a run it stops early is less trained than the recipe,
    /// and says so; `cgnmt demo` again (without the cap) finishes it.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Extra configuration overrides.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Dev sentences the model and the penalties are chosen on (evenly spaced; 0: the whole dev set).
    #[arg(long, default_value_t = 0)]
    pub selection_sentences: usize,
    /// Training and decoding recipe.
    #[arg(long, value_enum, default_value_t = demo::Recipe::Improved)]
    pub recipe: demo::Recipe,
}

pub fn run(a: DemoArgs) -> Result<()> {
    demo::run(demo::DemoOptions {
        data: a.data,
        out: a.out,
        updates: a.updates,
        seconds: a.seconds,
        sets: a.sets,
        selection_sentences: a.selection_sentences,
        recipe: a.recipe,
    })
}
