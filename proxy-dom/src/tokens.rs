//! Session tokens. The token file holds one token per line, optionally
//! followed by whitespace and a tenant name; blank lines and lines starting
//! with `#` are ignored. The file is read again at every Hello, so tokens can
//! be added and revoked while the proxy runs.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Token files larger than this are refused (a token file is a short list).
const MAX_FILE: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the token file {path} cannot be read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the token file {0} is larger than 1 MiB")]
    TooLarge(PathBuf),
}

/// Who a valid token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// The tenant name, or `line N` when the line names none.
    pub name: String,
}

/// Looks `token` up in the token file: `Ok(None)` when it is not listed.
pub fn lookup(path: &Path, token: &str) -> Result<Option<Tenant>, TokenError> {
    let read_err = |source| TokenError::Read {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(path).map_err(read_err)?;
    let mut text = String::new();
    f.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(read_err)?;
    if text.len() as u64 > MAX_FILE {
        return Err(TokenError::TooLarge(path.to_path_buf()));
    }
    Ok(find(&text, token))
}

fn find(text: &str, token: &str) -> Option<Tenant> {
    if token.is_empty() {
        return None;
    }
    let mut found = None;
    // Every line is compared (no early exit) so the time taken does not tell
    // which line matched.
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.splitn(2, char::is_whitespace);
        let listed = parts.next().unwrap_or("");
        if same(listed.as_bytes(), token.as_bytes()) && found.is_none() {
            let name = parts.next().map(str::trim).filter(|s| !s.is_empty());
            found = Some(Tenant {
                name: name.map_or_else(|| format!("line {}", n + 1), String::from),
            });
        }
    }
    found
}

/// Compares in time that depends only on the lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_with_and_without_tenants() {
        let text = "# tokens\n\nabc123 tenant-a\n  def456\tsecond tenant \nghi\n";
        assert_eq!(find(text, "abc123").unwrap().name, "tenant-a");
        assert_eq!(find(text, "def456").unwrap().name, "second tenant");
        assert_eq!(find(text, "ghi").unwrap().name, "line 5");
        assert_eq!(find(text, "abc"), None);
        assert_eq!(find(text, "# tokens"), None);
        assert_eq!(find(text, ""), None);
    }

    #[test]
    fn a_missing_file_is_an_error_not_an_empty_list() {
        assert!(matches!(
            lookup(Path::new("/nonexistent/crane-tokens"), "x"),
            Err(TokenError::Read { .. })
        ));
    }
}
