//! The remote "vendor" entry points: each has the signature of the OpenCL
//! function it stands for and turns the call into a wire message. Only the
//! functions the interposer calls on a vendor are here; the rest stay empty in
//! the table, which the interposer reports as CL_INVALID_OPERATION (SVM, pipes,
//! host timers: suspend already refuses processes with live SVM).

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{CStr, c_char, c_void};
use std::mem::MaybeUninit;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crane_wire::{
    Answer, Call, Id, ImageDesc, ImageFormat, InfoKind, KernelArg, Rect, Sync as Waits,
};
use opencl_sys::cl_icd::_cl_icd_dispatch;
use opencl_sys::*;

use super::session::{Dest, Session};
use super::{RObj, arc, id_of, obj};
use crate::entry::write_info;

type R<T> = Result<T, cl_int>;

/// Runs a body that returns a status; a panic becomes an error code instead
/// of unwinding into C.
fn guard(f: impl FnOnce() -> R<()>) -> cl_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CL_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CL_OUT_OF_HOST_MEMORY,
    }
}

/// As `guard`, for functions returning an object and an error code.
fn guard_obj(err: *mut cl_int, f: impl FnOnce() -> R<*mut c_void>) -> *mut c_void {
    let (p, e) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(p)) => (p, CL_SUCCESS),
        Ok(Err(e)) => (std::ptr::null_mut(), e),
        Err(_) => (std::ptr::null_mut(), CL_OUT_OF_HOST_MEMORY),
    };
    crate::entry::put(err, e);
    p
}

/// Sends the creation of object `id`; an application's creation fails at
/// once with the proxy's error, and the failed id is given back.
fn created(s: &Arc<Session>, id: Id, call: &Call, payload: &[u8]) -> R<()> {
    s.post_checked(call, payload).inspect_err(|_| {
        let _ = s.post(&Call::Release { id }, &[], false);
    })
}

fn sess<'a>(p: *mut c_void) -> R<&'a Arc<Session>> {
    Ok(&obj(p)?.session)
}

/// A slice from a C pointer and count (empty for a null pointer).
fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if p.is_null() || n == 0 {
        &[]
    } else {
        // SAFETY: OpenCL callers pass `n` valid elements at `p`.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

fn ids<T>(list: *const *mut T, n: cl_uint) -> Vec<Id> {
    slice(list, n as usize)
        .iter()
        .map(|&p| id_of(p.cast()))
        .collect()
}

/// The property types of OpenCL (signed or unsigned, 64 bits wide).
trait Prop: Copy {
    fn bits(self) -> u64;
}
impl Prop for isize {
    fn bits(self) -> u64 {
        self as u64
    }
}
impl Prop for u64 {
    fn bits(self) -> u64 {
        self
    }
}

/// A 0-terminated property list, as numbers, with object-valued entries
/// (`keys`) turned into ids.
fn props<T: Prop>(p: *const T, object_keys: &[u64]) -> Vec<u64> {
    let mut out = Vec::new();
    if p.is_null() {
        return out;
    }
    let mut i = 0;
    loop {
        // SAFETY: a 0-terminated list of key/value pairs.
        let k = unsafe { *p.add(i) }.bits();
        if k == 0 {
            break;
        }
        // SAFETY: as above.
        let v = unsafe { *p.add(i + 1) }.bits();
        out.push(k);
        if object_keys.contains(&k) {
            out.push(id_of(v as usize as *mut c_void));
        } else {
            out.push(v);
        }
        i += 2;
    }
    out
}

/// A property list as the application gave it, with its terminating 0
/// (empty for NULL).
fn raw_props<T: Prop>(p: *const T) -> Vec<u64> {
    if p.is_null() {
        return Vec::new();
    }
    let mut v = props(p, &[]);
    v.push(0);
    v
}

/// Records the application's property list of a new object.
fn keep_props(o: *mut c_void, list: Vec<u64>) -> R<*mut c_void> {
    *obj(o)?.app_props.lock().unwrap_or_else(|e| e.into_inner()) = Some(list);
    Ok(o)
}

/// Answers a `CL_*_PROPERTIES` query from the list the object was made
/// with, if known; None: ask the proxy.
fn props_info(o: *mut c_void, size: usize, value: *mut c_void, ret: *mut usize) -> Option<cl_int> {
    let list = obj(o)
        .ok()?
        .app_props
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()?;
    Some(guard(|| {
        write_info(crate::entry::bytes_of_slice(&list), size, value, ret)
    }))
}

/// Checks the wait list of an enqueue on queue `qo` and makes the output
/// event, if the caller wants one.
fn out_event(
    qo: &RObj,
    ev: *mut cl_event,
    n: cl_uint,
    list: *const cl_event,
) -> R<(Waits, Option<*mut c_void>)> {
    super::check::wait_list(qo, slice(list, n as usize))?;
    let s = &qo.session;
    let waits = ids(list, n);
    if ev.is_null() {
        return Ok((Waits { waits, event: 0 }, None));
    }
    let id = s.new_id();
    let p = RObj::create(s, id, 0);
    obj(p)?.set_context(qo.context());
    Ok((Waits { waits, event: id }, Some(p)))
}

fn give_event(ev: *mut cl_event, p: Option<*mut c_void>) {
    if let Some(p) = p {
        crate::entry::put(ev, p.cast());
    }
}

/// Undoes `out_event` when the call could not be sent.
fn drop_event(p: Option<*mut c_void>) {
    if let Some(p) = p {
        super::release(p);
    }
}

/// Posts an enqueue that creates an event.
fn post_enqueue(
    q: cl_command_queue,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
    payload: &[u8],
    flush: bool,
    make: impl FnOnce(Id, Waits) -> Call,
) -> cl_int {
    guard(|| {
        let qo = obj(q.cast())?;
        let s = &qo.session;
        let (w, e) = out_event(qo, ev, n, list)?;
        if let Some(p) = e {
            order_after(p, q, qo.ticket_now());
        }
        match s.post(&make(qo.id, w), payload, flush) {
            Ok(()) => {
                give_event(ev, e);
                Ok(())
            }
            Err(x) => {
                drop_event(e);
                Err(x)
            }
        }
    })
}

fn info(
    p: *mut c_void,
    kind: InfoKind,
    param: cl_uint,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    guard(|| {
        let o = obj(p)?;
        let (a, data) = o.session.call(
            &Call::GetInfo {
                kind,
                object: o.id,
                param,
            },
            &[],
            Dest::Keep,
        )?;
        match a {
            Answer::Info(CL_SUCCESS) => write_info(&data, size, value, size_ret),
            Answer::Info(e) => Err(e),
            _ => Err(CL_INVALID_OPERATION),
        }
    })
}

fn status_of(a: Answer) -> R<()> {
    match a {
        Answer::Status(CL_SUCCESS) => Ok(()),
        Answer::Status(e) => Err(e),
        _ => Err(CL_INVALID_OPERATION),
    }
}

/// Copies between application memory laid out with pitches and a tightly
/// packed region (`region[0]` in bytes).
///
/// # Safety
/// `host` must cover the region at `origin` with the given pitches.
unsafe fn rect_copy(
    host: *mut u8,
    origin: [usize; 3],
    region: [usize; 3],
    row: usize,
    slice: usize,
    packed: *mut u8,
    to_host: bool,
) {
    let row = if row == 0 { region[0] } else { row };
    let slice = if slice == 0 { row * region[1] } else { slice };
    let base = origin[2] * slice + origin[1] * row + origin[0];
    for z in 0..region[2] {
        for y in 0..region[1] {
            let h = base + z * slice + y * row;
            let p = (z * region[1] + y) * region[0];
            // SAFETY: both ranges lie inside their buffers (caller's contract).
            unsafe {
                if to_host {
                    std::ptr::copy_nonoverlapping(packed.add(p), host.add(h), region[0]);
                } else {
                    std::ptr::copy_nonoverlapping(host.add(h), packed.add(p), region[0]);
                }
            }
        }
    }
}

fn pack(
    host: *const c_void,
    origin: [usize; 3],
    region: [usize; 3],
    row: usize,
    slice: usize,
) -> Vec<u8> {
    let mut v = vec![0u8; region.iter().product()];
    // SAFETY: the application's region, as OpenCL requires it to be valid.
    unsafe {
        rect_copy(
            host as *mut u8,
            origin,
            region,
            row,
            slice,
            v.as_mut_ptr(),
            false,
        )
    };
    v
}

fn scatter(
    host: *mut c_void,
    origin: [usize; 3],
    region: [usize; 3],
    row: usize,
    slice: usize,
) -> Dest {
    let host = host as usize;
    Dest::Scatter(Box::new(move |data: &[u8]| {
        if data.len() == region.iter().product::<usize>() {
            // SAFETY: the application's region, valid until the read completes.
            unsafe {
                rect_copy(
                    host as *mut u8,
                    origin,
                    region,
                    row,
                    slice,
                    data.as_ptr().cast_mut(),
                    true,
                )
            };
        }
    }))
}

fn three(p: *const usize) -> [usize; 3] {
    if p.is_null() {
        [0; 3]
    } else {
        // SAFETY: OpenCL passes three values.
        unsafe { (p as *const [usize; 3]).read_unaligned() }
    }
}

fn u3(a: [usize; 3]) -> [u64; 3] {
    a.map(|x| x as u64)
}

/// A read: blocking ones wait for the data, the others return and let the
/// reader thread land it (the event and queue count it as pending).
fn read(
    q: cl_command_queue,
    blocking: cl_bool,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
    dest: Dest,
    make: impl FnOnce(Id, Waits) -> Call,
) -> cl_int {
    guard(|| {
        let qo = obj(q.cast())?;
        let s = &qo.session;
        let (w, e) = out_event(qo, ev, n, list)?;
        let call = make(qo.id, w);
        if blocking != 0 {
            let before = qo.ticket_now();
            let r = match s.call(&call, &[], dest) {
                Ok((Answer::Data(st), _)) => {
                    if let Some(p) = e {
                        order_after(p, q, before);
                    }
                    give_event(ev, e);
                    if st == CL_SUCCESS { Ok(()) } else { Err(st) }
                }
                Ok(_) => {
                    drop_event(e);
                    Err(CL_INVALID_OPERATION)
                }
                Err(x) => {
                    drop_event(e);
                    Err(x)
                }
            };
            // On an in-order queue the reads enqueued before this one are
            // done too: their data must be in place when this call returns.
            if r.is_ok() && !qo.out_of_order.load(Ordering::Relaxed) {
                s.wait_reads_before(qo, before)?;
            }
            r
        } else {
            let ticket = qo.issue_read();
            if let Some(p) = e {
                order_after(p, q, ticket);
            }
            match s.read_async(&call, dest, e.map(arc), arc(q.cast()), ticket) {
                Ok(()) => {
                    give_event(ev, e);
                    Ok(())
                }
                Err(x) => {
                    drop_event(e);
                    Err(x)
                }
            }
        }
    })
}

/// Records, for an event of an in-order queue, the reads that must land
/// before it counts as complete here.
fn order_after(event: *mut c_void, q: cl_command_queue, ticket: u64) {
    let (Ok(e), Ok(qo)) = (obj(event), obj(q.cast())) else {
        return;
    };
    if !qo.out_of_order.load(Ordering::Relaxed) {
        *e.after.lock().unwrap_or_else(|x| x.into_inner()) = Some((arc(q.cast()), ticket));
    }
}

// ---- platforms and devices ----

pub unsafe extern "C" fn rGetPlatformInfo(
    p: cl_platform_id,
    param: cl_platform_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    info(p.cast(), InfoKind::Platform, param, size, value, ret)
}

/// The root devices of a remote platform with their types, listed once.
fn root_devices(p: *mut c_void) -> R<&'static [(usize, cl_device_type)]> {
    let po: &'static RObj = obj(p)?;
    if let Some(d) = po.devices.get() {
        return Ok(d);
    }
    let s = &po.session;
    let list = |ids: Vec<Id>| -> R<u32> {
        let call = Call::GetDeviceIds {
            platform: po.id,
            device_type: CL_DEVICE_TYPE_ALL,
            ids,
        };
        match s.call(&call, &[], Dest::Keep)?.0 {
            Answer::Count {
                status: CL_SUCCESS,
                count,
            } => Ok(count),
            Answer::Count { status, .. } => Err(status),
            _ => Err(CL_INVALID_OPERATION),
        }
    };
    let n = list(Vec::new())?;
    let ids: Vec<Id> = (0..n).map(|_| s.new_id()).collect();
    let got = list(ids.clone())?;
    let mut devs = Vec::new();
    for &id in ids.iter().take(got as usize) {
        let d = RObj::create(s, id, 0);
        let mut ty: cl_device_type = 0;
        let rc = info(
            d,
            InfoKind::Device,
            CL_DEVICE_TYPE,
            size_of::<cl_device_type>(),
            (&raw mut ty).cast(),
            std::ptr::null_mut(),
        );
        if rc != CL_SUCCESS {
            return Err(rc);
        }
        devs.push((d as usize, ty));
    }
    // Another thread may have listed them meanwhile; either list is complete.
    Ok(po.devices.get_or_init(|| devs))
}

