//! The shipped example configuration parses and states the defaults.

use std::path::Path;

use crane_agent::config::Config;

#[test]
fn shipped_config_is_the_defaults() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/agent.toml");
    let c = Config::load(&p, true).unwrap();
    let d = Config::default();
    assert_eq!(c.modules.unload, d.modules.unload);
    assert_eq!(c.device.holders, d.device.holders);
    assert_eq!(c.device.wait_for, d.device.wait_for);
    assert_eq!(c.default_deadline_ms, d.default_deadline_ms);
    assert_eq!(c.answer_grace_ms, d.answer_grace_ms);
    assert_eq!(c.rollback_timeout_ms, d.rollback_timeout_ms);
    assert_eq!(c.standalone.domid, d.standalone.domid);
}
