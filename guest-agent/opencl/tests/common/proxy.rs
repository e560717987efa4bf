//! A real crane-proxy process for a test, and waiting for an application's
//! control socket.

use std::net::TcpListener;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::{built, scratch};

/// A crane-proxy process for one test, killed when dropped. Its log (info
/// level) goes to a file, printed if the test fails.
pub struct Proxy {
    pub child: Child,
    pub addr: String,
    /// How it was started, for [`Proxy::restart`].
    options: Vec<String>,
    env: Vec<(String, String)>,
    /// The network namespace it runs in (`super::netns`), if not this one.
    netns: Option<String>,
    /// Holds the token file, the log and the unix socket; removed when
    /// dropped.
    dir: tempfile::TempDir,
}

impl Proxy {
    /// Starts a proxy that accepts the given tokens (token, tenant).
    pub fn start(name: &str, tcp: bool, tokens: &[(&str, &str)]) -> Proxy {
        Self::start_with(name, tcp, tokens, &[])
    }

    /// The same, with more command-line options (limits, say).
    pub fn start_with(name: &str, tcp: bool, tokens: &[(&str, &str)], options: &[&str]) -> Proxy {
        Self::start_env(name, tcp, tokens, options, &[])
    }

    /// The same, with more environment (the proxy's vendor settings, say).
    pub fn start_env(
        name: &str,
        tcp: bool,
        tokens: &[(&str, &str)],
        options: &[&str],
        env: &[(&str, &str)],
    ) -> Proxy {
        let dir = with_tokens(name, tokens);
        let addr = if tcp {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            format!("tcp://127.0.0.1:{port}")
        } else {
            format!("unix:{}", dir.path().join("proxy.sock").display())
        };
        let options = options.iter().map(|o| o.to_string()).collect();
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::launch(dir, addr, options, env, None)
    }

    /// A proxy in network namespace `ns` listening at `ip:7000`.
    pub fn start_in(name: &str, ns: &str, ip: &str, tokens: &[(&str, &str)]) -> Proxy {
        let dir = with_tokens(name, tokens);
        let addr = format!("tcp://{ip}:7000");
        Self::launch(dir, addr, Vec::new(), Vec::new(), Some(ns.to_string()))
    }

    /// Starts crane-proxy as described and waits until it answers.
    fn launch(
        dir: tempfile::TempDir,
        addr: String,
        options: Vec<String>,
        env: Vec<(String, String)>,
        netns: Option<String>,
    ) -> Proxy {
        let child = spawn(&addr, dir.path(), &options, &env, netns.as_deref());
        let p = Proxy {
            child,
            addr,
            options,
            env,
            netns,
            dir,
        };
        p.wait_ready();
        p
    }

    /// Kills the proxy (SIGKILL: no goodbye to anyone).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again, same address, tokens and options (after [`kill`]).
    pub fn restart(&mut self) {
        self.kill();
        self.child = spawn(
            &self.addr,
            self.dir.path(),
            &self.options,
            &self.env,
            self.netns.as_deref(),
        );
        self.wait_ready();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Waits for a line of the log that contains `what`.
    pub fn wait_log(&self, what: &str) -> String {
        let start = Instant::now();
        loop {
            if let Some(l) = self.log().lines().find(|l| l.contains(what)) {
                return l.to_string();
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "crane-proxy never logged {what:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_ready(&self) {
        let start = Instant::now();
        loop {
            let up = match (self.addr.strip_prefix("unix:"), &self.netns) {
                (Some(path), _) => std::os::unix::net::UnixStream::connect(path).is_ok(),
                (None, None) => {
                    std::net::TcpStream::connect(self.addr.trim_start_matches("tcp://")).is_ok()
                }
                (None, Some(ns)) => {
                    super::netns::connects(ns, self.addr.trim_start_matches("tcp://"))
                }
            };
            if up {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "crane-proxy did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A scratch directory for proxy `name` holding its token file (`TOKEN
/// TENANT` per line).
fn with_tokens(name: &str, tokens: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = scratch(&format!("proxy-{name}"));
    let lines: Vec<String> = tokens.iter().map(|(t, n)| format!("{t} {n}")).collect();
    std::fs::write(dir.path().join("tokens"), lines.join("\n") + "\n").unwrap();
    dir
}

/// Starts crane-proxy listening at `addr` with the token file in `dir`; its
/// log is appended to `dir/log`.
fn spawn(
    addr: &str,
    dir: &std::path::Path,
    options: &[String],
    env: &[(String, String)],
    netns: Option<&str>,
) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("log"))
        .unwrap();
    let proxy = built("crane-proxy", "crane-proxy");
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(proxy);
            c
        }
        None => Command::new(proxy),
    };
    cmd.args(["--listen", addr, "--token-file"])
        .arg(dir.join("tokens"))
        .args(options)
        .env("RUST_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stderr(log)
        .spawn()
        .expect("start crane-proxy")
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("crane-proxy's log:\n{}", self.log());
        }
    }
}

pub fn wait_socket(sock: &std::path::Path) {
    let start = Instant::now();
    while !sock.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no control socket appeared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
