//! What the client checks before it posts a kernel argument or a launch.
//!
//! `clSetKernelArg` and `clEnqueueNDRangeKernel` are posted (not waited
//! for), so an error the proxy's vendor finds only reaches the application
//! with its next `clFinish`. The cases the specification makes errors of
//! these calls are checked here instead, against a description of the kernel
//! fetched once ([`crane_wire::Call::DescribeKernel`]: its arguments'
//! qualifiers and types, and per device its work-group limits), and the
//! same error is returned at once. Checks follow the order PoCL makes them
//! in, so a call with several faults gets the vendor's code; anything this
//! module cannot be sure of (an argument of unknown type, a device that may
//! run non-uniform work-groups) is left to the proxy, and reported late as
//! before.

use std::sync::Arc;

use crane_wire::{Answer, ArgDesc, Call, Id, KernelDevice, MINOR_DESCRIBE_KERNEL};
use opencl_sys::*;

use super::RObj;
use super::session::{Dest, Session};

/// The size of a memory object, sampler or queue argument.
const PTR: usize = size_of::<*mut std::ffi::c_void>();

/// What kind of argument a kernel parameter is, as far as the checks go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgClass {
    /// Nothing is checked (no argument information, pipes, queues, events).
    Unknown,
    /// `__local` memory: a size and a NULL value.
    Local,
    /// A `__global` or `__constant` pointer: a buffer (or NULL).
    Pointer,
    Image,
    Sampler,
    /// A value of this many bytes (None: a type whose size is not known
    /// here, a struct or a typedef).
    Value(Option<usize>),
}

/// A kernel's description.
#[derive(Debug)]
pub struct KernelMeta {
    pub args: Vec<ArgDesc>,
    pub class: Vec<ArgClass>,
    pub devices: Vec<KernelDevice>,
}

impl KernelMeta {
    pub fn new(args: Vec<ArgDesc>, devices: Vec<KernelDevice>) -> KernelMeta {
        KernelMeta {
            class: args.iter().map(classify).collect(),
            args,
            devices,
        }
    }

    /// The limits of the launch on `device`, if known.
    fn device(&self, device: Id) -> Option<&KernelDevice> {
        self.devices
            .iter()
            .find(|d| d.device == device && d.status == CL_SUCCESS)
    }
}

fn classify(a: &ArgDesc) -> ArgClass {
    if a.status != CL_SUCCESS || a.type_qualifier & CL_KERNEL_ARG_TYPE_PIPE as u64 != 0 {
        return ArgClass::Unknown;
    }
    let name = a.type_name.trim();
    if a.address == CL_KERNEL_ARG_ADDRESS_LOCAL {
        return ArgClass::Local;
    }
    if a.access != CL_KERNEL_ARG_ACCESS_NONE || name.starts_with("image") {
        return ArgClass::Image;
    }
    if name == "sampler_t" {
        return ArgClass::Sampler;
    }
    if a.address == CL_KERNEL_ARG_ADDRESS_GLOBAL || a.address == CL_KERNEL_ARG_ADDRESS_CONSTANT {
        return if name.ends_with('*') {
            ArgClass::Pointer
        } else {
            ArgClass::Unknown
        };
    }
    if name.ends_with('*') || (name.ends_with("_t") && value_size(name).is_none()) {
        // Opaque types (queue_t, clk_event_t, ...), or typedefs.
        return ArgClass::Unknown;
    }
    ArgClass::Value(value_size(name))
}

/// The size of a built-in scalar or vector type of OpenCL C, by name.
fn value_size(name: &str) -> Option<usize> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (base, n) = name.split_at(name.len() - digits);
    let lanes = match n {
        "" => 1,
        "2" => 2,
        "3" | "4" => 4,
        "8" => 8,
        "16" => 16,
        _ => return None,
    };
    let size = match base {
        "char" | "uchar" => 1,
        "short" | "ushort" | "half" => 2,
        "int" | "uint" | "float" => 4,
        "long" | "ulong" | "double" => 8,
        _ => return None,
    };
    Some(size * lanes)
}

/// The kernel's description: cached, else (with `fetch`) asked of the proxy
/// once. None: nothing is known, nothing is checked.
pub fn kernel_meta(k: &RObj, fetch: bool) -> Option<Arc<KernelMeta>> {
    if let Some(m) = k.kmeta.get() {
        return m.clone();
    }
    if !fetch || k.session.proxy_minor < MINOR_DESCRIBE_KERNEL {
        return None;
    }
    let devices: Vec<Id> = k
        .devices_of()
        .into_iter()
        .map(|d| super::id_of(d as *mut std::ffi::c_void))
        .collect();
    let call = Call::DescribeKernel {
        kernel: k.id,
        devices,
    };
    let m = match k.session.call(&call, &[], Dest::Keep) {
        Ok((a, _)) => from_answer(a).ok().flatten(),
        Err(_) => None,
    };
    k.kmeta.get_or_init(|| m).clone()
}

