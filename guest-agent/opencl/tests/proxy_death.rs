//! Integration tier for surviving crane-proxy's death: a process on
//! crane-proxy whose proxy is killed (SIGKILL, no goodbye) at random moments
//! waits, replays its session on the restarted proxy (or on another one it
//! is pointed at) and ends with exactly the result of an undisturbed native
//! run; with no proxy to go to it fails with a clear error.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crane_control::{Mode, Request, call, socket_path};

mod common;
use common::netns::{self, Netns};
use common::proxy::{Proxy, wait_socket};
use common::{
    Rng, apps, finishes, library, long_enough, native, result_line, scratch, under_crane,
};

/// Starts `app` on `proxy` from its first call, with `env` besides.
fn start_remote(
    app: &str,
    iters: &str,
    run_dir: &Path,
    proxy: &Proxy,
    env: &[(&str, &str)],
) -> Child {
    under_crane(app, iters, run_dir)
        .env("CRANE_MODE", "remote")
        .env("CRANE_PROXY", &proxy.addr)
        .env("CRANE_PROXY_TOKEN", "k")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Kills and restarts `proxy` at random moments while `child` runs; returns
/// its output and how many kills landed while it ran.
fn kill_while_running(
    child: Child,
    proxy: &mut Proxy,
    seed: u64,
    max_kills: usize,
) -> (std::process::Output, usize) {
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    let mut rng = Rng(seed | 1);
    let mut kills = 0;
    let start = Instant::now();
    while kills < max_kills && start.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(50 + rng.below(400)));
        if waiter.is_finished() {
            break;
        }
        proxy.kill();
        kills += 1;
        // Down for a while: the process must wait for it, not give up.
        std::thread::sleep(Duration::from_millis(rng.below(700)));
        proxy.restart();
    }
    (waiter.join().unwrap(), kills)
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Waits for `child` to end: successfully, its session taken back by
/// `proxy`, with the result `want`.
fn ended_on(child: Child, proxy: &Proxy, want: &str) {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("{} took the session back", proxy.addr)),
        "{}",
        stderr(&out)
    );
    assert_eq!(result_line(&out.stdout), want);
}

/// Runs `app` on a proxy killed and restarted at random moments; the run
/// must print the native result after at least two kills.
///
/// `journal_mib` "1024" is the default journal (few checkpoints or none:
/// these runs make fewer calls than one asks for); "1" a 1 MiB one (a
/// checkpoint every few thousand calls), so that kills land inside
/// checkpoints too: in their drain, their read-back (which leaves the RAM
/// copies of the last checkpoint alone until the journal is compacted) and
/// their compaction. The corpus alternates between the two (CI's time).
fn survives(app: &str, iters: &str, journal_mib: &str) {
    let seed = if journal_mib == "1" {
        0x2545f4914f6cdd1du64
    } else {
        0x9e3779b97f4a7c15
    };
    {
        let mut proxy = Proxy::start(&format!("death-{app}"), true, &[("k", "t")]);
        let (iters, kills) = long_enough(app, iters, 2, |iters| {
            let scratch = scratch(&format!("death-{app}-{seed:x}"));
            let child = start_remote(
                app,
                iters,
                scratch.path(),
                &proxy,
                &[("CRANE_REMOTE_JOURNAL_MIB", journal_mib)],
            );
            let (out, kills) = kill_while_running(child, &mut proxy, seed, 4);
            assert!(
                out.status.success(),
                "{app} failed after {kills} proxy kill(s): {}",
                stderr(&out)
            );
            if kills > 0 {
                assert!(
                    stderr(&out).contains("took the session back"),
                    "{}",
                    stderr(&out)
                );
            }
            (result_line(&out.stdout), kills)
        });
        eprintln!(
            "{app}: {kills} proxy kills at --iters {iters} (journal {journal_mib} MiB), \
             result identical to native"
        );
    }
}

macro_rules! corpus_test {
    ($name:ident, $app:literal, $iters:expr, $journal:expr) => {
        #[test]
        fn $name() {
            survives($app, $iters, $journal);
        }
    };
}

// pingpong both ways; the others with one journal each, alternating.
corpus_test!(pingpong, "pingpong", "6000", "1024");
corpus_test!(pingpong_checkpointed, "pingpong", "6000", "1");
corpus_test!(subbuffers, "subbuffers", "3000", "1");
corpus_test!(images, "images", "2000", "1024");
corpus_test!(maps, "maps", "3000", "1");
corpus_test!(copies, "copies", "3000", "1024");
corpus_test!(frameloop, "frameloop", "600", "1");
corpus_test!(localmem, "localmem", "3000", "1024");
corpus_test!(multictx, "multictx", "2000", "1");
corpus_test!(events, "events", "2000", "1024");

