//! The shadow objects: what crane records about each OpenCL object so that it can
//! rebuild it on a freshly loaded vendor library.

use std::cell::UnsafeCell;
use std::ffi::{CStr, CString, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use opencl_sys::*;

use crate::handle::{self, Base, ClObject, Kind, Slot};
use crate::vendor;

macro_rules! cl_object {
    ($t:ident, $kind:ident, $release:ident) => {
        cl_object!($t, $kind, $release, |_s: &$t, _v: *mut c_void| ());
    };
    ($t:ident, $kind:ident, $release:ident, $before:expr) => {
        cl_object!(
            $t,
            $kind,
            release = |v| vendor::release(v, |d| d.$release),
            $before
        );
    };
    ($t:ident, $kind:ident, release = $rel:expr, $before:expr) => {
        impl ClObject for $t {
            const KIND: Kind = Kind::$kind;
            #[inline(always)]
            fn base(&self) -> &Base {
                &self.base
            }
        }
        impl Drop for $t {
            fn drop(&mut self) {
                let v = self.base.take_vendor();
                if !v.is_null() {
                    ($before)(self, v);
                    // SAFETY: `v` is a live vendor object of this kind that crane
                    // holds one reference to; this gives it back.
                    unsafe { ($rel)(v) };
                }
                handle::on_drop::<$t>(&self.base);
            }
        }
    };
}

pub struct Platform {
    pub base: Base,
    /// Which vendor library (index into the configured vendor list).
    pub vendor_index: usize,
    /// Position among that vendor's platforms.
    pub index: usize,
    pub name: String,
}

impl ClObject for Platform {
    const KIND: Kind = Kind::Platform;
    fn base(&self) -> &Base {
        &self.base
    }
}

pub struct Device {
    pub base: Base,
    pub platform: Arc<Platform>,
    pub parent: Option<Arc<Device>>,
    /// Root devices: position in clGetDeviceIDs(CL_DEVICE_TYPE_ALL). Sub-devices:
    /// position in the parent's clCreateSubDevices result.
    pub index: usize,
    /// Sub-devices: the partition properties they were made with.
    pub partition: Vec<cl_device_partition_property>,
    /// The device the application got this handle for.
    pub home: DeviceId,
    /// The device behind the handle now: another one after a move with a
    /// device spec (`crane_control::DeviceSpec`).
    pub now: Mutex<DeviceId>,
    /// Root devices: a context was ever made with it (or a sub-device of
    /// it). The devices a move with a spec takes along.
    pub used: AtomicBool,
}

/// Which physical device (as far as OpenCL tells) a handle refers to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceId {
    pub platform: String,
    pub name: String,
    /// `CL_DRIVER_VERSION`: binaries are reused only on the same driver.
    pub driver: String,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} of {:?}", self.name, self.platform)
    }
}

impl Device {
    /// The device behind the handle now.
    pub fn now(&self) -> DeviceId {
        self.now.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    /// The root device (itself for a root device).
    pub fn root(&self) -> &Device {
        match &self.parent {
            Some(p) => p.root(),
            None => self,
        }
    }
}

impl ClObject for Device {
    const KIND: Kind = Kind::Device;
    fn base(&self) -> &Base {
        &self.base
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let v = self.base.take_vendor();
        if self.parent.is_some() && !v.is_null() {
            // SAFETY: sub-devices are reference counted; crane holds one reference.
            unsafe { vendor::release(v, |d| d.clReleaseDevice) };
        }
        handle::on_drop::<Device>(&self.base);
    }
}

pub type ContextNotify =
    Option<unsafe extern "C" fn(*const std::ffi::c_char, *const c_void, usize, *mut c_void)>;

pub struct Context {
    pub base: Base,
    /// Properties as the application gave them, platform as crane's handle.
    pub props: Vec<cl_context_properties>,
    pub platform: Arc<Platform>,
    pub devices: Vec<Arc<Device>>,
    pub notify: ContextNotify,
    pub notify_data: usize,
    pub destructors: Mutex<Vec<Arc<Callback>>>,
    /// Host memory for maps (see `staging`).
    pub staging: Arc<crate::staging::Pool>,
}
cl_object!(
    Context,
    Context,
    release = |v| crate::quirks::release_context(v),
    crate::api::context::before_release
);

pub struct Queue {
    pub base: Base,
    pub context: Arc<Context>,
    pub device: Arc<Device>,
    /// OpenCL 2.0 property list (zero-terminated) or empty with `legacy_props`.
    pub props: Vec<cl_queue_properties>,
    pub legacy_props: Option<cl_command_queue_properties>,
    /// The properties clSetCommandQueueProperty (OpenCL 1.0, deprecated)
    /// left the queue with, where it changed them: a queue is created again
    /// with its creation properties and brought to these.
    pub set_props: std::sync::Mutex<Option<cl_command_queue_properties>>,
}
cl_object!(Queue, Queue, clReleaseCommandQueue);

impl Queue {
    /// The properties now: as created, or as clSetCommandQueueProperty left them.
    pub fn current_properties(&self) -> cl_command_queue_properties {
        self.set_props
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(|| self.properties())
    }

