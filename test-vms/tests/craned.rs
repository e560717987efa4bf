//! End-to-end tier for the dom0 service on one emulated Xen host: craned and
//! the xl wrapper in dom0, crane-agent in an HVM guest, the e1000 stand-in as
//! the pool's GPU. `xl migrate` through the wrapper must take the guest off
//! its device (otherwise Xen refuses log-dirty mode), migrate it, and give
//! the arrival a GPU again through craned's receive; `crane status` must say
//! so. Same-host live migration, as in xen_host.rs.
//!
//! Ignored unless built with `CRANE_E2E=1`:
//! `CRANE_E2E=1 cargo test -p crane-test-vms --test craned -- --nocapture`.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crane_images::{ImageSpec, Images, Paths};
use crane_test_vms::{
    EmulatedHost, GUEST_INITRD, GUEST_KERNEL, GUEST_STANDIN_BDF, Lifetime, host_configs,
    test_state_dir, workspace_root,
};

const RUNNER: &str = include_str!("../files/crane-runner");
const GUEST_RUN: &str = include_str!("../files/crane-guest-run");
const GUEST: &str = "gpuguest";
const STANDIN_ID: &str = "8086:100e";

const CRANED_TOML: &str = r#"
guests = ["gpuguest"]
tick_ms = 1000
agent_timeout_ms = 60000
[gpus]
pool = ["0000:00:05.0"]
[proxy]
address = "tcp://10.77.0.1:7000"
"#;

/// The guest agent in the test guest: no GPU modules or device nodes (the
/// stand-in's driver is left to the hot-unplug), no interposed processes.
const AGENT_TOML: &str = r#"
[modules]
unload = []
[device]
wait_for = []
"#;

fn build_binaries() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .current_dir(workspace_root())
        .args([
            "build",
            "--release",
            "-p",
            "craned",
            "-p",
            "crane-xl",
            "-p",
            "crane-agent",
        ])
        .status()
        .expect("running cargo build");
    assert!(
        st.success(),
        "building craned, the xl wrapper and crane-agent"
    );
    workspace_root().join("target/release")
}

fn images(bin: &std::path::Path) -> Images {
    let paths = Paths::in_workspace(&workspace_root());
    crane_test_vms::ensure_qemu(&paths).expect("QEMU");
    let builder = crane_images::Builder::new(paths).expect("image lock");
    let guest = ImageSpec::default()
        .text("/usr/sbin/crane-runner", RUNNER, 0o755)
        .service("/usr/sbin/crane-runner /dev/hvc0")
        .file(bin.join("crane-agent"), "/usr/sbin/crane-agent", 0o755)
        .text("/etc/crane/agent.toml", AGENT_TOML, 0o644)
        .hook(
            "60-crane-agent",
            "#!/bin/sh\nmkdir -p /run/crane\n\
             RUST_LOG=info setsid /usr/sbin/crane-agent --config /etc/crane/agent.toml \
             > /var/log/crane-agent.log 2>&1 < /dev/null &\n",
        );
    let guest_initrd = builder.domu("craned-guest", &guest).expect("guest image");
    let kernel = builder.kernel().expect("kernel");
    let dom0 = ImageSpec::default()
        .text("/usr/sbin/crane-runner", RUNNER, 0o755)
        .text("/usr/sbin/crane-guest-run", GUEST_RUN, 0o755)
        .file(&kernel, GUEST_KERNEL, 0o644)
        .file(&guest_initrd, GUEST_INITRD, 0o644)
        .service("/usr/sbin/crane-runner /dev/ttyS1")
        .file(bin.join("craned"), "/usr/sbin/craned", 0o755)
        .file(bin.join("crane"), "/usr/sbin/crane", 0o755)
        .file(bin.join("xl"), "/usr/local/sbin/xl", 0o755)
        .text("/etc/crane/craned.toml", CRANED_TOML, 0o644)
        .text(
            "/etc/crane/token-secret",
            "e2e-secret-0123456789abcdef\n",
            0o600,
        )
        .hook(
            "60-craned",
            "#!/bin/sh\nmkdir -p /run/crane\n\
             RUST_LOG=info setsid /usr/sbin/craned > /var/log/craned.log 2>&1 < /dev/null &\n",
        );
    Images {
        xen: builder.xen().expect("xen"),
        dom0_initrd: builder.dom0(&dom0).expect("dom0 image"),
        kernel,
        guest_initrd,
    }
}

fn dom0(host: &EmulatedHost, script: &str) -> String {
    let out = host
        .run(script, Duration::from_secs(300))
        .expect("dom0 command channel");
    assert!(
        out.success(),
        "dom0: {script} failed with {}:\n{}{}",
        out.status,
        out.stdout_text(),
        out.stderr_text()
    );
    out.stdout_text()
}

