//! `cgnmt align-corpus`, the statistical aligner in the box: on the first 20,000 Hansards fr-en training pairs
//! with the 447 NAACL 2003 gold-aligned test pairs appended, its links for the test pairs score an AER against
//! the gold Sure/Possible links (`cgnmt aer`) well below attention's (about 30 in results/deep-hansards), and
//! the three ways of combining the directions order as they must: the intersection's precision is the
//! highest, the union's recall the highest.

use crate::common::{self, run_ok};
use std::io::{BufRead, BufReader};

#[test]
fn align_corpus_aligns_hansards_and_its_symmetrisations_trade_precision_for_recall() {
    let data = common::data_dir();
    let (h, g) = (
        data.join("hansards-en-fr"),
        data.join("align-en-fr-hansards"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let side = |train: &str, test: &str, out: &str| -> std::path::PathBuf {
        let f = std::fs::File::open(h.join(train)).unwrap();
        let mut lines: Vec<String> = BufReader::new(flate2::read::GzDecoder::new(f))
            .lines()
            .take(20_000)
            .map(Result::unwrap)
            .collect();
        lines.extend(
            std::fs::read_to_string(g.join(test))
                .unwrap()
                .lines()
                .map(String::from),
        );
        let p = tmp.path().join(out);
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        p
    };
    let fr = side("train.fr.gz", "test.fr", "c.fr");
    let en = side("train.en.gz", "test.en", "c.en");
    let mut scores = vec![];
    for how in ["grow-diag-final-and", "intersection", "union"] {
        let out = tmp.path().join(format!("{how}.talp"));
        run_ok(&[
            "align-corpus",
            "-q",
            "--src",
            fr.to_str().unwrap(),
            "--tgt",
            en.to_str().unwrap(),
            "--symmetrize",
            how,
            "--target-first",
            "-o",
            out.to_str().unwrap(),
        ]);
        let links = std::fs::read_to_string(&out).unwrap();
        let all: Vec<&str> = links.lines().collect();
        assert_eq!(all.len(), 20_447);
        let test = tmp.path().join(format!("{how}.test.talp"));
        std::fs::write(&test, all[20_000..].join("\n") + "\n").unwrap();
        let v: serde_json::Value = serde_json::from_str(&run_ok(&[
            "aer",
            "--gold",
            g.join("test.talp").to_str().unwrap(),
            "--pred",
            test.to_str().unwrap(),
            "--json",
        ]))
        .unwrap();
        let f = |k: &str| v[k].as_f64().unwrap();
        scores.push((how, f("aer"), f("precision"), f("recall")));
    }
    eprintln!("{scores:?}");
    let (gdfa, inter, union) = (scores[0], scores[1], scores[2]);
    assert!(gdfa.1 < 0.25, "grow-diag-final-and AER {}", gdfa.1);
    assert!(inter.2 > gdfa.2 && inter.2 > union.2, "{scores:?}");
    assert!(union.3 > gdfa.3 && union.3 > inter.3, "{scores:?}");
    // Bad input is named.
    let err = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args([
            "align-corpus",
            "--src",
            fr.to_str().unwrap(),
            "--tgt",
            g.join("test.en").to_str().unwrap(),
            "-o",
        ])
        .arg(tmp.path().join("x.talp"))
        .output()
        .unwrap();
    assert!(!err.status.success());
    let msg = String::from_utf8_lossy(&err.stderr);
    assert!(msg.contains("c.fr") || msg.contains("test.en"), "{msg}");
    assert!(!tmp.path().join("x.talp").exists());
}
