//! Lexically constrained decoding: target prefixes, phrases every output must contain (positive
//! constraints) and phrases no output may contain (negative ones), for the beam search of
//! [`crate::decode::beam_search`].
//!
//! Positive constraints use Post & Vilar's (2018) **dynamic beam allocation** with a fixed beam `k`: at every
//! step a sentence's candidates are each live hypothesis's top-k words, the words that would advance one of
//! its unmet constraints (the next word of the phrase it is inside, or the first word of any phrase it has
//! not met), and its best word; each candidate is put in the *bank* of how many constraint words it has met
//! (words of the phrase it is inside count); the beam's `k` slots are shared out evenly over the `C + 1`
//! banks (C: the sentence's constraint words; the remainder to the banks that met most), each bank takes its
//! best candidates, and slots a bank cannot fill go to the best remaining candidates of any bank. A
//! hypothesis may end (EOS) only once it has met every constraint, so every finished hypothesis meets them
//! all, except those stopped at the length limit: the ranking puts the ones that met more constraints
//! first, and the caller warns about a best output that did not meet them all. The beam never grows with
//! the number of constraints.
//!
//! A word that would complete an `avoid` phrase is never a candidate. Phrases are matched on the model's
//! target tokens (subword pieces), after the target side's tokeniser and BPE.

/// What steers one sentence's search, in target ids. All empty: nothing (plain beam search).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Steering {
    /// The words the output starts with; the search goes on from them.
    pub prefix: Vec<u32>,
    /// Phrases the output must contain, each once, in any order (positive constraints).
    pub include: Vec<Vec<u32>>,
    /// Phrases the output must never contain (negative constraints).
    pub avoid: Vec<Vec<u32>>,
}

impl Steering {
    /// Nothing steers the sentence.
    pub fn is_empty(&self) -> bool {
        self.prefix.is_empty() && self.include.is_empty() && self.avoid.is_empty()
    }

    /// The number of constraint words (the highest bank).
    pub fn constraint_words(&self) -> usize {
        self.include.iter().map(Vec::len).sum()
    }

