//! BLEU tokenisers: sacreBLEU (`13a`, `intl`, `zh`, `char`, `none`), NIST `mteval-v11b.pl`,
//! `mteval-v13a.pl` (default and `--international-tokenization`) and Moses `multi-bleu.perl`.
//!
//! Each tokeniser also fixes how lowercasing is done, because the reference implementations
//! differ there (see `fixtures/bleu/README.md`, "Discrepancies"):
//! - sacreBLEU lowercases with Python `str.lower()` (full Unicode) *before* tokenising;
//! - `mteval-v11b.pl` and `mteval-v13a.pl` (default tokenisation) use `tr/[A-Z]/[a-z]/`,
//!   i.e. ASCII only; `mteval-v13a.pl --international-tokenization` uses Perl `lc` (Unicode);
//! - `multi-bleu.perl` reads bytes, so `lc` touches ASCII only.
//!
//! Whitespace also differs: sacreBLEU splits with Python `str.split()` (Unicode whitespace
//! plus U+001C..U+001F), `mteval-v13a.pl` with Perl's Unicode `\s`, while the byte-based
//! scripts (`mteval-v11b.pl`, `multi-bleu.perl`) split on ASCII whitespace only, so U+00A0
//! and U+3000 stay inside tokens there.

use std::sync::OnceLock;

use regex::Regex;

/// Which tokenisation (and lowercasing convention) to apply before counting n-grams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Tokenize {
    /// sacreBLEU `13a` (default): mteval-v13a rules on Unicode text.
    #[default]
    Tok13a,
    /// sacreBLEU `intl` (mteval-v14 international rules: split `\p{P}` unless between digits, `\p{S}`).
    Intl,
    /// sacreBLEU `zh`: every CJK character (sacreBLEU's range table) is its own token, rest as 13a.
    Zh,
    /// sacreBLEU `char`: every non-space character is a token.
    Char,
    /// sacreBLEU `none`: split on whitespace only.
    None,
    /// NIST `mteval-v11b.pl` (the metric of Tu et al. 2017): 13a rules, byte semantics (ASCII
    /// whitespace and ASCII lowercasing only).
    MtevalV11b,
    /// NIST `mteval-v13a.pl` default tokenisation (ASCII-only lowercasing, Unicode whitespace).
    MtevalV13a,
    /// NIST `mteval-v13a.pl --international-tokenization` (Unicode lowercasing).
    MtevalV13aIntl,
    /// Moses `multi-bleu.perl`: raw text split on ASCII whitespace, ASCII-only lowercasing.
    MultiBleu,
}

impl Tokenize {
    /// The name used in signatures and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Tokenize::Tok13a => "13a",
            Tokenize::Intl => "intl",
            Tokenize::Zh => "zh",
            Tokenize::Char => "char",
            Tokenize::None => "none",
            Tokenize::MtevalV11b => "mteval-v11b",
            Tokenize::MtevalV13a => "mteval-v13a",
            Tokenize::MtevalV13aIntl => "mteval-v13a-intl",
            Tokenize::MultiBleu => "multi-bleu",
        }
    }

    /// Parses a name as printed by [`Tokenize::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "13a" => Tokenize::Tok13a,
            "intl" => Tokenize::Intl,
            "zh" => Tokenize::Zh,
            "char" => Tokenize::Char,
            "none" => Tokenize::None,
            "mteval-v11b" | "v11b" => Tokenize::MtevalV11b,
            "mteval-v13a" | "v13a" => Tokenize::MtevalV13a,
            "mteval-v13a-intl" | "v13a-intl" => Tokenize::MtevalV13aIntl,
            "multi-bleu" => Tokenize::MultiBleu,
            _ => return None,
        })
    }

    /// Lowercases (if asked, with this tokeniser's convention), tokenises and splits `line`.
    pub fn tokens(self, line: &str, lowercase: bool) -> Vec<String> {
        match self {
            Tokenize::Tok13a => {
                let s = sacre_lower(line, lowercase);
                py_split(&tokenize_13a(s.trim_end_matches(py_is_space)))
            }
            Tokenize::Intl => {
                let s = sacre_lower(line, lowercase);
                py_split(&tokenize_intl(s.trim_end_matches(py_is_space)))
            }
            Tokenize::Zh => {
                let s = sacre_lower(line, lowercase);
                py_split(&tokenize_zh(s.trim_end_matches(py_is_space)))
            }
            Tokenize::Char => {
                let s = sacre_lower(line, lowercase);
                s.chars()
                    .filter(|&c| !py_is_space(c))
                    .map(String::from)
                    .collect()
            }
            Tokenize::None => {
                let s = sacre_lower(line, lowercase);
                py_split(&s)
            }
            Tokenize::MtevalV11b => {
                let s = mteval_normalize(line, lowercase);
                ascii_split(&s)
            }
            Tokenize::MtevalV13a => {
                let s = mteval_normalize(line, lowercase);
                s.split(char::is_whitespace)
                    .filter(|t| !t.is_empty())
                    .map(String::from)
                    .collect()
            }
            Tokenize::MtevalV13aIntl => {
                let s = mteval_intl(line, lowercase);
                s.split(char::is_whitespace)
                    .filter(|t| !t.is_empty())
                    .map(String::from)
                    .collect()
            }
            Tokenize::MultiBleu => {
                let s = if lowercase {
                    line.to_ascii_lowercase()
                } else {
                    line.to_string()
                };
                ascii_split(&s)
            }
        }
    }
}

