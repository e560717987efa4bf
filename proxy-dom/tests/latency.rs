//! Round-trip latency of the proxy over loopback TCP and a unix socket: a
//! Sync (the cheapest call that replies) from a bare synchronous client
//! (write a frame, read the answer on the same thread), then a Sync and a
//! 4 KiB buffer read through the test client (which reads answers on a
//! thread of its own, adding a thread wake-up). Prints figures, asserts
//! nothing about them. Run it with
//! `cargo test -p crane-proxy --release --test latency -- --ignored --nocapture`.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::*;
use crane_wire::{Call, Sync};

fn measure(label: &str, n: usize, mut once: impl FnMut()) {
    for _ in 0..n / 10 {
        once();
    }
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            once();
            t.elapsed()
        })
        .collect();
    times.sort();
    let mean = times.iter().sum::<Duration>() / n as u32;
    let pct = |p: f64| times[((n as f64 * p) as usize).min(n - 1)];
    println!(
        "{label:<28} n={n}  mean {:>6.1} µs  p50 {:>6.1} µs  p99 {:>6.1} µs  min {:>6.1} µs",
        mean.as_secs_f64() * 1e6,
        pct(0.50).as_secs_f64() * 1e6,
        pct(0.99).as_secs_f64() * 1e6,
        times[0].as_secs_f64() * 1e6,
    );
}

fn run(label: &str, c: &mut Client) {
    let n = 20_000;
    measure(&format!("{label} Sync"), n, || {
        c.call(Call::Sync, &[]);
    });
    let env = setup(c);
    let buf = create_buffer(c, &env, CL_MEM_READ_WRITE, 4096, Some(&[1; 4096]));
    measure(&format!("{label} read 4 KiB"), n / 4, || {
        c.call(
            Call::EnqueueReadBuffer {
                queue: env.queue,
                buffer: buf,
                offset: 0,
                size: 4096,
                sync: Sync::default(),
            },
            &[],
        );
    });
}

/// Hello, then Syncs written and answered on this thread alone.
fn bare(label: &str, mut s: impl Read + Write) {
    let mut seq = 1;
    s.write_all(&frame(
        seq,
        &Call::Hello {
            major: crane_wire::VERSION_MAJOR,
            minor: crane_wire::VERSION_MINOR,
            token: TOKEN_A.into(),
            client: "latency".into(),
        },
        &[],
    ))
    .unwrap();
    let mut body = Vec::new();
    crane_wire::read_frame(&mut s, 0, &mut body)
        .unwrap()
        .unwrap();
    let mut out = Vec::new();
    measure(&format!("{label} Sync, bare client"), 50_000, || {
        seq += 1;
        out.clear();
        crane_wire::encode(&mut out, seq, &Call::Sync, 0).unwrap();
        s.write_all(&out).unwrap();
        let h = crane_wire::read_frame(&mut s, 0, &mut body)
            .unwrap()
            .unwrap();
        assert_eq!(h.seq, seq);
    });
}

#[test]
#[ignore = "a benchmark: run it explicitly, preferably with --release"]
fn round_trip_latency() {
    let p = TestProxy::start(|_| {});
    let tcp = std::net::TcpStream::connect(p.tcp()).unwrap();
    tcp.set_nodelay(true).unwrap();
    bare("tcp loopback", tcp);
    bare(
        "unix socket",
        std::os::unix::net::UnixStream::connect(p.unix()).unwrap(),
    );
    run("tcp loopback", &mut p.client(TOKEN_A));
    run(
        "unix socket",
        &mut Client::connect_unix(&p.unix(), TOKEN_A).unwrap(),
    );
}
