//! Kernels and their arguments: the hottest path crane sits on.

use std::cell::UnsafeCell;
use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use opencl_sys::*;

use super::*;
use crate::entry::{self, ClResult, bytes_of, write_info};
use crate::handle::{Base, Slot};
use crate::vendor::{check, vfn};

pub(crate) fn arg_info<T: Copy + Default>(
    vk: *mut c_void,
    i: cl_uint,
    param: cl_kernel_arg_info,
) -> Option<T> {
    let mut out = T::default();
    let f = vfn!(vk, clGetKernelArgInfo).ok()?;
    // SAFETY: the vendor writes one value of the queried type.
    let rc = unsafe {
        f(
            vk.cast(),
            i,
            param,
            std::mem::size_of::<T>(),
            (&raw mut out).cast(),
            std::ptr::null_mut(),
        )
    };
    (rc == CL_SUCCESS).then_some(out)
}

fn arg_type_name(vk: *mut c_void, i: cl_uint) -> Option<String> {
    let f = vfn!(vk, clGetKernelArgInfo).ok()?;
    let mut buf = [0u8; 256];
    // SAFETY: a 256-byte buffer for the type name.
    let rc = unsafe {
        f(
            vk.cast(),
            i,
            CL_KERNEL_ARG_TYPE_NAME,
            buf.len(),
            buf.as_mut_ptr().cast(),
            std::ptr::null_mut(),
        )
    };
    if rc != CL_SUCCESS {
        return None;
    }
    Some(
        CStr::from_bytes_until_nul(&buf)
            .ok()?
            .to_string_lossy()
            .into_owned(),
    )
}

/// Classifies every argument of a vendor kernel, once, at creation.
fn classify(vk: *mut c_void) -> ClResult<Box<[ArgKind]>> {
    let mut n: cl_uint = 0;
    // SAFETY: one cl_uint.
    check(unsafe {
        vfn!(vk, clGetKernelInfo)?(
            vk.cast(),
            CL_KERNEL_NUM_ARGS,
            std::mem::size_of::<cl_uint>(),
            (&raw mut n).cast(),
            std::ptr::null_mut(),
        )
    })?;
    Ok((0..n)
        .map(|i| {
            let Some(addr) =
                arg_info::<cl_kernel_arg_address_qualifier>(vk, i, CL_KERNEL_ARG_ADDRESS_QUALIFIER)
            else {
                return ArgKind::Unknown;
            };
            let access =
                arg_info::<cl_kernel_arg_access_qualifier>(vk, i, CL_KERNEL_ARG_ACCESS_QUALIFIER)
                    .unwrap_or(CL_KERNEL_ARG_ACCESS_NONE);
            let tq = arg_info::<cl_kernel_arg_type_qualifier>(vk, i, CL_KERNEL_ARG_TYPE_QUALIFIER)
                .unwrap_or(0);
            let name = arg_type_name(vk, i).unwrap_or_default();
            if access != CL_KERNEL_ARG_ACCESS_NONE || name.starts_with("image") {
                return if access == CL_KERNEL_ARG_ACCESS_READ_ONLY {
                    ArgKind::ImageReadOnly
                } else {
                    ArgKind::ImageWritable
                };
            }
            if tq & CL_KERNEL_ARG_TYPE_PIPE != 0 {
                return ArgKind::MemWritable;
            }
            match addr {
                CL_KERNEL_ARG_ADDRESS_LOCAL => ArgKind::Local,
                CL_KERNEL_ARG_ADDRESS_CONSTANT => ArgKind::MemReadOnly,
                CL_KERNEL_ARG_ADDRESS_GLOBAL if tq & CL_KERNEL_ARG_TYPE_CONST != 0 => {
                    ArgKind::MemReadOnly
                }
                CL_KERNEL_ARG_ADDRESS_GLOBAL => ArgKind::MemWritable,
                _ if name == "sampler_t" => ArgKind::Sampler,
                _ if name == "queue_t" => ArgKind::Queue,
                _ => ArgKind::Value,
            }
        })
        .collect())
}

fn dirtying(kinds: &[ArgKind]) -> Box<[u32]> {
    kinds
        .iter()
        .enumerate()
        .filter(|(_, k)| {
            matches!(
                k,
                ArgKind::MemWritable | ArgKind::ImageWritable | ArgKind::Unknown
            )
        })
        .map(|(i, _)| i as u32)
        .collect()
}

