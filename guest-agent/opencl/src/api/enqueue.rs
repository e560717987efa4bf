//! Enqueued commands. Besides forwarding, these keep the RAM copy of buffers
//! up to date (host writes) and note which buffers the device may have changed
//! (kernels, copies, fills, write maps).

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use opencl_sys::*;

use super::event::{Waits, new_event, waits};
use super::*;
use crate::entry::{self, ClResult};
use crate::vendor::{check, vfn};

#[inline(always)]
pub(super) fn wl(w: &Waits) -> *const cl_event {
    if w.is_empty() {
        std::ptr::null()
    } else {
        w.as_ptr()
    }
}

/// The command queue of an enqueue. Every enqueue resolves it before any
/// other argument: the queue is the object the ICD loader dispatches on, so
/// a bad queue is reported before anything else, as natively.
#[inline(always)]
pub(super) fn queue_of<'a>(q: cl_command_queue) -> ClResult<&'a Queue> {
    queue_ref(q.cast())
}

/// The common shape of an enqueue on a resolved queue: translate the wait
/// list, call the vendor, and wrap the event the application asked for.
#[inline(always)]
pub(super) fn run(
    queue: &Queue,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
    cmd: cl_command_type,
    f: impl FnOnce(cl_command_queue, &Waits, *mut cl_event) -> ClResult<cl_int>,
) -> ClResult<()> {
    let vq = queue.base.vendor();
    let w = waits(n, list)?;
    let mut vev: cl_event = std::ptr::null_mut();
    check(f(
        vq.cast(),
        &w,
        if ev.is_null() {
            std::ptr::null_mut()
        } else {
            &mut vev
        },
    )?)?;
    if !ev.is_null() {
        wrap_event(queue, vev, cmd, ev)?;
    }
    Ok(())
}

#[cold]
fn wrap_event(
    queue: &Queue,
    vev: cl_event,
    cmd: cl_command_type,
    ev: *mut cl_event,
) -> ClResult<()> {
    let queue = arc_of::<Queue>(queue.base.handle(), CL_INVALID_COMMAND_QUEUE)?;
    let e = new_event(queue.context.clone(), Some(queue), vev.cast(), cmd);
    entry::put(ev, publish(e));
    Ok(())
}

