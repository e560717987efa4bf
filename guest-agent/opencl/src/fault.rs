//! Fault injection for the tests that prove a panic inside crane becomes an
//! OpenCL error code, and for the fault tests' other injected failures.
//! Compiled into debug builds (what `cargo test` loads: no second build of
//! the library and its dependencies just for these tests) and into release
//! builds only with the cargo feature `fault-injection`; in a release build
//! without it every function here is empty and inlined away. Nothing fires
//! unless its `CRANE_FAULT_*` variable is set.
//!
//! `CRANE_FAULT_PANIC=clCreateBuffer,event_trampoline` makes the first call of
//! each named entry point (or callback trampoline) panic inside its
//! `catch_unwind`; later calls run normally.

/// A named place that may be made to panic.
#[inline(always)]
pub fn point(_name: &str) {
    #[cfg(any(feature = "fault-injection", debug_assertions))]
    armed::hit(_name);
}

/// `CRANE_FAULT_ARG_INFO_BUILD=1`: take every build that crane gives
/// `-cl-kernel-arg-info` as failed by the vendor, as NVIDIA's compiler fails a
/// program with an argument-less kernel (crane must then build it with the
/// application's own options).
#[inline(always)]
pub fn arg_info_build_fails() -> bool {
    #[cfg(any(feature = "fault-injection", debug_assertions))]
    {
        std::env::var_os("CRANE_FAULT_ARG_INFO_BUILD").is_some_and(|v| v == "1")
    }
    #[cfg(not(any(feature = "fault-injection", debug_assertions)))]
    {
        false
    }
}

/// `CRANE_FAULT_RELOADS_WITHOUT_DEVICE=N`: the first N reloads of the local
/// vendor (after the first load) find it offering no device, as a driver
/// that is not ready yet does.
#[inline(always)]
pub fn reload_without_device() -> bool {
    #[cfg(any(feature = "fault-injection", debug_assertions))]
    {
        use std::sync::atomic::{AtomicI64, Ordering};
        static LEFT: AtomicI64 = AtomicI64::new(-1);
        if LEFT.load(Ordering::Relaxed) < 0 {
            let n = std::env::var("CRANE_FAULT_RELOADS_WITHOUT_DEVICE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0i64);
            let _ = LEFT.compare_exchange(-1, n, Ordering::Relaxed, Ordering::Relaxed);
        }
        LEFT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n > 0).then(|| n - 1)
        })
        .is_ok()
    }
    #[cfg(not(any(feature = "fault-injection", debug_assertions)))]
    {
        false
    }
}

/// `CRANE_FAULT_MOVE_READ_FAILS=N`: the Nth read a move to crane-proxy
/// makes beside the proxy's rebuild (counted over the process's life) fails
/// with CL_OUT_OF_RESOURCES, as a device that went wrong would.
#[inline(always)]
pub fn move_read_fails() -> bool {
    #[cfg(any(feature = "fault-injection", debug_assertions))]
    {
        use std::sync::atomic::{AtomicU64, Ordering};
        static READS: AtomicU64 = AtomicU64::new(0);
        let n = READS.fetch_add(1, Ordering::Relaxed) + 1;
        std::env::var("CRANE_FAULT_MOVE_READ_FAILS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            == Some(n)
    }
    #[cfg(not(any(feature = "fault-injection", debug_assertions)))]
    {
        false
    }
}

/// `CRANE_FAULT_SLOW_RELEASE_MS=N`: the release of the vendor objects a
/// suspend or move took out waits N ms first, as NVIDIA's release of a
/// context with its memory takes tens to hundreds of ms, while the
/// application already runs on the move's target.
#[inline(always)]
pub fn slow_release() {
    #[cfg(any(feature = "fault-injection", debug_assertions))]
    if let Some(ms) = std::env::var("CRANE_FAULT_SLOW_RELEASE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// The fault point of the entry point whose body is the closure type `F`.
#[inline(always)]
pub fn entry<F>() {
    #[cfg(any(feature = "fault-injection", debug_assertions))]
    armed::hit(armed::entry_name(std::any::type_name::<F>()));
}

#[cfg(any(feature = "fault-injection", debug_assertions))]
mod armed {
    use std::sync::{Mutex, OnceLock};

    /// The places still to panic; `None` when `CRANE_FAULT_PANIC` names
    /// none (every call of a debug build passes here: no lock then).
    fn armed() -> Option<&'static Mutex<Vec<String>>> {
        static ARMED: OnceLock<Option<Mutex<Vec<String>>>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let names = std::env::var("CRANE_FAULT_PANIC").unwrap_or_default();
                let names: Vec<String> = names
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(String::from)
                    .collect();
                (!names.is_empty()).then(|| Mutex::new(names))
            })
            .as_ref()
    }

    /// The entry point a body closure belongs to: its type is named
    /// `crane_opencl::api::<family>::<entry point>::{{closure}}`.
    pub fn entry_name(closure_type: &str) -> &str {
        closure_type
            .rsplit("::")
            .find(|s| s.starts_with("cl"))
            .unwrap_or(closure_type)
    }

    pub fn hit(name: &str) {
        let Some(armed) = armed() else {
            return;
        };
        let fire = {
            let mut a = armed.lock().unwrap_or_else(|e| e.into_inner());
            match a.iter().position(|n| n == name) {
                Some(i) => {
                    a.remove(i);
                    true
                }
                None => false,
            }
        };
        if fire {
            panic!("fault injected into {name} (CRANE_FAULT_PANIC)");
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn entry_name_is_the_entry_point() {
            assert_eq!(
                super::entry_name("crane_opencl::api::memory::clCreateBuffer::{{closure}}"),
                "clCreateBuffer"
            );
            assert_eq!(
                super::entry_name("crane_opencl::api::clRetainContext::{{closure}}"),
                "clRetainContext"
            );
        }
    }
}
