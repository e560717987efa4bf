//! Vendor bugs crane-proxy works around for its sessions (docs/architecture.md,
//! "Vendor quirks"; the version tests are `crane_vendor_loader::quirks`,
//! shared with the interposer).
//!
//! NVIDIA (580.159.04) crashes in clReleaseMemObject when overlapping
//! sub-buffers of one buffer are released oldest first, natively too
//! (benches/subbuf-release.c: every run of 150 rounds crashed within them on
//! an H200; newest first, none in 300 rounds). On crane-proxy that would let
//! one session, by releasing its own sub-buffers in that order (as a
//! program may: OpenCL allows any order), end the proxy and every other
//! session on it. So the vendor always sees a buffer's sub-buffers released
//! newest first: a session's release of a sub-buffer made before others of
//! the same buffer that are still alive is held back (the vendor object
//! kept, the client's id gone as usual) until those are released. It holds
//! no memory (a sub-buffer aliases its parent, which the newer ones keep
//! alive anyway), so it applies to every vendor.
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
//!
//! PoCL aborts the process on a program binary it cannot read (it trusts
//! every length and asserts; its own binaries can be such when another
//! process rewrites its shared kernel cache as one is serialised). So a
//! session's binaries for a PoCL platform are walked first
//! (`crane_vendor_loader::pocl_binary`, in `api/program.rs`, with the
//! format each PoCL platform reads, found at load by `crate::vendor`), and
//! one that fails is answered `CL_INVALID_BINARY` without PoCL seeing it.

use std::collections::HashMap;

use opencl_sys::*;

use crate::session::objects::{Detail, Kind};
use crate::session::release;
use crate::vendor::{VPtr, Vendor, vfn};

/// One session's bookkeeping for the quirks: the context references its
/// vendor leaked and the session has not given back yet, per vendor
/// context; and its live sub-buffers per parent buffer.
#[derive(Default)]
pub(crate) struct Quirks {
    leaked: HashMap<VPtr, u32>,
    subs: SubBuffers,
}

/// Sub-buffers per parent (vendor handles), oldest first, each with whether
/// the session has released it (its vendor release held back).
#[derive(Default)]
struct SubBuffers {
    by_parent: HashMap<VPtr, Vec<(VPtr, bool)>>,
    parent_of: HashMap<VPtr, VPtr>,
    /// Entries released by the session, still held.
    held: u64,
}

impl Quirks {
    /// Released sub-buffers whose vendor release is held back.
    pub fn held_back(&self) -> u64 {
        self.subs.held
    }

    /// Notes sub-buffer `sub` of buffer `parent`, just made.
    pub fn made_sub_buffer(&mut self, parent: VPtr, sub: VPtr) {
        self.subs
            .by_parent
            .entry(parent)
            .or_default()
            .push((sub, false));
        self.subs.parent_of.insert(sub, parent);
    }

    /// Gives back the session's reference to vendor object `h`
    /// ([`release`]), noting the context reference its vendor leaks when it
    /// destroys a 1D image buffer, giving a context the references noted in
    /// it before the session's own, and holding back a sub-buffer's release
    /// until the newer ones of its buffer are released.
    pub fn release(&mut self, vendor: &Vendor, kind: Kind, detail: Detail, h: VPtr) -> cl_int {
        match (kind, detail) {
            (Kind::Mem, Detail::Mem { sub: true, .. }) => self.subs.release(h),
            (Kind::Mem, Detail::Mem { image: Some(_), .. }) => {
                // Asked before the release: the image may be gone after it.
                let leaks_in = leaks_in(vendor, h);
                let rc = release(kind, detail, h);
                if let (Some(ctx), CL_SUCCESS) = (leaks_in, rc) {
                    *self.leaked.entry(ctx).or_default() += 1;
                }
                rc
            }
            (Kind::Context, _) => {
                // The leaked references first, the session's own last: the
                // context lives through them. An image PoCL still uses (a
                // command pending) is destroyed only when the command
                // completes, and until then the command's queue holds the
                // context.
                give_back(h, self.leaked.remove(&h).unwrap_or(0));
                release(kind, detail, h)
            }
            _ => release(kind, detail, h),
        }
    }

    /// At the session's end, every one of its objects released: gives
    /// back the sub-buffers still held back (none once the newer ones went:
    /// only those of a vendor release that failed) and what was leaked in
    /// contexts the session had released before the images made in them
    /// (OpenCL allows that order). Each such context is still alive, held
    /// by the very references given back here.
    pub fn give_back_rest(&mut self) {
        for (_, mut subs) in self.subs.by_parent.drain() {
            while let Some((sub, _)) = subs.pop() {
                release(Kind::Mem, Detail::Plain, sub);
            }
        }
        self.subs.parent_of.clear();
        self.subs.held = 0;
        for (ctx, n) in self.leaked.drain() {
            give_back(ctx, n);
        }
    }
}

