//! Enqueued commands, flush and finish. Nothing here blocks the session
//! thread on the device: writes are enqueued non-blocking from the received
//! payload, which is freed when the command completes; reads go into a host
//! buffer that is sent when the command completes; Finish enqueues a marker
//! and answers when it completes.

use std::sync::atomic::Ordering;

use crane_wire::{Id, Rect, Sync};
use opencl_sys::*;

use super::{check, dims, raw, volume, wait_list};
use crate::pinned::HostBuf;
use crate::session::completion::What;
use crate::session::objects::Kind;
use crate::session::{CallError, CallResult, Session, release};
use crate::vendor::{VPtr, vfn};

/// How long Finish watches its marker before handing it over.
const FINISH_SPIN: std::time::Duration = std::time::Duration::from_micros(30);
/// How long a read the client waits for is watched before it is handed to
/// a waiter thread (`CRANE_PROXY_READ_SPIN_US`, default 150, 0: never),
/// and the largest read watched.
static READ_SPIN: std::sync::LazyLock<std::time::Duration> = std::sync::LazyLock::new(|| {
    std::time::Duration::from_micros(
        std::env::var("CRANE_PROXY_READ_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(150),
    )
});
const READ_SPIN_MAX: usize = 1 << 20;

/// A host transfer of `len` bytes against an object of `extent` bytes: the
/// proxy checks the bound itself before it allocates anything.
fn within(offset: u64, len: u64, extent: u64) -> CallResult {
    match offset.checked_add(len) {
        Some(end) if len > 0 && end <= extent => Ok(()),
        _ => Err(CallError::Cl(CL_INVALID_VALUE)),
    }
}

fn payload_matches(name: &str, payload: &[u8], want: Option<u64>) -> CallResult {
    if want == Some(payload.len() as u64) {
        Ok(())
    } else {
        Err(CallError::Violation(format!(
            "the payload holds {} bytes, not the {name}'s",
            payload.len()
        )))
    }
}

impl Session {
    /// Bounds the host memory held for transfers in flight (and the
    /// callbacks that free it).
    fn admit_staging(&self, bytes: u64) -> CallResult {
        self.admit_callbacks(1)?;
        let held = self.completion.inflight.staging.load(Ordering::Acquire);
        if held.saturating_add(bytes) > self.shared.limits.max_mem_bytes {
            return Err(CallError::Cl(CL_OUT_OF_HOST_MEMORY));
        }
        Ok(())
    }

    /// Hands a command's event and host memory to the completion thread.
    /// `ev` carries one reference of ours, given back here.
    fn complete_later(&self, ev: Option<VPtr>, what: What) -> CallResult {
        let ev = ev.expect("enqueued with own = true");
        let bytes = match &what {
            What::Read { data, .. } | What::Staging { data } => data.len() as u64,
            _ => 0,
        };
        self.completion.inflight.hold(bytes);
        let registered = self.completion.register(ev, CL_COMPLETE, what);
        if !ev.get().is_null() {
            release(Kind::Event, crate::session::objects::Detail::Plain, ev);
        }
        registered.map_err(CallError::Cl)
    }

    /// Answers a read: from here if it completes within [`READ_SPIN`] while
    /// the client has sent nothing more (it most likely waits for this
    /// read, and the hand-over to a waiter thread cost ~10-20 us a frame on
    /// NVIDIA), else from the completion machinery.
    fn complete_read(&self, ev: Option<VPtr>, seq: u64, data: HostBuf) -> CallResult {
        let ev = ev.expect("enqueued with own = true");
        let spin = *READ_SPIN;
        if self.client_idle && !spin.is_zero() && !ev.get().is_null() && data.len() <= READ_SPIN_MAX
        {
            let until = std::time::Instant::now() + spin;
            loop {
                let status = crate::session::completion::event_status(ev);
                if status <= CL_COMPLETE {
                    release(Kind::Event, crate::session::objects::Detail::Plain, ev);
                    if status < 0 {
                        self.reply(seq, &crane_wire::Answer::Data(status), &[]);
                    } else {
                        self.reply(seq, &crane_wire::Answer::Data(CL_SUCCESS), &data);
                    }
                    if crate::trace::on() {
                        crate::trace::add(&crate::trace::GLOBAL.read_spun, 1);
                    }
                    self.completion.inflight.buffers.recycle(data);
                    return Ok(());
                }
                if std::time::Instant::now() >= until {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        self.complete_later(Some(ev), What::Read { seq, data })
    }

    fn queue(&self, id: Id) -> CallResult<VPtr> {
        self.objects.handle(id, Kind::Queue)
    }

    /// A host buffer of `len` bytes for a read on `queue`: pinned if it can
    /// be, else from the session's pool.
    fn pooled_buffer(&mut self, queue: Id, len: u64) -> CallResult<HostBuf> {
        if let Some(b) = self.pinned_staging(queue, len) {
            return Ok(b);
        }
        self.completion
            .inflight
            .buffers
            .take(len as usize)
            .map(HostBuf::Heap)
            .ok_or(CallError::Cl(CL_OUT_OF_HOST_MEMORY))
    }

    /// The queue `id`, counting one more command enqueued on it.
    fn enqueue_on(&mut self, id: Id) -> CallResult<VPtr> {
        let q = self.queue(id)?;
        self.progress
            .entry(id)
            .or_default()
            .enqueued
            .fetch_add(1, Ordering::AcqRel);
        Ok(q)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue_nd_range(
        &mut self,
        queue: Id,
        kernel: Id,
        work_dim: u32,
        offset: Option<[u64; 3]>,
        global: [u64; 3],
        local: Option<[u64; 3]>,
        sync: &Sync,
    ) -> CallResult {
        self.enqueue(sync, false, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let k = s.objects.handle(kernel, Kind::Kernel)?;
            if !(1..=3).contains(&work_dim) {
                return Err(CallError::Cl(CL_INVALID_WORK_DIMENSION));
            }
            // A zero local size divides by zero in PoCL (SIGFPE: the whole
            // proxy would die) where it has work-items to run.
            let n = work_dim as usize;
            if let Some(l) = local
                && global[..n].iter().all(|&g| g != 0)
                && l[..n].contains(&0)
            {
                return Err(CallError::Cl(CL_INVALID_WORK_GROUP_SIZE));
            }
            let f = vfn!(q.get(), clEnqueueNDRangeKernel)?;
            let global = dims(global);
            let offset = offset.map(dims);
            let local = local.map(dims);
            let (n, w) = wait_list(waits);
            // SAFETY: live queue, kernel and events; each size array has 3
            // entries, at least `work_dim`.
            check(unsafe {
                f(
                    q.get().cast(),
                    k.get().cast(),
                    work_dim,
                    offset.as_ref().map_or(std::ptr::null(), |o| o.as_ptr()),
                    global.as_ptr(),
                    local.as_ref().map_or(std::ptr::null(), |l| l.as_ptr()),
                    n,
                    w,
                    ev,
                )
            })
        })?;
        Ok(())
    }

    pub(crate) fn enqueue_write_buffer(
        &mut self,
        queue: Id,
        buffer: Id,
        offset: u64,
        size: u64,
        sync: &Sync,
        data: HostBuf,
    ) -> CallResult {
        payload_matches("write", &data, Some(size))?;
        let ev = self.enqueue(sync, true, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (b, extent) = s.buffer(buffer)?;
            within(offset, size, extent)?;
            s.admit_staging(size)?;
            let f = vfn!(q.get(), clEnqueueWriteBuffer)?;
            let (n, w) = wait_list(waits);
            // SAFETY: live queue, buffer and events; `data` is `size`
            // bytes and stays alive until the command completes.
            check(unsafe {
                f(
                    q.get().cast(),
                    b.get().cast(),
                    CL_FALSE,
                    offset as usize,
                    size as usize,
                    data.as_ptr().cast(),
                    n,
                    w,
                    ev,
                )
            })
        })?;
        self.complete_later(ev, What::Staging { data })
    }

    pub(crate) fn enqueue_read_buffer(
        &mut self,
        seq: u64,
        queue: Id,
        buffer: Id,
        offset: u64,
        size: u64,
        sync: &Sync,
    ) -> CallResult {
        let mut data = HostBuf::default();
        let ev = self.enqueue(sync, true, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (b, extent) = s.buffer(buffer)?;
            within(offset, size, extent)?;
            s.admit_staging(size)?;
            data = s.pooled_buffer(queue, size)?;
            let f = vfn!(q.get(), clEnqueueReadBuffer)?;
            let (n, w) = wait_list(waits);
            // SAFETY: live queue, buffer and events; `data` is `size`
            // bytes and stays alive until the command completes.
            let rc = unsafe {
                f(
                    q.get().cast(),
                    b.get().cast(),
                    CL_FALSE,
                    offset as usize,
                    size as usize,
                    data.as_mut_ptr().cast(),
                    n,
                    w,
                    ev,
                )
            };
            check(rc)?;
            flush(q);
            Ok(())
        })?;
        self.complete_read(ev, seq, data)
    }

    /// The host side of a rect transfer is tightly packed: row pitch
    /// region[0], slice pitch region[0] × region[1].
    fn rect_host(rect: &Rect, extent: u64) -> CallResult<(u64, [usize; 2])> {
        let packed = volume(rect.region).ok_or(CallError::Cl(CL_INVALID_VALUE))?;
        within(0, packed, extent)?;
        let row = rect.region[0] as usize;
        Ok((packed, [row, row * rect.region[1] as usize]))
    }

    pub(crate) fn enqueue_write_buffer_rect(
        &mut self,
        queue: Id,
        buffer: Id,
        rect: &Rect,
        sync: &Sync,
        data: HostBuf,
    ) -> CallResult {
        payload_matches("region", &data, volume(rect.region))?;
        let ev = self.enqueue(sync, true, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (b, extent) = s.buffer(buffer)?;
            let (packed, host_pitch) = Self::rect_host(rect, extent)?;
            s.admit_staging(packed)?;
            let f = vfn!(q.get(), clEnqueueWriteBufferRect)?;
            let (n, w) = wait_list(waits);
            let (origin, region, host_origin) = (dims(rect.origin), dims(rect.region), [0usize; 3]);
            // SAFETY: live objects; `data` is the packed region and stays
            // alive until the command completes.
            check(unsafe {
                f(
                    q.get().cast(),
                    b.get().cast(),
                    CL_FALSE,
                    origin.as_ptr(),
                    host_origin.as_ptr(),
                    region.as_ptr(),
                    rect.row_pitch as usize,
                    rect.slice_pitch as usize,
                    host_pitch[0],
                    host_pitch[1],
                    data.as_ptr().cast(),
                    n,
                    w,
                    ev,
                )
            })
        })?;
        self.complete_later(ev, What::Staging { data })
    }

    pub(crate) fn enqueue_read_buffer_rect(
        &mut self,
        seq: u64,
        queue: Id,
        buffer: Id,
        rect: &Rect,
        sync: &Sync,
    ) -> CallResult {
        let mut data = HostBuf::default();
        let ev = self.enqueue(sync, true, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (b, extent) = s.buffer(buffer)?;
            let (packed, host_pitch) = Self::rect_host(rect, extent)?;
            s.admit_staging(packed)?;
            data = s.pooled_buffer(queue, packed)?;
            let f = vfn!(q.get(), clEnqueueReadBufferRect)?;
            let (n, w) = wait_list(waits);
            let (origin, region, host_origin) = (dims(rect.origin), dims(rect.region), [0usize; 3]);
            // SAFETY: live objects; `data` is the packed region and stays
            // alive until the command completes.
            check(unsafe {
                f(
                    q.get().cast(),
                    b.get().cast(),
                    CL_FALSE,
                    origin.as_ptr(),
                    host_origin.as_ptr(),
                    region.as_ptr(),
                    rect.row_pitch as usize,
                    rect.slice_pitch as usize,
                    host_pitch[0],
                    host_pitch[1],
                    data.as_mut_ptr().cast(),
                    n,
                    w,
                    ev,
                )
            })?;
            flush(q);
            Ok(())
        })?;
        self.complete_read(ev, seq, data)
    }

    /// The packed size of an image region, checked against the image.
    fn image_region(&self, image: Id, region: [u64; 3]) -> CallResult<(VPtr, u64)> {
        let (h, extent, pixel) = self.image(image)?;
        let packed = volume(region)
            .and_then(|v| v.checked_mul(pixel))
            .ok_or(CallError::Cl(CL_INVALID_VALUE))?;
        within(0, packed, extent)?;
        Ok((h, packed))
    }

    pub(crate) fn enqueue_write_image(
        &mut self,
        queue: Id,
        image: Id,
        origin: [u64; 3],
        region: [u64; 3],
        sync: &Sync,
        data: HostBuf,
    ) -> CallResult {
        let ev = self.enqueue(sync, true, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (img, packed) = s.image_region(image, region)?;
            payload_matches("image region", &data, Some(packed))?;
            s.admit_staging(packed)?;
            let f = vfn!(q.get(), clEnqueueWriteImage)?;
            let (n, w) = wait_list(waits);
            let (origin, region) = (dims(origin), dims(region));
            // SAFETY: live objects; `data` is the packed region (pitches 0
            // mean tightly packed) and stays alive until the command
            // completes.
            check(unsafe {
                f(
                    q.get().cast(),
                    img.get().cast(),
                    CL_FALSE,
                    origin.as_ptr(),
                    region.as_ptr(),
                    0,
                    0,
                    data.as_ptr().cast(),
                    n,
                    w,
                    ev,
                )
            })
        })?;
        self.complete_later(ev, What::Staging { data })
    }

    pub(crate) fn enqueue_read_image(
        &mut self,
        seq: u64,
        queue: Id,
        image: Id,
        origin: [u64; 3],
        region: [u64; 3],
        sync: &Sync,
    ) -> CallResult {
        let mut data = HostBuf::default();
        let ev = self.enqueue(sync, true, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (img, packed) = s.image_region(image, region)?;
            s.admit_staging(packed)?;
            data = s.pooled_buffer(queue, packed)?;
            let f = vfn!(q.get(), clEnqueueReadImage)?;
            let (n, w) = wait_list(waits);
            let (origin, region) = (dims(origin), dims(region));
            // SAFETY: live objects; `data` is the packed region and stays
            // alive until the command completes.
            check(unsafe {
                f(
                    q.get().cast(),
                    img.get().cast(),
                    CL_FALSE,
                    origin.as_ptr(),
                    region.as_ptr(),
                    0,
                    0,
                    data.as_mut_ptr().cast(),
                    n,
                    w,
                    ev,
                )
            })?;
            flush(q);
            Ok(())
        })?;
        self.complete_read(ev, seq, data)
    }

    pub(crate) fn enqueue_fill_buffer(
        &mut self,
        queue: Id,
        buffer: Id,
        pattern: &[u8],
        offset: u64,
        size: u64,
        sync: &Sync,
    ) -> CallResult {
        self.enqueue(sync, false, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (b, _) = s.buffer(buffer)?;
            let f = vfn!(q.get(), clEnqueueFillBuffer)?;
            let (n, w) = wait_list(waits);
            // SAFETY: live objects; the vendor copies the pattern before
            // returning.
            check(unsafe {
                f(
                    q.get().cast(),
                    b.get().cast(),
                    super::or_null(pattern).cast(),
                    pattern.len(),
                    offset as usize,
                    size as usize,
                    n,
                    w,
                    ev,
                )
            })
        })?;
        Ok(())
    }

    pub(crate) fn enqueue_fill_image(
        &mut self,
        queue: Id,
        image: Id,
        color: &[u8; 16],
        origin: [u64; 3],
        region: [u64; 3],
        sync: &Sync,
    ) -> CallResult {
        self.enqueue(sync, false, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (img, _, _) = s.image(image)?;
            let f = vfn!(q.get(), clEnqueueFillImage)?;
            let (n, w) = wait_list(waits);
            let (origin, region) = (dims(origin), dims(region));
            // SAFETY: live objects; the 16-byte color is copied before the
            // call returns.
            check(unsafe {
                f(
                    q.get().cast(),
                    img.get().cast(),
                    color.as_ptr().cast(),
                    origin.as_ptr(),
                    region.as_ptr(),
                    n,
                    w,
                    ev,
                )
            })
        })?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue_copy_buffer(
        &mut self,
        queue: Id,
        src: Id,
        dst: Id,
        src_offset: u64,
        dst_offset: u64,
        size: u64,
        sync: &Sync,
    ) -> CallResult {
        self.enqueue(sync, false, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (a, _) = s.buffer(src)?;
            let (b, _) = s.buffer(dst)?;
            let f = vfn!(q.get(), clEnqueueCopyBuffer)?;
            let (n, w) = wait_list(waits);
            // SAFETY: live objects.
            check(unsafe {
                f(
                    q.get().cast(),
                    a.get().cast(),
                    b.get().cast(),
                    src_offset as usize,
                    dst_offset as usize,
                    size as usize,
                    n,
                    w,
                    ev,
                )
            })
        })?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue_copy_buffer_rect(
        &mut self,
        queue: Id,
        src: Id,
        dst: Id,
        src_origin: [u64; 3],
        dst_origin: [u64; 3],
        region: [u64; 3],
        src_pitch: [u64; 2],
        dst_pitch: [u64; 2],
        sync: &Sync,
    ) -> CallResult {
        self.enqueue(sync, false, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (a, _) = s.buffer(src)?;
            let (b, _) = s.buffer(dst)?;
            let f = vfn!(q.get(), clEnqueueCopyBufferRect)?;
            let (n, w) = wait_list(waits);
            let (so, dor, r) = (dims(src_origin), dims(dst_origin), dims(region));
            // SAFETY: live objects; 3-entry origin and region arrays.
            check(unsafe {
                f(
                    q.get().cast(),
                    a.get().cast(),
                    b.get().cast(),
                    so.as_ptr(),
                    dor.as_ptr(),
                    r.as_ptr(),
                    src_pitch[0] as usize,
                    src_pitch[1] as usize,
                    dst_pitch[0] as usize,
                    dst_pitch[1] as usize,
                    n,
                    w,
                    ev,
                )
            })
        })?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue_copy_image(
        &mut self,
        queue: Id,
        src: Id,
        dst: Id,
        src_origin: [u64; 3],
        dst_origin: [u64; 3],
        region: [u64; 3],
        sync: &Sync,
    ) -> CallResult {
        self.enqueue(sync, false, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (a, _, _) = s.image(src)?;
            let (b, _, _) = s.image(dst)?;
            let f = vfn!(q.get(), clEnqueueCopyImage)?;
            let (n, w) = wait_list(waits);
            let (so, dor, r) = (dims(src_origin), dims(dst_origin), dims(region));
            // SAFETY: live objects; 3-entry arrays.
            check(unsafe {
                f(
                    q.get().cast(),
                    a.get().cast(),
                    b.get().cast(),
                    so.as_ptr(),
                    dor.as_ptr(),
                    r.as_ptr(),
                    n,
                    w,
                    ev,
                )
            })
        })?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue_copy_image_to_buffer(
        &mut self,
        queue: Id,
        src: Id,
        dst: Id,
        src_origin: [u64; 3],
        region: [u64; 3],
        dst_offset: u64,
        sync: &Sync,
    ) -> CallResult {
        self.enqueue(sync, false, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (a, _, _) = s.image(src)?;
            let (b, _) = s.buffer(dst)?;
            let f = vfn!(q.get(), clEnqueueCopyImageToBuffer)?;
            let (n, w) = wait_list(waits);
            let (so, r) = (dims(src_origin), dims(region));
            // SAFETY: live objects; 3-entry arrays.
            check(unsafe {
                f(
                    q.get().cast(),
                    a.get().cast(),
                    b.get().cast(),
                    so.as_ptr(),
                    r.as_ptr(),
                    dst_offset as usize,
                    n,
                    w,
                    ev,
                )
            })
        })?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue_copy_buffer_to_image(
        &mut self,
        queue: Id,
        src: Id,
        dst: Id,
        src_offset: u64,
        dst_origin: [u64; 3],
        region: [u64; 3],
        sync: &Sync,
    ) -> CallResult {
        self.enqueue(sync, false, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let (a, _) = s.buffer(src)?;
            let (b, _, _) = s.image(dst)?;
            let f = vfn!(q.get(), clEnqueueCopyBufferToImage)?;
            let (n, w) = wait_list(waits);
            let (dor, r) = (dims(dst_origin), dims(region));
            // SAFETY: live objects; 3-entry arrays.
            check(unsafe {
                f(
                    q.get().cast(),
                    a.get().cast(),
                    b.get().cast(),
                    src_offset as usize,
                    dor.as_ptr(),
                    r.as_ptr(),
                    n,
                    w,
                    ev,
                )
            })
        })?;
        Ok(())
    }

    pub(crate) fn enqueue_marker(&mut self, queue: Id, sync: &Sync) -> CallResult {
        self.enqueue(sync, false, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let f = vfn!(q.get(), clEnqueueMarkerWithWaitList)?;
            let (n, w) = wait_list(waits);
            // SAFETY: a live queue and events.
            check(unsafe { f(q.get().cast(), n, w, ev) })
        })?;
        Ok(())
    }

    pub(crate) fn enqueue_barrier(&mut self, queue: Id, sync: &Sync) -> CallResult {
        self.enqueue(sync, false, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let f = vfn!(q.get(), clEnqueueBarrierWithWaitList)?;
            let (n, w) = wait_list(waits);
            // SAFETY: a live queue and events.
            check(unsafe { f(q.get().cast(), n, w, ev) })
        })?;
        Ok(())
    }

    pub(crate) fn enqueue_migrate(
        &mut self,
        queue: Id,
        mems: &[Id],
        flags: u64,
        sync: &Sync,
    ) -> CallResult {
        self.enqueue(sync, false, |s, waits, ev| {
            let q = s.enqueue_on(queue)?;
            let mems: Vec<cl_mem> = raw(&s.objects.handles(mems, Kind::Mem)?);
            let f = vfn!(q.get(), clEnqueueMigrateMemObjects)?;
            let (n, w) = wait_list(waits);
            // SAFETY: a live queue, memory objects and events.
            check(unsafe {
                f(
                    q.get().cast(),
                    mems.len() as cl_uint,
                    super::or_null(&mems),
                    flags,
                    n,
                    w,
                    ev,
                )
            })
        })?;
        Ok(())
    }

    pub(crate) fn flush(&mut self, queue: Id) -> CallResult {
        let q = self.queue(queue)?;
        let f = vfn!(q.get(), clFlush)?;
        // SAFETY: a live queue.
        check(unsafe { f(q.get().cast()) })
    }

    /// Replies `Status` once everything enqueued before it has completed: at
    /// once when nothing was enqueued since the last Finish completed, else
    /// when a marker with an empty wait list (which waits for all earlier
    /// commands, in order or not) completes.
    pub(crate) fn finish(&mut self, seq: u64, queue: Id) -> CallResult {
        let q = self.queue(queue)?;
        let progress = self.progress.entry(queue).or_default().clone();
        let upto = progress.enqueued.load(Ordering::Acquire);
        if progress.finished.load(Ordering::Acquire) >= upto {
            self.reply(seq, &crane_wire::Answer::Status(CL_SUCCESS), &[]);
            return Ok(());
        }
        self.admit_callbacks(1)?;
        let f = vfn!(q.get(), clEnqueueMarkerWithWaitList)?;
        let mut ev: cl_event = std::ptr::null_mut();
        // SAFETY: a live queue; one event out.
        check(unsafe { f(q.get().cast(), 0, std::ptr::null(), &mut ev) })?;
        flush(q);
        let ev = VPtr(ev.cast());
        // An idle queue's marker completes within microseconds: answer
        // from here rather than pay for a hand-over.
        let until = std::time::Instant::now() + FINISH_SPIN;
        while !ev.get().is_null() && std::time::Instant::now() < until {
            let status = crate::session::completion::event_status(ev);
            if status <= CL_COMPLETE {
                if status == CL_COMPLETE {
                    progress.finished.fetch_max(upto, Ordering::AcqRel);
                }
                release(Kind::Event, crate::session::objects::Detail::Plain, ev);
                self.reply(seq, &crane_wire::Answer::Status(CL_SUCCESS), &[]);
                return Ok(());
            }
            std::thread::yield_now();
        }
        self.complete_later(
            Some(ev),
            What::Finish {
                seq,
                progress,
                upto,
            },
        )
    }
}

/// Submits what a queue holds, so that what waits for it makes progress.
fn flush(q: VPtr) {
    if let Ok(f) = vfn!(q.get(), clFlush) {
        // SAFETY: a live queue.
        unsafe { f(q.get().cast()) };
    }
}
