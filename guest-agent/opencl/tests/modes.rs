//! Integration tier: unmodified applications, linked as usual against the ICD
//! loader's libOpenCL.so.1, get crane the two ways other than LD_PRELOAD
//! (tests/corpus.rs covers that one):
//!
//! * drop-in: a directory on LD_LIBRARY_PATH whose libOpenCL.so.1 is a symlink
//!   to libcrane_opencl.so;
//! * ICD: `cranectl install-icd` has moved the vendors' ICD files to crane's
//!   directory and put crane.icd in the loader's (here copies of them, named
//!   by OCL_ICD_VENDORS and CRANE_VENDORS_DIR, so /etc is never touched).
//!
//! In each, corpus programs suspended and resumed at random moments print
//! exactly what a native run prints.

use std::path::Path;
use std::process::Command;

mod common;
use common::{IcdDirs, Mode, apps, interrupted, library, long_enough, scratch};

/// glibc's complaint when a library lacks the symbol versions an application
/// was linked against.
const NO_VERSION_INFO: &str = "no version information available";

fn check(mode: &Mode, app: &str, iters: &str) {
    let (iters, n) = long_enough(app, iters, 3, |iters| {
        let run = interrupted(app, iters, 0x9e3779b97f4a7c15, 10, mode);
        assert!(
            !run.stderr.contains(NO_VERSION_INFO),
            "{app} ({}): {}",
            mode.name,
            run.stderr
        );
        (run.result, run.cycles)
    });
    eprintln!(
        "{app} ({}): {n} cycles at --iters {iters}, result identical to native",
        mode.name
    );
}

macro_rules! mode_tests {
    ($($drop_in:ident, $icd:ident, $app:literal, $iters:literal;)*) => {$(
        #[test]
        fn $drop_in() {
            check(&Mode::drop_in($app), $app, $iters);
        }

        #[test]
        fn $icd() {
            check(&Mode::icd($app), $app, $iters);
        }
    )*};
}

mode_tests! {
    drop_in_pingpong, icd_pingpong, "pingpong", "6000";
    drop_in_images, icd_images, "images", "2000";
    drop_in_events, icd_events, "events", "2000";
    drop_in_programs, icd_programs, "programs", "40";
}

/// The `OPENCL_x.y` version nodes a library defines (`objdump -p`).
fn version_nodes(lib: &Path) -> Vec<String> {
    let out = Command::new("objdump")
        .arg("-p")
        .arg(lib)
        .output()
        .expect("run objdump (binutils)");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let defs = text
        .split("Version definitions:")
        .nth(1)
        .unwrap_or_default()
        .split("\n\n")
        .next()
        .unwrap_or_default();
    defs.lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter(|v| v.starts_with("OPENCL_"))
        .map(str::to_string)
        .collect()
}

/// Applications linked against ocl-icd require its version nodes; a drop-in
/// libOpenCL.so.1 must define every one of them.
#[test]
fn library_defines_every_version_node_of_the_icd_loader() {
    let loader = libopencl_of(Command::new("ldd"));
    let want = version_nodes(Path::new(&loader));
    assert!(want.len() >= 7, "{} defines only {want:?}", loader);
    assert_eq!(version_nodes(&library()), want);
}

/// The libOpenCL.so.1 a corpus program loads, as `ldd` (run by `cmd`) reports.
fn libopencl_of(mut ldd: Command) -> String {
    let out = ldd.arg(apps().join("pingpong")).output().expect("run ldd");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains(NO_VERSION_INFO), "{text}");
    text.lines()
        .find_map(|l| l.trim().strip_prefix("libOpenCL.so.1 => "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("ldd shows no libOpenCL.so.1:\n{text}"))
        .to_string()
}

/// In drop-in mode the program loads crane as its libOpenCL.so.1, without
/// glibc complaining about symbol versions.
#[test]
fn drop_in_replaces_the_loader() {
    let mode = Mode::drop_in("ldd");
    let loaded = libopencl_of(mode.command("ldd"));
    assert_eq!(
        std::fs::canonicalize(&loaded).unwrap(),
        std::fs::canonicalize(library()).unwrap(),
        "libOpenCL.so.1 is {loaded}, not the drop-in"
    );
}

