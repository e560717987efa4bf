//! Moving a process onto other devices (another GPU model, another vendor, the
//! CPU): what must hold on the new devices for the move to go ahead.
//!
//! The policy (docs/architecture.md, "Resume anywhere"): after a move, the
//! process's handles refer to the new devices and every query answers with
//! the new devices' values. A move is refused, and the process carries on
//! where it was, when something the application already did would not work
//! there: an allocation larger than the new device allows, more memory in
//! all than it has, images where it has none, a program it cannot make (IL,
//! built-in kernels), a kernel launched with a work-group it cannot run, more
//! local memory than it has.
//!
//! [`check_objects`] runs once the new vendor is loaded and before anything
//! is recreated on it; [`check_launches`] once the kernels exist there (a
//! kernel's work-group limit is known only then). Either failure undoes the
//! move (`lifecycle::rebuild`).

use std::sync::Arc;

use opencl_sys::*;

use crate::handle;
use crate::objects::*;
use crate::vendor::{Moved, device_string, device_value, vfn};

/// Which contexts a rebuild checks: those with a device that moved, or all
/// of them on crane-proxy (its vendor, even the same device, may have other
/// limits: another driver, other settings).
#[derive(Clone, Copy)]
pub struct Scope<'a> {
    pub moved: &'a [Moved],
    pub remote: bool,
}

impl Scope<'_> {
    fn nothing(&self) -> bool {
        self.moved.is_empty() && !self.remote
    }

    fn covers(&self, ctx: &Context) -> bool {
        self.remote
            || ctx.devices.iter().any(|d| {
                self.moved
                    .iter()
                    .any(|m| std::ptr::eq(d.root(), &*m.device))
            })
    }
}

/// The vendor devices of a context, with their description for messages.
fn new_devices(ctx: &Context) -> Vec<(cl_device_id, String)> {
    ctx.devices
        .iter()
        .map(|d| (d.base.vendor().cast(), d.now().to_string()))
        .collect()
}

/// What the objects the process holds need of the devices they move to.
pub fn check_objects(scope: Scope<'_>) -> Result<(), String> {
    if scope.nothing() {
        return Ok(());
    }
    let mems = handle::live::<Mem>();
    for ctx in handle::live::<Context>() {
        if !scope.covers(&ctx) {
            continue;
        }
        // The objects that own storage (sub-buffers live in their parent's).
        let mine: Vec<&Arc<Mem>> = mems
            .iter()
            .filter(|m| {
                Arc::ptr_eq(&m.context, &ctx) && !matches!(m.kind, MemKind::SubBuffer { .. })
            })
            .collect();
        let total: u64 = mine.iter().map(|m| m.size as u64).sum();
        let biggest = mine.iter().map(|m| m.size as u64).max();
        let images = mine.iter().any(|m| m.is_image());
        // A query that fails (a connection to crane-proxy that broke) refuses
        // nothing here: the rebuild then fails and says why.
        for (vd, name) in new_devices(&ctx) {
            let max_alloc: u64 = device_value(vd, CL_DEVICE_MAX_MEM_ALLOC_SIZE).unwrap_or(u64::MAX);
            let global: u64 = device_value(vd, CL_DEVICE_GLOBAL_MEM_SIZE).unwrap_or(u64::MAX);
            if let Some(big) = biggest.filter(|&b| b > max_alloc) {
                return Err(refused(
                    &name,
                    format!(
                        "the process holds a memory object of {big} bytes, larger than the \
                         largest allocation there ({max_alloc} bytes)"
                    ),
                ));
            }
            if total > global {
                return Err(refused(
                    &name,
                    format!(
                        "the process holds {total} bytes of memory objects, more than the \
                         device's memory ({global} bytes)"
                    ),
                ));
            }
            if images && device_value::<cl_bool>(vd, CL_DEVICE_IMAGE_SUPPORT) == Some(CL_FALSE) {
                return Err(refused(
                    &name,
                    "the process uses images and the device has no image support".into(),
                ));
            }
            check_programs(&ctx, vd, &name)?;
            check_local_memory(&ctx, vd, &name)?;
        }
    }
    Ok(())
}

