//! The lock file: the exact Debian packages (name, version, architecture, SHA-256 of
//! the .deb) that every image is made of.
//!
//! Builds only ever fetch what the lock names and refuse a .deb whose checksum differs,
//! so two builds from the same lock produce the same images. `relock` (see
//! [`crate::relock`]) is the only thing that writes it.

use std::fmt::Write as _;
use std::path::Path;

/// One pinned Debian package.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LockedPackage {
    pub name: String,
    pub version: String,
    pub arch: String,
    /// Lower-case hex SHA-256 of the .deb file, as Debian's `Packages` index gives it.
    pub sha256: String,
}

impl LockedPackage {
    /// The file name `apt-get download` gives this package (':' in the epoch is
    /// written `%3a`).
    pub fn deb_file_name(&self) -> String {
        format!(
            "{}_{}_{}.deb",
            self.name,
            self.version.replace(':', "%3a"),
            self.arch
        )
    }
}

/// The parsed lock file, sorted by package name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lockfile {
    pub packages: Vec<LockedPackage>,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot read the lock file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write the lock file {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("line {line} of the lock file is not `name version arch sha256`: {text:?}")]
    Syntax { line: usize, text: String },
    #[error("the lock file names package {0} twice")]
    Duplicate(String),
    #[error("the lock file has no entry for package {0}; run `cargo xtask testbed lock`")]
    Missing(String),
}

const HEADER: &str = "\
# Debian packages that the crane images are built from: name version arch sha256.
# Written by `cargo xtask testbed lock`; builds fetch exactly these and check each checksum.
";

impl Lockfile {
    pub fn parse(text: &str) -> Result<Self, LockError> {
        let mut packages = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, version, arch, sha256] = fields[..] else {
                return Err(LockError::Syntax {
                    line: index + 1,
                    text: raw.to_owned(),
                });
            };
            if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(LockError::Syntax {
                    line: index + 1,
                    text: raw.to_owned(),
                });
            }
            packages.push(LockedPackage {
                name: name.to_owned(),
                version: version.to_owned(),
                arch: arch.to_owned(),
                sha256: sha256.to_ascii_lowercase(),
            });
        }
        Self::from_packages(packages)
    }

    pub fn from_packages(mut packages: Vec<LockedPackage>) -> Result<Self, LockError> {
        packages.sort();
        for pair in packages.windows(2) {
            if pair[0].name == pair[1].name {
                return Err(LockError::Duplicate(pair[0].name.clone()));
            }
        }
        Ok(Self { packages })
    }

    pub fn load(path: &Path) -> Result<Self, LockError> {
        let text = std::fs::read_to_string(path).map_err(|source| LockError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    pub fn render(&self) -> String {
        let mut out = String::from(HEADER);
        for p in &self.packages {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "{} {} {} {}", p.name, p.version, p.arch, p.sha256);
        }
        out
    }

    pub fn save(&self, path: &Path) -> Result<(), LockError> {
        std::fs::write(path, self.render()).map_err(|source| LockError::Write {
            path: path.display().to_string(),
            source,
        })
    }

    pub fn get(&self, name: &str) -> Result<&LockedPackage, LockError> {
        self.packages
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| LockError::Missing(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    #[test]
    fn round_trips_and_sorts() {
        let text =
            format!("# c\nzlib1g 1:1.2.13 amd64 {SHA}\nbusybox-static 1:1.35.0-4 amd64 {SHA}\n");
        let lock = Lockfile::parse(&text).unwrap();
        assert_eq!(lock.packages[0].name, "busybox-static");
        assert_eq!(Lockfile::parse(&lock.render()).unwrap(), lock);
        assert_eq!(
            lock.get("zlib1g").unwrap().deb_file_name(),
            "zlib1g_1%3a1.2.13_amd64.deb"
        );
    }

    #[test]
    fn rejects_bad_lines_and_duplicates() {
        assert!(matches!(
            Lockfile::parse("a 1 amd64 nothex"),
            Err(LockError::Syntax { line: 1, .. })
        ));
        let dup = format!("a 1 amd64 {SHA}\na 2 amd64 {SHA}\n");
        assert!(matches!(
            Lockfile::parse(&dup),
            Err(LockError::Duplicate(_))
        ));
        assert!(matches!(
            Lockfile::default().get("x"),
            Err(LockError::Missing(_))
        ));
    }
}
