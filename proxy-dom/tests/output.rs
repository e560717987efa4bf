//! Kernel printf output: the proxy (as a process, which captures its
//! standard output) sends each session what its own kernels printed, before
//! the answer of the call that waited for them, and never what another
//! session's kernels printed.

mod common;

use std::time::{Duration, Instant};

use common::*;
use crane_wire::{Answer, Call, Id, KernelArg, Sync};

const PRINTS: &str = r#"
__kernel void say(uint tag, uint n) {
    for (uint i = 0; i < n; i++)
        printf("tenant %u line %u\n", tag, i);
}
"#;

const QUIET: &str = r#"
__kernel void quiet(__global uint *out) { out[get_global_id(0)] = 7; }
"#;

struct Printer {
    c: Client,
    env: Env,
    kernel: Id,
    tag: u32,
}

impl Printer {
    fn open(p: &ProxyProcess, token: &str, tag: u32) -> Printer {
        let mut c = Client::connect_tcp(p.tcp, token).expect("a session opens");
        let env = setup(&mut c);
        let kernel = kernel(&mut c, &env, PRINTS, "say");
        set_arg(
            &mut c,
            kernel,
            0,
            KernelArg::Bytes(tag.to_ne_bytes().to_vec()),
        );
        assert!(c.sync().is_empty());
        Printer {
            c,
            env,
            kernel,
            tag,
        }
    }

    /// Launches one work-item printing `n` lines; its event is `event`
    /// (0: none).
    fn launch(&mut self, n: u32, event: Id) {
        set_arg(
            &mut self.c,
            self.kernel,
            1,
            KernelArg::Bytes(n.to_ne_bytes().to_vec()),
        );
        let sync = Sync {
            waits: vec![],
            event,
        };
        launch_one(&mut self.c, &self.env, self.kernel, sync);
    }

    fn finish(&mut self) -> String {
        let (a, _) = self.c.call(
            Call::Finish {
                queue: self.env.queue,
            },
            &[],
        );
        assert_eq!(a, Answer::Status(CL_SUCCESS));
        String::from_utf8(self.c.take_output()).unwrap()
    }

    fn lines(&self, n: u32) -> String {
        (0..n)
            .map(|i| format!("tenant {} line {i}\n", self.tag))
            .collect()
    }
}

/// A session alone gets exactly what its kernels printed, when it waits for
/// them however it waits; a session whose programs do not print gets none.
#[test]
fn a_printing_session_gets_its_kernels_output() {
    let p = ProxyProcess::start(&[]);
    let mut a = Printer::open(&p, TOKEN_A, 1);

    a.launch(3, 0);
    assert_eq!(a.finish(), a.lines(3));
    // Nothing launched since: nothing more.
    assert_eq!(a.finish(), "");

    let ev = a.c.id();
    a.launch(2, ev);
    let (st, _) = a.c.call(Call::WaitForEvents { events: vec![ev] }, &[]);
    assert_eq!(st, Answer::Status(CL_SUCCESS));
    assert_eq!(String::from_utf8(a.c.take_output()).unwrap(), a.lines(2));

    let buf = create_buffer(&mut a.c, &a.env, CL_MEM_READ_WRITE, 64, None);
    a.launch(4, 0);
    let data = read(&mut a.c, &a.env, buf, 64, vec![]);
    assert_eq!(data.len(), 64);
    assert_eq!(String::from_utf8(a.c.take_output()).unwrap(), a.lines(4));

    // A session that never printed receives nothing, and its calls work.
    let mut q = Client::connect_tcp(p.tcp, TOKEN_B).unwrap();
    let env = setup(&mut q);
    let kernel = kernel(&mut q, &env, QUIET, "quiet");
    let out = create_buffer(&mut q, &env, CL_MEM_READ_WRITE, 16, None);
    set_arg(&mut q, kernel, 0, KernelArg::Object(out));
    q.post(
        Call::EnqueueNdRange {
            queue: env.queue,
            kernel,
            dims: 1,
            offset: None,
            global: [4, 1, 1],
            local: None,
            sync: Sync::default(),
        },
        &[],
    );
    assert_eq!(read(&mut q, &env, out, 16, vec![]), [7, 0, 0, 0].repeat(4));
    assert!(q.take_output().is_empty());

    // The printer still gets its own.
    a.launch(1, 0);
    assert_eq!(a.finish(), a.lines(1));
}

