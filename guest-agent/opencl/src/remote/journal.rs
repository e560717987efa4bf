//! What a remote session keeps so that it survives crane-proxy's death
//! (docs/reliability.md, "Surviving crane-proxy's death").
//!
//! Every call sent to the proxy is recorded here, in order, with its payload.
//! Ids are the client's (the proxy takes the ids it is given), so sending the
//! same calls to a fresh proxy makes the same objects under the same names,
//! and the remote objects the application holds stay valid. Replaying from
//! the session's start would need every byte ever written, so the journal is
//! compacted at *checkpoints*: moments when the proxy's queues are drained
//! and every buffer the proxy changed has been read back into its RAM copy
//! (the shadow crane keeps anyway, `objects::Shadow`). At a checkpoint the
//! journal keeps only what makes the objects (creations, builds, kernel
//! arguments, releases, ...) and marks each memory object to be filled from
//! its RAM copy right after it is made; transfers, kernel launches and
//! queries go. What comes after the checkpoint is kept whole, with copies of
//! the data written, until the next one.
//!
//! While the journal is armed the RAM copies stay as they were at the last
//! checkpoint: host writes mark buffers dirty instead of updating them
//! ([`FROZEN`]), and only the checkpoint itself replaces them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use crane_wire::{Call, Id, KernelArg, Sync as WSync};

use crate::objects::Mem;
use crate::staging::HostBytes;

/// Set while a session's journal refers to RAM copies as they were at its
/// last checkpoint: host writes must not change them (see `enqueue.rs`).
pub static FROZEN: AtomicBool = AtomicBool::new(false);

/// What an entry costs beyond its payload (the call itself, its vectors).
const ENTRY_OVERHEAD: u64 = 160;

/// Contents a memory object gets right after it is made at a replay: its RAM
/// copy as of the last checkpoint (or, for `CL_MEM_USE_HOST_PTR` objects,
/// the application's memory, which the checkpoint brought up to date).
#[derive(Clone)]
pub struct Content {
    /// Weak: the journal must not keep an object the application released
    /// (its drop releases it on the proxy, which the journal then records;
    /// an object a sub-buffer or image still uses is kept alive by that).
    pub mem: Weak<Mem>,
    pub context: Id,
    pub device: Id,
    /// For `CL_MEM_USE_HOST_PTR` buffers: the host memory as it was at the
    /// checkpoint (the application goes on changing it).
    pub copy: Option<Arc<[u8]>>,
}

/// A call's payload as the journal keeps it: from 2 MiB in crane's own
/// page-aligned memory, advised to use huge pages ([`HostBytes`]), where
/// copying into fresh memory ran at a quarter of the speed of a copy into
/// memory already touched (page faults and zeroing); smaller ones on the
/// heap.
pub enum Payload {
    Heap(Vec<u8>),
    Pages(HostBytes),
}

/// From this size a payload goes into [`Payload::Pages`].
const PAGES_FROM: usize = 2 << 20;

impl Default for Payload {
    fn default() -> Payload {
        Payload::Heap(Vec::new())
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Payload::Heap(v) => v,
            Payload::Pages(h) => h,
        }
    }
}

impl Payload {
    fn capacity(&self) -> usize {
        match self {
            Payload::Heap(v) => v.capacity(),
            Payload::Pages(h) => h.capacity(),
        }
    }

    /// A copy of `bytes` in this payload's memory, which
    /// [`HostBytes::fits`] it.
    fn refill(self, bytes: &[u8]) -> Result<Payload, Payload> {
        let len = bytes.len();
        Ok(match self {
            Payload::Heap(mut v) => {
                v.clear();
                v.extend_from_slice(bytes);
                Payload::Heap(v)
            }
            Payload::Pages(h) => match h.reuse(len) {
                Ok(mut h) => {
                    h.copy_from_slice(bytes);
                    Payload::Pages(h)
                }
                Err(h) => return Err(Payload::Pages(h)),
            },
        })
    }

    fn copy_of(bytes: &[u8]) -> Payload {
        if bytes.len() >= PAGES_FROM {
            Payload::Pages(HostBytes::from_slice(bytes))
        } else {
            Payload::Heap(bytes.to_vec())
        }
    }
}

