//! Kernels and their arguments.

use std::ffi::c_void;

use crane_wire::{Answer, ArgDesc, Id, KernelArg, KernelDevice, MAX_DESCRIBED_DEVICES};
use opencl_sys::*;

use super::{c_string, check, made, query};
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

    /// Replies `Kernel`: the kernel's arguments (`clGetKernelArgInfo`) and,
    /// per device, its work-group limits, which the client checks
    /// `clSetKernelArg` and `clEnqueueNDRangeKernel` against.
    pub(crate) fn describe_kernel(&mut self, seq: u64, kernel: Id, devices: &[Id]) -> CallResult {
        if devices.len() > MAX_DESCRIBED_DEVICES {
            return Err(CallError::Cl(CL_INVALID_VALUE));
        }
        let k = self.objects.handle(kernel, Kind::Kernel)?;
        let devs = self.objects.handles(devices, Kind::Device)?;
        let kh = k.get();
        let mut n: cl_uint = 0;
        let info = vfn!(kh, clGetKernelInfo)?;
        // SAFETY: a live kernel; one cl_uint.
        check(unsafe {
            info(
                kh.cast(),
                CL_KERNEL_NUM_ARGS,
                size_of::<cl_uint>(),
                (&raw mut n).cast(),
                std::ptr::null_mut(),
            )
        })?;
        let arg_info = vfn!(kh, clGetKernelArgInfo)?;
        let arg = |i: cl_uint, param: cl_uint| {
            // SAFETY: a live kernel; the vendor writes at most `size` bytes.
            query(|size, v, ret| unsafe { arg_info(kh.cast(), i, param, size, v, ret) })
        };
        let num = |v: &[u8]| {
            let mut a = [0u8; 8];
            let l = v.len().min(8);
            a[..l].copy_from_slice(&v[..l]);
            u64::from_le_bytes(a)
        };
        let mut args = Vec::with_capacity(n.min(4096) as usize);
        for i in 0..n {
            let d = (|| -> CallResult<ArgDesc> {
                let address = num(&arg(i, CL_KERNEL_ARG_ADDRESS_QUALIFIER)?) as u32;
                let access = num(&arg(i, CL_KERNEL_ARG_ACCESS_QUALIFIER)?) as u32;
                let type_qualifier = num(&arg(i, CL_KERNEL_ARG_TYPE_QUALIFIER)?);
                let mut name = arg(i, CL_KERNEL_ARG_TYPE_NAME)?;
                if let Some(z) = name.iter().position(|&b| b == 0) {
                    name.truncate(z);
                }
                name.truncate(255);
                Ok(ArgDesc {
                    status: CL_SUCCESS,
                    address,
                    access,
                    type_qualifier,
                    type_name: String::from_utf8_lossy(&name).into_owned(),
                })
            })();
            args.push(match d {
                Ok(d) => d,
                Err(CallError::Cl(status)) => ArgDesc {
                    status,
                    address: 0,
                    access: 0,
                    type_qualifier: 0,
                    type_name: String::new(),
                },
                Err(e) => return Err(e),
            });
        }
        let wg_info = vfn!(kh, clGetKernelWorkGroupInfo)?;
        let mut out = Vec::with_capacity(devs.len());
        for (&id, d) in devices.iter().zip(&devs) {
            let dh = d.get();
            let d = (|| -> CallResult<KernelDevice> {
                let dev_info = vfn!(dh, clGetDeviceInfo)?;
                let wg = |param| {
                    // SAFETY: a live kernel and device; as above.
                    query(|size, v, ret| unsafe {
                        wg_info(kh.cast(), dh.cast(), param, size, v, ret)
                    })
                };
                let dev = |param| {
                    // SAFETY: a live device; as above.
                    query(|size, v, ret| unsafe { dev_info(dh.cast(), param, size, v, ret) })
                };
                let sizes = |v: Vec<u8>| {
                    let mut a = [1u64; 3];
                    for (i, c) in v.chunks_exact(8).take(3).enumerate() {
                        a[i] = num(c);
                    }
                    a
                };
                let version = dev(CL_DEVICE_VERSION)?;
                let version = String::from_utf8_lossy(&version).into_owned();
                let major = version
                    .strip_prefix("OpenCL ")
                    .and_then(|v| v.split('.').next())
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(1);
                let non_uniform = match major {
                    0 | 1 => false,
                    2 => true,
                    _ => dev(CL_DEVICE_NON_UNIFORM_WORK_GROUP_SUPPORT).is_ok_and(|v| num(&v) != 0),
                };
                Ok(KernelDevice {
                    device: id,
                    status: CL_SUCCESS,
                    work_group_size: num(&wg(CL_KERNEL_WORK_GROUP_SIZE)?),
                    compile_work_group_size: sizes(wg(CL_KERNEL_COMPILE_WORK_GROUP_SIZE)?),
                    max_dims: num(&dev(CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS)?) as u32,
                    max_item_sizes: sizes(dev(CL_DEVICE_MAX_WORK_ITEM_SIZES)?),
                    max_work_group_size: num(&dev(CL_DEVICE_MAX_WORK_GROUP_SIZE)?),
                    non_uniform,
                })
            })();
            out.push(match d {
                Ok(d) => d,
                Err(CallError::Cl(status)) => KernelDevice {
                    device: id,
                    status,
                    work_group_size: 0,
                    compile_work_group_size: [0; 3],
                    max_dims: 0,
                    max_item_sizes: [0; 3],
                    max_work_group_size: 0,
                    non_uniform: false,
                },
                Err(e) => return Err(e),
            });
        }
        self.reply(
            seq,
            &Answer::Kernel {
                status: CL_SUCCESS,
                args,
                devices: out,
            },
            &[],
        );
        Ok(())
    }
}
