//! `crane status [--socket PATH] [--json]`: what craned manages on this host.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use craned_control::{DEFAULT_SOCKET, Request, Status, call};

const USAGE: &str = "usage: crane status [--socket PATH] [--json]";

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
    let mut socket = PathBuf::from(DEFAULT_SOCKET);
    let mut json = false;
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("status") => {}
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return Ok(());
        }
        _ => bail!("{USAGE}"),
    }
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = PathBuf::from(args.next().context(USAGE)?),
            "--json" => json = true,
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
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
