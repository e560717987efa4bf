//! Vendor quirks crane-proxy works around for its sessions (src/quirks.rs).
//! PoCL before 7.0 (Debian's 3.1 here) leaks a context reference per 1D
//! image buffer it destroys: before, every session that made one left its
//! vendor context alive after it ended, and the proxy grew by about 3 KiB of
//! heap per such session, forever. Sessions here make a context, a buffer
//! and 1D image buffers from it, and end; the proxy's heap must not grow
//! with their number. Alone in its test binary: the heap is the process's.

mod common;

use std::time::{Duration, Instant};

use common::*;
use crane_wire::{Call, ImageDesc, ImageFormat};

const CL_RGBA: u32 = 0x10B5;
const CL_FLOAT: u32 = 0x10DE;
const CL_MEM_OBJECT_IMAGE1D_BUFFER: u32 = 0x10F6;

/// Sessions per round: leaked, their contexts held ~290 KiB.
const SESSIONS: usize = 100;

/// Bytes the process's allocator has handed out and not had back.
fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    unsafe { libc::mallinfo2() }.uordblks
}

/// Waits until the proxy holds nothing for any session and no warm context
/// is being made (each session takes the warm one and owes a replacement).
fn settle(p: &TestProxy) {
    assert!(p.wait_idle(LONG), "the sessions were not torn down");
    let deadline = Instant::now() + LONG;
    while crane_proxy::warm::counts().1 != 0 {
        assert!(Instant::now() < deadline, "warm contexts still being made");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One session with a context, a buffer and two 1D image buffers made from
/// it; with `release`, the client releases them all (images first, as
/// crane's interposer does) before it goes, else the proxy's teardown does.
fn session(p: &TestProxy, release: bool) {
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);
    let buffer = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 4096, None);
    let mut images = Vec::new();
    for _ in 0..2 {
        let id = c.id();
        c.post(
            Call::CreateImage {
                id,
                context: env.context,
                flags: CL_MEM_READ_WRITE,
                format: ImageFormat {
                    order: CL_RGBA,
                    data_type: CL_FLOAT,
                },
                desc: ImageDesc {
                    image_type: CL_MEM_OBJECT_IMAGE1D_BUFFER,
                    width: 256,
                    height: 0,
                    depth: 0,
                    array_size: 0,
                    row_pitch: 0,
                    slice_pitch: 0,
                    num_mip_levels: 0,
                    num_samples: 0,
                    buffer,
                },
                props: vec![],
                init: false,
            },
            &[],
        );
        images.push(id);
    }
    assert_eq!(c.sync(), vec![], "the images are made");
    if release {
        for id in images.into_iter().chain([buffer, env.queue, env.context]) {
            c.post(Call::Release { id }, &[]);
        }
        assert_eq!(c.sync(), vec![]);
    }
}

/// How much the heap grew over `SESSIONS` sessions.
fn growth(p: &TestProxy, release: bool) -> isize {
    settle(p);
    let before = heap_in_use();
    for _ in 0..SESSIONS {
        session(p, release);
    }
    settle(p);
    heap_in_use() as isize - before as isize
}

#[test]
fn sessions_with_1d_image_buffers_leave_no_vendor_context_behind() {
    let p = TestProxy::start(|_| {});
    // The first sessions warm the allocator, the vendor and the proxy up.
    for i in 0..10 {
        session(&p, i % 2 == 0);
    }
    let released = growth(&p, true);
    let ended = growth(&p, false);
    eprintln!("heap growth over {SESSIONS} sessions: released {released} B, ended {ended} B");
    // A context kept per session is ~2.9 KiB: ~290 KiB over a round.
    let limit = 96 << 10;
    assert!(
        released < limit,
        "the heap grew by {released} bytes over {SESSIONS} sessions that released their objects"
    );
    assert!(
        ended < limit,
        "the heap grew by {ended} bytes over {SESSIONS} sessions torn down by the proxy"
    );
}
