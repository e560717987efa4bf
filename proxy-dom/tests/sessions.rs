//! Sessions side by side and apart: tenants that do not see each other,
//! per-session limits reported as OpenCL errors, and sessions whose clients
//! vanish being torn down completely.

mod common;

use std::time::Duration;

use common::*;
use crane_wire::{Answer, Call, KernelArg, Sync};

const PATTERN: &str = r#"
__kernel void fill_pattern(__global uint *out, uint seed) {
    size_t g = get_global_id(0);
    out[g] = (uint)g * 2654435761u ^ seed;
}
"#;

const WORDS: u64 = 16 * 1024;

fn pattern(seed: u32) -> Vec<u8> {
    u32_bytes(
        &(0..WORDS as u32)
            .map(|g| g.wrapping_mul(2654435761) ^ seed)
            .collect::<Vec<_>>(),
    )
}

/// Runs `fill_pattern` with `seed` into a fresh buffer and checks it.
fn run_pattern(c: &mut Client, env: &Env, kernel: u64, seed: u32) {
    let out = create_buffer(c, env, CL_MEM_READ_WRITE, WORDS * 4, None);
    c.post(
        Call::SetKernelArg {
            kernel,
            index: 0,
            arg: KernelArg::Object(out),
        },
        &[],
    );
    c.post(
        Call::SetKernelArg {
            kernel,
            index: 1,
            arg: KernelArg::Bytes(seed.to_ne_bytes().to_vec()),
        },
        &[],
    );
    c.post(
        Call::EnqueueNdRange {
            queue: env.queue,
            kernel,
            dims: 1,
            offset: None,
            global: [WORDS, 1, 1],
            local: None,
            sync: Sync::default(),
        },
        &[],
    );
    assert!(
        read(c, env, out, WORDS * 4, vec![]) == pattern(seed),
        "seed {seed}"
    );
    c.post(Call::Release { id: out }, &[]);
}

fn pattern_kernel(c: &mut Client, env: &Env) -> u64 {
    let program = build(c, env, PATTERN);
    let kernel = c.id();
    c.post(
        Call::CreateKernel {
            id: kernel,
            program,
            name: "fill_pattern".into(),
        },
        &[],
    );
    kernel
}

#[test]
fn two_tenants_at_once_use_the_same_ids_without_interference() {
    let p = TestProxy::start(|_| {});
    let tcp = p.tcp();
    let run = move |token: &'static str, seed: u32| {
        std::thread::spawn(move || {
            let mut c = Client::connect_tcp(tcp, token).unwrap();
            let env = setup(&mut c);
            let kernel = pattern_kernel(&mut c, &env);
            for i in 0..20 {
                run_pattern(&mut c, &env, kernel, seed + i);
            }
            assert_eq!(c.sync(), vec![]);
            (c, env)
        })
    };
    let a = run(TOKEN_A, 0x1000);
    let b = run(TOKEN_B, 0x2000);
    let ((mut a, env_a), (mut b, env_b)) = (a.join().unwrap(), b.join().unwrap());
    // Both sessions numbered their objects alike.
    assert_eq!((env_a.context, env_a.queue), (env_b.context, env_b.queue));
    let stats = p.proxy.stats();
    let mut tenants: Vec<&str> = stats.sessions.iter().map(|s| s.tenant.as_str()).collect();
    tenants.sort();
    assert_eq!(tenants, ["tenant-a", "tenant-b"]);
    assert_ne!(a.session, b.session);

    // An id that only A has named is a forged handle in B's session.
    let only_a = create_buffer(&mut a, &env_a, CL_MEM_READ_WRITE, 16, Some(&[4; 16]));
    assert_eq!(a.sync(), vec![]);
    b.send(
        Call::EnqueueFillBuffer {
            queue: env_b.queue,
            buffer: only_a,
            pattern: vec![0],
            offset: 0,
            size: 16,
            sync: Sync::default(),
        },
        &[],
    );
    let reason = b.closed(LONG).expect("a Goodbye");
    assert!(reason.contains("names no object"), "{reason}");
    // A is untouched.
    assert_eq!(read(&mut a, &env_a, only_a, 16, vec![]), vec![4; 16]);
}

