use std::io::Write;

use cgnmt_data::{read_lines, read_parallel, DataError};
use flate2::write::GzEncoder;
use flate2::Compression;

use crate::common::tatoeba;

fn write_gz(path: &std::path::Path, text: &str) {
    let f = std::fs::File::create(path).unwrap();
    let mut enc = GzEncoder::new(f, Compression::default());
    enc.write_all(text.as_bytes()).unwrap();
    enc.finish().unwrap();
}

#[test]
fn reads_plain_text_and_strips_cr() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.txt");
    std::fs::write(&p, "\u{feff}first line\r\nsecond\n\nlast no newline").unwrap();
    let lines = read_lines(&p).unwrap();
    assert_eq!(lines, vec!["first line", "second", "", "last no newline"]);
}

#[test]
fn reads_gzip_by_extension_and_by_magic() {
    let dir = tempfile::tempdir().unwrap();
    let text = "我们走吧。\r\nI don't know, Tom.\n";
    let gz = dir.path().join("a.zh.gz");
    write_gz(&gz, text);
    assert_eq!(
        read_lines(&gz).unwrap(),
        vec!["我们走吧。", "I don't know, Tom."]
    );
    // Same bytes, name without .gz: detected by the magic bytes.
    let noext = dir.path().join("a.zh");
    std::fs::copy(&gz, &noext).unwrap();
    assert_eq!(
        read_lines(&noext).unwrap(),
        vec!["我们走吧。", "I don't know, Tom."]
    );
}

#[test]
fn gz_extension_on_plain_text_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fake.gz");
    std::fs::write(&p, "plain\n").unwrap();
    let msg = read_lines(&p).unwrap_err().to_string();
    assert!(msg.contains("fake.gz") && msg.contains("not gzip"), "{msg}");
}

#[test]
fn tatoeba_line_counts() {
    assert_eq!(read_lines(&tatoeba("test.en")).unwrap().len(), 2049);
    let (s, t) = read_parallel(&tatoeba("dev.zh"), &tatoeba("dev.en")).unwrap();
    assert_eq!((s.len(), t.len()), (982, 982));
}

#[test]
fn missing_file_is_named() {
    let err = read_lines(std::path::Path::new("/nonexistent/dir/corpus.en")).unwrap_err();
    assert!(matches!(err, DataError::NotFound { .. }));
    assert_eq!(
        err.to_string(),
        "file not found: /nonexistent/dir/corpus.en"
    );
}

#[test]
fn invalid_utf8_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.en");
    std::fs::write(&p, b"ok\nstill ok\nbad \xff byte\n").unwrap();
    let err = read_lines(&p).unwrap_err();
    match &err {
        DataError::InvalidUtf8 {
            line, valid_up_to, ..
        } => {
            assert_eq!((*line, *valid_up_to), (3, 4))
        }
        e => panic!("unexpected {e}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("bad.en") && msg.contains("line 3"), "{msg}");
    // Also inside gzip.
    let gz = dir.path().join("bad.en.gz");
    let f = std::fs::File::create(&gz).unwrap();
    let mut enc = GzEncoder::new(f, Compression::fast());
    enc.write_all(b"a\n\xc3\n").unwrap();
    enc.finish().unwrap();
    let msg = read_lines(&gz).unwrap_err().to_string();
    assert!(msg.contains("bad.en.gz") && msg.contains("line 2"), "{msg}");
}

#[test]
fn corrupt_gzip_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.gz");
    std::fs::write(&p, [0x1f, 0x8b, 8, 0, 1, 2, 3]).unwrap();
    let msg = read_lines(&p).unwrap_err().to_string();
    assert!(msg.contains("c.gz"), "{msg}");
}

#[test]
fn mismatch_names_both_files_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("train.zh");
    let b = dir.path().join("train.en.gz");
    std::fs::write(&a, "一\n二\n三\n").unwrap();
    write_gz(&b, "one\ntwo\n");
    let msg = read_parallel(&a, &b).unwrap_err().to_string();
    assert!(
        msg.contains("train.zh") && msg.contains("train.en.gz"),
        "{msg}"
    );
    assert!(msg.contains("3 lines") && msg.contains("2 lines"), "{msg}");
}

#[test]
fn empty_corpus_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("e.zh");
    let b = dir.path().join("e.en");
    std::fs::write(&a, "").unwrap();
    std::fs::write(&b, "").unwrap();
    let err = read_parallel(&a, &b).unwrap_err();
    assert!(matches!(err, DataError::EmptyCorpus { .. }));
    assert!(err.to_string().contains("e.zh"));
}
