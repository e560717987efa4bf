//! The migration notice: while a migration is under way the guest agent keeps
//! `$CRANE_RUN_DIR/migration`, so a process that starts interposing then
//! begins in the mode the others were switched to instead of opening the GPU
//! that is about to go away (docs/control-protocol.md).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The notice's name in the run directory.
pub const NOTICE_FILE: &str = "migration";

/// Largest notice a reader accepts.
pub const MAX_NOTICE: u64 = 4096;

/// What a process starting now must do; JSON, one object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "mode", rename_all = "kebab-case")]
pub enum MigrationNotice {
    /// Forward OpenCL calls to crane-proxy at `proxy` with `token`.
    Remote {
        proxy: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
    },
    /// Hold OpenCL calls (as if suspended) until the notice is gone.
    Suspended,
}

pub fn notice_path(run_dir: &Path) -> PathBuf {
    run_dir.join(NOTICE_FILE)
}

/// Writes the notice atomically (temporary file, then rename). Mode 0644:
/// interposed processes run as any user; the proxy token is the guest's, not
/// a user's.
pub fn write_notice(run_dir: &Path, notice: &MigrationNotice) -> std::io::Result<()> {
    std::fs::create_dir_all(run_dir)?;
    let tmp = run_dir.join(format!(".{NOTICE_FILE}.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    let mut body = serde_json::to_vec(notice).map_err(std::io::Error::other)?;
    body.push(b'\n');
    f.write_all(&body)?;
    f.sync_all()?;
    std::fs::rename(&tmp, notice_path(run_dir))
}

/// The notice, if one is there and valid.
pub fn read_notice(run_dir: &Path) -> Option<MigrationNotice> {
    use std::io::Read;
    let f = std::fs::File::open(notice_path(run_dir)).ok()?;
    let mut s = String::new();
    f.take(MAX_NOTICE).read_to_string(&mut s).ok()?;
    serde_json::from_str(&s).ok()
}

/// Removes the notice (no error when there is none).
pub fn clear_notice(run_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(notice_path(run_dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notice_round_trip() {
        let d = std::env::temp_dir().join(format!("crane-notice-{}", std::process::id()));
        let n = MigrationNotice::Remote {
            proxy: "tcp://10.77.0.2:7000".into(),
            token: Some("t".into()),
        };
        write_notice(&d, &n).unwrap();
        assert_eq!(read_notice(&d), Some(n));
        assert_eq!(
            std::fs::read_to_string(notice_path(&d)).unwrap(),
            "{\"mode\":\"remote\",\"proxy\":\"tcp://10.77.0.2:7000\",\"token\":\"t\"}\n"
        );
        write_notice(&d, &MigrationNotice::Suspended).unwrap();
        assert_eq!(read_notice(&d), Some(MigrationNotice::Suspended));
        clear_notice(&d).unwrap();
        clear_notice(&d).unwrap();
        assert_eq!(read_notice(&d), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
