//! `/etc/crane/agent.toml`: every key is optional; the defaults below are the
//! documented ones (docs/xenstore-layout.md, "Agent configuration").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub const DEFAULT_CONFIG: &str = "/etc/crane/agent.toml";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("{path}: {why}")]
    Invalid { path: PathBuf, why: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where interposed processes have their sockets (`apps/<pid>.sock`) and
    /// where the migration notice goes; `CRANE_RUN_DIR` when unset, else
    /// `/run/crane`.
    pub run_dir: PathBuf,
    /// A request's deadline when it carries none.
    pub default_deadline_ms: u64,
    /// How long past the deadline a process may take to report its own
    /// deadline error before it counts as not answering.
    pub answer_grace_ms: u64,
    /// How long a rollback may take per process.
    pub rollback_timeout_ms: u64,
    /// Before prepare-migrate stops the processes, pre-copy their device
    /// memory while they run on (`cranectl precopy`), so that the stop reads
    /// only what they changed since; for a live migration also to
    /// crane-proxy (`cranectl remote --precopy`), so that the move sends
    /// only that, and back from it after the migration (`cranectl local
    /// --precopy`: the local vendor made ready and what the proxy changed
    /// read while the process runs on there).
    pub precopy: bool,
    /// The most rounds of a pre-copy to or from crane-proxy (each moves
    /// what the process changed during the one before).
    pub precopy_rounds: u32,
    pub modules: ModulesConfig,
    pub device: DeviceConfig,
    pub standalone: StandaloneConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModulesConfig {
    /// GPU kernel modules to unload, in this order (and load in reverse).
    pub unload: Vec<String>,
    /// Directory holding `<release>/modules.dep`; the running kernel's release
    /// is appended.
    pub root: PathBuf,
    /// Parameters passed when loading a module.
    pub params: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceConfig {
    /// Path prefixes of GPU device files: a process with one of these open or
    /// mapped holds the GPU.
    pub holders: Vec<String>,
    /// Device nodes that must exist and open before the GPU counts as usable
    /// on prepare-resume.
    pub wait_for: Vec<PathBuf>,
    /// A command that must exit 0 before the GPU counts as usable (e.g. a tiny
    /// OpenCL device query); empty: none.
    pub probe_command: Vec<String>,
    /// How long one run of the probe command may take.
    pub probe_timeout_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StandaloneConfig {
    /// The domid the agent plays in its in-process XenStore.
    pub domid: u16,
    /// cranectl's socket; `<run_dir>/agent.sock` when unset.
    pub socket: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            run_dir: crane_control::run_dir_from_env(),
            default_deadline_ms: 30_000,
            answer_grace_ms: 2_000,
            rollback_timeout_ms: 60_000,
            precopy: true,
            precopy_rounds: 4,
            modules: ModulesConfig::default(),
            device: DeviceConfig::default(),
            standalone: StandaloneConfig::default(),
        }
    }
}

impl Default for ModulesConfig {
    fn default() -> Self {
        ModulesConfig {
            unload: ["nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia"]
                .map(String::from)
                .to_vec(),
            root: PathBuf::from("/lib/modules"),
            params: BTreeMap::new(),
        }
    }
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            holders: ["/dev/nvidia", "/dev/dri/", "/dev/kfd"]
                .map(String::from)
                .to_vec(),
            wait_for: vec![PathBuf::from("/dev/nvidiactl")],
            probe_command: Vec::new(),
            probe_timeout_ms: 10_000,
        }
    }
}

impl Default for StandaloneConfig {
    fn default() -> Self {
        StandaloneConfig {
            domid: 1,
            socket: None,
        }
    }
}

impl Config {
    /// Reads a config file; a missing file at the default path gives the
    /// defaults, a missing file named explicitly is an error.
    pub fn load(path: &Path, explicit: bool) -> Result<Config, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                return Ok(Config::default());
            }
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        Config::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |why: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            why,
        };
        if !(1..=crane_xs::message::MAX_DEADLINE_MS).contains(&cfg.default_deadline_ms) {
            return Err(invalid("default_deadline_ms must be 1 to 3600000".into()));
        }
        for m in &cfg.modules.unload {
            if m.is_empty()
                || !m
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(invalid(format!("{m:?} is not a module name")));
            }
        }
        if cfg.device.holders.iter().any(|h| !h.starts_with('/')) {
            return Err(invalid(
                "device.holders must be absolute path prefixes".into(),
            ));
        }
        Ok(cfg)
    }

    pub fn standalone_socket(&self) -> PathBuf {
        self.standalone
            .socket
            .clone()
            .unwrap_or_else(|| self.run_dir.join("agent.sock"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c = Config::parse("", Path::new("t")).unwrap();
        assert_eq!(c.modules.unload[0], "nvidia_uvm");
        assert_eq!(c.default_deadline_ms, 30_000);
        let c = Config::parse(
            "run_dir = \"/tmp/x\"\n[modules]\nunload = []\n[device]\nwait_for = []\nprobe_command = [\"clinfo\", \"-l\"]\n",
            Path::new("t"),
        )
        .unwrap();
        assert!(c.modules.unload.is_empty());
        assert_eq!(c.standalone_socket(), PathBuf::from("/tmp/x/agent.sock"));
        assert_eq!(c.device.probe_command, ["clinfo", "-l"]);
    }

    #[test]
    fn bad_configs_say_why() {
        for (text, want) in [
            ("deadline = 3", "unknown field"),
            ("default_deadline_ms = 0", "1 to 3600000"),
            ("[modules]\nunload = [\"a b\"]", "not a module name"),
            ("[device]\nholders = [\"dev\"]", "absolute"),
        ] {
            let e = Config::parse(text, Path::new("t")).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        assert!(Config::load(Path::new("/nonexistent/agent.toml"), false).is_ok());
        assert!(Config::load(Path::new("/nonexistent/agent.toml"), true).is_err());
    }
}