pub struct Entry {
    pub seq: u64,
    pub call: Call,
    pub payload: Payload,
    /// The payload was not copied (crane's own rebuild, before the
    /// checkpoint that ends it).
    pub lost: bool,
    pub content: Option<Content>,
}

#[derive(Default)]
pub struct Journal {
    pub entries: Vec<Entry>,
    /// `entries[..since]` make the state of the last checkpoint;
    /// `entries[since..]` were sent after it.
    pub since: usize,
    /// Bytes held (payloads and entries).
    pub bytes: u64,
    /// Bytes at which a checkpoint is asked for (0: no journal).
    pub limit: u64,
    /// Calls since the last checkpoint at which one is asked for: a replay
    /// runs them all again (on the H200, about 13 µs each).
    pub call_limit: usize,
    /// Replays may use the journal (it has seen a checkpoint, or the session
    /// was the application's own from its start).
    pub armed: bool,
    /// Why the journal was given up, if it was.
    pub off: Option<String>,
    /// A checkpoint has been asked for since the last one.
    pub asked: bool,
    /// Checkpoints so far.
    pub checkpoints: u64,
    /// Payload buffers of calls a checkpoint dropped, reused for the next
    /// copies: a copy into memory already touched runs several times faster
    /// than into fresh pages (bounded by the journal's limit: the journal
    /// and its spares together stay about that size).
    spare: Vec<Payload>,
}

/// What [`Journal::record`] asks of the session.
#[derive(Debug, PartialEq, Eq)]
pub enum After {
    Nothing,
    /// The journal has grown past its limit: take a checkpoint.
    Checkpoint,
}

impl Journal {
    pub fn new(limit: u64, call_limit: usize) -> Journal {
        Journal {
            limit,
            call_limit: call_limit.max(1),
            off: (limit == 0).then(|| "CRANE_REMOTE_JOURNAL_MIB=0".to_string()),
            ..Journal::default()
        }
    }

    pub fn usable(&self) -> bool {
        self.armed && self.off.is_none()
    }

    /// Records a call as it is sent. `copy`: keep a copy of the payload (the
    /// application's calls); crane's own rebuild is followed by a checkpoint,
    /// which needs no copy of the memory contents it wrote.
    pub fn record(&mut self, seq: u64, call: &Call, payload: &[u8], copy: bool) -> After {
        // Blobs sent ahead by a pre-copy are not the application's: a move
        // uses them before the checkpoint that ends it.
        if self.off.is_some()
            || matches!(
                call,
                Call::Hello { .. } | Call::Bye | Call::Stash { .. } | Call::Unstash { .. }
            )
        {
            return After::Nothing;
        }
        // Memory contents written by crane's own rebuild are what the RAM
        // copies hold, which the checkpoint at its end refers to; anything
        // else (program binaries, IL) is kept.
        let copy = copy
            || !matches!(
                call,
                Call::CreateBuffer { .. }
                    | Call::CreateImage { .. }
                    | Call::EnqueueWriteBuffer { .. }
                    | Call::EnqueueWriteBufferRect { .. }
                    | Call::EnqueueWriteImage { .. }
            );
        // A write over a lane carries its contents on the lane, which a
        // replay does not have: it is one of the rebuild's writes.
        let lost = (!copy && !payload.is_empty()) || matches!(call, Call::EnqueueWriteLane { .. });
        let payload = if copy && !payload.is_empty() {
            self.copy_of(payload)
        } else {
            Payload::default()
        };
        self.bytes += payload.len() as u64 + ENTRY_OVERHEAD;
        self.entries.push(Entry {
            seq,
            call: call.clone(),
            lost,
            payload,
            content: None,
        });
        if self.bytes > self.limit.saturating_mul(2) {
            self.give_up(format!(
                "the journal grew past {} MiB without a checkpoint",
                self.limit.saturating_mul(2) >> 20
            ));
            return After::Nothing;
        }
        let calls = self.entries.len() - self.since;
        if (self.bytes > self.limit || calls > self.call_limit) && !self.asked {
            self.asked = true;
            return After::Checkpoint;
        }
        After::Nothing
    }

    /// Stops keeping a journal: a proxy's death then ends the application's
    /// OpenCL work, as without one.
    pub fn give_up(&mut self, why: String) {
        if self.off.is_none() {
            crate::config::warn!(
                "crane-proxy's death can no longer be survived by this process: {why}"
            );
            self.off = Some(why);
        }
        self.entries = Vec::new();
        self.spare = Vec::new();
        self.since = 0;
        self.bytes = 0;
        self.armed = false;
        FROZEN.store(false, Ordering::Relaxed);
    }

