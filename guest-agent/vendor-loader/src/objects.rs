//! The dynamic linker's view of the process: which objects are loaded, where
//! their segments lie, and what their dynamic sections say, read in memory.
//!
//! Everything that dereferences an object's memory runs inside a
//! `dl_iterate_phdr` callback: glibc holds its loader lock for the duration,
//! so no object can be unmapped while it is being read or patched.

use std::collections::HashSet;
use std::ffi::{CStr, OsStr, c_int, c_void};
use std::ops::{ControlFlow, Range};
use std::os::unix::ffi::OsStrExt;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use goblin::elf::dynamic::{
    DF_1_NODELETE, DT_FLAGS_1, DT_GNU_HASH, DT_HASH, DT_JMPREL, DT_NEEDED, DT_NULL, DT_PLTREL,
    DT_PLTRELSZ, DT_RELA, DT_RELASZ, DT_SONAME, DT_STRSZ, DT_STRTAB, DT_SYMTAB,
};
use goblin::elf::dynamic::{DT_FINI, DT_FINI_ARRAY, DT_FINI_ARRAYSZ};
use goblin::elf::program_header::{PF_W, PF_X, PT_DYNAMIC, PT_GNU_RELRO, PT_LOAD};
use goblin::elf::section_header::SHN_UNDEF;
use goblin::elf::sym::STB_GNU_UNIQUE;
use goblin::elf64::dynamic::Dyn;
use goblin::elf64::reloc::{Rela, r_sym, r_type};
use goblin::elf64::sym::Sym;

/// One loaded object, named the way the dynamic linker names it: by the path
/// it was loaded from and the address its segments are relative to. The pair
/// tells apart an object from a later one loaded at another address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ObjectId {
    pub path: PathBuf,
    pub base: usize,
}

/// The relocation types through which an object reaches an imported
/// function: its PLT slots, its GOT entries for address-taken functions,
/// and plain absolute pointers to it in data.
#[cfg(target_arch = "x86_64")]
const IMPORT_RELOCATIONS: [u32; 3] = [
    goblin::elf::reloc::R_X86_64_JUMP_SLOT,
    goblin::elf::reloc::R_X86_64_GLOB_DAT,
    goblin::elf::reloc::R_X86_64_64,
];
#[cfg(target_arch = "aarch64")]
const IMPORT_RELOCATIONS: [u32; 3] = [
    goblin::elf::reloc::R_AARCH64_JUMP_SLOT,
    goblin::elf::reloc::R_AARCH64_GLOB_DAT,
    goblin::elf::reloc::R_AARCH64_ABS64,
];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("crane-vendor-loader patches ELF64 relocations of x86_64 and aarch64 only");

/// What is known about an object that matters for explaining why it stays
/// mapped.
#[derive(Debug, Clone)]
pub(crate) struct ObjectFacts {
    pub id: ObjectId,
    pub soname: Option<String>,
    pub needed: Vec<String>,
    pub nodelete_flag: bool,
    pub unique_symbols: bool,
}

/// A view of one loaded object, valid only inside a `dl_iterate_phdr`
/// callback (the loader lock keeps it mapped).
pub(crate) struct Image<'a> {
    name: &'a CStr,
    base: usize,
    phdrs: &'a [libc::Elf64_Phdr],
    /// The absolute address ranges of the loadable segments.
    ranges: Vec<Range<usize>>,
}

/// The parts of an object's dynamic section this crate reads, with every
/// address already made absolute.
struct Dynamic {
    strtab: usize,
    strsz: usize,
    symtab: usize,
    rela: Option<(usize, usize)>,
    jmprel: Option<(usize, usize)>,
    gnu_hash: Option<usize>,
    hash: Option<usize>,
    flags_1: u64,
    needed: Vec<usize>,
    soname: Option<usize>,
}

impl<'a> Image<'a> {
    pub fn id(&self) -> ObjectId {
        ObjectId {
            path: self.path().to_path_buf(),
            base: self.base,
        }
    }

