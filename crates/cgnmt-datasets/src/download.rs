//! Downloading a file: streamed to `NAME.part` with a progress bar, resumed with an HTTP range request when
//! the connection drops, checked against its SHA-256, then renamed into place. A checksum mismatch, an HTTP
//! error or a download that cannot be completed is an error that leaves no file behind.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

/// Attempts per file (the first and the resumptions after a dropped connection).
pub const ATTEMPTS: usize = 5;

/// What a finished download was.
#[derive(Debug, Clone)]
pub struct Downloaded {
    pub path: PathBuf,
    pub bytes: u64,
    pub sha256: String,
    /// Range requests that resumed it.
    pub resumed: usize,
}

/// A file's digest, as lower-case hex.
fn digest_file<D: Digest>(p: &Path) -> Result<String> {
    let mut f = std::fs::File::open(p).with_context(|| format!("{}: cannot open", p.display()))?;
    let mut h = D::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("{}: cannot read", p.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// The SHA-256 of a file, as lower-case hex.
pub fn sha256_file(p: &Path) -> Result<String> {
    digest_file::<Sha256>(p)
}

/// The MD5 of a file (some publishers give only MD5).
pub fn md5_file(p: &Path) -> Result<String> {
    digest_file::<md5::Md5>(p)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn part_path(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_os_string();
    s.push(".part");
    PathBuf::from(s)
}

/// Download `url` to `dest` (whole or not at all). With `sha256` (or `md5`), the file must have it.
pub fn download(
    url: &str,
    dest: &Path,
    sha256: Option<&str>,
    md5: Option<&str>,
    quiet: bool,
) -> Result<Downloaded> {
    let part = part_path(dest);
    let result = fetch(url, &part, quiet).and_then(|resumed| {
        let got = sha256_file(&part)?;
        if let Some(want) = sha256 {
            if !got.eq_ignore_ascii_case(want) {
                bail!(
                    "{url}: checksum mismatch: SHA-256 {got}, the registry says {want} (the download is \
                     removed)"
                );
            }
        }
        if let Some(want) = md5 {
            let got = md5_file(&part)?;
            if !got.eq_ignore_ascii_case(want) {
                bail!(
                    "{url}: checksum mismatch: MD5 {got}, the registry says {want} (the download is removed)"
                );
            }
        }
        let bytes = std::fs::metadata(&part)?.len();
        std::fs::rename(&part, dest)
            .with_context(|| format!("{}: cannot move into place", dest.display()))?;
        Ok(Downloaded {
            path: dest.to_path_buf(),
            bytes,
            sha256: got,
            resumed,
        })
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    result
}

/// Fetch into `part`, resuming after a dropped connection; the number of resumptions.
fn fetch(url: &str, part: &Path, quiet: bool) -> Result<usize> {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(30))
        .timeout_read(Duration::from_secs(60))
        .build();
    let _ = std::fs::remove_file(part);
    let mut resumed = 0;
    let mut total: Option<u64> = None;
    let pb = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(0)
    };
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
        )
        .expect("template"),
    );
    pb.set_message(
        url.rsplit('/')
            .next()
            .unwrap_or(url)
            .chars()
            .take(40)
            .collect::<String>(),
    );
    let mut last_err = None;
    for attempt in 0..ATTEMPTS {
        let have = std::fs::metadata(part).map_or(0, |m| m.len());
        if let Some(t) = total {
            if have >= t {
                break;
            }
        }
        let mut req = agent.get(url);
        if have > 0 {
            req = req.set("Range", &format!("bytes={have}-"));
        }
        let resp = match req.call() {
            Ok(r) => r,
            Err(ureq::Error::Status(code, r)) => {
                bail!("{url}: HTTP {code} {}", r.status_text())
            }
            Err(e) => {
                let msg = e.to_string();
                last_err = Some(if msg.contains(url) {
                    anyhow::anyhow!("{msg}")
                } else {
                    anyhow::anyhow!("{url}: {msg}")
                });
                std::thread::sleep(Duration::from_millis(200 * (attempt as u64 + 1)));
                continue;
            }
        };
        let len: Option<u64> = resp.header("Content-Length").and_then(|v| v.parse().ok());
        let (mut f, start) = if have > 0 && resp.status() == 206 {
            resumed += 1;
            let f = std::fs::OpenOptions::new()
                .append(true)
                .open(part)
                .with_context(|| format!("{}: cannot open", part.display()))?;
            (f, have)
        } else {
            // A first request, or a server that ignored the range: from the start.
            let f = std::fs::File::create(part)
                .with_context(|| format!("{}: cannot create", part.display()))?;
            (f, 0)
        };
        if let Some(l) = len {
            total = Some(start + l);
            pb.set_length(start + l);
        }
        pb.set_position(start);
        let mut reader = resp.into_reader();
        let mut buf = vec![0u8; 1 << 16];
        let mut got = start;
        let dropped = loop {
            match reader.read(&mut buf) {
                Ok(0) => break None,
                Ok(n) => {
                    f.write_all(&buf[..n])
                        .with_context(|| format!("{}: cannot write", part.display()))?;
                    got += n as u64;
                    pb.set_position(got);
                }
                Err(e) => break Some(e),
            }
        };
        f.sync_all()
            .with_context(|| format!("{}: cannot write", part.display()))?;
        match (dropped, total) {
            (None, Some(t)) if got == t => {
                pb.finish_and_clear();
                return Ok(resumed);
            }
            (None, None) => {
                pb.finish_and_clear();
                return Ok(resumed);
            }
            (e, _) => {
                last_err = Some(anyhow::anyhow!(
                    "{url}: the connection dropped after {got} of {} bytes{}",
                    total.map_or("?".into(), |t| t.to_string()),
                    e.map(|e| format!(" ({e})")).unwrap_or_default()
                ));
            }
        }
    }
    pb.finish_and_clear();
    Err(last_err
        .unwrap_or_else(|| anyhow::anyhow!("{url}: download failed"))
        .context(format!("gave up after {ATTEMPTS} attempts")))
}
