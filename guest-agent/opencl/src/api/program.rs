//! Programs: creation, build, compile, link, introspection.

use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use opencl_sys::*;

use super::*;
use crate::callbacks::{BuildNotify, PENDING_BUILDS, build_trampoline};
use crate::entry::{self, ClResult, bytes_of, bytes_of_slice, write_info};
use crate::handle::Base;
use crate::vendor::{check, vfn};

/// crane asks for kernel argument information on every build so that
/// clSetKernelArg knows each argument's kind without guessing.
const ARG_INFO: &str = "-cl-kernel-arg-info";

pub fn with_arg_info(options: &CStr) -> CString {
    let s = options.to_string_lossy();
    if s.split_whitespace().any(|w| w == ARG_INFO) {
        return options.to_owned();
    }
    CString::new(format!("{s} {ARG_INFO}")).expect("no interior NUL")
}

fn options_of(p: *const c_char) -> CString {
    if p.is_null() {
        return CString::default();
    }
    // SAFETY: OpenCL options are NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_owned()
}

fn new_program(context: Arc<Context>, source: ProgramSource) -> Program {
    Program {
        base: Base::new(std::ptr::null_mut()),
        context,
        source,
        steps: Mutex::new(Vec::new()),
        arg_info_hidden: AtomicBool::new(false),
        reported_binaries: Mutex::new(None),
        compiled: Mutex::new(None),
        executables: Mutex::new(Vec::new()),
        from_executable: AtomicBool::new(false),
        from_compiled: AtomicBool::new(false),
    }
}

/// A device's binary: crane's device, the vendor's, the bytes.
type DeviceBinary = (Arc<Device>, *mut c_void, Vec<u8>);

/// A vendor program's binaries with crane's device and the vendor's device
/// of each, if every device has a non-empty binary of type `want`.
fn binaries_of_type(
    p: &Program,
    v: *mut c_void,
    want: cl_program_binary_type,
) -> ClResult<Vec<DeviceBinary>> {
    let devices = program_info_vec(v, CL_PROGRAM_DEVICES, std::ptr::null_mut::<c_void>())?;
    let bins = vendor_binaries(v)?;
    let build_info = vfn!(v, clGetProgramBuildInfo)?;
    let mut out = Vec::new();
    for (vd, bin) in devices.into_iter().zip(bins) {
        let mut ty: cl_program_binary_type = 0;
        // SAFETY: one value of the queried type.
        check(unsafe {
            build_info(
                v.cast(),
                vd.cast(),
                CL_PROGRAM_BINARY_TYPE,
                size_of::<cl_program_binary_type>(),
                (&raw mut ty).cast(),
                std::ptr::null_mut(),
            )
        })?;
        match p.context.devices.iter().find(|d| d.base.vendor() == vd) {
            Some(d) if ty == want && !bin.is_empty() => {
                // A binary the vendor itself could not read back (PoCL's,
                // serialised while another process rewrote its cache:
                // `crane_vendor_loader::pocl_binary`) is not kept; the
                // program is built again from its source.
                if let Err(flaw) = crane_vendor_loader::pocl_binary::check(&bin, None) {
                    crate::config::debug!("a program's binary is not kept: {flaw}");
                    return Err(CL_INVALID_BINARY);
                }
                out.push((d.clone(), vd, bin))
            }
            _ => return Err(CL_INVALID_PROGRAM),
        }
    }
    Ok(out)
}

/// A vendor program's binaries of type `want` on every device, each with
/// the identity of the device it is for and its build log.
#[allow(clippy::type_complexity)]
fn binaries_and_logs(
    p: &Program,
    v: *mut c_void,
    want: cl_program_binary_type,
) -> ClResult<(Vec<(Arc<Device>, DeviceId, Vec<u8>)>, Vec<Vec<u8>>)> {
    let mut binaries = Vec::new();
    let mut logs = Vec::new();
    for (d, vd, bin) in binaries_of_type(p, v, want)? {
        let id = d.root().now();
        logs.push(build_log(v, vd)?);
        binaries.push((d, id, bin));
    }
    Ok((binaries, logs))
}

/// Suspend: keeps the compiled object of a program whose latest step is a
/// clCompileProgram that worked, for [`vendor_create_compiled`]. Anything
/// the vendor does not give leaves the program to be compiled again.
pub fn save_compiled(p: &Program) {
    let last_is_compile = matches!(
        p.steps.lock().unwrap_or_else(|e| e.into_inner()).last(),
        Some(BuildStep::Compile { .. })
    );
    let v = p.base.vendor();
    // Made from the kept object at an earlier resume: that one stays (PoCL
    // 3.1 does not give a program made from a binary its binary back, and
    // the log is the first compile's).
    if !last_is_compile || v.is_null() || p.from_compiled.load(Ordering::Relaxed) {
        return;
    }
    match binaries_and_logs(p, v, CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT) {
        Ok((binaries, logs)) => {
            *p.compiled.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(Compiled { binaries, logs })
        }
        Err(e) => crate::config::debug!("the compiled object of a program is not read: {e}"),
    }
}

/// Suspend: keeps the executable of a program built from source or IL (its
/// latest step a build that worked on every device), once per build, for
/// [`vendor_create_executable`]. Anything the vendor does not give leaves
/// the program to be compiled again.
pub fn save_executable(p: &Program) {
    if !matches!(p.source, ProgramSource::Source(_) | ProgramSource::Il(_)) {
        return;
    }
    let steps = {
        let steps = p.steps.lock().unwrap_or_else(|e| e.into_inner());
        if !matches!(steps.last(), Some(BuildStep::Build { .. })) {
            return;
        }
        steps.len()
    };
    let v = p.base.vendor();
    let mut kept = p.executables.lock().unwrap_or_else(|e| e.into_inner());
    // Kept for an older build: of no use any more.
    kept.retain(|e| e.steps == steps);
    if v.is_null() || kept.iter().any(is_current) || long_kernel_name(v) {
        return;
    }
    let saved =
        binaries_and_logs(p, v, CL_PROGRAM_BINARY_TYPE_EXECUTABLE).map(|(binaries, logs)| {
            Executable {
                steps,
                binaries,
                logs,
                attributes: kernel_attributes(v),
            }
        });
    match saved {
        Ok(e) => kept.push(e),
        Err(e) => crate::config::debug!("the executable of a program is not read: {e}"),
    }
}

