//! `cargo xtask conformance`: the Khronos OpenCL conformance suite (CTS) run
//! natively and through crane in every mode, sub-test by sub-test.
//!
//! Each suite runs once natively; a sub-test that crashes or hangs natively is
//! listed and left out (the rest of the suite runs on in a new process). Then
//! the same sub-tests run under `libcrane_opencl.so`, preloaded, in each mode:
//!
//! * `passthrough`: calls go straight to the vendor library, tracked;
//! * `cycles`: passthrough, with suspend/resume cycles sent to the process's
//!   control socket every 0.5–1 s for the whole run;
//! * `remote`: started on a crane-proxy this command starts for the run;
//! * `switches`: passthrough, with moves to that crane-proxy and back sent the
//!   same way.
//!
//! A sub-test's outcome under crane must be the native one: the same pass,
//! fail or skip, and never a crash or hang where native ends by itself. The
//! report lists every difference, the result file holds each sub-test's
//! outcome in each mode, and the command fails on any difference.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use crane_control::{Request, call, socket_path};
use serde::Serialize;

/// The environment variable that points at the CTS (default: the shared copy
/// beside the workspace).
pub const CTS_ENV: &str = "CRANE_CTS_DIR";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Native,
    Passthrough,
    Cycles,
    Remote,
    Switches,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Native => "native",
            Mode::Passthrough => "passthrough",
            Mode::Cycles => "cycles",
            Mode::Remote => "remote",
            Mode::Switches => "switches",
        }
    }

    fn needs_proxy(self) -> bool {
        matches!(self, Mode::Remote | Mode::Switches)
    }
}

#[derive(Debug, clap::Args)]
#[command(
    about = "Run the Khronos OpenCL CTS natively and through crane in each mode",
    long_about = "Run the Khronos OpenCL CTS natively and through crane in each mode, and \
                  list every sub-test whose outcome under crane differs from native. \
                  SUITE is a binary of the CTS's bin/ folder (test_basic, ...), optionally \
                  with the sub-tests to run: test_basic:hostptr,arraycopy. Without SUITE, \
                  every suite runs in full (see docs/conformance.md for how long)."
)]
pub struct Args {
    /// Modes to run, comma-separated (native always runs first: it is the reference).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "native,passthrough,cycles,remote,switches"
    )]
    pub modes: Vec<Mode>,
    /// The CTS folder (with bin/); default: $CRANE_CTS_DIR, else ../shared/conformance/opencl-cts
    /// beside the workspace.
    #[arg(long, value_name = "DIR")]
    pub cts: Option<PathBuf>,
    /// The subset `cargo xtask test` runs (fits CI's budget); SUITE arguments are added to it.
    #[arg(long)]
    pub ci: bool,
    /// Leave these sub-tests out: SUITE:SUBTEST[,SUBTEST...] (repeatable).
    #[arg(long, value_name = "SUITE:SUBTESTS")]
    pub exclude: Vec<String>,
    /// libcrane_opencl.so to test (default: built now with cargo).
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
    /// crane-proxy for the remote and switches modes (default: built now with cargo).
    #[arg(long, value_name = "PATH")]
    pub proxy: Option<PathBuf>,
    /// Build crane with --release (when --lib/--proxy are not given).
    #[arg(long)]
    pub release: bool,
    /// Where the machine-readable results go (default target/conformance/results.json).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Limit for a native run of one suite, in seconds; runs under crane get
    /// four times the native run's time plus 60 s (at least 120 s).
    #[arg(long, default_value_t = 1200, value_name = "SECS")]
    pub timeout: u64,
    /// Shortest and longest pause between two injected cycles or switches, in ms.
    #[arg(long, default_value = "500-1000", value_name = "MIN-MAX")]
    pub interval: String,
    /// Keep every run's log in this folder (default: kept only for runs that differ,
    /// under target/conformance/logs).
    #[arg(long, value_name = "DIR")]
    pub logs: Option<PathBuf>,
    /// How many modes of a suite run at once after its native run (each mode's
    /// runs are independent processes with their own proxy and folders). 1 for
    /// timings that mean something; CI runs several to use the cores the suites
    /// leave idle.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=16))]
    pub jobs: u32,
    /// SUITE[:SUBTEST,...]
    pub suites: Vec<String>,
}

/// Each suite's own arguments, as the CTS's README gives them: test_compiler
/// finds its SPIR-V binaries from the working directory; the image suites
/// take -w (every format, smaller images).
fn suite_args(suite: &str) -> Vec<String> {
    match suite {
        "test_compiler" => vec!["--spirv-binaries-path".into(), "bin/spirv_bin".into()],
        s if s.starts_with("test_cl_") || s == "test_image_streams" => vec!["-w".into()],
        _ => Vec::new(),
    }
}

/// The suites, in the order a full run takes them.
const SUITES: &[&str] = &[
    "test_api",
    "test_buffers",
    "test_events",
    "test_basic",
    "test_compiler",
    "test_printf",
    "test_multiples",
    "test_cl_get_info",
    "test_cl_fill_images",
    "test_cl_read_write_images",
    "test_cl_copy_images",
    "test_image_streams",
];

