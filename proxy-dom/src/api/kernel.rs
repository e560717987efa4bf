//! Kernels and their arguments.

use std::ffi::c_void;

use crane_wire::{Answer, Id, KernelArg};
use opencl_sys::*;

use super::{c_string, check, made};
use crate::session::objects::{Detail, Kind};
use crate::session::{CallError, CallResult, Session};
use crate::vendor::{VPtr, vfn};

impl Session {
    pub(crate) fn create_kernel(&mut self, id: Id, program: Id, name: &str) -> CallResult {
        self.create(id, Kind::Kernel, |s| {
            let p = s.objects.handle(program, Kind::Program)?;
            let name = c_string(name, CL_INVALID_KERNEL_NAME)?;
            let f = vfn!(p.get(), clCreateKernel)?;
            let mut err = CL_SUCCESS;
            // SAFETY: a live program and a C string.
            let h = unsafe { f(p.get().cast(), name.as_ptr(), &mut err) };
            Ok((made(h, err)?, Detail::Plain))
        })
    }

    /// Replies `Count` with the number of kernels in the program; with ids,
    /// also makes them (the first `count` ids name them).
    pub(crate) fn create_kernels_in_program(
        &mut self,
        seq: u64,
        program: Id,
        ids: &[Id],
    ) -> CallResult {
        let p = self.objects.handle(program, Kind::Program)?;
        let f = vfn!(p.get(), clCreateKernelsInProgram)?;
        let mut n: cl_uint = 0;
        if ids.is_empty() {
            // SAFETY: a count query.
            check(unsafe { f(p.get().cast(), 0, std::ptr::null_mut(), &mut n) })?;
        } else {
            self.objects.check_new_all(ids)?;
            self.objects.admit_n(ids.len() as u64)?;
            let mut out: Vec<cl_kernel> = vec![std::ptr::null_mut(); ids.len()];
            // SAFETY: `out` holds as many entries as the count passed.
            check(unsafe {
                f(
                    p.get().cast(),
                    out.len() as cl_uint,
                    out.as_mut_ptr(),
                    &mut n,
                )
            })?;
            for (&id, &k) in ids.iter().zip(out.iter().take(n as usize)) {
                if !k.is_null() {
                    self.objects
                        .insert(id, Kind::Kernel, VPtr(k.cast()), Detail::Plain);
                }
            }
        }
        self.reply(
            seq,
            &Answer::Count {
                status: CL_SUCCESS,
                count: n,
            },
            &[],
        );
        Ok(())
    }

    pub(crate) fn clone_kernel(&mut self, id: Id, source: Id) -> CallResult {
        self.create(id, Kind::Kernel, |s| {
            let k = s.objects.handle(source, Kind::Kernel)?;
            let f = vfn!(k.get(), clCloneKernel)?;
            let mut err = CL_SUCCESS;
            // SAFETY: a live kernel.
            let h = unsafe { f(k.get().cast(), &mut err) };
            Ok((made(h, err)?, Detail::Plain))
        })
    }

    /// The vendor handle behind an object argument: a memory object, a
    /// sampler or a (device) queue; anything else is a forged argument.
    fn arg_object(&self, id: Id) -> CallResult<VPtr> {
        let o = self.objects.lookup(id)?;
        match o.kind {
            Kind::Mem | Kind::Sampler | Kind::Queue => o.handle.map_err(CallError::Cl),
            other => Err(CallError::Violation(format!(
                "id {id} names {}, which cannot be a kernel argument",
                other.a()
            ))),
        }
    }

    pub(crate) fn set_kernel_arg(&mut self, kernel: Id, index: u32, arg: &KernelArg) -> CallResult {
        let k = self.objects.handle(kernel, Kind::Kernel)?;
        let f = vfn!(k.get(), clSetKernelArg)?;
        let object = |h: *mut c_void| {
            // SAFETY: a live kernel; the value is one object handle, which
            // the vendor copies.
            unsafe {
                f(
                    k.get().cast(),
                    index,
                    size_of::<*mut c_void>(),
                    (&raw const h).cast(),
                )
            }
        };
        let rc = match arg {
            KernelArg::Bytes(b) => {
                let value = if b.is_empty() {
                    std::ptr::null()
                } else {
                    b.as_ptr().cast()
                };
                // SAFETY: `value` is b.len() bytes (or NULL), copied by the
                // vendor.
                unsafe { f(k.get().cast(), index, b.len(), value) }
            }
            // SAFETY: a __local argument: a size and a NULL value.
            KernelArg::Local(n) => unsafe {
                f(k.get().cast(), index, *n as usize, std::ptr::null())
            },
            KernelArg::Object(id) => object(self.arg_object(*id)?.get()),
            KernelArg::NullObject => object(std::ptr::null_mut()),
        };
        check(rc)
    }
}
