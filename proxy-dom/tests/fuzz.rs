//! Thousands of random and mutated frames, in separate sessions, against an
//! in-process proxy: every session ends with the connection closed, no
//! panic is caught, nothing is left behind, and a good session works after.
//! `CRANE_FUZZ_SESSIONS` changes the number of sessions (default 800).

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use crane_wire::{Call, HEADER_LEN, ImageDesc, ImageFormat, InfoKind, KernelArg, Rect, Sync};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng, rngs::StdRng};

const KERNEL: &str = "__kernel void k(__global int *p, int n) { if (get_global_id(0) < 4) p[get_global_id(0)] = n; }";

/// The ids the setup prefix names: platform 1, device 2, context 3, queue
/// 4, buffer 5, user event 6, program 7, kernel 8, image 9.
const IDS: u64 = 12;

fn setup_frames(out: &mut Vec<u8>, seq: &mut u64) {
    let mut push = |call: Call, payload: &[u8]| {
        *seq += 1;
        out.extend(frame(*seq, &call, payload));
    };
    push(
        Call::Hello {
            major: crane_wire::VERSION_MAJOR,
            minor: 0,
            token: TOKEN_A.into(),
            client: "fuzz".into(),
        },
        &[],
    );
    push(Call::GetPlatformIds { ids: vec![1] }, &[]);
    push(
        Call::GetDeviceIds {
            platform: 1,
            device_type: CL_DEVICE_TYPE_ALL,
            ids: vec![2],
        },
        &[],
    );
    push(
        Call::CreateContext {
            id: 3,
            props: vec![CL_CONTEXT_PLATFORM, 1],
            devices: vec![2],
        },
        &[],
    );
    push(
        Call::CreateQueue {
            id: 4,
            context: 3,
            device: 2,
            props: vec![],
        },
        &[],
    );
    push(
        Call::CreateBuffer {
            id: 5,
            context: 3,
            flags: CL_MEM_READ_WRITE,
            size: 4096,
            props: vec![],
            init: true,
        },
        &[0x11; 4096],
    );
    push(Call::CreateUserEvent { id: 6, context: 3 }, &[]);
    push(
        Call::CreateProgramWithSource {
            id: 7,
            context: 3,
            source: KERNEL.into(),
        },
        &[],
    );
    push(
        Call::BuildProgram {
            program: 7,
            devices: vec![2],
            options: String::new(),
        },
        &[],
    );
    push(
        Call::CreateKernel {
            id: 8,
            program: 7,
            name: "k".into(),
        },
        &[],
    );
    push(
        Call::CreateImage {
            id: 9,
            context: 3,
            flags: CL_MEM_READ_WRITE,
            format: ImageFormat {
                order: 0x10B5,
                data_type: 0x10D2,
            },
            desc: ImageDesc {
                image_type: 0x10F1,
                width: 8,
                height: 8,
                depth: 0,
                array_size: 0,
                row_pitch: 0,
                slice_pitch: 0,
                num_mip_levels: 0,
                num_samples: 0,
                buffer: 0,
            },
            props: vec![],
            init: false,
        },
        &[],
    );
}

