//! Integration tier: `clinfo -a` (every property it knows, and the
//! NULL-platform defaults) prints through crane, preloaded, as a drop-in
//! libOpenCL.so.1 and installed as the ICD, what it prints natively, line for
//! line, except for these differences, which `expected` applies to the native
//! output and nothing else:
//!
//! 1. "Run native kernels" is "No": crane refuses clEnqueueNativeKernel (it
//!    cannot rebuild what native kernels capture), so clGetDeviceInfo clears
//!    CL_EXEC_NATIVE_KERNEL from CL_DEVICE_EXECUTION_CAPABILITIES.
//! 2. Preloaded and as a drop-in, the "ICD loader properties" block is absent:
//!    clinfo reads it through clGetICDLoaderInfoOCLICD, a function of the
//!    ocl-icd loader that crane replaces there, and crane answers NULL for it
//!    as for every extension function it does not wrap. As an ICD, ocl-icd is
//!    the loader and answers as natively.
//! 3. The platform's and devices' extension lists ("... Extensions" and
//!    "... Extensions with Version") lack the extensions whose functions crane
//!    does not wrap (`crane_opencl::extensions`; on PoCL cl_pocl_content_size
//!    and cl_khr_command_buffer). clinfo -a queries those extensions'
//!    properties whether advertised or not, so nothing else changes.

use std::process::Command;

// The library is a cdylib only (so that its statics are reached without the
// GOT); the extension filter is plain code, compiled into this test as well.
#[path = "../src/extensions.rs"]
#[allow(dead_code)]
mod extensions;
use extensions::{advertised, filter_string};

mod common;
use common::Mode;

const NATIVE_KERNELS: &str = "Run native kernels";
const LOADER_BLOCK: &str = "ICD loader properties";

