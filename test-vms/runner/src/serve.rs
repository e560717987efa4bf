//! The runner: reads requests from its device, runs each script with `sh`
//! (one at a time, reading nothing meanwhile), answers on the same device.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::proto::{self, Incoming};

/// How the runner works; [`Config::default`] is what init starts.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where a script, its output and its error output are kept while it runs.
    pub work_dir: PathBuf,
    /// How long the runner drops input at start: requests that arrived before it
    /// ran were answered by nobody and their clients have given up.
    pub drain: Duration,
    /// How long a script stopped at its limit (SIGTERM to its process group)
    /// has to end before SIGKILL follows.
    pub grace: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            work_dir: PathBuf::from("/tmp"),
            drain: Duration::from_secs(1),
            grace: Duration::from_secs(5),
        }
    }
}

/// The requests' state between lines: the last request and, once it has
/// ended, its answer.
#[derive(Debug, Default)]
struct State {
    last: Option<String>,
    answer: Option<String>,
}

/// Serves requests from `input`, answering on `output`, until `input` ends.
pub fn serve<R: Read + AsFd, W: Write>(input: R, mut output: W, config: &Config) -> io::Result<()> {
    drain(&input, config.drain)?;
    let mut reader = BufReader::new(input);
    let mut state = State::default();
    let mut raw = Vec::new();
    loop {
        raw.clear();
        if reader.read_until(b'\n', &mut raw)? == 0 {
            return Ok(());
        }
        let line = String::from_utf8_lossy(&raw);
        match proto::parse_incoming(&line) {
            Incoming::Noise => {}
            Incoming::KeepAlive => {
                let idle = match (&state.last, &state.answer) {
                    (Some(id), Some(_)) => format!("CRANE-IDLE {id} ended\n"),
                    _ => "CRANE-IDLE - none\n".to_owned(),
                };
                output.write_all(idle.as_bytes())?;
            }
            Incoming::Run { id, limit, script } => {
                output.write_all(format!("CRANE-ACK {id}\n").as_bytes())?;
                if state.last.as_deref() == Some(id.as_str()) {
                    if let Some(answer) = &state.answer {
                        output.write_all(answer.as_bytes())?;
                    }
                    output.flush()?;
                    continue;
                }
                output.flush()?;
                state.last = Some(id.clone());
                state.answer = None;
                let (stdout, stderr, status) = match script {
                    Ok(script) => run_script(&script, limit, config),
                    Err(why) => (
                        Vec::new(),
                        format!("crane-runner: {why}\n").into_bytes(),
                        126,
                    ),
                };
                let answer = proto::answer(&id, &stdout, &stderr, status);
                output.write_all(answer.as_bytes())?;
                state.answer = Some(answer);
            }
        }
        output.flush()?;
    }
}

