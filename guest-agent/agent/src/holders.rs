//! Who still holds the GPU: processes with a GPU device file open
//! (`/proc/PID/fd`) or mapped (`/proc/PID/maps`). The module unload would fail
//! on them anyway; finding them first names the culprit in the report.

use std::fmt;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub comm: String,
    pub path: String,
    /// `fd` or `map`.
    pub how: &'static str,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} ({}) has {} {}",
            self.pid,
            self.comm,
            if self.how == "fd" { "open" } else { "mapped" },
            self.path
        )
    }
}

fn matches(path: &str, prefixes: &[String]) -> bool {
    prefixes.iter().any(|p| path.starts_with(p.as_str()))
}

/// Scans every process under `proc_root` except `skip_pid`. Processes that
/// vanish or cannot be read while scanning are passed over.
pub fn scan(proc_root: &Path, prefixes: &[String], skip_pid: u32) -> Vec<Holder> {
    let mut out = Vec::new();
    if prefixes.is_empty() {
        return out;
    }
    let Ok(rd) = std::fs::read_dir(proc_root) else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == skip_pid {
            continue;
        }
        let dir = e.path();
        let comm = std::fs::read_to_string(dir.join("comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let before = out.len();
        if let Ok(fds) = std::fs::read_dir(dir.join("fd")) {
            for fd in fds.flatten() {
                if let Ok(target) = std::fs::read_link(fd.path()) {
                    let t = target.to_string_lossy();
                    if matches(&t, prefixes) {
                        out.push(Holder {
                            pid,
                            comm: comm.clone(),
                            path: t.into_owned(),
                            how: "fd",
                        });
                    }
                }
            }
        }
        if out.len() == before
            && let Ok(maps) = std::fs::read_to_string(dir.join("maps"))
        {
            // The path is the sixth column and may contain spaces.
            if let Some(p) = maps
                .lines()
                .filter_map(|l| l.split_whitespace().nth(5).map(|_| l))
                .filter_map(|l| l.find(" /").map(|i| l[i + 1..].trim_end()))
                .find(|p| matches(p, prefixes))
            {
                out.push(Holder {
                    pid,
                    comm,
                    path: p.to_string(),
                    how: "map",
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A real process holding a file under a fake device prefix is found; the
    /// scanner skips the pid it is told to.
    #[test]
    fn finds_a_process_holding_a_device_file() {
        let dir = std::env::temp_dir().join(format!("crane-holders-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dev = dir.join("fakegpu0");
        std::fs::write(&dev, b"").unwrap();
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "exec 3<'{}'; echo ready; exec sleep 30",
                dev.display()
            ))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let prefixes = vec![dir.join("fakegpu").to_string_lossy().into_owned()];
        let found = scan(Path::new("/proc"), &prefixes, 0);
        let _ = child.kill();
        let _ = child.wait();
        let h = found
            .iter()
            .find(|h| h.pid == child.id())
            .unwrap_or_else(|| panic!("holder not found in {found:?}"));
        assert_eq!(h.how, "fd");
        assert!(h.path.ends_with("fakegpu0"));
        assert!(h.to_string().contains("has open"));
        assert!(
            scan(Path::new("/proc"), &prefixes, 0)
                .iter()
                .all(|h| h.pid != child.id())
        );
        assert!(scan(Path::new("/proc"), &[], 0).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