pub unsafe extern "C" fn rGetDeviceIDs(
    p: cl_platform_id,
    ty: cl_device_type,
    n: cl_uint,
    out: *mut cl_device_id,
    num: *mut cl_uint,
) -> cl_int {
    guard(|| {
        let all = root_devices(p.cast())?;
        // The specification's errors, in its order, before any lookup.
        let types = CL_DEVICE_TYPE_DEFAULT
            | CL_DEVICE_TYPE_CPU
            | CL_DEVICE_TYPE_GPU
            | CL_DEVICE_TYPE_ACCELERATOR
            | CL_DEVICE_TYPE_CUSTOM;
        if ty != CL_DEVICE_TYPE_ALL && (ty == 0 || ty & !types != 0) {
            return Err(CL_INVALID_DEVICE_TYPE);
        }
        if (n == 0 && !out.is_null()) || (out.is_null() && num.is_null()) {
            return Err(CL_INVALID_VALUE);
        }
        let pick: Vec<usize> = if ty == CL_DEVICE_TYPE_ALL {
            all.iter().map(|d| d.0).collect()
        } else if ty == CL_DEVICE_TYPE_DEFAULT {
            all.iter()
                .find(|d| d.1 & CL_DEVICE_TYPE_DEFAULT != 0)
                .or(all.first())
                .map(|d| d.0)
                .into_iter()
                .collect()
        } else {
            all.iter().filter(|d| d.1 & ty != 0).map(|d| d.0).collect()
        };
        if pick.is_empty() {
            return Err(CL_DEVICE_NOT_FOUND);
        }
        if !out.is_null() {
            for (i, &d) in pick.iter().take(n as usize).enumerate() {
                // SAFETY: the caller's array of `n` entries.
                unsafe { *out.add(i) = d as cl_device_id };
            }
        }
        crate::entry::put(num, pick.len() as cl_uint);
        Ok(())
    })
}

pub unsafe extern "C" fn rGetDeviceInfo(
    d: cl_device_id,
    param: cl_device_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    let rc = info(d.cast(), InfoKind::Device, param, size, value, ret);
    // SVM is not remoted (clSVMAlloc has no remote entry): the device
    // answers as one without SVM does, so that applications (and the CTS)
    // take the paths they take on such a device.
    if rc == CL_SUCCESS
        && param == CL_DEVICE_SVM_CAPABILITIES
        && !value.is_null()
        && size >= size_of::<cl_device_svm_capabilities>()
    {
        // SAFETY: the caller's value holds at least one bitfield, as checked.
        unsafe { (value as *mut cl_device_svm_capabilities).write_unaligned(0) };
    }
    rc
}

pub unsafe extern "C" fn rCreateSubDevices(
    d: cl_device_id,
    p: *const cl_device_partition_property,
    n: cl_uint,
    out: *mut cl_device_id,
    num: *mut cl_uint,
) -> cl_int {
    guard(|| {
        let s = sess(d.cast())?;
        let ids: Vec<Id> = if out.is_null() {
            Vec::new()
        } else {
            (0..n).map(|_| s.new_id()).collect()
        };
        let (a, _) = s.call(
            &Call::CreateSubDevices {
                device: id_of(d.cast()),
                props: props(p, &[]),
                ids: ids.clone(),
            },
            &[],
            Dest::Keep,
        )?;
        let count = match a {
            Answer::Count {
                status: CL_SUCCESS,
                count,
            } => count,
            Answer::Count { status, .. } => return Err(status),
            _ => return Err(CL_INVALID_OPERATION),
        };
        for (i, &id) in ids.iter().take(count as usize).enumerate() {
            // SAFETY: the caller's array of `n` entries.
            unsafe { *out.add(i) = RObj::create(s, id, 0).cast() };
        }
        crate::entry::put(num, count);
        Ok(())
    })
}

pub unsafe extern "C" fn rRetainDevice(d: cl_device_id) -> cl_int {
    super::retain(d.cast())
}
pub unsafe extern "C" fn rReleaseDevice(d: cl_device_id) -> cl_int {
    super::release(d.cast())
}

pub unsafe extern "C" fn rUnloadPlatformCompiler(_p: cl_platform_id) -> cl_int {
    CL_SUCCESS
}

// ---- contexts ----

type CtxNotify = Option<unsafe extern "C" fn(*const c_char, *const c_void, usize, *mut c_void)>;

pub unsafe extern "C" fn rCreateContext(
    p: *const cl_context_properties,
    n: cl_uint,
    devs: *const cl_device_id,
    _notify: CtxNotify,
    _ud: *mut c_void,
    err: *mut cl_int,
) -> cl_context {
    guard_obj(err, || {
        let first = *slice(devs, n as usize).first().ok_or(CL_INVALID_VALUE)?;
        let s = sess(first.cast())?;
        let id = s.new_id();
        let call = Call::CreateContext {
            id,
            props: props(p, &[CL_CONTEXT_PLATFORM as u64]),
            devices: ids(devs, n),
        };
        created(s, id, &call, &[])?;
        let c = RObj::create(s, id, 0);
        obj(c)?.set_devices(dev_list(devs, n));
        obj(c)?.set_context(id);
        Ok(c)
    })
    .cast()
}

/// A device list's object addresses.
fn dev_list(devs: *const cl_device_id, n: cl_uint) -> Vec<usize> {
    slice(devs, n as usize)
        .iter()
        .map(|&d| d as usize)
        .collect()
}

/// The devices a program is for: those named, else the context's.
fn program_devices(c: cl_context, devs: *const cl_device_id, n: cl_uint) -> Vec<usize> {
    if n > 0 && !devs.is_null() {
        dev_list(devs, n)
    } else {
        obj(c.cast()).map(|o| o.devices_of()).unwrap_or_default()
    }
}

pub unsafe extern "C" fn rGetContextInfo(
    c: cl_context,
    param: cl_context_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    info(c.cast(), InfoKind::Context, param, size, value, ret)
}

type Destructor = Option<unsafe extern "C" fn(*mut c_void, *mut c_void)>;

fn add_destructor(o: *mut c_void, f: Destructor, ud: *mut c_void) -> cl_int {
    guard(|| {
        let f = f.ok_or(CL_INVALID_VALUE)?;
        obj(o)?
            .destructors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((f as usize, ud as usize));
        Ok(())
    })
}

pub unsafe extern "C" fn rSetContextDestructorCallback(
    c: cl_context,
    f: Destructor,
    ud: *mut c_void,
) -> cl_int {
    add_destructor(c.cast(), f, ud)
}

pub unsafe extern "C" fn rSetMemObjectDestructorCallback(
    m: cl_mem,
    f: Destructor,
    ud: *mut c_void,
) -> cl_int {
    add_destructor(m.cast(), f, ud)
}

// ---- queues ----

fn create_queue(
    c: cl_context,
    d: cl_device_id,
    props: Vec<u64>,
    app: Vec<u64>,
    err: *mut cl_int,
) -> cl_command_queue {
    guard_obj(err, || {
        let s = sess(c.cast())?;
        let id = s.new_id();
        created(
            s,
            id,
            &Call::CreateQueue {
                id,
                context: id_of(c.cast()),
                device: id_of(d.cast()),
                props: props.clone(),
            },
            &[],
        )?;
        let q = RObj::create(s, id, 0);
        obj(q)?.set_context(id_of(c.cast()));
        obj(q)?.dev.store(id_of(d.cast()), Ordering::Relaxed);
        let ooo = props.chunks(2).any(|kv| {
            kv[0] == CL_QUEUE_PROPERTIES as u64
                && kv
                    .get(1)
                    .is_some_and(|v| v & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE != 0)
        });
        obj(q)?.out_of_order.store(ooo, Ordering::Relaxed);
        let default = props.chunks(2).any(|kv| {
            kv[0] == CL_QUEUE_PROPERTIES as u64
                && kv
                    .get(1)
                    .is_some_and(|v| v & CL_QUEUE_ON_DEVICE_DEFAULT != 0)
        });
        obj(q)?.device_default.store(default, Ordering::Relaxed);
        keep_props(q, app)
    })
    .cast()
}

pub unsafe extern "C" fn rCreateCommandQueue(
    c: cl_context,
    d: cl_device_id,
    p: cl_command_queue_properties,
    err: *mut cl_int,
) -> cl_command_queue {
    // "CL_INVALID_VALUE if values specified in properties are not valid"
    // (the proxy makes every queue with properties, where unknown bits may
    // mean something else).
    let known = CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE
        | CL_QUEUE_PROFILING_ENABLE
        | CL_QUEUE_ON_DEVICE
        | CL_QUEUE_ON_DEVICE_DEFAULT;
    if p & !known != 0 {
        crate::entry::put(err, CL_INVALID_VALUE);
        return std::ptr::null_mut();
    }
    let props = if p == 0 {
        Vec::new()
    } else {
        vec![CL_QUEUE_PROPERTIES as u64, p]
    };
    create_queue(c, d, props, Vec::new(), err)
}

pub unsafe extern "C" fn rCreateCommandQueueWithProperties(
    c: cl_context,
    d: cl_device_id,
    p: *const cl_queue_properties,
    err: *mut cl_int,
) -> cl_command_queue {
    create_queue(c, d, props(p, &[]), raw_props(p), err)
}

