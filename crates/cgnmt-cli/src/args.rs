//! Argument groups more than one command takes, and the conversion of a command's arguments into the
//! library's options.

use cgnmt_eval::report as R;
use cgnmt_eval::report::{SmoothArg, TokenizeArg};

/// `From<Args> for Options`, field by field: `options!(A => O { plain, fields; converted, fields })` moves the
/// first list as they are and converts the second with `into()`; `options!(enum A => O { Variants })` maps
/// each variant's arguments.
macro_rules! options {
    ($from:ident => $to:path { $($f:ident),* ; $($g:ident),* }) => {
        impl From<$from> for $to {
            fn from(a: $from) -> Self {
                $to { $($f: a.$f,)* $($g: a.$g.into(),)* }
            }
        }
    };
    (enum $from:ident => $to:path { $($v:ident),* }) => {
        impl From<$from> for $to {
            fn from(c: $from) -> Self {
                match c {
                    $($from::$v(x) => <$to>::$v(x.into()),)*
                }
            }
        }
    };
}
pub(crate) use options;

/// Options shared by `score` and `compare` that configure BLEU / chrF.
#[derive(Debug, Clone, clap::Args)]
pub struct MetricArgs {
    /// BLEU tokenisation (default 13a).
    #[arg(long = "tokenize", visible_alias = "tok", value_enum)]
    pub tokenize: Option<TokenizeArg>,
    /// Case-insensitive scoring (`-lc` works as in sacreBLEU).
    #[arg(short = 'l', long = "lowercase", visible_alias = "lc")]
    pub lowercase: bool,
    /// (Hidden: makes sacreBLEU's `-lc` parse as `-l -c`.)
    #[arg(short = 'c', hide = true)]
    pub lc_c: bool,
    /// BLEU smoothing (default exp).
    #[arg(long = "smooth", value_enum)]
    pub smooth: Option<SmoothArg>,
    /// Value for floor / add-k smoothing.
    #[arg(long = "smooth-value")]
    pub smooth_value: Option<f64>,
    /// NIST mteval-v11b.pl BLEU (the paper's metric): its tokenisation, shortest reference
    /// length, no smoothing, case-insensitive unless --cased.
    #[arg(long = "mteval-v11b")]
    pub mteval_v11b: bool,
    /// With --mteval-v11b: case-sensitive (mteval's `-c`).
    #[arg(long = "cased", requires = "mteval_v11b")]
    pub cased: bool,
}

options!(MetricArgs => R::MetricOptions { tokenize, lowercase, lc_c, smooth, smooth_value, mteval_v11b, cased;  });

/// `translate`'s shortlist: a lexicon and how many words to take from it.
#[derive(Debug, Clone, clap::Args)]
pub struct ShortlistArgs {
    /// Decode each batch over a shortlist of target words only: the most frequent ones and each source
    /// word's most probable translations in this lexicon (from `cgnmt shortlist`). Faster, approximate: the
    /// model's distribution is renormalised over the shortlist.
    #[arg(long, value_name = "LEXICON")]
    pub shortlist: Option<std::path::PathBuf>,
    /// With --shortlist: the most frequent target words every batch takes.
    #[arg(long, value_name = "N", default_value_t = 100, requires = "shortlist")]
    pub shortlist_frequent: usize,
    /// With --shortlist: the most probable target words taken per source word.
    #[arg(long, value_name = "N", default_value_t = 50, requires = "shortlist")]
    pub shortlist_per_word: usize,
}

impl ShortlistArgs {
    /// The library's options, or an error when the shortlist would be empty.
    pub fn options(&self) -> anyhow::Result<Option<cgnmt::ShortlistOptions>> {
        if self.shortlist.is_some() && self.shortlist_per_word == 0 && self.shortlist_frequent == 0
        {
            anyhow::bail!("--shortlist-frequent and --shortlist-per-word are both 0: the shortlist would be empty");
        }
        Ok(self.shortlist.as_ref().map(|p| cgnmt::ShortlistOptions {
            lexicon: p.clone(),
            frequent: self.shortlist_frequent,
            per_word: self.shortlist_per_word,
        }))
    }
}