    pub fn path(&self) -> &Path {
        Path::new(OsStr::from_bytes(self.name.to_bytes()))
    }

    /// The address ranges of its executable segments.
    pub fn code_ranges(&self) -> Vec<Range<usize>> {
        self.load_segments()
            .filter(|p| p.p_flags & PF_X != 0)
            .map(|p| {
                let start = self.base.wrapping_add(p.p_vaddr as usize);
                start..start.wrapping_add(p.p_memsz as usize)
            })
            .collect()
    }

    /// The slot through which glibc's `dlclose` calls the object's last
    /// termination function: glibc calls the `DT_FINI_ARRAY` entries from
    /// the end of the array, then the `DT_FINI` function, whose address it
    /// reads from the object's dynamic section at that moment. So: the
    /// `DT_FINI` entry's value, else the array's first entry.
    pub fn termination_slot(&self) -> Option<TerminationSlot> {
        let segment = self.phdrs.iter().find(|p| p.p_type == PT_DYNAMIC)?;
        let start = self.base.wrapping_add(segment.p_vaddr as usize);
        let count = segment.p_memsz as usize / size_of::<Dyn>();
        let (mut array, mut size, mut fini) = (None, 0, None);
        for index in 0..count {
            let address = start + index * size_of::<Dyn>();
            let entry: Dyn = self.read(address)?;
            match entry.d_tag {
                DT_NULL => break,
                DT_FINI_ARRAY => array = self.absolute(entry.d_val),
                DT_FINI_ARRAYSZ => size = entry.d_val as usize,
                // d_val follows the 8-byte d_tag.
                DT_FINI => fini = Some((address + size_of::<u64>(), entry.d_val as usize)),
                _ => {}
            }
        }
        if let Some((slot, value)) = fini {
            // glibc calls l_addr + d_ptr; the entry is never relocated.
            return Some(TerminationSlot {
                slot,
                value,
                function: self.base.wrapping_add(value),
                relative: true,
            });
        }
        if size < size_of::<usize>() {
            return None;
        }
        let slot = array?;
        let value = self.read::<usize>(slot)?;
        Some(TerminationSlot {
            slot,
            value,
            function: value,
            relative: false,
        })
    }

    fn load_segments(&self) -> impl Iterator<Item = &libc::Elf64_Phdr> {
        self.phdrs.iter().filter(|p| p.p_type == PT_LOAD)
    }

    fn new(name: &'a CStr, base: usize, phdrs: &'a [libc::Elf64_Phdr]) -> Self {
        let ranges = phdrs
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .map(|p| {
                let start = base.wrapping_add(p.p_vaddr as usize);
                start..start.wrapping_add(p.p_memsz as usize)
            })
            .collect();
        Image {
            name,
            base,
            phdrs,
            ranges,
        }
    }

    pub fn contains(&self, address: usize) -> bool {
        self.ranges.iter().any(|r| r.contains(&address))
    }

    /// Whether `len` bytes at `address` lie inside one loadable segment.
    fn spans(&self, address: usize, len: usize) -> bool {
        let Some(end) = address.checked_add(len) else {
            return false;
        };
        self.ranges
            .iter()
            .any(|r| r.start <= address && end <= r.end)
    }

    /// Turns an address read from the dynamic section into an absolute one.
    /// glibc rewrites most of these entries in place by adding the load
    /// base, but not for every object (a read-only dynamic section, as in the
    /// vDSO, keeps the link-time values), so accept whichever reading lands
    /// inside the object.
    fn absolute(&self, value: u64) -> Option<usize> {
        let value = usize::try_from(value).ok()?;
        if self.contains(value) {
            Some(value)
        } else {
            let biased = self.base.wrapping_add(value);
            self.contains(biased).then_some(biased)
        }
    }

    fn read<T: Copy>(&self, address: usize) -> Option<T> {
        if !address.is_multiple_of(align_of::<T>()) || !self.spans(address, size_of::<T>()) {
            return None;
        }
        // SAFETY: the range lies inside a loadable segment of an object that
        // the loader lock (held by our caller, dl_iterate_phdr) keeps mapped,
        // and it is aligned for T; T is a plain ELF integer or record.
        Some(unsafe { (address as *const T).read() })
    }

