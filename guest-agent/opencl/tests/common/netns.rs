//! Two network namespaces joined by a veth pair, for a peer that vanishes
//! without a word: its end of the link taken down, nothing it sends (no FIN,
//! no RST) reaches the other side, as when Xen destroys a proxy domain.
//! Needs root (`ip netns`), as the project's test machines have.

use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Duration;

/// Namespaces `<name>-a` (10.213.7.1, the application's) and `<name>-b`
/// (10.213.7.2, crane-proxy's), removed when dropped.
pub struct Netns {
    pub a: String,
    pub b: String,
}

/// crane-proxy's side of the link.
pub const B_IP: &str = "10.213.7.2";

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {} (these tests need root and `ip netns`)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = format!("crane-{tag}-{}", std::process::id());
        let n = Netns {
            a: format!("{name}-a"),
            b: format!("{name}-b"),
        };
        ip(&["netns", "add", &n.a]);
        ip(&["netns", "add", &n.b]);
        ip(&[
            "link", "add", "va", "netns", &n.a, "type", "veth", "peer", "name", "vb", "netns", &n.b,
        ]);
        for (ns, dev, addr) in [(&n.a, "va", "10.213.7.1/30"), (&n.b, "vb", "10.213.7.2/30")] {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "addr", "add", addr, "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        n
    }

    /// crane-proxy's side goes silent: its address taken away, so that its
    /// kernel drops what arrives and answers nothing (not even ARP), while
    /// the application's side of the link keeps its carrier, as a guest's
    /// does when the proxy domain behind the bridge is destroyed. (Taking
    /// the link down would make the application's sends fail at once,
    /// which TCP retries every 500 ms instead of backing off: not what a
    /// guest sees.)
    pub fn cut(&self) {
        ip(&["-n", &self.b, "addr", "del", "10.213.7.2/30", "dev", "vb"]);
    }

    /// And back.
    pub fn restore(&self) {
        ip(&["-n", &self.b, "addr", "add", "10.213.7.2/30", "dev", "vb"]);
    }

    /// `program args...` inside namespace `ns` with `env`, through `env(1)`
    /// so that `ip` itself gets none of it (an LD_PRELOAD, say); `ip netns
    /// exec` and `env` exec, so the child's pid is the program's.
    pub fn command(ns: &str, program: &std::path::Path, env: &[(&str, &str)]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, "env"]);
        for (k, v) in env {
            c.arg(format!("{k}={v}"));
        }
        c.arg(program);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Whether a TCP connection to `addr` (IP:PORT) from inside namespace `ns`
/// succeeds (tried from a thread of its own that joins the namespace).
pub fn connects(ns: &str, addr: &str) -> bool {
    let path = format!("/run/netns/{ns}");
    let addr: std::net::SocketAddr = addr.parse().expect("an IP:PORT address");
    std::thread::spawn(move || {
        let f = std::fs::File::open(&path).expect("the namespace's file");
        // SAFETY: setns takes a descriptor that stays open for the call (f
        // lives to the end of the closure); it changes only this thread's
        // network namespace, and the thread ends after the connect below.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
    })
    .join()
    .unwrap()
}
