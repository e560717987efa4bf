//! The `crane-proxy` binary: parses the command line, starts the proxy,
//! prints where it listens, and serves until killed.

use std::io::Write;

use anyhow::Context;
use crane_proxy::Proxy;
use crane_proxy::config::{self, Command};

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let config = match config::parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(c)) => c,
        Ok(Command::Help) => {
            print!("{}", config::USAGE);
            return Ok(());
        }
        Ok(Command::Version) => {
            println!(
                "crane-proxy {} (wire protocol {}.{})",
                env!("CARGO_PKG_VERSION"),
                crane_wire::VERSION_MAJOR,
                crane_wire::VERSION_MINOR
            );
            return Ok(());
        }
        Err(e) => {
            eprintln!("crane-proxy: {e}");
            eprint!("{}", config::USAGE);
            std::process::exit(2);
        }
    };
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