/// Each kernel of vendor program `v` with its `CL_KERNEL_ATTRIBUTES`
/// (NUL-terminated), for the kernels the vendor makes and answers for;
/// those with no attributes are left out (a kernel not listed answers
/// the empty string).
fn kernel_attributes(v: *mut c_void) -> Vec<(CString, Vec<u8>)> {
    let Some(names) = crate::vendor::info_string(v, |d| {
        d.clGetProgramInfo.map(|f| (f, CL_PROGRAM_KERNEL_NAMES))
    }) else {
        return Vec::new();
    };
    let Ok(create) = vfn!(v, clCreateKernel) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in names.split(';').filter(|n| !n.is_empty()) {
        let Ok(name) = CString::new(name) else {
            continue;
        };
        let mut err = CL_SUCCESS;
        // SAFETY: a live vendor program and a NUL-terminated name.
        let k = unsafe { create(v.cast(), name.as_ptr(), &mut err) };
        if k.is_null() || err != CL_SUCCESS {
            continue;
        }
        let attrs = crate::vendor::info_string(k.cast(), |d| {
            d.clGetKernelInfo.map(|f| (f, CL_KERNEL_ATTRIBUTES))
        });
        // SAFETY: the kernel just made, not handed out.
        unsafe { crate::vendor::release(k.cast(), |t| t.clReleaseKernel) };
        if let Some(a) = attrs.filter(|a| !a.is_empty()) {
            let mut bytes = a.into_bytes();
            bytes.push(0);
            out.push((name, bytes));
        }
    }
    out
}

/// Kernel names longer than this keep a program from being made from its
/// kept executable: PoCL files a binary program's kernels under a longer
/// cache path than a program built from source, and asserts (aborting the
/// process) when a kernel's path passes its limit: the CTS's
/// `kernel_name_size`, whose kernel name is the longest allowed, crashed at
/// a move (docs/conformance.md). Such programs are built from source again.
const LONGEST_REUSED_KERNEL_NAME: usize = 128;

/// Whether vendor program `v` has a kernel whose name is longer than
/// [`LONGEST_REUSED_KERNEL_NAME`] (unknown: no).
fn long_kernel_name(v: *mut c_void) -> bool {
    crate::vendor::info_string(v, |d| {
        d.clGetProgramInfo.map(|f| (f, CL_PROGRAM_KERNEL_NAMES))
    })
    .is_some_and(|names| {
        names
            .split(';')
            .any(|n| n.len() > LONGEST_REUSED_KERNEL_NAME)
    })
}

/// Whether binaries are for the devices their program's devices are now.
fn all_current(binaries: &[(Arc<Device>, DeviceId, Vec<u8>)]) -> bool {
    binaries
        .iter()
        .all(|(d, id, _)| *d.root().now.lock().unwrap_or_else(|e| e.into_inner()) == *id)
}

/// Whether an executable is for the devices its program's devices are now.
fn is_current(e: &Executable) -> bool {
    all_current(&e.binaries)
}

/// Resume: the program made from the executable [`save_executable`] kept,
/// when every device it was built for is the same device with the same
/// driver now and no build came since; built with the options of its last
/// build (binaries ignore the compiler's). None: it is compiled again from
/// its source (also when the vendor refuses the binary, or would no longer
/// report its kernels' argument information).
/// Returns the program and the executable bytes it was made from.
pub fn vendor_create_executable(p: &Program) -> Option<(*mut c_void, u64)> {
    p.from_executable.store(false, Ordering::Relaxed);
    let mut all = p.executables.lock().unwrap_or_else(|e| e.into_inner());
    let i = all.iter().position(is_current)?;
    // The one in use goes last: its build log is the one answered.
    let kept = all.remove(i);
    all.push(kept.clone());
    drop(all);
    let last = {
        let steps = p.steps.lock().unwrap_or_else(|e| e.into_inner());
        if steps.len() != kept.steps {
            return None;
        }
        match steps.last()? {
            BuildStep::Build {
                options, arg_info, ..
            } => (options.clone(), *arg_info),
            _ => return None,
        }
    };
    let bins: DeviceBinaries = kept
        .binaries
        .iter()
        .map(|(d, _, b)| (d.clone(), b.clone()))
        .collect();
    let mut err = CL_SUCCESS;
    let v = create_from_binaries(p.context.base.vendor(), &bins, &mut err).ok()?;
    let built = !v.is_null()
        && err == CL_SUCCESS
        && replay_step(
            v,
            &BuildStep::Build {
                devices: bins.iter().map(|(d, _)| d.clone()).collect(),
                options: last.0,
                arg_info: last.1,
            },
        )
        .is_ok()
        && build_succeeded(v)
        && (!last.1 || arg_info_kept(v));
    if built {
        p.from_executable.store(true, Ordering::Relaxed);
        return Some((v, bins.iter().map(|(_, b)| b.len() as u64).sum()));
    }
    if !v.is_null() {
        // SAFETY: the program just made, not handed out.
        unsafe { crate::vendor::release(v, |t| t.clReleaseProgram) };
    }
    None
}

/// A device's build log of a vendor program, NUL-terminated.
fn build_log(v: *mut c_void, vd: *mut c_void) -> ClResult<Vec<u8>> {
    let f = vfn!(v, clGetProgramBuildInfo)?;
    let mut n = 0usize;
    // SAFETY: a size query.
    check(unsafe {
        f(
            v.cast(),
            vd.cast(),
            CL_PROGRAM_BUILD_LOG,
            0,
            std::ptr::null_mut(),
            &mut n,
        )
    })?;
    let mut log = vec![0u8; n.max(1)];
    // SAFETY: `log` holds at least n bytes.
    check(unsafe {
        f(
            v.cast(),
            vd.cast(),
            CL_PROGRAM_BUILD_LOG,
            n,
            log.as_mut_ptr().cast(),
            std::ptr::null_mut(),
        )
    })?;
    Ok(log)
}