    fn c_str_at(&self, dynamic: &Dynamic, offset: usize) -> Option<&CStr> {
        if offset >= dynamic.strsz {
            return None;
        }
        let start = dynamic.strtab.checked_add(offset)?;
        let len = dynamic.strsz - offset;
        if !self.spans(start, len) {
            return None;
        }
        // SAFETY: the string table lies inside the mapped object (checked
        // just above), which the loader lock keeps mapped while the returned
        // borrow of self lives.
        let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, len) };
        CStr::from_bytes_until_nul(bytes).ok()
    }

    fn dynamic(&self) -> Option<Dynamic> {
        let segment = self.phdrs.iter().find(|p| p.p_type == PT_DYNAMIC)?;
        let start = self.base.wrapping_add(segment.p_vaddr as usize);
        let count = segment.p_memsz as usize / size_of::<Dyn>();
        let mut dynamic = Dynamic {
            strtab: 0,
            strsz: 0,
            symtab: 0,
            rela: None,
            jmprel: None,
            gnu_hash: None,
            hash: None,
            flags_1: 0,
            needed: Vec::new(),
            soname: None,
        };
        let (mut rela, mut relasz, mut jmprel, mut pltrelsz, mut pltrel) = (0, 0, 0, 0, 0);
        for index in 0..count {
            let entry: Dyn = self.read(start + index * size_of::<Dyn>())?;
            match entry.d_tag {
                DT_NULL => break,
                DT_STRTAB => dynamic.strtab = self.absolute(entry.d_val)?,
                DT_STRSZ => dynamic.strsz = entry.d_val as usize,
                DT_SYMTAB => dynamic.symtab = self.absolute(entry.d_val)?,
                DT_RELA => rela = self.absolute(entry.d_val)?,
                DT_RELASZ => relasz = entry.d_val as usize,
                DT_JMPREL => jmprel = self.absolute(entry.d_val)?,
                DT_PLTRELSZ => pltrelsz = entry.d_val as usize,
                DT_PLTREL => pltrel = entry.d_val,
                DT_GNU_HASH => dynamic.gnu_hash = self.absolute(entry.d_val),
                DT_HASH => dynamic.hash = self.absolute(entry.d_val),
                DT_FLAGS_1 => dynamic.flags_1 = entry.d_val,
                DT_NEEDED => dynamic.needed.push(entry.d_val as usize),
                DT_SONAME => dynamic.soname = Some(entry.d_val as usize),
                _ => {}
            }
        }
        if rela != 0 && relasz != 0 {
            dynamic.rela = Some((rela, relasz));
        }
        // Only RELA is used on the 64-bit targets this crate supports.
        if jmprel != 0 && pltrelsz != 0 && pltrel == DT_RELA {
            dynamic.jmprel = Some((jmprel, pltrelsz));
        }
        (dynamic.strtab != 0 && dynamic.symtab != 0).then_some(dynamic)
    }

    fn symbol(&self, dynamic: &Dynamic, index: usize) -> Option<Sym> {
        self.read(
            dynamic
                .symtab
                .checked_add(index.checked_mul(size_of::<Sym>())?)?,
        )
    }

    /// Facts about the object for the unload report.
    pub fn facts(&self, with_symbol_scan: bool) -> ObjectFacts {
        let mut facts = ObjectFacts {
            id: self.id(),
            soname: None,
            needed: Vec::new(),
            nodelete_flag: false,
            unique_symbols: false,
        };
        let Some(dynamic) = self.dynamic() else {
            return facts;
        };
        let name = |offset| {
            self.c_str_at(&dynamic, offset)
                .map(|s| s.to_string_lossy().into_owned())
        };
        facts.soname = dynamic.soname.and_then(name);
        facts.needed = dynamic.needed.iter().filter_map(|&o| name(o)).collect();
        facts.nodelete_flag = dynamic.flags_1 & DF_1_NODELETE != 0;
        if with_symbol_scan {
            facts.unique_symbols = self.symbol_count(&dynamic).is_some_and(|count| {
                (1..count).any(|index| {
                    self.symbol(&dynamic, index).is_some_and(|sym| {
                        sym.st_info >> 4 == STB_GNU_UNIQUE && u32::from(sym.st_shndx) != SHN_UNDEF
                    })
                })
            });
        }
        facts
    }

    /// The number of dynamic symbols. ELF does not record it directly; it is
    /// `nchain` of a SysV hash table, or the end of the last chain of a GNU
    /// hash table.
    fn symbol_count(&self, dynamic: &Dynamic) -> Option<usize> {
        if let Some(hash) = dynamic.hash {
            return self.read::<u32>(hash + 4).map(|n| n as usize);
        }
        let table = dynamic.gnu_hash?;
        let nbuckets = self.read::<u32>(table)? as usize;
        let symoffset = self.read::<u32>(table + 4)? as usize;
        let bloom_words = self.read::<u32>(table + 8)? as usize;
        let buckets = table + 16 + bloom_words * size_of::<u64>();
        let chains = buckets + nbuckets * size_of::<u32>();
        let mut last = 0;
        for bucket in 0..nbuckets {
            last = last.max(self.read::<u32>(buckets + bucket * 4)? as usize);
        }
        if last < symoffset {
            return Some(symoffset);
        }
        loop {
            let hash = self.read::<u32>(chains + (last - symoffset) * 4)?;
            if hash & 1 == 1 {
                return Some(last + 1);
            }
            last += 1;
        }
    }

    /// The range that glibc made read-only after relocation (RELRO), rounded
    /// the way glibc rounds it: whole pages from the start, the last partial
    /// page stays writable.
    fn relro_pages(&self, page: usize) -> Option<Range<usize>> {
        let relro = self.phdrs.iter().find(|p| p.p_type == PT_GNU_RELRO)?;
        let start = self.base.wrapping_add(relro.p_vaddr as usize);
        let end = start + relro.p_memsz as usize;
        Some(start & !(page - 1)..end & !(page - 1))
    }

    fn writable(&self, address: usize) -> bool {
        self.load_segments().any(|p| {
            let start = self.base.wrapping_add(p.p_vaddr as usize);
            (start..start + p.p_memsz as usize).contains(&address) && p.p_flags & PF_W != 0
        })
    }

    /// Points every import of a function named in `hooks` at the hook, in
    /// the object's relocated GOT and data. Returns how many slots changed.
    pub fn redirect_imports(&self, hooks: &[(&CStr, usize)]) -> usize {
        let Some(dynamic) = self.dynamic() else {
            return 0;
        };
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let relro = self.relro_pages(page);
        let mut changed = 0;
        for (table, size) in [dynamic.rela, dynamic.jmprel].into_iter().flatten() {
            for index in 0..size / size_of::<Rela>() {
                let Some(rela) = self.read::<Rela>(table + index * size_of::<Rela>()) else {
                    break;
                };
                if !IMPORT_RELOCATIONS.contains(&r_type(rela.r_info)) || rela.r_addend != 0 {
                    continue;
                }
                let Some(sym) = self.symbol(&dynamic, r_sym(rela.r_info) as usize) else {
                    continue;
                };
                if sym.st_name == 0 || u32::from(sym.st_shndx) != SHN_UNDEF {
                    continue;
                }
                let Some(name) = self.c_str_at(&dynamic, sym.st_name as usize) else {
                    continue;
                };
                let Some(&(_, hook)) = hooks.iter().find(|(n, _)| *n == name) else {
                    continue;
                };
                let slot = self.base.wrapping_add(rela.r_offset as usize);
                if self.write_slot(slot, hook, relro.as_ref(), page) {
                    changed += 1;
                }
            }
        }
        changed
    }

    fn write_slot(
        &self,
        slot: usize,
        value: usize,
        relro: Option<&Range<usize>>,
        page: usize,
    ) -> bool {
        if !slot.is_multiple_of(align_of::<usize>()) || !self.spans(slot, size_of::<usize>()) {
            log::warn!(
                "Skipped a relocation of {} outside its image.",
                self.path().display()
            );
            return false;
        }
        // SAFETY: the slot is an aligned, pointer-sized location inside the
        // mapped object (checked above), kept mapped by the loader lock;
        // other threads only read it, and atomically, as the CPU loads a
        // naturally aligned word.
        let cell = unsafe { std::sync::atomic::AtomicUsize::from_ptr(slot as *mut usize) };
        if cell.load(std::sync::atomic::Ordering::Relaxed) == value {
            return false;
        }
        let page_start = slot & !(page - 1);
        let protected = relro.is_some_and(|r| r.contains(&page_start));
        if !protected && !self.writable(slot) {
            log::warn!(
                "Skipped a relocation of {} in a read-only segment.",
                self.path().display()
            );
            return false;
        }
        if protected {
            // SAFETY: the page belongs to this object's RELRO range, which is
            // mapped; it is made writable only for the store below.
            let rc = unsafe {
                libc::mprotect(
                    page_start as *mut c_void,
                    page,
                    libc::PROT_READ | libc::PROT_WRITE,
                )
            };
            if rc != 0 {
                log::warn!(
                    "mprotect of {:#x} in {} failed: {}.",
                    page_start,
                    self.path().display(),
                    std::io::Error::last_os_error()
                );
                return false;
            }
        }
        cell.store(value, std::sync::atomic::Ordering::Release);
        if protected {
            // SAFETY: restores the protection glibc gave the RELRO page.
            unsafe { libc::mprotect(page_start as *mut c_void, page, libc::PROT_READ) };
        }
        true
    }
}

