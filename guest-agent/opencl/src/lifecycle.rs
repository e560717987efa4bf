//! Suspend and resume: parking every OpenCL object of the process in RAM and
//! unloading the vendor library, then rebuilding everything on a freshly loaded
//! one. Both run on the control thread with the gate shut.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crane_control::{DeviceSpec, Mode, Phase, Residue};
use crane_vendor_loader::DevicePolicy;
use opencl_sys::*;

use crate::api::{self, kernel, memory, program, queue as queue_api};
use crate::callbacks::PENDING_BUILDS;
use crate::config::{debug, warn};
use crate::entry::ClResult;
use crate::gate;
use crate::handle::{self, ClObject};
use crate::objects::*;
use crate::staging::{self, HostBytes, Staging};
use crate::vendor::{self, Target, check, vfn};

/// The process's mode; `None` until first asked, then derived from where the
/// process starts (see `config::initial_target`).
static MODE: Mutex<Option<Mode>> = Mutex::new(None);

fn running_mode() -> Mode {
    match vendor::target() {
        Target::Local => Mode::Passthrough,
        Target::Remote { .. } => Mode::Remote,
    }
}

pub fn mode() -> Mode {
    let mut m = MODE.lock().unwrap_or_else(|e| e.into_inner());
    *m.get_or_insert_with(running_mode)
}

fn set_mode(m: Mode) {
    *MODE.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
}

/// Map write-backs whose source memory must live until their event completes.
static PARKED: Mutex<Vec<(usize, Staging)>> = Mutex::new(Vec::new());

/// Keeps `storage` alive until the vendor event `vev` completes.
pub fn park_storage(vev: *mut c_void, storage: Staging) {
    let freed = reap(&mut PARKED.lock().unwrap_or_else(|e| e.into_inner()));
    drop(freed);
    PARKED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((vev as usize, storage));
}

/// A parked region `fits` whose write-back was queued on the vendor queue
/// `vq` (in order: what the caller queues there next runs after it), taken
/// off the parked list; its memory is free for a command queued behind the
/// write-back. A 256 MiB read-write map after another found the last one's
/// memory busy and pinned 256 MiB afresh (44% of native on an H200).
pub fn take_parked_behind(vq: *mut c_void, fits: impl Fn(&Staging) -> bool) -> Option<Staging> {
    if vq.is_null() || vendor::remote_session().is_some() {
        return None;
    }
    let mut p = PARKED.lock().unwrap_or_else(|e| e.into_inner());
    let i = p
        .iter()
        .position(|(ev, s)| fits(s) && event_queue(*ev as *mut c_void) == Some(vq as usize))?;
    let (ev, s) = p.swap_remove(i);
    // SAFETY: crane's reference to a vendor event it parked.
    unsafe { vendor::release(ev as *mut c_void, |d| d.clReleaseEvent) };
    Some(s)
}

fn event_queue(v: *mut c_void) -> Option<usize> {
    // SAFETY: CL_EVENT_COMMAND_QUEUE is a cl_command_queue.
    let q: cl_command_queue = unsafe { event_info(v, CL_EVENT_COMMAND_QUEUE) }?;
    (!q.is_null()).then_some(q as usize)
}

/// Gives the memory of completed write-backs back to its pools.
pub fn reap_parked() {
    let freed = reap(&mut PARKED.lock().unwrap_or_else(|e| e.into_inner()));
    // Dropped after the lock: a region goes back to its pool.
    drop(freed);
}

fn reap(p: &mut Vec<(usize, Staging)>) -> Vec<Staging> {
    let mut freed = Vec::new();
    let mut i = 0;
    while i < p.len() {
        let ev = p[i].0 as *mut c_void;
        if event_status(ev).is_none_or(|s| s <= CL_COMPLETE) {
            // SAFETY: crane's reference to a vendor event it parked.
            unsafe { vendor::release(ev, |d| d.clReleaseEvent) };
            freed.push(p.swap_remove(i).1);
        } else {
            i += 1;
        }
    }
    freed
}

fn event_status(v: *mut c_void) -> Option<cl_int> {
    // SAFETY: CL_EVENT_COMMAND_EXECUTION_STATUS is a cl_int.
    unsafe { event_info(v, CL_EVENT_COMMAND_EXECUTION_STATUS) }
}

/// Vendor event `v`'s `param`, a value of type `T`.
///
/// # Safety
/// `T` must be `param`'s type; `v` a live vendor event.
unsafe fn event_info<T: Default>(v: *mut c_void, param: cl_event_info) -> Option<T> {
    let mut out = T::default();
    let f = vfn!(v, clGetEventInfo).ok()?;
    // SAFETY: `out` holds one `T`, the caller's type for `param`.
    let rc = unsafe {
        f(
            v.cast(),
            param,
            size_of::<T>(),
            (&raw mut out).cast(),
            std::ptr::null_mut(),
        )
    };
    (rc == CL_SUCCESS).then_some(out)
}

struct Timer {
    phases: Vec<Phase>,
    t: Instant,
}

impl Timer {
    fn new() -> Timer {
        Timer {
            phases: Vec::new(),
            t: Instant::now(),
        }
    }
    fn lap(&mut self, name: &str, bytes: u64) {
        let now = Instant::now();
        debug!(
            "{name} done in {:.1} ms",
            (now - self.t).as_secs_f64() * 1e3
        );
        self.phases.push(Phase {
            name: name.into(),
            ms: (now - self.t).as_secs_f64() * 1e3,
            bytes,
            parallel: false,
        });
        self.t = now;
    }
}

fn policy() -> DevicePolicy {
    DevicePolicy::default()
}

/// What the process still holds of a device.
pub fn residue() -> Residue {
    let mut r = Residue::default();
    if let Ok(res) = crane_vendor_loader::device_residue(&policy()) {
        r.device_fds = res
            .fds
            .iter()
            .map(|f| format!("{} -> {}", f.fd, f.target.display()))
            .collect();
        r.device_mappings = res
            .mappings
            .iter()
            .map(|m| m.path.display().to_string())
            .collect();
    }
    r.vendor_threads = crane_vendor_loader::vendor_threads_alive()
        .iter()
        .filter_map(|t| t.tid)
        .collect();
    r
}

/// Suspends the process's OpenCL state. On failure before anything was
/// released, the application simply carries on.
pub fn suspend(deadline: Duration) -> Result<(Vec<Phase>, Residue), String> {
    if mode() == Mode::Suspended {
        return Err("the process is already suspended".into());
    }
    let mut tm = Timer::new();
    park(deadline, &mut tm, None)?;
    release_all();
    unload_compilers();
    tm.lap("release", 0);
    if let Some(ms) = std::env::var("CRANE_UNLOAD_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        // Diagnostics (docs/architecture.md, NVIDIA): let the vendor's threads
        // finish what they still owe before its code is unmapped.
        std::thread::sleep(Duration::from_millis(ms));
    }
    let still_mapped = close_vendors(vendor::detach());
    let mut res = residue();
    res.libraries_still_mapped = still_mapped;
    tm.lap("unload", 0);
    set_mode(Mode::Suspended);
    debug!("suspended: {:?}", tm.phases);
    Ok((tm.phases, res))
}

/// Set while a pre-copy replaces RAM copies with what the device holds: host
/// writes cached in RAM then mark their buffer dirty instead (see
/// `api::enqueue::cache_write`).
pub static PRECOPY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Pre-copy (docs/architecture.md, "Pre-copy"): reads, while the application
/// runs on, every buffer whose device contents RAM does not hold, so that a
/// suspend or a move soon after reads only what changed since.
///
/// The snapshot point is a moment with no application call inside OpenCL
/// (the gate shut for as long as it takes to enqueue one marker per queue):
/// the buffers to read are taken and their dirty flags cleared there. Once
/// the markers complete (all work enqueued before the point is done), each
/// buffer is read on a queue of crane's own and its copy kept unless a
/// launch, copy, fill, unmap or host write since the point marked it dirty
/// again: those the stop reads as before. Buffers only: images, pipes and
/// `CL_MEM_USE_HOST_PTR` buffers are left to the stop.
///
/// On crane-proxy (the way back, `cranectl local --precopy`) what is read
/// is kept beside the RAM copies ([`READ_AHEAD`]) until the next read-back
/// (the move's, or a checkpoint's) takes it: until then the RAM copies stay
/// those of the last checkpoint, from which a replay after the proxy's death
/// rebuilds the session.
///
/// Locally each copy is read into memory pinned for it, and the pin is kept
/// with the copy (see [`staging::HostBytes::keep_pin`]): a later round, or
/// the stop, reads what changed since into that memory at the device's
/// rate. Giving pins back costs time too (NVIDIA: about 20 ms per GiB), so
/// where the stop would pay it (`Pins::Hot`: a suspend, whose release stops
/// the application) only the pins of buffers that changed again during
/// the round stay; a move to crane-proxy (`Pins::All`) releases them beside
/// the application running on the proxy.
pub fn precopy(deadline: Duration, pins: Pins) -> Result<Vec<Phase>, String> {
    let remote = match mode() {
        Mode::Passthrough => false,
        Mode::Remote => true,
        _ => return Err("pre-copy runs in passthrough or on crane-proxy only".into()),
    };
    if !vendor::is_loaded() {
        return Err("pre-copy runs in passthrough or on crane-proxy only".into());
    }
    let end = Instant::now() + deadline;
    let mut tm = Timer::new();
    if let Err(n) = gate::shut(gate::CLOSED, end) {
        gate::open();
        return Err(format!(
            "{n} thread(s) stayed inside OpenCL calls past the deadline"
        ));
    }
    PRECOPY.store(true, Ordering::SeqCst);
    let queues = handle::live::<Queue>();
    let mut markers: Vec<*mut c_void> = Vec::new();
    let mut marked = Ok(());
    for q in &queues {
        let vq = q.base.vendor();
        if vq.is_null() {
            continue;
        }
        let mut ev: cl_event = std::ptr::null_mut();
        // SAFETY: a marker on a live vendor queue; its event is ours.
        let rc = unsafe {
            vfn!(vq, clEnqueueMarkerWithWaitList)
                .map(|f| f(vq.cast(), 0, std::ptr::null(), &mut ev))
                .unwrap_or(CL_INVALID_OPERATION)
        };
        if rc != CL_SUCCESS {
            marked = Err(rc);
            break;
        }
        markers.push(ev.cast());
    }
    let targets: Vec<Arc<Mem>> = if marked.is_ok() {
        handle::live::<Mem>()
            .into_iter()
            .filter(|m| {
                matches!(m.kind, MemKind::Buffer)
                    && m.flags & CL_MEM_USE_HOST_PTR == 0
                    && !m.base.vendor().is_null()
                    && m.ever_written.load(Ordering::Relaxed)
                    && (m.dirty.load(Ordering::Relaxed)
                        || (m
                            .shadow
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .data()
                            .is_none()
                            && !read_ahead_holds(m)))
            })
            .collect()
    } else {
        Vec::new()
    };
    for m in &targets {
        m.dirty.store(false, Ordering::Relaxed);
    }
    gate::open();
    tm.lap("mark", 0);
    let waited = markers.iter().try_for_each(|&ev| {
        let list: cl_event = ev.cast();
        // SAFETY: our own marker event.
        check(unsafe { vfn!(ev, clWaitForEvents)?(1, &list) })
    });
    for ev in markers {
        // SAFETY: our own marker event.
        unsafe { vendor::release(ev, |d| d.clReleaseEvent) };
    }
    let mut bytes = 0u64;
    // Bytes read into memory an earlier round kept pinned (diagnostics).
    let mut warm = 0u64;
    let mut failed = marked.and(waited).err();
    // Queues of crane's own, one per context, not the application's: its work
    // goes on meanwhile.
    let mut own: Vec<(*const Context, *mut c_void)> = Vec::new();
    // Into the stale RAM copy's own memory where there is one (locally:
    // faulted in, and pinned if an earlier round kept a pin on it), else
    // into fresh memory faulted in ahead of the reads. On crane-proxy the RAM
    // copies stay those of the last checkpoint.
    let mut reused: HashMap<usize, HostBytes> = HashMap::new();
    if !remote {
        for m in &targets {
            let mut sh = m.shadow.lock().unwrap_or_else(|e| e.into_inner());
            if sh.data().is_some_and(|d| d.len() == m.size)
                && let Some(d) = sh.replace(None)
            {
                reused.insert(Arc::as_ptr(m) as usize, d);
            }
        }
    }
    let (mut fresh, _faulting) = fresh_copies(
        targets
            .iter()
            .filter(|m| !reused.contains_key(&(Arc::as_ptr(m) as usize)))
            .map(|m| (Arc::as_ptr(m) as usize, m.size))
            .collect(),
    );
    for m in &targets {
        let key = Arc::as_ptr(m) as usize;
        let Some(mut data) = reused.remove(&key).or_else(|| fresh.remove(&key)) else {
            continue;
        };
        if failed.is_some() {
            m.dirty.store(true, Ordering::Relaxed);
            put_back(m, data);
            continue;
        }
        let ctx: *const Context = &*m.context;
        let q = match own.iter().find(|(c, _)| *c == ctx) {
            Some(&(_, q)) => Ok(q),
            None => transfer_queue(&m.context, &[]).map(|(q, _)| {
                own.push((ctx, q));
                q
            }),
        };
        // Locally the pin stays with the copy: the stop reads into it again
        // if the application changes the buffer meanwhile.
        let pin = if remote {
            data.pin(&m.context)
        } else {
            if data.kept_pinned(&m.context) {
                warm += m.size as u64;
            }
            data.keep_pin(&m.context);
            None
        };
        let read = q.and_then(|q| {
            read_buffer(
                &m.context,
                q.cast(),
                m.base.vendor(),
                m.flags,
                m.size,
                data.as_mut_ptr(),
            )
        });
        drop(pin);
        match read {
            Ok(()) if remote => {
                let mut ahead = read_ahead();
                ahead.retain(|(w, _)| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), &**m));
                if !m.dirty.load(Ordering::SeqCst) {
                    ahead.push((Arc::downgrade(m), data));
                    bytes += m.size as u64;
                }
            }
            Ok(()) => {
                let mut sh = m.shadow.lock().unwrap_or_else(|e| e.into_inner());
                if !m.dirty.load(Ordering::SeqCst) {
                    sh.replace(Some(data));
                    bytes += m.size as u64;
                } else if sh.data().is_none() {
                    // Changed during the read: kept as a stale copy (the
                    // dirty flag says so) for the stop to read into.
                    sh.replace(Some(data));
                }
            }
            Err(e) => {
                m.dirty.store(true, Ordering::Relaxed);
                failed = Some(e);
                if !remote {
                    put_back(m, data);
                }
            }
        }
    }
    PRECOPY.store(false, Ordering::SeqCst);
    if warm > 0 {
        debug!("pre-copy: {warm} bytes read into RAM copies kept pinned");
    }
    if !remote && pins == Pins::Hot {
        for m in targets.iter().filter(|m| !m.dirty.load(Ordering::Relaxed)) {
            let pin = m
                .shadow
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .data_pinned_mut()
                .and_then(HostBytes::take_kept_pin);
            drop(pin);
        }
    }
    for (_, q) in own {
        // SAFETY: the queues made above.
        unsafe { vendor::release(q, |d| d.clReleaseCommandQueue) };
    }
    tm.lap("read", bytes);
    match failed {
        None => Ok(tm.phases),
        Some(e) => Err(format!(
            "pre-copy failed with OpenCL error {} (nothing is lost: the stop reads those buffers)",
            crate::entry::error_text(e)
        )),
    }
}

