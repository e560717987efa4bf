//! `craned [--config FILE]`: crane's dom0 service (see the library's docs).
//! `craned --help` lists the options.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use crane_libxl::Libxl;
use crane_xs::system::SystemStore;
use craned::config::{Config, DEFAULT_CONFIG};
use craned::proxy::connect_check;
use craned::service::Service;
use craned::{server, tokens};

/// `craned`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "craned",
    version,
    about = "crane's dom0 service: the GPU pool, the proxy domain, and the migration \
             choreography around xl migrate.",
    after_help = "Logging: RUST_LOG (default info). Status: `crane status`.",
    // A single-valued option given twice: the last one counts.
    args_override_self = true,
    max_term_width = 100
)]
struct Cli {
    /// The configuration file; without this option /etc/crane/craned.toml,
    /// where a missing file means the built-in settings
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

fn main() -> Result<()> {
    // Usage errors exit with status 2, --help and --version with 0 (clap).
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cfg = match &cli.config {
        Some(p) => Config::load(p, true)?,
        None => Config::load(&PathBuf::from(DEFAULT_CONFIG), false)?,
    };
    let secret = tokens::load_secret(&cfg.tokens.secret_file)?;
    if secret.is_none() {
        log::warn!(
            "no token secret at {}: remote mode is off, stop-and-copy only",
            cfg.tokens.secret_file.display()
        );
    }
    let store = SystemStore::open().context("connecting to xenstored")?;
    let xl = Libxl::open(&cfg.xl).context("opening libxl")?;
    let listener = server::bind(&cfg.socket)?;
    let tick = Duration::from_millis(cfg.tick_ms);
    log::info!(
        "craned: {} guests, {} GPUs in the pool, control socket {}",
        cfg.guests.len(),
        cfg.pool().len(),
        cfg.socket.display()
    );
    // A second connection carries the watch on the request tree, so that
    // watch events never interleave with the service's own replies.
    let wake: Option<Box<dyn crane_xs::XsWatch + Send>> = match SystemStore::open() {
        Ok(s) => Some(Box::new(s)),
        Err(e) => {
            log::warn!(
                "no second xenstored connection ({e}); XenStore requests are seen every tick"
            );
            None
        }
    };
    // The proxy supervisor's own connection and toolstack: it runs on a
    // thread of its own, beside requests that take minutes.
    let apart = match (SystemStore::open(), Libxl::open(&cfg.xl)) {
        (Ok(s), Ok(x)) => Some((s, x)),
        (Err(e), _) => {
            log::warn!(
                "no third xenstored connection ({e}); the proxy is supervised between requests only"
            );
            None
        }
        (_, Err(e)) => {
            log::warn!(
                "no second libxl context ({e}); the proxy is supervised between requests only"
            );
            None
        }
    };
    let service = Service::new(cfg, store, xl, secret, Box::new(connect_check));
    server::serve(service, listener, tick, wake, apart);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("craned").chain(args.iter().copied()))
    }

    #[test]
    fn help_and_version() {
        Cli::command().debug_assert();
        for h in ["--help", "-h"] {
            let e = parse(&[h]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::DisplayHelp);
            assert!(e.to_string().contains("--config <FILE>"), "{e}");
        }
        for v in ["--version", "-V"] {
            let e = parse(&[v]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::DisplayVersion);
            assert_eq!(
                e.to_string().trim(),
                format!("craned {}", env!("CARGO_PKG_VERSION"))
            );
        }
    }

    #[test]
    fn usage_errors_name_the_option() {
        let e = parse(&["--bogus-flag"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--bogus-flag"), "{e}");
        let e = parse(&["--confg", "/x"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--config"), "a suggestion: {e}");
        let e = parse(&["--config"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        assert!(e.to_string().contains("--config"), "{e}");
        let e = parse(&["/etc/crane/craned.toml"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
    }

    /// dom0/craned/dist/craned.service's invocation, and the testbed's.
    #[test]
    fn real_invocations() {
        let cli = parse(&["--config", "/etc/crane/craned.toml"]).unwrap();
        assert_eq!(cli.config, Some(PathBuf::from("/etc/crane/craned.toml")));
        let cli = parse(&["--config=/tmp/c.toml"]).unwrap();
        assert_eq!(cli.config, Some(PathBuf::from("/tmp/c.toml")));
        assert_eq!(parse(&[]).unwrap().config, None);
    }
}
