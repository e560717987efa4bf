//! Work that finishes after the call that started it: reads, Finish,
//! WaitForEvents, the host memory of non-blocking writes, and the client's
//! event callbacks.
//!
//! Asking NVIDIA for an event callback is costly: once one is registered,
//! every later command of the context takes longer to enqueue (a frame of 8
//! small kernels, a 4 KiB write and a read ran at 10–12k frames/s natively
//! with a callback on its write's event, 16–20k without). So callbacks are
//! asked for only where nothing cheaper completes the work:
//!
//! - The host memory of a non-blocking write is *staged*: kept with the
//!   command's event, and freed once the event's status says the command
//!   ended, checked when the session thread is about to wait for the client,
//!   at the next write, and by the completion thread's poll.
//! - What a client waits for (reads, Finish, WaitForEvents) goes to one of
//!   the session's two waiter threads, which block in clWaitForEvents and
//!   answer directly. Only when both waiters are busy (one may be stuck on a
//!   user event) is a vendor callback registered as well.
//! - The client's own event callbacks are vendor callbacks.
//!
//! A vendor callback runs on a vendor thread and only hands a message to the
//! session's completion thread, which writes the answer and releases the
//! event. A vendor thread therefore never blocks on a client's socket, and a
//! wait on a user event never stops the session thread from running the call
//! that sets it.
//!
//! Vendors do not always call back: PoCL 3.1 calls a callback only when
//! the event reaches exactly the status it was registered for, so a
//! command that fails (its wait list failed) never calls its CL_COMPLETE
//! callback, and a CL_RUNNING callback never comes for a user event. The
//! completion thread therefore also polls the status of its session's
//! pending events while any are pending, and completes those that nothing
//! else has. A registration's reference to its event is released only on
//! the completion thread, so polling never touches a released event.
//!
//! The vendor is handed a token, not a pointer: registrations live in one
//! table, and whichever of the vendor's callback, a waiter and the poll
//! takes a registration out of it completes it; the others find nothing.
//! Registrations without host memory (client callbacks, waits, finishes)
//! are dropped when their session ends; staged writes still running then
//! leave their host memory to the vendor.

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
use crate::pinned::HostBuf;
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
    /// Non-blocking writes in flight: their events and the host memory the
    /// vendor reads, in the order enqueued. No vendor callback is asked for
    /// them (registering one slows every later command of the context on
    /// NVIDIA); they are reaped by status ([`Inflight::reap`]).
    staged: Mutex<std::collections::VecDeque<(VPtr, HostBuf)>>,
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

    /// Frees the host memory of the staged writes whose commands have
    /// ended: all of them, or (`front_only`) those at the front of the
    /// list, up to the first still running (cheap, and enough for in-order
    /// queues). Returns how many are left.
    pub fn reap(&self, front_only: bool) -> usize {
        let mut done = Vec::new();
        let left = {
            let mut staged = self.staged.lock().unwrap_or_else(|e| e.into_inner());
            let mut i = 0;
            while i < staged.len() {
                if event_status(staged[i].0) <= CL_COMPLETE {
                    done.extend(staged.remove(i));
                } else if front_only {
                    break;
                } else {
                    i += 1;
                }
            }
            staged.len()
        };
        for (event, data) in done {
            self.free(data.len() as u64);
            self.buffers.recycle(data);
            release_event(event);
            self.callbacks.fetch_sub(1, Ordering::AcqRel);
        }
        left
    }

    /// At the end of the session: what is still running keeps its host
    /// memory (leaked, the vendor may still read it) and its event.
    fn abandon_staged(&self) -> usize {
        self.reap(false);
        let left: Vec<_> = self
            .staged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        let n = left.len();
        for (_, data) in left {
            std::mem::forget(data);
        }
        n
    }
}

/// What to do when an event completes.
pub(crate) enum What {
    /// A non-blocking read into `data`: answer `Data` with it.
    Read { seq: u64, data: HostBuf },
    /// The marker a Finish enqueued: answer `Status`, and record that the
    /// queue's first `upto` commands have completed.
    Finish {
        seq: u64,
        progress: Arc<QueueProgress>,
        upto: u64,
    },
    /// The host memory a non-blocking write reads from: free it.
    Staging { data: HostBuf },
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
        data: HostBuf,
        release: VPtr,
    },
    Release(VPtr),
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
    /// When a waited-for registration was made (only while tracing).
    since: Option<Instant>,
}

