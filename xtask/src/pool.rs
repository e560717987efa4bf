//! The unit and integration tiers' test binaries, run several at a time.
//!
//! `cargo test` runs a workspace's test binaries one after another. Most of
//! crane's integration tests wait more than they compute (a proxy restarting,
//! suspend/resume cycles every half second, an application holding), so one
//! binary at a time left about two thirds of CI's two cores idle: 500 s of
//! tests used some 350 core-seconds. Here cargo builds them (`--no-run`, the
//! artifacts as JSON), and they run `CRANE_TEST_JOBS` (default 3) at a time,
//! each as cargo would run it (in its package's directory, with cargo's
//! variables), longest first, each one's output printed whole when it ends so
//! that the log reads as before.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// One thing to run, under a name for the log.
pub struct Job {
    pub name: String,
    pub cmd: Command,
}

/// The test binaries `cargo test ARGS` would run, built now. `args` are what
/// selects them (`--workspace`, `-p X`); the doc tests are not among them.
pub fn test_binaries(cargo: Command, args: &[&str]) -> Result<Vec<Job>> {
    let mut cargo = cargo;
    cargo
        .arg("test")
        .args(args)
        .args(["--no-run", "--message-format=json-render-diagnostics"])
        .stdout(Stdio::piped());
    eprintln!("xtask: {cargo:?}");
    let out = cargo
        .output()
        .with_context(|| format!("cannot run {cargo:?}"))?;
    if !out.status.success() {
        bail!("{cargo:?} failed with {}", out.status);
    }
    let cargo_bin = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut jobs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(a) = artifact(line) else { continue };
        let dir = a
            .manifest
            .parent()
            .context("a manifest path has a directory")?;
        let mut cmd = Command::new(&a.executable);
        cmd.current_dir(dir)
            .env("CARGO", &cargo_bin)
            .env("CARGO_MANIFEST_DIR", dir)
            .env("CARGO_PKG_NAME", &a.package);
        jobs.push(Job {
            name: format!("{} {}", a.package, a.target),
            cmd,
        });
    }
    Ok(jobs)
}

/// A test executable from one line of cargo's JSON messages.
#[derive(Debug, PartialEq)]
struct Artifact {
    package: String,
    target: String,
    manifest: PathBuf,
    executable: PathBuf,
}

fn artifact(line: &str) -> Option<Artifact> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
        return None;
    }
    let executable = PathBuf::from(v["executable"].as_str()?);
    let target = v["target"]["name"].as_str()?.to_owned();
    let manifest = PathBuf::from(v["manifest_path"].as_str()?);
    // "path+file:///w/guest-agent/opencl#crane-opencl@0.1.0"; "path+file:///w/dom0/craned#0.1.0"
    // when the name is the directory's; "craned 0.1.0 (path+...)" from older cargos.
    let id = v["package_id"].as_str()?;
    let package = match id.split_once('#') {
        Some((url, rest)) => match rest.split_once('@') {
            Some((name, _)) => name,
            None => url.rsplit('/').next().unwrap_or(url),
        },
        None => id.split(' ').next().unwrap_or(id),
    }
    .to_owned();
    Some(Artifact {
        package,
        target,
        manifest,
        executable,
    })
}

/// Test binaries that take a minute or more in CI, in the order they should
/// start so that the longest do not end up last. A binary not named here
/// starts after them; a name that no longer exists costs nothing.
const LONG_FIRST: &[&str] = &[
    "proxy_death",
    "conformance",
    "corpus",
    "remote",
    "bad_input",
    "devices",
    "modes",
    "precopy",
    "fuzz",
    "standalone",
];

fn rank(job: &Job) -> usize {
    let target = job.name.rsplit(' ').next().unwrap_or_default();
    LONG_FIRST
        .iter()
        .position(|n| *n == target)
        .unwrap_or(LONG_FIRST.len())
}

/// How many at a time: `CRANE_TEST_JOBS`, else 3.
pub fn jobs_from_env() -> Result<usize> {
    match std::env::var("CRANE_TEST_JOBS") {
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("CRANE_TEST_JOBS={v:?}: want a whole number of at least 1"),
        },
        Err(_) => Ok(3),
    }
}

