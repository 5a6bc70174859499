//! Shared test helpers.
#![allow(dead_code)]

use std::path::PathBuf;

/// The shared data directory: `$CGNMT_DATA`, or `../../../shared/data` from this crate.
pub fn data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CGNMT_DATA") {
        return PathBuf::from(d);
    }
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    assert!(
        d.join("tatoeba-zh-en").is_dir(),
        "test data not found at {}; set CGNMT_DATA to the shared data directory",
        d.display()
    );
    d
}

pub fn tatoeba(file: &str) -> PathBuf {
    data_dir().join("tatoeba-zh-en").join(file)
}

pub fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}
