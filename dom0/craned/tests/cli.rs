//! The `craned` and `crane` binaries' command lines (issue 17): `--help` and
//! `--version` answer and exit 0; an unknown option or an option without its
//! value is refused with status 2 and a message that names it, before
//! anything is read or contacted.

use std::process::{Command, Output};

fn run(exe: &str, args: &[&str]) -> Output {
    Command::new(exe)
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("the binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const CRANED: &str = env!("CARGO_BIN_EXE_craned");
const CRANE: &str = env!("CARGO_BIN_EXE_crane");

#[test]
fn help_and_version_exit_0() {
    for (exe, args, shows) in [
        (CRANED, &["--help"][..], "--config <FILE>"),
        (CRANE, &["--help"], "status"),
        (CRANE, &["status", "--help"], "--socket <PATH>"),
    ] {
        let out = run(exe, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert!(text(&out.stdout).contains(shows), "{args:?}: {out:?}");
    }
    for (exe, name) in [(CRANED, "craned"), (CRANE, "crane")] {
        let out = run(exe, &["--version"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(
            text(&out.stdout).trim(),
            format!("{name} {}", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn usage_errors_exit_2_and_name_the_option() {
    for (exe, args, named) in [
        (CRANED, &["--bogus-flag"][..], "--bogus-flag"),
        (CRANED, &["--config"], "--config"),
        (CRANE, &["status", "--bogus-flag"], "--bogus-flag"),
        (CRANE, &["status", "--socket"], "--socket"),
        (CRANE, &["stats"], "status"),
        (CRANE, &[], "status"),
    ] {
        let out = run(exe, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = text(&out.stderr);
        assert!(err.contains(named), "{args:?}: {err}");
    }
}