/// Two sessions printing at the same time: neither ever receives a byte the
/// other's kernels printed (what cannot be told apart goes to the proxy's
/// log); once the other has gone, a session gets all of its output again.
#[test]
fn two_sessions_printing_at_once_never_see_each_others_output() {
    let p = ProxyProcess::start(&[]);
    let mut a = Printer::open(&p, TOKEN_A, 1);
    let b = Printer::open(&p, TOKEN_B, 2);
    let run = |mut me: Printer| {
        std::thread::spawn(move || {
            let mut got = String::new();
            for i in 0..15 {
                me.launch(1 + i % 4, 0);
                got += &me.finish();
            }
            (me, got)
        })
    };
    let (ta, tb) = (run(a), run(b));
    let (a2, got_a) = ta.join().unwrap();
    let (b2, got_b) = tb.join().unwrap();
    a = a2;
    assert!(!got_a.contains("tenant 2"), "{got_a}");
    assert!(!got_b.contains("tenant 1"), "{got_b}");
    for l in got_a.lines().chain(got_b.lines()) {
        assert!(l.starts_with("tenant ") && l.contains(" line "), "{l:?}");
    }

    // The other session ends: soon this one gets everything again.
    drop(b2);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        a.launch(3, 0);
        let got = a.finish();
        if got == a.lines(3) {
            break;
        }
        assert!(!got.contains("tenant 2"), "{got}");
        assert!(
            Instant::now() < deadline,
            "the output never came back: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// With --no-capture-stdout the proxy sends no output at all.
#[test]
fn no_output_is_sent_when_capture_is_off() {
    let p = ProxyProcess::start(&["--no-capture-stdout"]);
    let mut a = Printer::open(&p, TOKEN_A, 1);
    a.launch(2, 0);
    assert_eq!(a.finish(), "");
}

const SLOW: &str = r#"
__kernel void slow(__global ulong *out, ulong n, uint tag) {
    ulong x = 0;
    for (ulong i = 0; i < n; i++)
        x = x * 6364136223846793005UL + i;
    out[0] = x;
    printf("tenant %u late\n", tag);
}
"#;

/// One session with the slow kernel: launches it with `n` iterations.
struct Slow {
    c: Client,
    env: Env,
    kernel: Id,
}

impl Slow {
    fn open(p: &ProxyProcess, token: &str) -> Slow {
        let mut c = Client::connect_tcp(p.tcp, token).expect("a session opens");
        let env = setup(&mut c);
        let kernel = kernel(&mut c, &env, SLOW, "slow");
        let out = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 8, None);
        set_arg(&mut c, kernel, 0, KernelArg::Object(out));
        set_arg(
            &mut c,
            kernel,
            2,
            KernelArg::Bytes(1u32.to_ne_bytes().to_vec()),
        );
        assert!(c.sync().is_empty());
        Slow { c, env, kernel }
    }

    fn launch(&mut self, n: u64) {
        set_arg(
            &mut self.c,
            self.kernel,
            1,
            KernelArg::Bytes(n.to_ne_bytes().to_vec()),
        );
        launch_one(&mut self.c, &self.env, self.kernel, Sync::default());
        assert!(self.c.sync().is_empty());
    }
}

/// A session that goes while its kernel still runs, past the teardown
/// timeout: what that kernel prints later is never given to the session
/// that is then the only other printer (it stays a printer until its queues
/// have drained, so the output cannot be told apart and is logged).
#[test]
fn a_late_kernel_of_a_closed_session_prints_to_nobody_else() {
    let p = ProxyProcess::start(&["--teardown-timeout", "1"]);
    let mut a = Slow::open(&p, TOKEN_A);
    // Calibrate: iterations for about 4 s, well past the teardown timeout.
    let n0 = 1u64 << 22;
    let t = Instant::now();
    a.launch(n0);
    let (st, _) = a.c.call(Call::Finish { queue: a.env.queue }, &[]);
    assert_eq!(st, Answer::Status(CL_SUCCESS));
    assert_eq!(
        String::from_utf8(a.c.take_output()).unwrap(),
        "tenant 1 late\n"
    );
    let per = t.elapsed().as_secs_f64().max(1e-3) / n0 as f64;
    let n = ((4.0 / per) as u64).max(n0);
    a.launch(n);
    let gone = Instant::now();
    drop(a);
    // Teardown gives up after 1 s; then b is the only session whose
    // programs print, while a's kernel runs on for about 3 s more.
    let mut b = Printer::open(&p, TOKEN_B, 2);
    let mut got = String::new();
    while gone.elapsed() < Duration::from_secs(8) {
        b.launch(1, 0);
        got += &b.finish();
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!got.contains("tenant 1"), "another session's output: {got}");
    // Once a's queue has drained, b gets its own output again.
    b.launch(2, 0);
    assert_eq!(b.finish(), b.lines(2));
}
