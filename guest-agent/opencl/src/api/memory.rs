//! Buffers, sub-buffers, images and pipes.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use opencl_sys::*;

use super::*;
use crate::entry::{self, ClResult, bytes_of, write_info};
use crate::handle::Base;
use crate::vendor::{check, vfn};

const HOST_PTR_FLAGS: cl_mem_flags = CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR;

/// Creates the vendor object for a crane memory object, optionally initialised
/// from `init` (whole contents, images tightly packed). Used at creation (with
/// the application's data) and on resume (with the RAM copy).
pub fn vendor_create(m: &Mem, init: Option<*const c_void>) -> ClResult<*mut c_void> {
    let vc = m.context.base.vendor();
    let mut flags = m.flags & !CL_MEM_COPY_HOST_PTR;
    let mut host = std::ptr::null_mut::<c_void>();
    let emulate = crate::config::get().emulate_host_memory;
    if emulate {
        // The vendor gets plain device memory; crane keeps the application's
        // host pointer up to date through maps (and at suspend) itself.
        flags &= !(CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR);
    }
    if m.flags & CL_MEM_USE_HOST_PTR != 0 {
        host = m.host_ptr as *mut c_void;
        if emulate {
            flags |= CL_MEM_COPY_HOST_PTR;
        }
    } else if let Some(p) = init {
        flags |= CL_MEM_COPY_HOST_PTR;
        host = p.cast_mut();
    }
    let mut err = CL_SUCCESS;
    let props = if m.props.is_empty() {
        std::ptr::null()
    } else {
        m.props.as_ptr()
    };
    let v: *mut c_void = match &m.kind {
        MemKind::Buffer => {
            if m.with_props {
                // SAFETY: vendor context; `host` is null or holds `size` bytes.
                unsafe {
                    vfn!(vc, clCreateBufferWithProperties)?(
                        vc.cast(),
                        props,
                        flags,
                        m.size,
                        host,
                        &mut err,
                    )
                }
                .cast()
            } else {
                // SAFETY: as above.
                unsafe { vfn!(vc, clCreateBuffer)?(vc.cast(), flags, m.size, host, &mut err) }
                    .cast()
            }
        }
        MemKind::SubBuffer { parent, origin } => {
            let region = cl_buffer_region {
                origin: *origin,
                size: m.size,
            };
            let vp = parent.base.vendor();
            // SAFETY: vendor parent buffer and a region struct.
            unsafe {
                vfn!(vp, clCreateSubBuffer)?(
                    vp.cast(),
                    m.flags,
                    CL_BUFFER_CREATE_TYPE_REGION,
                    (&raw const region).cast(),
                    &mut err,
                )
            }
            .cast()
        }
        MemKind::Image {
            format,
            desc,
            buffer,
        } => {
            let mut d = *desc;
            if let Some(b) = buffer {
                d.buffer = b.base.vendor().cast();
            }
            if m.flags & CL_MEM_USE_HOST_PTR == 0 {
                // RAM copies are tightly packed.
                d.image_row_pitch = 0;
                d.image_slice_pitch = 0;
            }
            if m.with_props {
                // SAFETY: vendor context, format and descriptor.
                unsafe {
                    vfn!(vc, clCreateImageWithProperties)?(
                        vc.cast(),
                        props,
                        flags,
                        format,
                        &d,
                        host,
                        &mut err,
                    )
                }
                .cast()
            } else {
                // SAFETY: as above.
                unsafe { vfn!(vc, clCreateImage)?(vc.cast(), flags, format, &d, host, &mut err) }
                    .cast()
            }
        }
        MemKind::Pipe {
            packet_size,
            max_packets,
            props,
        } => {
            let p = if props.is_empty() {
                std::ptr::null()
            } else {
                props.as_ptr()
            };
            // SAFETY: vendor context.
            unsafe {
                vfn!(vc, clCreatePipe)?(vc.cast(), m.flags, *packet_size, *max_packets, p, &mut err)
            }
            .cast()
        }
    };
    check(err)?;
    Ok(v)
}

