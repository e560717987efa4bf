//! The test corpus (testapps/): building it once per test binary, and the
//! native reference run each interrupted run is compared with.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::repo;

/// Builds the corpus once per test binary.
pub fn apps() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = repo().join("target/testapps");
        let st = Command::new("bash")
            .arg(repo().join("testapps/build.sh"))
            .arg(&out)
            .status()
            .expect("run testapps/build.sh");
        assert!(st.success(), "building the corpus failed");
        out
    })
}

pub fn result_line(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_default()
        .to_string()
}

pub fn native(app: &str, iters: &str) -> String {
    let out = Command::new(apps().join(app))
        .args(["--iters", iters])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{app} failed natively: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = result_line(&out.stdout);
    assert!(!r.is_empty(), "{app} printed no RESULT line");
    r
}

/// Tiny deterministic generator, so a failure can be replayed from its seed.
pub struct Rng(pub u64);
impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
