//! Proxy session tokens. Every host's craned derives the same token for a
//! guest from a shared secret, HMAC-SHA256(secret, "GUEST:EPOCH") in hex, so
//! the host that runs the proxy domain can publish it (crane_xs::proxy) and
//! the host a guest migrates from can hand it to the guest, without the two
//! talking to each other.

use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read the token secret {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the token secret {0} is shorter than 16 bytes")]
    TooShort(PathBuf),
}

/// The token of `guest` for `epoch`: 64 hex digits.
pub fn derive(secret: &[u8], guest: &str, epoch: u64) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(format!("{guest}:{epoch}").as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Reads the secret (trailing whitespace dropped). `None` when the file does
/// not exist: remote mode is then refused, stop-and-copy still works.
pub fn load_secret(path: &Path) -> Result<Option<Vec<u8>>, SecretError> {
    let mut bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(SecretError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    while bytes.last().is_some_and(|b| b.is_ascii_whitespace()) {
        bytes.pop();
    }
    if bytes.len() < 16 {
        return Err(SecretError::TooShort(path.to_path_buf()));
    }
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_hmac_sha256_hex_and_differ_per_guest_and_epoch() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let t = derive(b"0123456789abcdef", "gpuguest", 1);
        assert_eq!(t.len(), 64);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(t, derive(b"0123456789abcdef", "gpuguest", 1));
        assert_ne!(t, derive(b"0123456789abcdef", "gpuguest", 2));
        assert_ne!(t, derive(b"0123456789abcdef", "other", 1));
        assert_ne!(t, derive(b"another secret!!", "gpuguest", 1));
        crane_xs::message::validate_token(&t).unwrap();
    }

    #[test]
    fn secrets_are_read_trimmed_and_checked() {
        let dir = std::env::temp_dir().join(format!("craned-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s");
        assert!(load_secret(&p).unwrap().is_none());
        std::fs::write(&p, "0123456789abcdef\n").unwrap();
        assert_eq!(load_secret(&p).unwrap().unwrap(), b"0123456789abcdef");
        std::fs::write(&p, "short\n").unwrap();
        assert!(load_secret(&p).unwrap_err().to_string().contains("shorter"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
