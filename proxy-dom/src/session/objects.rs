//! A session's objects: the client's ids mapped to vendor objects, or to the
//! error their creation failed with. Each session has its own table, so ids
//! are a per-session namespace and one client can never name another's
//! objects. The table also keeps the session's limits (object count, device
//! memory) and the order objects were made in, for teardown.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crane_wire::Id;
use opencl_sys::*;

use super::CallError;
use crate::vendor::VPtr;

/// What an id names. Mirrors the OpenCL object types; buffers and images are
/// both `Mem` (OpenCL's `cl_mem`), told apart by their [`Detail`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Platform,
    Device,
    Context,
    Queue,
    Mem,
    Sampler,
    Program,
    Kernel,
    Event,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Platform => "platform",
            Kind::Device => "device",
            Kind::Context => "context",
            Kind::Queue => "command queue",
            Kind::Mem => "memory object",
            Kind::Sampler => "sampler",
            Kind::Program => "program",
            Kind::Kernel => "kernel",
            Kind::Event => "event",
        }
    }

    /// The name with its indefinite article, for messages.
    pub fn a(self) -> &'static str {
        match self {
            Kind::Platform => "a platform",
            Kind::Device => "a device",
            Kind::Context => "a context",
            Kind::Queue => "a command queue",
            Kind::Mem => "a memory object",
            Kind::Sampler => "a sampler",
            Kind::Program => "a program",
            Kind::Kernel => "a kernel",
            Kind::Event => "an event",
        }
    }

    /// Teardown releases lower ranks first: dependents before what they
    /// depend on.
    fn teardown_rank(self, detail: &Detail) -> u8 {
        match (self, detail) {
            (Kind::Kernel, _) => 0,
            (Kind::Event, _) => 1,
            (Kind::Mem, Detail::Mem { image: Some(_), .. } | Detail::Mem { sub: true, .. }) => 2,
            (Kind::Mem, _) => 3,
            (Kind::Sampler, _) => 4,
            (Kind::Program, _) => 5,
            (Kind::Queue, _) => 6,
            (Kind::Context, _) => 7,
            (Kind::Device | Kind::Platform, _) => 8,
        }
    }
}

/// What the proxy needs to know about an object beyond its handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detail {
    Plain,
    /// A platform or root device: the vendor's, never released.
    Root,
    Mem {
        /// Bytes addressable through the object (a buffer's size, an image's
        /// tightly packed size): bounds host staging before any vendor call.
        extent: u64,
        /// Bytes charged to the session's memory limit (0 for sub-buffers
        /// and images made from buffers, which alias their parent).
        charged: u64,
        /// Bytes per pixel, for images.
        image: Option<u64>,
        sub: bool,
    },
    /// A user event and whether the client has set its status.
    UserEvent {
        set: bool,
    },
    /// A program made from source, and whether that source has a directive
    /// that reads a file (it is then not compiled: `crane_wire::source`).
    SourceProgram {
        includes: bool,
    },
}

pub(crate) struct Object {
    pub kind: Kind,
    pub handle: Result<VPtr, cl_int>,
    pub detail: Detail,
    order: u64,
}

/// Counts a session shares with the proxy's statistics.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub objects: AtomicU64,
    pub mem: AtomicU64,
}

pub(crate) struct Objects {
    map: HashMap<Id, Object>,
    next_order: u64,
    /// Live vendor objects, unset user events the client released included.
    live: u64,
    /// Sub-buffers the client released whose vendor release is held back
    /// (`crate::quirks`): they count against the object limit until it
    /// happens, or a session could keep any number of them.
    held_back: u64,
    mem: u64,
    max_objects: u64,
    max_mem: u64,
    /// User events the client released before setting them: kept so that
    /// teardown can fail them, or the queues waiting on them would never
    /// drain.
    unset_released: Vec<VPtr>,
    counters: Arc<Counters>,
}

impl Objects {
    pub fn new(max_objects: u64, max_mem: u64, counters: Arc<Counters>) -> Objects {
        Objects {
            map: HashMap::new(),
            next_order: 0,
            live: 0,
            held_back: 0,
            mem: 0,
            max_objects,
            max_mem,
            unset_released: Vec::new(),
            counters,
        }
    }

