//! Output a pipeline can trust word by word (`translate --word-scores`, `--alignment`): each token's score is
//! the log-probability that forced decoding of the same output gives it, the hard links are `cgnmt align`'s
//! on the same words, and the command line writes them after each translation without changing it.

use crate::common::{self, prepare, run_ok};
use cgnmt::decode::alignment::{AlignmentMode, WordLevel};
use cgnmt::{ScoreOptions, TranslateOptions, Translator, TranslatorOptions};
use cgnmt_data::bpe::merge_subwords;

/// A small gated model trained on 400 Tatoeba pairs, and 40 dev sentences (raw text).
pub(crate) fn trained(
    tmp: &std::path::Path,
) -> (std::path::PathBuf, Vec<String>, std::path::PathBuf) {
    let prepared = tmp.join("prep");
    prepare(&prepared, 400);
    let run = tmp.join("run");
    common::train_tiny(
        &prepared,
        &run,
        &[
            "model.embedding_dim=48",
            "model.hidden_dim=64",
            "model.attention_dim=48",
            "model.context_gate=both",
            "train.batch_size=32",
            "train.max_steps=180",
            "train.optimizer=adam",
            "train.learning_rate=0.005",
        ],
    );
    let dev = common::data_dir().join("tatoeba-zh-en/dev.zh");
    let srcs: Vec<String> = std::fs::read_to_string(&dev)
        .unwrap()
        .lines()
        .take(40)
        .map(str::to_string)
        .collect();
    let input = tmp.join("src.txt");
    std::fs::write(&input, srcs.join("\n") + "\n").unwrap();
    (run.join("last"), srcs, input)
}

#[test]
fn word_scores_are_forced_log_probabilities_and_hard_links_are_aligns() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, srcs, _) = trained(tmp.path());
    let tr = Translator::open(&[&model], &TranslatorOptions::default()).unwrap();
    let lm = tr.model();
    let opts = TranslateOptions {
        beam: 5,
        nbest: 3,
        word_scores: true,
        alignment: Some(AlignmentMode::Hard),
        ..Default::default()
    };
    let out = tr.translate(&srcs, &opts).unwrap();
    // The same search without the options gives the same hypotheses and scores.
    let plain = tr
        .translate(
            &srcs,
            &TranslateOptions {
                beam: 5,
                nbest: 3,
                ..Default::default()
            },
        )
        .unwrap();
    for (a, b) in out.iter().zip(&plain) {
        assert_eq!(a.text, b.text);
        let s = |t: &cgnmt::Translation| {
            t.hyps
                .iter()
                .map(|h| (h.tokens.clone(), h.score))
                .collect::<Vec<_>>()
        };
        assert_eq!(s(a), s(b));
        assert!(b.hyps.iter().all(|h| h.word_scores.is_empty()));
    }

    // Every hypothesis's token scores against forced decoding of its tokens.
    let (mut ssrc, mut stgt) = (vec![], vec![]);
    for t in &out {
        for h in &t.hyps {
            ssrc.push(t.src_tokens.join(" "));
            stgt.push(lm.tgt_vocab.decode(&h.tokens).join(" "));
        }
    }
    let forced = tr
        .score(
            &ssrc,
            &stgt,
            &ScoreOptions {
                pretokenized: true,
                ..Default::default()
            },
        )
        .unwrap();
    let (mut k, mut tokens) = (0, 0);
    for t in &out {
        for h in &t.hyps {
            let f = &forced[k];
            k += 1;
            // With EOS when the hypothesis finished with it, without when it reached the length limit.
            let n = h.word_scores.len();
            assert!(
                n == h.tokens.len() || n == h.tokens.len() + 1,
                "{n} scores, {} tokens",
                h.tokens.len()
            );
            for (i, (&a, &b)) in h.word_scores.iter().zip(&f.token_scores[..n]).enumerate() {
                assert!((a - b).abs() < 1e-4, "token {i}: search {a}, forced {b}");
            }
            let sum: f64 = h.word_scores.iter().map(|&x| x as f64).sum();
            assert!((sum - h.score).abs() < 1e-4, "sum {sum}, score {}", h.score);
            // Words' scores are their pieces' sums; their gates one per word.
            let w = WordLevel::of(&t.src_tokens, &lm.tgt_vocab.decode(&h.tokens), h);
            let nw = merge_subwords(&lm.tgt_vocab.decode(&h.tokens)).len();
            assert_eq!(w.word_scores.len(), nw);
            assert_eq!(w.word_gates.len(), nw);
            assert!(w.word_gates.iter().all(|g| (0.0..=1.0).contains(g)));
            let wsum: f64 = w.word_scores.iter().sum();
            let tsum: f64 = h.word_scores[..h.tokens.len()]
                .iter()
                .map(|&x| x as f64)
                .sum();
            assert!((wsum - tsum).abs() < 1e-6);
            tokens += h.tokens.len();
        }
    }
    assert!(tokens > 200, "only {tokens} tokens scored");

    // Hard links: the best output's words, forced through `align`, give the same word matrix and links
    // (where the output's pieces are its words' own subwords, which forcing the words reproduces).
    let (mut asrc, mut atgt, mut which) = (vec![], vec![], vec![]);
    for (i, t) in out.iter().enumerate() {
        let words = merge_subwords(&t.tokens);
        if t.tokens.is_empty() || lm.preprocess.tgt_bpe_apply(&words) != t.tokens {
            continue;
        }
        asrc.push(merge_subwords(&t.src_tokens).join(" "));
        atgt.push(words.join(" "));
        which.push(i);
    }
    assert!(
        which.len() >= 30,
        "only {} outputs are their words' subwords",
        which.len()
    );
    let aligned = tr.align(&asrc, &atgt, 8).unwrap();
    for (a, &i) in aligned.iter().zip(&which) {
        let h = &out[i].hyps[0];
        let w = WordLevel::of(&out[i].src_tokens, &out[i].tokens, h);
        assert_eq!(w.attention.len(), a.attention.len());
        for (r, (x, y)) in w.attention.iter().zip(&a.attention).enumerate() {
            for (c, (p, q)) in x.iter().zip(y).enumerate() {
                assert!(
                    (p - q).abs() < 1e-4,
                    "line {i}, word {r}, source {c}: {p} and {q}"
                );
            }
            // The argmax, unless two source words are within the matrices' difference of each other.
            let mut sorted = x.clone();
            sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
            if sorted.len() < 2 || sorted[0] - sorted[1] > 1e-3 {
                let link = w.links(AlignmentMode::Hard)[r];
                assert_eq!(Some(&link), a.links.iter().find(|l| l.1 == r), "line {i}");
            }
        }
        // A threshold keeps every link at least that likely, the hard link among them where it is.
        let half = w.links(AlignmentMode::Threshold(0.5));
        assert!(half.iter().all(|&(s, t)| w.attention[t][s] >= 0.5));
    }
}

