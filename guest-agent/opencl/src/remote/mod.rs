//! Remoting: crane-proxy presented to the rest of the library as one more
//! vendor library.
//!
//! The interposer reaches a vendor only through the ICD dispatch table at the
//! start of each vendor object. In remote mode the "vendor objects" are
//! [`RObj`]s whose table ([`api::DISPATCH`]) turns each call into a message of
//! the wire protocol (crate `crane-wire`). Everything above this layer
//! (tracking, dirty bits, suspend and recreate) is the same code in both
//! modes, so going remote is a suspend followed by a resume onto the proxy,
//! and coming back is a suspend from the proxy followed by a resume onto the
//! local vendor library: the proxy receives exactly the state a reload would,
//! and only what the proxy dirtied comes back.

pub mod ahead;
pub mod api;
pub mod check;
pub mod fallback;
pub mod includes;
pub mod journal;
pub mod lanes;
pub mod session;

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crane_wire::{Answer, Call, Id, KernelArg};
use opencl_sys::cl_icd::_cl_icd_dispatch;
use opencl_sys::*;

pub use session::Session;

/// A remote object: what crane's shadow objects hold as their "vendor"
/// pointer while remoting.
#[repr(C)]
pub struct RObj {
    /// First, as in every ICD object.
    dispatch: *const _cl_icd_dispatch,
    pub id: Id,
    pub session: Arc<Session>,
    refs: AtomicU32,
    /// Reads whose data has not landed yet (events and queues).
    pub pending: AtomicU32,
    /// Bytes per pixel, for images.
    pub px: usize,
    /// Destructor callbacks (function, user data), run after the last release.
    destructors: Mutex<Vec<(usize, usize)>>,
    /// For queues: reads sent but whose data has not landed, by ticket in
    /// the order they were enqueued.
    pub reads: Mutex<ReadTickets>,
    /// For queues: out-of-order execution (no ordering among its commands).
    pub out_of_order: std::sync::atomic::AtomicBool,
    /// For events of in-order queues: the queue and the ticket of the first
    /// read enqueued after the event's command; reads before it must have
    /// landed for the event to count as complete here.
    pub after: Mutex<Option<(Arc<RObj>, u64)>>,
    /// For platforms: the root devices (object address, device type), listed
    /// once so that every query returns the same objects, as a vendor does.
    pub devices: std::sync::OnceLock<Vec<(usize, cl_device_type)>>,
    /// For kernels: per argument index, the value last sent and the session's
    /// count of failed posted calls then (see `api::rSetKernelArg`).
    pub args: Mutex<Vec<Option<(KernelArg, u64)>>>,
    /// For contexts and programs: their devices (object addresses), for
    /// `CL_PROGRAM_DEVICES`, which the proxy does not answer (its value is
    /// handles).
    pub devs: Mutex<Vec<usize>>,
    /// For queues, memory objects and samplers: the property list the
    /// application gave, with its terminating 0 (empty: none, or made by the
    /// entry point without properties), for `CL_*_PROPERTIES` queries, whose
    /// answer depends on how the object was made.
    pub app_props: Mutex<Option<Vec<u64>>>,
    /// The id of the object's context (0: unknown), for the checks of
    /// `check`: queues, events, programs and kernels.
    pub ctx: std::sync::atomic::AtomicU64,
    /// For queues: the id of their device.
    pub dev: std::sync::atomic::AtomicU64,
    /// For queues: made with CL_QUEUE_ON_DEVICE_DEFAULT.
    pub device_default: std::sync::atomic::AtomicBool,
    /// For kernels: their description, fetched once (None inside: the proxy
    /// could not give it; nothing is checked on the client then).
    pub kmeta: std::sync::OnceLock<Option<Arc<check::KernelMeta>>>,
    /// For kernels: which arguments have been set (by index).
    pub set_args: Mutex<Vec<bool>>,
    /// For programs made from source: the application's source and the
    /// source crane-proxy holds (see `includes`).
    pub text: Mutex<Option<(String, String)>>,
}

// SAFETY: the raw dispatch pointer refers to an immutable static; every other
// field is thread-safe.
unsafe impl Send for RObj {}
// SAFETY: as above.
unsafe impl Sync for RObj {}

impl RObj {
    /// Makes a remote object named `id`; the returned pointer holds one
    /// reference.
    pub fn create(s: &Arc<Session>, id: Id, px: usize) -> *mut c_void {
        let o = Arc::new(RObj {
            dispatch: &api::DISPATCH,
            id,
            session: s.clone(),
            refs: AtomicU32::new(1),
            pending: AtomicU32::new(0),
            px,
            destructors: Mutex::new(Vec::new()),
            devices: std::sync::OnceLock::new(),
            reads: Mutex::new(ReadTickets::default()),
            out_of_order: Default::default(),
            after: Mutex::new(None),
            args: Mutex::new(Vec::new()),
            devs: Mutex::new(Vec::new()),
            app_props: Mutex::new(None),
            ctx: Default::default(),
            dev: Default::default(),
            device_default: Default::default(),
            kmeta: std::sync::OnceLock::new(),
            set_args: Mutex::new(Vec::new()),
            text: Mutex::new(None),
        });
        let p = Arc::into_raw(o) as *mut c_void;
        s.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p as usize);
        p
    }
}