/// `clSetCommandQueueProperty`, carried out by crane-proxy's vendor (wire
/// 1.4; an older proxy: `CL_INVALID_OPERATION`, which the specification
/// allows for the deprecated call).
pub unsafe extern "C" fn rSetCommandQueueProperty(
    q: cl_command_queue,
    props: cl_command_queue_properties,
    enable: cl_bool,
    old_ret: *mut cl_command_queue_properties,
) -> cl_int {
    guard(|| {
        let o = obj(q.cast())?;
        if o.session.proxy_minor < crane_wire::MINOR_QUEUE_PROPERTY {
            return Err(CL_INVALID_OPERATION);
        }
        let (a, data) = o.session.call(
            &Call::SetQueueProperty {
                queue: o.id,
                properties: props,
                enable: enable != CL_FALSE,
            },
            &[],
            Dest::Keep,
        )?;
        let old = match a {
            Answer::Info(CL_SUCCESS) => data
                .as_slice()
                .try_into()
                .map(u64::from_le_bytes)
                .map_err(|_| CL_INVALID_OPERATION)?,
            Answer::Info(e) => return Err(e),
            _ => return Err(CL_INVALID_OPERATION),
        };
        let now = if enable != CL_FALSE {
            old | props
        } else {
            old & !props
        };
        o.out_of_order.store(
            now & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE != 0,
            Ordering::Relaxed,
        );
        if !old_ret.is_null() {
            // SAFETY: the application's out-parameter, one value.
            unsafe { *old_ret = old };
        }
        Ok(())
    })
}

pub unsafe extern "C" fn rGetCommandQueueInfo(
    q: cl_command_queue,
    param: cl_command_queue_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    if param == CL_QUEUE_PROPERTIES_ARRAY
        && let Some(rc) = props_info(q.cast(), size, value, ret)
    {
        return rc;
    }
    if param == CL_QUEUE_DEVICE_DEFAULT {
        // A handle, which the proxy does not answer: the default device
        // queue of the queue's context and device, made here, else NULL.
        return guard(|| {
            let qo = obj(q.cast())?;
            let dev = qo.dev.load(Ordering::Relaxed);
            let live: Vec<usize> = qo
                .session
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .copied()
                .collect();
            let found = live
                .into_iter()
                .find(|&p| {
                    obj(p as *mut c_void).is_ok_and(|o| {
                        o.device_default.load(Ordering::Relaxed)
                            && o.context() == qo.context()
                            && o.dev.load(Ordering::Relaxed) == dev
                    })
                })
                .unwrap_or(0);
            write_info(&found.to_ne_bytes(), size, value, ret)
        });
    }
    info(q.cast(), InfoKind::Queue, param, size, value, ret)
}

pub unsafe extern "C" fn rFlush(q: cl_command_queue) -> cl_int {
    guard(|| {
        let o = obj(q.cast())?;
        o.session.post(&Call::Flush { queue: o.id }, &[], true)
    })
}

/// Waits for the queue on the proxy, then for its reads to land here. A
/// posted call that failed since the last synchronisation is reported here.
pub unsafe extern "C" fn rFinish(q: cl_command_queue) -> cl_int {
    guard(|| {
        let o = obj(q.cast())?;
        let before = o.ticket_now();
        let (a, _) = o
            .session
            .call(&Call::Finish { queue: o.id }, &[], Dest::Keep)?;
        status_of(a)?;
        o.session.wait_reads_before(o, before)?;
        match o.session.take_failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    })
}

// ---- memory objects ----

fn create_buffer(
    c: cl_context,
    p: Vec<u64>,
    flags: cl_mem_flags,
    size: usize,
    host: *mut c_void,
    with_props: bool,
    app: Vec<u64>,
    err: *mut cl_int,
) -> cl_mem {
    guard_obj(err, || {
        let s = sess(c.cast())?;
        let id = s.new_id();
        // The proxy cannot use the application's memory: it gets a copy.
        let init = flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR) != 0;
        if init && host.is_null() {
            return Err(CL_INVALID_HOST_PTR);
        }
        let payload = if init {
            slice(host as *const u8, size)
        } else {
            &[]
        };
        // Contents larger than one frame are written after the creation.
        let large = payload.len() > s.limits.max_payload as usize;
        let call = Call::CreateBuffer {
            id,
            context: id_of(c.cast()),
            flags: flags & !(CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR),
            size: size as u64,
            props: if with_props { p } else { Vec::new() },
            init: init && !large,
        };
        created(s, id, &call, if large { &[] } else { payload })?;
        let m = RObj::create(s, id, 0);
        if large && let Err(e) = fill_large(s, c, id, flags, payload, None) {
            super::release(m);
            return Err(e);
        }
        keep_props(m, app)
    })
    .cast()
}

/// Gives a new buffer or image (`region`, in pixels) initial contents too
/// large for one frame: they are written in pieces on a queue of crane's own
/// and waited for, into the buffer itself where the host may write it, else
/// into a staging buffer copied on the device.
fn fill_large(
    s: &Arc<Session>,
    c: cl_context,
    mem: Id,
    flags: cl_mem_flags,
    data: &[u8],
    region: Option<[usize; 3]>,
) -> R<()> {
    let device = *obj(c.cast())?
        .devices_of()
        .first()
        .ok_or(CL_INVALID_CONTEXT)?;
    let context = id_of(c.cast());
    let queue = s.new_id();
    s.post(
        &Call::CreateQueue {
            id: queue,
            context,
            device: id_of(device as *mut c_void),
            props: Vec::new(),
        },
        &[],
        false,
    )?;
    let direct = region.is_none() && flags & (CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS) == 0;
    let target = if direct { mem } else { s.new_id() };
    if !direct {
        s.post(
            &Call::CreateBuffer {
                id: target,
                context,
                flags: CL_MEM_READ_WRITE,
                size: data.len() as u64,
                props: Vec::new(),
                init: false,
            },
            &[],
            false,
        )?;
    }
    for (o, len) in byte_pieces(data.len(), (s.limits.max_payload as usize).max(1)) {
        let call = Call::EnqueueWriteBuffer {
            queue,
            buffer: target,
            offset: o as u64,
            size: len as u64,
            sync: Waits::default(),
        };
        s.post(&call, &data[o..o + len], false)?;
    }
    if !direct {
        let copy = match region {
            Some(r) => Call::EnqueueCopyBufferToImage {
                queue,
                src: target,
                dst: mem,
                src_offset: 0,
                dst_origin: [0; 3],
                region: u3(r),
                sync: Waits::default(),
            },
            None => Call::EnqueueCopyBuffer {
                queue,
                src: target,
                dst: mem,
                src_offset: 0,
                dst_offset: 0,
                size: data.len() as u64,
                sync: Waits::default(),
            },
        };
        s.post(&copy, &[], false)?;
    }
    let done = s.call(&Call::Finish { queue }, &[], Dest::Keep);
    if !direct {
        s.post(&Call::Release { id: target }, &[], false)?;
    }
    s.post(&Call::Release { id: queue }, &[], false)?;
    status_of(done?.0)
}

pub unsafe extern "C" fn rCreateBuffer(
    c: cl_context,
    flags: cl_mem_flags,
    size: usize,
    host: *mut c_void,
    err: *mut cl_int,
) -> cl_mem {
    create_buffer(c, Vec::new(), flags, size, host, false, Vec::new(), err)
}

pub unsafe extern "C" fn rCreateBufferWithProperties(
    c: cl_context,
    p: *const cl_mem_properties,
    flags: cl_mem_flags,
    size: usize,
    host: *mut c_void,
    err: *mut cl_int,
) -> cl_mem {
    create_buffer(c, props(p, &[]), flags, size, host, true, raw_props(p), err)
}

pub unsafe extern "C" fn rCreateSubBuffer(
    b: cl_mem,
    flags: cl_mem_flags,
    ty: cl_buffer_create_type,
    info: *const c_void,
    err: *mut cl_int,
) -> cl_mem {
    guard_obj(err, || {
        if ty != CL_BUFFER_CREATE_TYPE_REGION || info.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: a region struct, as the create type says.
        let region = unsafe { *(info as *const cl_buffer_region) };
        let s = sess(b.cast())?;
        let id = s.new_id();
        created(
            s,
            id,
            &Call::CreateSubBuffer {
                id,
                parent: id_of(b.cast()),
                flags,
                origin: region.origin as u64,
                size: region.size as u64,
            },
            &[],
        )?;
        Ok(RObj::create(s, id, 0))
    })
    .cast()
}

fn create_image(
    c: cl_context,
    p: Vec<u64>,
    flags: cl_mem_flags,
    fmt: *const cl_image_format,
    desc: *const cl_image_desc,
    host: *mut c_void,
    app: Vec<u64>,
    err: *mut cl_int,
) -> cl_mem {
    guard_obj(err, || {
        if fmt.is_null() || desc.is_null() {
            return Err(CL_INVALID_IMAGE_DESCRIPTOR);
        }
        // SAFETY: checked non-null; the caller's structs.
        let (f, d) = unsafe { (*fmt, *desc) };
        let s = sess(c.cast())?;
        let px = crate::api::memory::pixel_size(&f);
        let buffer = d.buffer;
        let init = flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR) != 0;
        if init && host.is_null() {
            return Err(CL_INVALID_HOST_PTR);
        }
        let region = crate::api::memory::image_region(&d);
        let payload = if init {
            let row_bytes = region[0] * px;
            // A 1D array's elements are spaced by the slice pitch.
            let (row, slice) = if d.image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY {
                (d.image_slice_pitch, 0)
            } else {
                (d.image_row_pitch, d.image_slice_pitch)
            };
            pack(host, [0; 3], [row_bytes, region[1], region[2]], row, slice)
        } else {
            Vec::new()
        };
        let id = s.new_id();
        // Contents larger than one frame are written after the creation.
        let large = payload.len() > s.limits.max_payload as usize;
        let call = Call::CreateImage {
            id,
            context: id_of(c.cast()),
            flags: flags & !(CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR),
            format: ImageFormat {
                order: f.image_channel_order,
                data_type: f.image_channel_data_type,
            },
            desc: ImageDesc {
                image_type: d.image_type,
                width: d.image_width as u64,
                height: d.image_height as u64,
                depth: d.image_depth as u64,
                array_size: d.image_array_size as u64,
                row_pitch: if init { 0 } else { d.image_row_pitch as u64 },
                slice_pitch: if init { 0 } else { d.image_slice_pitch as u64 },
                num_mip_levels: d.num_mip_levels,
                num_samples: d.num_samples,
                buffer: id_of(buffer.cast()),
            },
            props: p,
            init: init && !large,
        };
        created(s, id, &call, if large { &[] } else { &payload })?;
        let m = RObj::create(s, id, px);
        if large && let Err(e) = fill_large(s, c, id, flags, &payload, Some(region)) {
            super::release(m);
            return Err(e);
        }
        keep_props(m, app)
    })
    .cast()
}

pub unsafe extern "C" fn rCreateImage(
    c: cl_context,
    flags: cl_mem_flags,
    fmt: *const cl_image_format,
    desc: *const cl_image_desc,
    host: *mut c_void,
    err: *mut cl_int,
) -> cl_mem {
    create_image(c, Vec::new(), flags, fmt, desc, host, Vec::new(), err)
}

pub unsafe extern "C" fn rCreateImageWithProperties(
    c: cl_context,
    p: *const cl_mem_properties,
    flags: cl_mem_flags,
    fmt: *const cl_image_format,
    desc: *const cl_image_desc,
    host: *mut c_void,
    err: *mut cl_int,
) -> cl_mem {
    create_image(c, props(p, &[]), flags, fmt, desc, host, raw_props(p), err)
}

