//! Warm contexts (`crane_proxy::warm`): a session that takes the one made
//! ahead owes a replacement, and the replacement is made only once the
//! session's calls so far have run (its next Sync): a move's rebuild takes
//! the warm context and then writes every buffer, and on NVIDIA a context
//! being made slows every transfer on the device about eight-fold. Alone in
//! its test binary: the warm contexts are the process's.

mod common;

use std::time::{Duration, Instant};

use common::*;
use crane_proxy::warm;
use crane_wire::{Answer, Call, InfoKind};

const CL_CONTEXT_NUM_DEVICES: u32 = 0x1083;

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Makes a context as a rebuild does (posted, no Sync), then asks a
/// question with an answer that is not a Sync: the context was made (the
/// warm one taken) by the time the answer comes.
fn context_made(c: &mut Client) {
    let env = setup_posted(c);
    let (a, _) = c.call(
        Call::GetInfo {
            kind: InfoKind::Context,
            object: env.context,
            param: CL_CONTEXT_NUM_DEVICES,
        },
        &[],
    );
    assert_eq!(a, Answer::Info(0));
}

#[test]
fn a_taken_warm_context_is_replaced_after_the_sessions_next_sync() {
    let p = TestProxy::start(|_| {});
    // One ready per device, none being made.
    wait_for("the warm contexts made at start", || {
        let (ready, filling) = warm::counts();
        ready >= 1 && filling == 0
    });
    let (ready, _) = warm::counts();
    let mut c = p.client(TOKEN_A);
    context_made(&mut c);
    assert_eq!(
        warm::counts(),
        (ready - 1, 0),
        "taken, and not refilled before a Sync"
    );
    assert_eq!(c.sync(), vec![]);
    wait_for("the replacement after the Sync", || {
        warm::counts() == (ready, 0)
    });
    // A session that ends without a Sync still starts what it owes.
    let mut d = p.client(TOKEN_A);
    context_made(&mut d);
    assert_eq!(warm::counts(), (ready - 1, 0));
    d.kill();
    wait_for("the replacement after the session ended", || {
        warm::counts() == (ready, 0)
    });
}
