//! Which of the threads that vendor code started are still running.
//!
//! A thread counts as the same thread only if both its tid and its start
//! time (field 22 of `/proc/self/task/<tid>/stat`) match, so a tid the
//! kernel has handed to a newer thread is not mistaken for a vendor thread.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::objects::ObjectId;
use crate::tracker::{self, Task};

/// A thread started by vendor code that is still running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VendorThread {
    /// The kernel's id of the thread; `None` for a thread that has been
    /// created but has not run its first instruction yet.
    pub tid: Option<libc::pid_t>,
    /// The thread's name (`comm`), if it could be read.
    pub name: Option<String>,
    /// The library that holds the thread's start routine.
    pub start_library: Option<PathBuf>,
}

/// The calling thread, as the kernel identifies it.
pub(crate) fn current_task() -> Task {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    Task {
        tid,
        start_time: std::fs::read_to_string("/proc/thread-self/stat")
            .ok()
            .and_then(|stat| start_time(&stat)),
    }
}

/// Numeric field `n` (1-based, as in proc(5)) of a `stat` line. The second
/// field, the command name in parentheses, may itself contain spaces and
/// parentheses, so the fields are counted from the last `)`.
fn stat_field(stat: &str, n: usize) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the name.
    after_name
        .split_whitespace()
        .nth(n.checked_sub(3)?)?
        .parse()
        .ok()
}

/// Field 22 (starttime) of a `stat` line.
fn start_time(stat: &str) -> Option<u64> {
    stat_field(stat, 22)
}

/// The kernel's PF_EXITING task flag (include/linux/sched.h): set when a
/// thread enters `exit`, before the kernel clears its tid and so wakes its
/// joiner. Such a thread runs no user code any more, and its `pthread_t` may
/// already be gone (joined), though `/proc` still lists it for a moment.
const PF_EXITING: u64 = 0x4;

/// Field 9 (flags) of a `stat` line.
fn task_flags(stat: &str) -> Option<u64> {
    stat_field(stat, 9)
}

fn is_running(task: Task) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{}/stat", task.tid)) else {
        return false;
    };
    if task_flags(&stat).is_some_and(|f| f & PF_EXITING != 0) {
        return false;
    }
    task.start_time.is_none() || start_time(&stat) == task.start_time
}

fn thread_name(tid: libc::pid_t) -> Option<String> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .ok()
        .map(|name| name.trim_end().to_owned())
}

/// The threads started by vendor code (through its `pthread_create`) that
/// are still running, over every vendor library loaded so far.
pub fn vendor_threads_alive() -> Vec<VendorThread> {
    let entries = tracker::lock().threads.clone();
    let mut alive = Vec::new();
    let mut ended = Vec::new();
    for entry in entries {
        match entry.task {
            Some(task) if !is_running(task) => ended.push(entry.serial),
            task => alive.push(VendorThread {
                tid: task.map(|t| t.tid),
                name: task.and_then(|t| thread_name(t.tid)),
                start_library: entry.start_object.map(|o| o.path),
            }),
        }
    }
    if !ended.is_empty() {
        tracker::lock()
            .threads
            .retain(|t| !ended.contains(&t.serial));
    }
    alive
}

/// Waits until no vendor thread runs, but those `ignore` names, or `timeout`
/// has passed; returns those still running.
pub(crate) fn wait_for_vendor_threads(
    timeout: Duration,
    ignore: impl Fn(&VendorThread) -> bool,
) -> Vec<VendorThread> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut alive = vendor_threads_alive();
        alive.retain(|t| !ignore(t));
        if alive.is_empty() || Instant::now() >= deadline {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

unsafe extern "C" {
    /// Not declared by the libc crate for glibc targets.
    fn pthread_cancel(thread: libc::pthread_t) -> libc::c_int;
}

/// Cancels the running threads whose start routine lies in `object` and
/// waits until they have ended or `timeout` has passed. Returns the threads
/// cancelled (as they were before) and those still running afterwards.
///
/// Meant for threads that a vendor starts and never stops, blocked in a
/// cancellation point (poll, sem_wait, pthread_cond_wait...) inside its code
/// when it is about to be unmapped: cancelled, such a thread unwinds out of
/// the vendor's code and ends, instead of returning into unmapped code.
pub(crate) fn cancel_threads(
    object: &ObjectId,
    timeout: Duration,
) -> (Vec<VendorThread>, Vec<VendorThread>) {
    let targets: Vec<_> = tracker::lock()
        .threads
        .iter()
        .filter(|t| t.start_object.as_ref() == Some(object))
        .filter_map(|t| Some((t.task?, t.pthread?, t.start_object.clone())))
        .collect();
    let mut cancelled = Vec::new();
    for (task, pthread, start) in targets {
        if !is_running(task) {
            continue;
        }
        let thread = VendorThread {
            tid: Some(task.tid),
            name: thread_name(task.tid),
            start_library: start.map(|o| o.path),
        };
        // SAFETY: the thread still runs and is not exiting (checked just
        // above through its tid, start time and flags), so it has not been
        // joined and its pthread_t is valid; the thread belongs to
        // the vendor library that is being unloaded, and nothing will call
        // into that library again.
        let rc = unsafe { pthread_cancel(pthread) };
        if rc == 0 {
            cancelled.push((task, thread));
        } else {
            log::warn!("pthread_cancel of vendor thread {} failed: {rc}.", task.tid);
        }
    }
    let deadline = Instant::now() + timeout;
    while cancelled.iter().any(|(task, _)| is_running(*task)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let still: Vec<VendorThread> = cancelled
        .iter()
        .filter(|(task, _)| is_running(*task))
        .map(|(_, t)| t.clone())
        .collect();
    (cancelled.into_iter().map(|(_, t)| t).collect(), still)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_read_past_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 19 20";
        assert_eq!(start_time(stat), Some(987654));
        assert_eq!(task_flags(stat), Some(6));
    }

    #[test]
    fn an_exiting_thread_does_not_count_as_running() {
        // A thread that has returned and been joined may still be listed for
        // a moment, flagged as exiting: its pthread_t must not be cancelled.
        let exiting = "4242 (worker) R 1 2 3 4 5 4194372 7 8 9 10 11 12 13 14 15 16 17 18 987654";
        assert_eq!(
            task_flags(exiting).map(|f| f & PF_EXITING),
            Some(PF_EXITING)
        );
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        assert_eq!(task_flags(&stat).map(|f| f & PF_EXITING), Some(0));
    }

    #[test]
    fn the_current_thread_is_running_and_a_changed_start_time_is_not() {
        let task = current_task();
        let start_time = task.start_time.expect("procfs is mounted");
        assert!(is_running(task));
        assert!(!is_running(Task {
            start_time: Some(start_time + 1),
            ..task
        }));
    }
}
