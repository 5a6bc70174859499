//! Where data sets are found: `--data DIR`, else `$CGNMT_DATA`, else `../shared/data` beside the working
//! directory; and, when no data directory was given and that one lacks it, the copy of Tatoeba zh-en that is
//! compiled into the binary (`data/tatoeba-zh-en`, unpacked once into a cache directory), so that a fresh
//! clone runs its demo anywhere.

pub mod download;
pub mod registry;

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The name of the bundled data set (a directory of the data directory).
pub const BUNDLED_SET: &str = "tatoeba-zh-en";

/// The bundled files: name and gzip-compressed bytes.
const BUNDLED: &[(&str, &[u8])] = &[
    (
        "train.zh",
        include_bytes!("../../../data/tatoeba-zh-en/train.zh.gz"),
    ),
    (
        "train.en",
        include_bytes!("../../../data/tatoeba-zh-en/train.en.gz"),
    ),
    (
        "dev.zh",
        include_bytes!("../../../data/tatoeba-zh-en/dev.zh.gz"),
    ),
    (
        "dev.en",
        include_bytes!("../../../data/tatoeba-zh-en/dev.en.gz"),
    ),
    (
        "test.zh",
        include_bytes!("../../../data/tatoeba-zh-en/test.zh.gz"),
    ),
    (
        "test.en",
        include_bytes!("../../../data/tatoeba-zh-en/test.en.gz"),
    ),
    (
        "train.attribution",
        include_bytes!("../../../data/tatoeba-zh-en/train.attribution.gz"),
    ),
    (
        "dev.attribution",
        include_bytes!("../../../data/tatoeba-zh-en/dev.attribution.gz"),
    ),
    (
        "test.attribution",
        include_bytes!("../../../data/tatoeba-zh-en/test.attribution.gz"),
    ),
];

/// A data directory and whether the user named it (`--data` or `$CGNMT_DATA`).
#[derive(Debug, Clone)]
pub struct DataDir {
    pub root: PathBuf,
    pub explicit: bool,
}

impl DataDir {
    /// `--data`, else `$CGNMT_DATA`, else `../shared/data`.
    pub fn resolve(explicit: Option<PathBuf>) -> DataDir {
        if let Some(d) = explicit {
            return DataDir {
                root: d,
                explicit: true,
            };
        }
        if let Some(d) = std::env::var_os("CGNMT_DATA") {
            return DataDir {
                root: PathBuf::from(d),
                explicit: true,
            };
        }
        DataDir {
            root: PathBuf::from("../shared/data"),
            explicit: false,
        }
    }

    /// A file of a data set, `rel` relative to the data directory (e.g. `tatoeba-zh-en/train.zh`): from the
    /// data directory, or from the bundled copy when no directory was named and this one lacks the file.
    pub fn file(&self, rel: &str) -> Result<PathBuf> {
        let p = self.root.join(rel);
        if p.is_file() {
            return Ok(p);
        }
        if !self.explicit {
            if let Some(name) = rel.strip_prefix(&format!("{BUNDLED_SET}/")) {
                if BUNDLED.iter().any(|(n, _)| *n == name) {
                    return Ok(bundled_dir()?.join(name));
                }
            }
        }
        bail!(
            "{}: not found (data directory {}{}; set $CGNMT_DATA or --data to the directory that holds the data sets)",
            p.display(),
            self.root.display(),
            if self.explicit { "" } else { ", the default" }
        )
    }
}

/// Where the bundled copy is unpacked: `$CGNMT_CACHE`, else `$XDG_CACHE_HOME/cgnmt`, else `~/.cache/cgnmt`,
/// else the temporary directory.
pub(crate) fn cache_root() -> PathBuf {
    if let Some(d) = std::env::var_os("CGNMT_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("cgnmt");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache/cgnmt");
    }
    std::env::temp_dir().join("cgnmt")
}

/// The directory of the unpacked bundled data set (unpacked on first use, atomically: a directory built
/// beside it and renamed into place).
pub fn bundled_dir() -> Result<PathBuf> {
    let dir = cache_root().join(format!(
        "bundled-{}-{BUNDLED_SET}",
        env!("CARGO_PKG_VERSION")
    ));
    if dir.join("COMPLETE").is_file() {
        return Ok(dir);
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .with_context(|| format!("{}: cannot create the cache directory", parent.display()))?;
    let tmp = parent.join(format!(
        ".{}.tmp-{}",
        dir.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("bundled"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("{}: cannot create", tmp.display()))?;
    for (name, gz) in BUNDLED {
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(*gz)
            .read_to_end(&mut text)
            .with_context(|| format!("bundled {BUNDLED_SET}/{name}: corrupt"))?;
        std::fs::write(tmp.join(name), &text)
            .with_context(|| format!("{}: cannot write", tmp.join(name).display()))?;
    }
    std::fs::write(tmp.join("COMPLETE"), "")?;
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        // Another process may have unpacked it meanwhile.
        let _ = std::fs::remove_dir_all(&tmp);
        if !dir.join("COMPLETE").is_file() {
            return Err(e).with_context(|| format!("{}: cannot create", dir.display()));
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_copy_equals_the_shared_data_set() {
        let tmp = tempfile::tempdir().unwrap();
        std::env::set_var("CGNMT_CACHE", tmp.path());
        let dir = bundled_dir().unwrap();
        assert!(dir.starts_with(tmp.path()));
        let shared = std::env::var_os("CGNMT_DATA")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data"))
            .join(BUNDLED_SET);
        for (name, _) in BUNDLED {
            let ours = std::fs::read(dir.join(name)).unwrap();
            assert!(!ours.is_empty(), "{name}");
            if shared.join(name).is_file() {
                assert_eq!(ours, std::fs::read(shared.join(name)).unwrap(), "{name}");
            }
        }
        // Lines stay aligned: each split's three files have as many lines.
        for split in ["train", "dev", "test"] {
            let n = |e: &str| {
                std::fs::read_to_string(dir.join(format!("{split}.{e}")))
                    .unwrap()
                    .lines()
                    .count()
            };
            assert_eq!(n("zh"), n("en"));
            assert_eq!(n("zh"), n("attribution"));
        }
        // A named data directory never falls back to the bundled copy; the default one does.
        let named = DataDir {
            root: tmp.path().join("none"),
            explicit: true,
        };
        let e = named
            .file("tatoeba-zh-en/train.zh")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not found") && e.contains("CGNMT_DATA"), "{e}");
        let default = DataDir {
            root: tmp.path().join("none"),
            explicit: false,
        };
        assert_eq!(
            default.file("tatoeba-zh-en/train.zh").unwrap(),
            dir.join("train.zh")
        );
        assert!(default.file("hansards-en-fr/dev.fr").is_err());
    }
}
