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

#[test]
fn serve_steers_like_translate_and_every_front_end_decodes_with_the_penalties_the_model_keeps() {
    use crate::serve::{post, start, translations};
    let tmp = tempfile::tempdir().unwrap();
    let (model, srcs, input) = crate::steering::trained(tmp.path());
    let m = model.to_str().unwrap();
    let i = input.to_str().unwrap();
    let cli = |extra: &[&str]| -> Vec<String> {
        run_ok(&[&["translate", "-q", "-m", m, "-i", i][..], extra].concat())
            .lines()
            .map(String::from)
            .collect()
    };
    let zero = cli(&[]);
    let (a, b) = ("2.5", "0.6");
    let penalised = cli(&["--length-penalty", a, "--coverage-penalty", b]);
    assert_ne!(zero, penalised, "the penalties change nothing here");
    // The penalties chosen on dev, kept in the model directory: every front end's default.
    cgnmt::decode::settings::DecodingSettings {
        length_penalty: 2.5,
        coverage_penalty: 0.6,
        beam: 10,
        dev_bleu: 12.5,
        dev_sentences: 40,
    }
    .write(&model, "a test")
    .unwrap();
    assert_eq!(cli(&[]), penalised);
    // An explicit option still wins.
    assert_eq!(
        cli(&["--length-penalty", "0", "--coverage-penalty", "0"]),
        zero
    );
    let tr = Translator::open(&[&model], &TranslatorOptions::default()).unwrap();
    assert_eq!(tr.settings().unwrap().length_penalty, 2.5);
    let lib: Vec<String> = tr
        .translate(&srcs, &tr.options())
        .unwrap()
        .into_iter()
        .map(|t| t.text)
        .collect();
    assert_eq!(lib, penalised);

    let s = start(&model, &[]);
    let models: serde_json::Value = serde_json::from_str(
        &ureq::get(&format!("{}/v1/models", s.base))
            .call()
            .unwrap()
            .into_string()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(models["models"][0]["decoding"]["coverage_penalty"], 0.6);
    let (code, v) = post(&s.base, &serde_json::json!({"sentences": srcs}).to_string());
    assert_eq!(code, 200, "{v}");
    assert_eq!(translations(&v), penalised);
    let (_, v) = post(
        &s.base,
        &serde_json::json!({"sentences": srcs, "length_penalty": 0.0, "coverage_penalty": 0.0})
            .to_string(),
    );
    assert_eq!(translations(&v), zero);

    // Steering over the API: what `translate --json-input` writes for the same lines.
    let lm = tr.model();
    let first_word = |t: &str| t.split_whitespace().next().unwrap_or("").to_string();
    let prefixes: Vec<String> = (0..srcs.len())
        .map(|k| {
            if k % 3 == 0 {
                first_word(&zero[(k + 1) % srcs.len()])
            } else {
                String::new()
            }
        })
        .collect();
    let cons: Vec<Vec<String>> = (0..srcs.len())
        .map(|k| {
            let w = first_word(&zero[(k + 2) % srcs.len()]);
            if k % 2 == 0
                && !w.is_empty()
                && lm
                    .preprocess
                    .tgt_tokens(&w)
                    .iter()
                    .all(|p| lm.tgt_vocab.contains(p))
            {
                vec![w]
            } else {
                vec![]
            }
        })
        .collect();
    let avoid: Vec<Vec<String>> = (0..srcs.len())
        .map(|k| {
            let w = first_word(&zero[k]);
            if k % 5 == 1 && !w.is_empty() && !cons[k].contains(&w) {
                vec![w]
            } else {
                vec![]
            }
        })
        .collect();
    let lines: Vec<String> = (0..srcs.len())
        .map(|k| {
            serde_json::json!({"text": srcs[k], "target_prefix": prefixes[k], "constraints": cons[k], "avoid": avoid[k]})
                .to_string()
        })
        .collect();
    let jfile = tmp.path().join("in.jsonl");
    std::fs::write(&jfile, lines.join("\n") + "\n").unwrap();
    let want: Vec<String> = run_ok(&[
        "translate",
        "-q",
        "-m",
        m,
        "-i",
        jfile.to_str().unwrap(),
        "--json-input",
    ])
    .lines()
    .map(String::from)
    .collect();
    assert_ne!(want, penalised);
    let ask = serde_json::json!({"sentences": srcs, "target_prefix": prefixes, "constraints": cons, "avoid": avoid});
    // Two clients at once, one steered and one not: the batcher decodes them together, each gets its own.
    let steered = std::thread::scope(|sc| {
        let plain = sc.spawn(|| post(&s.base, &serde_json::json!({"sentences": srcs}).to_string()));
        let steered = post(&s.base, &ask.to_string());
        assert_eq!(translations(&plain.join().unwrap().1), penalised);
        steered
    });
    assert_eq!(steered.0, 200, "{}", steered.1);
    assert_eq!(translations(&steered.1), want);
    let unmet = steered.1["translations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["unmet_constraints"].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(unmet, 0);
    // Bad steering: 400 naming the problem.
    for (body, says) in [
        (
            serde_json::json!({"sentences": srcs, "constraints": [["x"]]}),
            "1 constraint lists for 40 lines",
        ),
        (
            serde_json::json!({"sentences": [srcs[0]], "avoid": [["☃"]]}),
            "not in the model's target vocabulary",
        ),
        (
            serde_json::json!({"sentences": [srcs[0]], "constraints": [[""]]}),
            "empty constraint",
        ),
    ] {
        let (code, v) = post(&s.base, &body.to_string());
        assert_eq!(code, 400, "{v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{v}");
    }
}
