//! Work that finishes after the call that started it: reads, Finish,
//! WaitForEvents, the host memory of non-blocking writes, and the client's
//! event callbacks. Each registers a vendor event callback; the callback runs
//! on a vendor thread and only hands a message to the session's completion
//! thread, which writes the answer and releases the event. A vendor thread
//! therefore never blocks on a client's socket, and a wait on a user event
//! never stops the session thread from running the call that sets it.
//!
//! Vendors do not always call back: PoCL 3.1 calls a callback only when
//! the event reaches exactly the status it was registered for, so a
//! command that fails (its wait list failed) never calls its CL_COMPLETE
//! callback, and a CL_RUNNING callback never comes for a user event. The
//! completion thread therefore also polls the status of its session's
//! pending events while any are pending, and completes those the vendor
//! has finished but not reported. A registration's reference to its event
//! is released only on the completion thread, so polling never touches a
//! released event.
//!
//! The vendor is handed a token, not a pointer: registrations live in one
//! table, and whichever of the vendor's callback and the poll takes a
//! registration out of it completes it; the other finds nothing.
//! Registrations without host memory (client callbacks, waits, finishes)
//! are dropped when their session ends.

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crane_wire::Answer;
use opencl_sys::*;

use crate::conn::Writer;
use crate::ratelimit::limited;
use crate::vendor::{VPtr, vfn};

/// How long a stopping completion thread waits for callbacks still owed.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How often pending events are polled (only while some are pending).
const POLL: Duration = Duration::from_millis(100);

/// What a session has in flight.
#[derive(Debug, Default)]
pub(crate) struct Inflight {
    /// Vendor callbacks registered and not yet run.
    pub callbacks: AtomicU64,
    /// Host bytes held for reads and writes still running.
    pub staging: AtomicU64,
    /// The same, summed over the proxy's sessions (for its statistics).
    pub proxy_staging: Arc<AtomicU64>,
}

impl Inflight {
    pub fn hold(&self, bytes: u64) {
        self.staging.fetch_add(bytes, Ordering::AcqRel);
        self.proxy_staging.fetch_add(bytes, Ordering::AcqRel);
    }

    fn free(&self, bytes: u64) {
        self.staging.fetch_sub(bytes, Ordering::AcqRel);
        self.proxy_staging.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// What to do when an event completes.
pub(crate) enum What {
    /// A non-blocking read into `data`: answer `Data` with it.
    Read { seq: u64, data: Vec<u8> },
    /// The marker a Finish enqueued: answer `Status`.
    Finish { seq: u64 },
    /// The host memory a non-blocking write reads from: free it.
    Staging { data: Vec<u8> },
    /// The client's own callback registration: send `EventFired`.
    Fired { cookie: u64 },
    /// One of the events of a WaitForEvents.
    WaitOne(Arc<WaitAll>),
}

/// A WaitForEvents in progress: answered when its last event completes.
pub(crate) struct WaitAll {
    seq: u64,
    remaining: AtomicUsize,
    failed: AtomicBool,
}

impl WaitAll {
    pub fn new(seq: u64, events: usize) -> Arc<WaitAll> {
        Arc::new(WaitAll {
            seq,
            remaining: AtomicUsize::new(events),
            failed: AtomicBool::new(false),
        })
    }

    /// Records one event's final status; the answer once all are in.
    fn one_done(&self, status: cl_int) -> Option<cl_int> {
        if status < 0 {
            self.failed.store(true, Ordering::Relaxed);
        }
        (self.remaining.fetch_sub(1, Ordering::AcqRel) == 1).then(|| {
            if self.failed.load(Ordering::Relaxed) {
                CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST
            } else {
                CL_SUCCESS
            }
        })
    }
}

enum Done {
    Answer {
        seq: u64,
        answer: Answer,
        data: Vec<u8>,
        release: VPtr,
    },
    Release(VPtr),
    /// Something is pending now: start polling.
    Wake,
    Stop,
}

/// The user data of one vendor callback registration.
struct Pending {
    /// The [`Completion`] that registered it.
    owner: u64,
    /// The status the registration waits for.
    trigger: cl_int,
    tx: Sender<Done>,
    inflight: Arc<Inflight>,
    /// The callback's own reference to the event, released by the
    /// completion thread.
    event: VPtr,
    what: What,
}

impl Pending {
    fn fire(self, status: cl_int) {
        let Pending {
            tx,
            inflight,
            event,
            what,
            ..
        } = self;
        let answer = |seq, answer, data| Done::Answer {
            seq,
            answer,
            data,
            release: event,
        };
        let done = match what {
            What::Read { seq, data } => {
                inflight.free(data.len() as u64);
                if status < 0 {
                    answer(seq, Answer::Data(status), Vec::new())
                } else {
                    answer(seq, Answer::Data(CL_SUCCESS), data)
                }
            }
            What::Finish { seq } => answer(seq, Answer::Status(CL_SUCCESS), Vec::new()),
            What::Staging { data } => {
                inflight.free(data.len() as u64);
                drop(data);
                Done::Release(event)
            }
            What::Fired { cookie } => answer(0, Answer::EventFired { cookie, status }, Vec::new()),
            What::WaitOne(all) => match all.one_done(status) {
                Some(st) => answer(all.seq, Answer::Status(st), Vec::new()),
                None => Done::Release(event),
            },
        };
        // The session may be gone; its events then stay with the vendor.
        let _ = tx.send(done);
        inflight.callbacks.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Registrations whose callbacks have not come yet, by token.
static PENDING: LazyLock<Mutex<HashMap<usize, Pending>>> = LazyLock::new(Mutex::default);
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(1);

fn pending() -> MutexGuard<'static, HashMap<usize, Pending>> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// The vendor callback: runs on a vendor thread, hands over, returns.
unsafe extern "C" fn on_event(_event: cl_event, status: cl_int, user_data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // The token may be gone: its session ended and dropped it.
        let found = pending().remove(&(user_data as usize));
        if let Some(p) = found {
            p.fire(status);
        }
    }));
}

fn release_event(e: VPtr) {
    if let Ok(f) = vfn!(e.get(), clReleaseEvent) {
        // SAFETY: `e` holds a reference the proxy owns.
        unsafe { f(e.get().cast()) };
    }
}

/// A session's completion thread and the way to it.
pub(crate) struct Completion {
    /// Unique in the process (session ids are unique only per proxy).
    owner: u64,
    tx: Sender<Done>,
    pub inflight: Arc<Inflight>,
    thread: Option<JoinHandle<()>>,
}

impl Completion {
    pub fn start(
        writer: Arc<Writer>,
        session: u64,
        proxy_staging: Arc<AtomicU64>,
    ) -> std::io::Result<Completion> {
        let (tx, rx) = mpsc::channel();
        let inflight = Arc::new(Inflight {
            proxy_staging,
            ..Inflight::default()
        });
        static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);
        let owner = NEXT_OWNER.fetch_add(1, Ordering::Relaxed);
        let thread = {
            let inflight = inflight.clone();
            std::thread::Builder::new()
                .name(format!("crane-done-{session}"))
                .spawn(move || run(rx, &writer, &inflight, owner))?
        };
        Ok(Completion {
            owner,
            tx,
            inflight,
            thread: Some(thread),
        })
    }

