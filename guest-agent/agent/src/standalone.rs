//! `crane-agent --standalone`: the agent without Xen, for a plain Linux box.
//! It keeps an in-process XenStore ([`MemStore`]) where it plays the guest
//! (the configured domid) and, on a unix socket, plays dom0 for `cranectl
//! agent ...`: each command is posted through the same dom0 API the dom0
//! service uses ([`GuestChannel`]), and the agent's answer read back from the
//! keys. So the whole XenStore path (permissions, sequence numbers, watches,
//! strict parsing) runs as it does under Xen. One JSON line per connection
//! each way.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crane_xs::dom0::GuestChannel;
use crane_xs::mem::{MemConn, MemStore};
use crane_xs::message::{MigrateMode, Op, ResumeTarget};
use serde::{Deserialize, Serialize};

/// Largest command line accepted.
const MAX_LINE: u64 = 64 * 1024;
/// How long past a request's deadline cranectl's answer may take.
const ANSWER_SLACK: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum CtlRequest {
    PrepareMigrate {
        /// `remote` or `stop-and-copy`.
        mode: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proxy: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline_ms: Option<u64>,
    },
    PrepareResume {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline_ms: Option<u64>,
        /// A device spec (see `crane_xs::message::ResumeTarget`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
        /// No GPU is attached.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        no_gpu: bool,
    },
    Status,
}

/// The raw XenStore values involved, for cranectl to parse with crane-xs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CtlReply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The request as posted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// `crane/agent/response`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    /// `crane/agent/apps/*` of that response.
    #[serde(default)]
    pub apps: Vec<String>,
    /// `crane/agent/state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// Sends one command to a standalone agent.
pub fn call(socket: &Path, req: &CtlRequest, timeout: Duration) -> std::io::Result<CtlReply> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(timeout))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    s.write_all(&line)?;
    let mut out = String::new();
    BufReader::new(s.take(16 << 20)).read_line(&mut out)?;
    serde_json::from_str(&out).map_err(std::io::Error::other)
}

/// The store and dom0's side of it.
pub struct Standalone {
    pub store: MemStore,
    pub domid: u16,
}

impl Standalone {
    /// A store with the guest's home and crane keys set up as dom0 would.
    pub fn new(domid: u16) -> Result<Standalone, crane_xs::dom0::Dom0Error> {
        let store = MemStore::new();
        store.introduce(domid);
        GuestChannel::new(&store.connect(0), domid).setup()?;
        Ok(Standalone { store, domid })
    }

    /// The guest's connection, for the agent.
    pub fn guest(&self) -> MemConn {
        self.store.connect(self.domid)
    }

    /// Serves cranectl on `socket` (mode 0600) on a thread.
    pub fn serve(&self, socket: PathBuf) -> std::io::Result<()> {
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let listener = crane_control::listen_at(&socket)?;
        let dom0 = self.store.connect(0);
        let domid = self.domid;
        std::thread::Builder::new()
            .name("crane-agent-ctl".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    match conn {
                        Ok(s) => serve_one(&dom0, domid, s),
                        Err(e) => log::warn!("cranectl connection: {e}"),
                    }
                }
            })?;
        Ok(())
    }
}

fn serve_one(dom0: &MemConn, domid: u16, s: UnixStream) {
    let mut line = String::new();
    let reply = match BufReader::new((&s).take(MAX_LINE)).read_line(&mut line) {
        Err(e) => failure(format!("cannot read the command: {e}")),
        Ok(_) => match serde_json::from_str::<CtlRequest>(&line) {
            Err(e) => failure(format!("malformed command: {e}")),
            Ok(req) => execute(dom0, domid, req),
        },
    };
    let mut out = serde_json::to_vec(&reply).unwrap_or_default();
    out.push(b'\n');
    let _ = (&s).write_all(&out);
}

fn failure(error: String) -> CtlReply {
    CtlReply {
        ok: false,
        error: Some(error),
        ..CtlReply::default()
    }
}

fn execute(dom0: &MemConn, domid: u16, req: CtlRequest) -> CtlReply {
    let ch = GuestChannel::new(dom0, domid);
    let (op, deadline_ms) = match req {
        CtlRequest::Status => {
            return CtlReply {
                ok: true,
                state: ch.agent_state().ok().flatten().map(|s| s.format()),
                response: ch.response().ok().flatten().map(|r| r.format()),
                ..CtlReply::default()
            };
        }
        CtlRequest::PrepareResume {
            deadline_ms,
            device,
            no_gpu,
        } => (
            Op::PrepareResume(ResumeTarget { device, no_gpu }),
            deadline_ms,
        ),
        CtlRequest::PrepareMigrate {
            mode,
            proxy,
            token,
            deadline_ms,
        } => {
            let mode = match (mode.as_str(), proxy) {
                ("stop-and-copy", None) => MigrateMode::StopAndCopy,
                ("remote", Some(proxy)) => MigrateMode::Remote { proxy, token },
                ("remote", None) => return failure("remote mode needs a proxy address".into()),
                ("stop-and-copy", Some(_)) => {
                    return failure("stop-and-copy takes no proxy address".into());
                }
                (m, _) => return failure(format!("unknown mode {m:?}")),
            };
            (Op::PrepareMigrate(mode), deadline_ms)
        }
    };
    let posted = match ch.post(op, deadline_ms) {
        Ok(r) => r,
        Err(e) => return failure(e.to_string()),
    };
    // The agent's own default applies when the request has none; wait long
    // enough for the longest it may take.
    let wait = Duration::from_millis(deadline_ms.unwrap_or(crane_xs::message::MAX_DEADLINE_MS))
        + ANSWER_SLACK;
    let response = match ch.wait_answer(posted.seq, wait) {
        Ok(r) => r,
        Err(e) => return failure(e.to_string()),
    };
    let apps = match ch.app_results(posted.seq) {
        Ok(a) => a.iter().map(|a| a.format()).collect(),
        Err(e) => return failure(e.to_string()),
    };
    CtlReply {
        ok: true,
        error: None,
        request: Some(posted.format()),
        response: Some(response.format()),
        apps,
        state: ch.agent_state().ok().flatten().map(|s| s.format()),
    }
}
