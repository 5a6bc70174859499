use std::path::{Path, PathBuf};

use cgnmt_data::prepare::prepare;
use cgnmt_data::{
    read_lines, run_prepare, PrepareOptions, Preprocessor, TokenizerKind, Vocab, WordCounts,
};

use crate::common::tatoeba;

/// The first 500 Tatoeba training pairs into `out`, with settings `extra` named as `cgnmt prepare`'s flags
/// (`--bpe-tgt 300`, `--lowercase`; the command line's own parsing is tested with the binary).
fn args(out: &Path, extra: &[&str]) -> PrepareOptions {
    let mut a = PrepareOptions::new(tatoeba("train.zh"), tatoeba("train.en"), out);
    a.limit = Some(500);
    let mut it = extra.iter();
    while let Some(&flag) = it.next() {
        let mut value = || it.next().expect("a value").to_string();
        match flag {
            "--lowercase" => a.lowercase = true,
            "--force" => a.force = true,
            "--dev-src" => a.dev_src = Some(value().into()),
            "--dev-tgt" => a.dev_tgt = Some(value().into()),
            "--test-src" => a.test_src = Some(value().into()),
            "--test-tgt" => a.test_tgt = Some(value().into()),
            "--src-vocab-size" => a.src_vocab_size = value().parse().unwrap(),
            "--tgt-vocab-size" => a.tgt_vocab_size = value().parse().unwrap(),
            "--max-len" => a.max_len = value().parse().unwrap(),
            "--bpe-src" => a.bpe_src = Some(value().parse().unwrap()),
            "--bpe-tgt" => a.bpe_tgt = Some(value().parse().unwrap()),
            "--unigram-src" => a.unigram_src = Some(value().parse().unwrap()),
            "--unigram-tgt" => a.unigram_tgt = Some(value().parse().unwrap()),
            other => panic!("the test helper does not know {other}"),
        }
    }
    a
}

fn read(dir: &Path, f: &str) -> Vec<String> {
    read_lines(&dir.join(f)).unwrap()
}