    /// Calls back `what` when `event` reaches `trigger` (or fails). The
    /// event is retained for the callback. When the vendor refuses the
    /// registration, a `Fired` registration gives the vendor's error; any
    /// other is waited for here (host memory the vendor uses is involved),
    /// so that it is still answered and freed.
    pub fn register(&self, event: VPtr, trigger: cl_int, what: What) -> Result<(), cl_int> {
        if event.get().is_null() {
            // A vendor that enqueued without giving the event asked for:
            // the command may still use the host memory, so it is leaked.
            std::mem::forget(what);
            return Err(CL_OUT_OF_RESOURCES);
        }
        crate::session::retain_event(event);
        if self.inflight.callbacks.fetch_add(1, Ordering::AcqRel) == 0 {
            // The completion thread sleeps without a timeout while nothing
            // is pending: wake it so that it polls.
            let _ = self.tx.send(Done::Wake);
        }
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        pending().insert(
            token,
            Pending {
                owner: self.owner,
                trigger,
                tx: self.tx.clone(),
                inflight: self.inflight.clone(),
                event,
                what,
            },
        );
        let rc = match vfn!(event.get(), clSetEventCallback) {
            // SAFETY: `on_event` matches the callback signature; the user
            // data is a token, never dereferenced.
            Ok(set_cb) => unsafe {
                set_cb(
                    event.get().cast(),
                    trigger,
                    Some(on_event),
                    token as *mut c_void,
                )
            },
            Err(e) => e,
        };
        if rc == CL_SUCCESS {
            return Ok(());
        }
        let Some(p) = pending().remove(&token) else {
            // The vendor refused, yet called back: nothing is left to do.
            return Ok(());
        };
        if let What::Fired { .. } = p.what {
            self.inflight.callbacks.fetch_sub(1, Ordering::AcqRel);
            let _ = self.tx.send(Done::Release(event));
            return Err(rc);
        }
        limited!(
            log::Level::Warn,
            "the vendor refused an event callback ({rc}); waiting for the event on the session thread"
        );
        let status = wait_synchronously(event);
        p.fire(status);
        Ok(())
    }

