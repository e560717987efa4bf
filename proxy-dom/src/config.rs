//! The proxy's settings and its command line.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::LazyLock;
use std::time::Duration;

use clap::Parser;

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

/// A value the command line's parser refuses (clap shows it with the option).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("a listen address must be tcp://HOST:PORT or unix:PATH, not {0:?}")]
    BadListen(String),
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
    /// Vendor libraries the embedding process has loaded already, with
    /// their platforms (addresses): used instead of `vendors`, nothing is
    /// opened. For a proxy inside an application's process, whose own
    /// loader tracks the vendor so that it can unload it later.
    pub preloaded: Vec<(PathBuf, Vec<usize>)>,
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
            preloaded: Vec::new(),
        }
    }
}

/// The proxy's and the protocol's versions, for `--version`.
static VERSION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{} (wire protocol {}.{})",
        env!("CARGO_PKG_VERSION"),
        crane_wire::VERSION_MAJOR,
        crane_wire::VERSION_MINOR
    )
});

/// `crane-proxy`'s command line (clap). [`Cli::into_config`] turns it into
/// the [`Config`] the proxy starts with.
#[derive(Debug, Parser)]
#[command(
    name = "crane-proxy",
    version = VERSION.as_str(),
    about = "Runs the OpenCL calls that crane's interposer forwards from migrating guests.",
    after_help = "Logging: RUST_LOG (default info). Each listening address is printed to stdout \
                  once bound, e.g. `listening tcp://127.0.0.1:4810`.",
    // A single-valued option given twice: the last one counts.
    args_override_self = true,
    max_term_width = 100
)]
pub struct Cli {
    /// tcp://HOST:PORT or unix:PATH (repeatable)
    #[arg(long, value_name = "ADDR", required = true)]
    pub listen: Vec<ListenAddr>,
    /// One token per line, optionally followed by a tenant name; read again
    /// at every Hello
    #[arg(long, value_name = "FILE")]
    pub token_file: PathBuf,
    /// Write FILE from the tokens dom0 publishes in this domain's XenStore
    /// (crane/proxy/tokens), at start and whenever they change (the proxy
    /// domain's mode)
    #[arg(long)]
    pub tokens_from_xenstore: bool,
    /// Vendor OpenCL ICD library (repeatable); default: CRANE_VENDOR, else
    /// OCL_ICD_FILENAMES, else the .icd files in OCL_ICD_VENDORS or
    /// /etc/OpenCL/vendors
    #[arg(long, value_name = "PATH")]
    pub vendor: Vec<PathBuf>,
    /// Device memory per session (suffixes K, M, G, T); default 75% of the
    /// smallest device's global memory
    #[arg(long, value_name = "BYTES", value_parser = byte_count)]
    pub max_session_mem: Option<u64>,
    /// Objects per session
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_OBJECTS,
          value_parser = positive_count::<u64>)]
    pub max_session_objects: u64,
    /// Sessions at once
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_SESSIONS,
          value_parser = positive_count::<usize>)]
    pub max_sessions: usize,
    /// Bulk data in one frame (suffixes K, M, G, T)
    #[arg(long, value_name = "BYTES", default_value = "256M", value_parser = byte_count)]
    pub max_payload: u64,
    /// Time a new connection has to say Hello
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = seconds)]
    pub hello_timeout: Duration,
    /// Time a closing session waits for its queues
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = seconds)]
    pub teardown_timeout: Duration,
    /// Leave kernels' printf output on the proxy's own stdout instead of
    /// sending it to the session that printed it
    #[arg(long)]
    pub no_capture_stdout: bool,
}

impl Cli {
    /// The configuration the command line describes.
    pub fn into_config(self) -> Config {
        Config {
            listen: self.listen,
            token_file: self.token_file,
            vendors: self.vendor,
            max_session_mem: self.max_session_mem,
            max_session_objects: self.max_session_objects,
            max_sessions: self.max_sessions,
            max_payload: self.max_payload,
            hello_timeout: self.hello_timeout,
            teardown_timeout: self.teardown_timeout,
            tokens_from_xenstore: self.tokens_from_xenstore,
            capture_stdout: !self.no_capture_stdout,
            preloaded: Vec::new(),
        }
    }
}

/// Parses a command line, the program's name first. `--help`, `--version`
/// and every usage error come back as a [`clap::Error`] (`exit()` prints it
/// and exits with 0 or 2).
pub fn parse_args<I, T>(args: I) -> Result<Config, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    Cli::try_parse_from(args).map(Cli::into_config)
}

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

fn byte_count(s: &str) -> Result<u64, String> {
    parse_bytes(s).ok_or_else(|| "not a valid byte count (e.g. 4096, 64K, 2G)".to_string())
}

fn positive_count<N: FromStr + PartialOrd + Default>(s: &str) -> Result<N, String> {
    s.parse::<N>()
        .ok()
        .filter(|n| *n > N::default())
        .ok_or_else(|| "not a valid positive count".to_string())
}

fn seconds(s: &str) -> Result<Duration, String> {
    secs(s).ok_or_else(|| "not a valid number of seconds (more than 0)".to_string())
}

