//! Integration tier for moves onto other devices (issue 16): the corpus under
//! libcrane_opencl.so, moved mid-run between PoCL's two CPU devices (`basic`
//! and `pthread`, both offered with `POCL_DEVICES`), keeps its handles and
//! prints exactly what a native run prints; a move the new device cannot take
//! is refused with the reason, and the program carries on where it was.
//!
//! The two devices are different OpenCL devices (names, compute units, the
//! driver that runs kernels) compiled for by the same compiler; the moves
//! between NVIDIA's GPU and PoCL's CPU are shown on the accelerator machine
//! (docs/benchmarks.md).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crane_control::{Mode, Request, Response, call, socket_path};

mod common;
use common::proxy::{Proxy, wait_socket};
use common::{Rng, finishes, long_enough, native, result_line, scratch, under_crane};

/// Both of PoCL's CPU drivers, so that a process has two devices to move between.
const BOTH: (&str, &str) = ("POCL_DEVICES", "basic pthread");

fn local_on(device: &str) -> Request {
    Request::Local {
        deadline_ms: 20_000,
        device: Some(device.into()),
        precopy: 0,
    }
}

fn start(app: &str, iters: &str, run_dir: &std::path::Path) -> Child {
    under_crane(app, iters, run_dir)
        .env(BOTH.0, BOTH.1)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn status(sock: &std::path::Path) -> crane_control::AppStatus {
    call(sock, &Request::Status, Duration::from_secs(30))
        .unwrap()
        .status
        .unwrap()
}

/// Runs `app` under crane and moves it between the two devices at random
/// moments until it exits; its standard output and how many moves it made.
fn moving(app: &str, iters: &str, seed: u64) -> (String, usize) {
    let dir = scratch(&format!("devices-{app}-{seed:x}"));
    let child = start(app, iters, dir.path());
    let sock = socket_path(dir.path(), child.id());
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    let mut rng = Rng(seed | 1);
    let mut moves = 0;
    let started = Instant::now();
    while !waiter.is_finished() && moves < 12 && started.elapsed() < Duration::from_secs(150) {
        std::thread::sleep(Duration::from_millis(20 + rng.below(100)));
        if !sock.exists() {
            continue;
        }
        let to = ["pthread", "basic"][moves % 2];
        let r = match call(&sock, &local_on(to), Duration::from_secs(60)) {
            Ok(r) => r,
            Err(e) => {
                assert!(finishes(&waiter), "{app}: move to {to} not answered: {e}");
                break;
            }
        };
        if !r.ok {
            if r.error
                .as_deref()
                .is_some_and(|e| e.starts_with("nothing to move"))
            {
                continue;
            }
            assert!(
                finishes(&waiter),
                "{app}: move to {to} failed: {:?}",
                r.error
            );
            break;
        }
        // Where it runs now, as the process reports it (it may have ended
        // meanwhile).
        if let Ok(Response {
            status: Some(st), ..
        }) = call(&sock, &Request::Status, Duration::from_secs(30))
        {
            assert_eq!(st.mode, Mode::Passthrough);
            assert!(
                st.devices.iter().all(|d| d.contains(to)),
                "{app}: after a move to {to} it reports {:?}",
                st.devices
            );
        }
        moves += 1;
    }
    let out = waiter.join().unwrap();
    assert!(
        out.status.success(),
        "{app} failed under crane: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (String::from_utf8_lossy(&out.stdout).into_owned(), moves)
}

fn check(app: &str, iters: &str) {
    let (iters, n) = long_enough(app, iters, 3, |iters| {
        let (out, n) = moving(app, iters, 0x9e3779b97f4a7c15);
        (result_line(out.as_bytes()), n)
    });
    eprintln!("{app}: {n} moves between devices at --iters {iters}, result identical to native");
}

macro_rules! device_test {
    ($name:ident, $iters:expr) => {
        #[test]
        fn $name() {
            check(stringify!($name), $iters);
        }
    };
}

/// floatmath's `FLOAT <name> <bound> <sum>` lines: a built-in's name, its
/// bound in ULP, and the sum of |result| over the run.
fn float_sums(out: &str) -> Vec<(String, f64, f64)> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f[..] {
                ["FLOAT", name, bound, sum] => {
                    Some((name.to_owned(), bound.parse().ok()?, sum.parse().ok()?))
                }
                _ => None,
            }
        })
        .collect()
}