#[test]
fn prepare_first_500_tatoeba_pairs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("prep");
    let dev_zh = tatoeba("dev.zh").display().to_string();
    let dev_en = tatoeba("dev.en").display().to_string();
    let a = args(
        &out,
        &[
            "--dev-src",
            &dev_zh,
            "--dev-tgt",
            &dev_en,
            "--src-vocab-size",
            "300",
            "--tgt-vocab-size",
            "400",
            "--max-len",
            "8",
        ],
    );
    let s = prepare(&a).unwrap();
    // Nothing else left next to the output (no tmp dir).
    let siblings: Vec<PathBuf> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(siblings, vec![out.clone()]);

    let src = read(&out, "train.src");
    let tgt = read(&out, "train.tgt");
    let lines = read(&out, "train.lines");
    assert_eq!(s.train.pairs_read, 500);
    assert_eq!(s.train.pairs_kept, src.len());
    assert_eq!(src.len(), tgt.len());
    assert_eq!(src.len(), lines.len());
    assert_eq!(
        s.train.pairs_kept + s.train.dropped_empty + s.train.dropped_too_long,
        500
    );
    // Tatoeba's first 500 pairs are short: only the longer ones go at --max-len 8.
    assert!(s.train.pairs_kept > 400, "{:?}", s.train);

    // Each kept line is the tokenization of the input line it names.
    let raw_zh = read_lines(&tatoeba("train.zh")).unwrap();
    let raw_en = read_lines(&tatoeba("train.en")).unwrap();
    let pre = Preprocessor::load(&out).unwrap();
    assert_eq!(pre.src.tokenizer.kind, TokenizerKind::Jieba);
    assert_eq!(pre.tgt.tokenizer.kind, TokenizerKind::Punct);
    let mut prev = 0usize;
    for (k, l) in lines.iter().enumerate() {
        let n: usize = l.parse().unwrap();
        assert!(n > prev && n <= 500);
        prev = n;
        assert_eq!(src[k], pre.src_tokens(&raw_zh[n - 1]).join(" "));
        assert_eq!(tgt[k], pre.tgt_tokens(&raw_en[n - 1]).join(" "));
        assert!(tgt[k].split(' ').count() <= 8);
        let toks: Vec<String> = tgt[k].split(' ').map(String::from).collect();
        assert_eq!(pre.postprocess_tgt(&toks), raw_en[n - 1]);
        let mut with_eos = toks.clone();
        with_eos.push("</s>".into());
        assert_eq!(pre.postprocess_tgt(&with_eos), raw_en[n - 1]);
    }

    // Vocabularies: K + 2 entries, most frequent first; counts consistent with train files.
    let vs = Vocab::load(&out.join("vocab.src")).unwrap();
    let vt = Vocab::load(&out.join("vocab.tgt")).unwrap();
    assert_eq!(vs.len(), s.src.vocab_entries);
    assert!(vs.len() <= 302 && vt.len() <= 402);
    let ct = WordCounts::load(&out.join("counts.tgt")).unwrap();
    let running: usize = tgt.iter().map(|l| l.split(' ').count()).sum();
    assert_eq!(ct.total() as usize, running);
    assert_eq!(vt.token(2), Some(ct.sorted()[0].0));
    assert!((cgnmt_data::coverage(&vt, &ct) - s.tgt.coverage).abs() < 1e-12);
    assert!(s.src.coverage > 0.5 && s.src.coverage <= 1.0);

    // Dev: not filtered, raw references copied exactly.
    assert_eq!(read(&out, "dev.src").len(), 982);
    assert_eq!(read(&out, "dev.tgt").len(), 982);
    assert_eq!(
        read(&out, "dev.ref"),
        read_lines(&tatoeba("dev.en")).unwrap()
    );
    assert!(!out.join("test.src").exists());

    // Summary JSON.
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("prepare.json")).unwrap()).unwrap();
    assert_eq!(j["train"]["pairs_read"], 500);
    assert_eq!(j["dev"]["pairs_read"], 982);
    assert_eq!(j["src"]["tokenizer"]["kind"], "jieba");
    // The dev set's out-of-vocabulary rates: its tokens missing from the vocabularies written beside it.
    for (k, side, vocab) in [(0, "dev.src", "vocab.src"), (1, "dev.tgt", "vocab.tgt")] {
        let words: std::collections::HashSet<String> = read(&out, vocab)
            .into_iter()
            .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
            .collect();
        let toks: Vec<String> = read(&out, side)
            .iter()
            .flat_map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
            .collect();
        let oov = toks.iter().filter(|t| !words.contains(*t)).count() as f64 / toks.len() as f64;
        let got = j["dev"]["unk_rate"][k].as_f64().unwrap();
        assert!(
            (got - oov).abs() < 1e-12 && got > 0.05,
            "{side}: {got} against {oov}"
        );
    }
    assert!(j["train"].get("unk_rate").is_none());

    // A second run refuses the non-empty directory, and leaves it intact.
    let err = prepare(&a).unwrap_err().to_string();
    assert!(
        err.contains("not empty") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(read(&out, "train.src"), src);
    // With --force it is replaced.
    let mut forced = a.clone();
    forced.force = true;
    forced.limit = Some(100);
    let s2 = prepare(&forced).unwrap();
    assert_eq!(s2.train.pairs_read, 100);
    assert_eq!(read(&out, "train.lines").len(), s2.train.pairs_kept);
    assert!(!out.join("nothing").exists());
}

#[test]
fn prepare_with_bpe_and_lowercase() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bpe");
    let test_zh = tatoeba("test.zh").display().to_string();
    let test_en = tatoeba("test.en").display().to_string();
    let a = args(
        &out,
        &[
            "--test-src",
            &test_zh,
            "--test-tgt",
            &test_en,
            "--bpe-src",
            "800",
            "--bpe-tgt",
            "300",
            "--lowercase",
        ],
    );
    run_prepare(&a).unwrap();
    assert!(out.join("bpe.src.json").is_file() && out.join("bpe.tgt.json").is_file());
    let pre = Preprocessor::load(&out).unwrap();
    assert_eq!(pre.tgt.bpe.as_deref(), Some(Path::new("bpe.tgt.json")));
    let test_tgt = read(&out, "test.tgt");
    let refs = read(&out, "test.ref");
    assert_eq!(test_tgt.len(), 2049);
    assert_eq!(refs, read_lines(&tatoeba("test.en")).unwrap());
    assert!(test_tgt.iter().any(|l| l.contains("@@ ")));
    // postprocess inverts BPE + tokenization up to lowercasing for nearly all references.
    let ok = test_tgt
        .iter()
        .zip(&refs)
        .filter(|(t, r)| {
            let toks: Vec<String> = t.split(' ').map(String::from).collect();
            pre.postprocess_tgt(&toks) == r.to_lowercase()
        })
        .count();
    assert!(ok as f64 >= 0.95 * 2049.0, "{ok}");
}