/// `translate`'s word-level outputs, target prefixes and constraints.
#[derive(Debug, Clone, clap::Args)]
pub struct SteerArgs {
    /// After each translation (each n-best line), write ` ||| ` and its word alignment from attention: `hard`
    /// links each output word to its most attended source word, a probability P (e.g. 0.2) gives every link
    /// with attention ≥ P, both as `i-j` pairs (source word i, output word j, 0-based); `soft` writes each
    /// output word's attention over the source words, comma-separated. Words are the tokenised source and
    /// output before subwords (pieces merged as `cgnmt align` merges them), not the detokenised text.
    #[arg(long, value_name = "hard|soft|P")]
    pub alignment: Option<cgnmt::decode::alignment::AlignmentMode>,
    /// At most N target tokens per output (default: three times the source's tokens plus one).
    #[arg(long, value_name = "N")]
    pub max_decoding_length: Option<usize>,
    /// No end of sentence before N target tokens (default: half the source's tokens plus one).
    #[arg(long, value_name = "N")]
    pub min_decoding_length: Option<usize>,
    /// After each translation (each n-best line), write ` ||| WordScores= ` each output word's
    /// log-probability (its subword pieces' sum) and `Score= ` the sentence's (EOS included), and, where the
    /// model has a context gate, ` ||| WordGates= ` each output word's mean gate value.
    #[arg(long)]
    pub word_scores: bool,
    /// Target prefixes, one line per input line (an empty line for none): each output starts with its
    /// line's prefix (raw text, or tokens with --pretokenized) and the search goes on from it.
    #[arg(long, value_name = "FILE")]
    pub prefix: Option<std::path::PathBuf>,
    /// Positive constraints, one line per input line, its phrases separated by tabs (an empty line for
    /// none): each output contains every phrase of its line once, in any order (dynamic beam allocation,
    /// the beam fixed). A line whose constraints cannot all be met within the length limit is warned about.
    #[arg(long, value_name = "FILE")]
    pub constraints: Option<std::path::PathBuf>,
    /// Negative constraints, one line per input line, its phrases separated by tabs: no output contains a
    /// phrase of its line.
    #[arg(long, value_name = "FILE")]
    pub avoid: Option<std::path::PathBuf>,
    /// Each input line is a JSON object: `{"text": …}` with, optionally, `"target_prefix": "…"`,
    /// `"constraints": ["…", …]` and `"avoid": ["…", …]`.
    #[arg(long, conflicts_with_all = ["prefix", "constraints", "avoid"])]
    pub json_input: bool,
}

/// One line of `translate --json-input`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonLine {
    text: String,
    #[serde(default)]
    target_prefix: String,
    #[serde(default)]
    constraints: Vec<String>,
    #[serde(default)]
    avoid: Vec<String>,
}

impl SteerArgs {
    /// Set these in `opts` for the input `lines` (read from `input`, named in messages): the prefixes and
    /// constraints read, one per line; with --json-input the lines become their texts.
    pub fn apply(
        &self,
        opts: &mut cgnmt::TranslateOptions,
        lines: &mut [String],
        input: Option<&std::path::Path>,
    ) -> anyhow::Result<()> {
        opts.word_scores = self.word_scores;
        opts.alignment = self.alignment;
        let per_line = |p: &std::path::Path| -> anyhow::Result<Vec<String>> {
            let v = cgnmt::decode::output::read_input(Some(p))?;
            if v.len() != lines.len() {
                anyhow::bail!(
                    "{}: {} lines, but the input has {}: give one line per input line (an empty line for none)",
                    p.display(),
                    v.len(),
                    lines.len()
                );
            }
            Ok(v)
        };
        let phrases = |v: Vec<String>| -> Vec<Vec<String>> {
            v.iter()
                .map(|l| match l.is_empty() {
                    true => vec![],
                    false => l.split('\t').map(str::to_string).collect(),
                })
                .collect()
        };
        if let Some(p) = &self.prefix {
            opts.target_prefix = per_line(p)?;
        }
        if let Some(p) = &self.constraints {
            opts.constraints = phrases(per_line(p)?);
        }
        if let Some(p) = &self.avoid {
            opts.avoid = phrases(per_line(p)?);
        }
        if self.json_input {
            let name = input.map_or("<stdin>".to_string(), |p| p.display().to_string());
            let (mut pre, mut inc, mut avo) = (vec![], vec![], vec![]);
            for (i, l) in lines.iter_mut().enumerate() {
                let j: JsonLine = serde_json::from_str(l).map_err(|e| {
                    anyhow::anyhow!("{name}: line {}: not a JSON input line ({e}); expected {{\"text\": …, \"constraints\": [...], \"avoid\": [...]}}", i + 1)
                })?;
                *l = j.text;
                pre.push(j.target_prefix);
                inc.push(j.constraints);
                avo.push(j.avoid);
            }
            opts.target_prefix = pre;
            opts.constraints = inc;
            opts.avoid = avo;
        }
        Ok(())
    }
}

/// `--kernels`: the command line's choice of [`cgnmt::kernels::Kernels`] (the library's own enum also has a
/// mode the model picks itself, which is not a choice here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelsArg {
    /// Composed candle ops (the reference every fused kernel is tested against).
    Reference,
    /// Fused CPU kernels with hand-derived backward passes (composed ops on other devices).
    Fused,
}

impl From<KernelsArg> for cgnmt::kernels::Kernels {
    fn from(k: KernelsArg) -> Self {
        match k {
            KernelsArg::Reference => cgnmt::kernels::Kernels::Reference,
            KernelsArg::Fused => cgnmt::kernels::Kernels::Fused,
        }
    }
}

/// `translate --long-input`: [`cgnmt::LongInput`] on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LongInputArg {
    /// Translate it in consecutive pieces of at most the limit and join their outputs.
    Split,
    /// Translate its first tokens up to the limit only.
    Truncate,
}

impl From<LongInputArg> for cgnmt::LongInput {
    fn from(l: LongInputArg) -> Self {
        match l {
            LongInputArg::Split => cgnmt::LongInput::Split,
            LongInputArg::Truncate => cgnmt::LongInput::Truncate,
        }
    }
}
