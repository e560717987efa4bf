//! Integration tier: `crane-agent --standalone` with a real OpenCL program
//! under the real interposer (libcrane_opencl.so on PoCL in CI). A
//! stop-and-copy prepare-migrate posted through the agent's socket (as
//! `cranectl agent` does) must suspend the program, prepare-resume must bring
//! it back, twice, and the program's result must be bit-identical to a native
//! run. Needs gcc and an OpenCL ICD (testapps/README.md); no root, no Xen.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crane_agent::standalone::{CtlReply, CtlRequest, call};
use crane_control::notice::{MigrationNotice, read_notice};
use crane_control::socket_path;
use crane_xs::message::{
    AgentState, AppOutcome, AppResult, DetachKind, GuestState, Outcome, Response,
};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// target/<profile>, from this test binary's path (target/<profile>/deps/x).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The interposer; `cargo test` does not build cdylibs of other packages.
fn library() -> PathBuf {
    let lib = profile_dir().join("libcrane_opencl.so");
    if !lib.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "crane-opencl"])
            .current_dir(repo());
        if profile_dir().file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        cmd.env("CARGO_TARGET_DIR", profile_dir().parent().unwrap());
        assert!(
            cmd.status().unwrap().success(),
            "building libcrane_opencl.so failed"
        );
    }
    lib
}

/// The C test programs (the Rust one is not needed here).
fn apps() -> PathBuf {
    let out = repo().join("target/testapps-c");
    let st = Command::new("bash")
        .arg(repo().join("testapps/build.sh"))
        .arg(&out)
        .env("CRANE_TESTAPPS_SKIP_RUST", "1")
        .stdout(Stdio::null())
        .status()
        .expect("run testapps/build.sh");
    assert!(st.success(), "building the test programs failed");
    out
}