fn vmem(m: cl_mem) -> ClResult<(&'static Mem, cl_mem)> {
    let mem = mem_ref(m.cast())?;
    let v = mem.base.vendor();
    if v.is_null() {
        return Err(CL_INVALID_MEM_OBJECT);
    }
    Ok((mem, v.cast()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueReadBuffer(
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
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (_, vb) = vmem(b)?;
        run(queue, n, list, ev, CL_COMMAND_READ_BUFFER, |vq, w, ve| {
            // SAFETY: forwarding the application's arguments with vendor objects.
            Ok(unsafe {
                vfn!(vq, clEnqueueReadBuffer)?(vq, vb, blocking, off, size, ptr, n, wl(w), ve)
            })
        })
    })
}

/// Keeps a host write in the buffer's RAM copy.
fn cache_write(mem: &Mem, off: usize, size: usize, ptr: *const c_void) {
    let root = mem.root();
    root.ever_written.store(true, Ordering::Relaxed);
    let cfg = crate::config::get();
    // Large writes are not copied (the copy would cost as much as the write
    // itself); the buffer is read back at suspend instead. So is a
    // CL_MEM_USE_HOST_PTR buffer: a vendor with a copy of its own (a discrete
    // GPU, or CRANE_HOST_MEMORY=emulate) wrote only that copy, and resume
    // rebuilds the buffer from the host memory.
    // During a pre-copy the RAM copy is being replaced by what the device
    // holds: a host write then counts as one to read again at the stop. On
    // crane-proxy the RAM copies are those of the last checkpoint, which a
    // replay starts from (`remote::journal`): they must not change either.
    if !cfg.write_cache
        || size > cfg.write_cache_max
        || root.flags & CL_MEM_USE_HOST_PTR != 0
        || root.is_image()
        || crate::lifecycle::PRECOPY.load(Ordering::Relaxed)
        || crate::remote::journal::FROZEN.load(Ordering::Relaxed)
    {
        root.dirty.store(true, Ordering::Relaxed);
        return;
    }
    let start = mem.root_offset() + off;
    let mut sh = root.shadow.lock().unwrap_or_else(|e| e.into_inner());
    if sh.data().is_none() {
        sh.replace(Some(crate::staging::HostBytes::zeroed(root.size)));
    }
    let data = sh.data_mut().expect("set above");
    if start + size > data.len() {
        return;
    }
    // SAFETY: the application's `size` bytes, already accepted by the vendor.
    data[start..start + size]
        .copy_from_slice(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), size) });
    if start == 0 && size == root.size {
        root.dirty.store(false, Ordering::Relaxed);
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueWriteBuffer(
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
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (mem, vb) = vmem(b)?;
        run(queue, n, list, ev, CL_COMMAND_WRITE_BUFFER, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe {
                vfn!(vq, clEnqueueWriteBuffer)?(vq, vb, blocking, off, size, ptr, n, wl(w), ve)
            })
        })?;
        cache_write(mem, off, size, ptr);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueReadBufferRect(
    q: cl_command_queue,
    b: cl_mem,
    blocking: cl_bool,
    buf_origin: *const usize,
    host_origin: *const usize,
    region: *const usize,
    buf_row: usize,
    buf_slice: usize,
    host_row: usize,
    host_slice: usize,
    ptr: *mut c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (_, vb) = vmem(b)?;
        run(
            queue,
            n,
            list,
            ev,
            CL_COMMAND_READ_BUFFER_RECT,
            |vq, w, ve| {
                // SAFETY: forwarding.
                Ok(unsafe {
                    vfn!(vq, clEnqueueReadBufferRect)?(
                        vq,
                        vb,
                        blocking,
                        buf_origin,
                        host_origin,
                        region,
                        buf_row,
                        buf_slice,
                        host_row,
                        host_slice,
                        ptr,
                        n,
                        wl(w),
                        ve,
                    )
                })
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueWriteBufferRect(
    q: cl_command_queue,
    b: cl_mem,
    blocking: cl_bool,
    buf_origin: *const usize,
    host_origin: *const usize,
    region: *const usize,
    buf_row: usize,
    buf_slice: usize,
    host_row: usize,
    host_slice: usize,
    ptr: *const c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (mem, vb) = vmem(b)?;
        run(
            queue,
            n,
            list,
            ev,
            CL_COMMAND_WRITE_BUFFER_RECT,
            |vq, w, ve| {
                // SAFETY: forwarding.
                Ok(unsafe {
                    vfn!(vq, clEnqueueWriteBufferRect)?(
                        vq,
                        vb,
                        blocking,
                        buf_origin,
                        host_origin,
                        region,
                        buf_row,
                        buf_slice,
                        host_row,
                        host_slice,
                        ptr,
                        n,
                        wl(w),
                        ve,
                    )
                })
            },
        )?;
        mem.mark_dirty();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueFillBuffer(
    q: cl_command_queue,
    b: cl_mem,
    pattern: *const c_void,
    psize: usize,
    off: usize,
    size: usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (mem, vb) = vmem(b)?;
        run(queue, n, list, ev, CL_COMMAND_FILL_BUFFER, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe {
                vfn!(vq, clEnqueueFillBuffer)?(vq, vb, pattern, psize, off, size, n, wl(w), ve)
            })
        })?;
        mem.mark_dirty();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueCopyBuffer(
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
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (_, vs) = vmem(src)?;
        let (dm, vd) = vmem(dst)?;
        run(queue, n, list, ev, CL_COMMAND_COPY_BUFFER, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe { vfn!(vq, clEnqueueCopyBuffer)?(vq, vs, vd, so, d_o, size, n, wl(w), ve) })
        })?;
        dm.mark_dirty();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueCopyBufferRect(
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    so: *const usize,
    d_o: *const usize,
    region: *const usize,
    s_row: usize,
    s_slice: usize,
    d_row: usize,
    d_slice: usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (_, vs) = vmem(src)?;
        let (dm, vd) = vmem(dst)?;
        run(
            queue,
            n,
            list,
            ev,
            CL_COMMAND_COPY_BUFFER_RECT,
            |vq, w, ve| {
                // SAFETY: forwarding.
                Ok(unsafe {
                    vfn!(vq, clEnqueueCopyBufferRect)?(
                        vq,
                        vs,
                        vd,
                        so,
                        d_o,
                        region,
                        s_row,
                        s_slice,
                        d_row,
                        d_slice,
                        n,
                        wl(w),
                        ve,
                    )
                })
            },
        )?;
        dm.mark_dirty();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueReadImage(
    q: cl_command_queue,
    img: cl_mem,
    blocking: cl_bool,
    origin: *const usize,
    region: *const usize,
    row: usize,
    slice: usize,
    ptr: *mut c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (_, vi) = vmem(img)?;
        run(queue, n, list, ev, CL_COMMAND_READ_IMAGE, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe {
                vfn!(vq, clEnqueueReadImage)?(
                    vq,
                    vi,
                    blocking,
                    origin,
                    region,
                    row,
                    slice,
                    ptr,
                    n,
                    wl(w),
                    ve,
                )
            })
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueWriteImage(
    q: cl_command_queue,
    img: cl_mem,
    blocking: cl_bool,
    origin: *const usize,
    region: *const usize,
    row: usize,
    slice: usize,
    ptr: *const c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (m, vi) = vmem(img)?;
        run(queue, n, list, ev, CL_COMMAND_WRITE_IMAGE, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe {
                vfn!(vq, clEnqueueWriteImage)?(
                    vq,
                    vi,
                    blocking,
                    origin,
                    region,
                    row,
                    slice,
                    ptr,
                    n,
                    wl(w),
                    ve,
                )
            })
        })?;
        m.mark_dirty();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueFillImage(
    q: cl_command_queue,
    img: cl_mem,
    color: *const c_void,
    origin: *const usize,
    region: *const usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (m, vi) = vmem(img)?;
        run(queue, n, list, ev, CL_COMMAND_FILL_IMAGE, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe {
                vfn!(vq, clEnqueueFillImage)?(vq, vi, color, origin, region, n, wl(w), ve)
            })
        })?;
        m.mark_dirty();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueCopyImage(
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    so: *const usize,
    d_o: *const usize,
    region: *const usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (_, vs) = vmem(src)?;
        let (dm, vd) = vmem(dst)?;
        run(queue, n, list, ev, CL_COMMAND_COPY_IMAGE, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe { vfn!(vq, clEnqueueCopyImage)?(vq, vs, vd, so, d_o, region, n, wl(w), ve) })
        })?;
        dm.mark_dirty();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueCopyImageToBuffer(
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    so: *const usize,
    region: *const usize,
    d_o: usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (_, vs) = vmem(src)?;
        let (dm, vd) = vmem(dst)?;
        run(
            queue,
            n,
            list,
            ev,
            CL_COMMAND_COPY_IMAGE_TO_BUFFER,
            |vq, w, ve| {
                // SAFETY: forwarding.
                Ok(unsafe {
                    vfn!(vq, clEnqueueCopyImageToBuffer)?(vq, vs, vd, so, region, d_o, n, wl(w), ve)
                })
            },
        )?;
        dm.mark_dirty();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueCopyBufferToImage(
    q: cl_command_queue,
    src: cl_mem,
    dst: cl_mem,
    so: usize,
    d_o: *const usize,
    region: *const usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (_, vs) = vmem(src)?;
        let (dm, vd) = vmem(dst)?;
        run(
            queue,
            n,
            list,
            ev,
            CL_COMMAND_COPY_BUFFER_TO_IMAGE,
            |vq, w, ve| {
                // SAFETY: forwarding.
                Ok(unsafe {
                    vfn!(vq, clEnqueueCopyBufferToImage)?(vq, vs, vd, so, d_o, region, n, wl(w), ve)
                })
            },
        )?;
        dm.mark_dirty();
        Ok(())
    })
}