pub unsafe extern "C" fn rRetainMemObject(m: cl_mem) -> cl_int {
    super::retain(m.cast())
}
pub unsafe extern "C" fn rReleaseMemObject(m: cl_mem) -> cl_int {
    super::release(m.cast())
}

pub unsafe extern "C" fn rGetSupportedImageFormats(
    c: cl_context,
    flags: cl_mem_flags,
    ty: cl_mem_object_type,
    n: cl_uint,
    out: *mut cl_image_format,
    num: *mut cl_uint,
) -> cl_int {
    guard(|| {
        let o = obj(c.cast())?;
        let (a, _) = o.session.call(
            &Call::GetSupportedImageFormats {
                context: o.id,
                flags,
                image_type: ty,
            },
            &[],
            Dest::Keep,
        )?;
        let formats = match a {
            Answer::Formats {
                status: CL_SUCCESS,
                formats,
            } => formats,
            Answer::Formats { status, .. } => return Err(status),
            _ => return Err(CL_INVALID_OPERATION),
        };
        if !out.is_null() {
            for (i, f) in formats.iter().take(n as usize).enumerate() {
                // SAFETY: the caller's array of `n` formats.
                unsafe {
                    *out.add(i) = cl_image_format {
                        image_channel_order: f.order,
                        image_channel_data_type: f.data_type,
                    }
                };
            }
        }
        crate::entry::put(num, formats.len() as cl_uint);
        Ok(())
    })
}

pub unsafe extern "C" fn rGetMemObjectInfo(
    m: cl_mem,
    param: cl_mem_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    if param == CL_MEM_PROPERTIES
        && let Some(rc) = props_info(m.cast(), size, value, ret)
    {
        return rc;
    }
    info(m.cast(), InfoKind::Mem, param, size, value, ret)
}

pub unsafe extern "C" fn rGetPipeInfo(
    m: cl_mem,
    param: cl_pipe_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    info(m.cast(), InfoKind::Pipe, param, size, value, ret)
}

pub unsafe extern "C" fn rGetImageInfo(
    m: cl_mem,
    param: cl_image_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    info(m.cast(), InfoKind::Image, param, size, value, ret)
}

// ---- samplers ----

fn create_sampler(c: cl_context, props: Vec<u64>, app: Vec<u64>, err: *mut cl_int) -> cl_sampler {
    guard_obj(err, || {
        let s = sess(c.cast())?;
        let id = s.new_id();
        created(
            s,
            id,
            &Call::CreateSampler {
                id,
                context: id_of(c.cast()),
                props,
            },
            &[],
        )?;
        keep_props(RObj::create(s, id, 0), app)
    })
    .cast()
}

pub unsafe extern "C" fn rCreateSampler(
    c: cl_context,
    norm: cl_bool,
    addr: cl_addressing_mode,
    filter: cl_filter_mode,
    err: *mut cl_int,
) -> cl_sampler {
    let p = vec![
        CL_SAMPLER_NORMALIZED_COORDS as u64,
        norm as u64,
        CL_SAMPLER_ADDRESSING_MODE as u64,
        addr as u64,
        CL_SAMPLER_FILTER_MODE as u64,
        filter as u64,
    ];
    create_sampler(c, p, Vec::new(), err)
}

pub unsafe extern "C" fn rCreateSamplerWithProperties(
    c: cl_context,
    p: *const cl_sampler_properties,
    err: *mut cl_int,
) -> cl_sampler {
    create_sampler(c, props(p, &[]), raw_props(p), err)
}

pub unsafe extern "C" fn rGetSamplerInfo(
    s: cl_sampler,
    param: cl_sampler_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    if param == CL_SAMPLER_PROPERTIES
        && let Some(rc) = props_info(s.cast(), size, value, ret)
    {
        return rc;
    }
    info(s.cast(), InfoKind::Sampler, param, size, value, ret)
}

// ---- programs ----

fn new_program(
    c: cl_context,
    devices: Vec<usize>,
    err: *mut cl_int,
    payload: &[u8],
    make: impl FnOnce(Id, Id) -> Call,
) -> cl_program {
    guard_obj(err, || {
        let s = sess(c.cast())?;
        let id = s.new_id();
        created(s, id, &make(id, id_of(c.cast())), payload)?;
        let p = RObj::create(s, id, 0);
        obj(p)?.set_devices(devices);
        obj(p)?.set_context(id_of(c.cast()));
        Ok(p)
    })
    .cast()
}

pub unsafe extern "C" fn rCreateProgramWithSource(
    c: cl_context,
    n: cl_uint,
    strings: *mut *const c_char,
    lengths: *const usize,
    err: *mut cl_int,
) -> cl_program {
    let mut source = String::new();
    let lens = slice(lengths, n as usize);
    for (i, &p) in slice(strings.cast_const(), n as usize).iter().enumerate() {
        if p.is_null() {
            continue;
        }
        let bytes: &[u8] = match lens.get(i) {
            Some(&l) if l > 0 => slice(p.cast::<u8>(), l),
            // SAFETY: without a length the string is NUL-terminated.
            _ => unsafe { CStr::from_ptr(p) }.to_bytes(),
        };
        source.push_str(&String::from_utf8_lossy(bytes));
    }
    let devices = program_devices(c, std::ptr::null(), 0);
    let text = source.clone();
    let p = new_program(c, devices, err, &[], |id, context| {
        Call::CreateProgramWithSource {
            id,
            context,
            source,
        }
    });
    if let Ok(o) = obj(p.cast()) {
        *o.text.lock().unwrap_or_else(|e| e.into_inner()) = Some((text.clone(), text));
    }
    p
}

/// The options to build `o` with on crane-proxy: before a build or compile,
/// the program's includes are resolved here and its source on the proxy
/// replaced if that changed it (`includes`); `-I` is left out.
fn prepare_build(o: &RObj, options: &str, embedded: &[(String, String)]) -> Result<String, cl_int> {
    if o.session.proxy_minor < crane_wire::MINOR_CLIENT_INCLUDES {
        return Ok(options.to_owned());
    }
    let mut text = o.text.lock().unwrap_or_else(|e| e.into_inner());
    let Some((original, sent)) = text.as_mut() else {
        return Ok(crane_wire::source::take_include_dirs(options).1);
    };
    let p = super::includes::prepare(original, options, embedded);
    // Sent again before every build of a program with includes: the proxy
    // keeps the source of a program that has kernels (the build then fails
    // as natively), so what it holds may not be what was last sent.
    let with_includes = !crane_wire::source::include_directives(original).is_empty();
    if p.source != *sent || with_includes {
        o.session.post(
            &Call::SetProgramSource {
                program: o.id,
                source: p.source.clone(),
            },
            &[],
            false,
        )?;
        *sent = p.source;
    }
    Ok(p.options)
}

pub unsafe extern "C" fn rCreateProgramWithIL(
    c: cl_context,
    il: *const c_void,
    len: usize,
    err: *mut cl_int,
) -> cl_program {
    let devices = program_devices(c, std::ptr::null(), 0);
    new_program(
        c,
        devices,
        err,
        slice(il as *const u8, len),
        |id, context| Call::CreateProgramWithIl { id, context },
    )
}

pub unsafe extern "C" fn rCreateProgramWithBuiltInKernels(
    c: cl_context,
    n: cl_uint,
    devs: *const cl_device_id,
    names: *const c_char,
    err: *mut cl_int,
) -> cl_program {
    let names = if names.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string.
        unsafe { CStr::from_ptr(names) }
            .to_string_lossy()
            .into_owned()
    };
    let devices = ids(devs, n);
    let list = program_devices(c, devs, n);
    new_program(c, list, err, &[], |id, context| {
        Call::CreateProgramWithBuiltInKernels {
            id,
            context,
            devices,
            names,
        }
    })
}

pub unsafe extern "C" fn rCreateProgramWithBinary(
    c: cl_context,
    n: cl_uint,
    devs: *const cl_device_id,
    lengths: *const usize,
    bins: *mut *const u8,
    status: *mut cl_int,
    err: *mut cl_int,
) -> cl_program {
    guard_obj(err, || {
        let s = sess(c.cast())?;
        let lens = slice(lengths, n as usize);
        let ptrs = slice(bins.cast_const(), n as usize);
        if lens.len() != n as usize || ptrs.len() != n as usize {
            return Err(CL_INVALID_VALUE);
        }
        let mut payload = Vec::new();
        for (&p, &l) in ptrs.iter().zip(lens) {
            payload.extend_from_slice(slice(p, l));
        }
        let id = s.new_id();
        let call = Call::CreateProgramWithBinary {
            id,
            context: id_of(c.cast()),
            devices: ids(devs, n),
            sizes: lens.iter().map(|&l| l as u64).collect(),
        };
        let (a, _) = s.call(&call, &payload, Dest::Keep)?;
        let p = RObj::create(s, id, 0);
        obj(p)?.set_devices(program_devices(c, devs, n));
        obj(p)?.set_context(id_of(c.cast()));
        match a {
            Answer::Binary {
                status: st,
                per_binary,
            } => {
                if !status.is_null() {
                    for (i, &b) in per_binary.iter().take(n as usize).enumerate() {
                        // SAFETY: the caller's array of `n` statuses.
                        unsafe { *status.add(i) = b };
                    }
                }
                if st == CL_SUCCESS {
                    Ok(p)
                } else {
                    super::release(p);
                    Err(st)
                }
            }
            _ => {
                super::release(p);
                Err(CL_INVALID_OPERATION)
            }
        }
    })
    .cast()
}

type BuildNotify = Option<unsafe extern "C" fn(cl_program, *mut c_void)>;

fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Builds run to completion on the proxy; the callback then runs here, as if
/// the vendor had finished at once.
fn notify(prog: *mut c_void, f: BuildNotify, ud: *mut c_void) {
    if let Some(f) = f {
        // SAFETY: the application's (or crane's) build callback.
        unsafe { f(prog.cast(), ud) };
    }
}

pub unsafe extern "C" fn rBuildProgram(
    p: cl_program,
    n: cl_uint,
    devs: *const cl_device_id,
    opts: *const c_char,
    f: BuildNotify,
    ud: *mut c_void,
) -> cl_int {
    let rc = guard(|| {
        let o = obj(p.cast())?;
        let options = prepare_build(o, &c_string(opts), &[])?;
        let (a, _) = o.session.call(
            &Call::BuildProgram {
                program: o.id,
                devices: ids(devs, n),
                options,
            },
            &[],
            Dest::Keep,
        )?;
        status_of(a)
    });
    if rc == CL_SUCCESS || rc == CL_BUILD_PROGRAM_FAILURE {
        notify(p.cast(), f, ud);
    }
    rc
}

