//! Link settings of `libcrane_opencl.so` that let it stand in for
//! `libOpenCL.so.1` and sit behind an ICD loader.
//!
//! * `-Bsymbolic-functions`: crane's own references to its exported `cl*`
//!   functions (the ICD dispatch table, clGetExtensionFunctionAddress) must
//!   bind to crane. Without it, in ICD mode the dynamic linker resolves them to
//!   the ICD loader's `libOpenCL.so.1`, which was loaded first, and the loader
//!   calls itself through crane's table for ever.
//! * `opencl-versions.map`: the `OPENCL_x.y` version nodes of ocl-icd's
//!   `libOpenCL.so.1`, which applications linked against it require.
//!
//! GNU ld refuses a second version script next to rustc's anonymous one (LLVM's
//! lld, rustc's default linker on x86_64 Linux, accepts it), so the version
//! script is only passed when a probe link with the same compiler, flags and
//! linker succeeds.

use std::path::PathBuf;
use std::process::{Command, Stdio};

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let map = dir.join("opencl-versions.map");
    println!("cargo:rerun-if-changed={}", map.display());
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcrane_opencl.so");
    let arg = format!("-Wl,--version-script={}", map.display());
    match probe(&arg) {
        Ok(()) => println!("cargo:rustc-cdylib-link-arg={arg}"),
        Err(why) => println!(
            "cargo:warning=libcrane_opencl.so is built without the OPENCL_x.y symbol \
             versions ({why}); as a drop-in libOpenCL.so.1, applications will print \
             \"no version information available\""
        ),
    }
}

/// Links an empty cdylib with the version script, the way rustc will link crane.
fn probe(version_arg: &str) -> Result<(), String> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR unset")?);
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let src = out.join("symver_probe.rs");
    std::fs::write(
        &src,
        "#[unsafe(no_mangle)] pub extern \"C\" fn crane_probe() {}\n",
    )
    .map_err(|e| format!("cannot write {}: {e}", src.display()))?;
    let mut cmd = Command::new(rustc);
    cmd.args([
        "--edition",
        "2024",
        "--crate-type",
        "cdylib",
        "--crate-name",
        "symver_probe",
    ])
    .arg("-o")
    .arg(out.join("libsymver_probe.so"))
    .arg(&src)
    .arg("-C")
    .arg(format!("link-arg={version_arg}"));
    if let Ok(t) = std::env::var("TARGET") {
        cmd.args(["--target", &t]);
    }
    if let Some(linker) = std::env::var_os("RUSTC_LINKER") {
        let mut opt = std::ffi::OsString::from("linker=");
        opt.push(linker);
        cmd.arg("-C").arg(opt);
    }
    if let Ok(flags) = std::env::var("CARGO_ENCODED_RUSTFLAGS") {
        cmd.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    }
    let res = cmd
        .stdout(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run rustc: {e}"))?;
    if res.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&res.stderr);
        Err(err
            .lines()
            .find(|l| l.contains("version"))
            .unwrap_or("the probe link failed")
            .trim()
            .to_string())
    }
}
