//! Unloading: the vendor's own `dlclose`, then what it left behind, then the
//! device descriptors and mappings, and a report of what stays.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, c_void};
use std::fmt;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use crate::objects::{self, ObjectFacts, ObjectId};
use crate::residue::{self, DeviceFd, DeviceMapping, DevicePolicy};
use crate::stacks;
use crate::termination;
use crate::threads::{self, VendorThread};
use crate::tracker::{self, HandleEntry};
use crate::{UnloadError, dl_error};

/// How many references taken behind the hooks are dropped from one library
/// before giving up on it.
const MAX_LEAKED_REFERENCES: usize = 16;

/// What [`crate::VendorLibrary::close`] did, and what stays.
#[derive(Debug, Clone)]
pub struct UnloadReport {
    /// The vendor library that was closed (the first opened of several).
    pub vendor: PathBuf,
    /// Every vendor library closed, in the order they were opened.
    pub vendors: Vec<PathBuf>,
    /// Libraries that came with or from the vendor and are unmapped now.
    pub libraries_closed: Vec<PathBuf>,
    /// Libraries that came with or from the vendor and are still mapped.
    pub libraries_still_mapped: Vec<StillMapped>,
    /// Libraries that appeared while the vendor was loaded without going
    /// through its `dlopen`, for instance loaded by the C library on its
    /// behalf, or by the application itself. They are left alone.
    pub libraries_loaded_untracked: Vec<PathBuf>,
    /// Handles the vendor closed itself (the closes were held back until
    /// now).
    pub handles_closed_by_vendor: Vec<PathBuf>,
    /// Handles the vendor left open, closed on its behalf.
    pub handles_closed_for_vendor: Vec<PathBuf>,
    /// References dropped that were taken without the hooks seeing them,
    /// one entry per reference.
    pub references_dropped: Vec<PathBuf>,
    pub device_fds_closed: Vec<DeviceFd>,
    pub device_mappings_unmapped: Vec<DeviceMapping>,
    /// Threads whose start routine lies in the vendor library itself and
    /// that were still running when glibc was about to unmap it: they were
    /// cancelled (and waited for, up to the policy's thread timeout) first.
    pub vendor_threads_cancelled: Vec<VendorThread>,
    /// Threads started by vendor code that still run.
    pub vendor_threads_alive: Vec<VendorThread>,
    pub elapsed: Duration,
}

/// A library that stays mapped after unloading, and why, as far as known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StillMapped {
    pub path: PathBuf,
    pub reasons: Vec<RetainReason>,
}

/// Why a library stays mapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetainReason {
    /// Its dynamic section has `DF_1_NODELETE` (as LLVM's and Clang's do).
    NoDeleteFlag,
    /// The vendor opened it with `RTLD_NODELETE`.
    OpenedNoDelete,
    /// It defines `STB_GNU_UNIQUE` symbols; glibc never unloads such a
    /// library once one of them has been bound.
    UniqueSymbols,
    /// This still-mapped library lists it in `DT_NEEDED`.
    NeededBy(PathBuf),
    /// A still-mapped library (`None`: code whose library was not found)
    /// opened it and has not closed it; closing it behind that library's
    /// back could leave it with dangling pointers.
    HeldOpen { by: Option<PathBuf> },
    /// The vendor closed it, but stays mapped itself and may still call into
    /// it (PoCL 3.1 does after `POCL_ENABLE_UNINIT`), so the close is kept
    /// for when the vendor is unmapped.
    ClosedByMappedVendor,
    /// A thread started by vendor code in this library still runs; unmapping
    /// it would crash the thread.
    ThreadRunning(Option<libc::pid_t>),
    /// `dlclose` failed with this message.
    CloseFailed(String),
    /// None of the above shows: the dynamic linker keeps it, typically
    /// because a `NODELETE` library binds to its symbols.
    DynamicLinker,
}