/// pingpong moved to a proxy and back again and again (back with a
/// pre-copy of 0-2 rounds), the proxy killed, and restarted a moment later,
/// at a random point of each move back: before it, inside the pre-copy's
/// rounds, the drain and read-back (which wait for the replay on the
/// restarted proxy), the local rebuild or the proxy's release after it.
/// Every move back completes and the result is the native one.
#[test]
fn killed_during_moves_back() {
    let mut proxy = Proxy::start("death-back", true, &[("k", "t")]);
    let (iters, kills) = long_enough("pingpong", "6000", 3, |iters| {
        let scratch = scratch("death-back");
        let child = under_crane("pingpong", iters, scratch.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let sock = socket_path(scratch.path(), child.id());
        let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
        let mut rng = Rng(0x51ed_2701_9e37_79b9);
        let mut kills = 0;
        let start = Instant::now();
        while !waiter.is_finished() && kills < 6 && start.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(5 + rng.below(60)));
            if !sock.exists() {
                continue;
            }
            let remote = Request::Remote {
                proxy: proxy.addr.clone(),
                token: Some("k".into()),
                deadline_ms: 20_000,
                device: None,
                precopy: 0,
            };
            let Ok(r) = call(&sock, &remote, Duration::from_secs(60)) else {
                break; // it has finished
            };
            if !r.ok {
                assert!(
                    finishes(&waiter),
                    "moving to the proxy failed: {:?}",
                    r.error
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(rng.below(40)));
            let back = Request::Local {
                deadline_ms: 60_000,
                device: None,
                precopy: rng.below(3) as u32,
            };
            let s = sock.clone();
            let asked = std::thread::spawn(move || call(&s, &back, Duration::from_secs(120)));
            std::thread::sleep(Duration::from_millis(rng.below(30)));
            proxy.kill();
            kills += 1;
            std::thread::sleep(Duration::from_millis(rng.below(300)));
            proxy.restart();
            match asked.join().unwrap() {
                Ok(r) => assert!(r.ok, "the move back failed: {:?}", r.error),
                Err(e) => assert!(finishes(&waiter), "the move back was not answered: {e}"),
            }
        }
        let out = waiter.join().unwrap();
        assert!(
            out.status.success(),
            "pingpong failed ({}) after {kills} kill(s): {}",
            out.status,
            stderr(&out)
        );
        (result_line(&out.stdout), kills)
    });
    eprintln!(
        "pingpong: {kills} proxy kills during moves back at --iters {iters}, identical to native"
    );
}

