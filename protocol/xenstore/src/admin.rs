//! The second migration trigger: requests an administrator or a management
//! stack writes into dom0's own tree, and the results the dom0 service writes
//! back (the first trigger is the `xl` wrapper). One request per guest:
//!
//! ```text
//! /local/domain/0/crane/requests/<guest>  id=4 op=migrate dest=host1 mode=remote
//! /local/domain/0/crane/results/<guest>   id=4 state=working phase=transfer ms=5120
//!                                         id=4 state=done ms=48210 pre-stop-ms=812.4
//! ```
//!
//! `id` orders requests: the service acts on a request whose `id` is larger
//! than the last result's, once. dom0's home is readable and writable by dom0
//! only, so no guest can post here; the service still checks that dom0 owns
//! the node and nobody else may write it, and parses the value as strictly as
//! everything else crane reads from XenStore.

use crate::layout::{DOM0_REQUESTS, DOM0_RESULTS, MAX_REQUEST_LEN};
use crate::value::{Fields, ValueError, bad_value, clip_error, format_ms, parse_ms};

/// Longest destination (an `xl migrate` host argument).
pub const MAX_DEST_LEN: usize = 255;
/// Longest result value (an error text of MAX_ERROR_CHARS, percent-encoded,
/// fits).
pub const MAX_RESULT_LEN: usize = 1280;

/// The request key of one guest (absolute).
pub fn request_key(guest: &str) -> String {
    format!("{DOM0_REQUESTS}/{guest}")
}

/// The result key of one guest (absolute).
pub fn result_key(guest: &str) -> String {
    format!("{DOM0_RESULTS}/{guest}")
}

/// How the guest's processes leave the GPU while the domain moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveMode {
    /// They keep running on crane-proxy.
    Remote,
    /// They are parked in RAM until the domain runs again.
    StopAndCopy,
}

impl MoveMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MoveMode::Remote => "remote",
            MoveMode::StopAndCopy => "stop-and-copy",
        }
    }
}

/// What an administrator asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminOp {
    /// `xl migrate [-s SSH_COMMAND] <guest> <dest>` with crane's choreography
    /// around it. `ssh_command` is xl's `-s` (an empty one makes xl run
    /// `dest` as the transport command itself).
    Migrate {
        dest: String,
        mode: MoveMode,
        ssh_command: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminRequest {
    pub id: u64,
    pub op: AdminOp,
}

impl AdminRequest {
    pub fn format(&self) -> String {
        let mut f = Fields::new();
        f.push("id", self.id.to_string());
        match &self.op {
            AdminOp::Migrate {
                dest,
                mode,
                ssh_command,
            } => {
                f.push("op", "migrate")
                    .push("dest", dest.clone())
                    .push("mode", mode.as_str());
                if let Some(s) = ssh_command {
                    f.push("ssh-command", s.clone());
                }
            }
        }
        f.format()
    }

    /// The id alone, for a value that does not parse otherwise (so that the
    /// rejection can name the request it rejects); 0 when even that fails.
    pub fn salvage_id(s: &str) -> u64 {
        Fields::parse(s, MAX_REQUEST_LEN)
            .ok()
            .and_then(|mut f| f.u64("id").ok().flatten())
            .unwrap_or(0)
    }

    pub fn parse(s: &str) -> Result<AdminRequest, ValueError> {
        let mut f = Fields::parse(s, MAX_REQUEST_LEN)?;
        let id = f.required_u64("id")?;
        if id == 0 {
            return Err(bad_value("id", "0", "ids start at 1"));
        }
        let op = f.required("op")?;
        let op = match op.as_str() {
            "migrate" => {
                let dest = f.required("dest")?;
                if dest.is_empty() || dest.len() > MAX_DEST_LEN {
                    return Err(bad_value("dest", &dest, "want 1 to 255 characters"));
                }
                if dest.starts_with('-') {
                    return Err(bad_value("dest", &dest, "must not look like an option"));
                }
                let mode = match f.take("mode").as_deref() {
                    None | Some("remote") => MoveMode::Remote,
                    Some("stop-and-copy") => MoveMode::StopAndCopy,
                    Some(other) => {
                        return Err(bad_value("mode", other, "want remote or stop-and-copy"));
                    }
                };
                let ssh_command = f.take("ssh-command");
                if let Some(s) = &ssh_command
                    && s.len() > MAX_DEST_LEN
                {
                    return Err(bad_value("ssh-command", s, "longer than 255 characters"));
                }
                AdminOp::Migrate {
                    dest,
                    mode,
                    ssh_command,
                }
            }
            other => return Err(bad_value("op", other, "want migrate")),
        };
        f.finish()?;
        Ok(AdminRequest { id, op })
    }
}

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminState {
    /// Accepted and under way; `phase` names the step.
    Working,
    /// The guest left (or moved) as asked.
    Done,
    /// It failed; `error` says why and how the rollback went.
    Failed,
    /// Not acted upon (malformed, not allowed, or the guest is busy).
    Rejected,
}

impl AdminState {
    pub fn as_str(self) -> &'static str {
        match self {
            AdminState::Working => "working",
            AdminState::Done => "done",
            AdminState::Failed => "failed",
            AdminState::Rejected => "rejected",
        }
    }

    fn parse(s: &str) -> Result<AdminState, ValueError> {
        Ok(match s {
            "working" => AdminState::Working,
            "done" => AdminState::Done,
            "failed" => AdminState::Failed,
            "rejected" => AdminState::Rejected,
            other => return Err(bad_value("state", other, "unknown state")),
        })
    }

    /// Whether the request is over.
    pub fn is_final(self) -> bool {
        self != AdminState::Working
    }
}

