//! The decoding settings chosen on dev, kept with the model: `decoding.toml` in a model directory (as a
//! model's decoder configuration travels beside it in other toolkits). `cgnmt select --tune` and the demo
//! write it into the model they choose; every front end (`translate`, `serve` and the explorer, the
//! library's [`crate::Translator::options`], the Python package) decodes with its penalties unless an
//! option given explicitly says otherwise.
//!
//! ```toml
//! # chosen on dev by cgnmt select
//! length_penalty = 1.5
//! coverage_penalty = 0.2
//! beam = 10
//! dev_bleu = 31.42
//! dev_sentences = 982
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{NmtError, Result};

/// The file's name in a model directory.
pub const SETTINGS_FILE: &str = "decoding.toml";

/// A model's decoding settings chosen on dev.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodingSettings {
    /// GNMT's length penalty α.
    pub length_penalty: f64,
    /// GNMT's coverage penalty β.
    pub coverage_penalty: f64,
    /// The beam they were chosen with (the front ends keep their own beam).
    pub beam: usize,
    /// The dev BLEU they gave.
    pub dev_bleu: f64,
    /// Dev sentences decoded.
    pub dev_sentences: usize,
}

impl DecodingSettings {
    /// The settings of model directory `dir`, if it has them; a file that does not parse, or holds a
    /// penalty that is not a number ≥ 0, is an error naming it.
    pub fn read(dir: &Path) -> Result<Option<DecodingSettings>> {
        let p = dir.join(SETTINGS_FILE);
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(NmtError::Options(format!("{}: {e}", p.display()))),
        };
        let s: DecodingSettings = toml::from_str(&text)
            .map_err(|e| NmtError::Options(format!("{}: {e}", p.display())))?;
        for (k, v) in [
            ("length_penalty", s.length_penalty),
            ("coverage_penalty", s.coverage_penalty),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(NmtError::Options(format!(
                    "{}: {k} = {v}: it must be a number ≥ 0",
                    p.display()
                )));
            }
        }
        Ok(Some(s))
    }

    /// Write them into model directory `dir` (atomically), with a first line saying who chose them.
    pub fn write(&self, dir: &Path, chosen_by: &str) -> Result<()> {
        let body = toml::to_string(self).map_err(|e| NmtError::Options(e.to_string()))?;
        let text = format!(
            "# Decoding settings chosen on dev by {chosen_by}; every front end decodes this model with them\n\
             # unless told otherwise (--length-penalty, --coverage-penalty, the API's fields).\n{body}"
        );
        let p = dir.join(SETTINGS_FILE);
        crate::atomic_file::write_atomic(&p, text.as_bytes())
            .map_err(|e| NmtError::Options(format!("{}: {e:#}", p.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(DecodingSettings::read(dir.path()).unwrap(), None);
        let s = DecodingSettings {
            length_penalty: 1.5,
            coverage_penalty: 0.2,
            beam: 10,
            dev_bleu: 31.25,
            dev_sentences: 982,
        };
        s.write(dir.path(), "a test").unwrap();
        assert_eq!(DecodingSettings::read(dir.path()).unwrap(), Some(s));
        std::fs::write(dir.path().join(SETTINGS_FILE), "length_penalty = -1\ncoverage_penalty = 0\nbeam = 1\ndev_bleu = 0\ndev_sentences = 1\n").unwrap();
        let e = DecodingSettings::read(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("decoding.toml") && e.contains("length_penalty = -1"),
            "{e}"
        );
        std::fs::write(dir.path().join(SETTINGS_FILE), "alpha = 1\n").unwrap();
        let e = DecodingSettings::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("decoding.toml") && e.contains("alpha"), "{e}");
    }
}
