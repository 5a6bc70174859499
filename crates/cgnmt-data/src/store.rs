//! The binary token store: one side of a prepared training corpus as a flat array of token ids plus each
//! sentence's offset. Training reads each sentence when a batch takes it, by position (`pread`), so the corpus
//! stays in the kernel's page cache (shared between the processes of a machine, and dropped under memory
//! pressure) instead of in the heap.
//!
//! Why positioned reads rather than a memory map: mapped pages count in a process's resident memory, and the
//! kernel maps whole folios around each sentence a fault touches, a share that grows toward the store's size
//! over an epoch. Training the small model for 100 updates on 8.3M pairs peaked at 1,889 MiB with the store
//! mapped against 1,140 MiB with positioned reads (`results/large-corpus/mmap`); the reads cost two system
//! calls per sentence and side, and the step rate did not change (`results/large-corpus/step-rate`).
//!
//! A store's ids are the ranks of the side's tokens in its counts (`counts.src` / `counts.tgt`): id `2 + k`
//! is the `k`-th most frequent token ([`crate::Vocab::build`]'s order; 0 and 1 are EOS and UNK), so a
//! vocabulary of the K most frequent tokens keeps the ids below `K + 2` and maps the others to UNK.
//!
//! File layout (little-endian): a 64-byte header (`CGNMTTOK`, format version, bytes per id (2 or 4), number
//! of sentences, number of tokens, the number of distinct ids, an FNV-1a 64-bit checksum of everything after
//! the header), then `sentences + 1` u64 offsets (in tokens), then the ids. A truncated file or one whose
//! checksum does not match is refused with an error naming it.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::error::DataError;

const MAGIC: &[u8; 8] = b"CGNMTTOK";
const VERSION: u32 = 1;
const HEADER: usize = 64;

/// FNV-1a, 64 bits (fast, no dependency; it guards against truncation and corruption, not tampering).
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

fn bad(path: &Path, why: impl Into<String>) -> DataError {
    DataError::Store {
        path: path.to_path_buf(),
        message: why.into(),
    }
}

/// Writes a store sentence by sentence: the offsets and the ids go to two temporary files beside it (nothing
/// grows in memory), and [`StoreWriter::finish`] writes the header, the offsets and the ids into the store,
/// then renames it into place.
pub struct StoreWriter {
    path: PathBuf,
    parts: [(PathBuf, BufWriter<File>); 2],
    sentences: u64,
    tokens: u64,
    width: usize,
    distinct: u64,
}

impl StoreWriter {
    /// A store of ids below `distinct` (2 bytes per id when they fit, else 4).
    pub fn create(path: &Path, distinct: u64) -> Result<StoreWriter, DataError> {
        let part = |ext: &str| -> Result<(PathBuf, BufWriter<File>), DataError> {
            let p = path.with_extension(ext);
            let f = File::create(&p).map_err(|e| DataError::io("create", &p, e))?;
            Ok((p, BufWriter::with_capacity(1 << 20, f)))
        };
        let mut w = StoreWriter {
            path: path.to_path_buf(),
            parts: [part("offsets.tmp")?, part("ids.tmp")?],
            sentences: 0,
            tokens: 0,
            width: if distinct <= u16::MAX as u64 + 1 {
                2
            } else {
                4
            },
            distinct,
        };
        w.write(0, &0u64.to_le_bytes())?;
        Ok(w)
    }

    fn write(&mut self, part: usize, bytes: &[u8]) -> Result<(), DataError> {
        let (p, w) = &mut self.parts[part];
        w.write_all(bytes)
            .map_err(|e| DataError::io("write", &*p, e))
    }

    pub fn push(&mut self, sentence: &[u32]) -> Result<(), DataError> {
        for &id in sentence {
            if id as u64 >= self.distinct {
                return Err(bad(
                    &self.path,
                    format!("id {id} out of range (the store has {} ids)", self.distinct),
                ));
            }
            if self.width == 2 {
                self.write(1, &(id as u16).to_le_bytes())?;
            } else {
                self.write(1, &id.to_le_bytes())?;
            }
        }
        self.sentences += 1;
        self.tokens += sentence.len() as u64;
        self.write(0, &self.tokens.to_le_bytes())
    }