fn secs(s: &str) -> Option<Duration> {
    let v: f64 = s.parse().ok()?;
    (v.is_finite() && v > 0.0 && v < 1e9).then(|| Duration::from_secs_f64(v))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use clap::error::ErrorKind;

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
        let c = parse_args(args(
            "crane-proxy --listen tcp://0.0.0.0:4810 --listen=unix:/tmp/p.sock \
             --token-file /etc/t --max-session-mem 2G --max-session-objects=100 \
             --max-sessions 3 --vendor /a.so --vendor=/b.so --max-payload 1M \
             --hello-timeout 0.5 --teardown-timeout=3 --no-capture-stdout",
        ))
        .unwrap();
        assert_eq!(
            c.listen,
            vec![
                ListenAddr::Tcp("0.0.0.0:4810".into()),
                ListenAddr::Unix("/tmp/p.sock".into())
            ]
        );
        assert_eq!(c.token_file, PathBuf::from("/etc/t"));
        assert_eq!(c.max_session_mem, Some(2 << 30));
        assert_eq!(c.max_session_objects, 100);
        assert_eq!(c.max_sessions, 3);
        assert_eq!(
            c.vendors,
            vec![PathBuf::from("/a.so"), PathBuf::from("/b.so")]
        );
        assert_eq!(c.max_payload, 1 << 20);
        assert_eq!(c.hello_timeout, Duration::from_millis(500));
        assert_eq!(c.teardown_timeout, Duration::from_secs(3));
        assert!(!c.capture_stdout);
        assert!(!c.tokens_from_xenstore);
        // A single-valued option given twice: the last one counts, as before.
        let c = parse_args(args(
            "crane-proxy --listen tcp://a:1 --token-file x --token-file y --max-sessions 2 \
             --max-sessions 5",
        ))
        .unwrap();
        assert_eq!(c.token_file, PathBuf::from("y"));
        assert_eq!(c.max_sessions, 5);
    }

    /// The proxy domain's invocation (proxy-dom/dist/crane-proxy.service,
    /// test-vms/files/crane-proxy-start), and its defaults: those of
    /// `Config::new`.
    #[test]
    fn the_proxy_domains_invocation_gets_the_defaults() {
        let c = parse_args(args(
            "crane-proxy --listen tcp://0.0.0.0:7000 --token-file /run/crane/proxy/tokens \
             --tokens-from-xenstore",
        ))
        .unwrap();
        let mut expected = Config::new(
            vec![ListenAddr::Tcp("0.0.0.0:7000".into())],
            "/run/crane/proxy/tokens".into(),
        );
        expected.tokens_from_xenstore = true;
        assert_eq!(format!("{c:?}"), format!("{expected:?}"));
        assert_eq!(c.max_payload, DEFAULT_MAX_PAYLOAD);
        assert!(c.capture_stdout);
    }

    #[test]
    fn help_and_version() {
        Cli::command().debug_assert();
        let e = parse_args(args("crane-proxy --help")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DisplayHelp);
        let help = e.to_string();
        for option in [
            "--listen <ADDR>",
            "--token-file <FILE>",
            "--tokens-from-xenstore",
            "--vendor <PATH>",
            "--max-session-mem <BYTES>",
            "--max-session-objects <N>",
            "--max-sessions <N>",
            "--max-payload <BYTES>",
            "--hello-timeout <SECS>",
            "--teardown-timeout <SECS>",
            "--no-capture-stdout",
            "-V, --version",
            "CRANE_VENDOR",
            "RUST_LOG",
        ] {
            assert!(help.contains(option), "{option} not in\n{help}");
        }
        assert_eq!(
            parse_args(args("crane-proxy -h")).unwrap_err().kind(),
            ErrorKind::DisplayHelp
        );
        for v in ["--version", "-V"] {
            let e = parse_args(["crane-proxy", v]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::DisplayVersion);
            assert_eq!(
                e.to_string().trim(),
                format!(
                    "crane-proxy {} (wire protocol {}.{})",
                    env!("CARGO_PKG_VERSION"),
                    crane_wire::VERSION_MAJOR,
                    crane_wire::VERSION_MINOR
                )
            );
        }
    }

    #[test]
    fn usage_errors_name_the_option() {
        let ok = "crane-proxy --listen tcp://a:1 --token-file x";
        let err = |line: &str| parse_args(args(line)).unwrap_err();
        let e = err(&format!("{ok} --bogus-flag"));
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--bogus-flag"), "{e}");
        // A misspelling gets a suggestion.
        let e = err(&format!("{ok} --max-sesions 3"));
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--max-sessions"), "{e}");
        // A stray word is no option either.
        assert_eq!(
            err(&format!("{ok} extra")).kind(),
            ErrorKind::UnknownArgument
        );
        // A known option without its value.
        let e = err("crane-proxy --listen tcp://a:1 --token-file");
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        assert!(e.to_string().contains("--token-file"), "{e}");
        let e = err("crane-proxy --token-file x --listen --tokens-from-xenstore");
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        assert!(e.to_string().contains("--listen"), "{e}");
        // The two options every proxy needs.
        let e = err("crane-proxy --token-file x");
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        assert!(e.to_string().contains("--listen"), "{e}");
        let e = err("crane-proxy --listen tcp://a:1");
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        assert!(e.to_string().contains("--token-file"), "{e}");
        // Values the proxy cannot use.
        for (bad, what) in [
            ("--max-sessions 0", "--max-sessions"),
            ("--max-session-objects many", "--max-session-objects"),
            ("--max-session-mem 2X", "--max-session-mem"),
            ("--max-payload G", "--max-payload"),
            ("--hello-timeout 0", "--hello-timeout"),
            ("--teardown-timeout soon", "--teardown-timeout"),
            ("--listen udp://x:1", "tcp://HOST:PORT or unix:PATH"),
        ] {
            let e = err(&format!("{ok} {bad}"));
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{bad}: {e}");
            assert!(e.to_string().contains(what), "{bad}: {e}");
        }
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
