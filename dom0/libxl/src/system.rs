//! [`Libxl`]: the [`Xl`] trait over a real libxl context.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{Mutex, MutexGuard};

use libxl_sys as sys;

use crate::create::xl_create;
use crate::error::{LibxlCode, LibxlError};
use crate::logger::LogLogger;
use crate::pci::PciAddr;
use crate::xl::{DomainInfo, DomainState, Xl};

/// libxl installs a SIGCHLD handler for its own children (hotplug scripts,
/// the device model) and reaps only those; craned runs `xl` itself and waits
/// for it with waitpid on its pid, which this mode allows. libxl keeps the
/// pointer, so the hooks are static.
static CHILD_HOOKS: sys::libxl_childproc_hooks = sys::libxl_childproc_hooks {
    chldowner: sys::libxl_sigchld_owner::libxl_sigchld_owner_libxl_always_selective_reap,
    fork_replacement: None,
    reaped_callback: None,
};

struct Ctx {
    ctx: *mut sys::libxl_ctx,
    /// Owned here; libxl holds a pointer to it until `libxl_ctx_free`.
    logger: *mut LogLogger,
}

// SAFETY: a libxl context is not tied to the thread that made it; the Mutex
// around `Ctx` makes every use exclusive.
unsafe impl Send for Ctx {}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: `ctx` came from libxl_ctx_alloc and is freed once, here;
        // libxl no longer uses the logger after that, so it is freed last.
        unsafe {
            sys::libxl_ctx_free(self.ctx);
            drop(Box::from_raw(self.logger));
        }
    }
}

/// A libxl context (calls are serialised) plus the path of the real `xl`,
/// which [`Xl::create`] runs.
pub struct Libxl {
    ctx: Mutex<Ctx>,
    xl: PathBuf,
}

fn check(op: &'static str, rc: i32) -> Result<(), LibxlError> {
    match LibxlCode::from_rc(rc) {
        None => Ok(()),
        Some(code) => Err(LibxlError::Call { op, code }),
    }
}

/// A `libxl_device_pci` for one address; disposed when dropped.
struct PciDevice(sys::libxl_device_pci);

impl PciDevice {
    fn new(bdf: PciAddr) -> PciDevice {
        let mut raw = std::mem::MaybeUninit::<sys::libxl_device_pci>::uninit();
        // SAFETY: libxl_device_pci_init fully initialises the structure
        // (zeroes it and sets defaults), so assume_init is sound after it.
        let mut raw = unsafe {
            sys::libxl_device_pci_init(raw.as_mut_ptr());
            raw.assume_init()
        };
        raw.domain = i32::from(bdf.domain);
        raw.bus = bdf.bus;
        raw.dev = bdf.dev;
        raw.func = bdf.func;
        PciDevice(raw)
    }
}

impl Drop for PciDevice {
    fn drop(&mut self) {
        // SAFETY: initialised by libxl_device_pci_init; dispose frees what
        // libxl allocated inside (nothing for the fields set here).
        unsafe { sys::libxl_device_pci_dispose(&mut self.0) }
    }
}

fn addr_of(p: &sys::libxl_device_pci) -> PciAddr {
    PciAddr::new(p.domain as u16, p.bus, p.dev, p.func)
}

fn state_of(i: &sys::libxl_dominfo) -> DomainState {
    if i.dying {
        DomainState::Dying
    } else if i.shutdown {
        DomainState::Shutdown
    } else if i.paused {
        DomainState::Paused
    } else if i.running {
        DomainState::Running
    } else {
        DomainState::Blocked
    }
}

