//! Word tokenizers and the matching detokenizers.
//!
//! Four kinds ([`TokenizerKind`]):
//!
//! * **Whitespace** – the text is already tokenized; tokens are the whitespace-separated words.
//! * **Jieba** – Chinese word segmentation with `jieba-rs` (its bundled dictionary, **HMM on**,
//!   so unknown words such as names are grouped by the HMM instead of being cut into single
//!   characters). Whitespace tokens are dropped. The dictionary is loaded once per process,
//!   on first use, and shared by all tokenizers.
//! * **Punct** – a rule-based tokenizer for English, French, German and similar scripts; see
//!   [`punct_tokenize`] for the exact rules.
//! * **Char** – one token per character, except that runs of letters/digits of alphabetic
//!   scripts (Latin, Cyrillic, Greek, ...) stay together; meant for Japanese (and any
//!   unsegmented script without a better tool). CJK characters are always single tokens.
//!
//! Lowercasing, when configured, is applied to the whole line before tokenization.

use std::sync::OnceLock;

use jieba_rs::Jieba;
use serde::{Deserialize, Serialize};

/// Which tokenizer to use for one side of the corpus.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// Pre-tokenized text: split on whitespace.
    Whitespace,
    /// Chinese word segmentation with jieba-rs (HMM on).
    Jieba,
    /// Punctuation-splitting tokenizer for English/French/German.
    Punct,
    /// Character tokenizer (runs of alphabetic-script letters/digits kept together).
    Char,
}

impl std::fmt::Display for TokenizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            TokenizerKind::Whitespace => "whitespace",
            TokenizerKind::Jieba => "jieba",
            TokenizerKind::Punct => "punct",
            TokenizerKind::Char => "char",
        };
        f.write_str(s)
    }
}

/// The default tokenizer for an ISO 639-1 language code (case-insensitive; a region suffix
/// such as `zh-CN` or `zh_TW` is ignored): `zh` → [`TokenizerKind::Jieba`],
/// `ja` → [`TokenizerKind::Char`], everything else → [`TokenizerKind::Punct`].
pub fn default_for_lang(lang: &str) -> TokenizerKind {
    let base = lang
        .split(['-', '_'])
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    match base.as_str() {
        "zh" | "cmn" | "yue" => TokenizerKind::Jieba,
        "ja" | "jpn" => TokenizerKind::Char,
        _ => TokenizerKind::Punct,
    }
}

/// Settings of a [`Tokenizer`]; stored in `preprocess.json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TokenizerConfig {
    /// Which tokenizer.
    pub kind: TokenizerKind,
    /// Lowercase the line (Unicode lowercasing) before tokenizing.
    #[serde(default)]
    pub lowercase: bool,
}

/// A configured tokenizer. Cheap to clone; the jieba dictionary is shared process-wide.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    config: TokenizerConfig,
}

fn jieba() -> &'static Jieba {
    static JIEBA: OnceLock<Jieba> = OnceLock::new();
    JIEBA.get_or_init(Jieba::new)
}

impl Tokenizer {
    /// Builds a tokenizer. For [`TokenizerKind::Jieba`] the dictionary is loaded by the first line it
    /// tokenizes, once per process (about a tenth of a second): a tokenizer that is never used (pre-tokenised
    /// input) does not load it.
    pub fn new(config: TokenizerConfig) -> Self {
        Tokenizer { config }
    }

    /// The configuration.
    pub fn config(&self) -> &TokenizerConfig {
        &self.config
    }

    /// Tokenizes one line. Never returns empty or whitespace-containing tokens.
    pub fn tokenize(&self, line: &str) -> Vec<String> {
        let lowered;
        let line = if self.config.lowercase {
            lowered = line.to_lowercase();
            lowered.as_str()
        } else {
            line
        };
        match self.config.kind {
            TokenizerKind::Whitespace => line.split_whitespace().map(str::to_owned).collect(),
            TokenizerKind::Jieba => jieba_tokenize(line),
            TokenizerKind::Punct => punct_tokenize(line),
            TokenizerKind::Char => char_tokenize(line),
        }
    }
}

fn jieba_tokenize(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    // Cut each whitespace-separated chunk separately so that no token spans a space.
    for chunk in line.split_whitespace() {
        for tok in jieba().cut(chunk, true) {
            let w = tok.word.trim();
            if !w.is_empty() {
                if w.chars().any(char::is_whitespace) {
                    out.extend(w.split_whitespace().map(str::to_owned));
                } else {
                    out.push(w.to_owned());
                }
            }
        }
    }
    out
}