/// Floating point across a move, which is which. testapps/c/floatmath.c
/// hashes into its RESULT line only what the OpenCL C specification makes
/// correctly rounded (*, -, fma: the same bits on every conforming device),
/// so that line must be identical to native's. Its built-ins (sin, cos, exp,
/// log, sqrt, division, pow) may be off by a few ULP and differ between
/// devices: the program checks every element against a double-precision
/// reference within the specification's bound (failing otherwise), and its
/// sums must agree with native's within 2 * bound * 2^-23 relative, the most
/// two devices each within the bound can differ by (benches/corpus.sh
/// `same_output` applies the same rule on the GPU). PoCL's two devices share
/// one compiler, so here the sums come out exact in practice; NVIDIA's GPU
/// and PoCL's CPU differ within the bound (docs/benchmarks.md).
#[test]
fn floatmath() {
    let mut natives = std::collections::HashMap::new();
    let (iters, n) = long_enough("floatmath", "400", 3, |iters| {
        let want = Command::new(common::apps().join("floatmath"))
            .args(["--iters", iters])
            .output()
            .unwrap();
        assert!(want.status.success());
        let want = float_sums(&String::from_utf8_lossy(&want.stdout));
        assert_eq!(want.len(), 7, "floatmath printed {want:?}");
        let (out, n) = moving("floatmath", iters, 0x2545f4914f6cdd1d);
        let got = float_sums(&out);
        assert_eq!(got.len(), want.len(), "{out}");
        for ((name, bound, a), (gname, _, b)) in want.iter().zip(&got) {
            assert_eq!(name, gname);
            let tolerance = 2.0 * bound * 2f64.powi(-23) * a.abs().max(b.abs());
            assert!(
                (a - b).abs() <= tolerance,
                "{name}: native sum {a:e}, after {n} moves {b:e} (tolerance {tolerance:e})"
            );
        }
        natives.insert(iters.to_owned(), want);
        (result_line(out.as_bytes()), n)
    });
    eprintln!(
        "floatmath: {n} moves at --iters {iters}: exact operations identical, built-ins within their bound ({:?})",
        natives[&iters]
    );
}

// Integer kernels (exact arithmetic) are bit-identical on any device. images
// also samples and computes in float: bit-identical here too, because PoCL's
// two devices share one compiler and its code generation; across vendors,
// float results agree within the precision OpenCL C allows each operation
// (docs/architecture.md, "Resume anywhere").
device_test!(pingpong, "6000");
device_test!(subbuffers, "3000");
device_test!(localmem, "3000");
device_test!(images, "2000");
device_test!(maps, "3000");
device_test!(multictx, "2000");
// Not `events`: it hangs natively on PoCL 3.1's `basic` device (its user-event
// waits never complete there). Not `programs`: it makes programs from
// binaries, which are for the device they were built for; a move while one
// lives is refused (CL_INVALID_BINARY, with the reason) and the process stays
// where it was.

/// The bytes of a reply's `programs` phase: the executables kept at suspend
/// that the programs were made from (0: compiled again from source).
fn reused(r: &Response) -> u64 {
    assert!(r.ok, "{:?}", r.error);
    r.phases
        .iter()
        .find(|p| p.name == "programs")
        .unwrap_or_else(|| panic!("no programs phase in {:?}", r.phases))
        .bytes
}

