//! cranectl's command line: `--help` and `--version` work, and nothing an
//! operator mistypes is silently ignored (before, `cranectl remote PID
//! --proxy A --bogus-flag` ran as if the flag were not there).

use std::process::{Command, Output};

fn cranectl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cranectl"))
        .args(args)
        .env(
            "CRANE_RUN_DIR",
            std::env::temp_dir().join("cranectl-cli-test-none"),
        )
        .env_remove("CRANE_PROXY")
        .output()
        .expect("cranectl runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_and_version() {
    let o = cranectl(&["--help"]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for verb in [
        "list",
        "suspend",
        "resume",
        "remote",
        "local",
        "agent",
        "install-icd",
    ] {
        assert!(help.contains(verb), "{help}");
    }
    let o = cranectl(&["remote", "--help"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("--token-file"));
    let o = cranectl(&["--version"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("cranectl "));
}

#[test]
fn mistakes_are_errors_that_say_what_was_wrong() {
    for (args, says) in [
        (
            &["remote", "123", "--proxy", "tcp://h:1", "--bogus-flag"][..],
            "--bogus-flag",
        ),
        (&["remote", "123"][..], "--proxy"),
        (&["remote", "123", "--proxy"][..], "a value is required"),
        (&["suspend"][..], "PID|all"),
        (&["suspend", "1", "--deadline-m", "5"][..], "--deadline-ms"),
        (&["suspend", "1", "--deadline-ms", "soon"][..], "soon"),
        (
            &["agent", "prepare-migrate", "--mode", "live"][..],
            "stop-and-copy",
        ),
        (&["uninstall-icd", "--root"][..], "a value is required"),
        (&["frobnicate"][..], "frobnicate"),
        (&["list", "--watch", "0"][..], "between 0 and 86400"),
    ] {
        let o = cranectl(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn a_well_formed_command_runs() {
    // No such process: the command itself was understood and fails on it.
    let o = cranectl(&["suspend", "999999999", "--deadline-ms", "50"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("999999999"), "{}", stderr(&o));
    let o = cranectl(&["--json", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // --json after the verb works too.
    let o = cranectl(&["list", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_watched_listing_is_printed_again_only_when_it_changes() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cranectl"))
        .args(["list", "--watch", "0.05"])
        .env(
            "CRANE_RUN_DIR",
            std::env::temp_dir().join("cranectl-cli-test-none"),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("cranectl runs");
    // About ten listings of nothing: one printed.
    std::thread::sleep(std::time::Duration::from_millis(600));
    assert!(
        child.try_wait().unwrap().is_none(),
        "--watch ended by itself"
    );
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("pid").count(), 1, "{text}");
}
