//! What every entry point does around its body: pass the gate, turn a panic into
//! an OpenCL error code, and write `errcode_ret`.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use opencl_sys::{CL_INVALID_VALUE, CL_OUT_OF_HOST_MEMORY, CL_SUCCESS, cl_int};

use crate::{fault, gate};

/// The error a panic inside crane is reported as: "CL_OUT_OF_HOST_MEMORY if
/// there is a failure to allocate resources required by the OpenCL
/// implementation on the host" is the one code every entry point may return,
/// so every application already handles it. The application's thread keeps
/// running; the panic message has gone to stderr as one line
/// (`install_panic_hook`).
const PANIC_CODE: cl_int = CL_OUT_OF_HOST_MEMORY;

pub type ClResult<T> = Result<T, cl_int>;

/// Entry points returning a `cl_int` status.
#[inline(always)]
pub fn status<F: FnOnce() -> ClResult<()>>(exempt: bool, f: F) -> cl_int {
    let _pass = gate::enter(exempt);
    match catch_unwind(AssertUnwindSafe(|| {
        fault::entry::<F>();
        f()
    })) {
        Ok(Ok(())) => CL_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => PANIC_CODE,
    }
}

/// Entry points returning an object and reporting through `errcode_ret`.
#[inline(always)]
pub fn object<T, F: FnOnce() -> ClResult<*mut T>>(errcode_ret: *mut cl_int, f: F) -> *mut T {
    let _pass = gate::enter(false);
    let (ret, code) = match catch_unwind(AssertUnwindSafe(|| {
        fault::entry::<F>();
        f()
    })) {
        Ok(Ok(p)) => (p, CL_SUCCESS),
        Ok(Err(e)) => (std::ptr::null_mut(), e),
        Err(_) => (std::ptr::null_mut(), PANIC_CODE),
    };
    if !errcode_ret.is_null() {
        // SAFETY: OpenCL lets errcode_ret be null or point to a writable cl_int.
        unsafe { errcode_ret.write(code) };
    }
    ret
}

/// Entry points that return a raw pointer (maps, SVM) and report through
/// `errcode_ret`.
#[inline(always)]
pub fn pointer<F: FnOnce() -> ClResult<*mut c_void>>(
    errcode_ret: *mut cl_int,
    f: F,
) -> *mut c_void {
    object(errcode_ret, f)
}

/// Entry points whose result is not an error code (e.g. clSVMAlloc): a panic
/// gives `fallback` (NULL for the pointer-returning ones).
pub fn infallible<T, F: FnOnce() -> T>(fallback: T, f: F) -> T {
    let _pass = gate::enter(false);
    catch_unwind(AssertUnwindSafe(|| {
        fault::entry::<F>();
        f()
    }))
    .unwrap_or(fallback)
}

/// Runs crane's side of a callback the vendor makes into crane. A panic must
/// not unwind into the vendor's frames (that aborts the process): it is
/// caught here and the callback is dropped, after the hook's one line.
pub fn callback(name: &str, f: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        fault::point(name);
        f()
    }));
}

/// Installs the panic hook of a loaded `libcrane_opencl.so`: one line on
/// stderr per panic (the default hook prints two and suggests
/// RUST_BACKTRACE, noise in someone else's program); `CRANE_DEBUG=1` adds a
/// backtrace. The hook belongs to crane's own copy of the Rust runtime, so it
/// sees only crane's panics, never the application's.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info.payload_as_str().unwrap_or("(no message)");
        let at = info
            .location()
            .map_or_else(String::new, |l| format!(" at {}:{}", l.file(), l.line()));
        eprintln!(
            "crane[{}]: caught internal error{at}: {msg}",
            std::process::id()
        );
        if crate::config::get().debug {
            eprintln!("{}", std::backtrace::Backtrace::force_capture());
        }
    }));
}

/// Writes an info query's answer the way every clGet*Info does: `size_ret` gets
/// the size, `value` (if not null) gets the bytes, and a too-small
/// `value_size` is CL_INVALID_VALUE.
pub fn write_info(
    bytes: &[u8],
    value_size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> ClResult<()> {
    if !value.is_null() {
        if value_size < bytes.len() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: the application promises `value` holds `value_size` bytes, and
        // we checked that covers `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), value.cast::<u8>(), bytes.len()) };
    }
    if !size_ret.is_null() {
        // SAFETY: OpenCL lets size_ret be null or point to a writable size_t.
        unsafe { size_ret.write(bytes.len()) };
    }
    Ok(())
}

/// The bytes of a plain value, for `write_info`.
pub fn bytes_of<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: any initialised Copy value may be viewed as its bytes.
    unsafe {
        std::slice::from_raw_parts(std::ptr::from_ref(v).cast::<u8>(), std::mem::size_of::<T>())
    }
}