/// Memory crane owns behind a mapping, so that the pointer the application
/// holds survives the vendor library being unloaded (see `staging`).
/// Memory for a map of `size` bytes of `mem` whose read or marker goes on
/// `queue` (see [`crate::staging::Pool::take`]).
fn map_storage(mem: &Mem, size: usize, queue: &Queue) -> ClResult<crate::staging::Staging> {
    let in_order = queue.current_properties() & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE == 0;
    mem.context
        .staging
        .take(&mem.context, size, in_order.then(|| queue.base.vendor()))
        .ok_or(CL_OUT_OF_HOST_MEMORY)
}

const HOST_ACCESS: cl_mem_flags =
    CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;

/// The host access flags in force for a memory object: a sub-buffer created
/// without any inherits its parent's.
fn host_access(mem: &Mem) -> cl_mem_flags {
    match &mem.kind {
        MemKind::SubBuffer { parent, .. } if mem.flags & HOST_ACCESS == 0 => host_access(parent),
        _ => mem.flags & HOST_ACCESS,
    }
}

/// The checks a map shares between buffers and images, which crane must make
/// itself because it serves maps from its own memory (a read or a marker
/// stands in for the vendor's map command, and neither checks all of these).
fn check_map(mem: &Mem, flags: cl_map_flags) -> ClResult<()> {
    // "CL_INVALID_OPERATION if buffer has been created with
    // CL_MEM_HOST_WRITE_ONLY or CL_MEM_HOST_NO_ACCESS and CL_MAP_READ is set
    // in map_flags".
    let host = host_access(mem);
    if flags & CL_MAP_READ != 0 && host & (CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_NO_ACCESS) != 0 {
        return Err(CL_INVALID_OPERATION);
    }
    // "CL_INVALID_OPERATION if buffer has been created with
    // CL_MEM_HOST_READ_ONLY or CL_MEM_HOST_NO_ACCESS and CL_MAP_WRITE or
    // CL_MAP_WRITE_INVALIDATE_REGION is set in map_flags".
    if flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0
        && host & (CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS) != 0
    {
        return Err(CL_INVALID_OPERATION);
    }
    Ok(())
}