impl fmt::Display for RetainReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoDeleteFlag => write!(f, "it is marked NODELETE"),
            Self::OpenedNoDelete => write!(f, "the vendor opened it with RTLD_NODELETE"),
            Self::UniqueSymbols => write!(f, "it defines STB_GNU_UNIQUE symbols"),
            Self::NeededBy(by) => write!(f, "{} needs it", by.display()),
            Self::HeldOpen { by: Some(by) } => write!(f, "{} holds it open", by.display()),
            Self::HeldOpen { by: None } => write!(f, "vendor code holds it open"),
            Self::ClosedByMappedVendor => {
                write!(
                    f,
                    "the vendor closed it but stays mapped and may still use it"
                )
            }
            Self::ThreadRunning(Some(tid)) => write!(f, "vendor thread {tid} runs in it"),
            Self::ThreadRunning(None) => write!(f, "a starting vendor thread runs in it"),
            Self::CloseFailed(message) => write!(f, "dlclose failed: {message}"),
            Self::DynamicLinker => write!(f, "the dynamic linker keeps it"),
        }
    }
}

/// The objects that hold the start routine of a running vendor thread.
fn objects_running_threads() -> HashMap<ObjectId, Option<libc::pid_t>> {
    // vendor_threads_alive prunes ended threads first.
    threads::vendor_threads_alive();
    tracker::lock()
        .threads
        .iter()
        .filter_map(|t| Some((t.start_object.clone()?, t.task.map(|task| task.tid))))
        .collect()
}

fn handle_of(entry: &HandleEntry) -> *mut c_void {
    entry.handle as *mut c_void
}

/// Closes, latest first, the handles the vendor closed itself and those it
/// left open whose opener is gone, until no more can be closed.
/// Handles opened from `keep` (what a vendor that stays mapped can reach)
/// stay open.
fn close_vendor_handles(
    report: &mut UnloadReport,
    failures: &mut HashMap<ObjectId, String>,
    keep: &HashSet<ObjectId>,
) {
    'rescan: loop {
        let entries = tracker::lock().handles.clone();
        let loaded = objects::loaded_ids();
        let running = objects_running_threads();
        for entry in entries.iter().rev() {
            let opener_gone = entry
                .opener
                .as_ref()
                .is_none_or(|opener| *opener == entry.target || !loaded.contains(opener));
            // A vendor that stays mapped may still use what it opened (its
            // own closes are held back too); what a gone vendor opened is
            // closed, which leaves any reference of the mapped one in place.
            let kept = match &entry.opener {
                Some(opener) => keep.contains(opener),
                None => keep.contains(&entry.target),
            };
            if !loaded.contains(&entry.target)
                || kept
                || !(entry.closed_by_vendor || opener_gone)
                || running.contains_key(&entry.target)
            {
                continue;
            }
            tracker::lock().handles.retain(|h| h.serial != entry.serial);
            // SAFETY: the handle came from a successful dlopen by the vendor,
            // its object is still loaded (so the handle is not stale), and
            // nobody but the unloaded vendor was meant to use it.
            if unsafe { libc::dlclose(handle_of(entry)) } != 0 {
                failures.insert(entry.target.clone(), dl_error());
            } else if entry.target.path.as_os_str().is_empty() {
                // A handle of the main program (dlopen(NULL)): nothing to
                // unload, not worth reporting.
            } else if entry.closed_by_vendor {
                report
                    .handles_closed_by_vendor
                    .push(entry.target.path.clone());
            } else {
                report
                    .handles_closed_for_vendor
                    .push(entry.target.path.clone());
            }
            // Closing may have unloaded openers of other handles.
            continue 'rescan;
        }
        return;
    }
}

fn is_loaded(id: &ObjectId) -> bool {
    objects::loaded_ids().contains(id)
}

/// Drops references to `id` that nobody tracked (as NVIDIA's libcuda holds
/// on itself), until `dlopen(RTLD_NOLOAD)` no longer finds it or there is no
/// reference left to drop.
fn drop_untracked_references(id: &ObjectId, report: &mut UnloadReport) {
    let Ok(path) = CString::new(id.path.as_os_str().as_bytes()) else {
        return;
    };
    for _ in 0..MAX_LEAKED_REFERENCES {
        // SAFETY: path is NUL-terminated; RTLD_NOLOAD loads nothing.
        let probe = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        let Some(probe) = NonNull::new(probe) else {
            dl_error();
            return;
        };
        let same = tracker::handle_target(probe).as_ref() == Some(id);
        // SAFETY: undoes the probe's own reference.
        unsafe { libc::dlclose(probe.as_ptr()) };
        if !same || !is_loaded(id) {
            return;
        }
        // SAFETY: the object is still loaded, so the handle is valid; this
        // drops one reference that some unloaded vendor code left behind.
        // glibc refuses ("shared object not open") when none is left.
        if unsafe { libc::dlclose(probe.as_ptr()) } != 0 {
            dl_error();
            return;
        }
        report.references_dropped.push(id.path.clone());
        if !is_loaded(id) {
            return;
        }
    }
}

