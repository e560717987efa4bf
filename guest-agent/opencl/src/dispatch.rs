//! The ICD dispatch table: one list names every entry point crane wraps, and
//! both the table an ICD loader calls through and the answers of
//! clGetExtensionFunctionAddress come from it, so they cannot drift apart. (The
//! exported symbols are the same functions; `tests/exports.rs` checks that every
//! exported `cl*` symbol is in this list.)

use std::ffi::{CStr, c_char, c_void};
use std::mem::MaybeUninit;

use opencl_sys::cl_icd::_cl_icd_dispatch;

use crate::api::{
    clReleaseContext, clReleaseEvent, clReleaseKernel, clReleaseMemObject, clReleaseProgram,
    clReleaseSampler, clRetainContext, clRetainEvent, clRetainKernel, clRetainMemObject,
    clRetainProgram, clRetainSampler, context::*, enqueue::*, event::*, kernel::*, memory::*,
    platform::*, program::*, queue::*, sampler::*, svm::*,
};

macro_rules! icd_table {
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

        /// The names in the table (tests compare them with the exported symbols).
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}

icd_table! {
    clGetPlatformIDs, clGetPlatformInfo, clGetDeviceIDs, clGetDeviceInfo,
    clCreateContext, clCreateContextFromType, clRetainContext, clReleaseContext, clGetContextInfo,
    clCreateCommandQueue, clRetainCommandQueue, clReleaseCommandQueue, clGetCommandQueueInfo, clSetCommandQueueProperty,
    clCreateBuffer, clCreateImage2D, clCreateImage3D, clRetainMemObject, clReleaseMemObject,
    clGetSupportedImageFormats, clGetMemObjectInfo, clGetImageInfo,
    clCreateSampler, clRetainSampler, clReleaseSampler, clGetSamplerInfo,
    clCreateProgramWithSource, clCreateProgramWithBinary, clRetainProgram, clReleaseProgram, clBuildProgram,
    clUnloadCompiler, clGetProgramInfo, clGetProgramBuildInfo,
    clCreateKernel, clCreateKernelsInProgram, clRetainKernel, clReleaseKernel, clSetKernelArg,
    clGetKernelInfo, clGetKernelWorkGroupInfo,
    clWaitForEvents, clGetEventInfo, clRetainEvent, clReleaseEvent, clGetEventProfilingInfo,
    clFlush, clFinish,
    clEnqueueReadBuffer, clEnqueueWriteBuffer, clEnqueueCopyBuffer, clEnqueueReadImage, clEnqueueWriteImage,
    clEnqueueCopyImage, clEnqueueCopyImageToBuffer, clEnqueueCopyBufferToImage, clEnqueueMapBuffer, clEnqueueMapImage,
    clEnqueueUnmapMemObject, clEnqueueNDRangeKernel, clEnqueueTask, clEnqueueNativeKernel,
    clEnqueueMarker, clEnqueueWaitForEvents, clEnqueueBarrier,
    clGetExtensionFunctionAddress,
    // OpenCL 1.1
    clSetEventCallback, clCreateSubBuffer, clSetMemObjectDestructorCallback, clCreateUserEvent, clSetUserEventStatus,
    clEnqueueReadBufferRect, clEnqueueWriteBufferRect, clEnqueueCopyBufferRect,
    // OpenCL 1.2
    clCreateSubDevices, clRetainDevice, clReleaseDevice, clCreateImage, clCreateProgramWithBuiltInKernels,
    clCompileProgram, clLinkProgram, clUnloadPlatformCompiler, clGetKernelArgInfo,
    clEnqueueFillBuffer, clEnqueueFillImage, clEnqueueMigrateMemObjects,
    clEnqueueMarkerWithWaitList, clEnqueueBarrierWithWaitList, clGetExtensionFunctionAddressForPlatform,
    // OpenCL 2.0
    clCreateCommandQueueWithProperties, clCreatePipe, clGetPipeInfo, clSVMAlloc, clSVMFree,
    clEnqueueSVMFree, clEnqueueSVMMemcpy, clEnqueueSVMMemFill, clEnqueueSVMMap, clEnqueueSVMUnmap,
    clCreateSamplerWithProperties, clSetKernelArgSVMPointer, clSetKernelExecInfo,
    // OpenCL 2.1
    clCloneKernel, clCreateProgramWithIL, clEnqueueSVMMigrateMem, clGetDeviceAndHostTimer, clGetHostTimer,
    clGetKernelSubGroupInfo, clSetDefaultDeviceCommandQueue,
    // OpenCL 2.2
    clSetProgramReleaseCallback, clSetProgramSpecializationConstant,
    // OpenCL 3.0
    clCreateBufferWithProperties, clCreateImageWithProperties, clSetContextDestructorCallback,
}

/// clGetExtensionFunctionAddress: the ICD entry point, and extension names
/// whose functions crane wraps under their core name. Anything else is refused
/// with NULL, since an untracked extension would break suspend.
pub fn extension_address(name: *const c_char) -> *mut c_void {
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a NUL-terminated function name.
    let n = unsafe { CStr::from_ptr(name) }.to_bytes();
    let core: &[u8] = match n {
        b"clIcdGetPlatformIDsKHR" => return clIcdGetPlatformIDsKHR as *mut c_void,
        b"clCreateProgramWithILKHR" => b"clCreateProgramWithIL",
        b"clGetKernelSubGroupInfoKHR" => b"clGetKernelSubGroupInfo",
        b"clCreateCommandQueueWithPropertiesKHR" => b"clCreateCommandQueueWithProperties",
        _ => return std::ptr::null_mut(),
    };
    entry_point(core)
}
