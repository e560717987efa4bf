//! Going to the local GPU when crane-proxy died and none comes back.
//!
//! A remote session's journal replays onto any crane-proxy (`session`'s
//! recovery). When none takes the session back within
//! `CRANE_REMOTE_LOCAL_AFTER_S` and this process can load a vendor library
//! with a device (the guest has its GPU again, or kept one), a crane-proxy is
//! started *inside this process*, on the local vendor, listening on a unix
//! socket of its own with a token of its own, and the recovery replays the
//! journal there: crane-proxy's executor is the only code that runs wire
//! calls, so the calls since the last checkpoint run exactly as they would on
//! a restarted proxy. Once the application runs again, a move back to local
//! (the same as `cranectl local PID`) takes the objects and the memory the
//! replay made into the interposer's own passthrough, and the in-process
//! proxy is stopped.
//!
//! The in-process proxy makes no warm contexts, captures no output and
//! serves one session. It opens no library itself: crane's tracking loader
//! opens the local vendors (`vendor::preload`) and hands the proxy their
//! platforms; the move back's load takes those libraries over, so there is
//! one tracked copy, unloaded as usual at the next suspend.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use crate::config::warn;

/// The running in-process proxy, its address and token, and the folder of
/// its socket and token file (removed when dropped).
struct Local {
    proxy: crane_proxy::Proxy,
    addr: String,
    token: String,
    _dir: tempfile::TempDir,
}

static LOCAL: Mutex<Option<Local>> = Mutex::new(None);

fn lock() -> std::sync::MutexGuard<'static, Option<Local>> {
    LOCAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A token nobody else knows (the socket's folder is the process's own too).
fn token() -> Result<String, String> {
    let mut b = [0u8; 16];
    // SAFETY: getrandom into a 16-byte buffer this function owns.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(format!(
            "no random bytes for a token: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Starts the in-process proxy on the local vendor (or finds it started);
/// returns its address and token. Fails when no vendor library with a
/// platform loads here.
pub fn start() -> Result<(String, String), String> {
    let mut l = lock();
    if let Some(local) = l.as_ref() {
        return Ok((local.addr.clone(), local.token.clone()));
    }
    let preloaded = crate::vendor::preload()?;
    let started = serve(preloaded);
    if started.is_err() {
        crate::vendor::drop_preloaded();
    }
    let local = started?;
    let found = (local.addr.clone(), local.token.clone());
    warn!(
        "started a crane-proxy inside this process on the local vendor ({})",
        local.addr
    );
    *l = Some(local);
    Ok(found)
}

/// A crane-proxy on the preloaded libraries, listening on a unix socket in a
/// fresh folder only this user can enter (0700), with a token of its own.
fn serve(preloaded: Vec<(PathBuf, Vec<usize>)>) -> Result<Local, String> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("crane-local-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .map_err(|e| format!("cannot make a folder for the local proxy: {e}"))?;
    let token = token()?;
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{token} local\n"))
        .map_err(|e| format!("cannot write the token: {e}"))?;
    let sock = dir.path().join("proxy.sock");
    let mut config =
        crane_proxy::Config::new(vec![crane_proxy::ListenAddr::Unix(sock.clone())], tokens);
    config.preloaded = preloaded;
    config.capture_stdout = false;
    config.max_sessions = 1;
    crane_proxy::warm::disable();
    let proxy = crane_proxy::Proxy::start(config)
        .map_err(|e| format!("no crane-proxy on the local vendor: {e}"))?;
    Ok(Local {
        proxy,
        addr: format!("unix:{}", sock.display()),
        token,
        _dir: dir,
    })
}

/// Whether `addr` is the in-process proxy's.
pub fn is_local(addr: &str) -> bool {
    lock().as_ref().is_some_and(|l| l.addr == addr)
}

/// Stops the in-process proxy (its session is over, or is ended), if any.
pub fn stop() {
    let Some(mut local) = lock().take() else {
        return;
    };
    local.proxy.shutdown(Duration::from_secs(10));
    drop(local);
    warn!("stopped the crane-proxy inside this process");
}

/// After a recovery onto the in-process proxy: moves the application back
/// to the interposer's own passthrough on the local vendor (the libraries the
/// proxy ran on, taken over), stopping the proxy once its session is closed.
/// Runs on a thread of its own, one control request at a time.
pub fn go_home() {
    let spawned = std::thread::Builder::new()
        .name("crane-local-fallback".into())
        .spawn(|| {
            let _one_at_a_time = crate::control::exclusive();
            match crate::lifecycle::go_local_then(Duration::from_secs(60), None, stop) {
                Ok(_) => warn!("the process runs on the local vendor again (its crane-proxy died)"),
                // Someone brought it home first (`cranectl local`, or a move
                // back the proxy's death interrupted and the replay let
                // finish): only the proxy is left to stop. Its libraries are
                // the process's own now (the resume took them).
                Err(_) if crate::lifecycle::mode() == crane_control::Mode::Passthrough => {
                    warn!("the process runs on the local vendor again (its crane-proxy died)");
                    stop();
                }
                Err(e) => warn!(
                    "the move from the in-process crane-proxy to the local vendor failed: {e}"
                ),
            }
        });
    if let Err(e) = spawned {
        warn!("cannot start the move back to the local vendor: {e}");
    }
}
