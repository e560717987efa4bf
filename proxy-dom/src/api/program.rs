//! Programs: creation from source, IL, binaries and built-in kernels;
//! build, compile, link; specialization constants; binaries.

use std::ffi::{c_char, c_void};

use crane_wire::{Answer, Id};
use opencl_sys::*;

use super::{c_string, check, made, or_null, query, raw};
use crate::ratelimit::limited;
use crate::session::objects::{Detail, Kind};
use crate::session::{CallError, CallResult, Session};
use crate::vendor::{VPtr, vfn};

impl Session {
    pub(crate) fn create_program_with_source(
        &mut self,
        id: Id,
        context: Id,
        source: &str,
    ) -> CallResult {
        self.create(id, Kind::Program, |s| {
            let ctx = s.objects.handle(context, Kind::Context)?;
            let f = vfn!(ctx.get(), clCreateProgramWithSource)?;
            let mut ptr = source.as_ptr() as *const c_char;
            let len = source.len();
            let mut err = CL_SUCCESS;
            // SAFETY: one string of `len` bytes (lengths given, so no NUL
            // terminator is needed).
            let h = unsafe { f(ctx.get().cast(), 1, &mut ptr, &len, &mut err) };
            Ok((made(h, err)?, source_detail(source)))
        })
    }

    /// Replaces the source of `program` (made from source) with the client's
    /// expansion of its includes: a new vendor program from it, in the same
    /// context. A program that has kernels, or that is referenced from
    /// elsewhere, keeps its source: its build then fails as it would
    /// natively (CL_INVALID_OPERATION).
    pub(crate) fn set_program_source(&mut self, program: Id, source: &str) -> CallResult {
        let o = self.objects.get(program, Kind::Program)?;
        if !matches!(o.detail, Detail::SourceProgram { .. }) {
            return Err(CallError::Cl(CL_INVALID_PROGRAM));
        }
        let old = o.handle.map_err(CallError::Cl)?;
        let info = |param: cl_program_info| {
            let f = vfn!(old.get(), clGetProgramInfo)?;
            // SAFETY: a live program; `query` sizes the answer.
            query(|n, v, r| unsafe { f(old.get().cast(), param, n, v, r) })
        };
        let refs = info(CL_PROGRAM_REFERENCE_COUNT)?;
        if refs.len() != 4 || u32::from_ne_bytes([refs[0], refs[1], refs[2], refs[3]]) != 1 {
            return Ok(());
        }
        let ctx = info(CL_PROGRAM_CONTEXT)?;
        let ctx: cl_context = usize::from_ne_bytes(
            ctx.get(..size_of::<usize>())
                .and_then(|b| b.try_into().ok())
                .ok_or(CallError::Cl(CL_INVALID_PROGRAM))?,
        ) as cl_context;
        let f = vfn!(old.get(), clCreateProgramWithSource)?;
        let mut ptr = source.as_ptr() as *const c_char;
        let len = source.len();
        let mut err = CL_SUCCESS;
        // SAFETY: the program's own live context; one string of `len` bytes.
        let h = made(unsafe { f(ctx, 1, &mut ptr, &len, &mut err) }, err)?;
        crate::session::release(Kind::Program, Detail::Plain, old);
        self.objects.replace(program, h, source_detail(source))
    }

    /// Source with a directive that reads a file is not compiled here (a
    /// client of 1.3 or later sends none: see `crane_wire::source`).
    fn refuse_includes(&self, program: Id, failure: cl_int) -> CallResult {
        let o = self.objects.get(program, Kind::Program)?;
        if o.detail == (Detail::SourceProgram { includes: true }) {
            log::warn!(
                "session {}: program {program} has an #include (or another directive that reads a \
                 file) left in its source; crane-proxy compiles only source whose includes the \
                 client resolved",
                self.id
            );
            return Err(CallError::Cl(failure));
        }
        Ok(())
    }