/// Which pins a pre-copy keeps on the RAM copies it reads (see [`precopy`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Pins {
    /// Those of buffers changed again during the round (a suspend follows).
    Hot,
    /// All of them (more rounds, or a move to crane-proxy, follow).
    All,
}

/// Gives a buffer whose dirty flag is set its RAM copy's memory back, stale
/// (the stop reads into it), unless it has one again.
fn put_back(m: &Mem, data: HostBytes) {
    let mut sh = m.shadow.lock().unwrap_or_else(|e| e.into_inner());
    if sh.data().is_none() {
        sh.replace(Some(data));
    }
}

/// Buffers a pre-copy on crane-proxy read (see [`precopy`]): what each held
/// at the pre-copy's snapshot, while its dirty flag says it has not changed
/// since; the next [`read_back`] takes them as read.
static READ_AHEAD: Mutex<Vec<(std::sync::Weak<Mem>, HostBytes)>> = Mutex::new(Vec::new());

fn read_ahead() -> std::sync::MutexGuard<'static, Vec<(std::sync::Weak<Mem>, HostBytes)>> {
    READ_AHEAD.lock().unwrap_or_else(|e| e.into_inner())
}

fn read_ahead_holds(m: &Mem) -> bool {
    read_ahead()
        .iter()
        .any(|(w, _)| std::ptr::eq(w.as_ptr(), m))
}

/// The first steps of every suspend: new calls stopped, every queue drained,
/// the gate shut, what RAM does not hold read back, events' states saved. On
/// failure the application simply carries on.
fn park(deadline: Duration, tm: &mut Timer, defer: Option<&mut Deferred>) -> Result<(), String> {
    let staged = drain_and_read_back(deadline, tm, defer)?;
    save_events();
    for p in handle::live::<Program>() {
        program::save_compiled(&p);
        program::save_executable(&p);
    }
    // Leaving crane-proxy: the journal no longer has a checkpoint once the
    // RAM copies change (nothing after this needs a replay).
    match vendor::remote_session() {
        Some(s) => s.disarm_journal_with(|| staged.install()),
        None => staged.install(),
    }
    SPARE_STAGING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
    Ok(())
}

/// Drains the queues, shuts the gate and reads what the device changed (the
/// first steps of a suspend, and a checkpoint); on failure the gate is open
/// again. On crane-proxy the data is staged, not yet in the RAM copies: a
/// recovery from the proxy's death meanwhile replays from the last
/// checkpoint, whose RAM copies these are, and the read-back's calls are
/// journaled like any others; the caller installs it together with the
/// journal's new state.
fn drain_and_read_back(
    deadline: Duration,
    tm: &mut Timer,
    mut defer: Option<&mut Deferred>,
) -> Result<ReadBack, String> {
    let end = Instant::now() + deadline;
    quiesce_and_drain(end)?;
    tm.lap("drain", 0);
    if let Err(n) = gate::shut(gate::CLOSED, end) {
        gate::open();
        return Err(format!(
            "{n} thread(s) stayed inside OpenCL calls past the deadline"
        ));
    }
    // Staged only where a replay may need the RAM copies as they are.
    let stage = vendor::remote_session().is_some_and(|s| s.journal_state().3.is_ok());
    let staged = match read_back(stage, defer.as_deref_mut()) {
        Ok(r) => r,
        Err(e) => {
            if let Some(d) = defer {
                d.drop_queues();
            }
            gate::open();
            return Err(format!(
                "reading device memory back failed with OpenCL error {}",
                crate::entry::error_text(e)
            ));
        }
    };
    tm.lap("read-dirty", staged.bytes);
    Ok(staged)
}

/// Stops new calls and finishes every queue. A queue may be held up by a user
/// event that the application sets only after further OpenCL calls of its own;
/// then the gate is opened again while the queues drain in the background, and
/// the whole step is retried until the deadline.
fn quiesce_and_drain(end: Instant) -> Result<(), String> {
    loop {
        if let Err(n) = gate::shut(gate::QUIESCING, end) {
            gate::open();
            return Err(format!(
                "{n} thread(s) stayed inside OpenCL calls past the deadline"
            ));
        }
        let (svm_n, _) = api::svm::live_bytes();
        if svm_n > 0 {
            gate::open();
            return Err(format!(
                "{svm_n} SVM allocation(s) are live; SVM addresses cannot be re-created after reloading the vendor library"
            ));
        }
        if !vendor::is_loaded() {
            return Ok(());
        }
        let rx = start_drain()?;
        let quick = (Instant::now() + Duration::from_millis(50)).min(end);
        if rx
            .recv_timeout(quick.saturating_duration_since(Instant::now()))
            .is_ok()
        {
            match wait_callbacks(end) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    gate::open();
                    return Err(e);
                }
            }
        }
        // Let the application run on (and set its user events) while the queues
        // drain, then try again.
        gate::open();
        if rx
            .recv_timeout(end.saturating_duration_since(Instant::now()))
            .is_err()
        {
            return Err("queues did not drain before the deadline (a command waits on a user event that is not set)".into());
        }
    }
}

/// Finishes every queue on a helper thread, which signals when done.
fn start_drain() -> Result<std::sync::mpsc::Receiver<()>, String> {
    // Strong references: the application may release a queue while it drains.
    let queues = handle::live::<Queue>();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("crane-drain".into())
        .spawn(move || {
            for q in queues {
                let v = q.base.vendor();
                if let Ok(f) = vfn!(v, clFinish) {
                    // SAFETY: a live vendor queue.
                    unsafe { f(v as cl_command_queue) };
                }
            }
            let _ = tx.send(());
        })
        .map_err(|e| format!("cannot start the drain thread: {e}"))?;
    Ok(rx)
}

