//! Work that finishes after the call that started it: reads, Finish,
//! WaitForEvents, the host memory of non-blocking writes, and the client's
//! event callbacks. Each registers a vendor event callback; the callback runs
//! on a vendor thread and only hands a message to the session's completion
//! thread, which writes the answer and releases the event. A vendor thread
//! therefore never blocks on a client's socket, and a wait on a user event
//! never stops the session thread from running the call that sets it.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crane_wire::Answer;
use opencl_sys::*;

use crate::conn::Writer;
use crate::ratelimit::limited;
use crate::vendor::{VPtr, vfn};

/// How long a stopping completion thread waits for callbacks still owed.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// What a session has in flight.
#[derive(Debug, Default)]
pub(crate) struct Inflight {
    /// Vendor callbacks registered and not yet run.
    pub callbacks: AtomicU64,
    /// Host bytes held for reads and writes still running.
    pub staging: AtomicU64,
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
    Stop,
}

/// The user data of one vendor callback registration.
struct Pending {
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
        } = self;
        let answer = |seq, answer, data| Done::Answer {
            seq,
            answer,
            data,
            release: event,
        };
        let done = match what {
            What::Read { seq, data } => {
                inflight
                    .staging
                    .fetch_sub(data.len() as u64, Ordering::Relaxed);
                if status < 0 {
                    answer(seq, Answer::Data(status), Vec::new())
                } else {
                    answer(seq, Answer::Data(CL_SUCCESS), data)
                }
            }
            What::Finish { seq } => answer(seq, Answer::Status(CL_SUCCESS), Vec::new()),
            What::Staging { data } => {
                inflight
                    .staging
                    .fetch_sub(data.len() as u64, Ordering::Relaxed);
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

/// The vendor callback: runs on a vendor thread, hands over, returns.
unsafe extern "C" fn on_event(_event: cl_event, status: cl_int, user_data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `user_data` is the Box that `register` leaked for exactly
        // one registration, and the vendor calls each registration once.
        let pending = unsafe { Box::from_raw(user_data.cast::<Pending>()) };
        pending.fire(status);
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
    tx: Sender<Done>,
    pub inflight: Arc<Inflight>,
    thread: Option<JoinHandle<()>>,
}

impl Completion {
    pub fn start(writer: Arc<Writer>, session: u64) -> std::io::Result<Completion> {
        let (tx, rx) = mpsc::channel();
        let inflight = Arc::new(Inflight::default());
        let thread = {
            let inflight = inflight.clone();
            std::thread::Builder::new()
                .name(format!("crane-done-{session}"))
                .spawn(move || run(rx, &writer, &inflight))?
        };
        Ok(Completion {
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
        self.inflight.callbacks.fetch_add(1, Ordering::AcqRel);
        let pending = Box::new(Pending {
            tx: self.tx.clone(),
            inflight: self.inflight.clone(),
            event,
            what,
        });
        let (pending, rc) = match vfn!(event.get(), clSetEventCallback) {
            Ok(set_cb) => {
                let raw = Box::into_raw(pending);
                // SAFETY: `on_event` matches the callback signature; `raw`
                // stays valid until the callback takes it back.
                let rc = unsafe { set_cb(event.get().cast(), trigger, Some(on_event), raw.cast()) };
                if rc == CL_SUCCESS {
                    return Ok(());
                }
                // SAFETY: the vendor refused the registration, so `raw` is
                // still ours.
                (unsafe { Box::from_raw(raw) }, rc)
            }
            Err(e) => (pending, e),
        };
        if let What::Fired { .. } = pending.what {
            self.inflight.callbacks.fetch_sub(1, Ordering::AcqRel);
            release_event(event);
            return Err(rc);
        }
        limited!(
            log::Level::Warn,
            "the vendor refused an event callback ({rc}); waiting for the event on the session thread"
        );
        let status = wait_synchronously(event);
        pending.fire(status);
        Ok(())
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

fn run(rx: Receiver<Done>, writer: &Writer, inflight: &Inflight) {
    let mut stopping: Option<Instant> = None;
    loop {
        let msg = match stopping {
            None => match rx.recv() {
                Ok(m) => m,
                Err(_) => break,
            },
            Some(deadline) => {
                if inflight.callbacks.load(Ordering::Acquire) == 0 {
                    break;
                }
                match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(m) => m,
                    Err(RecvTimeoutError::Timeout) => {
                        limited!(
                            log::Level::Warn,
                            "{} event callback(s) still owed when the session ended; their events stay with the vendor",
                            inflight.callbacks.load(Ordering::Acquire)
                        );
                        break;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
        };
        handle(msg, writer, &mut stopping);
    }
    while let Ok(msg) = rx.try_recv() {
        handle(msg, writer, &mut stopping);
    }
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
        Done::Stop => {
            stopping.get_or_insert_with(|| Instant::now() + STOP_GRACE);
        }
    }
}
