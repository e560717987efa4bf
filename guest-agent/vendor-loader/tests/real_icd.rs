//! Loading, using and unloading a real OpenCL implementation, cycle after
//! cycle, through its ICD dispatch table as an ICD loader would.
//!
//! The implementation is PoCL (`libpocl.so.2`, on the CPU) unless
//! `CRANE_TEST_ICD` names another one, such as `libnvidia-opencl.so.1` on a
//! GPU machine. The tests skip only when PoCL is not installed and no other
//! implementation was named.

mod common;

use std::ffi::{CStr, c_char, c_void};
use std::path::PathBuf;
use std::ptr::{null, null_mut};
use std::time::Instant;

use common::in_own_process;
use crane_vendor_loader::{
    DevicePolicy, LoadError, VendorLibrary, device_residue, vendor_threads_alive,
};
use opencl_sys::cl_icd::_cl_icd_dispatch;
use opencl_sys::{
    CL_CONTEXT_PLATFORM, CL_DEVICE_TYPE_ALL, CL_MEM_COPY_HOST_PTR, CL_MEM_READ_WRITE, CL_SUCCESS,
    CL_TRUE, cl_context_properties, cl_device_id, cl_int, cl_mem, cl_platform_id, cl_uint,
};

const POCL: &str = "/usr/lib/x86_64-linux-gnu/libpocl.so.2";
const ELEMENTS: usize = 1024;

type GetExtensionFunctionAddress = Option<unsafe extern "C" fn(*const c_char) -> *mut c_void>;
type IcdGetPlatformIds = opencl_sys::clIcdGetPlatformIDsKHR_t;

/// The implementation to test, or `None` to skip.
fn implementation() -> Option<PathBuf> {
    if let Some(named) = std::env::var_os("CRANE_TEST_ICD") {
        return Some(PathBuf::from(named));
    }
    if std::path::Path::new(POCL).exists() {
        Some(PathBuf::from(POCL))
    } else {
        eprintln!(
            "skipped: {POCL} is not installed and CRANE_TEST_ICD names no other OpenCL implementation"
        );
        None
    }
}

fn is_pocl(path: &std::path::Path) -> bool {
    path.to_string_lossy().contains("libpocl")
}

/// The dispatch table of an ICD object: every object's first field points
/// to it.
///
/// # Safety
/// `object` must be a valid object of an ICD implementation.
unsafe fn dispatch<'a, T>(object: *mut T) -> &'a _cl_icd_dispatch {
    assert!(!object.is_null());
    // SAFETY: per the caller, object starts with a pointer to the vendor's
    // dispatch table, which lives as long as the library is loaded.
    unsafe { &**object.cast::<*const _cl_icd_dispatch>() }
}

fn check(what: &str, code: cl_int) {
    assert_eq!(code, CL_SUCCESS, "{what} failed with {code}");
}

/// What one use of the implementation gave.
struct Run {
    result: Vec<i32>,
    /// Vendor threads running while the context existed.
    vendor_threads: usize,
    /// All threads of the process then.
    threads: usize,
}

