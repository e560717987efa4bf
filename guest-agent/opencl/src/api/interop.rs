//! Sharing with OpenGL and EGL (cl_khr_gl_sharing, cl_khr_gl_event,
//! cl_khr_egl_image, cl_khr_egl_event).
//!
//! crane does not track objects shared with another API: it could not rebuild
//! them after the vendor library was unloaded. The entry points still exist,
//! because ocl-icd's libOpenCL.so.1 exports them (an application linked against
//! it may bind them at start, which a drop-in replacement must satisfy) and an
//! ICD loader calls them through the dispatch table of crane's objects, where a
//! null slot would crash. Each checks its handle as every entry point does, then
//! refuses with CL_INVALID_OPERATION, the code crane gives for a function the
//! vendor lacks. clGetExtensionFunctionAddress does not hand them out.

use std::ffi::c_void;

use opencl_sys::cl_egl::{
    CLeglDisplayKHR, CLeglImageKHR, CLeglSyncKHR, cl_egl_image_properties_khr,
};
use opencl_sys::*;

use super::*;
use crate::entry::{self, ClResult};

/// Refuses a call that would create an object shared with another API.
fn refuse_create<T>(c: cl_context) -> ClResult<*mut T> {
    context_ref(c.cast())?;
    Err(CL_INVALID_OPERATION)
}

/// Refuses a query about the shared object behind a memory object (crane's
/// memory objects never have one).
fn refuse_query(m: cl_mem) -> ClResult<()> {
    mem_ref(m.cast())?;
    Err(CL_INVALID_OPERATION)
}

/// Refuses a call that would enqueue an acquire or release of shared objects.
fn refuse_enqueue(q: cl_command_queue, n: cl_uint, mems: *const cl_mem) -> ClResult<()> {
    queue_ref(q.cast())?;
    for &m in entry::slice(mems, n as usize, CL_INVALID_VALUE)? {
        mem_ref(m.cast())?;
    }
    Err(CL_INVALID_OPERATION)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateFromGLBuffer(
    c: cl_context,
    _flags: cl_mem_flags,
    _buffer: cl_GLuint,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    entry::object(errcode_ret, || refuse_create(c))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateFromGLTexture(
    c: cl_context,
    _flags: cl_mem_flags,
    _target: cl_GLenum,
    _miplevel: cl_GLint,
    _texture: cl_GLuint,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    entry::object(errcode_ret, || refuse_create(c))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateFromGLTexture2D(
    c: cl_context,
    _flags: cl_mem_flags,
    _target: cl_GLenum,
    _miplevel: cl_GLint,
    _texture: cl_GLuint,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    entry::object(errcode_ret, || refuse_create(c))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateFromGLTexture3D(
    c: cl_context,
    _flags: cl_mem_flags,
    _target: cl_GLenum,
    _miplevel: cl_GLint,
    _texture: cl_GLuint,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    entry::object(errcode_ret, || refuse_create(c))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateFromGLRenderbuffer(
    c: cl_context,
    _flags: cl_mem_flags,
    _renderbuffer: cl_GLuint,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    entry::object(errcode_ret, || refuse_create(c))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetGLObjectInfo(
    m: cl_mem,
    _ty: *mut cl_gl_object_type,
    _name: *mut cl_GLuint,
) -> cl_int {
    entry::status(false, || refuse_query(m))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetGLTextureInfo(
    m: cl_mem,
    _param: cl_gl_texture_info,
    _size: usize,
    _value: *mut c_void,
    _size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || refuse_query(m))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueAcquireGLObjects(
    q: cl_command_queue,
    n: cl_uint,
    mems: *const cl_mem,
    _n_wait: cl_uint,
    _wait: *const cl_event,
    _ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || refuse_enqueue(q, n, mems))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueReleaseGLObjects(
    q: cl_command_queue,
    n: cl_uint,
    mems: *const cl_mem,
    _n_wait: cl_uint,
    _wait: *const cl_event,
    _ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || refuse_enqueue(q, n, mems))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetGLContextInfoKHR(
    _props: *const cl_context_properties,
    _param: cl_gl_context_info,
    _size: usize,
    _value: *mut c_void,
    _size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || Err(CL_INVALID_OPERATION))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateEventFromGLsyncKHR(
    c: cl_context,
    _sync: cl_GLsync,
    errcode_ret: *mut cl_int,
) -> cl_event {
    entry::object(errcode_ret, || refuse_create(c))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateFromEGLImageKHR(
    c: cl_context,
    _display: CLeglDisplayKHR,
    _image: CLeglImageKHR,
    _flags: cl_mem_flags,
    _props: *const cl_egl_image_properties_khr,
    errcode_ret: *mut cl_int,
) -> cl_mem {
    entry::object(errcode_ret, || refuse_create(c))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueAcquireEGLObjectsKHR(
    q: cl_command_queue,
    n: cl_uint,
    mems: *const cl_mem,
    _n_wait: cl_uint,
    _wait: *const cl_event,
    _ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || refuse_enqueue(q, n, mems))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueReleaseEGLObjectsKHR(
    q: cl_command_queue,
    n: cl_uint,
    mems: *const cl_mem,
    _n_wait: cl_uint,
    _wait: *const cl_event,
    _ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || refuse_enqueue(q, n, mems))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateEventFromEGLSyncKHR(
    c: cl_context,
    _sync: CLeglSyncKHR,
    _display: CLeglDisplayKHR,
    errcode_ret: *mut cl_int,
) -> cl_event {
    entry::object(errcode_ret, || refuse_create(c))
}
