//! Integration tier: bad input never crashes an application under crane.
//!
//! * `testapps/c/badinput.c` makes ~450 invalid OpenCL calls; under
//!   libcrane_opencl.so each must get exactly the code the native run
//!   (ocl-icd and PoCL) gets, and with `--foreign` about 100 more calls with
//!   foreign handles, or that crash PoCL natively, must get the code the
//!   specification requires. The process must exit normally.
//! * A panic inside crane (made by the `fault-injection` build) must become an
//!   error code, print one line, and leave the application working.
//! * The control socket, fed garbage, oversized or never-finished requests and
//!   unknown commands, must answer with an error or close, keep serving valid
//!   requests promptly, and leave the application working.
//!
//! Needs gcc and an OpenCL ICD, like the corpus (testapps/README.md).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crane_control::{MAX_REQUEST, Mode, Request, Response, call, socket_path};

mod common;
use common::{apps, library, repo};

fn badinput() -> PathBuf {
    apps().join("badinput")
}

fn stdout_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Waits for a child, killing it after `limit`.
fn finish(child: Child, limit: Duration, what: &str) -> Output {
    let pid = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    let start = Instant::now();
    while !waiter.is_finished() {
        if start.elapsed() > limit {
            // SAFETY: kill(2) on the pid of our own child, which has not been
            // reaped (the waiter has not returned).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let out = waiter.join().unwrap();
            panic!(
                "{what} did not finish within {limit:?}; stderr:\n{}",
                stderr_of(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    waiter.join().unwrap()
}

fn run_dir(tag: &str) -> tempfile::TempDir {
    common::scratch(&format!("badinput-{tag}"))
}

/// `badinput` natively: the reference.
fn native() -> &'static Output {
    static OUT: OnceLock<Output> = OnceLock::new();
    OUT.get_or_init(|| {
        let child = Command::new(badinput())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = finish(child, Duration::from_secs(120), "badinput (native)");
        assert!(
            out.status.success(),
            "badinput failed natively: {}",
            stderr_of(&out)
        );
        out
    })
}

/// `badinput --foreign` under crane.
fn under_crane() -> &'static Output {
    static OUT: OnceLock<Output> = OnceLock::new();
    OUT.get_or_init(|| {
        let dir = run_dir("cases");
        let child = Command::new(badinput())
            .arg("--foreign")
            .env("LD_PRELOAD", library())
            .env("CRANE_RUN_DIR", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = finish(child, Duration::from_secs(120), "badinput under crane");
        assert!(
            out.status.success(),
            "badinput did not exit normally under crane ({}): {}",
            out.status,
            stderr_of(&out)
        );
        out
    })
}

fn lines_with<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn bad_calls_answer_as_natively() {
    let native = stdout_of(native());
    let crane = stdout_of(under_crane());
    let want = lines_with(&native, "case ");
    let got = lines_with(&crane, "case ");
    assert!(want.len() >= 400, "only {} cases ran natively", want.len());
    let differ: Vec<String> = want
        .iter()
        .zip(&got)
        .filter(|(w, g)| w != g)
        .map(|(w, g)| format!("  native: {w}\n  crane:  {g}"))
        .collect();
    assert!(
        differ.is_empty() && want.len() == got.len(),
        "{} of {} cases differ from the native run ({} lines natively, {} under crane):\n{}",
        differ.len(),
        want.len(),
        want.len(),
        got.len(),
        differ.join("\n")
    );
    assert_eq!(
        lines_with(&crane, "RESULT "),
        lines_with(&native, "RESULT "),
        "the computation after the bad calls differs"
    );
    let err = stderr_of(under_crane());
    assert!(
        !err.contains("internal error") && !err.contains("panicked"),
        "crane panicked on bad input:\n{err}"
    );
}

/// `spec <name> <code> <CODE> want <CODE>`: foreign handles and calls that
/// crash PoCL natively (badinput.c says which and why) get the code the
/// specification requires.
#[test]
fn foreign_handles_get_the_specification_code() {
    let crane = stdout_of(under_crane());
    let specs = lines_with(&crane, "spec ");
    assert!(specs.len() >= 90, "only {} spec cases ran", specs.len());
    let wrong: Vec<&str> = specs
        .iter()
        .copied()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() != 6 || f[4] != "want" || f[3] != f[5]
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} spec cases got another code:\n{}",
        wrong.len(),
        specs.len(),
        wrong.join("\n")
    );
    let foreign = specs.iter().filter(|l| l.contains(" foreign.")).count();
    assert!(foreign >= 80, "only {foreign} foreign-handle cases ran");
}

/// A library with fault injection: a debug build's own (src/fault.rs);
/// for a release build, one built with the `fault-injection` feature in a
/// target directory of its own, so that it never replaces the one under
/// test.
fn fault_library() -> PathBuf {
    if cfg!(debug_assertions) {
        return library();
    }
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
        let profile = profile_dir.file_name().unwrap().to_owned();
        let target = profile_dir.parent().unwrap().join("fault-injection");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args([
            "build",
            "-p",
            "crane-opencl",
            "--features",
            "fault-injection",
        ])
        .current_dir(repo())
        .env("CARGO_TARGET_DIR", &target);
        if profile == "release" {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().unwrap().success(),
            "building libcrane_opencl.so with fault-injection failed"
        );
        let lib = target.join(&profile).join("libcrane_opencl.so");
        assert!(lib.exists(), "{} missing", lib.display());
        lib
    })
    .clone()
}