/// Creates a context, a buffer and a kernel, runs the kernel, reads the
/// result back and releases everything; `unload_compiler` then calls
/// `clUnloadPlatformCompiler`.
fn run_kernel(library: &VendorLibrary, cycle: i32, unload_compiler: bool) -> Run {
    let address = library
        .symbol(c"clGetExtensionFunctionAddress")
        .expect("an ICD exports clGetExtensionFunctionAddress");
    // SAFETY: the symbol is clGetExtensionFunctionAddress, of this C type.
    let get_extension: GetExtensionFunctionAddress = unsafe { std::mem::transmute(address) };
    // SAFETY: an ICD returns clIcdGetPlatformIDsKHR, of this C type, through
    // clGetExtensionFunctionAddress.
    let get_platforms: IcdGetPlatformIds =
        unsafe { std::mem::transmute(get_extension.unwrap()(c"clIcdGetPlatformIDsKHR".as_ptr())) };
    let get_platforms = get_platforms.expect("the ICD returns clIcdGetPlatformIDsKHR");

    // SAFETY: every call below goes through the dispatch table of an object
    // the implementation returned, with arguments that follow the OpenCL
    // specification; buffers outlive the calls that use them.
    unsafe {
        let mut count: cl_uint = 0;
        check(
            "clIcdGetPlatformIDsKHR",
            get_platforms(0, null_mut(), &mut count),
        );
        assert!(count >= 1, "the ICD has no platform");
        let mut platforms: Vec<cl_platform_id> = vec![null_mut(); count as usize];
        check(
            "clIcdGetPlatformIDsKHR",
            get_platforms(count, platforms.as_mut_ptr(), null_mut()),
        );
        let platform = platforms[0];
        let mut device: cl_device_id = null_mut();
        check(
            "clGetDeviceIDs",
            dispatch(platform).clGetDeviceIDs.unwrap()(
                platform,
                CL_DEVICE_TYPE_ALL,
                1,
                &mut device,
                null_mut(),
            ),
        );
        let properties = [CL_CONTEXT_PLATFORM, platform as cl_context_properties, 0];
        let mut error = CL_SUCCESS;
        let context = dispatch(device).clCreateContext.unwrap()(
            properties.as_ptr(),
            1,
            &device,
            None,
            null_mut(),
            &mut error,
        );
        check("clCreateContext", error);
        let queue = dispatch(context).clCreateCommandQueue.unwrap()(context, device, 0, &mut error);
        check("clCreateCommandQueue", error);
        let mut data: Vec<i32> = (0..ELEMENTS as i32).map(|i| i + cycle).collect();
        let size = size_of_val(data.as_slice());
        let buffer = dispatch(context).clCreateBuffer.unwrap()(
            context,
            CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
            size,
            data.as_mut_ptr().cast(),
            &mut error,
        );
        check("clCreateBuffer", error);
        let source: &CStr = c"__kernel void twice_plus_one(__global int *a) {
            size_t i = get_global_id(0);
            a[i] = 2 * a[i] + 1;
        }";
        let mut source = source.as_ptr();
        let program = dispatch(context).clCreateProgramWithSource.unwrap()(
            context,
            1,
            &mut source,
            null(),
            &mut error,
        );
        check("clCreateProgramWithSource", error);
        check(
            "clBuildProgram",
            dispatch(program).clBuildProgram.unwrap()(
                program,
                1,
                &device,
                c"".as_ptr(),
                None,
                null_mut(),
            ),
        );
        let kernel = dispatch(program).clCreateKernel.unwrap()(
            program,
            c"twice_plus_one".as_ptr(),
            &mut error,
        );
        check("clCreateKernel", error);
        check(
            "clSetKernelArg",
            dispatch(kernel).clSetKernelArg.unwrap()(
                kernel,
                0,
                size_of::<cl_mem>(),
                (&raw const buffer).cast(),
            ),
        );
        let global = ELEMENTS;
        check(
            "clEnqueueNDRangeKernel",
            dispatch(queue).clEnqueueNDRangeKernel.unwrap()(
                queue,
                kernel,
                1,
                null(),
                &global,
                null(),
                0,
                null(),
                null_mut(),
            ),
        );
        let mut result = vec![0i32; ELEMENTS];
        check(
            "clEnqueueReadBuffer",
            dispatch(queue).clEnqueueReadBuffer.unwrap()(
                queue,
                buffer,
                CL_TRUE,
                0,
                size,
                result.as_mut_ptr().cast(),
                0,
                null(),
                null_mut(),
            ),
        );
        let vendor_threads = vendor_threads_alive().len();
        let threads = thread_count();
        check(
            "clReleaseMemObject",
            dispatch(buffer).clReleaseMemObject.unwrap()(buffer),
        );
        check(
            "clReleaseKernel",
            dispatch(kernel).clReleaseKernel.unwrap()(kernel),
        );
        check(
            "clReleaseProgram",
            dispatch(program).clReleaseProgram.unwrap()(program),
        );
        check(
            "clReleaseCommandQueue",
            dispatch(queue).clReleaseCommandQueue.unwrap()(queue),
        );
        check(
            "clReleaseContext",
            dispatch(context).clReleaseContext.unwrap()(context),
        );
        if unload_compiler {
            check(
                "clUnloadPlatformCompiler",
                dispatch(platform).clUnloadPlatformCompiler.unwrap()(platform),
            );
        }
        Run {
            result,
            vendor_threads,
            threads,
        }
    }
}

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |tasks| tasks.count())
}

fn expected(cycle: i32) -> Vec<i32> {
    (0..ELEMENTS as i32).map(|i| 2 * (i + cycle) + 1).collect()
}

