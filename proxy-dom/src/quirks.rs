//! Vendor bugs crane-proxy works around for its sessions, each narrowed to
//! the versions that have it (docs/architecture.md, "Vendor quirks"; the
//! version tests are `crane_vendor_loader::quirks`, shared with the
//! interposer).
//!
//! PoCL before 7.0 leaks a context reference per `CL_MEM_OBJECT_IMAGE1D_BUFFER`
//! image: clCreateImage retains the context for every image, and
//! clReleaseMemObject, destroying an image made from a buffer, releases the
//! buffer and returns without releasing the context. On crane-proxy that
//! kept the context of every session that made such an image alive after
//! the session ended (measured on Debian's PoCL 3.1: about 3 KiB of the
//! proxy's heap each), so a long-running proxy grew with its sessions. So a
//! session counts, per vendor context, the images of that kind it releases
//! there, and gives the context those references back with its own: exactly
//! what PoCL leaked, nothing more. Only session objects can be such images:
//! the contexts the proxy keeps for itself (warm, stash, pinned staging)
//! never have any, and are released as they are.

use std::collections::HashMap;

use opencl_sys::*;

use crate::session::objects::{Detail, Kind};
use crate::session::release;
use crate::vendor::{VPtr, Vendor, vfn};

/// One session's context references its vendor leaked and the session has
/// not given back yet, per vendor context.
#[derive(Default)]
pub(crate) struct Leaked(HashMap<VPtr, u32>);

impl Leaked {
    /// Gives back the session's reference to vendor object `h`
    /// ([`release`]), noting the context reference its vendor leaks when it
    /// destroys a 1D image buffer, and giving a context the references
    /// noted in it before the session's own.
    pub fn release(&mut self, vendor: &Vendor, kind: Kind, detail: Detail, h: VPtr) -> cl_int {
        match (kind, detail) {
            (Kind::Mem, Detail::Mem { image: Some(_), .. }) => {
                // Asked before the release: the image may be gone after it.
                let leaks_in = leaks_in(vendor, h);
                let rc = release(kind, detail, h);
                if let (Some(ctx), CL_SUCCESS) = (leaks_in, rc) {
                    *self.0.entry(ctx).or_default() += 1;
                }
                rc
            }
            (Kind::Context, _) => {
                // The leaked references first, the session's own last: the
                // context lives through them. An image PoCL still uses (a
                // command pending) is destroyed only when the command
                // completes, and until then the command's queue holds the
                // context.
                give_back(h, self.0.remove(&h).unwrap_or(0));
                release(kind, detail, h)
            }
            _ => release(kind, detail, h),
        }
    }

    /// Gives back what was leaked in contexts the session had released
    /// before the images made in them (OpenCL allows that order): at the
    /// session's end, every one of its objects released. Each such context
    /// is still alive, held by the very references given back here.
    pub fn give_back_rest(&mut self) {
        for (ctx, n) in self.0.drain() {
            give_back(ctx, n);
        }
    }
}

/// Releases `n` context references the vendor took and never gave back.
fn give_back(ctx: VPtr, n: u32) {
    for _ in 0..n {
        release(Kind::Context, Detail::Plain, ctx);
    }
}

/// The vendor context that destroying image `h` leaks a reference in: only
/// for a 1D image buffer of a vendor with the leak (nothing is asked of
/// other vendors).
fn leaks_in(vendor: &Vendor, h: VPtr) -> Option<VPtr> {
    if !vendor.leaks_image1d_buffer_context(h) {
        return None;
    }
    let ty: cl_mem_object_type = mem_info(h, CL_MEM_TYPE)?;
    if ty != CL_MEM_OBJECT_IMAGE1D_BUFFER {
        return None;
    }
    let ctx: cl_context = mem_info(h, CL_MEM_CONTEXT)?;
    (!ctx.is_null()).then(|| VPtr(ctx.cast()))
}

/// A scalar `clGetMemObjectInfo` value of type `T`.
fn mem_info<T: Copy + Default>(h: VPtr, param: cl_mem_info) -> Option<T> {
    let f = vfn!(h.get(), clGetMemObjectInfo).ok()?;
    let mut out = T::default();
    // SAFETY: a live memory object; `out` holds size_of::<T>() bytes, the
    // size of the parameter's type (the callers' T).
    let rc = unsafe {
        f(
            h.get().cast(),
            param,
            size_of::<T>(),
            (&raw mut out).cast(),
            std::ptr::null_mut(),
        )
    };
    (rc == CL_SUCCESS).then_some(out)
}

#[cfg(test)]
mod tests {
    //! On the vendor this machine has (PoCL 3.1 here, which has the leak):
    //! a session's objects released through [`Leaked`] as a session does,
    //! and the vendor context must really be gone after the session's last
    //! reference (its destructor callback ran), and not before.

    use std::ffi::c_void;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// The counts of destructor callbacks run, one slot per test.
    static DESTROYED: [AtomicU32; 2] = [AtomicU32::new(0), AtomicU32::new(0)];

    extern "C" fn destroyed(_ctx: cl_context, slot: *mut c_void) {
        DESTROYED[slot as usize].fetch_add(1, Ordering::SeqCst);
    }

    fn vendor() -> Vendor {
        Vendor::load(&[]).expect("a vendor OpenCL library (PoCL) for the proxy's tests")
    }