/// Waits for the callbacks the vendor still owes for completed work.
fn wait_callbacks(end: Instant) -> Result<(), String> {
    while PENDING_BUILDS.load(Ordering::Acquire) > 0 || unfired_callbacks() > 0 {
        if Instant::now() >= end {
            return Err("build or event callbacks did not run before the deadline".into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

fn unfired_callbacks() -> usize {
    handle::live::<Event>()
        .iter()
        .filter(|e| {
            e.base.vendor().is_null()
                || event_status(e.base.vendor()).is_some_and(|s| s <= CL_COMPLETE)
        })
        .map(|e| {
            e.callbacks
                .lock()
                .unwrap_or_else(|x| x.into_inner())
                .iter()
                .filter(|c| !c.fired.load(Ordering::Acquire))
                .count()
        })
        .sum()
}

/// A vendor queue on `ctx` for crane's own transfers: one of the application's,
/// or a temporary one (returned second, to be released).
fn transfer_queue(ctx: &Context, queues: &[Arc<Queue>]) -> ClResult<(*mut c_void, bool)> {
    if let Some(q) = queues
        .iter()
        .find(|q| std::ptr::eq(&*q.context, ctx) && !q.base.vendor().is_null())
    {
        return Ok((q.base.vendor(), false));
    }
    let vc = ctx.base.vendor();
    let vd = ctx.devices[0].base.vendor();
    let mut err = CL_SUCCESS;
    #[allow(deprecated)]
    // SAFETY: vendor context and device.
    let q = unsafe { vfn!(vc, clCreateCommandQueue)?(vc.cast(), vd.cast(), 0, &mut err) };
    check(err)?;
    Ok((q.cast(), true))
}

fn with_queue<T>(
    ctx: &Context,
    queues: &[Arc<Queue>],
    f: impl FnOnce(cl_command_queue) -> ClResult<T>,
) -> ClResult<T> {
    let (q, temp) = transfer_queue(ctx, queues)?;
    let r = f(q.cast());
    if temp {
        // SAFETY: the temporary queue made above.
        unsafe { vendor::release(q, |d| d.clReleaseCommandQueue) };
    }
    r
}

/// Device memory read back, for the RAM copies ([`ReadBack::install`]).
/// Empty when it went straight into them (`stage` false in [`read_back`]).
#[derive(Default)]
struct ReadBack {
    items: Vec<(Arc<Mem>, HostBytes)>,
    bytes: u64,
    /// Of the items, bytes a pre-copy on crane-proxy had read already.
    ahead: u64,
}

impl ReadBack {
    /// Puts what was read where RAM keeps it: the RAM copy, or the
    /// application's memory behind a `CL_MEM_USE_HOST_PTR` object. The RAM
    /// copies replaced go to [`SPARE_STAGING`] for the next staged read.
    fn install(self) {
        let mut freed = Vec::new();
        for (m, data) in self.items {
            freed.extend(install(&m, data));
        }
        let mut spare = SPARE_STAGING.lock().unwrap_or_else(|e| e.into_inner());
        let limit = crate::config::get().remote_journal_mib << 20;
        let mut held: u64 = spare.iter().map(|h| h.capacity() as u64).sum();
        for h in freed {
            if held + h.capacity() as u64 <= limit {
                held += h.capacity() as u64;
                spare.push(h);
            }
        }
    }
}

/// RAM copies a staged read-back replaced, for the next one to read into: a
/// checkpoint every second on crane-proxy spent more time faulting in and
/// zeroing fresh memory for its reads than reading (bounded by
/// `CRANE_REMOTE_JOURNAL_MIB`; emptied when the process leaves the proxy).
static SPARE_STAGING: Mutex<Vec<HostBytes>> = Mutex::new(Vec::new());

/// Memory for a staged read of `len` bytes.
fn staging_for(len: usize) -> HostBytes {
    let mut spare = SPARE_STAGING.lock().unwrap_or_else(|e| e.into_inner());
    let fits = spare
        .iter()
        .position(|h| HostBytes::fits(h.capacity(), len));
    match fits.map(|i| spare.swap_remove(i).reuse(len)) {
        Some(Ok(h)) => h,
        _ => HostBytes::zeroed(len),
    }
}

/// Installs `data` (see [`ReadBack::install`]); returns the RAM copy it
/// replaced.
fn install(m: &Mem, data: HostBytes) -> Option<HostBytes> {
    let host = m.flags & CL_MEM_USE_HOST_PTR != 0 && m.host_ptr != 0;
    m.dirty.store(false, Ordering::Relaxed);
    match &m.kind {
        MemKind::Buffer if host => copy_to_host_ptr(m, &data),
        // Rebuilt from the host memory at resume, as buffers are.
        MemKind::Image { format, desc, .. } if host => {
            copy_image_to_host_ptr(m, desc, memory::pixel_size(format), &data)
        }
        _ => {
            return m
                .shadow
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .replace(Some(data));
        }
    }
    Some(data)
}

/// Whether RAM lacks `m`'s device contents: written by the device, and
/// dirty or without a RAM copy (the host memory behind a
/// `CL_MEM_USE_HOST_PTR` object holds them otherwise).
fn needs_read(m: &Mem) -> bool {
    let has_copy = m
        .shadow
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .data()
        .is_some();
    m.ever_written.load(Ordering::Relaxed)
        && (m.dirty.load(Ordering::Relaxed) || (!has_copy && m.flags & CL_MEM_USE_HOST_PTR == 0))
}

/// Whether `m` has no RAM copy of its own size to read into.
fn lacks_ram_copy(m: &Mem) -> bool {
    m.shadow
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .data()
        .is_none_or(|d| d.len() != m.size)
}

/// Fresh RAM copies for `wants` (key, bytes), in that order, faulted in by
/// helpers ahead of the reads that take them (see
/// [`HostBytes::fresh_in_order`]); the helpers stop when the second value
/// is dropped (`let (map, guard)` drops the guard first).
fn fresh_copies<K: std::hash::Hash + Eq>(
    wants: Vec<(K, usize)>,
) -> (HashMap<K, HostBytes>, staging::Faulting) {
    let sizes: Vec<usize> = wants.iter().map(|w| w.1).collect();
    let (fresh, faulting) = HostBytes::fresh_in_order(&sizes);
    (
        wants.into_iter().map(|w| w.0).zip(fresh).collect(),
        faulting,
    )
}

/// Reads every object whose device contents RAM does not hold: into the RAM
/// copies, or with `stage` into fresh memory returned for
/// [`ReadBack::install`].
fn read_back(stage: bool, mut defer: Option<&mut Deferred>) -> ClResult<ReadBack> {
    let mut out = ReadBack::default();
    let queues = handle::live::<Queue>();
    let mut ahead = std::mem::take(&mut *read_ahead());
    let mems = handle::live::<Mem>();
    // Fresh RAM copies for the buffers read below on this thread, faulted
    // in by helpers ahead of the reads.
    let fresh_for: Vec<&Arc<Mem>> = if stage {
        Vec::new()
    } else {
        mems.iter()
            .filter(|m| {
                matches!(m.kind, MemKind::Buffer)
                    && !m.base.vendor().is_null()
                    && !(defer.is_some()
                        && m.flags & (CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_NO_ACCESS) == 0)
                    && (m.dirty.load(Ordering::Relaxed)
                        || !ahead.iter().any(|(w, _)| std::ptr::eq(w.as_ptr(), &***m)))
                    && needs_read(m)
                    && lacks_ram_copy(m)
            })
            .collect()
    };
    // Bytes read into memory a pre-copy kept pinned (for diagnostics).
    let mut warm = 0u64;
    let (mut fresh, _faulting) = fresh_copies(
        fresh_for
            .iter()
            .map(|m| (Arc::as_ptr(m) as usize, m.size))
            .collect(),
    );
    for m in mems {
        let v = m.base.vendor();
        if v.is_null() || matches!(m.kind, MemKind::SubBuffer { .. } | MemKind::Pipe { .. }) {
            continue;
        }
        // Read by a pre-copy on crane-proxy and not changed since: as read.
        let early = ahead
            .iter()
            .position(|(w, _)| std::ptr::eq(w.as_ptr(), &*m))
            .map(|i| ahead.swap_remove(i).1);
        if let Some(data) = early
            && !m.dirty.load(Ordering::Relaxed)
        {
            out.ahead += data.len() as u64;
            if stage {
                out.items.push((m, data));
            } else {
                install(&m, data);
            }
            continue;
        }
        if !needs_read(&m) {
            continue;
        }
        let data = match &m.kind {
            // Left to the move's reader (see [`Deferred`]): a plain read.
            MemKind::Buffer
                if !stage
                    && m.flags & (CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_NO_ACCESS) == 0
                    && defer.is_some() =>
            {
                let d = defer.as_deref_mut().expect("checked above");
                d.add(m, &queues)?;
                continue;
            }
            MemKind::Buffer => {
                // Into the RAM copy's own memory where there is one (a stale
                // copy of a dirty buffer), pinned for the read: from fresh
                // pageable memory NVIDIA read 256 MiB at 1 GB/s. Staged (on
                // crane-proxy, where nothing is pinned) the RAM copy stays
                // as the last checkpoint has it.
                let mut data = if stage {
                    staging_for(m.size)
                } else {
                    m.shadow
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .replace(None)
                        .filter(|d| d.len() == m.size)
                        .or_else(|| fresh.remove(&(Arc::as_ptr(&m) as usize)))
                        .unwrap_or_else(|| HostBytes::zeroed(m.size))
                };
                if data.kept_pinned(&m.context) {
                    warm += m.size as u64;
                }
                let pin = data.pin(&m.context);
                let read = with_queue(&m.context, &queues, |q| {
                    read_buffer(&m.context, q, v, m.flags, m.size, data.as_mut_ptr())
                });
                drop(pin);
                read?;
                data
            }
            MemKind::Image { format, desc, .. } => {
                let region = memory::image_region(desc);
                let px = memory::pixel_size(format);
                let len = region.iter().product::<usize>() * px;
                let mut data = if stage {
                    staging_for(len)
                } else {
                    HostBytes::zeroed(len)
                };
                with_queue(&m.context, &queues, |q| {
                    read_image(&m.context, q, v, m.flags, region, len, data.as_mut_ptr())
                })?;
                data
            }
            _ => {
                m.dirty.store(false, Ordering::Relaxed);
                continue;
            }
        };
        out.bytes += data.len() as u64;
        if stage {
            out.items.push((m, data));
        } else {
            install(&m, data);
        }
    }
    if warm > 0 {
        debug!("read-dirty: {warm} bytes into RAM copies a pre-copy kept pinned");
    }
    Ok(out)
}

/// Brings a CL_MEM_USE_HOST_PTR buffer's host memory up to date with what the
/// device holds, except the ranges the application has mapped for writing:
/// those hold its changes, which reach the device at unmap.
fn copy_to_host_ptr(m: &Mem, data: &[u8]) {
    let mut keep: Vec<(usize, usize)> = m
        .maps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|r| r.write)
        .map(|r| (r.offset, (r.offset + r.size).min(data.len())))
        .collect();
    keep.sort_unstable();
    let mut at = 0;
    let host = m.host_ptr as *mut u8;
    let copy = |from: usize, to: usize| {
        if from < to {
            // SAFETY: the application's host memory of the buffer's size,
            // which it must keep valid for the buffer's life.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr().add(from), host.add(from), to - from)
            };
        }
    };
    for (start, end) in keep {
        copy(at, start.max(at));
        at = at.max(end);
    }
    copy(at, data.len());
}

/// Brings a CL_MEM_USE_HOST_PTR image's host memory (laid out with the pitches
/// given at creation) up to date from `data` (the whole image, tightly packed),
/// except the regions the application has mapped for writing (as for buffers).
fn copy_image_to_host_ptr(m: &Mem, desc: &cl_image_desc, px: usize, data: &[u8]) {
    let [w, h, d] = memory::image_region(desc);
    let row = if desc.image_row_pitch != 0 {
        desc.image_row_pitch
    } else {
        w * px
    };
    // A 1D array's layers are its rows: "image_slice_pitch ... the size of
    // each 1D image in bytes", image_row_pitch by default.
    let one_d_array = desc.image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY;
    let slice = match desc.image_slice_pitch {
        0 if one_d_array => row,
        0 => row * h,
        s => s,
    };
    // Write-mapped regions: origin and region, in pixels, rows and slices.
    let keep: Vec<([usize; 3], [usize; 3])> = m
        .maps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|r| r.write)
        .filter_map(|r| r.image.map(|(o, reg, ..)| (o, reg)))
        .collect();
    let host = m.host_ptr as *mut u8;
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for z in 0..d {
        for y in 0..h {
            let src = (z * h + y) * w * px;
            let dst = if one_d_array {
                y * slice
            } else {
                y * row + z * slice
            };
            spans.clear();
            spans.extend(
                keep.iter()
                    .filter(|(o, r)| (o[1]..o[1] + r[1]).contains(&y))
                    .filter(|(o, r)| (o[2]..o[2] + r[2]).contains(&z))
                    .map(|(o, r)| (o[0].min(w), (o[0] + r[0]).min(w))),
            );
            spans.sort_unstable();
            let mut at = 0;
            let copy = |from: usize, to: usize| {
                if from < to {
                    // SAFETY: the application's host memory of the image,
                    // which it must keep valid for the image's life, laid out
                    // with the pitches it gave; `data` holds every pixel.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            data.as_ptr().add(src + from * px),
                            host.add(dst + from * px),
                            (to - from) * px,
                        )
                    };
                }
            };
            for &(start, end) in &spans {
                copy(at, start.max(at));
                at = at.max(end);
            }
            copy(at, w);
        }
    }
}

/// Runs `f` on a scratch buffer of `size` bytes made on `ctx`'s vendor
/// context, released after.
fn with_scratch(
    ctx: &Context,
    size: usize,
    f: impl FnOnce(cl_mem) -> ClResult<()>,
) -> ClResult<()> {
    let vc = ctx.base.vendor();
    let mut err = CL_SUCCESS;
    // SAFETY: a scratch buffer on the vendor context.
    let scratch = unsafe {
        vfn!(vc, clCreateBuffer)?(
            vc.cast(),
            CL_MEM_READ_WRITE,
            size,
            std::ptr::null_mut(),
            &mut err,
        )
    };
    check(err)?;
    let r = f(scratch);
    // SAFETY: the scratch buffer made above.
    unsafe { vendor::release(scratch.cast(), |d| d.clReleaseMemObject) };
    r
}

/// Reads a whole buffer. Buffers the host may not read
/// (CL_MEM_HOST_WRITE_ONLY / CL_MEM_HOST_NO_ACCESS) go through a scratch buffer
/// on the device.
fn read_buffer(
    ctx: &Context,
    q: cl_command_queue,
    v: *mut c_void,
    flags: cl_mem_flags,
    size: usize,
    dst: *mut u8,
) -> ClResult<()> {
    let read = |src: *mut c_void| {
        // SAFETY: `dst` holds `size` bytes.
        check(unsafe {
            vfn!(q, clEnqueueReadBuffer)?(
                q,
                src.cast(),
                CL_TRUE,
                0,
                size,
                dst.cast(),
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
            )
        })
    };
    if flags & (CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_NO_ACCESS) == 0 {
        return read(v);
    }
    with_scratch(ctx, size, |scratch| {
        // SAFETY: copying between two vendor buffers of `size` bytes.
        check(unsafe {
            vfn!(q, clEnqueueCopyBuffer)?(
                q,
                v.cast(),
                scratch,
                0,
                0,
                size,
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
            )
        })
        .and_then(|()| read(scratch.cast()))
    })
}

/// Reads a whole image of `len` bytes, tightly packed. Images the host may
/// not read (CL_MEM_HOST_WRITE_ONLY / CL_MEM_HOST_NO_ACCESS:
/// clEnqueueReadImage answers CL_INVALID_OPERATION) are copied into a
/// scratch buffer on the device first (clEnqueueCopyImageToBuffer packs them
/// the same way).
fn read_image(
    ctx: &Context,
    q: cl_command_queue,
    v: *mut c_void,
    flags: cl_mem_flags,
    region: [usize; 3],
    len: usize,
    dst: *mut u8,
) -> ClResult<()> {
    let origin = [0usize; 3];
    if flags & (CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_NO_ACCESS) == 0 {
        // Pitches 0: tightly packed, as `dst` is. "slice_pitch ... must be 0
        // if image is a 1D or 2D image": NVIDIA refuses a 2D image's read
        // with any other (CL_INVALID_VALUE), PoCL did not.
        // SAFETY: `dst` holds the whole image tightly packed.
        return check(unsafe {
            vfn!(q, clEnqueueReadImage)?(
                q,
                v.cast(),
                CL_TRUE,
                origin.as_ptr(),
                region.as_ptr(),
                0,
                0,
                dst.cast(),
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
            )
        });
    }
    with_scratch(ctx, len, |scratch| {
        // SAFETY: the whole image into a buffer of its packed size.
        check(unsafe {
            vfn!(q, clEnqueueCopyImageToBuffer)?(
                q,
                v.cast(),
                scratch,
                origin.as_ptr(),
                region.as_ptr(),
                0,
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
            )
        })
        .and_then(|()| read_buffer(ctx, q, scratch.cast(), 0, len, dst))
    })
}