/// pingpong running locally, moved to crane-proxy again and again while the
/// proxy is killed (SIGKILL, restarted a moment later) at a random point of
/// each move: before it connects, during the session's rebuild (its
/// buffers over lanes, every move, in small pieces), in the pre-copy's
/// rounds, or just after. Each move either completes (the process is on the
/// proxy, which may die right after: it replays on the restarted one, and
/// the move back brings it home) or is refused with the reason, the process
/// local and running; the result is the native one.
///
/// It found a way to lose the application (2026-11-28, one CI run in four):
/// a frame's header and payload went out in one `writev`, which raises
/// SIGPIPE when the proxy has just died, and a C program's default SIGPIPE
/// ends it. Every socket write of the interposer is a `send`/`sendmsg`
/// with `MSG_NOSIGNAL` now (`nosignal.rs`).
#[test]
fn killed_during_moves_there() {
    let mut proxy = Proxy::start("death-there", true, &[("k", "t")]);
    let (mut moved, mut refused) = (0, 0);
    let (iters, kills) = long_enough("pingpong", "6000", 3, |iters| {
        let scratch = scratch("death-there");
        let child = under_crane("pingpong", iters, scratch.path())
            .envs([
                ("CRANE_REMOTE_LANES_MIN", "1"),
                ("CRANE_REMOTE_LANE_PIECE", "65536"),
                ("CRANE_REMOTE_LANES", "3"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let sock = socket_path(scratch.path(), child.id());
        let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
        let mut rng = Rng(0x7f4a_7c15_2545_f491);
        let mut kills = 0;
        (moved, refused) = (0, 0);
        let start = Instant::now();
        while !waiter.is_finished() && kills < 6 && start.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(5 + rng.below(60)));
            if !sock.exists() {
                continue;
            }
            let there = Request::Remote {
                proxy: proxy.addr.clone(),
                token: Some("k".into()),
                deadline_ms: 20_000,
                device: None,
                precopy: rng.below(3) as u32,
            };
            let s = sock.clone();
            let asked = std::thread::spawn(move || call(&s, &there, Duration::from_secs(60)));
            std::thread::sleep(Duration::from_millis(rng.below(30)));
            proxy.kill();
            kills += 1;
            std::thread::sleep(Duration::from_millis(rng.below(300)));
            proxy.restart();
            match asked.join().unwrap() {
                Ok(r) if r.ok => moved += 1,
                Ok(r) => {
                    let e = r.error.unwrap_or_default();
                    assert!(
                        e.contains("crane-proxy") || e.contains("connection"),
                        "a refused move must say why: {e:?}"
                    );
                    refused += 1;
                    continue;
                }
                Err(e) => {
                    assert!(finishes(&waiter), "the move was not answered: {e}");
                    break;
                }
            }
            let back = Request::Local {
                deadline_ms: 60_000,
                device: None,
                precopy: 0,
            };
            match call(&sock, &back, Duration::from_secs(120)) {
                Ok(r) => assert!(r.ok, "the move back failed: {:?}", r.error),
                Err(e) => assert!(finishes(&waiter), "the move back was not answered: {e}"),
            }
        }
        let out = waiter.join().unwrap();
        assert!(
            out.status.success(),
            "pingpong failed ({}) after {kills} kill(s): {}",
            out.status,
            stderr(&out)
        );
        (result_line(&out.stdout), kills)
    });
    eprintln!(
        "pingpong: {kills} proxy kills during moves to it at --iters {iters} \
         ({moved} moves completed, {refused} refused), identical to native"
    );
}

/// pingpong on crane-proxy while the proxy is stopped (SIGSTOP) for a while,
/// three times: the process waits (its connection is not broken, so nothing
/// is replayed) and, the proxy continued, ends with the native result.
#[test]
fn a_stalled_proxy_is_waited_for() {
    let proxy = Proxy::start("stalled", true, &[("k", "t")]);
    let want = native("pingpong", "6000");
    let scratch = scratch("stalled");
    let child = start_remote("pingpong", "6000", scratch.path(), &proxy, &[]);
    wait_socket(&socket_path(scratch.path(), child.id()));
    let pid = nix::unistd::Pid::from_raw(proxy.child.id() as i32);
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    let mut stalls = 0;
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(200));
        if waiter.is_finished() {
            break;
        }
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
        stalls += 1;
    }
    let out = waiter.join().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stalls >= 1, "pingpong ended before the proxy was stopped");
    assert!(
        !stderr(&out).contains("took the session back"),
        "a stall is not a death: {}",
        stderr(&out)
    );
    assert_eq!(result_line(&out.stdout), want);
}