#[test]
fn twenty_cycles_leave_no_thread_and_no_device_behind() {
    // PoCL joins its worker threads only when POCL_ENABLE_UNINIT is set and
    // clUnloadPlatformCompiler is called after the last context is gone.
    if in_own_process(
        "twenty_cycles_leave_no_thread_and_no_device_behind",
        &[("POCL_ENABLE_UNINIT", "1")],
    ) {
        return;
    }
    let Some(path) = implementation() else {
        return;
    };
    let policy = DevicePolicy::default();
    for cycle in 0..20 {
        let started = Instant::now();
        let library = VendorLibrary::open(&path).expect("the OpenCL implementation loads");
        let run = run_kernel(&library, cycle, true);
        assert_eq!(
            run.result,
            expected(cycle),
            "cycle {cycle}: wrong kernel result"
        );
        let used = started.elapsed();
        println!(
            "cycle {cycle}: {} vendor threads of {} threads while in use",
            run.vendor_threads, run.threads
        );

        let report = library.close(&policy).expect("unloading works");

        println!(
            "cycle {cycle}: used in {used:?}, {} threads after unload, {report:#?}",
            thread_count()
        );
        assert!(
            report.vendor_threads_alive.is_empty(),
            "cycle {cycle}: {report:#?}"
        );
        assert!(vendor_threads_alive().is_empty(), "cycle {cycle}");
        let residue = device_residue(&policy).unwrap();
        assert!(residue.is_empty(), "cycle {cycle}: {residue:?}");
        if is_pocl(&path) {
            assert!(run.vendor_threads > 0, "PoCL's workers are seen starting");
            // LLVM and Clang are NODELETE; PoCL itself stays as a relocation
            // dependency of them, and keeps its device drivers.
            let pocl = report
                .libraries_still_mapped
                .iter()
                .find(|l| l.path == path)
                .unwrap_or_else(|| panic!("PoCL stays mapped: {report:#?}"));
            assert!(!pocl.reasons.is_empty());
            assert!(
                report.libraries_still_mapped.iter().any(|l| l
                    .path
                    .to_string_lossy()
                    .contains("libLLVM")
                    && l.reasons
                        .contains(&crane_vendor_loader::RetainReason::NoDeleteFlag)),
                "{report:#?}"
            );
        } else {
            // Only NODELETE libraries may stay, and no reference to them was
            // counted as dropped.
            assert!(
                report.libraries_still_mapped.iter().all(|l| l
                    .reasons
                    .contains(&crane_vendor_loader::RetainReason::NoDeleteFlag)),
                "{report:#?}"
            );
            assert!(report.references_dropped.is_empty(), "{report:#?}");
            // The path may be a bare soname; the report names what the
            // dynamic linker found.
            let name = path.file_name();
            assert!(
                report
                    .libraries_closed
                    .iter()
                    .any(|l| l.file_name() == name),
                "{report:#?}"
            );
        }
    }
}

#[test]
fn without_uninit_pocl_workers_outlive_the_unload_and_are_reported() {
    if in_own_process(
        "without_uninit_pocl_workers_outlive_the_unload_and_are_reported",
        &[("POCL_ENABLE_UNINIT", "0")],
    ) {
        return;
    }
    let Some(path) = implementation().filter(|p| is_pocl(p)) else {
        eprintln!("skipped: this test is about PoCL");
        return;
    };
    let policy = DevicePolicy {
        thread_exit_timeout: std::time::Duration::from_millis(50),
        ..DevicePolicy::default()
    };
    let mut workers = None;
    for cycle in 0..3 {
        let library = VendorLibrary::open(&path).unwrap();
        assert_eq!(run_kernel(&library, cycle, true).result, expected(cycle));
        let report = library.close(&policy).unwrap();
        let alive = &report.vendor_threads_alive;
        assert!(!alive.is_empty(), "cycle {cycle}: {report:#?}");
        assert!(
            alive.iter().all(|t| t
                .start_library
                .as_ref()
                .is_some_and(|l| l.to_string_lossy().contains("libpocl-devices-pthread"))),
            "{alive:?}"
        );
        // The same workers serve the next load: they do not pile up.
        assert_eq!(
            *workers.get_or_insert(alive.clone()),
            *alive,
            "cycle {cycle}"
        );
    }
}

/// A second name for a vendor already open (its soname, where the first was
/// the file's path) is refused as that vendor, not loaded as a second one:
/// the dynamic linker would hand back the same object, and its platforms
/// would show twice.
#[test]
fn another_name_for_an_open_vendor_is_that_vendor() {
    if in_own_process("another_name_for_an_open_vendor_is_that_vendor", &[]) {
        return;
    }
    let Some(path) = implementation() else {
        return;
    };
    let Some(soname) = path.file_name().map(PathBuf::from) else {
        return;
    };
    let Ok(real) = path.canonicalize() else {
        return;
    };
    let library = VendorLibrary::open(&real).unwrap();
    match VendorLibrary::open(&soname) {
        Err(LoadError::SameAs { path, open }) => {
            assert_eq!((path, open), (soname.clone(), real.clone()));
        }
        other => panic!("{}: {other:?}", soname.display()),
    }
    library.close(&DevicePolicy::default()).unwrap();
    // Closed, the name loads again.
    let again = VendorLibrary::open(&soname).unwrap();
    again.close(&DevicePolicy::default()).unwrap();
}
