//! End-to-end tier on one emulated Xen host: PCI passthrough of the stand-in device to an
//! HVM guest around a live migration, and stop-and-copy of a PV guest.
//!
//! Ignored unless built with `CRANE_E2E=1` (see build.rs):
//! `CRANE_E2E=1 cargo test -p crane-test-vms --test xen_host -- --nocapture`.
//! Everything runs in one boot to stay within CI's budget; each phase's wall time is
//! printed and written to target/testbed/e2e-host0/timings.txt.

use std::time::{Duration, Instant};

use crane_test_vms::{EmulatedHost, GUEST_INITRD, GUEST_KERNEL};

/// The stand-in passthrough device: QEMU's e1000 at host slot 5.
const STANDIN_BDF: &str = "0000:00:05.0";
const STANDIN_ID: &str = "8086:100e";

struct Tier {
    host: EmulatedHost,
    started: Instant,
    phase_started: Instant,
    timings: Vec<(String, Duration)>,
}

impl Tier {
    fn phase(&mut self, name: &str) {
        let now = Instant::now();
        self.timings
            .push((name.to_owned(), now - self.phase_started));
        eprintln!(
            "[{:>6.1}s] {name}: {:.1}s",
            self.started.elapsed().as_secs_f64(),
            (now - self.phase_started).as_secs_f64()
        );
        self.phase_started = now;
    }

    /// Runs a script in dom0 and returns its stdout; fails the test on a non-zero status.
    fn dom0(&self, script: &str) -> String {
        let out = self
            .host
            .run(script, Duration::from_secs(240))
            .expect("dom0 command channel");
        assert!(
            out.success(),
            "dom0 script failed with {}:\n{script}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            out.stdout_text(),
            out.stderr_text()
        );
        out.stdout_text()
    }

    /// Runs a script in a domU through its console runner; fails on a non-zero status.
    fn domu(&self, domain: &str, script: &str) -> String {
        let out = self
            .host
            .run_in_domain(domain, script, Duration::from_secs(60))
            .expect("dom0 command channel");
        assert!(
            out.success(),
            "script in {domain} failed with {}:\n{script}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            out.stdout_text(),
            out.stderr_text()
        );
        out.stdout_text()
    }

    /// Polls a domU until `check` accepts the output of `script` (guests under software
    /// emulation take seconds to boot and to probe a device).
    fn wait_domu(
        &self,
        domain: &str,
        script: &str,
        limit: Duration,
        check: impl Fn(&str) -> bool,
    ) -> String {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < limit {
            if let Ok(out) = self
                .host
                .run_in_domain(domain, script, Duration::from_secs(20))
            {
                last = format!(
                    "status {}: {}{}",
                    out.status,
                    out.stdout_text(),
                    out.stderr_text()
                );
                if out.success() && check(&out.stdout_text()) {
                    return out.stdout_text();
                }
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        panic!("{domain}: `{script}` did not reach the expected state in {limit:?}; last: {last}");
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        // Keep the domUs' consoles for the post-mortem when a check failed.
        if let Ok(paths) = self.host.collect_logs() {
            for path in paths {
                eprintln!("console log: {}", path.display());
            }
        }
        let report: String = self
            .timings
            .iter()
            .map(|(name, d)| format!("{:>7.1}s  {name}\n", d.as_secs_f64()))
            .collect();
        let _ = std::fs::write(self.host.state_dir().join("timings.txt"), report);
    }
}

/// One row of `xl list`.
#[derive(Debug)]
struct Domain {
    name: String,
    id: u32,
    memory_mib: u32,
}

fn parse_xl_list(text: &str) -> Vec<Domain> {
    text.lines()
        .skip_while(|l| !l.starts_with("Name"))
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Domain {
                name: f.first()?.to_string(),
                id: f.get(1)?.parse().ok()?,
                memory_mib: f.get(2)?.parse().ok()?,
            })
        })
        .collect()
}

fn domain<'a>(list: &'a [Domain], name: &str) -> Option<&'a Domain> {
    list.iter().find(|d| d.name == name)
}

/// `lspci -n` lines of the form `SLOT CLASS: VENDOR:DEVICE ...` → (slot, vendor:device).
fn parse_lspci(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.to_string(), f.get(2)?.to_string()))
        })
        .collect()
}

