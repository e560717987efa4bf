//! `crane-agent [--config FILE] [--standalone]`: the guest migration daemon.
//! Under Xen it talks to xenstored through the guest's xenbus device; with
//! `--standalone` it runs without Xen, driven by `cranectl agent ...`.
//! `crane-agent --help` lists the options.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use crane_agent::config::{Config, DEFAULT_CONFIG};
use crane_agent::daemon::Daemon;
use crane_agent::device::SystemProbe;
use crane_agent::migration::Agent;
use crane_agent::modules::KernelModules;
use crane_agent::standalone::Standalone;

/// `crane-agent`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "crane-agent",
    version,
    about = "crane's guest migration daemon: moves interposed OpenCL processes off the GPU and \
             back, driven by dom0 through XenStore.",
    after_help = "Logging: RUST_LOG (default info).",
    // A single-valued option given twice: the last one counts.
    args_override_self = true,
    max_term_width = 100
)]
struct Cli {
    /// The configuration file; without this option /etc/crane/agent.toml,
    /// where a missing file means the built-in settings
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Run without Xen: an in-process XenStore, driven by `cranectl agent ...`
    /// over the socket the configuration's [standalone] section names
    #[arg(long)]
    standalone: bool,
}

fn main() -> Result<()> {
    // Usage errors exit with status 2, --help and --version with 0 (clap).
    let Cli { config, standalone } = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
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
    let run_dir = cfg.run_dir.clone();
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
        let watcher = sa.guest();
        crane_agent::proxy_now::spawn(move || Ok(watcher), run_dir);
        Daemon::new(&guest, agent).run()?;
    } else {
        let store = crane_xs::system::SystemStore::open().context("connecting to XenStore")?;
        // Its own connection: the request loop may be held by a
        // prepare-resume waiting for the very proxy this names.
        crane_agent::proxy_now::spawn(crane_xs::system::SystemStore::open, run_dir);
        log::info!("watching crane/ in XenStore");
        Daemon::new(&store, agent).run()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("crane-agent").chain(args.iter().copied()))
    }

    #[test]
    fn help_and_version() {
        Cli::command().debug_assert();
        for h in ["--help", "-h"] {
            let e = parse(&[h]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::DisplayHelp);
            let help = e.to_string();
            assert!(help.contains("--config <FILE>"), "{help}");
            assert!(help.contains("--standalone"), "{help}");
        }
        for v in ["--version", "-V"] {
            let e = parse(&[v]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::DisplayVersion);
            assert_eq!(
                e.to_string().trim(),
                format!("crane-agent {}", env!("CARGO_PKG_VERSION"))
            );
        }
    }

    #[test]
    fn usage_errors_name_the_option() {
        let e = parse(&["--standalone", "--bogus-flag"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--bogus-flag"), "{e}");
        let e = parse(&["--stand-alone"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--standalone"), "a suggestion: {e}");
        let e = parse(&["--standalone", "--config"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        assert!(e.to_string().contains("--config"), "{e}");
        let e = parse(&["agent.toml"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
    }

    /// The invocations of guest-agent/agent/dist/crane-agent.service, the
    /// testbed (test-vms/files/crane-agent-start), README.md and
    /// tests/standalone.rs.
    #[test]
    fn real_invocations() {
        let cli = parse(&["--config", "/etc/crane/agent.toml"]).unwrap();
        assert_eq!(cli.config, Some(PathBuf::from("/etc/crane/agent.toml")));
        assert!(!cli.standalone);
        let cli = parse(&["--standalone", "--config", "agent.toml"]).unwrap();
        assert_eq!(cli.config, Some(PathBuf::from("agent.toml")));
        assert!(cli.standalone);
        let cli = parse(&["--standalone"]).unwrap();
        assert_eq!(cli.config, None);
        assert!(cli.standalone);
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.config, None);
        assert!(!cli.standalone);
    }
}
