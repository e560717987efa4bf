//! Integration tier: the test corpus (testapps/) under libcrane_opencl.so on a
//! real OpenCL implementation (PoCL in CI), interrupted by suspend/resume cycles
//! at random moments, must print exactly what an uninterrupted native run
//! prints. Needs gcc and an OpenCL ICD; see testapps/README.md.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crane_control::{Request, call, socket_path};

mod common;
use common::{Mode, apps, interrupted, library, long_enough, native, result_line, scratch};

fn check(app: &str, iters: &str) {
    let preload = Mode::preload();
    for seed in [0x9e3779b97f4a7c15u64, 0x2545f4914f6cdd1d] {
        let (iters, n) = long_enough(app, iters, 3, |iters| {
            let run = interrupted(app, iters, seed, 40, &preload);
            (run.result, run.cycles)
        });
        eprintln!("{app}: {n} cycles at --iters {iters}, result identical to native");
    }
}

macro_rules! corpus_test {
    ($name:ident, $iters:expr) => {
        #[test]
        fn $name() {
            check(stringify!($name), $iters);
        }
    };
}

corpus_test!(pingpong, "6000");
corpus_test!(subbuffers, "3000");
corpus_test!(images, "2000");
corpus_test!(localmem, "3000");
corpus_test!(maps, "3000");
corpus_test!(copies, "3000");
corpus_test!(multictx, "2000");
corpus_test!(events, "2000");
corpus_test!(programs, "40");
corpus_test!(frameloop, "600");
corpus_test!(rustpipe, "1200");

/// Without membarrier (`CRANE_MEMBARRIER=0`, or a kernel without it) every
/// call takes the gate's fenced path; suspends must still find every call and
/// the program's result must not change (events: callbacks from the vendor's
/// threads as well).
#[test]
fn gate_without_membarrier() {
    let mut mode = Mode::preload();
    mode.env.push(("CRANE_MEMBARRIER", "0".into()));
    for app in ["pingpong", "events"] {
        let (iters, n) = long_enough(app, "2000", 3, |iters| {
            let run = interrupted(app, iters, 0x2545f4914f6cdd1d, 20, &mode);
            (run.result, run.cycles)
        });
        eprintln!("{app} without membarrier: {n} cycles at --iters {iters}, identical to native");
    }
}

/// With map memory and RAM copies pinned as on a GPU (`CRANE_PIN_CPU=1`):
/// maps served from pinned pooled regions, dirty buffers read into pinned RAM
/// copies and re-injected by writes from them at resume; every result must
/// still be native's across the cycles.
#[test]
fn pinned_staging_as_on_a_gpu() {
    let mut mode = Mode::preload();
    mode.env.push(("CRANE_PIN_CPU", "1".into()));
    // The corpus's buffers are small: pin from one page on.
    mode.env.push(("CRANE_PIN_MIN", "4096".into()));
    // Every host write read back at suspend: the re-injection path for all.
    mode.env.push(("CRANE_WRITE_CACHE", "0".into()));
    for app in ["maps", "copies", "pingpong", "subbuffers"] {
        let (iters, n) = long_enough(app, "2000", 3, |iters| {
            let run = interrupted(app, iters, 0x9e3779b97f4a7c15, 20, &mode);
            (run.result, run.cycles)
        });
        eprintln!("{app} pinned: {n} cycles at --iters {iters}, identical to native");
    }
}

/// SVM allocations cannot be moved, so suspend must refuse them cleanly and the
/// program must finish correctly.
#[test]
fn svm_suspend_is_refused_and_app_continues() {
    let want = native("svm", "6000");
    let scratch = scratch("corpus-svm");
    let run_dir = scratch.path();
    let child = Command::new(apps().join("svm"))
        .args(["--iters", "6000"])
        .env("LD_PRELOAD", library())
        .env("CRANE_RUN_DIR", run_dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(run_dir, child.id());
    let mut refused = 0;
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() && refused < 3 {
        std::thread::sleep(Duration::from_millis(30));
        if let Ok(r) = call(
            &sock,
            &Request::Suspend { deadline_ms: 5_000 },
            Duration::from_secs(30),
        ) {
            if !r.ok && r.error.as_deref().is_some_and(|e| e.contains("SVM")) {
                refused += 1;
            } else if r.ok {
                call(&sock, &Request::RESUME, Duration::from_secs(30)).unwrap();
            }
        }
    }
    let out = waiter.join().unwrap();
    assert!(out.status.success());
    assert_eq!(result_line(&out.stdout), want);
    assert!(refused > 0, "no suspend attempt met a live SVM allocation");
}

/// Twenty suspend/resume cycles in one process: each leaves no device
/// descriptor, no device mapping and no vendor thread, and the result is still
/// the native one.
#[test]
fn twenty_cycles_leave_nothing() {
    let want = native("pingpong", "60000");
    let scratch = scratch("corpus-twenty");
    let run_dir = scratch.path();
    let child = Command::new(apps().join("pingpong"))
        .args(["--iters", "60000"])
        .env("LD_PRELOAD", library())
        .env("CRANE_RUN_DIR", run_dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(run_dir, child.id());
    let start = Instant::now();
    while !sock.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no control socket appeared"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for cycle in 0..20 {
        let r = call(
            &sock,
            &Request::Suspend {
                deadline_ms: 20_000,
            },
            Duration::from_secs(60),
        )
        .unwrap();
        assert!(r.ok, "cycle {cycle}: suspend failed: {:?}", r.error);
        let res = r.residue.unwrap();
        assert!(
            res.device_fds.is_empty()
                && res.device_mappings.is_empty()
                && res.vendor_threads.is_empty(),
            "cycle {cycle}: left behind {res:?}"
        );
        let r = call(&sock, &Request::RESUME, Duration::from_secs(60)).unwrap();
        assert!(r.ok, "cycle {cycle}: resume failed: {:?}", r.error);
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(result_line(&out.stdout), want);
}
