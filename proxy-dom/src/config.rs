//! The proxy's settings and its command line.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// Default cap on objects per session.
pub const DEFAULT_MAX_OBJECTS: u64 = 65536;
/// Default cap on sessions at once (connections that have not said Hello yet
/// count too).
pub const DEFAULT_MAX_SESSIONS: usize = 256;
/// Default bound on the payload of one frame: larger transfers are split by
/// the client.
pub const DEFAULT_MAX_PAYLOAD: u64 = 256 << 20;
/// Session memory when no device reports its global memory size.
pub const FALLBACK_SESSION_MEM: u64 = 4 << 30;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} needs a value")]
    MissingValue(String),
    #[error("unknown option {0} (see --help)")]
    UnknownOption(String),
    #[error("{flag}: {value:?} is not a valid {what}")]
    BadValue {
        flag: &'static str,
        value: String,
        what: &'static str,
    },
    #[error("a listen address must be tcp://HOST:PORT or unix:PATH, not {0:?}")]
    BadListen(String),
    #[error("at least one --listen address is needed")]
    NoListen,
    #[error("--token-file is needed: without tokens no session can be opened")]
    NoTokenFile,
}

/// Where the proxy accepts connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// `tcp://HOST:PORT` (port 0 picks a free one).
    Tcp(String),
    /// `unix:PATH`.
    Unix(PathBuf),
}

impl FromStr for ListenAddr {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(rest) = s.strip_prefix("tcp://") {
            if rest
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            {
                return Ok(ListenAddr::Tcp(rest.to_string()));
            }
        } else if let Some(rest) = s.strip_prefix("unix:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if !path.is_empty() {
                return Ok(ListenAddr::Unix(PathBuf::from(path)));
            }
        }
        Err(ConfigError::BadListen(s.to_string()))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "tcp://{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Everything `crane-proxy` is told at start.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: Vec<ListenAddr>,
    /// One token per line, optionally followed by whitespace and a tenant
    /// name; read again at every Hello.
    pub token_file: PathBuf,
    /// Vendor ICD libraries; empty means discover them like the interposer.
    pub vendors: Vec<PathBuf>,
    /// Device memory one session may hold; `None`: 75 % of the smallest
    /// device's global memory.
    pub max_session_mem: Option<u64>,
    pub max_session_objects: u64,
    pub max_sessions: usize,
    pub max_payload: u64,
    /// How long a new connection has to say Hello.
    pub hello_timeout: Duration,
    /// How long a closing session waits for its queues to drain.
    pub teardown_timeout: Duration,
    /// Keep `token_file` in sync with the tokens dom0 publishes in this
    /// domain's XenStore (`crane/proxy/tokens`): the proxy domain's mode.
    pub tokens_from_xenstore: bool,
    /// Capture the vendor's standard output and send each session its
    /// kernels' printf output (`crane_proxy::output`); started by the
    /// binary after it printed its addresses.
    pub capture_stdout: bool,
}

impl Config {
    /// A configuration with the defaults, listening on `listen`.
    pub fn new(listen: Vec<ListenAddr>, token_file: PathBuf) -> Config {
        Config {
            listen,
            token_file,
            vendors: Vec::new(),
            max_session_mem: None,
            max_session_objects: DEFAULT_MAX_OBJECTS,
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_payload: DEFAULT_MAX_PAYLOAD,
            hello_timeout: Duration::from_secs(10),
            teardown_timeout: Duration::from_secs(10),
            tokens_from_xenstore: false,
            capture_stdout: true,
        }
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Run(Config),
    Help,
    Version,
}

pub const USAGE: &str = "\
usage: crane-proxy --listen ADDR [--listen ADDR ...] --token-file FILE [options]

Runs the OpenCL calls that crane's interposer forwards from migrating guests.