fn new_mem(
    context: Arc<Context>,
    flags: cl_mem_flags,
    size: usize,
    kind: MemKind,
    host_ptr: *mut c_void,
    props: Vec<cl_mem_properties>,
    with_props: bool,
) -> Mem {
    Mem {
        base: Base::new(std::ptr::null_mut()),
        context,
        flags,
        size,
        kind,
        host_ptr: host_ptr as usize,
        props,
        with_props,
        dirty: AtomicBool::new(false),
        ever_written: AtomicBool::new(false),
        shadow: Mutex::new(Shadow::default()),
        maps: Mutex::new(Vec::new()),
        destructors: Mutex::new(Vec::new()),
    }
}

fn create_buffer(
    c: cl_context,
    props: Vec<cl_mem_properties>,
    with_props: bool,
    flags: cl_mem_flags,
    size: usize,
    host: *mut c_void,
) -> ClResult<cl_mem> {
    let context = arc_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
    if size == 0 {
        return Err(CL_INVALID_BUFFER_SIZE);
    }
    if (host.is_null()) != (flags & HOST_PTR_FLAGS == 0) {
        return Err(CL_INVALID_HOST_PTR);
    }
    let m = new_mem(
        context,
        flags,
        size,
        MemKind::Buffer,
        if flags & CL_MEM_USE_HOST_PTR != 0 {
            host
        } else {
            std::ptr::null_mut()
        },
        props,
        with_props,
    );
    let init = (flags & CL_MEM_COPY_HOST_PTR != 0).then_some(host.cast_const());
    m.base.set_vendor(vendor_create(&m, init)?);
    if let Some(p) = init {
        // Large initial contents are not copied (natively creation costs one
        // transfer; a copy of 256 MiB into fresh memory doubled it): the
        // buffer counts as written and is read back at suspend, as after a
        // large host write.
        let cfg = crate::config::get();
        if cfg.write_cache && size <= cfg.write_cache_max {
            // SAFETY: COPY_HOST_PTR: the application's `size` bytes at `p`.
            let data = crate::staging::HostBytes::from_slice(unsafe {
                std::slice::from_raw_parts(p.cast::<u8>(), size)
            });
            m.shadow
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .replace(Some(data));
        } else {
            m.dirty.store(true, Ordering::Relaxed);
        }
        m.ever_written.store(true, Ordering::Relaxed);
    } else if flags & CL_MEM_USE_HOST_PTR != 0 {
        m.ever_written.store(true, Ordering::Relaxed);
    }
    Ok(publish(Arc::new(m)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateBuffer(
    c: cl_context,
    flags: cl_mem_flags,
    size: usize,
    host: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    entry::object(errcode_ret, || {
        create_buffer(c, Vec::new(), false, flags, size, host)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateBufferWithProperties(
    c: cl_context,
    props: *const cl_mem_properties,
    flags: cl_mem_flags,
    size: usize,
    host: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    entry::object(errcode_ret, || {
        create_buffer(c, entry::read_props(props), true, flags, size, host)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateSubBuffer(
    b: cl_mem,
    flags: cl_mem_flags,
    ty: cl_buffer_create_type,
    info: *const c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    entry::object(errcode_ret, || {
        let parent = arc_of::<Mem>(b.cast(), CL_INVALID_MEM_OBJECT)?;
        if !matches!(parent.kind, MemKind::Buffer) {
            return Err(CL_INVALID_MEM_OBJECT);
        }
        if ty != CL_BUFFER_CREATE_TYPE_REGION {
            return Err(CL_INVALID_VALUE);
        }
        if info.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: for CL_BUFFER_CREATE_TYPE_REGION `info` points to a cl_buffer_region.
        let region = unsafe { *(info as *const cl_buffer_region) };
        let mut m = new_mem(
            parent.context.clone(),
            flags,
            region.size,
            MemKind::SubBuffer {
                parent: parent.clone(),
                origin: region.origin,
            },
            std::ptr::null_mut(),
            Vec::new(),
            false,
        );
        let vp = parent.base.vendor();
        let mut err = CL_SUCCESS;
        // SAFETY: vendor parent and the application's region.
        let v = unsafe { vfn!(vp, clCreateSubBuffer)?(vp.cast(), flags, ty, info, &mut err) };
        check(err)?;
        m.base.set_vendor(v.cast());
        if parent.flags & CL_MEM_USE_HOST_PTR != 0 {
            m.host_ptr = parent.host_ptr + region.origin;
        }
        Ok(publish(Arc::new(m)))
    })
}

fn create_image(
    c: cl_context,
    props: Vec<cl_mem_properties>,
    with_props: bool,
    flags: cl_mem_flags,
    format: *const cl_image_format,
    desc: *const cl_image_desc,
    host: *mut c_void,
) -> ClResult<cl_mem> {
    let context = arc_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
    if format.is_null() {
        return Err(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR);
    }
    if desc.is_null() {
        return Err(CL_INVALID_IMAGE_DESCRIPTOR);
    }
    if (host.is_null()) != (flags & HOST_PTR_FLAGS == 0) {
        return Err(CL_INVALID_HOST_PTR);
    }
    // SAFETY: checked non-null; the application passes valid structs.
    let (format, desc) = unsafe { (*format, *desc) };
    let buffer = if desc.buffer.is_null() {
        None
    } else {
        Some(arc_of::<Mem>(
            desc.buffer.cast(),
            CL_INVALID_IMAGE_DESCRIPTOR,
        )?)
    };
    let m = new_mem(
        context,
        flags,
        0,
        MemKind::Image {
            format,
            desc,
            buffer,
        },
        if flags & CL_MEM_USE_HOST_PTR != 0 {
            host
        } else {
            std::ptr::null_mut()
        },
        props,
        with_props,
    );
    // First creation uses the application's own pitches, so pass its descriptor.
    let vc = m.context.base.vendor();
    let mut d = desc;
    if let MemKind::Image {
        buffer: Some(b), ..
    } = &m.kind
    {
        d.buffer = b.base.vendor().cast();
    }
    let mut err = CL_SUCCESS;
    let v = if with_props {
        // SAFETY: forwarding the application's arguments with vendor objects.
        unsafe {
            vfn!(vc, clCreateImageWithProperties)?(
                vc.cast(),
                if m.props.is_empty() {
                    std::ptr::null()
                } else {
                    m.props.as_ptr()
                },
                flags,
                &format,
                &d,
                host,
                &mut err,
            )
        }
    } else {
        // SAFETY: as above.
        unsafe { vfn!(vc, clCreateImage)?(vc.cast(), flags, &format, &d, host, &mut err) }
    };
    check(err)?;
    m.base.set_vendor(v.cast());
    if flags & HOST_PTR_FLAGS != 0 {
        m.mark_dirty();
    }
    Ok(publish(Arc::new(m)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateImage(
    c: cl_context,
    flags: cl_mem_flags,
    format: *const cl_image_format,
    desc: *const cl_image_desc,
    host: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    entry::object(errcode_ret, || {
        create_image(c, Vec::new(), false, flags, format, desc, host)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateImageWithProperties(
    c: cl_context,
    props: *const cl_mem_properties,
    flags: cl_mem_flags,
    format: *const cl_image_format,
    desc: *const cl_image_desc,
    host: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    entry::object(errcode_ret, || {
        create_image(c, entry::read_props(props), true, flags, format, desc, host)
    })
}

fn legacy_desc(
    ty: cl_mem_object_type,
    w: usize,
    h: usize,
    d: usize,
    row: usize,
    slice: usize,
) -> cl_image_desc {
    // SAFETY: cl_image_desc is plain data; all-zero is a valid value.
    let mut desc: cl_image_desc = unsafe { std::mem::zeroed() };
    desc.image_type = ty;
    desc.image_width = w;
    desc.image_height = h;
    desc.image_depth = d;
    desc.image_row_pitch = row;
    desc.image_slice_pitch = slice;
    desc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateImage2D(
    c: cl_context,
    flags: cl_mem_flags,
    format: *const cl_image_format,
    w: usize,
    h: usize,
    row: usize,
    host: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    let desc = legacy_desc(CL_MEM_OBJECT_IMAGE2D, w, h, 1, row, 0);
    entry::object(errcode_ret, || {
        create_image(c, Vec::new(), false, flags, format, &desc, host)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateImage3D(
    c: cl_context,
    flags: cl_mem_flags,
    format: *const cl_image_format,
    w: usize,
    h: usize,
    d: usize,
    row: usize,
    slice: usize,
    host: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    let desc = legacy_desc(CL_MEM_OBJECT_IMAGE3D, w, h, d, row, slice);
    entry::object(errcode_ret, || {
        create_image(c, Vec::new(), false, flags, format, &desc, host)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreatePipe(
    c: cl_context,
    flags: cl_mem_flags,
    packet_size: cl_uint,
    max_packets: cl_uint,
    props: *const cl_pipe_properties,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    entry::object(errcode_ret, || {
        let context = arc_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
        let m = new_mem(
            context,
            flags,
            packet_size as usize * max_packets as usize,
            MemKind::Pipe {
                packet_size,
                max_packets,
                props: entry::read_props(props),
            },
            std::ptr::null_mut(),
            Vec::new(),
            false,
        );
        m.base.set_vendor(vendor_create(&m, None)?);
        Ok(publish(Arc::new(m)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetPipeInfo(
    m: cl_mem,
    param: cl_pipe_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let v = vendor_of::<Mem>(m.cast(), CL_INVALID_MEM_OBJECT)?;
        // SAFETY: forwarding.
        check(unsafe { vfn!(v, clGetPipeInfo)?(v.cast(), param, size, value, size_ret) })
    })
}

pub fn before_release(m: &Mem, v: *mut c_void) {
    let list = std::mem::take(&mut *m.destructors.lock().unwrap_or_else(|e| e.into_inner()));
    crate::callbacks::hand_over_destructors(list, v, |d| {
        d.clSetMemObjectDestructorCallback.map(|f| f as usize)
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSetMemObjectDestructorCallback(
    m: cl_mem,
    f: Option<unsafe extern "C" fn(cl_mem, *mut c_void)>,
    user_data: *mut c_void,
) -> cl_int {
    entry::status(false, || {
        let mem = mem_ref(m.cast())?;
        let f = f.ok_or(CL_INVALID_VALUE)?;
        mem.destructors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new(Callback {
                func: f as usize,
                user_data: user_data as usize,
                kind: 0,
                fired: Default::default(),
                handle: m as usize,
            }));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetSupportedImageFormats(
    c: cl_context,
    flags: cl_mem_flags,
    ty: cl_mem_object_type,
    n: cl_uint,
    out: *mut cl_image_format,
    n_ret: *mut cl_uint,
) -> cl_int {
    entry::status(false, || {
        let v = vendor_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
        // SAFETY: forwarding.
        check(unsafe { vfn!(v, clGetSupportedImageFormats)?(v.cast(), flags, ty, n, out, n_ret) })
    })
}

const ACCESS_FLAGS: cl_mem_flags = CL_MEM_READ_WRITE | CL_MEM_READ_ONLY | CL_MEM_WRITE_ONLY;
const HOST_ACCESS_FLAGS: cl_mem_flags =
    CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;

/// CL_MEM_FLAGS: a sub-buffer, or an image made from a buffer, inherits the
/// access and host access flags it was created without, and always the host
/// pointer flags (CL_MEM_ALLOC_HOST_PTR, CL_MEM_COPY_HOST_PTR,
/// CL_MEM_USE_HOST_PTR) of the buffer it was made from.
fn reported_flags(mem: &Mem) -> cl_mem_flags {
    let from = match &mem.kind {
        MemKind::SubBuffer { parent, .. } => parent,
        MemKind::Image {
            buffer: Some(b), ..
        } => b,
        _ => return mem.flags,
    };
    let p = reported_flags(from);
    let mut f = mem.flags;
    if f & ACCESS_FLAGS == 0 {
        f |= p & ACCESS_FLAGS;
    }
    if f & HOST_ACCESS_FLAGS == 0 {
        f |= p & HOST_ACCESS_FLAGS;
    }
    f | p & (CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR | CL_MEM_USE_HOST_PTR)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetMemObjectInfo(
    m: cl_mem,
    param: cl_mem_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let mem = mem_ref(m.cast())?;
        match param {
            CL_MEM_CONTEXT => write_info(
                bytes_of(&mem.context.base.handle::<c_void>()),
                size,
                value,
                size_ret,
            ),
            CL_MEM_REFERENCE_COUNT => {
                write_info(bytes_of(&mem.base.app_refs()), size, value, size_ret)
            }
            CL_MEM_FLAGS => write_info(bytes_of(&reported_flags(mem)), size, value, size_ret),
            CL_MEM_HOST_PTR => write_info(
                bytes_of(&(mem.host_ptr as *mut c_void)),
                size,
                value,
                size_ret,
            ),
            CL_MEM_MAP_COUNT => {
                let n = mem.maps.lock().unwrap_or_else(|e| e.into_inner()).len() as cl_uint;
                write_info(bytes_of(&n), size, value, size_ret)
            }
            CL_MEM_ASSOCIATED_MEMOBJECT => {
                let h: *mut c_void = match &mem.kind {
                    MemKind::SubBuffer { parent, .. } => parent.base.handle(),
                    MemKind::Image {
                        buffer: Some(b), ..
                    } => b.base.handle(),
                    _ => std::ptr::null_mut(),
                };
                write_info(bytes_of(&h), size, value, size_ret)
            }
            _ => {
                let v = mem.base.vendor();
                // SAFETY: forwarding.
                check(unsafe {
                    vfn!(v, clGetMemObjectInfo)?(v.cast(), param, size, value, size_ret)
                })
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetImageInfo(
    m: cl_mem,
    param: cl_image_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let mem = mem_ref(m.cast())?;
        match (&mem.kind, param) {
            (MemKind::Image { buffer, .. }, CL_IMAGE_BUFFER) => {
                let h: *mut c_void = buffer
                    .as_ref()
                    .map_or(std::ptr::null_mut(), |b| b.base.handle());
                write_info(bytes_of(&h), size, value, size_ret)
            }
            // Other objects too go to the vendor, which decides what an image
            // query on a buffer answers.
            _ => {
                let v = mem.base.vendor();
                // SAFETY: forwarding.
                check(unsafe { vfn!(v, clGetImageInfo)?(v.cast(), param, size, value, size_ret) })
            }
        }
    })
}

/// Bytes per pixel of an image format.
pub fn pixel_size(f: &cl_image_format) -> usize {
    #[allow(non_upper_case_globals)]
    let channels = match f.image_channel_order {
        CL_R | CL_A | CL_INTENSITY | CL_LUMINANCE | CL_DEPTH | CL_Rx => 1,
        CL_RG | CL_RA | CL_RGx => 2,
        CL_RGB | CL_RGBx | CL_sRGB | CL_sRGBx => 3,
        _ => 4,
    };
    match f.image_channel_data_type {
        CL_SNORM_INT8 | CL_UNORM_INT8 | CL_SIGNED_INT8 | CL_UNSIGNED_INT8 => channels,
        CL_SNORM_INT16 | CL_UNORM_INT16 | CL_SIGNED_INT16 | CL_UNSIGNED_INT16 | CL_HALF_FLOAT => {
            2 * channels
        }
        CL_UNORM_SHORT_565 | CL_UNORM_SHORT_555 => 2,
        CL_UNORM_INT_101010 | CL_UNORM_INT_101010_2 => 4,
        _ => 4 * channels,
    }
}

/// The full region of an image, in pixels (width, height or array size, depth or
/// array size), as clEnqueueReadImage wants it.
pub fn image_region(desc: &cl_image_desc) -> [usize; 3] {
    let w = desc.image_width.max(1);
    match desc.image_type {
        CL_MEM_OBJECT_IMAGE1D_ARRAY => [w, desc.image_array_size.max(1), 1],
        CL_MEM_OBJECT_IMAGE2D => [w, desc.image_height.max(1), 1],
        CL_MEM_OBJECT_IMAGE2D_ARRAY => [w, desc.image_height.max(1), desc.image_array_size.max(1)],
        CL_MEM_OBJECT_IMAGE3D => [w, desc.image_height.max(1), desc.image_depth.max(1)],
        _ => [w, 1, 1],
    }
}