fn sees_standin(lspci: &str) -> bool {
    parse_lspci(lspci).iter().any(|(_, id)| id == STANDIN_ID)
}

fn guest_config(name: &str, kind: &str) -> String {
    let hvm = if kind == "hvm" {
        "serial = \"pty\"\nvnc = 0\nsdl = 0\nvga = \"none\"\n\
         device_model_override = \"/usr/libexec/xen-qemu-system-i386\"\n"
    } else {
        ""
    };
    format!(
        "name = \"{name}\"\ntype = \"{kind}\"\nmemory = 256\nvcpus = 1\n\
         kernel = \"{GUEST_KERNEL}\"\nramdisk = \"{GUEST_INITRD}\"\n\
         extra = \"console=hvc0 quiet crane.hostname={name}\"\n\
         passthrough = \"enabled\"\non_crash = \"preserve\"\n{hvm}"
    )
}

fn create_domain(tier: &Tier, name: &str, kind: &str) {
    let config = guest_config(name, kind);
    tier.dom0(&format!(
        "mkdir -p /etc/xen/crane && cat > /etc/xen/crane/{name}.cfg <<'CFG'\n{config}CFG\nxl create /etc/xen/crane/{name}.cfg"
    ));
    tier.wait_domu(name, "hostname", Duration::from_secs(180), |out| {
        out.trim() == name
    });
}