/// Wraps a vendor kernel in a crane kernel.
pub fn wrap(
    program: Arc<Program>,
    vk: *mut c_void,
    name: CString,
    args: Option<Vec<ArgValue>>,
) -> ClResult<Arc<Kernel>> {
    let kinds = classify(vk)?;
    let n = kinds.len();
    Ok(Arc::new(Kernel {
        base: Base::new(vk),
        program,
        name,
        dirtying_args: dirtying(&kinds),
        arg_kinds: kinds,
        args: UnsafeCell::new(args.unwrap_or_else(|| vec![ArgValue::Unset; n])),
        exec_info: Mutex::new(Vec::new()),
        max_local: Default::default(),
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateKernel(
    p: cl_program,
    name: *const c_char,
    errcode_ret: *mut cl_int,
) -> cl_kernel {
    entry::object(errcode_ret, || {
        let prog = arc_of::<Program>(p.cast(), CL_INVALID_PROGRAM)?;
        if name.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let vp = prog.base.vendor();
        let mut err = CL_SUCCESS;
        // SAFETY: vendor program and a NUL-terminated name.
        let vk = unsafe { vfn!(vp, clCreateKernel)?(vp.cast(), name, &mut err) };
        check(err)?;
        // SAFETY: checked non-null; NUL-terminated.
        let name = unsafe { CStr::from_ptr(name) }.to_owned();
        Ok(publish(wrap(prog, vk.cast(), name, None)?))
    })
}

/// The name of a vendor kernel.
pub fn kernel_name(vk: *mut c_void) -> ClResult<CString> {
    let f = vfn!(vk, clGetKernelInfo)?;
    let mut n = 0usize;
    // SAFETY: size query.
    check(unsafe {
        f(
            vk.cast(),
            CL_KERNEL_FUNCTION_NAME,
            0,
            std::ptr::null_mut(),
            &mut n,
        )
    })?;
    let mut buf = vec![0u8; n];
    // SAFETY: `buf` holds n bytes.
    check(unsafe {
        f(
            vk.cast(),
            CL_KERNEL_FUNCTION_NAME,
            n,
            buf.as_mut_ptr().cast(),
            std::ptr::null_mut(),
        )
    })?;
    CString::from_vec_with_nul(buf).map_err(|_| CL_INVALID_KERNEL)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateKernelsInProgram(
    p: cl_program,
    n: cl_uint,
    out: *mut cl_kernel,
    n_ret: *mut cl_uint,
) -> cl_int {
    entry::status(false, || {
        let prog = arc_of::<Program>(p.cast(), CL_INVALID_PROGRAM)?;
        let vp = prog.base.vendor();
        let f = vfn!(vp, clCreateKernelsInProgram)?;
        let mut cnt = 0;
        // SAFETY: count query.
        check(unsafe { f(vp.cast(), 0, std::ptr::null_mut(), &mut cnt) })?;
        entry::put(n_ret, cnt);
        if out.is_null() {
            return Ok(());
        }
        if n < cnt {
            return Err(CL_INVALID_VALUE);
        }
        let mut vks = vec![std::ptr::null_mut(); cnt as usize];
        // SAFETY: `vks` holds cnt entries.
        check(unsafe { f(vp.cast(), cnt, vks.as_mut_ptr(), std::ptr::null_mut()) })?;
        for (i, &vk) in vks.iter().enumerate() {
            let k = wrap(prog.clone(), vk.cast(), kernel_name(vk.cast())?, None)?;
            // SAFETY: room for n >= cnt kernels.
            unsafe { out.add(i).write(publish(k)) };
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCloneKernel(k: cl_kernel, errcode_ret: *mut cl_int) -> cl_kernel {
    entry::object(errcode_ret, || {
        let src = kernel_ref(k.cast())?;
        let vk = src.base.vendor();
        let mut err = CL_SUCCESS;
        // SAFETY: vendor kernel.
        let v = unsafe { vfn!(vk, clCloneKernel)?(vk.cast(), &mut err) };
        check(err)?;
        // SAFETY: the application serialises calls on `src`, this is one of them.
        let args = unsafe { src.args_mut() }.clone();
        let exec = src
            .exec_info
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let nk = wrap(src.program.clone(), v.cast(), src.name.clone(), Some(args))?;
        *nk.exec_info.lock().unwrap_or_else(|e| e.into_inner()) = exec;
        Ok(publish(nk))
    })
}

const PTR: usize = std::mem::size_of::<*mut c_void>();

/// The vendor object and slot for a handle-typed argument value.
#[inline(always)]
fn handle_arg(p: *const c_void, kind: ArgKind) -> Option<(*mut c_void, *const Slot)> {
    fn of<T: ClObject>(p: *const c_void) -> Option<(*mut c_void, *const Slot)> {
        handle::get_with_slot::<T>(p).map(|(o, s)| (o.base().vendor(), s))
    }
    if kind.is_mem() {
        return of::<Mem>(p);
    }
    match kind {
        ArgKind::Sampler => of::<Sampler>(p),
        ArgKind::Queue => of::<Queue>(p),
        ArgKind::Unknown => of::<Mem>(p)
            .or_else(|| of::<Sampler>(p))
            .or_else(|| of::<Queue>(p)),
        _ => None,
    }
}

/// Sets one argument on a vendor kernel from a recorded value (resume).
pub fn apply_arg(vk: *mut c_void, i: u32, a: &ArgValue) -> ClResult<()> {
    let f = vfn!(vk, clSetKernelArg)?;
    let rc = match a {
        ArgValue::Unset => return Ok(()),
        ArgValue::Bytes(b) => {
            let b = b.as_slice();
            // SAFETY: the recorded bytes.
            unsafe { f(vk.cast(), i, b.len(), b.as_ptr().cast()) }
        }
        ArgValue::Handle(slot, generation_) => {
            let v = handle::resolve::<Mem>(*slot, *generation_)
                .map(|m| m.base.vendor())
                .or_else(|| {
                    handle::resolve::<Sampler>(*slot, *generation_).map(|s| s.base.vendor())
                })
                .or_else(|| handle::resolve::<Queue>(*slot, *generation_).map(|q| q.base.vendor()));
            // An object the application released since: leave the argument unset,
            // as a launch with it would have been invalid anyway.
            let Some(v) = v else { return Ok(()) };
            // SAFETY: one vendor handle.
            unsafe { f(vk.cast(), i, PTR, (&raw const v).cast()) }
        }
        ArgValue::NullHandle(size) => {
            let z = [0u8; 16];
            // SAFETY: `size` (≤ 16) zero bytes.
            unsafe { f(vk.cast(), i, *size, z.as_ptr().cast()) }
        }
        // SAFETY: a local size with no value.
        ArgValue::Local(size) => unsafe { f(vk.cast(), i, *size, std::ptr::null()) },
        ArgValue::Svm(p) => {
            // SAFETY: an SVM pointer.
            unsafe { vfn!(vk, clSetKernelArgSVMPointer)?(vk.cast(), i, *p as *const c_void) }
        }
    };
    check(rc)
}

#[inline(always)]
fn set_arg(k: cl_kernel, index: cl_uint, size: usize, value: *const c_void) -> ClResult<()> {
    let kernel = kernel_ref(k.cast())?;
    let i = index as usize;
    let Some(&kind) = kernel.arg_kinds.get(i) else {
        return Err(CL_INVALID_ARG_INDEX);
    };
    let vk = kernel.base.vendor();
    let f = vfn!(vk, clSetKernelArg)?;
    // The hot case, kept small (the rest is out of line): a buffer or image
    // argument given as a valid crane handle.
    if size == PTR && kind.is_mem() && !value.is_null() {
        // SAFETY: the application passes `size` readable bytes at `value`.
        let p = unsafe { value.cast::<*const c_void>().read_unaligned() };
        if let Some((m, slot)) = handle::get_with_slot::<Mem>(p) {
            let v = m.base.vendor();
            let record = ArgValue::Handle(slot, handle::generation(slot));
            // SAFETY: one vendor handle in place of crane's.
            check(unsafe { f(vk.cast(), index, size, (&raw const v).cast()) })?;
            // SAFETY: OpenCL makes clSetKernelArg non-reentrant per kernel, so
            // this thread is the only one touching the record now.
            let dst = unsafe { &mut kernel.args_mut()[i] };
            if dst.owns_memory() {
                *dst = record;
            } else {
                // SAFETY: the old value owns nothing, so overwriting it
                // without dropping it loses nothing.
                unsafe { std::ptr::write(dst, record) };
            }
            return Ok(());
        }
    }
    set_arg_other(kernel, index, kind, vk, f, size, value)
}

/// [`set_arg`] for every case but a valid memory object.
#[inline(never)]
fn set_arg_other(
    kernel: &Kernel,
    index: cl_uint,
    kind: ArgKind,
    vk: *mut c_void,
    f: unsafe extern "C" fn(cl_kernel, cl_uint, usize, *const c_void) -> cl_int,
    size: usize,
    value: *const c_void,
) -> ClResult<()> {
    let i = index as usize;
    let record;
    let rc = if value.is_null() {
        // A null value is a local-memory size, or for a memory object argument
        // a null buffer (recorded as such so that a resume sets it the same).
        let object = kind.is_mem() || matches!(kind, ArgKind::Sampler | ArgKind::Queue);
        record = if object && size == PTR {
            ArgValue::NullHandle(size)
        } else {
            ArgValue::Local(size)
        };
        // SAFETY: forwarding a local-memory size or null object (or the
        // vendor's error for it).
        unsafe { f(vk.cast(), index, size, value) }
    } else if size == PTR && !matches!(kind, ArgKind::Value | ArgKind::Local) {
        // SAFETY: the application passes `size` readable bytes at `value`.
        let p = unsafe { value.cast::<*const c_void>().read_unaligned() };
        if p.is_null() {
            record = ArgValue::NullHandle(size);
            // SAFETY: forwarding a null object.
            unsafe { f(vk.cast(), index, size, value) }
        } else if let Some((v, slot)) = handle_arg(p, kind) {
            record = ArgValue::Handle(slot, handle::generation(slot));
            // SAFETY: one vendor handle in place of crane's.
            unsafe { f(vk.cast(), index, size, (&raw const v).cast()) }
        } else if kind == ArgKind::Unknown {
            // SAFETY: the application's bytes.
            record = ArgValue::Bytes(unsafe { ArgBytes::copy_from(value.cast(), size) });
            // SAFETY: forwarding plain bytes.
            unsafe { f(vk.cast(), index, size, value) }
        } else {
            return Err(match kind {
                ArgKind::Sampler => CL_INVALID_SAMPLER,
                ArgKind::Queue => CL_INVALID_DEVICE_QUEUE,
                _ => CL_INVALID_MEM_OBJECT,
            });
        }
    } else {
        // SAFETY: the application passes `size` readable bytes.
        record = ArgValue::Bytes(unsafe { ArgBytes::copy_from(value.cast(), size) });
        // SAFETY: forwarding plain bytes.
        unsafe { f(vk.cast(), index, size, value) }
    };
    check(rc)?;
    // SAFETY: OpenCL makes clSetKernelArg non-reentrant per kernel, so this thread
    // is the only one touching the record now.
    unsafe { kernel.args_mut()[i] = record };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSetKernelArg(
    k: cl_kernel,
    index: cl_uint,
    size: usize,
    value: *const c_void,
) -> cl_int {
    entry::status(false, || set_arg(k, index, size, value))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSetKernelArgSVMPointer(
    k: cl_kernel,
    index: cl_uint,
    value: *const c_void,
) -> cl_int {
    entry::status(false, || {
        let kernel = kernel_ref(k.cast())?;
        let vk = kernel.base.vendor();
        if index as usize >= kernel.arg_kinds.len() {
            return Err(CL_INVALID_ARG_INDEX);
        }
        // SAFETY: forwarding the SVM pointer.
        check(unsafe { vfn!(vk, clSetKernelArgSVMPointer)?(vk.cast(), index, value) })?;
        // SAFETY: as in clSetKernelArg.
        unsafe { kernel.args_mut()[index as usize] = ArgValue::Svm(value as usize) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSetKernelExecInfo(
    k: cl_kernel,
    param: cl_kernel_exec_info,
    size: usize,
    value: *const c_void,
) -> cl_int {
    entry::status(false, || {
        let kernel = kernel_ref(k.cast())?;
        let vk = kernel.base.vendor();
        // The vendor judges the value (some take a null one); crane records
        // only what it accepted.
        // SAFETY: forwarding.
        check(unsafe { vfn!(vk, clSetKernelExecInfo)?(vk.cast(), param, size, value) })?;
        if value.is_null() {
            // Nothing to replay: the vendor took the call without data.
            return Ok(());
        }
        let bytes = entry::slice(value.cast::<u8>(), size, CL_INVALID_VALUE)?;
        kernel
            .exec_info
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((param, bytes.to_vec()));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetKernelInfo(
    k: cl_kernel,
    param: cl_kernel_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let kernel = kernel_ref(k.cast())?;
        match param {
            CL_KERNEL_CONTEXT => write_info(
                bytes_of(&kernel.program.context.base.handle::<c_void>()),
                size,
                value,
                size_ret,
            ),
            CL_KERNEL_PROGRAM => write_info(
                bytes_of(&kernel.program.base.handle::<c_void>()),
                size,
                value,
                size_ret,
            ),
            CL_KERNEL_REFERENCE_COUNT => {
                write_info(bytes_of(&kernel.base.app_refs()), size, value, size_ret)
            }
            // A program made from its kept executable: the attributes its
            // build from source gave (the vendor may have none now).
            CL_KERNEL_ATTRIBUTES if kernel.program.from_executable.load(Ordering::Relaxed) => {
                let kept = kernel
                    .program
                    .executables
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                // The executable in use is the last one.
                let attrs = kept
                    .last()
                    .and_then(|e| e.attributes_of(&kernel.name))
                    .unwrap_or(b"\0");
                write_info(attrs, size, value, size_ret)
            }
            _ => {
                let v = kernel.base.vendor();
                // SAFETY: forwarding.
                check(unsafe { vfn!(v, clGetKernelInfo)?(v.cast(), param, size, value, size_ret) })
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetKernelArgInfo(
    k: cl_kernel,
    index: cl_uint,
    param: cl_kernel_arg_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let kernel = kernel_ref(k.cast())?;
        // "CL_INVALID_ARG_INDEX if arg_indx is not a valid argument index."
        if index as usize >= kernel.arg_kinds.len() {
            return Err(CL_INVALID_ARG_INDEX);
        }
        // "CL_KERNEL_ARG_INFO_NOT_AVAILABLE if the argument information is not
        // available for kernel." crane builds every program with
        // -cl-kernel-arg-info for itself; what the application sees is what
        // its own options give.
        if kernel.program.arg_info_hidden() {
            return Err(CL_KERNEL_ARG_INFO_NOT_AVAILABLE);
        }
        let v = kernel.base.vendor();
        // SAFETY: forwarding.
        check(unsafe {
            vfn!(v, clGetKernelArgInfo)?(v.cast(), index, param, size, value, size_ret)
        })
    })
}

/// A null device is allowed when the kernel's program has one device.
fn optional_device(d: cl_device_id) -> ClResult<*mut c_void> {
    if d.is_null() {
        Ok(std::ptr::null_mut())
    } else {
        vendor_of::<Device>(d.cast(), CL_INVALID_DEVICE)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetKernelWorkGroupInfo(
    k: cl_kernel,
    d: cl_device_id,
    param: cl_kernel_work_group_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let v = vendor_of::<Kernel>(k.cast(), CL_INVALID_KERNEL)?;
        let vd = optional_device(d)?;
        // SAFETY: forwarding with the vendor device.
        check(unsafe {
            vfn!(v, clGetKernelWorkGroupInfo)?(v.cast(), vd.cast(), param, size, value, size_ret)
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetKernelSubGroupInfo(
    k: cl_kernel,
    d: cl_device_id,
    param: cl_kernel_sub_group_info,
    in_size: usize,
    input: *const c_void,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let v = vendor_of::<Kernel>(k.cast(), CL_INVALID_KERNEL)?;
        let vd = optional_device(d)?;
        // SAFETY: forwarding with the vendor device.
        check(unsafe {
            vfn!(v, clGetKernelSubGroupInfo)?(
                v.cast(),
                vd.cast(),
                param,
                in_size,
                input,
                size,
                value,
                size_ret,
            )
        })
    })
}

/// cl_khr_subgroups' query (OpenCL 2.0 vendors have only this one); the same
/// as clGetKernelSubGroupInfo, forwarded to whichever of the two the vendor
/// has.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetKernelSubGroupInfoKHR(
    k: cl_kernel,
    d: cl_device_id,
    param: cl_kernel_sub_group_info,
    in_size: usize,
    input: *const c_void,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let v = vendor_of::<Kernel>(k.cast(), CL_INVALID_KERNEL)?;
        let vd = optional_device(d)?;
        let f =
            vfn!(v, clGetKernelSubGroupInfoKHR).or_else(|_| vfn!(v, clGetKernelSubGroupInfo))?;
        // SAFETY: forwarding with the vendor device; both functions take the
        // same arguments.
        check(unsafe {
            f(
                v.cast(),
                vd.cast(),
                param,
                in_size,
                input,
                size,
                value,
                size_ret,
            )
        })
    })
}
