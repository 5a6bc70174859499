//! Lexically constrained decoding (`translate --constraints`, `--avoid`, `--json-input`; the library's
//! `TranslateOptions::constraints` / `avoid`): every output contains its line's phrases and none of the
//! avoided ones, with one model or an ensemble, int8, a shortlist, n-best lists and split lines; no
//! constraints changes nothing; bad input is refused naming the line.

use crate::common::{self, run_ok};
use cgnmt::{
    InputLimit, LongInput, ShortlistOptions, TranslateOptions, Translator, TranslatorOptions,
};

/// `phrase` occurs in `tokens` as consecutive tokens.
fn contains(tokens: &[String], phrase: &str) -> bool {
    let p: Vec<&str> = phrase.split_whitespace().collect();
    tokens
        .windows(p.len())
        .any(|w| w.iter().zip(&p).all(|(a, b)| a == b))
}

#[test]
fn constrained_outputs_contain_their_phrases_and_never_the_avoided_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, srcs, _) = crate::steering::trained(tmp.path());
    let tr = Translator::open(&[&model], &TranslatorOptions::default()).unwrap();
    let lm = tr.model();
    // In the model's tokens, so that a phrase is exactly the pieces it names.
    let pieces: Vec<String> = srcs
        .iter()
        .map(|s| lm.preprocess.src_tokens(s).join(" "))
        .collect();
    let refs: Vec<Vec<String>> =
        cgnmt_data::corpus::read_lines(&common::data_dir().join("tatoeba-zh-en/dev.en"))
            .unwrap()
            .iter()
            .take(srcs.len())
            .map(|l| {
                let t = lm.preprocess.tgt_tokens(l);
                t.into_iter().filter(|p| lm.tgt_vocab.contains(p)).collect()
            })
            .collect();
    // As Post & Vilar draw them: phrases of the reference, here its middle token and its first two.
    let constraints: Vec<Vec<String>> = refs
        .iter()
        .map(|r| match r.len() {
            0..=2 => vec![],
            n => vec![r[n / 2].clone(), r[..2].join(" ")],
        })
        .collect();
    let asked = constraints.iter().filter(|c| !c.is_empty()).count();
    assert!(asked >= 25, "{asked}");
    let base = TranslateOptions {
        beam: 5,
        nbest: 3,
        pretokenized: true,
        word_scores: true,
        ..Default::default()
    };
    let plain = tr.translate(&pieces, &base).unwrap();
    let with = |tr: &Translator, o: &TranslateOptions| tr.translate(&pieces, o).unwrap();
    let constrained = TranslateOptions {
        constraints: constraints.clone(),
        ..base.clone()
    };
    let check = |out: &[cgnmt::Translation], what: &str| {
        let mut changed = 0;
        for ((t, c), p) in out.iter().zip(&constraints).zip(&plain) {
            assert!(!t.hyps.is_empty(), "{what}");
            for h in &t.hyps {
                let toks = lm.tgt_vocab.decode(&h.tokens);
                assert_eq!(h.unmet_constraints, 0, "{what}: {toks:?} {c:?}");
                for phrase in c {
                    assert!(contains(&toks, phrase), "{what}: {toks:?} lacks {phrase:?}");
                }
                // The token scores still add up to the hypothesis's score.
                let sum: f64 = h.word_scores.iter().map(|&x| x as f64).sum();
                assert!((sum - h.score).abs() < 1e-3, "{what}: {sum} vs {}", h.score);
            }
            changed += usize::from(t.tokens != p.tokens);
        }
        assert!(changed >= 10, "{what}: only {changed} outputs changed");
    };
    let out = with(&tr, &constrained);
    check(&out, "one model");
    // The same model twice as an ensemble: the same search.
    let twice = Translator::open(&[&model, &model], &TranslatorOptions::default()).unwrap();
    let ens = with(&twice, &constrained);
    for (a, b) in ens.iter().zip(&out) {
        assert_eq!(a.tokens, b.tokens);
    }
    // Int8, and a shortlist that need not hold the phrases' words (they enter it).
    let int8 = Translator::open(
        &[&model],
        &TranslatorOptions {
            int8: true,
            ..Default::default()
        },
    )
    .unwrap();
    check(&with(&int8, &constrained), "int8");
    let lexicon = tmp.path().join("lex.tsv");
    let prep = tmp.path().join("prep");
    run_ok(&[
        "shortlist",
        "--src",
        prep.join("train.src").to_str().unwrap(),
        "--tgt",
        prep.join("train.tgt").to_str().unwrap(),
        "-o",
        lexicon.to_str().unwrap(),
    ]);
    let short = Translator::open(
        &[&model],
        &TranslatorOptions {
            shortlist: Some(ShortlistOptions {
                lexicon: lexicon.clone(),
                frequent: 5,
                per_word: 2,
            }),
            ..Default::default()
        },
    )
    .unwrap();
    check(&with(&short, &constrained), "shortlist");
    // Lines split into pieces of at most 3 tokens: the phrases are shared out over the pieces.
    let split = TranslateOptions {
        input_limit: InputLimit {
            max_words: 3,
            long_input: LongInput::Split,
        },
        nbest: 1,
        ..constrained.clone()
    };
    for (t, c) in with(&tr, &split).iter().zip(&constraints) {
        for phrase in c {
            assert!(
                contains(&t.tokens, phrase),
                "split: {:?} lacks {phrase:?}",
                t.tokens
            );
        }
    }

    // No constraints (empty lists) change nothing.
    let none = TranslateOptions {
        constraints: vec![vec![]; srcs.len()],
        avoid: vec![vec![]; srcs.len()],
        ..base.clone()
    };
    for (a, b) in with(&tr, &none).iter().zip(&plain) {
        let s = |t: &cgnmt::Translation| {
            t.hyps
                .iter()
                .map(|h| (h.tokens.clone(), h.score))
                .collect::<Vec<_>>()
        };
        assert_eq!(s(a), s(b));
    }

    // Avoid the unconstrained output's first two tokens and its last one: no hypothesis has them.
    let avoid: Vec<Vec<String>> = plain
        .iter()
        .map(|t| match t.tokens.len() {
            0..=2 => vec![],
            n => vec![t.tokens[..2].join(" "), t.tokens[n - 1].clone()],
        })
        .collect();
    let avoided = with(
        &tr,
        &TranslateOptions {
            avoid: avoid.clone(),
            ..base.clone()
        },
    );
    let mut changed = 0;
    for ((t, a), p) in avoided.iter().zip(&avoid).zip(&plain) {
        for h in &t.hyps {
            let toks = lm.tgt_vocab.decode(&h.tokens);
            for phrase in a {
                assert!(!contains(&toks, phrase), "{toks:?} has {phrase:?}");
            }
        }
        changed += usize::from(t.tokens != p.tokens);
    }
    assert!(changed >= 30, "only {changed} outputs changed");

    // A phrase both required and avoided, an empty phrase, a token outside the vocabulary: refused.
    let mut bad = constraints.clone();
    bad[4] = vec!["snow ☃".into()];
    let err = tr
        .translate(
            &pieces,
            &TranslateOptions {
                constraints: bad,
                ..base.clone()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 5") && err.contains("not in the model's target vocabulary"),
        "{err}"
    );
    let mut bad = vec![vec![]; srcs.len()];
    bad[1] = vec![String::new()];
    let err = tr
        .translate(
            &pieces,
            &TranslateOptions {
                constraints: bad.clone(),
                ..base.clone()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 2") && err.contains("empty constraint"),
        "{err}"
    );
    bad[1] = vec![plain[1].tokens[0].clone()];
    let err = tr
        .translate(
            &pieces,
            &TranslateOptions {
                constraints: bad.clone(),
                avoid: bad,
                ..base.clone()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 2") && err.contains("both a constraint and avoided"),
        "{err}"
    );
}

#[test]
fn translate_reads_constraints_from_files_or_json_lines_and_warns_about_unmet_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, srcs, _) = crate::steering::trained(tmp.path());
    let tr = Translator::open(&[&model], &TranslatorOptions::default()).unwrap();
    let lm = tr.model();
    let pieces: Vec<String> = srcs
        .iter()
        .take(12)
        .map(|s| lm.preprocess.src_tokens(s).join(" "))
        .collect();
    let plain = tr
        .translate(
            &pieces,
            &TranslateOptions {
                pretokenized: true,
                ..Default::default()
            },
        )
        .unwrap();
    // Per line: require the last output token of the next line, avoid the line's own first token.
    let n = pieces.len();
    let cons: Vec<Vec<String>> = (0..n)
        .map(|i| {
            plain[(i + 1) % n]
                .tokens
                .last()
                .cloned()
                .into_iter()
                .collect()
        })
        .collect();
    let avoid: Vec<Vec<String>> = (0..n)
        .map(|i| {
            plain[i]
                .tokens
                .first()
                .cloned()
                .into_iter()
                .filter(|w| !cons[i].contains(w))
                .collect()
        })
        .collect();
    let lib = tr
        .translate(
            &pieces,
            &TranslateOptions {
                pretokenized: true,
                constraints: cons.clone(),
                avoid: avoid.clone(),
                ..Default::default()
            },
        )
        .unwrap();
    let write = |name: &str, lines: &[String]| -> String {
        let p = tmp.path().join(name);
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        p.to_str().unwrap().to_string()
    };
    let tabbed = |v: &[Vec<String>]| -> Vec<String> { v.iter().map(|l| l.join("\t")).collect() };
    let input = write("in.txt", &pieces);
    let cfile = write("cons.txt", &tabbed(&cons));
    let afile = write("avoid.txt", &tabbed(&avoid));
    let m = model.to_str().unwrap();
    let args = ["translate", "-q", "--pretokenized", "-m", m];
    let files = run_ok(
        &[
            &args[..],
            &["-i", &input, "--constraints", &cfile, "--avoid", &afile],
        ]
        .concat(),
    );
    let want: String = lib.iter().map(|t| format!("{}\n", t.text)).collect();
    assert_eq!(files, want);
    // The same as JSON lines.
    let json: Vec<String> = (0..n)
        .map(|i| {
            serde_json::json!({"text": pieces[i], "constraints": cons[i], "avoid": avoid[i]})
                .to_string()
        })
        .collect();
    let jfile = write("in.jsonl", &json);
    assert_eq!(
        run_ok(&[&args[..], &["-i", &jfile, "--json-input"]].concat()),
        want
    );

    let cgnmt = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
            .args([&args[..], extra].concat())
            .output()
            .unwrap()
    };
    let fails = |extra: &[&str], want: &[&str]| {
        let out = cgnmt(extra);
        assert!(!out.status.success(), "{extra:?}");
        assert!(out.stdout.is_empty());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(want.iter().all(|w| err.contains(w)), "{err}");
    };
    // A malformed JSON line, an unknown key.
    let mut j = json.clone();
    j[2] = "{\"text\": \"a\", ".into();
    let bad = write("bad.jsonl", &j);
    fails(
        &["-i", &bad, "--json-input"],
        &["bad.jsonl", "line 3", "not a JSON input line"],
    );
    j[2] = "{\"text\": \"a\", \"constraint\": []}".into();
    let bad = write("bad.jsonl", &j);
    fails(&["-i", &bad, "--json-input"], &["line 3", "constraint"]);
    // An empty phrase, a token outside the vocabulary, the wrong number of lines.
    let mut c = tabbed(&cons);
    c[5] = format!("{}\t", cons[5][0]);
    let bad = write("bad.txt", &c);
    fails(
        &["-i", &input, "--constraints", &bad],
        &["in.txt", "line 6", "empty constraint"],
    );
    c[5] = "☃".into();
    let bad = write("bad.txt", &c);
    fails(
        &["-i", &input, "--constraints", &bad],
        &["line 6", "not in the model's target vocabulary"],
    );
    let bad = write("bad.txt", &c[..3]);
    fails(
        &["-i", &input, "--avoid", &bad],
        &["bad.txt", "3 lines", &format!("has {n}")],
    );
    // A phrase longer than any output of its line may be.
    let one = write("one.txt", &["x".to_string()]);
    let long = write("long.txt", &[vec![cons[0][0].as_str(); 7].join(" ")]);
    fails(
        &["-i", &one, "--constraints", &long],
        &["line 1", "a constraint of 7 tokens, more than the 6"],
    );
    // Phrases that fit one by one but not together (a one-token line's output has at most 6 tokens): the
    // line is decoded and named, with the output that met most of them.
    let w = &plain[0].tokens[0];
    let triple = [w.as_str(); 3].join(" ");
    let three = write(
        "three.txt",
        &[[triple.as_str(), triple.as_str(), w.as_str()].join("\t")],
    );
    let out = cgnmt(&["-i", &one, "--constraints", &three]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("one.txt: line 1") && err.contains("could not be met"),
        "{err}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}