    /// A context of the first device, its destructor counted in `slot`.
    fn context(v: &Vendor, slot: usize) -> VPtr {
        let d = v.first_device().expect("a device");
        let f = vfn!(d.get(), clCreateContext).unwrap();
        let dev: cl_device_id = d.get().cast();
        let mut err = CL_SUCCESS;
        // SAFETY: one live device, no properties, no callback.
        let c = unsafe {
            f(
                std::ptr::null(),
                1,
                &dev,
                None,
                std::ptr::null_mut(),
                &mut err,
            )
        };
        assert_eq!(err, CL_SUCCESS);
        let f = vfn!(c, clSetContextDestructorCallback).unwrap();
        // SAFETY: a live context; the callback only counts.
        let rc = unsafe { f(c, Some(destroyed), slot as *mut c_void) };
        assert_eq!(rc, CL_SUCCESS);
        VPtr(c.cast())
    }

    fn buffer(ctx: VPtr) -> (VPtr, Detail) {
        let f = vfn!(ctx.get(), clCreateBuffer).unwrap();
        let mut err = CL_SUCCESS;
        // SAFETY: a live context, no host pointer.
        let b = unsafe {
            f(
                ctx.get().cast(),
                CL_MEM_READ_WRITE,
                4096,
                std::ptr::null_mut(),
                &mut err,
            )
        };
        assert_eq!(err, CL_SUCCESS);
        let detail = Detail::Mem {
            extent: 4096,
            charged: 4096,
            image: None,
            sub: false,
        };
        (VPtr(b.cast()), detail)
    }

    /// A 256-pixel RGBA float 1D image: made from `buffer` (a 1D image
    /// buffer), or of its own.
    fn image(ctx: VPtr, buffer: Option<VPtr>) -> (VPtr, Detail) {
        let format = cl_image_format {
            image_channel_order: CL_RGBA,
            image_channel_data_type: CL_FLOAT,
        };
        let desc = cl_image_desc {
            image_type: if buffer.is_some() {
                CL_MEM_OBJECT_IMAGE1D_BUFFER
            } else {
                CL_MEM_OBJECT_IMAGE1D
            },
            image_width: 256,
            image_height: 0,
            image_depth: 0,
            image_array_size: 0,
            image_row_pitch: 0,
            image_slice_pitch: 0,
            num_mip_levels: 0,
            num_samples: 0,
            buffer: buffer.map_or(std::ptr::null_mut(), |b| b.get().cast()),
        };
        let f = vfn!(ctx.get(), clCreateImage).unwrap();
        let mut err = CL_SUCCESS;
        // SAFETY: a live context, a valid format and descriptor (the buffer
        // holds 256 pixels of 16 bytes), no host pointer.
        let i = unsafe {
            f(
                ctx.get().cast(),
                CL_MEM_READ_WRITE,
                &format,
                &desc,
                std::ptr::null_mut(),
                &mut err,
            )
        };
        assert_eq!(err, CL_SUCCESS);
        let detail = Detail::Mem {
            extent: 4096,
            charged: if buffer.is_some() { 0 } else { 4096 },
            image: Some(16),
            sub: false,
        };
        (VPtr(i.cast()), detail)
    }

    fn references(ctx: VPtr) -> cl_uint {
        let f = vfn!(ctx.get(), clGetContextInfo).unwrap();
        let mut n: cl_uint = 0;
        // SAFETY: a live context; a cl_uint value.
        let rc = unsafe {
            f(
                ctx.get().cast(),
                CL_CONTEXT_REFERENCE_COUNT,
                size_of::<cl_uint>(),
                (&raw mut n).cast(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, CL_SUCCESS);
        n
    }

    #[test]
    fn a_sessions_context_goes_with_its_last_reference_after_1d_image_buffers() {
        let v = vendor();
        let ctx = context(&v, 0);
        // The test's own reference: the session's release must leave it,
        // and only it (nothing released twice).
        let f = vfn!(ctx.get(), clRetainContext).unwrap();
        // SAFETY: a live context.
        assert_eq!(unsafe { f(ctx.get().cast()) }, CL_SUCCESS);
        let (buf, buf_detail) = buffer(ctx);
        let one = image(ctx, Some(buf));
        let two = image(ctx, Some(buf));
        // An image of its own: PoCL releases its context reference itself.
        let own = image(ctx, None);
        let mut leaked = Leaked::default();
        for (h, detail) in [one, two, own, (buf, buf_detail)] {
            assert_eq!(leaked.release(&v, Kind::Mem, detail, h), CL_SUCCESS);
        }
        assert_eq!(
            leaked.release(&v, Kind::Context, Detail::Plain, ctx),
            CL_SUCCESS
        );
        assert_eq!(
            references(ctx),
            1,
            "the session's release leaves the test's reference, and only it"
        );
        assert_eq!(DESTROYED[0].load(Ordering::SeqCst), 0);
        release(Kind::Context, Detail::Plain, ctx);
        assert_eq!(
            DESTROYED[0].load(Ordering::SeqCst),
            1,
            "the context outlived every reference"
        );
    }

    #[test]
    fn a_context_released_before_its_1d_image_buffer_goes_at_the_sessions_end() {
        let v = vendor();
        let ctx = context(&v, 1);
        let (buf, buf_detail) = buffer(ctx);
        let (img, img_detail) = image(ctx, Some(buf));
        let mut leaked = Leaked::default();
        // OpenCL allows the context to go first: its objects keep it.
        assert_eq!(
            leaked.release(&v, Kind::Context, Detail::Plain, ctx),
            CL_SUCCESS
        );
        assert_eq!(leaked.release(&v, Kind::Mem, img_detail, img), CL_SUCCESS);
        assert_eq!(leaked.release(&v, Kind::Mem, buf_detail, buf), CL_SUCCESS);
        leaked.give_back_rest();
        assert_eq!(
            DESTROYED[1].load(Ordering::SeqCst),
            1,
            "the context outlived the session"
        );
    }
}