impl Libxl {
    /// Opens a libxl context whose messages go to the `log` crate (target
    /// `libxl`). `real_xl` is the xl binary [`Xl::create`] runs. Fails
    /// outside dom0 of a running Xen.
    pub fn open(real_xl: impl Into<PathBuf>) -> Result<Libxl, LibxlError> {
        let logger = Box::into_raw(LogLogger::new());
        let mut ctx = ptr::null_mut();
        // SAFETY: `ctx` is an out-pointer; the logger lives until Ctx's drop,
        // after libxl_ctx_free. LIBXL_VERSION is the header's value.
        let rc = unsafe {
            sys::libxl_ctx_alloc(
                &mut ctx,
                sys::LIBXL_VERSION as i32,
                0,
                LogLogger::as_xtl(&mut *logger),
            )
        };
        if let Some(code) = LibxlCode::from_rc(rc) {
            // SAFETY: libxl_ctx_free accepts null and a half-made context;
            // the logger is ours again once the context is gone.
            unsafe {
                sys::libxl_ctx_free(ctx);
                drop(Box::from_raw(logger));
            }
            return Err(LibxlError::Open(code));
        }
        // SAFETY: `ctx` is valid; CHILD_HOOKS is static, as libxl requires.
        unsafe { sys::libxl_childproc_setmode(ctx, &CHILD_HOOKS, ptr::null_mut()) };
        Ok(Libxl {
            ctx: Mutex::new(Ctx { ctx, logger }),
            xl: real_xl.into(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Ctx> {
        self.ctx.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn name_of(ctx: &Ctx, domid: u32) -> String {
        // SAFETY: valid context; the result is null or a malloc'd string we
        // own and free.
        unsafe {
            let p = sys::libxl_domid_to_name(ctx.ctx, domid);
            if p.is_null() {
                return String::new();
            }
            let name = CStr::from_ptr(p).to_string_lossy().into_owned();
            libc::free(p.cast());
            name
        }
    }

    fn info_of(ctx: &Ctx, i: &sys::libxl_dominfo) -> DomainInfo {
        DomainInfo {
            domid: i.domid,
            name: Self::name_of(ctx, i.domid),
            state: state_of(i),
            memory_kib: i.current_memkb,
        }
    }

    /// Runs a libxl call that fills an array, copying each element out and
    /// freeing the array with `free`.
    fn list<T, E>(
        op: &'static str,
        call: impl FnOnce(&mut i32) -> *mut E,
        each: impl Fn(&E) -> T,
        free: impl FnOnce(*mut E, i32),
    ) -> Result<Vec<T>, LibxlError> {
        let mut n = 0;
        let p = call(&mut n);
        if p.is_null() {
            return if n == 0 {
                Ok(Vec::new())
            } else {
                Err(LibxlError::Null { op })
            };
        }
        let count = usize::try_from(n).unwrap_or(0);
        // SAFETY: libxl returned `n` initialised elements at `p`.
        let items = unsafe { std::slice::from_raw_parts(p, count) };
        let out = items.iter().map(each).collect();
        free(p, n);
        Ok(out)
    }

    fn pci_op(
        &self,
        op: &'static str,
        bdf: PciAddr,
        call: impl FnOnce(*mut sys::libxl_ctx, *mut sys::libxl_device_pci) -> i32,
    ) -> Result<(), LibxlError> {
        let ctx = self.lock();
        let mut dev = PciDevice::new(bdf);
        let rc = call(ctx.ctx, &mut dev.0);
        match LibxlCode::from_rc(rc) {
            None => Ok(()),
            Some(code) => Err(LibxlError::Pci { op, bdf, code }),
        }
    }
}

impl Xl for Libxl {
    fn domid(&self, name: &str) -> Result<Option<u32>, LibxlError> {
        let c = CString::new(name).map_err(|_| LibxlError::BadName(name.to_string()))?;
        let ctx = self.lock();
        let mut domid = 0u32;
        // SAFETY: valid context, NUL-terminated name, out-pointer.
        let rc = unsafe { sys::libxl_name_to_domid(ctx.ctx, c.as_ptr(), &mut domid) };
        match LibxlCode::from_rc(rc) {
            None => Ok(Some(domid)),
            // libxl_name_to_domid answers ERROR_INVAL when no domain has the
            // name.
            Some(LibxlCode::Inval) => Ok(None),
            Some(code) => Err(LibxlError::Call {
                op: "name_to_domid",
                code,
            }),
        }
    }

    fn domain_info(&self, domid: u32) -> Result<Option<DomainInfo>, LibxlError> {
        let ctx = self.lock();
        let mut raw = std::mem::MaybeUninit::<sys::libxl_dominfo>::uninit();
        // SAFETY: init fully initialises the structure; domain_info fills it
        // for an existing domain; dispose frees what it allocated inside.
        unsafe {
            sys::libxl_dominfo_init(raw.as_mut_ptr());
            let mut info = raw.assume_init();
            let rc = sys::libxl_domain_info(ctx.ctx, &mut info, domid);
            let out = match LibxlCode::from_rc(rc) {
                None => Ok(Some(Self::info_of(&ctx, &info))),
                Some(LibxlCode::DomainNotFound) => Ok(None),
                Some(code) => Err(LibxlError::Domain {
                    op: "domain_info",
                    domid,
                    code,
                }),
            };
            sys::libxl_dominfo_dispose(&mut info);
            out
        }
    }

    fn domains(&self) -> Result<Vec<DomainInfo>, LibxlError> {
        let ctx = self.lock();
        Self::list(
            "list_domain",
            // SAFETY: valid context and out-pointer.
            |n| unsafe { sys::libxl_list_domain(ctx.ctx, n) },
            |i| Self::info_of(&ctx, i),
            // SAFETY: the list and count libxl_list_domain returned.
            |p, n| unsafe { sys::libxl_dominfo_list_free(p, n) },
        )
    }

    fn pci_assignable_list(&self) -> Result<Vec<PciAddr>, LibxlError> {
        let ctx = self.lock();
        Self::list(
            "device_pci_assignable_list",
            // SAFETY: valid context and out-pointer.
            |n| unsafe { sys::libxl_device_pci_assignable_list(ctx.ctx, n) },
            addr_of,
            // SAFETY: the list and count libxl returned.
            |p, n| unsafe { sys::libxl_device_pci_assignable_list_free(p, n) },
        )
    }

    fn pci_assignable_add(&self, bdf: PciAddr, rebind: bool) -> Result<(), LibxlError> {
        self.pci_op("device_pci_assignable_add", bdf, |ctx, dev| {
            // SAFETY: valid context and initialised device.
            unsafe { sys::libxl_device_pci_assignable_add(ctx, dev, i32::from(rebind)) }
        })
    }

    fn pci_assignable_remove(&self, bdf: PciAddr, rebind: bool) -> Result<(), LibxlError> {
        self.pci_op("device_pci_assignable_remove", bdf, |ctx, dev| {
            // SAFETY: valid context and initialised device.
            unsafe { sys::libxl_device_pci_assignable_remove(ctx, dev, i32::from(rebind)) }
        })
    }

    fn pci_list(&self, domid: u32) -> Result<Vec<PciAddr>, LibxlError> {
        let ctx = self.lock();
        Self::list(
            "device_pci_list",
            // SAFETY: valid context and out-pointer.
            |n| unsafe { sys::libxl_device_pci_list(ctx.ctx, domid, n) },
            addr_of,
            // SAFETY: the list and count libxl returned.
            |p, n| unsafe { sys::libxl_device_pci_list_free(p, n) },
        )
    }

    fn pci_attach(&self, domid: u32, bdf: PciAddr) -> Result<(), LibxlError> {
        self.pci_op("device_pci_add", bdf, |ctx, dev| {
            // SAFETY: valid context and device; a null ao_how makes the call
            // synchronous.
            unsafe { sys::libxl_device_pci_add(ctx, domid, dev, ptr::null()) }
        })
    }

    fn pci_detach(&self, domid: u32, bdf: PciAddr) -> Result<(), LibxlError> {
        self.pci_op("device_pci_remove", bdf, |ctx, dev| {
            // SAFETY: valid context and device; a null ao_how makes the call
            // synchronous.
            unsafe { sys::libxl_device_pci_remove(ctx, domid, dev, ptr::null()) }
        })
    }

    fn create(&self, config: &Path, paused: bool) -> Result<(), LibxlError> {
        xl_create(&self.xl, config, paused)
    }

    fn unpause(&self, domid: u32) -> Result<(), LibxlError> {
        let ctx = self.lock();
        // SAFETY: valid context; a null ao_how makes the call synchronous.
        let rc = unsafe { sys::libxl_domain_unpause(ctx.ctx, domid, ptr::null()) };
        check("domain_unpause", rc).map_err(|e| match e {
            LibxlError::Call { op, code } => LibxlError::Domain { op, domid, code },
            e => e,
        })
    }

    fn destroy(&self, domid: u32) -> Result<(), LibxlError> {
        let ctx = self.lock();
        // SAFETY: valid context; a null ao_how makes the call synchronous.
        let rc = unsafe { sys::libxl_domain_destroy(ctx.ctx, domid, ptr::null()) };
        check("domain_destroy", rc).map_err(|e| match e {
            LibxlError::Call { op, code } => LibxlError::Domain { op, domid, code },
            e => e,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_devices_carry_the_address() {
        let bdf: PciAddr = "0000:00:05.0".parse().unwrap();
        let dev = PciDevice::new(bdf);
        assert_eq!(addr_of(&dev.0), bdf);
        assert!(dev.0.name.is_null());
    }

    #[test]
    fn opening_without_xen_fails_cleanly() {
        // Without a hypervisor libxl cannot open its handles; the error must
        // come back as a value, with everything freed.
        if Path::new("/proc/xen/capabilities").exists() {
            return;
        }
        match Libxl::open("/usr/sbin/xl") {
            Err(LibxlError::Open(_)) => {}
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("opened a libxl context without Xen"),
        }
    }
}
