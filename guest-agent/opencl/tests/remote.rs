//! Integration tier for remoting: the corpus under libcrane_opencl.so, moved
//! between the local vendor library (PoCL) and a real crane-proxy process at
//! random moments, must print exactly what an uninterrupted native run prints.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crane_control::{Mode, Request, call, socket_path};

mod common;
use common::proxy::{Proxy, wait_socket};
use common::{
    Rng, apps, finishes, library, long_enough, native, result_line, scratch, under_crane,
};

fn remote(proxy: &str, token: &str) -> Request {
    Request::Remote {
        proxy: proxy.into(),
        token: Some(token.into()),
        deadline_ms: 20_000,
        device: None,
        precopy: 0,
    }
}

struct Switched {
    result: String,
    switches: usize,
}

/// Moves send every buffer over lanes, in pieces of 64 KiB (by default
/// only moves of 32 MiB or more use them, in pieces of 4 MiB).
const LANES_ALWAYS: &[(&str, &str)] = &[
    ("CRANE_REMOTE_LANES_MIN", "1"),
    ("CRANE_REMOTE_LANE_PIECE", "65536"),
    ("CRANE_REMOTE_LANES", "3"),
];

/// Runs `app` under crane and moves it between local and remote at random
/// moments (now and then through a plain suspend/resume too) until it exits.
fn switching(app: &str, iters: &str, seed: u64, proxy: &Proxy, token: &str) -> Switched {
    switching_with(app, iters, seed, proxy, token, &[])
}

/// [`switching`] with `env` set for the application.
fn switching_with(
    app: &str,
    iters: &str,
    seed: u64,
    proxy: &Proxy,
    token: &str,
    env: &[(&str, &str)],
) -> Switched {
    let scratch = scratch(&format!("remote-{app}-{seed:x}"));
    let run_dir = scratch.path();
    let child = under_crane(app, iters, run_dir)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(run_dir, child.id());
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    let mut rng = Rng(seed | 1);
    let mut mode = Mode::Passthrough;
    let mut switches = 0;
    let start = Instant::now();
    while !waiter.is_finished() && switches < 30 && start.elapsed() < Duration::from_secs(150) {
        std::thread::sleep(Duration::from_millis(5 + rng.below(80)));
        if !sock.exists() {
            continue;
        }
        let (req, next) = match (mode, rng.below(5)) {
            (Mode::Passthrough, _) => (remote(&proxy.addr, token), Mode::Remote),
            (Mode::Remote, 0) => (
                Request::Suspend {
                    deadline_ms: 20_000,
                },
                Mode::Suspended,
            ),
            (Mode::Remote, _) => (
                Request::Local {
                    deadline_ms: 20_000,
                    device: None,
                    precopy: 0,
                },
                Mode::Passthrough,
            ),
            (Mode::Suspended, _) => (Request::RESUME, Mode::Remote),
        };
        let r = match call(&sock, &req, Duration::from_secs(60)) {
            Ok(r) => r,
            Err(e) => {
                // An exiting process closes its socket first; give it time.
                assert!(finishes(&waiter), "{app}: {req:?} not answered: {e}");
                break;
            }
        };
        if !r.ok {
            assert!(finishes(&waiter), "{app}: {req:?} failed: {:?}", r.error);
            break;
        }
        if next == Mode::Remote && mode == Mode::Passthrough {
            let res = r.residue.expect("going remote reports residue");
            assert!(
                res.device_fds.is_empty() && res.device_mappings.is_empty(),
                "{app}: device left behind when going remote: {res:?}"
            );
        }
        mode = next;
        switches += 1;
    }
    if mode == Mode::Suspended && !waiter.is_finished() {
        let r = call(&sock, &Request::RESUME, Duration::from_secs(60)).unwrap();
        assert!(r.ok, "{app}: final resume failed: {:?}", r.error);
    }
    let out = waiter.join().unwrap();
    assert!(
        out.status.success(),
        "{app} failed under crane: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Switched {
        result: result_line(&out.stdout),
        switches,
    }
}