/// Each injected panic and what the application sees from the first call of
/// that entry point (the second must be as natively).
const FAULTS: &[(&str, &str)] = &[
    // A status entry point: CL_OUT_OF_HOST_MEMORY (entry.rs, PANIC_CODE).
    ("clGetDeviceInfo", "fault clGetDeviceInfo#1 -6"),
    // An object entry point: NULL and CL_OUT_OF_HOST_MEMORY in errcode_ret.
    ("clCreateBuffer", "fault clCreateBuffer#1 -6 null"),
    // A pointer entry point, likewise.
    ("clEnqueueMapBuffer", "fault clEnqueueMapBuffer#1 -6 null"),
    // An entry point without an error code: its failure value.
    ("clSVMAlloc", "fault clSVMAlloc#1 null"),
    // A vendor callback into crane: the application's callback is dropped.
    ("event_trampoline", "fault event_trampoline#1 calls=0"),
];

#[test]
fn panic_inside_crane_becomes_an_error_code() {
    let native = {
        let child = Command::new(badinput())
            .arg("--faults")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        finish(child, Duration::from_secs(60), "badinput --faults (native)")
    };
    assert!(native.status.success(), "{}", stderr_of(&native));
    let dir = run_dir("faults");
    let names: Vec<&str> = FAULTS.iter().map(|(n, _)| *n).collect();
    let child = Command::new(badinput())
        .arg("--faults")
        .env("LD_PRELOAD", fault_library())
        .env("CRANE_RUN_DIR", dir.path())
        .env("CRANE_FAULT_PANIC", names.join(","))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let crane = finish(child, Duration::from_secs(60), "badinput --faults");
    let (out, err) = (stdout_of(&crane), stderr_of(&crane));
    assert!(
        crane.status.success(),
        "the application did not survive the panics ({}):\n{err}",
        crane.status
    );
    let native_out = stdout_of(&native);
    for (name, first) in FAULTS {
        let line = |out: &str, i: u32| {
            let p = format!("fault {name}#{i} ");
            out.lines()
                .find(|l| l.starts_with(&p))
                .unwrap_or_else(|| panic!("no line for {name}#{i}:\n{out}"))
                .to_string()
        };
        assert_eq!(line(&out, 1), *first, "first call of {name}");
        assert_eq!(
            line(&out, 2),
            line(&native_out, 2),
            "{name} does not work again after its panic"
        );
    }
    assert!(
        out.lines().any(|l| l == "fault compute ok"),
        "no computation after the panics:\n{out}"
    );
    assert_eq!(
        lines_with(&out, "RESULT "),
        lines_with(&native_out, "RESULT ")
    );
    // One line per panic, naming it, and nothing of the default hook.
    let reports = lines_with(&err, "crane[");
    assert_eq!(reports.len(), FAULTS.len(), "stderr:\n{err}");
    for (name, _) in FAULTS {
        assert!(
            reports
                .iter()
                .any(|l| l.contains("caught internal error") && l.contains(name)),
            "no report of the panic in {name}:\n{err}"
        );
    }
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "the default panic output reached the application's stderr:\n{err}"
    );
}

