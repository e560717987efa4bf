//! Misbehaving clients against the real `crane-proxy` process: each gets a
//! Goodbye saying why and a closed connection, while a good session keeps
//! working throughout and the process stays up.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use crane_wire::{Answer, Call, HEADER_LEN, KernelArg, MAX_BODY, Sync};

/// Writes `bytes` on a fresh connection (then, with `close`, ends the
/// sending side) and collects what the proxy answers until it closes.
/// Returns the Goodbye's reason.
fn raw_exchange(addr: SocketAddr, bytes: &[u8], close: bool) -> Option<String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(bytes).unwrap();
    if close {
        s.shutdown(Shutdown::Write).unwrap();
    }
    let mut got = Vec::new();
    let started = Instant::now();
    s.read_to_end(&mut got)
        .expect("the proxy closes the connection");
    assert!(started.elapsed() < Duration::from_secs(15));
    let mut r = got.as_slice();
    let mut body = Vec::new();
    let mut reason = None;
    while let Some(h) = crane_wire::read_frame(&mut r, 0, &mut body).unwrap() {
        match crane_wire::decode::<Answer>(&body).unwrap() {
            Answer::Goodbye { reason: why } => reason = Some(why),
            other => panic!("unexpected answer {other:?} (seq {})", h.seq),
        }
    }
    reason
}

fn hello(major: u16, token: &str) -> Call {
    Call::Hello {
        major,
        minor: 0,
        token: token.into(),
        client: "bad-input-test".into(),
    }
}

/// A session that keeps writing and reading a buffer until told to stop.
fn good_session(addr: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u32> {
    std::thread::spawn(move || {
        let mut c = Client::connect_tcp(addr, TOKEN_B).unwrap();
        let env = setup(&mut c);
        let buf = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 4096, None);
        let mut rounds = 0u32;
        while !stop.load(Ordering::Relaxed) || rounds < 5 {
            let fill = vec![rounds as u8; 4096];
            c.post(
                Call::EnqueueWriteBuffer {
                    queue: env.queue,
                    buffer: buf,
                    offset: 0,
                    size: 4096,
                    sync: Sync::default(),
                },
                &fill,
            );
            assert_eq!(read(&mut c, &env, buf, 4096, vec![]), fill);
            rounds += 1;
        }
        assert_eq!(c.sync(), vec![]);
        rounds
    })
}