#[test]
fn exceeding_the_memory_limit_is_an_allocation_failure_and_the_session_goes_on() {
    let p = TestProxy::start(|c| {
        c.max_session_mem = Some(1 << 20);
        c.max_session_objects = 64;
    });
    let mut c = p.client(TOKEN_A);
    assert_eq!(c.limits.max_mem_bytes, 1 << 20);
    assert_eq!(c.limits.max_objects, 64);
    assert_eq!(c.limits.max_payload, p.proxy.limits().max_payload);
    let env = setup(&mut c);
    let half = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 512 << 10, None);
    let seq = c.post(
        Call::CreateBuffer {
            id: 100,
            context: env.context,
            flags: CL_MEM_READ_WRITE,
            size: 768 << 10,
            props: vec![],
            init: false,
        },
        &[],
    );
    let uses = c.post(
        Call::EnqueueFillBuffer {
            queue: env.queue,
            buffer: 100,
            pattern: vec![1],
            offset: 0,
            size: 16,
            sync: Sync::default(),
        },
        &[],
    );
    const CL_MEM_OBJECT_ALLOCATION_FAILURE: i32 = -4;
    assert_eq!(
        c.sync(),
        vec![
            (seq, CL_MEM_OBJECT_ALLOCATION_FAILURE),
            (uses, CL_MEM_OBJECT_ALLOCATION_FAILURE)
        ]
    );
    assert_eq!(p.proxy.stats().mem_bytes(), 512 << 10);
    // Releasing frees the charge.
    c.post(Call::Release { id: half }, &[]);
    c.post(Call::Release { id: 100 }, &[]);
    let big = create_buffer(
        &mut c,
        &env,
        CL_MEM_READ_WRITE,
        768 << 10,
        Some(&vec![9; 768 << 10]),
    );
    assert_eq!(c.sync(), vec![]);
    assert_eq!(read(&mut c, &env, big, 16, vec![]), vec![9; 16]);

    // The object limit: 4 objects so far (platform, device, context,
    // queue) and the buffer.
    let mut failures = Vec::new();
    for _ in 0..64 {
        let id = c.id();
        failures.push(c.post(
            Call::CreateUserEvent {
                id,
                context: env.context,
            },
            &[],
        ));
    }
    const CL_OUT_OF_RESOURCES: i32 = -5;
    let want: Vec<(u64, i32)> = failures[59..]
        .iter()
        .map(|&s| (s, CL_OUT_OF_RESOURCES))
        .collect();
    assert_eq!(c.sync(), want);
}

#[test]
fn a_payload_over_the_limit_ends_the_session() {
    let p = TestProxy::start(|c| c.max_payload = 4096);
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);
    let buf = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 8192, None);
    c.send(
        Call::EnqueueWriteBuffer {
            queue: env.queue,
            buffer: buf,
            offset: 0,
            size: 8192,
            sync: Sync::default(),
        },
        &[0; 8192],
    );
    let reason = c.closed(LONG).expect("a Goodbye");
    assert!(reason.contains("exceeds the limit"), "{reason}");
    assert!(p.wait_idle(LONG));
}