/// Diagnostics (`CRANE_UNLOAD_TRACE=1`): which threads have code of the
/// vendor's libraries on their stacks at each step.
struct Trace {
    on: bool,
    started: Instant,
    code: Vec<(ObjectId, Range<usize>)>,
}

impl Trace {
    fn new(started: Instant, attributed: &[ObjectId]) -> Trace {
        let on = std::env::var_os("CRANE_UNLOAD_TRACE").is_some_and(|v| v != "0");
        let code = if on {
            objects::code_ranges(&attributed.iter().cloned().collect())
        } else {
            Vec::new()
        };
        Trace { on, started, code }
    }

    fn describe(&self, address: usize) -> String {
        match self.code.iter().find(|(_, r)| r.contains(&address)) {
            Some((id, _)) => format!(
                "{}+{:#x}",
                id.path
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
                address - id.base
            ),
            None => format!("{address:#x}"),
        }
    }

    fn point(&self, label: &str) {
        if !self.on {
            return;
        }
        let ranges: Vec<Range<usize>> = self.code.iter().map(|(_, r)| r.clone()).collect();
        let hits = stacks::threads_with_code_on_stack(&ranges, true);
        let threads: Vec<String> = threads::vendor_threads_alive()
            .iter()
            .map(|t| format!("{:?}/{}", t.tid, t.name.as_deref().unwrap_or("?")))
            .collect();
        eprintln!(
            "crane-unload-trace +{:.1}ms {label}: vendor threads [{}]",
            self.started.elapsed().as_secs_f64() * 1e3,
            threads.join(" ")
        );
        for hit in hits {
            let words: Vec<String> = hit
                .words
                .iter()
                .take(16)
                .map(|&(offset, value)| format!("sp+{offset:#x}={}", self.describe(value)))
                .collect();
            eprintln!(
                "crane-unload-trace   tid {} {} pc {} [{}]",
                hit.tid,
                hit.name,
                hit.pc
                    .map_or_else(|| "running".into(), |pc| self.describe(pc)),
                words.join(" ")
            );
        }
    }
}

fn reasons(
    id: &ObjectId,
    facts: &[ObjectFacts],
    handles: &[HandleEntry],
    opened_nodelete: &HashSet<ObjectId>,
    running: &HashMap<ObjectId, Option<libc::pid_t>>,
    failures: &HashMap<ObjectId, String>,
) -> Vec<RetainReason> {
    let mut reasons = Vec::new();
    let mut add = |reason| {
        if !reasons.contains(&reason) {
            reasons.push(reason);
        }
    };
    if let Some(message) = failures.get(id) {
        add(RetainReason::CloseFailed(message.clone()));
    }
    if let Some(tid) = running.get(id) {
        add(RetainReason::ThreadRunning(*tid));
    }
    let own = facts.iter().find(|f| f.id == *id);
    if own.is_some_and(|f| f.nodelete_flag) {
        add(RetainReason::NoDeleteFlag);
    }
    if opened_nodelete.contains(id) {
        add(RetainReason::OpenedNoDelete);
    }
    for handle in handles.iter().filter(|h| h.target == *id) {
        if handle.closed_by_vendor {
            add(RetainReason::ClosedByMappedVendor);
        } else {
            add(RetainReason::HeldOpen {
                by: handle.opener.as_ref().map(|o| o.path.clone()),
            });
        }
    }
    let file_name = id
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let soname = own.and_then(|f| f.soname.clone());
    for other in facts.iter().filter(|f| f.id != *id) {
        let needs = other
            .needed
            .iter()
            .any(|n| Some(n) == soname.as_ref() || Some(n) == file_name.as_ref());
        if needs {
            add(RetainReason::NeededBy(other.id.path.clone()));
        }
    }
    if own.is_some_and(|f| f.unique_symbols) {
        add(RetainReason::UniqueSymbols);
    }
    if reasons.is_empty() {
        reasons.push(RetainReason::DynamicLinker);
    }
    reasons
}

