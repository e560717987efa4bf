//! `cranectl agent ...`: drives a `crane-agent --standalone` (no Xen) over its
//! socket, `$CRANE_AGENT_SOCKET` or `$CRANE_RUN_DIR/agent.sock`. The agent
//! plays dom0 and hands back the raw XenStore values, parsed here with
//! crane-xs exactly as the dom0 service parses them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use crane_agent::standalone::{CtlReply, CtlRequest, call};
use crane_xs::message::{AgentState, AppResult, Outcome, Response};

fn opt(args: &[String], name: &str) -> Result<Option<String>> {
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(Some(
            args.get(i + 1)
                .with_context(|| format!("{name} needs a value"))?
                .clone(),
        )),
        None => Ok(None),
    }
}

fn print(reply: &CtlReply) -> Result<bool> {
    if let Some(s) = &reply.state {
        let st = AgentState::parse(s).context("the agent's state")?;
        println!("agent: {} (last request {})", st.state, st.last_seq);
    }
    let Some(r) = &reply.response else {
        return Ok(true);
    };
    let r = Response::parse(r).context("the agent's response")?;
    let phases: Vec<String> = r
        .phases
        .iter()
        .map(|p| format!("{} {:.1} ms", p.name, p.ms))
        .collect();
    println!(
        "request {}: {} in {:.1} ms ({})",
        r.seq,
        r.outcome.as_str(),
        r.ms,
        phases.join(", ")
    );
    for a in &reply.apps {
        let a = AppResult::parse(a).context("an app result")?;
        match &a.error {
            Some(e) => println!("  {}: {} in {:.1} ms: {e}", a.pid, a.outcome.as_str(), a.ms),
            None => println!("  {}: {} in {:.1} ms", a.pid, a.outcome.as_str(), a.ms),
        }
    }
    if let Some(rb) = r.rollback {
        println!("rollback: {rb:?}");
    }
    if let Some(e) = &r.error {
        println!("error: {e}");
    }
    Ok(matches!(
        r.outcome,
        Outcome::ReadyForDetach | Outcome::Resumed
    ))
}

pub fn run(args: &[String], json: bool, run_dir: &Path) -> Result<ExitCode> {
    let socket = std::env::var_os("CRANE_AGENT_SOCKET")
        .map_or_else(|| run_dir.join("agent.sock"), PathBuf::from);
    let deadline_ms = opt(args, "--deadline-ms")?
        .map(|v| v.parse::<u64>())
        .transpose()
        .context("--deadline-ms")?;
    let req = match args.first().map(String::as_str) {
        Some("prepare-migrate") => {
            let mode = opt(args, "--mode")?.unwrap_or_else(|| "stop-and-copy".into());
            let token = match opt(args, "--token-file")? {
                Some(f) => Some(
                    std::fs::read_to_string(&f)
                        .with_context(|| format!("reading {f}"))?
                        .trim()
                        .to_string(),
                ),
                None => None,
            };
            CtlRequest::PrepareMigrate {
                mode,
                proxy: opt(args, "--proxy")?,
                token,
                deadline_ms,
            }
        }
        Some("prepare-resume") => CtlRequest::PrepareResume { deadline_ms },
        Some("status") => CtlRequest::Status,
        _ => bail!("usage: cranectl agent prepare-migrate|prepare-resume|status [options]"),
    };
    let wait = Duration::from_millis(deadline_ms.unwrap_or(3_600_000)) + Duration::from_secs(180);
    let reply = call(&socket, &req, wait).with_context(|| {
        format!(
            "talking to crane-agent --standalone at {}",
            socket.display()
        )
    })?;
    if json {
        println!("{}", serde_json::to_string(&reply)?);
    }
    if !reply.ok {
        bail!("{}", reply.error.unwrap_or_default());
    }
    let done = if json { true } else { print(&reply)? };
    let ok = done
        && reply
            .response
            .as_deref()
            .and_then(|r| Response::parse(r).ok())
            .is_none_or(|r| matches!(r.outcome, Outcome::ReadyForDetach | Outcome::Resumed));
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