/// Runs `app` twice with different switch schedules, each bit-identical to
/// native with at least four switches: the second with every move's
/// buffers sent over lanes.
fn check(app: &str, iters: &str) {
    let proxy = Proxy::start(app, false, &[("t0ken", "tenant-a")]);
    for (seed, env) in [
        (0x9e3779b97f4a7c15u64, &[][..]),
        (0x2545f4914f6cdd1d, LANES_ALWAYS),
    ] {
        let (iters, n) = long_enough(app, iters, 4, |iters| {
            let run = switching_with(app, iters, seed, &proxy, "t0ken", env);
            (run.result, run.switches)
        });
        let lanes = if env.is_empty() { "" } else { ", over lanes" };
        eprintln!("{app}: {n} switches{lanes} at --iters {iters}, result identical to native");
    }
}

/// A move of pingpong, held halfway with its buffers dirty on the device,
/// sends every buffer's contents over lanes (the session's connection
/// carries only the writes that take them), and the result is native's.
#[test]
fn a_move_sends_the_buffers_over_lanes() {
    let want = native("pingpong", "600");
    let proxy = Proxy::start("lanes", false, &[("abc", "t")]);
    let scratch = scratch("remote-lanes");
    let run_dir = scratch.path();
    let release = hold_file(run_dir);
    let mut child = under_crane("pingpong", "600", run_dir)
        .envs(LANES_ALWAYS.iter().copied())
        .env("CRANE_WRITE_CACHE", "0")
        .env("TESTAPP_HOLD", &release)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(run_dir, child.id());
    wait_socket(&sock);
    // Until it holds: its kernels have run, its buffers are dirty.
    let rest = common::wait_holding(&mut child);
    let r = call(&sock, &remote(&proxy.addr, "abc"), Duration::from_secs(60)).unwrap();
    assert!(r.ok, "{:?}", r.error);
    let bytes = |name: &str| -> u64 {
        r.phases
            .iter()
            .filter(|p| p.name == name)
            .map(|p| p.bytes)
            .sum()
    };
    assert!(bytes("reinject") > 0, "{:?}", r.phases);
    assert_eq!(bytes("reinject-lanes"), bytes("reinject"), "{:?}", r.phases);
    let back = Request::Local {
        deadline_ms: 20_000,
        device: None,
        precopy: 0,
    };
    let r = call(&sock, &back, Duration::from_secs(60)).unwrap();
    assert!(r.ok, "{:?}", r.error);
    std::fs::write(&release, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    rest.join().unwrap();
    assert!(out.status.success());
    assert_eq!(result_line(&out.stdout), want);
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
corpus_test!(programs, "150");
corpus_test!(frameloop, "600");
corpus_test!(rustpipe, "1200");

/// The file whose creation releases a pingpong run with `TESTAPP_HOLD`: it
/// holds halfway until then, so that it is still running when a test's
/// requests arrive (on a fast machine a whole run ended before the first one,
/// and CI saw the control socket refuse the connection).
fn hold_file(run_dir: &Path) -> PathBuf {
    run_dir.join("release")
}

/// `programs` under crane with `env`, held halfway (`TESTAPP_HOLD`, with
/// program E's kernel alive): the process, its control socket and the file
/// that releases it.
fn held_programs(iters: &str, run_dir: &Path, env: (&str, &str)) -> (Child, PathBuf, PathBuf) {
    let release = hold_file(run_dir);
    let child = under_crane("programs", iters, run_dir)
        .env("TESTAPP_HOLD", &release)
        .env(env.0, env.1)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(run_dir, child.id());
    wait_socket(&sock);
    let started = Instant::now();
    while !run_dir.join("release.held").exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "not holding");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, sock, release)
}

