//! Which threads have code of given libraries on their stacks: a thread
//! blocked in a call that vendor code made (a callback of one library that
//! waits inside another, say) returns into that code later, so the code must
//! stay mapped until the thread has left it.
//!
//! The other threads are not stopped: for each one the kernel tells the
//! stack pointer it had when it last entered the kernel
//! (`/proc/self/task/TID/syscall`), and the words from there to the top of
//! its stack mapping are read through `/proc/self/mem` (which fails cleanly
//! instead of faulting) and compared with the code ranges. The answer is
//! conservative: a word that merely looks like a code address (a function
//! pointer kept in a frame) counts too.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;

/// How much of a stack is read, from the stack pointer up.
const MAX_STACK_SCAN: usize = 1 << 20;

/// A thread with words on its stack that point into the code ranges.
#[derive(Debug, Clone)]
pub(crate) struct StackHit {
    pub tid: libc::pid_t,
    pub name: String,
    /// The program counter when the thread last entered the kernel.
    pub pc: Option<usize>,
    /// (distance from the stack pointer, value) of each matching word.
    pub words: Vec<(usize, usize)>,
}

/// Stack pointer and program counter of a thread that is blocked (or was
/// last seen) in the kernel; `None` for one that runs in user space now.
fn sp_pc(tid: libc::pid_t) -> Option<(usize, usize)> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok()?;
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() < 3 || fields[0] == "running" {
        return None;
    }
    let hex = |s: &str| usize::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    Some((
        hex(fields[fields.len() - 2])?,
        hex(fields[fields.len() - 1])?,
    ))
}

/// The end of the mapping that contains `address`.
fn mapping_end(maps: &str, address: usize) -> Option<usize> {
    maps.lines().find_map(|line| {
        let range = line.split_whitespace().next()?;
        let (lo, hi) = range.split_once('-')?;
        let lo = usize::from_str_radix(lo, 16).ok()?;
        let hi = usize::from_str_radix(hi, 16).ok()?;
        (lo <= address && address < hi).then_some(hi)
    })
}

/// The threads other than the caller whose stacks hold a word inside one of
/// `ranges`. Threads running in user space right now are reported with
/// `pc: None` and no words when `include_running` is set (their stack
/// pointer is unknown).
pub(crate) fn threads_with_code_on_stack(
    ranges: &[Range<usize>],
    include_running: bool,
) -> Vec<StackHit> {
    let mut hits = Vec::new();
    if ranges.is_empty() {
        return hits;
    }
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return hits;
    };
    let Ok(mem) = File::open("/proc/self/mem") else {
        return hits;
    };
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return hits;
    };
    let inside = |value: usize| ranges.iter().any(|r| r.contains(&value));
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if tid == me {
            continue;
        }
        let name = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
            .map(|n| n.trim_end().to_owned())
            .unwrap_or_default();
        let Some((sp, pc)) = sp_pc(tid) else {
            if include_running {
                hits.push(StackHit {
                    tid,
                    name,
                    pc: None,
                    words: Vec::new(),
                });
            }
            continue;
        };
        let Some(end) = mapping_end(&maps, sp) else {
            continue;
        };
        let len = (end - sp).min(MAX_STACK_SCAN);
        let mut buffer = vec![0u8; len];
        let Ok(read) = mem.read_at(&mut buffer, sp as u64) else {
            continue;
        };
        let word = size_of::<usize>();
        let words: Vec<(usize, usize)> = buffer[..read - read % word]
            .chunks_exact(word)
            .enumerate()
            .filter_map(|(index, bytes)| {
                let value = usize::from_ne_bytes(bytes.try_into().ok()?);
                inside(value).then_some((index * word, value))
            })
            .collect();
        if !words.is_empty() || inside(pc) {
            hits.push(StackHit {
                tid,
                name,
                pc: Some(pc),
                words,
            });
        }
    }
    hits
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[inline(never)]
    fn blocked_in(rx: &mpsc::Receiver<()>) {
        rx.recv().ok();
        std::hint::black_box(());
    }

    #[test]
    fn a_thread_blocked_below_a_function_has_its_return_address_found() {
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            ready_tx.send(()).unwrap();
            blocked_in(&rx);
        });
        ready_rx.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // The test binary's own code: the blocked thread returns into it.
        let here =
            a_thread_blocked_below_a_function_has_its_return_address_found as *const () as usize;
        let own = crate::objects::object_containing(here).expect("the test binary is loaded");
        let ranges: Vec<Range<usize>> =
            crate::objects::code_ranges(&std::iter::once(own).collect())
                .into_iter()
                .map(|(_, r)| r)
                .collect();
        let hits = threads_with_code_on_stack(&ranges, false);
        tx.send(()).unwrap();
        thread.join().unwrap();
        assert!(hits.iter().any(|h| !h.words.is_empty()), "{hits:?}");
        assert!(threads_with_code_on_stack(&[], false).is_empty());
    }
}