/// Drops whatever `input` offers until it has been quiet for `quiet`.
fn drain<R: Read + AsFd>(input: &R, quiet: Duration) -> io::Result<()> {
    if quiet.is_zero() {
        return Ok(());
    }
    let ms = u16::try_from(quiet.as_millis()).unwrap_or(u16::MAX);
    let mut buf = [0u8; 4096];
    loop {
        let mut fds = [PollFd::new(input.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => return Ok(()),
            Ok(_) => {
                // One read of what is there; the descriptor stays blocking.
                let n = nix::unistd::read(input.as_fd(), &mut buf)?;
                if n == 0 {
                    return Ok(());
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Runs `script` with `sh` in a process group of its own, stdin from
/// /dev/null, output into files (a background process the script leaves
/// behind may keep them open: the runner does not wait for it). At `limit`
/// the group gets SIGTERM, then SIGKILL after the grace time. The status is
/// the exit code, or 128 + the signal that ended the shell.
fn run_script(script: &[u8], limit: Duration, config: &Config) -> (Vec<u8>, Vec<u8>, i32) {
    let dir = config
        .work_dir
        .join(format!("crane-run.{}", std::process::id()));
    let failed = |what: &str, e: io::Error| {
        (
            Vec::new(),
            format!("crane-runner: {what}: {e}\n").into_bytes(),
            126,
        )
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return failed(&format!("cannot create {}", dir.display()), e);
    }
    let result = run_in(&dir, script, limit, config);
    let _ = std::fs::remove_dir_all(&dir);
    result.unwrap_or_else(|e| failed("cannot run the script", e))
}

fn run_in(
    dir: &Path,
    script: &[u8],
    limit: Duration,
    config: &Config,
) -> io::Result<(Vec<u8>, Vec<u8>, i32)> {
    let script_path = dir.join("script");
    std::fs::write(&script_path, script)?;
    let out = std::fs::File::create(dir.join("out"))?;
    let err = std::fs::File::create(dir.join("err"))?;
    let child = Command::new("sh")
        .arg(&script_path)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()?;
    let pid = child.id();
    // The child is waited for on a thread, so that this one can wait with a limit
    // without waking up to poll.
    let (tx, rx) = mpsc::channel();
    let mut child = child;
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let group = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
    let status = match rx.recv_timeout(limit) {
        Ok(s) => s?,
        Err(_) => {
            let _ = killpg(group, Signal::SIGTERM);
            match rx.recv_timeout(config.grace) {
                Ok(s) => s?,
                Err(_) => {
                    let _ = killpg(group, Signal::SIGKILL);
                    rx.recv()
                        .map_err(|_| io::Error::other("the waiting thread ended"))??
                }
            }
        }
    };
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1);
    Ok((
        std::fs::read(dir.join("out"))?,
        std::fs::read(dir.join("err"))?,
        code,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{AnswerParser, CommandOutput, request_line};
    use std::os::unix::net::UnixStream;

    fn runner() -> (
        UnixStream,
        BufReader<UnixStream>,
        std::thread::JoinHandle<()>,
        tempfile::TempDir,
    ) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let work = tempfile::tempdir().unwrap();
        let config = Config {
            work_dir: work.path().to_path_buf(),
            drain: Duration::from_millis(200),
            grace: Duration::from_millis(500),
        };
        let input = theirs.try_clone().unwrap();
        let t = std::thread::spawn(move || serve(input, theirs, &config).unwrap());
        let reader = BufReader::new(ours.try_clone().unwrap());
        (ours, reader, t, work)
    }

    fn next(reader: &mut BufReader<UnixStream>) -> String {
        let mut line = String::new();
        assert_ne!(
            reader.read_line(&mut line).unwrap(),
            0,
            "runner closed early"
        );
        line
    }

    fn answer(reader: &mut BufReader<UnixStream>, id: &str) -> CommandOutput {
        let mut parser = AnswerParser::new(id);
        let mut acked = false;
        loop {
            let line = next(reader);
            acked |= line == format!("CRANE-ACK {id}\n");
            if let Some(output) = parser.feed(&line).unwrap() {
                assert!(acked, "answered without an acknowledgement");
                return output;
            }
        }
    }

    #[test]
    fn runs_each_request_once_and_replays_its_answer() {
        let (mut to, mut from, t, work) = runner();
        // Sent before the runner drained its start: dropped, never run.
        let runs = work.path().join("runs");
        let count = format!(
            "echo run >> {}; echo out; echo err >&2; exit 5",
            runs.display()
        );
        to.write_all(request_line("early", Duration::from_secs(5), &count).as_bytes())
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        to.write_all(b"garbage line\n").unwrap();
        std::thread::sleep(Duration::from_millis(400));
        // A keep-alive before any request.
        to.write_all(b"\n").unwrap();
        assert_eq!(next(&mut from), "CRANE-IDLE - none\n");
        let request = request_line("t1", Duration::from_secs(5), &count);
        to.write_all(request.as_bytes()).unwrap();
        let output = answer(&mut from, "t1");
        assert_eq!(output.stdout, b"out\n");
        assert_eq!(output.stderr, b"err\n");
        assert_eq!(output.status, 5);
        // A client that missed the answer asks again: acknowledged and answered
        // again, not run again. A keep-alive gets a line back.
        to.write_all(request.as_bytes()).unwrap();
        assert_eq!(answer(&mut from, "t1"), output);
        to.write_all(b"\r\n").unwrap();
        assert_eq!(next(&mut from), "CRANE-IDLE t1 ended\n");
        assert_eq!(std::fs::read_to_string(&runs).unwrap(), "run\n");
        to.shutdown(std::net::Shutdown::Write).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_script_past_its_limit_is_stopped_with_its_children_and_background_work_is_not_waited_for()
    {
        let (mut to, mut from, t, work) = runner();
        std::thread::sleep(Duration::from_millis(300));
        let marker = work.path().join("child-alive");
        // A foreground child that would outlive the limit, in the script's group.
        let script = format!("echo started; sleep 30; touch {}", marker.display());
        to.write_all(request_line("slow", Duration::from_secs(1), &script).as_bytes())
            .unwrap();
        let started = std::time::Instant::now();
        let output = answer(&mut from, "slow");
        assert_eq!(output.status, 128 + 15, "{output:?}");
        assert_eq!(output.stdout, b"started\n");
        assert!(started.elapsed() < Duration::from_secs(10));
        // A detached background process keeping the output open is not waited for.
        let bg = "setsid sh -c 'sleep 20' > /dev/null 2>&1 < /dev/null & sleep 30 & echo quick";
        to.write_all(request_line("bg", Duration::from_secs(20), bg).as_bytes())
            .unwrap();
        let started = std::time::Instant::now();
        let output = answer(&mut from, "bg");
        assert_eq!(
            (output.status, output.stdout.as_slice()),
            (0, &b"quick\n"[..])
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        // Not valid base64: an error, the runner carries on.
        to.write_all(b"CRANE-RUN bad 5 !!!!\n").unwrap();
        let output = answer(&mut from, "bad");
        assert_eq!(output.status, 126);
        assert!(
            output.stderr_text().contains("not valid base64"),
            "{output:?}"
        );
        to.shutdown(std::net::Shutdown::Write).unwrap();
        t.join().unwrap();
        assert!(!marker.exists(), "the stopped script's child ran on");
    }
}