fn clinfo(mode: Option<&Mode>, run_dir: &std::path::Path) -> String {
    let mut cmd = match mode {
        Some(m) => m.command("clinfo"),
        None => Command::new("clinfo"),
    };
    let out = cmd
        .arg("-a")
        .env("CRANE_RUN_DIR", run_dir)
        .output()
        .expect("run clinfo (Debian package clinfo)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "clinfo failed: {stderr}");
    assert!(stderr.is_empty(), "clinfo wrote to stderr: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

const EXTENSION_LISTS: [&str; 2] = ["  Platform Extensions", "  Device Extensions"];
const WITH_VERSION: &str = " with Version";

/// Where a clinfo line's value starts, after `label` and its padding.
fn value_column(line: &str, label: &str) -> usize {
    label.len() + line[label.len()..].len() - line[label.len()..].trim_start().len()
}

/// Difference 3 on one line, or on a "with Version" block (the line and the
/// continuation lines that follow it, pulled from `lines`).
fn filter_extensions<'a>(
    line: &str,
    lines: &mut std::iter::Peekable<impl Iterator<Item = &'a str>>,
    out: &mut Vec<String>,
) -> bool {
    let Some(label) = EXTENSION_LISTS.iter().find(|l| line.starts_with(**l)) else {
        return false;
    };
    let rest = &line[label.len()..];
    if rest.starts_with(WITH_VERSION) {
        let label = format!("{label}{WITH_VERSION}");
        let col = value_column(line, &label);
        let mut entries = vec![&line[col..]];
        while let Some(next) = lines.peek() {
            let is_continuation =
                next.len() > col && next[..col].trim().is_empty() && !next[col..].starts_with(' ');
            if !is_continuation {
                break;
            }
            entries.push(&next[col..]);
            lines.next();
        }
        let kept: Vec<&str> = entries
            .into_iter()
            .filter(|e| advertised(e.split(' ').next().unwrap_or_default().as_bytes()))
            .collect();
        for (i, e) in kept.iter().enumerate() {
            let head = if i == 0 {
                line[..col].to_string()
            } else {
                " ".repeat(col)
            };
            out.push(format!("{head}{e}"));
        }
        return true;
    }
    if !rest.starts_with(' ') {
        return false; // "... Extensions function suffix"
    }
    let col = value_column(line, label);
    let filtered = filter_string(&line.as_bytes()[col..]);
    out.push(format!(
        "{}{}",
        &line[..col],
        String::from_utf8(filtered).unwrap()
    ));
    true
}

/// The native output with crane's documented differences applied.
fn expected(native: &str, crane_is_the_loader: bool) -> String {
    let mut out = Vec::new();
    let mut lines = native.lines().peekable();
    while let Some(line) = lines.next() {
        if filter_extensions(line, &mut lines, &mut out) {
            continue;
        }
        if crane_is_the_loader
            && line.is_empty()
            && lines.peek().is_some_and(|l| *l == LOADER_BLOCK)
        {
            // The block runs to the end of the output or the next blank line.
            lines.next();
            while lines.peek().is_some_and(|l| !l.is_empty()) {
                lines.next();
            }
            continue;
        }
        match line.strip_suffix("Yes") {
            Some(head) if line.trim_start().starts_with(NATIVE_KERNELS) => {
                out.push(format!("{head}No"));
            }
            _ => out.push(line.to_string()),
        }
    }
    out.join("\n") + if native.ends_with('\n') { "\n" } else { "" }
}

fn compare(mode: &Mode, crane_is_the_loader: bool) {
    let scratch = common::scratch(&format!("clinfo-{}", mode.name));
    let run_dir = scratch.path();
    let native = clinfo(None, run_dir);
    assert!(
        native.contains("Number of platforms") && native.contains(NATIVE_KERNELS),
        "unexpected native clinfo output:\n{native}"
    );
    let want = expected(&native, crane_is_the_loader);
    let got = clinfo(Some(mode), run_dir);
    // It was crane that answered: it opened its control socket.
    assert!(
        run_dir.join("apps").exists(),
        "crane did not run inside clinfo ({})",
        mode.name
    );
    if got != want {
        let first = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(got.lines().count()));
        panic!(
            "clinfo through crane ({}) differs from native at line {}:\n  native:   {:?}\n  crane:    {:?}",
            mode.name,
            first + 1,
            want.lines().nth(first),
            got.lines().nth(first)
        );
    }
}

#[test]
fn clinfo_preload_matches_native() {
    compare(&Mode::preload(), true);
}

#[test]
fn clinfo_drop_in_matches_native() {
    compare(&Mode::drop_in("clinfo"), true);
}

#[test]
fn clinfo_icd_matches_native() {
    compare(&Mode::icd("clinfo"), false);
}

/// The filter changes only what it documents.
#[test]
fn the_filter_touches_only_its_three_differences() {
    let native = "Number of platforms 1\n  Device Name  cpu\n    Run native kernels   Yes\n  Max clock  2\n\nICD loader properties\n  ICD loader Name  OpenCL ICD Loader\n  ICD loader Version  2.3.1\n";
    assert_eq!(
        expected(native, false),
        native.replace("kernels   Yes", "kernels   No")
    );
    assert_eq!(
        expected(native, true),
        "Number of platforms 1\n  Device Name  cpu\n    Run native kernels   No\n  Max clock  2\n"
    );
}

#[test]
fn the_filter_drops_untracked_extensions_and_nothing_else() {
    let native = "  Platform Extensions            cl_khr_icd cl_pocl_content_size
  Platform Extensions with Version  cl_khr_icd           0x400000 (1.0.0)
                                    cl_pocl_content_size 0x400000 (1.0.0)
  Platform Extensions function suffix  POCL
  Device Extensions       cl_khr_spir   cl_khr_command_buffer cl_khr_fp64
  Device Extensions with Version  cl_khr_command_buffer  0x9000 (0.9.0)
                                  cl_khr_fp64            0x400000 (1.0.0)
  Built-in kernels with version   pocl.add.i8            0x402000 (1.2.0)
                                  cl_khr_command_buffer  0x402000 (1.2.0)
";
    let want = "  Platform Extensions            cl_khr_icd
  Platform Extensions with Version  cl_khr_icd           0x400000 (1.0.0)
  Platform Extensions function suffix  POCL
  Device Extensions       cl_khr_spir   cl_khr_fp64
  Device Extensions with Version  cl_khr_fp64            0x400000 (1.0.0)
  Built-in kernels with version   pocl.add.i8            0x402000 (1.2.0)
                                  cl_khr_command_buffer  0x402000 (1.2.0)
";
    assert_eq!(expected(native, false), want);
}
