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
//! Callbacks can also be late (NVIDIA delivers them tens of microseconds
//! after the command completed), which a client blocked in a read or a
//! clFinish pays for in full. So what a client waits for (reads, Finish,
//! WaitForEvents) is also handed to one of the session's two waiter
//! threads, which block in clWaitForEvents and answer directly. They only
//! speed things up: a waiter stuck on a user event costs nothing but its
//! place, the callback and the poll still complete everything.
//!
//! The vendor is handed a token, not a pointer: registrations live in one
//! table, and whichever of the vendor's callback, a waiter and the poll
//! takes a registration out of it completes it; the others find nothing.
//! Registrations without host memory (client callbacks, waits, finishes)
//! are dropped when their session ends.

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crane_wire::Answer;
use opencl_sys::*;

use crate::conn::Writer;
use crate::pool::BufferPool;
use crate::ratelimit::limited;
use crate::vendor::{VPtr, vfn};

/// How long a stopping completion thread waits for callbacks still owed.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How often pending events are polled (only while some are pending).
const POLL: Duration = Duration::from_millis(100);
/// Waiter threads per session, and the waits queued for them at most.
const WAITERS: usize = 2;
const WAITER_QUEUE: usize = 256;

/// What a session has in flight.
#[derive(Debug, Default)]
pub(crate) struct Inflight {
    /// Vendor callbacks registered and not yet run.
    pub callbacks: AtomicU64,
    /// Host bytes held for reads and writes still running.
    pub staging: AtomicU64,
    /// The same, summed over the proxy's sessions (for its statistics).
    pub proxy_staging: Arc<AtomicU64>,
    /// Host buffers kept for the next transfers.
    pub buffers: BufferPool,
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
    /// The marker a Finish enqueued: answer `Status`, and record that the
    /// queue's first `upto` commands have completed.
    Finish {
        seq: u64,
        progress: Arc<QueueProgress>,
        upto: u64,
    },
    /// The host memory a non-blocking write reads from: free it.
    Staging { data: Vec<u8> },
    /// The client's own callback registration: send `EventFired`.
    Fired { cookie: u64 },
    /// One of the events of a WaitForEvents.
    WaitOne(Arc<WaitAll>),
}

/// How far a queue's commands are known to have completed: `enqueued`
/// counts the commands the session has enqueued on it, `finished` how many
/// of the first ones a completed Finish covered. When they are equal the
/// queue is idle and a Finish needs no marker.
#[derive(Debug, Default)]
pub(crate) struct QueueProgress {
    pub enqueued: AtomicU64,
    pub finished: AtomicU64,
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
    /// Completes the registration from a vendor callback or the poll: the
    /// completion thread answers.
    fn fire(self, status: cl_int) {
        let (done, tx, inflight) = self.into_done(status);
        // The session may be gone; its events then stay with the vendor.
        let _ = tx.send(done);
        inflight.callbacks.fetch_sub(1, Ordering::AcqRel);
    }

    /// Completes the registration on a waiter thread: the answer goes out
    /// from here, the event's release to the completion thread.
    fn answer_here(self, status: cl_int, writer: &Writer) {
        let (done, tx, inflight) = self.into_done(status);
        let release = match done {
            Done::Answer {
                seq,
                answer,
                data,
                release,
            } => {
                writer.send(seq, &answer, &data);
                inflight.buffers.give(data);
                Done::Release(release)
            }
            other => other,
        };
        let _ = tx.send(release);
        inflight.callbacks.fetch_sub(1, Ordering::AcqRel);
    }

