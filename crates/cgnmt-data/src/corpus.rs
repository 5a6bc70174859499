//! Reading corpora: plain or gzip-compressed UTF-8 text, one sentence per line.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

use crate::error::DataError;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Opens a file for buffered reading, transparently decompressing gzip.
///
/// A file is decompressed when it starts with the gzip magic bytes (`1f 8b`), whatever its
/// name. A file whose name ends in `.gz` but that is not gzip data is an error (it is most
/// likely truncated or misnamed). Concatenated gzip members are read as one stream.
pub fn open_text(path: &Path) -> Result<Box<dyn BufRead>, DataError> {
    let mut file = File::open(path).map_err(|e| DataError::io("open", path, e))?;
    if path.is_dir() {
        return Err(DataError::Io {
            action: "read",
            path: path.to_path_buf(),
            source: std::io::Error::other("it is a directory, not a file"),
        });
    }
    let mut magic = [0u8; 2];
    let mut got = 0;
    while got < 2 {
        let n = file
            .read(&mut magic[got..])
            .map_err(|e| DataError::io("read", path, e))?;
        if n == 0 {
            break;
        }
        got += n;
    }
    let has_gz_ext = path
        .extension()
        .map(|e| e.eq_ignore_ascii_case("gz"))
        .unwrap_or(false);
    let is_gzip = got == 2 && magic == GZIP_MAGIC;
    let head = std::io::Cursor::new(magic[..got].to_vec());
    let chained = head.chain(file);
    if is_gzip {
        Ok(Box::new(BufReader::with_capacity(
            1 << 16,
            MultiGzDecoder::new(chained),
        )))
    } else if has_gz_ext && got > 0 {
        Err(DataError::Io {
            action: "read",
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the name ends in .gz but the file is not gzip data",
            ),
        })
    } else {
        Ok(Box::new(BufReader::with_capacity(1 << 16, chained)))
    }
}

/// Reads all lines of a plain or gzipped UTF-8 text file.
///
/// Line terminators (`\n`, and a `\r` before it) are removed, as is a UTF-8 byte-order mark at
/// the start of the file. A final line without a terminator is kept; a trailing newline does
/// not produce an extra empty line. An empty file gives an empty vector.
///
/// Errors: [`DataError::NotFound`] naming a missing file, [`DataError::InvalidUtf8`] naming the
/// file and 1-based line of the first invalid line, [`DataError::Io`] for other failures
/// (including corrupt gzip data).
pub fn read_lines(path: &Path) -> Result<Vec<String>, DataError> {
    Lines::open(path)?.collect()
}

/// The lines of a plain or gzipped UTF-8 text file, one at a time (the conventions and errors of
/// [`read_lines`]), in bounded memory.
pub struct Lines {
    reader: Box<dyn BufRead>,
    path: std::path::PathBuf,
    line_no: usize,
    buf: Vec<u8>,
}

impl Lines {
    pub fn open(path: &Path) -> Result<Lines, DataError> {
        Ok(Lines {
            reader: open_text(path)?,
            path: path.to_path_buf(),
            line_no: 0,
            buf: Vec::new(),
        })
    }

    /// Lines read so far.
    pub fn lines_read(&self) -> usize {
        self.line_no
    }
}

impl Iterator for Lines {
    type Item = Result<String, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.buf.clear();
        let n = match self.reader.read_until(b'\n', &mut self.buf) {
            Ok(n) => n,
            Err(e) => return Some(Err(DataError::io("read", &self.path, e))),
        };
        if n == 0 {
            return None;
        }
        self.line_no += 1;
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        }
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        let mut bytes = std::mem::take(&mut self.buf);
        if self.line_no == 1 && bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
            bytes.drain(..3);
        }
        Some(
            String::from_utf8(bytes).map_err(|e| DataError::InvalidUtf8 {
                path: self.path.clone(),
                line: self.line_no,
                valid_up_to: e.utf8_error().valid_up_to(),
            }),
        )
    }
}

/// A line-aligned parallel corpus read in chunks of at most `chunk` pairs, in bounded memory. The end of one
/// file before the other is [`DataError::LineCountMismatch`] (both files counted to their ends); a corpus
/// with no line at all is [`DataError::EmptyCorpus`].
pub struct PairChunks {
    src: Lines,
    tgt: Lines,
    chunk: usize,
    done: bool,
}

impl PairChunks {
    pub fn open(src: &Path, tgt: &Path, chunk: usize) -> Result<PairChunks, DataError> {
        Ok(PairChunks {
            src: Lines::open(src)?,
            tgt: Lines::open(tgt)?,
            chunk: chunk.max(1),
            done: false,
        })
    }

    fn mismatch(&mut self) -> DataError {
        // Both files read to their ends, so that the message gives their line counts.
        Iterator::count(&mut self.src);
        Iterator::count(&mut self.tgt);
        DataError::LineCountMismatch {
            src: self.src.path.clone(),
            src_lines: self.src.line_no,
            tgt: self.tgt.path.clone(),
            tgt_lines: self.tgt.line_no,
        }
    }
}

impl Iterator for PairChunks {
    type Item = Result<Vec<(String, String)>, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut out = Vec::with_capacity(self.chunk.min(1 << 16));
        while out.len() < self.chunk {
            match (self.src.next(), self.tgt.next()) {
                (Some(Ok(a)), Some(Ok(b))) => out.push((a, b)),
                (Some(Err(e)), _) | (_, Some(Err(e))) => {
                    self.done = true;
                    return Some(Err(e));
                }
                (None, None) => {
                    self.done = true;
                    if self.src.line_no == 0 {
                        return Some(Err(DataError::EmptyCorpus {
                            path: self.src.path.clone(),
                        }));
                    }
                    break;
                }
                _ => {
                    self.done = true;
                    return Some(Err(self.mismatch()));
                }
            }
        }
        if out.is_empty() {
            None
        } else {
            Some(Ok(out))
        }
    }
}

/// Reads a line-aligned parallel corpus (each file plain or gzipped).
///
/// Errors when either file cannot be read (see [`read_lines`]), when a file is empty
/// ([`DataError::EmptyCorpus`]) or when the line counts differ
/// ([`DataError::LineCountMismatch`], naming both files and both counts).
pub fn read_parallel(src: &Path, tgt: &Path) -> Result<(Vec<String>, Vec<String>), DataError> {
    let s = read_lines(src)?;
    let t = read_lines(tgt)?;
    if s.len() != t.len() {
        return Err(DataError::LineCountMismatch {
            src: src.to_path_buf(),
            src_lines: s.len(),
            tgt: tgt.to_path_buf(),
            tgt_lines: t.len(),
        });
    }
    if s.is_empty() {
        return Err(DataError::EmptyCorpus {
            path: src.to_path_buf(),
        });
    }
    Ok((s, t))
}