impl Pending {
    /// Counts how a waited-for registration was answered (tracing).
    fn traced(&self, by: fn(&crate::trace::Global) -> &AtomicU64) {
        if let Some(t) = self.since {
            let g = &*crate::trace::GLOBAL;
            crate::trace::add(by(g), 1);
            crate::trace::add(&g.answer_ns, crate::trace::ns(t));
        }
    }

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
                inflight.buffers.recycle(data);
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
                    inflight.buffers.recycle(data);
                    answer(seq, Answer::Data(status), HostBuf::default())
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
                answer(seq, Answer::Status(CL_SUCCESS), HostBuf::default())
            }
            What::Staging { data } => {
                inflight.free(data.len() as u64);
                inflight.buffers.recycle(data);
                Done::Release(event)
            }
            What::Fired { cookie } => {
                answer(0, Answer::EventFired { cookie, status }, HostBuf::default())
            }
            What::WaitOne(all) => match all.one_done(status) {
                Some(st) => answer(all.seq, Answer::Status(st), HostBuf::default()),
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
            p.traced(|g| &g.by_callback);
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
    /// Waiter threads running, and the waits queued for them or under way.
    waiters_running: AtomicUsize,
    waits_busy: Arc<AtomicUsize>,
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
            waiters_running: AtomicUsize::new(0),
            waits_busy: Arc::new(AtomicUsize::new(0)),
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
        let t0 = crate::trace::on().then(Instant::now);
        crate::session::retain_event(event);
        self.inflight.callbacks.fetch_add(1, Ordering::AcqRel);
        if let What::Staging { data } = what {
            // Reaped by status, not called back (see `Inflight::staged`).
            self.inflight.reap(true);
            self.inflight
                .staged
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back((event, data));
            return Ok(());
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
                since: t0.filter(|_| waited_for),
            },
        );
        // A wait that a free waiter thread takes needs no vendor callback
        // (which slows the context's later commands on NVIDIA): the waiter
        // completes it, or the poll if the waiter fails.
        if waited_for && self.wait_in_background(token, event) {
            return Ok(());
        }
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
        if let Some(t0) = t0 {
            let g = &*crate::trace::GLOBAL;
            crate::trace::add(&g.registrations, 1);
            crate::trace::add(&g.register_ns, crate::trace::ns(t0));
        }
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

    /// Hands a registration a client waits for to a waiter thread, which
    /// holds its own reference to the event meanwhile. True when a waiter
    /// was free to take it at once; otherwise (all waiters busy, maybe on
    /// user events) it is queued if there is room, and the caller also
    /// registers the vendor callback.
    fn wait_in_background(&self, token: usize, event: VPtr) -> bool {
        if !self.waiters_started.swap(true, Ordering::AcqRel) {
            let (tx, rx) = mpsc::sync_channel(WAITER_QUEUE);
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..WAITERS {
                let (rx, writer) = (rx.clone(), self.writer.clone());
                let busy = self.waits_busy.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("crane-wait-{}.{i}", self.session))
                    .spawn(move || waiter(&rx, &writer, &busy));
                match spawned {
                    Ok(_) => {
                        self.waiters_running.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(e) => limited!(log::Level::Warn, "cannot start a waiter thread: {e}"),
                }
            }
            *self.waiters.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        }
        crate::session::retain_event(event);
        let ahead = self.waits_busy.fetch_add(1, Ordering::AcqRel);
        let queued = match &*self.waiters.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(tx) => tx.try_send((token, event)).is_ok(),
            None => false,
        };
        if !queued {
            self.waits_busy.fetch_sub(1, Ordering::AcqRel);
            release_event(event);
            return false;
        }
        ahead < self.waiters_running.load(Ordering::Acquire)
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
fn waiter(rx: &Mutex<Receiver<(usize, VPtr)>>, writer: &Writer, busy: &AtomicUsize) {
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
                    p.traced(|g| &g.by_waiter);
                    p.answer_here(status, writer);
                }
            }
        }));
        // The waiter's own reference; the registration keeps its own.
        release_event(event);
        busy.fetch_sub(1, Ordering::AcqRel);
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
        if stopping.is_some() {
            inflight.reap(false);
        }
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
        // Polls on a timer rather than being woken for each new
        // registration: one wake-up every POLL per idle session.
        let until = match (owed_now, stopping) {
            (false, Some(d)) => Some(d),
            (_, None) => Some(next_poll),
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
        if Instant::now() >= next_poll {
            if owed_now {
                poll(owner);
                inflight.reap(false);
            }
            next_poll = Instant::now() + POLL;
        }
    }
    while let Ok(msg) = rx.try_recv() {
        handle(msg, writer, inflight, &mut stopping);
    }
    let abandoned = inflight.abandon_staged();
    if abandoned > 0 {
        limited!(
            log::Level::Warn,
            "{abandoned} write(s) still running when the session ended; their host memory stays with the vendor"
        );
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
            p.traced(|g| &g.by_poll);
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
            inflight.buffers.recycle(data);
            release_event(release);
        }
        Done::Release(e) => release_event(e),
        Done::Stop => {
            stopping.get_or_insert_with(|| Instant::now() + STOP_GRACE);
        }
    }
}
