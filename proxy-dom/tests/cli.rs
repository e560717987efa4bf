//! The `crane-proxy` binary's command line (issue 17): `--help` and
//! `--version` answer and exit 0; an unknown option or an option without
//! its value is refused with status 2 and a message that names it, before
//! anything starts.

use std::process::{Command, Output};

fn proxy(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_crane-proxy"))
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("crane-proxy runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_and_version_exit_0() {
    let out = proxy(&["--help"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let help = text(&out.stdout);
    assert!(help.contains("--listen <ADDR>"), "{help}");
    assert!(help.contains("--tokens-from-xenstore"), "{help}");
    let out = proxy(&["--version"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text(&out.stdout).starts_with(&format!(
            "crane-proxy {} (wire protocol ",
            env!("CARGO_PKG_VERSION")
        )),
        "{out:?}"
    );
}

#[test]
fn usage_errors_exit_2_and_name_the_option() {
    let base = [
        "--listen",
        "tcp://127.0.0.1:0",
        "--token-file",
        "/nonexistent",
    ];
    for (extra, named) in [
        (&["--bogus-flag"][..], "--bogus-flag"),
        (&["--max-sessions"][..], "--max-sessions"),
        (&["--max-sessions", "0"][..], "--max-sessions"),
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let out = proxy(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {out:?}");
        let err = text(&out.stderr);
        assert!(err.contains(named), "{extra:?}: {err}");
        assert!(out.stdout.is_empty(), "{extra:?}: nothing listens");
    }
    let out = proxy(&["--token-file", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(text(&out.stderr).contains("--listen"), "{out:?}");
}