fn save_events() {
    for e in handle::live::<Event>() {
        let v = e.base.vendor();
        if v.is_null() {
            continue;
        }
        let status = if e.is_user() {
            e.user_status.load(Ordering::Acquire)
        } else {
            event_status(v).unwrap_or(CL_COMPLETE)
        };
        e.final_status.store(status, Ordering::Release);
        let profiled = e
            .queue
            .as_ref()
            .is_some_and(|q| q.current_properties() & CL_QUEUE_PROFILING_ENABLE != 0);
        // An event restored by an earlier resume is a user event on the vendor,
        // which has no profiling information: keep what was saved the first
        // time (re-reading gave zeros, so an application reading START before
        // and END after a second suspend saw END < START).
        let saved = e
            .profiling
            .lock()
            .unwrap_or_else(|x| x.into_inner())
            .is_some();
        if profiled && status == CL_COMPLETE && !saved {
            let mut vals = [0u64; 5];
            let params = [
                CL_PROFILING_COMMAND_QUEUED,
                CL_PROFILING_COMMAND_SUBMIT,
                CL_PROFILING_COMMAND_START,
                CL_PROFILING_COMMAND_END,
                CL_PROFILING_COMMAND_COMPLETE,
            ];
            for (slot, p) in vals.iter_mut().zip(params) {
                if let Ok(f) = vfn!(v, clGetEventProfilingInfo) {
                    // SAFETY: one cl_ulong.
                    unsafe {
                        f(
                            v.cast(),
                            p,
                            8,
                            (slot as *mut u64).cast(),
                            std::ptr::null_mut(),
                        )
                    };
                }
            }
            if vals[4] == 0 {
                vals[4] = vals[3];
            }
            *e.profiling.lock().unwrap_or_else(|x| x.into_inner()) = Some(vals);
        }
    }
}

/// What kind of vendor object a held handle is (its release function).
#[derive(Clone, Copy)]
enum Family {
    Kernel,
    Event,
    Mem,
    Sampler,
    Program,
    Queue,
    Context,
    Device,
}

/// One step of giving the vendor its objects back.
enum Giveback {
    Release(*mut c_void, Family),
    /// Some vendors free memory (and unpin host memory) only when the queue
    /// that last used it moves on: every queue finishes before it goes.
    Finish(*mut c_void),
}

/// Vendor objects taken out of crane's objects, in the order they must be
/// given back (dependents first), with the host memory of map write-backs
/// that the vendor may read until their events are released.
struct Held {
    steps: Vec<Giveback>,
    storage: Vec<Staging>,
    /// The first `own` steps release crane's own vendor objects (parked
    /// write-back events, pins of map memory); the others were taken out of
    /// the application's objects, which `restore` puts them back into.
    own: usize,
    restore: Vec<Box<dyn FnOnce() + Send>>,
}

// SAFETY: vendor handles may be used from any thread, and crane's objects no
// longer refer to these.
unsafe impl Send for Held {}

fn take_kind<T: ClObject>(held: &mut Held, family: Family, filter: impl Fn(&T) -> bool) {
    for o in handle::live::<T>() {
        if !filter(&o) {
            continue;
        }
        let v = o.base().take_vendor();
        if !v.is_null() {
            held.steps.push(Giveback::Release(v, family));
            let addr = v as usize;
            // Weak: the held objects are released beside the application
            // once it runs on the move's target, and a strong reference
            // here would keep an object it releases meanwhile (and its
            // object there) alive until then; a kernel kept so stays
            // attached to its program, whose next build the vendor refuses
            // (CL_INVALID_OPERATION: the CTS's options_denorm_cache under
            // switches on NVIDIA, whose release takes ~100 ms).
            let o = Arc::downgrade(&o);
            held.restore.push(Box::new(move || match o.upgrade() {
                Some(o) => o.base().set_vendor(addr as *mut c_void),
                // SAFETY: crane's reference to a live vendor object, in no
                // crane object any more (its own was released meanwhile).
                None => unsafe { release_family(addr as *mut c_void, family) },
            }));
        }
    }
}

/// Takes every vendor object out of crane's objects (their vendor pointers
/// are cleared); [`give_back`] releases them.
fn take_vendor_objects() -> Held {
    let parked = std::mem::take(&mut *PARKED.lock().unwrap_or_else(|e| e.into_inner()));
    let mut held = Held {
        steps: Vec::new(),
        storage: Vec::new(),
        own: 0,
        restore: Vec::new(),
    };
    for (ev, bytes) in parked {
        held.steps
            .push(Giveback::Release(ev as *mut c_void, Family::Event));
        held.storage.push(bytes);
    }
    // Pins of map memory, after the write-backs that may read it.
    for pin in staging::take_pins() {
        held.steps.push(Giveback::Release(pin, Family::Mem));
    }
    held.own = held.steps.len();
    // Queues finished first: nothing is released while a command may still
    // use it.
    for q in handle::live::<Queue>() {
        let v = q.base.vendor();
        if !v.is_null() {
            held.steps.push(Giveback::Finish(v));
        }
    }
    take_kind::<Kernel>(&mut held, Family::Kernel, |_| true);
    take_kind::<Event>(&mut held, Family::Event, |_| true);
    take_kind::<Mem>(&mut held, Family::Mem, |m| {
        matches!(m.kind, MemKind::Image { .. })
    });
    // Sub-buffers newest first (`live` lists objects oldest first), as a
    // program's own teardown releases them: NVIDIA (580.159.04) crashes in
    // clReleaseMemObject on one of 16 overlapping sub-buffers released in
    // creation order, natively too (benches/subbuf-release.c: 4 of 4 runs
    // of 150 rounds crashed on an H200; newest first, none in 300 rounds).
    let first = held.steps.len();
    take_kind::<Mem>(&mut held, Family::Mem, |m| {
        matches!(m.kind, MemKind::SubBuffer { .. })
    });
    held.steps[first..].reverse();
    take_kind::<Mem>(&mut held, Family::Mem, |_| true);
    take_kind::<Sampler>(&mut held, Family::Sampler, |_| true);
    take_kind::<Program>(&mut held, Family::Program, |p| {
        matches!(p.source, ProgramSource::Linked { .. })
    });
    take_kind::<Program>(&mut held, Family::Program, |_| true);
    take_kind::<Queue>(&mut held, Family::Queue, |_| true);
    take_kind::<Context>(&mut held, Family::Context, |_| true);
    take_kind::<Device>(&mut held, Family::Device, |d| d.parent.is_some());
    held
}

/// Puts taken vendor objects back into crane's objects (a move to
/// crane-proxy that goes back before anything was released); crane's own
/// (parked write-backs, which the drain completed, and pins) are released.
fn restore_held(held: Held) {
    for step in held.steps.into_iter().take(held.own) {
        if let Giveback::Release(v, family) = step {
            // SAFETY: crane's own reference to a live vendor object.
            unsafe { release_family(v, family) };
        }
    }
    drop(held.storage);
    for r in held.restore {
        r();
    }
}

/// Releases held vendor objects in order.
fn give_back(held: Held) {
    crate::fault::slow_release();
    // Pins kept on RAM copies by a pre-copy, before the contexts they were
    // made on (the reads that used them are done).
    staging::drop_kept_pins();
    for step in held.steps {
        match step {
            Giveback::Finish(v) => {
                if let Ok(f) = vfn!(v, clFinish) {
                    // SAFETY: a live vendor queue.
                    unsafe { f(v.cast()) };
                }
            }
            // SAFETY: crane's one reference to a live vendor object of that
            // family, taken out of crane's objects.
            Giveback::Release(v, family) => unsafe { release_family(v, family) },
        }
    }
    drop(held.storage);
}

/// # Safety
/// `v` must be crane's reference to a live vendor object of `family`.
unsafe fn release_family(v: *mut c_void, family: Family) {
    // SAFETY: the caller's contract; each family's own release function.
    unsafe {
        match family {
            Family::Kernel => vendor::release(v, |d| d.clReleaseKernel),
            Family::Event => vendor::release(v, |d| d.clReleaseEvent),
            Family::Mem => crate::quirks::release_mem(v),
            Family::Sampler => vendor::release(v, |d| d.clReleaseSampler),
            Family::Program => vendor::release(v, |d| d.clReleaseProgram),
            Family::Queue => vendor::release(v, |d| d.clReleaseCommandQueue),
            Family::Context => crate::quirks::release_context(v),
            Family::Device => vendor::release(v, |d| d.clReleaseDevice),
        }
    }
}

/// Gives every vendor object back, dependents first.
fn release_all() {
    give_back(take_vendor_objects());
}

/// Asks each platform to drop its compiler, once no objects are left, where
/// that is safe and worth it (see [`unloads_compiler`]).
fn unload_compilers() {
    let used = vendor::used_roots();
    let platforms: Vec<*mut c_void> = vendor::platforms()
        .unwrap_or_default()
        .iter()
        .filter(|p| {
            let version = vendor::info_string(p.base.vendor(), |d| {
                d.clGetPlatformInfo.map(|f| (f, CL_PLATFORM_VERSION))
            })
            .unwrap_or_default();
            // A process that made no context anywhere yet counts as using
            // every platform: PoCL's workers started when it listed devices.
            let mine = used.is_empty() || used.iter().any(|d| Arc::ptr_eq(&d.platform, p));
            unloads_compiler(&version, mine)
        })
        .map(|p| p.base.vendor())
        .collect();
    unload_compilers_of(&platforms);
}

/// Whether to call clUnloadPlatformCompiler on a platform of this
/// `CL_PLATFORM_VERSION` that the process did (`used`) or did not make
/// contexts on. PoCL answers it, with POCL_ENABLE_UNINIT=1 (`on_load`), by
/// un-initialising its devices, which joins its worker threads: PoCL 3 sleeps
/// 100 ms first, and PoCL 4 and later also shut LLVM down, after which PoCL 5
/// can no longer make a context in the process (an assertion in
/// pocl_setup_context aborts it, seen on Ubuntu 24.04's PoCL 5.0 at the
/// second move onto its CPU device). So PoCL's compiler is unloaded only on
/// PoCL 3 and older, and only where the process used it, or used no platform
/// yet (a platform merely listed beside the GPU it runs on does not cost
/// every suspend 100 ms); its workers otherwise stay (PoCL stays mapped
/// anyway and holds no device).
fn unloads_compiler(version: &str, used: bool) -> bool {
    match crate::quirks::pocl_major(version) {
        None => true,
        Some(major) => used && major < 4,
    }
}

fn unload_compilers_of(platforms: &[*mut c_void]) {
    for &v in platforms {
        if let Ok(f) = vfn!(v, clUnloadPlatformCompiler) {
            // SAFETY: a live vendor platform with no objects left.
            unsafe { f(v.cast()) };
        }
    }
}

/// Closes what [`vendor::detach`] took; the libraries that stayed mapped.
fn close_vendors(detached: vendor::Detached) -> Vec<String> {
    let mut still_mapped = Vec::new();
    for r in detached.close(&policy()) {
        match r {
            Ok(rep) => still_mapped.extend(
                rep.libraries_still_mapped
                    .iter()
                    .map(|l| l.path.display().to_string()),
            ),
            Err(e) => warn!("unloading a vendor library: {e}"),
        }
    }
    still_mapped
}

/// Resumes after `suspend` onto the devices `spec` names (none: the devices
/// the process was on).
pub fn resume_on(spec: Option<DeviceSpec>) -> Result<Vec<Phase>, String> {
    if mode() != Mode::Suspended {
        return Err("the process is not suspended".into());
    }
    vendor::set_device(spec);
    resume()
}

/// Resumes after `suspend`: reload, recreate in dependency order, re-inject.
pub fn resume() -> Result<Vec<Phase>, String> {
    if mode() != Mode::Suspended {
        return Err("the process is not suspended".into());
    }
    let phases = rebuild()?;
    reopen();
    Ok(phases)
}

/// Lets the application's calls through again, in the mode of the loaded
/// target.
fn reopen() {
    set_mode(running_mode());
    gate::open();
}