fn result_line(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_default()
        .to_string()
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(path: &Path, what: &str) {
    let t = Instant::now();
    while !path.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{what} did not appear"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn post(sock: &Path, req: CtlRequest) -> (Response, Vec<AppResult>, AgentState) {
    let reply: CtlReply = call(sock, &req, Duration::from_secs(120)).unwrap();
    assert!(reply.ok, "{:?}", reply.error);
    let resp = Response::parse(reply.response.as_deref().unwrap()).unwrap();
    let apps = reply
        .apps
        .iter()
        .map(|a| AppResult::parse(a).unwrap())
        .collect();
    let state = AgentState::parse(reply.state.as_deref().unwrap()).unwrap();
    (resp, apps, state)
}

/// The devices the program reports it runs on.
fn app_devices(run: &Path, pid: u32) -> Vec<String> {
    let r = crane_control::call(
        &socket_path(run, pid),
        &crane_control::Request::Status,
        Duration::from_secs(10),
    )
    .unwrap();
    let st = r.status.expect("a status");
    assert!(!st.devices.is_empty(), "no devices reported: {st:?}");
    st.devices
}

#[test]
fn stop_and_copy_cycle_under_the_real_interposer() {
    let lib = library();
    let prog = apps().join("pingpong");
    let native = Command::new(&prog)
        .args(["--iters", "60000"])
        .output()
        .unwrap();
    assert!(native.status.success());
    let want = result_line(&native.stdout);
    assert!(!want.is_empty());

    let run = std::env::temp_dir().join(format!("crane-agent-it-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(&run).unwrap();
    // No GPU modules on a plain box, PoCL runs on the CPU: nothing to unload,
    // no device node to wait for, no device files to hold.
    let cfg = run.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "run_dir = \"{}\"\n[modules]\nunload = []\n[device]\nholders = [\"{}/gpu\"]\nwait_for = []\n",
            run.display(),
            run.display()
        ),
    )
    .unwrap();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_crane-agent"))
        .args(["--standalone", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let agent_log = agent.stderr.take().unwrap();
    let agent = Killed(agent);
    let log_lines = std::thread::spawn(move || {
        BufReader::new(agent_log)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let sock = run.join("agent.sock");
    wait_for(&sock, "the agent's socket");

    // Halfway the program holds until `release` exists, so that it is still
    // running for the second cycle however fast the machine is.
    let release = run.join("release");
    let child = Command::new(&prog)
        .args(["--iters", "60000"])
        .env("LD_PRELOAD", &lib)
        .env("CRANE_RUN_DIR", &run)
        .env("TESTAPP_HOLD", &release)
        // Two devices (PoCL's basic, then pthread), for the move onto another.
        .env("POCL_DEVICES", "basic pthread")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_for(&socket_path(&run, pid), "the program's control socket");
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());

    for cycle in 0..2 {
        std::thread::sleep(Duration::from_millis(300));
        let (resp, apps, state) = post(
            &sock,
            CtlRequest::PrepareMigrate {
                mode: "stop-and-copy".into(),
                proxy: None,
                token: None,
                deadline_ms: Some(20_000),
            },
        );
        assert_eq!(
            resp.outcome,
            Outcome::ReadyForDetach,
            "cycle {cycle}: {resp:?}"
        );
        assert_eq!(state.state, GuestState::Detached(DetachKind::StopAndCopy));
        let app = apps
            .iter()
            .find(|a| a.pid == pid)
            .expect("the program's result");
        assert_eq!(app.outcome, AppOutcome::Suspended, "{app:?}");
        assert_eq!(read_notice(&run), Some(MigrationNotice::Suspended));
        // Parked: the program makes no progress and does not exit.
        std::thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished(), "the program ran on while suspended");

        // The second time, as craned's `no_free_gpu = "cpu"` asks: onto
        // another device (here PoCL's other CPU device), no GPU driver.
        let (device, no_gpu) = if cycle == 0 {
            (None, false)
        } else {
            (Some("pthread".to_string()), true)
        };
        let (resp, apps, state) = post(
            &sock,
            CtlRequest::PrepareResume {
                deadline_ms: Some(20_000),
                device,
                no_gpu,
            },
        );
        assert_eq!(resp.outcome, Outcome::Resumed, "cycle {cycle}: {resp:?}");
        assert_eq!(state.state, GuestState::Passthrough);
        let app = apps
            .iter()
            .find(|a| a.pid == pid)
            .expect("the program's result");
        assert_eq!(app.outcome, AppOutcome::Passthrough, "{app:?}");
        assert_eq!(read_notice(&run), None);
        let expect = if cycle == 0 { "basic" } else { "pthread" };
        let on = app_devices(&run, pid);
        assert!(
            on.iter().all(|d| d.contains(expect)),
            "cycle {cycle}: {on:?}"
        );
    }
    // A GPU again: back onto the devices it started on, from passthrough.
    let (resp, apps, _) = post(
        &sock,
        CtlRequest::PrepareResume {
            deadline_ms: Some(20_000),
            device: Some("home".into()),
            no_gpu: false,
        },
    );
    assert_eq!(resp.outcome, Outcome::Resumed, "{resp:?}");
    assert!(
        apps.iter()
            .any(|a| a.pid == pid && a.outcome == AppOutcome::Passthrough)
    );
    let on = app_devices(&run, pid);
    assert!(on.iter().all(|d| d.contains("basic")), "back home: {on:?}");
    std::fs::write(&release, b"").unwrap();
    let out = waiter.join().unwrap();
    assert!(
        out.status.success(),
        "the program failed under crane: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(result_line(&out.stdout), want, "result differs from native");

    let reply = call(&sock, &CtlRequest::Status, Duration::from_secs(10)).unwrap();
    let st = AgentState::parse(reply.state.as_deref().unwrap()).unwrap();
    assert_eq!(st.last_seq, 5);
    drop(agent);
    let lines = log_lines.join().unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("request 1: prepare-migrate")),
        "agent log: {lines:?}"
    );
    let _ = std::fs::remove_dir_all(&run);
}