#[test]
fn translate_writes_links_and_word_scores_after_each_translation() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, srcs, input) = trained(tmp.path());
    let m = model.to_str().unwrap();
    let i = input.to_str().unwrap();
    let translate = |extra: &[&str]| {
        let mut args = vec!["translate", "-q", "-m", m, "-i", i, "--beam", "4"];
        args.extend(extra);
        run_ok(&args)
    };
    let plain = translate(&[]);
    let rich = translate(&["--alignment", "hard", "--word-scores"]);
    let soft = translate(&["--alignment", "soft"]);
    let plain: Vec<&str> = plain.lines().collect();
    let (rich, soft): (Vec<&str>, Vec<&str>) = (rich.lines().collect(), soft.lines().collect());
    assert_eq!(
        (plain.len(), rich.len(), soft.len()),
        (srcs.len(), srcs.len(), srcs.len())
    );
    let tr = Translator::open(&[&model], &TranslatorOptions::default()).unwrap();
    let src_words: Vec<usize> = srcs
        .iter()
        .map(|s| merge_subwords(&tr.model().preprocess.src_tokens(s)).len())
        .collect();
    for (k, ((p, r), s)) in plain.iter().zip(&rich).zip(&soft).enumerate() {
        let f: Vec<&str> = r.split(" ||| ").collect();
        assert_eq!(f.len(), 4, "line {k}: {r}");
        // The translation itself is unchanged.
        assert_eq!(f[0], *p);
        let scores: Vec<f64> = f[2]
            .strip_prefix("WordScores=")
            .unwrap()
            .split_whitespace()
            .take_while(|x| *x != "Score=")
            .map(|x| x.parse().unwrap())
            .collect();
        let gates = f[3]
            .strip_prefix("WordGates=")
            .unwrap()
            .split_whitespace()
            .count();
        assert_eq!(gates, scores.len(), "line {k}");
        assert!(scores.iter().all(|&x| x <= 0.0));
        // One hard link per output word, each inside both sentences.
        let links: Vec<(usize, usize)> = f[1]
            .split_whitespace()
            .map(|l| {
                let (a, b) = l.split_once('-').unwrap();
                (a.parse().unwrap(), b.parse().unwrap())
            })
            .collect();
        assert_eq!(links.len(), scores.len(), "line {k}: {r}");
        for (j, &(si, ti)) in links.iter().enumerate() {
            assert_eq!(ti, j);
            assert!(
                si < src_words[k],
                "line {k}: link {si}-{ti}, {} source words",
                src_words[k]
            );
        }
        // Soft: each output word's attention over the source words, summing to 1.
        let (text, rows) = s.split_once(" ||| ").unwrap();
        assert_eq!(text, *p);
        let rows: Vec<&str> = rows.split_whitespace().collect();
        assert_eq!(rows.len(), scores.len());
        for row in rows {
            let v: Vec<f64> = row.split(',').map(|x| x.parse().unwrap()).collect();
            assert_eq!(v.len(), src_words[k]);
            assert!((v.iter().sum::<f64>() - 1.0).abs() < 1e-3, "{row}");
        }
    }
    // A threshold outside (0, 1] is refused, naming the option.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(["translate", "-m", m, "-i", i, "--alignment", "1.5"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("--alignment") && err.contains("(0, 1]"),
        "{err}"
    );
}

