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

/// `cranectl agent ...`.
#[derive(Debug, clap::Subcommand)]
pub enum AgentCmd {
    /// Ask the agent to take the guest's applications off the GPU.
    PrepareMigrate {
        /// What happens to the applications meanwhile.
        #[arg(long, default_value = "stop-and-copy", value_parser = ["stop-and-copy", "remote"])]
        mode: String,
        /// crane-proxy's address, for --mode remote.
        #[arg(long, value_name = "ADDR")]
        proxy: Option<String>,
        /// A file holding the session token the proxy expects.
        #[arg(long, value_name = "F")]
        token_file: Option<PathBuf>,
        /// How long the applications may take, in ms.
        #[arg(long, value_name = "N")]
        deadline_ms: Option<u64>,
    },
    /// Ask the agent to bring the applications back onto the GPU.
    PrepareResume {
        /// How long the applications may take, in ms.
        #[arg(long, value_name = "N")]
        deadline_ms: Option<u64>,
        /// Where the applications go (see `cranectl local --device`), also
        /// those already in passthrough.
        #[arg(long, value_name = "SPEC")]
        device: Option<String>,
        /// No GPU is attached: load no GPU driver, wait for no device.
        #[arg(long)]
        no_gpu: bool,
    },
    /// The agent's state.
    Status,
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

pub fn run(cmd: AgentCmd, json: bool, run_dir: &Path) -> Result<ExitCode> {
    let socket = std::env::var_os("CRANE_AGENT_SOCKET")
        .map_or_else(|| run_dir.join("agent.sock"), PathBuf::from);
    let (req, deadline_ms) = match cmd {
        AgentCmd::PrepareMigrate {
            mode,
            proxy,
            token_file,
            deadline_ms,
        } => {
            let token = match token_file {
                Some(f) => Some(
                    std::fs::read_to_string(&f)
                        .with_context(|| format!("reading {}", f.display()))?
                        .trim()
                        .to_string(),
                ),
                None => None,
            };
            (
                CtlRequest::PrepareMigrate {
                    mode,
                    proxy,
                    token,
                    deadline_ms,
                },
                deadline_ms,
            )
        }
        AgentCmd::PrepareResume {
            deadline_ms,
            device,
            no_gpu,
        } => (
            CtlRequest::PrepareResume {
                deadline_ms,
                device,
                no_gpu,
            },
            deadline_ms,
        ),
        AgentCmd::Status => (CtlRequest::Status, None),
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