/// A process started while its guest is remoting runs on the proxy from its
/// first call, and can later come home.
#[test]
fn starts_remote_then_goes_local() {
    let want = native("pingpong", "20000");
    let proxy = Proxy::start("starts-remote", true, &[("abc", "t")]);
    let scratch = scratch("remote-start");
    let run_dir = scratch.path();
    let release = hold_file(run_dir);
    let child = under_crane("pingpong", "20000", run_dir)
        .env("CRANE_MODE", "remote")
        .env("CRANE_PROXY", &proxy.addr)
        .env("CRANE_PROXY_TOKEN", "abc")
        .env("TESTAPP_HOLD", &release)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(run_dir, child.id());
    wait_socket(&sock);
    let st = call(&sock, &Request::Status, Duration::from_secs(30)).unwrap();
    assert_eq!(st.status.unwrap().mode, Mode::Remote);
    std::thread::sleep(Duration::from_millis(200));
    let r = call(
        &sock,
        &Request::Local {
            deadline_ms: 20_000,
            device: None,
            precopy: 0,
        },
        Duration::from_secs(60),
    )
    .unwrap();
    assert!(r.ok, "going local failed: {:?}", r.error);
    let st = call(&sock, &Request::Status, Duration::from_secs(30)).unwrap();
    assert_eq!(st.status.unwrap().mode, Mode::Passthrough);
    std::fs::write(&release, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(result_line(&out.stdout), want);
}

/// Compiled programs (clCompileProgram) come back from the compiled objects
/// kept at suspend when the device and driver are the same, locally and on
/// crane-proxy, without the compiler (the CTS's test_compiler keeps hundreds
/// alive: compiling them again took seconds at every move), as built ones
/// come back from their executables; the application can still compile and
/// build them again afterwards, with new options (`programs` compiles one of
/// its two units again every 10 iterations and links them again, and builds
/// a program again with and without a macro), and ends with the native
/// result.
#[test]
fn programs_made_from_kept_binaries_compile_and_build_again() {
    let iters = "60";
    let want = native("programs", iters);
    let proxy = Proxy::start("compiled", false, &[("k", "t")]);
    let scratch = scratch("remote-compiled");
    let run_dir = scratch.path();
    let (child, sock, release) = held_programs(iters, run_dir, ("CRANE_DEBUG", "1"));
    let t = Duration::from_secs(120);
    let local = Request::Local {
        deadline_ms: 20_000,
        device: None,
        precopy: 0,
    };
    let suspend = Request::Suspend {
        deadline_ms: 20_000,
    };
    // Held after 3 compiles again: suspend + resume, to the proxy, back,
    // and to the proxy again, where the rest of the run compiles again.
    for (what, req) in [
        ("suspend", &suspend),
        ("resume", &Request::RESUME),
        ("remote", &remote(&proxy.addr, "k")),
        ("local", &local),
        ("remote again", &remote(&proxy.addr, "k")),
    ] {
        let r = call(&sock, req, t).unwrap();
        assert!(r.ok, "{what}: {:?}", r.error);
    }
    std::fs::write(&release, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(result_line(&out.stdout), want);
    // The two compiled units, at every rebuild.
    let rebuilds: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("from kept compiled objects"))
        .collect();
    assert_eq!(rebuilds.len(), 4, "{rebuilds:?}");
    for l in rebuilds {
        assert!(l.contains(", 2 from kept compiled objects,"), "{l}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(", 6 links again, 6 builds again"),
        "{stdout}"
    );
}

/// A kernel the application releases while the objects a move took from
/// the old vendor are still being released beside it (NVIDIA's release
/// takes ~100 ms; 1.5 s here, `CRANE_FAULT_SLOW_RELEASE_MS`) is gone at
/// once, so its program can be built again, as natively. Before, the
/// released kernel lived until that release ended, still attached to its
/// program, and the build was refused (CL_INVALID_OPERATION: the CTS's
/// `test_compiler options_denorm_cache` under switches on NVIDIA).
/// `programs` holds with program E's kernel alive, releases it once the
/// move has begun and builds E again 10 iterations later, on crane-proxy.
#[test]
fn a_kernel_released_during_a_move_leaves_its_program_free_to_build() {
    let iters = "300";
    let want = native("programs", iters);
    let proxy = Proxy::start("released-kernel", false, &[("k", "t")]);
    let scratch = scratch("remote-released-kernel");
    let run_dir = scratch.path();
    let (child, sock, release) =
        held_programs(iters, run_dir, ("CRANE_FAULT_SLOW_RELEASE_MS", "1500"));
    let t = Duration::from_secs(120);
    let (to, addr) = (sock.clone(), proxy.addr.clone());
    // The move answers once the old objects are released; the program is
    // let go while it is under way (parked at once: its calls wait for the
    // move's rebuild, then run on crane-proxy beside the release).
    let mover = std::thread::spawn(move || call(&to, &remote(&addr, "k"), t));
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&release, b"").unwrap();
    let r = match mover.join().unwrap() {
        Ok(r) => r,
        Err(e) => {
            let out = child.wait_with_output().unwrap();
            panic!("remote: {e}\n{}", String::from_utf8_lossy(&out.stderr));
        }
    };
    assert!(r.ok, "remote: {:?}", r.error);
    // It ends on crane-proxy, E built again there 14 times.
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(result_line(&out.stdout), want);
}

/// crane does not send an argument again that the proxy's kernel holds
/// already, but a wrong one set again fails again, as natively (the client
/// checks its size: the call itself returns the error); valid arguments then
/// compute the native result.
#[test]
fn a_bad_argument_set_again_fails_again() {
    let proxy = Proxy::start("bad-arg", true, &[("abc", "t")]);
    let native = Command::new(apps().join("badinput"))
        .arg("--repeat-bad-arg")
        .output()
        .unwrap();
    assert!(
        native.status.success(),
        "natively: {}",
        String::from_utf8_lossy(&native.stderr)
    );
    let out = Command::new(apps().join("badinput"))
        .arg("--repeat-bad-arg")
        .env("LD_PRELOAD", library())
        .env("CRANE_CONTROL", "0")
        .env("CRANE_MODE", "remote")
        .env("CRANE_PROXY", &proxy.addr)
        .env("CRANE_PROXY_TOKEN", "abc")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "remote: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let native_out = String::from_utf8_lossy(&native.stdout);
    for round in 0..3 {
        let round_line = |out: &str| {
            out.lines()
                .find(|l| l.starts_with(&format!("round {round}:")))
                .unwrap_or_else(|| panic!("no round {round} in {out}"))
                .to_string()
        };
        // The client finds the wrong size itself (remote/check.rs): the
        // call returns the error, as natively, each time.
        assert_eq!(round_line(&stdout), round_line(&native_out));
    }
    assert_eq!(result_line(&out.stdout), result_line(&native.stdout));
}

/// Two applications of two tenants on one proxy at once, each switching on its
/// own, both end with their native results.
#[test]
fn two_tenants_share_one_proxy() {
    let proxy = Proxy::start("two", true, &[("tok-a", "a"), ("tok-b", "b")]);
    // Each app runs long enough for two switches of its own (repeated
    // longer on a machine where it did not); both share the proxy meanwhile.
    std::thread::scope(|s| {
        let a = s.spawn(|| {
            long_enough("pingpong", "4000", 2, |iters| {
                let r = switching("pingpong", iters, 7, &proxy, "tok-a");
                (r.result, r.switches)
            })
        });
        let b = s.spawn(|| {
            long_enough("copies", "1500", 2, |iters| {
                let r = switching("copies", iters, 11, &proxy, "tok-b");
                (r.result, r.switches)
            })
        });
        a.join().unwrap();
        b.join().unwrap();
    });
}

/// A wrong token is refused, and the process carries on locally.
#[test]
fn wrong_token_leaves_the_app_local() {
    let want = native("pingpong", "6000");
    let proxy = Proxy::start("badtoken", false, &[("right", "t")]);
    let app = Held::start("6000");
    let err = app.refused_move(&proxy.addr, "wrong");
    assert!(err.contains("refused"), "unexpected error: {err}");
    assert_eq!(app.finish(), want);
}

/// pingpong under crane, held halfway (TESTAPP_HOLD) with its two 64 KiB
/// buffers made, so that a move has them to rebuild.
struct Held {
    child: Child,
    sock: PathBuf,
    release: PathBuf,
    _dir: tempfile::TempDir,
}

impl Held {
    fn start(iters: &str) -> Held {
        Held::start_with(iters, &[])
    }

    /// [`Held::start`] with `env` set for the application.
    fn start_with(iters: &str, env: &[(&str, &str)]) -> Held {
        let dir = scratch("remote-held");
        let release = hold_file(dir.path());
        let child = under_crane("pingpong", iters, dir.path())
            .envs(env.iter().copied())
            .env("TESTAPP_HOLD", &release)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let sock = socket_path(dir.path(), child.id());
        wait_socket(&sock);
        let held = Held {
            child,
            sock,
            release,
            _dir: dir,
        };
        let start = Instant::now();
        while held.status().objects.buffers < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "pingpong made no buffers"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        held
    }

    fn ask(&self, req: &Request) -> crane_control::Response {
        call(&self.sock, req, Duration::from_secs(60)).unwrap()
    }

    fn status(&self) -> crane_control::AppStatus {
        self.ask(&Request::Status).status.unwrap()
    }

    /// A move to `addr` with `token` that must fail, leaving the process
    /// local with its vendor library loaded again; its error.
    fn refused_move(&self, addr: &str, token: &str) -> String {
        let r = self.ask(&remote(addr, token));
        assert!(!r.ok, "the move to {addr} succeeded");
        let err = r.error.unwrap();
        assert!(err.ends_with("it carries on locally"), "{err}");
        assert!(!err.contains("suspended"), "it is not suspended: {err}");
        let st = self.status();
        assert_eq!(st.mode, Mode::Passthrough);
        assert!(
            !st.vendors.is_empty(),
            "no vendor library after the rollback"
        );
        err
    }

    /// A move to `addr` and back, both of which must work.
    fn there_and_back(&self, addr: &str) {
        let r = self.ask(&remote(addr, "k"));
        assert!(r.ok, "the move to {addr} failed: {:?}", r.error);
        assert_eq!(self.status().mode, Mode::Remote);
        let r = self.ask(&Request::Local {
            deadline_ms: 20_000,
            device: None,
            precopy: 0,
        });
        assert!(r.ok, "going local failed: {:?}", r.error);
    }

    /// Lets it run to the end; its result line.
    fn finish(self) -> String {
        std::fs::write(&self.release, b"").unwrap();
        let out = self.child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        result_line(&out.stdout)
    }
}

/// A proxy without room for the process's buffers (its per-session device
/// memory limit here, a full GPU in the field) refuses the move with
/// OpenCL's allocation error. The process carries on locally with its vendor
/// library reloaded (the move had unloaded it), the proxy frees what it had
/// made, and a later move to a proxy with room, and back, still ends with the
/// native result.
#[test]
fn a_full_proxy_leaves_the_app_local() {
    let want = native("pingpong", "6000");
    let full = Proxy::start_with("full", true, &[("k", "t")], &["--max-session-mem", "1K"]);
    let roomy = Proxy::start("roomy", true, &[("k", "t")]);
    let app = Held::start("6000");
    let err = app.refused_move(&full.addr, "k");
    assert!(err.contains("CL_MEM_OBJECT_ALLOCATION_FAILURE"), "{err}");
    let closed = full.wait_log("closed by the client");
    assert!(closed.contains("object(s) released"), "{closed}");
    app.there_and_back(&roomy.addr);
    assert_eq!(app.finish(), want);
}

/// A TCP relay to `to` that cuts both ways once its client has sent
/// `cut_after` bytes: to the client, a proxy that died in the middle of what
/// it was sent.
fn cutting_relay(to: &str, cut_after: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("tcp://{}", listener.local_addr().unwrap());
    let to = to.trim_start_matches("tcp://").to_string();
    std::thread::spawn(move || {
        if let Ok((client, _)) = listener.accept() {
            relay_one(client, &to, cut_after, false);
        }
    });
    addr
}

/// A relay to `to` that passes the first connection (a session) whole and
/// cuts every later one (the move's lanes) after `cut_after` bytes.
fn lane_cutting_relay(to: &str, cut_after: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("tcp://{}", listener.local_addr().unwrap());
    let to = to.trim_start_matches("tcp://").to_string();
    std::thread::spawn(move || {
        for (n, client) in listener.incoming().enumerate() {
            let Ok(client) = client else { return };
            let to = to.clone();
            let cut = if n == 0 { usize::MAX } else { cut_after };
            std::thread::spawn(move || relay_one(client, &to, cut, true));
        }
    });
    addr
}

/// Relays one connection to `to`, the client's first `cut_after` bytes
/// only; then the proxy sees the end of the stream. With `answers`, what the
/// proxy says to that (its Goodbye) still reaches the client, else the
/// proxy's side is cut too and the client sees the end at once.
fn relay_one(client: std::net::TcpStream, to: &str, cut_after: usize, answers: bool) {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpStream};
    let upstream = TcpStream::connect(to).unwrap();
    let (mut c_in, mut u_out) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
    let back = std::thread::spawn(move || {
        let (mut u_in, mut c_out) = (upstream, client);
        let _ = std::io::copy(&mut u_in, &mut c_out);
        if answers {
            let _ = c_out.shutdown(Shutdown::Write);
        }
    });
    let mut sent = 0;
    let mut buf = vec![0u8; 16 << 10];
    while sent < cut_after {
        let n = match c_in.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n.min(cut_after - sent),
        };
        if u_out.write_all(&buf[..n]).is_err() {
            break;
        }
        sent += n;
    }
    // The proxy's side ends, and the client's sees its end (a FIN) while
    // what it still sends is read and dropped: a socket closed with
    // unread data would turn that end into a reset.
    if answers {
        let _ = u_out.shutdown(Shutdown::Write);
    } else {
        let _ = u_out.shutdown(Shutdown::Both);
        let _ = c_in.shutdown(Shutdown::Write);
    }
    let _ = std::io::copy(&mut c_in, &mut std::io::sink());
    let _ = back.join();
}