/// See [`Image::termination_slot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TerminationSlot {
    /// Where the pointer lies.
    pub slot: usize,
    /// What it holds now.
    pub value: usize,
    /// The function it designates.
    pub function: usize,
    /// Whether the slot holds an offset from the object's base (`DT_FINI`)
    /// rather than an address.
    pub relative: bool,
}

/// The termination slot of the loaded object `id`, with the object's base.
pub(crate) fn termination_slot(id: &ObjectId) -> Option<TerminationSlot> {
    let mut out = None;
    for_each_object(|image| {
        if image.id() == *id {
            out = image.termination_slot();
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    out
}

/// Stores `value` in the pointer-sized `slot` of the loaded object `id`
/// (through its RELRO protection if need be); whether it was stored.
pub(crate) fn write_slot(id: &ObjectId, slot: usize, value: usize) -> bool {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let mut written = false;
    for_each_object(|image| {
        if image.id() == *id {
            let relro = image.relro_pages(page);
            written = image.write_slot(slot, value, relro.as_ref(), page)
                || image.read::<usize>(slot) == Some(value);
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    written
}

/// The executable ranges of the loaded objects in `ids`, with their ids.
pub(crate) fn code_ranges(ids: &HashSet<ObjectId>) -> Vec<(ObjectId, Range<usize>)> {
    let mut out = Vec::new();
    for_each_object(|image| {
        let id = image.id();
        if ids.contains(&id) {
            for range in image.code_ranges() {
                out.push((id.clone(), range));
            }
        }
        ControlFlow::Continue(())
    });
    out
}

/// Calls `visit` for each loaded object, in link-map order, under the loader
/// lock. `visit` must not call into the dynamic linker.
pub(crate) fn for_each_object(mut visit: impl FnMut(&Image<'_>) -> ControlFlow<()>) {
    struct State<'f> {
        visit: &'f mut dyn FnMut(&Image<'_>) -> ControlFlow<()>,
        panic: Option<Box<dyn std::any::Any + Send>>,
    }

    unsafe extern "C" fn callback(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: data is the &mut State passed to dl_iterate_phdr below,
        // alive for the whole iteration and used by this callback alone.
        let state = unsafe { &mut *data.cast::<State<'_>>() };
        // SAFETY: glibc passes a valid dl_phdr_info for the duration of the
        // call.
        let info = unsafe { &*info };
        let name = if info.dlpi_name.is_null() {
            c""
        } else {
            // SAFETY: dlpi_name is a NUL-terminated string owned by the
            // link map, alive while the loader lock is held.
            unsafe { CStr::from_ptr(info.dlpi_name) }
        };
        let phdrs = if info.dlpi_phdr.is_null() {
            &[][..]
        } else {
            // SAFETY: dlpi_phdr points to dlpi_phnum program headers of the
            // mapped object.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
        };
        let image = Image::new(name, info.dlpi_addr as usize, phdrs);
        // A panic must not unwind through glibc's frames: carry it out.
        match panic::catch_unwind(AssertUnwindSafe(|| (state.visit)(&image))) {
            Ok(ControlFlow::Continue(())) => 0,
            Ok(ControlFlow::Break(())) => 1,
            Err(payload) => {
                state.panic = Some(payload);
                1
            }
        }
    }

    let mut state = State {
        visit: &mut visit,
        panic: None,
    };
    // SAFETY: the callback matches dl_iterate_phdr's contract and the state
    // pointer outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(callback), (&raw mut state).cast()) };
    if let Some(payload) = state.panic {
        panic::resume_unwind(payload);
    }
}

/// The objects loaded now.
pub(crate) fn loaded_ids() -> HashSet<ObjectId> {
    let mut ids = HashSet::new();
    for_each_object(|image| {
        ids.insert(image.id());
        ControlFlow::Continue(())
    });
    ids
}

/// The object whose segments contain `address`.
pub(crate) fn object_containing(address: usize) -> Option<ObjectId> {
    let mut found = None;
    for_each_object(|image| {
        if image.contains(address) {
            found = Some(image.id());
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    found
}

/// Redirects the named imports of each object in `targets` to the hooks.
pub(crate) fn redirect_imports(targets: &HashSet<ObjectId>, hooks: &[(&CStr, usize)]) {
    for_each_object(|image| {
        let id = image.id();
        if targets.contains(&id) {
            let changed = image.redirect_imports(hooks);
            log::debug!("Redirected {changed} imports of {}.", id.path.display());
        }
        ControlFlow::Continue(())
    });
}

/// Facts about every loaded object; symbols are scanned only for `scan`.
pub(crate) fn facts(scan: &HashSet<ObjectId>) -> Vec<ObjectFacts> {
    let mut all = Vec::new();
    for_each_object(|image| {
        all.push(image.facts(scan.contains(&image.id())));
        ControlFlow::Continue(())
    });
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_is_found_with_its_soname() {
        let facts = facts(&HashSet::new());
        let libc = facts
            .iter()
            .find(|f| f.soname.as_deref() == Some("libc.so.6"))
            .expect("libc.so.6 is loaded in every test process");
        assert!(!libc.nodelete_flag);
    }

    #[test]
    fn symbol_count_of_libc_is_read_from_its_hash_table() {
        // libc defines no STB_GNU_UNIQUE symbol; the scan must still run and
        // count its dynamic symbols without leaving the image.
        let ids = loaded_ids();
        let libc = ids
            .iter()
            .find(|id| id.path.to_string_lossy().contains("libc.so.6"))
            .expect("libc.so.6 is loaded")
            .clone();
        let mut count = None;
        for_each_object(|image| {
            if image.id() == libc {
                count = image.dynamic().and_then(|d| image.symbol_count(&d));
                assert!(!image.facts(true).unique_symbols);
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        });
        assert!(
            count.is_some_and(|c| c > 1000),
            "libc has thousands of dynamic symbols, counted {count:?}"
        );
    }

    #[test]
    fn object_containing_finds_this_function() {
        let here = object_containing_finds_this_function as *const () as usize;
        let id = object_containing(here).expect("the test binary is a loaded object");
        let exe = std::env::current_exe().unwrap();
        // The main program is listed with an empty name.
        assert!(id.path.as_os_str().is_empty() || id.path == exe, "{id:?}");
    }
}