/// Whether every device's build of a vendor program succeeded.
fn build_succeeded(v: *mut c_void) -> bool {
    let Ok(devices) = program_info_vec(v, CL_PROGRAM_DEVICES, std::ptr::null_mut::<c_void>())
    else {
        return false;
    };
    let Ok(build_info) = vfn!(v, clGetProgramBuildInfo) else {
        return false;
    };
    devices.into_iter().all(|vd| {
        let mut status: cl_build_status = CL_BUILD_NONE;
        // SAFETY: one value of the queried type.
        let rc = unsafe {
            build_info(
                v.cast(),
                vd.cast(),
                CL_PROGRAM_BUILD_STATUS,
                size_of::<cl_build_status>(),
                (&raw mut status).cast(),
                std::ptr::null_mut(),
            )
        };
        rc == CL_SUCCESS && status == CL_BUILD_SUCCESS
    })
}

/// Whether a program made from a binary still reports its kernels' argument
/// information (crane classifies arguments by it, and the application may
/// ask): checked on the first kernel that has arguments.
fn arg_info_kept(v: *mut c_void) -> bool {
    let Ok(create) = vfn!(v, clCreateKernelsInProgram) else {
        return false;
    };
    let mut n: cl_uint = 0;
    // SAFETY: a count query.
    if unsafe { create(v.cast(), 0, std::ptr::null_mut(), &mut n) } != CL_SUCCESS {
        return false;
    }
    let mut ks: Vec<cl_kernel> = vec![std::ptr::null_mut(); n as usize];
    // SAFETY: room for n kernels.
    if n > 0 && unsafe { create(v.cast(), n, ks.as_mut_ptr(), std::ptr::null_mut()) } != CL_SUCCESS
    {
        return false;
    }
    let mut ok = true;
    for &k in &ks {
        let args: Option<cl_uint> = kernel_info_value(k.cast(), CL_KERNEL_NUM_ARGS);
        if args.unwrap_or(0) > 0 {
            ok = super::kernel::arg_info::<cl_kernel_arg_address_qualifier>(
                k.cast(),
                0,
                CL_KERNEL_ARG_ADDRESS_QUALIFIER,
            )
            .is_some();
            break;
        }
    }
    for k in ks {
        // SAFETY: kernels made above, not handed out.
        unsafe { crate::vendor::release(k.cast(), |t| t.clReleaseKernel) };
    }
    ok
}

fn kernel_info_value<T: Copy + Default>(k: *mut c_void, param: cl_kernel_info) -> Option<T> {
    let f = vfn!(k, clGetKernelInfo).ok()?;
    let mut out = T::default();
    // SAFETY: one value of the queried type.
    (unsafe {
        f(
            k.cast(),
            param,
            size_of::<T>(),
            (&raw mut out).cast(),
            std::ptr::null_mut(),
        )
    } == CL_SUCCESS)
        .then_some(out)
}

/// Whether `p`, made from source, can be compiled again as it was: every
/// include of its source resolves with its compile steps' options and
/// embedded headers (the CTS removes its include directories after
/// compiling; a compile that cannot find them fails, and PoCL 3.1 then
/// aborts).
pub fn recompilable(p: &Program) -> bool {
    let ProgramSource::Source(src) = &p.source else {
        return false;
    };
    let src = String::from_utf8_lossy(src);
    let steps = p.steps.lock().unwrap_or_else(|e| e.into_inner());
    steps.iter().all(|step| match step {
        BuildStep::Compile {
            options, headers, ..
        } => {
            let embedded: Vec<(String, String)> = headers
                .iter()
                .filter_map(|(h, name)| match &h.source {
                    ProgramSource::Source(s) => Some((
                        name.to_string_lossy().into_owned(),
                        String::from_utf8_lossy(s).into_owned(),
                    )),
                    _ => None,
                })
                .collect();
            crate::remote::includes::all_resolvable(&src, &options.to_string_lossy(), &embedded)
        }
        BuildStep::Build { options, .. } => {
            crate::remote::includes::all_resolvable(&src, &options.to_string_lossy(), &[])
        }
        BuildStep::SpecConstant { .. } => true,
    })
}

/// Whether the compiled object [`save_compiled`] kept is for the devices
/// the program's devices are now (the same devices and drivers).
pub fn compiled_is_current(p: &Program) -> bool {
    p.compiled
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|c| all_current(&c.binaries))
}

/// Resume: the program made from the compiled object [`save_compiled`]
/// kept, or None (then it is made and compiled again from its source), with
/// the bytes it was made from.
pub fn vendor_create_compiled(p: &Program) -> Option<(*mut c_void, u64)> {
    let bins: DeviceBinaries = p
        .compiled
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()?
        .binaries
        .iter()
        .map(|(d, _, b)| (d.clone(), b.clone()))
        .collect();
    let mut err = CL_SUCCESS;
    let v = create_from_binaries(p.context.base.vendor(), &bins, &mut err).ok()?;
    if err == CL_SUCCESS && !v.is_null() {
        p.from_compiled.store(true, Ordering::Relaxed);
        return Some((v, bins.iter().map(|(_, b)| b.len() as u64).sum()));
    }
    if !v.is_null() {
        // SAFETY: the program just made, not handed out.
        unsafe { crate::vendor::release(v, |t| t.clReleaseProgram) };
    }
    None
}