impl RObj {
    /// The devices of a context or program.
    pub fn devices_of(&self) -> Vec<usize> {
        self.devs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The id of the object's context (0: unknown).
    pub fn context(&self) -> Id {
        self.ctx.load(Ordering::Relaxed)
    }

    /// Records the id of the object's context.
    pub fn set_context(&self, c: Id) {
        self.ctx.store(c, Ordering::Relaxed);
    }

    /// Records the devices of a context or program.
    pub fn set_devices(&self, d: Vec<usize>) {
        *self.devs.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }
}

/// Reads of one queue in flight (see `RObj::reads`).
#[derive(Default)]
pub struct ReadTickets {
    pub next: u64,
    pub outstanding: std::collections::BTreeSet<u64>,
}

impl RObj {
    /// The ticket the next read on this queue will get: every read enqueued
    /// so far has a smaller one.
    pub fn ticket_now(&self) -> u64 {
        self.reads.lock().unwrap_or_else(|e| e.into_inner()).next
    }

    /// Registers a read about to be sent.
    pub fn issue_read(&self) -> u64 {
        let mut r = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        let t = r.next;
        r.next += 1;
        r.outstanding.insert(t);
        t
    }

    /// Whether some read enqueued before `ticket` has not landed.
    pub fn reads_before(&self, ticket: u64) -> bool {
        self.reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .outstanding
            .range(..ticket)
            .next()
            .is_some()
    }
}

/// The remote object behind a pointer crane got from this module.
///
/// The interposer hands this layer only pointers it got from it, so a
/// non-null pointer is a live `RObj`.
pub fn obj<'a>(p: *mut c_void) -> Result<&'a RObj, cl_int> {
    if p.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: see above; the object lives until its last release.
    Ok(unsafe { &*(p as *const RObj) })
}

/// A counted reference, for work that outlives the call (pending reads,
/// callbacks).
pub fn arc(p: *mut c_void) -> Arc<RObj> {
    // SAFETY: `p` came from `Arc::into_raw` in `RObj::create` and is live.
    unsafe {
        Arc::increment_strong_count(p as *const RObj);
        Arc::from_raw(p as *const RObj)
    }
}

/// The id of an object pointer (0 for null).
pub fn id_of(p: *mut c_void) -> Id {
    obj(p).map_or(0, |o| o.id)
}

pub fn retain(p: *mut c_void) -> cl_int {
    match obj(p) {
        Ok(o) => {
            o.refs.fetch_add(1, Ordering::Relaxed);
            CL_SUCCESS
        }
        Err(e) => e,
    }
}

/// Drops a reference; the last one tells the proxy to release its object.
pub fn release(p: *mut c_void) -> cl_int {
    let o = match obj(p) {
        Ok(o) => o,
        Err(e) => return e,
    };
    if o.refs.fetch_sub(1, Ordering::AcqRel) != 1 {
        return CL_SUCCESS;
    }
    let s = o.session.clone();
    // A failure here means the session is gone, and the proxy with it.
    let _ = s.post(&Call::Release { id: o.id }, &[], false);
    s.live
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(p as usize));
    let destructors = std::mem::take(&mut *o.destructors.lock().unwrap_or_else(|e| e.into_inner()));
    let addr = p as usize;
    if !destructors.is_empty() {
        s.defer(Box::new(move || {
            for (f, ud) in destructors.into_iter().rev() {
                type Destructor = unsafe extern "C" fn(*mut c_void, *mut c_void);
                // SAFETY: registered as a destructor callback of this type.
                let f: Destructor = unsafe { std::mem::transmute::<usize, Destructor>(f) };
                // SAFETY: the application's callback with its user data; the
                // object pointer is only an identity by now.
                unsafe { f(addr as *mut c_void, ud as *mut c_void) };
            }
        }));
    }
    // SAFETY: the reference `RObj::create` made; other Arcs (pending reads)
    // keep the memory until they finish.
    drop(unsafe { Arc::from_raw(p as *const RObj) });
    CL_SUCCESS
}

/// The proxy's platforms, as remote objects.
pub fn platforms(s: &Arc<Session>) -> Result<Vec<*mut c_void>, cl_int> {
    let (a, _) = s.call(
        &Call::GetPlatformIds { ids: Vec::new() },
        &[],
        session::Dest::Keep,
    )?;
    let n = match a {
        Answer::Count {
            status: CL_SUCCESS,
            count,
        } => count as usize,
        Answer::Count { status, .. } => return Err(status),
        _ => return Err(CL_INVALID_OPERATION),
    };
    let ids: Vec<Id> = (0..n).map(|_| s.new_id()).collect();
    let (a, _) = s.call(
        &Call::GetPlatformIds { ids: ids.clone() },
        &[],
        session::Dest::Keep,
    )?;
    match a {
        Answer::Count {
            status: CL_SUCCESS,
            count,
        } => Ok(ids
            .iter()
            .take(count as usize)
            .map(|&id| RObj::create(s, id, 0))
            .collect()),
        Answer::Count { status, .. } => Err(status),
        _ => Err(CL_INVALID_OPERATION),
    }
}