    fn publish(&self) {
        self.counters.objects.store(
            self.map.len() as u64 + self.unset_released.len() as u64 + self.held_back,
            Ordering::Relaxed,
        );
        self.counters.mem.store(self.mem, Ordering::Relaxed);
    }

    /// Checks that `id` can name a new object. Failed objects are kept too,
    /// so the table may hold twice the object limit before the session is
    /// ended instead.
    pub fn check_new(&self, id: Id) -> Result<(), CallError> {
        if id == 0 {
            return Err(CallError::Violation("id 0 names no object".into()));
        }
        if self.map.contains_key(&id) {
            return Err(CallError::Violation(format!("id {id} is already in use")));
        }
        if self.map.len() as u64 >= self.max_objects.saturating_mul(2) {
            return Err(CallError::Violation(
                "the session's object table is full (failed objects count too: release them)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Whether one more object taking `mem` bytes fits the session's limits.
    pub fn admit(&self, mem: u64) -> Result<(), cl_int> {
        if self.live + self.held_back >= self.max_objects {
            return Err(CL_OUT_OF_RESOURCES);
        }
        if self.mem.saturating_add(mem) > self.max_mem {
            return Err(CL_MEM_OBJECT_ALLOCATION_FAILURE);
        }
        Ok(())
    }

    /// Whether `n` more objects fit the object limit.
    pub fn admit_n(&self, n: u64) -> Result<(), cl_int> {
        if (self.live + self.held_back).saturating_add(n) > self.max_objects {
            return Err(CL_OUT_OF_RESOURCES);
        }
        Ok(())
    }

    /// Checks that the ids of a call that names several new objects are
    /// fresh and distinct.
    pub fn check_new_all(&self, ids: &[Id]) -> Result<(), CallError> {
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        for &id in ids {
            self.check_new(id)?;
            if !seen.insert(id) {
                return Err(CallError::Violation(format!("id {id} is named twice")));
            }
        }
        Ok(())
    }

    pub fn insert(&mut self, id: Id, kind: Kind, handle: VPtr, detail: Detail) {
        self.live += 1;
        if let Detail::Mem { charged, .. } = detail {
            self.mem += charged;
        }
        self.put(id, kind, Ok(handle), detail);
    }

    pub fn insert_failed(&mut self, id: Id, kind: Kind, status: cl_int) {
        self.put(id, kind, Err(status), Detail::Plain);
    }

    fn put(&mut self, id: Id, kind: Kind, handle: Result<VPtr, cl_int>, detail: Detail) {
        let order = self.next_order;
        self.next_order += 1;
        self.map.insert(
            id,
            Object {
                kind,
                handle,
                detail,
                order,
            },
        );
        self.publish();
    }

    pub fn contains(&self, id: Id) -> bool {
        self.map.contains_key(&id)
    }

    /// The object `id`, of whatever kind: an unknown id ends the session.
    pub fn lookup(&self, id: Id) -> Result<&Object, CallError> {
        self.map
            .get(&id)
            .ok_or_else(|| CallError::Violation(format!("id {id} names no object of this session")))
    }

    /// The object `id`, which must be a `kind`: an unknown id or one of
    /// another kind is a forged handle and ends the session.
    pub fn get(&self, id: Id, kind: Kind) -> Result<&Object, CallError> {
        let o = self.lookup(id)?;
        if o.kind != kind {
            return Err(CallError::Violation(format!(
                "id {id} names {}, not {}",
                o.kind.a(),
                kind.a()
            )));
        }
        Ok(o)
    }

    pub fn get_mut(&mut self, id: Id, kind: Kind) -> Result<&mut Object, CallError> {
        self.get(id, kind)?;
        Ok(self.map.get_mut(&id).expect("checked above"))
    }

    /// The vendor handle of `id`; a failed object gives its creation's error.
    pub fn handle(&self, id: Id, kind: Kind) -> Result<VPtr, CallError> {
        self.get(id, kind)?.handle.map_err(CallError::Cl)
    }

    /// Like [`Objects::handle`], with id 0 standing for NULL.
    pub fn handle_or_null(&self, id: Id, kind: Kind) -> Result<VPtr, CallError> {
        if id == 0 {
            Ok(VPtr(std::ptr::null_mut()))
        } else {
            self.handle(id, kind)
        }
    }

    /// The handles of `ids`, all of `kind`.
    pub fn handles(&self, ids: &[Id], kind: Kind) -> Result<Vec<VPtr>, CallError> {
        ids.iter().map(|&id| self.handle(id, kind)).collect()
    }

    /// Gives `id` (a live object) another vendor handle and detail.
    pub fn replace(&mut self, id: Id, handle: VPtr, detail: Detail) -> Result<(), CallError> {
        let o = self.map.get_mut(&id).ok_or_else(|| {
            CallError::Violation(format!("id {id} names no object of this session"))
        })?;
        o.handle = Ok(handle);
        o.detail = detail;
        Ok(())
    }

    /// Forgets `id`, returning what it named.
    pub fn remove(&mut self, id: Id) -> Result<Object, CallError> {
        let o = self.map.remove(&id).ok_or_else(|| {
            CallError::Violation(format!("id {id} names no object of this session"))
        })?;
        if o.handle.is_ok() {
            self.live -= 1;
            if let Detail::Mem { charged, .. } = o.detail {
                self.mem -= charged;
            }
        }
        self.publish();
        Ok(o)
    }

    /// Sets how many released sub-buffers wait for their vendor release.
    pub fn set_held_back(&mut self, n: u64) {
        self.held_back = n;
        self.publish();
    }

    /// Keeps a user event the client released before setting it.
    pub fn keep_unset(&mut self, event: VPtr) {
        self.live += 1;
        self.unset_released.push(event);
        self.publish();
    }

    /// The live user events nobody has set yet.
    pub fn unset_user_events(&self) -> Vec<VPtr> {
        let mut v: Vec<VPtr> = self
            .map
            .values()
            .filter(|o| matches!(o.detail, Detail::UserEvent { set: false }))
            .filter_map(|o| o.handle.ok())
            .collect();
        v.extend(self.unset_released.iter().copied());
        v
    }

    /// The live objects of `kind`.
    pub fn live_of(&self, kind: Kind) -> Vec<VPtr> {
        self.map
            .values()
            .filter(|o| o.kind == kind)
            .filter_map(|o| o.handle.ok())
            .collect()
    }

    /// Empties the table, returning the live objects in the order they must
    /// be released: kernels, events, images and sub-buffers, buffers,
    /// samplers, programs (linked ones before their inputs), queues,
    /// contexts, devices; newest first within each group.
    pub fn take_for_teardown(&mut self) -> Vec<(Kind, Detail, VPtr)> {
        let mut all: Vec<Object> = self.map.drain().map(|(_, o)| o).collect();
        all.sort_by_key(|o| (o.kind.teardown_rank(&o.detail), std::cmp::Reverse(o.order)));
        let mut out: Vec<(Kind, Detail, VPtr)> = self
            .unset_released
            .drain(..)
            .map(|e| (Kind::Event, Detail::UserEvent { set: true }, e))
            .collect();
        out.extend(
            all.into_iter()
                .filter_map(|o| Some((o.kind, o.detail, o.handle.ok()?))),
        );
        self.live = 0;
        self.held_back = 0;
        self.mem = 0;
        self.publish();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(n: usize) -> VPtr {
        VPtr(n as *mut std::ffi::c_void)
    }

    fn table() -> Objects {
        Objects::new(4, 1000, Arc::default())
    }

    #[test]
    fn forged_and_mistyped_ids_are_violations_failed_ones_give_their_error() {
        let mut t = table();
        t.insert(1, Kind::Context, fake(0x10), Detail::Plain);
        t.insert_failed(2, Kind::Mem, CL_MEM_OBJECT_ALLOCATION_FAILURE);
        assert_eq!(t.handle(1, Kind::Context).unwrap(), fake(0x10));
        assert!(matches!(
            t.handle(1, Kind::Queue),
            Err(CallError::Violation(_))
        ));
        assert!(matches!(
            t.handle(9, Kind::Queue),
            Err(CallError::Violation(_))
        ));
        assert!(matches!(
            t.handle(2, Kind::Mem),
            Err(CallError::Cl(CL_MEM_OBJECT_ALLOCATION_FAILURE))
        ));
        assert!(matches!(t.check_new(1), Err(CallError::Violation(_))));
        assert!(matches!(t.check_new(0), Err(CallError::Violation(_))));
        assert!(t.handle_or_null(0, Kind::Mem).unwrap().get().is_null());
    }

    /// Sub-buffers whose vendor release is held back (crate::quirks) count
    /// against the object limit until they go.
    #[test]
    fn held_back_sub_buffers_count_against_the_object_limit() {
        let mut t = table();
        for id in 1..=3 {
            t.insert(id, Kind::Context, fake(id as usize), Detail::Plain);
        }
        assert_eq!(t.admit(0), Ok(()));
        t.set_held_back(1);
        assert_eq!(t.admit(0), Err(CL_OUT_OF_RESOURCES));
        assert_eq!(t.admit_n(1), Err(CL_OUT_OF_RESOURCES));
        t.set_held_back(0);
        assert_eq!(t.admit(0), Ok(()));
    }

    #[test]
    fn limits_count_live_objects_and_charged_memory() {
        let mut t = table();
        assert_eq!(t.admit(1001), Err(CL_MEM_OBJECT_ALLOCATION_FAILURE));
        let mem = |charged| Detail::Mem {
            extent: charged,
            charged,
            image: None,
            sub: false,
        };
        t.insert(1, Kind::Mem, fake(1), mem(600));
        assert_eq!(t.admit(500), Err(CL_MEM_OBJECT_ALLOCATION_FAILURE));
        assert_eq!(t.admit(400), Ok(()));
        t.insert(2, Kind::Mem, fake(2), mem(400));
        t.insert(3, Kind::Context, fake(3), Detail::Plain);
        t.insert(4, Kind::Context, fake(4), Detail::Plain);
        assert_eq!(t.admit(0), Err(CL_OUT_OF_RESOURCES));
        t.remove(1).unwrap();
        assert_eq!(t.admit(600), Ok(()));
        // Failed objects fill the table up to twice the limit, then the
        // session ends.
        for id in 10..15 {
            t.check_new(id).unwrap();
            t.insert_failed(id, Kind::Mem, CL_OUT_OF_RESOURCES);
        }
        assert!(matches!(t.check_new(99), Err(CallError::Violation(_))));
    }

    #[test]
    fn teardown_releases_dependents_first() {
        let mut t = Objects::new(100, 1 << 20, Arc::default());
        let buf = Detail::Mem {
            extent: 8,
            charged: 8,
            image: None,
            sub: false,
        };
        let sub = Detail::Mem {
            extent: 8,
            charged: 0,
            image: None,
            sub: true,
        };
        t.insert(1, Kind::Context, fake(1), Detail::Plain);
        t.insert(2, Kind::Queue, fake(2), Detail::Plain);
        t.insert(3, Kind::Mem, fake(3), buf);
        t.insert(4, Kind::Program, fake(4), Detail::Plain);
        t.insert(5, Kind::Program, fake(5), Detail::Plain); // linked from 4
        t.insert(6, Kind::Kernel, fake(6), Detail::Plain);
        t.insert(7, Kind::Mem, fake(7), sub);
        t.insert(8, Kind::Event, fake(8), Detail::UserEvent { set: false });
        t.insert_failed(9, Kind::Kernel, CL_INVALID_KERNEL_NAME);
        t.insert(10, Kind::Device, fake(10), Detail::Root);
        let order: Vec<usize> = t
            .take_for_teardown()
            .into_iter()
            .map(|(_, _, h)| h.get() as usize)
            .collect();
        assert_eq!(order, vec![6, 8, 7, 3, 5, 4, 2, 1, 10]);
        assert_eq!(t.admit(1 << 20), Ok(()));
    }
}