/// Before the application compiles or builds a program that a resume made
/// from its kept compiled object or executable (or names it as a header):
/// the program is made from its source again, with its specialization
/// constants, since a program made from a binary cannot be compiled, and
/// builds the binary rather than the source with new options (the CTS's
/// `options_build_macro_existence` builds a program twice, with and without
/// a macro; PoCL aborted on the second build after a resume). Not while the
/// program has kernels: the vendor refuses that build as it would have
/// natively. Nothing else holds the vendor object then (a link consumed
/// it).
fn back_to_source(p: &Program) -> ClResult<()> {
    let from_binary =
        p.from_compiled.load(Ordering::Acquire) || p.from_executable.load(Ordering::Acquire);
    if !from_binary
        || !matches!(p.source, ProgramSource::Source(_) | ProgramSource::Il(_))
        || handle::live::<Kernel>()
            .iter()
            .any(|k| std::ptr::eq(Arc::as_ptr(&k.program), p))
    {
        return Ok(());
    }
    let v = vendor_create(p)?;
    let constants = p
        .steps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|s| matches!(s, BuildStep::SpecConstant { .. }))
        .try_for_each(|s| replay_step(v, s));
    if let Err(e) = constants {
        // SAFETY: the program just made, not handed out.
        unsafe { crate::vendor::release(v, |t| t.clReleaseProgram) };
        return Err(e);
    }
    let old = p.base.take_vendor();
    p.base.set_vendor(v);
    p.from_compiled.store(false, Ordering::Release);
    p.from_executable.store(false, Ordering::Release);
    // SAFETY: the vendor program made from the binary, replaced above.
    unsafe { crate::vendor::release(old, |t| t.clReleaseProgram) };
    Ok(())
}

/// A vendor program's answer to `param` as an array of `T` (a size query,
/// then the values; `fill` only initialises the array).
fn program_info_vec<T: Copy>(v: *mut c_void, param: cl_program_info, fill: T) -> ClResult<Vec<T>> {
    let f = vfn!(v, clGetProgramInfo)?;
    let mut n = 0usize;
    // SAFETY: a size query.
    check(unsafe { f(v.cast(), param, 0, std::ptr::null_mut(), &mut n) })?;
    let mut out = vec![fill; n / size_of::<T>()];
    // SAFETY: `out` holds at most `n` bytes, all of them written by the vendor.
    check(unsafe {
        f(
            v.cast(),
            param,
            out.len() * size_of::<T>(),
            out.as_mut_ptr().cast(),
            std::ptr::null_mut(),
        )
    })?;
    Ok(out)
}

/// The vendor program's binaries, one per device (empty where it has none).
fn vendor_binaries(v: *mut c_void) -> ClResult<Vec<Vec<u8>>> {
    let f = vfn!(v, clGetProgramInfo)?;
    let sizes = program_info_vec(v, CL_PROGRAM_BINARY_SIZES, 0usize)?;
    let mut bins: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0u8; s]).collect();
    let mut ptrs: Vec<*mut u8> = bins
        .iter_mut()
        .map(|b| {
            if b.is_empty() {
                std::ptr::null_mut()
            } else {
                b.as_mut_ptr()
            }
        })
        .collect();
    // SAFETY: one buffer of the reported size per device (the gate is held,
    // so no suspend rebuilds the program between the two queries).
    check(unsafe {
        f(
            v.cast(),
            CL_PROGRAM_BINARIES,
            ptrs.len() * size_of::<*mut u8>(),
            ptrs.as_mut_ptr().cast(),
            std::ptr::null_mut(),
        )
    })?;
    Ok(bins)
}

/// The program's binaries, one per device of the vendor program: those of
/// the compiled object it was made from at a resume (PoCL 3.1 gives none
/// for a program made from a binary: the CTS's
/// execute_after_serialize_reload_object failed with CL_INVALID_PROGRAM
/// after a move), else the vendor's.
fn binaries_now(p: &Program, v: *mut c_void) -> ClResult<Vec<Vec<u8>>> {
    if p.from_compiled.load(Ordering::Acquire)
        && let Some(c) = p
            .compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
    {
        let devices = program_info_vec(v, CL_PROGRAM_DEVICES, std::ptr::null_mut::<c_void>())?;
        return Ok(devices
            .iter()
            .map(|&vd| {
                c.binaries
                    .iter()
                    .find(|(d, _, _)| d.base.vendor() == vd)
                    .map(|(_, _, b)| b.clone())
                    .unwrap_or_default()
            })
            .collect());
    }
    vendor_binaries(v)
}

/// Whether the application's options leave kernel argument information out.
/// "Kernel argument information is only available if the program object
/// associated with kernel is created with clCreateProgramWithSource and the
/// program executable was built with the -cl-kernel-arg-info option": options
/// given without it hide the information, as natively; no options at all leave
/// it to the vendor, which (PoCL) then reports it.
fn hides_arg_info(options: *const c_char) -> bool {
    !options.is_null() && !options_of(options).to_string_lossy().contains(ARG_INFO)
}

/// Creates the vendor program from what crane recorded (resume). Binaries saved
/// at suspend are preferred: they skip the compiler.
pub fn vendor_create(p: &Program) -> ClResult<*mut c_void> {
    let vc = p.context.base.vendor();
    let mut err = CL_SUCCESS;
    let v: *mut c_void = match &p.source {
        ProgramSource::Source(src) => {
            let s = src.as_ptr().cast::<c_char>();
            let len = src.len();
            // SAFETY: one string of `len` bytes.
            unsafe {
                vfn!(vc, clCreateProgramWithSource)?(vc.cast(), 1, &mut { s }, &len, &mut err)
            }
            .cast()
        }
        ProgramSource::Il(il) => {
            // SAFETY: the IL bytes.
            unsafe {
                vfn!(vc, clCreateProgramWithIL)?(vc.cast(), il.as_ptr().cast(), il.len(), &mut err)
            }
            .cast()
        }
        ProgramSource::Binaries(bins) => create_from_binaries(vc, bins, &mut err)?,
        ProgramSource::BuiltIn(devs, names) => {
            let vd: Vec<cl_device_id> = devs.iter().map(|d| d.base.vendor().cast()).collect();
            // SAFETY: vendor devices and a NUL-terminated name list.
            unsafe {
                vfn!(vc, clCreateProgramWithBuiltInKernels)?(
                    vc.cast(),
                    vd.len() as cl_uint,
                    vd.as_ptr(),
                    names.as_ptr(),
                    &mut err,
                )
            }
            .cast()
        }
        ProgramSource::Linked {
            devices,
            options,
            inputs,
        } => {
            let vd: Vec<cl_device_id> = devices.iter().map(|d| d.base.vendor().cast()).collect();
            let vi: Vec<cl_program> = inputs.iter().map(|i| i.base.vendor().cast()).collect();
            let opts = with_arg_info(options);
            // SAFETY: vendor objects; no callback (resume is synchronous).
            unsafe {
                vfn!(vc, clLinkProgram)?(
                    vc.cast(),
                    vd.len() as cl_uint,
                    if vd.is_empty() {
                        std::ptr::null()
                    } else {
                        vd.as_ptr()
                    },
                    opts.as_ptr(),
                    vi.len() as cl_uint,
                    vi.as_ptr(),
                    None,
                    std::ptr::null_mut(),
                    &mut err,
                )
            }
            .cast()
        }
    };
    check(err)?;
    Ok(v)
}