/// The connection to the proxy breaks during the move, at points from before
/// the Hello to inside the buffers' data: each move fails with the broken
/// connection as its reason, the process carries on locally with nothing
/// lost, the proxy tears down the half-built sessions, and the process can
/// still move and come back.
#[test]
fn a_proxy_lost_during_the_move_leaves_the_app_local() {
    let want = native("pingpong", "6000");
    let proxy = Proxy::start("lost", true, &[("k", "t")]);
    let app = Held::start("6000");
    // Bytes from the app before the cut: none, inside the Hello, inside the
    // platform queries, inside the program source, inside each 64 KiB buffer.
    for cut in [0usize, 10, 60, 400, 40 << 10, 130 << 10] {
        let relay = cutting_relay(&proxy.addr, cut);
        let err = app.refused_move(&relay, "k");
        assert!(
            err.contains("closed the connection"),
            "cut after {cut} bytes: {err}"
        );
    }
    let closed = proxy.wait_log("object(s) released");
    assert!(!closed.contains("by the client"), "{closed}");
    app.there_and_back(&proxy.addr);
    assert_eq!(app.finish(), want);
}

/// Lanes cut during a move: one that cannot join is left out (the move goes
/// over the rest, or the session's own connection); one cut after joining,
/// inside its pieces, refuses the move with the proxy's reason, and the
/// process carries on locally, then moves there and back as usual.
#[test]
fn a_lane_lost_during_the_move_refuses_it_and_the_app_goes_on() {
    let want = native("pingpong", "6000");
    let proxy = Proxy::start("lane-lost", true, &[("k", "t")]);
    let app = Held::start_with("6000", LANES_ALWAYS);
    let back = Request::Local {
        deadline_ms: 20_000,
        device: None,
        precopy: 0,
    };
    // Inside JoinLane: no lane joins.
    let r = app.ask(&remote(&lane_cutting_relay(&proxy.addr, 30), "k"));
    assert!(r.ok, "{:?}", r.error);
    assert!(
        !r.phases.iter().any(|p| p.name == "reinject-lanes"),
        "{:?}",
        r.phases
    );
    assert!(app.ask(&back).ok);
    // Inside the pieces.
    for cut in [100usize, 40 << 10] {
        let err = app.refused_move(&lane_cutting_relay(&proxy.addr, cut), "k");
        assert!(
            err.contains("a lane to crane-proxy"),
            "cut after {cut}: {err}"
        );
    }
    app.there_and_back(&proxy.addr);
    assert_eq!(app.finish(), want);
}

