//! `cgnmt prepare`: tokenise a line-aligned parallel corpus (plain or gzipped), build vocabularies and subword
//! models, and write what training reads into one directory (`cgnmt_data::prepare`).

use std::path::PathBuf;

use anyhow::Result;
use cgnmt_data::prepare::{run_prepare, PrepareOptions};
use cgnmt_data::TokenizerKind;

/// Arguments of `cgnmt prepare`.
#[derive(clap::Args, Debug)]
pub struct PrepareArgs {
    /// Training source file (plain or gzip), one sentence per line.
    #[arg(long)]
    pub src: PathBuf,
    /// Training target file, line-aligned with --src.
    #[arg(long)]
    pub tgt: PathBuf,
    /// Output directory (must not exist or be empty, unless --force).
    #[arg(long)]
    pub out: PathBuf,
    /// Development source file.
    #[arg(long, requires = "dev_tgt")]
    pub dev_src: Option<PathBuf>,
    /// Development target (reference) file.
    #[arg(long, requires = "dev_src")]
    pub dev_tgt: Option<PathBuf>,
    /// Test source file.
    #[arg(long, requires = "test_tgt")]
    pub test_src: Option<PathBuf>,
    /// Test target (reference) file.
    #[arg(long, requires = "test_src")]
    pub test_tgt: Option<PathBuf>,
    /// Source language code; chooses the default source tokenizer.
    #[arg(long, default_value = "zh")]
    pub src_lang: String,
    /// Target language code; chooses the default target tokenizer.
    #[arg(long, default_value = "en")]
    pub tgt_lang: String,
    /// Source tokenizer (default: jieba for zh, char for ja, punct otherwise).
    #[arg(long, value_enum)]
    pub src_tok: Option<TokenizerKind>,
    /// Target tokenizer (default: from --tgt-lang).
    #[arg(long, value_enum)]
    pub tgt_tok: Option<TokenizerKind>,
    /// Lowercase both sides before tokenizing.
    #[arg(long)]
    pub lowercase: bool,
    /// Source vocabulary size K (K most frequent tokens, plus </s> and <unk>).
    #[arg(long, default_value_t = 30000)]
    pub src_vocab_size: usize,
    /// Target vocabulary size K.
    #[arg(long, default_value_t = 30000)]
    pub tgt_vocab_size: usize,
    /// Drop training pairs with a side longer than this many model tokens.
    #[arg(long, default_value_t = 80)]
    pub max_len: usize,
    /// Learn a source BPE model with this many subword types.
    #[arg(long)]
    pub bpe_src: Option<usize>,
    /// Learn a target BPE model with this many subword types.
    #[arg(long)]
    pub bpe_tgt: Option<usize>,
    /// Learn a source unigram subword model (SentencePiece's algorithm) with this many pieces, instead of
    /// BPE.
    #[arg(long, conflicts_with = "bpe_src")]
    pub unigram_src: Option<usize>,
    /// Learn a target unigram subword model with this many pieces, instead of BPE.
    #[arg(long, conflicts_with = "bpe_tgt")]
    pub unigram_tgt: Option<usize>,
    /// Use only the first N training pairs.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Replace a non-empty output directory.
    #[arg(long)]
    pub force: bool,
    /// Tokenise with the preprocessing (tokenizers, subword models) of this model directory (or prepared
    /// directory) and keep its vocabularies: data to fine-tune that model on (`cgnmt train --init DIR`).
    #[arg(long, value_name = "DIR")]
    pub like: Option<PathBuf>,
    /// Word alignments of the training pairs (Pharaoh `i-j`, 0-based, one line per pair, over the tokenised
    /// words): checked and kept in step with the pairs kept, as `train.align` (for train.guided_alignment).
    #[arg(long, value_name = "FILE")]
    pub alignment: Option<PathBuf>,
}

pub fn run(a: PrepareArgs) -> Result<()> {
    run_prepare(&PrepareOptions {
        src: a.src,
        tgt: a.tgt,
        out: a.out,
        dev_src: a.dev_src,
        dev_tgt: a.dev_tgt,
        test_src: a.test_src,
        test_tgt: a.test_tgt,
        src_lang: a.src_lang,
        tgt_lang: a.tgt_lang,
        src_tok: a.src_tok,
        tgt_tok: a.tgt_tok,
        lowercase: a.lowercase,
        src_vocab_size: a.src_vocab_size,
        tgt_vocab_size: a.tgt_vocab_size,
        max_len: a.max_len,
        bpe_src: a.bpe_src,
        bpe_tgt: a.bpe_tgt,
        unigram_src: a.unigram_src,
        unigram_tgt: a.unigram_tgt,
        limit: a.limit,
        force: a.force,
        like: a.like,
        alignment: a.alignment,
    })
}