/// The service's answer, rewritten as the request progresses.
#[derive(Debug, Clone, PartialEq)]
pub struct AdminResult {
    pub id: u64,
    pub state: AdminState,
    /// The step under way (working) or the last one taken.
    pub phase: Option<String>,
    /// Milliseconds since the request was taken up.
    pub ms: u64,
    /// The longest time a process of the guest was stopped by the
    /// pre-migration (its switch to remote or its suspension).
    pub pre_stop_ms: Option<f64>,
    /// Bytes the transfer moved, when known.
    pub bytes: Option<u64>,
    pub error: Option<String>,
}

impl AdminResult {
    pub fn new(id: u64, state: AdminState) -> AdminResult {
        AdminResult {
            id,
            state,
            phase: None,
            ms: 0,
            pre_stop_ms: None,
            bytes: None,
            error: None,
        }
    }

    pub fn format(&self) -> String {
        let mut f = Fields::new();
        f.push("id", self.id.to_string())
            .push("state", self.state.as_str());
        if let Some(p) = &self.phase {
            f.push("phase", p.clone());
        }
        f.push("ms", self.ms.to_string());
        if let Some(s) = self.pre_stop_ms {
            f.push("pre-stop-ms", format_ms(s));
        }
        if let Some(b) = self.bytes {
            f.push("bytes", b.to_string());
        }
        if let Some(e) = &self.error {
            f.push("error", clip_error(e));
        }
        f.format()
    }

    pub fn parse(s: &str) -> Result<AdminResult, ValueError> {
        let mut f = Fields::parse(s, MAX_RESULT_LEN)?;
        let id = f.required_u64("id")?;
        let state = AdminState::parse(&f.required("state")?)?;
        let phase = f.take("phase");
        let ms = f.required_u64("ms")?;
        let pre_stop_ms = match f.take("pre-stop-ms") {
            Some(v) => Some(parse_ms("pre-stop-ms", &v)?),
            None => None,
        };
        let bytes = f.u64("bytes")?;
        let error = f.take("error");
        f.finish()?;
        Ok(AdminResult {
            id,
            state,
            phase,
            ms,
            pre_stop_ms,
            bytes,
            error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_default_to_remote() {
        let r = AdminRequest::parse("id=4 op=migrate dest=host1").unwrap();
        assert_eq!(
            r,
            AdminRequest {
                id: 4,
                op: AdminOp::Migrate {
                    dest: "host1".into(),
                    mode: MoveMode::Remote,
                    ssh_command: None
                }
            }
        );
        let r = AdminRequest {
            id: 9,
            op: AdminOp::Migrate {
                dest: "socat - TCP:10.77.0.11:8002".into(),
                mode: MoveMode::StopAndCopy,
                ssh_command: Some(String::new()),
            },
        };
        let text = r.format();
        assert_eq!(
            text,
            "id=9 op=migrate dest=socat%20-%20TCP:10.77.0.11:8002 mode=stop-and-copy ssh-command="
        );
        assert_eq!(AdminRequest::parse(&text).unwrap(), r);
    }

    #[test]
    fn hostile_requests_say_what_is_wrong() {
        for (text, want) in [
            ("", "empty"),
            ("id=0 op=migrate dest=h", "ids start at 1"),
            ("id=1 op=destroy dest=h", "want migrate"),
            ("id=1 op=migrate", "dest is missing"),
            ("id=1 op=migrate dest=", "1 to 255"),
            ("id=1 op=migrate dest=--help", "option"),
            (
                "id=1 op=migrate dest=h mode=fast",
                "remote or stop-and-copy",
            ),
            ("id=1 op=migrate dest=h extra=1", "unknown key extra"),
            ("id=01 op=migrate dest=h", "decimal"),
            ("id=1 op=migrate dest=h\n", "printable"),
        ] {
            let e = AdminRequest::parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let long = format!("id=1 op=migrate dest={}", "a".repeat(300));
        assert!(AdminRequest::parse(&long).is_err());
        assert!(AdminRequest::parse(&"x".repeat(5000)).is_err());
        assert_eq!(AdminRequest::salvage_id("id=7 op=explode"), 7);
        assert_eq!(AdminRequest::salvage_id("garbage"), 0);
    }

    #[test]
    fn results_round_trip() {
        let mut r = AdminResult::new(4, AdminState::Working);
        r.phase = Some("transfer".into());
        r.ms = 5120;
        assert_eq!(r.format(), "id=4 state=working phase=transfer ms=5120");
        assert_eq!(AdminResult::parse(&r.format()).unwrap(), r);
        let mut r = AdminResult::new(4, AdminState::Failed);
        r.ms = 2;
        r.pre_stop_ms = Some(812.4);
        r.bytes = Some(1 << 30);
        r.error = Some("xl migrate failed: status 1; rolled back".into());
        assert_eq!(AdminResult::parse(&r.format()).unwrap(), r);
        assert!(AdminResult::parse("id=4 state=maybe ms=1").is_err());
        assert!(AdminState::Done.is_final() && !AdminState::Working.is_final());
    }
}
