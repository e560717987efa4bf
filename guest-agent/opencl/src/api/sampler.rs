//! Samplers.

use std::ffi::c_void;
use std::sync::Arc;

use opencl_sys::*;

use super::*;
use crate::entry::{self, ClResult, bytes_of, write_info};
use crate::handle::Base;
use crate::vendor::{check, vfn};

pub fn vendor_create(s: &Sampler) -> ClResult<*mut c_void> {
    let vc = s.context.base.vendor();
    let mut err = CL_SUCCESS;
    let v = match s.legacy {
        // SAFETY: vendor context.
        #[allow(deprecated)]
        Some((n, a, f)) => unsafe { vfn!(vc, clCreateSampler)?(vc.cast(), n, a, f, &mut err) },
        // SAFETY: vendor context and a zero-terminated property list.
        None => unsafe {
            vfn!(vc, clCreateSamplerWithProperties)?(
                vc.cast(),
                if s.props.is_empty() {
                    std::ptr::null()
                } else {
                    s.props.as_ptr()
                },
                &mut err,
            )
        },
    };
    check(err)?;
    Ok(v.cast())
}

fn create(
    c: cl_context,
    props: Vec<cl_sampler_properties>,
    legacy: Option<(cl_bool, cl_addressing_mode, cl_filter_mode)>,
) -> ClResult<cl_sampler> {
    let context = arc_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
    let s = Sampler {
        base: Base::new(std::ptr::null_mut()),
        context,
        props,
        legacy,
    };
    s.base.set_vendor(vendor_create(&s)?);
    Ok(publish(Arc::new(s)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateSampler(
    c: cl_context,
    normalized: cl_bool,
    addressing: cl_addressing_mode,
    filter: cl_filter_mode,
    errcode_ret: *mut cl_int,
) -> cl_sampler {
    entry::object(errcode_ret, || {
        create(c, Vec::new(), Some((normalized, addressing, filter)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateSamplerWithProperties(
    c: cl_context,
    props: *const cl_sampler_properties,
    errcode_ret: *mut cl_int,
) -> cl_sampler {
    entry::object(errcode_ret, || create(c, entry::read_props(props), None))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetSamplerInfo(
    s: cl_sampler,
    param: cl_sampler_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let smp = sampler_ref(s.cast())?;
        match param {
            CL_SAMPLER_CONTEXT => write_info(
                bytes_of(&smp.context.base.handle::<c_void>()),
                size,
                value,
                size_ret,
            ),
            CL_SAMPLER_REFERENCE_COUNT => {
                write_info(bytes_of(&smp.base.app_refs()), size, value, size_ret)
            }
            _ => {
                let v = smp.base.vendor();
                // SAFETY: forwarding.
                check(unsafe { vfn!(v, clGetSamplerInfo)?(v.cast(), param, size, value, size_ret) })
            }
        }
    })
}