/// A random call over the setup's ids, with sizes mostly small and
/// sometimes absurd; and its payload.
fn random_call(rng: &mut StdRng) -> (Call, Vec<u8>) {
    let any = |rng: &mut StdRng| rng.random_range(0..=IDS);
    // The right kind of object most of the time, so that calls get past
    // the id checks and reach the vendor.
    let pick = |rng: &mut StdRng, right: &[u64]| {
        if rng.random_range(0..8) == 0 {
            rng.random_range(0..=IDS)
        } else {
            *right.choose(rng).unwrap()
        }
    };
    let (queue, mem, buffer, image, kernel, event, context, program) = (
        &[4][..],
        &[5, 9][..],
        &[5][..],
        &[9][..],
        &[8][..],
        &[6][..],
        &[3][..],
        &[7][..],
    );
    let size = |rng: &mut StdRng| match rng.random_range(0..10) {
        0 => rng.random(),
        1 => 0,
        _ => rng.random_range(1..8192),
    };
    let dims = |rng: &mut StdRng| {
        [
            rng.random_range(0..16),
            rng.random_range(0..16),
            rng.random_range(0..3),
        ]
    };
    let sync = |rng: &mut StdRng| Sync {
        waits: (0..rng.random_range(0..3))
            .map(|_| rng.random_range(0..=IDS))
            .collect(),
        event: if rng.random() {
            rng.random_range(10..40)
        } else {
            0
        },
    };
    let small = |rng: &mut StdRng| {
        (0..rng.random_range(0..16))
            .map(|_| rng.random())
            .collect::<Vec<u8>>()
    };
    match rng.random_range(0..28) {
        0 => (
            Call::GetInfo {
                kind: [
                    InfoKind::Platform,
                    InfoKind::Device,
                    InfoKind::Context,
                    InfoKind::Queue,
                    InfoKind::Mem,
                    InfoKind::Image,
                    InfoKind::Program,
                    InfoKind::Kernel,
                    InfoKind::Event,
                    InfoKind::KernelArg { index: 0 },
                    InfoKind::ProgramBuild { device: 2 },
                    InfoKind::KernelWorkGroup { device: 2 },
                    InfoKind::EventProfiling,
                ]
                .choose(rng)
                .unwrap()
                .clone(),
                object: any(rng),
                param: rng.random_range(0x1000..0x1300),
            },
            vec![],
        ),
        1 => {
            let n = size(rng) % 100_000;
            let init = rng.random();
            (
                Call::CreateBuffer {
                    id: rng.random_range(10..40),
                    context: pick(rng, context),
                    flags: rng.random_range(0..64),
                    size: if init { n } else { size(rng) },
                    props: vec![],
                    init,
                },
                if init { vec![7; n as usize] } else { vec![] },
            )
        }
        2 => (
            Call::CreateSubBuffer {
                id: rng.random_range(10..40),
                parent: pick(rng, buffer),
                flags: rng.random_range(0..8),
                origin: size(rng),
                size: size(rng),
            },
            vec![],
        ),
        3 => (
            Call::SetKernelArg {
                kernel: pick(rng, kernel),
                index: rng.random_range(0..4),
                arg: match rng.random_range(0..4) {
                    0 => KernelArg::Bytes(small(rng)),
                    1 => KernelArg::Local(size(rng)),
                    2 => KernelArg::Object(pick(rng, mem)),
                    _ => KernelArg::NullObject,
                },
            },
            vec![],
        ),
        4 => (
            Call::EnqueueNdRange {
                queue: pick(rng, queue),
                kernel: pick(rng, kernel),
                dims: rng.random_range(0..5),
                offset: None,
                global: [rng.random_range(0..4096), 1, 1],
                local: if rng.random() {
                    Some([rng.random_range(0..64), 1, 1])
                } else {
                    None
                },
                sync: sync(rng),
            },
            vec![],
        ),
        5 => {
            let n = size(rng) % 10_000;
            (
                Call::EnqueueWriteBuffer {
                    queue: pick(rng, queue),
                    buffer: pick(rng, buffer),
                    offset: size(rng) % 8192,
                    size: n,
                    sync: sync(rng),
                },
                vec![3; n as usize],
            )
        }
        6 => (
            Call::EnqueueReadBuffer {
                queue: pick(rng, queue),
                buffer: pick(rng, buffer),
                offset: size(rng),
                size: size(rng),
                sync: sync(rng),
            },
            vec![],
        ),
        7 => (
            Call::EnqueueReadBufferRect {
                queue: pick(rng, queue),
                buffer: pick(rng, buffer),
                rect: Rect {
                    origin: dims(rng),
                    region: dims(rng),
                    row_pitch: size(rng),
                    slice_pitch: size(rng),
                },
                sync: sync(rng),
            },
            vec![],
        ),
        8 => (
            Call::EnqueueReadImage {
                queue: pick(rng, queue),
                image: pick(rng, image),
                origin: dims(rng),
                region: dims(rng),
                sync: sync(rng),
            },
            vec![],
        ),
        9 => {
            let region = dims(rng);
            let n = (region[0] * region[1] * region[2] * 4) as usize;
            (
                Call::EnqueueWriteImage {
                    queue: pick(rng, queue),
                    image: pick(rng, image),
                    origin: dims(rng),
                    region,
                    sync: sync(rng),
                },
                vec![9; n],
            )
        }
        10 => (
            Call::EnqueueFillBuffer {
                queue: pick(rng, queue),
                buffer: pick(rng, buffer),
                pattern: small(rng),
                offset: size(rng) % 8192,
                size: size(rng) % 8192,
                sync: sync(rng),
            },
            vec![],
        ),
        11 => (
            Call::EnqueueCopyBufferRect {
                queue: pick(rng, queue),
                src: pick(rng, mem),
                dst: pick(rng, mem),
                src_origin: dims(rng),
                dst_origin: dims(rng),
                region: dims(rng),
                src_pitch: [size(rng), size(rng)],
                dst_pitch: [size(rng), size(rng)],
                sync: sync(rng),
            },
            vec![],
        ),
        12 => (
            Call::EnqueueCopyImage {
                queue: pick(rng, queue),
                src: pick(rng, mem),
                dst: pick(rng, mem),
                src_origin: dims(rng),
                dst_origin: dims(rng),
                region: dims(rng),
                sync: sync(rng),
            },
            vec![],
        ),
        13 => (
            Call::SetUserEventStatus {
                event: pick(rng, event),
                status: rng.random_range(-3..3),
            },
            vec![],
        ),
        14 => (
            Call::SetEventCallback {
                event: pick(rng, event),
                status: rng.random_range(-1..4),
                cookie: rng.random(),
            },
            vec![],
        ),
        15 => (
            Call::WaitForEvents {
                events: (0..rng.random_range(0..3))
                    .map(|_| pick(rng, event))
                    .collect(),
            },
            vec![],
        ),
        16 => (
            Call::Finish {
                queue: pick(rng, queue),
            },
            vec![],
        ),
        17 => (Call::Release { id: any(rng) }, vec![]),
        18 => (
            Call::CreateImage {
                id: rng.random_range(10..40),
                context: pick(rng, context),
                flags: rng.random_range(0..8),
                format: ImageFormat {
                    order: rng.random_range(0x10B0..0x10C4),
                    data_type: rng.random_range(0x10D0..0x10E1),
                },
                desc: ImageDesc {
                    image_type: rng.random_range(0x10F0..0x10F7),
                    width: size(rng) % 512,
                    height: size(rng) % 512,
                    depth: rng.random_range(0..4),
                    array_size: rng.random_range(0..4),
                    row_pitch: 0,
                    slice_pitch: 0,
                    num_mip_levels: 0,
                    num_samples: 0,
                    buffer: if rng.random() { 0 } else { pick(rng, buffer) },
                },
                props: vec![],
                init: false,
            },
            vec![],
        ),
        19 => (
            Call::CreateSubDevices {
                device: pick(rng, &[2]),
                props: (0..rng.random_range(0..4))
                    .map(|_| rng.random_range(0..0x1090))
                    .collect(),
                ids: (0..rng.random_range(0..3))
                    .map(|_| rng.random_range(10..40))
                    .collect(),
            },
            vec![],
        ),
        20 => (
            Call::CreateKernelsInProgram {
                program: pick(rng, program),
                ids: (0..rng.random_range(0..3))
                    .map(|_| rng.random_range(10..40))
                    .collect(),
            },
            vec![],
        ),
        21 => {
            // Pre-copy blobs: a few keys, pieces at any offset of any total.
            let total = size(rng);
            let len = rng.random_range(0..4096usize);
            (
                Call::Stash {
                    key: rng.random_range(0..4),
                    total,
                    offset: if rng.random() { 0 } else { size(rng) },
                },
                vec![7; len],
            )
        }
        22 => (
            Call::EnqueueWriteStash {
                queue: pick(rng, queue),
                buffer: pick(rng, mem),
                offset: size(rng),
                key: rng.random_range(0..4),
                sync: sync(rng),
            },
            vec![],
        ),
        23 => (
            Call::Unstash {
                key: rng.random_range(0..4),
            },
            vec![],
        ),
        // Lanes' frames out of place, and a write over a lane in a session
        // that asked for none: each ends the session.
        24 => (
            Call::EnqueueWriteLane {
                queue: pick(rng, queue),
                buffer: pick(rng, mem),
                offset: size(rng),
                key: rng.random_range(0..4),
                sync: sync(rng),
            },
            vec![],
        ),
        25 => (
            Call::LanePiece {
                key: rng.random_range(0..4),
            },
            vec![5; rng.random_range(0..64)],
        ),
        26 => (
            Call::JoinLane {
                session: rng.random_range(0..4),
                lane: rng.random_range(0..4),
                secret: rng.random(),
            },
            vec![],
        ),
        _ => (Call::Sync, vec![]),
    }
}

