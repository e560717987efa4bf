//! Unloading a fake vendor library (tests/fixtures/fake_vendor.c) that
//! leaves behind what real vendor libraries do: a library it opened itself,
//! descriptors and a shared mapping of a "device" node, and a thread.

mod common;

use std::ffi::{CStr, CString, c_char};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{FakeDevice, fixtures, in_own_process};
use crane_vendor_loader::{
    DevicePolicy, LoadError, RetainReason, UnloadError, VendorLibrary, VendorThread,
    device_residue, vendor_threads_alive,
};

type StartFn = Option<unsafe extern "C" fn(*const c_char, *const c_char) -> i32>;
type OpenFn = Option<unsafe extern "C" fn(*const c_char) -> i32>;
type VoidFn = Option<unsafe extern "C" fn()>;
type IntFn = Option<unsafe extern "C" fn() -> i32>;

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// Whether the dynamic linker still has the library loaded.
fn is_loaded(path: &Path) -> bool {
    let path = c_path(path);
    // SAFETY: RTLD_NOLOAD loads nothing; a handle found is closed at once.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return false;
    }
    // SAFETY: the handle just obtained.
    unsafe { libc::dlclose(handle) };
    true
}

/// The vendor's function `name`, as the C type `F` (an `Option` of a
/// function pointer).
fn function<F: Copy>(library: &VendorLibrary, name: &CStr) -> F {
    let address = library
        .symbol(name)
        .unwrap_or_else(|| panic!("the fake vendor exports {name:?}"));
    assert_eq!(size_of::<F>(), size_of::<*mut libc::c_void>());
    // SAFETY: F is an Option of an extern "C" function pointer of the
    // symbol's C signature, which has the layout of a pointer.
    unsafe { std::mem::transmute_copy(&address.as_ptr()) }
}

fn policy(device: &FakeDevice, timeout: Duration) -> DevicePolicy {
    DevicePolicy {
        device_prefixes: vec![device.dir.clone()],
        thread_exit_timeout: timeout,
    }
}

/// Opens `vendor` and has it take its resources; the caller releases.
fn open_and_start(vendor: &Path, device: &FakeDevice) -> VendorLibrary {
    let library = VendorLibrary::open(vendor).expect("the fake vendor loads");
    let start: StartFn = function(&library, c"vendor_start");
    let helper = c_path(&fixtures().helper);
    let node = c_path(&device.node);
    // SAFETY: vendor_start(const char *, const char *) with two valid
    // strings.
    let rc = unsafe { start.unwrap()(helper.as_ptr(), node.as_ptr()) };
    assert_eq!(rc, 0, "vendor_start failed at step {}", -rc);
    library
}

/// Waits until `count` vendor threads run and all have told their tid (a
/// thread is counted from pthread_create on, before it first runs).
fn wait_for_vendor_threads(count: usize) -> Vec<VendorThread> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let threads = vendor_threads_alive();
        if threads.len() == count && threads.iter().all(|t| t.tid.is_some()) {
            return threads;
        }
        assert!(
            Instant::now() < deadline,
            "expected {count} started vendor threads: {threads:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn release(library: &VendorLibrary) {
    let release: VoidFn = function(library, c"vendor_release");
    // SAFETY: vendor_release(void).
    unsafe { release.unwrap()() };
}

#[test]
fn unloads_everything_the_vendor_left_behind_twenty_times() {
    let fixtures = fixtures();
    if in_own_process(
        "unloads_everything_the_vendor_left_behind_twenty_times",
        &[],
    ) {
        return;
    }
    let device = FakeDevice::new("cycles");
    let policy = policy(&device, Duration::from_secs(2));
    for cycle in 0..20 {
        let library = open_and_start(&fixtures.vendor, &device);
        let residue = device_residue(&policy).unwrap();
        assert_eq!(
            (residue.fds.len(), residue.mappings.len()),
            (2, 1),
            "cycle {cycle}: {residue:?}"
        );
        let threads = wait_for_vendor_threads(1);
        assert_eq!(threads[0].start_library.as_ref(), Some(&fixtures.vendor));
        assert!(is_loaded(&fixtures.helper));
        release(&library);
        // The vendor's own dlclose is held back until the vendor is unloaded.
        assert!(is_loaded(&fixtures.helper));

        let report = library.close(&policy).unwrap();

        assert!(
            report.libraries_closed.contains(&fixtures.vendor),
            "{report:#?}"
        );
        assert!(
            report.libraries_closed.contains(&fixtures.helper),
            "{report:#?}"
        );
        assert!(report.libraries_still_mapped.is_empty(), "{report:#?}");
        assert_eq!(
            report.handles_closed_by_vendor,
            vec![fixtures.helper.clone()]
        );
        assert_eq!(
            report.handles_closed_for_vendor,
            vec![fixtures.helper.clone()]
        );
        assert!(report.references_dropped.is_empty(), "{report:#?}");
        assert_eq!(report.device_fds_closed.len(), 2, "{report:#?}");
        assert!(
            report
                .device_fds_closed
                .iter()
                .all(|fd| fd.target == device.node)
        );
        assert_eq!(report.device_mappings_unmapped.len(), 1, "{report:#?}");
        assert!(report.vendor_threads_alive.is_empty(), "{report:#?}");
        assert!(
            !is_loaded(&fixtures.helper),
            "cycle {cycle}: the helper is still loaded"
        );
        assert!(
            !is_loaded(&fixtures.vendor),
            "cycle {cycle}: the vendor is still loaded"
        );
        assert!(device_residue(&policy).unwrap().is_empty());
        assert!(vendor_threads_alive().is_empty());
    }
}