/// Loads the target, recreates every object in dependency order and
/// re-injects buffer contents; the gate stays shut. On failure nothing of the
/// target is kept and the process is still suspended: the caller says what
/// happens next.
fn rebuild() -> Result<Vec<Phase>, String> {
    let mut tm = Timer::new();
    let remote = matches!(vendor::target(), Target::Remote { .. });
    crate::remote::lanes::take_failure();
    let loaded = vendor::load();
    // A device spec is for this attempt only.
    vendor::set_device(None);
    loaded.map_err(|e| {
        if let Some(why) = vendor::take_load_error() {
            why
        } else if remote {
            format!(
                "connecting to crane-proxy failed with OpenCL error {}",
                crate::entry::error_text(e)
            )
        } else {
            format!(
                "reloading the vendor library failed with OpenCL error {}",
                crate::entry::error_text(e)
            )
        }
    })?;
    tm.lap(if remote { "connect" } else { "reload" }, 0);
    let moved = vendor::take_moved();
    // Gives back what was made, so that a later attempt starts clean (on the
    // devices the process was on), and says why.
    let give_up = |why: String| {
        crate::remote::ahead::finish(None);
        release_all();
        vendor::unload(&policy());
        for m in &moved {
            *m.device.now.lock().unwrap_or_else(|e| e.into_inner()) = m.from.clone();
        }
        why
    };
    // Says why a step failed: a broken connection to crane-proxy rather than
    // the error code every call gets after it.
    let failed = |what: &str, e: cl_int| {
        let broken = vendor::remote_session()
            .and_then(|s| s.broken())
            .or_else(crate::remote::lanes::take_failure);
        let hint = if e == CL_INVALID_BINARY && !moved.is_empty() {
            ": a program the application made from a binary cannot be made on the new device \
             (a binary is for the device it was built for)"
        } else {
            ""
        };
        give_up(match broken {
            Some(why) => format!("{what} failed: {why}"),
            None => format!(
                "{what} failed with OpenCL error {}{hint}",
                crate::entry::error_text(e)
            ),
        })
    };
    let scope = crate::retarget::Scope {
        moved: &moved,
        remote,
    };
    let broken = || vendor::remote_session().and_then(|s| s.broken());
    if let Err(why) = crate::retarget::check_objects(scope) {
        return Err(give_up(broken().unwrap_or(why)));
    }
    let (mut bytes, mut inject) = (0u64, Duration::ZERO);
    let mut programs = ProgramStats::default();
    let recreated = recreate(&mut bytes, &mut inject, &mut programs, !moved.is_empty());
    // Blobs a pre-copy sent ahead that the rebuild did not use are dropped.
    let unused = crate::remote::ahead::finish(vendor::remote_session().as_deref());
    if unused > 0 {
        debug!("{unused} buffer(s) sent ahead changed since: sent again");
    }
    if let Err(e) = recreated {
        return Err(failed("recreating the objects", e));
    }
    if let Some(s) = vendor::remote_session() {
        // Creation is posted: wait until the proxy has carried it out, so that
        // a failure shows here and not in the application's next call.
        if let Err(e) = remote_sync(&s) {
            return Err(failed("recreating the objects on crane-proxy", e));
        }
        // The proxy holds what RAM holds: a checkpoint, from which a replay
        // can rebuild the session if this proxy dies.
        s.checkpoint_with(journal_contents);
    } else {
        // Maps the application holds keep their speed on the new vendor.
        staging::repin_held();
    }
    if let Err(why) = crate::retarget::check_launches(scope) {
        return Err(give_up(broken().unwrap_or(why)));
    }
    tm.lap("recreate", 0);
    let rec = tm.phases.last_mut().expect("just pushed");
    rec.ms -= (inject + programs.time + programs.contexts + programs.read_wait).as_secs_f64() * 1e3;
    if !programs.read_wait.is_zero() {
        // Waiting for the reads beside (a move to crane-proxy): the stop's
        // share of `read-dirty-beside`.
        tm.phases.push(Phase {
            name: "wait-read".into(),
            ms: programs.read_wait.as_secs_f64() * 1e3,
            bytes: 0,
            parallel: false,
        });
    }
    // Contexts and programs, apart: the driver's part, and the compiler's
    // (or the executables kept at suspend: their bytes).
    tm.phases.push(Phase {
        name: "contexts".into(),
        ms: programs.contexts.as_secs_f64() * 1e3,
        bytes: 0,
        parallel: false,
    });
    tm.phases.push(Phase {
        name: "programs".into(),
        ms: programs.time.as_secs_f64() * 1e3,
        bytes: programs.reused_bytes,
        parallel: false,
    });
    tm.phases.push(Phase {
        name: "reinject".into(),
        ms: inject.as_secs_f64() * 1e3,
        bytes: bytes - programs.ahead,
        parallel: false,
    });
    if programs.lanes > 0 {
        // Of `reinject`, sent over lanes beside the session's connection.
        tm.phases.push(Phase {
            name: "reinject-lanes".into(),
            ms: 0.0,
            bytes: programs.lanes,
            parallel: true,
        });
    }
    if programs.ahead > 0 {
        // Written on crane-proxy from what a pre-copy sent ahead (its time
        // is in `reinject`).
        tm.phases.push(Phase {
            name: "reinject-ahead".into(),
            ms: 0.0,
            bytes: programs.ahead,
            parallel: false,
        });
    }
    debug!("rebuilt: {:?}", tm.phases);
    Ok(tm.phases)
}

/// What making the programs again cost, and how much of it came from kept
/// executables; and what making the contexts cost (on NVIDIA each is a CUDA
/// context, about 100 ms of the driver's).
#[derive(Default)]
struct ProgramStats {
    time: Duration,
    reused_bytes: u64,
    contexts: Duration,
    /// Programs made from kept executables, from kept compiled objects, and
    /// made again from what the application gave (compiled or built again).
    from_executables: usize,
    from_compiled: usize,
    from_source: usize,
    /// Bytes written on crane-proxy from blobs a pre-copy sent ahead.
    ahead: u64,
    /// Bytes of it the lanes carried to crane-proxy (`remote::lanes`).
    lanes: u64,
    /// Waiting for the reads a move runs beside the rebuild (`await_read`).
    read_wait: Duration,
}

/// Whether the rebuild's writes go over lanes (`remote::lanes`).
#[derive(Default)]
enum LaneState {
    #[default]
    NotAsked,
    Open(crate::remote::lanes::Lanes),
    None,
}

/// On crane-proxy: the bytes the rebuild's writes would send over the
/// session (RAM copies of host-writable buffers, and those a move is still
/// reading beside the rebuild, less those a pre-copy sent ahead unchanged);
/// 0 locally or when lanes are off.
fn lane_bytes(mems: &[Arc<Mem>]) -> u64 {
    if vendor::remote_session().is_none() || crate::config::get().remote_lanes == 0 {
        return 0;
    }
    let pending = reads().pending.clone();
    mems.iter()
        .filter(|m| crate::remote::ahead::eligible(m))
        .map(|m| {
            if pending.contains(&(Arc::as_ptr(m) as usize)) {
                return m.size as u64;
            }
            let sh = m.shadow.lock().unwrap_or_else(|e| e.into_inner());
            match sh.data() {
                Some(d) if !crate::remote::ahead::holds(m, sh.generation()) => d.len() as u64,
                _ => 0,
            }
        })
        .sum()
}

fn recreate(
    reinjected: &mut u64,
    reinject_time: &mut Duration,
    programs: &mut ProgramStats,
    moved: bool,
) -> ClResult<()> {
    // Sub-devices, parents first (slot order is creation order for a chain).
    for d in handle::live::<Device>() {
        let Some(parent) = &d.parent else { continue };
        *d.now.lock().unwrap_or_else(|e| e.into_inner()) = parent.now();
        let vs = api::platform::create_sub_devices(parent, &d.partition)?;
        let mine = *vs.get(d.index).ok_or(CL_DEVICE_NOT_FOUND)?;
        for (i, &v) in vs.iter().enumerate() {
            if i != d.index {
                // SAFETY: sub-devices made only to reach ours.
                unsafe { vendor::release(v.cast(), |t| t.clReleaseDevice) };
            }
        }
        d.base.set_vendor(mine.cast());
    }
    let t = Instant::now();
    for c in handle::live::<Context>() {
        c.base.set_vendor(api::context::vendor_create(&c)?);
    }
    programs.contexts = t.elapsed();
    for q in handle::live::<Queue>() {
        q.base.set_vendor(queue_api::vendor_create(&q)?);
    }
    // Memory: buffers, then objects built on them.
    let mems = handle::live::<Mem>();
    let queues = handle::live::<Queue>();
    let mut inject = Injection {
        lane_bytes: lane_bytes(&mems),
        ..Injection::default()
    };
    let r = recreate_mems(
        &mems,
        &queues,
        &mut inject,
        reinjected,
        reinject_time,
        &mut programs.read_wait,
    );
    programs.ahead = inject.ahead;
    let t = Instant::now();
    let finished = inject.finish().map(|lanes| programs.lanes = lanes);
    *reinject_time += t.elapsed();
    r?;
    finished?;
    recreate_rest(moved, programs)
}

/// Buffers re-injected by writes from their pinned RAM copies, completed
/// together at the end: the pinning of the next buffer overlaps the
/// transfer of the one before.
#[derive(Default)]
struct Injection {
    /// Per context: the queue the writes go to, and whether it is crane's own.
    queues: Vec<(*const Context, *mut c_void, bool)>,
    pins: Vec<staging::TempPin>,
    /// Bytes written on crane-proxy from blobs a pre-copy sent ahead.
    ahead: u64,
    /// On crane-proxy: the bytes the writes would send (lanes are asked for
    /// at the first write when they are enough), and the lanes.
    lane_bytes: u64,
    lanes: LaneState,
}

impl Injection {
    fn queue(&mut self, ctx: &Context, queues: &[Arc<Queue>]) -> ClResult<*mut c_void> {
        if let Some(&(_, q, _)) = self.queues.iter().find(|(c, ..)| std::ptr::eq(*c, ctx)) {
            return Ok(q);
        }
        let (q, temp) = transfer_queue(ctx, queues)?;
        self.queues.push((ctx, q, temp));
        Ok(q)
    }

    /// The lanes of this rebuild, asked for at the first write that could
    /// use them when the writes are worth it.
    fn lanes(&mut self, s: &crate::remote::Session) -> Option<&mut crate::remote::lanes::Lanes> {
        if matches!(self.lanes, LaneState::NotAsked) {
            let c = crate::config::get();
            self.lanes = match (self.lane_bytes >= c.remote_lanes_min)
                .then(|| crate::remote::lanes::Lanes::open(s, c.remote_lanes))
                .flatten()
            {
                Some(l) => LaneState::Open(l),
                None => LaneState::None,
            };
        }
        match &mut self.lanes {
            LaneState::Open(l) => Some(l),
            _ => None,
        }
    }

    /// Waits until the lanes have sent everything and for every write, then
    /// unpins and drops crane's own queues; the bytes the lanes carried. A
    /// lane that failed fails the rebuild (its writes cannot complete); why
    /// is kept for the report.
    fn finish(self) -> ClResult<u64> {
        let lanes_ok = match self.lanes {
            LaneState::Open(l) => l.finish().map_err(|why| {
                crate::remote::lanes::note_failure(why);
                CL_OUT_OF_RESOURCES
            }),
            _ => Ok(0),
        };
        for &(_, q, _) in &self.queues {
            if let Ok(f) = vfn!(q, clFinish) {
                // SAFETY: a live vendor queue.
                unsafe { f(q.cast()) };
            }
        }
        drop(self.pins);
        for (_, q, temp) in self.queues {
            if temp {
                // SAFETY: the temporary queue `transfer_queue` made.
                unsafe { vendor::release(q, |d| d.clReleaseCommandQueue) };
            }
        }
        lanes_ok
    }
}

