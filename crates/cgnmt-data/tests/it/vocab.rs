use cgnmt_data::{count_tokens, coverage, DataError, Vocab, WordCounts, EOS_TOKEN, UNK_TOKEN};

use crate::common::strs;

fn toy() -> Vec<Vec<String>> {
    vec![
        strs(&["the", "cat", "sat", "on", "the", "mat"]),
        strs(&["the", "dog", "sat"]),
        strs(&["a", "cat", "!"]),
    ]
}

#[test]
fn counts_and_order() {
    let c = count_tokens(&toy());
    assert_eq!(c.total(), 12);
    assert_eq!(c.len(), 8);
    assert_eq!(c.get("the"), 3);
    assert_eq!(c.get("zebra"), 0);
    // count desc, then bytes asc: "!" < "a" < "dog" < "mat" < "on"
    assert_eq!(
        c.sorted(),
        vec![
            ("the", 3),
            ("cat", 2),
            ("sat", 2),
            ("!", 1),
            ("a", 1),
            ("dog", 1),
            ("mat", 1),
            ("on", 1)
        ]
    );
}

#[test]
fn build_encode_decode() {
    let c = count_tokens(&toy());
    let v = Vocab::build(&c, 4);
    assert_eq!(v.len(), 6); // K + EOS + UNK
    assert_eq!(
        v.tokens(),
        &strs(&[EOS_TOKEN, UNK_TOKEN, "the", "cat", "sat", "!"])[..]
    );
    assert_eq!((v.eos(), v.unk()), (0, 1));
    let ids = v.encode(&strs(&["the", "dog", "sat", "!"]));
    assert_eq!(ids, vec![2, 1, 4, 5]); // no EOS appended, dog is UNK
    assert_eq!(v.decode(&ids), strs(&["the", "<unk>", "sat", "!"]));
    assert_eq!(v.decode(&[0, 99]), strs(&["</s>", "<unk>"])); // out of range → <unk>, no panic
                                                              // K larger than the number of words.
    assert_eq!(Vocab::build(&c, 100).len(), 10);
}

#[test]
fn coverage_by_hand() {
    let c = count_tokens(&toy());
    let v = Vocab::build(&c, 2); // the(3) + cat(2) cover 5 of 12 running tokens
    assert!((coverage(&v, &c) - 5.0 / 12.0).abs() < 1e-12);
    let v = Vocab::build(&c, 3); // + sat(2) → 7/12
    assert!((coverage(&v, &c) - 7.0 / 12.0).abs() < 1e-12);
    assert_eq!(coverage(&Vocab::build(&c, 100), &c), 1.0);
    assert_eq!(coverage(&v, &WordCounts::new()), 0.0);
}

#[test]
fn save_load_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let c = count_tokens(&toy());
    let v = Vocab::build(&c, 5);
    let vp = dir.path().join("vocab.src");
    v.save(&vp).unwrap();
    assert_eq!(
        std::fs::read_to_string(&vp).unwrap(),
        "</s>\n<unk>\nthe\ncat\nsat\n!\na\n"
    );
    assert_eq!(Vocab::load(&vp).unwrap(), v);
    let cp = dir.path().join("counts.src");
    c.save(&cp).unwrap();
    assert!(std::fs::read_to_string(&cp)
        .unwrap()
        .starts_with("the\t3\ncat\t2\nsat\t2\n!\t1\n"));
    assert_eq!(WordCounts::load(&cp).unwrap(), c);
}

#[test]
fn bad_files_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("vocab.tgt");
    std::fs::write(&p, "</s>\n<unk>\nthe\ncat\nthe\n").unwrap();
    let err = Vocab::load(&p).unwrap_err();
    assert!(matches!(err, DataError::Format { line: 5, .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("vocab.tgt") && msg.contains("line 5") && msg.contains("the"),
        "{msg}"
    );

    std::fs::write(&p, "the\n").unwrap();
    assert!(Vocab::load(&p).unwrap_err().to_string().contains("line 1"));
    std::fs::write(&p, "</s>\n<unk>\na b\n").unwrap();
    assert!(Vocab::load(&p).unwrap_err().to_string().contains("line 3"));
    std::fs::write(&p, "</s>\n<unk>\n\n").unwrap();
    assert!(Vocab::load(&p).unwrap_err().to_string().contains("line 3"));

    let c = dir.path().join("counts.src");
    std::fs::write(&c, "the\t3\ncat 2\n").unwrap();
    let msg = WordCounts::load(&c).unwrap_err().to_string();
    assert!(
        msg.contains("counts.src") && msg.contains("line 2"),
        "{msg}"
    );
    std::fs::write(&c, "the\t3\ncat\tx\n").unwrap();
    assert!(WordCounts::load(&c)
        .unwrap_err()
        .to_string()
        .contains("line 2"));
    std::fs::write(&c, "the\t3\nthe\t2\n").unwrap();
    assert!(WordCounts::load(&c)
        .unwrap_err()
        .to_string()
        .contains("line 2"));
}
