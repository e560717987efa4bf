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

/// A client that writes a call and reads its answer on the same thread.
struct Bare<S> {
    s: S,
    seq: u64,
    out: Vec<u8>,
    body: Vec<u8>,
    data: Vec<u8>,
}

impl<S: Read + Write> Bare<S> {
    fn new(s: S) -> Bare<S> {
        let mut b = Bare {
            s,
            seq: 0,
            out: Vec::new(),
            body: Vec::new(),
            data: Vec::new(),
        };
        b.call(
            Call::Hello {
                major: crane_wire::VERSION_MAJOR,
                minor: crane_wire::VERSION_MINOR,
                token: TOKEN_A.into(),
                client: "latency".into(),
            },
            &[],
        );
        b
    }

    fn post(&mut self, call: Call, payload: &[u8]) {
        self.seq += 1;
        self.out.clear();
        crane_wire::encode(&mut self.out, self.seq, &call, payload.len() as u64).unwrap();
        self.s.write_all(&self.out).unwrap();
        self.s.write_all(payload).unwrap();
    }

    /// Sends a call and reads up to its answer; the length of the answer's
    /// payload, which is read into `self.data` (kept from call to call, as a
    /// real client reads into the application's memory).
    fn call(&mut self, call: Call, payload: &[u8]) -> usize {
        self.post(call, payload);
        loop {
            let h = crane_wire::read_frame(&mut self.s, u64::MAX, &mut self.body)
                .unwrap()
                .unwrap();
            let n = h.payload_len as usize;
            if self.data.len() < n {
                self.data.resize(n, 0);
            }
            self.s.read_exact(&mut self.data[..n]).unwrap();
            if h.seq == self.seq {
                return n;
            }
        }
    }
}

fn bare(label: &str, s: impl Read + Write) {
    let mut b = Bare::new(s);
    measure(&format!("{label} Sync, bare client"), 50_000, || {
        b.call(Call::Sync, &[]);
    });
    b.call(Call::GetPlatformIds { ids: vec![1] }, &[]);
    b.call(
        Call::GetDeviceIds {
            platform: 1,
            device_type: CL_DEVICE_TYPE_ALL,
            ids: vec![2],
        },
        &[],
    );
    b.post(
        Call::CreateContext {
            id: 3,
            props: vec![],
            devices: vec![2],
        },
        &[],
    );
    b.post(
        Call::CreateQueue {
            id: 4,
            context: 3,
            device: 2,
            props: vec![],
        },
        &[],
    );
    measure(&format!("{label} Finish (idle), bare"), 10_000, || {
        b.call(Call::Finish { queue: 4 }, &[]);
    });
    const BIG: u64 = 64 << 20;
    b.post(
        Call::CreateBuffer {
            id: 5,
            context: 3,
            flags: CL_MEM_READ_WRITE,
            size: BIG,
            props: vec![],
            init: false,
        },
        &[],
    );
    let data = vec![7u8; BIG as usize];
    let rounds = 10;
    let t = Instant::now();
    for _ in 0..rounds {
        b.post(
            Call::EnqueueWriteBuffer {
                queue: 4,
                buffer: 5,
                offset: 0,
                size: BIG,
                sync: Sync::default(),
            },
            &data,
        );
        b.call(Call::Finish { queue: 4 }, &[]);
    }
    let write = t.elapsed() / rounds;
    let t = Instant::now();
    for _ in 0..rounds {
        let got = b.call(
            Call::EnqueueReadBuffer {
                queue: 4,
                buffer: 5,
                offset: 0,
                size: BIG,
                sync: Sync::default(),
            },
            &[],
        );
        assert_eq!(got as u64, BIG);
    }
    let read = t.elapsed() / rounds;
    let mbs = |d: Duration| BIG as f64 / d.as_secs_f64() / 1e6;
    println!(
        "{label:<28} 64 MiB write+Finish {:.1} ms ({:.0} MB/s), read {:.1} ms ({:.0} MB/s), bare client",
        write.as_secs_f64() * 1e3,
        mbs(write),
        read.as_secs_f64() * 1e3,
        mbs(read)
    );
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
