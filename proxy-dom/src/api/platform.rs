//! Platforms, devices, sub-devices, and `clGet*Info` for every object.

use std::ffi::c_void;

use crane_wire::{Answer, Id, InfoKind};
use log::Level;
use opencl_sys::*;

use super::{check, query, raw, terminated};
use crate::ratelimit::limited;
use crate::session::objects::{Detail, Kind};
use crate::session::{CallError, CallResult, Session};
use crate::vendor::{VPtr, vfn};

/// Info parameters whose values are vendor handles (or, for
/// `CL_PROGRAM_BINARIES`, an array of pointers the vendor writes through).
/// The client answers these itself from its own objects; the proxy refuses
/// them rather than leak its addresses or write through a client's bytes.
fn handle_valued(kind: &InfoKind, param: u32) -> bool {
    let list: &[u32] = match kind {
        InfoKind::Device => &[CL_DEVICE_PLATFORM, CL_DEVICE_PARENT_DEVICE],
        InfoKind::Context => &[CL_CONTEXT_DEVICES, CL_CONTEXT_PROPERTIES],
        InfoKind::Queue => &[CL_QUEUE_CONTEXT, CL_QUEUE_DEVICE, CL_QUEUE_DEVICE_DEFAULT],
        InfoKind::Mem => &[CL_MEM_HOST_PTR, CL_MEM_CONTEXT, CL_MEM_ASSOCIATED_MEMOBJECT],
        InfoKind::Image => &[CL_IMAGE_BUFFER],
        InfoKind::Sampler => &[CL_SAMPLER_CONTEXT],
        InfoKind::Program => &[CL_PROGRAM_CONTEXT, CL_PROGRAM_DEVICES, CL_PROGRAM_BINARIES],
        InfoKind::Kernel => &[CL_KERNEL_CONTEXT, CL_KERNEL_PROGRAM],
        InfoKind::Event => &[CL_EVENT_COMMAND_QUEUE, CL_EVENT_CONTEXT],
        _ => &[],
    };
    list.contains(&param)
}

impl Session {
    /// Names vendor-owned objects (platforms, root devices) with the
    /// client's ids. Naming the same object with the same id again is
    /// harmless: clients ask for platforms and devices more than once.
    fn name_roots(&mut self, ids: &[Id], kind: Kind, handles: &[VPtr]) -> CallResult {
        let pairs: Vec<(Id, VPtr)> = ids.iter().copied().zip(handles.iter().copied()).collect();
        let mut fresh = Vec::new();
        for &(id, h) in &pairs {
            if self.objects.contains(id) {
                let o = self.objects.get(id, kind)?;
                if o.handle != Ok(h) {
                    return Err(CallError::Violation(format!(
                        "id {id} already names another {}",
                        kind.name()
                    )));
                }
            } else {
                fresh.push(id);
            }
        }
        self.objects.check_new_all(&fresh)?;
        self.objects.admit_n(fresh.len() as u64)?;
        for (id, h) in pairs {
            if fresh.contains(&id) {
                self.objects.insert(id, kind, h, Detail::Root);
            }
        }
        Ok(())
    }

    pub(crate) fn get_platform_ids(&mut self, seq: u64, ids: &[Id]) -> CallResult {
        let platforms = self.shared.vendor.platforms();
        self.name_roots(ids, Kind::Platform, &platforms)?;
        let count = platforms.len() as u32;
        self.reply(
            seq,
            &Answer::Count {
                status: CL_SUCCESS,
                count,
            },
            &[],
        );
        Ok(())
    }

    /// The platform `id`, or the first one for id 0 (OpenCL leaves a NULL
    /// platform to the implementation).
    pub(crate) fn platform_or_default(&self, id: Id) -> CallResult<VPtr> {
        if id != 0 {
            return self.objects.handle(id, Kind::Platform);
        }
        self.shared
            .vendor
            .platforms()
            .first()
            .copied()
            .ok_or(CallError::Cl(CL_INVALID_PLATFORM))
    }

