//! `crane status [--socket PATH] [--json]`: what craned manages on this host.
//! `crane --help` lists the commands, `crane status --help` the options.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use craned_control::{DEFAULT_SOCKET, Request, Status, call};

/// `crane`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "crane",
    version,
    about = "crane's operator command: asks craned, over its control socket, what it manages \
             on this host.",
    subcommand_required = true,
    arg_required_else_help = true,
    // A single-valued option given twice: the last one counts.
    args_override_self = true,
    max_term_width = 100
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Guests, their GPUs, their OpenCL processes and modes, the latest
    /// migration steps with stoppage; the GPU pool; the proxy
    Status {
        /// craned's control socket
        #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Print craned's status as JSON
        #[arg(long)]
        json: bool,
    },
}

fn print(st: &Status) {
    println!(
        "{:<20} {:>6}  {:<14} {:<14} apps (pid:mode)",
        "guest", "domid", "gpus", "migration"
    );
    for g in &st.guests {
        let apps: Vec<String> = g
            .apps
            .iter()
            .map(|a| format!("{}:{}", a.pid, a.mode))
            .collect();
        println!(
            "{:<20} {:>6}  {:<14} {:<14} {}",
            g.name,
            g.domid.map_or("-".into(), |d| d.to_string()),
            if g.gpus.is_empty() {
                "-".into()
            } else {
                g.gpus.join(",")
            },
            g.migration.as_deref().unwrap_or("-"),
            if apps.is_empty() {
                "-".into()
            } else {
                apps.join(" ")
            },
        );
    }
    for g in st.guests.iter().filter(|g| !g.recent.is_empty()) {
        println!();
        println!("{}: latest migration steps, oldest first", g.name);
        for line in &g.recent {
            println!("  {line}");
        }
    }
    println!();
    println!("{:<14} {:<6} {:<11} holder", "gpu", "role", "assignable");
    for g in &st.gpus {
        println!(
            "{:<14} {:<6} {:<11} {}",
            g.bdf,
            g.role,
            if g.assignable { "yes" } else { "no" },
            g.holder.as_deref().unwrap_or("(free)")
        );
    }
    if let Some(p) = &st.proxy {
        println!();
        println!(
            "proxy {} at {}: {}{}; restarts {}{}",
            p.domain.as_deref().unwrap_or("(remote)"),
            p.address,
            if p.healthy {
                "healthy"
            } else {
                "NOT answering"
            },
            p.domid.map_or(String::new(), |d| format!(", domain {d}")),
            p.restarts,
            p.last_error
                .as_deref()
                .map_or(String::new(), |e| format!("; last error: {e}")),
        );
    }
}

fn main() -> Result<()> {
    // Usage errors exit with status 2, --help and --version with 0 (clap).
    let Cmd::Status { socket, json } = Cli::parse().command;
    let done = call(&socket, &Request::Status, Duration::from_secs(10), |_| {})?;
    if !done.ok {
        bail!("craned: {}", done.error.unwrap_or_default());
    }
    if let Some(note) = &done.error {
        eprintln!("crane: {note}");
    }
    let st = done.status.context("craned sent no status")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&st)?);
    } else {
        print(&st);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("crane").chain(args.iter().copied()))
    }

    #[test]
    fn help_and_version() {
        Cli::command().debug_assert();
        for h in [&["--help"][..], &["-h"], &["help"]] {
            let e = parse(h).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::DisplayHelp, "{h:?}");
            assert!(e.to_string().contains("status"), "{e}");
        }
        for h in [&["status", "--help"][..], &["help", "status"]] {
            let e = parse(h).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::DisplayHelp, "{h:?}");
            let help = e.to_string();
            assert!(help.contains("--socket <PATH>"), "{help}");
            assert!(help.contains(DEFAULT_SOCKET), "{help}");
            assert!(help.contains("--json"), "{help}");
        }
        for v in ["--version", "-V"] {
            let e = parse(&[v]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::DisplayVersion);
            assert_eq!(
                e.to_string().trim(),
                format!("crane {}", env!("CARGO_PKG_VERSION"))
            );
        }
    }

    #[test]
    fn usage_errors_name_the_option() {
        let e = parse(&["status", "--bogus-flag"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--bogus-flag"), "{e}");
        let e = parse(&["status", "--jsn"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--json"), "a suggestion: {e}");
        let e = parse(&["--bogus-flag"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--bogus-flag"), "{e}");
        let e = parse(&["status", "--socket"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        assert!(e.to_string().contains("--socket"), "{e}");
        let e = parse(&["stats"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSubcommand);
        assert!(e.to_string().contains("status"), "a suggestion: {e}");
        // No command: the help, as an error.
        let e = parse(&[]).unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
        assert_eq!(e.exit_code(), 2);
    }

    /// The invocations of docs/operations.md and the testbed
    /// (test-vms/src/scenario.rs).
    #[test]
    fn real_invocations() {
        let Cmd::Status { socket, json } = parse(&["status"]).unwrap().command;
        assert_eq!(socket, PathBuf::from(DEFAULT_SOCKET));
        assert!(!json);
        let Cmd::Status { socket, json } = parse(&["status", "--json"]).unwrap().command;
        assert_eq!(socket, PathBuf::from(DEFAULT_SOCKET));
        assert!(json);
        let Cmd::Status { socket, json } = parse(&["status", "--socket", "/tmp/c.sock", "--json"])
            .unwrap()
            .command;
        assert_eq!(socket, PathBuf::from("/tmp/c.sock"));
        assert!(json);
        let Cmd::Status { socket, .. } =
            parse(&["status", "--socket=/tmp/d.sock"]).unwrap().command;
        assert_eq!(socket, PathBuf::from("/tmp/d.sock"));
    }
}
