//! `cgnmt serve`: the HTTP server: the JSON translation API, the attention-and-gate explorer (`/`) and the
//! subjective-evaluation page (`/eval`) (`cgnmt_serve`).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;

/// Arguments of `cgnmt serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// A model directory, or NAME=DIR (repeatable; the first is the default model).
    #[arg(short, long = "model", required = true, value_name = "[NAME=]DIR")]
    pub models: Vec<String>,
    /// Address to listen on (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Sentences decoded together in one batch (a decoding call runs one such batch per core at once).
    #[arg(long, default_value_t = 16)]
    pub max_batch: usize,
    /// Most sentences in one request (more: 413).
    #[arg(long, default_value_t = 256)]
    pub max_sentences: usize,
    /// Most words (tokens) in one sentence (more: 413).
    #[arg(long, default_value_t = 200)]
    pub max_input_words: usize,
    /// Largest request body in bytes (more: 413).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Largest beam a request may ask for.
    #[arg(long, default_value_t = 64)]
    pub max_beam: usize,
    /// Requests arriving within this many milliseconds of each other (with the same model and options) are
    /// decoded in one batch.
    #[arg(long, default_value_t = 5)]
    pub batch_window_ms: u64,
    /// Translation requests admitted at once (decoding or waiting); more are answered 429 with Retry-After.
    #[arg(long, default_value_t = 256)]
    pub queue: usize,
    /// Judgement database (SQLite) of the subjective-evaluation page `/eval`; created when missing.
    #[arg(long, value_name = "FILE")]
    pub eval_db: Option<PathBuf>,
    /// Blinded pairs to judge (`pairs.jsonl` from `cgnmt eval-pairs` or `cgnmt reproduce`); needed when the
    /// database is new, and kept in it.
    #[arg(long, value_name = "FILE", requires = "eval_db")]
    pub eval_pairs: Option<PathBuf>,
}

pub fn run(a: ServeArgs) -> Result<()> {
    cgnmt_serve::run(cgnmt_serve::ServeOptions {
        models: a.models,
        addr: a.addr,
        max_batch: a.max_batch,
        max_sentences: a.max_sentences,
        max_input_words: a.max_input_words,
        max_body_bytes: a.max_body_bytes,
        max_beam: a.max_beam,
        batch_window_ms: a.batch_window_ms,
        queue: a.queue,
        eval_db: a.eval_db,
        eval_pairs: a.eval_pairs,
    })
}