/// A vendor whose compiler fails a build only because of the
/// `-cl-kernel-arg-info` crane adds (NVIDIA 580 does, for any program holding
/// a kernel without arguments): the application's build must still succeed,
/// built with its own options, and the kernels, whose argument kinds are then
/// unknown, must keep every buffer they may write across suspend/resume
/// cycles (the result identical to native).
#[test]
fn a_build_failing_only_with_crane_s_arg_info_is_built_without_it() {
    let mode = common::Mode::preload_of(
        fault_library(),
        vec![("CRANE_FAULT_ARG_INFO_BUILD", "1".into())],
    );
    let (iters, n) = common::long_enough("pingpong", "3000", 3, |iters| {
        let run = common::interrupted("pingpong", iters, 0x9e3779b97f4a7c15, 20, &mode);
        assert!(
            !run.result.is_empty(),
            "pingpong failed under crane:\n{}",
            run.stderr
        );
        (run.result, run.cycles)
    });
    eprintln!("pingpong without argument information: {n} cycles at --iters {iters}, as native");
}

/// A suspend through the control socket; it must succeed.
fn suspend(sock: &Path) {
    let r = call(
        sock,
        &Request::Suspend {
            deadline_ms: 20_000,
        },
        Duration::from_secs(60),
    )
    .unwrap();
    assert!(r.ok, "suspend failed: {:?}", r.error);
}

/// One whole suspend/resume cycle through the control socket; both must
/// succeed.
fn suspend_resume(sock: &Path) {
    suspend(sock);
    let r = call(sock, &Request::RESUME, Duration::from_secs(60)).unwrap();
    assert!(r.ok, "resume failed: {:?}", r.error);
}

/// `badinput ARGS` under crane, driven through its stdin and stdout: the
/// child (stderr piped), its stdin, its stdout and its control socket.
fn held(args: &[&str], dir: &Path) -> (Child, ChildStdin, BufReader<ChildStdout>, PathBuf) {
    let mut child = Command::new(badinput())
        .args(args)
        .env("LD_PRELOAD", library())
        .env("CRANE_RUN_DIR", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let sock = socket_path(dir, child.id());
    (child, stdin, out, sock)
}

/// The next line of a badinput's stdout that is not its device banner (empty
/// at end of file).
fn next_line(out: &mut impl BufRead) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            return String::new();
        }
        if !line.starts_with("badinput: ") {
            return line.trim().to_string();
        }
    }
}

/// `badinput --work` under crane: checks a kernel's results in a loop until
/// its stdin closes, while the tests poke its control socket.
struct WorkingApp {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    sock: PathBuf,
    /// Removed when the app is dropped.
    _dir: tempfile::TempDir,
}