    /// Drops the registrations of this session that hold no host memory
    /// (client callbacks, waits, finishes): the session is ending, their
    /// answers have nowhere to go, and their callbacks may never come.
    pub fn drop_waits(&self) -> usize {
        let dropped: Vec<Pending> = {
            let mut map = pending();
            let tokens: Vec<usize> = map
                .iter()
                .filter(|(_, p)| {
                    p.owner == self.owner
                        && matches!(
                            p.what,
                            What::Fired { .. } | What::WaitOne(_) | What::Finish { .. }
                        )
                })
                .map(|(&t, _)| t)
                .collect();
            tokens.iter().filter_map(|t| map.remove(t)).collect()
        };
        for p in &dropped {
            let _ = self.tx.send(Done::Release(p.event));
            self.inflight.callbacks.fetch_sub(1, Ordering::AcqRel);
        }
        dropped.len()
    }

    /// Stops the thread once the callbacks still owed have run (or after a
    /// grace period), and waits for it.
    pub fn stop(&mut self) {
        let _ = self.tx.send(Done::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        self.stop();
    }
}

fn wait_synchronously(event: VPtr) -> cl_int {
    let Ok(wait) = vfn!(event.get(), clWaitForEvents) else {
        return CL_INVALID_OPERATION;
    };
    let e: cl_event = event.get().cast();
    // SAFETY: one live event.
    let rc = unsafe { wait(1, &e) };
    if rc == CL_SUCCESS { CL_COMPLETE } else { rc }
}

fn run(rx: Receiver<Done>, writer: &Writer, inflight: &Inflight, owner: u64) {
    let mut stopping: Option<Instant> = None;
    let mut next_poll = Instant::now() + POLL;
    loop {
        let owed_now = inflight.callbacks.load(Ordering::Acquire) > 0;
        if let Some(deadline) = stopping {
            if !owed_now {
                break;
            }
            if Instant::now() >= deadline {
                limited!(
                    log::Level::Warn,
                    "event callbacks still owed when the session ended ({}); their events and host memory stay with the vendor",
                    owed(owner)
                );
                break;
            }
        }
        let until = match (owed_now, stopping) {
            (false, None) => None,
            (false, Some(d)) => Some(d),
            (true, None) => Some(next_poll),
            (true, Some(d)) => Some(next_poll.min(d)),
        };
        let msg = match until {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(t) => rx.recv_timeout(t.saturating_duration_since(Instant::now())),
        };
        match msg {
            Ok(m) => handle(m, writer, &mut stopping),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if owed_now && Instant::now() >= next_poll {
            poll(owner);
            next_poll = Instant::now() + POLL;
        }
    }
    while let Ok(msg) = rx.try_recv() {
        handle(msg, writer, &mut stopping);
    }
}

/// Completes the registrations of `owner` whose events the vendor has
/// finished (or failed) without calling back. Runs on the completion
/// thread, which alone releases registrations' events: the events
/// snapshotted here stay alive while they are queried.
fn poll(owner: u64) {
    let snapshot: Vec<(usize, VPtr, cl_int)> = pending()
        .iter()
        .filter(|(_, p)| p.owner == owner)
        .map(|(&t, p)| (t, p.event, p.trigger))
        .collect();
    for (token, event, trigger) in snapshot {
        let Ok(info) = vfn!(event.get(), clGetEventInfo) else {
            continue;
        };
        let mut status: cl_int = CL_QUEUED;
        // SAFETY: the registration holds a reference to `event`, released
        // only by this thread; the value is one cl_int.
        let rc = unsafe {
            info(
                event.get().cast(),
                CL_EVENT_COMMAND_EXECUTION_STATUS,
                size_of::<cl_int>(),
                (&raw mut status).cast(),
                std::ptr::null_mut(),
            )
        };
        if rc != CL_SUCCESS || status > trigger.max(CL_COMPLETE) {
            continue;
        }
        let taken = pending().remove(&token);
        if let Some(p) = taken {
            // As a vendor would report it: the registered status, or the
            // error the command ended with.
            p.fire(if status < 0 { status } else { trigger });
        }
    }
}

/// What an owner's registrations still wait for, for the log.
fn owed(owner: u64) -> String {
    let (mut reads, mut writes, mut other) = (0, 0, 0);
    for p in pending().values().filter(|p| p.owner == owner) {
        match p.what {
            What::Read { .. } => reads += 1,
            What::Staging { .. } => writes += 1,
            _ => other += 1,
        }
    }
    format!("{reads} read(s), {writes} write(s), {other} other")
}

fn handle(msg: Done, writer: &Writer, stopping: &mut Option<Instant>) {
    match msg {
        Done::Answer {
            seq,
            answer,
            data,
            release,
        } => {
            writer.send(seq, &answer, &data);
            release_event(release);
        }
        Done::Release(e) => release_event(e),
        Done::Wake => {}
        Done::Stop => {
            stopping.get_or_insert_with(|| Instant::now() + STOP_GRACE);
        }
    }
}
