//! Stops the threads a vendor library starts and never stops, at the one
//! moment when it is certain that glibc is about to unmap the library: when
//! `dlclose` calls the library's termination function.
//!
//! NVIDIA's libnvidia-opencl starts an event thread (`cuda-EvtHandlr`,
//! polling with a timeout) and worker threads (in `sem_wait`) that its
//! termination function leaves running, blocked inside its own code. Once
//! glibc has unmapped the library, the event thread's next `poll` timeout
//! returns into unmapped code. Whether `dlclose` unmaps a library cannot be
//! told beforehand (PoCL, for one, stays mapped for reasons of the dynamic
//! linker's own, and its threads must then live on), but glibc runs a
//! library's termination functions exactly when it unloads it, right before
//! unmapping it. So the slot through which glibc calls the vendor's last
//! termination function (`DT_FINI`; NVIDIA's does its teardown from there)
//! is pointed at [`termination_hook`], which cancels the threads whose start
//! routine lies in the vendor and still run, waits for them to end, and then
//! calls the vendor's own function. When the vendor stays mapped, the slot
//! gets its original value back.
//!
//! A cancelled thread ends inside whatever cancellation point it waits in.
//! One waiting in `pthread_cond_wait` ends holding the condition's mutex
//! (unless the vendor pushed a cleanup handler); a termination function
//! that then takes that mutex would hang `dlclose`. NVIDIA's threads wait in
//! `poll` and `sem_wait`, which hold nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::objects::{self, ObjectId, TerminationSlot};
use crate::threads::{self, VendorThread};

#[derive(Debug)]
struct Armed {
    vendor: ObjectId,
    slot: TerminationSlot,
    timeout: Duration,
    fired: bool,
    cancelled: Vec<VendorThread>,
    still_running: Vec<VendorThread>,
}

static ARMED: Mutex<Option<Armed>> = Mutex::new(None);

/// The vendor function the hook calls on, kept apart from [`ARMED`] so that
/// the hook can call it even if it runs when nothing is armed.
static ORIGINAL: AtomicUsize = AtomicUsize::new(0);

fn armed() -> MutexGuard<'static, Option<Armed>> {
    ARMED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the hook did during the vendor's `dlclose`.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// glibc called the hook: it unloaded the vendor.
    pub fired: bool,
    pub cancelled: Vec<VendorThread>,
    pub still_running: Vec<VendorThread>,
}

/// Whether threads started in `vendor` run, so that the hook is needed.
pub(crate) fn needed(vendor: &ObjectId) -> bool {
    threads::vendor_threads_alive();
    crate::tracker::lock()
        .threads
        .iter()
        .any(|t| t.start_object.as_ref() == Some(vendor))
}

/// Points the vendor's termination slot at the hook; whether it could.
pub(crate) fn arm(vendor: &ObjectId, timeout: Duration) -> bool {
    let Some(slot) = objects::termination_slot(vendor) else {
        log::warn!(
            "{} has no termination function to stop its threads in.",
            vendor.path.display()
        );
        return false;
    };
    let hook = termination_hook as *const () as usize;
    let value = if slot.relative {
        hook.wrapping_sub(vendor.base)
    } else {
        hook
    };
    ORIGINAL.store(slot.function, Ordering::Release);
    *armed() = Some(Armed {
        vendor: vendor.clone(),
        slot,
        timeout,
        fired: false,
        cancelled: Vec::new(),
        still_running: Vec::new(),
    });
    if objects::write_slot(vendor, slot.slot, value) {
        true
    } else {
        log::warn!(
            "The termination slot of {} could not be rewritten.",
            vendor.path.display()
        );
        *armed() = None;
        false
    }
}

/// After the vendor's `dlclose`: what the hook did. When glibc did not call
/// it, the vendor is still loaded and its slot gets its original value back.
pub(crate) fn disarm() -> Outcome {
    let Some(armed) = armed().take() else {
        return Outcome::default();
    };
    if !armed.fired && !objects::write_slot(&armed.vendor, armed.slot.slot, armed.slot.value) {
        log::warn!(
            "The termination slot of {} could not be restored; the hook stays and calls the original.",
            armed.vendor.path.display()
        );
    }
    Outcome {
        fired: armed.fired,
        cancelled: armed.cancelled,
        still_running: armed.still_running,
    }
}

/// Called by glibc, inside `dlclose`, in place of the vendor's first
/// termination function.
extern "C" fn termination_hook() {
    let target = armed().as_mut().map(|a| {
        a.fired = true;
        (a.vendor.clone(), a.timeout)
    });
    if let Some((vendor, timeout)) = target {
        match std::panic::catch_unwind(|| threads::cancel_threads(&vendor, timeout)) {
            Ok((cancelled, still_running)) => {
                if let Some(a) = armed().as_mut() {
                    a.cancelled = cancelled;
                    a.still_running = still_running;
                }
            }
            Err(_) => log::error!("Stopping the vendor's threads panicked."),
        }
    }
    let original = ORIGINAL.load(Ordering::Acquire);
    if original != 0 {
        // SAFETY: the function glibc would have called from this slot, with
        // the same (empty) signature, while the vendor is still mapped.
        let function: extern "C" fn() = unsafe { std::mem::transmute(original) };
        function();
    }
}