    pub(crate) fn get_device_ids(
        &mut self,
        seq: u64,
        platform: Id,
        device_type: u64,
        ids: &[Id],
    ) -> CallResult {
        let p = self.platform_or_default(platform)?;
        let f = vfn!(p.get(), clGetDeviceIDs)?;
        let mut n: cl_uint = 0;
        // SAFETY: a count query on a live platform.
        check(unsafe { f(p.get().cast(), device_type, 0, std::ptr::null_mut(), &mut n) })?;
        let mut devices: Vec<cl_device_id> = vec![std::ptr::null_mut(); n as usize];
        if n > 0 {
            // SAFETY: `devices` holds n entries.
            check(unsafe {
                f(
                    p.get().cast(),
                    device_type,
                    n,
                    devices.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })?;
        }
        let devices: Vec<VPtr> = devices.into_iter().map(|d| VPtr(d.cast())).collect();
        self.name_roots(ids, Kind::Device, &devices)?;
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

    pub(crate) fn create_sub_devices(
        &mut self,
        seq: u64,
        device: Id,
        props: &[u64],
        ids: &[Id],
    ) -> CallResult {
        let d = self.objects.handle(device, Kind::Device)?;
        let f = vfn!(d.get(), clCreateSubDevices)?;
        let props: Vec<cl_device_partition_property> = terminated(props, |v| v as isize, 0);
        if props.is_empty() {
            return Err(CallError::Cl(CL_INVALID_VALUE));
        }
        let mut n: cl_uint = 0;
        if ids.is_empty() {
            // SAFETY: a count query: no sub-devices are made.
            check(unsafe {
                f(
                    d.get().cast(),
                    props.as_ptr(),
                    0,
                    std::ptr::null_mut(),
                    &mut n,
                )
            })?;
        } else {
            self.objects.check_new_all(ids)?;
            self.objects.admit_n(ids.len() as u64)?;
            let mut out: Vec<cl_device_id> = vec![std::ptr::null_mut(); ids.len()];
            // SAFETY: `out` holds ids.len() entries, the count passed.
            check(unsafe {
                f(
                    d.get().cast(),
                    props.as_ptr(),
                    out.len() as cl_uint,
                    out.as_mut_ptr(),
                    &mut n,
                )
            })?;
            for (&id, &sub) in ids.iter().zip(out.iter().take(n as usize)) {
                if !sub.is_null() {
                    self.objects
                        .insert(id, Kind::Device, VPtr(sub.cast()), Detail::Plain);
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

    pub(crate) fn get_info(
        &mut self,
        seq: u64,
        kind: &InfoKind,
        object: Id,
        param: u32,
    ) -> CallResult {
        if handle_valued(kind, param) {
            limited!(
                Level::Debug,
                "session {}: info parameter {param:#x} is handle-valued; the client answers it",
                self.id
            );
            return Err(CallError::Cl(CL_INVALID_VALUE));
        }
        let objects = &self.objects;
        let null = std::ptr::null_mut::<c_void>;
        let value = match kind {
            InfoKind::Platform => {
                let h = objects.handle(object, Kind::Platform)?;
                let f = vfn!(h.get(), clGetPlatformInfo)?;
                // SAFETY: `h` is live and the vendor writes at most `size`
                // bytes to `v`, as OpenCL specifies (so below, "as above").
                query(|size, v, ret| unsafe { f(h.get().cast(), param, size, v, ret) })
            }
            InfoKind::Device => {
                let h = objects.handle(object, Kind::Device)?;
                let f = vfn!(h.get(), clGetDeviceInfo)?;
                // SAFETY: as above.
                query(|size, v, ret| unsafe { f(h.get().cast(), param, size, v, ret) })
            }
            InfoKind::Context => {
                let h = objects.handle(object, Kind::Context)?;
                let f = vfn!(h.get(), clGetContextInfo)?;
                // SAFETY: as above.
                query(|size, v, ret| unsafe { f(h.get().cast(), param, size, v, ret) })
            }
            InfoKind::Queue => {
                let h = objects.handle(object, Kind::Queue)?;
                let f = vfn!(h.get(), clGetCommandQueueInfo)?;
                // SAFETY: as above.
                query(|size, v, ret| unsafe { f(h.get().cast(), param, size, v, ret) })
            }
            InfoKind::Mem => {
                let h = objects.handle(object, Kind::Mem)?;
                let f = vfn!(h.get(), clGetMemObjectInfo)?;
                // SAFETY: as above.
                query(|size, v, ret| unsafe { f(h.get().cast(), param, size, v, ret) })
            }
            InfoKind::Image => {
                let h = objects.handle(object, Kind::Mem)?;
                let f = vfn!(h.get(), clGetImageInfo)?;
                // SAFETY: as above.
                query(|size, v, ret| unsafe { f(h.get().cast(), param, size, v, ret) })
            }
            InfoKind::Pipe => {
                let h = objects.handle(object, Kind::Mem)?;
                let f = vfn!(h.get(), clGetPipeInfo)?;
                // SAFETY: as above.
                query(|size, v, ret| unsafe { f(h.get().cast(), param, size, v, ret) })
            }
            InfoKind::Sampler => {
                let h = objects.handle(object, Kind::Sampler)?;
                let f = vfn!(h.get(), clGetSamplerInfo)?;
                // SAFETY: as above.
                query(|size, v, ret| unsafe { f(h.get().cast(), param, size, v, ret) })
            }
            InfoKind::Program => {
                let h = objects.handle(object, Kind::Program)?;
                let f = vfn!(h.get(), clGetProgramInfo)?;
                // SAFETY: as above.
                query(|size, v, ret| unsafe { f(h.get().cast(), param, size, v, ret) })
            }
            InfoKind::ProgramBuild { device } => {
                let h = objects.handle(object, Kind::Program)?;
                let d = objects.handle(*device, Kind::Device)?;
                let f = vfn!(h.get(), clGetProgramBuildInfo)?;
                // SAFETY: as above; `d` is a live device.
                query(|size, v, ret| unsafe {
                    f(h.get().cast(), d.get().cast(), param, size, v, ret)
                })
            }
            InfoKind::Kernel => {
                let h = objects.handle(object, Kind::Kernel)?;
                let f = vfn!(h.get(), clGetKernelInfo)?;
                // SAFETY: as above.
                query(|size, v, ret| unsafe { f(h.get().cast(), param, size, v, ret) })
            }
            InfoKind::KernelWorkGroup { device } => {
                let h = objects.handle(object, Kind::Kernel)?;
                let d = objects.handle_or_null(*device, Kind::Device)?;
                let f = vfn!(h.get(), clGetKernelWorkGroupInfo)?;
                // SAFETY: as above; `d` is a live device or NULL.
                query(|size, v, ret| unsafe {
                    f(h.get().cast(), d.get().cast(), param, size, v, ret)
                })
            }
            InfoKind::KernelArg { index } => {
                let h = objects.handle(object, Kind::Kernel)?;
                let f = vfn!(h.get(), clGetKernelArgInfo)?;
                // SAFETY: as above.
                query(|size, v, ret| unsafe { f(h.get().cast(), *index, param, size, v, ret) })
            }
            InfoKind::KernelSubGroup { device, input } => {
                let h = objects.handle(object, Kind::Kernel)?;
                let d = objects.handle_or_null(*device, Kind::Device)?;
                let f = vfn!(h.get(), clGetKernelSubGroupInfo)
                    .or_else(|_| vfn!(h.get(), clGetKernelSubGroupInfoKHR))?;
                let input_ptr = if input.is_empty() {
                    null()
                } else {
                    input.as_ptr() as *mut c_void
                };
                // SAFETY: as above; the input value is `input.len()` bytes
                // the vendor only reads.
                query(|size, v, ret| unsafe {
                    f(
                        h.get().cast(),
                        d.get().cast(),
                        param,
                        input.len(),
                        input_ptr,
                        size,
                        v,
                        ret,
                    )
                })
            }
            InfoKind::Event => {
                let h = objects.handle(object, Kind::Event)?;
                let f = vfn!(h.get(), clGetEventInfo)?;
                // SAFETY: as above.
                query(|size, v, ret| unsafe { f(h.get().cast(), param, size, v, ret) })
            }
            InfoKind::EventProfiling => {
                let h = objects.handle(object, Kind::Event)?;
                let f = vfn!(h.get(), clGetEventProfilingInfo)?;
                // SAFETY: as above.
                query(|size, v, ret| unsafe { f(h.get().cast(), param, size, v, ret) })
            }
        }?;
        self.reply(seq, &Answer::Info(CL_SUCCESS), &value);
        Ok(())
    }

    /// The platforms' and devices' handles as vendor pointers (for calls
    /// that take device lists).
    pub(crate) fn device_list(&self, ids: &[Id]) -> CallResult<Vec<cl_device_id>> {
        Ok(raw(&self.objects.handles(ids, Kind::Device)?))
    }
}