    /// The properties the queue was created with.
    pub fn properties(&self) -> cl_command_queue_properties {
        if let Some(p) = self.legacy_props {
            return p;
        }
        self.props
            .chunks(2)
            .find(|c| c.len() == 2 && c[0] == CL_QUEUE_PROPERTIES as cl_queue_properties)
            .map_or(0, |c| c[1])
    }
}

pub enum MemKind {
    Buffer,
    SubBuffer {
        parent: Arc<Mem>,
        origin: usize,
    },
    Image {
        format: cl_image_format,
        desc: cl_image_desc,
        buffer: Option<Arc<Mem>>,
    },
    Pipe {
        packet_size: cl_uint,
        max_packets: cl_uint,
        props: Vec<cl_pipe_properties>,
    },
}

/// What crane keeps in RAM of a memory object's contents.
#[derive(Default)]
pub struct Shadow {
    /// Whole-object contents (images: tightly packed), when known.
    data: Option<crate::staging::HostBytes>,
    /// Changes whenever `data` may change (process-wide unique, never 0 once
    /// set): a copy sent ahead to crane-proxy by a pre-copy is used at the
    /// move only if the generation it was sent at is still this one.
    generation: u64,
}

static GENERATIONS: AtomicU64 = AtomicU64::new(1);

impl Shadow {
    /// The contents, when known.
    pub fn data(&self) -> Option<&crate::staging::HostBytes> {
        self.data.as_ref()
    }
    /// The contents, to change them.
    pub fn data_mut(&mut self) -> Option<&mut crate::staging::HostBytes> {
        self.bump();
        self.data.as_mut()
    }
    /// The contents' memory, to change how it is pinned (not the bytes: the
    /// generation stays).
    pub fn data_pinned_mut(&mut self) -> Option<&mut crate::staging::HostBytes> {
        self.data.as_mut()
    }
    /// Replaces the contents (None: not known), giving back the old ones.
    pub fn replace(
        &mut self,
        d: Option<crate::staging::HostBytes>,
    ) -> Option<crate::staging::HostBytes> {
        self.bump();
        std::mem::replace(&mut self.data, d)
    }
    /// Which version of the contents this is (see `generation`).
    pub fn generation(&self) -> u64 {
        self.generation
    }
    fn bump(&mut self) {
        self.generation = GENERATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

pub struct MapRecord {
    pub ptr: usize,
    pub offset: usize,
    pub size: usize,
    pub write: bool,
    /// Image maps: region and pitches crane chose.
    pub image: Option<([usize; 3], [usize; 3], usize, usize)>,
    /// Crane-owned memory behind `ptr` (absent for USE_HOST_PTR objects).
    pub storage: Option<crate::staging::Staging>,
}

// SAFETY: the raw pointers inside image descriptors are vendor handles crane
// only passes back to the vendor, never dereferences.
unsafe impl Send for MemKind {}
// SAFETY: as above.
unsafe impl Sync for MemKind {}

pub struct Mem {
    pub base: Base,
    pub context: Arc<Context>,
    pub flags: cl_mem_flags,
    pub size: usize,
    pub kind: MemKind,
    pub host_ptr: usize,
    pub props: Vec<cl_mem_properties>,
    pub with_props: bool,
    /// Set when a kernel, copy, fill or write-map may have changed the device
    /// copy since it was last known in RAM. For sub-buffers the parent's flag is
    /// used.
    pub dirty: AtomicBool,
    /// True once device contents exist that RAM does not hold (anything ever
    /// written); a never-written object need not be read back.
    pub ever_written: AtomicBool,
    pub shadow: Mutex<Shadow>,
    pub maps: Mutex<Vec<MapRecord>>,
    pub destructors: Mutex<Vec<Arc<Callback>>>,
}
cl_object!(
    Mem,
    Mem,
    release = |v| crate::quirks::release_mem(v),
    crate::api::memory::before_release
);

impl Mem {
    /// The object that owns the storage: a sub-buffer's parent, the buffer
    /// an image was made from (`CL_MEM_OBJECT_IMAGE1D_BUFFER`, or a 2D image
    /// from a buffer). Writes through an image made from a buffer mark the
    /// buffer dirty: it is the buffer that is read at a suspend and the image
    /// that is made from it again at the resume.
    pub fn root(&self) -> &Mem {
        match &self.kind {
            MemKind::SubBuffer { parent, .. } => parent.root(),
            MemKind::Image {
                buffer: Some(b), ..
            } => b.root(),
            _ => self,
        }
    }
    #[inline(always)]
    pub fn mark_dirty(&self) {
        let r = self.root();
        if !r.dirty.load(Ordering::Relaxed) {
            r.dirty.store(true, Ordering::Relaxed);
        }
        if !r.ever_written.load(Ordering::Relaxed) {
            r.ever_written.store(true, Ordering::Relaxed);
        }
    }
    pub fn is_image(&self) -> bool {
        matches!(self.kind, MemKind::Image { .. })
    }
    /// Offset of this object inside its root's storage.
    pub fn root_offset(&self) -> usize {
        match &self.kind {
            MemKind::SubBuffer { parent, origin } => parent.root_offset() + origin,
            MemKind::Image {
                buffer: Some(b), ..
            } => b.root_offset(),
            _ => 0,
        }
    }
}

pub struct Sampler {
    pub base: Base,
    pub context: Arc<Context>,
    pub props: Vec<cl_sampler_properties>,
    pub legacy: Option<(cl_bool, cl_addressing_mode, cl_filter_mode)>,
}
cl_object!(Sampler, Sampler, clReleaseSampler);

pub enum ProgramSource {
    Source(Vec<u8>),
    Il(Vec<u8>),
    Binaries(Vec<(Arc<Device>, Vec<u8>)>),
    BuiltIn(Vec<Arc<Device>>, CString),
    Linked {
        devices: Vec<Arc<Device>>,
        options: CString,
        inputs: Vec<Arc<Program>>,
    },
}

/// One build step applied to a program, replayed in order on resume.
pub enum BuildStep {
    Build {
        devices: Vec<Arc<Device>>,
        options: CString,
        /// Built with crane's -cl-kernel-arg-info added. False where the
        /// vendor failed the build with it and built the program without it
        /// (NVIDIA's compiler, 580: a kernel without arguments in a program
        /// built with -cl-kernel-arg-info fails in ptxas); its kernels'
        /// arguments are then of unknown kind, taken as written by launches.
        arg_info: bool,
    },
    Compile {
        devices: Vec<Arc<Device>>,
        options: CString,
        headers: Vec<(Arc<Program>, CString)>,
    },
    SpecConstant {
        id: cl_uint,
        value: Vec<u8>,
    },
}

impl BuildStep {
    /// The options the application gave, for CL_PROGRAM_BUILD_OPTIONS.
    pub fn options(&self) -> Option<&CString> {
        match self {
            BuildStep::Build { options, .. } | BuildStep::Compile { options, .. } => Some(options),
            BuildStep::SpecConstant { .. } => None,
        }
    }
}

/// One binary per device, as `clCreateProgramWithBinary` takes them.
pub type DeviceBinaries = Vec<(Arc<Device>, Vec<u8>)>;

pub struct Program {
    pub base: Base,
    pub context: Arc<Context>,
    pub source: ProgramSource,
    pub steps: Mutex<Vec<BuildStep>>,
    /// The application's latest build, compile or link options did not ask
    /// for kernel argument information (crane always does, for itself).
    pub arg_info_hidden: AtomicBool,
    /// The binaries whose sizes `CL_PROGRAM_BINARY_SIZES` last reported. The
    /// application sizes its buffers for `CL_PROGRAM_BINARIES` from that
    /// answer, and a suspend between the two queries rebuilds the program,
    /// whose new binary may be longer (PoCL's is): the buffers are filled from
    /// this copy, never past the sizes the application was given.
    pub reported_binaries: Mutex<Option<Vec<Vec<u8>>>>,
    /// The compiled object of a program whose latest step is a
    /// clCompileProgram, kept at suspend: a resume onto the same devices and
    /// drivers makes the program from it rather than compiling again, and so
    /// does any resume where compiling again would not work (the CTS compiles
    /// with `-I DIR` and removes DIR at once).
    pub compiled: Mutex<Option<Compiled>>,
    /// The vendor program now was made from `compiled`: it answers the kept
    /// compile log and status, and is made from its source again before the
    /// application compiles or builds it (a program made from a binary
    /// refuses clCompileProgram).
    pub from_compiled: AtomicBool,
    /// The executables of a program built from source or IL, kept at
    /// suspend, one per set of devices it was built on: a resume onto the
    /// same devices and drivers makes the program from one rather than
    /// compiling again.
    pub executables: Mutex<Vec<Executable>>,
    /// The vendor program now was made from the latest of `executables`:
    /// its build log is the one kept with it (a build from a binary logs
    /// nothing).
    pub from_executable: AtomicBool,
}
cl_object!(Program, Program, clReleaseProgram);

/// A program's compiled object, per device, with the identity of the device
/// it was compiled for, and the compile log of each device.
#[derive(Clone)]
pub struct Compiled {
    pub binaries: Vec<(Arc<Device>, DeviceId, Vec<u8>)>,
    pub logs: Vec<Vec<u8>>,
}

/// A program's built executable, per device, with the identity (platform,
/// name, driver version) of the device it was built for.
#[derive(Clone)]
pub struct Executable {
    /// How many build steps the program had: a later build makes it stale.
    pub steps: usize,
    pub binaries: Vec<(Arc<Device>, DeviceId, Vec<u8>)>,
    /// The build log of each device, NUL-terminated, as the build gave it.
    pub logs: Vec<Vec<u8>>,
    /// Each kernel's `CL_KERNEL_ATTRIBUTES` (name, NUL-terminated value) as
    /// the build from source gave it: a vendor may report none for kernels
    /// of a program made from a binary (PoCL does), so kernels of a program
    /// made from this executable answer the kept string.
    pub attributes: Vec<(CString, Vec<u8>)>,
}

impl Executable {
    /// The `CL_KERNEL_ATTRIBUTES` kept for kernel `name`.
    pub fn attributes_of(&self, name: &CStr) -> Option<&[u8]> {
        self.attributes
            .iter()
            .find(|(n, _)| n.as_c_str() == name)
            .map(|(_, a)| a.as_slice())
    }
}

/// The log kept for the device whose vendor handle is `vendor_device`,
/// among kept `binaries` (per device) and their `logs`.
pub fn kept_log<'a>(
    binaries: &[(Arc<Device>, DeviceId, Vec<u8>)],
    logs: &'a [Vec<u8>],
    vendor_device: *mut std::ffi::c_void,
) -> Option<&'a [u8]> {
    let i = binaries
        .iter()
        .position(|(dev, _, _)| dev.base.vendor() == vendor_device)?;
    logs.get(i).map(Vec::as_slice)
}

impl Program {
    pub fn arg_info_hidden(&self) -> bool {
        self.arg_info_hidden.load(Ordering::Relaxed)
    }
}

/// What an argument of a kernel is, from its declaration. The memory kinds
/// come first, with explicit discriminants, so that [`ArgKind::is_mem`] is one
/// compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ArgKind {
    /// `__global`/`__constant` pointer written by the kernel (may dirty a buffer).
    MemWritable = 0,
    /// `__global const`/`__constant` pointer: only read.
    MemReadOnly = 1,
    /// `image*_t`, read_write or write_only: may be dirtied.
    ImageWritable = 2,
    /// `image*_t`, read_only.
    ImageReadOnly = 3,
    Sampler,
    Local,
    Queue,
    /// Plain bytes (scalars, vectors, structs).
    Value,
    /// The vendor gave no argument information; decided per value.
    Unknown,
}

