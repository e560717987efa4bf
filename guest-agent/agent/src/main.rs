//! `crane-agent [--config FILE] [--standalone]`: the guest migration daemon.
//! Under Xen it talks to xenstored through the guest's xenbus device; with
//! `--standalone` it runs without Xen, driven by `cranectl agent ...`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use crane_agent::config::{Config, DEFAULT_CONFIG};
use crane_agent::daemon::Daemon;
use crane_agent::device::SystemProbe;
use crane_agent::migration::Agent;
use crane_agent::modules::KernelModules;
use crane_agent::standalone::Standalone;

const USAGE: &str = "usage: crane-agent [--config FILE] [--standalone]";

fn main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let mut config = None;
    let mut standalone = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--config" => config = Some(PathBuf::from(args.next().context(USAGE)?)),
            "--standalone" => standalone = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let cfg = match &config {
        Some(p) => Config::load(p, true)?,
        None => Config::load(&PathBuf::from(DEFAULT_CONFIG), false)?,
    };
    let modules = KernelModules::new(&cfg.modules.root, cfg.modules.params.clone());
    let probe = SystemProbe {
        wait_for: cfg.device.wait_for.clone(),
        command: cfg.device.probe_command.clone(),
        command_timeout: Duration::from_millis(cfg.device.probe_timeout_ms),
    };
    let socket = cfg.standalone_socket();
    let domid = cfg.standalone.domid;
    let agent = Agent::new(cfg, modules, probe);
    if standalone {
        let sa = Standalone::new(domid).context("setting up the in-process XenStore")?;
        sa.serve(socket.clone())
            .with_context(|| format!("listening on {}", socket.display()))?;
        log::info!(
            "standalone: playing domain {domid}; cranectl agent ... on {}",
            socket.display()
        );
        let guest = sa.guest();
        Daemon::new(&guest, agent).run()?;
    } else {
        let store = crane_xs::system::SystemStore::open().context("connecting to XenStore")?;
        log::info!("watching crane/ in XenStore");
        Daemon::new(&store, agent).run()?;
    }
    Ok(())
}
