//! End-to-end tier on two emulated Xen hosts with linked bridges: a PV proxy domU and an
//! HVM guest networked over the bridges, PCI passthrough of the stand-in device to the
//! guest around a live migration on the same host and then to the other host,
//! stop-and-copy (save/restore) of the PV proxy, and PCI passthrough of the proxy's own
//! stand-in device to the PV proxy.
//!
//! Ignored unless built with `CRANE_E2E=1` (see build.rs):
//! `CRANE_E2E=1 cargo test -p crane-test-vms --test xen_host -- --nocapture`.
//! Everything runs in one boot to stay within CI's budget; each phase's wall time is
//! printed and written to target/testbed/e2e-host0/timings.txt (host 1: e2e-host1).

use std::time::{Duration, Instant};

use crane_test_vms::{
    EmulatedHost, GUEST_INITRD, GUEST_KERNEL, GUEST_STANDIN_BDF, PROXY_STANDIN_BDF,
};

/// The guest's stand-in passthrough device: QEMU's e1000 at host slot 5.
const STANDIN_BDF: &str = GUEST_STANDIN_BDF;
const STANDIN_ID: &str = "8086:100e";

struct Tier {
    hosts: Vec<EmulatedHost>,
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

    /// Runs a script in dom0 of host 0 and returns its stdout; fails the test on a
    /// non-zero status.
    fn dom0(&self, script: &str) -> String {
        self.dom0_of(0, script)
    }

    fn dom0_of(&self, host: usize, script: &str) -> String {
        let out = self.hosts[host]
            .run(script, Duration::from_secs(240))
            .expect("dom0 command channel");
        assert!(
            out.success(),
            "dom0 of host {host}: script failed with {}:\n{script}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            out.stdout_text(),
            out.stderr_text()
        );
        out.stdout_text()
    }

    /// Runs a script in a domU of host 0 through its console runner; fails on a
    /// non-zero status.
    fn domu(&self, domain: &str, script: &str) -> String {
        self.domu_of(0, domain, script)
    }

    fn domu_of(&self, host: usize, domain: &str, script: &str) -> String {
        let out = self.hosts[host]
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
        self.wait_domu_of(0, domain, script, limit, check)
    }