/// Runs a corpus program started remote on `proxy` and requires its whole
/// output to be what a native run prints.
fn same_as_native_remote(app: &str, args: &[&str], proxy: &Proxy, token: &str) {
    let native = Command::new(apps().join(app)).args(args).output().unwrap();
    assert!(
        native.status.success(),
        "{app} natively: {}",
        String::from_utf8_lossy(&native.stderr)
    );
    let out = Command::new(apps().join(app))
        .args(args)
        .env("LD_PRELOAD", library())
        .env("CRANE_CONTROL", "0")
        .env("CRANE_MODE", "remote")
        .env("CRANE_PROXY", &proxy.addr)
        .env("CRANE_PROXY_TOKEN", token)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{app} remote: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&native.stdout)
    );
}

/// CL_PROGRAM_DEVICES (which the proxy does not answer: its value is
/// handles) names the program's devices; buffers, rects, maps, images and
/// initial contents several times larger than the proxy's largest payload
/// travel in pieces, blocking or not, in-order or not, and the session
/// survives.
#[test]
fn api_checks_and_transfers_larger_than_a_frame() {
    let proxy = Proxy::start_with("apicheck", false, &[("abc", "t")], &["--max-payload", "1M"]);
    same_as_native_remote("apicheck", &["--iters", "2"], &proxy, "abc");
    assert!(!proxy.log().contains("exceeds"), "{}", proxy.log());
}

