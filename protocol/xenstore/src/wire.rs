//! A small blocking client of the XenStore wire protocol (Xen's
//! docs/misc/xenstore.txt, io/xs_wire.h): what xenstore-rs's blocking backend
//! lacks, i.e. watches and permissions, with replies matched by request id and
//! watch events queued while a reply is awaited. It speaks over xenstored's
//! unix socket (dom0) or the guest's xenbus device, and waits with poll(2), so
//! waiting for a watch event takes a timeout.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::error::XsError;
use crate::layout::validate_path;
use crate::perms::Perm;
use crate::store::WatchEvent;

/// Message types (enum xsd_sockmsg_type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MsgType {
    Directory = 1,
    Read = 2,
    GetPerms = 3,
    Watch = 4,
    Unwatch = 5,
    GetDomainPath = 10,
    Write = 11,
    Mkdir = 12,
    Rm = 13,
    SetPerms = 14,
    WatchEvent = 15,
    Error = 16,
}

/// Largest payload in either direction (XENSTORE_PAYLOAD_MAX); xenstored
/// drops a client that sends more.
pub const PAYLOAD_MAX: usize = 4096;
const HEADER_LEN: usize = 16;

/// xenstored's socket in dom0.
pub const DEFAULT_SOCKET: &str = "/run/xenstored/socket";
/// The xenbus device in a Linux guest.
pub const XENBUS_DEVICE: &str = "/dev/xen/xenbus";

/// One message: header {type, req_id, tx_id, len} in native byte order, then
/// `len` bytes of payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub ty: u32,
    pub req_id: u32,
    pub tx_id: u32,
    pub payload: Vec<u8>,
}

impl Message {
    pub fn encode(&self) -> Result<Vec<u8>, XsError> {
        if self.payload.len() > PAYLOAD_MAX {
            return Err(XsError::InvalidArgument(format!(
                "a XenStore message payload is limited to {PAYLOAD_MAX} bytes, this one has {}",
                self.payload.len()
            )));
        }
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        for v in [self.ty, self.req_id, self.tx_id, self.payload.len() as u32] {
            out.extend_from_slice(&v.to_ne_bytes());
        }
        out.extend_from_slice(&self.payload);
        Ok(out)
    }

    /// Takes one whole message off the front of `buf`, if there is one.
    pub fn decode(buf: &mut Vec<u8>) -> Result<Option<Message>, XsError> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let word = |i: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&buf[i * 4..i * 4 + 4]);
            u32::from_ne_bytes(w)
        };
        let (ty, req_id, tx_id, len) = (word(0), word(1), word(2), word(3) as usize);
        if len > PAYLOAD_MAX {
            return Err(XsError::Protocol(format!(
                "payload of {len} bytes announced, more than {PAYLOAD_MAX}"
            )));
        }
        if buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        buf.drain(..HEADER_LEN + len);
        Ok(Some(Message {
            ty,
            req_id,
            tx_id,
            payload,
        }))
    }
}

/// Payload of nul-terminated strings.
fn strings(parts: &[&str]) -> Vec<u8> {
    let mut p = Vec::new();
    for s in parts {
        p.extend_from_slice(s.as_bytes());
        p.push(0);
    }
    p
}

/// Splits a payload of nul-terminated strings.
fn split_strings(payload: &[u8]) -> Result<Vec<String>, XsError> {
    let body = payload.strip_suffix(&[0]).unwrap_or(payload);
    if body.is_empty() {
        return Ok(Vec::new());
    }
    body.split(|&b| b == 0)
        .map(|s| {
            String::from_utf8(s.to_vec())
                .map_err(|_| XsError::Protocol("a string in a reply is not UTF-8".into()))
        })
        .collect()
}

enum Transport {
    Socket(UnixStream),
    Device(File),
}

impl Transport {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Transport::Socket(s) => s.as_fd(),
            Transport::Device(f) => f.as_fd(),
        }
    }
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Transport::Socket(s) => s.read(buf),
            Transport::Device(f) => f.read(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Transport::Socket(s) => s.write_all(buf),
            Transport::Device(f) => f.write_all(buf),
        }
    }
}