/// One vendor library of the group being closed.
pub(crate) struct Opened {
    pub handle: NonNull<c_void>,
    pub path: PathBuf,
    pub object: ObjectId,
}

/// What a vendor that stays mapped can still reach: the vendors themselves,
/// the libraries they (transitively) need, and what those opened and have not
/// closed. Nothing of it may be closed behind their back.
fn reachable_from(
    mapped: &[ObjectId],
    attributed: &[ObjectId],
    handles: &[HandleEntry],
) -> HashSet<ObjectId> {
    let loaded = objects::loaded_ids();
    let live: HashSet<ObjectId> = attributed
        .iter()
        .filter(|id| loaded.contains(id))
        .cloned()
        .collect();
    let facts = objects::facts(&live);
    let mut reach: HashSet<ObjectId> = mapped.iter().cloned().collect();
    loop {
        let before = reach.len();
        let mut more = Vec::new();
        for f in facts.iter().filter(|f| reach.contains(&f.id)) {
            for other in &facts {
                let name = other
                    .id
                    .path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned());
                if f.needed
                    .iter()
                    .any(|n| Some(n) == other.soname.as_ref() || Some(n) == name.as_ref())
                {
                    more.push(other.id.clone());
                }
            }
        }
        for h in handles {
            if h.opener.as_ref().is_some_and(|o| reach.contains(o)) {
                more.push(h.target.clone());
            }
        }
        reach.extend(more);
        if reach.len() == before {
            return reach;
        }
    }
}

