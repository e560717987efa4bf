//! A tenant cannot make crane-proxy's compiler read the proxy domain's files:
//! source with an `#include` (in any spelling) is not compiled, options that
//! read files are refused, embedded header names cannot leave their
//! directory; and the source the client sends after resolving its includes
//! (`SetProgramSource`, wire 1.3) is what is built. Before, `#include` of a
//! file of the proxy's (its token file, for one) built against it and the
//! build log quoted its lines.

mod common;

use common::*;
use crane_wire::{Answer, Call, Id, InfoKind};

const CL_BUILD_PROGRAM_FAILURE: i32 = -11;
const CL_COMPILE_PROGRAM_FAILURE: i32 = -15;
const CL_INVALID_VALUE: i32 = -30;
const CL_INVALID_BUILD_OPTIONS: i32 = -43;
const CL_INVALID_COMPILER_OPTIONS: i32 = -66;
const CL_PROGRAM_BUILD_LOG: u32 = 0x1183;

fn program(c: &mut Client, env: &Env, source: &str) -> Id {
    let id = c.id();
    c.post(
        Call::CreateProgramWithSource {
            id,
            context: env.context,
            source: source.into(),
        },
        &[],
    );
    id
}

fn build(c: &mut Client, env: &Env, program: Id, options: &str) -> Answer {
    c.call(
        Call::BuildProgram {
            program,
            devices: vec![env.device],
            options: options.into(),
        },
        &[],
    )
    .0
}

fn log(c: &mut Client, env: &Env, program: Id) -> String {
    let (_, log) = c.call(
        Call::GetInfo {
            kind: InfoKind::ProgramBuild { device: env.device },
            object: program,
            param: CL_PROGRAM_BUILD_LOG,
        },
        &[],
    );
    String::from_utf8_lossy(&log).into_owned()
}

#[test]
fn the_proxy_compiler_reads_no_file_a_tenant_names() {
    let dir = tempfile::tempdir().unwrap();
    // A file of the proxy domain's that is valid OpenCL C: with the include
    // honoured, the program below would build.
    let secret = dir.path().join("secret.h");
    std::fs::write(&secret, "#define SECRET 0x5ec12e7 // token-gamma-1234\n").unwrap();
    let p = TestProxy::start(|_| {});
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);
    let path = secret.display().to_string();
    let kernel = "__kernel void k(__global int *o) { o[0] = SECRET; }\n";
    for spelling in [
        format!("#include \"{path}\"\n"),
        format!("  #  include <{path}>\n"),
        format!("%:include \"{path}\"\n"),
        format!("#/**/include \"{path}\"\n"),
        format!("#\\\ninclude \"{path}\"\n"),
        format!("#define F \"{path}\"\n#include F\n"),
        format!("#include_next \"{path}\"\n"),
        format!("#import \"{path}\"\n"),
        format!("#embed \"{path}\"\n"),
    ] {
        let prog = program(&mut c, &env, &format!("{spelling}{kernel}"));
        assert_eq!(
            build(&mut c, &env, prog, ""),
            Answer::Status(CL_BUILD_PROGRAM_FAILURE),
            "{spelling}"
        );
        let l = log(&mut c, &env, prog);
        assert!(!l.contains("token-gamma"), "{spelling}: {l}");
        // Compiling refuses it too.
        let (a, _) = c.call(
            Call::CompileProgram {
                program: prog,
                devices: vec![env.device],
                options: String::new(),
                headers: vec![],
            },
            &[],
        );
        assert_eq!(a, Answer::Status(CL_COMPILE_PROGRAM_FAILURE), "{spelling}");
    }
    // Options that read files.
    let plain = program(
        &mut c,
        &env,
        "__kernel void k(__global int *o) { o[0] = 1; }\n",
    );
    for opts in [
        format!("-include {path}"),
        format!("-I{}", dir.path().display()),
        format!("@{path}"),
        format!("-imacros {path}"),
        format!("-Xclang -include -Xclang {path}"),
    ] {
        assert_eq!(
            build(&mut c, &env, plain, &opts),
            Answer::Status(CL_INVALID_BUILD_OPTIONS),
            "{opts}"
        );
        let (a, _) = c.call(
            Call::CompileProgram {
                program: plain,
                devices: vec![env.device],
                options: opts.clone(),
                headers: vec![],
            },
            &[],
        );
        assert_eq!(a, Answer::Status(CL_INVALID_COMPILER_OPTIONS), "{opts}");
    }
    // Embedded header names stay in their directory.
    let header = program(&mut c, &env, "#define H 1\n");
    for name in ["../h.h", "/tmp/h.h", "a/../../h.h"] {
        let (a, _) = c.call(
            Call::CompileProgram {
                program: plain,
                devices: vec![env.device],
                options: String::new(),
                headers: vec![(header, name.into())],
            },
            &[],
        );
        assert_eq!(a, Answer::Status(CL_INVALID_VALUE), "{name}");
    }
    // The session carries on: what the client resolved builds and runs.
    assert_eq!(
        build(&mut c, &env, plain, "-DX=1 -cl-std=CL1.2"),
        Answer::Status(CL_SUCCESS)
    );
    assert_eq!(c.sync(), vec![]);
}

#[test]
fn a_program_builds_from_the_source_its_client_resolved() {
    let p = TestProxy::start(|_| {});
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);
    let prog = program(
        &mut c,
        &env,
        "#include \"v.h\"\n__kernel void k(__global int *o) { o[0] = V; }\n",
    );
    // The client's resolution of the include, as the interposer makes it.
    c.post(
        Call::SetProgramSource {
            program: prog,
            source: "#line 1 \"v.h\"\n#define V 41\n#line 2 \"<source>\"\n\
                     __kernel void k(__global int *o) { o[0] = V + 1; }\n"
                .into(),
        },
        &[],
    );
    assert_eq!(
        build(&mut c, &env, prog, ""),
        Answer::Status(CL_SUCCESS),
        "{}",
        log(&mut c, &env, prog)
    );
    let out = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 4, None);
    let kernel = c.id();
    c.post(
        Call::CreateKernel {
            id: kernel,
            program: prog,
            name: "k".into(),
        },
        &[],
    );
    set_arg(&mut c, kernel, 0, crane_wire::KernelArg::Object(out));
    launch_one(&mut c, &env, kernel, Default::default());
    assert_eq!(read(&mut c, &env, out, 4, vec![]), 42i32.to_ne_bytes());
    // A program with a kernel keeps its source: a second replacement changes
    // nothing, and building again fails as natively.
    c.post(
        Call::SetProgramSource {
            program: prog,
            source: "__kernel void k(__global int *o) { o[0] = 7; }\n".into(),
        },
        &[],
    );
    assert_ne!(build(&mut c, &env, prog, ""), Answer::Status(CL_SUCCESS));
    assert_eq!(c.sync(), vec![]);
}