pub unsafe extern "C" fn rCompileProgram(
    p: cl_program,
    n: cl_uint,
    devs: *const cl_device_id,
    opts: *const c_char,
    nh: cl_uint,
    headers: *const cl_program,
    names: *mut *const c_char,
    f: BuildNotify,
    ud: *mut c_void,
) -> cl_int {
    let rc = guard(|| {
        let o = obj(p.cast())?;
        let hs = slice(headers, nh as usize);
        let ns = slice(names.cast_const(), nh as usize);
        let headers: Vec<(Id, String)> = hs
            .iter()
            .zip(ns)
            .map(|(&h, &nm)| (id_of(h.cast()), c_string(nm)))
            .collect();
        let embedded: Vec<(String, String)> = hs
            .iter()
            .zip(ns)
            .filter_map(|(&h, &nm)| {
                let text = obj(h.cast()).ok()?.text.lock().ok()?.clone()?;
                Some((c_string(nm), text.0))
            })
            .collect();
        let options = prepare_build(o, &c_string(opts), &embedded)?;
        let (a, _) = o.session.call(
            &Call::CompileProgram {
                program: o.id,
                devices: ids(devs, n),
                options,
                headers,
            },
            &[],
            Dest::Keep,
        )?;
        status_of(a)
    });
    if rc == CL_SUCCESS || rc == CL_COMPILE_PROGRAM_FAILURE {
        notify(p.cast(), f, ud);
    }
    rc
}

pub unsafe extern "C" fn rLinkProgram(
    c: cl_context,
    n: cl_uint,
    devs: *const cl_device_id,
    opts: *const c_char,
    ni: cl_uint,
    inputs: *const cl_program,
    f: BuildNotify,
    ud: *mut c_void,
    err: *mut cl_int,
) -> cl_program {
    let mut failed = false;
    let p = guard_obj(err, || {
        let s = sess(c.cast())?;
        let id = s.new_id();
        let call = Call::LinkProgram {
            id,
            context: id_of(c.cast()),
            devices: ids(devs, n),
            options: c_string(opts),
            inputs: ids(inputs, ni),
        };
        let (a, _) = s.call(&call, &[], Dest::Keep)?;
        let p = RObj::create(s, id, 0);
        obj(p)?.set_devices(program_devices(c, devs, n));
        obj(p)?.set_context(id_of(c.cast()));
        match a {
            Answer::Status(CL_SUCCESS) => Ok(p),
            // A failed link still gives a program, for its build log.
            Answer::Status(CL_LINK_PROGRAM_FAILURE) => {
                failed = true;
                Ok(p)
            }
            Answer::Status(e) => {
                super::release(p);
                Err(e)
            }
            _ => {
                super::release(p);
                Err(CL_INVALID_OPERATION)
            }
        }
    });
    if failed {
        crate::entry::put(err, CL_LINK_PROGRAM_FAILURE);
    }
    if !p.is_null() {
        notify(p, f, ud);
    }
    p.cast()
}

pub unsafe extern "C" fn rSetProgramSpecializationConstant(
    p: cl_program,
    spec: cl_uint,
    size: usize,
    value: *const c_void,
) -> cl_int {
    guard(|| {
        let o = obj(p.cast())?;
        let call = Call::SetSpecializationConstant {
            program: o.id,
            spec_id: spec,
            value: slice(value as *const u8, size).to_vec(),
        };
        o.session.post(&call, &[], false)
    })
}

pub unsafe extern "C" fn rRetainProgram(p: cl_program) -> cl_int {
    super::retain(p.cast())
}
pub unsafe extern "C" fn rReleaseProgram(p: cl_program) -> cl_int {
    super::release(p.cast())
}

pub unsafe extern "C" fn rGetProgramInfo(
    p: cl_program,
    param: cl_program_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    if param == CL_PROGRAM_DEVICES {
        // The proxy does not answer handles: the program's devices are known
        // here.
        return guard(|| {
            let d = obj(p.cast())?.devices_of();
            write_info(crate::entry::bytes_of_slice(&d), size, value, ret)
        });
    }
    if param != CL_PROGRAM_BINARIES {
        return info(p.cast(), InfoKind::Program, param, size, value, ret);
    }
    // The value is an array of pointers to the application's buffers.
    guard(|| {
        let o = obj(p.cast())?;
        let (a, data) =
            o.session
                .call(&Call::GetProgramBinaries { program: o.id }, &[], Dest::Keep)?;
        let sizes = match a {
            Answer::Binaries {
                status: CL_SUCCESS,
                sizes,
            } => sizes,
            Answer::Binaries { status, .. } => return Err(status),
            _ => return Err(CL_INVALID_OPERATION),
        };
        let need = sizes.len() * size_of::<*mut u8>();
        if !value.is_null() {
            if size < need {
                return Err(CL_INVALID_VALUE);
            }
            let dsts = slice(value as *const *mut u8, sizes.len());
            let mut at = 0usize;
            for (&d, &n) in dsts.iter().zip(&sizes) {
                let n = n as usize;
                let src = data.get(at..at + n).ok_or(CL_INVALID_OPERATION)?;
                if !d.is_null() {
                    // SAFETY: the application sized each buffer from
                    // CL_PROGRAM_BINARY_SIZES.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), d, n) };
                }
                at += n;
            }
        }
        crate::entry::put(ret, need);
        Ok(())
    })
}

pub unsafe extern "C" fn rGetProgramBuildInfo(
    p: cl_program,
    d: cl_device_id,
    param: cl_program_build_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    info(
        p.cast(),
        InfoKind::ProgramBuild {
            device: id_of(d.cast()),
        },
        param,
        size,
        value,
        ret,
    )
}

// ---- kernels ----

pub unsafe extern "C" fn rCreateKernel(
    p: cl_program,
    name: *const c_char,
    err: *mut cl_int,
) -> cl_kernel {
    guard_obj(err, || {
        let s = sess(p.cast())?;
        let id = s.new_id();
        let call = Call::CreateKernel {
            id,
            program: id_of(p.cast()),
            name: c_string(name),
        };
        let devices = obj(p.cast())?.devices_of();
        // The application's creation: its error is returned at once, and the
        // kernel's description comes in the same round trip.
        let meta = if crate::gate::is_open() && s.proxy_minor >= crane_wire::MINOR_DESCRIBE_KERNEL {
            let ids = devices.iter().map(|&d| id_of(d as *mut c_void)).collect();
            Some(super::check::create_kernel(s, id, &call, ids)?)
        } else {
            created(s, id, &call, &[])?;
            None
        };
        let k = RObj::create(s, id, 0);
        let o = obj(k)?;
        o.set_devices(devices);
        o.set_context(obj(p.cast())?.context());
        if let Some(m) = meta {
            let _ = o.kmeta.set(m);
        }
        Ok(k)
    })
    .cast()
}

pub unsafe extern "C" fn rCreateKernelsInProgram(
    p: cl_program,
    n: cl_uint,
    out: *mut cl_kernel,
    num: *mut cl_uint,
) -> cl_int {
    guard(|| {
        let s = sess(p.cast())?;
        let ids: Vec<Id> = if out.is_null() {
            Vec::new()
        } else {
            (0..n).map(|_| s.new_id()).collect()
        };
        let (a, _) = s.call(
            &Call::CreateKernelsInProgram {
                program: id_of(p.cast()),
                ids: ids.clone(),
            },
            &[],
            Dest::Keep,
        )?;
        let count = match a {
            Answer::Count {
                status: CL_SUCCESS,
                count,
            } => count,
            Answer::Count { status, .. } => return Err(status),
            _ => return Err(CL_INVALID_OPERATION),
        };
        let po = obj(p.cast())?;
        for (i, &id) in ids.iter().take(count as usize).enumerate() {
            let k = RObj::create(s, id, 0);
            obj(k)?.set_devices(po.devices_of());
            obj(k)?.set_context(po.context());
            // SAFETY: the caller's array of `n` kernels.
            unsafe { *out.add(i) = k.cast() };
        }
        crate::entry::put(num, count);
        Ok(())
    })
}

pub unsafe extern "C" fn rCloneKernel(k: cl_kernel, err: *mut cl_int) -> cl_kernel {
    guard_obj(err, || {
        let s = sess(k.cast())?;
        let id = s.new_id();
        created(
            s,
            id,
            &Call::CloneKernel {
                id,
                source: id_of(k.cast()),
            },
            &[],
        )?;
        // The clone has the source's arguments, set or not.
        let src = obj(k.cast())?;
        let c = RObj::create(s, id, 0);
        let o = obj(c)?;
        o.set_devices(src.devices_of());
        o.set_context(src.context());
        if let Some(m) = src.kmeta.get() {
            let _ = o.kmeta.set(m.clone());
        }
        *o.set_args.lock().unwrap_or_else(|e| e.into_inner()) = src
            .set_args
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        *o.args.lock().unwrap_or_else(|e| e.into_inner()) =
            src.args.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok(c)
    })
    .cast()
}

pub unsafe extern "C" fn rSetKernelArg(
    k: cl_kernel,
    index: cl_uint,
    size: usize,
    value: *const c_void,
) -> cl_int {
    guard(|| {
        let o = obj(k.cast())?;
        // The vendor's errors, found here rather than with the next clFinish.
        let meta = super::check::kernel_meta(o, crate::gate::is_open());
        if let Some(m) = &meta {
            super::check::set_arg(m, index as usize, size, value.is_null())?;
        }
        let arg = if value.is_null() {
            KernelArg::Local(size as u64)
        } else {
            let bytes = slice(value as *const u8, size);
            let as_obj = (size == size_of::<usize>())
                .then(|| {
                    // SAFETY: `value` holds a pointer-sized value, not
                    // necessarily aligned (crane replays recorded bytes).
                    let p = unsafe { (value as *const usize).read_unaligned() };
                    o.session
                        .live
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains(&p)
                        .then_some(p)
                })
                .flatten();
            // An image argument takes an image: not a buffer, nor anything
            // that is not a memory object ("CL_INVALID_MEM_OBJECT for an
            // argument declared to be a memory object when the specified
            // arg_value is not a valid memory object"; only images have a
            // pixel size here).
            if meta.as_ref().is_some_and(|m| {
                m.class.get(index as usize) == Some(&super::check::ArgClass::Image)
            }) && !as_obj.is_some_and(|p| obj(p as *mut c_void).is_ok_and(|m| m.px != 0))
            {
                return Err(CL_INVALID_MEM_OBJECT);
            }
            match as_obj {
                Some(p) => KernelArg::Object(id_of(p as *mut c_void)),
                None => KernelArg::Bytes(bytes.to_vec()),
            }
        };
        // An argument set again to the value it has (a frame loop setting
        // every argument before each launch) is not sent: the proxy's kernel
        // holds it already. Unless a posted call failed since it was sent:
        // it may have been that one, and then the proxy's kernel does not
        // hold it, and the vendor's error must come again.
        let failures = o.session.failures();
        let mut args = o.args.lock().unwrap_or_else(|e| e.into_inner());
        let i = index as usize;
        if args
            .get(i)
            .and_then(Option::as_ref)
            .is_some_and(|(sent, at)| *at == failures && *sent == arg)
        {
            return Ok(());
        }
        mark_set(o, i);
        o.session.post(
            &Call::SetKernelArg {
                kernel: o.id,
                index,
                arg: arg.clone(),
            },
            &[],
            false,
        )?;
        if i < MAX_REMEMBERED_ARGS {
            if args.len() <= i {
                args.resize(i + 1, None);
            }
            args[i] = Some((arg, failures));
        }
        Ok(())
    })
}

/// Notes that argument `i` of a kernel has been set (launches check that all
/// are).
fn mark_set(k: &RObj, i: usize) {
    let mut set = k.set_args.lock().unwrap_or_else(|e| e.into_inner());
    if set.len() <= i {
        if i >= 1 << 16 {
            return;
        }
        set.resize(i + 1, false);
    }
    set[i] = true;
}

