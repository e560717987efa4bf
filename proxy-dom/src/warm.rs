//! Warm contexts: a context made ahead of time for each device, handed to
//! the next session that asks for exactly that context.
//!
//! Making an OpenCL context on NVIDIA makes a CUDA context, about 100 ms of
//! the driver's work, and a move to crane-proxy makes the application's
//! contexts while the application is stopped. So the proxy keeps one unused
//! context per (device, properties) ready: made for each device with
//! `CL_CONTEXT_PLATFORM` at start, and for any other single-device
//! combination once a session has asked for it. A session that asks for one
//! takes it (it was never used by anyone: nothing of another tenant is in
//! it) and a replacement is made in the background. A proxy keeps one such
//! context per device and combination asked for (on NVIDIA each holds a
//! CUDA context's device memory). Contexts of several
//! devices, or with a notification callback, are made as asked.
//! `CRANE_PROXY_WARM_CONTEXTS=0` turns this off.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use opencl_sys::*;

use crate::vendor::{VPtr, vfn};

/// What a warm context must match: the device and the terminated property
/// list (empty: none).
type Key = (usize, Vec<cl_context_properties>);

/// Ready contexts per key, and the keys being filled.
pub(crate) struct Warm<T> {
    ready: Mutex<HashMap<Key, Vec<T>>>,
    filling: Mutex<std::collections::HashSet<Key>>,
}

impl<T> Default for Warm<T> {
    fn default() -> Self {
        Warm {
            ready: Mutex::new(HashMap::new()),
            filling: Mutex::new(Default::default()),
        }
    }
}

impl<T> Warm<T> {
    /// A ready value for `key`, if any.
    pub fn take(&self, key: &Key) -> Option<T> {
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(key)?
            .pop()
    }

    /// Whether `key` has a value ready or being made; if neither, marks it
    /// as being made (the caller makes it and [`put`](Self::put)s it).
    fn claim(&self, key: &Key) -> bool {
        let ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        if ready.get(key).is_some_and(|v| !v.is_empty()) {
            return false;
        }
        self.filling
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone())
    }

    /// Stores a value made for `key` (None: making it failed).
    fn put(&self, key: Key, value: Option<T>) {
        self.filling
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        if let Some(v) = value {
            self.ready
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key)
                .or_default()
                .push(v);
        }
    }

    /// Makes one value for `key` with `make` unless one is ready or being
    /// made; `spawn` runs the making (a thread, or at once in tests).
    pub fn refill(
        &'static self,
        key: Key,
        make: impl FnOnce() -> Option<T> + Send + 'static,
        spawn: impl FnOnce(Box<dyn FnOnce() + Send>),
    ) where
        T: Send + 'static,
    {
        if !self.claim(&key) {
            return;
        }
        spawn(Box::new(move || {
            let v = make();
            self.put(key, v);
        }));
    }
}

static CONTEXTS: LazyLock<Warm<VPtr>> = LazyLock::new(Warm::default);

/// Set by [`disable`]: no warm contexts in this process, whatever the
/// environment says.
static OFF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn enabled() -> bool {
    static ON: LazyLock<bool> = LazyLock::new(|| {
        std::env::var("CRANE_PROXY_WARM_CONTEXTS").map_or(true, |v| v.trim() != "0")
    });
    *ON && !OFF.load(std::sync::atomic::Ordering::Relaxed)
}