/// A process moved to the proxy (its session starts with crane's rebuild)
/// and checkpointed on request; the proxy dies for good, and the process,
/// pointed at another proxy with `cranectl remote`, carries on there, comes
/// home, and ends with the native result.
#[test]
fn pointed_at_another_proxy_after_a_checkpoint() {
    let want = native("pingpong", "20000");
    let mut first = Proxy::start("death-first", true, &[("k", "t")]);
    let second = Proxy::start("death-second", false, &[("k2", "t")]);
    let scratch = scratch("death-moved");
    let run_dir = scratch.path();
    let release = run_dir.join("release");
    let child = under_crane("pingpong", "20000", run_dir)
        .env("TESTAPP_HOLD", &release)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(run_dir, child.id());
    wait_socket(&sock);
    let ask = |req: &Request| call(&sock, req, Duration::from_secs(90)).unwrap();
    // In passthrough there is nothing to redirect.
    let r = ask(&Request::Redirect {
        proxy: second.addr.clone(),
        token: None,
    });
    assert!(
        !r.ok
            && r.error
                .as_deref()
                .unwrap_or("")
                .contains("not on crane-proxy (the process is in passthrough)"),
        "{r:?}"
    );
    let r = ask(&Request::Remote {
        proxy: first.addr.clone(),
        token: Some("k".into()),
        deadline_ms: 20_000,
        device: None,
        precopy: 0,
    });
    assert!(r.ok, "moving to the proxy failed: {:?}", r.error);
    let r = ask(&Request::Checkpoint {
        deadline_ms: 20_000,
    });
    assert!(r.ok, "the checkpoint failed: {:?}", r.error);
    assert!(
        r.phases.iter().any(|p| p.name == "compact"),
        "{:?}",
        r.phases
    );
    // The program runs on past its hold; the proxy dies under it.
    std::fs::write(&release, b"").unwrap();
    std::thread::sleep(Duration::from_millis(150));
    first.kill();
    std::thread::sleep(Duration::from_millis(300));
    let r = ask(&Request::Remote {
        proxy: second.addr.clone(),
        token: Some("k2".into()),
        deadline_ms: 20_000,
        device: None,
        precopy: 0,
    });
    assert!(
        r.ok,
        "pointing the process at another proxy failed: {:?}",
        r.error
    );
    // Home again, from the second proxy (if it is still running).
    let start = Instant::now();
    loop {
        match call(&sock, &Request::Status, Duration::from_secs(30)) {
            Ok(st)
                if st
                    .status
                    .as_ref()
                    .is_some_and(|s| s.mode == Mode::Remote && !s.busy) =>
            {
                let r = ask(&Request::Local {
                    deadline_ms: 20_000,
                    device: None,
                    precopy: 0,
                });
                if r.ok {
                    break;
                }
            }
            Ok(_) => {}
            Err(_) => break, // it has finished
        }
        if start.elapsed() > Duration::from_secs(60) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    ended_on(child, &second, &want);
}

/// A redirect (`cranectl redirect`) to a process on a live proxy is kept
/// (and the live connection left alone). Once its proxy has died for good,
/// the process is redirected to an address where no proxy listens yet, a
/// second before its wait (3 s) would end: the redirect starts the wait
/// again, and a proxy started there after the first wait would have ended
/// takes the session; the result is the native one.
#[test]
fn a_redirect_names_the_proxy_and_waits_again() {
    let want = native("pingpong", "6000");
    let mut first = Proxy::start("redirect-first", true, &[("k", "t")]);
    let mut second = Proxy::start("redirect-second", true, &[("k", "t")]);
    second.kill();
    let scratch = scratch("redirect");
    let release = scratch.path().join("release");
    let child = start_remote(
        "pingpong",
        "6000",
        scratch.path(),
        &first,
        &[
            ("CRANE_REMOTE_RECOVER_S", "3"),
            ("CRANE_REMOTE_LOCAL_AFTER_S", "0"),
            ("TESTAPP_HOLD", release.to_str().unwrap()),
        ],
    );
    let sock = socket_path(scratch.path(), child.id());
    wait_socket(&sock);
    let redirect = Request::Redirect {
        proxy: second.addr.clone(),
        token: None,
    };
    let r = call(&sock, &redirect, Duration::from_secs(30)).unwrap();
    assert!(
        r.ok,
        "a process on crane-proxy refused a redirect: {:?}",
        r.error
    );
    let st = call(&sock, &Request::Status, Duration::from_secs(30)).unwrap();
    assert_eq!(st.status.map(|s| s.mode), Some(Mode::Remote));
    first.kill();
    let killed = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let r = call(&sock, &redirect, Duration::from_secs(30)).unwrap();
    assert!(r.ok, "the redirect was refused: {:?}", r.error);
    // Past the first wait's end, within the second's.
    std::thread::sleep(Duration::from_millis(3600).saturating_sub(killed.elapsed()));
    second.restart();
    std::fs::write(&release, b"").unwrap();
    ended_on(child, &second, &want);
}

/// A proxy domain destroyed under a process (its host gone silent: no FIN,
/// no RST, as `xl destroy` leaves it) and created again. dom0 tells the
/// guest where crane-proxy is as soon as it creates the domain again
/// (`crane/proxy-now`; here the redirect crane-agent then sends), before the
/// process can notice: the process keeps the address, leaves the silent
/// connection within seconds (not after its TCP timeout of 60 s), waits for
/// the proxy (not falling back to the local vendor after 10 s: dom0 named
/// the proxy), replays its session on the new one and ends with the native
/// result. `busy`: the process goes on calling into the silence (its
/// data unacknowledged) and dom0's word comes 14 s later, when TCP's next
/// retransmission (which would end the connection under the quick timeout)
/// is 11 s away: the look at TCP_INFO must leave it within seconds. (When
/// the domain dies between the acknowledgement of a call and its answer,
/// the process is idle instead, and the probes leave it as fast.) Not busy:
/// its call acknowledged by the domain's kernel and its answer awaited (the
/// proxy stopped first), which quick keepalive probes find. Runs in two
/// network namespaces joined by a veth pair (root).
fn destroyed_under(busy: bool) {
    let want = native("pingpong", "6000");
    let tag = if busy { "silent-busy" } else { "silent-idle" };
    let net = Netns::new(tag);
    let mut proxy = Proxy::start_in(tag, &net.b, netns::B_IP, &[("k", "t")]);
    let app = HeldInNetns::start(&net, &proxy, tag);
    if !busy {
        let pid = nix::unistd::Pid::from_raw(proxy.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        // The next read is sent, acknowledged, and waits for its answer.
        std::thread::sleep(Duration::from_millis(300));
    }
    // The domain destroyed: its link goes silent first, so that the
    // process's kill sends the application nothing.
    net.cut();
    proxy.kill();
    let destroyed = Instant::now();
    std::thread::sleep(Duration::from_secs(if busy { 14 } else { 1 }));
    // dom0 created it again and says so; it is still booting.
    app.redirect(&proxy.addr);
    let left = app.wait_err("waiting up to", Duration::from_secs(15));
    let noticed = destroyed.elapsed();
    if busy {
        assert!(
            left < Duration::from_secs(5),
            "left {left:?} after the redirect:\n{}",
            app.err()
        );
    }
    // Booted: the new proxy answers at the same address.
    std::thread::sleep(Duration::from_secs(3));
    net.restore();
    proxy.restart();
    let (out, err) = app.release();
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "crane-proxy at {} took the session back",
            proxy.addr
        )),
        "{err}"
    );
    assert!(!err.contains("local vendor"), "{err}");
    assert_eq!(result_line(&out.stdout), want);
    eprintln!(
        "{tag}: the connection left {:.1} s after the proxy's host went silent",
        noticed.as_secs_f64()
    );
}

