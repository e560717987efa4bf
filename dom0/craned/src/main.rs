//! `craned [--config FILE]`: crane's dom0 service (see the library's docs).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use crane_libxl::Libxl;
use crane_xs::system::SystemStore;
use craned::config::{Config, DEFAULT_CONFIG};
use craned::proxy::connect_check;
use craned::service::Service;
use craned::{server, tokens};

const USAGE: &str = "usage: craned [--config FILE]";

fn main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let mut config = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--config" => config = Some(PathBuf::from(args.next().context(USAGE)?)),
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
    let service = Service::new(cfg, store, xl, secret, Box::new(connect_check));
    server::serve(service, listener, tick, wake);
    Ok(())
}