  --listen ADDR               tcp://HOST:PORT or unix:PATH (repeatable)
  --token-file FILE           one token per line, optionally followed by a
                              tenant name; read again at every Hello
  --tokens-from-xenstore      write FILE from the tokens dom0 publishes in this
                              domain's XenStore (crane/proxy/tokens), at start
                              and whenever they change (the proxy domain's mode)
  --vendor PATH               vendor OpenCL ICD library (repeatable); default:
                              CRANE_VENDOR, else OCL_ICD_FILENAMES, else the
                              .icd files in OCL_ICD_VENDORS or /etc/OpenCL/vendors
  --max-session-mem BYTES     device memory per session (suffixes K, M, G, T);
                              default 75% of the smallest device's global memory
  --max-session-objects N     objects per session (default 65536)
  --max-sessions N            sessions at once (default 256)
  --max-payload BYTES         bulk data in one frame (default 256M)
  --hello-timeout SECS        time a new connection has to say Hello (default 10)
  --teardown-timeout SECS     time a closing session waits for its queues (default 10)
  --no-capture-stdout         leave kernels' printf output on the proxy's own
                              stdout instead of sending it to the session that
                              printed it
  -h, --help                  this text
  -V, --version               the proxy's and the protocol's versions

Logging: RUST_LOG (default info). Each listening address is printed to stdout
once bound, e.g. `listening tcp://127.0.0.1:4810`.
";

/// Parses a byte count with an optional K/M/G/T (powers of 1024) suffix.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, shift) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 10),
        (i, 'm' | 'M') => (&s[..i], 20),
        (i, 'g' | 'G') => (&s[..i], 30),
        (i, 't' | 'T') => (&s[..i], 40),
        _ => (s, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// Parses the command line (without the program name).
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Command, ConfigError> {
    let mut listen = Vec::new();
    let mut token_file = None;
    let mut cfg = Config::new(Vec::new(), PathBuf::new());
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| ConfigError::MissingValue(name.to_string()))
        };
        let bad = |flag: &'static str, value: &str, what: &'static str| ConfigError::BadValue {
            flag,
            value: value.to_string(),
            what,
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--listen" => listen.push(value("--listen")?.parse()?),
            "--token-file" => token_file = Some(PathBuf::from(value("--token-file")?)),
            "--tokens-from-xenstore" => cfg.tokens_from_xenstore = true,
            "--no-capture-stdout" => cfg.capture_stdout = false,
            "--vendor" => cfg.vendors.push(PathBuf::from(value("--vendor")?)),
            "--max-session-mem" => {
                let v = value("--max-session-mem")?;
                cfg.max_session_mem = Some(
                    parse_bytes(&v).ok_or_else(|| bad("--max-session-mem", &v, "byte count"))?,
                );
            }
            "--max-session-objects" => {
                let v = value("--max-session-objects")?;
                cfg.max_session_objects = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad("--max-session-objects", &v, "positive count"))?;
            }
            "--max-sessions" => {
                let v = value("--max-sessions")?;
                cfg.max_sessions = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad("--max-sessions", &v, "positive count"))?;
            }
            "--max-payload" => {
                let v = value("--max-payload")?;
                cfg.max_payload =
                    parse_bytes(&v).ok_or_else(|| bad("--max-payload", &v, "byte count"))?;
            }
            "--hello-timeout" => {
                let v = value("--hello-timeout")?;
                cfg.hello_timeout =
                    secs(&v).ok_or_else(|| bad("--hello-timeout", &v, "number of seconds"))?;
            }
            "--teardown-timeout" => {
                let v = value("--teardown-timeout")?;
                cfg.teardown_timeout =
                    secs(&v).ok_or_else(|| bad("--teardown-timeout", &v, "number of seconds"))?;
            }
            _ => return Err(ConfigError::UnknownOption(arg)),
        }
    }
    if listen.is_empty() {
        return Err(ConfigError::NoListen);
    }
    cfg.listen = listen;
    cfg.token_file = token_file.ok_or(ConfigError::NoTokenFile)?;
    Ok(Command::Run(cfg))
}

fn secs(s: &str) -> Option<Duration> {
    let v: f64 = s.parse().ok()?;
    (v.is_finite() && v > 0.0 && v < 1e9).then(|| Duration::from_secs_f64(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn listen_addresses_parse_and_print() {
        assert_eq!(
            "tcp://127.0.0.1:0".parse::<ListenAddr>().unwrap(),
            ListenAddr::Tcp("127.0.0.1:0".into())
        );
        assert_eq!(
            "tcp://[::1]:4810"
                .parse::<ListenAddr>()
                .unwrap()
                .to_string(),
            "tcp://[::1]:4810"
        );
        assert_eq!(
            "unix:/run/crane/proxy.sock".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix("/run/crane/proxy.sock".into())
        );
        for bad in ["tcp://nohost", "tcp://:80", "udp://x:1", "unix:", "/path"] {
            assert!(bad.parse::<ListenAddr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn command_line_with_repeats_suffixes_and_inline_values() {
        let Command::Run(c) = parse_args(args(
            "--listen tcp://0.0.0.0:4810 --listen=unix:/tmp/p.sock --token-file /etc/t \
             --max-session-mem 2G --max-session-objects=100 --max-sessions 3 --vendor /a.so",
        ))
        .unwrap() else {
            panic!("not a run")
        };
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.max_session_mem, Some(2 << 30));
        assert_eq!(c.max_session_objects, 100);
        assert_eq!(c.max_sessions, 3);
        assert_eq!(c.vendors, vec![PathBuf::from("/a.so")]);
        assert!(matches!(
            parse_args(args("--token-file x")),
            Err(ConfigError::NoListen)
        ));
        assert!(matches!(
            parse_args(args("--listen tcp://a:1")),
            Err(ConfigError::NoTokenFile)
        ));
        assert!(matches!(
            parse_args(args("--listen tcp://a:1 --token-file x --max-sessions 0")),
            Err(ConfigError::BadValue { .. })
        ));
        assert!(matches!(
            parse_args(args("--bogus")),
            Err(ConfigError::UnknownOption(_))
        ));
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64K"), Some(64 << 10));
        assert_eq!(parse_bytes("3m"), Some(3 << 20));
        assert_eq!(parse_bytes("99999999999T"), None);
        assert_eq!(parse_bytes("G"), None);
    }
}
