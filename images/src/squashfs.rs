//! Read-only disk images for domUs: a tree of locked files packed with `mksquashfs`
//! (Debian's squashfs-tools on the build machine), reproducibly: every file owned by
//! root, every time 0, no extended attributes.
//!
//! Large, rarely changing contents (PoCL with LLVM: 260 MB) live on such a disk rather
//! than in a domU's initramfs: an initramfs sits whole in the domU's memory, which a
//! live migration copies, and an HVM guest's firmware loads it through emulated I/O
//! ports, which takes many minutes for 100 MB under software emulation.

use std::path::Path;
use std::process::Command;

use crate::apt::{self, AptError};

/// The program that packs the trees.
pub const MKSQUASHFS: &str = "/usr/bin/mksquashfs";

#[derive(Debug, thiserror::Error)]
pub enum SquashfsError {
    #[error("installing squashfs-tools: {0}")]
    Install(#[from] AptError),
    #[error("cannot run {MKSQUASHFS}: {0}")]
    Spawn(std::io::Error),
    #[error("mksquashfs failed ({status}): {stderr}")]
    Failed {
        status: std::process::ExitStatus,
        stderr: String,
    },
}

/// The arguments after `mksquashfs TREE OUT`. zstd decompresses fastest of the
/// compressors the domU kernel has built in; level 6 packs 260 MB in seconds.
pub fn options() -> Vec<&'static str> {
    vec![
        "-noappend",
        "-reproducible",
        "-all-root",
        "-all-time",
        "0",
        "-mkfs-time",
        "0",
        "-no-xattrs",
        "-comp",
        "zstd",
        "-Xcompression-level",
        "6",
        "-quiet",
        "-no-progress",
    ]
}

/// Packs `tree` into the squashfs image `out`, installing squashfs-tools if needed.
pub fn pack(cache_dir: &Path, tree: &Path, out: &Path) -> Result<(), SquashfsError> {
    apt::ensure_host_tool(cache_dir, Path::new(MKSQUASHFS), &["squashfs-tools"])?;
    let output = Command::new(MKSQUASHFS)
        .arg(tree)
        .arg(out)
        .args(options())
        .output()
        .map_err(SquashfsError::Spawn)?;
    if !output.status.success() {
        return Err(SquashfsError::Failed {
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(())
}
