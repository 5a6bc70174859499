//! Guided alignment's links for training (`train.guided_alignment`; model-spec §6b): word alignments of the
//! prepared training pairs, read from a file of links or made by the built-in aligner
//! ([`crate::train::word_aligner`]), checked against the pairs' words, and turned into links between the pairs'
//! pieces, in the order of the run's corpus, for [`crate::model::Batch::alignment`].
//!
//! A pair's words are its prepared pieces joined (a piece ending in `@@` continues into the next); every
//! piece of a linked source word is linked to every piece of a linked target word, and the target's EOS to the
//! source's. The links of the pairs training leaves out (an empty side, longer than `data.max_len`, past
//! `data.limit`) are checked and dropped, so the file keeps one line per line of `train.src`.

use std::path::{Path, PathBuf};

use crate::cluster::Cluster;
use crate::config::Config;
use crate::error::{NmtError, Result};
use crate::train::word_aligner::{align_corpus, AlignerOptions, Symmetrize};

/// `train.guided_alignment`'s value that runs the built-in aligner.
pub const BUILTIN: &str = "builtin";
/// Where a run keeps the built-in aligner's links (made once, read again on resume).
pub const BUILTIN_FILE: &str = "guided-alignment.txt";

/// The piece links of every pair of the run's corpus: pair `k`'s `(source position, target position)` links.
#[derive(Debug, Clone, Default)]
pub struct GuideLinks {
    offsets: Vec<usize>,
    links: Vec<(u32, u32)>,
}

