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

/// While an answer is awaited, a line of noise (which the runner skips) goes
/// to the runner after each second of silence: a byte arriving on dom0's
/// serial port is a device interrupt, and a device interrupt wakes an
/// emulated CPU that QEMU 7.2's software emulation left halted with its
/// timer interrupt pending and undelivered (a lost wake-up: its
/// `interrupt_request` is updated without atomics when Xen enters a guest
/// with an interrupt window, fixed upstream only in QEMU 10.2;
/// docs/testbed.md, "Known traps"). Without it the soak's emulated host
/// stalled for good after 6 to 16 moves.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
const NOISE: &[u8] = b"#\n";

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
        stream.set_read_timeout(Some(left.min(HEARTBEAT)))?;
        // A read cut short by the timeout keeps what it read in `line`.
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return Err(ControlError::Closed),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if Instant::now() < deadline {
                    (&*stream).write_all(NOISE)?;
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        if !line.ends_with(b"\n") {
            continue;
        }
        let fed = parser.feed(&String::from_utf8_lossy(&line))?;
        line.clear();
        if let Some(output) = fed {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crane_testbed_runner::proto::{Incoming, answer, parse_incoming};
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    /// A runner that takes 2.6 s over a request, its answer split around
    /// the wait: the client sends a noise line after each second of
    /// silence (the heartbeat), the runner skips them as noise, and the
    /// answer still arrives whole.
    #[test]
    fn a_long_request_is_kept_alive_with_noise_the_runner_skips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(s.try_clone().unwrap());
            let mut request = String::new();
            reader.read_line(&mut request).unwrap();
            let Incoming::Run { id, .. } = parse_incoming(&request) else {
                panic!("not a request: {request}");
            };
            let full = answer(&id, b"done\n", b"", 0);
            let (head, tail) = full.split_at(full.len() / 2);
            s.write_all(head.as_bytes()).unwrap();
            let mut seen = Vec::new();
            let until = Instant::now() + Duration::from_millis(2600);
            while Instant::now() < until {
                s.set_read_timeout(Some(until - Instant::now())).unwrap();
                let mut b = [0u8; 64];
                match s.read(&mut b) {
                    Ok(n) => seen.extend_from_slice(&b[..n]),
                    Err(_) => break,
                }
            }
            s.write_all(tail.as_bytes()).unwrap();
            let text = String::from_utf8(seen).unwrap();
            for l in text.lines() {
                assert!(matches!(parse_incoming(l), Incoming::Noise), "{l:?}");
            }
            text.lines().count()
        });
        let out = run(&path, "sleep 2.6", Duration::from_secs(10)).unwrap();
        assert_eq!(out.stdout, b"done\n");
        let beats = fake.join().unwrap();
        assert!((2..=3).contains(&beats), "{beats} heartbeat(s)");
    }
}