impl WorkingApp {
    fn start(tag: &str) -> WorkingApp {
        let dir = run_dir(tag);
        let mut child = Command::new(badinput())
            .arg("--work")
            .env("LD_PRELOAD", library())
            .env("CRANE_RUN_DIR", dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let sock = socket_path(dir.path(), child.id());
        let start = Instant::now();
        while !sock.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no control socket appeared"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        WorkingApp {
            child: Some(child),
            stdin,
            sock,
            _dir: dir,
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// A valid status request, answered within `limit`.
    fn status_within(&self, limit: Duration) {
        let t = Instant::now();
        let r = call(&self.sock, &Request::Status, limit).expect("status request");
        assert!(r.ok, "status failed: {:?}", r.error);
        assert!(t.elapsed() <= limit, "status took {:?}", t.elapsed());
        let st = r.status.expect("status carries the process status");
        assert_eq!(st.pid, self.pid());
        assert_eq!(st.mode, Mode::Passthrough);
    }

    /// A whole suspend/resume cycle, which the working loop must not notice.
    fn cycle(&self) {
        suspend_resume(&self.sock);
    }

    /// Closes stdin and checks the application kept computing correctly.
    fn finish(mut self) {
        drop(self.stdin.take());
        let out = finish(
            self.child.take().unwrap(),
            Duration::from_secs(60),
            "badinput --work",
        );
        let (o, e) = (stdout_of(&out), stderr_of(&out));
        assert!(
            out.status.success(),
            "the application failed ({}):\n{e}",
            out.status
        );
        assert!(o.lines().any(|l| l == "work ok"), "stdout:\n{o}");
        assert!(!e.contains("internal error"), "crane panicked:\n{e}");
    }
}

impl Drop for WorkingApp {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Sends raw bytes as one request and returns the response, if any came
/// before the connection closed.
fn raw_request(sock: &Path, bytes: &[u8], half_close: bool) -> Option<Response> {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    (&s).write_all(bytes).unwrap();
    if half_close {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    read_response(&s)
}

fn read_response(s: &UnixStream) -> Option<Response> {
    let mut line = String::new();
    match BufReader::new(s).read_line(&mut line) {
        Ok(n) if n > 0 => Some(
            serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("response is not valid ({e}): {line:?}")),
        ),
        _ => None,
    }
}

fn assert_refused(r: Option<Response>, what: &str, mentions: &str) {
    let r = r.unwrap_or_else(|| panic!("{what}: no response"));
    assert!(!r.ok, "{what} was accepted");
    let e = r.error.unwrap_or_default();
    assert!(
        e.contains(mentions),
        "{what}: error {e:?} lacks {mentions:?}"
    );
}

#[test]
fn control_socket_refuses_garbage_and_unknown_commands() {
    let app = WorkingApp::start("garbage");
    let sock = app.sock.clone();
    let cases: &[(&str, &[u8], &str)] = &[
        (
            "binary garbage",
            b"\x00\xff\xfe\x01garbage\n",
            "malformed request",
        ),
        ("plain text", b"hello crane\n", "malformed request"),
        (
            "unknown command",
            b"{\"cmd\":\"explode\"}\n",
            "unknown variant",
        ),
        ("missing field", b"{\"cmd\":\"suspend\"}\n", "missing field"),
        ("not an object", b"[1,2,3]\n", "malformed request"),
        ("empty line", b"\n", "malformed request"),
        (
            "wrong type",
            b"{\"cmd\":\"suspend\",\"deadline_ms\":\"soon\"}\n",
            "invalid type",
        ),
    ];
    for (what, bytes, mentions) in cases {
        assert_refused(raw_request(&sock, bytes, false), what, mentions);
    }
    // A request cut short by the peer closing its side is judged as it stands.
    assert_refused(
        raw_request(&sock, b"{\"cmd\":\"stat", true),
        "truncated request",
        "malformed request",
    );
    // A connection that sends nothing and closes gets nothing.
    assert!(raw_request(&sock, b"", true).is_none());
    app.status_within(Duration::from_secs(5));
    app.cycle();
    app.status_within(Duration::from_secs(5));
    app.finish();
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

#[test]
fn control_socket_caps_request_size() {
    let app = WorkingApp::start("huge");
    app.status_within(Duration::from_secs(5));
    let peak_before = peak_rss_kib(app.pid());
    // Offer 64 MiB without a newline; crane must stop reading at its cap.
    let offered = 64usize << 20;
    let s = UnixStream::connect(&app.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let writer = {
        let s = s.try_clone().unwrap();
        std::thread::spawn(move || {
            let chunk = vec![b'{'; 64 << 10];
            let mut sent = 0;
            while sent < offered {
                match (&s).write(&chunk) {
                    Ok(n) => sent += n,
                    Err(_) => break,
                }
            }
            sent
        })
    };
    let t = Instant::now();
    let r = read_response(&s);
    let sent = writer.join().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the oversized request took {:?}",
        t.elapsed()
    );
    assert!(
        sent < offered,
        "crane read all {offered} bytes of an oversized request"
    );
    // An error response, or the connection closed under the writer.
    if let Some(r) = r {
        assert!(!r.ok);
        let e = r.error.unwrap_or_default();
        assert!(
            e.contains(&format!("longer than {MAX_REQUEST}")),
            "error {e:?}"
        );
    }
    let grown = peak_rss_kib(app.pid()).saturating_sub(peak_before);
    assert!(
        grown < 16 << 10,
        "peak memory grew by {grown} KiB on a {offered}-byte request"
    );
    app.status_within(Duration::from_secs(5));
    app.cycle();
    app.finish();
}

#[test]
fn control_socket_idle_connections_block_nobody() {
    let app = WorkingApp::start("idle");
    // Connections that never send, and one that trickles a byte at a time.
    let idle: Vec<UnixStream> = (0..8)
        .map(|_| UnixStream::connect(&app.sock).unwrap())
        .collect();
    let trickler = UnixStream::connect(&app.sock).unwrap();
    let trickle = {
        let s = trickler.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..200 {
                if (&s).write_all(b" ").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    // Valid requests are answered at once meanwhile, and the process can be
    // suspended and resumed.
    app.status_within(Duration::from_secs(2));
    app.cycle();
    app.status_within(Duration::from_secs(2));
    // Crane gives up on the idle and trickling peers after its deadline and
    // says why.
    let t = Instant::now();
    for s in idle.iter().chain(std::iter::once(&trickler)) {
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        assert_refused(read_response(s), "idle connection", "no complete request");
    }
    assert!(
        t.elapsed() < Duration::from_secs(12),
        "idle connections held for {:?}",
        t.elapsed()
    );
    trickle.join().unwrap();
    // A flood of idle connections beyond crane's limit is refused at once
    // rather than queued; closing them frees their places immediately.
    let flood: Vec<UnixStream> = (0..40)
        .map(|_| UnixStream::connect(&app.sock).unwrap())
        .collect();
    let mut refused = 0;
    for s in &flood {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = [0u8; 256];
        if matches!((&*s).read(&mut b), Ok(n) if n > 0) {
            assert!(
                String::from_utf8_lossy(&b).contains("too many control connections"),
                "unexpected answer to an idle connection"
            );
            refused += 1;
        }
    }
    assert!(refused > 0, "40 idle connections were all taken on");
    drop(flood);
    let start = Instant::now();
    loop {
        match call(&app.sock, &Request::Status, Duration::from_secs(2)) {
            Ok(r) if r.ok => break,
            _ if start.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => panic!("status after the flood: {other:?}"),
        }
    }
    app.finish();
}

/// A status request while the process sits inside a long OpenCL call (here
/// clWaitForEvents; in practice a program build) cannot count objects, which
/// needs the process's calls paused: it is still answered, marked busy, with
/// the process's mode, so `cranectl list` keeps listing it. Outside calls the
/// counts come back.
#[test]
fn status_inside_a_long_call_is_answered_busy() {
    let dir = run_dir("busy");
    let (mut child, mut stdin, mut out, sock) = held(&["--wait-in-call", "6000"], dir.path());
    let mut expect = |want: &str| assert_eq!(next_line(&mut out), want);
    expect("waiting");
    // The waiting thread entered clWaitForEvents just after printing.
    std::thread::sleep(Duration::from_millis(300));
    let r = call(&sock, &Request::Status, Duration::from_secs(10)).unwrap();
    assert!(r.ok, "{:?}", r.error);
    let st = r.status.unwrap();
    assert!(st.busy, "{st:?}");
    assert_eq!((st.pid, st.mode), (child.id(), Mode::Passthrough));
    assert_eq!(st.objects.contexts, 0, "no counts while busy: {st:?}");
    expect("waited");
    let r = call(&sock, &Request::Status, Duration::from_secs(10)).unwrap();
    let st = r.status.unwrap();
    assert!(!st.busy, "{st:?}");
    assert!(st.objects.contexts >= 1, "{st:?}");
    // The second wait is not disturbed by the first status.
    writeln!(stdin, "again").unwrap();
    expect("waiting");
    expect("waited");
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// The application sizes its buffer from CL_PROGRAM_BINARY_SIZES, and a
/// suspend/resume before it asks for CL_PROGRAM_BINARIES rebuilds the program
/// (PoCL's rebuilt binary can be longer): the binary it gets must still fit
/// the size it was given, and work. CI once saw `programs` die of SIGSEGV
/// there; this pins that moment down instead of waiting for a random suspend
/// to land on it.
#[test]
fn binary_sized_before_a_suspend_fits_after_it() {
    held_through_two_cycles("binary", "--binary-hold", "binary sized", "binary ok");
}

/// `badinput MODE` under crane: once it prints `ready`, two suspend/resume
/// cycles, then a line on its stdin; its next line must be `want` and it
/// must exit cleanly.
fn held_through_two_cycles(tag: &str, mode: &str, ready: &str, want: &str) {
    let dir = run_dir(tag);
    let (child, mut stdin, mut out, sock) = held(&[mode], dir.path());
    assert_eq!(next_line(&mut out), ready);
    suspend_resume(&sock);
    suspend_resume(&sock);
    writeln!(stdin, "go").unwrap();
    let got = next_line(&mut out);
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        got,
        want,
        "{}; stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{}", out.status);
}

/// A program compiled with `-I DIR` whose DIR is gone by the next suspend
/// (the CTS's test_compiler removes its header directories at once): resume
/// makes it from the compiled object kept at suspend, so that the later
/// clLinkProgram works as natively (before, resume compiled it again, failed,
/// and the link crashed PoCL).
#[test]
fn a_compiled_program_whose_headers_are_gone_survives_a_suspend() {
    let native = {
        let mut child = Command::new(badinput())
            .arg("--compile-hold")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        writeln!(child.stdin.take().unwrap(), "go").unwrap();
        finish(
            child,
            Duration::from_secs(120),
            "badinput --compile-hold (native)",
        )
    };
    assert!(native.status.success(), "{}", stderr_of(&native));
    let want = lines_with(&stdout_of(&native), "compile-hold value ")
        .first()
        .map(|l| l.to_string())
        .expect("a value natively");
    held_through_two_cycles("compile", "--compile-hold", "compiled", &want);
}

/// A kernel's writes to a CL_MEM_USE_HOST_PTR image and buffer, and a
/// clEnqueueWriteBuffer to the buffer, survive suspend/resume: at resume such
/// objects are rebuilt from the application's host memory, so suspend must
/// have brought it up to date. PoCL works in aligned host memory itself; with
/// `CRANE_HOST_MEMORY=emulate` the vendor holds a copy of its own (as
/// discrete GPUs do), which is where the writes were lost.
#[test]
fn use_host_ptr_contents_survive_a_suspend() {
    for emulate in [false, true] {
        let dir = run_dir(if emulate { "hostptr-emu" } else { "hostptr" });
        let mut child = Command::new(badinput())
            .arg("--host-ptr-hold")
            .env("LD_PRELOAD", library())
            .env("CRANE_RUN_DIR", dir.path())
            .env(
                "CRANE_HOST_MEMORY",
                if emulate { "emulate" } else { "vendor" },
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let sock = socket_path(dir.path(), child.id());
        assert_eq!(next_line(&mut out), "host-ptr created");
        suspend_resume(&sock);
        writeln!(stdin, "write").unwrap();
        assert_eq!(next_line(&mut out), "host-ptr written");
        suspend_resume(&sock);
        suspend_resume(&sock);
        writeln!(stdin, "go").unwrap();
        let got = next_line(&mut out);
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            got,
            "host-ptr ok",
            "emulate={emulate}: {}; stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{}", out.status);
    }
}

/// pingpong for `iters` iterations under the fault-injection build with
/// `fault` in its environment, holding halfway until the file returned
/// third exists: the child, its control socket (up), that file and the
/// folder holding them.
fn held_under_faults(
    iters: &str,
    fault: (&str, &str),
) -> (Child, PathBuf, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    let child = Command::new(apps().join("pingpong"))
        .args(["--iters", iters])
        .env("LD_PRELOAD", fault_library())
        .env("CRANE_RUN_DIR", dir.path())
        .env(fault.0, fault.1)
        .env("TESTAPP_HOLD", &release)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(dir.path(), child.id());
    common::proxy::wait_socket(&sock);
    (child, sock, release, dir)
}

/// A resume whose local vendor offers no device (NVIDIA once answered with
/// none in 148 CTS cycles, with other CUDA processes starting beside it;
/// here the fault-injection build makes the first two reloads see none)
/// tries the reload again a few times before it gives up: the resume
/// succeeds on the third try and the program ends with the native result;
/// with more reloads failing than it tries, the resume fails with the reason
/// and a later one succeeds.
#[test]
fn a_vendor_without_a_device_for_a_moment_is_tried_again() {
    for (failing, resumes) in [("2", 1), ("4", 2)] {
        let (child, sock, release, _dir) =
            held_under_faults("2000", ("CRANE_FAULT_RELOADS_WITHOUT_DEVICE", failing));
        suspend(&sock);
        for i in 1..=resumes {
            let r = call(&sock, &Request::RESUME, Duration::from_secs(60)).unwrap();
            if i < resumes {
                let e = r.error.unwrap_or_default();
                assert!(!r.ok && e.contains("offers no device"), "{e}");
            } else {
                assert!(r.ok, "resume failed: {:?}", r.error);
            }
        }
        std::fs::write(&release, b"").unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            err.contains("offers no device yet (attempt 2 of 4)"),
            "{err}"
        );
        assert_eq!(
            common::result_line(&out.stdout),
            common::native("pingpong", "2000")
        );
    }
}

/// A move to crane-proxy reads the device's memory while the proxy
/// rebuilds the objects (the reads beside the rebuild, lifecycle.rs
/// `go_remote_streamed`). If one of those reads fails (here the
/// fault-injection build fails the second, after the first was read into
/// its RAM copy), nothing has been released yet: the move fails with the
/// reason, the process carries on with its local objects as they were, the
/// proxy's half-built session is torn down, and the next move there and
/// back works; the program's result is the native one.
#[test]
fn a_read_failing_during_a_move_to_the_proxy_leaves_the_app_local() {
    let proxy = common::proxy::Proxy::start("readfail", true, &[("k", "t")]);
    let (child, sock, release, _dir) =
        held_under_faults("3000", ("CRANE_FAULT_MOVE_READ_FAILS", "2"));
    let status = || {
        call(&sock, &Request::Status, Duration::from_secs(60))
            .unwrap()
            .status
            .unwrap()
    };
    let start = Instant::now();
    while status().objects.buffers < 3 {
        assert!(start.elapsed() < Duration::from_secs(30), "no buffers");
        std::thread::sleep(Duration::from_millis(10));
    }
    let remote = Request::Remote {
        proxy: proxy.addr.clone(),
        token: Some("k".into()),
        deadline_ms: 20_000,
        device: None,
        precopy: 0,
    };
    let r = call(&sock, &remote, Duration::from_secs(60)).unwrap();
    let e = r.error.unwrap_or_default();
    assert!(!r.ok, "the move worked although a read failed");
    assert!(
        e.contains("reading device memory back failed with OpenCL error CL_OUT_OF_RESOURCES")
            && e.contains("it carries on locally"),
        "{e}"
    );
    assert_eq!(status().mode, Mode::Passthrough);
    let closed = proxy.wait_log("closed by the client");
    assert!(closed.contains("object(s) released"), "{closed}");
    let r = call(&sock, &remote, Duration::from_secs(60)).unwrap();
    assert!(r.ok, "the second move failed: {:?}", r.error);
    assert_eq!(status().mode, Mode::Remote);
    let local = Request::Local {
        deadline_ms: 20_000,
        device: None,
        precopy: 0,
    };
    let r = call(&sock, &local, Duration::from_secs(60)).unwrap();
    assert!(r.ok, "the move back failed: {:?}", r.error);
    std::fs::write(&release, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        common::result_line(&out.stdout),
        common::native("pingpong", "3000")
    );
}