/// Turns warm contexts off for this process, before a proxy starts: a proxy
/// inside an application's process (crane's fallback onto the local GPU)
/// must leave nothing of the vendor's behind once its session is over, and
/// has only one session to serve.
pub fn disable() {
    OFF.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The key of a context of `device` with `props` (terminated, or empty).
/// `CL_CONTEXT_PLATFORM` naming the device's own platform, alone, is the
/// same context as no properties (the device decides the platform; crane's
/// client answers `CL_CONTEXT_PROPERTIES` from its own record), so both
/// share one key; a platform that is not the device's keeps its own key, and
/// the vendor's answer to it.
pub(crate) fn key(device: cl_device_id, props: &[cl_context_properties]) -> Key {
    let own = props.len() == 3
        && props[0] == CL_CONTEXT_PLATFORM
        && props[2] == 0
        && platform_of(device).is_some_and(|p| p as cl_context_properties == props[1]);
    (
        device as usize,
        if own { Vec::new() } else { props.to_vec() },
    )
}

fn platform_of(device: cl_device_id) -> Option<cl_platform_id> {
    let f = vfn!(device.cast::<std::ffi::c_void>(), clGetDeviceInfo).ok()?;
    let mut p: cl_platform_id = std::ptr::null_mut();
    // SAFETY: one cl_platform_id into one.
    let rc = unsafe {
        f(
            device,
            CL_DEVICE_PLATFORM,
            size_of::<cl_platform_id>(),
            (&raw mut p).cast(),
            std::ptr::null_mut(),
        )
    };
    (rc == CL_SUCCESS && !p.is_null()).then_some(p)
}

/// A replacement owed for a warm context a session took (or for a key it
/// asked for that had none ready). The session starts it once its calls
/// so far have run ([`Refill::start`] at its next `Sync`, or at its end),
/// not at the take: a move's rebuild takes the warm context and then writes
/// every buffer, and while the driver makes a context every transfer on
/// the device runs about eight times slower (NVIDIA H200: 32 writes of 8 MiB
/// from pinned memory 1.24-1.39 ms each against 0.16, benches/pinned-contexts.c).
#[must_use = "a refill does nothing until started"]
pub(crate) struct Refill {
    device: VPtr,
    key: Key,
}

impl Refill {
    /// Starts making the replacement in the background, unless one is
    /// ready or being made.
    pub fn start(self) {
        fill_key(self.device.get().cast(), self.key);
    }
}

/// A ready context for exactly this device and these properties, if any,
/// and the replacement owed for it (None when warm contexts are off).
pub(crate) fn take(
    device: cl_device_id,
    props: &[cl_context_properties],
) -> (Option<VPtr>, Option<Refill>) {
    if !enabled() {
        return (None, None);
    }
    let k = key(device, props);
    let got = CONTEXTS.take(&k);
    (
        got,
        Some(Refill {
            device: VPtr(device.cast()),
            key: k,
        }),
    )
}

/// Contexts ready, over every key, and keys whose context is being made
/// (for tests and operators' diagnostics).
pub fn counts() -> (usize, usize) {
    let ready = CONTEXTS
        .ready
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .map(Vec::len)
        .sum();
    let filling = CONTEXTS
        .filling
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .len();
    (ready, filling)
}

/// Starts making a context for `device` with `props` in the background,
/// unless one is ready or being made.
pub(crate) fn fill(device: cl_device_id, props: Vec<cl_context_properties>) {
    if !enabled() {
        return;
    }
    fill_key(device, key(device, &props));
}

/// Starts making a context for `k` (see [`fill`]); what is made is what the
/// key says (no properties for the device's own platform).
fn fill_key(device: cl_device_id, k: Key) {
    let d = VPtr(device.cast());
    let props = k.1.clone();
    CONTEXTS.refill(
        k,
        move || make(d, &props),
        |job| {
            let _ = std::thread::Builder::new()
                .name("crane-warm-ctx".into())
                .spawn(job);
        },
    );
}

fn make(device: VPtr, props: &[cl_context_properties]) -> Option<VPtr> {
    let f = vfn!(device.0, clCreateContext).ok()?;
    let d: cl_device_id = device.0.cast();
    let mut err = CL_SUCCESS;
    // SAFETY: a live root device of a loaded vendor, a terminated property
    // list (or NULL), no callback.
    let c = unsafe {
        f(
            if props.is_empty() {
                std::ptr::null()
            } else {
                props.as_ptr()
            },
            1,
            &d,
            None,
            std::ptr::null_mut(),
            &mut err,
        )
    };
    (err == CL_SUCCESS && !c.is_null()).then(|| VPtr(c.cast()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now(job: Box<dyn FnOnce() + Send>) {
        job()
    }

    #[test]
    fn a_ready_value_is_taken_once_and_refilled_once() {
        static W: LazyLock<Warm<u32>> = LazyLock::new(Warm::default);
        let k: Key = (1, vec![]);
        assert_eq!(W.take(&k), None);
        W.refill(k.clone(), || Some(7), now);
        // Ready already: a second refill makes nothing.
        W.refill(k.clone(), || panic!("made twice"), now);
        assert_eq!(W.take(&k), Some(7));
        assert_eq!(W.take(&k), None);
        // Another key is another slot.
        W.refill((2, vec![1, 2, 0]), || Some(9), now);
        assert_eq!(W.take(&k), None);
        assert_eq!(W.take(&(2, vec![1, 2, 0])), Some(9));
    }

    #[test]
    fn a_failed_making_leaves_the_key_free_to_try_again() {
        static W: LazyLock<Warm<u32>> = LazyLock::new(Warm::default);
        let k: Key = (3, vec![]);
        W.refill(k.clone(), || None, now);
        assert_eq!(W.take(&k), None);
        W.refill(k.clone(), || Some(4), now);
        assert_eq!(W.take(&k), Some(4));
    }

    #[test]
    fn a_key_being_made_is_not_made_again() {
        static W: LazyLock<Warm<u32>> = LazyLock::new(Warm::default);
        let k: Key = (5, vec![]);
        let mut later = None;
        W.refill(k.clone(), || Some(1), |job| later = Some(job));
        W.refill(k.clone(), || panic!("made while being made"), now);
        later.expect("spawned")();
        assert_eq!(W.take(&k), Some(1));
    }
}
