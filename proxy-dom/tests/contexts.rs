//! A context the client releases is released on the vendor too, with the
//! pinned staging crane-proxy made for its transfers: before, each context
//! kept its staging pool (and with it the vendor context) until the session
//! ended, so a program making and dropping contexts one after the other
//! exhausted NVIDIA's contexts (about a hundred: every later creation failed
//! with CL_OUT_OF_HOST_MEMORY) and held up to the session's pinned budget.

mod common;

use common::*;
use crane_wire::{Call, Sync};

const MIB: u64 = 1 << 20;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

#[test]
fn released_contexts_give_back_their_pinned_staging() {
    let p = ProxyProcess::start(&[]);
    let mut c = Client::connect_tcp(p.tcp, TOKEN_A).expect("a session opens");
    let env = setup(&mut c);
    let size = 32 * MIB;
    let mut base = 0;
    for i in 0..12u8 {
        // A context of its own, as a test harness makes one per test.
        let ctx = Env {
            context: c.id(),
            queue: c.id(),
            ..env
        };
        c.post(
            Call::CreateContext {
                id: ctx.context,
                props: vec![CL_CONTEXT_PLATFORM, env.platform],
                devices: vec![env.device],
            },
            &[],
        );
        c.post(
            Call::CreateQueue {
                id: ctx.queue,
                context: ctx.context,
                device: env.device,
                props: vec![],
            },
            &[],
        );
        let buf = create_buffer(&mut c, &ctx, CL_MEM_READ_WRITE, size, None);
        let data = vec![i.wrapping_mul(37) ^ 0x5a; size as usize];
        c.post(
            Call::EnqueueWriteBuffer {
                queue: ctx.queue,
                buffer: buf,
                offset: 0,
                size,
                sync: Sync::default(),
            },
            &data,
        );
        assert!(read(&mut c, &ctx, buf, size, vec![]) == data, "round {i}");
        for id in [buf, ctx.queue, ctx.context] {
            c.post(Call::Release { id }, &[]);
        }
        assert_eq!(c.sync(), vec![]);
        if i == 1 {
            base = rss_kib(p.child.id());
        }
    }
    let grown = rss_kib(p.child.id()).saturating_sub(base);
    // Each context's staging is 32 MiB or more; leaked, ten of them held
    // the session's whole pinned budget (256 MiB).
    assert!(
        grown < 96 * 1024,
        "crane-proxy grew by {grown} KiB over ten contexts made and released"
    );
}
