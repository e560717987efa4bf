//! `crane-runner DEVICE` serves requests on DEVICE (init starts it in every
//! domain); installed as `crane-guest-run` (dom0), the same program is the
//! client of a domU's runner. See the library's documentation.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::ExitCode;

use crane_testbed_runner::{client, serve};

/// Set once the runner has re-run itself under the domain's profile.
const PROFILED: &str = "CRANE_RUNNER_PROFILED";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let name = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned();
    if name == "crane-guest-run" {
        return match client::Args::parse(&args[1..]) {
            Ok(a) => ExitCode::from(u8::try_from(client::main(&a)).unwrap_or(1)),
            Err(usage) => {
                eprintln!("{usage}");
                ExitCode::from(2)
            }
        };
    }
    let [_, device] = args.as_slice() else {
        eprintln!(
            "usage: crane-runner DEVICE (or, as crane-guest-run, DOMAIN TIMEOUT SCRIPT [START_TIMEOUT])"
        );
        return ExitCode::from(2);
    };
    // The domain's environment, as a login shell would have it (the GPU guest's
    // library path): the runner runs itself again under /etc/profile, once.
    if std::env::var_os(PROFILED).is_none() && Path::new("/etc/profile").exists() {
        let e = std::process::Command::new("sh")
            .arg("-c")
            .arg(". /etc/profile >/dev/null 2>&1; exec \"$0\" \"$@\"")
            .arg(&args[0])
            .arg(device)
            .env(PROFILED, "1")
            .exec();
        eprintln!("crane-runner: cannot run itself under /etc/profile: {e}");
    }
    match run(device) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crane-runner: {device}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(device: &str) -> std::io::Result<()> {
    let dev = crane_testbed_runner::open_raw(Path::new(device))?;
    let output = dev.try_clone()?;
    serve::serve(dev, output, &serve::Config::default())
}