/// Writes `m`'s RAM copy into its new vendor buffer with a non-blocking
/// write, from pinned memory locally (if it can be pinned) or over the
/// session to crane-proxy, if the host may write the buffer; None otherwise
/// (the buffer is then created from the copy).
fn inject_pinned(
    m: &Mem,
    data: &HostBytes,
    generation: u64,
    queues: &[Arc<Queue>],
    inject: &mut Injection,
) -> ClResult<Option<*mut c_void>> {
    if !matches!(m.kind, MemKind::Buffer)
        || m.flags & (CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS) != 0
    {
        return Ok(None);
    }
    // Sent ahead by a pre-copy and unchanged since: the proxy writes it from
    // the blob it holds.
    if let Some(s) = vendor::remote_session()
        && let Some(key) = crate::remote::ahead::blob_for(m, generation)
    {
        let q = inject.queue(&m.context, queues)?;
        let v = memory::vendor_create(m, None)?;
        let call = crane_wire::Call::EnqueueWriteStash {
            queue: crate::remote::id_of(q),
            buffer: crate::remote::id_of(v),
            offset: 0,
            key,
            sync: crane_wire::Sync::default(),
        };
        if let Err(e) = s.post(&call, &[], false) {
            // SAFETY: the buffer just made.
            unsafe { vendor::release(v, |d| d.clReleaseMemObject) };
            return Err(e);
        }
        inject.ahead += data.len() as u64;
        return Ok(Some(v));
    }
    // Over the lanes: in pieces beside the session's own connection, which
    // carries the writes that take them, in order.
    if let Some(s) = vendor::remote_session()
        && inject.lanes(&s).is_some()
    {
        let q = inject.queue(&m.context, queues)?;
        let v = memory::vendor_create(m, None)?;
        let lanes = inject.lanes(&s).expect("opened above");
        if let Err(e) = send_over_lanes(&s, lanes, q, v, data) {
            // SAFETY: the buffer just made.
            unsafe { vendor::release(v, |d| d.clReleaseMemObject) };
            return Err(e);
        }
        return Ok(Some(v));
    }
    // On crane-proxy the write goes over the session, whose payload the proxy
    // reads straight into its own pinned staging and copies to the device
    // while the next arrives (a buffer created from the data instead is one
    // synchronous copy from the proxy's pageable memory after the whole
    // payload has come); locally the RAM copy is pinned for the DMA.
    let pin = if vendor::remote_session().is_some() {
        None
    } else {
        let Some(pin) = data.pin(&m.context) else {
            debug!("re-injecting {} bytes from unpinned memory", data.len());
            return Ok(None);
        };
        Some(pin)
    };
    let q = inject.queue(&m.context, queues)?;
    let v = memory::vendor_create(m, None)?;
    // SAFETY: a non-blocking write of the copy's `len` bytes, which stay
    // mapped and pinned until `Injection::finish` has waited for it.
    let rc = unsafe {
        vfn!(q, clEnqueueWriteBuffer)?(
            q.cast(),
            v.cast(),
            CL_FALSE,
            0,
            data.len(),
            data.as_ptr().cast(),
            0,
            std::ptr::null(),
            std::ptr::null_mut(),
        )
    };
    if rc != CL_SUCCESS {
        // SAFETY: the buffer just made.
        unsafe { vendor::release(v, |d| d.clReleaseMemObject) };
        return Err(rc);
    }
    inject.pins.extend(pin);
    Ok(Some(v))
}

/// Writes `data` into the proxy's buffer `v` on queue `q` in pieces over
/// the lanes: each piece goes on a lane and the write that takes it on the
/// session's own connection, sent at once (the proxy waits for a piece
/// only once its write comes; a lane holds few pieces the session has not
/// written, so the writes must not wait in the batch).
fn send_over_lanes(
    s: &crate::remote::Session,
    lanes: &mut crate::remote::lanes::Lanes,
    q: *mut c_void,
    v: *mut c_void,
    data: &HostBytes,
) -> ClResult<()> {
    let piece = crate::config::get().remote_lane_piece;
    let (queue, buffer) = (crate::remote::id_of(q), crate::remote::id_of(v));
    let mut offset = 0;
    while offset < data.len() {
        let len = piece.min(data.len() - offset);
        let key = s.new_id();
        // SAFETY: the RAM copy stays as it is until the lanes have sent
        // it: the application is stopped for the whole rebuild, which
        // changes no RAM copy, and `Injection::finish` joins the lanes
        // before the rebuild returns.
        if let Err(why) = unsafe { lanes.send(key, &data[offset..offset + len]) } {
            crate::remote::lanes::note_failure(why);
            return Err(CL_OUT_OF_RESOURCES);
        }
        let call = crane_wire::Call::EnqueueWriteLane {
            queue,
            buffer,
            offset: offset as u64,
            key,
            sync: crane_wire::Sync::default(),
        };
        s.post(&call, &[], true)?;
        offset += len;
    }
    Ok(())
}

fn recreate_mems(
    mems: &[Arc<Mem>],
    queues: &[Arc<Queue>],
    inject: &mut Injection,
    reinjected: &mut u64,
    reinject_time: &mut Duration,
    read_wait: &mut Duration,
) -> ClResult<()> {
    for pass in 0..3 {
        for m in mems {
            let this_pass = match &m.kind {
                MemKind::Buffer | MemKind::Pipe { .. } => 0,
                MemKind::SubBuffer { .. } => 1,
                MemKind::Image { buffer, .. } => {
                    if buffer.is_some() {
                        2
                    } else {
                        0
                    }
                }
            };
            if this_pass == pass {
                // Read beside by a move to crane-proxy: its RAM copy once
                // the read is done.
                let t = Instant::now();
                await_read(m)?;
                *read_wait += t.elapsed();
                // Objects with a RAM copy are created from it (CL_MEM_COPY_HOST_PTR
                // works whatever the host access flags); that is the re-injection.
                let t = Instant::now();
                let sh = m.shadow.lock().unwrap_or_else(|e| e.into_inner());
                let init = match (&m.kind, sh.data()) {
                    (MemKind::Buffer | MemKind::Image { buffer: None, .. }, Some(d))
                        if m.flags & CL_MEM_USE_HOST_PTR == 0 =>
                    {
                        Some(d.as_ptr().cast::<c_void>())
                    }
                    _ => None,
                };
                let pinned = match (sh.data(), init) {
                    (Some(d), Some(_)) => inject_pinned(m, d, sh.generation(), queues, inject)?,
                    _ => None,
                };
                match pinned {
                    Some(v) => m.base.set_vendor(v),
                    None => m.base.set_vendor(memory::vendor_create(m, init)?),
                }
                if init.is_some() {
                    *reinjected += sh.data().map_or(0, |d| d.len() as u64);
                    *reinject_time += t.elapsed();
                }
            }
        }
    }
    Ok(())
}

/// Linked programs in an order where each comes after the linked programs
/// among its inputs (libraries); any left in a cycle (none can be made
/// so) come last, as they were.
fn link_order(mut left: Vec<Arc<Program>>) -> Vec<Arc<Program>> {
    let mut out = Vec::with_capacity(left.len());
    loop {
        let waits = |p: &Arc<Program>, left: &[Arc<Program>]| match &p.source {
            ProgramSource::Linked { inputs, .. } => inputs
                .iter()
                .any(|i| left.iter().any(|l| Arc::ptr_eq(l, i))),
            _ => false,
        };
        let before = left.len();
        let mut i = 0;
        while i < left.len() {
            if waits(&left[i], &left) {
                i += 1;
            } else {
                out.push(left.remove(i));
            }
        }
        if left.is_empty() || left.len() == before {
            out.extend(left);
            return out;
        }
    }
}

fn recreate_rest(moved: bool, stats: &mut ProgramStats) -> ClResult<()> {
    for s in handle::live::<Sampler>() {
        s.base.set_vendor(api::sampler::vendor_create(&s)?);
    }
    // Programs: plain ones, then linked ones (their inputs exist by then).
    let started = Instant::now();
    // Programs that a compile names as embedded headers are made before the
    // programs compiled with them (an application may make the header after
    // the program, as the CTS's test_compiler does; PoCL crashed on the
    // header's stale vendor object).
    let mut progs = handle::live::<Program>();
    let compiled_with_headers = |p: &Arc<Program>| {
        p.steps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|s| matches!(s, BuildStep::Compile { headers, .. } if !headers.is_empty()))
    };
    progs.sort_by_key(|p| compiled_with_headers(p));
    // Plain programs, then linked ones, each after the linked programs it
    // was linked from (a library): handles are recycled, so slot order is
    // not creation order (NVIDIA's test_compiler multiple_libraries under
    // switches linked a program from a library not yet made: "id 0").
    let (linked_progs, mut order): (Vec<_>, Vec<_>) = progs
        .into_iter()
        .partition(|p| matches!(p.source, ProgramSource::Linked { .. }));
    order.extend(link_order(linked_progs));
    for p in &order {
        let linked = matches!(p.source, ProgramSource::Linked { .. });
        p.from_compiled.store(false, Ordering::Relaxed);
        // A compiled program is made from the compiled object kept at
        // suspend on the same devices and drivers (without the compiler:
        // hundreds of compiled programs took seconds to compile again on
        // every move; made from its source again only if the application
        // compiles it again), and elsewhere where its compile could not
        // read its files again (its headers are gone), unless the devices
        // changed: that object is for the old ones. Otherwise it is
        // compiled again from its source.
        if !linked
            && (program::compiled_is_current(p) || (!moved && !program::recompilable(p)))
            && let Some((v, n)) = program::vendor_create_compiled(p)
        {
            p.base.set_vendor(v);
            stats.reused_bytes += n;
            stats.from_compiled += 1;
            continue;
        }
        // Built on the same devices and drivers before: made from the
        // executable kept at suspend, without the compiler.
        if let Some((v, n)) = program::vendor_create_executable(p) {
            p.base.set_vendor(v);
            stats.reused_bytes += n;
            stats.from_executables += 1;
            continue;
        }
        stats.from_source += 1;
        let v = program::vendor_create(p)?;
        p.base.set_vendor(v);
        let replayed = p
            .steps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|step| !(matches!(step, BuildStep::Compile { .. }) && linked))
            .try_for_each(|step| program::replay_step(v, step));
        if let Err(e) = replayed {
            // The compiled object, where one was kept, rather than no
            // program at all.
            let Some((kept, _)) = (!linked && !moved)
                .then(|| program::vendor_create_compiled(p))
                .flatten()
            else {
                return Err(e);
            };
            let old = p.base.take_vendor();
            // SAFETY: the program made above, which nothing else holds.
            unsafe { vendor::release(old, |t| t.clReleaseProgram) };
            p.base.set_vendor(kept);
        }
    }
    stats.time = started.elapsed();
    debug!(
        "programs: {} from kept executables, {} from kept compiled objects, {} made again",
        stats.from_executables, stats.from_compiled, stats.from_source
    );
    for k in handle::live::<Kernel>() {
        let vp = k.program.base.vendor();
        let mut err = CL_SUCCESS;
        // SAFETY: vendor program and the recorded name.
        let vk = unsafe { vfn!(vp, clCreateKernel)?(vp.cast(), k.name.as_ptr(), &mut err) };
        check(err)?;
        k.base.set_vendor(vk.cast());
        // SAFETY: the gate is shut; no application thread touches the kernel.
        for (i, a) in unsafe { k.args_mut() }.iter().enumerate() {
            kernel::apply_arg(vk.cast(), i as u32, a)?;
        }
        for (param, bytes) in k.exec_info.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            // SAFETY: recorded exec info.
            check(unsafe {
                vfn!(vk, clSetKernelExecInfo)?(vk, *param, bytes.len(), bytes.as_ptr().cast())
            })?;
        }
    }
    // Events become user events carrying their final status.
    for e in handle::live::<Event>() {
        let vc = e.context.base.vendor();
        let mut err = CL_SUCCESS;
        // SAFETY: vendor context.
        let v = unsafe { vfn!(vc, clCreateUserEvent)?(vc.cast(), &mut err) };
        check(err)?;
        let status = e.final_status.load(Ordering::Acquire);
        if status <= CL_COMPLETE {
            // SAFETY: a fresh user event.
            check(unsafe { vfn!(v, clSetUserEventStatus)?(v, status) })?;
        }
        e.base.set_vendor(v.cast());
        for cb in e.callbacks.lock().unwrap_or_else(|x| x.into_inner()).iter() {
            if !cb.fired.load(Ordering::Acquire) {
                crate::callbacks::register_event(v.cast(), cb);
            }
        }
    }
    Ok(())
}

/// A round trip that returns the first failure of the calls posted before it.
fn remote_sync(s: &crate::remote::Session) -> Result<(), cl_int> {
    match s.call(
        &crane_wire::Call::Sync,
        &[],
        crate::remote::session::Dest::Keep,
    )? {
        (crane_wire::Answer::Status(CL_SUCCESS), _) => match s.take_failure() {
            Some(e) => Err(e),
            None => Ok(()),
        },
        (crane_wire::Answer::Status(e), _) => Err(e),
        _ => Err(CL_INVALID_OPERATION),
    }
}

/// What every memory object on crane-proxy holds at a checkpoint, by its id
/// there: its RAM copy (or a `CL_MEM_USE_HOST_PTR` buffer's host memory).
/// Sub-buffers and images made from buffers hold their parents' memory.
fn journal_contents() -> HashMap<crane_wire::Id, crate::remote::journal::Content> {
    use crate::remote::id_of;
    let mut out = HashMap::new();
    let mut todo = handle::live::<Mem>();
    while let Some(m) = todo.pop() {
        match &m.kind {
            MemKind::SubBuffer { parent, .. } => {
                todo.push(parent.clone());
                continue;
            }
            MemKind::Image {
                buffer: Some(b), ..
            } => {
                todo.push(b.clone());
                continue;
            }
            MemKind::Pipe { .. } => continue,
            _ => {}
        }
        let v = m.base.vendor();
        if v.is_null() {
            continue;
        }
        let id = id_of(v);
        if out.contains_key(&id) {
            continue;
        }
        let device = m
            .context
            .devices
            .first()
            .map_or(0, |d| id_of(d.base.vendor()));
        let context = id_of(m.context.base.vendor());
        let copy = (m.flags & CL_MEM_USE_HOST_PTR != 0
            && m.host_ptr != 0
            && matches!(m.kind, MemKind::Buffer))
        .then(|| {
            // SAFETY: the application's memory behind a CL_MEM_USE_HOST_PTR
            // buffer, `size` bytes, kept for the buffer's life; the gate is
            // shut, so no call of the application changes it now.
            std::sync::Arc::<[u8]>::from(unsafe {
                std::slice::from_raw_parts(m.host_ptr as *const u8, m.size)
            })
        });
        out.insert(
            id,
            crate::remote::journal::Content {
                mem: Arc::downgrade(&m),
                context,
                device,
                copy,
            },
        );
    }
    out
}