impl ArgKind {
    /// A memory object argument (buffer or image): the hot case of
    /// `clSetKernelArg`, tested with one compare (a `match` over the kinds
    /// became a jump table, an indirect branch on every call).
    #[inline(always)]
    pub fn is_mem(self) -> bool {
        self as u8 <= ArgKind::ImageReadOnly as u8
    }
}

/// A copy of a plain-bytes kernel argument. Scalars and small vectors (up to 16
/// bytes, nearly every argument there is) are kept inline, and the common
/// sizes are copied with one load and one store instead of a call to memcpy:
/// `clSetKernelArg` is the hottest call there is (docs/benchmarks.md).
#[derive(Clone)]
pub enum ArgBytes {
    Inline {
        len: u8,
        data: [u8; ArgBytes::INLINE],
    },
    Heap(Box<[u8]>),
}

impl ArgBytes {
    pub const INLINE: usize = 16;

    /// Copies `len` bytes from `p`.
    ///
    /// # Safety
    /// `p` must point to `len` readable bytes (any alignment).
    #[inline(always)]
    pub unsafe fn copy_from(p: *const u8, len: usize) -> ArgBytes {
        let mut data = [0u8; Self::INLINE];
        let d = data.as_mut_ptr();
        // SAFETY: the caller's promise covers `len` bytes at `p`, and every
        // branch writes at most `len` ≤ INLINE bytes into `data`.
        unsafe {
            match len {
                4 => d
                    .cast::<u32>()
                    .write_unaligned(p.cast::<u32>().read_unaligned()),
                8 => d
                    .cast::<u64>()
                    .write_unaligned(p.cast::<u64>().read_unaligned()),
                16 => d
                    .cast::<u128>()
                    .write_unaligned(p.cast::<u128>().read_unaligned()),
                0..=Self::INLINE => std::ptr::copy_nonoverlapping(p, d, len),
                _ => return ArgBytes::Heap(std::slice::from_raw_parts(p, len).into()),
            }
        }
        ArgBytes::Inline {
            len: len as u8,
            data,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            ArgBytes::Inline { len, data } => &data[..*len as usize],
            ArgBytes::Heap(b) => b,
        }
    }
}