/// Waits until the process at `sock` has made its kernels (pingpong's two).
fn wait_kernels(sock: &std::path::Path) {
    let started = Instant::now();
    while status(sock).objects.kernels < 2 {
        assert!(started.elapsed() < Duration::from_secs(60), "no kernels");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Suspends the process at `sock` and resumes it where it was: the bytes of
/// kept executables its programs were made from.
fn cycle(sock: &std::path::Path) -> u64 {
    let t = Duration::from_secs(60);
    let s = call(
        sock,
        &Request::Suspend {
            deadline_ms: 20_000,
        },
        t,
    )
    .unwrap();
    assert!(s.ok, "{:?}", s.error);
    reused(&call(sock, &Request::RESUME, t).unwrap())
}

/// Every `program.bc` below `dir`, removed; how many.
fn remove_program_bcs(dir: &std::path::Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let path = e.path();
        if e.file_type().unwrap().is_dir() {
            n += remove_program_bcs(&path);
        } else if path.file_name().is_some_and(|f| f == "program.bc") {
            std::fs::remove_file(&path).unwrap();
            n += 1;
        }
    }
    n
}

/// PoCL's kernel cache is shared by the user's processes, and a build that
/// finds no `program.bc` there removes and writes it again; a binary PoCL
/// serialises in between has an empty `program.bc`, and PoCL aborts the
/// process that makes a program from it (found by the conformance suite,
/// crane_vendor_loader::pocl_binary). Here the files are removed while the
/// program runs, so the executable read at the suspend is such a binary: it
/// is not kept, the resume compiles the program again from its source, and
/// the program ends with the native result (before, the resume aborted it).
#[test]
fn an_executable_pocl_could_not_read_back_is_not_kept() {
    let iters = "40000";
    let dir = scratch("devices-no-program-bc");
    let cache = dir.path().join("pocl-cache");
    let child = under_crane("pingpong", iters, dir.path())
        .env(BOTH.0, BOTH.1)
        .env("POCL_CACHE_DIR", &cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(dir.path(), child.id());
    wait_socket(&sock);
    wait_kernels(&sock);
    assert!(
        remove_program_bcs(&cache) > 0,
        "PoCL kept no program.bc in {cache:?}"
    );
    assert_eq!(
        cycle(&sock),
        0,
        "resumed from an executable without its program.bc"
    );
    // Compiled again, its program.bc is back: the next cycle reuses the
    // executable kept then.
    assert!(cycle(&sock) > 0);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(result_line(&out.stdout), native("pingpong", iters));
}

/// Programs come back from the executables kept at suspend when the device
/// and its driver are the same (no compiler run), and are compiled again from
/// their source on another device (whose own executable is kept in turn);
/// back on the first device its executable serves again. The program ends with the native result.
#[test]
fn programs_are_reused_on_the_same_device_and_compiled_on_another() {
    let iters = "60000";
    let dir = scratch("devices-reuse");
    let child = start("pingpong", iters, dir.path());
    let sock = socket_path(dir.path(), child.id());
    wait_socket(&sock);
    wait_kernels(&sock);
    let t = Duration::from_secs(60);
    let same = cycle(&sock);
    assert!(
        same > 0,
        "resumed on the same device without the kept executable"
    );
    // POCL_DEVICES="basic pthread": it started on `basic`.
    let other = reused(&call(&sock, &local_on("pthread"), t).unwrap());
    assert_eq!(other, 0, "another device took the first one's executable");
    let there = cycle(&sock);
    assert!(there > 0, "the second device's own executable was not kept");
    let back = reused(&call(&sock, &local_on("basic"), t).unwrap());
    assert_eq!(back, same, "back on its first device");
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(result_line(&out.stdout), native("pingpong", iters));
}

/// A device spec that names no device is refused before anything stops, and
/// the program carries on where it was.
#[test]
fn a_spec_naming_no_device_is_refused() {
    let dir = scratch("devices-nomatch");
    let child = start("pingpong", "6000", dir.path());
    let sock = socket_path(dir.path(), child.id());
    wait_socket(&sock);
    let started = Instant::now();
    while status(&sock).objects.contexts == 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "no context");
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = call(&sock, &local_on("no such device"), Duration::from_secs(60)).unwrap();
    assert!(!r.ok);
    let err = r.error.unwrap();
    assert!(err.contains("names 0 of its devices"), "{err}");
    assert!(err.ends_with("it carries on where it was"), "{err}");
    assert_eq!(status(&sock).mode, Mode::Passthrough);
    let r = call(
        &sock,
        &Request::Local {
            deadline_ms: 1000,
            device: Some(String::new()),
            precopy: 0,
        },
        Duration::from_secs(60),
    )
    .unwrap();
    assert!(r.error.unwrap().starts_with("bad device spec"));
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(result_line(&out.stdout), native("pingpong", "6000"));
}

/// localmem launches work-groups of up to 256 work-items. A crane-proxy whose
/// PoCL runs at most 64 (`POCL_MAX_WORK_GROUP_SIZE`) cannot run them: the
/// move there is refused once its kernels exist there, with the kernel and
/// the sizes in the reason, and the program carries on locally to the native
/// result. The same proxy takes pingpong, which leaves the work-group size to
/// the vendor.
#[test]
fn a_move_to_a_device_that_cannot_run_a_launch_is_refused() {
    let small = Proxy::start_env(
        "small-wg",
        false,
        &[("k", "t")],
        &[],
        &[("POCL_MAX_WORK_GROUP_SIZE", "64")],
    );
    let want = native("localmem", "3000");
    let dir = scratch("devices-wg");
    // Held halfway (its kernels launched with their largest work-groups)
    // until the refusal is in: a whole run takes about a second, and one CI
    // run saw it end while the move was being refused (the control socket
    // closed before the answer).
    let release = dir.path().join("release");
    let child = under_crane("localmem", "3000", dir.path())
        .env(BOTH.0, BOTH.1)
        .env("TESTAPP_HOLD", &release)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(dir.path(), child.id());
    wait_socket(&sock);
    // Halfway: its kernels have run with every work-group size it uses.
    let started = Instant::now();
    while !dir.path().join("release.held").exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "not holding");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = call(
        &sock,
        &Request::Remote {
            proxy: small.addr.clone(),
            token: Some("k".into()),
            deadline_ms: 20_000,
            device: Some("cpu".into()),
            precopy: 0,
        },
        Duration::from_secs(120),
    )
    .unwrap();
    assert!(
        !r.ok,
        "the move to a proxy with work-groups of 64 succeeded"
    );
    let err = r.error.unwrap();
    assert!(err.contains("was refused"), "{err}");
    assert!(err.contains("work-items per group"), "{err}");
    assert!(err.ends_with("it carries on locally"), "{err}");
    assert_eq!(status(&sock).mode, Mode::Passthrough);
    std::fs::write(&release, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(result_line(&out.stdout), want);
}
