//! Helpers shared by the integration tests: the library and cranectl under
//! test, the corpus (testapps/), the three ways an unmodified application gets
//! crane, and a run interrupted by suspend/resume cycles.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crane_control::{Request, call, socket_path};

pub mod netns;
pub mod proxy;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// target/<profile>, where cargo puts the test binaries' siblings.
fn profile_dir() -> PathBuf {
    // target/<profile>/deps/<test>-<hash> -> target/<profile>
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// An artifact of another build target in target/<profile>, built with cargo
/// when it is missing (`cargo test` builds neither the cdylib nor other
/// packages' binaries; `cargo xtask test` builds both first).
pub fn built(file: &str, package: &str) -> PathBuf {
    let dir = profile_dir();
    let path = dir.join(file);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", package]).current_dir(repo());
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        cmd.env("CARGO_TARGET_DIR", dir.parent().unwrap());
        assert!(cmd.status().unwrap().success(), "building {file} failed");
    }
    assert!(path.exists(), "{} missing", path.display());
    path
}

/// The cdylib under test.
pub fn library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| built("libcrane_opencl.so", "crane-opencl"))
        .clone()
}

/// cranectl, for installing crane as an ICD.
pub fn cranectl() -> PathBuf {
    static CTL: OnceLock<PathBuf> = OnceLock::new();
    CTL.get_or_init(|| built("cranectl", "cranectl")).clone()
}

/// A fresh scratch directory for one test, removed when dropped (also when
/// the test fails), so that runs leave nothing under /tmp.
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("crane-{name}-"))
        .tempdir()
        .expect("create a scratch directory")
}

/// Builds the corpus once per test binary.
pub fn apps() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = repo().join("target/testapps");
        let st = Command::new("bash")
            .arg(repo().join("testapps/build.sh"))
            .arg(&out)
            .status()
            .expect("run testapps/build.sh");
        assert!(st.success(), "building the corpus failed");
        out
    })
}

pub fn result_line(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_default()
        .to_string()
}

/// `app --iters ITERS` preloaded with crane, its control socket under
/// `run_dir`; the caller adds its environment and standard streams.
pub fn under_crane(app: &str, iters: &str, run_dir: &Path) -> Command {
    let mut c = Command::new(apps().join(app));
    c.args(["--iters", iters])
        .env("LD_PRELOAD", library())
        .env("CRANE_RUN_DIR", run_dir);
    c
}

/// Reads pingpong's standard error until it says it holds; the rest is
/// drained by the thread returned.
pub fn wait_holding(child: &mut std::process::Child) -> std::thread::JoinHandle<usize> {
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    loop {
        let line = lines
            .next()
            .expect("pingpong ended before holding")
            .unwrap();
        if line.contains("holding at iteration") {
            break;
        }
    }
    std::thread::spawn(move || lines.map_while(Result::ok).count())
}

/// The RESULT line of an uninterrupted native run.
pub fn native(app: &str, iters: &str) -> String {
    let out = Command::new(apps().join(app))
        .args(["--iters", iters])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{app} failed natively: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = result_line(&out.stdout);
    assert!(!r.is_empty(), "{app} printed no RESULT line");
    r
}

/// Runs `run` on `app` with `iters` iterations and compares its result with
/// a native run of the same length. How far an app gets between two
/// interruptions depends on the machine, so a run that ended before `min`
/// interruptions (the count `run` returns) landed is repeated with four times
/// the iterations, up to three times. Returns the last run's count.
pub fn long_enough(
    app: &str,
    iters: &str,
    min: usize,
    mut run: impl FnMut(&str) -> (String, usize),
) -> (String, usize) {
    let mut n: u64 = iters.parse().expect("--iters is a number");
    for attempt in 0.. {
        let iters = n.to_string();
        let want = native(app, &iters);
        let (got, count) = run(&iters);
        assert_eq!(
            got, want,
            "{app} (--iters {iters}, {count} interruptions) differs from native"
        );
        if count >= min {
            return (iters, count);
        }
        assert!(
            attempt < 3,
            "{app}: only {count} interruptions landed even at --iters {iters}"
        );
        n *= 4;
    }
    unreachable!()
}