/// Arguments beyond this index are always sent (the vector of remembered
/// values is indexed by what the application passes).
const MAX_REMEMBERED_ARGS: usize = 64;

pub unsafe extern "C" fn rRetainKernel(k: cl_kernel) -> cl_int {
    super::retain(k.cast())
}
pub unsafe extern "C" fn rReleaseKernel(k: cl_kernel) -> cl_int {
    super::release(k.cast())
}

pub unsafe extern "C" fn rGetKernelInfo(
    k: cl_kernel,
    param: cl_kernel_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    if param == CL_KERNEL_NUM_ARGS
        && let Some(m) = obj(k.cast())
            .ok()
            .and_then(|o| super::check::kernel_meta(o, true))
    {
        let n = m.args.len() as cl_uint;
        return guard(|| write_info(&n.to_ne_bytes(), size, value, ret));
    }
    info(k.cast(), InfoKind::Kernel, param, size, value, ret)
}

pub unsafe extern "C" fn rGetKernelArgInfo(
    k: cl_kernel,
    index: cl_uint,
    param: cl_kernel_arg_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    // What the interposer asks of every argument at creation is in the
    // kernel's description: no round trip each.
    if let Some(m) = obj(k.cast())
        .ok()
        .and_then(|o| super::check::kernel_meta(o, true))
        && let Some(a) = m.args.get(index as usize)
    {
        if a.status == CL_KERNEL_ARG_INFO_NOT_AVAILABLE {
            return a.status;
        }
        if a.status == CL_SUCCESS {
            let name;
            let bytes: Option<&[u8]> = match param {
                CL_KERNEL_ARG_ADDRESS_QUALIFIER => Some(&a.address.to_ne_bytes()),
                CL_KERNEL_ARG_ACCESS_QUALIFIER => Some(&a.access.to_ne_bytes()),
                CL_KERNEL_ARG_TYPE_QUALIFIER => Some(&a.type_qualifier.to_ne_bytes()),
                CL_KERNEL_ARG_TYPE_NAME => {
                    name = [a.type_name.as_bytes(), &[0]].concat();
                    Some(&name)
                }
                _ => None,
            };
            if let Some(b) = bytes {
                return guard(|| write_info(b, size, value, ret));
            }
        }
    }
    info(
        k.cast(),
        InfoKind::KernelArg { index },
        param,
        size,
        value,
        ret,
    )
}

pub unsafe extern "C" fn rGetKernelWorkGroupInfo(
    k: cl_kernel,
    d: cl_device_id,
    param: cl_kernel_work_group_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    info(
        k.cast(),
        InfoKind::KernelWorkGroup {
            device: id_of(d.cast()),
        },
        param,
        size,
        value,
        ret,
    )
}

pub unsafe extern "C" fn rGetKernelSubGroupInfo(
    k: cl_kernel,
    d: cl_device_id,
    param: cl_kernel_sub_group_info,
    in_size: usize,
    input: *const c_void,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    let input = slice(input as *const u8, in_size).to_vec();
    info(
        k.cast(),
        InfoKind::KernelSubGroup {
            device: id_of(d.cast()),
            input,
        },
        param,
        size,
        value,
        ret,
    )
}

// ---- events ----

pub unsafe extern "C" fn rCreateUserEvent(c: cl_context, err: *mut cl_int) -> cl_event {
    guard_obj(err, || {
        let s = sess(c.cast())?;
        let id = s.new_id();
        created(
            s,
            id,
            &Call::CreateUserEvent {
                id,
                context: id_of(c.cast()),
            },
            &[],
        )?;
        let e = RObj::create(s, id, 0);
        obj(e)?.set_context(id_of(c.cast()));
        Ok(e)
    })
    .cast()
}

pub unsafe extern "C" fn rSetUserEventStatus(e: cl_event, status: cl_int) -> cl_int {
    guard(|| {
        let o = obj(e.cast())?;
        // Sent at once: another thread may be waiting on this event.
        o.session.post(
            &Call::SetUserEventStatus {
                event: o.id,
                status,
            },
            &[],
            true,
        )
    })
}

pub unsafe extern "C" fn rWaitForEvents(n: cl_uint, list: *const cl_event) -> cl_int {
    guard(|| {
        let evs = slice(list, n as usize);
        let first = *evs.first().ok_or(CL_INVALID_VALUE)?;
        let s = sess(first.cast())?;
        let (a, _) = s.call(
            &Call::WaitForEvents {
                events: ids(list, n),
            },
            &[],
            Dest::Keep,
        )?;
        let r = status_of(a);
        for &e in evs {
            s.wait_event_landed(obj(e.cast())?)?;
        }
        r
    })
}

pub unsafe extern "C" fn rGetEventInfo(
    e: cl_event,
    param: cl_event_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    let rc = info(e.cast(), InfoKind::Event, param, size, value, ret);
    // A read is complete only once its data has landed here.
    if rc == CL_SUCCESS
        && param == CL_EVENT_COMMAND_EXECUTION_STATUS
        && !value.is_null()
        && size >= 4
        && obj(e.cast()).is_ok_and(|o| {
            o.pending.load(Ordering::Acquire) > 0
                || o.after
                    .lock()
                    .unwrap_or_else(|x| x.into_inner())
                    .as_ref()
                    .is_some_and(|(q, t)| q.reads_before(*t))
        })
    {
        // SAFETY: at least one cl_int, as checked.
        unsafe {
            let v = value as *mut cl_int;
            if *v == CL_COMPLETE {
                *v = CL_RUNNING;
            }
        }
    }
    rc
}

pub unsafe extern "C" fn rGetEventProfilingInfo(
    e: cl_event,
    param: cl_profiling_info,
    size: usize,
    value: *mut c_void,
    ret: *mut usize,
) -> cl_int {
    info(e.cast(), InfoKind::EventProfiling, param, size, value, ret)
}

type EventNotify = Option<unsafe extern "C" fn(cl_event, cl_int, *mut c_void)>;

pub unsafe extern "C" fn rSetEventCallback(
    e: cl_event,
    ty: cl_int,
    f: EventNotify,
    ud: *mut c_void,
) -> cl_int {
    guard(|| {
        let f = f.ok_or(CL_INVALID_VALUE)?;
        let ev = arc(e.cast());
        let s = ev.session.clone();
        let addr = e as usize;
        let ud = ud as usize;
        let cookie = s.register_callback(Box::new(move |status| {
            if status == CL_COMPLETE {
                let _ = ev.session.wait_event_landed(&ev);
            }
            // SAFETY: the callback with its user data and the event it was
            // registered on, which `ev` keeps alive.
            unsafe { f(addr as cl_event, status, ud as *mut c_void) };
            drop(ev);
        }));
        s.post(
            &Call::SetEventCallback {
                event: id_of(e.cast()),
                status: ty,
                cookie,
            },
            &[],
            true,
        )
    })
}

pub unsafe extern "C" fn rRetainEvent(e: cl_event) -> cl_int {
    super::retain(e.cast())
}
pub unsafe extern "C" fn rReleaseEvent(e: cl_event) -> cl_int {
    super::release(e.cast())
}

// ---- enqueued commands ----

pub unsafe extern "C" fn rEnqueueNDRangeKernel(
    q: cl_command_queue,
    k: cl_kernel,
    dims: cl_uint,
    off: *const usize,
    gws: *const usize,
    lws: *const usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    if dims == 0 || dims > 3 {
        return CL_INVALID_WORK_DIMENSION;
    }
    let take = |p: *const usize| -> Option<[u64; 3]> {
        if p.is_null() {
            return None;
        }
        let mut a = [1u64; 3];
        for (i, v) in slice(p, dims as usize).iter().enumerate() {
            a[i] = *v as u64;
        }
        Some(a)
    };
    let (offset, global, local) = (
        take(off).map(|mut o| {
            for v in o.iter_mut().skip(dims as usize) {
                *v = 0;
            }
            o
        }),
        // A NULL global size enqueues no work-items (OpenCL 2.1 on).
        take(gws).unwrap_or([0; 3]),
        take(lws),
    );
    // The vendor's errors, found here rather than with the next clFinish.
    if let (Ok(qo), Ok(ko)) = (obj(q.cast()), obj(k.cast()))
        && let Some(m) = super::check::kernel_meta(ko, crate::gate::is_open())
    {
        let set = ko.set_args.lock().unwrap_or_else(|e| e.into_inner());
        let launch = super::check::Launch {
            dims,
            global: (!gws.is_null()).then_some(global),
            local,
        };
        if let Err(e) = super::check::launch(&m, &set, qo, ko, &launch) {
            return e;
        }
    }
    let kernel = id_of(k.cast());
    post_enqueue(q, n, list, ev, &[], false, |queue, sync| {
        Call::EnqueueNdRange {
            queue,
            kernel,
            dims,
            offset,
            global,
            local,
            sync,
        }
    })
}

/// The most bytes one frame's payload may carry on this queue's session:
/// larger transfers go as several commands.
fn piece_limit(q: cl_command_queue) -> R<usize> {
    Ok((obj(q.cast())?.session.limits.max_payload as usize).max(1))
}

/// One command of a transfer split into pieces: what it sends (writes) and
/// the call, given the queue and the piece's wait list and event.
type MakeCall<'a> = Box<dyn FnOnce(Id, Waits) -> Call + 'a>;

/// Posts the pieces of one write. Every piece waits for the caller's wait
/// list; the caller's event is the last piece's, which on an out-of-order
/// queue also waits for the others (through events of their own, released
/// at once).
fn post_pieces(
    q: cl_command_queue,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
    flush: bool,
    pieces: Vec<(std::borrow::Cow<'_, [u8]>, MakeCall<'_>)>,
) -> cl_int {
    guard(|| {
        let qo = obj(q.cast())?;
        let s = &qo.session;
        let ooo = qo.out_of_order.load(Ordering::Relaxed);
        let (last, e) = out_event(qo, ev, n, list)?;
        if let Some(p) = e {
            order_after(p, q, qo.ticket_now());
        }
        let k = pieces.len();
        let mut own = Vec::new();
        for (i, (data, make)) in pieces.into_iter().enumerate() {
            let w = if i + 1 == k {
                let mut w = last.clone();
                w.waits.extend(&own);
                w
            } else {
                let event = if ooo { s.new_id() } else { 0 };
                if event != 0 {
                    own.push(event);
                }
                Waits {
                    waits: last.waits.clone(),
                    event,
                }
            };
            if let Err(x) = s.post(&make(qo.id, w), &data, flush && i + 1 == k) {
                drop_event(e);
                return Err(x);
            }
        }
        for id in own {
            s.post(&Call::Release { id }, &[], false)?;
        }
        give_event(ev, e);
        Ok(())
    })
}