#[test]
fn cancels_threads_the_vendor_never_stops_before_it_is_unmapped() {
    let fixtures = fixtures();
    if in_own_process(
        "cancels_threads_the_vendor_never_stops_before_it_is_unmapped",
        &[],
    ) {
        return;
    }
    let device = FakeDevice::new("lingering");
    let policy = policy(&device, Duration::from_secs(2));
    for cycle in 0..3 {
        let library = open_and_start(&fixtures.vendor, &device);
        let start_lingering: IntFn = function(&library, c"vendor_start_lingering_threads");
        // SAFETY: vendor_start_lingering_threads(void).
        assert_eq!(unsafe { start_lingering.unwrap()() }, 0);
        wait_for_vendor_threads(3);
        release(&library);

        let report = library.close(&policy).unwrap();

        // The worker its destructor stops is joined there; the two it never
        // stops were cancelled before glibc unmapped it.
        assert_eq!(
            report.vendor_threads_cancelled.len(),
            2,
            "cycle {cycle}: {report:#?}"
        );
        assert!(
            report
                .vendor_threads_cancelled
                .iter()
                .all(|t| t.start_library.as_ref() == Some(&fixtures.vendor)),
            "{report:#?}"
        );
        assert!(report.vendor_threads_alive.is_empty(), "{report:#?}");
        assert!(
            report.libraries_closed.contains(&fixtures.vendor),
            "{report:#?}"
        );
        assert!(!is_loaded(&fixtures.vendor));
        assert!(device_residue(&policy).unwrap().is_empty());
        // A polling thread left behind would have returned into the
        // unmapped code by now (its poll times out every 5 ms).
        std::thread::sleep(Duration::from_millis(50));
        assert!(vendor_threads_alive().is_empty());
    }
}

#[test]
fn a_vendor_without_lingering_threads_keeps_its_termination_function() {
    let fixtures = fixtures();
    if in_own_process(
        "a_vendor_without_lingering_threads_keeps_its_termination_function",
        &[],
    ) {
        return;
    }
    let device = FakeDevice::new("plain");
    let library = open_and_start(&fixtures.vendor, &device);
    release(&library);
    let report = library
        .close(&policy(&device, Duration::from_secs(2)))
        .unwrap();
    assert!(report.vendor_threads_cancelled.is_empty(), "{report:#?}");
    assert!(report.vendor_threads_alive.is_empty(), "{report:#?}");
}

#[test]
fn drops_references_taken_behind_the_hooks() {
    let fixtures = fixtures();
    if in_own_process("drops_references_taken_behind_the_hooks", &[]) {
        return;
    }
    let device = FakeDevice::new("untracked");
    let library = open_and_start(&fixtures.vendor, &device);
    let open_untracked: OpenFn = function(&library, c"vendor_open_untracked");
    let helper = c_path(&fixtures.helper);
    // SAFETY: vendor_open_untracked(const char *) with a valid string.
    assert_eq!(unsafe { open_untracked.unwrap()(helper.as_ptr()) }, 0);
    release(&library);

    let report = library
        .close(&policy(&device, Duration::from_secs(2)))
        .unwrap();

    assert_eq!(
        report.references_dropped,
        vec![fixtures.helper.clone()],
        "{report:#?}"
    );
    assert!(
        report.libraries_closed.contains(&fixtures.helper),
        "{report:#?}"
    );
    assert!(!is_loaded(&fixtures.helper));
}