/// The bytes of a slice of plain values, for `write_info`.
pub fn bytes_of_slice<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: as for `bytes_of`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Reads a zero-terminated property list of name-value pairs (contexts,
/// queues, mem objects, samplers, pipes), keeping the terminator. Only a
/// zero *name* ends the list: values are often 0 (`CL_FALSE`, no queue
/// properties, a null platform), and stopping at one handed the vendor a list
/// cut after that value, with no terminator. Null gives an empty list.
pub fn read_props<T: Copy + PartialEq + Default>(p: *const T) -> Vec<T> {
    let mut out = Vec::new();
    if p.is_null() {
        return out;
    }
    let zero = T::default();
    let mut i = 0;
    loop {
        // SAFETY: OpenCL property lists are zero-terminated arrays of pairs;
        // we stop at the terminator, which takes a name's place. The cap
        // guards against a list that is not terminated.
        let name = unsafe { p.add(i).read() };
        out.push(name);
        if name == zero || i > 4096 {
            break;
        }
        // SAFETY: a name is followed by its value.
        out.push(unsafe { p.add(i + 1).read() });
        i += 2;
    }
    out
}

/// A slice from an application pointer and count, refusing null with a non-zero
/// count.
pub fn slice<'a, T>(p: *const T, n: usize, err: cl_int) -> ClResult<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(err);
    }
    // SAFETY: the application passes `n` valid elements at `p`, as OpenCL requires.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Writes `v` to an optional out-parameter.
pub fn put<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: OpenCL out-parameters are null or writable.
        unsafe { p.write(v) };
    }
}

/// An OpenCL error code as operators read it in crane's messages:
/// `CL_MEM_OBJECT_ALLOCATION_FAILURE (-4)`, or the bare number for a code
/// outside the core API's list (vendor and extension codes).
pub fn error_text(code: cl_int) -> String {
    macro_rules! named {
        ($($name:ident),* $(,)?) => {
            match code {
                $(opencl_sys::$name => Some(stringify!($name)),)*
                _ => None,
            }
        };
    }
    let name = named!(
        CL_SUCCESS,
        CL_DEVICE_NOT_FOUND,
        CL_DEVICE_NOT_AVAILABLE,
        CL_COMPILER_NOT_AVAILABLE,
        CL_MEM_OBJECT_ALLOCATION_FAILURE,
        CL_OUT_OF_RESOURCES,
        CL_OUT_OF_HOST_MEMORY,
        CL_PROFILING_INFO_NOT_AVAILABLE,
        CL_MEM_COPY_OVERLAP,
        CL_IMAGE_FORMAT_MISMATCH,
        CL_IMAGE_FORMAT_NOT_SUPPORTED,
        CL_BUILD_PROGRAM_FAILURE,
        CL_MAP_FAILURE,
        CL_MISALIGNED_SUB_BUFFER_OFFSET,
        CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST,
        CL_COMPILE_PROGRAM_FAILURE,
        CL_LINKER_NOT_AVAILABLE,
        CL_LINK_PROGRAM_FAILURE,
        CL_DEVICE_PARTITION_FAILED,
        CL_KERNEL_ARG_INFO_NOT_AVAILABLE,
        CL_INVALID_VALUE,
        CL_INVALID_DEVICE_TYPE,
        CL_INVALID_PLATFORM,
        CL_INVALID_DEVICE,
        CL_INVALID_CONTEXT,
        CL_INVALID_QUEUE_PROPERTIES,
        CL_INVALID_COMMAND_QUEUE,
        CL_INVALID_HOST_PTR,
        CL_INVALID_MEM_OBJECT,
        CL_INVALID_IMAGE_FORMAT_DESCRIPTOR,
        CL_INVALID_IMAGE_SIZE,
        CL_INVALID_SAMPLER,
        CL_INVALID_BINARY,
        CL_INVALID_BUILD_OPTIONS,
        CL_INVALID_PROGRAM,
        CL_INVALID_PROGRAM_EXECUTABLE,
        CL_INVALID_KERNEL_NAME,
        CL_INVALID_KERNEL_DEFINITION,
        CL_INVALID_KERNEL,
        CL_INVALID_ARG_INDEX,
        CL_INVALID_ARG_VALUE,
        CL_INVALID_ARG_SIZE,
        CL_INVALID_KERNEL_ARGS,
        CL_INVALID_WORK_DIMENSION,
        CL_INVALID_WORK_GROUP_SIZE,
        CL_INVALID_WORK_ITEM_SIZE,
        CL_INVALID_GLOBAL_OFFSET,
        CL_INVALID_EVENT_WAIT_LIST,
        CL_INVALID_EVENT,
        CL_INVALID_OPERATION,
        CL_INVALID_GL_OBJECT,
        CL_INVALID_BUFFER_SIZE,
        CL_INVALID_MIP_LEVEL,
        CL_INVALID_GLOBAL_WORK_SIZE,
        CL_INVALID_PROPERTY,
        CL_INVALID_IMAGE_DESCRIPTOR,
        CL_INVALID_COMPILER_OPTIONS,
        CL_INVALID_LINKER_OPTIONS,
        CL_INVALID_DEVICE_PARTITION_COUNT,
        CL_INVALID_PIPE_SIZE,
        CL_INVALID_DEVICE_QUEUE,
        CL_INVALID_SPEC_ID,
        CL_MAX_SIZE_RESTRICTION_EXCEEDED,
    );
    match name {
        Some(n) => format!("{n} ({code})"),
        None => format!("{code}"),
    }
}

#[cfg(test)]
mod tests {
    use super::error_text;

    #[test]
    fn error_codes_are_named_and_unknown_ones_kept() {
        assert_eq!(error_text(-4), "CL_MEM_OBJECT_ALLOCATION_FAILURE (-4)");
        assert_eq!(error_text(-72), "CL_MAX_SIZE_RESTRICTION_EXCEEDED (-72)");
        assert_eq!(error_text(-1001), "-1001");
    }
}