/// Where to reach xenstored, as xenstore-rs looks: `$XENSTORED_PATH` (a
/// socket), else the default socket when it exists, else the xenbus device.
pub fn default_endpoint() -> PathBuf {
    if let Some(p) = std::env::var_os("XENSTORED_PATH") {
        return PathBuf::from(p);
    }
    if Path::new(DEFAULT_SOCKET).exists() {
        PathBuf::from(DEFAULT_SOCKET)
    } else {
        PathBuf::from(XENBUS_DEVICE)
    }
}

/// One connection to xenstored.
pub struct WireClient {
    io: Transport,
    next_req_id: u32,
    inbox: Vec<u8>,
    events: VecDeque<WatchEvent>,
    reply_timeout: Duration,
}

/// How long a reply may take before the connection is considered dead.
pub const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(30);

impl WireClient {
    /// Connects to a socket, or opens a device node (anything that is not a
    /// socket is opened as the xenbus device).
    pub fn open(path: &Path) -> Result<WireClient, XsError> {
        use std::os::unix::fs::FileTypeExt;
        let connect = |source| XsError::Connect {
            path: path.to_path_buf(),
            source,
        };
        let is_socket = std::fs::metadata(path)
            .map_err(connect)?
            .file_type()
            .is_socket();
        let io = if is_socket {
            Transport::Socket(UnixStream::connect(path).map_err(connect)?)
        } else {
            Transport::Device(
                File::options()
                    .read(true)
                    .write(true)
                    .open(path)
                    .map_err(connect)?,
            )
        };
        Ok(WireClient {
            io,
            next_req_id: 1,
            inbox: Vec::new(),
            events: VecDeque::new(),
            reply_timeout: DEFAULT_REPLY_TIMEOUT,
        })
    }

    pub fn set_reply_timeout(&mut self, t: Duration) {
        self.reply_timeout = t;
    }