fn refused(device: &str, why: String) -> String {
    format!("the move to {device} was refused: {why}")
}

/// Programs the new device cannot make: IL where it takes none, built-in
/// kernels it lacks.
fn check_programs(ctx: &Arc<Context>, vd: cl_device_id, name: &str) -> Result<(), String> {
    for p in handle::live::<Program>() {
        if !Arc::ptr_eq(&p.context, ctx) {
            continue;
        }
        match &p.source {
            ProgramSource::Il(_) => {
                let il = device_string(vd, CL_DEVICE_IL_VERSION);
                if il.is_some_and(|il| il.trim().is_empty()) {
                    return Err(refused(
                        name,
                        "the process has a program made from IL (SPIR-V) and the device \
                         takes no IL"
                            .into(),
                    ));
                }
            }
            ProgramSource::BuiltIn(_, kernels) => {
                let Some(offered) = device_string(vd, CL_DEVICE_BUILT_IN_KERNELS) else {
                    continue;
                };
                let offered: Vec<&str> = offered.split(';').map(str::trim).collect();
                if let Some(k) = kernels
                    .to_string_lossy()
                    .split(';')
                    .map(str::trim)
                    .find(|k| !k.is_empty() && !offered.contains(k))
                {
                    return Err(refused(
                        name,
                        format!(
                            "the process uses the built-in kernel {k:?}, which the device lacks"
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Kernels whose `__local` arguments ask for more than the device has.
fn check_local_memory(ctx: &Arc<Context>, vd: cl_device_id, name: &str) -> Result<(), String> {
    let have: u64 = device_value(vd, CL_DEVICE_LOCAL_MEM_SIZE).unwrap_or(u64::MAX);
    for k in handle::live::<Kernel>() {
        if !Arc::ptr_eq(&k.program.context, ctx) {
            continue;
        }
        // SAFETY: the gate is shut (suspended): no application thread touches
        // the kernel's arguments.
        let asked: u64 = unsafe { k.args_mut() }
            .iter()
            .map(|a| match a {
                ArgValue::Local(n) => *n as u64,
                _ => 0,
            })
            .sum();
        if asked > have {
            return Err(refused(
                name,
                format!(
                    "kernel {:?} has {asked} bytes of local memory set, more than the device \
                     has ({have} bytes)",
                    k.name
                ),
            ));
        }
    }
    Ok(())
}

/// Kernels launched with a work-group the new device cannot run.
pub fn check_launches(scope: Scope<'_>) -> Result<(), String> {
    if scope.nothing() {
        return Ok(());
    }
    for k in handle::live::<Kernel>() {
        let (dims, total) = k.largest_local();
        if total == 0 || !scope.covers(&k.program.context) {
            continue;
        }
        let vk = k.base.vendor();
        for (vd, name) in new_devices(&k.program.context) {
            let mut wg = 0usize;
            // SAFETY: a size_t answer into `wg`.
            let rc = unsafe {
                vfn!(vk, clGetKernelWorkGroupInfo)
                    .map(|f| {
                        f(
                            vk.cast(),
                            vd,
                            CL_KERNEL_WORK_GROUP_SIZE,
                            size_of::<usize>(),
                            (&raw mut wg).cast(),
                            std::ptr::null_mut(),
                        )
                    })
                    .unwrap_or(CL_INVALID_OPERATION)
            };
            if rc != CL_SUCCESS {
                // Not built for this device of the context: nothing launched
                // it there.
                continue;
            }
            // The first three dimensions (a device with more fails the
            // query: then no per-dimension check).
            let items: [usize; 3] =
                device_value(vd, CL_DEVICE_MAX_WORK_ITEM_SIZES).unwrap_or([usize::MAX; 3]);
            let too_wide = dims.iter().zip(items).any(|(&d, max)| d > max);
            if total > wg || too_wide {
                return Err(refused(
                    &name,
                    format!(
                        "kernel {:?} was launched with work-groups of {:?} ({total} \
                         work-items), and there it runs at most {wg} work-items per group, \
                         at most {items:?} per dimension",
                        k.name, dims
                    ),
                ));
            }
        }
    }
    Ok(())
}
