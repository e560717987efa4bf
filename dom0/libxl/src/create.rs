//! Domain creation through the real `xl create`. libxl creates domains from a
//! `libxl_domain_config`, and filling one from an xl configuration file is
//! what most of xl does (`parse_config_data` in xl_parse.c, thousands of
//! lines over libxlutil); running xl itself gives exactly xl's semantics for
//! the proxy domain's configuration. Everything else craned does goes through
//! libxl. The xl run here must be the real one, never crane's wrapper (which
//! would pass `create` through anyway, at the cost of a detour).

use std::path::Path;
use std::process::Command;

use crate::error::LibxlError;

/// Runs `XL create [-p] CONFIG` and waits for it; xl returns once the domain
/// is built and unpaused, or with `paused` built and left paused (it does not
/// attach to the console without `-c`).
pub fn xl_create(xl: &Path, config: &Path, paused: bool) -> Result<(), LibxlError> {
    let fail = |why: String| LibxlError::Create {
        config: config.display().to_string(),
        why,
    };
    let out = Command::new(xl)
        .arg("create")
        .args(paused.then_some("-p"))
        .arg(config)
        .output()
        .map_err(|e| fail(format!("cannot run {}: {e}", xl.display())))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(fail(format!(
        "{} exited with {}: {}",
        xl.display(),
        out.status,
        tail.join(" / ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_xl_failure_with_its_last_lines() {
        let dir = std::env::temp_dir().join(format!("crane-libxl-create-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("xl");
        std::fs::write(
            &fake,
            "#!/bin/sh\n[ \"$1\" = create ] || exit 9\necho \"Parsing config from $2\" >&2\necho 'bad thing' >&2\nexit 3\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = xl_create(&fake, Path::new("/etc/xen/p.cfg"), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/etc/xen/p.cfg"), "{e}");
        assert!(e.contains("exit status: 3"), "{e}");
        assert!(
            e.contains("Parsing config from /etc/xen/p.cfg / bad thing"),
            "{e}"
        );
        // Paused: `-p` comes before the configuration.
        std::fs::write(
            &fake,
            "#!/bin/sh\n[ \"$1 $2 $3\" = 'create -p /etc/xen/p.cfg' ] || exit 4\n",
        )
        .unwrap();
        xl_create(&fake, Path::new("/etc/xen/p.cfg"), true).unwrap();
        let e = xl_create(&fake, Path::new("/etc/xen/p.cfg"), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("exit status: 4"), "{e}");
        let e = xl_create(&dir.join("missing"), Path::new("c"), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot run"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
