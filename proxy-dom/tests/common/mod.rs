//! A small crane-wire client for the proxy's integration tests, and a way to
//! start the proxy in-process (on an ephemeral TCP port and a unix socket)
//! or as a process.

#![allow(dead_code)] // Each test binary uses a different part.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crane_proxy::{BoundAddr, Config, ListenAddr, Proxy};
use crane_wire::{Answer, Call, HEADER_LEN, Id, Limits, Sync};

pub const TOKEN_A: &str = "token-alpha-7c1e";
pub const TOKEN_B: &str = "token-beta-93fd";
pub const CL_SUCCESS: i32 = 0;
pub const CL_COMPLETE: i32 = 0;
pub const CL_DEVICE_TYPE_ALL: u64 = 0xFFFF_FFFF;
pub const CL_CONTEXT_PLATFORM: u64 = 0x1084;
pub const CL_MEM_READ_WRITE: u64 = 1;
pub const CL_MEM_READ_ONLY: u64 = 1 << 2;
pub const CL_MEM_WRITE_ONLY: u64 = 1 << 1;

pub const LONG: Duration = Duration::from_secs(60);

pub fn init_logs() {
    let _ = env_logger::builder().is_test(true).try_init();
}

/// A proxy running in this process, with its token file.
pub struct TestProxy {
    pub proxy: Proxy,
    pub dir: tempfile::TempDir,
}

impl TestProxy {
    pub fn start(adjust: impl FnOnce(&mut Config)) -> TestProxy {
        init_logs();
        let dir = tempfile::tempdir().unwrap();
        let tokens = write_tokens(dir.path());
        let mut config = Config::new(
            vec![
                ListenAddr::Tcp("127.0.0.1:0".into()),
                ListenAddr::Unix(dir.path().join("proxy.sock")),
            ],
            tokens,
        );
        adjust(&mut config);
        let proxy = Proxy::start(config).expect("the proxy starts");
        TestProxy { proxy, dir }
    }

    pub fn tcp(&self) -> SocketAddr {
        self.proxy
            .addrs()
            .iter()
            .find_map(|a| match a {
                BoundAddr::Tcp(a) => Some(*a),
                _ => None,
            })
            .unwrap()
    }

    pub fn unix(&self) -> PathBuf {
        self.dir.path().join("proxy.sock")
    }

    pub fn client(&self, token: &str) -> Client {
        Client::connect_tcp(self.tcp(), token).expect("a session opens")
    }