    /// A copy of `bytes`, in a spare payload's memory if one fits.
    fn copy_of(&mut self, bytes: &[u8]) -> Payload {
        let len = bytes.len();
        if let Some(i) = self
            .spare
            .iter()
            .position(|p| HostBytes::fits(p.capacity(), len))
        {
            match self.spare.swap_remove(i).refill(bytes) {
                Ok(p) => return p,
                Err(p) => self.spare.push(p),
            }
        }
        Payload::copy_of(bytes)
    }

    /// Keeps a payload's memory for reuse, within the journal's limit.
    fn recycle(&mut self, p: Payload) {
        let held: usize = self.spare.iter().map(Payload::capacity).sum();
        if p.capacity() >= 4096 && (held + p.capacity()) as u64 <= self.limit {
            self.spare.push(p);
        }
    }

    /// Drops the journal without a word (the session is closing).
    pub fn give_up_quietly(&mut self) {
        if self.off.is_none() {
            self.off = Some("the session was closed".into());
        }
        self.entries = Vec::new();
        self.spare = Vec::new();
        self.since = 0;
        self.bytes = 0;
        self.armed = false;
        FROZEN.store(false, Ordering::Relaxed);
    }

    /// Compacts at a checkpoint: the proxy is drained, every memory object
    /// whose contents matter has them in `contents` (by id), and `failed`
    /// are the posted calls the proxy reported as failed. `pending_cookies`:
    /// event callbacks that have not fired.
    pub fn compact(
        &mut self,
        contents: &HashMap<Id, Content>,
        failed: &HashSet<u64>,
        pending_cookies: &HashSet<u64>,
    ) {
        if self.off.is_some() {
            return;
        }
        let released: HashSet<Id> = self
            .entries
            .iter()
            .filter_map(|e| match e.call {
                Call::Release { id } => Some(id),
                _ => None,
            })
            .collect();
        let mut kept = Vec::with_capacity(self.since + 64);
        // Events of commands that go: nothing may name them at a replay.
        let mut unmade: HashSet<Id> = HashSet::new();
        for mut e in std::mem::take(&mut self.entries) {
            if let Some(event) = enqueued_event(&e.call) {
                // A command's effect is in the RAM copies now; an event the
                // application still holds is remade by a marker, complete at
                // once on a drained queue.
                let queue = enqueue_queue(&e.call).unwrap_or(0);
                let payload = std::mem::take(&mut e.payload);
                self.recycle(payload);
                if event == 0 || released.contains(&event) || failed.contains(&e.seq) {
                    unmade.insert(event);
                    continue;
                }
                e.call = Call::EnqueueMarker {
                    queue,
                    sync: WSync {
                        waits: Vec::new(),
                        event,
                    },
                };
                e.lost = false;
                kept.push(e);
                continue;
            }
            let keep = match &e.call {
                Call::GetPlatformIds { ids } | Call::GetDeviceIds { ids, .. } => !ids.is_empty(),
                Call::SetEventCallback { cookie, event, .. } => {
                    pending_cookies.contains(cookie) && !unmade.contains(event)
                }
                Call::Release { id } => !unmade.contains(id),
                c => changes_state(c),
            };
            if !keep {
                self.recycle(std::mem::take(&mut e.payload));
                continue;
            }
            match &mut e.call {
                Call::CreateBuffer { id, init, .. } | Call::CreateImage { id, init, .. } => {
                    if let Some(c) = contents.get(id) {
                        *init = false;
                        let payload = std::mem::take(&mut e.payload);
                        self.recycle(payload);
                        e.lost = false;
                        e.content = Some(c.clone());
                    }
                }
                _ => {}
            }
            if e.lost {
                self.give_up(format!(
                    "{} made while moving has no copy of its contents to replay",
                    e.call.name()
                ));
                return;
            }
            kept.push(e);
        }
        prune_kernel_args(&mut kept);
        prune_released(&mut kept, &released);
        self.bytes = kept
            .iter()
            .map(|e| {
                let copy = e.content.as_ref().and_then(|c| c.copy.as_ref());
                (e.payload.len() + copy.map_or(0, |c| c.len())) as u64 + ENTRY_OVERHEAD
            })
            .sum();
        self.since = kept.len();
        self.entries = kept;
        self.armed = true;
        self.asked = false;
        self.checkpoints += 1;
        FROZEN.store(true, Ordering::Relaxed);
    }
}

