//! The exported `cl*` symbols of libcrane_opencl.so and the ICD dispatch table
//! come from one list (src/entry_points.rs); this checks that nothing is
//! exported that the table and clGetExtensionFunctionAddress do not know.

use std::process::Command;

mod common;

macro_rules! entry_points {
    ($($name:ident),* $(,)?) => {
        const NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}
include!("../src/entry_points.rs");

#[test]
fn every_exported_cl_symbol_is_in_the_dispatch_list() {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(common::library())
        .output()
        .expect("run nm (binutils)");
    assert!(out.status.success());
    let exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|s| s.starts_with("cl"))
        .map(str::to_string)
        .collect();
    assert!(
        exported.len() > 100,
        "only {} cl* symbols exported",
        exported.len()
    );
    let names = NAMES;
    for s in &exported {
        // The ICD entry point is reached through clGetExtensionFunctionAddress.
        if s == "clIcdGetPlatformIDsKHR" {
            continue;
        }
        assert!(
            names.contains(&s.as_str()),
            "{s} is exported but not in the dispatch list"
        );
    }
    for n in names {
        assert!(
            exported.iter().any(|s| s == n),
            "{n} is in the dispatch list but not exported"
        );
    }
}