    /// Write the store (header, offsets, ids) and remove the temporary files.
    pub fn finish(self) -> Result<(), DataError> {
        let StoreWriter {
            path,
            parts,
            sentences,
            tokens,
            width,
            distinct,
        } = self;
        let mut paths = vec![];
        for (p, w) in parts {
            w.into_inner()
                .map_err(|e| DataError::io("write", &p, e.into_error()))?;
            paths.push(p);
        }
        // The checksum covers the offsets, then the ids.
        let mut sum = Fnv::new();
        let mut buf = vec![0u8; 1 << 20];
        for p in &paths {
            let mut r = File::open(p).map_err(|e| DataError::io("read", p, e))?;
            loop {
                let n = r.read(&mut buf).map_err(|e| DataError::io("read", p, e))?;
                if n == 0 {
                    break;
                }
                sum.update(&buf[..n]);
            }
        }
        let tmp = path.with_extension("store.tmp");
        let out = File::create(&tmp).map_err(|e| DataError::io("create", &tmp, e))?;
        let mut w = BufWriter::with_capacity(1 << 20, out);
        let mut header = Vec::with_capacity(HEADER);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&(width as u32).to_le_bytes());
        header.extend_from_slice(&sentences.to_le_bytes());
        header.extend_from_slice(&tokens.to_le_bytes());
        header.extend_from_slice(&distinct.to_le_bytes());
        header.extend_from_slice(&sum.0.to_le_bytes());
        header.resize(HEADER, 0);
        w.write_all(&header)
            .map_err(|e| DataError::io("write", &tmp, e))?;
        for p in &paths {
            let mut r = File::open(p).map_err(|e| DataError::io("read", p, e))?;
            std::io::copy(&mut r, &mut w).map_err(|e| DataError::io("write", &tmp, e))?;
        }
        w.flush().map_err(|e| DataError::io("write", &tmp, e))?;
        drop(w);
        for p in &paths {
            std::fs::remove_file(p).map_err(|e| DataError::io("remove", p, e))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| DataError::io("rename", &path, e))?;
        Ok(())
    }
}

/// A store opened for reading (sentences read by position).
pub struct TokenStore {
    path: PathBuf,
    file: File,
    width: usize,
    sentences: usize,
    distinct: u64,
}

impl std::fmt::Debug for TokenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenStore")
            .field("path", &self.path)
            .field("sentences", &self.sentences)
            .finish()
    }
}