/// Calls that make or change objects (kept at a checkpoint); the rest are
/// transfers, launches, waits and queries, whose effects the RAM copies hold.
fn changes_state(c: &Call) -> bool {
    use Call::*;
    matches!(
        c,
        CreateSubDevices { .. }
            | CreateContext { .. }
            | CreateContextFromType { .. }
            | CreateQueue { .. }
            | CreateBuffer { .. }
            | CreateSubBuffer { .. }
            | CreateImage { .. }
            | CreateSampler { .. }
            | CreateProgramWithSource { .. }
            | CreateProgramWithIl { .. }
            | CreateProgramWithBinary { .. }
            | CreateProgramWithBuiltInKernels { .. }
            | BuildProgram { .. }
            | CompileProgram { .. }
            | LinkProgram { .. }
            | SetSpecializationConstant { .. }
            | CreateKernel { .. }
            | CreateKernelsInProgram { .. }
            | CloneKernel { .. }
            | SetKernelArg { .. }
            | CreateUserEvent { .. }
            | SetUserEventStatus { .. }
            | Release { .. }
            | SetProgramSource { .. }
            | SetQueueProperty { .. }
    )
}

/// Whether a replayed call that the proxy answers makes or changes objects
/// (its answer is not waited for, but it must be sent), as opposed to a
/// query.
pub fn makes_objects(c: &Call) -> bool {
    use Call::*;
    match c {
        GetPlatformIds { ids } | GetDeviceIds { ids, .. } => !ids.is_empty(),
        CreateSubDevices { .. }
        | CreateProgramWithBinary { .. }
        | BuildProgram { .. }
        | CompileProgram { .. }
        | LinkProgram { .. }
        | CreateKernelsInProgram { .. }
        | SetQueueProperty { .. } => true,
        _ => false,
    }
}

/// The synchronisation of an enqueued command, if the call is one.
pub fn enqueue_sync(c: &Call) -> Option<(Id, &WSync)> {
    use Call::*;
    match c {
        EnqueueNdRange { queue, sync, .. }
        | EnqueueWriteBuffer { queue, sync, .. }
        | EnqueueReadBuffer { queue, sync, .. }
        | EnqueueWriteStash { queue, sync, .. }
        | EnqueueWriteLane { queue, sync, .. }
        | EnqueueWriteBufferRect { queue, sync, .. }
        | EnqueueReadBufferRect { queue, sync, .. }
        | EnqueueWriteImage { queue, sync, .. }
        | EnqueueReadImage { queue, sync, .. }
        | EnqueueFillBuffer { queue, sync, .. }
        | EnqueueFillImage { queue, sync, .. }
        | EnqueueCopyBuffer { queue, sync, .. }
        | EnqueueCopyBufferRect { queue, sync, .. }
        | EnqueueCopyImage { queue, sync, .. }
        | EnqueueCopyImageToBuffer { queue, sync, .. }
        | EnqueueCopyBufferToImage { queue, sync, .. }
        | EnqueueMarker { queue, sync }
        | EnqueueBarrier { queue, sync }
        | EnqueueMigrate { queue, sync, .. } => Some((*queue, sync)),
        _ => None,
    }
}

/// Whether a call is a read that made an event.
pub fn read_with_event(c: &Call) -> bool {
    match c {
        Call::EnqueueReadBuffer { sync, .. }
        | Call::EnqueueReadBufferRect { sync, .. }
        | Call::EnqueueReadImage { sync, .. } => sync.event != 0,
        _ => false,
    }
}

fn enqueued_event(c: &Call) -> Option<Id> {
    enqueue_sync(c).map(|(_, s)| s.event)
}

fn enqueue_queue(c: &Call) -> Option<Id> {
    enqueue_sync(c).map(|(q, _)| q)
}

