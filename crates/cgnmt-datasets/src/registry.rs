//! The registry of public corpora and test sets (`configs/data/registry.toml`, compiled in): where each is
//! published, its licence and checksums, and how its files become line-aligned pairs
//! `DIR/NAME/{split}.{src_lang}` and `DIR/NAME/{split}.{tgt_lang}`, the layout every command reads.
//! `cgnmt data list | get | verify` are built on it.

use std::collections::BTreeMap;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::download;

/// The registry compiled into the binary.
pub const BUILTIN: &str = include_str!("../../../configs/data/registry.toml");

/// The registry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registry {
    #[serde(rename = "corpus")]
    pub corpora: Vec<Entry>,
}

/// One corpus or test set.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub name: String,
    pub description: String,
    pub licence: String,
    /// train, dev or test: the output files' split name.
    pub split: String,
    pub src_lang: String,
    pub tgt_lang: String,
    /// What is downloaded.
    pub files: Vec<Source>,
    /// How the downloads become pairs.
    pub format: Format,
    /// Where its facts come from, and anything a user should know.
    #[serde(default)]
    pub notes: String,
}

/// One download.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    pub url: String,
    /// SHA-256 of the file; without it the checksum seen is recorded and printed (trust on first use).
    #[serde(default)]
    pub sha256: Option<String>,
    /// MD5 of the file, where the publisher (or sacreBLEU's registry) gives only that.
    #[serde(default)]
    pub md5: Option<String>,
    /// Size in bytes, where known (for `list`).
    #[serde(default)]
    pub size: Option<u64>,
}

/// How the downloads become line-aligned pairs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Format {
    /// One tab-separated file (gzip or plain): the source and target columns (0-based); with `keep`, only
    /// the rows whose column `keep_column` starts with `keep` (e.g. one script of a macro-language).
    Tsv {
        src_column: usize,
        tgt_column: usize,
        #[serde(default)]
        keep_column: Option<usize>,
        #[serde(default)]
        keep: Option<String>,
    },
    /// Two files (gzip or plain), source first, one sentence per line.
    Pair,
    /// One tar archive (gzip or plain): the members holding source and target, as plain lines or as
    /// WMT's SGML (`<seg id="..">text</seg>` lines).
    Tar {
        src: String,
        tgt: String,
        #[serde(default)]
        text: Text,
    },
    /// One tar archive of many gzip-compressed document pairs (`STEM{src_suffix}`, `STEM{tgt_suffix}`, aligned
    /// by line), concatenated in the order of their names; `latin1` for text in ISO-8859-1.
    TarDocuments {
        src_suffix: String,
        tgt_suffix: String,
        #[serde(default)]
        latin1: bool,
    },
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Text {
    #[default]
    Plain,
    Sgm,
}

/// What `get` records beside a corpus (`SOURCE.toml`), for `verify`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub entry: Entry,
    /// SHA-256 of each download, as seen.
    pub downloads: Vec<String>,
    /// SHA-256 of each output file.
    pub outputs: BTreeMap<String, String>,
    pub pairs: usize,
    /// Lines left out because a side was empty (TSV rows with an empty column).
    pub dropped_empty: usize,
    /// TSV rows left out by the entry's `keep` filter.
    #[serde(default)]
    pub filtered: usize,
}

pub const RECORD_FILE: &str = "SOURCE.toml";

impl Registry {
    pub fn parse(text: &str, origin: &str) -> Result<Registry> {
        let r: Registry =
            toml::from_str(text).with_context(|| format!("{origin}: not a valid data registry"))?;
        let mut seen = std::collections::HashSet::new();
        for e in &r.corpora {
            if !seen.insert(e.name.as_str()) {
                bail!("{origin}: corpus {:?} is listed twice", e.name);
            }
            let want = match e.format {
                Format::Pair => 2,
                _ => 1,
            };
            if e.files.len() != want {
                bail!(
                    "{origin}: corpus {:?} has {} files; its format takes {want}",
                    e.name,
                    e.files.len()
                );
            }
            if e.name.is_empty() || e.name.contains(['/', '\\']) || e.name.starts_with('.') {
                bail!("{origin}: {:?} is not a usable corpus name", e.name);
            }
        }
        Ok(r)
    }

