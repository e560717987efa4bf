//! The host side of the command channel to a domain's `crane-runner`
//! (test-vms/files/crane-runner holds the other side and the protocol's description).
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

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

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

/// What a command run in a domain produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The exit status of the script (124 or 143 when the runner's timeout stopped it).
    pub status: i32,
}

impl CommandOutput {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    pub fn success(&self) -> bool {
        self.status == 0
    }
}

/// Renders one request line.
pub fn request_line(id: &str, timeout: Duration, script: &str) -> String {
    format!(
        "CRANE-RUN {id} {} {}\n",
        timeout.as_secs().max(1),
        STANDARD.encode(script.as_bytes())
    )
}

/// Collects the answer to request `id` from the lines of a channel.
#[derive(Debug, Default)]
pub struct AnswerParser {
    id: String,
    started: bool,
    stdout: String,
    stderr: String,
}

impl AnswerParser {
    pub fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            ..Self::default()
        }
    }

    /// Feeds one line; returns the complete output once the answer's end line arrives.
    pub fn feed(&mut self, raw: &str) -> Result<Option<CommandOutput>, ControlError> {
        let line = raw.trim_end_matches(['\r', '\n']);
        let Some(rest) = line.strip_prefix("CRANE-") else {
            if self.started {
                if let Some(data) = line.strip_prefix("O ") {
                    self.stdout.push_str(data.trim());
                } else if let Some(data) = line.strip_prefix("E ") {
                    self.stderr.push_str(data.trim());
                }
            }
            return Ok(None);
        };
        let mut words = rest.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("BEGIN"), Some(id), None) if id == self.id => {
                self.started = true;
                self.stdout.clear();
                self.stderr.clear();
            }
            (Some("END"), Some(id), Some(status)) if id == self.id && self.started => {
                return Ok(Some(CommandOutput {
                    stdout: STANDARD.decode(&self.stdout)?,
                    stderr: STANDARD.decode(&self.stderr)?,
                    status: status.parse().unwrap_or(-1),
                }));
            }
            _ => {}
        }
        Ok(None)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_an_answer_among_noise() {
        let mut parser = AnswerParser::new("h1");
        let stdout = STANDARD.encode(b"hello\nworld\n");
        let lines = [
            "[  1.0] e1000: eth0 up\r\n".to_owned(),
            "CRANE-BEGIN h0\n".to_owned(),
            "O aWdub3JlZA==\n".to_owned(),
            "CRANE-END h0 3\n".to_owned(),
            "CRANE-BEGIN h1\n".to_owned(),
            format!("O {}\n", &stdout[..8]),
            format!("O {}\n", &stdout[8..]),
            "E ZXJy\n".to_owned(),
        ];
        for line in &lines {
            assert_eq!(parser.feed(line).unwrap(), None);
        }
        let output = parser.feed("CRANE-END h1 7\n").unwrap().unwrap();
        assert_eq!(output.stdout, b"hello\nworld\n");
        assert_eq!(output.stderr, b"err");
        assert_eq!(output.status, 7);
    }

    #[test]
    fn request_lines_are_single_base64_lines() {
        let line = request_line("h9", Duration::from_secs(0), "echo a\necho b\n");
        assert!(line.starts_with("CRANE-RUN h9 1 "));
        assert_eq!(line.matches('\n').count(), 1);
        let payload = line.trim_end().rsplit(' ').next().unwrap();
        assert_eq!(STANDARD.decode(payload).unwrap(), b"echo a\necho b\n");
    }

    /// The real runner script, run by a real shell over a socket pair, answers the way
    /// the parser expects (the emulated host runs the same script on a serial port).
    #[test]
    fn real_runner_script_round_trip() {
        let runner = Path::new(env!("CARGO_MANIFEST_DIR")).join("files/crane-runner");
        let dir = std::env::temp_dir().join(format!("crane-runner-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo_in = dir.join("in");
        let fifo_out = dir.join("out");
        for f in [&fifo_in, &fifo_out] {
            nix::unistd::mkfifo(f, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        }
        // The runner opens one device read-write; a small shell glue joins two fifos.
        let script = std::fs::read_to_string(&runner)
            .unwrap()
            .replace("stty -F \"$dev\" raw -echo\n", "")
            .replace("while read -r -t 1 stale <&3; do :; done\n", "")
            .replace("exec 3<>\"$dev\"", "exec 3<\"$dev\" 4>\"$OUT\"")
            .replace(">&3", ">&4")
            .replace(
                "/tmp/crane-run.answer",
                &dir.join("answer").display().to_string(),
            );
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("crane-runner")
            .arg(&fifo_in)
            .env("OUT", &fifo_out)
            .spawn()
            .unwrap();
        let mut to_runner = std::fs::OpenOptions::new()
            .write(true)
            .open(&fifo_in)
            .unwrap();
        let from_runner = std::fs::File::open(&fifo_out).unwrap();
        to_runner.write_all(b"garbage line\n").unwrap();
        // The script counts its runs in a file: a resent request must not run again.
        let runs = dir.join("runs");
        let request = request_line(
            "t1",
            Duration::from_secs(5),
            &format!(
                "echo run >> {}; echo out; echo err >&2; exit 5",
                runs.display()
            ),
        );
        to_runner.write_all(request.as_bytes()).unwrap();
        let mut reader = BufReader::new(from_runner);
        let mut next_line = || {
            let mut line = String::new();
            assert_ne!(
                reader.read_line(&mut line).unwrap(),
                0,
                "runner closed early"
            );
            line
        };
        let answer = |next_line: &mut dyn FnMut() -> String| {
            let mut parser = AnswerParser::new("t1");
            let mut acked = false;
            loop {
                let line = next_line();
                acked |= line == "CRANE-ACK t1\n";
                if let Some(output) = parser.feed(&line).unwrap() {
                    assert!(acked, "answered without an acknowledgement");
                    break output;
                }
            }
        };
        let output = answer(&mut next_line);
        assert_eq!(output.stdout, b"out\n");
        assert_eq!(output.stderr, b"err\n");
        assert_eq!(output.status, 5);
        // A client that missed the answer asks again: acknowledged and answered again,
        // not run again. A keep-alive gets a line back.
        to_runner.write_all(request.as_bytes()).unwrap();
        assert_eq!(answer(&mut next_line), output);
        to_runner.write_all(b"\n").unwrap();
        assert_eq!(next_line(), "CRANE-IDLE t1 ended\n");
        assert_eq!(std::fs::read_to_string(&runs).unwrap(), "run\n");
        drop(to_runner);
        child.wait().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
