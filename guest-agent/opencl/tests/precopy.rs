//! Integration tier for pre-copy (issue 15): reading device memory into RAM
//! while the application runs on must never cost it a byte. The corpus runs
//! under crane with pre-copies at random moments, each followed (at once, or
//! after a while of the application changing its buffers again) by a
//! suspend and a resume; the result must equal a native run's. And a pre-copy
//! of an application that changes nothing leaves its suspend nothing to read.
//! The same with moves to crane-proxy after a pre-copy there (buffers sent
//! ahead while the application runs, the move writing them from what was
//! sent).

use std::process::Stdio;
use std::time::{Duration, Instant};

use crane_control::{Request, Response, call, socket_path};

mod common;
use common::proxy::{Proxy, wait_socket};
use common::{Rng, finishes, long_enough, result_line, scratch, under_crane, wait_holding};

fn ask(sock: &std::path::Path, req: &Request) -> Option<Response> {
    call(sock, req, Duration::from_secs(60)).ok()
}

/// The bytes a transition's phase `name` moved.
fn phase_bytes(r: &Response, name: &str) -> u64 {
    r.phases
        .iter()
        .filter(|p| p.name == name)
        .map(|p| p.bytes)
        .sum()
}

/// Runs `app` under crane with pre-copies, suspends and resumes at random
/// moments; its result line and the number of pre-copies that were followed
/// by a suspend.
fn precopied(app: &str, iters: &str, seed: u64) -> (String, usize) {
    let (line, rounds, _) = precopied_with(app, iters, seed, &[]);
    (line, rounds)
}

