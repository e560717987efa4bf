//! Integration tier: crane's XenStore client (xenstore-rs for data, crane's
//! wire client for watches and permissions) against a real xenstored, as dom0
//! sees it: `CRANE_XENSTORE_SOCKET` names xenstored's socket (in the emulated
//! Xen host's dom0: `/run/xenstored/socket`). Without it the test says so and
//! passes: xenstored cannot run on a plain box (C xenstored needs the
//! hypervisor unless started with `-D`, and then crashes on the first write
//! because dom0 was never introduced; oxenstored needs libxenctrl's
//! hypervisor handle), see docs/xenstore-layout.md. Over the socket every
//! client is dom0, so permission enforcement for a guest is checked from
//! inside a guest by the end-to-end tier; what is checked here is the wire
//! form of every request and reply and what xenstored stores and reports.
//! Nodes are created under `/crane-test` and `/local/domain/65000` and removed
//! at the end.

use std::path::PathBuf;
use std::time::Duration;

use crane_xs::dom0::GuestChannel;
use crane_xs::layout::{AGENT, CRANE, REQUEST, absolute};
use crane_xs::message::{GuestState, MigrateMode, Op, Request};
use crane_xs::system::SystemStore;
use crane_xs::{Access, Perm, XsData, XsPerms, XsWatch};

#[test]
fn client_against_real_xenstored() {
    let Some(sock) = std::env::var_os("CRANE_XENSTORE_SOCKET").map(PathBuf::from) else {
        eprintln!("SKIPPED: set CRANE_XENSTORE_SOCKET to a running xenstored's socket");
        return;
    };
    // SAFETY: this test binary has a single test, and nothing else in the
    // process reads the environment while it is set; xenstore-rs reads
    // XENSTORED_PATH when SystemStore opens its connection.
    unsafe { std::env::set_var("XENSTORED_PATH", &sock) };
    let store = SystemStore::open().unwrap();
    let guest: u16 = 65000;
    store.rm("/crane-test").unwrap();
    store.rm(&crane_xs::layout::home(guest)).unwrap();

    // Plain data through xenstore-rs.
    store.write("/crane-test/a/b", "hello world").unwrap();
    assert_eq!(
        store.read("/crane-test/a/b").unwrap().as_deref(),
        Some("hello world")
    );
    assert_eq!(store.read("/crane-test/none").unwrap(), None);
    assert_eq!(store.directory("/crane-test").unwrap(), vec!["a"]);
    assert!(store.directory("/crane-test/none").unwrap().is_empty());
    store.rm("/crane-test/none").unwrap();

    // Permissions through the wire client: xenstored stores and reports them
    // in order, owner first.
    let perms = [Perm::new(0, Access::None), Perm::new(5, Access::Read)];
    store.set_perms("/crane-test/a", &perms).unwrap();
    assert_eq!(store.get_perms("/crane-test/a").unwrap(), perms);
    // Children created by dom0 inherit the parent's list.
    store.write("/crane-test/a/c", "x").unwrap();
    assert_eq!(store.get_perms("/crane-test/a/c").unwrap(), perms);
    let e = store.get_perms("/crane-test/none").unwrap_err();
    assert!(e.is_not_found(), "{e}");

    // Watches: fire once when set, then on changes at or below the path, and
    // with the watched path when a parent is removed.
    store.watch("/crane-test/a", "tok").unwrap();
    let ev = store.wait_event(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(
        (ev.path.as_str(), ev.token.as_str()),
        ("/crane-test/a", "tok")
    );
    assert_eq!(store.wait_event(Duration::from_millis(100)).unwrap(), None);
    store.write("/crane-test/a/b", "changed").unwrap();
    let ev = store.wait_event(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(ev.path, "/crane-test/a/b");
    store.write("/crane-test/elsewhere", "x").unwrap();
    assert_eq!(store.wait_event(Duration::from_millis(100)).unwrap(), None);
    store.rm("/crane-test").unwrap();
    let ev = store.wait_event(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(ev.path, "/crane-test/a");
    store.unwatch("/crane-test/a", "tok").unwrap();
    let e = store.unwatch("/crane-test/a", "tok").unwrap_err();
    assert!(matches!(e, crane_xs::XsError::Refused { .. }), "{e}");

    // A payload over XENSTORE_PAYLOAD_MAX is refused before it is sent (the
    // daemon would drop the connection), and the connection still works.
    assert!(store.write("/crane-test/big", &"x".repeat(5000)).is_err());
    assert!(store.watch(&format!("/{}", "p".repeat(5000)), "t").is_err());
    assert_eq!(store.read("/crane-test/big").unwrap(), None);

    // dom0's side of the crane protocol: the keys and their permissions.
    let ch = GuestChannel::new(&store, guest);
    ch.setup().unwrap();
    let dom0_guest_read = [Perm::new(0, Access::None), Perm::new(guest, Access::Read)];
    assert_eq!(
        store.get_perms(&absolute(guest, CRANE)).unwrap(),
        dom0_guest_read
    );
    assert_eq!(
        store.get_perms(&absolute(guest, AGENT)).unwrap(),
        [Perm::new(guest, Access::None)]
    );
    let req = ch
        .post(
            Op::PrepareMigrate(MigrateMode::Remote {
                proxy: "tcp://10.77.0.2:7000".into(),
                token: Some("tok".into()),
            }),
            Some(1000),
        )
        .unwrap();
    assert_eq!(req.seq, 1);
    let raw = store.read(&absolute(guest, REQUEST)).unwrap().unwrap();
    assert_eq!(Request::parse(&raw).unwrap(), req);
    assert_eq!(
        store.get_perms(&absolute(guest, REQUEST)).unwrap(),
        dom0_guest_read
    );
    // What the agent would publish, written here as dom0.
    store
        .write(
            &absolute(guest, "crane/agent/state"),
            "state=detached mode=remote last-seq=1",
        )
        .unwrap();
    let st = ch.agent_state().unwrap().unwrap();
    assert_eq!(
        st.state,
        GuestState::Detached(crane_xs::message::DetachKind::Remote)
    );
    assert_eq!(ch.next_seq().unwrap(), 2);
    assert!(ch.wait_answer(1, Duration::from_millis(200)).is_err());
    store
        .write(
            &absolute(guest, "crane/agent/response"),
            "seq=1 outcome=ready-for-detach ms=12.5 apps=0",
        )
        .unwrap();
    let r = ch.wait_answer(1, Duration::from_secs(5)).unwrap();
    assert_eq!(r.ms, 12.5);
    store.rm(&crane_xs::layout::home(guest)).unwrap();
}