/// Flips, truncates or splices bytes of an encoded frame.
fn mutate(rng: &mut StdRng, f: &mut Vec<u8>) {
    for _ in 0..rng.random_range(1..4) {
        match rng.random_range(0..4) {
            0 if !f.is_empty() => {
                let i = rng.random_range(0..f.len());
                f[i] = rng.random();
            }
            1 if f.len() > HEADER_LEN => {
                // Mutate the body only, keeping the header's lengths right.
                let i = rng.random_range(HEADER_LEN..f.len());
                f[i] ^= 1 << rng.random_range(0..8);
            }
            2 => {
                let i = rng.random_range(0..=f.len());
                f.splice(i..i, [0xff, 0xff, 0xff, 0xff, 0x0f]);
            }
            _ => f.truncate(rng.random_range(0..=f.len())),
        }
    }
}

/// One session's worth of bytes, and the number of frames in it.
fn session_bytes(rng: &mut StdRng, kind: u32) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut seq = 0;
    match kind {
        0 if rng.random() => out.extend((0..rng.random_range(0..200)).map(|_| rng.random::<u8>())),
        // A would-be lane: a JoinLane with a guessed secret, then pieces.
        0 => {
            seq += 1;
            let mut join = frame(
                seq,
                &Call::JoinLane {
                    session: rng.random_range(0..8),
                    lane: rng.random_range(0..4),
                    secret: rng.random(),
                },
                &[],
            );
            if rng.random() {
                mutate(rng, &mut join);
            }
            out.extend(join);
            for _ in 0..rng.random_range(0..4) {
                seq += 1;
                let mut piece = frame(
                    seq,
                    &Call::LanePiece {
                        key: rng.random_range(0..4),
                    },
                    &vec![3; rng.random_range(1..256)],
                );
                if rng.random() {
                    mutate(rng, &mut piece);
                }
                out.extend(piece);
            }
        }
        1 => {
            seq += 1;
            let mut hello = frame(
                seq,
                &Call::Hello {
                    major: crane_wire::VERSION_MAJOR,
                    minor: 0,
                    token: TOKEN_A.into(),
                    client: "fuzz".into(),
                },
                &[],
            );
            mutate(rng, &mut hello);
            out.extend(hello);
        }
        _ => {
            setup_frames(&mut out, &mut seq);
            for _ in 0..rng.random_range(1..12) {
                let (call, payload) = random_call(rng);
                seq += rng.random_range(1..3);
                let mut f = frame(seq, &call, &payload);
                if kind == 2 && rng.random_range(0..3) == 0 {
                    mutate(rng, &mut f);
                }
                out.extend(f);
            }
        }
    }
    (out, seq.max(1) as usize)
}

