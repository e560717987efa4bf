//! The line protocol (7-bit clean, so any tty setting carries it):
//!
//! ```text
//! request:   CRANE-RUN <id> <timeout-seconds> <base64 of the script>
//! response:  CRANE-ACK <id>               (at once, before the script runs)
//!            CRANE-BEGIN <id>
//!            O <base64 of stdout>...      E <base64 of stderr>...
//!            CRANE-END <id> <exit status>
//! keep-alive: an empty line, answered CRANE-IDLE <last id> ended | CRANE-IDLE - none
//! ```
//!
//! The runner reads nothing while a script runs, so an IDLE always means the
//! last request has ended. Anything else on the line (boot noise, half lines
//! from before the runner started) is ignored; clients match answers to their
//! requests by id. A request with the id of the last one is not run again: it
//! is acknowledged again and, once its script has ended, answered again (a
//! client that lost the answer asks again).
//!
//! Why keep-alives are answered: an emulated console can lose a notification
//! (seen after `xl restore` and `xl migrate`, under load), leaving an answer in
//! the console ring until the domain writes again; each write notifies anew.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// Renders one request line.
pub fn request_line(id: &str, timeout: Duration, script: &str) -> String {
    format!(
        "CRANE-RUN {id} {} {}\n",
        timeout.as_secs().max(1),
        STANDARD.encode(script.as_bytes())
    )
}

/// A request as the runner reads it.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    /// An empty line: a waiting client's keep-alive.
    KeepAlive,
    Run {
        id: String,
        limit: Duration,
        /// The script, or why it could not be decoded.
        script: Result<Vec<u8>, String>,
    },
    /// Anything else.
    Noise,
}

/// Reads one line (without its end) the way the runner does.
pub fn parse_incoming(line: &str) -> Incoming {
    let line = line.trim_end_matches(['\r', '\n']);
    if line.trim().is_empty() {
        return Incoming::KeepAlive;
    }
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next(), words.next()) {
        (Some("CRANE-RUN"), Some(id), Some(limit), payload) => {
            // A limit that is not a number counts as the shortest.
            let limit = Duration::from_secs(limit.parse::<u64>().unwrap_or(1).max(1));
            let script = match payload {
                Some(p) => STANDARD
                    .decode(p)
                    .map_err(|e| format!("request {id} is not valid base64: {e}")),
                None => Ok(Vec::new()),
            };
            Incoming::Run {
                id: id.to_owned(),
                limit,
                script,
            }
        }
        _ => Incoming::Noise,
    }
}

/// The answer lines for a request that ended with `status`.
pub fn answer(id: &str, stdout: &[u8], stderr: &[u8], status: i32) -> String {
    let mut out = format!("CRANE-BEGIN {id}\n");
    for (tag, data) in [("O", stdout), ("E", stderr)] {
        // 76 columns, as base64(1) wraps: short lines pass any tty unharmed.
        let encoded = STANDARD.encode(data);
        for chunk in encoded.as_bytes().chunks(76) {
            out.push_str(tag);
            out.push(' ');
            out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
            out.push('\n');
        }
    }
    out.push_str(&format!("CRANE-END {id} {status}\n"));
    out
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

    /// Whether the answer's BEGIN line has come.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Feeds one line; returns the complete output once the answer's end line
    /// arrives. A BEGIN seen again (a resent request answered twice) starts over.
    pub fn feed(&mut self, raw: &str) -> Result<Option<CommandOutput>, base64::DecodeError> {
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
    fn request_lines_are_single_base64_lines_the_runner_reads_back() {
        let line = request_line("h9", Duration::from_secs(0), "echo a\necho b\n");
        assert!(line.starts_with("CRANE-RUN h9 1 "));
        assert_eq!(line.matches('\n').count(), 1);
        assert_eq!(
            parse_incoming(&line),
            Incoming::Run {
                id: "h9".into(),
                limit: Duration::from_secs(1),
                script: Ok(b"echo a\necho b\n".to_vec()),
            }
        );
        assert_eq!(parse_incoming("\r\n"), Incoming::KeepAlive);
        assert_eq!(parse_incoming("[ 3.1] eth0: up"), Incoming::Noise);
        assert!(matches!(
            parse_incoming("CRANE-RUN x 5 %%%"),
            Incoming::Run { script: Err(_), .. }
        ));
    }

    #[test]
    fn answers_round_trip_through_the_parser_in_short_lines() {
        let big: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let text = answer("a1", &big, b"", 3);
        assert!(text.lines().all(|l| l.len() <= 78), "{text}");
        assert!(!text.contains("\nE "), "an empty stream has no lines");
        let mut p = AnswerParser::new("a1");
        let mut out = None;
        for line in text.lines() {
            out = p.feed(line).unwrap().or(out);
        }
        let out = out.unwrap();
        assert_eq!((out.stdout, out.stderr, out.status), (big, vec![], 3));
    }
}