/// Keeps only the last setting of each kernel argument (and the one in force
/// when the kernel was cloned, which copies its arguments).
fn prune_kernel_args(entries: &mut Vec<Entry>) {
    let mut later: HashSet<(Id, u32)> = HashSet::new();
    let mut drop = vec![false; entries.len()];
    for (i, e) in entries.iter().enumerate().rev() {
        match &e.call {
            Call::SetKernelArg { kernel, index, .. } => {
                drop[i] = !later.insert((*kernel, *index));
            }
            Call::CloneKernel { source, .. } => later.retain(|(k, _)| k != source),
            _ => {}
        }
    }
    let mut i = 0;
    entries.retain(|_| {
        i += 1;
        !drop[i - 1]
    });
}

/// The ids a call names, first the object it makes or acts on.
fn ids(c: &Call) -> Vec<Id> {
    use Call::*;
    let mut v: Vec<Id> = match c {
        GetDeviceIds { platform, ids, .. } => [vec![*platform], ids.clone()].concat(),
        CreateSubDevices { device, ids, .. } => [vec![*device], ids.clone()].concat(),
        CreateContext { id, devices, .. } => [vec![*id], devices.clone()].concat(),
        CreateQueue {
            id,
            context,
            device,
            ..
        } => vec![*id, *context, *device],
        CreateBuffer { id, context, .. }
        | CreateImage { id, context, .. }
        | CreateSampler { id, context, .. }
        | CreateProgramWithSource { id, context, .. }
        | CreateProgramWithIl { id, context, .. }
        | CreateUserEvent { id, context } => vec![*id, *context],
        CreateContextFromType { id, .. } => vec![*id],
        CreateSubBuffer { id, parent, .. } => vec![*id, *parent],
        CreateProgramWithBinary {
            id,
            context,
            devices,
            ..
        }
        | CreateProgramWithBuiltInKernels {
            id,
            context,
            devices,
            ..
        } => [vec![*id, *context], devices.clone()].concat(),
        BuildProgram {
            program, devices, ..
        } => [vec![*program], devices.clone()].concat(),
        CompileProgram {
            program,
            devices,
            headers,
            ..
        } => [
            vec![*program],
            devices.clone(),
            headers.iter().map(|h| h.0).collect(),
        ]
        .concat(),
        LinkProgram {
            id,
            context,
            devices,
            inputs,
            ..
        } => [vec![*id, *context], devices.clone(), inputs.clone()].concat(),
        SetSpecializationConstant { program, .. } | SetProgramSource { program, .. } => {
            vec![*program]
        }
        CreateKernel { id, program, .. } => vec![*id, *program],
        CreateKernelsInProgram { program, ids } => [vec![*program], ids.clone()].concat(),
        CloneKernel { id, source } => vec![*id, *source],
        SetKernelArg { kernel, arg, .. } => match arg {
            KernelArg::Object(o) => vec![*kernel, *o],
            _ => vec![*kernel],
        },
        SetUserEventStatus { event, .. } | SetEventCallback { event, .. } => vec![*event],
        SetQueueProperty { queue, .. } => vec![*queue],
        Release { id } => vec![*id],
        c => match enqueue_sync(c) {
            Some((q, s)) => [vec![q, s.event], s.waits.clone()].concat(),
            None => Vec::new(),
        },
    };
    v.retain(|&i| i != 0);
    v
}

/// Whether a call only acts on its first id (so it goes with that object).
fn acts_on_first(c: &Call) -> bool {
    use Call::*;
    matches!(
        c,
        SetKernelArg { .. }
            | SetUserEventStatus { .. }
            | SetEventCallback { .. }
            | BuildProgram { .. }
            | CompileProgram { .. }
            | SetSpecializationConstant { .. }
            | SetProgramSource { .. }
            | SetQueueProperty { .. }
            | Release { .. }
    )
}

