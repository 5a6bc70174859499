//! Search options on a real model: GNMT's length penalty (`translate --length-penalty`) at 0 is the plain
//! search byte for byte, and a positive α lengthens the outputs the total log-probability keeps short;
//! GNMT's coverage penalty (`--coverage-penalty`) at 0 is the plain search, and a positive β picks, per
//! sentence, the hypothesis with the best log-probability + β·penalty, checked on the attention dumped;
//! `cgnmt rescore` of `translate --nbest` picks translate's output with the default weights, and follows
//! a weighted length or an external feature file.

use crate::common;

use common::{prepare, run_ok};

#[test]
fn penalties_and_rescoring_rank_as_documented_and_their_defaults_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 400);
    let run = tmp.path().join("run");
    common::train_tiny(
        &prepared,
        &run,
        &[
            "model.embedding_dim=48",
            "model.hidden_dim=64",
            "model.attention_dim=48",
            "train.batch_size=32",
            "train.max_steps=180",
            "train.optimizer=adam",
            "train.learning_rate=0.005",
        ],
    );
    let src =
        cgnmt_data::corpus::read_lines(&common::data_dir().join("tatoeba-zh-en/test.zh")).unwrap();
    let input = tmp.path().join("in.zh");
    std::fs::write(&input, src[..120].join("\n") + "\n").unwrap();
    let model = run.join("last");
    let tr = |extra: &[&str]| -> Vec<String> {
        let mut args = vec![
            "translate",
            "--quiet",
            "-m",
            model.to_str().unwrap(),
            "-i",
            input.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        run_ok(&args).lines().map(String::from).collect()
    };
    let plain = tr(&[]);
    assert_eq!(tr(&["--length-penalty", "0"]), plain);
    let words = |v: &[String]| {
        v.iter()
            .map(|l| l.split_whitespace().count())
            .sum::<usize>()
    };
    let long = tr(&["--length-penalty", "2"]);
    assert_eq!(long.len(), plain.len());
    assert!(
        words(&long) > words(&plain),
        "{} words with α = 2 against {} without",
        words(&long),
        words(&plain)
    );
    // A bad option value is refused with a message naming it.
    let refused = |args: &[&str], says: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(msg.contains(says), "{args:?}: {msg}");
    };
    let (m, i) = (model.to_str().unwrap(), input.to_str().unwrap());
    refused(
        &["translate", "-m", m, "-i", i, "--length-penalty=-1"],
        "--length-penalty -1",
    );

    // Coverage penalty: β = 0 is the plain search; with β = 1 each sentence's output has the best
    // log-probability + β·cp among the finished hypotheses, which hold the plain output (the highest
    // log-probability): so it scores no higher and covers the source at least as well.
    assert_eq!(tr(&["--coverage-penalty", "0"]), plain);
    let dumped = |extra: &[&str], name: &str| {
        let path = tmp.path().join(name);
        let mut args = vec!["--dump", path.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = tr(&args);
        let dump = cgnmt_eval::analysis::read_dump(&path).unwrap();
        // One attention row per output token, EOS included only when the search emitted it (a hypothesis
        // cut at the length limit has none).
        for d in &dump {
            assert_eq!(d.attention.len(), d.hyp.len(), "{:?}: {:?}", d.id, d.hyp);
        }
        (out, dump)
    };
    let (plain_out, plain_dump) = dumped(&[], "plain.jsonl");
    assert_eq!(plain_out, plain);
    let beta = 1.0;
    let (cov_out, cov_dump) = dumped(&["--coverage-penalty", "1"], "cov.jsonl");
    assert_eq!(cov_dump.len(), plain_dump.len());
    let cp = |d: &cgnmt_eval::analysis::DumpRecord| -> f64 {
        let mut mass = vec![0.0f64; d.attention[0].len()];
        for row in &d.attention {
            for (m, &a) in mass.iter_mut().zip(row) {
                *m += a;
            }
        }
        cgnmt::decode::penalties::coverage_penalty(&mass)
    };
    let mut changed = 0;
    for (p, c) in plain_dump.iter().zip(&cov_dump) {
        let (sp, sc) = (p.score.unwrap(), c.score.unwrap());
        let (cp_p, cp_c) = (cp(p), cp(c));
        assert!(
            sc <= sp + 1e-4,
            "{:?}: log-probability {sc} above the plain {sp}",
            c.id
        );
        assert!(
            sc + beta * cp_c >= sp + beta * cp_p - 1e-3,
            "{:?}: {sc} + {cp_c} below the plain output's {sp} + {cp_p}",
            c.id
        );
        assert!(cp_c >= cp_p - 1e-3, "{:?}: coverage {cp_c} < {cp_p}", c.id);
        if p.hyp != c.hyp {
            changed += 1;
        }
    }
    assert!(changed > 0, "β = 1 changed no output");
    assert_eq!(cov_out.len(), plain.len());
    refused(
        &["translate", "-m", m, "-i", i, "--coverage-penalty=nan"],
        "--coverage-penalty NaN",
    );

    // n-best rescoring: the default weights pick translate's own output; a length weight lengthens; an
    // external feature that favours each sentence's last hypothesis picks it.
    let nbest_path = tmp.path().join("nbest.txt");
    tr(&[
        "--beam",
        "5",
        "--nbest",
        "5",
        "-o",
        nbest_path.to_str().unwrap(),
    ]);
    let nbest: Vec<(usize, String)> = std::fs::read_to_string(&nbest_path)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(" ||| ").collect();
            (f[0].parse().unwrap(), f[1].to_string())
        })
        .collect();
    assert_eq!(nbest.last().unwrap().0, 119);
    let rescore = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["rescore", "-i", nbest_path.to_str().unwrap()];
        args.extend_from_slice(extra);
        run_ok(&args).lines().map(String::from).collect()
    };
    assert_eq!(rescore(&[]), tr(&["--beam", "5"]));
    let longer = rescore(&["--weight", "words=3"]);
    assert!(words(&longer) > words(&rescore(&[])));
    let mut rank = vec![];
    for (k, (i, _)) in nbest.iter().enumerate() {
        rank.push(if k > 0 && nbest[k - 1].0 == *i {
            rank[k - 1] + 1.0
        } else {
            0.0
        });
    }
    let feature = tmp.path().join("last.txt");
    let text: String = rank.iter().map(|r| format!("{}\n", r * 1000.0)).collect();
    std::fs::write(&feature, text).unwrap();
    let last: Vec<String> = (0..120)
        .map(|i| nbest.iter().rev().find(|(j, _)| *j == i).unwrap().1.clone())
        .collect();
    let arg = format!("last={}", feature.display());
    assert_eq!(rescore(&["--feature", &arg, "--weight", "last=1"]), last);
    std::fs::write(&feature, "1\n2\n").unwrap();
    refused(
        &[
            "rescore",
            "-i",
            nbest_path.to_str().unwrap(),
            "--feature",
            &arg,
        ],
        "has 2 lines",
    );
    // A feature from a model (`--model NAME=DIR`): the model's own log-probability of each hypothesis's
    // text, weighted alone, picks translate's output wherever the text tokenises back to the search's
    // tokens (nearly everywhere); without `--src` it is refused.
    let own = format!("self={}", model.display());
    let picked = rescore(&[
        "--model",
        &own,
        "--src",
        input.to_str().unwrap(),
        "--weight",
        "model=0",
        "--weight",
        "self=1",
    ]);
    let best = rescore(&[]);
    let same = picked.iter().zip(&best).filter(|(a, b)| a == b).count();
    assert_eq!(picked.len(), 120);
    eprintln!("the model feature picked translate's output for {same} of 120");
    assert!(
        same >= 114,
        "the model feature picked translate's output for {same} of 120"
    );
    refused(
        &[
            "rescore",
            "-i",
            nbest_path.to_str().unwrap(),
            "--model",
            &own,
        ],
        "needs the source sentences",
    );
}