#[test]
fn bad_input_ends_only_the_sessions_that_send_it() {
    let mut p = ProxyProcess::start(&["--hello-timeout", "1", "--max-payload", "1M"]);
    let stop = Arc::new(AtomicBool::new(false));
    let good = good_session(p.tcp, stop.clone());

    let hello_frame = frame(1, &hello(crane_wire::VERSION_MAJOR, TOKEN_A), &[]);
    let mut trailing = hello_frame.clone();
    trailing.push(0);
    trailing[4..8].copy_from_slice(&((hello_frame.len() - HEADER_LEN + 1) as u32).to_le_bytes());
    let mut body_garbage = header(40, 0, 1).to_vec();
    body_garbage.extend((0..40u8).map(|i| i.wrapping_mul(97) ^ 0x5a));
    let cases: Vec<(&str, Vec<u8>, bool, &str)> = vec![
        (
            "garbage",
            b"GET / HTTP/1.1\r\nHost: crane\r\n\r\n".to_vec(),
            true,
            "magic",
        ),
        (
            "truncated header",
            hello_frame[..10].to_vec(),
            true,
            "middle of a frame",
        ),
        (
            "truncated body",
            hello_frame[..HEADER_LEN + 3].to_vec(),
            true,
            "middle of a frame",
        ),
        (
            "wrong version",
            frame(1, &hello(crane_wire::VERSION_MAJOR + 1, TOKEN_A), &[]),
            true,
            "version",
        ),
        (
            "wrong token",
            frame(1, &hello(crane_wire::VERSION_MAJOR, "not-a-token"), &[]),
            true,
            "token is not valid",
        ),
        (
            "empty token",
            frame(1, &hello(crane_wire::VERSION_MAJOR, ""), &[]),
            true,
            "token is not valid",
        ),
        (
            "not a Hello",
            frame(1, &Call::Sync, &[]),
            true,
            "must be Hello",
        ),
        (
            "seq 0",
            frame(0, &hello(crane_wire::VERSION_MAJOR, TOKEN_A), &[]),
            true,
            "sequence number 0",
        ),
        (
            "oversized body",
            header(MAX_BODY + 1, 0, 1).to_vec(),
            true,
            "exceeds",
        ),
        (
            "large body before Hello",
            header(1 << 20, 0, 1).to_vec(),
            true,
            "at this point",
        ),
        (
            "payload on the Hello",
            frame(1, &hello(crane_wire::VERSION_MAJOR, TOKEN_A), &[1; 8]),
            true,
            "payload of 8 bytes",
        ),
        ("undecodable body", body_garbage, true, "cannot be decoded"),
        ("trailing bytes", trailing, true, "cannot be decoded"),
        ("silence", Vec::new(), false, "no Hello within"),
    ];
    for (name, bytes, close, want) in cases {
        let reason =
            raw_exchange(p.tcp, &bytes, close).unwrap_or_else(|| panic!("{name}: no Goodbye"));
        assert!(reason.contains(want), "{name}: {reason}");
        assert!(p.alive(), "{name} killed the proxy");
    }

    // Violations inside an open session.
    type Misdeed = Box<dyn Fn(&mut Client, &Env)>;
    let misdeeds: Vec<(&str, Misdeed, &str)> = vec![
        (
            "forged id",
            Box::new(|c, _| {
                c.post(
                    Call::CreateBuffer {
                        id: 900,
                        context: 999,
                        flags: CL_MEM_READ_WRITE,
                        size: 16,
                        props: vec![],
                        init: false,
                    },
                    &[],
                );
            }),
            "names no object",
        ),
        (
            "wrong-kind id",
            Box::new(|c, env| {
                c.post(
                    Call::CreateQueue {
                        id: 900,
                        context: env.device,
                        device: env.device,
                        props: vec![],
                    },
                    &[],
                );
            }),
            "names a device, not a context",
        ),
        (
            "wrong-kind kernel argument",
            Box::new(|c, env| {
                let program = build(c, env, "__kernel void k(__global int *p) { *p = 1; }");
                c.post(
                    Call::CreateKernel {
                        id: 900,
                        program,
                        name: "k".into(),
                    },
                    &[],
                );
                c.post(
                    Call::SetKernelArg {
                        kernel: 900,
                        index: 0,
                        arg: KernelArg::Object(env.context),
                    },
                    &[],
                );
            }),
            "cannot be a kernel argument",
        ),
        (
            "id in use",
            Box::new(|c, env| {
                c.post(
                    Call::CreateUserEvent {
                        id: env.context,
                        context: env.context,
                    },
                    &[],
                );
            }),
            "already in use",
        ),
        (
            "payload of the wrong size",
            Box::new(|c, env| {
                c.post(
                    Call::CreateBuffer {
                        id: 900,
                        context: env.context,
                        flags: CL_MEM_READ_WRITE,
                        size: 16,
                        props: vec![],
                        init: true,
                    },
                    &[1; 15],
                );
            }),
            "payload holds 15 bytes",
        ),
        (
            "payload on a call without one",
            Box::new(|c, _| {
                c.post(Call::Sync, &[1, 2, 3]);
            }),
            "carries no payload",
        ),
        (
            "payload over the limit",
            Box::new(|c, _| c.raw(&header(1, (1 << 20) + 1, 1000))),
            "exceeds the limit",
        ),
        (
            "oversized body",
            Box::new(|c, _| c.raw(&header(MAX_BODY + 1, 0, 1000))),
            "exceeds",
        ),
        ("garbage", Box::new(|c, _| c.raw(&[0xEE; 64])), "magic"),
        (
            "sequence number going back",
            Box::new(|c, _| {
                c.set_seq(1);
                c.post(Call::Sync, &[]);
            }),
            "does not follow",
        ),
        (
            "second Hello",
            Box::new(|c, _| {
                c.post(hello(crane_wire::VERSION_MAJOR, TOKEN_A), &[]);
            }),
            "Hello in an open session",
        ),
        (
            "truncated frame",
            Box::new(|c, _| {
                let f = frame(1000, &Call::Sync, &[]);
                c.raw(&f[..f.len() - 1]);
            }),
            "middle of a frame",
        ),
        (
            "use after release",
            Box::new(|c, env| {
                c.post(Call::Release { id: env.queue }, &[]);
                c.post(Call::Flush { queue: env.queue }, &[]);
            }),
            "names no object",
        ),
    ];
    for (name, misdeed, want) in misdeeds {
        let mut c = Client::connect_tcp(p.tcp, TOKEN_A).unwrap();
        let env = setup(&mut c);
        misdeed(&mut c, &env);
        c.finish_writes();
        let reason = c
            .closed(LONG)
            .unwrap_or_else(|| panic!("{name}: no Goodbye"));
        assert!(reason.contains(want), "{name}: {reason}");
        assert!(p.alive(), "{name} killed the proxy");
    }

    stop.store(true, Ordering::Relaxed);
    let rounds = good.join().expect("the good session kept working");
    assert!(rounds >= 5);
    assert!(p.alive());
    let mut c = Client::connect_tcp(p.tcp, TOKEN_A).unwrap();
    let env = setup(&mut c);
    let buf = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 64, Some(&[3; 64]));
    assert_eq!(read(&mut c, &env, buf, 64, vec![]), vec![3; 64]);
}

#[test]
fn a_missing_token_file_refuses_sessions_until_it_appears() {
    let p = ProxyProcess::start(&[]);
    let tokens = p.dir.path().join("tokens");
    let saved = std::fs::read_to_string(&tokens).unwrap();
    std::fs::remove_file(&tokens).unwrap();
    let refused = Client::connect_tcp(p.tcp, TOKEN_A).err().unwrap();
    assert!(refused.contains("cannot check tokens"), "{refused}");
    // Tokens added while the proxy runs are honoured at the next Hello.
    std::fs::write(&tokens, format!("{saved}new-token tenant-c\n")).unwrap();
    let mut c = Client::connect_tcp(p.tcp, "new-token").unwrap();
    assert_eq!(c.call(Call::Sync, &[]).0, Answer::Status(0));
}