impl SubBuffers {
    /// The session's release of sub-buffer `h`: it and every older one
    /// released before it are given back to the vendor, newest first, once
    /// no newer one of the same buffer is alive; until then `h` is held.
    /// The vendor's answer for `h`, or success where it is held.
    fn release(&mut self, h: VPtr) -> cl_int {
        let Some(parent) = self.parent_of.get(&h).copied() else {
            return release(Kind::Mem, Detail::Plain, h);
        };
        let subs = self
            .by_parent
            .get_mut(&parent)
            .expect("noted with its parent");
        if let Some(s) = subs.iter_mut().find(|(s, held)| *s == h && !held) {
            s.1 = true;
            self.held += 1;
        }
        let mut rc = CL_SUCCESS;
        while let Some(&(sub, true)) = subs.last() {
            subs.pop();
            self.held -= 1;
            self.parent_of.remove(&sub);
            let r = release(Kind::Mem, Detail::Plain, sub);
            if sub == h {
                rc = r;
            }
        }
        if subs.is_empty() {
            self.by_parent.remove(&parent);
        }
        rc
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
    //! a session's objects released through [`Quirks`] as a session does,
    //! and the vendor context must really be gone after the session's last
    //! reference (its destructor callback ran), and not before.

    use std::ffi::c_void;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// The counts of destructor callbacks run, one slot per test.
    static DESTROYED: [AtomicU32; 3] = [AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0)];

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
        let mut leaked = Quirks::default();
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
        let mut leaked = Quirks::default();
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

    /// Sub-buffers destroyed, in order (by the index their destructor
    /// callback was given).
    static SUBS_GONE: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

    extern "C" fn sub_gone(_m: cl_mem, i: *mut c_void) {
        SUBS_GONE.lock().unwrap().push(i as usize);
    }

    /// Overlapping sub-buffers 0..n of `buf`, oldest first, each reporting
    /// its destruction with its index plus `base`.
    fn subs(buf: VPtr, n: usize, base: usize, q: &mut Quirks) -> Vec<VPtr> {
        (0..n)
            .map(|i| {
                let f = vfn!(buf.get(), clCreateSubBuffer).unwrap();
                let region = cl_buffer_region {
                    origin: 0,
                    size: 1024 * (i + 1),
                };
                let mut err = CL_SUCCESS;
                // SAFETY: a live 4096-byte buffer; a region inside it.
                let h = unsafe {
                    f(
                        buf.get().cast(),
                        CL_MEM_READ_ONLY,
                        CL_BUFFER_CREATE_TYPE_REGION,
                        (&raw const region).cast(),
                        &mut err,
                    )
                };
                assert_eq!(err, CL_SUCCESS);
                let cb = vfn!(buf.get(), clSetMemObjectDestructorCallback).unwrap();
                // SAFETY: a live sub-buffer; the callback only records its index.
                let rc = unsafe { cb(h, Some(sub_gone), (base + i) as *mut c_void) };
                assert_eq!(rc, CL_SUCCESS);
                q.made_sub_buffer(buf, VPtr(h.cast()));
                VPtr(h.cast())
            })
            .collect()
    }

    fn gone(base: usize) -> Vec<usize> {
        let all = SUBS_GONE.lock().unwrap();
        all.iter()
            .filter(|&&i| i / 100 == base / 100)
            .copied()
            .collect()
    }

    /// A session releasing its sub-buffers oldest first (what crashed
    /// NVIDIA): the vendor sees them go newest first, each only once no
    /// newer one of its buffer is alive; released newest first they go at
    /// once; and those still held at the session's end go with it.
    #[test]
    fn sub_buffers_reach_the_vendor_released_newest_first() {
        let v = vendor();
        let ctx = context(&v, 2);
        let (buf, buf_detail) = buffer(ctx);
        let mut q = Quirks::default();
        let sub = Detail::Mem {
            extent: 1024,
            charged: 0,
            image: None,
            sub: true,
        };
        // Oldest first: held until the newest goes, then all, newest first.
        let s = subs(buf, 3, 100, &mut q);
        assert_eq!(q.release(&v, Kind::Mem, sub, s[0]), CL_SUCCESS);
        assert_eq!(q.release(&v, Kind::Mem, sub, s[1]), CL_SUCCESS);
        assert_eq!(
            gone(100),
            Vec::<usize>::new(),
            "released before a newer one"
        );
        assert_eq!(q.held_back(), 2);
        assert_eq!(q.release(&v, Kind::Mem, sub, s[2]), CL_SUCCESS);
        assert_eq!(gone(100), vec![102, 101, 100]);
        assert_eq!(q.held_back(), 0);
        // Newest first, as a program's teardown does: each at once.
        let s = subs(buf, 3, 200, &mut q);
        for (k, h) in s.iter().rev().enumerate() {
            assert_eq!(q.release(&v, Kind::Mem, sub, *h), CL_SUCCESS);
            assert_eq!(gone(200).len(), k + 1);
        }
        assert_eq!(gone(200), vec![202, 201, 200]);
        // The middle one released, the session ends: it goes with the
        // session's other releases (the newest one last released by it).
        let s = subs(buf, 3, 300, &mut q);
        assert_eq!(q.release(&v, Kind::Mem, sub, s[1]), CL_SUCCESS);
        assert_eq!(q.release(&v, Kind::Mem, sub, s[2]), CL_SUCCESS);
        assert_eq!(gone(300), vec![302, 301]);
        let s0 = s[0];
        let _newer = subs(buf, 1, 400, &mut q);
        assert_eq!(q.release(&v, Kind::Mem, sub, s0), CL_SUCCESS);
        assert_eq!(gone(300), vec![302, 301], "s0 is older than a live one");
        assert_eq!(q.held_back(), 1);
        q.give_back_rest();
        assert_eq!(q.held_back(), 0);
        assert_eq!(gone(400), vec![400]);
        assert_eq!(gone(300), vec![302, 301, 300]);
        assert_eq!(q.release(&v, Kind::Mem, buf_detail, buf), CL_SUCCESS);
        assert_eq!(q.release(&v, Kind::Context, Detail::Plain, ctx), CL_SUCCESS);
        assert_eq!(DESTROYED[2].load(Ordering::SeqCst), 1);
    }
}