/// Sends the pieces of one read. A blocking read sends them one after the
/// other; a non-blocking one sends them all, and its event counts as pending
/// until every piece has landed (the last piece makes it on the proxy).
fn read_pieces(
    q: cl_command_queue,
    blocking: cl_bool,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
    mut pieces: Vec<(Dest, MakeCall<'_>)>,
) -> cl_int {
    if pieces.len() == 1 {
        let (dest, make) = pieces.pop().expect("one piece");
        return read(q, blocking, n, list, ev, dest, make);
    }
    if blocking != 0 {
        let k = pieces.len();
        for (i, (dest, make)) in pieces.into_iter().enumerate() {
            let e = if i + 1 == k { ev } else { std::ptr::null_mut() };
            let rc = read(q, blocking, n, list, e, dest, make);
            if rc != CL_SUCCESS {
                return rc;
            }
        }
        return CL_SUCCESS;
    }
    guard(|| {
        let qo = obj(q.cast())?;
        let s = &qo.session;
        let (last, e) = out_event(qo, ev, n, list)?;
        if let Some(p) = e {
            order_after(p, q, qo.ticket_now());
        }
        let k = pieces.len();
        for (i, (dest, make)) in pieces.into_iter().enumerate() {
            let w = if i + 1 == k {
                last.clone()
            } else {
                Waits {
                    waits: last.waits.clone(),
                    event: 0,
                }
            };
            let ticket = qo.issue_read();
            if let Err(x) = s.read_async(&make(qo.id, w), dest, e.map(arc), arc(q.cast()), ticket) {
                drop_event(e);
                return Err(x);
            }
        }
        give_event(ev, e);
        Ok(())
    })
}

/// Ranges (offset, length) of at most `limit` bytes covering `size` bytes.
fn byte_pieces(size: usize, limit: usize) -> Vec<(usize, usize)> {
    if size <= limit {
        return vec![(0, size)];
    }
    (0..size)
        .step_by(limit)
        .map(|o| (o, limit.min(size - o)))
        .collect()
}

/// A part of a region: its offset and size.
type Piece = ([usize; 3], [usize; 3]);

/// Sub-regions (offset, region), in units of `unit` bytes along x, each at
/// most `limit` bytes, covering `region`: whole slices where they fit, else
/// rows, else parts of rows.
fn region_pieces(region: [usize; 3], unit: usize, limit: usize) -> Vec<Piece> {
    let row = region[0] * unit;
    let slice = row * region[1];
    let mut out = Vec::new();
    if slice * region[2] <= limit {
        out.push(([0; 3], region));
    } else if slice <= limit {
        let per = limit / slice.max(1);
        for z in (0..region[2]).step_by(per) {
            out.push(([0, 0, z], [region[0], region[1], per.min(region[2] - z)]));
        }
    } else if row <= limit {
        let per = limit / row.max(1);
        for z in 0..region[2] {
            for y in (0..region[1]).step_by(per) {
                out.push(([0, y, z], [region[0], per.min(region[1] - y), 1]));
            }
        }
    } else {
        let per = (limit / unit.max(1)).max(1);
        for z in 0..region[2] {
            for y in 0..region[1] {
                for x in (0..region[0]).step_by(per) {
                    out.push(([x, y, z], [per.min(region[0] - x), 1, 1]));
                }
            }
        }
    }
    out
}

/// Pitches with OpenCL's defaults (0: tightly packed) made explicit, so that
/// they keep their meaning for a part of the region.
fn pitches(region_bytes: [usize; 3], row: usize, slice: usize) -> (usize, usize) {
    let row = if row == 0 { region_bytes[0] } else { row };
    let slice = if slice == 0 {
        row * region_bytes[1]
    } else {
        slice
    };
    (row, slice)
}

fn add3(a: [usize; 3], b: [usize; 3]) -> [usize; 3] {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2]]
}

pub unsafe extern "C" fn rEnqueueWriteBuffer(
    q: cl_command_queue,
    b: cl_mem,
    blocking: cl_bool,
    off: usize,
    size: usize,
    ptr: *const c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let buffer = id_of(b.cast());
    let limit = match piece_limit(q) {
        Ok(l) => l,
        Err(e) => return e,
    };
    let data = slice(ptr as *const u8, size);
    let pieces = byte_pieces(size, limit)
        .into_iter()
        .map(|(o, len)| {
            let make: MakeCall = Box::new(move |queue, sync| Call::EnqueueWriteBuffer {
                queue,
                buffer,
                offset: (off + o) as u64,
                size: len as u64,
                sync,
            });
            (data.get(o..o + len).unwrap_or(&[]).into(), make)
        })
        .collect();
    post_pieces(q, n, list, ev, blocking != 0, pieces)
}

pub unsafe extern "C" fn rEnqueueReadBuffer(
    q: cl_command_queue,
    b: cl_mem,
    blocking: cl_bool,
    off: usize,
    size: usize,
    ptr: *mut c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let buffer = id_of(b.cast());
    let limit = match piece_limit(q) {
        Ok(l) => l,
        Err(e) => return e,
    };
    let pieces = byte_pieces(size, limit)
        .into_iter()
        .map(|(o, len)| {
            let make: MakeCall = Box::new(move |queue, sync| Call::EnqueueReadBuffer {
                queue,
                buffer,
                offset: (off + o) as u64,
                size: len as u64,
                sync,
            });
            (Dest::Memory(ptr.cast::<u8>().wrapping_add(o), len), make)
        })
        .collect();
    read_pieces(q, blocking, n, list, ev, pieces)
}

fn rect(origin: [usize; 3], region: [usize; 3], row: usize, slice: usize) -> Rect {
    Rect {
        origin: u3(origin),
        region: u3(region),
        row_pitch: row as u64,
        slice_pitch: slice as u64,
    }
}

pub unsafe extern "C" fn rEnqueueWriteBufferRect(
    q: cl_command_queue,
    b: cl_mem,
    blocking: cl_bool,
    bo: *const usize,
    ho: *const usize,
    reg: *const usize,
    brow: usize,
    bslice: usize,
    hrow: usize,
    hslice: usize,
    ptr: *const c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let (bo, ho, region) = (three(bo), three(ho), three(reg));
    let buffer = id_of(b.cast());
    let limit = match piece_limit(q) {
        Ok(l) => l,
        Err(e) => return e,
    };
    let parts = region_pieces(region, 1, limit);
    let ((brow, bslice), (hrow, hslice)) = if parts.len() > 1 {
        (pitches(region, brow, bslice), pitches(region, hrow, hslice))
    } else {
        ((brow, bslice), (hrow, hslice))
    };
    let pieces = parts
        .into_iter()
        .map(|(o, r)| {
            let data = pack(ptr, add3(ho, o), r, hrow, hslice);
            let make: MakeCall = Box::new(move |queue, sync| Call::EnqueueWriteBufferRect {
                queue,
                buffer,
                rect: rect(add3(bo, o), r, brow, bslice),
                sync,
            });
            (data.into(), make)
        })
        .collect();
    post_pieces(q, n, list, ev, blocking != 0, pieces)
}

pub unsafe extern "C" fn rEnqueueReadBufferRect(
    q: cl_command_queue,
    b: cl_mem,
    blocking: cl_bool,
    bo: *const usize,
    ho: *const usize,
    reg: *const usize,
    brow: usize,
    bslice: usize,
    hrow: usize,
    hslice: usize,
    ptr: *mut c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let (bo, ho, region) = (three(bo), three(ho), three(reg));
    let buffer = id_of(b.cast());
    let limit = match piece_limit(q) {
        Ok(l) => l,
        Err(e) => return e,
    };
    let parts = region_pieces(region, 1, limit);
    let ((brow, bslice), (hrow, hslice)) = if parts.len() > 1 {
        (pitches(region, brow, bslice), pitches(region, hrow, hslice))
    } else {
        ((brow, bslice), (hrow, hslice))
    };
    let pieces = parts
        .into_iter()
        .map(|(o, r)| {
            let make: MakeCall = Box::new(move |queue, sync| Call::EnqueueReadBufferRect {
                queue,
                buffer,
                rect: rect(add3(bo, o), r, brow, bslice),
                sync,
            });
            (scatter(ptr, add3(ho, o), r, hrow, hslice), make)
        })
        .collect();
    read_pieces(q, blocking, n, list, ev, pieces)
}

/// The image region in bytes per row, and the pixel size of the image.
fn image_bytes(img: cl_mem, region: [usize; 3]) -> R<[usize; 3]> {
    let px = obj(img.cast())?.px.max(1);
    Ok([region[0] * px, region[1], region[2]])
}

/// An image transfer's pieces: (pixel offset, pixel region, host origin in
/// bytes, host region in bytes), and the host pitches to use.
fn image_pieces(
    q: cl_command_queue,
    img: cl_mem,
    region: [usize; 3],
    row: usize,
    slc: usize,
) -> R<(Vec<Piece>, usize, usize, usize)> {
    let px = obj(img.cast())?.px.max(1);
    let parts = region_pieces(region, px, piece_limit(q)?);
    let (row, slc) = if parts.len() > 1 {
        pitches(image_bytes(img, region)?, row, slc)
    } else {
        (row, slc)
    };
    Ok((parts, px, row, slc))
}

pub unsafe extern "C" fn rEnqueueWriteImage(
    q: cl_command_queue,
    img: cl_mem,
    blocking: cl_bool,
    origin: *const usize,
    reg: *const usize,
    row: usize,
    slc: usize,
    ptr: *const c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let (o, region) = (three(origin), three(reg));
    let (parts, px, row, slc) = match image_pieces(q, img, region, row, slc) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let image = id_of(img.cast());
    let pieces = parts
        .into_iter()
        .map(|(at, r)| {
            let data = pack(
                ptr,
                [at[0] * px, at[1], at[2]],
                [r[0] * px, r[1], r[2]],
                row,
                slc,
            );
            let make: MakeCall = Box::new(move |queue, sync| Call::EnqueueWriteImage {
                queue,
                image,
                origin: u3(add3(o, at)),
                region: u3(r),
                sync,
            });
            (data.into(), make)
        })
        .collect();
    post_pieces(q, n, list, ev, blocking != 0, pieces)
}

pub unsafe extern "C" fn rEnqueueReadImage(
    q: cl_command_queue,
    img: cl_mem,
    blocking: cl_bool,
    origin: *const usize,
    reg: *const usize,
    row: usize,
    slc: usize,
    ptr: *mut c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let (o, region) = (three(origin), three(reg));
    let (parts, px, row, slc) = match image_pieces(q, img, region, row, slc) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let image = id_of(img.cast());
    let pieces = parts
        .into_iter()
        .map(|(at, r)| {
            let make: MakeCall = Box::new(move |queue, sync| Call::EnqueueReadImage {
                queue,
                image,
                origin: u3(add3(o, at)),
                region: u3(r),
                sync,
            });
            (
                scatter(
                    ptr,
                    [at[0] * px, at[1], at[2]],
                    [r[0] * px, r[1], r[2]],
                    row,
                    slc,
                ),
                make,
            )
        })
        .collect();
    read_pieces(q, blocking, n, list, ev, pieces)
}

pub unsafe extern "C" fn rEnqueueFillBuffer(
    q: cl_command_queue,
    b: cl_mem,
    pat: *const c_void,
    psize: usize,
    off: usize,
    size: usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let pattern = slice(pat as *const u8, psize).to_vec();
    let buffer = id_of(b.cast());
    post_enqueue(q, n, list, ev, &[], false, |queue, sync| {
        Call::EnqueueFillBuffer {
            queue,
            buffer,
            pattern,
            offset: off as u64,
            size: size as u64,
            sync,
        }
    })
}