/// Drops objects the application has released that nothing kept still
/// names: their creation, what acted on them alone, and their release (a
/// loop that makes and frees a buffer per frame would otherwise grow the
/// journal forever).
fn prune_released(entries: &mut Vec<Entry>, released: &HashSet<Id>) {
    // Per id: whether an entry that neither makes it nor acts on it alone
    // names it (then it must stay).
    let mut needed: HashSet<Id> = HashSet::new();
    let mut made_alone: HashSet<Id> = HashSet::new();
    for e in entries.iter() {
        let v = ids(&e.call);
        let single_maker = matches!(
            e.call,
            Call::CreateContext { .. }
                | Call::CreateContextFromType { .. }
                | Call::CreateQueue { .. }
                | Call::CreateBuffer { .. }
                | Call::CreateSubBuffer { .. }
                | Call::CreateImage { .. }
                | Call::CreateSampler { .. }
                | Call::CreateProgramWithSource { .. }
                | Call::CreateProgramWithIl { .. }
                | Call::CreateProgramWithBinary { .. }
                | Call::CreateProgramWithBuiltInKernels { .. }
                | Call::LinkProgram { .. }
                | Call::CreateKernel { .. }
                | Call::CloneKernel { .. }
                | Call::CreateUserEvent { .. }
        );
        let skip_first = single_maker || acts_on_first(&e.call);
        if single_maker && let Some(&id) = v.first() {
            made_alone.insert(id);
        }
        for (k, id) in v.into_iter().enumerate() {
            if k == 0 && skip_first {
                continue;
            }
            needed.insert(id);
        }
    }
    let gone: HashSet<Id> = released
        .iter()
        .copied()
        .filter(|id| made_alone.contains(id) && !needed.contains(id))
        .collect();
    if gone.is_empty() {
        return;
    }
    entries.retain(|e| {
        let first = ids(&e.call).first().copied();
        !(first.is_some_and(|id| gone.contains(&id))
            && (acts_on_first(&e.call) || e.content.is_some() || changes_state(&e.call)))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal() -> Journal {
        let mut j = Journal::new(1 << 20, 1 << 20);
        j.armed = true;
        j
    }

    fn calls(j: &Journal) -> Vec<String> {
        j.entries.iter().map(|e| format!("{:?}", e.call)).collect()
    }

    fn kernel_arg(kernel: Id, index: u32, v: u8) -> Call {
        Call::SetKernelArg {
            kernel,
            index,
            arg: KernelArg::Bytes(vec![v]),
        }
    }

    /// A write over a lane has its contents on the lane, not in the journal:
    /// it counts as a rebuild's write whose contents only a checkpoint holds.
    #[test]
    fn a_write_over_a_lane_has_no_contents_to_replay() {
        let mut j = journal();
        let call = Call::EnqueueWriteLane {
            queue: 1,
            buffer: 2,
            offset: 0,
            key: 3,
            sync: WSync::default(),
        };
        j.record(7, &call, &[], true);
        assert!(j.entries[0].lost);
        assert_eq!(enqueue_sync(&call).map(|(q, _)| q), Some(1));
    }

    #[test]
    fn a_checkpoint_keeps_objects_and_drops_work() {
        let mut j = journal();
        let sync = |event| WSync {
            waits: Vec::new(),
            event,
        };
        let script = [
            Call::CreateContext {
                id: 1,
                props: vec![],
                devices: vec![9],
            },
            Call::CreateQueue {
                id: 2,
                context: 1,
                device: 9,
                props: vec![],
            },
            Call::CreateBuffer {
                id: 3,
                context: 1,
                flags: 0,
                size: 4,
                props: vec![],
                init: true,
            },
            kernel_arg(5, 0, 1),
            kernel_arg(5, 0, 2),
            Call::EnqueueWriteBuffer {
                queue: 2,
                buffer: 3,
                offset: 0,
                size: 4,
                sync: sync(6),
            },
            Call::EnqueueNdRange {
                queue: 2,
                kernel: 5,
                dims: 1,
                offset: None,
                global: [1, 1, 1],
                local: None,
                sync: sync(7),
            },
            Call::Release { id: 7 },
            Call::GetInfo {
                kind: crane_wire::InfoKind::Mem,
                object: 3,
                param: 0,
            },
            Call::Finish { queue: 2 },
        ];
        for (i, c) in script.iter().enumerate() {
            let payload: &[u8] = if matches!(
                c,
                Call::CreateBuffer { .. } | Call::EnqueueWriteBuffer { .. }
            ) {
                &[1, 2, 3, 4]
            } else {
                &[]
            };
            assert_eq!(j.record(i as u64 + 2, c, payload, true), After::Nothing);
        }
        j.compact(&HashMap::new(), &HashSet::new(), &HashSet::new());
        let got = calls(&j);
        // The context, queue and buffer stay (the buffer with its initial
        // contents, having no RAM copy here); the last argument only; the
        // write's event the application holds becomes a marker; the launch
        // (its event released), the query and the wait go.
        assert_eq!(got.len(), 5, "{got:#?}");
        assert!(got[3].contains("Bytes([2])"), "{got:#?}");
        assert!(got[4].starts_with("EnqueueMarker"), "{got:#?}");
        assert_eq!(&*j.entries[2].payload, [1, 2, 3, 4]);
        assert_eq!(j.since, 5);
        assert!(FROZEN.load(Ordering::Relaxed));
    }

    /// clSetCommandQueueProperty changes the queue: a checkpoint keeps it
    /// with the queue (a replay makes the queue as the application left it),
    /// a replay sends it although the proxy answers it, and it goes with the
    /// queue once that is released.
    #[test]
    fn a_queue_property_set_stays_with_its_queue() {
        let mut j = journal();
        let script = [
            Call::CreateQueue {
                id: 2,
                context: 1,
                device: 9,
                props: vec![],
            },
            Call::SetQueueProperty {
                queue: 2,
                properties: 2,
                enable: false,
            },
            Call::Finish { queue: 2 },
        ];
        for (i, c) in script.iter().enumerate() {
            j.record(i as u64 + 2, c, &[], true);
        }
        assert!(makes_objects(&script[1]));
        j.compact(&HashMap::new(), &HashSet::new(), &HashSet::new());
        let got = calls(&j);
        assert_eq!(got.len(), 2, "{got:#?}");
        assert!(got[1].starts_with("SetQueueProperty"), "{got:#?}");
        j.record(10, &Call::Release { id: 2 }, &[], true);
        j.compact(&HashMap::new(), &HashSet::new(), &HashSet::new());
        assert!(calls(&j).is_empty(), "{:#?}", calls(&j));
    }

    #[test]
    fn released_objects_nothing_names_go() {
        let mut j = journal();
        for (i, c) in [
            Call::CreateBuffer {
                id: 3,
                context: 1,
                flags: 0,
                size: 4,
                props: vec![],
                init: false,
            },
            Call::CreateBuffer {
                id: 4,
                context: 1,
                flags: 0,
                size: 4,
                props: vec![],
                init: false,
            },
            Call::CreateSubBuffer {
                id: 5,
                parent: 4,
                flags: 0,
                origin: 0,
                size: 2,
            },
            Call::Release { id: 3 },
            Call::Release { id: 4 },
        ]
        .iter()
        .enumerate()
        {
            j.record(i as u64 + 2, c, &[], true);
        }
        j.compact(&HashMap::new(), &HashSet::new(), &HashSet::new());
        let got = calls(&j);
        // Buffer 3 is gone; buffer 4 stays, as its sub-buffer names it.
        assert_eq!(got.len(), 3, "{got:#?}");
        assert!(got.iter().all(|c| !c.contains("id: 3")), "{got:#?}");
    }

    #[test]
    fn an_argument_in_force_at_a_clone_stays() {
        let mut j = journal();
        for (i, c) in [
            kernel_arg(5, 0, 1),
            Call::CloneKernel { id: 6, source: 5 },
            kernel_arg(5, 0, 2),
        ]
        .iter()
        .enumerate()
        {
            j.record(i as u64 + 2, c, &[], true);
        }
        j.compact(&HashMap::new(), &HashSet::new(), &HashSet::new());
        assert_eq!(j.entries.len(), 3);
    }

    #[test]
    fn many_calls_ask_for_a_checkpoint() {
        let mut j = Journal::new(1 << 30, 3);
        j.armed = true;
        let c = Call::Flush { queue: 2 };
        for seq in 2..5 {
            assert_eq!(j.record(seq, &c, &[], true), After::Nothing);
        }
        assert_eq!(j.record(5, &c, &[], true), After::Checkpoint);
        assert_eq!(j.record(6, &c, &[], true), After::Nothing, "asked once");
    }

    #[test]
    fn a_journal_past_twice_its_limit_gives_up() {
        let mut j = Journal::new(1000, 1 << 20);
        j.armed = true;
        let w = Call::EnqueueWriteBuffer {
            queue: 2,
            buffer: 3,
            offset: 0,
            size: 800,
            sync: WSync::default(),
        };
        assert_eq!(j.record(2, &w, &[0; 800], true), After::Nothing);
        assert_eq!(j.record(3, &w, &[0; 800], true), After::Checkpoint);
        assert_eq!(j.record(4, &w, &[0; 800], true), After::Nothing);
        assert!(j.off.is_some() && j.entries.is_empty() && !j.usable());
    }
}
