//! End-to-end tier on two emulated Xen hosts with linked bridges, in one boot:
//!
//! - the Xen plumbing crane relies on: HVM, passthrough and HAP; the hosts' linked
//!   bridges; stop-and-copy (`xl save` / `xl restore`) of a small PV domain; the
//!   proxy domain created by the operator before craned runs;
//! - crane as an operator runs it (`crane_test_vms::scenario`): craned in every dom0
//!   (adopting the proxy domain and passing it its own GPU, publishing the guest's
//!   token to crane-proxy), crane-agent in the HVM GPU guest, an OpenCL program there
//!   under crane's drop-in `libOpenCL.so.1` on PoCL, moved by `xl migrate` through
//!   the wrapper to the same host and to the other host (remote mode: the program
//!   runs on crane-proxy while the guest has no GPU) and by `xl save` / `xl restore`
//!   (stop-and-copy); it must end with the result of a native run in the same guest;
//! - afterwards: the guest on host 1 reaches the proxy on host 0.
//!
//! Ignored unless built with `CRANE_E2E=1` (see build.rs):
//! `CRANE_E2E=1 cargo test -p crane-test-vms --test xen_host -- --nocapture`.
//! Each phase's wall time is printed and written to target/testbed/e2e-host0/timings.txt.

use std::time::Duration;

use crane_control::Mode;
use crane_test_vms::scenario::{self, App, GUEST, GUEST_IP, Move, PROXY, PROXY_IP, PV_GUEST};
use crane_test_vms::session::Session;
use crane_test_vms::xl::{find_domain, parse_ping_received, parse_xl_list};

const DOM0_IP: &str = "10.77.0.1";
/// The host of the PV stop-and-copy check.
const PV_HOST: usize = 1;

/// Pings `target` 3 times from dom0 of `host` (no domain) or from a domU; the replies.
/// A console request the domU never received (its runner never
/// acknowledged it, resends included: seen once on a re-created proxy domain
/// on a slow machine) is tried once more.
fn ping(s: &Session, host: usize, domain: Option<&str>, target: &str) -> u32 {
    let script = format!("ping -c 3 -W 5 {target}");
    let attempt = || {
        match domain {
            Some(domain) => s.try_domu(host, domain, &script, Duration::from_secs(40)),
            None => s.try_dom0(host, &script),
        }
        .expect("command channel")
    };
    let mut out = attempt();
    if out.status == 124 {
        eprintln!(
            "ping from {domain:?} on host {host}: no answer ({}); once more",
            out.stderr_text().trim()
        );
        out = attempt();
    }
    parse_ping_received(&out.stdout_text()).unwrap_or_else(|| {
        panic!(
            "no ping summary from {domain:?} on host {host}: {}{}",
            out.stdout_text(),
            out.stderr_text()
        )
    })
}

