//! `/etc/crane/craned.toml`. Every key has a default (dist/craned.toml lists
//! them, and a test keeps that file equal to the code); unknown keys are
//! errors. docs/operations.md ("Running craned") describes each.

use std::path::{Path, PathBuf};

use crane_libxl::PciAddr;
use crane_xs::layout::valid_element;
use serde::Deserialize;

pub const DEFAULT_CONFIG: &str = "/etc/crane/craned.toml";

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

/// What the destination does when a guest arrives and no GPU is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoFreeGpu {
    /// Accept the guest; its processes stay on the proxy (or parked) and
    /// craned attaches a GPU as soon as one frees.
    Wait,
    /// Refuse the incoming migration before it starts (the xl wrapper asks
    /// before running `xl migrate-receive`), so the guest stays at the source.
    Refuse,
    /// Accept the guest; its processes carry on on the guest's own CPU
    /// OpenCL device (the agent loads no GPU driver) and move back onto a GPU
    /// as soon as craned can attach one.
    Cpu,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The control socket (mode 0600).
    pub socket: PathBuf,
    /// The real xl, which craned runs for `xl create` (never the wrapper).
    pub xl: PathBuf,
    /// The GPU guests crane manages, by domain name.
    pub guests: Vec<String>,
    pub no_free_gpu: NoFreeGpu,
    /// How long a guest's agent may take to publish its state.
    pub agent_timeout_ms: u64,
    /// How long a guest's agent may take to pick up a request (a running
    /// agent takes it within milliseconds and says `working`). Past it the
    /// agent counts as dead or stuck: the request is withdrawn, superseded
    /// by prepare-resume, instead of waiting out the whole deadline.
    pub agent_ack_ms: u64,
    /// The deadline given to the agent for prepare-migrate.
    pub migrate_deadline_ms: u64,
    /// The deadline given to the agent for prepare-resume.
    pub resume_deadline_ms: u64,
    /// How long past a deadline dom0 waits for the agent's answer.
    pub answer_grace_ms: u64,
    /// Period of the supervision loop (proxy health, journal, new guests).
    pub tick_ms: u64,
    pub gpus: GpusConfig,
    pub proxy: ProxyConfig,
    pub tokens: TokensConfig,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpusConfig {
    /// The GPUs craned gives to guests, by PCI address.
    pub pool: Vec<PciAddr>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// Where interposed processes reach crane-proxy (`tcp://HOST:PORT`), sent
    /// to the guest with prepare-migrate in remote mode. Empty: remote mode
    /// is refused.
    pub address: String,
    /// The proxy domU that craned keeps running on this host; empty when the
    /// proxy runs elsewhere.
    pub domain: String,
    /// Its xl configuration (for `xl create`).
    pub config: PathBuf,
    /// The GPU that belongs to the proxy domain (never given to guests).
    pub gpu: Option<PciAddr>,
    /// One health check's connect timeout.
    pub health_timeout_ms: u64,
    /// After (re)creating the proxy, how long failed checks are not held
    /// against it (it is booting).
    pub boot_grace_ms: u64,
    /// Consecutive failed checks after which craned recreates the proxy.
    pub failures_before_restart: u32,
    /// While a proxy domain craned created again does not answer yet, the
    /// guests are told where it is again this often (`crane/proxy-now`):
    /// each time their processes waiting for it wait anew, so keep it below
    /// their wait (`CRANE_REMOTE_RECOVER_S`, 60 s by default).
    pub retell_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TokensConfig {
    /// The secret shared by every host's craned, from which each guest's
    /// proxy session token is derived (HMAC-SHA256). Empty file or missing:
    /// no tokens (remote mode is refused).
    pub secret_file: PathBuf,
    /// Part of every token; raise it on all hosts together to rotate them.
    pub epoch: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            socket: PathBuf::from(craned_control::DEFAULT_SOCKET),
            xl: PathBuf::from("/usr/sbin/xl"),
            guests: Vec::new(),
            no_free_gpu: NoFreeGpu::Wait,
            agent_timeout_ms: 30_000,
            agent_ack_ms: 10_000,
            migrate_deadline_ms: 30_000,
            resume_deadline_ms: 60_000,
            answer_grace_ms: 5_000,
            tick_ms: 5_000,
            gpus: GpusConfig::default(),
            proxy: ProxyConfig::default(),
            tokens: TokensConfig::default(),
        }
    }
}

impl Default for ProxyConfig {
    fn default() -> ProxyConfig {
        ProxyConfig {
            address: String::new(),
            domain: String::new(),
            config: PathBuf::from("/etc/xen/crane/proxy.cfg"),
            gpu: None,
            health_timeout_ms: 2_000,
            boot_grace_ms: 120_000,
            failures_before_restart: 6,
            retell_ms: 20_000,
        }
    }
}

