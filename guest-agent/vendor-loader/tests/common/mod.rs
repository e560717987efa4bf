//! Helpers shared by the integration tests: each test runs in a process of
//! its own (the loader's state, the link map and the descriptor table are
//! process-wide), and the fake vendor libraries are compiled with the
//! system C compiler.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const CHILD_TEST: &str = "CRANE_VL_CHILD_TEST";
const FIXTURE_DIR: &str = "CRANE_VL_FIXTURE_DIR";

/// Runs the test named `test` in a child process with `env` added, and
/// returns true in the parent (which then has nothing left to do). Returns
/// false in the child, which runs the test body.
pub fn in_own_process(test: &str, env: &[(&str, &str)]) -> bool {
    if std::env::var(CHILD_TEST).as_deref() == Ok(test) {
        return false;
    }
    let mut child = Command::new(std::env::current_exe().expect("the test binary has a path"));
    child
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_TEST, test)
        .envs(env.iter().copied());
    // Fixtures built by the parent are shared with the child.
    if let Some(fixtures) = FIXTURES.get() {
        child.env(FIXTURE_DIR, &fixtures.dir);
    }
    let output = child.output().expect("the test binary can run itself");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("--- {test} in its own process ---\n{stdout}{stderr}");
    assert!(
        output.status.success(),
        "{test} failed in its own process: {}",
        output.status
    );
    // An exact filter that matches nothing passes vacuously; make sure the
    // test did run.
    assert!(
        stdout.contains("1 passed"),
        "{test} did not run in its own process"
    );
    true
}

/// The compiled fake libraries.
pub struct Fixtures {
    pub dir: PathBuf,
    pub vendor: PathBuf,
    /// The same vendor, linked with `-z nodelete` so that it stays mapped.
    pub pinned_vendor: PathBuf,
    pub helper: PathBuf,
}

static FIXTURES: OnceLock<Fixtures> = OnceLock::new();

/// The fake libraries, compiled on first use (or taken from the parent
/// process).
pub fn fixtures() -> &'static Fixtures {
    FIXTURES.get_or_init(|| {
        let dir = match std::env::var_os(FIXTURE_DIR) {
            Some(dir) => PathBuf::from(dir),
            None => build_fixtures(),
        };
        Fixtures {
            vendor: dir.join("libfake_vendor.so"),
            pinned_vendor: dir.join("libfake_vendor_pinned.so"),
            helper: dir.join("libfake_helper.so"),
            dir,
        }
    })
}

fn build_fixtures() -> PathBuf {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("vendor-loader-fixtures");
    std::fs::create_dir_all(&dir).expect("the fixture directory can be created");
    compile(
        &sources.join("fake_helper.c"),
        &dir.join("libfake_helper.so"),
        &[],
    );
    compile(
        &sources.join("fake_vendor.c"),
        &dir.join("libfake_vendor.so"),
        &[],
    );
    compile(
        &sources.join("fake_vendor.c"),
        &dir.join("libfake_vendor_pinned.so"),
        &["-Wl,-z,nodelete"],
    );
    dir
}

fn compile(source: &Path, output: &Path, extra: &[&str]) {
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    // Build under a temporary name and rename, so that concurrent test
    // binaries never load a half-written library.
    let partial = output.with_extension(format!("so.{}", std::process::id()));
    let status = Command::new(&compiler)
        .args([
            "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-pthread", "-o",
        ])
        .arg(&partial)
        .arg(source)
        .args(extra)
        .status()
        .unwrap_or_else(|e| panic!("the C compiler {compiler} could not be run: {e}"));
    assert!(
        status.success(),
        "{compiler} failed on {}",
        source.display()
    );
    std::fs::rename(&partial, output).expect("the compiled fixture can be moved into place");
}

/// A scratch "device" directory with a one-page file `fake0` in it.
pub struct FakeDevice {
    pub dir: PathBuf,
    pub node: PathBuf,
}

impl FakeDevice {
    pub fn new(name: &str) -> FakeDevice {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("fake-dev-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the fake device directory can be created");
        let node = dir.join("fake0");
        std::fs::write(&node, vec![0u8; 4096]).expect("the fake device can be written");
        FakeDevice { dir, node }
    }
}

impl Drop for FakeDevice {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
