//! Shared test helpers.
#![allow(dead_code)]

use std::path::PathBuf;

/// The shared data directory: `$CGNMT_DATA`, or `../../../shared/data` from this crate; `None` where
/// neither exists (a fresh clone away from the project's shared files).
pub fn data_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("CGNMT_DATA") {
        return Some(PathBuf::from(d));
    }
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    d.join("tatoeba-zh-en").is_dir().then_some(d)
}

/// A Tatoeba zh-en file: from the data directory, else the gzip-compressed copy that ships in the
/// repository's `data/` (the corpus reader decompresses it).
pub fn tatoeba(file: &str) -> PathBuf {
    match data_dir() {
        Some(d) => d.join("tatoeba-zh-en").join(file),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../data/tatoeba-zh-en")
            .join(format!("{file}.gz")),
    }
}

pub fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}
