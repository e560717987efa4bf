//! The host side of the command channel to dom0's `crane-runner`
//! (test-vms/runner holds the other side and the protocol, [`crane_testbed_runner::proto`]).
//!
//! dom0's runner listens on the emulated machine's second serial port, which QEMU
//! connects to a Unix socket under the testbed's state directory. The channel is
//! line-based and 7-bit clean (base64 payloads), so it survives any tty setting, and
//! answers carry the request's id, so noise and answers to earlier, abandoned requests
//! are skipped.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot connect to the command channel {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("the command channel failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("no answer from the command runner within {0:?}")]
    Timeout(Duration),
    #[error("the command runner sent output that is not base64: {0}")]
    Garbled(#[from] base64::DecodeError),
    #[error("the command channel closed before the answer ended")]
    Closed,
}

pub use crane_testbed_runner::proto::{AnswerParser, CommandOutput, request_line};

/// A unique request id (the process id keeps concurrent clients apart).
pub fn new_request_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("h{}x{nanos:x}", std::process::id())
}

/// Sends `script` over the channel at `socket` and waits up to `timeout` (plus a
/// margin for the transfer) for its answer. The runner itself stops the script at
/// `timeout`.
pub fn run(socket: &Path, script: &str, timeout: Duration) -> Result<CommandOutput, ControlError> {
    let stream = UnixStream::connect(socket).map_err(|source| ControlError::Connect {
        path: socket.display().to_string(),
        source,
    })?;
    let id = new_request_id();
    let deadline = Instant::now() + timeout + Duration::from_secs(30);
    (&stream).write_all(request_line(&id, timeout, script).as_bytes())?;
    read_answer(&stream, &id, deadline, timeout)
}

fn read_answer(
    stream: &UnixStream,
    id: &str,
    deadline: Instant,
    timeout: Duration,
) -> Result<CommandOutput, ControlError> {
    let mut parser = AnswerParser::new(id);
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ControlError::Timeout(timeout));
        }
        stream.set_read_timeout(Some(left))?;
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return Err(ControlError::Closed),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ControlError::Timeout(timeout));
            }
            Err(e) => return Err(e.into()),
        }
        if let Some(output) = parser.feed(&String::from_utf8_lossy(&line))? {
            return Ok(output);
        }
    }
}

/// One quick request, for telling whether the runner is up yet: `Ok(true)` once it
/// answered within `wait`.
pub fn ping(socket: &Path, wait: Duration) -> Result<bool, ControlError> {
    let stream = UnixStream::connect(socket).map_err(|source| ControlError::Connect {
        path: socket.display().to_string(),
        source,
    })?;
    let id = new_request_id();
    (&stream)
        .write_all(request_line(&id, Duration::from_secs(5), "echo crane-ready").as_bytes())?;
    match read_answer(&stream, &id, Instant::now() + wait, wait) {
        Ok(output) => Ok(output.stdout == b"crane-ready\n"),
        Err(ControlError::Timeout(_)) => Ok(false),
        Err(e) => Err(e),
    }
}
