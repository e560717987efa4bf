//! The gate every entry point passes, so that suspend can stop the application's
//! OpenCL calls and wait for those in flight.
//!
//! The fast path must cost a few nanoseconds (the whole per-call budget is
//! 10 ns), so it uses no read-modify-write instruction and no fence: each thread
//! announces "inside an OpenCL call" with a plain store to its own slot, and the
//! rare suspender pays for the ordering with `membarrier(2)`, which runs a full
//! barrier on every thread of the process (the asymmetric Dekker pattern used by
//! userspace RCU). Where membarrier is unavailable the fast path falls back to a
//! SeqCst fence.
//!
//! States: `OPEN`; `QUIESCING` (new calls wait, except those that can complete
//! work others are waiting on, such as `clSetUserEventStatus`); `CLOSED` (every
//! call waits). Nested calls (an application callback calling OpenCL from inside
//! a vendor call) always pass: the outer call is already counted.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering, compiler_fence, fence};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

pub const OPEN: u32 = 0;
pub const QUIESCING: u32 = 1;
pub const CLOSED: u32 = 2;

static STATE: AtomicU32 = AtomicU32::new(OPEN);
/// What the fast path reads: `STATE`, with `SLOW_PATH` added while the
/// process runs without membarrier, so that one load and one compare decide
/// every call that may simply pass.
static FAST: AtomicU32 = AtomicU32::new(OPEN);
const SLOW_PATH: u32 = 1 << 8;
static WAKE: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
static MEMBARRIER_OK: AtomicBool = AtomicBool::new(false);
static INIT: std::sync::Once = std::sync::Once::new();

/// One per thread that has ever called into crane; never freed, reused after the
/// thread exits.
struct ThreadSlot {
    depth: AtomicU32,
    in_use: AtomicBool,
}

static THREADS: Mutex<Vec<&'static ThreadSlot>> = Mutex::new(Vec::new());

thread_local! {
    static OWNER: SlotOwner = const { SlotOwner };
}

struct SlotOwner;
impl Drop for SlotOwner {
    fn drop(&mut self) {
        if let Some(s) = mine::get() {
            // A call from a later destructor of this thread registers anew.
            mine::set(None);
            s.in_use.store(false, Ordering::Release);
        }
    }
}

/// This thread's slot, in one word of initial-exec ("static") TLS.
///
/// `thread_local!` in a shared library compiles to the general-dynamic TLS
/// model: every entry point would call `__tls_get_addr` through the PLT, a
/// good part of the 10 ns budget. Rust has no stable way to pick the TLS
/// model, so on x86-64 Linux the word is declared in assembly (`.tbss`) and
/// read `%fs`-relative through its GOT slot, which is what C compiled with
/// `-ftls-model=initial-exec` does (Mesa's and glibc's own dispatch code do
/// the same). The price is 8 bytes of the static TLS block; when the library
/// is dlopen()ed (ICD mode) glibc takes them from the surplus it keeps for
/// exactly this (the link marks the library DF_STATIC_TLS).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod mine {
    use super::ThreadSlot;

    std::arch::global_asm!(
        ".pushsection .tbss.crane_gate_mine,\"awT\",@nobits",
        ".p2align 3",
        ".globl crane_gate_mine",
        ".hidden crane_gate_mine",
        ".type crane_gate_mine,@object",
        ".size crane_gate_mine,8",
        "crane_gate_mine:",
        ".zero 8",
        ".popsection",
    );

    #[inline(always)]
    pub fn get() -> Option<&'static ThreadSlot> {
        let p: *const ThreadSlot;
        // SAFETY: reads this thread's own TLS word (offset from the GOT,
        // base in %fs); it touches nothing else.
        unsafe {
            std::arch::asm!(
                "mov {p}, qword ptr [rip + crane_gate_mine@GOTTPOFF]",
                "mov {p}, qword ptr fs:[{p}]",
                p = out(reg) p,
                options(nostack, readonly, preserves_flags),
            );
        }
        // SAFETY: the word is null or a slot from `register`, leaked and
        // never freed.
        unsafe { p.as_ref() }
    }

    pub fn set(slot: Option<&'static ThreadSlot>) {
        let p: *const ThreadSlot = slot.map_or(std::ptr::null(), |s| s);
        // SAFETY: writes this thread's own TLS word and nothing else.
        unsafe {
            std::arch::asm!(
                "mov {t}, qword ptr [rip + crane_gate_mine@GOTTPOFF]",
                "mov qword ptr fs:[{t}], {p}",
                t = out(reg) _,
                p = in(reg) p,
                options(nostack, preserves_flags),
            );
        }
    }
}

/// Elsewhere: the same word through `thread_local!`.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod mine {
    use super::ThreadSlot;
    use std::cell::Cell;

    thread_local! {
        static MINE: Cell<Option<&'static ThreadSlot>> = const { Cell::new(None) };
    }

    #[inline(always)]
    pub fn get() -> Option<&'static ThreadSlot> {
        MINE.try_with(Cell::get).ok().flatten()
    }

    pub fn set(slot: Option<&'static ThreadSlot>) {
        let _ = MINE.try_with(|m| m.set(slot));
    }
}

fn init() {
    INIT.call_once(|| {
        // CRANE_MEMBARRIER=0 keeps the process off membarrier (every call then
        // takes the fenced path).
        let off = std::env::var_os("CRANE_MEMBARRIER").is_some_and(|v| v == "0");
        // SAFETY: membarrier takes (cmd, flags, cpu_id) and touches no memory of ours.
        let ok = !off
            && unsafe {
                libc::syscall(
                    libc::SYS_membarrier,
                    libc::MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                    0,
                    0,
                )
            } == 0;
        MEMBARRIER_OK.store(ok, Ordering::Release);
        // `shut` and `open` call `init` first, so the state cannot change
        // before this store.
        FAST.store(fast_word(STATE.load(Ordering::SeqCst)), Ordering::SeqCst);
    });
}

