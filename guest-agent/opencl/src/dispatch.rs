//! The ICD dispatch table: one list names every entry point crane wraps, and
//! both the table an ICD loader calls through and the answers of
//! clGetExtensionFunctionAddress come from it, so they cannot drift apart. (The
//! exported symbols are the same functions; `tests/exports.rs` checks that every
//! exported `cl*` symbol is in this list, src/entry_points.rs.)

use std::ffi::{CStr, c_char, c_void};
use std::mem::MaybeUninit;

use opencl_sys::cl_icd::_cl_icd_dispatch;

use crate::api::{
    clReleaseContext, clReleaseEvent, clReleaseKernel, clReleaseMemObject, clReleaseProgram,
    clReleaseSampler, clRetainContext, clRetainEvent, clRetainKernel, clRetainMemObject,
    clRetainProgram, clRetainSampler, context::*, enqueue::*, event::*, interop::*, kernel::*,
    memory::*, platform::*, program::*, queue::*, sampler::*, svm::*,
};

macro_rules! entry_points {
    ($($name:ident),* $(,)?) => {
        /// The table at the start of every crane handle.
        #[allow(deprecated)]
        pub static DISPATCH: _cl_icd_dispatch = {
            // SAFETY: every field is an Option of a function pointer, for which all
            // zero bits is None.
            let mut d: _cl_icd_dispatch = unsafe { MaybeUninit::zeroed().assume_init() };
            $( d.$name = Some($name); )*
            d
        };

        /// Every wrapped entry point by name.
        #[allow(deprecated)]
        pub fn entry_point(name: &[u8]) -> *mut c_void {
            $( if name == stringify!($name).as_bytes() { return $name as *mut c_void; } )*
            std::ptr::null_mut()
        }

    };
}

include!("entry_points.rs");

/// clGetExtensionFunctionAddress: the ICD entry point, and the extension
/// functions crane wraps (some under their core name). Anything else, the
/// refused sharing functions of api/interop.rs included, is NULL, since an
/// untracked extension would break suspend.
pub fn extension_address(name: *const c_char) -> *mut c_void {
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a NUL-terminated function name.
    let n = unsafe { CStr::from_ptr(name) }.to_bytes();
    let wrapped: &[u8] = match n {
        b"clIcdGetPlatformIDsKHR" => return clIcdGetPlatformIDsKHR as *mut c_void,
        b"clCreateProgramWithILKHR" => b"clCreateProgramWithIL",
        b"clGetKernelSubGroupInfoKHR" => b"clGetKernelSubGroupInfoKHR",
        b"clCreateCommandQueueWithPropertiesKHR" => b"clCreateCommandQueueWithProperties",
        _ => {
            crate::config::debug!(
                "extension function {} is not wrapped: answered NULL",
                String::from_utf8_lossy(n)
            );
            return std::ptr::null_mut();
        }
    };
    entry_point(wrapped)
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// ocl-icd calls through a slot of the table without checking it for null,
    /// so every slot an ICD loader on Linux can reach must be filled. Only the
    /// Direct3D and DX9 sharing slots (Windows loaders) and the OpenCL 3.1 slot
    /// (not in the headers crane builds with) stay empty.
    #[test]
    fn every_slot_a_linux_loader_reaches_is_filled() {
        type D = _cl_icd_dispatch;
        let may_be_empty = [
            offset_of!(D, clGetDeviceIDsFromD3D10KHR),
            offset_of!(D, clCreateFromD3D10BufferKHR),
            offset_of!(D, clCreateFromD3D10Texture2DKHR),
            offset_of!(D, clCreateFromD3D10Texture3DKHR),
            offset_of!(D, clEnqueueAcquireD3D10ObjectsKHR),
            offset_of!(D, clEnqueueReleaseD3D10ObjectsKHR),
            offset_of!(D, clGetDeviceIDsFromD3D11KHR),
            offset_of!(D, clCreateFromD3D11BufferKHR),
            offset_of!(D, clCreateFromD3D11Texture2DKHR),
            offset_of!(D, clCreateFromD3D11Texture3DKHR),
            offset_of!(D, clCreateFromDX9MediaSurfaceKHR),
            offset_of!(D, clEnqueueAcquireD3D11ObjectsKHR),
            offset_of!(D, clEnqueueReleaseD3D11ObjectsKHR),
            offset_of!(D, clGetDeviceIDsFromDX9MediaAdapterKHR),
            offset_of!(D, clEnqueueAcquireDX9MediaSurfacesKHR),
            offset_of!(D, clEnqueueReleaseDX9MediaSurfacesKHR),
            offset_of!(D, clGetKernelSuggestedLocalWorkSize),
        ];
        assert_eq!(size_of::<D>() % size_of::<usize>(), 0);
        let words = size_of::<D>() / size_of::<usize>();
        // SAFETY: the table is a repr(C) struct of pointer-sized fields (function
        // pointers and intptr_t), so it reads as `words` usizes.
        let slots =
            unsafe { std::slice::from_raw_parts((&raw const DISPATCH).cast::<usize>(), words) };
        for (i, &slot) in slots.iter().enumerate() {
            let offset = i * size_of::<usize>();
            if !may_be_empty.contains(&offset) {
                assert_ne!(slot, 0, "dispatch slot {i} (offset {offset}) is null");
            }
        }
    }
}