    /// `--registry FILE`, or the built-in one.
    pub fn load(path: Option<&Path>) -> Result<Registry> {
        match path {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("{}: cannot read", p.display()))?;
                Registry::parse(&text, &p.display().to_string())
            }
            None => Registry::parse(BUILTIN, "configs/data/registry.toml (built in)"),
        }
    }

    pub fn get(&self, name: &str) -> Result<&Entry> {
        self.corpora.iter().find(|e| e.name == name).ok_or_else(|| {
            anyhow::anyhow!(
                "no corpus {name:?} in the registry (`cgnmt data list` shows them: {})",
                self.corpora
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }
}

impl Entry {
    pub fn output_names(&self) -> [String; 2] {
        [
            format!("{}.{}", self.split, self.src_lang),
            format!("{}.{}", self.split, self.tgt_lang),
        ]
    }
}

/// A downloaded file's bytes, decompressed when gzip.
fn open_maybe_gz(p: &Path) -> Result<Box<dyn BufRead>> {
    Ok(cgnmt_data::corpus::open_text(p)?)
}

/// Text of one line of WMT's SGML, or `None` for a line that is not a segment.
fn sgm_segment(line: &str) -> Option<String> {
    let l = line.trim();
    if !l.starts_with("<seg") {
        return None;
    }
    let start = l.find('>')? + 1;
    let end = l.rfind("</seg>")?;
    if end < start {
        return None;
    }
    Some(unescape(l[start..end].trim()))
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// Lines of a tar member (the archive gzip or plain).
fn tar_member(archive: &Path, member: &str) -> Result<Vec<u8>> {
    let reader = open_maybe_gz(archive)?;
    let mut tar = tar::Archive::new(reader);
    let want = member.trim_start_matches("./");
    for e in tar
        .entries()
        .with_context(|| format!("{}: not a tar archive", archive.display()))?
    {
        let mut e = e.with_context(|| format!("{}: damaged tar archive", archive.display()))?;
        let path = e
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        if path == want {
            let mut bytes = vec![];
            e.read_to_end(&mut bytes)
                .with_context(|| format!("{}: cannot read {member}", archive.display()))?;
            return Ok(bytes);
        }
    }
    bail!("{}: the archive has no member {member}", archive.display())
}

fn utf8_lines(bytes: Vec<u8>, what: &str) -> Result<Vec<String>> {
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!("{what}: not UTF-8 (byte {})", e.utf8_error().valid_up_to())
    })?;
    Ok(text
        .lines()
        .map(|l| l.trim_end_matches('\r').to_string())
        .collect())
}

/// What extraction gives: the pairs, and the lines left out (an empty side; the `keep` filter).
pub struct Extracted {
    pub src: Vec<String>,
    pub tgt: Vec<String>,
    pub dropped_empty: usize,
    pub filtered: usize,
}

/// ISO-8859-1 bytes as text (each byte is the code point of the same number).
fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| b as char).collect()
}