/// `apicheck ARG` under crane, in passthrough or (with a proxy) started on
/// it with the token "abc"; it must succeed. Its stdout.
fn apicheck(arg: &str, proxy: Option<&Proxy>) -> String {
    let mut c = Command::new(apps().join("apicheck"));
    c.arg(arg)
        .env("LD_PRELOAD", library())
        .env("CRANE_CONTROL", "0");
    if let Some(proxy) = proxy {
        c.env("CRANE_MODE", "remote")
            .env("CRANE_PROXY", &proxy.addr)
            .env("CRANE_PROXY_TOKEN", "abc");
    }
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// PoCL aborts the process asked for a device-side queue; the proxy refuses
/// one the device cannot have with the specification's codes, returned by
/// the creating call, and serves the next session.
#[test]
fn a_device_side_queue_is_refused_and_the_proxy_lives_on() {
    let proxy = Proxy::start("devqueue", false, &[("abc", "t")]);
    for _ in 0..2 {
        let stdout = apicheck("--device-queue", Some(&proxy));
        assert!(stdout.contains("device-side queue -35 NULL"), "{stdout}");
        assert!(
            stdout.contains("device-side in-order queue -30 NULL"),
            "{stdout}"
        );
    }
}

/// A kernel's printf output, which the vendor writes to crane-proxy's
/// standard output, reaches the application's stdout before the call that
/// waited for the kernel returns (wait, finish, blocking read), even while
/// the application points stdout at a file around the launch as the CTS's
/// test_printf does: the whole output is the native one.
#[test]
fn kernel_printf_output_reaches_the_application() {
    let proxy = Proxy::start("printf", false, &[("abc", "t")]);
    same_as_native_remote("printf", &[], &proxy, "abc");
}

/// SVM is not remoted: a remote device says it has no SVM capabilities, so
/// that applications take the path of a device without SVM (the CTS's SVM
/// sub-tests skip instead of failing on a NULL clSVMAlloc), and clSVMAlloc
/// gives NULL.
#[test]
fn a_remote_device_has_no_svm() {
    let proxy = Proxy::start("svm", false, &[("abc", "t")]);
    let stdout = apicheck("--svm", Some(&proxy));
    assert!(
        stdout.contains("svm capabilities 0 none, clSVMAlloc NULL"),
        "{stdout}"
    );
}

/// clSetCommandQueueProperty (deprecated) is carried out by crane-proxy's
/// vendor (wire 1.4): what it answers, the properties before and after and
/// the queue's use afterwards are those of passthrough on the same vendor.
/// PoCL has no such entry (natively its ICD loader calls a null pointer),
/// so both answer CL_INVALID_OPERATION and the proxy serves the next
/// session; NVIDIA carries it out (the CTS's test_api
/// `set_command_queue_property`, docs/conformance.md).
#[test]
fn set_command_queue_property_goes_to_the_proxy() {
    let proxy = Proxy::start("queueprop", false, &[("abc", "t")]);
    let local = apicheck("--queue-property", None);
    assert!(local.contains("apicheck: set profiling 0: "), "{local}");
    assert!(local.contains("queue after: data same"), "{local}");
    for _ in 0..2 {
        assert_eq!(apicheck("--queue-property", Some(&proxy)), local);
    }
}

/// The client's own answers give the specification's error codes where
/// PoCL 3.1 does not (CL_DEVICE_NOT_FOUND for a device type of 0, a buffer
/// taken for an image argument; NVIDIA gives the specification's codes, and
/// the CTS's test_api `negative_get_device_ids` and
/// `negative_set_kernel_arg_invalid_image` check them), and valid calls stay
/// valid.
#[test]
fn remote_errors_are_the_specifications() {
    let proxy = Proxy::start("specerrors", false, &[("abc", "t")]);
    let stdout = apicheck("--spec-errors", Some(&proxy));
    for line in [
        "clGetDeviceIDs type 0: -31",
        "clGetDeviceIDs type 1<<20: -31",
        "clGetDeviceIDs 0 entries: -30",
        "clGetDeviceIDs no outputs: -30",
        "image argument, a buffer: -38",
        "image argument, an image: 0",
        "buffer argument, a buffer: 0",
    ] {
        assert!(
            stdout.contains(&format!("apicheck: {line}\n")),
            "{line}:\n{stdout}"
        );
    }
}

/// The proxy process's open descriptors and threads.
fn proxy_resources(proxy: &Proxy) -> (usize, usize) {
    let pid = proxy.child.id();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    (fds, threads)
}

/// Applications (the real interposer, not a test client) killed with
/// SIGKILL at random moments while they run on crane-proxy, with work in
/// flight: the proxy tears each session down (its objects released, not
/// "by the client"), keeps no descriptor or thread of theirs, and serves
/// the next application, whose result is native's.
#[test]
fn applications_killed_on_the_proxy_are_torn_down_and_the_next_is_served() {
    let proxy = Proxy::start("killed-apps", true, &[("k", "t")]);
    // A first application, run to its end, so that the proxy's own lazily
    // made threads and descriptors (warm contexts, staging) are there.
    same_as_native_remote("pingpong", &["--iters", "200"], &proxy, "k");
    let closed = |p: &Proxy| p.log().matches(" object(s) released").count();
    let settled = |p: &Proxy, n: usize| {
        let start = Instant::now();
        while closed(p) < n {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the proxy never tore session {n} down:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    settled(&proxy, 1);
    std::thread::sleep(Duration::from_millis(300));
    let before = proxy_resources(&proxy);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for k in 0..4 {
        let scratch = scratch("killed-apps");
        let mut child = under_crane("pingpong", "1000000", scratch.path())
            .env("CRANE_MODE", "remote")
            .env("CRANE_PROXY", &proxy.addr)
            .env("CRANE_PROXY_TOKEN", "k")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200 + rng.below(600)));
        assert!(
            child.try_wait().unwrap().is_none(),
            "pingpong ended before it was killed"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        settled(&proxy, k + 2);
    }
    let log = proxy.log();
    let teardowns: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" object(s) released"))
        .collect();
    assert!(
        teardowns[1..].iter().all(|l| !l.contains("by the client")),
        "{teardowns:#?}"
    );
    // The helpers that drain a dead session's queues end shortly after it.
    let start = Instant::now();
    loop {
        let now = proxy_resources(&proxy);
        if now.0 <= before.0 && now.1 <= before.1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the proxy kept descriptors or threads (fds, threads): {before:?} before, {now:?} after"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "4 applications killed on crane-proxy: (fds, threads) {before:?} before, {:?} after",
        proxy_resources(&proxy)
    );
    same_as_native_remote("pingpong", &["--iters", "6000"], &proxy, "k");
}