fn wait_dom0(
    host: &EmulatedHost,
    script: &str,
    limit: Duration,
    ok: impl Fn(&str) -> bool,
) -> String {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < limit {
        if let Ok(out) = host.run(script, Duration::from_secs(60)) {
            last = out.stdout_text() + &out.stderr_text();
            if out.success() && ok(&out.stdout_text()) {
                return out.stdout_text();
            }
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    panic!("`{script}` did not reach the expected state in {limit:?}; last: {last}");
}

#[test]
#[cfg_attr(
    not(crane_e2e),
    ignore = "boots Xen under QEMU; build with CRANE_E2E=1 to run"
)]
fn xl_migrate_through_the_wrapper_detaches_and_reattaches_the_gpu() {
    let bin = build_binaries();
    let images = images(&bin);
    let mut configs = host_configs(1, |i| test_state_dir(&format!("e2e-craned{i}")));
    configs[0].port_base += 60;
    let hosts = EmulatedHost::boot_all(&configs, &images, Lifetime::Owned).expect("boot");
    let host = &hosts[0];
    wait_dom0(
        host,
        "/usr/sbin/crane status --json",
        Duration::from_secs(60),
        |o| o.contains("\"guests\""),
    );

    let config = format!(
        "name = \"{GUEST}\"\ntype = \"hvm\"\nmemory = 256\nvcpus = 1\n\
         kernel = \"{GUEST_KERNEL}\"\nramdisk = \"{GUEST_INITRD}\"\n\
         extra = \"console=hvc0 quiet iommu=noaperture pci=noearly crane.hostname={GUEST} crane.ip=10.77.0.3/24\"\n\
         vif = [ \"bridge=xenbr0,type=vif,script=vif-crane\" ]\n\
         passthrough = \"enabled\"\non_crash = \"preserve\"\n\
         serial = \"pty\"\nvnc = 0\nsdl = 0\nvga = \"none\"\n\
         device_model_override = \"/usr/libexec/xen-qemu-system-i386\"\n"
    );
    dom0(
        host,
        &format!(
            "mkdir -p /etc/xen/crane && cat > /etc/xen/crane/{GUEST}.cfg <<'CFG'\n{config}CFG\n\
             xl create /etc/xen/crane/{GUEST}.cfg && \
             xl pci-assignable-add {GUEST_STANDIN_BDF} && xl pci-attach {GUEST} {GUEST_STANDIN_BDF}"
        ),
    );
    // craned sets up the guest's keys; the agent publishes its state.
    let state = wait_dom0(
        host,
        &format!("xenstore-read /local/domain/$(xl domid {GUEST})/crane/agent/state"),
        Duration::from_secs(400),
        |o| o.contains("state=passthrough"),
    );
    eprintln!("agent: {state}");
    let before: u32 = dom0(host, &format!("xl domid {GUEST}"))
        .trim()
        .parse()
        .unwrap();

    let out = host
        .run(
            &format!(
                "/usr/local/sbin/xl migrate -s '' {GUEST} '/usr/local/sbin/xl migrate-receive'"
            ),
            Duration::from_secs(300),
        )
        .expect("command channel");
    let log = out.stderr_text();
    eprintln!("{log}");
    assert!(
        out.success(),
        "xl migrate through the wrapper failed:\n{log}"
    );
    assert!(log.contains("prepare-migrate"), "{log}");
    assert!(
        log.contains(&format!("{GUEST_STANDIN_BDF} detached")),
        "{log}"
    );
    assert!(log.contains("arrived and runs on GPU"), "{log}");

    let after: u32 = dom0(host, &format!("xl domid {GUEST}"))
        .trim()
        .parse()
        .unwrap();
    assert_ne!(before, after, "the migration made a new domain");
    assert!(dom0(host, &format!("xl pci-list {GUEST}")).contains(&GUEST_STANDIN_BDF[5..]));
    let lspci = host
        .run_in_domain(GUEST, "lspci -n", Duration::from_secs(60))
        .expect("guest command channel")
        .stdout_text();
    assert!(
        lspci.contains(STANDIN_ID),
        "the guest sees its device again: {lspci}"
    );
    // On one host the source's "left" note comes after the receive's, so
    // the check is on the pool: the GPU is held by the guest again.
    let status = dom0(host, "/usr/sbin/crane status");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with(GUEST_STANDIN_BDF) && l.ends_with(GUEST)),
        "{status}"
    );
    let journal = dom0(
        host,
        "xenstore-ls /local/domain/0/crane/migrations 2>/dev/null; true",
    );
    assert!(
        journal.trim().is_empty(),
        "no migration left in the journal: {journal}"
    );
    dom0(host, &format!("xl destroy {GUEST}"));
}