    fn into_done(self, status: cl_int) -> (Done, Sender<Done>, Arc<Inflight>) {
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
                    inflight.buffers.give(data);
                    answer(seq, Answer::Data(status), Vec::new())
                } else {
                    answer(seq, Answer::Data(CL_SUCCESS), data)
                }
            }
            What::Finish {
                seq,
                progress,
                upto,
            } => {
                if status >= 0 {
                    progress.finished.fetch_max(upto, Ordering::AcqRel);
                }
                answer(seq, Answer::Status(CL_SUCCESS), Vec::new())
            }
            What::Staging { data } => {
                inflight.free(data.len() as u64);
                inflight.buffers.give(data);
                Done::Release(event)
            }
            What::Fired { cookie } => answer(0, Answer::EventFired { cookie, status }, Vec::new()),
            What::WaitOne(all) => match all.one_done(status) {
                Some(st) => answer(all.seq, Answer::Status(st), Vec::new()),
                None => Done::Release(event),
            },
        };
        (done, tx, inflight)
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
    writer: Arc<Writer>,
    session: u64,
    /// The waiter threads' queue, started at the first wait.
    waiters: Mutex<Option<SyncSender<(usize, VPtr)>>>,
    waiters_started: AtomicBool,
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
                .spawn({
                    let writer = writer.clone();
                    move || run(rx, &writer, &inflight, owner)
                })?
        };
        Ok(Completion {
            owner,
            tx,
            inflight,
            thread: Some(thread),
            writer,
            session,
            waiters: Mutex::new(None),
            waiters_started: AtomicBool::new(false),
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
        let waited_for = matches!(
            what,
            What::Read { .. } | What::Finish { .. } | What::WaitOne(_)
        );
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
            if waited_for {
                self.wait_in_background(token, event);
            }
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

    /// Hands a registration a client waits for to a waiter thread, which
    /// holds its own reference to the event meanwhile. When the waiters are
    /// busy and their queue full, the callback and the poll do the work.
    fn wait_in_background(&self, token: usize, event: VPtr) {
        if !self.waiters_started.swap(true, Ordering::AcqRel) {
            let (tx, rx) = mpsc::sync_channel(WAITER_QUEUE);
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..WAITERS {
                let (rx, writer) = (rx.clone(), self.writer.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("crane-wait-{}.{i}", self.session))
                    .spawn(move || waiter(&rx, &writer));
                if let Err(e) = spawned {
                    limited!(log::Level::Warn, "cannot start a waiter thread: {e}");
                }
            }
            *self.waiters.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        }
        crate::session::retain_event(event);
        let queued = match &*self.waiters.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(tx) => tx.try_send((token, event)).is_ok(),
            None => false,
        };
        if !queued {
            release_event(event);
        }
    }

    /// Stops the thread once the callbacks still owed have run (or after a
    /// grace period), and waits for it. Waiter threads end once their queue
    /// is empty (one blocked on the device is left to finish on its own).
    pub fn stop(&mut self) {
        self.waiters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
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

/// A waiter thread: blocks in clWaitForEvents for each queued registration
/// and, if nothing else completed it meanwhile, answers it.
fn waiter(rx: &Mutex<Receiver<(usize, VPtr)>>, writer: &Writer) {
    loop {
        let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok((token, event)) = job else {
            return;
        };
        let _ = catch_unwind(AssertUnwindSafe(|| {
            wait_synchronously(event);
            // A wait that ended otherwise than with the command (an error
            // of the wait itself) is left to the callback and the poll.
            let status = event_status(event);
            if status <= CL_COMPLETE {
                let taken = pending().remove(&token);
                if let Some(p) = taken {
                    p.answer_here(status, writer);
                }
            }
        }));
        // The waiter's own reference; the registration keeps its own.
        release_event(event);
    }
}

/// An event's execution status, or CL_QUEUED if it cannot be read.
pub(crate) fn event_status(event: VPtr) -> cl_int {
    let Ok(info) = vfn!(event.get(), clGetEventInfo) else {
        return CL_QUEUED;
    };
    let mut status: cl_int = CL_QUEUED;
    // SAFETY: the caller holds a reference to `event`; the value is one
    // cl_int.
    let rc = unsafe {
        info(
            event.get().cast(),
            CL_EVENT_COMMAND_EXECUTION_STATUS,
            size_of::<cl_int>(),
            (&raw mut status).cast(),
            std::ptr::null_mut(),
        )
    };
    if rc == CL_SUCCESS { status } else { CL_QUEUED }
}

fn wait_synchronously(event: VPtr) -> cl_int {
    let Ok(wait) = vfn!(event.get(), clWaitForEvents) else {
        return CL_INVALID_OPERATION;
    };
    let e: cl_event = event.get().cast();
    // SAFETY: one live event.
    let rc = unsafe { wait(1, &e) };
    // The event's own status says how it ended (failed events make the
    // wait return an error too).
    match event_status(event) {
        st if st <= CL_COMPLETE => st,
        _ if rc != CL_SUCCESS => rc,
        _ => CL_COMPLETE,
    }
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
            Ok(m) => handle(m, writer, inflight, &mut stopping),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if owed_now && Instant::now() >= next_poll {
            poll(owner);
            next_poll = Instant::now() + POLL;
        }
    }
    while let Ok(msg) = rx.try_recv() {
        handle(msg, writer, inflight, &mut stopping);
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
        let status = event_status(event);
        if status > trigger.max(CL_COMPLETE) {
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

fn handle(msg: Done, writer: &Writer, inflight: &Inflight, stopping: &mut Option<Instant>) {
    match msg {
        Done::Answer {
            seq,
            answer,
            data,
            release,
        } => {
            writer.send(seq, &answer, &data);
            inflight.buffers.give(data);
            release_event(release);
        }
        Done::Release(e) => release_event(e),
        Done::Wake => {}
        Done::Stop => {
            stopping.get_or_insert_with(|| Instant::now() + STOP_GRACE);
        }
    }
}