impl TokenStore {
    /// Open and check a store: its header, its size against the header, and (reading the file once) its
    /// checksum and offsets. Returns the store and every sentence's length.
    pub fn open(path: &Path) -> Result<(TokenStore, Vec<u16>), DataError> {
        let file = File::open(path).map_err(|e| DataError::io("open", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| DataError::io("read", path, e))?
            .len();
        let mut r = std::io::BufReader::with_capacity(1 << 20, &file);
        let mut header = [0u8; HEADER];
        r.read_exact(&mut header)
            .map_err(|_| bad(path, "truncated: no complete header (not a token store?)"))?;
        if &header[..8] != MAGIC {
            return Err(bad(path, "not a token store (no CGNMTTOK header)"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
        let (version, width) = (u32_at(8), u32_at(12) as usize);
        let (sentences, tokens, distinct, checksum) =
            (u64_at(16), u64_at(24), u64_at(32), u64_at(40));
        if version != VERSION || !(width == 2 || width == 4) {
            return Err(bad(
                path,
                format!("format version {version}, {width} bytes per id: not one this cgnmt reads"),
            ));
        }
        let want = (HEADER as u64)
            .checked_add(sentences.saturating_add(1).saturating_mul(8))
            .and_then(|x| x.checked_add((width as u64).saturating_mul(tokens)));
        if want != Some(len) {
            return Err(bad(
                path,
                format!(
                    "{len} bytes where its header says otherwise ({sentences} sentences, {tokens} tokens): \
                     truncated or damaged; prepare the corpus again"
                ),
            ));
        }
        // The offsets (rising from 0 to the token count) give the lengths; the checksum covers them and the ids.
        let mut sum = Fnv::new();
        let mut lengths = Vec::with_capacity(sentences as usize);
        let mut word = [0u8; 8];
        let mut prev = 0u64;
        for i in 0..=sentences {
            r.read_exact(&mut word)
                .map_err(|e| DataError::io("read", path, e))?;
            sum.update(&word);
            let o = u64::from_le_bytes(word);
            if (i == 0 && o != 0) || o < prev || o > tokens {
                return Err(bad(path, format!("offset {i} out of order: damaged")));
            }
            if i > 0 {
                let n = o - prev;
                if n > u16::MAX as u64 {
                    return Err(bad(
                        path,
                        format!(
                            "sentence {i} has {n} tokens; a store holds sentences of up to 65,535"
                        ),
                    ));
                }
                lengths.push(n as u16);
            }
            prev = o;
        }
        if prev != tokens {
            return Err(bad(
                path,
                "its offsets do not end at its token count: damaged",
            ));
        }
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = r
                .read(&mut buf)
                .map_err(|e| DataError::io("read", path, e))?;
            if n == 0 {
                break;
            }
            sum.update(&buf[..n]);
        }
        if sum.0 != checksum {
            return Err(bad(
                path,
                "its checksum does not match its contents: damaged; prepare the corpus again",
            ));
        }
        drop(r);
        Ok((
            TokenStore {
                path: path.to_path_buf(),
                file,
                width,
                sentences: sentences as usize,
                distinct,
            },
            lengths,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of sentences.
    pub fn len(&self) -> usize {
        self.sentences
    }

    pub fn is_empty(&self) -> bool {
        self.sentences == 0
    }

    /// The ids are below this.
    pub fn distinct(&self) -> u64 {
        self.distinct
    }

    /// Fill `buf` from byte `pos` of the file.
    fn read_at(&self, buf: &mut [u8], pos: u64) -> Result<(), DataError> {
        #[cfg(unix)]
        let r = std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, pos);
        #[cfg(windows)]
        let r = (|| {
            let (mut done, mut buf) = (0u64, buf);
            while !buf.is_empty() {
                match std::os::windows::fs::FileExt::seek_read(&self.file, buf, pos + done)? {
                    0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                    n => {
                        done += n as u64;
                        buf = &mut buf[n..];
                    }
                }
            }
            Ok(())
        })();
        r.map_err(|e| DataError::io("read", &self.path, e))
    }

    /// Sentence `i`'s first and end offsets, in tokens.
    fn span(&self, i: usize) -> Result<(u64, u64), DataError> {
        assert!(
            i < self.sentences,
            "sentence {i} of a store of {}",
            self.sentences
        );
        let mut b = [0u8; 16];
        self.read_at(&mut b, (HEADER + 8 * i) as u64)?;
        let a = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        let e = u64::from_le_bytes(b[8..].try_into().expect("8 bytes"));
        if e < a {
            return Err(bad(
                &self.path,
                format!("offset {i} out of order: changed since it was opened"),
            ));
        }
        Ok((a, e))
    }

    /// Sentence `i`'s length in tokens.
    pub fn sentence_len(&self, i: usize) -> Result<usize, DataError> {
        let (a, e) = self.span(i)?;
        Ok((e - a) as usize)
    }

    /// Sentence `i`'s ids.
    pub fn sentence(&self, i: usize) -> Result<Vec<u32>, DataError> {
        let (a, e) = self.span(i)?;
        let base = (HEADER + 8 * (self.sentences + 1)) as u64;
        let mut bytes = vec![0u8; (e - a) as usize * self.width];
        self.read_at(&mut bytes, base + a * self.width as u64)?;
        Ok(if self.width == 2 {
            bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
                .collect()
        } else {
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, sents: &[Vec<u32>], distinct: u64) {
        let mut w = StoreWriter::create(path, distinct).unwrap();
        for s in sents {
            w.push(s).unwrap();
        }
        w.finish().unwrap();
    }

    #[test]
    fn a_store_reads_back_what_was_written_and_refuses_damage() {
        let tmp = tempfile::tempdir().unwrap();
        let sents: Vec<Vec<u32>> = (0..500u32)
            .map(|i| (0..(i % 13)).map(|k| (i * 7 + k * 3) % 60_000).collect())
            .collect();
        for (name, distinct) in [("small", 60_000u64), ("wide", 100_000)] {
            let p = tmp.path().join(name);
            write(&p, &sents, distinct);
            assert!(
                !p.with_extension("ids.tmp").exists() && !p.with_extension("offsets.tmp").exists()
            );
            let (s, lengths) = TokenStore::open(&p).unwrap();
            assert_eq!(s.len(), 500);
            assert_eq!(
                lengths,
                sents.iter().map(|x| x.len() as u16).collect::<Vec<_>>()
            );
            for (i, want) in sents.iter().enumerate() {
                assert_eq!(&s.sentence(i).unwrap(), want, "{name} {i}");
                assert_eq!(s.sentence_len(i).unwrap(), want.len());
            }
        }
        let p = tmp.path().join("small");
        let bytes = std::fs::read(&p).unwrap();
        // Truncated.
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        let e = TokenStore::open(&p).unwrap_err().to_string();
        assert!(e.contains("truncated") && e.contains("small"), "{e}");
        // One id changed.
        let mut changed = bytes.clone();
        let last = changed.len() - 1;
        changed[last] ^= 1;
        std::fs::write(&p, &changed).unwrap();
        let e = TokenStore::open(&p).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
        // Not a store at all.
        std::fs::write(&p, b"hello").unwrap();
        assert!(TokenStore::open(&p).is_err());
        // Ids beyond the store's range are refused when written.
        let mut w = StoreWriter::create(&tmp.path().join("x"), 10).unwrap();
        assert!(w.push(&[3, 10]).is_err());
    }
}
