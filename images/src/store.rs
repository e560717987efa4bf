//! The package store under the cache directory: pinned .debs, checked against the lock,
//! unpacked with `dpkg -x` (one directory per package), and the [`Sysroot`] that looks
//! paths up across all of them as if they were installed together.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::apt::{self, AptError};
use crate::lock::LockedPackage;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Apt(#[from] AptError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "checksum mismatch for {file}: the lock says {expected}, the file has {actual}; \
         delete the file to fetch it again, or relock if the archive changed"
    )]
    Checksum {
        file: String,
        expected: String,
        actual: String,
    },
    #[error("`dpkg -x {deb}` failed: {stderr}")]
    Unpack { deb: String, stderr: String },
    #[error("{0} is not in any locked package")]
    NotFound(String),
    #[error("{0} has too many levels of symbolic links")]
    SymlinkLoop(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Lower-case hex SHA-256 of a file.
pub fn sha256_file(path: &Path) -> Result<String, StoreError> {
    let mut file = std::fs::File::open(path).map_err(io_err(path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// Where the store keeps its files.
#[derive(Debug, Clone)]
pub struct Store {
    pub cache_dir: PathBuf,
}

impl Store {
    pub fn new(cache_dir: impl Into<PathBuf>) -> Self {
        Self {
            cache_dir: cache_dir.into(),
        }
    }

    fn debs_dir(&self) -> PathBuf {
        self.cache_dir.join("debs")
    }

    fn unpacked_dir(&self, package: &LockedPackage) -> PathBuf {
        self.cache_dir
            .join("unpacked")
            .join(format!("{}_{}", package.name, &package.sha256[..16]))
    }

    /// The .deb for `package`, downloaded if missing and always checked against its
    /// locked checksum.
    pub fn fetch(&self, package: &LockedPackage) -> Result<PathBuf, StoreError> {
        let dir = self.debs_dir();
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let deb = dir.join(package.deb_file_name());
        if !deb.exists() {
            apt::ensure_updated(&self.cache_dir)?;
            // apt-get writes the .deb under its final name as it arrives, so
            // it downloads into a staging directory and the file moves into
            // place only once complete: an interrupted download (a killed
            // `cargo xtask test`, whose prefetch runs beside the other tiers)
            // leaves nothing that looks fetched and fails its checksum forever.
            let staging = dir.join(format!("partial-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&staging);
            std::fs::create_dir_all(&staging).map_err(io_err(&staging))?;
            let fetched = apt::download(package, &staging).or_else(|_| {
                // The package lists may predate the lock: refresh them once and retry.
                apt::update(&self.cache_dir)?;
                apt::download(package, &staging)
            });
            let moved = fetched.map_err(StoreError::from).and_then(|()| {
                let got = staging.join(package.deb_file_name());
                std::fs::rename(&got, &deb).map_err(io_err(&got))
            });
            let _ = std::fs::remove_dir_all(&staging);
            moved?;
        }
        let actual = sha256_file(&deb)?;
        if actual != package.sha256 {
            return Err(StoreError::Checksum {
                file: deb.display().to_string(),
                expected: package.sha256.clone(),
                actual,
            });
        }
        Ok(deb)
    }

    /// The directory `package` is unpacked in (fetching and unpacking it when needed).
    pub fn unpack(&self, package: &LockedPackage) -> Result<PathBuf, StoreError> {
        let target = self.unpacked_dir(package);
        let mut done = target.clone().into_os_string();
        done.push(".done");
        let done = PathBuf::from(done);
        if done.exists() {
            return Ok(target);
        }
        let deb = self.fetch(package)?;
        if target.exists() {
            std::fs::remove_dir_all(&target).map_err(io_err(&target))?;
        }
        std::fs::create_dir_all(&target).map_err(io_err(&target))?;
        let output = Command::new("dpkg")
            .arg("-x")
            .arg(&deb)
            .arg(&target)
            .output()
            .map_err(io_err(&deb))?;
        if !output.status.success() {
            return Err(StoreError::Unpack {
                deb: deb.display().to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        std::fs::write(&done, b"").map_err(io_err(&done))?;
        Ok(target)
    }

    /// Unpacks all `packages` and indexes their files into one [`Sysroot`].
    pub fn sysroot(&self, packages: &[LockedPackage]) -> Result<Sysroot, StoreError> {
        let mut sysroot = Sysroot::default();
        for package in packages {
            let dir = self.unpack(package)?;
            sysroot.add_package(&package.name, &dir)?;
        }
        Ok(sysroot)
    }
}

/// What one absolute path is in the union of the unpacked packages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    File { source: PathBuf, mode: u32 },
    Symlink { target: PathBuf },
}

/// A node and the package that supplied it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub node: Node,
    pub package: String,
}

/// The files of several unpacked packages, looked up by their absolute installed path.
/// When two packages ship the same path, the first one added wins (like dpkg refusing
/// the second, but without failing the build over identical copies).
#[derive(Debug, Default)]
pub struct Sysroot {
    entries: BTreeMap<PathBuf, Entry>,
}

impl Sysroot {
    pub fn add_package(&mut self, package: &str, dir: &Path) -> Result<(), StoreError> {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(current) = stack.pop() {
            let read = std::fs::read_dir(&current).map_err(io_err(&current))?;
            for item in read {
                let item = item.map_err(io_err(&current))?;
                let path = item.path();
                let meta = std::fs::symlink_metadata(&path).map_err(io_err(&path))?;
                let installed = Path::new("/").join(path.strip_prefix(dir).unwrap_or(&path));
                let node = if meta.file_type().is_symlink() {
                    Node::Symlink {
                        target: std::fs::read_link(&path).map_err(io_err(&path))?,
                    }
                } else if meta.is_dir() {
                    stack.push(path.clone());
                    Node::Dir
                } else {
                    use std::os::unix::fs::PermissionsExt;
                    Node::File {
                        source: path.clone(),
                        mode: meta.permissions().mode() & 0o7777,
                    }
                };
                self.entries.entry(installed).or_insert(Entry {
                    node,
                    package: package.to_owned(),
                });
            }
        }
        Ok(())
    }

    pub fn entry(&self, path: &Path) -> Option<&Entry> {
        self.entries.get(path)
    }

    /// All installed paths under `dir` (not following symlinks), in order.
    pub fn walk<'a>(
        &'a self,
        dir: &'a Path,
    ) -> impl Iterator<Item = (&'a PathBuf, &'a Entry)> + 'a {
        self.entries
            .range(dir.to_path_buf()..)
            .take_while(move |(p, _)| p.starts_with(dir))
    }

    /// Follows symlinks (in every component) until `path` names a file or directory.
    /// Returns the chain of symlinks passed through, then the final path.
    pub fn resolve(&self, path: &Path) -> Result<(Vec<PathBuf>, PathBuf), StoreError> {
        let mut links = Vec::new();
        let mut pending: Vec<PathBuf> = vec![normalize(path)];
        for _ in 0..40 {
            let Some(current) = pending.pop() else { break };
            let mut prefix = PathBuf::from("/");
            let mut redirected = false;
            let components: Vec<_> = current.components().skip(1).collect();
            for (i, component) in components.iter().enumerate() {
                prefix.push(component);
                match self.entries.get(&prefix).map(|e| &e.node) {
                    Some(Node::Symlink { target }) => {
                        links.push(prefix.clone());
                        let base = prefix.parent().unwrap_or(Path::new("/"));
                        let mut next = normalize(&base.join(target));
                        for rest in &components[i + 1..] {
                            next.push(rest);
                        }
                        pending.push(normalize(&next));
                        redirected = true;
                        break;
                    }
                    Some(_) => {}
                    None => return Err(StoreError::NotFound(path.display().to_string())),
                }
            }
            if !redirected {
                return Ok((links, prefix));
            }
        }
        Err(StoreError::SymlinkLoop(path.display().to_string()))
    }
}

/// Makes `path` absolute and removes `.` and `..` without touching the file system.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(c) => out.push(c),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_symlinks_across_packages() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(a.path().join("lib/x86_64-linux-gnu")).unwrap();
        std::fs::write(a.path().join("lib/x86_64-linux-gnu/libz.so.1.2.13"), b"z").unwrap();
        std::os::unix::fs::symlink(
            "libz.so.1.2.13",
            a.path().join("lib/x86_64-linux-gnu/libz.so.1"),
        )
        .unwrap();
        std::fs::create_dir_all(b.path().join("lib64")).unwrap();
        std::os::unix::fs::symlink("/lib/x86_64-linux-gnu/libz.so.1", b.path().join("lib64/z"))
            .unwrap();
        let mut root = Sysroot::default();
        root.add_package("a", a.path()).unwrap();
        root.add_package("b", b.path()).unwrap();
        let (links, target) = root.resolve(Path::new("/lib64/z")).unwrap();
        assert_eq!(target, Path::new("/lib/x86_64-linux-gnu/libz.so.1.2.13"));
        assert_eq!(
            links,
            vec![
                PathBuf::from("/lib64/z"),
                PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1")
            ]
        );
        assert_eq!(root.entry(&target).unwrap().package, "a");
        assert!(matches!(
            root.resolve(Path::new("/nope")),
            Err(StoreError::NotFound(_))
        ));
    }

    #[test]
    fn checksums_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"abc").unwrap();
        assert_eq!(
            sha256_file(&f).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