#[test]
fn a_destroyed_proxy_domain_is_left_when_dom0_names_the_new_one() {
    destroyed_under(true);
}

#[test]
fn a_destroyed_proxy_domain_is_found_by_quick_probes_when_the_process_awaits_an_answer() {
    destroyed_under(false);
}

/// A move back (`cranectl local`) asked of a process whose proxy domain
/// was just destroyed (silently): the move back's first call hangs on the
/// dead connection; dom0's word (a redirect) makes the process leave it, the
/// session is replayed on the new proxy, and the move back completes from
/// there: the process is local, and its result the native one.
#[test]
fn a_move_back_from_a_destroyed_proxy_domain_completes_from_the_new_one() {
    let want = native("pingpong", "6000");
    let net = Netns::new("back");
    let mut proxy = Proxy::start_in("back", &net.b, netns::B_IP, &[("k", "t")]);
    let app = HeldInNetns::start(&net, &proxy, "back");
    net.cut();
    proxy.kill();
    let back = app.move_back();
    std::thread::sleep(Duration::from_secs(1));
    app.redirect(&proxy.addr);
    app.wait_err("waiting up to", Duration::from_secs(15));
    std::thread::sleep(Duration::from_secs(2));
    net.restore();
    proxy.restart();
    app.moved_back(back);
    let (out, err) = app.release();
    assert!(out.status.success(), "{err}");
    assert!(err.contains("took the session back"), "{err}");
    assert_eq!(result_line(&out.stdout), want);
}

/// The network between a busy process and its crane-proxy goes silent for
/// 4 s (a partition, not a death: both ends live) and comes back: nothing
/// is replayed (TCP retransmits what was lost), the process carries on on
/// the same session and ends with the native result.
#[test]
fn a_short_network_partition_is_ridden_out() {
    let want = native("pingpong", "6000");
    let net = Netns::new("partition");
    let proxy = Proxy::start_in("partition", &net.b, netns::B_IP, &[("k", "t")]);
    let app = HeldInNetns::start(&net, &proxy, "partition");
    net.cut();
    std::thread::sleep(Duration::from_secs(4));
    net.restore();
    std::thread::sleep(Duration::from_millis(500));
    let (out, err) = app.release();
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("took the session back"), "{err}");
    let sessions = sessions_opened(&proxy);
    assert_eq!(sessions, 1, "{}", proxy.log());
    assert_eq!(result_line(&out.stdout), want);
}

