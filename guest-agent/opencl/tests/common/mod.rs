//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The test programs (testapps/build.sh), built once per test binary.
#[allow(dead_code)] // not every test binary runs test programs
pub fn apps() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = repo().join("target/testapps");
        let st = Command::new("bash")
            .arg(repo().join("testapps/build.sh"))
            .arg(&out)
            .status()
            .expect("run testapps/build.sh");
        assert!(st.success(), "building the test programs failed");
        out
    })
}

/// The cdylib under test. `cargo test` builds this crate as an rlib only, so
/// the shared object is built here when it is missing (`cargo xtask test`
/// builds it first).
pub fn library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        // target/<profile>/deps/<test>-<hash> -> target/<profile>/libcrane_opencl.so
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
        let lib = profile_dir.join("libcrane_opencl.so");
        if !lib.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "-p", "crane-opencl"])
                .current_dir(repo());
            if profile_dir.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            cmd.env("CARGO_TARGET_DIR", profile_dir.parent().unwrap());
            assert!(
                cmd.status().unwrap().success(),
                "building libcrane_opencl.so failed"
            );
        }
        assert!(lib.exists(), "{} missing", lib.display());
        lib
    })
    .clone()
}