/// The `FAST` word for gate state `state`.
fn fast_word(state: u32) -> u32 {
    if MEMBARRIER_OK.load(Ordering::Acquire) {
        state
    } else {
        state | SLOW_PATH
    }
}

#[cold]
fn register() -> &'static ThreadSlot {
    init();
    let mut all = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    let slot = match all.iter().find(|s| {
        s.in_use
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) {
        Some(s) => *s,
        None => {
            let s: &'static ThreadSlot = Box::leak(Box::new(ThreadSlot {
                depth: AtomicU32::new(0),
                in_use: AtomicBool::new(true),
            }));
            all.push(s);
            s
        }
    };
    mine::set(Some(slot));
    // Touch OWNER so its destructor runs when this thread exits. `try_with`:
    // a call from another thread-local destructor, after OWNER's own has run,
    // must not panic here, outside every catch_unwind (the slot then stays
    // marked in use, which costs one leaked slot).
    let _ = OWNER.try_with(|_| ());
    slot
}

/// Proof that the current thread is inside an entry point; leaving the entry
/// point drops it.
pub struct Pass(&'static ThreadSlot);

impl Drop for Pass {
    #[inline(always)]
    fn drop(&mut self) {
        let d = self.0.depth.load(Ordering::Relaxed);
        self.0.depth.store(d - 1, Ordering::Release);
    }
}

/// Enters an entry point; blocks while the gate is shut for this call.
#[inline(always)]
pub fn enter(exempt_while_quiescing: bool) -> Pass {
    let slot = match mine::get() {
        Some(s) => s,
        None => register(),
    };
    let d = slot.depth.load(Ordering::Relaxed);
    slot.depth.store(d + 1, Ordering::Relaxed);
    // With membarrier the suspender pays for the ordering (module comment);
    // without it `FAST` is never OPEN and `enter_slow` fences.
    compiler_fence(Ordering::SeqCst);
    if FAST.load(Ordering::Acquire) == OPEN || d > 0 {
        return Pass(slot);
    }
    enter_slow(slot, exempt_while_quiescing)
}

/// The rest of [`enter`]: the gate is not open, or the process has no
/// membarrier.
#[cold]
#[inline(never)]
fn enter_slow(slot: &'static ThreadSlot, exempt: bool) -> Pass {
    fence(Ordering::SeqCst);
    let state = STATE.load(Ordering::Acquire);
    if state == OPEN || (state == QUIESCING && exempt) {
        return Pass(slot);
    }
    wait_open(slot, exempt)
}

#[cold]
#[inline(never)]
fn wait_open(slot: &'static ThreadSlot, exempt: bool) -> Pass {
    loop {
        slot.depth.store(0, Ordering::Release);
        {
            let mut g = WAKE.0.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                let s = STATE.load(Ordering::Acquire);
                if s == OPEN || (s == QUIESCING && exempt) {
                    break;
                }
                g = WAKE.1.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        }
        slot.depth.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let s = STATE.load(Ordering::Acquire);
        if s == OPEN || (s == QUIESCING && exempt) {
            return Pass(slot);
        }
    }
}

/// Enters crane from a vendor callback: never waits (the vendor may be inside
/// a call the suspender is waiting for), but counts as inside, so that suspend
/// waits for the application's callback to return.
pub fn enter_callback() -> Pass {
    let slot = match mine::get() {
        Some(s) => s,
        None => register(),
    };
    let d = slot.depth.load(Ordering::Relaxed);
    slot.depth.store(d + 1, Ordering::Release);
    Pass(slot)
}

fn heavy_barrier() {
    if MEMBARRIER_OK.load(Ordering::Acquire) {
        // SAFETY: see `init`.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                libc::MEMBARRIER_CMD_PRIVATE_EXPEDITED,
                0,
                0,
            );
        }
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The longest pause between two looks at the threads still inside a call
/// while the gate shuts: what a late call's exit may add to a suspend.
const MAX_SHUT_PAUSE: Duration = Duration::from_millis(2);

/// Moves the gate to `state` and, unless it opens it, waits up to `deadline` for
/// every call that the new state does not admit to leave. On timeout the gate is
/// left in `state` and the number of threads still inside is returned.
pub fn shut(state: u32, deadline: Instant) -> Result<(), usize> {
    init();
    STATE.store(state, Ordering::SeqCst);
    FAST.store(fast_word(state), Ordering::SeqCst);
    heavy_barrier();
    // The caller (the control thread) is never inside an entry point itself.
    let me = mine::get();
    // Calls usually leave within microseconds; one that does not (a program
    // build, a long wait) is waited for with a growing pause, so that the
    // waiting costs no CPU the application's own threads need (a 200 µs poll
    // took most of a slow guest's only CPU while a build ran).
    let mut pause = Duration::from_micros(20);
    loop {
        let busy = THREADS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|s| me.is_none_or(|m| !std::ptr::eq(**s, m)))
            .filter(|s| s.depth.load(Ordering::Acquire) > 0)
            .count();
        if busy == 0 {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(busy);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(MAX_SHUT_PAUSE);
    }
}

/// Whether application calls pass (neither quiescing nor closed).
pub fn is_open() -> bool {
    STATE.load(Ordering::Acquire) == OPEN
}

pub fn open() {
    init();
    let _g = WAKE.0.lock().unwrap_or_else(|e| e.into_inner());
    STATE.store(OPEN, Ordering::SeqCst);
    FAST.store(fast_word(OPEN), Ordering::SeqCst);
    WAKE.1.notify_all();
}