/// The recorded value of one kernel argument.
#[derive(Clone)]
pub enum ArgValue {
    Unset,
    Bytes(ArgBytes),
    /// A crane memory object, sampler or queue handle, with its slot generation.
    Handle(*const Slot, u32),
    /// `clSetKernelArg(k, i, sizeof(cl_mem), &NULL)` and the like.
    NullHandle(usize),
    Local(usize),
    Svm(usize),
}

impl ArgValue {
    /// Whether dropping this value frees anything (the only variant with drop
    /// glue is `Bytes(ArgBytes::Heap)`): `clSetKernelArg`'s hot path
    /// overwrites a value that owns nothing without dropping it.
    #[inline(always)]
    pub fn owns_memory(&self) -> bool {
        matches!(self, ArgValue::Bytes(ArgBytes::Heap(_)))
    }
}

// SAFETY: the slot pointer is an arena address used only as an identifier and
// resolved through the handle module's checks.
unsafe impl Send for ArgValue {}
// SAFETY: as above.
unsafe impl Sync for ArgValue {}

pub struct Kernel {
    pub base: Base,
    pub program: Arc<Program>,
    pub name: CString,
    pub arg_kinds: Box<[ArgKind]>,
    /// OpenCL: clSetKernelArg is not thread-safe for one kernel object, so the
    /// application serialises calls on a kernel; crane reads these only with the
    /// gate shut (suspend) or from the calling thread (enqueue).
    pub args: UnsafeCell<Vec<ArgValue>>,
    /// Indices of the arguments through which a launch may write memory.
    pub dirtying_args: Box<[u32]>,
    pub exec_info: Mutex<Vec<(cl_kernel_exec_info, Vec<u8>)>>,
    /// The largest explicit work-group the application launched: per
    /// dimension, then the product. A move to another device is refused
    /// where the kernel there cannot run it.
    pub max_local: [AtomicUsize; 4],
}
cl_object!(Kernel, Kernel, clReleaseKernel);