fn run_session(addr: SocketAddr, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let reader = {
        let mut r = s.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            r.read_to_end(&mut sink).is_ok()
        })
    };
    // The proxy may close early, cutting this write short.
    let _ = s.write_all(bytes);
    let _ = s.shutdown(Shutdown::Write);
    assert!(
        reader.join().unwrap(),
        "the proxy did not close the session"
    );
}

#[test]
fn thousands_of_mutated_frames_leave_the_proxy_serving() {
    let p = TestProxy::start(|c| {
        c.max_session_mem = Some(64 << 20);
        c.max_payload = 1 << 20;
        c.hello_timeout = Duration::from_secs(2);
        c.teardown_timeout = Duration::from_secs(3);
    });
    let sessions: u32 = std::env::var("CRANE_FUZZ_SESSIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(800);
    let addr = p.tcp();
    let workers: Vec<_> = (0..2u64)
        .map(|w| {
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(0x6372_616e_6500 + w);
                let mut frames = 0usize;
                for i in 0..sessions / 2 {
                    let (bytes, n) = session_bytes(&mut rng, i % 4);
                    frames += n;
                    run_session(addr, &bytes);
                }
                frames
            })
        })
        .collect();
    let frames: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    eprintln!("{sessions} sessions, about {frames} frames");
    let stats = p.proxy.stats();
    assert_eq!(stats.panics, 0, "a panic was caught: {stats:?}");
    assert!(p.wait_idle(Duration::from_secs(30)));

    let mut c = p.client(TOKEN_B);
    let env = setup(&mut c);
    let buf = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 1024, Some(&[8; 1024]));
    assert_eq!(read(&mut c, &env, buf, 1024, vec![]), vec![8; 1024]);
    assert_eq!(c.sync(), vec![]);
}
