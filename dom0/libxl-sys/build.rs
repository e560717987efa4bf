//! Generates the libxl bindings from the system's headers. Only what
//! `crane-libxl` wraps is allowlisted, so the bindings stay small and a
//! libxl that lacks one of these names fails here, at build time.

use std::path::PathBuf;

/// Header directories searched when `LIBXL_INCLUDE_DIR` is not set.
const DEFAULT_INCLUDE_DIRS: &[&str] = &["/usr/include", "/usr/local/include"];

const FUNCTIONS: &[&str] = &[
    "libxl_ctx_alloc",
    "libxl_ctx_free",
    "libxl_childproc_setmode",
    "libxl_name_to_domid",
    "libxl_domid_to_name",
    "libxl_domain_info",
    "libxl_list_domain",
    "libxl_dominfo_init",
    "libxl_dominfo_dispose",
    "libxl_dominfo_list_free",
    "libxl_domain_destroy",
    "libxl_domain_unpause",
    "libxl_device_pci_init",
    "libxl_device_pci_dispose",
    "libxl_device_pci_add",
    "libxl_device_pci_remove",
    "libxl_device_pci_list",
    "libxl_device_pci_list_free",
    "libxl_device_pci_assignable_add",
    "libxl_device_pci_assignable_remove",
    "libxl_device_pci_assignable_list",
    "libxl_device_pci_assignable_list_free",
    "vsnprintf",
];

const TYPES: &[&str] = &[
    "libxl_ctx",
    "libxl_dominfo",
    "libxl_device_pci",
    "libxl_childproc_hooks",
    "libxl_sigchld_owner",
    "libxl_error",
    "libxl_domain_type",
    "libxl_shutdown_reason",
    "xentoollog_logger",
    "xentoollog_level",
];

fn main() {
    println!("cargo::rerun-if-changed=wrapper.h");
    println!("cargo::rerun-if-env-changed=LIBXL_INCLUDE_DIR");
    let dirs: Vec<PathBuf> = match std::env::var_os("LIBXL_INCLUDE_DIR") {
        Some(d) => vec![PathBuf::from(d)],
        None => DEFAULT_INCLUDE_DIRS.iter().map(PathBuf::from).collect(),
    };
    let Some(include) = dirs.iter().find(|d| d.join("libxl.h").is_file()) else {
        panic!(
            "\n\nlibxl-sys: libxl.h was not found in {dirs:?}.\n\
             Install Debian's libxen-dev (apt-get install libxen-dev; `cargo xtask test` \
             installs it), or point LIBXL_INCLUDE_DIR at the directory holding libxl.h.\n\
             bindgen also needs libclang (Debian's libclang-dev).\n"
        );
    };
    println!(
        "cargo::rerun-if-changed={}",
        include.join("libxl.h").display()
    );
    println!("cargo::rustc-link-lib=dylib=xenlight");
    println!("cargo::rustc-link-lib=dylib=xentoollog");

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_var("LIBXL_VERSION")
        .allowlist_var("INVALID_DOMID")
        .default_enum_style(bindgen::EnumVariation::ModuleConsts)
        .derive_default(false)
        .layout_tests(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for f in FUNCTIONS {
        builder = builder.allowlist_function(f);
    }
    for t in TYPES {
        builder = builder.allowlist_type(t);
    }
    let bindings = builder.generate().unwrap_or_else(|e| {
        panic!(
            "\n\nlibxl-sys: bindgen could not process {}: {e}\n\
             bindgen needs libclang: install Debian's libclang-dev.\n",
            include.join("libxl.h").display()
        )
    });
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing the generated bindings");
}