/// True for characters of scripts written without spaces between words (CJK ideographs,
/// kana, Hangul syllables, CJK symbols and full-width forms), which are single tokens for the
/// char tokenizer.
fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x2E80..=0x2FFF      // radicals, Kangxi
        | 0x3000..=0x303F    // CJK symbols and punctuation
        | 0x3040..=0x30FF    // hiragana, katakana
        | 0x3100..=0x31FF    // bopomofo, katakana ext
        | 0x3200..=0x9FFF    // enclosed, compat, ext A, unified
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0xF900..=0xFAFF    // compat ideographs
        | 0xFF00..=0xFFEF    // half/full-width forms
        | 0x20000..=0x3FFFF) // ext B+
}

fn char_tokenize(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut run = String::new();
    for c in line.chars() {
        if c.is_alphanumeric() && !is_cjk(c) {
            run.push(c);
            continue;
        }
        if !run.is_empty() {
            out.push(std::mem::take(&mut run));
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    if !run.is_empty() {
        out.push(run);
    }
    out
}

fn is_word_char(c: char) -> bool {
    // Letters, digits and combining marks (which are not alphanumeric but belong to words).
    c.is_alphanumeric() || is_mark(c)
}

fn is_mark(c: char) -> bool {
    matches!(c as u32, 0x0300..=0x036F | 0x1AB0..=0x1AFF | 0x1DC0..=0x1DFF | 0x20D0..=0x20FF | 0xFE20..=0xFE2F)
}

fn is_apostrophe(c: char) -> bool {
    c == '\'' || c == '\u{2019}'
}

fn is_hyphen(c: char) -> bool {
    matches!(c, '-' | '\u{2010}' | '\u{2011}' | '\u{2013}')
}

/// Single letters separated by periods, possibly after a hyphenated prefix: `U.S`, `e.g`,
/// `China-U.S` (the final period is not part of the argument).
fn is_acronym(word: &str) -> bool {
    let last = word.rsplit(is_hyphen).next().unwrap_or(word);
    let mut parts = 0;
    for p in last.split('.') {
        let mut cs = p.chars();
        match (cs.next(), cs.next()) {
            (Some(c), None) if c.is_alphabetic() => parts += 1,
            _ => return false,
        }
    }
    parts >= 2
}

/// Abbreviations whose final period stays attached (compared case-insensitively, without
/// the period), unless the period ends the line.
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "mt", "vs", "etc", "no", "vol", "fig",
    "inc", "ltd", "co", "corp", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept",
    "oct", "nov", "dec", "approx", "dept", "est", "gen", "gov", "sgt", "capt", "col", "lt", "rev",
    "hon", "messrs", "mme", "mlle", "mm", "hr", "bzw", "usw", "z.b", "d.h", "u.a", "ca", "nr",
    "ggf",
];

/// English clitics split off a word (compared case-insensitively). `n't` is handled apart.
const CLITICS: &[&str] = &["s", "re", "ll", "ve", "d", "m"];

/// Splits an English clitic off a word: `don't` → `do n't`, `Tom's` → `Tom 's`,
/// `we're` → `we 're`; other apostrophes stay inside the word (`O'Brien`, `aujourd'hui`).
fn push_word(word: String, out: &mut Vec<String>) {
    let chars: Vec<(usize, char)> = word.char_indices().collect();
    let n = chars.len();
    // n't
    if n >= 4 {
        let (i_n, c_n) = chars[n - 3];
        let (_, c_a) = chars[n - 2];
        let (_, c_t) = chars[n - 1];
        if (c_n == 'n' || c_n == 'N')
            && is_apostrophe(c_a)
            && (c_t == 't' || c_t == 'T')
            && chars[n - 4].1.is_alphabetic()
        {
            let rest = word[i_n..].to_owned();
            let mut head = word;
            head.truncate(i_n);
            out.push(head);
            out.push(rest);
            return;
        }
    }
    // 's 're 'll 've 'd 'm
    if let Some(pos) = chars.iter().rposition(|&(_, c)| is_apostrophe(c)) {
        if pos > 0 && chars[pos - 1].1.is_alphanumeric() {
            let suffix = &word[chars[pos].0 + chars[pos].1.len_utf8()..];
            if CLITICS.iter().any(|c| suffix.eq_ignore_ascii_case(c)) {
                let rest = word[chars[pos].0..].to_owned();
                let mut head = word;
                head.truncate(chars[pos].0);
                out.push(head);
                out.push(rest);
                return;
            }
        }
    }
    out.push(word);
}

/// The punctuation tokenizer ([`TokenizerKind::Punct`]).
///
/// Rules, applied to each whitespace-separated chunk:
/// * a word is a run of letters, digits and combining marks; inside a word these stay:
///   `-` `‐` `‑` `–` `.` `&` between two word characters (`well-known`, `4.599`,
///   `FiveThirtyEight.com`, `R&D`), `,` `:` between digits (`1,000`, `3:30`), an apostrophe
///   between a letter/digit and a letter (`O'Brien`, `aujourd'hui`);
/// * the final period of an acronym (`U.S.`, `e.g.`, `China-U.S.`) or of a known
///   abbreviation (`Mr.`, `Dr.`, `etc.`, `z.B.`, ...) stays attached, except at the very end
///   of the line;
/// * English clitics are split off: `n't`, `'s`, `'re`, `'ll`, `'ve`, `'d`, `'m`
///   (`don't` → `do n't`, `can't` → `ca n't`, `Tom's` → `Tom 's`); `'` and `’` both count;
/// * every other non-space character is punctuation (ASCII or Unicode, symbols included) and
///   becomes its own token, except that a run of the same character stays one token
///   (`...`, `!!`, `--`).
///
/// Nothing is removed or changed except whitespace, so the tokens concatenated in order give
/// the line without its spaces.
pub fn punct_tokenize(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chunks: Vec<&str> = line.split_whitespace().collect();
    let last_chunk = chunks.len().saturating_sub(1);
    for (ci, chunk) in chunks.iter().enumerate() {
        let chars: Vec<char> = chunk.chars().collect();
        let n = chars.len();
        let mut i = 0;
        while i < n {
            let c = chars[i];
            if is_word_char(c) {
                let mut word = String::new();
                word.push(c);
                i += 1;
                while i < n {
                    let c = chars[i];
                    if is_word_char(c) {
                        word.push(c);
                        i += 1;
                        continue;
                    }
                    let prev = chars[i - 1];
                    let next = chars.get(i + 1).copied();
                    let between_words =
                        is_word_char(prev) && next.map(is_word_char).unwrap_or(false);
                    let keep = if is_hyphen(c) || c == '.' || c == '&' {
                        between_words
                    } else if c == ',' || c == ':' {
                        prev.is_ascii_digit() && next.map(|d| d.is_ascii_digit()).unwrap_or(false)
                    } else if is_apostrophe(c) {
                        prev.is_alphanumeric() && next.map(char::is_alphabetic).unwrap_or(false)
                    } else {
                        false
                    };
                    if !keep {
                        break;
                    }
                    word.push(c);
                    i += 1;
                }
                // A final period of an acronym or known abbreviation.
                if i < n && chars[i] == '.' && chars.get(i + 1) != Some(&'.') {
                    let at_line_end = ci == last_chunk && i + 1 == n;
                    let lower = word.to_lowercase();
                    let is_abbrev = ABBREVIATIONS.contains(&lower.as_str());
                    if !at_line_end && (is_acronym(&word) || is_abbrev) {
                        word.push('.');
                        i += 1;
                    }
                }
                push_word(word, &mut out);
            } else {
                let mut tok = String::new();
                tok.push(c);
                i += 1;
                while i < n && chars[i] == c {
                    tok.push(c);
                    i += 1;
                }
                out.push(tok);
            }
        }
    }
    out
}

/// Tokens after which no space is written.
fn opens(tok: &str) -> bool {
    matches!(
        tok,
        "(" | "[" | "{" | "¿" | "¡" | "$" | "£" | "€" | "¥" | "#" | "“" | "‘" | "«" | "„" | "‚"
    )
}

/// Tokens before which no space is written.
fn closes(tok: &str) -> bool {
    if matches!(
        tok,
        "." | ","
            | "!"
            | "?"
            | ";"
            | ":"
            | "%"
            | ")"
            | "]"
            | "}"
            | "…"
            | "”"
            | "’"
            | "»"
            | "‰"
            | "°"
            | "℃"
    ) {
        return true;
    }
    // Runs such as "...", "!!", "?!" (each char closing punctuation).
    if tok.chars().count() > 1 && tok.chars().all(|c| matches!(c, '.' | '!' | '?' | '…')) {
        return true;
    }
    is_clitic(tok)
}

fn is_clitic(tok: &str) -> bool {
    let mut chars = tok.chars();
    match chars.next() {
        Some(c) if is_apostrophe(c) => {
            let rest = chars.as_str();
            CLITICS.iter().any(|c| rest.eq_ignore_ascii_case(c))
        }
        Some('n') | Some('N') => {
            let rest = chars.as_str();
            let mut r = rest.chars();
            matches!(r.next(), Some(a) if is_apostrophe(a))
                && matches!(r.next(), Some('t') | Some('T'))
                && r.next().is_none()
        }
        _ => false,
    }
}

/// Joins tokens into a line; the inverse of [`Tokenizer::tokenize`] as far as it can be.
///
/// * [`TokenizerKind::Punct`]: English conventions — no space before closing punctuation
///   (`. , ! ? ; : % ) ] }`, `...`, closing quotes) and clitics (`n't`, `'s`, ...), none after
///   opening brackets, currency signs and opening quotes, none around `/`; straight quotes
///   `"` and stand-alone `'` alternate between opening and closing. For tokens produced by
///   [`punct_tokenize`] from normally spaced English, this restores the original line in the
///   vast majority of cases (≥ 95% of Tatoeba test sentences, tested). Lowercasing is not undone.
/// * [`TokenizerKind::Jieba`], [`TokenizerKind::Char`]: concatenation, with a space kept only
///   between two tokens that end and start with an ASCII letter or digit (`iPhone X`).
/// * [`TokenizerKind::Whitespace`]: tokens joined with single spaces.
pub fn detokenize(tokens: &[String], kind: TokenizerKind) -> String {
    match kind {
        TokenizerKind::Whitespace => tokens.join(" "),
        TokenizerKind::Jieba | TokenizerKind::Char => {
            let mut out = String::new();
            for t in tokens {
                let prev_ascii = out
                    .chars()
                    .last()
                    .map(|c| c.is_ascii_alphanumeric())
                    .unwrap_or(false);
                let next_ascii = t
                    .chars()
                    .next()
                    .map(|c| c.is_ascii_alphanumeric())
                    .unwrap_or(false);
                if prev_ascii && next_ascii {
                    out.push(' ');
                }
                out.push_str(t);
            }
            out
        }
        TokenizerKind::Punct => detok_punct(tokens),
    }
}

fn detok_punct(tokens: &[String]) -> String {
    let mut out = String::new();
    let mut no_space_next = true; // no space before the first token
    let mut double_open = false; // inside "..."
    let mut single_open = false; // inside '...'
    for (idx, t) in tokens.iter().enumerate() {
        let tok = t.as_str();
        let mut space = !no_space_next;
        no_space_next = false;
        match tok {
            "\"" => {
                if double_open {
                    space = false; // closing quote attaches left
                } else {
                    no_space_next = true; // opening quote attaches right
                }
                double_open = !double_open;
            }
            "'" | "\u{2019}" if !is_possessive_quote(tokens, idx, single_open) => {
                if single_open {
                    space = false;
                } else {
                    no_space_next = true;
                }
                single_open = !single_open;
            }
            "'" | "\u{2019}" => space = false, // possessive: "the boys' room"
            "/" => {
                space = false;
                no_space_next = true;
            }
            _ => {
                if closes(tok) {
                    space = false;
                }
                if opens(tok) {
                    no_space_next = true;
                }
            }
        }
        if space && !out.is_empty() {
            out.push(' ');
        }
        out.push_str(tok);
    }
    out
}

/// A stand-alone apostrophe right after a word ending in `s`, followed by a word, when no
/// single quote is open, is a plural possessive (`the boys' room`).
fn is_possessive_quote(tokens: &[String], idx: usize, single_open: bool) -> bool {
    if single_open || idx == 0 {
        return false;
    }
    let prev_s = tokens[idx - 1]
        .chars()
        .last()
        .map(|c| c == 's' || c == 'S')
        .unwrap_or(false);
    let next_word = tokens
        .get(idx + 1)
        .and_then(|t| t.chars().next())
        .map(char::is_alphanumeric)
        .unwrap_or(false);
    prev_s && next_word
}
