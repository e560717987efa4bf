//! The xl wrapper as a process: a fake "real xl" (a shell script that logs
//! its arguments and exits as told) and a fake craned on a real unix socket
//! answering the control protocol, so argument passing, exit statuses, the
//! order of requests and the untouched migration stream are checked.

use std::io::{BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use craned_control::{Domain, Done, Progress, Reply, Request, read_line, write_message};

struct Fixture {
    dir: PathBuf,
    socket: PathBuf,
    requests: Arc<Mutex<Vec<Request>>>,
}

/// craned's answers: the domain list grows by one after the first `domains`.
fn answer(req: &Request, domains_asked: &mut u32, refuse: bool) -> Vec<Reply> {
    let progress = |phase: &str| {
        Reply::Progress(Progress {
            phase: phase.into(),
            elapsed_ms: 1,
            bytes: None,
            detail: None,
        })
    };
    match req {
        Request::PreMigrate { guest, .. } if guest == "plain" => vec![Reply::Done(Done {
            managed: Some(false),
            ..Done::ok()
        })],
        Request::PreMigrate { .. } => vec![
            progress("prepare-migrate"),
            progress("detach"),
            Reply::Done(Done {
                gpu: Some("0000:00:05.0".into()),
                ..Done::ok()
            }),
        ],
        Request::CheckReceive if refuse => {
            vec![Reply::Done(Done::failed("no GPU of the pool is free"))]
        }
        Request::Domains => {
            *domains_asked += 1;
            let mut list = vec![Domain {
                domid: 0,
                name: "Domain-0".into(),
            }];
            if *domains_asked > 1 {
                list.push(Domain {
                    domid: 7,
                    name: "gpuguest".into(),
                });
            }
            vec![Reply::Done(Done {
                domains: Some(list),
                ..Done::ok()
            })]
        }
        Request::Receive { .. } => vec![Reply::Done(Done {
            gpu: Some("0000:00:06.0".into()),
            ..Done::ok()
        })],
        _ => vec![Reply::Done(Done::ok())],
    }
}

impl Fixture {
    fn new(name: &str, refuse: bool) -> Fixture {
        let dir = std::env::temp_dir().join(format!("crane-xl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let real = dir.join("real-xl");
        // Logs its argv, writes a marker to stdout (the migration stream of
        // migrate-receive) and exits with $FAKE_XL_STATUS.
        std::fs::write(
            &real,
            format!(
                "#!/bin/sh\necho \"$0 $*\" >> {}\nprintf 'STREAM-BYTES'\nexit ${{FAKE_XL_STATUS:-0}}\n",
                dir.join("calls").display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
        let socket = dir.join("craned.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            let mut domains_asked = 0;
            for s in listener.incoming() {
                let s = s.unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let Some(line) = read_line(&mut r).unwrap() else {
                    continue;
                };
                let req: Request = serde_json::from_str(&line).unwrap();
                let replies = answer(&req, &mut domains_asked, refuse);
                // Recorded before answering: once the wrapper has its answer
                // it may exit, and the test reads the list right after.
                seen.lock().unwrap().push(req);
                let mut w = s;
                for reply in replies {
                    write_message(&mut w, &reply).unwrap();
                }
                w.flush().unwrap();
            }
        });
        Fixture {
            dir,
            socket,
            requests,
        }
    }

    fn xl(&self, args: &str, status: i32) -> Output {
        Command::new(env!("CARGO_BIN_EXE_xl"))
            .args(args.split_whitespace())
            .env("CRANE_REAL_XL", self.dir.join("real-xl"))
            .env("CRANED_SOCKET", &self.socket)
            .env("FAKE_XL_STATUS", status.to_string())
            .env_remove("CRANE_MIGRATE_MODE")
            .env_remove("CRANE_XL_BYPASS")
            .output()
            .unwrap()
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.split_once(' ').map_or("", |(_, a)| a).to_string())
            .collect()
    }

    fn requests(&self) -> Vec<&'static str> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(Request::name)
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn other_subcommands_pass_through_with_their_status() {
    let f = Fixture::new("pass", false);
    let out = f.xl("pci-attach g 0000:00:05.0", 3);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(text(&out.stdout), "STREAM-BYTES");
    assert_eq!(f.calls(), ["pci-attach g 0000:00:05.0"]);
    assert!(f.requests().is_empty(), "craned is not asked");
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

#[test]
fn migrate_prepares_runs_xl_and_reports() {
    let f = Fixture::new("migrate", false);
    let out = f.xl("migrate -s ssh-x gpuguest host1", 0);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(f.calls(), ["migrate -s ssh-x gpuguest host1"]);
    assert_eq!(f.requests(), ["pre-migrate", "migrated"]);
    let err = text(&out.stderr);
    assert!(
        err.contains("prepare-migrate") && err.contains("detach"),
        "{err}"
    );
    assert!(err.contains("0000:00:05.0 detached"), "{err}");
    assert_eq!(
        f.requests.lock().unwrap()[0],
        Request::PreMigrate {
            guest: "gpuguest".into(),
            dest: "host1".into(),
            mode: craned_control::Mode::Remote
        }
    );
}

#[test]
fn a_failed_migrate_rolls_back_and_keeps_xls_status() {
    let f = Fixture::new("fail", false);
    let out = f.xl("migrate gpuguest host1", 4);
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(f.requests(), ["pre-migrate", "post-migrate-failed"]);
    assert!(text(&out.stderr).contains("giving gpuguest its GPU back"));
}

#[test]
fn save_is_stop_and_copy_and_save_c_resumes() {
    let f = Fixture::new("save", false);
    let out = f.xl("save gpuguest /tmp/g.chk", 0);
    assert_eq!(out.status.code(), Some(0));
    assert!(matches!(
        &f.requests.lock().unwrap()[0],
        Request::PreMigrate {
            mode: craned_control::Mode::StopAndCopy,
            ..
        }
    ));
    assert_eq!(f.requests(), ["pre-migrate", "migrated"]);
    let f = Fixture::new("save-c", false);
    f.xl("save -c gpuguest /tmp/g.chk", 0);
    assert_eq!(f.requests(), ["pre-migrate", "post-migrate-failed"]);
}

#[test]
fn unmanaged_domains_migrate_as_without_crane() {
    let f = Fixture::new("plain", false);
    let out = f.xl("migrate plain host1", 0);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(f.calls(), ["migrate plain host1"]);
    assert_eq!(f.requests(), ["pre-migrate"]);
}

#[test]
fn receive_keeps_the_stream_and_gives_the_arrival_a_gpu() {
    let f = Fixture::new("receive", false);
    let out = f.xl("migrate-receive", 0);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "STREAM-BYTES", "stdout is xl's alone");
    assert_eq!(f.calls(), ["migrate-receive"]);
    assert_eq!(
        f.requests(),
        ["check-receive", "domains", "domains", "receive"]
    );
    assert_eq!(
        f.requests.lock().unwrap()[3],
        Request::Receive {
            guest: "gpuguest".into()
        }
    );
    assert!(text(&out.stderr).contains("gpuguest arrived and runs on GPU 0000:00:06.0"));
}

#[test]
fn receive_is_refused_before_xl_runs_when_no_gpu_is_free() {
    let f = Fixture::new("refuse", true);
    let out = f.xl("migrate-receive", 0);
    assert_eq!(out.status.code(), Some(1));
    assert!(f.calls().is_empty(), "the real receive never ran");
    assert!(text(&out.stderr).contains("no GPU of the pool is free"));
}

#[test]
fn without_craned_moves_are_refused_unless_bypassed() {
    let f = Fixture::new("nocraned", false);
    let run = |bypass: bool| {
        Command::new(env!("CARGO_BIN_EXE_xl"))
            .args(["migrate", "g", "h"])
            .env("CRANE_REAL_XL", f.dir.join("real-xl"))
            .env("CRANED_SOCKET", Path::new("/nonexistent/craned.sock"))
            .env("CRANE_XL_BYPASS", if bypass { "1" } else { "0" })
            .output()
            .unwrap()
    };
    let out = run(false);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("CRANE_XL_BYPASS=1"));
    assert!(f.calls().is_empty());
    let out = run(true);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(f.calls(), ["migrate g h"]);
}

/// A guest arriving while the destination's craned is not running is
/// received all the same (never lose an arriving domain): the real
/// `migrate-receive` runs with the migration stream untouched and its
/// status, and the wrapper says the guest waits for craned (which receives
/// it when it starts: craned's
/// `migrate::a_guest_that_arrived_without_craned_is_received_when_it_starts`).
#[test]
fn a_guest_arrives_without_craned_and_waits_for_it() {
    let f = Fixture::new("arrive-nocraned", false);
    let out = Command::new(env!("CARGO_BIN_EXE_xl"))
        .args(["migrate-receive"])
        .env("CRANE_REAL_XL", f.dir.join("real-xl"))
        .env("CRANED_SOCKET", Path::new("/nonexistent/craned.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"STREAM-BYTES");
    assert_eq!(f.calls(), ["migrate-receive"]);
    let err = text(&out.stderr);
    assert!(err.contains("receiving without crane"), "{err}");
    assert!(err.contains("craned receives it when it starts"), "{err}");
}