impl Default for TokensConfig {
    fn default() -> TokensConfig {
        TokensConfig {
            secret_file: PathBuf::from("/etc/crane/token-secret"),
            epoch: 1,
        }
    }
}

impl Config {
    /// Reads and checks `path`; a missing file gives the defaults unless
    /// `required`.
    pub fn load(path: &Path, required: bool) -> Result<Config, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => String::new(),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        Config::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        cfg.validate().map_err(|why| ConfigError::Invalid {
            path: path.to_path_buf(),
            why,
        })?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), String> {
        for g in &self.guests {
            if !valid_element(g) {
                return Err(format!(
                    "guest name {g:?}: crane uses names as XenStore keys, so they must be \
                     1 to 64 characters of [A-Za-z0-9_-]"
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for g in &self.guests {
            if !seen.insert(g) {
                return Err(format!("guest {g} is listed twice"));
            }
        }
        let mut pool = std::collections::BTreeSet::new();
        for gpu in &self.gpus.pool {
            if !pool.insert(gpu) {
                return Err(format!("GPU {gpu} is listed twice in gpus.pool"));
            }
        }
        if let Some(gpu) = &self.proxy.gpu
            && pool.contains(gpu)
        {
            return Err(format!(
                "GPU {gpu} is both the proxy's (proxy.gpu) and in gpus.pool"
            ));
        }
        if !self.proxy.address.is_empty() {
            crane_xs::message::validate_proxy(&self.proxy.address)
                .map_err(|e| format!("proxy.address: {e}"))?;
        }
        if !self.proxy.domain.is_empty() && self.guests.contains(&self.proxy.domain) {
            return Err(format!(
                "the proxy domain {} is also listed as a guest",
                self.proxy.domain
            ));
        }
        for (name, v) in [
            ("agent_timeout_ms", self.agent_timeout_ms),
            ("agent_ack_ms", self.agent_ack_ms),
            ("migrate_deadline_ms", self.migrate_deadline_ms),
            ("resume_deadline_ms", self.resume_deadline_ms),
            ("tick_ms", self.tick_ms),
        ] {
            if !(1..=crane_xs::message::MAX_DEADLINE_MS).contains(&v) {
                return Err(format!("{name} = {v}: want 1 to 3600000"));
            }
        }
        Ok(())
    }

    pub fn manages(&self, guest: &str) -> bool {
        self.guests.iter().any(|g| g == guest)
    }

    /// The pool GPUs, i.e. those guests may get.
    pub fn pool(&self) -> &[PciAddr] {
        &self.gpus.pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("craned.toml"), text)
    }

    #[test]
    fn the_shipped_file_lists_the_defaults() {
        let shipped = include_str!("../dist/craned.toml");
        let from_file = parse(shipped).unwrap();
        let defaults = Config::default();
        assert_eq!(format!("{from_file:?}"), format!("{defaults:?}"));
    }

    #[test]
    fn a_full_configuration() {
        let cfg = parse(
            r#"
            guests = ["gpuguest", "g2"]
            no_free_gpu = "refuse"
            [gpus]
            pool = ["0000:00:05.0", "0000:00:06.0"]
            [proxy]
            address = "tcp://10.77.0.2:7000"
            domain = "proxy"
            gpu = "0000:00:07.0"
            [tokens]
            epoch = 7
            "#,
        )
        .unwrap();
        assert_eq!(cfg.no_free_gpu, NoFreeGpu::Refuse);
        assert_eq!(cfg.pool().len(), 2);
        assert_eq!(cfg.proxy.gpu.unwrap().to_string(), "0000:00:07.0");
        assert!(cfg.manages("g2") && !cfg.manages("proxy"));
        assert_eq!(cfg.tokens.epoch, 7);
    }

    #[test]
    fn mistakes_are_named() {
        for (text, want) in [
            ("guest = []", "unknown field"),
            ("guests = [\"a.b\"]", "XenStore keys"),
            ("guests = [\"a\", \"a\"]", "listed twice"),
            ("[gpus]\npool = [\"00:02\"]", "not a PCI address"),
            (
                "[gpus]\npool = [\"0000:00:05.0\"]\n[proxy]\ngpu = \"0000:00:05.0\"",
                "both the proxy's",
            ),
            ("[proxy]\naddress = \"10.0.0.1:7000\"", "proxy.address"),
            (
                "guests = [\"proxy\"]\n[proxy]\ndomain = \"proxy\"",
                "also listed as a guest",
            ),
            ("tick_ms = 0", "tick_ms"),
            ("no_free_gpu = \"maybe\"", "unknown variant"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let e = Config::load(Path::new("/nonexistent/craned.toml"), true).unwrap_err();
        assert!(e.to_string().contains("cannot read"), "{e}");
        assert!(Config::load(Path::new("/nonexistent/craned.toml"), false).is_ok());
    }
}
