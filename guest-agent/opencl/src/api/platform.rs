//! Platforms and devices.

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use opencl_sys::*;

use super::*;
use crate::entry::{self, ClResult, bytes_of, put, write_info};
use crate::handle::Base;
use crate::vendor::{self, check, vfn};

fn get_platform_ids(n: cl_uint, out: *mut cl_platform_id, n_ret: *mut cl_uint) -> ClResult<()> {
    if (n == 0 && !out.is_null()) || (out.is_null() && n_ret.is_null()) {
        return Err(CL_INVALID_VALUE);
    }
    let ps = vendor::platforms()?;
    crate::control::start();
    put(n_ret, ps.len() as cl_uint);
    if ps.is_empty() {
        return Err(CL_PLATFORM_NOT_FOUND_KHR);
    }
    if !out.is_null() {
        for (i, p) in ps.iter().take(n as usize).enumerate() {
            // SAFETY: the application gave room for n platforms.
            unsafe { out.add(i).write(p.base.handle()) };
        }
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetPlatformIDs(
    n: cl_uint,
    out: *mut cl_platform_id,
    n_ret: *mut cl_uint,
) -> cl_int {
    entry::status(false, || get_platform_ids(n, out, n_ret))
}

/// The ICD loader's entry point: the same as clGetPlatformIDs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clIcdGetPlatformIDsKHR(
    n: cl_uint,
    out: *mut cl_platform_id,
    n_ret: *mut cl_uint,
) -> cl_int {
    entry::status(false, || get_platform_ids(n, out, n_ret))
}

/// Resolves a platform argument; null means "the first platform", as the ICD
/// loader does (ocl-icd replaces a null platform by its default one before
/// dispatching).
fn platform_or_default(p: cl_platform_id) -> ClResult<Arc<Platform>> {
    if p.is_null() {
        return vendor::platforms()?
            .into_iter()
            .next()
            .ok_or(CL_INVALID_PLATFORM);
    }
    arc_of::<Platform>(p.cast(), CL_INVALID_PLATFORM)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetPlatformInfo(
    p: cl_platform_id,
    param: cl_platform_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let p = platform_or_default(p)?;
        let v = p.base.vendor();
        let f = vfn!(v, clGetPlatformInfo)?;
        // SAFETY: `f` answers `param` of the live vendor platform `v`.
        let query = |n, out, n_ret| unsafe { f(v.cast(), param, n, out, n_ret) };
        match param {
            CL_PLATFORM_EXTENSIONS => extension_string(query, size, value, size_ret),
            CL_PLATFORM_EXTENSIONS_WITH_VERSION => extension_versions(query, size, value, size_ret),
            _ => check(query(size, value, size_ret)),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetDeviceIDs(
    p: cl_platform_id,
    ty: cl_device_type,
    n: cl_uint,
    out: *mut cl_device_id,
    n_ret: *mut cl_uint,
) -> cl_int {
    entry::status(false, || {
        if (n == 0 && !out.is_null()) || (out.is_null() && n_ret.is_null()) {
            return Err(CL_INVALID_VALUE);
        }
        let p = platform_or_default(p)?;
        let all = vendor::root_devices(&p)?;
        let vp = p.base.vendor();
        let f = vfn!(vp, clGetDeviceIDs)?;
        let mut cnt = 0;
        // SAFETY: count query on the vendor platform.
        check(unsafe { f(vp.cast(), ty, 0, std::ptr::null_mut(), &mut cnt) })?;
        let mut vs = vec![std::ptr::null_mut(); cnt as usize];
        // SAFETY: `vs` holds cnt entries.
        check(unsafe { f(vp.cast(), ty, cnt, vs.as_mut_ptr(), std::ptr::null_mut()) })?;
        let ours: Vec<&Arc<Device>> = vs
            .iter()
            .filter_map(|&v| all.iter().find(|d| d.base.vendor() == v.cast()))
            .collect();
        put(n_ret, ours.len() as cl_uint);
        if !out.is_null() {
            for (i, d) in ours.iter().take(n as usize).enumerate() {
                // SAFETY: room for n devices.
                unsafe { out.add(i).write(d.base.handle()) };
            }
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetDeviceInfo(
    d: cl_device_id,
    param: cl_device_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let dev = device_ref(d.cast())?;
        match param {
            CL_DEVICE_PLATFORM => {
                let h: cl_platform_id = dev.platform.base.handle();
                write_info(bytes_of(&h), size, value, size_ret)
            }
            CL_DEVICE_PARENT_DEVICE => {
                let h: cl_device_id = dev
                    .parent
                    .as_ref()
                    .map_or(std::ptr::null_mut(), |p| p.base.handle());
                write_info(bytes_of(&h), size, value, size_ret)
            }
            CL_DEVICE_EXECUTION_CAPABILITIES => {
                // crane refuses clEnqueueNativeKernel, so it does not report
                // the capability either.
                let v = dev.base.vendor();
                let mut caps: cl_device_exec_capabilities = 0;
                // SAFETY: a cl_device_exec_capabilities-sized answer into `caps`.
                check(unsafe {
                    vfn!(v, clGetDeviceInfo)?(
                        v.cast(),
                        param,
                        std::mem::size_of_val(&caps),
                        (&raw mut caps).cast(),
                        std::ptr::null_mut(),
                    )
                })?;
                caps &= !CL_EXEC_NATIVE_KERNEL;
                write_info(bytes_of(&caps), size, value, size_ret)
            }
            CL_DEVICE_REFERENCE_COUNT => {
                let n: cl_uint = if dev.parent.is_some() {
                    dev.base.app_refs()
                } else {
                    1
                };
                write_info(bytes_of(&n), size, value, size_ret)
            }
            _ => {
                let v = dev.base.vendor();
                let f = vfn!(v, clGetDeviceInfo)?;
                // SAFETY: `f` answers `param` of the live vendor device `v`.
                let query = |n, out, n_ret| unsafe { f(v.cast(), param, n, out, n_ret) };
                match param {
                    CL_DEVICE_EXTENSIONS => extension_string(query, size, value, size_ret),
                    CL_DEVICE_EXTENSIONS_WITH_VERSION => {
                        extension_versions(query, size, value, size_ret)
                    }
                    _ => check(query(size, value, size_ret)),
                }
            }
        }
    })
}

/// A vendor info query: (size, value, size_ret) -> status.
type Query<'a> = &'a dyn Fn(usize, *mut c_void, *mut usize) -> cl_int;

/// The vendor's answer to an info query, whole.
fn vendor_bytes(query: Query) -> ClResult<Vec<u8>> {
    let mut n = 0;
    check(query(0, std::ptr::null_mut(), &mut n))?;
    let mut buf = vec![0u8; n];
    check(query(n, buf.as_mut_ptr().cast(), std::ptr::null_mut()))?;
    Ok(buf)
}

/// CL_*_EXTENSIONS without the extensions crane does not track
/// (`crate::extensions`).
fn extension_string(
    query: impl Fn(usize, *mut c_void, *mut usize) -> cl_int,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> ClResult<()> {
    let raw = vendor_bytes(&query)?;
    let text = raw.split(|&b| b == 0).next().unwrap_or_default();
    let mut out = crate::extensions::filter_string(text);
    out.push(0);
    write_info(&out, size, value, size_ret)
}

/// CL_*_EXTENSIONS_WITH_VERSION, filtered like `extension_string`.
fn extension_versions(
    query: impl Fn(usize, *mut c_void, *mut usize) -> cl_int,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> ClResult<()> {
    let raw = vendor_bytes(&query)?;
    let n = crate::extensions::version_entries(raw.len());
    let kept: Vec<cl_name_version> = (0..n)
        .map(|i| {
            // SAFETY: `raw` holds n whole cl_name_version entries; the read
            // is unaligned because a Vec<u8> promises no alignment.
            unsafe {
                raw.as_ptr()
                    .cast::<cl_name_version>()
                    .add(i)
                    .read_unaligned()
            }
        })
        .filter(crate::extensions::advertised_version)
        .collect();
    // SAFETY: cl_name_version is plain data; its bytes are what OpenCL returns.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            kept.as_ptr().cast::<u8>(),
            std::mem::size_of_val(kept.as_slice()),
        )
    };
    write_info(bytes, size, value, size_ret)
}

/// Creates sub-devices on the vendor and crane objects for them (also used to
/// recreate them on resume).
pub fn create_sub_devices(
    parent: &Arc<Device>,
    props: &[cl_device_partition_property],
) -> ClResult<Vec<cl_device_id>> {
    let v = parent.base.vendor();
    let f = vfn!(v, clCreateSubDevices)?;
    let mut n = 0;
    // SAFETY: count query; `props` is zero-terminated.
    check(unsafe { f(v.cast(), props.as_ptr(), 0, std::ptr::null_mut(), &mut n) })?;
    let mut vs = vec![std::ptr::null_mut(); n as usize];
    // SAFETY: `vs` holds n entries.
    check(unsafe {
        f(
            v.cast(),
            props.as_ptr(),
            n,
            vs.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })?;
    Ok(vs)
}

/// Reads a partition property list: a name and its value, except
/// `CL_DEVICE_PARTITION_BY_COUNTS`, whose counts run to
/// `CL_DEVICE_PARTITION_BY_COUNTS_LIST_END` (0); then the terminator.
fn read_partition(p: *const cl_device_partition_property) -> Vec<cl_device_partition_property> {
    let mut out = Vec::new();
    // SAFETY: a zero-terminated list as OpenCL defines it; the cap guards
    // against one that is not terminated. `p` is not null (checked).
    let at = |i: usize| unsafe { p.add(i).read() };
    let mut i = 0;
    while i < 4096 {
        let name = at(i);
        out.push(name);
        i += 1;
        if name == 0 {
            break;
        }
        if name == CL_DEVICE_PARTITION_BY_COUNTS as cl_device_partition_property {
            loop {
                let c = at(i);
                out.push(c);
                i += 1;
                if c == CL_DEVICE_PARTITION_BY_COUNTS_LIST_END as cl_device_partition_property
                    || i >= 4096
                {
                    break;
                }
            }
        } else {
            out.push(at(i));
            i += 1;
        }
    }
    out
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateSubDevices(
    d: cl_device_id,
    props: *const cl_device_partition_property,
    n: cl_uint,
    out: *mut cl_device_id,
    n_ret: *mut cl_uint,
) -> cl_int {
    entry::status(false, || {
        let parent = arc_of::<Device>(d.cast(), CL_INVALID_DEVICE)?;
        if props.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let props = read_partition(props);
        let vs = create_sub_devices(&parent, &props)?;
        put(n_ret, vs.len() as cl_uint);
        if out.is_null() {
            // Counting only: give the vendor's sub-devices back.
            for &v in &vs {
                // SAFETY: sub-devices we just created and do not keep.
                unsafe { vendor::release(v.cast(), |t| t.clReleaseDevice) };
            }
            return Ok(());
        }
        if (n as usize) < vs.len() {
            for &v in &vs {
                // SAFETY: as above.
                unsafe { vendor::release(v.cast(), |t| t.clReleaseDevice) };
            }
            return Err(CL_INVALID_VALUE);
        }
        for (i, &v) in vs.iter().enumerate() {
            let sub = Arc::new(Device {
                base: Base::new(v.cast()),
                platform: parent.platform.clone(),
                parent: Some(parent.clone()),
                index: i,
                partition: props.clone(),
                home: parent.home.clone(),
                now: std::sync::Mutex::new(parent.now()),
                used: Default::default(),
            });
            // SAFETY: room for n >= vs.len() devices.
            unsafe { out.add(i).write(publish(sub)) };
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clRetainDevice(d: cl_device_id) -> cl_int {
    entry::status(true, || {
        let dev = device_ref(d.cast())?;
        if dev.parent.is_some() {
            handle::app_retain(dev);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clReleaseDevice(d: cl_device_id) -> cl_int {
    entry::status(true, || {
        let dev = device_ref(d.cast())?;
        if dev.parent.is_some() {
            handle::app_release(dev);
        }
        Ok(())
    })
}

/// cl_ext_device_fission's retain: the same as clRetainDevice.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clRetainDeviceEXT(d: cl_device_id) -> cl_int {
    // SAFETY: same contract as clRetainDevice.
    unsafe { clRetainDevice(d) }
}

/// cl_ext_device_fission's release: the same as clReleaseDevice.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clReleaseDeviceEXT(d: cl_device_id) -> cl_int {
    // SAFETY: same contract as clReleaseDevice.
    unsafe { clReleaseDevice(d) }
}

/// cl_ext_device_fission's partitioning, superseded by clCreateSubDevices
/// (OpenCL 1.2). Its partition tokens differ from the core ones, and crane
/// recreates sub-devices on resume from core partition properties only, so it
/// refuses it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateSubDevicesEXT(
    d: cl_device_id,
    _props: *const cl_device_partition_property_ext,
    _n: cl_uint,
    _out: *mut cl_device_id,
    _n_ret: *mut cl_uint,
) -> cl_int {
    entry::status(false, || {
        device_ref(d.cast())?;
        Err(CL_INVALID_OPERATION)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetDeviceAndHostTimer(
    d: cl_device_id,
    dev_ts: *mut cl_ulong,
    host_ts: *mut cl_ulong,
) -> cl_int {
    entry::status(false, || {
        let v = vendor_of::<Device>(d.cast(), CL_INVALID_DEVICE)?;
        // SAFETY: forwarding.
        check(unsafe { vfn!(v, clGetDeviceAndHostTimer)?(v.cast(), dev_ts, host_ts) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetHostTimer(d: cl_device_id, host_ts: *mut cl_ulong) -> cl_int {
    entry::status(false, || {
        let v = vendor_of::<Device>(d.cast(), CL_INVALID_DEVICE)?;
        // SAFETY: forwarding.
        check(unsafe { vfn!(v, clGetHostTimer)?(v.cast(), host_ts) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clUnloadCompiler() -> cl_int {
    entry::status(false, || Ok(()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clUnloadPlatformCompiler(p: cl_platform_id) -> cl_int {
    entry::status(false, || {
        let v = platform_or_default(p)?.base.vendor();
        // SAFETY: forwarding.
        check(unsafe { vfn!(v, clUnloadPlatformCompiler)?(v.cast()) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetExtensionFunctionAddress(name: *const c_char) -> *mut c_void {
    entry::infallible(std::ptr::null_mut(), || {
        crate::dispatch::extension_address(name)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetExtensionFunctionAddressForPlatform(
    p: cl_platform_id,
    name: *const c_char,
) -> *mut c_void {
    entry::infallible(std::ptr::null_mut(), || {
        if platform_ref(p.cast()).is_err() {
            return std::ptr::null_mut();
        }
        crate::dispatch::extension_address(name)
    })
}
