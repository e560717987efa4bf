//! One tenant's flood does not starve another tenant's session: while tenant
//! B floods crane-proxy with connections, with small calls or with bulk
//! data, tenant A's round trips and transfers still complete, with the right
//! data, and the proxy serves everyone after. Prints A's round trip (median
//! and 99th percentile) and bandwidth alone and under each flood: figures,
//! not assertions (docs/reliability.md). Bounded: each flood lasts as long
//! as A's measurement (a few seconds), on loopback only.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use crane_wire::{Answer, Call, KernelArg, Sync};

const MIB: u64 = 1 << 20;
const BULK: u64 = 8 * MIB;

struct Figures {
    rtt_median_us: f64,
    rtt_p99_us: f64,
    gb_per_s: f64,
}

/// A's measurement: 300 blocking round trips, then four 8 MiB writes each
/// read back and checked.
fn measure(c: &mut Client, env: &Env, buf: u64, round: u8) -> Figures {
    let mut rtts: Vec<f64> = (0..300)
        .map(|_| {
            let t = Instant::now();
            let (a, _) = c.call(Call::Finish { queue: env.queue }, &[]);
            assert_eq!(a, Answer::Status(CL_SUCCESS));
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    rtts.sort_by(f64::total_cmp);
    let t = Instant::now();
    for i in 0..4u8 {
        let data = vec![round.wrapping_mul(31) ^ i; BULK as usize];
        c.post(
            Call::EnqueueWriteBuffer {
                queue: env.queue,
                buffer: buf,
                offset: 0,
                size: BULK,
                sync: Sync::default(),
            },
            &data,
        );
        assert!(
            read(c, env, buf, BULK, vec![]) == data,
            "A's data came back wrong"
        );
    }
    let secs = t.elapsed().as_secs_f64();
    Figures {
        rtt_median_us: rtts[rtts.len() / 2],
        rtt_p99_us: rtts[rtts.len() * 99 / 100],
        gb_per_s: (8 * BULK) as f64 / secs / 1e9,
    }
}

/// B's flood threads, stopped and joined when dropped; `work` counts what
/// they got done.
/// What a flood thread runs until told to stop.
type FloodBody = fn(&TestProxy, &AtomicBool, &AtomicU64);

struct Flood {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    work: Arc<AtomicU64>,
}

impl Flood {
    fn start(n: usize, p: &Arc<TestProxy>, body: FloodBody) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let work = Arc::new(AtomicU64::new(0));
        let threads = (0..n)
            .map(|_| {
                let (stop, work, p) = (stop.clone(), work.clone(), p.clone());
                std::thread::spawn(move || body(&p, &stop, &work))
            })
            .collect();
        // Measured once the flood is on: every kind has done some work.
        let t = Instant::now();
        while work.load(Ordering::Relaxed) == 0 && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(20));
        }
        Flood {
            stop,
            threads,
            work,
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let panicked = self
            .threads
            .drain(..)
            .map(|t| t.join().is_err())
            .filter(|&p| p)
            .count();
        if !std::thread::panicking() {
            assert_eq!(panicked, 0, "a flood thread panicked");
        }
    }
}

/// Opens sessions and closes them again, as fast as it can.
fn connections(p: &TestProxy, stop: &AtomicBool, work: &AtomicU64) {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(mut c) = Client::connect_tcp(p.tcp(), TOKEN_B) {
            let _ = c.call(Call::GetPlatformIds { ids: vec![] }, &[]);
            work.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Posts small calls (kernel arguments) in batches of 2000, then a round trip.
fn calls(p: &TestProxy, stop: &AtomicBool, work: &AtomicU64) {
    let mut c = p.client(TOKEN_B);
    let env = setup(&mut c);
    let k = kernel(
        &mut c,
        &env,
        "__kernel void k(uint a, __global uint *o) { o[0] = a; }",
        "k",
    );
    while !stop.load(Ordering::Relaxed) {
        for i in 0..2000u32 {
            set_arg(&mut c, k, 0, KernelArg::Bytes(i.to_ne_bytes().to_vec()));
        }
        assert_eq!(c.sync(), vec![]);
        work.fetch_add(2000, Ordering::Relaxed);
    }
}

/// Writes 8 MiB to a buffer of its own, again and again.
fn bulk(p: &TestProxy, stop: &AtomicBool, work: &AtomicU64) {
    let mut c = p.client(TOKEN_B);
    let env = setup(&mut c);
    let buf = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, BULK, None);
    let data = vec![0x5au8; BULK as usize];
    while !stop.load(Ordering::Relaxed) {
        c.post(
            Call::EnqueueWriteBuffer {
                queue: env.queue,
                buffer: buf,
                offset: 0,
                size: BULK,
                sync: Sync::default(),
            },
            &data,
        );
        assert_eq!(c.sync(), vec![]);
        work.fetch_add(BULK, Ordering::Relaxed);
    }
}

#[test]
fn a_flooding_tenant_does_not_starve_the_others() {
    let p = Arc::new(TestProxy::start(|_| {}));
    let mut a = p.client(TOKEN_A);
    let env = setup(&mut a);
    let buf = create_buffer(&mut a, &env, CL_MEM_READ_WRITE, BULK, None);
    let alone = measure(&mut a, &env, buf, 0);
    let floods: [(&str, usize, FloodBody, &str); 3] = [
        ("connections", 4, connections, "sessions"),
        ("small calls", 4, calls, "calls"),
        ("bulk writes", 2, bulk, "bytes"),
    ];
    println!(
        "{:<26} {:>12} {:>12} {:>10}  flood",
        "tenant A's session", "RTT med µs", "RTT p99 µs", "GB/s"
    );
    let row = |name: &str, f: &Figures, extra: &str| {
        println!(
            "{name:<26} {:>12.1} {:>12.1} {:>10.2}  {extra}",
            f.rtt_median_us, f.rtt_p99_us, f.gb_per_s
        )
    };
    row("alone", &alone, "");
    for (i, (name, threads, body, unit)) in floods.into_iter().enumerate() {
        let flood = Flood::start(threads, &p, body);
        let t = Instant::now();
        let f = measure(&mut a, &env, buf, i as u8 + 1);
        let done = flood.work.load(Ordering::Relaxed);
        assert!(
            done > 0,
            "the {name} flood did nothing: A was measured alone"
        );
        let secs = t.elapsed().as_secs_f64();
        drop(flood);
        row(
            &format!("under {name}"),
            &f,
            &format!(
                "{threads} threads of tenant B: {:.0} {unit}/s",
                done as f64 / secs.max(1e-9)
            ),
        );
    }
    // Everyone is served after: A's session goes on, B opens a new one.
    assert_eq!(a.sync(), vec![]);
    let mut b = p.client(TOKEN_B);
    setup(&mut b);
    drop((a, b));
    assert!(
        p.wait_idle(Duration::from_secs(30)),
        "the proxy did not clean up"
    );
}