/// The pairs of a corpus from its downloads.
pub fn extract(e: &Entry, downloads: &[PathBuf]) -> Result<Extracted> {
    let (mut dropped_empty, mut filtered) = (0, 0);
    let (src, tgt) = match &e.format {
        Format::Tsv {
            src_column,
            tgt_column,
            keep_column,
            keep,
        } => {
            let (mut s, mut t) = (vec![], vec![]);
            for (k, line) in open_maybe_gz(&downloads[0])?.lines().enumerate() {
                let line = line.with_context(|| {
                    format!("{}: line {}: not UTF-8 text", downloads[0].display(), k + 1)
                })?;
                let cols: Vec<&str> = line.split('\t').collect();
                let col = |c: usize| -> Result<String> {
                    cols.get(c).map(|x| x.trim().to_string()).ok_or_else(|| {
                        anyhow::anyhow!(
                            "{}: line {}: {} columns, column {c} wanted",
                            downloads[0].display(),
                            k + 1,
                            cols.len()
                        )
                    })
                };
                if let (Some(kc), Some(prefix)) = (keep_column, keep) {
                    if !col(*kc)?.starts_with(prefix.as_str()) {
                        filtered += 1;
                        continue;
                    }
                }
                let (a, b) = (col(*src_column)?, col(*tgt_column)?);
                if a.is_empty() || b.is_empty() {
                    dropped_empty += 1;
                    continue;
                }
                s.push(a);
                t.push(b);
            }
            (s, t)
        }
        Format::Pair => {
            let read = |p: &Path| -> Result<Vec<String>> {
                let mut out = vec![];
                for (k, l) in open_maybe_gz(p)?.lines().enumerate() {
                    out.push(l.with_context(|| {
                        format!("{}: line {}: not UTF-8 text", p.display(), k + 1)
                    })?);
                }
                Ok(out)
            };
            (read(&downloads[0])?, read(&downloads[1])?)
        }
        Format::Tar { src, tgt, text } => {
            let side = |member: &str| -> Result<Vec<String>> {
                let what = format!("{} member {member}", downloads[0].display());
                let lines = utf8_lines(tar_member(&downloads[0], member)?, &what)?;
                Ok(match text {
                    Text::Plain => lines,
                    Text::Sgm => lines.iter().filter_map(|l| sgm_segment(l)).collect(),
                })
            };
            (side(src)?, side(tgt)?)
        }
        Format::TarDocuments {
            src_suffix,
            tgt_suffix,
            latin1: is_latin1,
        } => {
            let archive = &downloads[0];
            let mut docs: BTreeMap<String, [Option<Vec<String>>; 2]> = BTreeMap::new();
            let mut tar = tar::Archive::new(open_maybe_gz(archive)?);
            for entry in tar
                .entries()
                .with_context(|| format!("{}: not a tar archive", archive.display()))?
            {
                let mut entry =
                    entry.with_context(|| format!("{}: damaged tar archive", archive.display()))?;
                let path = entry.path()?.to_string_lossy().to_string();
                let (stem, side) = if let Some(st) = path.strip_suffix(src_suffix.as_str()) {
                    (st.to_string(), 0)
                } else if let Some(st) = path.strip_suffix(tgt_suffix.as_str()) {
                    (st.to_string(), 1)
                } else {
                    continue;
                };
                let mut raw = vec![];
                entry
                    .read_to_end(&mut raw)
                    .with_context(|| format!("{}: cannot read {path}", archive.display()))?;
                let mut bytes = vec![];
                if raw.starts_with(&[0x1f, 0x8b]) {
                    flate2::read::MultiGzDecoder::new(&raw[..])
                        .read_to_end(&mut bytes)
                        .with_context(|| format!("{}: {path}: damaged gzip", archive.display()))?;
                } else {
                    bytes = raw;
                }
                let text = if *is_latin1 {
                    latin1(&bytes)
                } else {
                    String::from_utf8(bytes)
                        .map_err(|_| anyhow::anyhow!("{}: {path}: not UTF-8", archive.display()))?
                };
                docs.entry(stem).or_default()[side] = Some(
                    text.lines()
                        .map(|l| l.trim_end_matches('\r').to_string())
                        .collect(),
                );
            }
            let (mut s, mut t) = (vec![], vec![]);
            for (stem, [a, b]) in docs {
                let (Some(a), Some(b)) = (a, b) else {
                    bail!(
                        "{}: {stem} has only one side ({src_suffix} / {tgt_suffix})",
                        archive.display()
                    );
                };
                if a.len() != b.len() {
                    bail!(
                        "{}: {stem}{src_suffix} has {} lines, {stem}{tgt_suffix} {}",
                        archive.display(),
                        a.len(),
                        b.len()
                    );
                }
                for (x, y) in a.into_iter().zip(b) {
                    if x.trim().is_empty() || y.trim().is_empty() {
                        dropped_empty += 1;
                    } else {
                        s.push(x);
                        t.push(y);
                    }
                }
            }
            (s, t)
        }
    };
    if src.len() != tgt.len() {
        bail!(
            "{}: {} source lines but {} target lines: not line-aligned (nothing was written)",
            e.name,
            src.len(),
            tgt.len()
        );
    }
    if src.is_empty() {
        bail!("{}: no sentence pairs in the download", e.name);
    }
    Ok(Extracted {
        src,
        tgt,
        dropped_empty,
        filtered,
    })
}