/// Python `str.isspace()`: Unicode White_Space plus the separators U+001C..U+001F.
pub fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Perl `\s` on byte strings: ASCII whitespace only (space, \t, \n, \x0B, \x0C, \r).
fn perl_byte_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\u{0B}' | '\u{0C}' | '\r')
}

/// Python `str.split()` with no arguments.
fn py_split(s: &str) -> Vec<String> {
    s.split(py_is_space)
        .filter(|t| !t.is_empty())
        .map(String::from)
        .collect()
}

fn ascii_split(s: &str) -> Vec<String> {
    s.split(perl_byte_space)
        .filter(|t| !t.is_empty())
        .map(String::from)
        .collect()
}

fn sacre_lower(line: &str, lowercase: bool) -> String {
    if lowercase {
        line.to_lowercase()
    } else {
        line.to_string()
    }
}

struct Regexes {
    punct: Regex,
    period_comma_after_nondigit: Regex,
    period_comma_before_nondigit: Regex,
    dash_after_digit: Regex,
    intl_punct_after: Regex,
    intl_punct_before: Regex,
    intl_symbol: Regex,
}

fn regexes() -> &'static Regexes {
    static RE: OnceLock<Regexes> = OnceLock::new();
    RE.get_or_init(|| {
        // The patterns are constant and known to compile; a failure here is a programming error.
        let re = |p: &str| Regex::new(p).expect("constant regex");
        Regexes {
            // sacreBLEU / mteval: ([\{-\~\[-\` -\&\(-\+\:-\@\/])
            punct: re(r"([\x7B-\x7E\x5B-\x60\x20-\x26\x28-\x2B\x3A-\x40/])"),
            period_comma_after_nondigit: re(r"([^0-9])([.,])"),
            period_comma_before_nondigit: re(r"([.,])([^0-9])"),
            dash_after_digit: re(r"([0-9])(-)"),
            intl_punct_after: re(r"(\P{N})(\p{P})"),
            intl_punct_before: re(r"(\p{P})(\P{N})"),
            intl_symbol: re(r"(\p{S})"),
        }
    })
}

/// The language-dependent part shared by 13a, zh, mteval-v11b and mteval-v13a
/// (sacreBLEU's `TokenizerRegexp` without the final whitespace normalisation).
fn regexp_core(s: &str) -> String {
    let re = regexes();
    let s = re.punct.replace_all(s, " ${1} ");
    let s = re.period_comma_after_nondigit.replace_all(&s, "${1} ${2} ");
    let s = re
        .period_comma_before_nondigit
        .replace_all(&s, " ${1} ${2}");
    let s = re.dash_after_digit.replace_all(&s, "${1} ${2} ");
    s.into_owned()
}

fn unescape_sgml(s: &str) -> String {
    if s.contains('&') {
        s.replace("&quot;", "\"")
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
    } else {
        s.to_string()
    }
}

/// sacreBLEU `Tokenizer13a` (returns the tokenised string).
fn tokenize_13a(line: &str) -> String {
    let s = line
        .replace("<skipped>", "")
        .replace("-\n", "")
        .replace('\n', " ");
    let s = unescape_sgml(&s);
    regexp_core(&format!(" {s} "))
}

/// sacreBLEU `TokenizerV14International`.
fn tokenize_intl(line: &str) -> String {
    intl_core(line)
}

fn intl_core(s: &str) -> String {
    let re = regexes();
    let s = re.intl_punct_after.replace_all(s, "${1} ${2} ");
    let s = re.intl_punct_before.replace_all(&s, " ${1} ${2}");
    let s = re.intl_symbol.replace_all(&s, " ${1} ");
    s.into_owned()
}