#[test]
fn keeps_a_library_whose_thread_still_runs() {
    let fixtures = fixtures();
    if in_own_process("keeps_a_library_whose_thread_still_runs", &[]) {
        return;
    }
    let device = FakeDevice::new("stuck");
    let policy = policy(&device, Duration::from_millis(100));
    let library = open_and_start(&fixtures.vendor, &device);
    let start_stuck: IntFn = function(&library, c"vendor_start_stuck_thread");
    // SAFETY: vendor_start_stuck_thread(void).
    assert_eq!(unsafe { start_stuck.unwrap()() }, 0);
    wait_for_vendor_threads(2);
    release(&library);

    let report = library.close(&policy).unwrap();

    // The vendor itself and its own worker are gone; the helper, in which a
    // thread the vendor started through it still runs, is not unmapped
    // under that thread.
    assert!(
        report.libraries_closed.contains(&fixtures.vendor),
        "{report:#?}"
    );
    assert_eq!(report.vendor_threads_alive.len(), 1, "{report:#?}");
    let stuck = &report.vendor_threads_alive[0];
    assert_eq!(stuck.start_library.as_ref(), Some(&fixtures.helper));
    let helper = report
        .libraries_still_mapped
        .iter()
        .find(|l| l.path == fixtures.helper)
        .unwrap_or_else(|| panic!("the helper stays mapped: {report:#?}"));
    assert!(
        helper
            .reasons
            .contains(&RetainReason::ThreadRunning(stuck.tid)),
        "{report:#?}"
    );
    assert_eq!(report.device_fds_closed.len(), 2);
    assert!(is_loaded(&fixtures.helper));

    // Once the thread ends, the next unload takes the helper too.
    let helper_path = c_path(&fixtures.helper);
    // SAFETY: RTLD_NOLOAD of a loaded library; the symbol is
    // helper_release_stuck_thread(void).
    unsafe {
        let handle = libc::dlopen(helper_path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        assert!(!handle.is_null());
        let release_stuck: VoidFn =
            std::mem::transmute(libc::dlsym(handle, c"helper_release_stuck_thread".as_ptr()));
        release_stuck.unwrap()();
        libc::dlclose(handle);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !vendor_threads_alive().is_empty() {
        assert!(Instant::now() < deadline, "the released thread did not end");
        std::thread::sleep(Duration::from_millis(5));
    }
    let library = VendorLibrary::open(&fixtures.vendor).unwrap();
    let report = library.close(&policy).unwrap();
    assert!(
        report.libraries_closed.contains(&fixtures.helper),
        "{report:#?}"
    );
    assert!(!is_loaded(&fixtures.helper));
}

#[test]
fn a_vendor_that_stays_mapped_keeps_what_it_opened() {
    let fixtures = fixtures();
    if in_own_process("a_vendor_that_stays_mapped_keeps_what_it_opened", &[]) {
        return;
    }
    let device = FakeDevice::new("pinned");
    let policy = policy(&device, Duration::from_millis(50));
    let library = open_and_start(&fixtures.pinned_vendor, &device);
    let worker = wait_for_vendor_threads(1).remove(0);
    release(&library);

    let report = library.close(&policy).unwrap();

    let still = |path: &PathBuf| {
        report
            .libraries_still_mapped
            .iter()
            .find(|l| l.path == *path)
            .unwrap_or_else(|| panic!("{} stays mapped: {report:#?}", path.display()))
    };
    // Its worker is stopped only by its destructor, which a NODELETE library
    // does not run on dlclose: reported, not hidden.
    assert_eq!(report.vendor_threads_alive, vec![worker.clone()]);
    assert_eq!(
        still(&fixtures.pinned_vendor).reasons,
        vec![
            RetainReason::ThreadRunning(worker.tid),
            RetainReason::NoDeleteFlag
        ]
    );
    let helper = still(&fixtures.helper);
    assert!(
        helper.reasons.contains(&RetainReason::HeldOpen {
            by: Some(fixtures.pinned_vendor.clone())
        }),
        "the opener is found from the call site: {report:#?}"
    );
    assert!(
        helper.reasons.contains(&RetainReason::ClosedByMappedVendor),
        "{report:#?}"
    );
    assert!(report.handles_closed_for_vendor.is_empty());
    assert!(report.handles_closed_by_vendor.is_empty());
    // The device is released all the same.
    assert_eq!(report.device_fds_closed.len(), 2);
    assert_eq!(report.device_mappings_unmapped.len(), 1);
    assert!(device_residue(&policy).unwrap().is_empty());

    let library = VendorLibrary::open(&fixtures.pinned_vendor).expect("reopening works");
    assert!(library.symbol(c"vendor_start").is_some());
    let report = library.close(&policy).unwrap();
    assert!(
        report
            .libraries_still_mapped
            .iter()
            .any(|l| l.path == fixtures.helper)
    );
}

#[test]
fn load_failures_and_a_vendor_opened_twice_are_reported() {
    let fixtures = fixtures();
    if in_own_process("load_failures_and_a_vendor_opened_twice_are_reported", &[]) {
        return;
    }
    let missing = fixtures.dir.join("libmissing.so");
    match VendorLibrary::open(&missing) {
        Err(LoadError::Dlopen { path, message }) => {
            assert_eq!(path, missing);
            assert!(message.contains("libmissing.so"), "{message}");
        }
        other => panic!("expected a dlopen failure, got {other:?}"),
    }
    let library = VendorLibrary::open(&fixtures.vendor).unwrap();
    match VendorLibrary::open(&fixtures.vendor) {
        Err(LoadError::AlreadyOpen(path)) => assert_eq!(path, fixtures.vendor),
        other => panic!("expected AlreadyOpen, got {other:?}"),
    }
    // Another vendor opens beside it; closing only one of them is refused
    // (what the other still uses could not be told apart), and that one
    // stays loaded, untracked.
    let other = VendorLibrary::open(&fixtures.pinned_vendor).unwrap();
    match library.close(&DevicePolicy::default()) {
        Err(UnloadError::OthersOpen { open }) => {
            assert_eq!(open, vec![fixtures.pinned_vendor.clone()]);
        }
        other => panic!("expected OthersOpen, got {other:?}"),
    }
    assert!(is_loaded(&fixtures.vendor));
    other.close(&DevicePolicy::default()).unwrap();
}

/// Two vendors open at once (NVIDIA's GPU and PoCL's CPU on one machine),
/// closed together: what the vendor that unloads left behind is closed,
/// device included, while the vendor that stays mapped (NODELETE, as PoCL's
/// LLVM makes it) keeps what it can still reach.
#[test]
fn two_vendors_open_together_are_closed_together() {
    let fixtures = fixtures();
    if in_own_process("two_vendors_open_together_are_closed_together", &[]) {
        return;
    }
    let device = FakeDevice::new("two");
    let policy = policy(&device, Duration::from_millis(200));
    {
        let round = 0;
        let first = open_and_start(&fixtures.vendor, &device);
        let second = open_and_start(&fixtures.pinned_vendor, &device);
        let residue = device_residue(&policy).unwrap();
        assert_eq!(
            (residue.fds.len(), residue.mappings.len()),
            (4, 2),
            "round {round}: {residue:?}"
        );
        wait_for_vendor_threads(2);
        release(&first);
        release(&second);

        let report = VendorLibrary::close_all(vec![first, second], &policy).unwrap();

        assert_eq!(
            report.vendors,
            vec![fixtures.vendor.clone(), fixtures.pinned_vendor.clone()]
        );
        assert!(!is_loaded(&fixtures.vendor), "round {round}: {report:#?}");
        assert!(is_loaded(&fixtures.pinned_vendor));
        // The helper both opened stays: the mapped vendor may still use it
        // (its own close is held back); the handles of the vendor that is
        // gone are closed.
        assert!(is_loaded(&fixtures.helper));
        assert!(
            report
                .libraries_still_mapped
                .iter()
                .any(|l| l.path == fixtures.helper
                    && l.reasons == vec![RetainReason::ClosedByMappedVendor]),
            "{report:#?}"
        );
        let closed: Vec<&PathBuf> = report
            .handles_closed_by_vendor
            .iter()
            .chain(&report.handles_closed_for_vendor)
            .collect();
        assert_eq!(closed, vec![&fixtures.helper; 2], "{report:#?}");
        // The device is free all the same, and the unloaded vendor's
        // thread is gone (the mapped vendor's worker runs on: reported).
        assert_eq!(report.device_fds_closed.len(), 4, "{report:#?}");
        assert_eq!(report.device_mappings_unmapped.len(), 2, "{report:#?}");
        assert!(device_residue(&policy).unwrap().is_empty());
        assert!(
            report
                .vendor_threads_alive
                .iter()
                .all(|t| t.start_library.as_ref() == Some(&fixtures.pinned_vendor)),
            "{report:#?}"
        );
    }
}