/// A checkpoint of a process on crane-proxy (docs/reliability.md): its
/// queues drained and what the proxy changed read back into RAM, so that
/// the journal a replay needs shrinks to the objects and their RAM copies.
/// Taken when the journal grows past `CRANE_REMOTE_JOURNAL_MIB`, and on
/// request (`cranectl checkpoint`).
pub fn checkpoint(deadline: Duration) -> Result<Vec<Phase>, String> {
    if mode() != Mode::Remote {
        return Err("checkpoints are for processes on crane-proxy".into());
    }
    let Some(s) = vendor::remote_session() else {
        return Err("the process has no session with crane-proxy".into());
    };
    let mut tm = Timer::new();
    let staged = drain_and_read_back(deadline, &mut tm, None)?;
    // A replay remakes the events of commands before now with markers: their
    // status and profiling times are answered from what is kept here.
    save_events();
    s.checkpoint_with(|| {
        staged.install();
        journal_contents()
    });
    let (calls, kept, _, _) = s.journal_state();
    tm.lap("compact", kept);
    debug!("checkpoint: {calls} call(s) kept; {:?}", tm.phases);
    gate::open();
    Ok(tm.phases)
}

/// Passthrough (or suspended) to remote: the pre-migration critical path.
/// The state goes to RAM as for `suspend`; then crane-proxy rebuilds the
/// objects from RAM while a helper thread releases the local ones and unloads
/// the local vendor library; the application's calls resume on crane-proxy
/// as soon as it has rebuilt them, and this returns once the local vendor
/// library is gone too (as after `suspend`).
/// If the proxy cannot take them, the process goes back to where it was.
pub fn go_remote(
    addr: String,
    token: String,
    deadline: Duration,
    spec: Option<DeviceSpec>,
) -> Result<(Vec<Phase>, Residue), String> {
    let was = mode();
    if was == Mode::Remote {
        return Err("the process is already remote".into());
    }
    let before = vendor::target();
    let remote = Target::Remote {
        addr: addr.clone(),
        token,
    };
    if was == Mode::Suspended {
        vendor::set_target(remote);
        vendor::set_device(spec);
        return resume().map(|p| (p, Residue::default())).map_err(|e| {
            vendor::set_target(before);
            format!("moving to crane-proxy at {addr} failed: {e}; it stays suspended")
        });
    }
    if crate::config::get().parallel_release {
        return go_remote_streamed(&addr, remote, before, deadline, spec);
    }
    // `CRANE_PARALLEL_RELEASE=0`: read, release and unload, then rebuild.
    let mut tm = Timer::new();
    park(deadline, &mut tm, None)?;
    let released = release_and_close(take_vendor_objects(), vendor::detach());
    set_mode(Mode::Suspended);
    vendor::set_target(remote);
    vendor::set_device(spec);
    let rebuilt = rebuild();
    let waited = Instant::now();
    let mut res = residue();
    res.libraries_still_mapped = released.still_mapped.clone();
    end_move(&mut tm, &released, false, false, waited, rebuilt, before)
        .map(|()| (tm.phases, res))
        .map_err(|e| moving_failed(&addr, e))
}

fn moving_failed(addr: &str, (e, back): (String, Result<(), String>)) -> String {
    let back = match back {
        Ok(()) => "it carries on locally".to_string(),
        Err(e2) => format!("resuming locally failed too ({e2}); it stays suspended"),
    };
    format!("moving to crane-proxy at {addr} failed: {e}; {back}")
}

/// A move from passthrough to crane-proxy with the device's memory read
/// while the proxy rebuilds: a helper thread reads the dirty buffers one
/// after the other (into their RAM copies, pinned) while this thread
/// recreates the objects on the proxy and sends each buffer as soon as its
/// read is done ([`await_read`]), so that reading, sending and the proxy's
/// writes overlap instead of following one another; the helper then
/// releases the local objects and unloads the local vendor
/// ([`release_and_close`]). If a read fails, the move goes back: the proxy's
/// objects are given up and the local ones, not released, put back.
fn go_remote_streamed(
    addr: &str,
    remote: Target,
    before: Target,
    deadline: Duration,
    spec: Option<DeviceSpec>,
) -> Result<(Vec<Phase>, Residue), String> {
    let mut tm = Timer::new();
    let mut deferred = Deferred::default();
    park(deadline, &mut tm, Some(&mut deferred))?;
    let held = take_vendor_objects();
    let detached = vendor::detach();
    let helper = deferred.start(held, detached);
    set_mode(Mode::Suspended);
    vendor::set_target(remote);
    vendor::set_device(spec);
    let rebuilt = rebuild();
    let early = rebuilt.is_ok();
    if early {
        reopen();
    }
    let waited = Instant::now();
    match helper.finish() {
        AfterReads::Done {
            read,
            bytes,
            released,
        } => {
            tm.phases.push(Phase {
                name: "read-dirty-beside".into(),
                ms: read.as_secs_f64() * 1e3,
                bytes,
                parallel: true,
            });
            let mut res = residue();
            res.libraries_still_mapped = released.still_mapped.clone();
            end_move(&mut tm, &released, true, early, waited, rebuilt, before)
                .map(|()| (tm.phases, res))
                .map_err(|e| moving_failed(addr, e))
        }
        AfterReads::Failed {
            error,
            held,
            detached,
        } => {
            if rebuilt.is_ok() {
                // Not reached: the rebuild waits for every read. Given up
                // all the same.
                release_all();
                vendor::unload(&policy());
            }
            vendor::set_target(before);
            restore_held(held);
            vendor::reattach(detached);
            staging::repin_held();
            reopen();
            Err(format!(
                "moving to crane-proxy at {addr} failed: reading device memory back failed \
                 with OpenCL error {}; it carries on locally",
                crate::entry::error_text(error)
            ))
        }
    }
}

/// Reads of a move to crane-proxy that [`read_back`] leaves to a helper
/// thread: plain reads of buffers, with the local vendor handles they need
/// (taken before the objects' own are taken out for the release).
#[derive(Default)]
struct Deferred {
    jobs: Vec<ReadJob>,
    /// Per context: the queue the reads go to, and whether it is crane's own.
    queues: Vec<(usize, usize, bool)>,
}

struct ReadJob {
    m: Arc<Mem>,
    mem: usize,
    queue: usize,
    context: usize,
    device: usize,
}

/// What the helper of a streamed move did.
enum AfterReads {
    Done {
        read: Duration,
        bytes: u64,
        released: Released,
    },
    /// A read failed: nothing was released.
    Failed {
        error: cl_int,
        held: Held,
        detached: vendor::Detached,
    },
}

enum ReadHelper {
    Thread(std::thread::JoinHandle<AfterReads>),
    Done(AfterReads),
}

/// The buffers (by address) whose reads are not done yet, and a failed
/// read's error.
struct Reads {
    pending: std::collections::BTreeSet<usize>,
    failed: Option<cl_int>,
}

static READS: Mutex<Reads> = Mutex::new(Reads {
    pending: std::collections::BTreeSet::new(),
    failed: None,
});
static READ_DONE: std::sync::Condvar = std::sync::Condvar::new();

fn reads() -> std::sync::MutexGuard<'static, Reads> {
    READS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits until `m`'s contents are in its RAM copy, if a streamed move is
/// reading it; the read's error if it (or an earlier one) failed.
fn await_read(m: &Mem) -> ClResult<()> {
    let addr = std::ptr::from_ref(m) as usize;
    let mut st = reads();
    loop {
        if !st.pending.contains(&addr) {
            return Ok(());
        }
        if let Some(e) = st.failed {
            return Err(e);
        }
        st = READ_DONE.wait(st).unwrap_or_else(|e| e.into_inner());
    }
}

impl Deferred {
    /// Adds `m` (a buffer the host may read), on a queue of its context.
    fn add(&mut self, m: Arc<Mem>, queues: &[Arc<Queue>]) -> ClResult<()> {
        let ctx = std::ptr::from_ref(&*m.context) as usize;
        let queue = match self.queues.iter().find(|(c, ..)| *c == ctx) {
            Some(&(_, q, _)) => q,
            None => {
                let (q, temp) = transfer_queue(&m.context, queues)?;
                self.queues.push((ctx, q as usize, temp));
                q as usize
            }
        };
        self.jobs.push(ReadJob {
            mem: m.base.vendor() as usize,
            queue,
            context: m.context.base.vendor() as usize,
            device: m
                .context
                .devices
                .first()
                .map_or(0, |d| d.base.vendor() as usize),
            m,
        });
        Ok(())
    }

    /// Releases crane's own queues (the reads are done or abandoned).
    fn drop_queues(&mut self) {
        for (_, q, temp) in self.queues.drain(..) {
            if temp {
                // SAFETY: a temporary queue `transfer_queue` made.
                unsafe { vendor::release(q as *mut c_void, |d| d.clReleaseCommandQueue) };
            }
        }
    }

    /// Marks the buffers pending and starts the helper: the reads, then,
    /// if they all worked, the release of `held` and the unload of
    /// `detached` (on this thread if no helper can be started).
    fn start(self, held: Held, detached: vendor::Detached) -> ReadHelper {
        {
            let mut st = reads();
            st.failed = None;
            st.pending = self
                .jobs
                .iter()
                .map(|j| Arc::as_ptr(&j.m) as usize)
                .collect();
        }
        let work = Arc::new(Mutex::new(Some((self, held, detached))));
        let mine = work.clone();
        let run = move || {
            let taken = mine.lock().unwrap_or_else(|e| e.into_inner()).take();
            let (d, held, detached) = taken.expect("taken once");
            d.run(held, detached)
        };
        match std::thread::Builder::new()
            .name("crane-read".into())
            .spawn(run)
        {
            Ok(t) => ReadHelper::Thread(t),
            Err(e) => {
                warn!("reading on this thread: cannot start a helper ({e})");
                let taken = work.lock().unwrap_or_else(|e| e.into_inner()).take();
                let (d, held, detached) = taken.expect("not taken");
                ReadHelper::Done(d.run(held, detached))
            }
        }
    }

    fn run(mut self, held: Held, detached: vendor::Detached) -> AfterReads {
        let t = Instant::now();
        let jobs = std::mem::take(&mut self.jobs);
        // Fresh RAM copies for the buffers without one, faulted in by
        // helpers ahead of the reads.
        let (mut fresh, faulting) = fresh_copies(
            jobs.iter()
                .enumerate()
                .filter(|(_, j)| lacks_ram_copy(&j.m))
                .map(|(i, j)| (i, j.m.size))
                .collect(),
        );
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut bytes = 0u64;
            for (i, j) in jobs.iter().enumerate() {
                read_job(j, fresh.remove(&i))?;
                bytes += j.m.size as u64;
                reads().pending.remove(&(Arc::as_ptr(&j.m) as usize));
                READ_DONE.notify_all();
            }
            Ok(bytes)
        }))
        .unwrap_or(Err(CL_OUT_OF_HOST_MEMORY));
        drop(faulting);
        self.drop_queues();
        let read_time = t.elapsed();
        match read {
            Ok(bytes) => AfterReads::Done {
                read: read_time,
                bytes,
                released: release_and_close(held, detached),
            },
            Err(error) => {
                let mut st = reads();
                st.failed = Some(error);
                drop(st);
                READ_DONE.notify_all();
                AfterReads::Failed {
                    error,
                    held,
                    detached,
                }
            }
        }
    }
}

/// One deferred read, into the RAM copy's own memory where it has one (else
/// into `fresh`), pinned on the local context for the read.
fn read_job(j: &ReadJob, fresh: Option<HostBytes>) -> ClResult<()> {
    let m = &j.m;
    let mut data = m
        .shadow
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .replace(None)
        .filter(|d| d.len() == m.size)
        .or(fresh)
        .unwrap_or_else(|| HostBytes::zeroed(m.size));
    if data.pinned_on(j.context as *mut c_void) {
        debug!("move: {} bytes read into a RAM copy kept pinned", m.size);
    }
    let pin = data.pin_on(j.context as *mut c_void, j.device as *mut c_void);
    // A plain read (the host may read these buffers: no scratch buffer on
    // the context, whose vendor handle is already taken); the local
    // objects stay alive until the helper releases them after this.
    let read = read_buffer(
        &m.context,
        j.queue as cl_command_queue,
        j.mem as *mut c_void,
        m.flags,
        m.size,
        data.as_mut_ptr(),
    );
    drop(pin);
    read?;
    if crate::fault::move_read_fails() {
        return Err(CL_OUT_OF_RESOURCES);
    }
    install(m, data);
    Ok(())
}