impl GuideLinks {
    /// Pair `k`'s links (the corpus's index).
    pub fn of(&self, k: usize) -> &[(u32, u32)] {
        &self.links[self.offsets[k]..self.offsets[k + 1]]
    }
    /// The pairs.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Each piece's word: the index of the word it belongs to (pieces ending in `@@` continue into the next).
pub fn piece_words(pieces: &[String]) -> (Vec<u32>, usize) {
    let mut w = 0u32;
    let mut out = Vec::with_capacity(pieces.len());
    for (k, p) in pieces.iter().enumerate() {
        out.push(w);
        if !p.ends_with(cgnmt_data::bpe::BPE_MARKER) || k + 1 == pieces.len() {
            w += 1;
        }
    }
    (out, w as usize)
}

/// Parse one line of Pharaoh links (`i-j …`, 0-based) and check them against a pair of `n` source and `m`
/// target words; `at` names the file and line in errors.
pub fn parse_links(line: &str, (n, m): (usize, usize), at: &str) -> Result<Vec<(usize, usize)>> {
    line.split_whitespace()
        .map(|tok| {
            let bad = |why: String| NmtError::Data(format!("{at}: link {tok:?}: {why}"));
            let (i, j) = tok
                .split_once('-')
                .ok_or_else(|| bad("not of the form i-j".into()))?;
            let (i, j): (usize, usize) = match (i.parse(), j.parse()) {
                (Ok(i), Ok(j)) => (i, j),
                _ => return Err(bad("not of the form i-j (two 0-based word indices)".into())),
            };
            if i >= n || j >= m {
                return Err(bad(format!(
                    "the pair has {n} source and {m} target words (indices from 0)"
                )));
            }
            Ok((i, j))
        })
        .collect()
}

/// The links `cfg.train.guided_alignment` asks for, as piece links of the run's corpus of `pairs` pairs (an
/// error if the prepared text yields another number). With `"builtin"`, rank 0 aligns the prepared pairs'
/// words and keeps the links in `run_dir` ([`BUILTIN_FILE`]; an existing one, from an interrupted run, is
/// read again); every rank then reads them. `None` when the key is not set.
pub fn load(
    cfg: &Config,
    run_dir: &Path,
    pairs: usize,
    cluster: &Cluster,
    quiet: bool,
) -> Result<Option<GuideLinks>> {
    let Some(source) = cfg.train.guided_alignment.as_deref() else {
        return Ok(None);
    };
    let dir = &cfg.data.prepared;
    let (src, tgt) = crate::train::data::read_prepared_pairs(dir)?;
    let words: Vec<[(Vec<u32>, usize); 2]> = src
        .iter()
        .zip(&tgt)
        .map(|(s, t)| [piece_words(s), piece_words(t)])
        .collect();
    let path: PathBuf = if source == BUILTIN {
        let p = run_dir.join(BUILTIN_FILE);
        if cluster.rank() == 0 && !p.is_file() {
            align_builtin(&src, &tgt, &p, quiet)?;
        }
        cluster.barrier();
        p
    } else {
        PathBuf::from(source)
    };
    let text = cgnmt_data::corpus::read_lines(&path)
        .map_err(|e| NmtError::Data(format!("train.guided_alignment = {}: {e}", path.display())))?;
    if text.len() != src.len() {
        return Err(NmtError::Data(format!(
            "{}: {} lines of links, but {} has {} sentence pairs (one line per line of train.src, links over \
             its words)",
            path.display(),
            text.len(),
            dir.join("train.src").display(),
            src.len()
        )));
    }
    let mut out = GuideLinks {
        offsets: vec![0],
        links: vec![],
    };
    for (k, ((line, [(sw, ns), (tw, nt)]), (s, t))) in text
        .iter()
        .zip(&words)
        .zip(src.iter().zip(&tgt))
        .enumerate()
    {
        let at = format!("{} line {}", path.display(), k + 1);
        let links = parse_links(line, (*ns, *nt), &at)?;
        // The pairs the corpus keeps (as `train::data` keeps them).
        if s.is_empty() || t.is_empty() {
            continue;
        }
        if s.len() > cfg.data.max_len || t.len() > cfg.data.max_len {
            continue;
        }
        if cfg.data.limit > 0 && out.len() >= cfg.data.limit {
            continue;
        }
        for (i, j) in links {
            for (ps, _) in sw.iter().enumerate().filter(|(_, &w)| w as usize == i) {
                for (pt, _) in tw.iter().enumerate().filter(|(_, &w)| w as usize == j) {
                    out.links.push((ps as u32, pt as u32));
                }
            }
        }
        // EOS to EOS.
        out.links.push((s.len() as u32, t.len() as u32));
        out.offsets.push(out.links.len());
    }
    if out.len() != pairs {
        return Err(NmtError::Data(format!(
            "{}: links for {} training pairs, but the corpus has {pairs}: prepare the corpus again",
            path.display(),
            out.len()
        )));
    }
    Ok(Some(out))
}

/// The built-in aligner's links (grow-diag-final-and) of the prepared pairs' words, written to `out`.
fn align_builtin(src: &[Vec<String>], tgt: &[Vec<String>], out: &Path, quiet: bool) -> Result<()> {
    let pairs: Vec<(Vec<String>, Vec<String>)> = src
        .iter()
        .zip(tgt)
        .map(|(s, t)| {
            (
                cgnmt_data::bpe::merge_subwords(s),
                cgnmt_data::bpe::merge_subwords(t),
            )
        })
        .collect();
    let o = AlignerOptions::default();
    let pb = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let pb = indicatif::ProgressBar::new(2 * o.iterations as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "guided alignment: aligning {msg} [{elapsed}] iteration {pos}/{len}",
            )
            .expect("progress template"),
        );
        pb.set_message(format!("{} training pairs", pairs.len()));
        pb
    };
    let links = align_corpus(&pairs, &o, Symmetrize::GrowDiagFinalAnd, |d, _| {
        pb.set_position(d as u64)
    });
    pb.finish_and_clear();
    let mut text = String::new();
    for l in &links {
        let row: Vec<String> = l.iter().map(|&(i, j)| format!("{i}-{j}")).collect();
        text.push_str(&row.join(" "));
        text.push('\n');
    }
    crate::atomic_file::write_atomic(out, text.as_bytes())
        .map_err(|e| NmtError::Data(format!("{}: {e:#}", out.display())))?;
    if !quiet {
        eprintln!(
            "guided alignment: the built-in aligner's links of {} pairs in {}",
            links.len(),
            out.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_map_to_their_words() {
        let p: Vec<String> = ["un@@", "believ@@", "able", "news", "to@@"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(piece_words(&p), (vec![0, 0, 0, 1, 2], 3));
    }

    #[test]
    fn bad_links_name_the_line() {
        assert_eq!(
            parse_links("0-1 2-0", (3, 2), "f line 4").unwrap(),
            vec![(0, 1), (2, 0)]
        );
        for bad in ["0-2", "3-0", "a-1", "01", "1-"] {
            let e = parse_links(bad, (3, 2), "f line 4")
                .unwrap_err()
                .to_string();
            assert!(e.contains("f line 4") && e.contains(bad), "{e}");
        }
        assert!(parse_links("", (3, 2), "x").unwrap().is_empty());
    }
}
