//! The per-process control socket (`$CRANE_RUN_DIR/apps/<pid>.sock`, mode
//! 0600), served by one thread started at the application's first OpenCL call.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Once;
use std::time::{Duration, Instant};

use crane_control::{MAX_REQUEST, Mode, Request, Response};

use crate::config::{self, debug, warn};
use crate::{gate, lifecycle};

static START: Once = Once::new();

/// Starts the control thread once per process.
pub fn start() {
    if !config::get().control_socket {
        return;
    }
    START.call_once(|| {
        let dir = crane_control::apps_dir(&config::get().run_dir);
        let path = crane_control::socket_path(&config::get().run_dir, std::process::id());
        if let Err(e) = std::fs::create_dir_all(&dir) {
            warn!(
                "cannot create {}: {e}; this process cannot be suspended",
                dir.display()
            );
            return;
        }
        let _ = std::fs::remove_file(&path);
        let listener = match UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                warn!(
                    "cannot listen on {}: {e}; this process cannot be suspended",
                    path.display()
                );
                return;
            }
        };
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
        debug!("control socket {}", path.display());
        let spawned = std::thread::Builder::new()
            .name("crane-control".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    match conn {
                        Ok(s) => serve(s),
                        Err(e) => debug!("control accept: {e}"),
                    }
                }
            });
        if let Err(e) = spawned {
            warn!("cannot start the control thread: {e}");
        }
        // SAFETY: atexit takes a plain function; removing our socket at exit.
        unsafe { libc::atexit(remove_socket) };
    });
}

extern "C" fn remove_socket() {
    let _ = std::fs::remove_file(crane_control::socket_path(
        &config::get().run_dir,
        std::process::id(),
    ));
}

fn serve(s: UnixStream) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    let mut r = BufReader::new((&s).take(MAX_REQUEST as u64));
    let resp = match r.read_line(&mut line) {
        Ok(_) => match serde_json::from_str::<Request>(&line) {
            Ok(req) => handle(req),
            Err(e) => Response::error(format!("malformed request: {e}")),
        },
        Err(e) => Response::error(format!("cannot read request: {e}")),
    };
    let mut out = serde_json::to_vec(&resp).unwrap_or_default();
    out.push(b'\n');
    let _ = (&s).write_all(&out);
}

fn handle(req: Request) -> Response {
    let ok = |phases, residue| Response {
        ok: true,
        error: None,
        status: None,
        phases,
        residue,
    };
    match req {
        Request::Status => {
            // Counting objects needs them to hold still: pause the application's
            // calls briefly (they already are while suspended).
            let paused = lifecycle::mode() != Mode::Suspended;
            if paused && gate::shut(gate::CLOSED, Instant::now() + Duration::from_secs(2)).is_err()
            {
                gate::open();
                return Response::error("the process stayed inside OpenCL calls; try again");
            }
            let st = std::panic::catch_unwind(lifecycle::status);
            if paused {
                gate::open();
            }
            match st {
                Ok(st) => Response {
                    ok: true,
                    error: None,
                    status: Some(st),
                    phases: Vec::new(),
                    residue: None,
                },
                Err(_) => Response::error("internal error while counting objects"),
            }
        }
        Request::Suspend { deadline_ms } => match std::panic::catch_unwind(|| {
            lifecycle::suspend(Duration::from_millis(deadline_ms))
        }) {
            Ok(Ok((phases, residue))) => ok(phases, Some(residue)),
            Ok(Err(e)) => Response::error(e),
            Err(_) => Response::error("internal error during suspend"),
        },
        Request::Resume => match std::panic::catch_unwind(lifecycle::resume) {
            Ok(Ok(phases)) => ok(phases, None),
            Ok(Err(e)) => Response::error(e),
            Err(_) => Response::error("internal error during resume"),
        },
        Request::Remote {
            proxy,
            token,
            deadline_ms,
        } => match std::panic::catch_unwind(|| {
            lifecycle::go_remote(
                proxy,
                token.unwrap_or_default(),
                Duration::from_millis(deadline_ms),
            )
        }) {
            Ok(Ok((phases, residue))) => ok(phases, Some(residue)),
            Ok(Err(e)) => Response::error(e),
            Err(_) => Response::error("internal error while going remote"),
        },
        Request::Local { deadline_ms } => match std::panic::catch_unwind(|| {
            lifecycle::go_local(Duration::from_millis(deadline_ms))
        }) {
            Ok(Ok(phases)) => ok(phases, None),
            Ok(Err(e)) => Response::error(e),
            Err(_) => Response::error("internal error while going local"),
        },
    }
}
