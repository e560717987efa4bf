//! Contexts and command queues.

use crane_wire::Id;
use opencl_sys::*;

use super::{check, made, or_null, terminated};
use crate::session::objects::{Detail, Kind};
use crate::session::{CallError, CallResult, Session};
use crate::vendor::{VPtr, vfn};

impl Session {
    /// Context properties for the vendor, terminated, with the platform id
    /// translated; also the platform named, if any. Properties whose values
    /// the proxy cannot vouch for (pointers of other APIs) are refused.
    fn context_props(
        &self,
        props: &[u64],
    ) -> CallResult<(Vec<cl_context_properties>, Option<VPtr>)> {
        if props.is_empty() {
            return Ok((Vec::new(), None));
        }
        if !props.len().is_multiple_of(2) {
            return Err(CallError::Cl(CL_INVALID_PROPERTY));
        }
        let mut out = Vec::with_capacity(props.len() + 1);
        let mut platform = None;
        for pair in props.chunks_exact(2) {
            let (key, value) = (pair[0] as cl_context_properties, pair[1]);
            let value = match key {
                CL_CONTEXT_PLATFORM => {
                    let p = self.objects.handle(value, Kind::Platform)?;
                    platform = Some(p);
                    p.get() as cl_context_properties
                }
                CL_CONTEXT_INTEROP_USER_SYNC => value as cl_context_properties,
                _ => return Err(CallError::Cl(CL_INVALID_PROPERTY)),
            };
            out.extend([key, value]);
        }
        out.push(0);
        Ok((out, platform))
    }

    pub(crate) fn create_context(&mut self, id: Id, props: &[u64], devices: &[Id]) -> CallResult {
        self.create(id, Kind::Context, |s| {
            let (props, _) = s.context_props(props)?;
            let devices = s.device_list(devices)?;
            let first = *devices.first().ok_or(CallError::Cl(CL_INVALID_VALUE))?;
            // One made ahead for exactly this device and these properties
            // (crate::warm): a move here does not wait for the driver's.
            // Its replacement waits until the session's calls so far have
            // run (`Session::warm_refills`).
            if devices.len() == 1 {
                let (ready, refill) = crate::warm::take(first, &props);
                s.warm_refills.extend(refill);
                if let Some(c) = ready {
                    return Ok((c, Detail::Plain));
                }
            }
            let f = vfn!(first, clCreateContext)?;
            let mut err = CL_SUCCESS;
            // SAFETY: live devices, a terminated property list (or NULL),
            // no notification callback.
            let h = unsafe {
                f(
                    or_null(&props),
                    devices.len() as cl_uint,
                    devices.as_ptr(),
                    None,
                    std::ptr::null_mut(),
                    &mut err,
                )
            };
            Ok((made(h, err)?, Detail::Plain))
        })
    }

    pub(crate) fn create_context_from_type(
        &mut self,
        id: Id,
        props: &[u64],
        device_type: u64,
    ) -> CallResult {
        self.create(id, Kind::Context, |s| {
            let (props, platform) = s.context_props(props)?;
            // Like the ICD loader: the platform named, else the first one.
            let p = match platform {
                Some(p) => p,
                None => s.platform_or_default(0)?,
            };
            let f = vfn!(p.get(), clCreateContextFromType)?;
            let mut err = CL_SUCCESS;
            // SAFETY: a terminated property list (or NULL), no callback.
            let h = unsafe {
                f(
                    or_null(&props),
                    device_type,
                    None,
                    std::ptr::null_mut(),
                    &mut err,
                )
            };
            Ok((made(h, err)?, Detail::Plain))
        })
    }

