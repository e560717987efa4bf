//! The OpenCL calls of the wire protocol, as methods of [`Session`], one file
//! per object family. Each translates the client's ids into vendor objects
//! (an unknown or mistyped id ends the session), checks what the proxy must
//! check before handing memory to the vendor (sizes against payloads and
//! against the objects' extents), and calls the vendor through the objects'
//! dispatch tables.
//!
//! [`Session`]: crate::session::Session

mod context;
mod enqueue;
mod event;
mod kernel;
mod memory;
mod platform;
mod program;
mod stash;

pub(crate) use stash::{Blob, stash_context};

use std::ffi::{CString, c_void};

use opencl_sys::*;

use crate::session::{CallError, CallResult};
use crate::vendor::VPtr;

// Sizes travel as u64 and are handed to the vendor as size_t.
const _: () = assert!(size_of::<usize>() == size_of::<u64>());

/// Largest info value or binary set the proxy fetches for a client.
const MAX_INFO: usize = 1 << 30;

pub(crate) fn check(rc: cl_int) -> CallResult {
    if rc == CL_SUCCESS {
        Ok(())
    } else {
        Err(CallError::Cl(rc))
    }
}

/// The result of a `clCreate*` call.
pub(crate) fn made<T>(h: *mut T, err: cl_int) -> CallResult<VPtr> {
    if err != CL_SUCCESS {
        return Err(CallError::Cl(err));
    }
    if h.is_null() {
        return Err(CallError::Cl(CL_OUT_OF_HOST_MEMORY));
    }
    Ok(VPtr(h.cast()))
}

/// A wait list as OpenCL takes it: NULL when empty.
pub(crate) fn wait_list(w: &[cl_event]) -> (cl_uint, *const cl_event) {
    (w.len() as cl_uint, or_null(w))
}

/// A slice's pointer, or NULL when it is empty.
pub(crate) fn or_null<T>(v: &[T]) -> *const T {
    if v.is_empty() {
        std::ptr::null()
    } else {
        v.as_ptr()
    }
}

/// Vendor handles as the pointer type a vendor function takes.
pub(crate) fn raw<T>(v: &[VPtr]) -> Vec<*mut T> {
    v.iter().map(|h| h.get().cast()).collect()
}

/// A property list as the wire carries it (no terminator), terminated; an
/// empty list stays empty (passed as NULL).
pub(crate) fn terminated<T: Copy>(props: &[u64], conv: impl Fn(u64) -> T, zero: T) -> Vec<T> {
    if props.is_empty() {
        return Vec::new();
    }
    let mut v: Vec<T> = props.iter().map(|&p| conv(p)).collect();
    v.push(zero);
    v
}

/// A string for the vendor; one holding a NUL byte fails with `err`.
pub(crate) fn c_string(s: &str, err: cl_int) -> CallResult<CString> {
    CString::new(s).map_err(|_| CallError::Cl(err))
}

/// A zeroed host buffer, or CL_OUT_OF_HOST_MEMORY.
pub(crate) fn host_buffer(len: u64) -> CallResult<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len as usize)
        .map_err(|_| CallError::Cl(CL_OUT_OF_HOST_MEMORY))?;
    v.resize(len as usize, 0);
    Ok(v)
}

/// Three sizes as size_t.
pub(crate) fn dims(v: [u64; 3]) -> [usize; 3] {
    v.map(|x| x as usize)
}

/// The product of a region's sides, if it does not overflow.
pub(crate) fn volume(region: [u64; 3]) -> Option<u64> {
    region[0].checked_mul(region[1])?.checked_mul(region[2])
}

/// The whole of a `clGet*Info`-shaped value: asks for its size, then for it.
/// `f(size, value, size_ret)` calls the vendor.
pub(crate) fn query(f: impl Fn(usize, *mut c_void, *mut usize) -> cl_int) -> CallResult<Vec<u8>> {
    let mut size = 0usize;
    check(f(0, std::ptr::null_mut(), &mut size))?;
    if size > MAX_INFO {
        return Err(CallError::Cl(CL_OUT_OF_HOST_MEMORY));
    }
    if size == 0 {
        return Ok(Vec::new());
    }
    // Room beyond the size the vendor reported, offered to it: a vendor
    // that writes past its own answer writes there, not into the heap
    // (docs/conformance.md, kernel_name_size on NVIDIA).
    let room = size + QUERY_SLACK;
    let mut v = host_buffer(room as u64)?;
    let mut got = size;
    check(f(room, v.as_mut_ptr().cast(), &mut got))?;
    v.truncate(got.min(room));
    Ok(v)
}

/// Bytes [`query`] offers beyond the reported size.
const QUERY_SLACK: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    /// A vendor that reports 10 bytes and writes 110 writes into the room
    /// `query` offers beyond the size (not past the buffer), and the answer
    /// is the 10 bytes it reported.
    #[test]
    fn a_vendor_writing_past_its_size_writes_into_the_room() {
        let answer = query(|size, value, ret| {
            if value.is_null() {
                // SAFETY: the size query's out-parameter.
                unsafe { *ret = 10 };
                return CL_SUCCESS;
            }
            assert!(size >= 110, "offered {size} bytes");
            // SAFETY: `value` holds `size` >= 110 bytes.
            unsafe { std::ptr::write_bytes(value.cast::<u8>(), 7, 110) };
            if !ret.is_null() {
                // SAFETY: as above.
                unsafe { *ret = 10 };
            }
            CL_SUCCESS
        })
        .unwrap();
        assert_eq!(answer, vec![7u8; 10]);
    }
}