impl ReadHelper {
    fn finish(self) -> AfterReads {
        let after = match self {
            ReadHelper::Done(a) => a,
            ReadHelper::Thread(t) => t.join().unwrap_or_else(|_| {
                // `run` catches the reads' panics; one in the release is
                // the release's (its objects are gone).
                warn!("the read and release helper panicked");
                AfterReads::Done {
                    read: Duration::ZERO,
                    bytes: 0,
                    released: Released::default(),
                }
            }),
        };
        let mut st = reads();
        st.pending.clear();
        st.failed = None;
        after
    }
}

/// The end of a move between the local vendor and crane-proxy: the
/// release's phases (`parallel` where they ran beside), then, if the
/// rebuild worked, its phases and `wait-release` (and the application's
/// calls let through, if they were not yet: `early`); if it did not, the
/// process goes back to `before` with a resume there, whose outcome comes
/// with the rebuild's error.
fn end_move(
    tm: &mut Timer,
    released: &Released,
    parallel: bool,
    early: bool,
    waited: Instant,
    rebuilt: Result<Vec<Phase>, String>,
    before: Target,
) -> Result<(), (String, Result<(), String>)> {
    for (name, d) in [("release", released.release), ("unload", released.unload)] {
        tm.phases.push(Phase {
            name: name.into(),
            ms: d.as_secs_f64() * 1e3,
            bytes: 0,
            parallel,
        });
    }
    match rebuilt {
        Ok(p) => {
            tm.phases.extend(p);
            tm.phases.push(Phase {
                name: "wait-release".into(),
                ms: waited.elapsed().as_secs_f64() * 1e3,
                bytes: 0,
                parallel: early,
            });
            if !early {
                reopen();
            }
            Ok(())
        }
        Err(e) => {
            vendor::set_target(before);
            Err((e, resume().map(|_| ())))
        }
    }
}

/// What the helper thread of a move to crane-proxy did.
#[derive(Default)]
struct Released {
    release: Duration,
    unload: Duration,
    still_mapped: Vec<String>,
}

/// Gives taken vendor objects back and closes the detached vendor libraries.
fn release_and_close(held: Held, detached: vendor::Detached) -> Released {
    let t = Instant::now();
    give_back(held);
    unload_compilers_of(&detached.platforms());
    let release = t.elapsed();
    let still_mapped = close_vendors(detached);
    Released {
        release,
        unload: t.elapsed() - release,
        still_mapped,
    }
}

/// The release of the local objects during a move back from crane-proxy.
enum Releaser {
    /// Done before the rebuild (`CRANE_PARALLEL_RELEASE=0`).
    Done(Released),
    /// Done when [`finish`](Releaser::finish) is called: after the
    /// application runs locally again.
    Later(Held, vendor::Detached),
}

impl Releaser {
    fn finish(self) -> Released {
        match self {
            Releaser::Done(r) => r,
            Releaser::Later(held, detached) => release_and_close(held, detached),
        }
    }
}

/// Remote to passthrough: the post-migration path. Drains the proxy, reads
/// back what it dirtied, closes the session (the proxy frees its memory), then
/// reloads the local vendor library and recreates everything.
///
/// With a device spec, also from passthrough: onto other local devices (a
/// suspend and a resume there); if they cannot take the process, it resumes
/// where it was.
///
/// From crane-proxy, first, while the application still runs there, the
/// local vendor is opened and its contexts made ([`crate::local_ahead`]),
/// so that the stop waits for no driver context; with `precopy` rounds
/// (`cranectl local --precopy`) the buffers the proxy changed are then read
/// in rounds (see [`precopy`]), so that the stop reads only what changed
/// after the last round. The application's calls go on once the local
/// rebuild is done; the proxy's objects are released and its session closed
/// after that. If the local rebuild fails the application carries on on
/// crane-proxy.
pub fn go_local(
    deadline: Duration,
    spec: Option<DeviceSpec>,
    precopy_rounds: u32,
) -> Result<Vec<Phase>, String> {
    if mode() != Mode::Remote {
        return go_local_then(deadline, spec, || {});
    }
    let mut phases = back_ahead(deadline, spec.as_ref(), precopy_rounds);
    let ahead_contexts = crate::local_ahead::any();
    let done = go_local_from_remote(deadline, spec);
    // Made ahead and not taken (or the move did not happen): released while
    // their library is still open.
    crate::local_ahead::discard();
    if mode() != Mode::Passthrough {
        vendor::drop_preloaded();
    }
    if ahead_contexts {
        debug!("the move back used the contexts made ahead where it could");
    }
    done.map(|p| {
        phases.extend(p);
        phases
    })
}

/// Bytes a round of the pre-copy on the way back may leave to the stop and
/// end the rounds.
const BACK_SMALL: u64 = 8 << 20;

/// The preparation of [`go_local`] from crane-proxy, beside the
/// application: the local vendor opened and the contexts made, then
/// `rounds` of pre-copy (0: none); its phases (all `parallel`). A failure
/// costs only the time: the move then makes and reads what was not made or
/// read.
fn back_ahead(deadline: Duration, spec: Option<&DeviceSpec>, rounds: u32) -> Vec<Phase> {
    let mut phases = Vec::new();
    let mut beside = |name: String, t: Instant, bytes: u64| {
        phases.push(Phase {
            name,
            ms: t.elapsed().as_secs_f64() * 1e3,
            bytes,
            parallel: true,
        });
    };
    let t = Instant::now();
    match crate::local_ahead::prepare(spec) {
        Ok(n) => debug!("{n} context(s) made ahead on the local vendor"),
        Err(e) => debug!("the local vendor could not be prepared ahead: {e}"),
    }
    beside("ahead-contexts".into(), t, 0);
    let mut last = u64::MAX;
    for k in 1..=rounds {
        let t = Instant::now();
        let read = match precopy(deadline, Pins::Hot) {
            Ok(p) => p.iter().map(|x| x.bytes).sum::<u64>(),
            Err(e) => {
                debug!("pre-copy round {k} on the way back: {e}");
                break;
            }
        };
        beside(format!("precopy-read-{k}"), t, read);
        if read <= BACK_SMALL || read >= last {
            break;
        }
        last = read;
    }
    phases
}

/// crane-proxy to the local vendor. The proxy's objects are released and
/// its session closed once the application runs locally
/// (`CRANE_PARALLEL_RELEASE=0`: before the rebuild): not beside the rebuild,
/// since on a shared GPU the proxy's teardown (its contexts destroyed)
/// slowed the rebuild's writes 2-3 fold, and nothing waits for it.
fn go_local_from_remote(
    deadline: Duration,
    spec: Option<DeviceSpec>,
) -> Result<Vec<Phase>, String> {
    let mut tm = Timer::new();
    park(deadline, &mut tm, None)?;
    let parallel = crate::config::get().parallel_release;
    let before = vendor::target();
    let (held, detached) = (take_vendor_objects(), vendor::detach());
    let releaser = if parallel {
        Releaser::Later(held, detached)
    } else {
        Releaser::Done(release_and_close(held, detached))
    };
    set_mode(Mode::Suspended);
    vendor::set_target(Target::Local);
    vendor::set_device(spec);
    let rebuilt = rebuild();
    let early = rebuilt.is_ok() && parallel;
    if early {
        reopen();
    }
    let waited = Instant::now();
    let released = releaser.finish();
    // On failure, back onto crane-proxy (a new session, rebuilt from RAM).
    match end_move(&mut tm, &released, parallel, early, waited, rebuilt, before) {
        Ok(()) => Ok(tm.phases),
        Err((e, back)) => {
            let back = match back {
                Ok(()) => "it carries on on crane-proxy".to_string(),
                Err(e2) => format!(
                    "resuming on crane-proxy failed too ({e2}); it stays suspended \
                     (retry, or go remote again)"
                ),
            };
            Err(format!("going local failed: {e}; {back}"))
        }
    }
}

/// [`go_local`], running `between` after the suspend from crane-proxy (its
/// session closed) and before the resume onto the local vendor.
pub fn go_local_then(
    deadline: Duration,
    spec: Option<DeviceSpec>,
    between: impl FnOnce(),
) -> Result<Vec<Phase>, String> {
    let was = mode();
    if was == Mode::Passthrough {
        let Some(spec) = spec else {
            return Err("the process is already local".into());
        };
        if vendor::used_roots().is_empty() {
            return Err("nothing to move: the process has made no OpenCL context yet".into());
        }
        let mut phases = suspend(deadline)?.0;
        vendor::set_device(Some(spec.clone()));
        return match resume() {
            Ok(p) => {
                phases.extend(p);
                Ok(phases)
            }
            Err(e) => match resume() {
                Ok(_) => Err(format!(
                    "moving onto device {spec} failed: {e}; it carries on where it was"
                )),
                Err(e2) => Err(format!(
                    "moving onto device {spec} failed: {e}; resuming where it was failed \
                     too ({e2}); it stays suspended"
                )),
            },
        };
    }
    let mut phases = if was == Mode::Remote {
        suspend(deadline)?.0
    } else {
        Vec::new()
    };
    between();
    let before = vendor::target();
    vendor::set_target(Target::Local);
    vendor::set_device(spec);
    match resume() {
        Ok(p) => {
            phases.extend(p);
            Ok(phases)
        }
        Err(e) => {
            vendor::set_target(before);
            Err(format!(
                "going local failed: {e}; the process stays suspended (retry, or go remote again)"
            ))
        }
    }
}

/// Object counts and byte totals for `cranectl list`.
pub fn status() -> crane_control::AppStatus {
    let mems = handle::live::<Mem>();
    let roots = mems
        .iter()
        .filter(|m| !matches!(m.kind, MemKind::SubBuffer { .. }));
    let mut tracked = 0u64;
    let mut dirty = 0u64;
    for m in roots {
        let size = match &m.kind {
            MemKind::Image { format, desc, .. } => {
                (memory::image_region(desc).iter().product::<usize>() * memory::pixel_size(format))
                    as u64
            }
            _ => m.size as u64,
        };
        tracked += size;
        if m.dirty.load(Ordering::Relaxed) {
            dirty += size;
        }
    }
    crane_control::AppStatus {
        objects: crane_control::ObjectCounts {
            contexts: handle::count::<Context>(),
            queues: handle::count::<Queue>(),
            buffers: mems.iter().filter(|m| !m.is_image()).count(),
            images: mems.iter().filter(|m| m.is_image()).count(),
            samplers: handle::count::<Sampler>(),
            programs: handle::count::<Program>(),
            kernels: handle::count::<Kernel>(),
            events: handle::count::<Event>(),
            svm_allocations: api::svm::live_bytes().0,
        },
        tracked_bytes: tracked,
        dirty_bytes: dirty,
        devices: vendor::used_roots()
            .iter()
            .map(|d| d.now().to_string())
            .collect(),
        busy: false,
        ..status_busy()
    }
}

/// What can be told without pausing the application (its objects cannot be
/// walked while its calls run): pid, exe, mode and vendors, marked busy.
pub fn status_busy() -> crane_control::AppStatus {
    crane_control::AppStatus {
        pid: std::process::id(),
        exe: std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        mode: mode(),
        objects: crane_control::ObjectCounts::default(),
        tracked_bytes: 0,
        dirty_bytes: 0,
        vendors: vendor::loaded_paths()
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        devices: Vec::new(),
        busy: true,
    }
}

#[cfg(test)]
mod tests {
    use super::unloads_compiler;

    #[test]
    fn pocl_compilers_are_unloaded_only_on_pocl_3_and_only_where_used() {
        let pocl3 = "OpenCL 3.0 PoCL 3.1+debian  Linux, None+Asserts, RELOC, LLVM 15.0.6, SLEEF, DISTRO, POCL_DEBUG";
        let pocl5 = "OpenCL 3.0 PoCL 5.0+debian  Linux, None+Asserts, RELOC, SPIR, LLVM 16.0.6";
        assert!(unloads_compiler(pocl3, true));
        assert!(!unloads_compiler(pocl3, false));
        assert!(!unloads_compiler(pocl5, true));
        assert!(!unloads_compiler("OpenCL 3.0 PoCL garbage", true));
        assert!(unloads_compiler("OpenCL 3.0 CUDA 13.0.96", false));
        assert!(unloads_compiler("", true));
    }
}