    pub(crate) fn create_program_with_il(&mut self, id: Id, context: Id, il: &[u8]) -> CallResult {
        self.create(id, Kind::Program, |s| {
            let ctx = s.objects.handle(context, Kind::Context)?;
            let f = vfn!(ctx.get(), clCreateProgramWithIL)?;
            let mut err = CL_SUCCESS;
            // SAFETY: `il` is il.len() bytes.
            let h = unsafe { f(ctx.get().cast(), or_null(il).cast(), il.len(), &mut err) };
            Ok((made(h, err)?, Detail::Plain))
        })
    }

    /// Replies `Binary` with the per-binary statuses whether or not the
    /// program could be made.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_program_with_binary(
        &mut self,
        seq: u64,
        id: Id,
        context: Id,
        devices: &[Id],
        sizes: &[u64],
        payload: &[u8],
    ) -> CallResult {
        let total = sizes.iter().try_fold(0u64, |a, &b| a.checked_add(b));
        if total != Some(payload.len() as u64) {
            return Err(CallError::Violation(format!(
                "the payload holds {} bytes, not the binaries' total",
                payload.len()
            )));
        }
        let mut per_binary: Vec<cl_int> = vec![CL_SUCCESS; sizes.len()];
        let made_it = self.create(id, Kind::Program, |s| {
            let ctx = s.objects.handle(context, Kind::Context)?;
            let devices = s.device_list(devices)?;
            if devices.len() != sizes.len() || devices.is_empty() {
                return Err(CallError::Cl(CL_INVALID_VALUE));
            }
            let lengths: Vec<usize> = sizes.iter().map(|&n| n as usize).collect();
            let mut binaries: Vec<*const u8> = Vec::with_capacity(sizes.len());
            let mut at = 0usize;
            // PoCL aborts the process on a binary it cannot read
            // (`crate::quirks`): each is checked first, and one it would
            // abort on gets the specification's answer instead.
            let pocl = s.shared.vendor.pocl_binary_format(ctx);
            let mut flawed = false;
            for (i, &n) in lengths.iter().enumerate() {
                let bin = &payload[at..at + n];
                if let Some(format) = pocl
                    && let Err(flaw) = crane_vendor_loader::pocl_binary::check(bin, Some(format))
                {
                    limited!(
                        log::Level::Warn,
                        "session {}: binary {i} of program {id}: {flaw}",
                        s.id
                    );
                    per_binary[i] = CL_INVALID_BINARY;
                    flawed = true;
                }
                binaries.push(bin.as_ptr());
                at += n;
            }
            if flawed {
                return Err(CallError::Cl(CL_INVALID_BINARY));
            }
            let f = vfn!(ctx.get(), clCreateProgramWithBinary)?;
            let mut err = CL_SUCCESS;
            // SAFETY: n devices, n lengths, n pointers into the payload
            // covering exactly those lengths, n statuses.
            let h = unsafe {
                f(
                    ctx.get().cast(),
                    devices.len() as cl_uint,
                    devices.as_ptr(),
                    lengths.as_ptr(),
                    binaries.as_mut_ptr(),
                    per_binary.as_mut_ptr(),
                    &mut err,
                )
            };
            Ok((made(h, err)?, Detail::Plain))
        });
        let status = match made_it {
            Ok(()) => CL_SUCCESS,
            Err(CallError::Cl(e)) => e,
            Err(v) => return Err(v),
        };
        self.reply(seq, &Answer::Binary { status, per_binary }, &[]);
        Ok(())
    }

    pub(crate) fn create_program_with_built_in_kernels(
        &mut self,
        id: Id,
        context: Id,
        devices: &[Id],
        names: &str,
    ) -> CallResult {
        self.create(id, Kind::Program, |s| {
            let ctx = s.objects.handle(context, Kind::Context)?;
            let devices = s.device_list(devices)?;
            let names = c_string(names, CL_INVALID_VALUE)?;
            let f = vfn!(ctx.get(), clCreateProgramWithBuiltInKernels)?;
            let mut err = CL_SUCCESS;
            // SAFETY: live devices and a C string.
            let h = unsafe {
                f(
                    ctx.get().cast(),
                    devices.len() as cl_uint,
                    or_null(&devices),
                    names.as_ptr(),
                    &mut err,
                )
            };
            Ok((made(h, err)?, Detail::Plain))
        })
    }

    pub(crate) fn build_program(
        &mut self,
        seq: u64,
        program: Id,
        devices: &[Id],
        options: &str,
    ) -> CallResult {
        let p = self.objects.handle(program, Kind::Program)?;
        let devices = self.device_list(devices)?;
        refuse_options(options, CL_INVALID_BUILD_OPTIONS, self.id)?;
        self.refuse_includes(program, CL_BUILD_PROGRAM_FAILURE)?;
        let options = c_string(options, CL_INVALID_BUILD_OPTIONS)?;
        let f = vfn!(p.get(), clBuildProgram)?;
        // SAFETY: a live program, live devices (or NULL), a C string, no
        // callback: the build completes before the call returns.
        check(unsafe {
            f(
                p.get().cast(),
                devices.len() as cl_uint,
                or_null(&devices),
                options.as_ptr(),
                None,
                std::ptr::null_mut(),
            )
        })?;
        self.reply(seq, &Answer::Status(CL_SUCCESS), &[]);
        Ok(())
    }

    pub(crate) fn compile_program(
        &mut self,
        seq: u64,
        program: Id,
        devices: &[Id],
        options: &str,
        headers: &[(Id, String)],
    ) -> CallResult {
        let p = self.objects.handle(program, Kind::Program)?;
        let devices = self.device_list(devices)?;
        refuse_options(options, CL_INVALID_COMPILER_OPTIONS, self.id)?;
        self.refuse_includes(program, CL_COMPILE_PROGRAM_FAILURE)?;
        let options = c_string(options, CL_INVALID_COMPILER_OPTIONS)?;
        let mut header_programs: Vec<cl_program> = Vec::with_capacity(headers.len());
        let mut names = Vec::with_capacity(headers.len());
        for (id, name) in headers {
            // A vendor may write embedded headers to files named after them
            // (PoCL does): no name may leave its directory.
            if name.starts_with('/') || name.split('/').any(|c| c == "..") {
                log::warn!(
                    "session {}: embedded header name {name:?} leaves its directory",
                    self.id
                );
                return Err(CallError::Cl(CL_INVALID_VALUE));
            }
            // Header programs may hold includes: with none left in the
            // program compiled, the compiler never opens them.
            header_programs.push(self.objects.handle(*id, Kind::Program)?.get().cast());
            names.push(c_string(name, CL_INVALID_VALUE)?);
        }
        let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let f = vfn!(p.get(), clCompileProgram)?;
        // SAFETY: live program, devices and header programs; one C string
        // per header; no callback.
        check(unsafe {
            f(
                p.get().cast(),
                devices.len() as cl_uint,
                or_null(&devices),
                options.as_ptr(),
                header_programs.len() as cl_uint,
                or_null(&header_programs),
                or_null(&name_ptrs) as *mut *const c_char,
                None,
                std::ptr::null_mut(),
            )
        })?;
        self.reply(seq, &Answer::Status(CL_SUCCESS), &[]);
        Ok(())
    }

    /// Replies `Status`. A link that fails may still produce a program (to
    /// read its log): then `id` names it although the status is an error.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn link_program(
        &mut self,
        seq: u64,
        id: Id,
        context: Id,
        devices: &[Id],
        options: &str,
        inputs: &[Id],
    ) -> CallResult {
        self.objects.check_new(id)?;
        let linked = (|| {
            self.objects.admit(0)?;
            let ctx = self.objects.handle(context, Kind::Context)?;
            let devices = self.device_list(devices)?;
            refuse_options(options, CL_INVALID_LINKER_OPTIONS, self.id)?;
            let options = c_string(options, CL_INVALID_LINKER_OPTIONS)?;
            let inputs: Vec<cl_program> = raw(&self.objects.handles(inputs, Kind::Program)?);
            let f = vfn!(ctx.get(), clLinkProgram)?;
            let mut err = CL_SUCCESS;
            // SAFETY: live context, devices and input programs; a C
            // string; no callback.
            let h = unsafe {
                f(
                    ctx.get().cast(),
                    devices.len() as cl_uint,
                    or_null(&devices),
                    options.as_ptr(),
                    inputs.len() as cl_uint,
                    or_null(&inputs),
                    None,
                    std::ptr::null_mut(),
                    &mut err,
                )
            };
            Ok((h, err))
        })();
        let status = match linked {
            Ok((h, err)) if !h.is_null() => {
                self.objects
                    .insert(id, Kind::Program, VPtr(h.cast()), Detail::Plain);
                err
            }
            Ok((_, err)) => {
                let err = if err == CL_SUCCESS {
                    CL_OUT_OF_HOST_MEMORY
                } else {
                    err
                };
                self.objects.insert_failed(id, Kind::Program, err);
                err
            }
            Err(CallError::Cl(e)) => {
                self.objects.insert_failed(id, Kind::Program, e);
                e
            }
            Err(v) => return Err(v),
        };
        self.reply(seq, &Answer::Status(status), &[]);
        Ok(())
    }

    pub(crate) fn set_specialization_constant(
        &mut self,
        program: Id,
        spec_id: u32,
        value: &[u8],
    ) -> CallResult {
        let p = self.objects.handle(program, Kind::Program)?;
        let f = vfn!(p.get(), clSetProgramSpecializationConstant)?;
        // SAFETY: `value` is value.len() bytes, copied by the vendor.
        check(unsafe { f(p.get().cast(), spec_id, value.len(), or_null(value).cast()) })
    }

    /// Replies `Binaries`: the size of each device's binary, and the
    /// binaries one after the other as payload.
    pub(crate) fn get_program_binaries(&mut self, seq: u64, program: Id) -> CallResult {
        let p = self.objects.handle(program, Kind::Program)?;
        let f = vfn!(p.get(), clGetProgramInfo)?;
        // SAFETY: a live program; the vendor writes at most `size` bytes.
        let raw_sizes = query(|size, v, ret| unsafe {
            f(p.get().cast(), CL_PROGRAM_BINARY_SIZES, size, v, ret)
        })?;
        let sizes: Vec<u64> = raw_sizes
            .chunks_exact(size_of::<usize>())
            .map(|c| u64::from_ne_bytes(c.try_into().expect("8-byte chunks")))
            .collect();
        let total = sizes
            .iter()
            .try_fold(0u64, |a, &b| a.checked_add(b))
            .filter(|&t| t <= super::MAX_INFO as u64)
            .ok_or(CallError::Cl(CL_OUT_OF_HOST_MEMORY))?;
        let mut data = super::host_buffer(total)?;
        let mut ptrs: Vec<*mut u8> = Vec::with_capacity(sizes.len());
        let mut at = 0usize;
        for &n in &sizes {
            ptrs.push(if n == 0 {
                std::ptr::null_mut()
            } else {
                data[at..].as_mut_ptr()
            });
            at += n as usize;
        }
        // SAFETY: one pointer per device, each to as many bytes as that
        // device's binary size (NULL for none).
        check(unsafe {
            f(
                p.get().cast(),
                CL_PROGRAM_BINARIES,
                ptrs.len() * size_of::<*mut u8>(),
                ptrs.as_mut_ptr() as *mut c_void,
                std::ptr::null_mut(),
            )
        })?;
        self.reply(
            seq,
            &Answer::Binaries {
                status: CL_SUCCESS,
                sizes,
            },
            &data,
        );
        Ok(())
    }
}

fn source_detail(source: &str) -> Detail {
    Detail::SourceProgram {
        includes: crane_wire::source::reads_files(source),
    }
}

/// Options that make the compiler read files or load code are refused
/// (`crane_wire::source::forbidden_option`).
fn refuse_options(options: &str, code: cl_int, session: u64) -> CallResult {
    if let Some(bad) = crane_wire::source::forbidden_option(options) {
        log::warn!(
            "session {session}: build option {bad:?} refused (it reads files on this machine)"
        );
        return Err(CallError::Cl(code));
    }
    Ok(())
}