/// Is `c` a "Chinese character" for sacreBLEU's `zh` tokeniser?
///
/// This reproduces sacreBLEU's `_UCODE_RANGES` table *including its quirk*: the entries
/// written `'\u20000'`..`'\u2a6d6'` and `'\u2f800'`..`'\u2fa1d'` are two-character Python strings
/// (`\u2000` + `0`, ...), so for a single character they act as U+2001..=U+2A6D and
/// U+2F81..=U+2FA1 (covering general punctuation such as curly quotes and the em dash).
fn is_sacre_chinese_char(c: char) -> bool {
    const RANGES: &[(u32, u32)] = &[
        (0x3400, 0x4db5),
        (0x4e00, 0x9fa5),
        (0x9fa6, 0x9fbb),
        (0xf900, 0xfa2d),
        (0xfa30, 0xfa6a),
        (0xfa70, 0xfad9),
        (0x2001, 0x2a6d), // sacreBLEU: ('\u20000', '\u2a6d6')
        (0x2f81, 0x2fa1), // sacreBLEU: ('\u2f800', '\u2fa1d')
        (0xff00, 0xffef),
        (0x2e80, 0x2eff),
        (0x3000, 0x303f),
        (0x31c0, 0x31ef),
        (0x2f00, 0x2fdf),
        (0x2ff0, 0x2fff),
        (0x3100, 0x312f),
        (0x31a0, 0x31bf),
        (0xfe10, 0xfe1f),
        (0xfe30, 0xfe4f),
        (0x2600, 0x26ff),
        (0x2700, 0x27bf),
        (0x3200, 0x32ff),
        (0x3300, 0x33ff),
    ];
    let u = c as u32;
    RANGES.iter().any(|&(a, b)| a <= u && u <= b)
}

/// sacreBLEU `TokenizerZh`.
fn tokenize_zh(line: &str) -> String {
    let line = line.trim_matches(py_is_space);
    let mut s = String::with_capacity(line.len() * 2);
    for c in line.chars() {
        if is_sacre_chinese_char(c) {
            s.push(' ');
            s.push(c);
            s.push(' ');
        } else {
            s.push(c);
        }
    }
    regexp_core(&s)
}

/// `mteval-v11b.pl` `NormalizeText` / `mteval-v13a.pl` `tokenization` (before splitting).
fn mteval_normalize(line: &str, lowercase: bool) -> String {
    let s = line
        .replace("<skipped>", "")
        .replace("-\n", "")
        .replace('\n', " ");
    let s = s
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">");
    let mut s = format!(" {s} ");
    if lowercase {
        s.make_ascii_lowercase();
    }
    regexp_core(&s)
}

/// `mteval-v13a.pl` `tokenization_international` (before splitting).
fn mteval_intl(line: &str, lowercase: bool) -> String {
    let s = line
        .replace("<skipped>", "")
        .replace(['\u{2028}'], " ")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&apos;", "'");
    let s = if lowercase { s.to_lowercase() } else { s };
    intl_core(&s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(tok: Tokenize, s: &str) -> String {
        tok.tokens(s, false).join(" ")
    }

    #[test]
    fn thirteen_a_basic() {
        assert_eq!(
            t(
                Tokenize::Tok13a,
                "The committee approved $1,000.5 million for 3-4 projects."
            ),
            "The committee approved $ 1,000.5 million for 3 - 4 projects ."
        );
        assert_eq!(t(Tokenize::Tok13a, "AT&amp;T"), "AT & T");
        assert_eq!(t(Tokenize::Intl, "AT&amp;T"), "AT & amp ; T");
    }

    #[test]
    fn byte_scripts_keep_nbsp() {
        let s = "a\u{a0}b c";
        assert_eq!(Tokenize::MtevalV11b.tokens(s, false).len(), 2);
        assert_eq!(Tokenize::Tok13a.tokens(s, false).len(), 3);
        assert_eq!(Tokenize::MtevalV11b.tokens("ÉA", true), vec!["Éa"]);
        assert_eq!(Tokenize::Tok13a.tokens("ÉA", true), vec!["éa"]);
    }

    #[test]
    fn zh_splits_cjk() {
        assert_eq!(t(Tokenize::Zh, "我爱 NLP。"), "我 爱 NLP 。");
        assert_eq!(t(Tokenize::Char, "ab c"), "a b c");
    }
}