/// "CL_INVALID_CONTEXT if the context associated with command_queue and
/// buffer are not the same".
fn same_context(queue: &Queue, mem: &Mem) -> ClResult<()> {
    if Arc::ptr_eq(&queue.context, &mem.context) {
        Ok(())
    } else {
        Err(CL_INVALID_CONTEXT)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueMapBuffer(
    q: cl_command_queue,
    b: cl_mem,
    blocking: cl_bool,
    flags: cl_map_flags,
    off: usize,
    size: usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
    errcode_ret: *mut cl_int,
) -> *mut c_void {
    entry::pointer(errcode_ret, || {
        let queue = queue_of(q)?;
        let (mem, vb) = vmem(b)?;
        // "CL_INVALID_VALUE if region being mapped given by (offset, size) is
        // out of bounds or if size is 0".
        if size == 0 {
            return Err(CL_INVALID_VALUE);
        }
        // "CL_INVALID_MEM_OBJECT if buffer is not a valid buffer object."
        if !matches!(mem.kind, MemKind::Buffer | MemKind::SubBuffer { .. }) {
            return Err(CL_INVALID_MEM_OBJECT);
        }
        same_context(queue, mem)?;
        // "CL_INVALID_EVENT_WAIT_LIST if event_wait_list is NULL and
        // num_events_in_wait_list > 0, or event_wait_list is not NULL and
        // num_events_in_wait_list is 0, or if event objects in event_wait_list
        // are not valid events."
        waits(n, list)?;
        if off.checked_add(size).is_none_or(|e| e > mem.size) {
            return Err(CL_INVALID_VALUE);
        }
        check_map(mem, flags)?;
        let storage_for = || -> ClResult<(*mut u8, Option<crate::staging::Staging>)> {
            Ok(if mem.flags & CL_MEM_USE_HOST_PTR != 0 {
                ((mem.host_ptr + off) as *mut u8, None)
            } else {
                let s = map_storage(mem, size, queue)?;
                (s.as_mut_ptr(), Some(s))
            })
        };
        let write = flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0;
        let invalidate = flags & CL_MAP_WRITE_INVALIDATE_REGION != 0;
        // A blocking write-invalidate map reads nothing: its memory is taken
        // once its marker has completed, when the write-back of the map
        // before it (queued ahead) has finished and returned its memory to
        // the pool. Taken first, every such map of a large buffer found the
        // last one's memory still busy and pinned fresh memory (30% of native
        // at 256 MiB on an H200).
        let early = if invalidate && blocking != 0 {
            None
        } else {
            Some(storage_for()?)
        };
        if invalidate {
            // Nothing to read: a marker carries the wait list and the event;
            // a blocking map returns once it has completed, as natively (and
            // the write-back of an earlier map has then freed its memory).
            run(queue, n, list, ev, CL_COMMAND_MAP_BUFFER, |vq, w, ve| {
                let marker = vfn!(vq, clEnqueueMarkerWithWaitList)?;
                if blocking == 0 {
                    // SAFETY: forwarding.
                    return Ok(unsafe { marker(vq, n, wl(w), ve) });
                }
                if ve.is_null() && n == 0 {
                    // Nothing to wait on but what the queue holds, and no
                    // event to give back: clFinish waits as the marker
                    // would, without making and waiting on an event (H200:
                    // a 64 KiB map + unmap 10 us instead of 16.5; natively
                    // 9-10).
                    // SAFETY: forwarding.
                    return Ok(unsafe { vfn!(vq, clFinish)?(vq) });
                }
                let mut own: cl_event = std::ptr::null_mut();
                let out = if ve.is_null() { &raw mut own } else { ve };
                // SAFETY: forwarding, with an event to wait on.
                let rc = unsafe { marker(vq, n, wl(w), out) };
                if rc != CL_SUCCESS {
                    return Ok(rc);
                }
                // SAFETY: the vendor event just returned.
                let e = unsafe { *out };
                let waited = vfn!(e, clWaitForEvents)
                    // SAFETY: one live vendor event.
                    .map(|wait| unsafe { wait(1, &e) })
                    .unwrap_or(CL_INVALID_OPERATION);
                if !own.is_null() {
                    // SAFETY: crane's own reference to the marker's event.
                    unsafe { crate::vendor::release(own.cast(), |d| d.clReleaseEvent) };
                }
                // A wait list with a failed event fails the blocking map
                // (CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST), as natively.
                Ok(waited)
            })?;
        } else {
            let ptr = early.as_ref().map_or(std::ptr::null_mut(), |(p, _)| *p);
            run(queue, n, list, ev, CL_COMMAND_MAP_BUFFER, |vq, w, ve| {
                // SAFETY: reading into memory of `size` bytes crane owns (or the
                // application's host pointer region), taken above.
                Ok(unsafe {
                    vfn!(vq, clEnqueueReadBuffer)?(
                        vq,
                        vb,
                        blocking,
                        off,
                        size,
                        ptr.cast(),
                        n,
                        wl(w),
                        ve,
                    )
                })
            })?;
        }
        let (ptr, storage) = match early {
            Some(taken) => taken,
            None => match storage_for() {
                Ok(taken) => taken,
                Err(e) => {
                    // The map fails: the event its marker returned goes.
                    if !ev.is_null() {
                        // SAFETY: the event this call just returned to `ev`.
                        unsafe { super::clReleaseEvent(*ev) };
                        // SAFETY: `ev` is the application's out-pointer.
                        unsafe { *ev = std::ptr::null_mut() };
                    }
                    return Err(e);
                }
            },
        };
        mem.maps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(MapRecord {
                ptr: ptr as usize,
                offset: off,
                size,
                write,
                image: None,
                storage,
            });
        Ok(ptr.cast())
    })
}

/// Origin and region of an image map, checked against the image before crane
/// allocates memory for it.
fn image_map_region(
    desc: &cl_image_desc,
    origin: *const usize,
    region: *const usize,
) -> ClResult<([usize; 3], [usize; 3])> {
    // "CL_INVALID_VALUE if origin or region is NULL."
    if origin.is_null() || region.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: three values each, as OpenCL requires; checked non-null.
    let (o, r) = unsafe {
        (
            origin.cast::<[usize; 3]>().read_unaligned(),
            region.cast::<[usize; 3]>().read_unaligned(),
        )
    };
    // "CL_INVALID_VALUE if the region being mapped given by (origin,
    // origin+region) is out of bounds or if values specified in map_flags are
    // not valid." and "CL_INVALID_VALUE if values in origin and region do not
    // follow rules described in the argument description for origin and
    // region": every region value is at least 1.
    let whole = super::memory::image_region(desc);
    for i in 0..3 {
        if r[i] == 0 || o[i].checked_add(r[i]).is_none_or(|e| e > whole[i]) {
            return Err(CL_INVALID_VALUE);
        }
    }
    Ok((o, r))
}

/// Where an image map lives and how it is laid out.
struct MapLayout {
    /// The application's memory the map points into (CL_MEM_USE_HOST_PTR),
    /// else crane allocates `total` bytes.
    host: Option<usize>,
    /// Row and slice pitch the application is told.
    row: usize,
    slice: usize,
    /// Slice pitch for the vendor's read and write-back: "must be 0 if image
    /// is a 1D or 2D image" (NVIDIA refuses any other with CL_INVALID_VALUE).
    read_slice: usize,
    total: usize,
}

/// The layout of an image map of region `r` at origin `o`: the whole image's
/// pitches, as a vendor mapping its own copy of the image reports them (PoCL
/// does), though crane holds only the region. A 1D image array's layers are
/// one row each, so its slice pitch is its row pitch. For a
/// CL_MEM_USE_HOST_PTR image "the pointer value returned by clEnqueueMapImage
/// will be derived from the host_ptr specified when the image object is
/// created", with the pitches given then.
fn map_layout(
    mem: &Mem,
    desc: &cl_image_desc,
    px: usize,
    o: &[usize; 3],
    r: &[usize; 3],
) -> ClResult<MapLayout> {
    let ty = desc.image_type;
    let layered = matches!(
        ty,
        CL_MEM_OBJECT_IMAGE3D | CL_MEM_OBJECT_IMAGE1D_ARRAY | CL_MEM_OBJECT_IMAGE2D_ARRAY
    );
    let host = mem.flags & CL_MEM_USE_HOST_PTR != 0 && mem.host_ptr != 0;
    let row = if host && desc.image_row_pitch != 0 {
        desc.image_row_pitch
    } else {
        desc.image_width.checked_mul(px).ok_or(CL_INVALID_VALUE)?
    };
    let rows = desc.image_height.max(1);
    let slice = match ty {
        CL_MEM_OBJECT_IMAGE1D_ARRAY if host && desc.image_slice_pitch != 0 => {
            desc.image_slice_pitch
        }
        CL_MEM_OBJECT_IMAGE1D_ARRAY => row,
        _ if layered && host && desc.image_slice_pitch != 0 => desc.image_slice_pitch,
        _ if layered => row.checked_mul(rows).ok_or(CL_INVALID_VALUE)?,
        _ => 0,
    };
    // Bytes from the map's first pixel to one past its last.
    let last = |n: usize, pitch: usize| (n - 1).checked_mul(pitch).ok_or(CL_INVALID_VALUE);
    let span = if ty == CL_MEM_OBJECT_IMAGE1D_ARRAY {
        last(r[1], slice)?
    } else {
        last(r[1], row)?
            .checked_add(last(r[2], slice)?)
            .ok_or(CL_INVALID_VALUE)?
    };
    let total = span
        .checked_add(r[0].checked_mul(px).ok_or(CL_INVALID_VALUE)?)
        .ok_or(CL_INVALID_VALUE)?;
    let host = if host {
        let off = if ty == CL_MEM_OBJECT_IMAGE1D_ARRAY {
            o[0] * px + o[1] * slice
        } else {
            o[0] * px + o[1] * row + o[2] * slice
        };
        Some(mem.host_ptr + off)
    } else {
        None
    };
    Ok(MapLayout {
        host,
        row,
        slice,
        read_slice: if layered { slice } else { 0 },
        total,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueMapImage(
    q: cl_command_queue,
    img: cl_mem,
    blocking: cl_bool,
    flags: cl_map_flags,
    origin: *const usize,
    region: *const usize,
    row_pitch: *mut usize,
    slice_pitch: *mut usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
    errcode_ret: *mut cl_int,
) -> *mut c_void {
    entry::pointer(errcode_ret, || {
        let queue = queue_of(q)?;
        let (mem, vi) = vmem(img)?;
        same_context(queue, mem)?;
        // "CL_INVALID_MEM_OBJECT if image is not a valid image object."
        let MemKind::Image { format, desc, .. } = &mem.kind else {
            return Err(CL_INVALID_MEM_OBJECT);
        };
        waits(n, list)?;
        // "CL_INVALID_VALUE if image_row_pitch is NULL."
        if row_pitch.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let (o, r) = image_map_region(desc, origin, region)?;
        // "CL_INVALID_VALUE if image is a 3D image, 1D or 2D image array object
        // and image_slice_pitch is NULL."
        if slice_pitch.is_null()
            && matches!(
                desc.image_type,
                CL_MEM_OBJECT_IMAGE3D | CL_MEM_OBJECT_IMAGE1D_ARRAY | CL_MEM_OBJECT_IMAGE2D_ARRAY
            )
        {
            return Err(CL_INVALID_VALUE);
        }
        check_map(mem, flags)?;
        let px = super::memory::pixel_size(format);
        let layout = map_layout(mem, desc, px, &o, &r)?;
        let (ptr, storage) = match layout.host {
            Some(p) => (p as *mut u8, None),
            None => {
                let s = map_storage(mem, layout.total, queue)?;
                (s.as_mut_ptr(), Some(s))
            }
        };
        entry::put(row_pitch, layout.row);
        // "For a 2D image, 1D image, or 1D image buffer, if image_slice_pitch
        // is not NULL, 0 is returned."
        entry::put(slice_pitch, layout.slice);
        let (row, slice) = (layout.row, layout.read_slice);
        let write = flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0;
        run(queue, n, list, ev, CL_COMMAND_MAP_IMAGE, |vq, w, ve| {
            // SAFETY: reading the region into memory of that layout (crane's,
            // or the application's host pointer region).
            Ok(unsafe {
                vfn!(vq, clEnqueueReadImage)?(
                    vq,
                    vi,
                    blocking,
                    o.as_ptr(),
                    r.as_ptr(),
                    row,
                    slice,
                    ptr.cast(),
                    n,
                    wl(w),
                    ve,
                )
            })
        })?;
        mem.maps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(MapRecord {
                ptr: ptr as usize,
                offset: 0,
                size: layout.total,
                write,
                image: Some((o, r, row, slice)),
                storage,
            });
        Ok(ptr.cast())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueUnmapMemObject(
    q: cl_command_queue,
    m: cl_mem,
    ptr: *mut c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let (mem, vm) = vmem(m)?;
        // "CL_INVALID_CONTEXT if context associated with command_queue and
        // memobj are not the same".
        same_context(queue, mem)?;
        let w = waits(n, list)?;
        // "CL_INVALID_VALUE if mapped_ptr is not a valid pointer returned by
        // clEnqueueMapBuffer or clEnqueueMapImage for memobj." The record is
        // only taken once the unmap is sure to be enqueued: a failed unmap
        // leaves the region mapped, as natively.
        let rec = {
            let mut maps = mem.maps.lock().unwrap_or_else(|e| e.into_inner());
            let i = maps
                .iter()
                .position(|r| r.ptr == ptr as usize)
                .ok_or(CL_INVALID_VALUE)?;
            maps.remove(i)
        };
        let put_back = |rec| mem.maps.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
        if !rec.write {
            let r = run(
                queue,
                n,
                list,
                ev,
                CL_COMMAND_UNMAP_MEM_OBJECT,
                |vq, w, ve| {
                    // SAFETY: forwarding the wait list to a marker.
                    Ok(unsafe { vfn!(vq, clEnqueueMarkerWithWaitList)?(vq, n, wl(w), ve) })
                },
            );
            if r.is_err() {
                put_back(rec);
            }
            return r;
        }
        // The write-back reads crane's storage, which must outlive the command:
        // the storage is parked until its event completes. (A USE_HOST_PTR
        // mapping has no storage of crane's: the vendor's event is needed only
        // if the application asked for one.)
        let vq: cl_command_queue = queue.base.vendor().cast();
        let want_event = rec.storage.is_some() || !ev.is_null();
        let mut vev: cl_event = std::ptr::null_mut();
        let vev_out: *mut cl_event = if want_event {
            &mut vev
        } else {
            std::ptr::null_mut()
        };
        let rc = match rec.image {
            // SAFETY: writing back from the mapped memory.
            Some((o, r, row, slice)) => unsafe {
                vfn!(vq, clEnqueueWriteImage)?(
                    vq,
                    vm,
                    CL_FALSE,
                    o.as_ptr(),
                    r.as_ptr(),
                    row,
                    slice,
                    rec.ptr as *const c_void,
                    n,
                    wl(&w),
                    vev_out,
                )
            },
            // SAFETY: as above.
            None => unsafe {
                vfn!(vq, clEnqueueWriteBuffer)?(
                    vq,
                    vm,
                    CL_FALSE,
                    rec.offset,
                    rec.size,
                    rec.ptr as *const c_void,
                    n,
                    wl(&w),
                    vev_out,
                )
            },
        };
        if rc != CL_SUCCESS {
            put_back(rec);
            return Err(rc);
        }
        mem.mark_dirty();
        // The vendor's one reference to `vev` goes to the parked storage, or
        // to the application's event; both need a second one.
        match (rec.storage, ev.is_null()) {
            (Some(storage), true) => crate::lifecycle::park_storage(vev.cast(), storage),
            (Some(storage), false) => {
                // SAFETY: the event we got back; the application's event shares it.
                unsafe {
                    crate::vendor::disp(vev.cast())
                        .clRetainEvent
                        .map(|f| f(vev))
                };
                crate::lifecycle::park_storage(vev.cast(), storage);
                wrap_event(queue, vev, CL_COMMAND_UNMAP_MEM_OBJECT, ev)?;
            }
            (None, false) => wrap_event(queue, vev, CL_COMMAND_UNMAP_MEM_OBJECT, ev)?,
            (None, true) => {}
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueMigrateMemObjects(
    q: cl_command_queue,
    n_mems: cl_uint,
    mems: *const cl_mem,
    flags: cl_mem_migration_flags,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let hs = entry::slice(mems, n_mems as usize, CL_INVALID_VALUE)?;
        let mut vms: Vec<cl_mem> = Vec::with_capacity(hs.len());
        for &h in hs {
            vms.push(vmem(h)?.1);
        }
        run(
            queue,
            n,
            list,
            ev,
            CL_COMMAND_MIGRATE_MEM_OBJECTS,
            |vq, w, ve| {
                // SAFETY: forwarding.
                Ok(unsafe {
                    vfn!(vq, clEnqueueMigrateMemObjects)?(
                        vq,
                        n_mems,
                        vms.as_ptr(),
                        flags,
                        n,
                        wl(w),
                        ve,
                    )
                })
            },
        )
    })
}

/// Marks what a launch may have written.
#[inline(always)]
fn note_launch(kernel: &Kernel) {
    if kernel.dirtying_args.is_empty() {
        return;
    }
    // SAFETY: enqueueing a kernel is serialised with setting its arguments by the
    // application (same rule as clSetKernelArg).
    let args = unsafe { kernel.args_mut() };
    for &i in kernel.dirtying_args.iter() {
        if let ArgValue::Handle(slot, generation_) = args[i as usize]
            && let Some(m) = crate::handle::resolve::<Mem>(slot, generation_)
        {
            m.mark_dirty();
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueNDRangeKernel(
    q: cl_command_queue,
    k: cl_kernel,
    dim: cl_uint,
    offset: *const usize,
    global: *const usize,
    local: *const usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let kernel = kernel_ref(k.cast())?;
        let vk: cl_kernel = kernel.base.vendor().cast();
        run(
            queue,
            n,
            list,
            ev,
            CL_COMMAND_NDRANGE_KERNEL,
            |vq, w, ve| {
                // SAFETY: forwarding.
                Ok(unsafe {
                    vfn!(vq, clEnqueueNDRangeKernel)?(
                        vq,
                        vk,
                        dim,
                        offset,
                        global,
                        local,
                        n,
                        wl(w),
                        ve,
                    )
                })
            },
        )?;
        note_launch(kernel);
        kernel.note_local(dim, local);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueTask(
    q: cl_command_queue,
    k: cl_kernel,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    let one = 1usize;
    // SAFETY: a one-item NDRange, which is what clEnqueueTask is.
    unsafe { clEnqueueNDRangeKernel(q, k, 1, std::ptr::null(), &one, &one, n, list, ev) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueNativeKernel(
    q: cl_command_queue,
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    args: *mut c_void,
    cb_args: usize,
    n_mems: cl_uint,
    mems: *const cl_mem,
    locs: *mut *const c_void,
    _n: cl_uint,
    _list: *const cl_event,
    _ev: *mut cl_event,
) -> cl_int {
    // Native kernels run host code on the device's behalf with rewritten memory
    // pointers; crane does not wrap them and answers as a device without
    // CL_EXEC_NATIVE_KERNEL does, after the argument checks that come first.
    entry::status(false, || {
        queue_of(q)?;
        // "CL_INVALID_VALUE if user_func is NULL."
        if f.is_none() {
            return Err(CL_INVALID_VALUE);
        }
        // "CL_INVALID_VALUE if args is a NULL value and cb_args > 0, or if args
        // is a NULL value and num_mem_objects > 0."
        if args.is_null() && (cb_args > 0 || n_mems > 0) {
            return Err(CL_INVALID_VALUE);
        }
        // "CL_INVALID_VALUE if args is not NULL and cb_args is 0."
        if !args.is_null() && cb_args == 0 {
            return Err(CL_INVALID_VALUE);
        }
        // "CL_INVALID_VALUE if num_mem_objects > 0 and mem_list or
        // args_mem_loc are NULL."
        if n_mems > 0 && (mems.is_null() || locs.is_null()) {
            return Err(CL_INVALID_VALUE);
        }
        // "CL_INVALID_VALUE if num_mem_objects = 0 and mem_list or
        // args_mem_loc are not NULL."
        if n_mems == 0 && (!mems.is_null() || !locs.is_null()) {
            return Err(CL_INVALID_VALUE);
        }
        // "CL_INVALID_OPERATION if the device associated with command_queue
        // cannot execute the native kernel."
        Err(CL_INVALID_OPERATION)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueMarkerWithWaitList(
    q: cl_command_queue,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        run(queue, n, list, ev, CL_COMMAND_MARKER, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe { vfn!(vq, clEnqueueMarkerWithWaitList)?(vq, n, wl(w), ve) })
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueBarrierWithWaitList(
    q: cl_command_queue,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        run(queue, n, list, ev, CL_COMMAND_BARRIER, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe { vfn!(vq, clEnqueueBarrierWithWaitList)?(vq, n, wl(w), ve) })
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueMarker(q: cl_command_queue, ev: *mut cl_event) -> cl_int {
    // The OpenCL 1.1 marker is a marker with an empty wait list whose event is
    // required.
    entry::status(false, || {
        let queue = queue_of(q)?;
        // "CL_INVALID_VALUE if event is a NULL value."
        if ev.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        run(
            queue,
            0,
            std::ptr::null(),
            ev,
            CL_COMMAND_MARKER,
            |vq, _, ve| {
                // SAFETY: forwarding.
                Ok(unsafe { vfn!(vq, clEnqueueMarkerWithWaitList)?(vq, 0, std::ptr::null(), ve) })
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueBarrier(q: cl_command_queue) -> cl_int {
    // SAFETY: the OpenCL 1.1 barrier is a barrier with an empty wait list.
    unsafe { clEnqueueBarrierWithWaitList(q, 0, std::ptr::null(), std::ptr::null_mut()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueWaitForEvents(
    q: cl_command_queue,
    n: cl_uint,
    list: *const cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        // "CL_INVALID_VALUE if num_events is 0 or event_list is NULL."
        if n == 0 || list.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // "CL_INVALID_EVENT if event objects specified in event_list are not
        // valid events."
        waits(n, list).map_err(|_| CL_INVALID_EVENT)?;
        run(
            queue,
            n,
            list,
            std::ptr::null_mut(),
            CL_COMMAND_BARRIER,
            |vq, w, _| {
                // SAFETY: a barrier on the given events.
                Ok(unsafe {
                    vfn!(vq, clEnqueueBarrierWithWaitList)?(vq, n, wl(w), std::ptr::null_mut())
                })
            },
        )
    })
}