/// How an unmodified application gets crane: the environment to run it with.
pub struct Mode {
    pub name: &'static str,
    pub env: Vec<(&'static str, OsString)>,
    /// Scratch files the mode needs, removed with the mode.
    _dir: Option<tempfile::TempDir>,
}

impl Mode {
    /// `LD_PRELOAD=libcrane_opencl.so`.
    pub fn preload() -> Mode {
        Mode {
            name: "preload",
            env: vec![("LD_PRELOAD", library().into())],
            _dir: None,
        }
    }

    /// Another build of the library, preloaded, with settings of its own
    /// (the fault-injection build, say).
    pub fn preload_of(lib: PathBuf, env: Vec<(&'static str, OsString)>) -> Mode {
        let mut env = env;
        env.push(("LD_PRELOAD", lib.into()));
        Mode {
            name: "preload",
            env,
            _dir: None,
        }
    }

    /// A directory on `LD_LIBRARY_PATH` whose libOpenCL.so.1 is a symlink to
    /// the library, in place of the ICD loader the application was linked
    /// against.
    pub fn drop_in(tag: &str) -> Mode {
        let dir = scratch(&format!("dropin-{tag}"));
        std::os::unix::fs::symlink(library(), dir.path().join("libOpenCL.so.1")).unwrap();
        Mode {
            name: "drop-in",
            env: vec![("LD_LIBRARY_PATH", dir.path().into())],
            _dir: Some(dir),
        }
    }

    /// crane installed as the ICD by `cranectl install-icd`, into a copy of
    /// the system's ICD directory (OCL_ICD_VENDORS for the loader,
    /// CRANE_VENDORS_DIR for crane), so the real /etc is never touched.
    pub fn icd(tag: &str) -> Mode {
        let root = scratch(&format!("icd-{tag}"));
        let icd = IcdDirs::new(root.path());
        let out = icd.cranectl(&["install-icd".into(), "--lib".into(), library().into()]);
        assert!(
            out.status.success(),
            "cranectl install-icd failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mode = Mode {
            name: "ICD",
            env: icd.env(),
            _dir: Some(root),
        };
        assert_eq!(
            IcdDirs::icd_names(&icd.vendors),
            ["crane.icd"],
            "install-icd left other ICDs in the loader's directory"
        );
        mode
    }

    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }
}

/// A copy of the system's ICD directory and an empty directory for crane.
pub struct IcdDirs {
    pub vendors: PathBuf,
    pub crane: PathBuf,
}

impl IcdDirs {
    pub fn new(root: &Path) -> IcdDirs {
        let vendors = root.join("vendors");
        let crane = root.join("crane");
        std::fs::create_dir_all(&vendors).unwrap();
        for f in Self::icd_names(Path::new("/etc/OpenCL/vendors")) {
            std::fs::copy(Path::new("/etc/OpenCL/vendors").join(&f), vendors.join(&f)).unwrap();
        }
        assert!(
            !Self::icd_names(&vendors).is_empty(),
            "no ICD in /etc/OpenCL/vendors (is pocl-opencl-icd installed?)"
        );
        IcdDirs { vendors, crane }
    }

    pub fn env(&self) -> Vec<(&'static str, OsString)> {
        vec![
            ("OCL_ICD_VENDORS", self.vendors.clone().into()),
            ("CRANE_VENDORS_DIR", self.crane.clone().into()),
        ]
    }

    /// Runs cranectl against these directories.
    pub fn cranectl(&self, args: &[OsString]) -> Output {
        let mut c = Command::new(cranectl());
        c.args(args);
        for (k, v) in self.env() {
            c.env(k, v);
        }
        c.output().unwrap()
    }

