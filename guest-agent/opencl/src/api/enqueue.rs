//! Enqueued commands. Besides forwarding, these keep the RAM copy of buffers
//! up to date (host writes) and note which buffers the device may have changed
//! (kernels, copies, fills, write maps).

use std::ffi::c_void;
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

/// The common shape of an enqueue: resolve the queue and wait list, call the
/// vendor, and wrap the event the application asked for.
#[inline(always)]
pub(super) fn run(
    q: cl_command_queue,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
    cmd: cl_command_type,
    f: impl FnOnce(cl_command_queue, &Waits, *mut cl_event) -> ClResult<cl_int>,
) -> ClResult<()> {
    let queue = queue_ref(q.cast())?;
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
        wrap_event(q, vev, cmd, ev)?;
    }
    Ok(())
}

#[cold]
fn wrap_event(
    q: cl_command_queue,
    vev: cl_event,
    cmd: cl_command_type,
    ev: *mut cl_event,
) -> ClResult<()> {
    let queue = arc_of::<Queue>(q.cast(), CL_INVALID_COMMAND_QUEUE)?;
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
        let (_, vb) = vmem(b)?;
        run(q, n, list, ev, CL_COMMAND_READ_BUFFER, |vq, w, ve| {
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
    if !crate::config::get().write_cache || root.flags & CL_MEM_USE_HOST_PTR != 0 || root.is_image()
    {
        if root.flags & CL_MEM_USE_HOST_PTR == 0 {
            root.dirty.store(true, Ordering::Relaxed);
        }
        return;
    }
    let start = mem.root_offset() + off;
    let mut sh = root.shadow.lock().unwrap_or_else(|e| e.into_inner());
    let data = sh.data.get_or_insert_with(|| vec![0u8; root.size]);
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
        let (mem, vb) = vmem(b)?;
        run(q, n, list, ev, CL_COMMAND_WRITE_BUFFER, |vq, w, ve| {
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
        let (_, vb) = vmem(b)?;
        run(q, n, list, ev, CL_COMMAND_READ_BUFFER_RECT, |vq, w, ve| {
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
        })
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
        let (mem, vb) = vmem(b)?;
        run(q, n, list, ev, CL_COMMAND_WRITE_BUFFER_RECT, |vq, w, ve| {
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
        })?;
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
        let (mem, vb) = vmem(b)?;
        run(q, n, list, ev, CL_COMMAND_FILL_BUFFER, |vq, w, ve| {
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
        let (_, vs) = vmem(src)?;
        let (dm, vd) = vmem(dst)?;
        run(q, n, list, ev, CL_COMMAND_COPY_BUFFER, |vq, w, ve| {
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
        let (_, vs) = vmem(src)?;
        let (dm, vd) = vmem(dst)?;
        run(q, n, list, ev, CL_COMMAND_COPY_BUFFER_RECT, |vq, w, ve| {
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
        })?;
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
        let (_, vi) = vmem(img)?;
        run(q, n, list, ev, CL_COMMAND_READ_IMAGE, |vq, w, ve| {
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
        let (m, vi) = vmem(img)?;
        run(q, n, list, ev, CL_COMMAND_WRITE_IMAGE, |vq, w, ve| {
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
        let (m, vi) = vmem(img)?;
        run(q, n, list, ev, CL_COMMAND_FILL_IMAGE, |vq, w, ve| {
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
        let (_, vs) = vmem(src)?;
        let (dm, vd) = vmem(dst)?;
        run(q, n, list, ev, CL_COMMAND_COPY_IMAGE, |vq, w, ve| {
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
        let (_, vs) = vmem(src)?;
        let (dm, vd) = vmem(dst)?;
        run(
            q,
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
        let (_, vs) = vmem(src)?;
        let (dm, vd) = vmem(dst)?;
        run(
            q,
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
/// holds survives the vendor library being unloaded.
fn map_storage(size: usize) -> Box<[u8]> {
    vec![0u8; size.max(1)].into_boxed_slice()
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
        let (mem, vb) = vmem(b)?;
        if mem.is_image() {
            return Err(CL_INVALID_MEM_OBJECT);
        }
        if off.checked_add(size).is_none_or(|e| e > mem.size) || size == 0 {
            return Err(CL_INVALID_VALUE);
        }
        let (ptr, storage) = if mem.flags & CL_MEM_USE_HOST_PTR != 0 {
            ((mem.host_ptr + off) as *mut u8, None)
        } else {
            let mut s = map_storage(size);
            (s.as_mut_ptr(), Some(s))
        };
        let write = flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0;
        if flags & CL_MAP_WRITE_INVALIDATE_REGION != 0 {
            // Nothing to read: a marker carries the wait list and the event.
            run(q, n, list, ev, CL_COMMAND_MAP_BUFFER, |vq, w, ve| {
                // SAFETY: forwarding.
                Ok(unsafe { vfn!(vq, clEnqueueMarkerWithWaitList)?(vq, n, wl(w), ve) })
            })?;
            if blocking != 0 && !ev.is_null() {
                // SAFETY: the event just returned.
                unsafe { super::event::clWaitForEvents(1, ev) };
            }
        } else {
            run(q, n, list, ev, CL_COMMAND_MAP_BUFFER, |vq, w, ve| {
                // SAFETY: reading into memory of `size` bytes crane owns (or the
                // application's host pointer region).
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
        let (mem, vi) = vmem(img)?;
        let MemKind::Image { format, .. } = &mem.kind else {
            return Err(CL_INVALID_MEM_OBJECT);
        };
        if origin.is_null() || region.is_null() || row_pitch.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: three values each, as OpenCL requires.
        let (o, r) = unsafe {
            (
                *(origin as *const [usize; 3]),
                *(region as *const [usize; 3]),
            )
        };
        let px = super::memory::pixel_size(format);
        let row = r[0] * px;
        let slice = row * r[1];
        let mut s = map_storage(slice * r[2]);
        let ptr = s.as_mut_ptr();
        entry::put(row_pitch, row);
        entry::put(slice_pitch, slice);
        let write = flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0;
        run(q, n, list, ev, CL_COMMAND_MAP_IMAGE, |vq, w, ve| {
            // SAFETY: reading the region into crane-owned memory of that size.
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
                size: slice * r[2],
                write,
                image: Some((o, r, row, slice)),
                storage: Some(s),
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
        let (mem, vm) = vmem(m)?;
        let rec = {
            let mut maps = mem.maps.lock().unwrap_or_else(|e| e.into_inner());
            let i = maps
                .iter()
                .position(|r| r.ptr == ptr as usize)
                .ok_or(CL_INVALID_VALUE)?;
            maps.remove(i)
        };
        if !rec.write {
            return run(q, n, list, ev, CL_COMMAND_UNMAP_MEM_OBJECT, |vq, w, ve| {
                // SAFETY: forwarding the wait list to a marker.
                Ok(unsafe { vfn!(vq, clEnqueueMarkerWithWaitList)?(vq, n, wl(w), ve) })
            });
        }
        // The write-back reads crane's storage, which must outlive the command:
        // the command is made blocking unless the wait list could block forever,
        // in which case the storage is parked until its event completes.
        let queue = queue_ref(q.cast())?;
        let vq: cl_command_queue = queue.base.vendor().cast();
        let w = waits(n, list)?;
        let mut vev: cl_event = std::ptr::null_mut();
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
                    &mut vev,
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
                    &mut vev,
                )
            },
        };
        if rc != CL_SUCCESS {
            mem.maps.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
            return Err(rc);
        }
        mem.mark_dirty();
        if let Some(storage) = rec.storage {
            crate::lifecycle::park_storage(vev.cast(), storage);
        }
        if !ev.is_null() {
            // SAFETY: the event we got back; the application's event shares it.
            unsafe {
                crate::vendor::disp(vev.cast())
                    .clRetainEvent
                    .map(|f| f(vev))
            };
            wrap_event(q, vev, CL_COMMAND_UNMAP_MEM_OBJECT, ev)?;
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
        let hs = entry::slice(mems, n_mems as usize, CL_INVALID_VALUE)?;
        let mut vms: Vec<cl_mem> = Vec::with_capacity(hs.len());
        for &h in hs {
            vms.push(vmem(h)?.1);
        }
        run(
            q,
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
        let kernel = kernel_ref(k.cast())?;
        let vk: cl_kernel = kernel.base.vendor().cast();
        run(q, n, list, ev, CL_COMMAND_NDRANGE_KERNEL, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe {
                vfn!(vq, clEnqueueNDRangeKernel)?(vq, vk, dim, offset, global, local, n, wl(w), ve)
            })
        })?;
        note_launch(kernel);
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
    _q: cl_command_queue,
    _f: Option<unsafe extern "C" fn(*mut c_void)>,
    _args: *mut c_void,
    _cb: usize,
    _n_mems: cl_uint,
    _mems: *const cl_mem,
    _locs: *mut *const c_void,
    _n: cl_uint,
    _list: *const cl_event,
    _ev: *mut cl_event,
) -> cl_int {
    // Native kernels run host code on the device's behalf with rewritten memory
    // pointers; crane does not wrap them and answers as a device without
    // CL_EXEC_NATIVE_KERNEL does.
    entry::status(false, || Err(CL_INVALID_OPERATION))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueMarkerWithWaitList(
    q: cl_command_queue,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        run(q, n, list, ev, CL_COMMAND_MARKER, |vq, w, ve| {
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
        run(q, n, list, ev, CL_COMMAND_BARRIER, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe { vfn!(vq, clEnqueueBarrierWithWaitList)?(vq, n, wl(w), ve) })
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueMarker(q: cl_command_queue, ev: *mut cl_event) -> cl_int {
    // SAFETY: the OpenCL 1.1 marker is a marker with an empty wait list.
    unsafe { clEnqueueMarkerWithWaitList(q, 0, std::ptr::null(), ev) }
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
        if n == 0 || list.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        run(
            q,
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