/// [`precopied`] with environment `env`; also the application's stderr.
fn precopied_with(
    app: &str,
    iters: &str,
    seed: u64,
    env: &[(&str, &str)],
) -> (String, usize, String) {
    let dir = scratch(&format!("precopy-{app}-{seed:x}"));
    let child = under_crane(app, iters, dir.path())
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(dir.path(), child.id());
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    let mut rng = Rng(seed | 1);
    let mut rounds = 0;
    let started = Instant::now();
    while !waiter.is_finished() && rounds < 30 && started.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(5 + rng.below(60)));
        if !sock.exists() {
            continue;
        }
        let deadline_ms = 20_000;
        let Some(r) = ask(&sock, &Request::Precopy { deadline_ms }) else {
            continue;
        };
        if !r.ok {
            assert!(finishes(&waiter), "{app}: pre-copy failed: {:?}", r.error);
            break;
        }
        // At once, or after the application changed things again.
        std::thread::sleep(Duration::from_millis(rng.below(3) * rng.below(30)));
        let Some(r) = ask(&sock, &Request::Suspend { deadline_ms }) else {
            continue;
        };
        if !r.ok {
            assert!(finishes(&waiter), "{app}: suspend failed: {:?}", r.error);
            break;
        }
        let r = ask(&sock, &Request::RESUME);
        match r {
            Some(r) => assert!(r.ok, "{app}: resume failed: {:?}", r.error),
            None => {
                assert!(finishes(&waiter), "{app}: resume not answered");
                break;
            }
        }
        rounds += 1;
    }
    let out = waiter.join().unwrap();
    assert!(
        out.status.success(),
        "{app} failed under crane: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        result_line(&out.stdout),
        rounds,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

macro_rules! precopy_test {
    ($name:ident, $iters:expr) => {
        #[test]
        fn $name() {
            let app = stringify!($name);
            let (iters, n) = long_enough(app, $iters, 3, |iters| {
                precopied(app, iters, 0x5851f42d4c957f2d)
            });
            eprintln!("{app}: {n} pre-copies + suspends at --iters {iters}, identical to native");
        }
    };
}

// Kernels rotating buffers (pingpong), host writes cached in RAM and maps
// (maps, copies), sub-buffers and several contexts.
precopy_test!(pingpong, "6000");
precopy_test!(maps, "3000");
precopy_test!(copies, "3000");
precopy_test!(subbuffers, "3000");
precopy_test!(multictx, "2000");

/// RAM copies from 4 KiB pinned as on a GPU, with the debug lines that say
/// where a read found a kept pin.
const PINNED_AS_ON_A_GPU: &[(&str, &str)] = &[
    ("CRANE_PIN_CPU", "1"),
    ("CRANE_PIN_MIN", "4096"),
    ("CRANE_DEBUG", "1"),
];

/// With RAM copies pinned as on a GPU (`CRANE_PIN_CPU=1`), a pre-copy keeps
/// the pins on the copies of buffers the application changed again during
/// it, and a suspend soon after reads what changed into that pinned memory
/// (on NVIDIA at the device's rate, where pinning for the read halves it):
/// the pins must be given back before the vendor objects and never outlive
/// their memory. pingpong rewrites its buffers at every iteration; the
/// result must be the native one, and some suspend must have read into
/// kept pins.
#[test]
fn pingpong_with_pins_kept_from_the_precopy() {
    let want = common::native("pingpong", "6000");
    let (line, rounds, err) =
        precopied_with("pingpong", "6000", 0x2545f4914f6cdd1d, PINNED_AS_ON_A_GPU);
    assert_eq!(line, want);
    assert!(rounds > 0, "no pre-copy was followed by a suspend");
    let warm = err
        .lines()
        .filter(|l| l.contains("bytes into RAM copies a pre-copy kept pinned"))
        .count();
    assert!(
        warm > 0,
        "no suspend read into a kept pin in {rounds} rounds"
    );
}

/// pingpong held halfway changes no buffer: after a pre-copy has read what
/// its kernels wrote, a suspend has nothing left to read, and the result is
/// still the native one.
#[test]
fn a_precopied_idle_application_leaves_its_suspend_nothing_to_read() {
    let dir = scratch("precopy-held");
    let release = dir.path().join("release");
    let child = under_crane("pingpong", "600", dir.path())
        .env("TESTAPP_HOLD", &release)
        // Host writes are not kept in RAM: every buffer must come from the device.
        .env("CRANE_WRITE_CACHE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = child;
    let sock = socket_path(dir.path(), child.id());
    wait_socket(&sock);
    // Until it says it holds (its kernels have run, its buffers are dirty).
    let rest = wait_holding(&mut child);
    let st = ask(&sock, &Request::Status).and_then(|r| r.status).unwrap();
    assert!(st.dirty_bytes > 0, "nothing dirty to pre-copy: {st:?}");
    let deadline_ms = 20_000;
    let r = ask(&sock, &Request::Precopy { deadline_ms }).unwrap();
    assert!(r.ok, "{:?}", r.error);
    let read = phase_bytes(&r, "read");
    assert!(read > 0, "the pre-copy read nothing: {:?}", r.phases);
    let st = ask(&sock, &Request::Status).and_then(|r| r.status).unwrap();
    assert_eq!(st.dirty_bytes, 0, "still dirty after the pre-copy");
    let r = ask(&sock, &Request::Suspend { deadline_ms }).unwrap();
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(phase_bytes(&r, "read-dirty"), 0, "{:?}", r.phases);
    let r = ask(&sock, &Request::RESUME).unwrap();
    assert!(r.ok, "{:?}", r.error);
    std::fs::write(&release, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    rest.join().unwrap();
    assert!(out.status.success());
    assert_eq!(result_line(&out.stdout), common::native("pingpong", "600"));
}

/// Pre-copy is for a process in passthrough; elsewhere it is refused and
/// nothing changes.
#[test]
fn precopy_is_refused_while_suspended() {
    let dir = scratch("precopy-suspended");
    let release = dir.path().join("release");
    let mut child = under_crane("pingpong", "6000", dir.path())
        .env("TESTAPP_HOLD", &release)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sock = socket_path(dir.path(), child.id());
    wait_socket(&sock);
    let deadline_ms = 20_000;
    let r = ask(&sock, &Request::Suspend { deadline_ms }).unwrap();
    assert!(r.ok, "{:?}", r.error);
    let r = ask(&sock, &Request::Precopy { deadline_ms }).unwrap();
    assert!(!r.ok);
    assert!(
        r.error
            .unwrap()
            .contains("passthrough or on crane-proxy only")
    );
    let r = ask(&sock, &Request::RESUME).unwrap();
    assert!(r.ok, "{:?}", r.error);
    std::fs::write(&release, b"").unwrap();
    assert!(child.wait().unwrap().success());
}

fn to_proxy(proxy: &Proxy, precopy: u32) -> Request {
    Request::Remote {
        proxy: proxy.addr.clone(),
        token: Some("k".into()),
        deadline_ms: 20_000,
        device: None,
        precopy,
    }
}

const LOCAL: Request = local(0);

/// Back from crane-proxy, with a pre-copy of `precopy` rounds (0: none).
const fn local(precopy: u32) -> Request {
    Request::Local {
        deadline_ms: 20_000,
        device: None,
        precopy,
    }
}

/// Runs `app` under crane and moves it to crane-proxy with a pre-copy there
/// (sent ahead in rounds while it runs) and back at random moments, back
/// with a pre-copy on the way (read in rounds from the proxy while it runs
/// there) or without; its result line and the moves made.
fn precopied_remote(app: &str, iters: &str, seed: u64, proxy: &Proxy) -> (String, usize) {
    let (line, moves, _) = precopied_remote_with(app, iters, seed, proxy, &[]);
    (line, moves)
}

/// [`precopied_remote`] with environment `env`; also the application's
/// stderr.
fn precopied_remote_with(
    app: &str,
    iters: &str,
    seed: u64,
    proxy: &Proxy,
    env: &[(&str, &str)],
) -> (String, usize, String) {
    let dir = scratch(&format!("precopy-remote-{app}-{seed:x}"));
    let child = under_crane(app, iters, dir.path())
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(dir.path(), child.id());
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    let mut rng = Rng(seed | 1);
    let mut moves = 0;
    let started = Instant::now();
    while !waiter.is_finished() && moves < 12 && started.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(5 + rng.below(60)));
        if !sock.exists() {
            continue;
        }
        let Some(r) = ask(&sock, &to_proxy(proxy, 1 + rng.below(4) as u32)) else {
            continue;
        };
        if !r.ok {
            assert!(finishes(&waiter), "{app}: move failed: {:?}", r.error);
            break;
        }
        std::thread::sleep(Duration::from_millis(rng.below(40)));
        let Some(r) = ask(&sock, &local(rng.below(4) as u32)) else {
            assert!(finishes(&waiter), "{app}: local not answered");
            break;
        };
        assert!(r.ok, "{app}: going local failed: {:?}", r.error);
        moves += 1;
    }
    let out = waiter.join().unwrap();
    assert!(
        out.status.success(),
        "{app} failed under crane: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        result_line(&out.stdout),
        moves,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Moves to crane-proxy after pre-copies in rounds with RAM copies pinned
/// as on a GPU (`CRANE_PIN_CPU=1`): each round keeps the pins it made, the
/// next round and the move read what changed into memory already pinned,
/// and the pins are given back before the local vendor objects (beside
/// the application running on the proxy). The result must be the native
/// one, and some round or move must have read into kept pins.
#[test]
fn remote_pingpong_with_pins_kept_across_rounds() {
    let want = common::native("pingpong", "6000");
    let proxy = Proxy::start("precopy-pins", false, &[("k", "t")]);
    let (line, moves, err) = precopied_remote_with(
        "pingpong",
        "6000",
        0x5851f42d4c957f2d,
        &proxy,
        PINNED_AS_ON_A_GPU,
    );
    assert_eq!(line, want);
    assert!(moves > 0, "no move to crane-proxy");
    assert!(
        err.lines().any(|l| l.contains("kept pinned")),
        "no pre-copy round or move read into a kept pin in {moves} moves"
    );
}

macro_rules! precopy_remote_test {
    ($name:ident, $app:literal, $iters:expr) => {
        #[test]
        fn $name() {
            let proxy = Proxy::start(concat!("precopy-", $app), false, &[("k", "t")]);
            let (iters, n) = long_enough($app, $iters, 3, |iters| {
                precopied_remote($app, iters, 0x2545f4914f6cdd1d, &proxy)
            });
            eprintln!(
                "{}: {n} moves to crane-proxy with pre-copy at --iters {iters}, identical to native",
                $app
            );
        }
    };
}

// Buffers rewritten by kernels every iteration (pingpong), host writes
// cached in RAM and maps (maps, copies), sub-buffers (whose parent is what
// is sent) and several contexts.
precopy_remote_test!(remote_pingpong, "pingpong", "6000");
precopy_remote_test!(remote_maps, "maps", "3000");
precopy_remote_test!(remote_copies, "copies", "3000");
precopy_remote_test!(remote_subbuffers, "subbuffers", "3000");
precopy_remote_test!(remote_multictx, "multictx", "2000");

/// pingpong held halfway changes nothing: a move to crane-proxy after a
/// pre-copy there writes every buffer from what was sent ahead and sends
/// nothing itself; the rounds stop once one sends nothing new, and the
/// result is the native one.
#[test]
fn a_precopied_idle_application_moves_to_the_proxy_sending_nothing() {
    let proxy = Proxy::start("precopy-idle", false, &[("k", "t")]);
    let dir = scratch("precopy-remote-held");
    let release = dir.path().join("release");
    let mut child = under_crane("pingpong", "600", dir.path())
        .env("TESTAPP_HOLD", &release)
        .env("CRANE_WRITE_CACHE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(dir.path(), child.id());
    wait_socket(&sock);
    let rest = wait_holding(&mut child);
    let r = ask(&sock, &to_proxy(&proxy, 4)).unwrap();
    assert!(r.ok, "{:?}", r.error);
    let sent = phase_bytes(&r, "precopy-send-1");
    assert!(sent > 0, "nothing sent ahead: {:?}", r.phases);
    // The second round finds nothing new and ends the pre-copy.
    assert_eq!(phase_bytes(&r, "precopy-send-2"), 0, "{:?}", r.phases);
    assert!(
        !r.phases.iter().any(|p| p.name == "precopy-send-3"),
        "{:?}",
        r.phases
    );
    assert_eq!(phase_bytes(&r, "reinject-ahead"), sent, "{:?}", r.phases);
    assert_eq!(phase_bytes(&r, "reinject"), 0, "{:?}", r.phases);
    assert_eq!(phase_bytes(&r, "read-dirty"), 0, "{:?}", r.phases);
    let r = ask(&sock, &LOCAL).unwrap();
    assert!(r.ok, "{:?}", r.error);
    std::fs::write(&release, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    rest.join().unwrap();
    assert!(out.status.success());
    assert_eq!(result_line(&out.stdout), common::native("pingpong", "600"));
}

/// pingpong started on crane-proxy and held halfway, so that every buffer
/// it holds changed there: a move back with a pre-copy reads all of them in
/// the first round, nothing in the second (which ends the rounds), makes
/// the context ahead, and leaves the stop nothing to read; the result is
/// the native one.
#[test]
fn a_precopied_move_back_leaves_its_stop_nothing_to_read() {
    let proxy = Proxy::start("precopy-back", false, &[("k", "t")]);
    let dir = scratch("precopy-back-held");
    let release = dir.path().join("release");
    let mut child = under_crane("pingpong", "600", dir.path())
        .env("TESTAPP_HOLD", &release)
        .env("CRANE_MODE", "remote")
        .env("CRANE_PROXY", &proxy.addr)
        .env("CRANE_PROXY_TOKEN", "k")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(dir.path(), child.id());
    wait_socket(&sock);
    let rest = wait_holding(&mut child);
    let st = ask(&sock, &Request::Status).and_then(|r| r.status).unwrap();
    assert_eq!(st.mode, crane_control::Mode::Remote);
    let r = ask(&sock, &local(4)).unwrap();
    assert!(r.ok, "{:?}", r.error);
    assert!(
        r.phases
            .iter()
            .any(|p| p.name == "ahead-contexts" && p.parallel),
        "{:?}",
        r.phases
    );
    let read = phase_bytes(&r, "precopy-read-1");
    assert!(read > 0, "nothing read ahead: {:?}", r.phases);
    assert_eq!(phase_bytes(&r, "precopy-read-2"), 0, "{:?}", r.phases);
    assert!(
        !r.phases.iter().any(|p| p.name == "precopy-read-3"),
        "{:?}",
        r.phases
    );
    assert_eq!(phase_bytes(&r, "read-dirty"), 0, "{:?}", r.phases);
    let st = ask(&sock, &Request::Status).and_then(|r| r.status).unwrap();
    assert_eq!(st.mode, crane_control::Mode::Passthrough);
    std::fs::write(&release, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    rest.join().unwrap();
    assert!(out.status.success());
    assert_eq!(result_line(&out.stdout), common::native("pingpong", "600"));
}