/// `--unigram-src` / `--unigram-tgt`: unigram subword models on both sides, written, loaded by the
/// preprocessor, and inverted by its postprocessing; BPE and unigram on one side is refused.
#[test]
fn prepare_with_unigram_subwords() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("unigram");
    let test_zh = tatoeba("test.zh").display().to_string();
    let test_en = tatoeba("test.en").display().to_string();
    let a = args(
        &out,
        &[
            "--test-src",
            &test_zh,
            "--test-tgt",
            &test_en,
            "--unigram-src",
            "800",
            "--unigram-tgt",
            "400",
        ],
    );
    run_prepare(&a).unwrap();
    assert!(out.join("unigram.src.json").is_file() && out.join("unigram.tgt.json").is_file());
    assert!(!out.join("bpe.tgt.json").exists());
    let pre = Preprocessor::load(&out).unwrap();
    assert_eq!(pre.tgt.bpe.as_deref(), Some(Path::new("unigram.tgt.json")));
    let test_tgt = read(&out, "test.tgt");
    let refs = read(&out, "test.ref");
    assert!(test_tgt.iter().any(|l| l.contains("@@ ")));
    let ok = test_tgt
        .iter()
        .zip(&refs)
        .filter(|(t, r)| {
            let toks: Vec<String> = t.split(' ').map(String::from).collect();
            &pre.postprocess_tgt(&toks) == *r
        })
        .count();
    assert!(ok as f64 >= 0.95 * 2049.0, "{ok}");
    // A side takes BPE or unigram subwords, not both.
    let both = args(&out, &["--bpe-src", "5", "--unigram-src", "5"]);
    assert!(prepare(&both).is_err());
}

#[test]
fn prepare_errors_leave_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bad");
    let mut a = args(&out, &[]);
    a.tgt = tatoeba("dev.en"); // 982 lines vs 26k
    let err = prepare(&a).unwrap_err().to_string();
    assert!(err.contains("train.zh") && err.contains("dev.en"), "{err}");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);

    let mut a = args(&out, &[]);
    a.max_len = 0;
    assert!(prepare(&a).is_err());
    let mut a = args(&out, &[]);
    a.src = tmp.path().join("missing.zh");
    let err = format!("{:#}", prepare(&a).unwrap_err());
    assert!(err.contains("missing.zh"), "{err}");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

/// Full Tatoeba corpus (timing check): `cargo test --release -- --ignored full_tatoeba --nocapture`.
#[test]
#[ignore]
fn full_tatoeba() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("full");
    let mut a = args(&out, &["--bpe-tgt", "8000"]);
    a.limit = None;
    let t = std::time::Instant::now();
    run_prepare(&a).unwrap();
    eprintln!(
        "{:?}\n{}",
        t.elapsed(),
        std::fs::read_to_string(out.join("prepare.json")).unwrap()
    );
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::fs::read(out.join("bpe.tgt.json"))
        .unwrap()
        .hash(&mut h);
    std::fs::read(out.join("train.tgt")).unwrap().hash(&mut h);
    eprintln!("bpe+train.tgt hash {:x}", h.finish());
}

/// Full Hansards en–fr (833k gzipped pairs, pre-tokenized; timing check):
/// `cargo test --release -- --ignored full_hansards --nocapture`.
#[test]
#[ignore]
fn full_hansards() {
    let Some(d) = crate::common::data_dir().map(|d| d.join("hansards-en-fr")) else {
        eprintln!(
            "!!!!! full_hansards: SKIPPED — set CGNMT_DATA to the shared data directory !!!!!"
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("hansards");
    let mut a = PrepareOptions::new(d.join("train.en.gz"), d.join("train.fr.gz"), &out);
    (a.src_lang, a.tgt_lang) = ("en".into(), "fr".into());
    (a.src_tok, a.tgt_tok) = (
        Some(TokenizerKind::Whitespace),
        Some(TokenizerKind::Whitespace),
    );
    let t = std::time::Instant::now();
    run_prepare(&a).unwrap();
    eprintln!(
        "{:?}\n{}",
        t.elapsed(),
        std::fs::read_to_string(out.join("prepare.json")).unwrap()
    );
}
