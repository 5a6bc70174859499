//! The oracle fixtures (`../shared/fixtures`) of the evaluation commands' tests.

use std::path::PathBuf;

/// The `shared/fixtures` directory: `$CGNMT_SHARED/fixtures` if set, else
/// `<crate>/../../../shared/fixtures` (the layout of the project checkout).
pub fn fixtures_dir() -> Option<PathBuf> {
    let mut cands = Vec::new();
    if let Ok(s) = std::env::var("CGNMT_SHARED") {
        cands.push(PathBuf::from(s).join("fixtures"));
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    cands.push(manifest.join("../../../shared/fixtures"));
    cands.push(manifest.join("../../shared/fixtures"));
    cands.into_iter().find(|p| p.is_dir())
}

/// Like [`fixtures_dir`] but shouts when the fixtures are missing.
pub fn fixtures_or_skip(test: &str) -> Option<PathBuf> {
    let d = fixtures_dir();
    if d.is_none() {
        eprintln!(
            "!!!!! {test}: SKIPPED — shared/fixtures not found (set CGNMT_SHARED to the shared/ directory) !!!!!"
        );
    }
    d
}

pub fn read_json(p: &std::path::Path) -> serde_json::Value {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

pub fn read_lines(p: &std::path::Path) -> Vec<String> {
    cgnmt_eval::io::read_lines(p).unwrap_or_else(|e| panic!("{e}"))
}

pub fn usizes(v: &serde_json::Value) -> Vec<usize> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("integer") as usize)
        .collect()
}

pub fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}