    /// The `.icd` file names of a directory, sorted.
    pub fn icd_names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".icd"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// Tiny deterministic generator, so a failure can be replayed from its seed.
pub struct Rng(pub u64);
impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

pub struct Run {
    pub result: String,
    pub cycles: usize,
    pub stderr: String,
}

/// Runs `app` under crane in `mode`, suspending and resuming it at random
/// moments until it exits. Every suspend must leave no device descriptor or
/// mapping behind.
pub fn interrupted(app: &str, iters: &str, seed: u64, max_cycles: usize, mode: &Mode) -> Run {
    let run_dir = scratch(&format!("run-{app}-{seed}-{}", mode.name));
    let child = mode
        .command(apps().join(app))
        .args(["--iters", iters])
        .env("CRANE_RUN_DIR", run_dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let sock = socket_path(run_dir.path(), pid);
    let mut rng = Rng(seed | 1);
    let mut cycles = 0;
    let start = Instant::now();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() && cycles < max_cycles && start.elapsed() < Duration::from_secs(120)
    {
        std::thread::sleep(Duration::from_millis(5 + rng.below(60)));
        if !sock.exists() {
            continue;
        }
        let Ok(r) = call(
            &sock,
            &Request::Suspend {
                deadline_ms: 20_000,
            },
            Duration::from_secs(60),
        ) else {
            continue;
        };
        if !r.ok {
            // The process may be exiting; anything else is a failure.
            assert!(finishes(&waiter), "{app}: suspend failed: {:?}", r.error);
            continue;
        }
        let res = r.residue.expect("suspend reports residue");
        assert!(
            res.device_fds.is_empty() && res.device_mappings.is_empty(),
            "{app}: device left behind: {res:?}"
        );
        // Vendor threads: none may run after a suspend, except in ICD mode,
        // where crane is loaded only at the first OpenCL call and cannot set
        // POCL_ENABLE_UNINIT for PoCL in time (docs/architecture.md). A
        // vendor object crane fails to release keeps PoCL's device, and so its
        // workers, alive: this is what caught a leaked event per unmap.
        if mode.name == "ICD" {
            if !res.vendor_threads.is_empty() {
                eprintln!(
                    "{app}: vendor threads still running after suspend (ICD mode): {:?}",
                    res.vendor_threads
                );
            }
        } else {
            assert!(
                res.vendor_threads.is_empty(),
                "{app} ({}): vendor threads still running after suspend: {:?}",
                mode.name,
                res.vendor_threads
            );
        }
        std::thread::sleep(Duration::from_millis(rng.below(20)));
        // A process whose remaining work needs no OpenCL may finish while
        // suspended; otherwise resume must answer and succeed.
        let r = match call(&sock, &Request::RESUME, Duration::from_secs(60)) {
            Ok(r) => r,
            Err(e) => {
                assert!(finishes(&waiter), "{app}: resume not answered: {e}");
                break;
            }
        };
        assert!(r.ok, "{app}: resume failed: {:?}", r.error);
        cycles += 1;
    }
    // A hung application (say, a loader calling itself through crane's table)
    // fails the test instead of hanging it.
    while !waiter.is_finished() {
        if start.elapsed() > Duration::from_secs(240) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("{app} ({}) did not finish in 240 s; killed", mode.name);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = waiter.join().unwrap();
    drop(run_dir);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{app} failed under crane ({}), {} after {cycles} suspend/resume cycles: {stderr}",
        mode.name,
        out.status
    );
    Run {
        result: result_line(&out.stdout),
        cycles,
        stderr,
    }
}

/// Whether the process exits within a few seconds (on a loaded machine its
/// teardown takes a while after the control socket is gone).
pub fn finishes<T>(waiter: &std::thread::JoinHandle<T>) -> bool {
    let start = Instant::now();
    while !waiter.is_finished() {
        if start.elapsed() > Duration::from_secs(15) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}
