//! The `crane-agent` binary's command line (issue 17): `--help` and
//! `--version` answer and exit 0; an unknown option or an option without its
//! value is refused with status 2 and a message that names it, before
//! anything is read or started.

use std::process::{Command, Output};

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_crane-agent"))
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("crane-agent runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_and_version_exit_0() {
    let out = agent(&["--help"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let help = text(&out.stdout);
    assert!(help.contains("--config <FILE>"), "{help}");
    assert!(help.contains("--standalone"), "{help}");
    let out = agent(&["--version"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        text(&out.stdout).trim(),
        format!("crane-agent {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn usage_errors_exit_2_and_name_the_option() {
    for (args, named) in [
        (&["--standalone", "--bogus-flag"][..], "--bogus-flag"),
        (&["--standalone", "--config"], "--config"),
    ] {
        let out = agent(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = text(&out.stderr);
        assert!(err.contains(named), "{args:?}: {err}");
    }
}