    /// Every word a constraint or the prefix names (a shortlist must hold them).
    pub fn words(&self) -> impl Iterator<Item = u32> + '_ {
        self.prefix
            .iter()
            .chain(self.include.iter().flatten())
            .copied()
    }

    /// The words that may not follow `tokens` (each completes an avoided phrase).
    pub fn banned_after(&self, tokens: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .avoid
            .iter()
            .filter_map(|ph| {
                let (last, head) = ph.split_last()?;
                tokens.ends_with(head).then_some(*last)
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// A hypothesis's progress through its sentence's positive constraints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Per phrase: met.
    met: Vec<bool>,
    /// The phrase the hypothesis is inside and how many of its words it has produced.
    inside: Option<(usize, usize)>,
}

impl Progress {
    /// No constraint met yet, for a sentence with `phrases` positive constraints.
    pub fn new(phrases: usize) -> Self {
        Progress {
            met: vec![false; phrases],
            inside: None,
        }
    }

    /// Every constraint met.
    pub fn done(&self) -> bool {
        self.met.iter().all(|&m| m)
    }

    /// How many phrases are not met.
    pub fn unmet(&self) -> usize {
        self.met.iter().filter(|&&m| !m).count()
    }

    /// Constraint words met: the met phrases' words and those produced of the phrase it is inside (the
    /// candidate's bank).
    pub fn met_words(&self, include: &[Vec<u32>]) -> usize {
        let whole: usize = include
            .iter()
            .zip(&self.met)
            .filter(|(_, &m)| m)
            .map(|(p, _)| p.len())
            .sum();
        whole + self.inside.map_or(0, |(_, k)| k)
    }

    /// The progress after producing `w`: the phrase it is inside goes on when `w` is its next word and is
    /// left otherwise; `w` may start (or, for one word, meet) the first unmet phrase it begins.
    pub fn after(&self, include: &[Vec<u32>], w: u32) -> Progress {
        let mut p = self.clone();
        if let Some((i, k)) = self.inside {
            if include[i][k] == w {
                if k + 1 == include[i].len() {
                    p.met[i] = true;
                    p.inside = None;
                } else {
                    p.inside = Some((i, k + 1));
                }
                return p;
            }
            p.inside = None;
        }
        if let Some(i) = (0..include.len()).find(|&i| !p.met[i] && include[i][0] == w) {
            if include[i].len() == 1 {
                p.met[i] = true;
            } else {
                p.inside = Some((i, 1));
            }
        }
        p
    }

    /// The words that advance an unmet constraint: the next word of the phrase it is inside, and the first
    /// word of every unmet phrase.
    pub fn advancing(&self, include: &[Vec<u32>]) -> Vec<u32> {
        let mut out: Vec<u32> = include
            .iter()
            .zip(&self.met)
            .filter(|(_, &m)| !m)
            .map(|(ph, _)| ph[0])
            .collect();
        if let Some((i, k)) = self.inside {
            out.push(include[i][k]);
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Choose `k` of a sentence's candidates by dynamic beam allocation. Each candidate is `(score, bank, ..)`
/// (its bank: constraint words met, at most `banks - 1`), sorted best first; returns the chosen ones'
/// indices, in that order.
pub fn allocate(cands: &[(f64, usize)], k: usize, banks: usize) -> Vec<usize> {
    let banks = banks.max(1);
    // Each bank's share of the beam, the remainder to the banks that met most.
    let mut quota: Vec<usize> = (0..banks)
        .map(|b| k / banks + usize::from(b >= banks - k % banks))
        .collect();
    let mut chosen = vec![false; cands.len()];
    let mut taken = 0;
    for (i, &(_, bank)) in cands.iter().enumerate() {
        let b = bank.min(banks - 1);
        if quota[b] > 0 {
            quota[b] -= 1;
            chosen[i] = true;
            taken += 1;
        }
    }
    // Slots a bank could not fill: the best remaining candidates of any bank.
    for c in chosen.iter_mut() {
        if taken >= k {
            break;
        }
        if !*c {
            *c = true;
            taken += 1;
        }
    }
    (0..cands.len()).filter(|&i| chosen[i]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_follows_phrases_and_leaves_one_that_breaks() {
        let inc = vec![vec![5, 6, 7], vec![9]];
        let p = Progress::new(2);
        assert_eq!(p.advancing(&inc), vec![5, 9]);
        let p = p.after(&inc, 5).after(&inc, 6);
        assert_eq!(p.met_words(&inc), 2);
        assert_eq!(p.advancing(&inc), vec![5, 7, 9]);
        // A word that breaks the phrase leaves it (its words no longer count).
        let broken = p.after(&inc, 3);
        assert_eq!(broken.met_words(&inc), 0);
        // Restarting it from its first word.
        assert_eq!(p.after(&inc, 5).met_words(&inc), 1);
        let p = p.after(&inc, 7);
        assert_eq!((p.met_words(&inc), p.unmet()), (3, 1));
        let p = p.after(&inc, 9);
        assert!(p.done());
        assert_eq!(p.met_words(&inc), 4);
        assert!(p.advancing(&inc).is_empty());
    }

    #[test]
    fn avoided_phrases_ban_their_last_word_after_their_head() {
        let s = Steering {
            avoid: vec![vec![4], vec![1, 2, 3]],
            ..Default::default()
        };
        assert_eq!(s.banned_after(&[]), vec![4]);
        assert_eq!(s.banned_after(&[7, 1, 2]), vec![3, 4]);
        assert_eq!(s.banned_after(&[1, 3]), vec![4]);
    }

    #[test]
    fn allocation_shares_the_beam_over_banks_and_refills_empty_ones() {
        // Best first: banks 0,0,0,1,2,0.
        let c = [
            (-1.0, 0),
            (-2.0, 0),
            (-3.0, 0),
            (-4.0, 1),
            (-5.0, 2),
            (-6.0, 0),
        ];
        // k 3 over 3 banks: one each.
        assert_eq!(allocate(&c, 3, 3), vec![0, 3, 4]);
        // k 4: the remainder to the top bank, which has one candidate; its slot goes to the next best.
        assert_eq!(allocate(&c, 4, 3), vec![0, 1, 3, 4]);
        // No constraints: plain top-k.
        assert_eq!(allocate(&c, 2, 1), vec![0, 1]);
        // Fewer candidates than slots.
        assert_eq!(allocate(&c[..2], 5, 3), vec![0, 1]);
    }
}