fn create_from_binaries(
    vc: *mut c_void,
    bins: &[(Arc<Device>, Vec<u8>)],
    err: &mut cl_int,
) -> ClResult<*mut c_void> {
    let vd: Vec<cl_device_id> = bins.iter().map(|(d, _)| d.base.vendor().cast()).collect();
    let lens: Vec<usize> = bins.iter().map(|(_, b)| b.len()).collect();
    let mut ptrs: Vec<*const u8> = bins.iter().map(|(_, b)| b.as_ptr()).collect();
    // SAFETY: parallel arrays of devices and binaries.
    Ok(unsafe {
        vfn!(vc, clCreateProgramWithBinary)?(
            vc.cast(),
            vd.len() as cl_uint,
            vd.as_ptr(),
            lens.as_ptr(),
            ptrs.as_mut_ptr(),
            std::ptr::null_mut(),
            err,
        )
    }
    .cast())
}

/// Replays one build step on the vendor program (resume).
pub fn replay_step(v: *mut c_void, step: &BuildStep) -> ClResult<()> {
    match step {
        BuildStep::Build {
            devices,
            options,
            arg_info,
        } => {
            let vd: Vec<cl_device_id> = devices.iter().map(|d| d.base.vendor().cast()).collect();
            let o = if *arg_info {
                with_arg_info(options)
            } else {
                options.clone()
            };
            // SAFETY: vendor program and devices.
            let rc = unsafe {
                vfn!(v, clBuildProgram)?(
                    v.cast(),
                    vd.len() as cl_uint,
                    if vd.is_empty() {
                        std::ptr::null()
                    } else {
                        vd.as_ptr()
                    },
                    o.as_ptr(),
                    None,
                    std::ptr::null_mut(),
                )
            };
            // A build that failed before fails again; its log is what the app saw.
            if rc != CL_BUILD_PROGRAM_FAILURE {
                check(rc)
            } else {
                Ok(())
            }
        }
        BuildStep::Compile {
            devices,
            options,
            headers,
        } => {
            let vd: Vec<cl_device_id> = devices.iter().map(|d| d.base.vendor().cast()).collect();
            let vh: Vec<cl_program> = headers
                .iter()
                .map(|(h, _)| h.base.vendor().cast())
                .collect();
            let mut names: Vec<*const c_char> = headers.iter().map(|(_, n)| n.as_ptr()).collect();
            let o = with_arg_info(options);
            // SAFETY: vendor objects and parallel header arrays.
            let rc = unsafe {
                vfn!(v, clCompileProgram)?(
                    v.cast(),
                    vd.len() as cl_uint,
                    if vd.is_empty() {
                        std::ptr::null()
                    } else {
                        vd.as_ptr()
                    },
                    o.as_ptr(),
                    vh.len() as cl_uint,
                    if vh.is_empty() {
                        std::ptr::null()
                    } else {
                        vh.as_ptr()
                    },
                    if names.is_empty() {
                        std::ptr::null_mut()
                    } else {
                        names.as_mut_ptr()
                    },
                    None,
                    std::ptr::null_mut(),
                )
            };
            if rc != CL_COMPILE_PROGRAM_FAILURE {
                check(rc)
            } else {
                Ok(())
            }
        }
        BuildStep::SpecConstant { id, value } => {
            // SAFETY: vendor program and the recorded value.
            check(unsafe {
                vfn!(v, clSetProgramSpecializationConstant)?(
                    v.cast(),
                    *id,
                    value.len(),
                    value.as_ptr().cast(),
                )
            })
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateProgramWithSource(
    c: cl_context,
    count: cl_uint,
    strings: *mut *const c_char,
    lengths: *const usize,
    errcode_ret: *mut cl_int,
) -> cl_program {
    entry::object(errcode_ret, || {
        let context = arc_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
        let strs = entry::slice(strings.cast_const(), count as usize, CL_INVALID_VALUE)?;
        if strs.is_empty() {
            return Err(CL_INVALID_VALUE);
        }
        let mut src = Vec::new();
        for (i, &s) in strs.iter().enumerate() {
            if s.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: `lengths` is null or holds `count` entries.
            let len = if lengths.is_null() {
                0
            } else {
                // SAFETY: `lengths` is non-null and holds `count` entries.
                unsafe { *lengths.add(i) }
            };
            if len == 0 {
                // SAFETY: a NUL-terminated string.
                src.extend_from_slice(unsafe { CStr::from_ptr(s) }.to_bytes());
            } else {
                // SAFETY: `len` bytes at `s`.
                src.extend_from_slice(unsafe { std::slice::from_raw_parts(s.cast::<u8>(), len) });
            }
        }
        let p = new_program(context, ProgramSource::Source(src));
        p.base.set_vendor(vendor_create(&p)?);
        Ok(publish(Arc::new(p)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateProgramWithIL(
    c: cl_context,
    il: *const c_void,
    len: usize,
    errcode_ret: *mut cl_int,
) -> cl_program {
    entry::object(errcode_ret, || {
        let context = arc_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
        let bytes = entry::slice(il.cast::<u8>(), len, CL_INVALID_VALUE)?;
        if bytes.is_empty() {
            return Err(CL_INVALID_VALUE);
        }
        let p = new_program(context, ProgramSource::Il(bytes.to_vec()));
        p.base.set_vendor(vendor_create(&p)?);
        Ok(publish(Arc::new(p)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateProgramWithBinary(
    c: cl_context,
    n: cl_uint,
    devices: *const cl_device_id,
    lengths: *const usize,
    binaries: *mut *const u8,
    binary_status: *mut cl_int,
    errcode_ret: *mut cl_int,
) -> cl_program {
    entry::object(errcode_ret, || {
        let context = arc_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
        let (vd, devs) = devices_of(n, devices)?;
        if devs.is_empty() {
            return Err(CL_INVALID_VALUE);
        }
        let lens = entry::slice(lengths, n as usize, CL_INVALID_VALUE)?;
        let bins = entry::slice(binaries.cast_const(), n as usize, CL_INVALID_VALUE)?;
        let mut recorded = Vec::new();
        for i in 0..n as usize {
            let b = entry::slice(bins[i], lens[i], CL_INVALID_VALUE)?;
            if b.is_empty() {
                return Err(CL_INVALID_VALUE);
            }
            recorded.push((devs[i].clone(), b.to_vec()));
        }
        let vc = context.base.vendor();
        let mut err = CL_SUCCESS;
        // SAFETY: forwarding the application's arrays with vendor devices.
        let v = unsafe {
            vfn!(vc, clCreateProgramWithBinary)?(
                vc.cast(),
                n,
                vd.as_ptr(),
                lengths,
                binaries,
                binary_status,
                &mut err,
            )
        };
        check(err)?;
        let p = new_program(context, ProgramSource::Binaries(recorded));
        p.base.set_vendor(v.cast());
        Ok(publish(Arc::new(p)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateProgramWithBuiltInKernels(
    c: cl_context,
    n: cl_uint,
    devices: *const cl_device_id,
    names: *const c_char,
    errcode_ret: *mut cl_int,
) -> cl_program {
    entry::object(errcode_ret, || {
        let context = arc_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
        let (_, devs) = devices_of(n, devices)?;
        if names.is_null() || devs.is_empty() {
            return Err(CL_INVALID_VALUE);
        }
        let p = new_program(context, ProgramSource::BuiltIn(devs, options_of(names)));
        p.base.set_vendor(vendor_create(&p)?);
        Ok(publish(Arc::new(p)))
    })
}

type BuildCb = Option<unsafe extern "C" fn(cl_program, *mut c_void)>;

/// The vendor-facing callback and user data for an application callback.
fn build_notify(f: BuildCb, user_data: *mut c_void, handle: usize) -> (BuildCb, *mut c_void) {
    match f {
        None => (None, std::ptr::null_mut()),
        Some(func) => {
            PENDING_BUILDS.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            let b = Box::new(BuildNotify {
                func,
                user_data: user_data as usize,
                handle,
            });
            (Some(build_trampoline), Box::into_raw(b).cast())
        }
    }
}

fn undo_notify(cb: BuildCb, ud: *mut c_void) {
    if cb.is_some() {
        // SAFETY: the vendor refused and will not call back; reclaim the box.
        drop(unsafe { Box::from_raw(ud.cast::<BuildNotify>()) });
        PENDING_BUILDS.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

fn records_step(rc: cl_int) -> bool {
    rc == CL_SUCCESS || rc == CL_BUILD_PROGRAM_FAILURE || rc == CL_COMPILE_PROGRAM_FAILURE
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clBuildProgram(
    p: cl_program,
    n: cl_uint,
    devices: *const cl_device_id,
    options: *const c_char,
    f: BuildCb,
    user_data: *mut c_void,
) -> cl_int {
    entry::status(false, || {
        let prog = program_ref(p.cast())?;
        if f.is_none() && !user_data.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let (vd, devs) = devices_of(n, devices)?;
        back_to_source(prog)?;
        let opts = options_of(options);
        let vopts = with_arg_info(&opts);
        let added = vopts != opts;
        let v = prog.base.vendor();
        let vd_ptr = if vd.is_empty() {
            std::ptr::null()
        } else {
            vd.as_ptr()
        };
        let build = |o: &CStr, cb: BuildCb, ud: *mut c_void| -> ClResult<cl_int> {
            // SAFETY: vendor program and devices; `ud` is what `cb` expects.
            Ok(unsafe { vfn!(v, clBuildProgram)?(v.cast(), n, vd_ptr, o.as_ptr(), cb, ud) })
        };
        // A build that fails only because of the option crane added is built
        // again with the application's own options (see BuildStep::Build),
        // so that crane never turns a valid build into a failure. The retry
        // needs the first build's outcome, so where crane added the option
        // the build is synchronous and the application's callback is called
        // from here once it is done (the specification lets clBuildProgram
        // wait for the build).
        let (rc, arg_info) = if added {
            let first = if crate::fault::arg_info_build_fails() {
                CL_BUILD_PROGRAM_FAILURE
            } else {
                build(&vopts, None, std::ptr::null_mut())?
            };
            if first == CL_BUILD_PROGRAM_FAILURE {
                let second = build(&opts, None, std::ptr::null_mut())?;
                (second, second != CL_SUCCESS)
            } else {
                (first, true)
            }
        } else {
            let (cb, ud) = build_notify(f, user_data, p as usize);
            let rc = build(&vopts, cb, ud)?;
            if rc != CL_SUCCESS && rc != CL_BUILD_PROGRAM_FAILURE {
                undo_notify(cb, ud);
            }
            (rc, true)
        };
        if records_step(rc) {
            prog.arg_info_hidden
                .store(hides_arg_info(options), Ordering::Relaxed);
            prog.steps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(BuildStep::Build {
                    devices: devs,
                    options: opts,
                    arg_info,
                });
            *prog.compiled.lock().unwrap_or_else(|e| e.into_inner()) = None;
            prog.from_executable.store(false, Ordering::Relaxed);
        }
        if added && records_step(rc) {
            let (cb, ud) = build_notify(f, user_data, p as usize);
            if cb.is_some() {
                // SAFETY: `ud` is the box build_notify just made for this
                // call; the trampoline takes it back.
                unsafe { crate::callbacks::build_trampoline(v.cast(), ud) };
            }
        }
        check(rc)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCompileProgram(
    p: cl_program,
    n: cl_uint,
    devices: *const cl_device_id,
    options: *const c_char,
    n_headers: cl_uint,
    headers: *const cl_program,
    header_names: *mut *const c_char,
    f: BuildCb,
    user_data: *mut c_void,
) -> cl_int {
    entry::status(false, || {
        let prog = program_ref(p.cast())?;
        if f.is_none() && !user_data.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let (vd, devs) = devices_of(n, devices)?;
        let hs = entry::slice(headers, n_headers as usize, CL_INVALID_VALUE)?;
        let hn = entry::slice(
            header_names.cast_const(),
            n_headers as usize,
            CL_INVALID_VALUE,
        )?;
        back_to_source(prog)?;
        let mut vh = Vec::new();
        let mut recorded = Vec::new();
        for (&h, &name) in hs.iter().zip(hn) {
            let hp = arc_of::<Program>(h.cast(), CL_INVALID_PROGRAM)?;
            back_to_source(&hp)?;
            vh.push(hp.base.vendor().cast());
            recorded.push((hp, options_of(name)));
        }
        let opts = options_of(options);
        let vopts = with_arg_info(&opts);
        let (cb, ud) = build_notify(f, user_data, p as usize);
        let v = prog.base.vendor();
        // SAFETY: vendor objects and the application's header names.
        let rc = unsafe {
            vfn!(v, clCompileProgram)?(
                v.cast(),
                n,
                if vd.is_empty() {
                    std::ptr::null()
                } else {
                    vd.as_ptr()
                },
                vopts.as_ptr(),
                n_headers,
                if vh.is_empty() {
                    std::ptr::null()
                } else {
                    vh.as_ptr()
                },
                header_names,
                cb,
                ud,
            )
        };
        if rc != CL_SUCCESS && rc != CL_COMPILE_PROGRAM_FAILURE {
            undo_notify(cb, ud);
        }
        if records_step(rc) {
            prog.arg_info_hidden
                .store(hides_arg_info(options), Ordering::Relaxed);
            prog.steps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(BuildStep::Compile {
                    devices: devs,
                    options: opts,
                    headers: recorded,
                });
            // What an earlier suspend kept is not this compile's object.
            *prog.compiled.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        check(rc)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clLinkProgram(
    c: cl_context,
    n: cl_uint,
    devices: *const cl_device_id,
    options: *const c_char,
    n_inputs: cl_uint,
    inputs: *const cl_program,
    f: BuildCb,
    user_data: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_program {
    entry::object(errcode_ret, || {
        let context = arc_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
        if f.is_none() && !user_data.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let (vd, devs) = devices_of(n, devices)?;
        let ins = entry::slice(inputs, n_inputs as usize, CL_INVALID_VALUE)?;
        if ins.is_empty() {
            return Err(CL_INVALID_VALUE);
        }
        let mut vi = Vec::new();
        let mut recorded = Vec::new();
        for &i in ins {
            let ip = arc_of::<Program>(i.cast(), CL_INVALID_PROGRAM)?;
            vi.push(ip.base.vendor().cast());
            recorded.push(ip);
        }
        let opts = options_of(options);
        let vopts = with_arg_info(&opts);
        let prog = Arc::new(new_program(
            context.clone(),
            ProgramSource::Linked {
                devices: devs,
                options: opts,
                inputs: recorded,
            },
        ));
        prog.arg_info_hidden
            .store(hides_arg_info(options), Ordering::Relaxed);
        let h: cl_program = publish(prog.clone());
        let (cb, ud) = build_notify(f, user_data, h as usize);
        let vc = context.base.vendor();
        let mut err = CL_SUCCESS;
        // SAFETY: vendor objects.
        let v = unsafe {
            vfn!(vc, clLinkProgram)?(
                vc.cast(),
                n,
                if vd.is_empty() {
                    std::ptr::null()
                } else {
                    vd.as_ptr()
                },
                vopts.as_ptr(),
                n_inputs,
                vi.as_ptr(),
                cb,
                ud,
                &mut err,
            )
        };
        if v.is_null() {
            undo_notify(cb, ud);
            handle::app_release(&*prog);
            return Err(if err == CL_SUCCESS {
                CL_LINK_PROGRAM_FAILURE
            } else {
                err
            });
        }
        prog.base.set_vendor(v.cast());
        // OpenCL returns a program object even when linking failed (its log says
        // why); so does crane.
        Ok(h)
    })
}

/// Whether a vendor device takes intermediate-language programs: its
/// CL_DEVICE_IL_VERSION is a non-empty string (devices before OpenCL 2.1 do
/// not know the query).
fn takes_il(vd: *mut c_void) -> bool {
    let Ok(f) = vfn!(vd, clGetDeviceInfo) else {
        return false;
    };
    let mut size = 0usize;
    // SAFETY: a size query on a live vendor device.
    let rc = unsafe {
        f(
            vd.cast(),
            CL_DEVICE_IL_VERSION,
            0,
            std::ptr::null_mut(),
            &mut size,
        )
    };
    rc == CL_SUCCESS && size > 1
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSetProgramSpecializationConstant(
    p: cl_program,
    id: cl_uint,
    size: usize,
    value: *const c_void,
) -> cl_int {
    entry::status(false, || {
        let prog = program_ref(p.cast())?;
        // "CL_INVALID_PROGRAM if program is not a valid program object created
        // from an intermediate language (e.g. SPIR-V)." Checked here: a vendor
        // may not expect the call on other programs (PoCL asserts).
        // "CL_INVALID_OPERATION if no devices associated with program support
        // intermediate language programs" comes first: that is what the CTS
        // (consistency_il_programs) asks of a device without IL and what
        // NVIDIA answers natively.
        if !matches!(prog.source, ProgramSource::Il(_)) {
            let il = prog
                .context
                .devices
                .iter()
                .any(|d| takes_il(d.base.vendor()));
            return Err(if il {
                CL_INVALID_PROGRAM
            } else {
                CL_INVALID_OPERATION
            });
        }
        // "CL_INVALID_VALUE if spec_value is NULL".
        if value.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let bytes = entry::slice(value.cast::<u8>(), size, CL_INVALID_VALUE)?;
        let v = prog.base.vendor();
        // SAFETY: forwarding.
        check(unsafe { vfn!(v, clSetProgramSpecializationConstant)?(v.cast(), id, size, value) })?;
        prog.steps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(BuildStep::SpecConstant {
                id,
                value: bytes.to_vec(),
            });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSetProgramReleaseCallback(
    p: cl_program,
    _f: BuildCb,
    _user_data: *mut c_void,
) -> cl_int {
    // Deprecated in OpenCL 2.2 and allowed to fail with CL_INVALID_OPERATION;
    // crane cannot keep its timing across a suspend.
    entry::status(false, || {
        program_ref(p.cast())?;
        Err(CL_INVALID_OPERATION)
    })
}

/// Vendor devices to crane devices, for introspection results.
fn crane_devices(vds: &[cl_device_id], ctx: &Context) -> Vec<*mut c_void> {
    vds.iter()
        .map(|&vd| {
            ctx.devices
                .iter()
                .find(|d| d.base.vendor() == vd.cast())
                .map_or(std::ptr::null_mut(), |d| d.base.handle())
        })
        .collect()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetProgramInfo(
    p: cl_program,
    param: cl_program_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let prog = program_ref(p.cast())?;
        let v = prog.base.vendor();
        match param {
            CL_PROGRAM_CONTEXT => write_info(
                bytes_of(&prog.context.base.handle::<c_void>()),
                size,
                value,
                size_ret,
            ),
            CL_PROGRAM_REFERENCE_COUNT => {
                write_info(bytes_of(&prog.base.app_refs()), size, value, size_ret)
            }
            CL_PROGRAM_DEVICES => {
                let vds: Vec<cl_device_id> = program_info_vec(v, param, std::ptr::null_mut())?;
                write_info(
                    bytes_of_slice(&crane_devices(&vds, &prog.context)),
                    size,
                    value,
                    size_ret,
                )
            }
            CL_PROGRAM_BINARY_SIZES => {
                let bins = binaries_now(prog, v)?;
                let sizes: Vec<usize> = bins.iter().map(Vec::len).collect();
                write_info(bytes_of_slice(&sizes), size, value, size_ret)?;
                *prog
                    .reported_binaries
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(bins);
                Ok(())
            }
            CL_PROGRAM_BINARIES => {
                let mut reported = prog
                    .reported_binaries
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let bins = match reported.as_ref() {
                    Some(b) => b,
                    None => reported.insert(binaries_now(prog, v)?),
                };
                let need = bins.len() * size_of::<*mut u8>();
                if !value.is_null() {
                    if size < need {
                        return Err(CL_INVALID_VALUE);
                    }
                    // SAFETY: the application passes an array of `size`
                    // bytes of pointers, checked to cover one per device.
                    let dsts =
                        unsafe { std::slice::from_raw_parts(value.cast::<*mut u8>(), bins.len()) };
                    for (&d, b) in dsts.iter().zip(bins.iter()) {
                        if !d.is_null() {
                            // SAFETY: the application sized each buffer from
                            // CL_PROGRAM_BINARY_SIZES, which reported `b`'s
                            // length (or, never asked, the vendor's now).
                            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), d, b.len()) };
                        }
                    }
                }
                if !size_ret.is_null() {
                    // SAFETY: OpenCL lets size_ret be null or writable.
                    unsafe { size_ret.write(need) };
                }
                Ok(())
            }
            CL_PROGRAM_SOURCE => match &prog.source {
                ProgramSource::Source(s) => {
                    let mut z = s.clone();
                    z.push(0);
                    write_info(&z, size, value, size_ret)
                }
                // SAFETY: forwarding.
                _ => check(unsafe {
                    vfn!(v, clGetProgramInfo)?(v.cast(), param, size, value, size_ret)
                }),
            },
            // A program made again from its kept executable has no IL of
            // its own any more: the application's is answered.
            CL_PROGRAM_IL => match &prog.source {
                ProgramSource::Il(il) => write_info(il, size, value, size_ret),
                // SAFETY: forwarding.
                _ => check(unsafe {
                    vfn!(v, clGetProgramInfo)?(v.cast(), param, size, value, size_ret)
                }),
            },
            _ => {
                // SAFETY: forwarding.
                check(unsafe { vfn!(v, clGetProgramInfo)?(v.cast(), param, size, value, size_ret) })
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetProgramBuildInfo(
    p: cl_program,
    d: cl_device_id,
    param: cl_program_build_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let prog = program_ref(p.cast())?;
        let vd = vendor_of::<Device>(d.cast(), CL_INVALID_DEVICE)?;
        if param == CL_PROGRAM_BUILD_OPTIONS {
            let steps = prog.steps.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(o) = steps.iter().rev().find_map(BuildStep::options) {
                return write_info(o.as_bytes_with_nul(), size, value, size_ret);
            }
        }
        // Made from a kept compiled object (the vendor saw no compile) or
        // executable: the log kept with it, and a compile that succeeded.
        if prog.from_compiled.load(Ordering::Relaxed) {
            let kept = prog.compiled.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(log) = kept
                .as_ref()
                .and_then(|c| kept_log(&c.binaries, &c.logs, vd))
            {
                match param {
                    CL_PROGRAM_BUILD_LOG => return write_info(log, size, value, size_ret),
                    CL_PROGRAM_BUILD_STATUS => {
                        return write_info(bytes_of(&CL_BUILD_SUCCESS), size, value, size_ret);
                    }
                    _ => {}
                }
            }
        }
        if param == CL_PROGRAM_BUILD_LOG && prog.from_executable.load(Ordering::Relaxed) {
            let kept = prog.executables.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(log) = kept.last().and_then(|e| kept_log(&e.binaries, &e.logs, vd)) {
                return write_info(log, size, value, size_ret);
            }
        }
        let v = prog.base.vendor();
        // SAFETY: forwarding with the vendor device.
        check(unsafe {
            vfn!(v, clGetProgramBuildInfo)?(v.cast(), vd.cast(), param, size, value, size_ret)
        })
    })
}