/// A session with queued work stuck behind a user event, a pending read and
/// a pending wait.
fn busy_session(p: &TestProxy) -> Client {
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);
    let kernel = pattern_kernel(&mut c, &env);
    let gate = c.id();
    c.post(
        Call::CreateUserEvent {
            id: gate,
            context: env.context,
        },
        &[],
    );
    let out = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, WORDS * 4, None);
    c.post(
        Call::SetKernelArg {
            kernel,
            index: 0,
            arg: KernelArg::Object(out),
        },
        &[],
    );
    c.post(
        Call::SetKernelArg {
            kernel,
            index: 1,
            arg: KernelArg::Bytes(vec![1, 2, 3, 4]),
        },
        &[],
    );
    let ran = c.id();
    c.post(
        Call::EnqueueNdRange {
            queue: env.queue,
            kernel,
            dims: 1,
            offset: None,
            global: [WORDS, 1, 1],
            local: None,
            sync: Sync {
                waits: vec![gate],
                event: ran,
            },
        },
        &[],
    );
    c.post(
        Call::EnqueueWriteBuffer {
            queue: env.queue,
            buffer: out,
            offset: 0,
            size: 64,
            sync: Sync::default(),
        },
        &[7; 64],
    );
    c.post(
        Call::SetEventCallback {
            event: ran,
            status: CL_COMPLETE,
            cookie: 5,
        },
        &[],
    );
    let read = c.send(
        Call::EnqueueReadBuffer {
            queue: env.queue,
            buffer: out,
            offset: 0,
            size: WORDS * 4,
            sync: Sync::default(),
        },
        &[],
    );
    let wait = c.send(Call::WaitForEvents { events: vec![ran] }, &[]);
    assert_eq!(c.sync(), vec![]);
    assert!(!c.has_answer(read) && !c.has_answer(wait));
    let s = p.proxy.stats();
    assert_eq!(s.sessions.len(), 1);
    assert!(s.objects() >= 9 && s.mem_bytes() == WORDS * 4, "{s:?}");
    // The blocked write's payload and the pending read's buffer are held.
    assert_eq!(s.staging_bytes, 64 + WORDS * 4, "{s:?}");
    c
}

#[test]
fn a_client_that_disappears_is_torn_down_even_with_blocked_work() {
    let p = TestProxy::start(|c| c.teardown_timeout = Duration::from_secs(5));
    let c = busy_session(&p);
    c.kill();
    assert!(
        p.wait_idle(Duration::from_secs(20)),
        "the session was not torn down"
    );
    // The proxy serves new sessions as before.
    let mut c = p.client(TOKEN_B);
    let env = setup(&mut c);
    let kernel = pattern_kernel(&mut c, &env);
    run_pattern(&mut c, &env, kernel, 3);
    assert_eq!(p.proxy.stats().panics, 0);
}

#[test]
fn a_reset_connection_and_a_bye_both_release_everything() {
    let p = TestProxy::start(|_| {});
    // Reset: with SO_LINGER 0 the last close sends RST instead of FIN.
    {
        let s = std::net::TcpStream::connect(p.tcp()).unwrap();
        let (r, w, sd) = (
            s.try_clone().unwrap(),
            s.try_clone().unwrap(),
            s.try_clone().unwrap(),
        );
        let shutdown = Box::new(move |_| {
            // Wakes the client's reader without sending anything.
            let _ = sd.shutdown(std::net::Shutdown::Read);
        });
        let mut c = Client::open(
            Box::new(w),
            Box::new(r),
            shutdown,
            TOKEN_A,
            crane_wire::VERSION_MAJOR,
        )
        .unwrap();
        let env = setup(&mut c);
        create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 4096, Some(&[1; 4096]));
        assert_eq!(c.sync(), vec![]);
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid socket and a linger struct of the size given.
        let rc = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&s),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const linger).cast(),
                size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
    }
    assert!(p.wait_idle(Duration::from_secs(20)));
    // Bye.
    let mut c = busy_session(&p);
    c.send(Call::Bye, &[]);
    assert_eq!(c.closed(LONG), None);
    assert!(p.wait_idle(Duration::from_secs(20)));
}

#[test]
fn sessions_beyond_the_cap_are_turned_away_politely() {
    let p = TestProxy::start(|c| c.max_sessions = 2);
    let a = p.client(TOKEN_A);
    let mut b = p.client(TOKEN_B);
    let refused = Client::connect_tcp(p.tcp(), TOKEN_A)
        .err()
        .unwrap_or_default();
    assert!(refused.contains("too many sessions"), "{refused}");
    assert_eq!(p.proxy.stats().refused, 1);
    drop(a);
    assert_eq!(b.call(Call::Sync, &[]).0, Answer::Status(0));
    // A's place is free again once its session has ended.
    let deadline = std::time::Instant::now() + LONG;
    let mut c = loop {
        match Client::connect_tcp(p.tcp(), TOKEN_A) {
            Ok(c) => break c,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(c.call(Call::Sync, &[]).0, Answer::Status(0));
}