    /// Waits until no connection is served and no object is held.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.proxy.stats();
            if s.connections == 0 && s.objects() == 0 && s.staging_bytes == 0 {
                return true;
            }
            if Instant::now() > deadline {
                eprintln!("not idle: {s:?}");
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub fn write_tokens(dir: &Path) -> PathBuf {
    let path = dir.join("tokens");
    std::fs::write(
        &path,
        format!("# test tokens\n{TOKEN_A} tenant-a\n{TOKEN_B}   tenant-b\n"),
    )
    .unwrap();
    path
}

/// The proxy as a child process, listening on an ephemeral TCP port.
pub struct ProxyProcess {
    pub child: Child,
    pub tcp: SocketAddr,
    pub dir: tempfile::TempDir,
}

impl ProxyProcess {
    pub fn start(extra: &[&str]) -> ProxyProcess {
        let dir = tempfile::tempdir().unwrap();
        let tokens = write_tokens(dir.path());
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_crane-proxy"))
            .args(["--listen", "tcp://127.0.0.1:0", "--token-file"])
            .arg(&tokens)
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()),
            )
            .stdout(Stdio::piped())
            .spawn()
            .expect("crane-proxy starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let tcp = line
            .trim()
            .strip_prefix("listening tcp://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .unwrap();
        ProxyProcess { child, tcp, dir }
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the reader thread has received.
#[derive(Default)]
struct Inbox {
    replies: HashMap<u64, (Answer, Vec<u8>)>,
    failed: Vec<(u64, i32)>,
    fired: Vec<(u64, i32)>,
    /// Kernel output (`Answer::Output`), in the order received.
    output: Vec<u8>,
    goodbye: Option<String>,
    closed: bool,
}

type Shared = Arc<(Mutex<Inbox>, Condvar)>;

/// A client session: posted calls are batched until something waits.
pub struct Client {
    w: Box<dyn Write + Send>,
    shutdown: Box<dyn Fn(Shutdown) + Send>,
    out: Vec<u8>,
    seq: u64,
    next_id: Id,
    inbox: Shared,
    pub session: u64,
    pub limits: Limits,
}

impl Client {
    pub fn connect_tcp(addr: SocketAddr, token: &str) -> Result<Client, String> {
        let s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        s.set_nodelay(true).unwrap();
        let r = s.try_clone().unwrap();
        let sd = s.try_clone().unwrap();
        Client::open(
            Box::new(s),
            Box::new(r),
            Box::new(move |how| {
                let _ = sd.shutdown(how);
            }),
            token,
            crane_wire::VERSION_MAJOR,
        )
    }

    pub fn connect_unix(path: &Path, token: &str) -> Result<Client, String> {
        let s = UnixStream::connect(path).map_err(|e| e.to_string())?;
        let r = s.try_clone().unwrap();
        let sd = s.try_clone().unwrap();
        Client::open(
            Box::new(s),
            Box::new(r),
            Box::new(move |how| {
                let _ = sd.shutdown(how);
            }),
            token,
            crane_wire::VERSION_MAJOR,
        )
    }

    /// Says Hello; `Err` carries the Goodbye's reason.
    pub fn open(
        w: Box<dyn Write + Send>,
        r: Box<dyn Read + Send>,
        shutdown: Box<dyn Fn(Shutdown) + Send>,
        token: &str,
        major: u16,
    ) -> Result<Client, String> {
        let inbox: Shared = Arc::default();
        {
            let inbox = inbox.clone();
            std::thread::spawn(move || read_loop(r, &inbox));
        }
        let mut c = Client {
            w,
            shutdown,
            out: Vec::new(),
            seq: 0,
            next_id: 1,
            inbox,
            session: 0,
            limits: Limits {
                max_mem_bytes: 0,
                max_objects: 0,
                max_payload: 0,
            },
        };
        let seq = c.send(
            Call::Hello {
                major,
                minor: crane_wire::VERSION_MINOR,
                token: token.into(),
                client: "proxy-test".into(),
            },
            &[],
        );
        match c.wait(seq, LONG) {
            Some((
                Answer::Welcome {
                    session, limits, ..
                },
                _,
            )) => {
                c.session = session;
                c.limits = limits;
                Ok(c)
            }
            Some((Answer::Goodbye { reason }, _)) => Err(reason),
            None => Err(c
                .goodbye()
                .unwrap_or_else(|| "closed without Goodbye".into())),
            other => Err(format!("unexpected answer to Hello: {other:?}")),
        }
    }

    pub fn id(&mut self) -> Id {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Buffers a call; returns its seq.
    pub fn post(&mut self, call: Call, payload: &[u8]) -> u64 {
        self.seq += 1;
        crane_wire::encode(&mut self.out, self.seq, &call, payload.len() as u64).unwrap();
        self.out.extend_from_slice(payload);
        self.seq
    }

    /// Sends what is buffered (errors are noticed by the reader).
    pub fn flush(&mut self) {
        let _ = self.w.write_all(&self.out);
        self.out.clear();
    }

    /// Posts and flushes; returns the seq.
    pub fn send(&mut self, call: Call, payload: &[u8]) -> u64 {
        let seq = self.post(call, payload);
        self.flush();
        seq
    }

    /// Sends a call and waits for its answer.
    pub fn call(&mut self, call: Call, payload: &[u8]) -> (Answer, Vec<u8>) {
        let name = call.name();
        let seq = self.send(call, payload);
        self.wait(seq, LONG).unwrap_or_else(|| {
            panic!(
                "no answer to {name} (seq {seq}); goodbye: {:?}",
                self.goodbye()
            )
        })
    }

    /// Writes raw bytes (buffered calls first).
    pub fn raw(&mut self, bytes: &[u8]) {
        self.flush();
        let _ = self.w.write_all(bytes);
    }

    /// Raises the next seq (to test the proxy's ordering check).
    pub fn set_seq(&mut self, seq: u64) {
        self.seq = seq;
    }

    pub fn wait(&self, seq: u64, timeout: Duration) -> Option<(Answer, Vec<u8>)> {
        let (m, cv) = &*self.inbox;
        let deadline = Instant::now() + timeout;
        let mut g = m.lock().unwrap();
        loop {
            if let Some(r) = g.replies.remove(&seq) {
                return Some(r);
            }
            if g.closed {
                return None;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            g = cv.wait_timeout(g, left).unwrap().0;
        }
    }

    /// Whether an answer to `seq` has arrived (without taking it).
    pub fn has_answer(&self, seq: u64) -> bool {
        self.inbox.0.lock().unwrap().replies.contains_key(&seq)
    }

    /// A Sync round trip; returns the failures reported so far (and
    /// forgets them).
    pub fn sync(&mut self) -> Vec<(u64, i32)> {
        let (a, _) = self.call(Call::Sync, &[]);
        assert_eq!(a, Answer::Status(CL_SUCCESS));
        std::mem::take(&mut self.inbox.0.lock().unwrap().failed)
    }

    /// Waits for the callback with `cookie`; its status.
    pub fn fired(&self, cookie: u64, timeout: Duration) -> Option<i32> {
        let (m, cv) = &*self.inbox;
        let deadline = Instant::now() + timeout;
        let mut g = m.lock().unwrap();
        loop {
            if let Some(i) = g.fired.iter().position(|f| f.0 == cookie) {
                return Some(g.fired.remove(i).1);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if g.closed || left.is_zero() {
                return None;
            }
            g = cv.wait_timeout(g, left).unwrap().0;
        }
    }

    /// The kernel output received so far (and forgets it).
    pub fn take_output(&self) -> Vec<u8> {
        std::mem::take(&mut self.inbox.0.lock().unwrap().output)
    }

    pub fn goodbye(&self) -> Option<String> {
        self.inbox.0.lock().unwrap().goodbye.clone()
    }

    /// Waits for the proxy to close the connection; the Goodbye's reason,
    /// if one came. Panics if the connection stays open.
    pub fn closed(&self, timeout: Duration) -> Option<String> {
        let (m, cv) = &*self.inbox;
        let deadline = Instant::now() + timeout;
        let mut g = m.lock().unwrap();
        while !g.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "the proxy kept the connection open");
            g = cv.wait_timeout(g, left).unwrap().0;
        }
        g.goodbye.clone()
    }

    /// Drops the connection without Bye.
    pub fn kill(self) {}

    /// Sends what is buffered and ends the sending side (the proxy sees
    /// the end of the stream; answers still arrive).
    pub fn finish_writes(&mut self) {
        self.flush();
        (self.shutdown)(Shutdown::Write);
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        (self.shutdown)(Shutdown::Both);
    }
}

fn read_loop(mut r: Box<dyn Read + Send>, inbox: &Shared) {
    let mut body = Vec::new();
    while let Ok(Some(h)) = crane_wire::read_frame(&mut r, u64::MAX, &mut body) {
        let mut payload = vec![0u8; h.payload_len as usize];
        if r.read_exact(&mut payload).is_err() {
            break;
        }
        let a: Answer = crane_wire::decode(&body).expect("the proxy sends valid answers");
        let (m, cv) = &**inbox;
        let mut g = m.lock().unwrap();
        match a {
            Answer::Failed { seq, status } => {
                assert_eq!(h.seq, 0, "Failed is unsolicited");
                g.failed.push((seq, status));
            }
            Answer::EventFired { cookie, status } => {
                assert_eq!(h.seq, 0, "EventFired is unsolicited");
                g.fired.push((cookie, status));
            }
            Answer::Output => {
                assert_eq!(h.seq, 0, "Output is unsolicited");
                g.output.extend_from_slice(&payload);
            }
            Answer::Goodbye { reason } => g.goodbye = Some(reason),
            a => {
                assert!(h.seq != 0, "a reply with seq 0: {a:?}");
                g.replies.insert(h.seq, (a, payload));
            }
        }
        cv.notify_all();
    }
    let (m, cv) = &**inbox;
    m.lock().unwrap().closed = true;
    cv.notify_all();
}

/// The objects most tests need.
pub struct Env {
    pub platform: Id,
    pub device: Id,
    pub context: Id,
    pub queue: Id,
}

pub fn setup(c: &mut Client) -> Env {
    let env = setup_posted(c);
    assert_eq!(c.sync(), vec![]);
    env
}

/// [`setup`] as a move's rebuild does it: the context and queue posted, no
/// Sync (a Sync would start the warm context's replacement, and with it a
/// slower device while it is made).
pub fn setup_posted(c: &mut Client) -> Env {
    let platform = c.id();
    let (a, _) = c.call(
        Call::GetPlatformIds {
            ids: vec![platform],
        },
        &[],
    );
    assert!(
        matches!(a, Answer::Count { status: 0, count } if count >= 1),
        "{a:?}"
    );
    let device = c.id();
    let (a, _) = c.call(
        Call::GetDeviceIds {
            platform,
            device_type: CL_DEVICE_TYPE_ALL,
            ids: vec![device],
        },
        &[],
    );
    assert!(
        matches!(a, Answer::Count { status: 0, count } if count >= 1),
        "{a:?}"
    );
    let context = c.id();
    c.post(
        Call::CreateContext {
            id: context,
            props: vec![CL_CONTEXT_PLATFORM, platform],
            devices: vec![device],
        },
        &[],
    );
    let queue = c.id();
    c.post(
        Call::CreateQueue {
            id: queue,
            context,
            device,
            props: vec![],
        },
        &[],
    );
    Env {
        platform,
        device,
        context,
        queue,
    }
}

/// Creates and builds a program; panics with the build log on failure.
pub fn build(c: &mut Client, env: &Env, source: &str) -> Id {
    let program = c.id();
    c.post(
        Call::CreateProgramWithSource {
            id: program,
            context: env.context,
            source: source.into(),
        },
        &[],
    );
    let (a, _) = c.call(
        Call::BuildProgram {
            program,
            devices: vec![env.device],
            options: String::new(),
        },
        &[],
    );
    if a != Answer::Status(CL_SUCCESS) {
        let (_, log) = c.call(
            Call::GetInfo {
                kind: crane_wire::InfoKind::ProgramBuild { device: env.device },
                object: program,
                param: 0x1183, // CL_PROGRAM_BUILD_LOG
            },
            &[],
        );
        panic!("build failed: {a:?}\n{}", String::from_utf8_lossy(&log));
    }
    program
}

/// Kernel `name` of a program built from `source`.
pub fn kernel(c: &mut Client, env: &Env, source: &str, name: &str) -> Id {
    let program = build(c, env, source);
    let kernel = c.id();
    c.post(
        Call::CreateKernel {
            id: kernel,
            program,
            name: name.into(),
        },
        &[],
    );
    kernel
}

/// Sets argument `index` of `kernel` (posted).
pub fn set_arg(c: &mut Client, kernel: Id, index: u32, arg: crane_wire::KernelArg) {
    c.post(Call::SetKernelArg { kernel, index, arg }, &[]);
}

/// Launches one work-item of `kernel` on the environment's queue (posted).
pub fn launch_one(c: &mut Client, env: &Env, kernel: Id, sync: Sync) {
    c.post(
        Call::EnqueueNdRange {
            queue: env.queue,
            kernel,
            dims: 1,
            offset: None,
            global: [1, 1, 1],
            local: None,
            sync,
        },
        &[],
    );
}

pub fn create_buffer(c: &mut Client, env: &Env, flags: u64, size: u64, init: Option<&[u8]>) -> Id {
    let id = c.id();
    c.post(
        Call::CreateBuffer {
            id,
            context: env.context,
            flags,
            size,
            props: vec![],
            init: init.is_some(),
        },
        init.unwrap_or(&[]),
    );
    id
}

/// Reads a whole buffer (waiting on `waits`).
pub fn read(c: &mut Client, env: &Env, buffer: Id, size: u64, waits: Vec<Id>) -> Vec<u8> {
    let (a, data) = c.call(
        Call::EnqueueReadBuffer {
            queue: env.queue,
            buffer,
            offset: 0,
            size,
            sync: Sync { waits, event: 0 },
        },
        &[],
    );
    assert_eq!(a, Answer::Data(CL_SUCCESS));
    assert_eq!(data.len() as u64, size);
    data
}

/// One frame's bytes, for tests that corrupt them.
pub fn frame(seq: u64, call: &Call, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    crane_wire::encode(&mut out, seq, call, payload.len() as u64).unwrap();
    out.extend_from_slice(payload);
    out
}

pub fn header(body_len: u32, payload_len: u64, seq: u64) -> [u8; HEADER_LEN] {
    crane_wire::Header {
        body_len,
        payload_len,
        seq,
    }
    .to_bytes()
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

pub fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}