/// The network between a busy process and its crane-proxy goes silent for
/// longer than the process lets data go unacknowledged (here 3 s,
/// `CRANE_REMOTE_DEAD_AFTER_S`; 60 by default): the process gives the
/// connection up, finds the proxy again once the network is back (7 s
/// after the cut), opens a new session and replays onto it; it ends with
/// the native result.
#[test]
fn a_partition_longer_than_the_timeout_ends_in_a_replay() {
    let want = native("pingpong", "6000");
    let net = Netns::new("long-partition");
    let proxy = Proxy::start_in("long-partition", &net.b, netns::B_IP, &[("k", "t")]);
    let app = HeldInNetns::start_with(
        &net,
        &proxy,
        "long-partition",
        &[("CRANE_REMOTE_DEAD_AFTER_S", "3")],
    );
    net.cut();
    std::thread::sleep(Duration::from_secs(7));
    net.restore();
    app.wait_err("took the session back", Duration::from_secs(60));
    let (out, err) = app.release();
    assert!(out.status.success(), "{err}");
    let sessions = sessions_opened(&proxy);
    assert_eq!(sessions, 2, "{}", proxy.log());
    assert_eq!(result_line(&out.stdout), want);
}

/// The network goes silent for 3 s as a move back starts (a partition,
/// both ends alive): the move back waits for it and completes over the
/// same session, nothing replayed; the process is local and its result the
/// native one.
#[test]
fn a_move_back_rides_out_a_short_partition() {
    let want = native("pingpong", "6000");
    let net = Netns::new("back-partition");
    let proxy = Proxy::start_in("back-partition", &net.b, netns::B_IP, &[("k", "t")]);
    let app = HeldInNetns::start(&net, &proxy, "back-partition");
    net.cut();
    let back = app.move_back();
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !back.is_finished(),
        "the move back did not wait for the network"
    );
    net.restore();
    app.moved_back(back);
    let (out, err) = app.release();
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("took the session back"), "{err}");
    assert_eq!(result_line(&out.stdout), want);
}

/// dom0 says where crane-proxy is twice per new proxy domain: when it
/// creates it and when it answers. A process that replayed on the new proxy
/// in between then hears of the proxy it is on while its host is slow (here:
/// the network silent 8 s, its data unacknowledged): it rides that out on
/// the same session, where the quick watch of a first word would have left
/// the connection after 5 s and replayed again for nothing (seen end to end
/// under emulation). Ends with the native result, two sessions in all.
#[test]
fn a_repeated_word_about_the_proxy_it_replayed_on_is_not_a_death() {
    let want = native("pingpong", "6000");
    let net = Netns::new("repeat-word");
    let mut proxy = Proxy::start_in("repeat-word", &net.b, netns::B_IP, &[("k", "t")]);
    let app = HeldInNetns::start(&net, &proxy, "repeat-word");
    // The proxy dies (its process: the connection closes) and comes back;
    // the process replays there.
    proxy.restart();
    app.wait_err("took the session back", Duration::from_secs(60));
    // The host goes silent; dom0's second word arrives meanwhile.
    net.cut();
    std::thread::sleep(Duration::from_millis(500));
    app.redirect(&proxy.addr);
    std::thread::sleep(Duration::from_secs(8));
    net.restore();
    std::thread::sleep(Duration::from_millis(500));
    let (out, err) = app.release();
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches("took the session back").count(), 1, "{err}");
    assert_eq!(sessions_opened(&proxy), 2, "{}", proxy.log());
    assert_eq!(result_line(&out.stdout), want);
}

/// How many sessions `proxy` has opened, by its log.
fn sessions_opened(proxy: &Proxy) -> usize {
    proxy
        .log()
        .lines()
        .filter(|l| l.contains("crane_proxy::server") && l.contains("opened: tenant"))
        .count()
}

/// pingpong on `proxy` (in namespace `net.b`), started from namespace
/// `net.a` in remote mode, holding halfway (a small blocking read every
/// 20 ms); its stderr goes to a file, read as it grows. Killed if the test
/// fails before releasing it.
struct HeldInNetns {
    child: Option<Child>,
    sock: std::path::PathBuf,
    release: std::path::PathBuf,
    err_path: std::path::PathBuf,
    _scratch: tempfile::TempDir,
}

impl HeldInNetns {
    fn start(net: &Netns, proxy: &Proxy, name: &str) -> HeldInNetns {
        Self::start_with(net, proxy, name, &[])
    }

