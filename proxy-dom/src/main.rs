//! The `crane-proxy` binary: parses the command line, starts the proxy,
//! prints where it listens, and serves until killed.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use crane_proxy::Proxy;
use crane_proxy::config;

fn main() -> anyhow::Result<()> {
    // Usage errors exit with status 2, --help and --version with 0 (clap).
    let config = config::Cli::parse().into_config();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    if config.tokens_from_xenstore {
        crane_proxy::xs_tokens::start(config.token_file.clone())?;
    }
    let config_capture = config.capture_stdout;
    let proxy = Proxy::start(config).context("crane-proxy cannot start")?;
    let mut out = std::io::stdout().lock();
    for a in proxy.addrs() {
        log::info!("listening on {a}");
        writeln!(out, "listening {a}")?;
    }
    out.flush()?;
    drop(out);
    if config_capture {
        // From here on fd 1 is the vendor's: kernels' printf output.
        if let Err(e) = crane_proxy::output::capture_stdout() {
            log::warn!("kernel printf output stays on stdout: it cannot be captured: {e}");
        }
    }
    proxy.wait();
    Ok(())
}