    pub(crate) fn create_queue(
        &mut self,
        id: Id,
        context: Id,
        device: Id,
        props: &[u64],
    ) -> CallResult {
        self.create(id, Kind::Queue, |s| {
            let ctx = s.objects.handle(context, Kind::Context)?;
            let dev = s.objects.handle(device, Kind::Device)?;
            check_device_queue(dev, props)?;
            let mut err = CL_SUCCESS;
            let h = match vfn!(ctx.get(), clCreateCommandQueueWithProperties) {
                Ok(f) => {
                    let props: Vec<cl_queue_properties> = terminated(props, |v| v, 0);
                    // SAFETY: live context and device; a terminated list of
                    // scalar queue properties (or NULL).
                    unsafe {
                        f(
                            ctx.get().cast(),
                            dev.get().cast(),
                            or_null(&props),
                            &mut err,
                        )
                    }
                }
                Err(_) => {
                    // An OpenCL 1.x vendor: only CL_QUEUE_PROPERTIES exists.
                    let mut qp = 0;
                    for pair in props.chunks(2) {
                        match pair {
                            [k, v] if *k == u64::from(CL_QUEUE_PROPERTIES) => qp = *v,
                            _ => return Err(CallError::Cl(CL_INVALID_VALUE)),
                        }
                    }
                    let f = vfn!(ctx.get(), clCreateCommandQueue)?;
                    // SAFETY: live context and device.
                    unsafe { f(ctx.get().cast(), dev.get().cast(), qp, &mut err) }
                }
            };
            Ok((made(h, err)?, Detail::Plain))
        })
    }
}

impl Session {
    /// `clSetCommandQueueProperty`: answers the properties the queue had.
    pub(crate) fn set_queue_property(
        &mut self,
        seq: u64,
        queue: Id,
        properties: u64,
        enable: bool,
    ) -> CallResult {
        let q = self.objects.handle(queue, Kind::Queue)?;
        #[allow(deprecated)]
        let f = vfn!(q.get(), clSetCommandQueueProperty)?;
        let mut old: cl_command_queue_properties = 0;
        // SAFETY: a live queue; `old` is one value.
        check(unsafe { f(q.get().cast(), properties, cl_bool::from(enable), &mut old) })?;
        self.reply(
            seq,
            &crane_wire::Answer::Info(CL_SUCCESS),
            &old.to_le_bytes(),
        );
        Ok(())
    }
}

/// Refuses, with the specification's codes, device-side queue properties the
/// device cannot have: PoCL aborts the whole process when asked for a
/// device-side queue, so a client must not reach it with one.
/// "CL_INVALID_VALUE if values specified in properties are not valid";
/// "CL_INVALID_QUEUE_PROPERTIES if values specified in properties are valid
/// but are not supported by the device".
fn check_device_queue(dev: VPtr, props: &[u64]) -> CallResult {
    let mut qp = 0u64;
    let mut size = false;
    for pair in props.chunks(2) {
        match pair {
            [k, v] if *k == u64::from(CL_QUEUE_PROPERTIES) => qp = *v,
            [k, _] if *k == u64::from(CL_QUEUE_SIZE) => size = true,
            _ => {}
        }
    }
    let on_device = qp & CL_QUEUE_ON_DEVICE != 0;
    if (qp & CL_QUEUE_ON_DEVICE_DEFAULT != 0 || size) && !on_device {
        return Err(CallError::Cl(CL_INVALID_VALUE));
    }
    if !on_device {
        return Ok(());
    }
    if qp & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE == 0 {
        return Err(CallError::Cl(CL_INVALID_VALUE));
    }
    let mut max: cl_uint = 0;
    let f = vfn!(dev.get(), clGetDeviceInfo)?;
    // SAFETY: a live device and room for the cl_uint value.
    let rc = unsafe {
        f(
            dev.get().cast(),
            CL_DEVICE_QUEUE_ON_DEVICE_MAX_SIZE,
            std::mem::size_of::<cl_uint>(),
            (&raw mut max).cast(),
            std::ptr::null_mut(),
        )
    };
    if rc != CL_SUCCESS || max == 0 {
        return Err(CallError::Cl(CL_INVALID_QUEUE_PROPERTIES));
    }
    Ok(())
}
