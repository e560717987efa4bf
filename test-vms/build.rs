//! `CRANE_E2E=1` at build time turns the end-to-end tests (which boot Xen under QEMU
//! and take minutes) from ignored into ordinary tests; plain `cargo test` stays fast.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(crane_e2e)");
    println!("cargo::rerun-if-env-changed=CRANE_E2E");
    if std::env::var("CRANE_E2E").as_deref() == Ok("1") {
        println!("cargo::rustc-cfg=crane_e2e");
    }
}