/// The description an [`Answer::Kernel`] carries; Err: its status.
pub fn from_answer(a: Answer) -> Result<Option<Arc<KernelMeta>>, cl_int> {
    match a {
        Answer::Kernel {
            status: CL_SUCCESS,
            args,
            devices,
        } => Ok(Some(Arc::new(KernelMeta::new(args, devices)))),
        Answer::Kernel { status, .. } => Err(status),
        _ => Ok(None),
    }
}

/// Sends the creation of kernel `id` (made by `call`) and fetches its
/// description in the same round trip; the creation's error is returned.
pub fn create_kernel(
    s: &Arc<Session>,
    id: Id,
    call: &Call,
    devices: Vec<Id>,
) -> Result<Option<Arc<KernelMeta>>, cl_int> {
    let r = s
        .post_then_call(
            call,
            &[],
            &Call::DescribeKernel {
                kernel: id,
                devices,
            },
        )
        .and_then(from_answer);
    if r.is_err() {
        let _ = s.post(&Call::Release { id }, &[], false);
    }
    r
}

/// `clSetKernelArg`'s errors, in PoCL's order: a value for a `__local`
/// argument, no value for one that is not `__local` or a buffer, a zero
/// local size, an object argument not the size of a handle, a value of the
/// wrong size.
pub fn set_arg(m: &KernelMeta, index: usize, size: usize, null_value: bool) -> Result<(), cl_int> {
    let Some(&class) = m.class.get(index) else {
        return Ok(());
    };
    let local = class == ArgClass::Local;
    match class {
        ArgClass::Unknown => return Ok(()),
        _ if local && !null_value => return Err(CL_INVALID_ARG_VALUE),
        ArgClass::Image | ArgClass::Sampler | ArgClass::Value(_) if null_value => {
            return Err(CL_INVALID_ARG_VALUE);
        }
        _ => {}
    }
    if local && size == 0 {
        return Err(CL_INVALID_ARG_SIZE);
    }
    match class {
        ArgClass::Pointer | ArgClass::Image | ArgClass::Sampler if size != PTR => {
            Err(CL_INVALID_ARG_SIZE)
        }
        // A 3-component vector is sizeof of the 4-component one; PoCL also
        // takes three components' bytes.
        ArgClass::Value(Some(ts))
            if size != ts && !(size.is_multiple_of(3) && size / 3 * 4 == ts) =>
        {
            Err(CL_INVALID_ARG_SIZE)
        }
        _ => Ok(()),
    }
}

/// A launch as `clEnqueueNDRangeKernel` got it (sizes beyond `dims` are 1).
pub struct Launch {
    pub dims: u32,
    /// None: a NULL global size.
    pub global: Option<[u64; 3]>,
    pub local: Option<[u64; 3]>,
}

/// `clEnqueueNDRangeKernel`'s errors, in PoCL's order: contexts, work
/// dimensions, the work-group size against the device's limits, the
/// uniformity of work-groups (where the device cannot run non-uniform ones),
/// the kernel's required and largest work-group size, arguments not set.
pub fn launch(
    m: &KernelMeta,
    set: &[bool],
    queue: &RObj,
    kernel: &RObj,
    l: &Launch,
) -> Result<(), cl_int> {
    let (qc, kc) = (queue.context(), kernel.context());
    if qc != 0 && kc != 0 && qc != kc {
        return Err(CL_INVALID_CONTEXT);
    }
    let dev = m.device(queue.dev.load(std::sync::atomic::Ordering::Relaxed));
    if let Some(d) = dev {
        if l.dims > d.max_dims {
            return Err(CL_INVALID_WORK_DIMENSION);
        }
        let n = l.dims as usize;
        if let Some(g) = l.global.filter(|g| g[..n].iter().all(|&x| x != 0)) {
            if let Some(loc) = l.local {
                let total = loc.iter().try_fold(1u64, |a, &x| a.checked_mul(x));
                if total.is_none_or(|t| t > d.max_work_group_size) {
                    return Err(CL_INVALID_WORK_GROUP_SIZE);
                }
                if (0..n).any(|i| loc[i] > d.max_item_sizes[i]) {
                    return Err(CL_INVALID_WORK_ITEM_SIZE);
                }
                if loc[..n].contains(&0) {
                    return Err(CL_INVALID_WORK_GROUP_SIZE);
                }
                if !d.non_uniform && (0..n).any(|i| g[i] % loc[i] != 0) {
                    return Err(CL_INVALID_WORK_GROUP_SIZE);
                }
            }
            let req = d.compile_work_group_size;
            if req.iter().all(|&x| x > 0) && l.local.is_none_or(|loc| loc != req) {
                return Err(CL_INVALID_WORK_GROUP_SIZE);
            }
            if let Some(loc) = l.local
                && d.work_group_size > 0
                && loc.iter().product::<u64>() > d.work_group_size
            {
                return Err(CL_INVALID_WORK_GROUP_SIZE);
            }
        }
    }
    if m.class.len() > set.len() || set[..m.class.len()].contains(&false) {
        return Err(CL_INVALID_KERNEL_ARGS);
    }
    Ok(())
}