    /// The same with more environment.
    fn start_with(net: &Netns, proxy: &Proxy, name: &str, env: &[(&str, &str)]) -> HeldInNetns {
        let scratch = scratch(name);
        let release = scratch.path().join("release");
        let err_path = scratch.path().join("err");
        let mut vars = vec![
            ("LD_PRELOAD", library().to_str().unwrap().to_string()),
            (
                "CRANE_RUN_DIR",
                scratch.path().to_str().unwrap().to_string(),
            ),
            ("CRANE_MODE", "remote".to_string()),
            ("CRANE_PROXY", proxy.addr.clone()),
            ("CRANE_PROXY_TOKEN", "k".to_string()),
            ("TESTAPP_HOLD", release.to_str().unwrap().to_string()),
        ];
        vars.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let child = Netns::command(&net.a, &apps().join("pingpong"), &vars)
            .args(["--iters", "6000"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&err_path).unwrap())
            .spawn()
            .unwrap();
        let app = HeldInNetns {
            sock: socket_path(scratch.path(), child.id()),
            child: Some(child),
            release,
            err_path,
            _scratch: scratch,
        };
        app.wait_err("holding at iteration", Duration::from_secs(60));
        app
    }

    fn err(&self) -> String {
        std::fs::read_to_string(&self.err_path).unwrap_or_default()
    }

    /// Asks for a move back (`cranectl local`) on a thread of its own.
    fn move_back(&self) -> std::thread::JoinHandle<crane_control::Response> {
        let sock = self.sock.clone();
        std::thread::spawn(move || {
            call(
                &sock,
                &Request::Local {
                    deadline_ms: 90_000,
                    device: None,
                    precopy: 0,
                },
                Duration::from_secs(120),
            )
            .unwrap()
        })
    }

    /// The move back `back` succeeded: the process is in passthrough.
    fn moved_back(&self, back: std::thread::JoinHandle<crane_control::Response>) {
        let r = back.join().unwrap();
        assert!(r.ok, "the move back failed: {:?}\n{}", r.error, self.err());
        let st = call(&self.sock, &Request::Status, Duration::from_secs(30)).unwrap();
        assert_eq!(st.status.map(|s| s.mode), Some(Mode::Passthrough));
    }

