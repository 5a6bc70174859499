//! How finished hypotheses are ranked (model-spec §7): by their total log-probability (GroundHog's rule, the
//! default), per word, or under GNMT's length and coverage penalties (Wu et al., 2016).

/// The ranking of finished hypotheses that a search's options choose.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Ranking {
    /// Log-probability / (length + 1) instead of the total.
    pub length_norm: bool,
    /// GNMT's length penalty α: log-probability / ((5 + length + 1) / 6)^α; 0 ranks by the total. Ignored
    /// with `length_norm`.
    pub length_penalty: f64,
    /// GNMT's coverage penalty β: plus `β Σ_j log(min(m_j, 1))` over the attention mass `m_j` each source
    /// position received; 0 adds nothing.
    pub coverage_penalty: f64,
}

impl Ranking {
    /// Whether hypotheses are ranked by their total log-probability alone. Only then is a sentence decided
    /// once its `nbest`-th finished hypothesis scores at least as high as its best live one (log-probabilities
    /// are ≤ 0, so a live hypothesis only loses score as it grows).
    pub fn by_total(&self) -> bool {
        !self.length_norm && self.length_penalty == 0.0 && self.coverage_penalty == 0.0
    }

    /// Whether the search must carry each hypothesis's attention mass.
    pub fn needs_attention_mass(&self) -> bool {
        self.coverage_penalty != 0.0
    }

    /// The key a finished hypothesis is ranked by (higher first): its total log-probability `score` over
    /// `words` target words (EOS counted), per word, or over GNMT's length penalty `((5 + words) / 6)^α`;
    /// plus GNMT's coverage penalty of the attention `mass` where β ≠ 0.
    pub fn key(&self, score: f64, words: usize, mass: &[f64]) -> f64 {
        let words = words as f64;
        let key = if self.length_norm {
            score / words
        } else if self.length_penalty != 0.0 {
            score / ((5.0 + words) / 6.0).powf(self.length_penalty)
        } else {
            score
        };
        if self.coverage_penalty == 0.0 {
            return key;
        }
        key + self.coverage_penalty * coverage_penalty(mass)
    }
}

/// `Σ_j log(min(m_j, 1))` of the attention mass `m_j` each source position received (≤ 0; 0 when every
/// position received at least 1). A position that received none counts as the smallest positive mass.
pub fn coverage_penalty(mass: &[f64]) -> f64 {
    mass.iter()
        .map(|&m| m.clamp(f64::MIN_POSITIVE, 1.0).ln())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::{coverage_penalty, Ranking};

    #[test]
    fn length_penalty_ranks_like_gnmt() {
        // Two hypotheses: 2 words with log-probability −3 and 8 words with −4 (EOS counted below).
        let (short, long) = ((-3.0, 3), (-4.0, 9));
        let key = |r: &Ranking, (score, words): (f64, usize)| r.key(score, words, &[]);
        let total = Ranking::default();
        assert!(total.by_total());
        assert!(key(&total, short) > key(&total, long));
        // α = 1: −3 / (8/6) = −2.25 against −4 / (14/6) ≈ −1.714: the longer one wins.
        let lp = Ranking {
            length_penalty: 1.0,
            ..Default::default()
        };
        assert!(!lp.by_total());
        assert!((key(&lp, short) + 2.25).abs() < 1e-12);
        assert!((key(&lp, long) + 4.0 * 6.0 / 14.0).abs() < 1e-12);
        assert!(key(&lp, long) > key(&lp, short));
        // Per word: −3 / 3 = −1 against −4 / 9.
        let norm = Ranking {
            length_norm: true,
            length_penalty: 1.0,
            ..Default::default()
        };
        assert!((key(&norm, short) + 1.0).abs() < 1e-12);
        assert!((key(&norm, long) + 4.0 / 9.0).abs() < 1e-12);
    }

    #[test]
    fn coverage_penalty_ranks_like_gnmt() {
        // Σ_j log(min(m_j, 1)): 0 for full coverage; a position with no attention counts as a tiny mass.
        assert_eq!(coverage_penalty(&[1.0, 2.5, 1.0]), 0.0);
        let p = coverage_penalty(&[0.5, 1.7, 0.25]);
        assert!((p - (0.5f64.ln() + 0.25f64.ln())).abs() < 1e-12);
        assert!(coverage_penalty(&[0.0]).is_finite() && coverage_penalty(&[0.0]) < -700.0);
        // The likelier hypothesis left a word unattended; β = 0.5 ranks the one that covers it first:
        // −2 + 0.5·(log 0.2 + log 1) ≈ −2.80 against −2.5 + 0.5·log 0.9 ≈ −2.55. Both have 3 words + EOS.
        let (skips, covers) = ((-2.0, [0.2, 1.8]), (-2.5, [0.9, 1.1]));
        let key = |r: &Ranking, (score, mass): (f64, [f64; 2])| r.key(score, 4, &mass);
        let plain = Ranking::default();
        assert!(key(&plain, skips) > key(&plain, covers));
        let cp = Ranking {
            coverage_penalty: 0.5,
            ..Default::default()
        };
        assert!(cp.needs_attention_mass() && !cp.by_total());
        assert!((key(&cp, skips) - (-2.0 + 0.5 * 0.2f64.ln())).abs() < 1e-12);
        assert!((key(&cp, covers) - (-2.5 + 0.5 * 0.9f64.ln())).abs() < 1e-12);
        assert!(key(&cp, covers) > key(&cp, skips));
        // With the length penalty: the penalised log-probability plus β·cp.
        let both = Ranking {
            coverage_penalty: 0.5,
            length_penalty: 1.0,
            ..Default::default()
        };
        let lp = (5.0 + 4.0) / 6.0;
        assert!((key(&both, covers) - (-2.5 / lp + 0.5 * 0.9f64.ln())).abs() < 1e-12);
    }
}