pub unsafe extern "C" fn rEnqueueFillImage(
    q: cl_command_queue,
    img: cl_mem,
    color: *const c_void,
    origin: *const usize,
    reg: *const usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let mut c = [0u8; 16];
    c.copy_from_slice(slice(color as *const u8, 16));
    let (o, region) = (three(origin), three(reg));
    let image = id_of(img.cast());
    post_enqueue(q, n, list, ev, &[], false, |queue, sync| {
        Call::EnqueueFillImage {
            queue,
            image,
            color: c,
            origin: u3(o),
            region: u3(region),
            sync,
        }
    })
}

pub unsafe extern "C" fn rEnqueueCopyBuffer(
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    so: usize,
    d_o: usize,
    size: usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let (src, dst) = (id_of(src.cast()), id_of(dst.cast()));
    post_enqueue(q, n, list, ev, &[], false, |queue, sync| {
        Call::EnqueueCopyBuffer {
            queue,
            src,
            dst,
            src_offset: so as u64,
            dst_offset: d_o as u64,
            size: size as u64,
            sync,
        }
    })
}

pub unsafe extern "C" fn rEnqueueCopyBufferRect(
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    so: *const usize,
    d_o: *const usize,
    reg: *const usize,
    srow: usize,
    sslice: usize,
    drow: usize,
    dslice: usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let (src, dst) = (id_of(src.cast()), id_of(dst.cast()));
    let (so, d_o, region) = (three(so), three(d_o), three(reg));
    post_enqueue(q, n, list, ev, &[], false, |queue, sync| {
        Call::EnqueueCopyBufferRect {
            queue,
            src,
            dst,
            src_origin: u3(so),
            dst_origin: u3(d_o),
            region: u3(region),
            src_pitch: [srow as u64, sslice as u64],
            dst_pitch: [drow as u64, dslice as u64],
            sync,
        }
    })
}

pub unsafe extern "C" fn rEnqueueCopyImage(
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    so: *const usize,
    d_o: *const usize,
    reg: *const usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let (src, dst) = (id_of(src.cast()), id_of(dst.cast()));
    let (so, d_o, region) = (three(so), three(d_o), three(reg));
    post_enqueue(q, n, list, ev, &[], false, |queue, sync| {
        Call::EnqueueCopyImage {
            queue,
            src,
            dst,
            src_origin: u3(so),
            dst_origin: u3(d_o),
            region: u3(region),
            sync,
        }
    })
}

pub unsafe extern "C" fn rEnqueueCopyImageToBuffer(
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    so: *const usize,
    reg: *const usize,
    d_o: usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let (src, dst) = (id_of(src.cast()), id_of(dst.cast()));
    let (so, region) = (three(so), three(reg));
    post_enqueue(q, n, list, ev, &[], false, |queue, sync| {
        Call::EnqueueCopyImageToBuffer {
            queue,
            src,
            dst,
            src_origin: u3(so),
            region: u3(region),
            dst_offset: d_o as u64,
            sync,
        }
    })
}

pub unsafe extern "C" fn rEnqueueCopyBufferToImage(
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    so: usize,
    d_o: *const usize,
    reg: *const usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let (src, dst) = (id_of(src.cast()), id_of(dst.cast()));
    let (d_o, region) = (three(d_o), three(reg));
    post_enqueue(q, n, list, ev, &[], false, |queue, sync| {
        Call::EnqueueCopyBufferToImage {
            queue,
            src,
            dst,
            src_offset: so as u64,
            dst_origin: u3(d_o),
            region: u3(region),
            sync,
        }
    })
}

pub unsafe extern "C" fn rEnqueueMarkerWithWaitList(
    q: cl_command_queue,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    post_enqueue(q, n, list, ev, &[], false, |queue, sync| {
        Call::EnqueueMarker { queue, sync }
    })
}

pub unsafe extern "C" fn rEnqueueBarrierWithWaitList(
    q: cl_command_queue,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    post_enqueue(q, n, list, ev, &[], false, |queue, sync| {
        Call::EnqueueBarrier { queue, sync }
    })
}

pub unsafe extern "C" fn rEnqueueMigrateMemObjects(
    q: cl_command_queue,
    nm: cl_uint,
    mems: *const cl_mem,
    flags: cl_mem_migration_flags,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let mems = ids(mems, nm);
    post_enqueue(q, n, list, ev, &[], false, |queue, sync| {
        Call::EnqueueMigrate {
            queue,
            mems,
            flags,
            sync,
        }
    })
}

/// The table at the start of every remote object.
#[allow(deprecated)]
pub static DISPATCH: _cl_icd_dispatch = {
    // SAFETY: every field is an Option of a function pointer, for which all
    // zero bits is None.
    let mut d: _cl_icd_dispatch = unsafe { MaybeUninit::zeroed().assume_init() };
    d.clGetPlatformInfo = Some(rGetPlatformInfo);
    d.clGetDeviceIDs = Some(rGetDeviceIDs);
    d.clGetDeviceInfo = Some(rGetDeviceInfo);
    d.clCreateSubDevices = Some(rCreateSubDevices);
    d.clRetainDevice = Some(rRetainDevice);
    d.clReleaseDevice = Some(rReleaseDevice);
    d.clUnloadPlatformCompiler = Some(rUnloadPlatformCompiler);
    d.clCreateContext = Some(rCreateContext);
    d.clGetContextInfo = Some(rGetContextInfo);
    d.clRetainContext = Some(rRetainContext);
    d.clReleaseContext = Some(rReleaseContext);
    d.clSetContextDestructorCallback = Some(rSetContextDestructorCallback);
    d.clSetMemObjectDestructorCallback = Some(rSetMemObjectDestructorCallback);
    d.clCreateCommandQueue = Some(rCreateCommandQueue);
    d.clCreateCommandQueueWithProperties = Some(rCreateCommandQueueWithProperties);
    d.clGetCommandQueueInfo = Some(rGetCommandQueueInfo);
    #[allow(deprecated)]
    {
        d.clSetCommandQueueProperty = Some(rSetCommandQueueProperty);
    }
    d.clRetainCommandQueue = Some(rRetainCommandQueue);
    d.clReleaseCommandQueue = Some(rReleaseCommandQueue);
    d.clFlush = Some(rFlush);
    d.clFinish = Some(rFinish);
    d.clCreateBuffer = Some(rCreateBuffer);
    d.clCreateBufferWithProperties = Some(rCreateBufferWithProperties);
    d.clCreateSubBuffer = Some(rCreateSubBuffer);
    d.clCreateImage = Some(rCreateImage);
    d.clCreateImageWithProperties = Some(rCreateImageWithProperties);
    d.clRetainMemObject = Some(rRetainMemObject);
    d.clReleaseMemObject = Some(rReleaseMemObject);
    d.clGetSupportedImageFormats = Some(rGetSupportedImageFormats);
    d.clGetMemObjectInfo = Some(rGetMemObjectInfo);
    d.clGetImageInfo = Some(rGetImageInfo);
    d.clGetPipeInfo = Some(rGetPipeInfo);
    d.clCreateSampler = Some(rCreateSampler);
    d.clCreateSamplerWithProperties = Some(rCreateSamplerWithProperties);
    d.clRetainSampler = Some(rRetainSampler);
    d.clReleaseSampler = Some(rReleaseSampler);
    d.clGetSamplerInfo = Some(rGetSamplerInfo);
    d.clCreateProgramWithSource = Some(rCreateProgramWithSource);
    d.clCreateProgramWithIL = Some(rCreateProgramWithIL);
    d.clCreateProgramWithBinary = Some(rCreateProgramWithBinary);
    d.clCreateProgramWithBuiltInKernels = Some(rCreateProgramWithBuiltInKernels);
    d.clBuildProgram = Some(rBuildProgram);
    d.clCompileProgram = Some(rCompileProgram);
    d.clLinkProgram = Some(rLinkProgram);
    d.clSetProgramSpecializationConstant = Some(rSetProgramSpecializationConstant);
    d.clRetainProgram = Some(rRetainProgram);
    d.clReleaseProgram = Some(rReleaseProgram);
    d.clGetProgramInfo = Some(rGetProgramInfo);
    d.clGetProgramBuildInfo = Some(rGetProgramBuildInfo);
    d.clCreateKernel = Some(rCreateKernel);
    d.clCreateKernelsInProgram = Some(rCreateKernelsInProgram);
    d.clCloneKernel = Some(rCloneKernel);
    d.clSetKernelArg = Some(rSetKernelArg);
    d.clRetainKernel = Some(rRetainKernel);
    d.clReleaseKernel = Some(rReleaseKernel);
    d.clGetKernelInfo = Some(rGetKernelInfo);
    d.clGetKernelArgInfo = Some(rGetKernelArgInfo);
    d.clGetKernelWorkGroupInfo = Some(rGetKernelWorkGroupInfo);
    d.clGetKernelSubGroupInfo = Some(rGetKernelSubGroupInfo);
    d.clCreateUserEvent = Some(rCreateUserEvent);
    d.clSetUserEventStatus = Some(rSetUserEventStatus);
    d.clWaitForEvents = Some(rWaitForEvents);
    d.clGetEventInfo = Some(rGetEventInfo);
    d.clGetEventProfilingInfo = Some(rGetEventProfilingInfo);
    d.clSetEventCallback = Some(rSetEventCallback);
    d.clRetainEvent = Some(rRetainEvent);
    d.clReleaseEvent = Some(rReleaseEvent);
    d.clEnqueueNDRangeKernel = Some(rEnqueueNDRangeKernel);
    d.clEnqueueWriteBuffer = Some(rEnqueueWriteBuffer);
    d.clEnqueueReadBuffer = Some(rEnqueueReadBuffer);
    d.clEnqueueWriteBufferRect = Some(rEnqueueWriteBufferRect);
    d.clEnqueueReadBufferRect = Some(rEnqueueReadBufferRect);
    d.clEnqueueWriteImage = Some(rEnqueueWriteImage);
    d.clEnqueueReadImage = Some(rEnqueueReadImage);
    d.clEnqueueFillBuffer = Some(rEnqueueFillBuffer);
    d.clEnqueueFillImage = Some(rEnqueueFillImage);
    d.clEnqueueCopyBuffer = Some(rEnqueueCopyBuffer);
    d.clEnqueueCopyBufferRect = Some(rEnqueueCopyBufferRect);
    d.clEnqueueCopyImage = Some(rEnqueueCopyImage);
    d.clEnqueueCopyImageToBuffer = Some(rEnqueueCopyImageToBuffer);
    d.clEnqueueCopyBufferToImage = Some(rEnqueueCopyBufferToImage);
    d.clEnqueueMarkerWithWaitList = Some(rEnqueueMarkerWithWaitList);
    d.clEnqueueBarrierWithWaitList = Some(rEnqueueBarrierWithWaitList);
    d.clEnqueueMigrateMemObjects = Some(rEnqueueMigrateMemObjects);
    d
};

macro_rules! retain_release {
    ($($r:ident $l:ident $t:ty),*) => {$(
        pub unsafe extern "C" fn $r(o: $t) -> cl_int { super::retain(o.cast()) }
        pub unsafe extern "C" fn $l(o: $t) -> cl_int { super::release(o.cast()) }
    )*};
}
retain_release!(
    rRetainContext rReleaseContext cl_context,
    rRetainCommandQueue rReleaseCommandQueue cl_command_queue,
    rRetainSampler rReleaseSampler cl_sampler
);
