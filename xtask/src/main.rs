//! `cargo xtask`: the project's build, test and demo driver.

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("testbed") => crane_test_vms::cli(&args[1..]),
        other => anyhow::bail!("unknown xtask command {other:?}"),
    }
}
