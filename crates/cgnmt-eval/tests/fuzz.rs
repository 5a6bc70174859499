//! Property tests ("fuzzing"): arbitrary input never makes the `.talp` parser, the BLEU
//! tokenisers, BLEU / chrF scoring or the text reader panic.
//!
//! What was run (2026-11-29): `cargo test --release --test fuzz` with proptest's default 256
//! cases per property, and once with `PROPTEST_CASES=20000` for all properties — no failures.
//! Strings are drawn from `\PC*` (any printable Unicode) and from a small alphabet rich in the
//! characters the tokenisers and the link parser treat specially (`-?p.,&;<>` digits, U+00A0,
//! U+3000, CJK).

use std::path::Path;

use cgnmt_eval::aer::{parse_gold, parse_pred};
use cgnmt_eval::chrf::{corpus_chrf, ChrfOptions};
use cgnmt_eval::io::lines_from_bytes;
use cgnmt_eval::{corpus_bleu, BleuOptions, Tokenize};
use proptest::prelude::*;

const TOKS: [Tokenize; 9] = [
    Tokenize::Tok13a,
    Tokenize::Intl,
    Tokenize::Zh,
    Tokenize::Char,
    Tokenize::None,
    Tokenize::MtevalV11b,
    Tokenize::MtevalV13a,
    Tokenize::MtevalV13aIntl,
    Tokenize::MultiBleu,
];

fn tricky() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[0-9a-zA-Zé -?p.,&;<>\\n\\t\u{a0}\u{3000}我们。“”—]{0,40}")
        .expect("valid regex")
}

proptest! {
    #[test]
    fn talp_parser_never_panics(s in "\\PC*", t in tricky()) {
        let _ = parse_gold(&s, Path::new("fuzz"));
        let _ = parse_pred(&s, Path::new("fuzz"));
        let _ = parse_gold(&t, Path::new("fuzz"));
        let _ = parse_pred(&t, Path::new("fuzz"));
    }

    #[test]
    fn tokenizers_never_panic_and_give_no_empty_tokens(s in "\\PC*", t in tricky(), lc in any::<bool>()) {
        for tok in TOKS {
            for x in [&s, &t] {
                let v = tok.tokens(x, lc);
                prop_assert!(v.iter().all(|w| !w.is_empty()));
            }
        }
    }

    #[test]
    fn scoring_never_panics(h in tricky(), r in tricky()) {
        let hyps = vec![h];
        let refs = vec![vec![r]];
        for tok in TOKS {
            let mut o = BleuOptions::sacrebleu();
            o.tokenize = tok;
            let b = corpus_bleu(&hyps, &refs, &o).unwrap();
            prop_assert!(b.score.is_finite() && (0.0..=100.0 + 1e-9).contains(&b.score));
        }
        let c = corpus_chrf(&hyps, &refs, &ChrfOptions::chrf_plus_plus()).unwrap();
        prop_assert!(c.score.is_finite());
    }

    #[test]
    fn reader_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = lines_from_bytes(&bytes, Path::new("fuzz"));
    }
}

fn jsonish() -> impl Strategy<Value = String> {
    proptest::string::string_regex(
        "[{}\\[\\]\":,0-9.eE+\\- a-z\\n]{0,60}|\\{\"(id|step|eval|gates|attention|src|hyp|loss_per_token)\":[^\\n]{0,30}\\}",
    )
    .expect("valid regex")
}

proptest! {
    #[test]
    fn dump_and_log_parsers_never_panic(s in "\\PC*", t in jsonish()) {
        use cgnmt_eval::analysis::{parse_dump, parse_training_log};
        for x in [&s, &t] {
            let _ = parse_dump(x, Path::new("fuzz"));
            let _ = parse_training_log(x, Path::new("fuzz"));
        }
    }

    #[test]
    fn pearson_is_bounded_or_an_error(
        v in proptest::collection::vec((-1e6f64..1e6, -1e6f64..1e6), 0..12),
        nan in any::<bool>(),
    ) {
        let (mut x, y): (Vec<f64>, Vec<f64>) = v.into_iter().unzip();
        if nan && !x.is_empty() { x[0] = f64::NAN; }
        if let Ok(r) = cgnmt_eval::analysis::pearson(&x, &y) {
            prop_assert!((-1.0..=1.0).contains(&r));
        }
    }

    #[test]
    fn attention_figures_never_panic(
        rows in 0usize..6,
        cols in 0usize..6,
        ragged in any::<bool>(),
        nsrc in 0usize..7,
        nhyp in 0usize..7,
        w in proptest::collection::vec(prop_oneof![Just(f64::NAN), -2.0f64..3.0], 36),
        gates in proptest::collection::vec(prop_oneof![Just(f64::NAN), -1.0f64..2.0], 0..8),
        tok in tricky(),
        fit in any::<bool>(),
    ) {
        use cgnmt_eval::analysis::DumpRecord;
        use cgnmt_eval::plot::{render_rgb, AttentionFigure};
        let mut attention: Vec<Vec<f64>> =
            (0..rows).map(|i| (0..cols).map(|j| w[i * 6 + j]).collect()).collect();
        if ragged && rows > 1 { attention[1].push(0.5); }
        // Half of the cases have matching shapes, so that most of them are drawn.
        let (nsrc, nhyp) = if fit { (cols, rows) } else { (nsrc, nhyp) };
        let t = if tok.trim().is_empty() { "x".to_string() } else { tok };
        let rec = DumpRecord {
            id: Some(0),
            src: vec![t.clone(); nsrc],
            hyp: vec![t; nhyp],
            score: None,
            attention,
            gates,
            coverage: vec![],
        };
        if let Ok(fig) = AttentionFigure::from_record(&rec) {
            let _ = render_rgb(&fig);
        }
    }
}
