//! `xl ...`: crane's xl wrapper (see the library's docs). Everything but
//! migrate, save, migrate-receive and restore is handed to the real xl with
//! exec.

use std::collections::BTreeSet;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use crane_xl::{Plan, Reporter, Settings, ask, check_real_xl, plan};
use craned_control::migration_stream_bytes;
use craned_control::{ControlError, Mode, Request};

fn exec_real(settings: &Settings, args: &[String]) -> i32 {
    let e = Command::new(&settings.real_xl).arg0("xl").args(args).exec();
    eprintln!("crane: cannot run {}: {e}", settings.real_xl.display());
    127
}

fn code(st: ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// What the wrapper reports every 2 s while the real xl runs.
#[derive(Clone, Copy)]
enum Watch<'a> {
    /// `xl save`: the size of its file.
    Save(&'a str),
    /// `xl migrate`: the bytes xl and its save helper have written.
    Migrate,
    Nothing,
}

/// Runs the real xl as a child (the wrapper has work after it) and waits;
/// meanwhile Ctrl-C reaches xl, not the wrapper, which must live to report.
fn run_real(settings: &Settings, args: &[String], rep: &Reporter, watch: Watch<'_>) -> i32 {
    let mut child = match Command::new(&settings.real_xl)
        .arg0("xl")
        .args(args)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crane: cannot run {}: {e}", settings.real_xl.display());
            return 127;
        }
    };
    ignore_terminal_signals();
    let mut last_report = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return code(st),
            Ok(None) => {}
            Err(e) => {
                eprintln!("crane: waiting for xl: {e}");
                return 1;
            }
        }
        if last_report.elapsed() >= Duration::from_secs(2) {
            let mib = |b: u64| b as f64 / (1 << 20) as f64;
            match watch {
                Watch::Save(f) => {
                    if let Ok(m) = std::fs::metadata(f) {
                        rep.line(&format!("xl save: {:.1} MiB written", mib(m.len())));
                    }
                }
                Watch::Migrate => {
                    if let Some(b) = migration_stream_bytes(child.id()) {
                        rep.line(&format!("xl migrate: {:.1} MiB sent", mib(b)));
                    }
                }
                Watch::Nothing => {}
            }
            last_report = std::time::Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn ignore_terminal_signals() {
    for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP, libc::SIGTERM] {
        // SAFETY: SIG_IGN is a valid disposition; no handler code runs.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

fn unreachable(settings: &Settings, e: &ControlError) -> bool {
    eprintln!("crane: {e}");
    if settings.bypass {
        eprintln!("crane: CRANE_XL_BYPASS=1: running xl without crane");
        return true;
    }
    eprintln!(
        "crane: refusing to move a domain without craned (a GPU guest would fail or lose its GPU); \
         set CRANE_XL_BYPASS=1 to run xl alone"
    );
    false
}

/// `; pre-migration stoppage 81.2 ms` (the longest time one of the
/// guest's OpenCL processes was stopped), or nothing without processes.
fn stop_text(what: &str, stop_us: Option<u64>) -> String {
    stop_us.map_or(String::new(), |us| {
        format!("; {what} stoppage {:.1} ms", us as f64 / 1000.0)
    })
}

/// Source side: pre-migrate, the real command, then migrated or rollback.
fn depart(
    settings: &Settings,
    args: &[String],
    domain: &str,
    dest: &str,
    mode: Mode,
    resume_after: bool,
    save_file: Option<&str>,
) -> i32 {
    let rep = Reporter::default();
    rep.line(&format!(
        "preparing {domain} for {} ({})",
        if save_file.is_some() {
            "xl save"
        } else {
            "xl migrate"
        },
        mode.as_str()
    ));
    let req = Request::PreMigrate {
        guest: domain.to_string(),
        dest: dest.to_string(),
        mode,
    };
    let done = match ask(settings, &rep, &req) {
        Ok(d) => d,
        Err(e) => {
            return if unreachable(settings, &e) {
                exec_real(settings, args)
            } else {
                1
            };
        }
    };
    if !done.ok {
        eprintln!(
            "crane: pre-migration of {domain} failed: {}",
            done.error.unwrap_or_default()
        );
        return 1;
    }
    if done.managed == Some(false) {
        return exec_real(settings, args);
    }
    rep.line(&format!(
        "{domain} is off its GPU{}{}; running xl",
        done.gpu
            .map_or(String::new(), |g| format!(" ({g} detached)")),
        stop_text("pre-migration", done.stop_us)
    ));
    let watch = save_file.map_or(Watch::Migrate, Watch::Save);
    let rc = run_real(settings, args, &rep, watch);
    let guest = domain.to_string();
    if rc == 0 && !resume_after {
        match ask(settings, &rep, &Request::Migrated { guest }) {
            Ok(d) if d.ok => rep.line(&format!("{domain} left; its GPU is back in the pool")),
            Ok(d) => {
                eprintln!("crane: {}", d.error.unwrap_or_default());
                return 1;
            }
            Err(e) => eprintln!("crane: could not tell craned that {domain} left: {e}"),
        }
        return 0;
    }
    if rc != 0 {
        rep.line(&format!(
            "xl failed with status {rc}; giving {domain} its GPU back"
        ));
    } else {
        rep.line(&format!("{domain} still runs here; giving it its GPU back"));
    }
    match ask(settings, &rep, &Request::PostMigrateFailed { guest }) {
        Ok(d) if d.ok => rep.line(&match (d.gpu, d.waiting) {
            (_, Some(true)) => format!("{domain} waits for a free GPU"),
            (Some(g), _) => format!("{domain} runs on GPU {g} again"),
            (None, _) => format!("{domain} resumed"),
        }),
        Ok(d) => eprintln!(
            "crane: rollback of {domain} failed: {}",
            d.error.unwrap_or_default()
        ),
        Err(e) => eprintln!("crane: rollback of {domain} not possible: {e}"),
    }
    rc
}

/// Destination side: may one arrive, the real command, then receive.
fn arrive(settings: &Settings, args: &[String]) -> i32 {
    let rep = Reporter::default();
    let before: Option<BTreeSet<u32>> = match ask(settings, &rep, &Request::CheckReceive) {
        Ok(d) if !d.ok => {
            eprintln!(
                "crane: refusing the incoming domain: {}",
                d.error.unwrap_or_default()
            );
            return 1;
        }
        Ok(_) => match ask(settings, &rep, &Request::Domains) {
            Ok(d) => d.domains.map(|l| l.into_iter().map(|d| d.domid).collect()),
            Err(e) => {
                eprintln!("crane: {e}");
                None
            }
        },
        Err(e) => {
            // Never lose an arriving domain: receive it without crane.
            eprintln!(
                "crane: {e}; receiving without crane: the guest gets no GPU until craned \
                 receives it when it starts"
            );
            None
        }
    };
    let rc = run_real(settings, args, &rep, Watch::Nothing);
    let Some(before) = before else {
        return rc;
    };
    if rc != 0 {
        return rc;
    }
    let after = match ask(settings, &rep, &Request::Domains) {
        Ok(d) => d.domains.unwrap_or_default(),
        Err(e) => {
            eprintln!("crane: {e}");
            return rc;
        }
    };
    for d in after.into_iter().filter(|d| !before.contains(&d.domid)) {
        match ask(
            settings,
            &rep,
            &Request::Receive {
                guest: d.name.clone(),
            },
        ) {
            Ok(r) if r.managed == Some(false) => {}
            Ok(r) if r.ok && r.on_cpu == Some(true) => rep.line(&format!(
                "{} arrived; no GPU free, its programs run on its CPU until one frees",
                d.name
            )),
            Ok(r) if r.ok && r.waiting == Some(true) => rep.line(&format!(
                "{} arrived; no GPU free, it waits on the proxy",
                d.name
            )),
            Ok(r) if r.ok => rep.line(&format!(
                "{} arrived and runs on GPU {}{}",
                d.name,
                r.gpu.unwrap_or_else(|| "-".into()),
                stop_text("post-migration", r.stop_us)
            )),
            Ok(r) => eprintln!(
                "crane: receiving {} failed: {}",
                d.name,
                r.error.unwrap_or_default()
            ),
            Err(e) => eprintln!("crane: receiving {} failed: {e}", d.name),
        }
    }
    rc
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("crane: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = check_real_xl(&settings.real_xl) {
        eprintln!("crane: {e}");
        std::process::exit(127);
    }
    let rc = match plan(&args) {
        Plan::PassThrough => exec_real(&settings, &args),
        Plan::Migrate { domain, host } => depart(
            &settings,
            &args,
            &domain,
            &host,
            settings.migrate_mode,
            false,
            None,
        ),
        Plan::Save {
            domain,
            leave_running,
        } => {
            let file = save_file(&args);
            depart(
                &settings,
                &args,
                &domain,
                "save",
                Mode::StopAndCopy,
                leave_running,
                file.as_deref(),
            )
        }
        Plan::Receive => arrive(&settings, &args),
    };
    std::process::exit(rc);
}

/// The checkpoint file of `xl save [opts] DOMAIN FILE [CONFIG]`.
fn save_file(args: &[String]) -> Option<String> {
    let i = args.iter().position(|a| a == "save")?;
    args[i + 1..]
        .iter()
        .filter(|a| !a.starts_with('-'))
        .nth(1)
        .cloned()
}
