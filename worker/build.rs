//! Compiles the two small native helpers of the worker:
//! * `shim/torch_shim.cpp` against the libtorch headers in `$LIBTORCH` (what tch lacks), the same
//!   way torch-sys compiles its own C++ (C++17, the cxx11 ABI), with c10d's Gloo process group
//!   enabled and the Gloo headers it needs from `shim/third_party/gloo`, and the CUDA runtime's
//!   headers for libc10_cuda's;
//! * `shim/mpi_shim.c` against the MPI headers that `mpicc` reports.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=shim/torch_shim.cpp");
    println!("cargo:rerun-if-changed=shim/mpi_shim.c");
    println!("cargo:rerun-if-changed=shim/third_party/gloo");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    // Which checkout's sources these objects are (runtime/shim.rs holds it equal to the crate's):
    // two checkouts sharing a target folder share this script's output, and cargo reruns the
    // script only when the sources are newer than its last run, whichever checkout that was.
    println!(
        "cargo:rustc-env=ZEROBENCH_SHIM_SOURCES={}",
        env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")
    );

    let libtorch = PathBuf::from(
        env::var("LIBTORCH")
            .expect("LIBTORCH must point at libtorch 2.11.0 (run `make setup`, then `eval \"$(make -s env)\"`)"),
    );
    cc::Build::new()
        .cpp(true)
        .file("shim/torch_shim.cpp")
        .include(libtorch.join("include"))
        .include(libtorch.join("include/torch/csrc/api/include"))
        // libc10_cuda's headers include the CUDA runtime's (`make setup` unpacks them).
        .include(libtorch.join("cuda-include"))
        .include("shim/third_party/gloo")
        // What libtorch_cpu is built with: without it ProcessGroupGloo.hpp declares nothing.
        .define("USE_C10D_GLOO", None)
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .flag_if_supported("-Wno-unused-parameter")
        .warnings(false)
        .compile("zb_torch_shim");
    println!("cargo:rustc-link-search=native={}", libtorch.join("lib").display());
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=c10_cuda");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");

    let mut mpi = cc::Build::new();
    mpi.file("shim/mpi_shim.c");
    for inc in mpi_include_dirs() {
        mpi.include(inc);
    }
    mpi.compile("zb_mpi_shim");
}

/// Include directories of the MPI that rsmpi links, from the compiler wrapper.
fn mpi_include_dirs() -> Vec<PathBuf> {
    for args in [&["-showme:incdirs"][..], &["-show"][..]] {
        if let Ok(out) = Command::new("mpicc").args(args).output() {
            if out.status.success() {
                let text = String::from_utf8_lossy(&out.stdout);
                let dirs: Vec<PathBuf> = if args[0] == "-showme:incdirs" {
                    text.split_whitespace().map(PathBuf::from).collect()
                } else {
                    text.split_whitespace().filter_map(|w| w.strip_prefix("-I")).map(PathBuf::from).collect()
                };
                if !dirs.is_empty() {
                    return dirs;
                }
            }
        }
    }
    panic!("cannot find the MPI headers: `mpicc` is missing (run `make setup`)");
}