pub(crate) fn unload(
    vendors: &[Opened],
    loaded_before: &HashSet<ObjectId>,
    policy: &DevicePolicy,
) -> Result<UnloadReport, UnloadError> {
    let started = Instant::now();
    let mut attributed: Vec<ObjectId> = tracker::lock().objects.clone();
    for v in vendors {
        if !attributed.contains(&v.object) {
            attributed.push(v.object.clone());
        }
    }
    let opened_nodelete: HashSet<ObjectId> = tracker::lock()
        .handles
        .iter()
        .filter(|h| h.nodelete)
        .map(|h| h.target.clone())
        .collect();

    let trace = Trace::new(started, &attributed);
    trace.point("before the vendor's dlclose");
    let mut cancelled = Vec::new();
    for v in vendors {
        // Threads the vendor started and never stops must end before glibc
        // unmaps it (termination.rs); when it is not unmapped, they live on.
        let hooked = termination::needed(&v.object)
            && termination::arm(&v.object, policy.thread_exit_timeout);
        // SAFETY: the handle from open, closed exactly once (closing consumes
        // the VendorLibrary); the caller has released every object of it.
        if unsafe { libc::dlclose(v.handle.as_ptr()) } != 0 {
            if hooked {
                termination::disarm();
            }
            return Err(UnloadError::VendorClose {
                path: v.path.clone(),
                message: dl_error(),
            });
        }
        let outcome = if hooked {
            termination::disarm()
        } else {
            termination::Outcome::default()
        };
        if trace.on && hooked {
            eprintln!(
                "crane-unload-trace termination hook of {}: fired {}, cancelled {:?}, still running {:?}",
                v.path.display(),
                outcome.fired,
                outcome.cancelled,
                outcome.still_running
            );
        }
        cancelled.extend(outcome.cancelled);
    }
    trace.point("after the vendor's dlclose");
    let path = vendors.last().map_or_else(PathBuf::new, |v| v.path.clone());
    let path = path.as_path();

    let mut report = UnloadReport {
        vendor: path.to_path_buf(),
        vendors: vendors.iter().rev().map(|v| v.path.clone()).collect(),
        libraries_closed: Vec::new(),
        libraries_still_mapped: Vec::new(),
        libraries_loaded_untracked: Vec::new(),
        handles_closed_by_vendor: Vec::new(),
        handles_closed_for_vendor: Vec::new(),
        references_dropped: Vec::new(),
        device_fds_closed: Vec::new(),
        device_mappings_unmapped: Vec::new(),
        vendor_threads_cancelled: cancelled,
        vendor_threads_alive: Vec::new(),
        elapsed: Duration::ZERO,
    };
    let mut failures = HashMap::new();
    let mapped: Vec<ObjectId> = vendors
        .iter()
        .filter(|v| is_loaded(&v.object))
        .map(|v| v.object.clone())
        .collect();
    if mapped.len() < vendors.len() {
        // What a vendor that stays mapped can reach is its own (none when all
        // are gone).
        let keep = if mapped.is_empty() {
            HashSet::new()
        } else {
            reachable_from(&mapped, &attributed, &tracker::lock().handles)
        };
        // Threads the vendor stopped in its destructors may need a moment to
        // leave code that is about to be unmapped.
        // Those of a vendor that stays mapped may run on: not waited for.
        let kept: HashSet<&std::path::Path> = keep.iter().map(|id| id.path.as_path()).collect();
        threads::wait_for_vendor_threads(policy.thread_exit_timeout, |t| {
            t.start_library.as_deref().is_some_and(|p| kept.contains(p))
        });
        close_vendor_handles(&mut report, &mut failures, &keep);
        let running = objects_running_threads();
        let held: HashSet<ObjectId> = tracker::lock()
            .handles
            .iter()
            .map(|h| h.target.clone())
            .collect();
        let loaded = objects::loaded_ids();
        let remaining: HashSet<ObjectId> = attributed
            .iter()
            .filter(|id| loaded.contains(id))
            .cloned()
            .collect();
        // glibc's dlclose of a NODELETE library succeeds without dropping
        // anything, so probing one would only count phantom references.
        let nodelete: HashSet<ObjectId> = objects::facts(&remaining)
            .into_iter()
            .filter(|f| f.nodelete_flag || f.unique_symbols)
            .map(|f| f.id)
            .collect();
        for id in attributed.iter().rev() {
            let pinned = opened_nodelete.contains(id)
                || keep.contains(id)
                || nodelete.contains(id)
                || held.contains(id)
                || running.contains_key(id)
                || id.path.as_os_str().is_empty();
            if remaining.contains(id) && !pinned {
                drop_untracked_references(id, &mut report);
            }
        }
    } else {
        log::info!(
            "{} stay mapped after dlclose; what they opened stays open.",
            vendors
                .iter()
                .map(|v| v.path.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    let loaded = objects::loaded_ids();
    let still: HashSet<ObjectId> = attributed
        .iter()
        .filter(|id| loaded.contains(id))
        .cloned()
        .collect();
    let facts: Vec<ObjectFacts> = objects::facts(&still)
        .into_iter()
        .filter(|f| loaded.contains(&f.id))
        .collect();
    let handles = tracker::lock().handles.clone();
    let running = objects_running_threads();
    for id in &attributed {
        if still.contains(id) {
            report.libraries_still_mapped.push(StillMapped {
                path: id.path.clone(),
                reasons: reasons(id, &facts, &handles, &opened_nodelete, &running, &failures),
            });
        } else {
            report.libraries_closed.push(id.path.clone());
        }
    }
    let attributed: HashSet<ObjectId> = attributed.into_iter().collect();
    report.libraries_loaded_untracked = loaded
        .iter()
        .filter(|id| !loaded_before.contains(id) && !attributed.contains(id))
        .map(|id| id.path.clone())
        .collect();
    tracker::lock().forget_unloaded(&loaded);

    report.device_fds_closed = residue::close_device_fds(policy)?;
    report.device_mappings_unmapped = residue::unmap_device_mappings(policy)?;
    report.vendor_threads_alive = threads::vendor_threads_alive();
    report.elapsed = started.elapsed();
    trace.point("at the end of unloading");
    log::info!(
        "Unloaded {} in {:?}: {} libraries closed, {} still mapped, {} device descriptors closed, {} device mappings unmapped, {} vendor threads cancelled, {} still running.",
        path.display(),
        report.elapsed,
        report.libraries_closed.len(),
        report.libraries_still_mapped.len(),
        report.device_fds_closed.len(),
        report.device_mappings_unmapped.len(),
        report.vendor_threads_cancelled.len(),
        report.vendor_threads_alive.len()
    );
    Ok(report)
}