/// What `cargo xtask test` runs on PoCL: five suites, each cut to sub-tests
/// that run in a few seconds natively on 2 cores with PoCL's kernel cache
/// cold (test_basic's vector_creation alone compiles for 130 s), chosen to cover
/// each object family (buffers, sub-buffers, images, maps, events, callbacks,
/// user events, programs, kernels, queries and error codes).
const CI_SUBSET: &[&str] = &[
    "test_buffers:buffer_read_async_int,buffer_write_async_int,buffer_copy,buffer_partial_copy,\
     buffer_map_read_uint,buffer_map_write_uint,buffer_fill_int,sub_buffers_read_write,\
     sub_buffers_overlapping,buffer_migrate,image_migrate,buffer_fill_struct",
    "test_events:event_get_execute_status,event_get_info,event_wait_for_array,event_enqueue_marker,\
     out_of_order_event_waitlist_single_queue,waitlists,userevents,callbacks,\
     callbacks_simultaneous",
    "test_basic:hostptr,arraycopy,local_arg_def,writeimage,readimage,mri_multiple,\
     kernel_call_kernel_function,enqueue_map_buffer,enqueue_map_image,work_item_functions",
    "test_api:get_platform_info,get_device_info,get_kernel_info,get_program_info_kernel_names,\
     get_kernel_arg_info,get_buffer_info,get_image2d_info,get_sampler_info,\
     get_context_info,get_command_queue_info,create_context_from_type,\
     retain_mem_object_single,release_kernel_order,negative_create_context,\
     min_max_mem_alloc_size,context_destructor_callback,mem_object_destructor_callback",
    // The longest kernel name: PoCL aborted making it in a program made from
    // a kept executable (docs/conformance.md).
    "test_compiler:kernel_name_size",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Outcome {
    Pass,
    Fail,
    Skip,
    /// The process died (a signal, or an exit without a verdict) in this sub-test.
    Crash,
    /// The run was stopped at its time limit in this sub-test.
    Hang,
    /// The process ended (crash or hang) before this sub-test started.
    NotRun,
}

impl Outcome {
    fn word(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "skip",
            Outcome::Crash => "CRASH",
            Outcome::Hang => "HANG",
            Outcome::NotRun => "not run",
        }
    }
}

/// How one process of a suite ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Exited(i32),
    Signal(i32),
    TimedOut,
}

/// One process: which sub-tests started, each one's outcome, how it ended.
struct RunResult {
    outcomes: BTreeMap<String, Outcome>,
    end: End,
    wall: Duration,
    log: PathBuf,
}

/// Reads the sub-test verdicts from a CTS run's output: each sub-test prints
/// `NAME...` when it starts and `NAME passed`, `NAME FAILED`, `NAME test not
/// supported` or `NAME skipped ...` when it ends.
fn parse_log(text: &str, subtests: &[String]) -> (Vec<String>, BTreeMap<String, Outcome>) {
    let mut started = Vec::new();
    let mut outcomes = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(name) = line.strip_suffix("...")
            && subtests.iter().any(|s| s == name)
        {
            started.push(name.to_string());
            continue;
        }
        let Some((name, rest)) = line.split_once(' ') else {
            continue;
        };
        if !subtests.iter().any(|s| s == name) {
            continue;
        }
        let outcome = if rest == "passed" {
            Outcome::Pass
        } else if rest == "FAILED" {
            Outcome::Fail
        } else if rest == "test not supported" || rest.starts_with("skipped") {
            Outcome::Skip
        } else {
            continue;
        };
        outcomes.insert(name.to_string(), outcome);
    }
    (started, outcomes)
}

/// The outcomes of the CTS's own result file (written only when the suite
/// ends by itself).
fn parse_results_file(path: &Path) -> Option<BTreeMap<String, Outcome>> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let results = v.get("results")?.as_object()?;
    Some(
        results
            .iter()
            .map(|(k, v)| {
                let o = match v.as_str() {
                    Some("pass") => Outcome::Pass,
                    Some("skip") => Outcome::Skip,
                    _ => Outcome::Fail,
                };
                (k.clone(), o)
            })
            .collect(),
    )
}

/// The sub-tests a suite offers (`--list`), in the order they print.
fn list_subtests(bin: &Path, cts: &Path) -> Result<Vec<String>> {
    let out = Command::new(bin)
        .arg("--list")
        .current_dir(cts)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {} --list", bin.display()))?;
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('\t'))
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    if names.is_empty() {
        bail!("{} --list printed no sub-test", bin.display());
    }
    Ok(names)
}

/// The mode's environment and helpers for one process.
struct Setup {
    cts: PathBuf,
    lib: PathBuf,
    proxy_bin: PathBuf,
    interval: (u64, u64),
    /// PoCL's kernel caches, one folder per mode (`POCL_CACHE_DIR`): the
    /// modes of a suite run at once, and PoCL's cache is not safe between
    /// processes building the same source at once (a build that finds no
    /// `program.bc` removes the one another process just wrote before
    /// renaming its own into place; a process reading meanwhile finds none:
    /// a link failed so in CI, natively possible too). A mode's processes
    /// and its crane-proxy share one; no two modes do.
    pocl_cache: PathBuf,
}

/// A crane-proxy for one run, on a unix socket in the run's scratch folder.
pub(crate) struct Proxy {
    child: Child,
    pub addr: String,
    pub token: String,
    log: PathBuf,
}

impl Proxy {
    /// A crane-proxy on a unix socket in `dir`, with PoCL's kernel cache in
    /// `pocl_cache`.
    fn start(bin: &Path, dir: &Path, pocl_cache: &Path) -> Result<Proxy> {
        Proxy::start_with(
            bin,
            dir,
            format!("unix:{}", dir.join("proxy.sock").display()),
            Some(pocl_cache),
        )
    }