/// Download and extract one corpus into `dir/NAME` (whole or not at all).
pub fn get(e: &Entry, dir: &Path, force: bool, quiet: bool) -> Result<Record> {
    let out = dir.join(&e.name);
    if out.join(RECORD_FILE).is_file() && !force {
        bail!(
            "{}: already there (`cgnmt data verify {}` checks it; --force fetches it again)",
            out.display(),
            e.name
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let work = dir.join(format!(".{}.download", e.name));
    if work.exists() {
        std::fs::remove_dir_all(&work)
            .with_context(|| format!("{}: cannot remove", work.display()))?;
    }
    std::fs::create_dir_all(&work).with_context(|| format!("{}: cannot create", work.display()))?;
    let result = (|| -> Result<Record> {
        let mut paths = vec![];
        let mut sums = vec![];
        for (k, s) in e.files.iter().enumerate() {
            let name = s
                .url
                .rsplit('/')
                .next()
                .filter(|n| !n.is_empty())
                .unwrap_or("download");
            let dest = work.join(format!("{k}-{name}"));
            let d =
                download::download(&s.url, &dest, s.sha256.as_deref(), s.md5.as_deref(), quiet)?;
            if s.sha256.is_none() && !quiet {
                eprintln!(
                    "note: {}: the registry has no SHA-256 for it; this download's is {} (recorded in {})",
                    s.url, d.sha256, RECORD_FILE
                );
            }
            sums.push(d.sha256);
            paths.push(d.path);
        }
        let x = extract(e, &paths)?;
        let (src, tgt) = (&x.src, &x.tgt);
        let staged = work.join("out");
        std::fs::create_dir_all(&staged)?;
        let mut outputs = BTreeMap::new();
        for (name, lines) in e.output_names().iter().zip([src, tgt]) {
            let p = staged.join(name);
            let mut text = lines.join("\n");
            text.push('\n');
            std::fs::write(&p, text).with_context(|| format!("{}: cannot write", p.display()))?;
            outputs.insert(name.clone(), download::sha256_file(&p)?);
        }
        let rec = Record {
            entry: e.clone(),
            downloads: sums,
            outputs,
            pairs: src.len(),
            dropped_empty: x.dropped_empty,
            filtered: x.filtered,
        };
        std::fs::write(
            staged.join(RECORD_FILE),
            toml::to_string_pretty(&rec).context("cannot write the record")?,
        )?;
        if out.exists() {
            std::fs::remove_dir_all(&out)
                .with_context(|| format!("{}: cannot remove", out.display()))?;
        }
        std::fs::rename(&staged, &out)
            .with_context(|| format!("{}: cannot move into place", out.display()))?;
        Ok(rec)
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// Check a fetched corpus against its record: the files are unchanged and line-aligned.
pub fn verify(dir: &Path, name: &str) -> Result<Record> {
    let out = dir.join(name);
    let rp = out.join(RECORD_FILE);
    let text = std::fs::read_to_string(&rp).with_context(|| {
        format!(
            "{}: not fetched (no {RECORD_FILE}; `cgnmt data get {name}` fetches it)",
            out.display()
        )
    })?;
    let rec: Record =
        toml::from_str(&text).with_context(|| format!("{}: not a valid record", rp.display()))?;
    let mut counts = vec![];
    for (file, want) in &rec.outputs {
        let p = out.join(file);
        let got = download::sha256_file(&p)?;
        if &got != want {
            bail!(
                "{}: changed since it was fetched (SHA-256 {got}, recorded {want})",
                p.display()
            );
        }
        counts.push(cgnmt_data::corpus::read_lines(&p)?.len());
    }
    if counts.iter().any(|&c| c != rec.pairs) {
        bail!(
            "{}: line counts {counts:?} do not match the {} pairs recorded",
            out.display(),
            rec.pairs
        );
    }
    Ok(rec)
}

/// The registry's corpora as `cgnmt data list` prints them: one line each with its split, languages, size,
/// whether it is fetched into `dir`, and its description, then its licence.
pub fn listing(r: &Registry, dir: &Path) -> Vec<String> {
    let mut out = vec![];
    for e in &r.corpora {
        let size: Option<u64> = e.files.iter().map(|f| f.size).sum();
        let here = dir.join(&e.name).join(RECORD_FILE).is_file();
        out.push(format!(
            "{:<28} {:<5} {}-{}  {:>9}  {}  {}",
            e.name,
            e.split,
            e.src_lang,
            e.tgt_lang,
            size.map_or("?".into(), human),
            if here { "fetched    " } else { "not fetched" },
            e.description
        ));
        out.push(format!("{:<28} licence: {}", "", e.licence));
    }
    out
}

/// The names of the registry's corpora fetched into `dir`.
pub fn fetched(r: &Registry, dir: &Path) -> Vec<String> {
    r.corpora
        .iter()
        .filter(|e| dir.join(&e.name).join(RECORD_FILE).is_file())
        .map(|e| e.name.clone())
        .collect()
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.0} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

impl Record {
    /// What a fetch of corpus `name` into `dir` wrote, in a line: its pairs, where, and the lines left out.
    pub fn summary(&self, name: &str, dir: &Path) -> String {
        let mut left_out = vec![];
        if self.dropped_empty > 0 {
            left_out.push(format!(
                "{} lines with an empty side left out",
                self.dropped_empty
            ));
        }
        if self.filtered > 0 {
            left_out.push(format!(
                "{} rows not kept by the entry's filter",
                self.filtered
            ));
        }
        let note = if left_out.is_empty() {
            String::new()
        } else {
            format!(" ({}; counted in {RECORD_FILE})", left_out.join(", "))
        };
        format!(
            "{name}: {} sentence pairs → {}{note}",
            self.pairs,
            dir.join(name).display()
        )
    }
}

/// Where `get` writes by default: `$CGNMT_DATA`, else the cache's `data` directory.
pub fn default_dir() -> PathBuf {
    match std::env::var_os("CGNMT_DATA") {
        Some(d) => PathBuf::from(d),
        None => super::cache_root().join("data"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_registry_parses_and_names_the_issue_s_corpora() {
        let r = Registry::load(None).unwrap();
        for want in [
            "news-commentary",
            "newstest",
            "flores200",
            "tatoeba",
            "multi30k",
            "hansards",
        ] {
            assert!(
                r.corpora.iter().any(|e| e.name.contains(want)),
                "no {want} corpus in the registry"
            );
        }
        for e in &r.corpora {
            for s in &e.files {
                assert!(
                    s.url.starts_with("https://") || s.url.starts_with("http://"),
                    "{}",
                    s.url
                );
                if let Some(h) = &s.sha256 {
                    assert!(
                        h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()),
                        "{h}"
                    );
                }
            }
        }
    }

    #[test]
    fn sgm_segments_are_read_and_unescaped() {
        assert_eq!(
            sgm_segment(r#"<seg id="3">A &amp; B &lt;x&gt; </seg>"#).as_deref(),
            Some("A & B <x>")
        );
        assert_eq!(sgm_segment("<doc docid=\"x\">"), None);
        assert_eq!(sgm_segment("<p>"), None);
    }

    #[test]
    fn bad_registries_are_refused_with_the_reason() {
        let one = r#"[[corpus]]
name = "x"
description = "d"
licence = "l"
split = "test"
src_lang = "zh"
tgt_lang = "en"
files = [{ url = "http://h/a" }]
format = { type = "pair" }
"#;
        let e = Registry::parse(one, "r.toml").unwrap_err().to_string();
        assert!(e.contains("has 1 files"), "{e}");
        let tsv = one.replace(
            "{ type = \"pair\" }",
            "{ type = \"tsv\", src_column = 1, tgt_column = 0 }",
        );
        Registry::parse(&tsv, "r.toml").unwrap();
        let e = Registry::parse(&format!("{tsv}\n{tsv}"), "r.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("listed twice"), "{e}");
    }
}