/// The wait list's events must be of the queue's context.
pub fn wait_list(queue: &RObj, events: &[cl_event]) -> Result<(), cl_int> {
    let qc = queue.context();
    if qc == 0 {
        return Ok(());
    }
    for &e in events {
        if let Ok(o) = super::obj(e.cast()) {
            let c = o.context();
            if c != 0 && c != qc {
                return Err(CL_INVALID_CONTEXT);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(address: u32, access: u32, name: &str) -> ArgDesc {
        ArgDesc {
            status: CL_SUCCESS,
            address,
            access,
            type_qualifier: 0,
            type_name: name.into(),
        }
    }

    #[test]
    fn arguments_are_classified_and_checked_like_pocl() {
        let m = KernelMeta::new(
            vec![
                arg(
                    CL_KERNEL_ARG_ADDRESS_GLOBAL,
                    CL_KERNEL_ARG_ACCESS_NONE,
                    "float*",
                ),
                arg(
                    CL_KERNEL_ARG_ADDRESS_LOCAL,
                    CL_KERNEL_ARG_ACCESS_NONE,
                    "int*",
                ),
                arg(
                    CL_KERNEL_ARG_ADDRESS_PRIVATE,
                    CL_KERNEL_ARG_ACCESS_NONE,
                    "sampler_t",
                ),
                arg(
                    CL_KERNEL_ARG_ADDRESS_PRIVATE,
                    CL_KERNEL_ARG_ACCESS_NONE,
                    "char4",
                ),
                arg(
                    CL_KERNEL_ARG_ADDRESS_PRIVATE,
                    CL_KERNEL_ARG_ACCESS_NONE,
                    "float3",
                ),
                arg(
                    CL_KERNEL_ARG_ADDRESS_PRIVATE,
                    CL_KERNEL_ARG_ACCESS_NONE,
                    "struct s",
                ),
                arg(
                    CL_KERNEL_ARG_ADDRESS_PRIVATE,
                    CL_KERNEL_ARG_ACCESS_NONE,
                    "queue_t",
                ),
                arg(
                    CL_KERNEL_ARG_ADDRESS_GLOBAL,
                    CL_KERNEL_ARG_ACCESS_READ_ONLY,
                    "image2d_t",
                ),
            ],
            vec![],
        );
        use ArgClass::*;
        assert_eq!(
            m.class,
            [
                Pointer,
                Local,
                Sampler,
                Value(Some(4)),
                Value(Some(16)),
                Value(None),
                Unknown,
                Image
            ]
        );
        assert_eq!(set_arg(&m, 0, 8, true), Ok(()));
        assert_eq!(set_arg(&m, 0, 16, false), Err(CL_INVALID_ARG_SIZE));
        assert_eq!(set_arg(&m, 1, 0, true), Err(CL_INVALID_ARG_SIZE));
        assert_eq!(set_arg(&m, 1, 16, false), Err(CL_INVALID_ARG_VALUE));
        assert_eq!(set_arg(&m, 2, 8, true), Err(CL_INVALID_ARG_VALUE));
        assert_eq!(set_arg(&m, 2, 4, false), Err(CL_INVALID_ARG_SIZE));
        assert_eq!(set_arg(&m, 3, 2, false), Err(CL_INVALID_ARG_SIZE));
        assert_eq!(set_arg(&m, 3, 4, false), Ok(()));
        assert_eq!(set_arg(&m, 4, 12, false), Ok(()));
        assert_eq!(set_arg(&m, 4, 16, false), Ok(()));
        assert_eq!(set_arg(&m, 4, 8, false), Err(CL_INVALID_ARG_SIZE));
        assert_eq!(set_arg(&m, 5, 40, false), Ok(()));
        assert_eq!(set_arg(&m, 6, 3, true), Ok(()));
        assert_eq!(set_arg(&m, 7, 8, true), Err(CL_INVALID_ARG_VALUE));
    }
}