#[test]
#[cfg_attr(
    not(crane_e2e),
    ignore = "boots Xen under QEMU; build with CRANE_E2E=1 to run"
)]
fn hvm_passthrough_around_live_migration_and_pv_save_restore() {
    let started = Instant::now();
    let host = crane_test_vms::boot_owned_host("e2e-host0").expect("boot the emulated Xen host");
    let mut tier = Tier {
        host,
        started,
        phase_started: started,
        timings: Vec::new(),
    };
    tier.phase("build images and boot Xen + dom0");

    let info = tier.dom0("xl info");
    let caps = info
        .lines()
        .find_map(|l| l.strip_prefix("virt_caps"))
        .expect("xl info reports virt_caps");
    for cap in ["hvm", "hvm_directio", "hap"] {
        assert!(
            caps.split_whitespace().any(|c| c == cap),
            "virt_caps lacks {cap}: {caps}"
        );
    }
    let dom0_list = parse_xl_list(&tier.dom0("xl list"));
    assert_eq!(dom0_list.len(), 1, "only dom0 runs at first: {dom0_list:?}");
    assert_eq!(dom0_list[0].id, 0);
    assert_eq!(dom0_list[0].memory_mib, 1024);

    // --- HVM guest: attach, detach, live-migrate, attach again.
    create_domain(&tier, "hvmguest", "hvm");
    tier.phase("create HVM guest and wait for its runner");
    assert!(
        !sees_standin(&tier.domu("hvmguest", "lspci -n")),
        "stand-in visible before attach"
    );

    tier.dom0(&format!("xl pci-assignable-add {STANDIN_BDF}"));
    assert!(tier.dom0("xl pci-assignable-list").contains(STANDIN_BDF));
    tier.dom0(&format!("xl pci-attach hvmguest {STANDIN_BDF}"));
    assert!(tier.dom0("xl pci-list hvmguest").contains(STANDIN_BDF));
    let lspci = tier.wait_domu(
        "hvmguest",
        "lspci -n",
        Duration::from_secs(60),
        sees_standin,
    );
    let (slot, _) = parse_lspci(&lspci)
        .into_iter()
        .find(|(_, id)| id == STANDIN_ID)
        .expect("stand-in present");
    let driver = tier.wait_domu(
        "hvmguest",
        &format!("readlink /sys/bus/pci/devices/0000:{slot}/driver && ls /sys/bus/pci/devices/0000:{slot}/net"),
        Duration::from_secs(60),
        |out| out.contains("/e1000") && out.contains("eth"),
    );
    assert!(driver.contains("drivers/e1000"), "{driver}");
    tier.phase("attach stand-in e1000 to HVM guest, driver bound");

    // The guest gives up the device the way crane will: driver unloaded, then detached.
    tier.domu("hvmguest", "rmmod e1000");
    tier.dom0(&format!("xl pci-detach hvmguest {STANDIN_BDF}"));
    assert!(!tier.dom0("xl pci-list hvmguest").contains(STANDIN_BDF));
    tier.wait_domu("hvmguest", "lspci -n", Duration::from_secs(60), |out| {
        !sees_standin(out)
    });
    let uptime_before: f64 = tier
        .domu("hvmguest", "cut -d' ' -f1 /proc/uptime")
        .trim()
        .parse()
        .unwrap();
    let id_before = domain(&parse_xl_list(&tier.dom0("xl list")), "hvmguest")
        .unwrap()
        .id;
    tier.phase("unload driver and detach");

    tier.dom0("xl migrate -s '' hvmguest 'xl migrate-receive'");
    let after = parse_xl_list(&tier.dom0("xl list"));
    let migrated = domain(&after, "hvmguest").expect("hvmguest runs after migration");
    assert_ne!(migrated.id, id_before, "migration creates a new domain");
    assert_eq!(
        after
            .iter()
            .filter(|d| d.name.starts_with("hvmguest"))
            .count(),
        1,
        "{after:?}"
    );
    let uptime_after: f64 = tier
        .domu("hvmguest", "cut -d' ' -f1 /proc/uptime")
        .trim()
        .parse()
        .unwrap();
    assert!(
        uptime_after > uptime_before,
        "the guest kept running: {uptime_before} -> {uptime_after}"
    );
    tier.phase("live-migrate HVM guest to the same host");

    tier.dom0(&format!("xl pci-attach hvmguest {STANDIN_BDF}"));
    tier.wait_domu(
        "hvmguest",
        "lspci -n",
        Duration::from_secs(60),
        sees_standin,
    );
    tier.domu("hvmguest", "insmod $(grep /e1000.ko /etc/crane/modules)");
    tier.wait_domu(
        "hvmguest",
        "ls /sys/class/net",
        Duration::from_secs(60),
        |out| out.split_whitespace().any(|n| n.starts_with("eth")),
    );
    tier.phase("re-attach after migration, driver reloaded");
    tier.dom0(&format!(
        "xl pci-detach hvmguest {STANDIN_BDF} && xl destroy hvmguest"
    ));

    // --- PV guest: stop-and-copy with xl save / xl restore keeps its memory.
    create_domain(&tier, "pvguest", "pv");
    tier.phase("create PV guest and wait for its runner");
    tier.domu("pvguest", "echo crane-$$-marker > /run/marker");
    let marker = tier.domu("pvguest", "cat /run/marker");
    tier.dom0("mkdir -p /var/lib/xen/save && xl save pvguest /var/lib/xen/save/pvguest.chk");
    assert!(domain(&parse_xl_list(&tier.dom0("xl list")), "pvguest").is_none());
    tier.dom0("xl restore /var/lib/xen/save/pvguest.chk && rm /var/lib/xen/save/pvguest.chk");
    assert!(domain(&parse_xl_list(&tier.dom0("xl list")), "pvguest").is_some());
    assert_eq!(tier.domu("pvguest", "cat /run/marker"), marker);
    tier.phase("xl save + xl restore of the PV guest");

    let total = started.elapsed();
    eprintln!("whole tier: {:.1}s", total.as_secs_f64());
    assert!(
        total < Duration::from_secs(600),
        "the tier must fit in 10 minutes: {total:?}"
    );
}

#[test]
fn parses_xl_list_and_lspci() {
    let list = "Name                                        ID   Mem VCPUs\tState\tTime(s)\n\
                Domain-0                                     0  1024     2     r-----      97.3\n\
                hvmguest                                     2   255     1     r-----       1.5\n";
    let parsed = parse_xl_list(list);
    assert_eq!(parsed.len(), 2);
    assert_eq!(domain(&parsed, "hvmguest").unwrap().id, 2);
    let lspci = "00:02.0 ff80: 5853:0001 (rev 01)\n00:03.0 0200: 8086:100e (rev 03)\n";
    assert!(sees_standin(lspci));
    assert!(!sees_standin("00:02.0 ff80: 5853:0001 (rev 01)\n"));
    assert!(guest_config("g", "hvm").contains("device_model_override"));
    assert!(!guest_config("g", "pv").contains("device_model_override"));
}