impl Kernel {
    /// Records a launch's explicit work-group size (`local`, `dim` entries;
    /// null: the vendor chooses).
    #[inline(always)]
    pub fn note_local(&self, dim: cl_uint, local: *const usize) {
        if local.is_null() {
            return;
        }
        let dims = (dim as usize).min(3);
        let mut total = 1usize;
        for i in 0..dims {
            // SAFETY: the vendor accepted this launch, so `local` holds `dim`
            // entries.
            let l = unsafe { *local.add(i) };
            total = total.saturating_mul(l);
            if l > self.max_local[i].load(Ordering::Relaxed) {
                self.max_local[i].store(l, Ordering::Relaxed);
            }
        }
        if total > self.max_local[3].load(Ordering::Relaxed) {
            self.max_local[3].store(total, Ordering::Relaxed);
        }
    }

    /// The largest work-group launched so far: per dimension and in total.
    pub fn largest_local(&self) -> ([usize; 3], usize) {
        let d = |i: usize| self.max_local[i].load(Ordering::Relaxed);
        ([d(0), d(1), d(2)], d(3))
    }
}

// SAFETY: `args` is only touched as documented on the field.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// The recorded arguments.
    ///
    /// # Safety
    /// The caller must be the thread the application uses for this kernel, or
    /// hold the gate shut.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn args_mut(&self) -> &mut Vec<ArgValue> {
        // SAFETY: per the function's contract no other reference is live.
        unsafe { &mut *self.args.get() }
    }
}

