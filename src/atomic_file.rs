//! Output files that appear whole or not at all: written to `NAME.tmp` beside the destination, flushed and
//! synced, then renamed over it. An error (a full disk, a broken pipe) or an early return drops the
//! temporary file, so no truncated output is ever left where a complete one is expected.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The temporary name beside `p`: `p` with `.tmp` appended.
pub fn tmp_path(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_os_string();
    s.push(".tmp");
    PathBuf::from(s)
}

/// A file being written; [`AtomicFile::commit`] puts it in place, dropping it uncommitted removes it.
pub struct AtomicFile {
    dest: PathBuf,
    tmp: PathBuf,
    w: Option<BufWriter<File>>,
}

impl AtomicFile {
    pub fn create(dest: &Path) -> Result<Self> {
        let tmp = tmp_path(dest);
        let f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        Ok(Self {
            dest: dest.to_path_buf(),
            tmp,
            w: Some(BufWriter::new(f)),
        })
    }

    /// Flush, sync and rename into place; an error leaves nothing behind.
    pub fn commit(mut self) -> Result<()> {
        let w = self.w.take().expect("not yet committed");
        let finish = |w: BufWriter<File>| -> std::io::Result<()> {
            let f = w.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()
        };
        finish(w).with_context(|| format!("writing {}", self.dest.display()))?;
        std::fs::rename(&self.tmp, &self.dest)
            .with_context(|| format!("writing {}", self.dest.display()))?;
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.w.as_mut().expect("not yet committed").write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.as_mut().expect("not yet committed").flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some(w) = self.w.take() {
            // Uncommitted: throw the partial output away (its buffered bytes too).
            let (f, _) = w.into_parts();
            drop(f);
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Write `bytes` to `p` whole or not at all.
pub fn write_atomic(p: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(p)?;
    f.write_all(bytes)
        .with_context(|| format!("writing {}", p.display()))?;
    f.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_files_appear_and_dropped_ones_leave_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("out.txt");
        std::fs::write(&p, "old\n").unwrap();
        {
            let mut f = AtomicFile::create(&p).unwrap();
            writeln!(f, "half").unwrap();
            // Dropped without commit (as on an error): the old file stays, no temporary is left.
        }
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old\n");
        assert!(!tmp_path(&p).exists());
        let mut f = AtomicFile::create(&p).unwrap();
        writeln!(f, "new").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new\n");
        write_atomic(&p, b"x").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"x");
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
