//! Reading plain UTF-8 text files, one segment per line.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::EvalError;

/// Splits raw bytes into lines (on `\n`; a trailing `\r` is removed; a final newline does not
/// start an extra empty line) and decodes each as UTF-8.
///
/// `name` is used in error messages. Invalid UTF-8 gives [`EvalError::InvalidUtf8`] naming the
/// 1-based line.
pub fn lines_from_bytes(bytes: &[u8], name: &Path) -> Result<Vec<String>, EvalError> {
    let mut out = Vec::new();
    if bytes.is_empty() {
        return Ok(out);
    }
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    for (idx, raw) in body.split(|&b| b == b'\n').enumerate() {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        match std::str::from_utf8(raw) {
            Ok(s) => out.push(s.to_string()),
            Err(e) => {
                return Err(EvalError::InvalidUtf8 {
                    path: name.to_path_buf(),
                    line: idx + 1,
                    detail: e.to_string(),
                })
            }
        }
    }
    Ok(out)
}

/// Reads a UTF-8 text file into lines (see [`lines_from_bytes`]).
pub fn read_lines(path: &Path) -> Result<Vec<String>, EvalError> {
    let bytes = std::fs::read(path).map_err(|source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    lines_from_bytes(&bytes, path)
}

/// Like [`read_lines`] but an empty file is an error ([`EvalError::EmptyFile`]).
pub fn read_nonempty_lines(path: &Path) -> Result<Vec<String>, EvalError> {
    let lines = read_lines(path)?;
    if lines.is_empty() {
        return Err(EvalError::EmptyFile {
            path: path.to_path_buf(),
        });
    }
    Ok(lines)
}

/// Reads all of standard input into lines; errors name `<stdin>`.
pub fn read_stdin_lines() -> Result<Vec<String>, EvalError> {
    let name = PathBuf::from("<stdin>");
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .map_err(|source| EvalError::Io {
            path: name.clone(),
            source,
        })?;
    lines_from_bytes(&bytes, &name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_lines_and_reports_bad_utf8() {
        let p = Path::new("x.txt");
        assert_eq!(lines_from_bytes(b"a\nb\r\n", p).unwrap(), vec!["a", "b"]);
        assert_eq!(lines_from_bytes(b"a\n\nb", p).unwrap(), vec!["a", "", "b"]);
        assert_eq!(lines_from_bytes(b"\n", p).unwrap(), vec![""]);
        assert!(lines_from_bytes(b"", p).unwrap().is_empty());
        let err = lines_from_bytes(b"ok\nbad \xff\n", p).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("x.txt:2"), "{msg}");
    }
}