#[test]
fn outputs_start_with_their_target_prefix_and_the_search_goes_on_from_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, srcs, input) = trained(tmp.path());
    let tr = Translator::open(&[&model], &TranslatorOptions::default()).unwrap();
    let lm = tr.model();
    // In the model's tokens, so that a prefix is exactly the pieces it forces.
    let pieces: Vec<String> = srcs
        .iter()
        .map(|s| lm.preprocess.src_tokens(s).join(" "))
        .collect();
    let run = |beam: usize, nbest: usize, prefix: Vec<String>| {
        let o = TranslateOptions {
            beam,
            nbest,
            pretokenized: true,
            target_prefix: prefix,
            ..Default::default()
        };
        tr.translate(&pieces, &o).unwrap()
    };
    // Greedy search forced to start as it would have started anyway ends as it did.
    let greedy = run(1, 1, vec![]);
    let own: Vec<String> = greedy
        .iter()
        .map(|t| t.tokens[..t.tokens.len().min(2)].join(" "))
        .collect();
    for (a, b) in run(1, 1, own).iter().zip(&greedy) {
        assert_eq!(a.tokens, b.tokens);
        assert_eq!(a.hyps[0].score, b.hyps[0].score);
    }
    // Empty prefixes change nothing.
    let beam = run(5, 3, vec![]);
    let none = run(5, 3, vec![String::new(); srcs.len()]);
    for (a, b) in none.iter().zip(&beam) {
        assert_eq!(a.text, b.text);
    }
    // The references' first two tokens: every hypothesis of the n-best list starts with them, and differs
    // from the unforced output somewhere.
    let refs = common::data_dir().join("tatoeba-zh-en/dev.en");
    let refs: Vec<String> = std::fs::read_to_string(refs)
        .unwrap()
        .lines()
        .take(srcs.len())
        .map(|l| {
            let t = lm.preprocess.tgt_tokens(l);
            let known: Vec<String> = t.into_iter().filter(|p| lm.tgt_vocab.contains(p)).collect();
            known[..known.len().min(2)].join(" ")
        })
        .collect();
    let forced = run(5, 3, refs.clone());
    let mut changed = 0;
    for ((t, p), b) in forced.iter().zip(&refs).zip(&beam) {
        let p: Vec<&str> = p.split_whitespace().collect();
        for h in &t.hyps {
            let toks = lm.tgt_vocab.decode(&h.tokens);
            assert_eq!(toks[..p.len()], p[..], "{toks:?} does not start with {p:?}");
        }
        changed += usize::from(t.tokens != b.tokens);
    }
    assert!(changed >= 10, "only {changed} of 40 outputs changed");
    // The command line: `--prefix FILE`, the greedy output's own first word giving the greedy output.
    let m = model.to_str().unwrap();
    let i = input.to_str().unwrap();
    let plain = run_ok(&["translate", "-q", "-m", m, "-i", i, "--beam", "1"]);
    let first = tmp.path().join("prefix.txt");
    // (Where the raw word is tokenised back into the pieces the search chose; otherwise no prefix.)
    let words: Vec<String> = greedy
        .iter()
        .map(|t| {
            let w = merge_subwords(&t.tokens)
                .first()
                .cloned()
                .unwrap_or_default();
            let n = cgnmt_data::bpe::word_index_of_subwords(&t.tokens)
                .iter()
                .filter(|&&k| k == 0)
                .count();
            if !w.is_empty() && lm.preprocess.tgt_tokens(&w) == t.tokens[..n] {
                w
            } else {
                String::new()
            }
        })
        .collect();
    assert!(words.iter().filter(|w| !w.is_empty()).count() >= 30);
    std::fs::write(&first, words.join("\n") + "\n").unwrap();
    let p = first.to_str().unwrap();
    let prefixed = run_ok(&[
        "translate",
        "-q",
        "-m",
        m,
        "-i",
        i,
        "--beam",
        "1",
        "--prefix",
        p,
    ]);
    assert_eq!(prefixed, plain);
    // Bad prefixes are refused, naming the file or the line.
    let fails = |prefix: &str, want: &[&str]| {
        std::fs::write(&first, prefix).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
            .args(["translate", "-q", "-m", m, "-i", i, "--prefix", p])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(want.iter().all(|w| err.contains(w)), "{err}");
    };
    fails("a\nb\n", &["prefix.txt", "2 lines", "40"]);
    let mut lines = vec![String::new(); srcs.len()];
    lines[2] = "snow ☃ man".into();
    fails(
        &(lines.join("\n") + "\n"),
        &["line 3", "not in the model's target vocabulary"],
    );
    let known = words.iter().find(|w| !w.is_empty()).unwrap();
    lines[2] = vec![known.as_str(); 400].join(" ");
    fails(
        &(lines.join("\n") + "\n"),
        &["line 3", "target prefix of", "tokens, more than"],
    );
}