    /// A crane-proxy listening at `addr` (`unix:PATH` or `tcp://HOST:PORT`),
    /// its token file and logs in `dir`.
    pub(crate) fn start_at(bin: &Path, dir: &Path, addr: String) -> Result<Proxy> {
        Proxy::start_with(bin, dir, addr, None)
    }

    fn start_with(
        bin: &Path,
        dir: &Path,
        addr: String,
        pocl_cache: Option<&Path>,
    ) -> Result<Proxy> {
        let token = format!("cts-{}-{}", std::process::id(), seed());
        let tokens = dir.join("tokens");
        std::fs::write(&tokens, format!("{token}\n"))?;
        let log = dir.join("proxy.log");
        let mut cmd = Command::new(bin);
        if let Some(c) = pocl_cache {
            cmd.env("POCL_CACHE_DIR", c);
        }
        let child = cmd
            .args(["--listen", &addr, "--token-file"])
            .arg(&tokens)
            .stdin(Stdio::null())
            .stdout(File::create(&log)?)
            .stderr(File::create(dir.join("proxy.err"))?)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let mut p = Proxy {
            child,
            addr,
            token,
            log,
        };
        let t = Instant::now();
        loop {
            if std::fs::read_to_string(&p.log).is_ok_and(|s| s.contains("listening")) {
                return Ok(p);
            }
            if let Some(st) = p.child.try_wait()? {
                bail!(
                    "crane-proxy exited at start ({st}): {}",
                    std::fs::read_to_string(dir.join("proxy.err")).unwrap_or_default()
                );
            }
            if t.elapsed() > Duration::from_secs(30) {
                let _ = p.child.kill();
                bail!("crane-proxy did not listen within 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A number that differs from run to run, for pauses and tokens.
fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)
}

/// What the injector did to one process.
#[derive(Debug, Default, Clone, Serialize)]
struct Injected {
    /// Suspend/resume cycles, or moves to crane-proxy and back, completed.
    done: u64,
    /// Requests the process refused (with the reasons, first few kept): a
    /// refused suspend or move leaves it running where it was.
    refused: u64,
    reasons: Vec<String>,
    /// Requests that failed otherwise (a resume or a move back that did not
    /// work): each is a defect.
    errors: Vec<String>,
}

impl Injected {
    fn refusal(&mut self, why: String) {
        self.refused += 1;
        if self.reasons.len() < 5 && !self.reasons.contains(&why) {
            self.reasons.push(why);
        }
    }

    fn add(&mut self, other: &Injected) {
        self.done += other.done;
        self.refused += other.refused;
        for r in &other.reasons {
            if self.reasons.len() < 5 && !self.reasons.contains(r) {
                self.reasons.push(r.clone());
            }
        }
        self.errors.extend(other.errors.iter().cloned());
    }
}

/// Whether the process under test ended (its runner sets `stop` once it has):
/// a request cut off by the process's own exit is no failure of crane's. A
/// process dying of crane's doing shows as a crash of its sub-test instead.
fn ended(stop: &AtomicBool) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Sends suspend/resume cycles (or moves to the proxy and back) to `pid`
/// until `stop` is set or the process goes away.
fn inject(
    mode: Mode,
    sock: PathBuf,
    proxy: Option<(String, String)>,
    interval: (u64, u64),
    stop: Arc<AtomicBool>,
) -> Injected {
    let mut done = Injected::default();
    let mut rng = seed() | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        interval.0 + rng % (interval.1 - interval.0 + 1)
    };
    // The process's control socket appears once its library is loaded.
    while !sock.exists() {
        if stop.load(Ordering::Relaxed) {
            return done;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let deadline_ms = 10_000;
    let (away, back) = match (mode, proxy) {
        (Mode::Switches, Some((proxy, token))) => (
            Request::Remote {
                proxy,
                token: Some(token),
                deadline_ms,
                device: None,
                precopy: 0,
            },
            Request::Local {
                deadline_ms,
                device: None,
                precopy: 0,
            },
        ),
        _ => (Request::Suspend { deadline_ms }, Request::RESUME),
    };
    let gone = |e: &crane_control::CallError| matches!(e, crane_control::CallError::Connect { .. });
    loop {
        let pause = Instant::now() + Duration::from_millis(next());
        while Instant::now() < pause {
            if stop.load(Ordering::Relaxed) {
                return done;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        match call(&sock, &away, Duration::from_secs(60)) {
            Ok(r) if r.ok => {}
            Ok(r) => {
                done.refusal(r.error.unwrap_or_default());
                continue;
            }
            Err(e) if gone(&e) => return done,
            // The process ended while answering, or never answered.
            Err(e) => {
                if !ended(&stop) {
                    done.errors.push(format!("{away:?}: {e}"));
                }
                return done;
            }
        }
        // Back at once: the next pause runs with the process where it started.
        match call(&sock, &back, Duration::from_secs(120)) {
            Ok(r) if r.ok => done.done += 1,
            // A move back refused before anything changed (a queue held up
            // by a user event the application sets only later, say): the
            // process runs on on crane-proxy, as a refused move there runs
            // on locally. Asked again after the next pause. A failed resume,
            // or a move back that left the process suspended, is a defect.
            Ok(r) if matches!(back, Request::Local { .. }) && still_remote(&sock) => {
                done.refusal(r.error.unwrap_or_default());
                if !back_home(&sock, &back, &stop, &mut done) {
                    return done;
                }
            }
            Ok(r) => {
                done.errors.push(format!(
                    "{:?} failed: {}",
                    back,
                    r.error.unwrap_or_default()
                ));
                // Counted as a failure either way; asked again, as an
                // operator would, so that the process is not left parked
                // (its sub-test would then hang until the run's limit).
                for _ in 0..3 {
                    std::thread::sleep(Duration::from_secs(1));
                    match call(&sock, &back, Duration::from_secs(120)) {
                        Ok(r) if r.ok => break,
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
                return done;
            }
            Err(e) if gone(&e) => return done,
            Err(e) => {
                if !ended(&stop) {
                    done.errors.push(format!("{back:?}: {e}"));
                }
                return done;
            }
        }
    }
}

/// Whether the process at `sock` answers that it runs on crane-proxy.
fn still_remote(sock: &Path) -> bool {
    matches!(
        call(sock, &Request::Status, Duration::from_secs(30)),
        Ok(r) if r.status.as_ref().is_some_and(|s| s.mode == crane_control::Mode::Remote)
    )
}

/// After a refused move back: asks again, every 0.5 s for up to a minute,
/// until the process is home (true), or it ended (false). One still refused
/// after that is an error.
fn back_home(sock: &Path, back: &Request, stop: &AtomicBool, done: &mut Injected) -> bool {
    let t = Instant::now();
    let mut last = String::new();
    while t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        match call(sock, back, Duration::from_secs(120)) {
            Ok(r) if r.ok => {
                done.done += 1;
                return true;
            }
            Ok(r) => last = r.error.unwrap_or_default(),
            Err(e) => {
                if !ended(stop) {
                    done.errors.push(format!("{back:?}: {e}"));
                }
                return false;
            }
        }
    }
    done.errors
        .push(format!("{back:?} refused for a minute: {last}"));
    false
}

/// How long, since boot, some task of this machine waited for a CPU (the
/// kernel's pressure stall information, "some"); None where the kernel
/// does not report it.
fn cpu_stall() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    parse_cpu_stall(&text)
}

fn parse_cpu_stall(text: &str) -> Option<Duration> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    let total = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?;
    total.parse().ok().map(Duration::from_micros)
}

/// Whether a run that has taken `wall`, during `stalled` of which some task
/// of the machine waited for a CPU, is past its `limit`: the limit (set from
/// the native run's wall time) counts only the time the run could have used
/// the CPU, so that a run starved by other work (the conformance tier at idle
/// priority beside the emulated hosts of the end-to-end tier) is not taken
/// for a hang, while a run that sleeps (a real hang) is stopped at the limit.
/// Never past three times the limit of wall time, whatever the load.
fn out_of_time(wall: Duration, stalled: Duration, limit: Duration) -> bool {
    wall.saturating_sub(stalled) > limit || wall > limit * 3
}

/// Runs one process of `suite` with `subtests` in `mode`.
fn run_once(
    setup: &Setup,
    suite: &str,
    subtests: &[String],
    all: &[String],
    mode: Mode,
    limit: Duration,
    scratch: &Path,
) -> Result<(RunResult, Injected)> {
    let cts = setup.cts.as_path();
    let results = scratch.join("results.json");
    let _ = std::fs::remove_file(&results);
    let log = scratch.join("log.txt");
    let out = File::create(&log)?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(cts.join("bin").join(suite));
    cmd.args(suite_args(suite))
        .args(subtests)
        .current_dir(cts)
        .env("CL_CONFORMANCE_RESULTS_FILENAME", &results)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let run_dir = scratch.join("run");
    std::fs::create_dir_all(&run_dir)?;
    let pocl_cache = setup.pocl_cache.join(mode.name());
    let proxy = if mode.needs_proxy() {
        Some(Proxy::start(&setup.proxy_bin, scratch, &pocl_cache)?)
    } else {
        None
    };
    if mode != Mode::Native {
        cmd.env("POCL_CACHE_DIR", &pocl_cache);
        cmd.env("LD_PRELOAD", &setup.lib)
            .env("CRANE_RUN_DIR", &run_dir)
            .env_remove("CRANE_MODE");
    }
    if mode == Mode::Remote {
        let p = proxy.as_ref().expect("started above");
        cmd.env("CRANE_MODE", "remote")
            .env("CRANE_PROXY", &p.addr)
            .env("CRANE_PROXY_TOKEN", &p.token);
    }
    let t = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {suite}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let injector = matches!(mode, Mode::Cycles | Mode::Switches).then(|| {
        let sock = socket_path(&run_dir, child.id());
        let stop = stop.clone();
        let target = proxy.as_ref().map(|p| (p.addr.clone(), p.token.clone()));
        let interval = setup.interval;
        std::thread::spawn(move || inject(mode, sock, target, interval, stop))
    });
    let stalled_at_start = cpu_stall();
    let end = loop {
        if let Some(st) = child.try_wait()? {
            break match st.code() {
                Some(c) => End::Exited(c),
                None => End::Signal(st.signal().unwrap_or(0)),
            };
        }
        let stalled = stalled_at_start
            .zip(cpu_stall())
            .map_or(Duration::ZERO, |(a, b)| b.saturating_sub(a));
        if out_of_time(t.elapsed(), stalled, limit) {
            // SAFETY: kill has no memory-safety preconditions; the group is
            // the child's own (process_group(0)).
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break End::TimedOut;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut injected: Injected = injector
        .map(|h| h.join().unwrap_or_default())
        .unwrap_or_default();
    // Anything the suite left in its process group goes with it.
    // SAFETY: as above.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    // crane-proxy must outlive the run: one that died is a defect even when
    // the application carried on (a move to it is then refused, and the
    // process stays local).
    if let Some(mut p) = proxy
        && let Some(st) = p.child.try_wait()?
    {
        injected.errors.push(format!(
            "crane-proxy died during the run ({st}); its log is kept"
        ));
    }
    let text = String::from_utf8_lossy(&std::fs::read(&log)?).into_owned();
    let (started, mut outcomes) = parse_log(&text, all);
    if let Some(file) = parse_results_file(&results) {
        // The file is the suite's own verdict; the log fills in what it lacks.
        for (k, v) in file {
            if subtests.contains(&k) {
                outcomes.insert(k, v);
            }
        }
    }
    if end != End::Exited(0) && end != End::Exited(1) || !results.exists() {
        // The process died or was stopped: the sub-test it was in gets the
        // blame, those after it were never run.
        let blame = match end {
            End::TimedOut => Outcome::Hang,
            _ => Outcome::Crash,
        };
        let current = started
            .iter()
            .rev()
            .find(|s| !outcomes.contains_key(*s))
            .cloned();
        if let Some(c) = current {
            outcomes.insert(c, blame);
        }
        for s in subtests {
            outcomes.entry(s.clone()).or_insert(Outcome::NotRun);
        }
    }
    Ok((
        RunResult {
            outcomes,
            end,
            wall,
            log,
        },
        injected,
    ))
}

/// How long a crane mode's run of a suite may take before it counts as
/// hung, from the native run's wall time: four times as long and a minute,
/// at least two; on crane-proxy twelve times: every call is a round trip
/// there, and the image suites' many small blocking transfers on PoCL ran
/// about ten times native (test_cl_copy_images 3Dto2Darray: 54 s against
/// 4.8 s, 2026-11-27), which the four-fold limit called a hang.
fn mode_limit(native_wall_s: f64, mode: Mode) -> Duration {
    let times = if mode == Mode::Remote { 12 } else { 4 };
    Duration::from_secs((native_wall_s as u64 * times + 60).max(120))
}

/// Runs `subtests` of `suite` in `mode` to the end: after a crash or hang the
/// rest runs on in a new process, so that every sub-test gets an outcome.
#[allow(clippy::too_many_arguments)]
fn run_all(
    suite: &str,
    subtests: &[String],
    mode: Mode,
    setup: &Setup,
    limit: Duration,
    scratch: &Path,
    keep_logs: &Path,
    reference: Option<&BTreeMap<String, Outcome>>,
) -> Result<ModeResult> {
    let mut outcomes: BTreeMap<String, Outcome> = BTreeMap::new();
    let mut injected = Injected::default();
    let mut wall = Duration::ZERO;
    let mut processes = 0;
    let mut ends = Vec::new();
    let mut todo: Vec<String> = subtests.to_vec();
    while !todo.is_empty() {
        processes += 1;
        let dir = scratch.join(format!("{}-{processes}", mode.name()));
        std::fs::create_dir_all(&dir)?;
        let (r, inj) = run_once(setup, suite, &todo, subtests, mode, limit, &dir)?;
        wall += r.wall;
        injected.add(&inj);
        let abnormal = !matches!(r.end, End::Exited(0) | End::Exited(1));
        // The log of every process that ended badly or gave an outcome other
        // than the reference's is kept, to find out why.
        let differs = reference.is_some_and(|n| {
            r.outcomes
                .iter()
                .any(|(k, o)| *o != Outcome::NotRun && n.get(k).is_some_and(|x| x != o))
        });
        if abnormal || differs || !inj.errors.is_empty() {
            std::fs::create_dir_all(keep_logs)?;
            let kept = keep_logs.join(format!("{suite}-{}-{processes}.log", mode.name()));
            std::fs::copy(&r.log, &kept)?;
            for f in ["proxy.log", "proxy.err"] {
                if dir.join(f).exists() {
                    std::fs::copy(
                        dir.join(f),
                        keep_logs.join(format!("{suite}-{}-{processes}.{f}", mode.name())),
                    )?;
                }
            }
        }
        ends.push(match r.end {
            End::Exited(c) => format!("exit {c}"),
            End::Signal(s) => format!("signal {s}"),
            End::TimedOut => format!("stopped after {} s", limit.as_secs()),
        });
        let mut rest = Vec::new();
        for s in &todo {
            match r.outcomes.get(s) {
                Some(Outcome::NotRun) | None if abnormal => rest.push(s.clone()),
                Some(o) => {
                    outcomes.insert(s.clone(), *o);
                }
                None => {
                    // Ended normally without a word on it: the suite did
                    // not recognise it, or printed nothing.
                    outcomes.insert(s.clone(), Outcome::NotRun);
                }
            }
        }
        // A process that died before starting anything would loop for ever.
        if rest.len() == todo.len() {
            for s in rest {
                outcomes.insert(s, Outcome::Crash);
            }
            break;
        }
        todo = rest;
    }
    let count = |o| outcomes.values().filter(|v| **v == o).count();
    Ok(ModeResult {
        pass: count(Outcome::Pass),
        fail: count(Outcome::Fail),
        skip: count(Outcome::Skip),
        wall_s: wall.as_secs_f64(),
        processes,
        ends,
        injected: matches!(mode, Mode::Cycles | Mode::Switches).then_some(injected),
        differences: Vec::new(),
        better: 0,
        outcomes,
    })
}

#[derive(Debug, Serialize)]
struct ModeResult {
    pass: usize,
    fail: usize,
    skip: usize,
    wall_s: f64,
    /// Processes it took (more than one after a crash or a hang).
    processes: usize,
    ends: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    injected: Option<Injected>,
    /// Sub-tests whose outcome differs from native: (name, native, here).
    differences: Vec<(String, Outcome, Outcome)>,
    /// Of those, sub-tests that fail natively and pass under crane (listed,
    /// not counted against crane).
    better: usize,
    outcomes: BTreeMap<String, Outcome>,
}

#[derive(Debug, Serialize)]
struct SuiteResult {
    suite: String,
    args: Vec<String>,
    subtests: Vec<String>,
    /// Sub-tests left out because they crash or hang natively.
    left_out: BTreeMap<String, Outcome>,
    device: String,
    modes: BTreeMap<Mode, ModeResult>,
}

#[derive(Debug, Serialize)]
struct Report {
    date: String,
    machine: String,
    cts: String,
    suites: Vec<SuiteResult>,
    differences: usize,
}

/// The suite and sub-tests of a `SUITE[:SUBTEST,...]` argument.
fn parse_selection(s: &str) -> (String, Vec<String>) {
    match s.split_once(':') {
        Some((suite, subs)) => (
            suite.to_string(),
            subs.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect(),
        ),
        None => (s.to_string(), Vec::new()),
    }
}

fn machine() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{} ({cpu}, {cores} cores)", host.trim())
}

fn device_line(log: &Path) -> String {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Compute Device Name"))
        .map(|l| {
            l.split(", ")
                .filter(|p| {
                    p.starts_with("Compute Device Name") || p.starts_with("Compute Device Version")
                })
                .map(|p| p.split_once(" = ").map_or(p, |x| x.1))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

fn date() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The CTS folder: the argument, $CRANE_CTS_DIR, or the shared copy.
pub fn cts_dir(arg: Option<&Path>, root: &Path) -> PathBuf {
    arg.map(Path::to_path_buf)
        .or_else(|| std::env::var_os(CTS_ENV).map(PathBuf::from))
        .unwrap_or_else(|| root.join("../shared/conformance/opencl-cts"))
}

pub fn main(
    args: Args,
    root: &Path,
    build: impl FnOnce(bool) -> Result<(PathBuf, PathBuf)>,
) -> Result<()> {
    let cts = cts_dir(args.cts.as_deref(), root);
    let cts = cts
        .canonicalize()
        .with_context(|| format!("no CTS at {} (set --cts or {CTS_ENV})", cts.display()))?;
    let interval = match args.interval.split_once('-') {
        Some((a, b)) => (a.parse::<u64>()?, b.parse::<u64>()?),
        None => bail!("--interval takes MIN-MAX in milliseconds"),
    };
    if interval.0 == 0 || interval.1 < interval.0 {
        bail!("--interval: MIN must be at least 1 and MAX at least MIN");
    }
    let mut modes = args.modes.clone();
    modes.sort();
    modes.dedup();
    if modes.first() != Some(&Mode::Native) {
        modes.insert(0, Mode::Native);
    }
    let (lib, proxy_bin) = match (&args.lib, &args.proxy) {
        (Some(l), Some(p)) => (l.clone(), p.clone()),
        (l, p) if modes.len() > 1 => {
            let (bl, bp) = build(args.release)?;
            (l.clone().unwrap_or(bl), p.clone().unwrap_or(bp))
        }
        (l, p) => (l.clone().unwrap_or_default(), p.clone().unwrap_or_default()),
    };
    let scratch = tempfile::Builder::new().prefix("crane-cts-").tempdir()?;
    let setup = Setup {
        cts: cts.clone(),
        lib: lib.canonicalize().unwrap_or(lib),
        proxy_bin: proxy_bin.canonicalize().unwrap_or(proxy_bin),
        interval,
        pocl_cache: scratch.path().join("pocl-cache"),
    };

    // The selection: SUITE arguments, the CI subset, or every suite.
    let mut selection: Vec<(String, Vec<String>)> = Vec::new();
    fn add(selection: &mut Vec<(String, Vec<String>)>, s: &str) {
        let (suite, subs) = parse_selection(s);
        match selection.iter_mut().find(|(n, _)| *n == suite) {
            Some((_, have)) if !have.is_empty() && !subs.is_empty() => have.extend(subs),
            Some((_, have)) => have.clear(),
            None => selection.push((suite, subs)),
        }
    }
    if args.ci {
        CI_SUBSET.iter().for_each(|s| add(&mut selection, s));
    }
    args.suites.iter().for_each(|s| add(&mut selection, s));
    if selection.is_empty() {
        SUITES.iter().for_each(|s| add(&mut selection, s));
    }
    let excluded: Vec<(String, Vec<String>)> =
        args.exclude.iter().map(|s| parse_selection(s)).collect();

    let out_path = args
        .out
        .clone()
        .unwrap_or_else(|| root.join("target/conformance/results.json"));
    let keep_logs = args
        .logs
        .clone()
        .unwrap_or_else(|| root.join("target/conformance/logs"));
    let mut report = Report {
        date: date(),
        machine: machine(),
        cts: cts.display().to_string(),
        suites: Vec::new(),
        differences: 0,
    };
    println!("conformance: {} on {}", report.date, report.machine);
    let started = Instant::now();
    for (suite, chosen) in &selection {
        let bin = cts.join("bin").join(suite);
        if !bin.exists() {
            bail!("no suite {suite} in {}", cts.join("bin").display());
        }
        let offered = list_subtests(&bin, &cts)?;
        let mut subtests = if chosen.is_empty() {
            offered.clone()
        } else {
            for c in chosen {
                if !offered.contains(c) {
                    bail!("{suite} has no sub-test {c} (see {suite} --list)");
                }
            }
            chosen.clone()
        };
        for (s, ex) in &excluded {
            if s == suite {
                subtests.retain(|t| !ex.contains(t));
            }
        }
        let sdir = scratch.path().join(suite);
        std::fs::create_dir_all(&sdir)?;
        let native_limit = Duration::from_secs(args.timeout);
        let native = run_all(
            suite,
            &subtests,
            Mode::Native,
            &setup,
            native_limit,
            &sdir,
            &keep_logs,
            None,
        )?;
        let device = device_line(&sdir.join("native-1/log.txt"));
        // What crashes or hangs natively is left out of every mode.
        let left_out: BTreeMap<String, Outcome> = native
            .outcomes
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::Crash | Outcome::Hang | Outcome::NotRun))
            .map(|(k, o)| (k.clone(), *o))
            .collect();
        let kept: Vec<String> = subtests
            .iter()
            .filter(|s| !left_out.contains_key(*s))
            .cloned()
            .collect();
        println!(
            "\n{suite} ({} sub-tests{}) on {device}",
            kept.len(),
            if left_out.is_empty() {
                String::new()
            } else {
                format!(
                    "; left out, natively: {}",
                    left_out
                        .iter()
                        .map(|(k, o)| format!("{k} ({})", o.word()))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
        let mut result = SuiteResult {
            suite: suite.clone(),
            args: suite_args(suite),
            subtests: kept.clone(),
            left_out,
            device,
            modes: BTreeMap::new(),
        };
        // The modes under crane, `--jobs` at a time; reported in mode order.
        let crane_modes: Vec<Mode> = if kept.is_empty() {
            Vec::new()
        } else {
            modes
                .iter()
                .copied()
                .filter(|m| *m != Mode::Native)
                .collect()
        };
        let mut ran = run_modes(&crane_modes, args.jobs as usize, |mode| {
            run_all(
                suite,
                &kept,
                mode,
                &setup,
                mode_limit(native.wall_s, mode),
                &sdir,
                &keep_logs,
                Some(&native.outcomes),
            )
        });
        for &mode in &modes {
            let mut r = if mode == Mode::Native {
                let mut n = ModeResult {
                    ..native_clone(&native)
                };
                n.outcomes.retain(|k, _| kept.contains(k));
                n
            } else {
                match ran.remove(&mode) {
                    Some(r) => r?,
                    None => continue,
                }
            };
            if mode != Mode::Native {
                let native = &native.outcomes;
                r.differences = kept
                    .iter()
                    .filter_map(|s| {
                        let n = native.get(s).copied().unwrap_or(Outcome::NotRun);
                        let c = r.outcomes.get(s).copied().unwrap_or(Outcome::NotRun);
                        (n != c).then(|| (s.clone(), n, c))
                    })
                    .collect();
                r.pass = r.outcomes.values().filter(|o| **o == Outcome::Pass).count();
                r.better = r
                    .differences
                    .iter()
                    .filter(|(_, n, c)| *n == Outcome::Fail && *c == Outcome::Pass)
                    .count();
            } else {
                r.pass = r.outcomes.values().filter(|o| **o == Outcome::Pass).count();
                r.fail = r.outcomes.values().filter(|o| **o == Outcome::Fail).count();
                r.skip = r.outcomes.values().filter(|o| **o == Outcome::Skip).count();
            }
            print_mode(mode, &r, kept.len());
            report.differences +=
                r.differences.len() - r.better + r.injected.as_ref().map_or(0, |i| i.errors.len());
            result.modes.insert(mode, r);
            // Write as we go: a long run interrupted still leaves its results.
            write_report(&out_path, &report, Some(&result))?;
        }
        report.suites.push(result);
        write_report(&out_path, &report, None)?;
    }
    println!(
        "\nconformance: {} suite(s) in {:.0} s; results in {}",
        report.suites.len(),
        started.elapsed().as_secs_f64(),
        out_path.display()
    );
    if report.differences > 0 {
        bail!(
            "{} sub-test outcome(s) under crane differ from native (logs in {})",
            report.differences,
            keep_logs.display()
        );
    }
    println!("conformance: every mode matches native");
    Ok(())
}

/// Runs `run` for every mode, at most `jobs` at once; the results by mode.
fn run_modes<T: Send>(
    modes: &[Mode],
    jobs: usize,
    run: impl Fn(Mode) -> Result<T> + Sync,
) -> BTreeMap<Mode, Result<T>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, modes.len().max(1)) {
            scope.spawn(|| {
                // Taken in order: the order given is the order started.
                while let Some(&mode) =
                    modes.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    let r = run(mode);
                    done.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(mode, r);
                }
            });
        }
    });
    done.into_inner().unwrap_or_else(|e| e.into_inner())
}

fn native_clone(n: &ModeResult) -> ModeResult {
    ModeResult {
        pass: n.pass,
        fail: n.fail,
        skip: n.skip,
        wall_s: n.wall_s,
        processes: n.processes,
        ends: n.ends.clone(),
        injected: None,
        differences: Vec::new(),
        better: 0,
        outcomes: n.outcomes.clone(),
    }
}

fn print_mode(mode: Mode, r: &ModeResult, total: usize) {
    let mut line = format!(
        "  {:<12} {:>4}/{total} pass, {} fail, {} skip  {:>6.1} s",
        mode.name(),
        r.pass,
        r.outcomes.values().filter(|o| **o == Outcome::Fail).count(),
        r.outcomes.values().filter(|o| **o == Outcome::Skip).count(),
        r.wall_s
    );
    if let Some(i) = &r.injected {
        let what = if mode == Mode::Switches {
            "switches"
        } else {
            "cycles"
        };
        line += &format!("  {} {what}", i.done);
        if i.refused > 0 {
            line += &format!(", {} refused", i.refused);
        }
    }
    if r.processes > 1 {
        line += &format!("  ({} processes: {})", r.processes, r.ends.join(", "));
    }
    if mode != Mode::Native {
        let worse = r.differences.len() - r.better;
        if worse == 0 {
            line += "  = native";
        } else {
            line += &format!("  {worse} DIFFERENT");
        }
        if r.better > 0 {
            line += &format!(" ({} pass only under crane)", r.better);
        }
    }
    println!("{line}");
    for (s, n, c) in &r.differences {
        println!("      {s}: native {}, crane {}", n.word(), c.word());
    }
    if let Some(i) = &r.injected {
        for e in &i.errors {
            println!("      injected request failed: {e}");
        }
        for why in &i.reasons {
            println!("      refused: {why}");
        }
    }
}

fn write_report(path: &Path, report: &Report, partial: Option<&SuiteResult>) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut v = serde_json::to_value(report)?;
    if let Some(p) = partial {
        v["suites"]
            .as_array_mut()
            .expect("suites is an array")
            .push(serde_json::to_value(p)?);
    }
    std::fs::write(path, serde_json::to_string_pretty(&v)? + "\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_log_gives_each_subtest_its_verdict_and_the_one_running_when_it_died() {
        let subs = names(&["a", "b", "c", "d"]);
        let log = "a...\nsomething a passed\na passed\nb...\nb FAILED\nc...\nc test not supported\n\
                   d...\n";
        let (started, out) = parse_log(log, &subs);
        assert_eq!(started, subs);
        assert_eq!(out.get("a"), Some(&Outcome::Pass));
        assert_eq!(out.get("b"), Some(&Outcome::Fail));
        assert_eq!(out.get("c"), Some(&Outcome::Skip));
        assert_eq!(out.get("d"), None);
    }

    #[test]
    fn names_the_suite_does_not_offer_are_not_verdicts() {
        let subs = names(&["a"]);
        let (started, out) = parse_log("x...\nx passed\nab passed\n", &subs);
        assert!(started.is_empty());
        assert!(out.is_empty());
    }

    #[test]
    fn crane_proxy_gets_more_time_than_the_other_modes() {
        assert_eq!(mode_limit(10.0, Mode::Cycles), Duration::from_secs(120));
        let s = Duration::from_secs;
        assert!(!out_of_time(s(150), s(60), s(120)), "starved 60 s of 150");
        assert!(out_of_time(s(150), s(0), s(120)), "a sleeping hang");
        assert!(out_of_time(s(361), s(361), s(120)), "three times the limit");
        assert_eq!(
            parse_cpu_stall(
                "some avg10=7.49 avg60=4.07 avg300=16.82 total=6373963413\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
            ),
            Some(Duration::from_micros(6_373_963_413))
        );
        assert_eq!(parse_cpu_stall("full avg10=0.00 total=5\n"), None);
        assert_eq!(mode_limit(30.0, Mode::Switches), Duration::from_secs(180));
        assert_eq!(mode_limit(30.0, Mode::Remote), Duration::from_secs(420));
        assert_eq!(mode_limit(1.0, Mode::Remote), Duration::from_secs(120));
    }

    #[test]
    fn modes_run_at_most_jobs_at_once_and_each_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let modes = [
            Mode::Passthrough,
            Mode::Cycles,
            Mode::Remote,
            Mode::Switches,
        ];
        for jobs in [1, 2, 8] {
            let (now, most, calls) = (
                AtomicUsize::new(0),
                AtomicUsize::new(0),
                AtomicUsize::new(0),
            );
            let r = run_modes(&modes, jobs, |m| {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                calls.fetch_add(1, Ordering::SeqCst);
                // Runs wait until as many run at once as may (a pool that runs
                // fewer fails the check on `most` below).
                let until = Instant::now() + Duration::from_secs(5);
                let want = jobs.min(4);
                while now.load(Ordering::SeqCst) < want
                    && most.load(Ordering::SeqCst) < want
                    && Instant::now() < until
                {
                    std::thread::sleep(Duration::from_millis(2));
                }
                most.fetch_max(now.load(Ordering::SeqCst), Ordering::SeqCst);
                now.fetch_sub(1, Ordering::SeqCst);
                if m == Mode::Remote {
                    bail!("remote failed")
                }
                Ok(m.name())
            });
            assert_eq!(calls.load(Ordering::SeqCst), 4);
            assert_eq!(most.load(Ordering::SeqCst), jobs.min(4), "jobs {jobs}");
            assert_eq!(r.len(), 4);
            assert_eq!(r[&Mode::Cycles].as_ref().unwrap(), &Mode::Cycles.name());
            assert!(r[&Mode::Remote].is_err());
        }
    }

    #[test]
    fn a_selection_names_a_suite_and_its_subtests() {
        assert_eq!(parse_selection("test_basic"), ("test_basic".into(), vec![]));
        assert_eq!(
            parse_selection("test_basic:a, b,"),
            ("test_basic".into(), names(&["a", "b"]))
        );
    }
}