#[test]
#[cfg_attr(
    not(crane_e2e),
    ignore = "boots Xen under QEMU; build with CRANE_E2E=1 to run"
)]
fn crane_migrates_an_opencl_program_between_emulated_xen_hosts() {
    let mut s = Session::boot("e2e-host", 2).expect("boot two emulated Xen hosts");
    assert_eq!(
        ping(&s, 1, None, DOM0_IP),
        3,
        "the hosts' bridges are linked"
    );
    let info = s.dom0(0, "xl info").unwrap();
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
    let dom0_list = parse_xl_list(&s.dom0(0, "xl list").unwrap());
    assert_eq!(dom0_list.len(), 1, "only dom0 runs at first: {dom0_list:?}");
    assert_eq!(dom0_list[0].id, 0);
    assert_eq!(dom0_list[0].memory_mib, 1024);
    s.phase("Xen checks: HVM, passthrough, HAP; bridges linked");

    // --- The proxy domain, created by the operator before craned runs (craned
    // adopts it), and the HVM guest, which takes minutes to boot under emulation:
    // both boot meanwhile (the scenario finds them running).
    scenario::write_dom0_configs(&s).unwrap();
    s.dom0(0, &format!("xl create /etc/xen/crane/{PROXY}.cfg"))
        .unwrap();
    scenario::create_domain(&s, 0, &scenario::guest_config()).unwrap();
    // --- PV stop-and-copy: a small PV domain saved and restored with its memory, on
    // host 1, which has nothing else to do meanwhile: each emulated host has one CPU
    // (a core of the machine), so host 0 boots the proxy domain and the HVM guest
    // undisturbed while host 1 works.
    // (Before it ever holds a device: a PV domain that had a device attached and
    // detached crashes when restored, Linux 6.1 xen_irq_resume; docs/testbed.md.)
    scenario::create_domain(&s, PV_HOST, &scenario::pv_guest_config()).unwrap();
    scenario::wait_booted(&s, PV_HOST, PV_GUEST).unwrap();
    s.domu(PV_HOST, PV_GUEST, "echo crane-$$-marker > /run/marker")
        .unwrap();
    let marker = s.domu(PV_HOST, PV_GUEST, "cat /run/marker").unwrap();
    s.dom0(
        PV_HOST,
        &format!("mkdir -p /run/xen-save && xl save {PV_GUEST} /run/xen-save/pv.chk"),
    )
    .unwrap();
    assert!(
        find_domain(
            &parse_xl_list(&s.dom0(PV_HOST, "xl list").unwrap()),
            PV_GUEST
        )
        .is_none()
    );
    s.dom0(
        PV_HOST,
        "xl restore /run/xen-save/pv.chk && rm /run/xen-save/pv.chk",
    )
    .unwrap();
    assert!(
        find_domain(
            &parse_xl_list(&s.dom0(PV_HOST, "xl list").unwrap()),
            PV_GUEST
        )
        .is_some()
    );
    assert_eq!(
        s.domu(PV_HOST, PV_GUEST, "cat /run/marker").unwrap(),
        marker
    );
    assert_eq!(
        ping(&s, PV_HOST, Some(PV_GUEST), DOM0_IP),
        3,
        "the restored PV domain reaches host 0's dom0 across the linked bridges"
    );
    s.dom0(PV_HOST, &format!("xl destroy {PV_GUEST}")).unwrap();
    s.phase("PV domain: xl save + xl restore keep its memory");

    // --- crane: craned, crane-agent, crane-proxy, the wrapper; three moves.
    let app = App::default();
    let scope = scenario::Scope::from_env();
    eprintln!(
        "scenario: {scope:?} ({}=1 runs the full one)",
        scenario::FULL_ENV
    );
    let report = match scenario::run(&mut s, &app, scope) {
        Ok(report) => report,
        Err(e) => panic!("crane scenario: {e:#}"),
    };
    eprintln!("{}", report.summary());
    assert!(
        report.native.result.starts_with("RESULT pingpong "),
        "{:?}",
        report.native
    );
    assert_eq!(report.crane.result, report.native.result);
    assert_eq!(report.crane.status, 0);
    assert!(
        report.crane.stderr.contains("released after"),
        "{}",
        report.crane.stderr
    );
    let moves: Vec<Move> = report.migrations.iter().map(|m| m.how).collect();
    // The full scenario migrates once more on host 0, the proxy domain
    // destroyed during the transfer.
    let again: &[Move] = if scope == scenario::Scope::Full {
        &[Move::Live { from: 0, to: 0 }]
    } else {
        &[]
    };
    let want: Vec<Move> = [Move::Live { from: 0, to: 0 }]
        .iter()
        .chain(again)
        .chain(&[
            Move::Xenstore { from: 0, to: 1 },
            Move::SaveRestore { host: 1 },
        ])
        .copied()
        .collect();
    assert_eq!(moves, want);
    // The agent driven by hand: a malformed request rejected, a program inside
    // a long call that cannot leave the GPU in time and a module that will not
    // unload rolled back, then parked (driver unloaded, GPU detached and
    // attached by xl) and resumed, and an old request written again rejected.
    let by_hand = report.by_hand.as_deref().unwrap_or_default();
    let by_hand_wants: &[&str] = if scope == scenario::Scope::Full {
        &[
            "outcome=rejected",
            "inside a long call -> ",
            "outcome=failed",
            "rollback=complete",
            "outcome=ready-for-detach",
            "outcome=resumed",
            "written again -> ",
        ]
    } else {
        assert!(
            report.by_hand.is_none(),
            "the core scenario drove the agent by hand"
        );
        &[]
    };
    for want in by_hand_wants {
        assert!(by_hand.contains(want), "no {want} in:\n{by_hand}");
    }
    // The proxy domain paused: xl migrate was refused, and said why.
    let refused = report.refused.as_deref().unwrap_or_default();
    assert!(refused.contains("crane-proxy does not answer"), "{refused}");
    for m in &report.migrations {
        assert!(m.uptime_after > m.uptime_before, "{m:?}");
        match m.how {
            Move::Live { .. } | Move::Xenstore { .. } => assert!(
                m.modes_seen.contains(&Mode::Remote),
                "the program was never seen remote during {:?}: {:?}",
                m.how,
                m.modes_seen
            ),
            Move::SaveRestore { .. } => {}
        }
        match m.how {
            Move::Live { .. } => assert!(m.log.contains("for xl migrate (remote)"), "{}", m.log),
            Move::Xenstore { .. } if scope == scenario::Scope::Core => {
                assert!(m.log.contains("state=done"), "{}", m.log);
                assert!(!m.log.contains("no GPU free"), "{}", m.log);
            }
            Move::Xenstore { .. } => {
                // Refused by a destination without a free GPU, then waited on
                // the proxy for one, across a craned restart.
                for want in [
                    "refusing the incoming domain",
                    "state=failed",
                    "state=done",
                    "no GPU free",
                    "restarted",
                    "received after waiting",
                ] {
                    assert!(m.log.contains(want), "no {want:?} in:\n{}", m.log);
                }
            }
            Move::SaveRestore { .. } => {
                assert!(m.log.contains("for xl save (stop-and-copy)"), "{}", m.log)
            }
        }
        // craned reported how long the program was stopped each way.
        assert!(
            m.pre_stop_ms.is_some() && m.post_stop_ms.is_some(),
            "no stoppage figures for {:?}:\n{}",
            m.how,
            m.log
        );
        assert_eq!(m.modes_seen.last(), Some(&Mode::Passthrough), "{m:?}");
    }
    assert_ne!(
        report.migrations[0].domid_after,
        report.migrations[0].domid_before
    );
    // crane-proxy served the guest's sessions (one per remote move) and closed them.
    let opened = report
        .proxy
        .log
        .matches(&format!("tenant {GUEST}, client"))
        .count();
    let closed = report
        .proxy
        .log
        .matches(&format!("closed: tenant {GUEST}"))
        .count();
    assert!(
        opened >= 2 && closed >= 2,
        "crane-proxy's log:\n{}",
        report.proxy.log
    );

    // The proxy domain destroyed under the program: craned created it again and
    // told the guest, the program replayed its session there (its result, checked
    // above, is the native one).
    let death = report.proxy_death.as_deref().unwrap_or_default();
    for want in [
        "craned created it again",
        "took the session back",
        "on crane-proxy redirected there",
    ] {
        assert!(death.contains(want), "no {want:?} in:\n{death}");
    }

    // The proxy domain destroyed: craned created it again, with its GPU and the
    // guest's token, and crane-proxy answers.
    assert!(
        report.recreated.contains("craned created it again"),
        "{}",
        report.recreated
    );

    // --- Network across the hosts: the guest (now on host 1) and the proxy (host 0).
    assert!(
        s.dom0(1, "ls /sys/class/net/xenbr0/brif")
            .unwrap()
            .contains("vif"),
        "the guest's back end joined host 1's bridge"
    );
    assert_eq!(
        ping(&s, 1, Some(GUEST), PROXY_IP),
        3,
        "guest on host 1 reaches the proxy on host 0"
    );
    assert_eq!(
        ping(&s, 0, Some(PROXY), GUEST_IP),
        3,
        "proxy reaches the guest"
    );
    s.phase("pings across the hosts");

    s.dom0(1, &format!("xl destroy {GUEST}")).unwrap();
    s.dom0(0, "pkill craned; true").unwrap();
    s.dom0(0, &format!("xl destroy {PROXY}")).unwrap();

    let total = s.elapsed();
    eprintln!("whole tier: {:.1}s", total.as_secs_f64());
    // 10 to 12.5 minutes on an idle 2-core machine with the images cached, 16 minutes
    // in a clean clone's CI run (first downloads included); other builds on the same
    // cores slow it further, and some machines of the same kind emulate at half that
    // speed (18-21 minutes, 2026-11-25). Past 35 minutes something is wrong, not just
    // slow (the driver kills the tier at 40).
    assert!(
        total < Duration::from_secs(35 * 60),
        "the tier must fit in 35 minutes: {total:?}"
    );
}
