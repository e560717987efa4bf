//! User events, event callbacks, waits, and releasing any object.

use std::sync::atomic::Ordering;

use crane_wire::Id;
use opencl_sys::*;

use super::{check, made};
use crate::session::completion::{WaitAll, What};
use crate::session::objects::{Detail, Kind};
use crate::session::{CallError, CallResult, Session};
use crate::vendor::{VPtr, vfn};

impl Session {
    pub(crate) fn create_user_event(&mut self, id: Id, context: Id) -> CallResult {
        self.create(id, Kind::Event, |s| {
            let ctx = s.objects.handle(context, Kind::Context)?;
            let f = vfn!(ctx.get(), clCreateUserEvent)?;
            let mut err = CL_SUCCESS;
            // SAFETY: a live context.
            let h = unsafe { f(ctx.get().cast(), &mut err) };
            Ok((made(h, err)?, Detail::UserEvent { set: false }))
        })
    }

    pub(crate) fn set_user_event_status(&mut self, event: Id, status: i32) -> CallResult {
        let e = self.objects.handle(event, Kind::Event)?;
        let f = vfn!(e.get(), clSetUserEventStatus)?;
        // SAFETY: a live event (the vendor checks it is a user event).
        check(unsafe { f(e.get().cast(), status) })?;
        if let Detail::UserEvent { set } = &mut self.objects.get_mut(event, Kind::Event)?.detail {
            *set = true;
        }
        Ok(())
    }

    /// Bounds the callbacks a session may have pending: each holds a little
    /// memory until its event completes, which may be never.
    pub(crate) fn admit_callbacks(&self, n: u64) -> CallResult {
        let pending = self.completion.inflight.callbacks.load(Ordering::Acquire);
        if pending.saturating_add(n) > self.shared.limits.max_objects {
            return Err(CallError::Cl(CL_OUT_OF_RESOURCES));
        }
        Ok(())
    }

    pub(crate) fn set_event_callback(&mut self, event: Id, status: i32, cookie: u64) -> CallResult {
        let e = self.objects.handle(event, Kind::Event)?;
        self.admit_callbacks(1)?;
        self.completion
            .register(e, status, What::Fired { cookie })
            .map_err(CallError::Cl)
    }

    /// Replies `Status` once every event has completed (in the background).
    pub(crate) fn wait_for_events(&mut self, seq: u64, events: &[Id]) -> CallResult {
        if events.is_empty() {
            return Err(CallError::Cl(CL_INVALID_VALUE));
        }
        let handles = self.objects.handles(events, Kind::Event)?;
        self.admit_callbacks(handles.len() as u64)?;
        // clWaitForEvents flushes the queues it waits on; a callback does
        // not, so flush them here.
        for &e in &handles {
            if let Some(q) = event_queue(e)
                && let Ok(flush) = vfn!(q.get(), clFlush)
            {
                // SAFETY: the event's live queue.
                unsafe { flush(q.get().cast()) };
            }
        }
        let all = WaitAll::new(seq, handles.len());
        for e in handles {
            // Never fails for anything but a client's own callback.
            let _ = self
                .completion
                .register(e, CL_COMPLETE, What::WaitOne(all.clone()));
        }
        Ok(())
    }

    pub(crate) fn release(&mut self, id: Id) -> CallResult {
        let o = self.objects.remove(id)?;
        self.progress.remove(&id);
        self.pinned_by_queue.remove(&id);
        let Ok(h) = o.handle else {
            return Ok(());
        };
        if o.kind == Kind::Context {
            // The context's staging pool goes with it (once the transfers
            // using its buffers are done), and so does the pool's
            // reference to the vendor context.
            self.pinned_pools.remove(&h);
        }
        if o.detail == (Detail::UserEvent { set: false }) {
            // Commands may wait on it: teardown must still be able to fail it.
            self.objects.keep_unset(h);
            return Ok(());
        }
        let rc = self
            .quirks
            .release(&self.shared.vendor, o.kind, o.detail, h);
        self.objects.set_held_back(self.quirks.held_back());
        check(rc)
    }
}

/// The queue of an event's command (none for user events).
fn event_queue(e: VPtr) -> Option<VPtr> {
    let f = vfn!(e.get(), clGetEventInfo).ok()?;
    let mut q: cl_command_queue = std::ptr::null_mut();
    // SAFETY: a live event; the value is one queue handle.
    let rc = unsafe {
        f(
            e.get().cast(),
            CL_EVENT_COMMAND_QUEUE,
            size_of::<cl_command_queue>(),
            (&raw mut q).cast(),
            std::ptr::null_mut(),
        )
    };
    (rc == CL_SUCCESS && !q.is_null()).then_some(VPtr(q.cast()))
}