    /// What crane-agent does when dom0 says where crane-proxy is now.
    fn redirect(&self, proxy: &str) {
        let r = call(
            &self.sock,
            &Request::Redirect {
                proxy: proxy.to_string(),
                token: None,
            },
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(r.ok, "the redirect was refused: {:?}", r.error);
    }

    /// Waits until its stderr says `what`; returns how long that took.
    fn wait_err(&self, what: &str, limit: Duration) -> Duration {
        let start = Instant::now();
        while !self.err().contains(what) {
            assert!(
                start.elapsed() < limit,
                "no {what:?} within {limit:?}:\n{}",
                self.err()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        start.elapsed()
    }

    /// Lets it go on past its hold; its output and stderr once it ended.
    fn release(mut self) -> (std::process::Output, String) {
        std::fs::write(&self.release, b"").unwrap();
        let child = self.child.take().expect("released once");
        let out = child.wait_with_output().unwrap();
        (out, self.err())
    }
}

impl Drop for HeldInNetns {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// With no proxy to go to, the process's OpenCL calls fail with a clear
/// error once the wait is over, instead of hanging.
#[test]
fn no_proxy_to_go_to_fails_clearly() {
    let mut proxy = Proxy::start("death-for-good", true, &[("k", "t")]);
    let scratch = scratch("death-for-good");
    let child = start_remote(
        "pingpong",
        "100000000",
        scratch.path(),
        &proxy,
        &[
            ("CRANE_REMOTE_RECOVER_S", "2"),
            ("CRANE_REMOTE_LOCAL_AFTER_S", "0"),
        ],
    );
    wait_socket(&socket_path(scratch.path(), child.id()));
    std::thread::sleep(Duration::from_millis(300));
    proxy.kill();
    let killed = Instant::now();
    let out = child.wait_with_output().unwrap();
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "the app took {took:?} to give up"
    );
    assert!(
        !out.status.success(),
        "the app cannot have finished its work"
    );
    let err = stderr(&out);
    assert!(
        err.contains("no crane-proxy took the session back within 2s"),
        "no clear message: {err}"
    );
}

/// How the proxy's death is followed in [`dead_for_good`].
#[derive(Clone, Copy, PartialEq)]
enum Then {
    /// Nothing: the process is left to itself.
    Nothing,
    /// An operator's `local`, sent at once.
    OperatorHome,
    /// dom0 names where crane-proxy is now (a proxy domain being created
    /// again), and nothing answers there.
    NamedButSilent,
}

/// pingpong started on a proxy with `CRANE_REMOTE_LOCAL_AFTER_S=1`, held
/// halfway there; the proxy killed for good (then `then`); once the process
/// is in passthrough it is released. Its output, and the native run's
/// result.
fn dead_for_good(name: &str, then: Then) -> (std::process::Output, String) {
    let operator_home = then == Then::OperatorHome;
    let mut proxy = Proxy::start(name, true, &[("k", "t")]);
    let want = native("pingpong", "4000");
    let scratch = scratch(name);
    let release = scratch.path().join("release");
    let child = start_remote(
        "pingpong",
        "4000",
        scratch.path(),
        &proxy,
        &[
            ("CRANE_REMOTE_LOCAL_AFTER_S", "1"),
            // A named proxy is waited for until 1 s before this ends.
            ("CRANE_REMOTE_RECOVER_S", "6"),
            ("TESTAPP_HOLD", release.to_str().unwrap()),
        ],
    );
    let sock = socket_path(scratch.path(), child.id());
    wait_socket(&sock);
    let status = || {
        call(&sock, &Request::Status, Duration::from_secs(30))
            .ok()
            .and_then(|r| r.status)
    };
    // Holding halfway on the proxy, its kernels made there.
    let started = Instant::now();
    while !status().is_some_and(|s| s.mode == Mode::Remote && s.objects.kernels >= 2) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not on the proxy"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    proxy.kill();
    if then == Then::NamedButSilent {
        // Nothing listens there (the port of a listener just closed).
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = format!("tcp://{}", silent.local_addr().unwrap());
        drop(silent);
        let r = call(
            &sock,
            &Request::Redirect {
                proxy: addr,
                token: Some("t".into()),
            },
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(r.ok, "{:?}", r.error);
    }
    if operator_home {
        // Either answer is right: done, or "already local" if the fallback
        // brought it home first.
        let _ = call(
            &sock,
            &Request::Local {
                deadline_ms: 60_000,
                device: None,
                precopy: 0,
            },
            Duration::from_secs(120),
        );
    }
    let killed = Instant::now();
    while !status().is_some_and(|s| s.mode == Mode::Passthrough) {
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "not local 60 s after its proxy died"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    if operator_home {
        // The fallback's own move home runs after the replay; give it the
        // time to find the process home and stop its proxy.
        std::thread::sleep(Duration::from_secs(2));
    }
    std::fs::write(&release, b"").unwrap();
    (child.wait_with_output().unwrap(), want)
}

/// With no crane-proxy back within `CRANE_REMOTE_LOCAL_AFTER_S`, a process
/// whose proxy died for good replays its session onto a crane-proxy inside
/// itself, on the local vendor (PoCL here), and then goes local: it ends in
/// passthrough with the native result.
#[test]
fn a_proxy_dead_for_good_falls_back_to_the_local_vendor() {
    let (out, want) = dead_for_good("death-local", Then::Nothing);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(result_line(&out.stdout), want, "{err}");
    assert!(err.contains("replaying onto the local vendor"), "{err}");
    assert!(err.contains("runs on the local vendor again"), "{err}");
}

/// A proxy named by dom0 after the death (its domain being created again,
/// say) that does not answer keeps the process waiting only until
/// `CRANE_REMOTE_LOCAL_AFTER_S` before the wait would end; then it goes to
/// the local vendor: after a migration its guest has a GPU again, and
/// waiting on would end in the process's calls failing (seen in the
/// end-to-end tier: the recreated proxy domain answered after more than a
/// minute).
#[test]
fn a_named_proxy_that_stays_silent_falls_back_to_the_local_vendor() {
    let (out, want) = dead_for_good("death-named", Then::NamedButSilent);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(result_line(&out.stdout), want, "{err}");
    assert!(err.contains("replaying onto the local vendor"), "{err}");
    assert!(err.contains("runs on the local vendor again"), "{err}");
}

/// An operator's `local` sent while the process waits for its dead proxy
/// meets the fallback: whichever brings the process home first, it ends in
/// passthrough with the native result and the in-process proxy stopped.
#[test]
fn a_move_home_during_the_fallback_stops_the_in_process_proxy() {
    let (out, want) = dead_for_good("death-home", Then::OperatorHome);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(result_line(&out.stdout), want, "{err}");
    assert!(
        err.contains("stopped the crane-proxy inside this process"),
        "{err}"
    );
}
