//! Alignment error rate (Och & Ney 2003) on `.talp` files and soft AER (SAER) on attention
//! matrices (cgnmt model spec §8).
//!
//! **File format** (`.talp`): one line per sentence pair, space-separated 0-based links;
//! `i-j` is a sure link, `i?j` (or `ipj`, the `lilt/alignment-scripts` notation) a
//! possible-only link; an empty line means no links. P = S ∪ possible. The first index refers
//! to the first-named language (e.g. English in `hansards-en-fr`); [`aer`] compares the link
//! sets exactly as given, so gold and prediction must use the same order.
//!
//! **Soft AER**: for a soft matrix `soft[j][i]` (rows = target words j, columns = source
//! words i) and gold links written `i-j` (i = source = column, j = target = row),
//! SAER = 1 − (|M_A⊙M_S| + |M_A⊙M_P|)/(|M_A| + |M_S|), |M| = sum of entries, corpus values are
//! micro averages (sums over sentences before dividing).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::EvalError;

/// One alignment link `(first, second)`, 0-based.
pub type Link = (usize, usize);

/// Gold links of one sentence pair.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GoldLinks {
    /// Sure links S.
    pub sure: BTreeSet<Link>,
    /// Possible links P, *including* the sure ones (P = S ∪ possible-only).
    pub possible: BTreeSet<Link>,
}

/// A parsed link with its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedLink {
    /// First index.
    pub first: usize,
    /// Second index.
    pub second: usize,
    /// `true` for `i-j`, `false` for `i?j` / `ipj`.
    pub sure: bool,
}

