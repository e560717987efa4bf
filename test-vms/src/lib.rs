//! The emulated Xen testbed (work in progress).

/// Entry point for `cargo xtask testbed ARGS...`.
pub fn cli(args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("testbed not implemented yet: {args:?}")
}