/// An application callback registered with the vendor through a crane trampoline.
pub struct Callback {
    pub func: usize,
    pub user_data: usize,
    pub kind: cl_int,
    pub fired: AtomicBool,
    /// The crane handle passed to the application's function.
    pub handle: usize,
}

pub struct Event {
    pub base: Base,
    pub context: Arc<Context>,
    pub queue: Option<Arc<Queue>>,
    pub command_type: cl_command_type,
    /// User events: the status the application set (CL_SUBMITTED until set).
    pub user_status: AtomicI32,
    pub callbacks: Mutex<Vec<Arc<Callback>>>,
    /// Profiling counters saved at suspend (queued, submit, start, end, complete).
    pub profiling: Mutex<Option<[u64; 5]>>,
    /// Status saved at suspend.
    pub final_status: AtomicI32,
}
cl_object!(Event, Event, clReleaseEvent);

impl Event {
    pub fn is_user(&self) -> bool {
        self.command_type == CL_COMMAND_USER
    }
}

#[cfg(test)]
mod tests {
    use super::{ArgBytes, ArgKind, ArgValue};

    #[test]
    fn is_mem_names_exactly_the_memory_kinds() {
        use ArgKind::*;
        for k in [MemWritable, MemReadOnly, ImageWritable, ImageReadOnly] {
            assert!(k.is_mem(), "{k:?}");
        }
        for k in [Sampler, Local, Queue, Value, Unknown] {
            assert!(!k.is_mem(), "{k:?}");
        }
    }

    #[test]
    fn only_heap_bytes_own_memory() {
        // SAFETY: 40 readable bytes.
        let heap = unsafe { ArgBytes::copy_from([7u8; 40].as_ptr(), 40) };
        assert!(ArgValue::Bytes(heap).owns_memory());
        // SAFETY: 8 readable bytes.
        let inline = unsafe { ArgBytes::copy_from([7u8; 8].as_ptr(), 8) };
        assert!(!ArgValue::Bytes(inline).owns_memory());
        for v in [
            ArgValue::Unset,
            ArgValue::NullHandle(8),
            ArgValue::Local(64),
            ArgValue::Svm(0x1000),
        ] {
            assert!(!v.owns_memory());
        }
    }

    #[test]
    fn arg_bytes_keep_every_length_exactly() {
        // Unaligned on purpose: the application's bytes may sit anywhere.
        let src: Vec<u8> = (0..=64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        for len in 0..=63 {
            let from = &src[1..1 + len];
            // SAFETY: `from` holds `len` bytes.
            let b = unsafe { ArgBytes::copy_from(from.as_ptr(), len) };
            assert_eq!(b.as_slice(), from, "length {len}");
            assert_eq!(
                matches!(b, ArgBytes::Inline { .. }),
                len <= ArgBytes::INLINE,
                "length {len} stored in the wrong place"
            );
            assert_eq!(b.clone().as_slice(), from);
        }
    }
}