fn parse_index(s: &str) -> Result<usize, String> {
    if s.is_empty() {
        return Err("missing index".into());
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{s}` is not a non-negative integer"));
    }
    s.parse::<usize>()
        .map_err(|e| format!("`{s}` is not a valid index ({e})"))
}

/// Parses one link token (`3-4`, `3?4`, `3p4`).
pub fn parse_link(tok: &str) -> Result<ParsedLink, String> {
    let (pos, sure) = match (tok.find('-'), tok.find('?'), tok.find('p')) {
        (Some(p), None, None) => (p, true),
        (None, Some(p), None) => (p, false),
        (None, None, Some(p)) => (p, false),
        (None, None, None) => return Err("expected `i-j` (sure) or `i?j` (possible)".into()),
        _ => return Err("more than one separator".into()),
    };
    let (a, b) = (&tok[..pos], &tok[pos + 1..]);
    let first = parse_index(a)?;
    let second = parse_index(b)?;
    Ok(ParsedLink {
        first,
        second,
        sure,
    })
}

/// Parses one line of a `.talp` file. `path` and `line_no` (1-based) are used in errors.
pub fn parse_talp_line(
    line: &str,
    path: &Path,
    line_no: usize,
) -> Result<Vec<ParsedLink>, EvalError> {
    line.split_whitespace()
        .map(|tok| {
            parse_link(tok).map_err(|reason| EvalError::MalformedLink {
                path: path.to_path_buf(),
                line: line_no,
                link: tok.to_string(),
                reason,
            })
        })
        .collect()
}

/// Parses the text of a gold `.talp` file (one [`GoldLinks`] per line).
pub fn parse_gold(text: &str, path: &Path) -> Result<Vec<GoldLinks>, EvalError> {
    talp_lines(text)
        .enumerate()
        .map(|(i, l)| {
            let mut g = GoldLinks::default();
            for pl in parse_talp_line(l, path, i + 1)? {
                let link = (pl.first, pl.second);
                if pl.sure {
                    g.sure.insert(link);
                }
                g.possible.insert(link);
            }
            Ok(g)
        })
        .collect()
}

/// Parses the text of a predicted `.talp` file (every link counts, whatever its separator).
pub fn parse_pred(text: &str, path: &Path) -> Result<Vec<Vec<Link>>, EvalError> {
    talp_lines(text)
        .enumerate()
        .map(|(i, l)| {
            Ok(parse_talp_line(l, path, i + 1)?
                .into_iter()
                .map(|pl| (pl.first, pl.second))
                .collect())
        })
        .collect()
}

fn talp_lines(text: &str) -> impl Iterator<Item = &str> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    let empty = text.is_empty();
    body.split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .take(if empty { 0 } else { usize::MAX })
}

fn read_text(path: &Path) -> Result<String, EvalError> {
    let lines = crate::io::read_lines(path)?;
    let mut s = lines.join("\n");
    if !lines.is_empty() {
        s.push('\n');
    }
    Ok(s)
}

/// Reads a gold `.talp` file.
pub fn read_gold(path: &Path) -> Result<Vec<GoldLinks>, EvalError> {
    parse_gold(&read_text(path)?, path)
}

/// Reads a predicted `.talp` file.
pub fn read_pred(path: &Path) -> Result<Vec<Vec<Link>>, EvalError> {
    parse_pred(&read_text(path)?, path)
}

/// Checks that every link of sentence `k` lies inside `lens[k] = (first_len, second_len)`.
/// `path` is used in the error (line = sentence index + 1).
pub fn validate_ranges(
    links: &[Vec<Link>],
    lens: &[(usize, usize)],
    path: &Path,
) -> Result<(), EvalError> {
    if links.len() != lens.len() {
        return Err(EvalError::LengthMismatch {
            what: format!("{}: sentences vs sentence lengths", path.display()),
            expected: lens.len(),
            got: links.len(),
        });
    }
    for (k, (ls, &(n1, n2))) in links.iter().zip(lens).enumerate() {
        for &(a, b) in ls {
            if a >= n1 || b >= n2 {
                return Err(EvalError::LinkOutOfRange {
                    path: path.to_path_buf(),
                    line: k + 1,
                    link: format!("{a}-{b}"),
                    len_first: n1,
                    len_second: n2,
                });
            }
        }
    }
    Ok(())
}

/// Gold links as plain link lists (all of P), e.g. for [`validate_ranges`].
pub fn gold_as_links(gold: &[GoldLinks]) -> Vec<Vec<Link>> {
    gold.iter()
        .map(|g| g.possible.iter().copied().collect())
        .collect()
}

/// Corpus AER with its counts (micro sums over sentences).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AerResult {
    /// |A|: distinct predicted links.
    pub a: usize,
    /// |S|: sure gold links.
    pub s: usize,
    /// |P|: possible gold links (incl. sure).
    pub p: usize,
    /// |A ∩ S|.
    pub a_and_s: usize,
    /// |A ∩ P|.
    pub a_and_p: usize,
    /// |A∩P| / |A| (0 when A is empty).
    pub precision: f64,
    /// |A∩S| / |S| (0 when S is empty).
    pub recall: f64,
    /// 1 − (|A∩S| + |A∩P|) / (|A| + |S|) (0 when both A and S are empty).
    pub aer: f64,
}

fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 {
        num / den
    } else {
        0.0
    }
}

/// Corpus AER of predicted links against gold links (one entry per sentence pair).
///
/// Duplicate predicted links count once. With |A| + |S| = 0 the AER is defined as 0.
pub fn aer(gold: &[GoldLinks], pred: &[Vec<Link>]) -> Result<AerResult, EvalError> {
    if gold.len() != pred.len() {
        return Err(EvalError::LengthMismatch {
            what: "prediction sentences vs gold sentences".into(),
            expected: gold.len(),
            got: pred.len(),
        });
    }
    let (mut a, mut s, mut p, mut a_s, mut a_p) = (0, 0, 0, 0, 0);
    for (g, pr) in gold.iter().zip(pred) {
        let set: BTreeSet<Link> = pr.iter().copied().collect();
        a += set.len();
        s += g.sure.len();
        p += g.possible.len();
        a_s += set.iter().filter(|l| g.sure.contains(l)).count();
        a_p += set.iter().filter(|l| g.possible.contains(l)).count();
    }
    let aer = if a + s > 0 {
        1.0 - (a_s + a_p) as f64 / (a + s) as f64
    } else {
        0.0
    };
    Ok(AerResult {
        a,
        s,
        p,
        a_and_s: a_s,
        a_and_p: a_p,
        precision: ratio(a_p as f64, a as f64),
        recall: ratio(a_s as f64, s as f64),
        aer,
    })
}

/// Soft AER totals for one sentence or a corpus.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct SaerCounts {
    /// |M_A|: sum of all attention weights.
    pub sum_ma: f64,
    /// |M_S|: number of sure links.
    pub sum_ms: f64,
    /// |M_A ⊙ M_S|.
    pub sum_ma_ms: f64,
    /// |M_A ⊙ M_P|.
    pub sum_ma_mp: f64,
}

impl SaerCounts {
    /// 1 − (|M_A⊙M_S| + |M_A⊙M_P|)/(|M_A| + |M_S|) (0 when the denominator is 0).
    pub fn saer(&self) -> f64 {
        let den = self.sum_ma + self.sum_ms;
        if den > 0.0 {
            1.0 - (self.sum_ma_ms + self.sum_ma_mp) / den
        } else {
            0.0
        }
    }
}

/// Soft AER of a corpus.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SaerResult {
    /// Summed counts.
    pub totals: SaerCounts,
    /// Corpus SAER (micro average).
    pub saer: f64,
    /// Mean of the per-sentence SAER values (macro average).
    pub macro_saer: f64,
    /// Per-sentence counts.
    pub per_sentence: Vec<SaerCounts>,
}

/// Soft AER of attention matrices `soft[sentence][j][i]` (j = target row, i = source column)
/// against gold links `(i, j)` (source first, as in the `.talp` notation `i-j`).
///
/// A gold link outside its matrix, a ragged matrix or a non-finite / negative weight is an
/// error ([`EvalError::SoftAlignment`], line = sentence index + 1).
pub fn saer(gold: &[GoldLinks], soft: &[Vec<Vec<f64>>]) -> Result<SaerResult, EvalError> {
    let name = PathBuf::from("<soft alignments>");
    if gold.len() != soft.len() {
        return Err(EvalError::LengthMismatch {
            what: "soft-alignment sentences vs gold sentences".into(),
            expected: gold.len(),
            got: soft.len(),
        });
    }
    let mut per = Vec::with_capacity(gold.len());
    let mut tot = SaerCounts::default();
    for (k, (g, m)) in gold.iter().zip(soft).enumerate() {
        let err = |reason: String| EvalError::SoftAlignment {
            path: name.clone(),
            line: k + 1,
            reason,
        };
        let cols = m.first().map_or(0, Vec::len);
        let mut c = SaerCounts::default();
        for (j, row) in m.iter().enumerate() {
            if row.len() != cols {
                return Err(err(format!(
                    "row {j} has {} columns, row 0 has {cols}",
                    row.len()
                )));
            }
            for (i, &w) in row.iter().enumerate() {
                if !w.is_finite() || w < 0.0 {
                    return Err(err(format!(
                        "weight [{j}][{i}] = {w} is not a finite non-negative number"
                    )));
                }
                c.sum_ma += w;
            }
        }
        let cell = |&(i, j): &Link| -> Result<f64, EvalError> {
            m.get(j).and_then(|row| row.get(i)).copied().ok_or_else(|| {
                err(format!(
                    "gold link {i}-{j} outside the {}x{cols} matrix (rows = target, columns = source)",
                    m.len()
                ))
            })
        };
        for l in &g.sure {
            c.sum_ma_ms += cell(l)?;
        }
        for l in &g.possible {
            c.sum_ma_mp += cell(l)?;
        }
        c.sum_ms = g.sure.len() as f64;
        tot.sum_ma += c.sum_ma;
        tot.sum_ms += c.sum_ms;
        tot.sum_ma_ms += c.sum_ma_ms;
        tot.sum_ma_mp += c.sum_ma_mp;
        per.push(c);
    }
    let macro_saer = if per.is_empty() {
        0.0
    } else {
        per.iter().map(SaerCounts::saer).sum::<f64>() / per.len() as f64
    };
    Ok(SaerResult {
        totals: tot,
        saer: tot.saer(),
        macro_saer,
        per_sentence: per,
    })
}

/// Hard links from soft matrices: for every target word j the source word with the largest
/// weight (first on ties), written `(i, j)` (source first). Empty rows give no link.
pub fn argmax_links(soft: &[Vec<Vec<f64>>]) -> Vec<Vec<Link>> {
    soft.iter()
        .map(|m| {
            m.iter()
                .enumerate()
                .filter_map(|(j, row)| {
                    let mut best: Option<(usize, f64)> = None;
                    for (i, &w) in row.iter().enumerate() {
                        if best.is_none_or(|(_, bw)| w > bw) {
                            best = Some((i, w));
                        }
                    }
                    best.map(|(i, _)| (i, j))
                })
                .collect()
        })
        .collect()
}

/// One record of a soft-alignment JSONL file: `{"attention": [[f64; src_len]; tgt_len], ...}`
/// (extra keys such as `src`, `hyp`, `gates` are ignored).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct SoftRecord {
    /// Attention weights, rows = target words, columns = source words.
    pub attention: Vec<Vec<f64>>,
}

/// Reads a soft-alignment JSONL file (one [`SoftRecord`] per line; blank lines are errors so
/// that line numbers stay aligned with sentences).
pub fn read_soft_jsonl(path: &Path) -> Result<Vec<Vec<Vec<f64>>>, EvalError> {
    let lines = crate::io::read_lines(path)?;
    lines
        .iter()
        .enumerate()
        .map(|(k, l)| {
            serde_json::from_str::<SoftRecord>(l)
                .map(|r| r.attention)
                .map_err(|e| EvalError::SoftAlignment {
                    path: path.to_path_buf(),
                    line: k + 1,
                    reason: e.to_string(),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_reports_malformed_links() {
        let p = Path::new("g.talp");
        let g = parse_gold("0-0 1?1\n\n2p3\n", p).unwrap();
        assert_eq!(g.len(), 3);
        assert_eq!(g[0].sure.len(), 1);
        assert_eq!(g[0].possible.len(), 2);
        assert!(g[1].possible.is_empty());
        assert!(g[2].possible.contains(&(2, 3)));
        let e = parse_gold("0-0\n1-1 3-x\n", p).unwrap_err().to_string();
        assert!(e.contains("g.talp:2") && e.contains("`3-x`"), "{e}");
        for bad in ["3", "-1", "1-", "1-2-3", "a?b", "1--2", "+1-2"] {
            assert!(parse_link(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn validates_ranges() {
        let links = vec![vec![(0, 1)], vec![(3, 0)]];
        assert!(validate_ranges(&links, &[(1, 2), (4, 1)], Path::new("x")).is_ok());
        let e = validate_ranges(&links, &[(1, 2), (3, 1)], Path::new("x")).unwrap_err();
        assert!(e.to_string().contains("x:2"), "{e}");
    }

    #[test]
    fn aer_of_perfect_and_empty() {
        let g = parse_gold("0-0 1?1\n", Path::new("g")).unwrap();
        let r = aer(&g, &[vec![(0, 0)]]).unwrap();
        assert_eq!(r.aer, 0.0);
        assert_eq!(r.precision, 1.0);
        let r = aer(&g, &[vec![]]).unwrap();
        assert_eq!(r.aer, 1.0);
        assert!(aer(&g, &[]).is_err());
    }
}