/// Runs `jobs`, at most `width` at a time, longest first; prints each one's
/// output whole when it ends. Once one fails no more start; those running end,
/// and the error names every failure.
pub fn run_all(mut jobs: Vec<Job>, width: usize) -> Result<()> {
    jobs.sort_by_key(rank);
    let total = jobs.len();
    let started = Instant::now();
    let mut queue: VecDeque<Job> = jobs.into();
    let (tx, rx) = mpsc::channel::<(String, Duration, std::io::Result<Output>)>();
    let mut running = 0;
    let mut failed = Vec::new();
    // What each failed job printed, repeated in short after the rest: a CI
    // log is often read from its end.
    let mut gist = String::new();
    loop {
        while running < width && failed.is_empty() {
            let Some(mut job) = queue.pop_front() else {
                break;
            };
            let tx = tx.clone();
            running += 1;
            std::thread::spawn(move || {
                let t = Instant::now();
                let out = job.cmd.stdin(Stdio::null()).output();
                // The receiver lives until every job has reported.
                let _ = tx.send((job.name, t.elapsed(), out));
            });
        }
        if running == 0 {
            break;
        }
        let (name, took, out) = rx.recv().expect("a job thread reports");
        running -= 1;
        match out {
            Ok(out) => {
                eprintln!("xtask: ---- {name} ({:.1} s) ----", took.as_secs_f64());
                print_lossy(&out.stdout);
                print_lossy(&out.stderr);
                if !out.status.success() {
                    eprintln!("xtask: {name} FAILED ({})", out.status);
                    failed.push(format!("{name} ({})", out.status));
                    let mut all = String::from_utf8_lossy(&out.stdout).into_owned();
                    all.push_str(&String::from_utf8_lossy(&out.stderr));
                    gist.push_str(&format!(
                        "xtask: {name} FAILED; the end of its output, backtraces left out:\n{}",
                        tail_without_backtraces(&all, GIST_LINES)
                    ));
                }
            }
            Err(e) => failed.push(format!("{name}: cannot run it: {e}")),
        }
    }
    let skipped = queue.len();
    if !failed.is_empty() {
        eprint!("{gist}");
        bail!(
            "{} of {total} test binaries failed: {}{}",
            failed.len(),
            failed.join("; "),
            if skipped > 0 {
                format!(" ({skipped} not started after that)")
            } else {
                String::new()
            }
        );
    }
    eprintln!(
        "xtask: {total} test binaries passed in {:.0} s, {width} at a time",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// How many lines of a failed job's output are repeated at the end.
const GIST_LINES: usize = 40;

/// The last `n` lines of `text`, without the frames of Rust backtraces
/// (`  12: symbol` and `      at file:line`) and the lines announcing them.
fn tail_without_backtraces(text: &str, n: usize) -> String {
    let frame = |l: &str| {
        let t = l.trim_start();
        let numbered = t
            .split_once(':')
            .is_some_and(|(k, _)| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()));
        (numbered && l.starts_with(' '))
            || (t.starts_with("at ") && l.starts_with("    "))
            || t == "Stack backtrace:"
            || t.starts_with("note: run with `RUST_BACKTRACE")
    };
    let kept: Vec<&str> = text.lines().filter(|l| !frame(l)).collect();
    let from = kept.len().saturating_sub(n);
    let mut out = kept[from..].join("\n");
    out.push('\n');
    out
}

fn print_lossy(bytes: &[u8]) {
    use std::io::Write;
    // Test output goes to the log as cargo test would print it.
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(bytes);
}

/// The dir a job runs in (for tests).
#[cfg(test)]
fn dir_of(job: &Job) -> Option<&std::path::Path> {
    job.cmd.get_current_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_repeated_without_its_backtrace() {
        let out = "one\ntwo differs from native\nError: 1 mode differs\n\nStack backtrace:\n   0: anyhow::error::msg\n             at /r/src/backtrace.rs:10:14\n  11: main\nlast words\n";
        assert_eq!(
            tail_without_backtraces(out, 3),
            "Error: 1 mode differs\n\nlast words\n"
        );
        assert_eq!(tail_without_backtraces(out, 40).lines().count(), 5);
        // A test's own indented output is kept.
        assert_eq!(
            tail_without_backtraces("  ratio: 1.0\n", 5),
            "  ratio: 1.0\n"
        );
    }

    #[test]
    fn reads_test_executables_from_cargo_messages() {
        let new = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/guest-agent/opencl#crane-opencl@0.1.0","manifest_path":"/w/guest-agent/opencl/Cargo.toml","target":{"kind":["test"],"name":"corpus"},"profile":{"test":true},"executable":"/w/target/debug/deps/corpus-1"}"#;
        assert_eq!(
            artifact(new),
            Some(Artifact {
                package: "crane-opencl".into(),
                target: "corpus".into(),
                manifest: "/w/guest-agent/opencl/Cargo.toml".into(),
                executable: "/w/target/debug/deps/corpus-1".into(),
            })
        );
        let old = r#"{"reason":"compiler-artifact","package_id":"craned 0.1.0 (path+file:///w/dom0/craned)","manifest_path":"/w/dom0/craned/Cargo.toml","target":{"name":"craned"},"profile":{"test":true},"executable":"/w/target/debug/deps/craned-2"}"#;
        assert_eq!(artifact(old).unwrap().package, "craned");
        let short = new.replace("opencl#crane-opencl@0.1.0", "opencl#0.1.0");
        assert_eq!(artifact(&short).unwrap().package, "opencl");
        // A library built for the tests, not a test; a build script's output.
        let lib = r#"{"reason":"compiler-artifact","package_id":"x","manifest_path":"/m","target":{"name":"x"},"profile":{"test":false},"executable":null}"#;
        assert_eq!(artifact(lib), None);
        assert_eq!(
            artifact(r#"{"reason":"build-finished","success":true}"#),
            None
        );
        assert_eq!(artifact("not json"), None);
    }

    #[test]
    fn the_long_ones_start_first_and_a_failure_is_reported() {
        let job = |name: &str, script: &str| {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", script]).current_dir("/");
            Job {
                name: name.into(),
                cmd,
            }
        };
        let mut jobs = vec![job("p other", "true"), job("p corpus", "true")];
        jobs.sort_by_key(rank);
        assert_eq!(jobs[0].name, "p corpus");
        assert_eq!(dir_of(&jobs[0]), Some(std::path::Path::new("/")));
        run_all(jobs, 2).unwrap();
        let err = run_all(
            vec![job("p a", "exit 3"), job("p b", "true"), job("p c", "true")],
            1,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("1 of 3 test binaries failed: p a"), "{err}");
        assert!(err.contains("2 not started"), "{err}");
    }
}
