//! `cargo xtask fault-matrix [--e2e]`: runs every test the fault matrix of
//! docs/reliability.md names, and fails if one fails or no longer exists.
//!
//! The matrix in the document is the list: every `prefix::name` in its
//! section ("## Fault matrix" up to the next "## ") is a test, the prefix
//! telling where it lives (`daemon::` crane-agent's unit tests, `migrate::`
//! craned's, `proxy_death::` the interposer's integration test of that name,
//! ...; `{a,b,…}` lists several). With `--e2e`, the full end-to-end scenario
//! on the emulated Xen hosts runs after them (`CRANE_E2E_FULL=1`: its cells
//! marked "(full)" included).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Where the tests of a prefix live: the package and cargo's target
/// arguments.
fn home(prefix: &str) -> Option<(&'static str, Vec<String>)> {
    let lib = || vec!["--lib".to_string()];
    let test = |t: &str| vec!["--test".to_string(), t.to_string()];
    Some(match prefix {
        "daemon" | "apps" => ("crane-agent", lib()),
        "migrate" | "admin" | "proxy" | "server" => ("craned", lib()),
        "wrapper" => ("crane-xl", test("wrapper")),
        "remote" | "proxy_death" | "bad_input" | "corpus" | "devices" => {
            ("crane-opencl", test(prefix))
        }
        "sessions" => ("crane-proxy", test("sessions")),
        _ => return None,
    })
}

/// The matrix's section of the document.
fn section(doc: &str) -> Result<&str> {
    let start = doc
        .find("\n## Fault matrix")
        .context("docs/reliability.md has no \"## Fault matrix\" section")?;
    let rest = &doc[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    Ok(&rest[..end])
}

/// Every `prefix::name` named in backquotes, by prefix (names sorted, once
/// each); `prefix::{a,b,…}` gives a and b.
pub fn named(doc: &str) -> Result<BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (i, quoted) in section(doc)?.split('`').enumerate() {
        if i % 2 == 0 {
            continue;
        }
        let Some((prefix, rest)) = quoted.split_once("::") else {
            continue;
        };
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            continue;
        }
        let names: Vec<&str> = match rest.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            Some(list) => list.split(',').map(str::trim).collect(),
            None => vec![rest],
        };
        for n in names {
            let ok = !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if ok {
                out.entry(prefix.to_string())
                    .or_default()
                    .push(n.to_string());
            }
        }
    }
    for v in out.values_mut() {
        v.sort();
        v.dedup();
    }
    Ok(out)
}

/// What became of one named test in cargo's output: `Some(true)` passed,
/// `Some(false)` failed, `None` not run (no such test).
fn outcome(output: &str, name: &str) -> Option<bool> {
    let mut seen = None;
    for line in output.lines() {
        let Some(rest) = line.strip_prefix("test ") else {
            continue;
        };
        let Some((path, result)) = rest.split_once(" ... ") else {
            continue;
        };
        if path == name || path.ends_with(&format!("::{name}")) {
            let passed = result.trim() == "ok";
            seen = Some(seen.unwrap_or(true) && passed);
        }
    }
    seen
}

/// `cargo xtask fault-matrix`'s arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Then run the full end-to-end scenario on the emulated Xen hosts
    /// (`CRANE_E2E_FULL=1`: its cells marked "(full)" included).
    #[arg(long)]
    pub e2e: bool,
}

pub fn main(root: &Path, args: Args, cargo: impl Fn() -> Command) -> Result<()> {
    let Args { e2e } = args;
    let doc = std::fs::read_to_string(root.join("docs/reliability.md"))
        .context("reading docs/reliability.md")?;
    let tests = named(&doc)?;
    // One cargo run per package and target, every name of it as a filter.
    let mut runs: BTreeMap<(String, Vec<String>), Vec<String>> = BTreeMap::new();
    let mut unknown = Vec::new();
    for (prefix, names) in &tests {
        match home(prefix) {
            Some((pkg, target)) => runs
                .entry((pkg.to_string(), target))
                .or_default()
                .extend(names.iter().cloned()),
            None => unknown.push(prefix.clone()),
        }
    }
    if !unknown.is_empty() {
        bail!(
            "docs/reliability.md's fault matrix names tests under prefixes this command \
             does not know: {unknown:?} (xtask/src/matrix.rs, `home`)"
        );
    }
    let mut rows = Vec::new();
    for ((pkg, target), names) in &runs {
        eprintln!(
            "fault-matrix: {pkg} {}: {} test(s)",
            target.join(" "),
            names.len()
        );
        let out = cargo()
            .current_dir(root)
            .args(["test", "-p", pkg])
            .args(target)
            .arg("--")
            .args(names)
            .output()
            .with_context(|| format!("running cargo test -p {pkg}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        for n in names {
            rows.push((format!("{pkg} {n}"), outcome(&text, n)));
        }
        if !out.status.success() {
            eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let failed: Vec<&String> = rows
        .iter()
        .filter(|(_, r)| *r != Some(true))
        .map(|(n, _)| n)
        .collect();
    for (n, r) in &rows {
        let what = match r {
            Some(true) => "ok",
            Some(false) => "FAILED",
            None => "MISSING (no such test)",
        };
        println!("{what:>22}  {n}");
    }
    println!(
        "fault-matrix: {} test(s) named in docs/reliability.md, {} passed",
        rows.len(),
        rows.len() - failed.len()
    );
    if !failed.is_empty() {
        bail!(
            "{} of the matrix's tests failed or are missing",
            failed.len()
        );
    }
    if e2e {
        eprintln!("fault-matrix: the full end-to-end scenario (CRANE_E2E_FULL=1)");
        let st = cargo()
            .current_dir(root)
            .args(["xtask", "testbed", "e2e"])
            .env("CRANE_E2E_FULL", "1")
            .status()
            .context("running the end-to-end scenario")?;
        if !st.success() {
            bail!("the full end-to-end scenario failed");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matrix_names_its_tests() {
        let doc = "# R\n\n## Fault matrix\n\n| a | `daemon::x_y` and `proxy_death::{p1,…,p2}` |\n\
                   - `migrate::z`: e2e `agent_by_hand`, `std::fs` no\n\n## Fuzzing\n`migrate::after`\n";
        let t = named(doc).unwrap();
        assert_eq!(t["daemon"], ["x_y"]);
        assert_eq!(t["proxy_death"], ["p1", "p2"]);
        assert_eq!(t["migrate"], ["z"]);
        assert_eq!(t["std"], ["fs"]);
        assert!(home("std").is_none());
        assert!(named("no section").is_err());
    }

    #[test]
    fn outcomes_are_read_from_cargo_output() {
        let out = "test daemon::tests::x_y ... ok\ntest pingpong ... FAILED\n\
                   test pingpong_checkpointed ... ok\n";
        assert_eq!(outcome(out, "x_y"), Some(true));
        assert_eq!(outcome(out, "pingpong"), Some(false));
        assert_eq!(outcome(out, "gone"), None);
    }

    /// The real document: every prefix has a home.
    #[test]
    fn every_prefix_of_the_document_is_known() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let doc = std::fs::read_to_string(root.join("docs/reliability.md")).unwrap();
        let t = named(&doc).unwrap();
        assert!(t.values().map(Vec::len).sum::<usize>() > 40, "{t:?}");
        for p in t.keys() {
            assert!(home(p).is_some(), "unknown prefix {p}");
        }
    }
}
