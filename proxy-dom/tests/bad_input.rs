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

const CL_INVALID_BINARY: i32 = -42;

/// Builds `program` (made from a binary), makes its kernel `k`, runs it on
/// 64 work-items into a fresh buffer and returns what it wrote.
fn run_k(c: &mut Client, env: &Env, program: crane_wire::Id) -> Vec<u8> {
    let (a, _) = c.call(
        Call::BuildProgram {
            program,
            devices: vec![env.device],
            options: String::new(),
        },
        &[],
    );
    assert_eq!(a, Answer::Status(0), "built");
    let kernel = c.id();
    c.post(
        Call::CreateKernel {
            id: kernel,
            program,
            name: "k".into(),
        },
        &[],
    );
    let out = create_buffer(c, env, CL_MEM_READ_WRITE, 256, None);
    set_arg(c, kernel, 0, KernelArg::Object(out));
    c.post(
        Call::EnqueueNdRange {
            queue: env.queue,
            kernel,
            dims: 1,
            offset: None,
            global: [64, 1, 1],
            local: None,
            sync: Sync::default(),
        },
        &[],
    );
    read(c, env, out, 256, vec![])
}

/// A program made from `bin` on the environment's device: the answer.
fn from_binary(c: &mut Client, env: &Env, bin: &[u8]) -> (crane_wire::Id, Answer) {
    let id = c.id();
    let (a, _) = c.call(
        Call::CreateProgramWithBinary {
            id,
            context: env.context,
            devices: vec![env.device],
            sizes: vec![bin.len() as u64],
        },
        bin,
    );
    (id, a)
}

/// PoCL aborts the process on a binary it cannot read; its own binaries
/// can be such when another process rewrites its kernel cache as it
/// serialises one (crane_vendor_loader::pocl_binary). crane-proxy answers
/// CL_INVALID_BINARY for those instead, and the session and the process go
/// on. PoCL's own binary, read back from a program that ran, is taken.
#[test]
fn a_binary_pocl_would_abort_on_is_refused_and_the_proxy_goes_on() {
    let mut p = ProxyProcess::start(&[]);
    let mut c = Client::connect_tcp(p.tcp, TOKEN_A).unwrap();
    let env = setup(&mut c);
    let source =
        "__kernel void k(__global int *o) { size_t i = get_global_id(0); o[i] = 3 * (int)i + 1; }";
    let program = build(&mut c, &env, source);
    let (a, bin) = c.call(Call::GetProgramBinaries { program }, &[]);
    assert!(
        matches!(&a, Answer::Binaries { status: 0, sizes } if sizes == &[bin.len() as u64]),
        "{a:?}"
    );
    let want: Vec<u8> = (0..64i32).flat_map(|i| (3 * i + 1).to_ne_bytes()).collect();
    let (good, a) = from_binary(&mut c, &env, &bin);
    assert_eq!(
        a,
        Answer::Binary {
            status: 0,
            per_binary: vec![0]
        }
    );
    assert_eq!(run_k(&mut c, &env, good), want);
    // Read again after the kernel ran: its cache files are in it now.
    let (_, ran) = c.call(Call::GetProgramBinaries { program: good }, &[]);
    if !crane_vendor_loader::pocl_binary::is_pocl_binary(&ran) {
        eprintln!("not PoCL: nothing more to check");
        return;
    }
    // What a rewrite of PoCL's cache leaves: program.bc's entry empty.
    let format = u32::from_le_bytes(ran[16..20].try_into().unwrap());
    let flags = u64::from_le_bytes(ran[24..32].try_into().unwrap());
    let root = 77 + if format >= 10 && flags & 2 != 0 { 8 } else { 0 };
    let size = u64::from_le_bytes(ran[root..root + 8].try_into().unwrap()) as usize;
    assert!(size > 0);
    let mut emptied = ran[..root].to_vec();
    emptied.extend_from_slice(&0u64.to_le_bytes());
    emptied.extend_from_slice(&ran[root + 8 + size..]);
    let cut = &ran[..ran.len() / 2];
    for (what, bad) in [("emptied program.bc", &emptied[..]), ("cut in half", cut)] {
        let (id, a) = from_binary(&mut c, &env, bad);
        if a == (Answer::Binary {
            status: 0,
            per_binary: vec![0],
        }) {
            // Unchecked, PoCL aborts here.
            c.call(
                Call::BuildProgram {
                    program: id,
                    devices: vec![env.device],
                    options: String::new(),
                },
                &[],
            );
        }
        assert!(p.alive(), "crane-proxy ended on a binary {what}");
        assert_eq!(
            a,
            Answer::Binary {
                status: CL_INVALID_BINARY,
                per_binary: vec![CL_INVALID_BINARY]
            },
            "{what}"
        );
    }
    // The session goes on, and PoCL's good binary still serves.
    let (again, a) = from_binary(&mut c, &env, &ran);
    assert_eq!(
        a,
        Answer::Binary {
            status: 0,
            per_binary: vec![0]
        }
    );
    assert_eq!(run_k(&mut c, &env, again), want);
    assert!(p.alive());
}