    /// Reads the next message, waiting until `deadline`; `None` at the
    /// deadline.
    fn next_message(&mut self, deadline: Instant) -> Result<Option<Message>, XsError> {
        loop {
            if let Some(m) = Message::decode(&mut self.inbox)? {
                return Ok(Some(m));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = u16::try_from(left.as_millis().min(u16::MAX as u128)).unwrap_or(u16::MAX);
            let ready = {
                let mut fds = [PollFd::new(self.io.fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::from(ms)) {
                    Ok(n) => n,
                    Err(nix::errno::Errno::EINTR) => 0,
                    Err(e) => return Err(XsError::Io(e.into())),
                }
            };
            if ready == 0 {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                continue;
            }
            let mut buf = [0u8; PAYLOAD_MAX + HEADER_LEN];
            let n = match self.io.read(&mut buf) {
                Ok(0) => return Err(XsError::Closed),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(XsError::Io(e)),
            };
            self.inbox.extend_from_slice(&buf[..n]);
        }
    }

    fn queue_event(&mut self, m: &Message) {
        match split_strings(&m.payload) {
            Ok(parts) if parts.len() >= 2 => self.events.push_back(WatchEvent {
                path: parts[0].clone(),
                token: parts[1].clone(),
            }),
            _ => log::warn!("xenstored sent a malformed watch event; ignored"),
        }
    }

    /// Sends one request and returns the reply's payload.
    pub fn request(
        &mut self,
        ty: MsgType,
        what: &'static str,
        path: &str,
        payload: Vec<u8>,
    ) -> Result<Vec<u8>, XsError> {
        let req_id = self.next_req_id;
        self.next_req_id = self.next_req_id.wrapping_add(1).max(1);
        let msg = Message {
            ty: ty as u32,
            req_id,
            tx_id: 0,
            payload,
        };
        self.io.write_all(&msg.encode()?)?;
        let deadline = Instant::now() + self.reply_timeout;
        loop {
            let Some(m) = self.next_message(deadline)? else {
                return Err(XsError::Timeout {
                    op: what,
                    secs: self.reply_timeout.as_secs(),
                });
            };
            if m.ty == MsgType::WatchEvent as u32 {
                self.queue_event(&m);
                continue;
            }
            if m.req_id != req_id {
                log::debug!("xenstored reply for request {} skipped", m.req_id);
                continue;
            }
            if m.ty == MsgType::Error as u32 {
                let errno = split_strings(&m.payload)?
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                return Err(XsError::Refused {
                    op: what,
                    path: path.to_string(),
                    errno,
                });
            }
            if m.ty != ty as u32 {
                return Err(XsError::Protocol(format!(
                    "reply of type {} to a request of type {}",
                    m.ty, ty as u32
                )));
            }
            return Ok(m.payload);
        }
    }

    pub fn read(&mut self, path: &str) -> Result<Option<String>, XsError> {
        validate_path(path)?;
        match self.request(MsgType::Read, "read", path, strings(&[path])) {
            Ok(v) => Ok(Some(String::from_utf8(v).map_err(|_| {
                XsError::Protocol(format!("the value of {path} is not UTF-8"))
            })?)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn write(&mut self, path: &str, value: &str) -> Result<(), XsError> {
        validate_path(path)?;
        let mut p = strings(&[path]);
        p.extend_from_slice(value.as_bytes());
        self.request(MsgType::Write, "write", path, p).map(drop)
    }

    pub fn mkdir(&mut self, path: &str) -> Result<(), XsError> {
        validate_path(path)?;
        self.request(MsgType::Mkdir, "mkdir", path, strings(&[path]))
            .map(drop)
    }

    pub fn rm(&mut self, path: &str) -> Result<(), XsError> {
        validate_path(path)?;
        match self.request(MsgType::Rm, "rm", path, strings(&[path])) {
            Err(e) if e.is_not_found() => Ok(()),
            r => r.map(drop),
        }
    }

    pub fn directory(&mut self, path: &str) -> Result<Vec<String>, XsError> {
        validate_path(path)?;
        match self.request(MsgType::Directory, "directory", path, strings(&[path])) {
            Ok(p) => split_strings(&p),
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    pub fn get_perms(&mut self, path: &str) -> Result<Vec<Perm>, XsError> {
        validate_path(path)?;
        let p = self.request(MsgType::GetPerms, "get-perms", path, strings(&[path]))?;
        let perms = split_strings(&p)?
            .iter()
            .map(|s| Perm::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        if perms.is_empty() {
            return Err(XsError::Protocol(format!("no permissions for {path}")));
        }
        Ok(perms)
    }

    pub fn set_perms(&mut self, path: &str, perms: &[Perm]) -> Result<(), XsError> {
        validate_path(path)?;
        if perms.is_empty() {
            return Err(XsError::InvalidArgument(
                "a permission list needs at least the owner".into(),
            ));
        }
        let texts: Vec<String> = perms.iter().map(Perm::to_string).collect();
        let mut parts = vec![path];
        parts.extend(texts.iter().map(String::as_str));
        self.request(MsgType::SetPerms, "set-perms", path, strings(&parts))
            .map(drop)
    }

    pub fn get_domain_path(&mut self, domid: u16) -> Result<String, XsError> {
        let d = domid.to_string();
        let p = self.request(
            MsgType::GetDomainPath,
            "get-domain-path",
            &d,
            strings(&[&d]),
        )?;
        split_strings(&p)?
            .into_iter()
            .next()
            .ok_or_else(|| XsError::Protocol("empty domain path".into()))
    }

    pub fn watch(&mut self, path: &str, token: &str) -> Result<(), XsError> {
        validate_path(path)?;
        self.request(MsgType::Watch, "watch", path, strings(&[path, token]))
            .map(drop)
    }

    pub fn unwatch(&mut self, path: &str, token: &str) -> Result<(), XsError> {
        validate_path(path)?;
        self.request(MsgType::Unwatch, "unwatch", path, strings(&[path, token]))
            .map(drop)
    }

    /// The next watch event, waiting at most `timeout`.
    pub fn wait_event(&mut self, timeout: Duration) -> Result<Option<WatchEvent>, XsError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.events.pop_front() {
                return Ok(Some(e));
            }
            let Some(m) = self.next_message(deadline)? else {
                return Ok(None);
            };
            if m.ty == MsgType::WatchEvent as u32 {
                self.queue_event(&m);
            } else {
                log::debug!("unexpected xenstored message of type {} skipped", m.ty);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn framing_round_trip_and_limits() {
        let m = Message {
            ty: MsgType::Write as u32,
            req_id: 7,
            tx_id: 0,
            payload: b"a\0b".to_vec(),
        };
        let mut bytes = m.encode().unwrap();
        assert_eq!(bytes.len(), 16 + 3);
        assert_eq!(&bytes[0..4], &11u32.to_ne_bytes());
        assert_eq!(&bytes[4..8], &7u32.to_ne_bytes());
        assert_eq!(&bytes[12..16], &3u32.to_ne_bytes());
        let mut partial = bytes[..10].to_vec();
        assert_eq!(Message::decode(&mut partial).unwrap(), None);
        bytes.extend_from_slice(&bytes.clone());
        assert_eq!(Message::decode(&mut bytes).unwrap(), Some(m.clone()));
        assert_eq!(Message::decode(&mut bytes).unwrap(), Some(m));
        assert!(bytes.is_empty());
        let mut huge = Vec::new();
        for v in [2u32, 1, 0, 1 << 20] {
            huge.extend_from_slice(&v.to_ne_bytes());
        }
        assert!(Message::decode(&mut huge).is_err());
        let too_big = Message {
            ty: 11,
            req_id: 1,
            tx_id: 0,
            payload: vec![b'x'; PAYLOAD_MAX + 1],
        };
        assert!(too_big.encode().is_err());
    }

    /// A scripted xenstored on a real socket pair: the client must queue a
    /// watch event that arrives before its reply, match the reply by id, and
    /// turn error replies into errno names.
    #[test]
    fn client_matches_replies_and_queues_events() {
        let dir = std::env::temp_dir().join(format!("crane-xs-wire-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("socket");
        let listener = UnixListener::bind(&sock).unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut inbox = Vec::new();
            let next = |s: &mut UnixStream, inbox: &mut Vec<u8>| loop {
                if let Some(m) = Message::decode(inbox).unwrap() {
                    return m;
                }
                let mut b = [0u8; 512];
                let n = s.read(&mut b).unwrap();
                inbox.extend_from_slice(&b[..n]);
            };
            let send = |s: &mut UnixStream, ty: u32, req_id: u32, p: &[u8]| {
                let m = Message {
                    ty,
                    req_id,
                    tx_id: 0,
                    payload: p.to_vec(),
                };
                s.write_all(&m.encode().unwrap()).unwrap();
            };
            // WATCH: an event first, then the reply.
            let w = next(&mut s, &mut inbox);
            assert_eq!(w.ty, MsgType::Watch as u32);
            assert_eq!(w.payload, b"crane\0tok\0");
            send(&mut s, 15, 0, b"crane\0tok\0");
            send(&mut s, 4, w.req_id, b"OK\0");
            // GET_PERMS.
            let g = next(&mut s, &mut inbox);
            assert_eq!(g.payload, b"crane/request\0");
            send(&mut s, 3, g.req_id, b"n0\0r5\0");
            // READ of a missing node: error reply.
            let r = next(&mut s, &mut inbox);
            send(&mut s, 16, r.req_id, b"ENOENT\0");
            // SET_PERMS payload form.
            let p = next(&mut s, &mut inbox);
            assert_eq!(p.payload, b"crane/agent\0n5\0r0\0");
            send(&mut s, 16, p.req_id, b"EACCES\0");
            // WRITE payload has no trailing nul.
            let wr = next(&mut s, &mut inbox);
            assert_eq!(wr.payload, b"crane/x\0v 1");
            send(&mut s, 11, wr.req_id, b"OK\0");
            // Hold the connection until the client is done.
            let _ = done_rx.recv();
        });
        let mut c = WireClient::open(&sock).unwrap();
        c.watch("crane", "tok").unwrap();
        assert_eq!(
            c.get_perms("crane/request").unwrap(),
            vec![
                Perm::new(0, crate::perms::Access::None),
                Perm::new(5, crate::perms::Access::Read)
            ]
        );
        assert_eq!(c.read("crane/none").unwrap(), None);
        let e = c
            .set_perms(
                "crane/agent",
                &[
                    Perm::new(5, crate::perms::Access::None),
                    Perm::new(0, crate::perms::Access::Read),
                ],
            )
            .unwrap_err();
        assert!(e.is_access_denied(), "{e}");
        c.write("crane/x", "v 1").unwrap();
        let ev = c.wait_event(Duration::from_millis(10)).unwrap().unwrap();
        assert_eq!(ev.path, "crane");
        assert_eq!(ev.token, "tok");
        assert_eq!(c.wait_event(Duration::from_millis(20)).unwrap(), None);
        done_tx.send(()).unwrap();
        server.join().unwrap();
        assert!(matches!(
            c.wait_event(Duration::from_secs(5)),
            Err(XsError::Closed)
        ));
        assert!(c.read("bad path").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
