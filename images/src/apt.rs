//! Debian's package tools, driven as ordinary clients: `apt-get update` (once),
//! `apt-get install` for the build machine's own tools, `apt-cache` to resolve
//! versions and checksums when relocking, and `apt-get download` to fetch pinned .debs.
//!
//! Nothing here installs image contents on the build machine: .debs are only
//! downloaded and unpacked with `dpkg -x` (see [`crate::store`]).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use crate::lock::LockedPackage;

#[derive(Debug, thiserror::Error)]
pub enum AptError {
    #[error("cannot start `{command}`: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("cannot write the apt stamp {path}: {source}")]
    Stamp {
        path: String,
        source: std::io::Error,
    },
    #[error("apt-cache knows no installable version of package {0}")]
    NoCandidate(String),
}

fn run(command: &mut Command) -> Result<String, AptError> {
    let rendered = format!("{command:?}");
    let output = command.output().map_err(|source| AptError::Spawn {
        command: rendered.clone(),
        source,
    })?;
    if !output.status.success() {
        return Err(AptError::Failed {
            command: rendered,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `apt-get update` unless this cache directory already saw one: builds must work
/// on a fresh machine whose package lists are empty, but one update per cache is enough.
pub fn ensure_updated(cache_dir: &Path) -> Result<(), AptError> {
    if cache_dir.join(STAMP).exists() {
        return Ok(());
    }
    update(cache_dir)
}

const STAMP: &str = "apt-updated.stamp";

/// Runs `apt-get update` and records that it ran for this cache directory.
pub fn update(cache_dir: &Path) -> Result<(), AptError> {
    let stamp = cache_dir.join(STAMP);
    eprintln!("images: apt-get update");
    run(Command::new("apt-get").args(["update", "-q"]))?;
    std::fs::create_dir_all(cache_dir)
        .and_then(|()| std::fs::write(&stamp, b"apt-get update done\n"))
        .map_err(|source| AptError::Stamp {
            path: stamp.display().to_string(),
            source,
        })
}

/// Installs tools the build machine itself runs (QEMU, dpkg-deb, ...) when `probe` is
/// missing from the machine.
pub fn ensure_host_tool(cache_dir: &Path, probe: &Path, packages: &[&str]) -> Result<(), AptError> {
    if probe.exists() {
        return Ok(());
    }
    ensure_updated(cache_dir)?;
    eprintln!("images: apt-get install {}", packages.join(" "));
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    Ok(())
}

/// Downloads one pinned package into `dir` (the caller checks its checksum).
pub fn download(package: &LockedPackage, dir: &Path) -> Result<(), AptError> {
    run(Command::new("apt-get")
        .args(["download", "-q"])
        .arg(format!(
            "{}:{}={}",
            package.name, package.arch, package.version
        ))
        .current_dir(dir))?;
    Ok(())
}

/// The package's current candidate in the configured archive, with its checksum.
pub fn candidate(name: &str) -> Result<LockedPackage, AptError> {
    let text = run(Command::new("apt-cache").args(["show", "--no-all-versions", name]))?;
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_owned()))
    };
    match (field("Version:"), field("Architecture:"), field("SHA256:")) {
        (Some(version), Some(arch), Some(sha256)) => Ok(LockedPackage {
            name: name.to_owned(),
            version,
            arch,
            sha256,
        }),
        _ => Err(AptError::NoCandidate(name.to_owned())),
    }
}

/// Every package that `roots` depend on, recursively (hard dependencies only), keeping
/// those that can carry shared libraries. A superset: relocking prunes it down to the
/// packages whose files an image really contains.
pub fn library_closure(roots: &BTreeSet<String>) -> Result<BTreeSet<String>, AptError> {
    let text = run(Command::new("apt-cache")
        .args([
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
        ])
        .args(roots))?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.starts_with('<'))
        .map(str::trim)
        .filter(|n| {
            (n.starts_with("lib") || *n == "zlib1g")
                && !n.ends_with("-dev")
                && !n.ends_with("-bin")
                && !n.ends_with("-common")
        })
        .map(str::to_owned)
        .collect())
}

/// The versioned kernel package (`linux-image-6.1.0-N-amd64`) that Debian's kernel
/// meta-package currently depends on.
pub fn kernel_package(meta: &str) -> Result<String, AptError> {
    let text = run(Command::new("apt-cache").args(["depends", meta]))?;
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .map(str::trim)
        .find(|n| n.starts_with("linux-image-") && !n.starts_with('<'))
        .map(str::to_owned)
        .ok_or_else(|| AptError::NoCandidate(meta.to_owned()))
}