/// The platforms clinfo lists (`clinfo -l`).
fn platform_lines(mut cmd: Command) -> Vec<String> {
    let out = cmd.arg("-l").output().expect("run clinfo");
    assert!(
        out.status.success(),
        "clinfo -l failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("Platform #"))
        .map(str::to_string)
        .collect()
}

/// After install-icd the loader sees each vendor once, through crane (the
/// same platforms as natively, not crane's and the vendor's own); uninstall
/// puts the vendors' ICD files back unchanged.
#[test]
fn icd_mode_shows_each_platform_once_and_uninstall_restores() {
    let native = platform_lines(Command::new("clinfo"));
    assert!(!native.is_empty(), "no OpenCL platform natively");

    let scratch = scratch("icd-install");
    let root = scratch.path();
    let dirs = IcdDirs::new(root);
    let before: Vec<(String, Vec<u8>)> = IcdDirs::icd_names(&dirs.vendors)
        .into_iter()
        .map(|n| {
            let bytes = std::fs::read(dirs.vendors.join(&n)).unwrap();
            (n, bytes)
        })
        .collect();

    let out = dirs.cranectl(&["install-icd".into(), "--lib".into(), library().into()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(IcdDirs::icd_names(&dirs.vendors), ["crane.icd"]);
    let moved: Vec<String> = before.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(IcdDirs::icd_names(&dirs.crane), moved);

    let run_dir = root.join("run");
    let mut cmd = Command::new("clinfo");
    cmd.envs(dirs.env()).env("CRANE_RUN_DIR", &run_dir);
    assert_eq!(platform_lines(cmd), native);
    // It was crane that answered: it opened its control socket.
    assert!(
        run_dir.join("apps").exists(),
        "crane did not run inside clinfo"
    );

    let out = dirs.cranectl(&["uninstall-icd".into()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (name, bytes) in &before {
        assert_eq!(&std::fs::read(dirs.vendors.join(name)).unwrap(), bytes);
    }
    assert_eq!(IcdDirs::icd_names(&dirs.vendors), moved);
    assert!(!dirs.crane.exists());
}

/// As an ICD whose loader reads a folder holding only crane's `.icd`, with no
/// `CRANE_VENDORS_DIR` (the installer never ran), crane wraps the vendors of
/// /etc/OpenCL/vendors itself: the application sees the native platforms,
/// through crane, instead of none.
#[test]
fn icd_without_vendors_dir_wraps_the_system_vendors() {
    let native = platform_lines(Command::new("clinfo"));
    assert!(!native.is_empty(), "no OpenCL platform natively");

    let scratch = scratch("icd-system-vendors");
    let root = scratch.path();
    let loader_dir = root.join("loader");
    std::fs::create_dir_all(&loader_dir).unwrap();
    std::fs::write(
        loader_dir.join("crane.icd"),
        format!("{}\n", library().display()),
    )
    .unwrap();
    let run_dir = root.join("run");
    let mut cmd = Command::new("clinfo");
    cmd.env("OCL_ICD_VENDORS", &loader_dir)
        .env("CRANE_VENDORS_DIR", root.join("does-not-exist"))
        .env("CRANE_RUN_DIR", &run_dir);
    assert_eq!(platform_lines(cmd), native);
    assert!(
        run_dir.join("apps").exists(),
        "crane did not run inside clinfo"
    );
}

/// Preloaded in front of the application's loader, crane offers the
/// platforms that loader would: `OCL_ICD_FILENAMES` only where the loader
/// reads it (the Khronos loader adds those first; ocl-icd ignores them), and
/// a vendor named twice (a soname there, its file in an `.icd`) once. On the
/// accelerator machine (CUDA's Khronos loader) crane offered only the
/// `OCL_ICD_FILENAMES` vendor where the application natively saw it and the
/// system directory's.
#[test]
fn preloaded_crane_offers_the_platforms_the_loader_would() {
    let scratch = scratch("preloaded-filenames");
    for filenames in [
        "libpocl.so.2",
        "/nonexistent/libnothing.so",
        "/nonexistent/libnothing.so:libpocl.so.2",
    ] {
        let mut native = Command::new("clinfo");
        native.env("OCL_ICD_FILENAMES", filenames);
        let native = platform_lines(native);
        assert!(!native.is_empty(), "no OpenCL platform natively");
        let mut under = Command::new("clinfo");
        under
            .env("OCL_ICD_FILENAMES", filenames)
            .env("LD_PRELOAD", library())
            .env("CRANE_RUN_DIR", scratch.path().join("run"));
        assert_eq!(
            platform_lines(under),
            native,
            "OCL_ICD_FILENAMES={filenames}"
        );
    }
}