    fn wait_domu_of(
        &self,
        host: usize,
        domain: &str,
        script: &str,
        limit: Duration,
        check: impl Fn(&str) -> bool,
    ) -> String {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < limit {
            if let Ok(out) = self.hosts[host].poll_domain(
                domain,
                script,
                Duration::from_secs(20),
                Duration::from_secs(4),
            ) {
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
        for host in &self.hosts {
            if let Ok(paths) = host.collect_logs() {
                for path in paths {
                    eprintln!("console log: {}", path.display());
                }
            }
        }
        let report: String = self
            .timings
            .iter()
            .map(|(name, d)| format!("{:>7.1}s  {name}\n", d.as_secs_f64()))
            .collect();
        let _ = std::fs::write(self.hosts[0].state_dir().join("timings.txt"), report);
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

/// The xl configuration of a domU booting the testbed's domU kernel and initramfs,
/// with one network interface on dom0's bridge at `address`. HVM domUs get no
/// emulated NIC (`type=vif`): their network is the PV front end, as the proxy's is.
fn domu_config(name: &str, kind: &str, address: &str) -> String {
    let hvm = if kind == "hvm" {
        "serial = \"pty\"\nvnc = 0\nsdl = 0\nvga = \"none\"\n\
         device_model_override = \"/usr/libexec/xen-qemu-system-i386\"\n"
    } else {
        ""
    };
    format!(
        "name = \"{name}\"\ntype = \"{kind}\"\nmemory = 256\nvcpus = 1\n\
         kernel = \"{GUEST_KERNEL}\"\nramdisk = \"{GUEST_INITRD}\"\n\
         extra = \"console=hvc0 quiet {FAST_BOOT} crane.hostname={name} crane.ip={address}\"\n\
         vif = [ \"bridge=xenbr0,type=vif,script=vif-crane\" ]\n\
         passthrough = \"enabled\"\non_crash = \"preserve\"\n{hvm}"
    )
}

fn create_domain(tier: &Tier, name: &str, kind: &str, address: &str) {
    let config = domu_config(name, kind, address);
    tier.dom0(&format!(
        "mkdir -p /etc/xen/crane && cat > /etc/xen/crane/{name}.cfg <<'CFG'\n{config}CFG\nxl create /etc/xen/crane/{name}.cfg"
    ));
}

fn wait_booted(tier: &Tier, name: &str) {
    tier.wait_domu(name, "hostname", Duration::from_secs(300), |out| {
        out.trim() == name
    });
}

/// Pings `target` from `domain` and returns the number of replies (of 3).
fn ping(tier: &Tier, domain: &str, target: &str) -> u32 {
    ping_on(tier, 0, domain, target)
}

/// Pings `target` from dom0 of `host`.
fn ping_dom0(tier: &Tier, host: usize, target: &str) -> u32 {
    let out = tier.hosts[host]
        .run(&format!("ping -c 3 -W 5 {target}"), Duration::from_secs(40))
        .expect("command channel");
    parse_ping_received(&out.stdout_text()).unwrap_or(0)
}

fn ping_on(tier: &Tier, host: usize, domain: &str, target: &str) -> u32 {
    let out = tier.hosts[host]
        .run_in_domain(
            domain,
            &format!("ping -c 3 -W 5 {target}"),
            Duration::from_secs(40),
        )
        .expect("command channel");
    parse_ping_received(&out.stdout_text()).unwrap_or_else(|| {
        panic!(
            "no ping summary from {domain}: {}{}",
            out.stdout_text(),
            out.stderr_text()
        )
    })
}

/// The "N packets received" figure of busybox ping's summary.
fn parse_ping_received(text: &str) -> Option<u32> {
    let line = text.lines().find(|l| l.contains("packets transmitted"))?;
    let field = line.split(',').find(|f| f.contains("received"))?;
    field.split_whitespace().next()?.parse().ok()
}

/// Kernel parameters that skip the AGP aperture scan and the early PCI quirks: each
/// probes PCI configuration space through emulated port I/O, which cost an HVM guest
/// 9 s of boot under software emulation.
const FAST_BOOT: &str = "iommu=noaperture pci=noearly";

const PROXY_IP: &str = "10.77.0.2";
const HOST1_DOM0_IP: &str = "10.77.0.11";
const MIGRATION_PORT: u16 = 8002;
const GUEST_IP: &str = "10.77.0.3";
const DOM0_IP: &str = "10.77.0.1";

#[test]
#[cfg_attr(
    not(crane_e2e),
    ignore = "boots Xen under QEMU; build with CRANE_E2E=1 to run"
)]
fn passthrough_around_live_migrations_and_pv_save_restore() {
    let started = Instant::now();
    let hosts =
        crane_test_vms::boot_owned_hosts("e2e-host", 2).expect("boot two emulated Xen hosts");
    let mut tier = Tier {
        hosts,
        started,
        phase_started: started,
        timings: Vec::new(),
    };
    tier.phase("build images and boot two Xen hosts");
    assert_eq!(
        ping_dom0(&tier, 1, DOM0_IP),
        3,
        "the hosts' bridges are linked"
    );

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

    // --- The proxy domU (PV) and the GPU guest (HVM), networked over dom0's bridge.
    create_domain(&tier, "proxy", "pv", &format!("{PROXY_IP}/24"));
    create_domain(&tier, "hvmguest", "hvm", &format!("{GUEST_IP}/24"));
    wait_booted(&tier, "proxy");
    wait_booted(&tier, "hvmguest");
    tier.phase("create PV proxy + HVM guest, wait for their runners");
    assert!(
        tier.dom0("ls /sys/class/net/xenbr0/brif").contains("vif"),
        "back ends joined the bridge"
    );
    assert_eq!(
        ping(&tier, "hvmguest", PROXY_IP),
        3,
        "guest reaches the proxy"
    );
    assert_eq!(ping(&tier, "proxy", DOM0_IP), 3, "proxy reaches dom0");
    tier.phase("ping guest -> proxy and proxy -> dom0");

    // --- HVM guest: attach, detach, live-migrate, attach again.
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
    // Bound to e1000 with a network interface of its own (eth0 is the PV front end).
    let standin_bound = format!(
        "readlink /sys/bus/pci/devices/0000:{slot}/driver && ls /sys/bus/pci/devices/0000:{slot}/net"
    );
    let bound = |out: &str| out.contains("drivers/e1000") && out.contains("eth");
    tier.wait_domu("hvmguest", &standin_bound, Duration::from_secs(60), bound);
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
    assert_eq!(
        ping(&tier, "hvmguest", PROXY_IP),
        3,
        "guest reaches the proxy after migrating"
    );
    tier.phase("live-migrate HVM guest to the same host");

    tier.dom0(&format!("xl pci-attach hvmguest {STANDIN_BDF}"));
    let lspci = tier.wait_domu(
        "hvmguest",
        "lspci -n",
        Duration::from_secs(60),
        sees_standin,
    );
    assert!(
        lspci.contains(&slot),
        "the stand-in comes back at {slot}: {lspci}"
    );
    tier.domu("hvmguest", "insmod $(grep /e1000.ko /etc/crane/modules)");
    tier.wait_domu("hvmguest", &standin_bound, Duration::from_secs(60), bound);
    tier.phase("re-attach after migration, driver reloaded");

    // --- PV proxy: stop-and-copy with xl save / xl restore keeps its memory.
    tier.domu("proxy", "echo crane-$$-marker > /run/marker");
    let marker = tier.domu("proxy", "cat /run/marker");
    tier.dom0("mkdir -p /var/lib/xen/save && xl save proxy /var/lib/xen/save/proxy.chk");
    assert!(domain(&parse_xl_list(&tier.dom0("xl list")), "proxy").is_none());
    tier.dom0("xl restore /var/lib/xen/save/proxy.chk && rm /var/lib/xen/save/proxy.chk");
    assert!(domain(&parse_xl_list(&tier.dom0("xl list")), "proxy").is_some());
    assert_eq!(tier.domu("proxy", "cat /run/marker"), marker);
    assert_eq!(
        ping(&tier, "hvmguest", PROXY_IP),
        3,
        "guest reaches the restored proxy"
    );
    tier.phase("xl save + xl restore of the PV proxy");

    // --- Cross-host live migration with xl's own transport: `-s ''` makes xl run the
    // "host" argument as the transport command, here socat's TCP connection to a
    // listener on host 1 that hands the socket to `xl migrate-receive`. No ssh.
    tier.domu("hvmguest", "rmmod e1000");
    tier.dom0(&format!("xl pci-detach hvmguest {STANDIN_BDF}"));
    tier.wait_domu("hvmguest", "lspci -n", Duration::from_secs(60), |out| {
        !sees_standin(out)
    });
    let uptime_before: f64 = tier
        .domu("hvmguest", "cut -d' ' -f1 /proc/uptime")
        .trim()
        .parse()
        .unwrap();
    tier.dom0_of(
        1,
        &format!(
            "setsid nc -l -p {MIGRATION_PORT} -e xl migrate-receive \
             > /var/log/xen/migrate-receive.log 2>&1 < /dev/null &"
        ),
    );
    tier.dom0(&format!(
        "xl migrate -s '' hvmguest 'socat -b 262144 - TCP:{HOST1_DOM0_IP}:{MIGRATION_PORT}'"
    ));
    assert!(
        domain(&parse_xl_list(&tier.dom0("xl list")), "hvmguest").is_none(),
        "gone from host 0"
    );
    assert!(
        domain(&parse_xl_list(&tier.dom0_of(1, "xl list")), "hvmguest").is_some(),
        "running on host 1"
    );
    let uptime_after: f64 = tier
        .domu_of(1, "hvmguest", "cut -d' ' -f1 /proc/uptime")
        .trim()
        .parse()
        .unwrap();
    assert!(
        uptime_after > uptime_before,
        "the guest kept running: {uptime_before} -> {uptime_after}"
    );
    assert_eq!(
        ping_on(&tier, 1, "hvmguest", PROXY_IP),
        3,
        "guest on host 1 reaches the proxy on host 0"
    );
    tier.phase("live-migrate HVM guest to host 1 over TCP");

    tier.dom0_of(
        1,
        &format!("xl pci-assignable-add {STANDIN_BDF} && xl pci-attach hvmguest {STANDIN_BDF}"),
    );
    tier.wait_domu_of(
        1,
        "hvmguest",
        "lspci -n",
        Duration::from_secs(60),
        sees_standin,
    );
    tier.domu_of(1, "hvmguest", "insmod $(grep /e1000.ko /etc/crane/modules)");
    tier.wait_domu_of(
        1,
        "hvmguest",
        &standin_bound,
        Duration::from_secs(60),
        bound,
    );
    tier.phase("attach host 1's stand-in, driver bound");

    // --- The proxy's own stand-in, passed through to a PV domain: pcifront shows it
    // at 0000:00:00.0 and the proxy's e1000 driver binds it. Last, because a PV
    // domain that had a device attached and detached crashes when restored (Linux
    // 6.1: xen_irq_resume meets a freed IRQ); the proxy is never saved in crane.
    tier.dom0(&format!(
        "xl pci-assignable-add {PROXY_STANDIN_BDF} && xl pci-attach proxy {PROXY_STANDIN_BDF}"
    ));
    assert!(tier.dom0("xl pci-list proxy").contains(PROXY_STANDIN_BDF));
    let proxy_lspci = tier.wait_domu("proxy", "lspci -n", Duration::from_secs(60), sees_standin);
    let (proxy_slot, _) = parse_lspci(&proxy_lspci)
        .into_iter()
        .find(|(_, id)| id == STANDIN_ID)
        .expect("stand-in present in the proxy");
    let proxy_bound = tier.wait_domu(
        "proxy",
        &format!("readlink /sys/bus/pci/devices/0000:{proxy_slot}/driver"),
        Duration::from_secs(60),
        |out| out.contains("drivers/e1000"),
    );
    assert!(proxy_bound.contains("e1000"), "{proxy_bound}");
    tier.dom0(&format!("xl pci-detach proxy {PROXY_STANDIN_BDF}"));
    // With no device left, pcifront may leave no PCI bus for lspci to read.
    tier.wait_domu(
        "proxy",
        "lspci -n 2>&1; true",
        Duration::from_secs(60),
        |out| !sees_standin(out),
    );
    tier.phase("attach + detach the proxy's own stand-in (PV passthrough)");

    tier.dom0_of(1, "xl destroy hvmguest");
    tier.dom0("xl destroy proxy");

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
    assert!(domu_config("g", "hvm", "10.0.0.1/24").contains("device_model_override"));
    assert!(!domu_config("g", "pv", "10.0.0.1/24").contains("device_model_override"));
    let ping = "PING 10.77.0.2 (10.77.0.2): 56 data bytes\n\n--- 10.77.0.2 ping statistics ---\n\
                3 packets transmitted, 2 packets received, 33% packet loss\n";
    assert_eq!(parse_ping_received(ping), Some(2));
    assert_eq!(
        parse_ping_received("ping: sendto: Network unreachable\n"),
        None
    );
}
