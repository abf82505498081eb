//! The worker's own CUDA kernels are compiled at start with NVRTC (the GPU hosts have no CUDA
//! toolkit): the compile step, and the 16-bit float conversions every kernel shares, so bf16 is
//! rounded one way everywhere. 16-bit values are handled as `unsigned short` with explicit
//! conversions, so no CUDA header is needed.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, DriverError};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use tch::Kind;

use super::cuda::Gpu;

/// `bf2f`/`f2bf` (bf16, round to nearest even, NaN kept), `h2f`/`f2h` (fp16), `f2f` (fp32).
///
/// From compute capability 8.0 `f2bf` is the hardware's conversion (`cvt.rn.bf16.f32`), one
/// instruction where rounding by hand takes six: the sm_90 code of the kernels that round every
/// element is 19% (the GELU's gradient) to 37% (the layer norm's backward at 1600 columns)
/// shorter. Older GPUs round by hand. It rounds every number as libtorch does (the GPU self-check's `bf16_rounding` compares all 2^32
/// inputs); a NaN comes out as the canonical 0x7fff where libtorch writes 0x7fc0, both NaN.
const CONVERSIONS: &str = r#"
__device__ __forceinline__ float bf2f(unsigned short x) { return __uint_as_float(((unsigned int)x) << 16); }
__device__ __forceinline__ unsigned short f2bf(float f) {
#if __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0; /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                  /* round to nearest even */
    return (unsigned short)(u >> 16);
#endif
}
__device__ __forceinline__ float h2f(unsigned short x) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float f2f(float x) { return x; }
"#;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("NVRTC could not compile the kernels: {0}")]
    Compile(String),
    #[error("CUDA: {0}")]
    Cuda(#[from] DriverError),
}

/// Compiles `source` (after the shared conversions) to PTX for compute capability `arch`
/// (`(9, 0)` for H100 and H200).
pub fn compile(source: &str, arch: (i32, i32)) -> Result<Ptx, KernelError> {
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", arch.0, arch.1)],
        ..Default::default()
    };
    let full = format!("{CONVERSIONS}{source}");
    // NVRTC is loaded on first use; a host without it fails here, not at start-up.
    std::panic::catch_unwind(|| compile_ptx_with_opts(full, opts))
        .map_err(|_| KernelError::Compile("libnvrtc could not be loaded".into()))?
        .map_err(|e| KernelError::Compile(format!("{e:?}")))
}

/// Compiles `source` for `gpu`'s architecture and loads it into its context.
pub fn load(gpu: &Gpu, source: &str) -> Result<Arc<CudaModule>, KernelError> {
    let arch = gpu.ctx.compute_capability()?;
    Ok(gpu.ctx.load_module(compile(source, arch)?)?)
}

/// The precisions every kernel of the worker is instantiated for, in the order of [`Instances`];
/// the instances' names end in `_bf16`, `_f16` and `_f32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Bf16 = 0,
    F16 = 1,
    F32 = 2,
}

impl Precision {
    pub const SUFFIX: [&'static str; 3] = ["bf16", "f16", "f32"];

    /// The precision of tensors of `kind`, if the kernels have one.
    pub fn of(kind: Kind) -> Option<Self> {
        match kind {
            Kind::BFloat16 => Some(Self::Bf16),
            Kind::Half => Some(Self::F16),
            Kind::Float => Some(Self::F32),
            _ => None,
        }
    }

    /// Elements per 16-byte load.
    pub fn vector(self) -> i64 {
        match self {
            Self::Bf16 | Self::F16 => 8,
            Self::F32 => 4,
        }
    }
}

/// One kernel of a module in each [`Precision`].
pub struct Instances([CudaFunction; 3]);

impl Instances {
    /// `name_bf16`, `name_f16` and `name_f32` of `module`.
    pub fn load(module: &Arc<CudaModule>, name: &str) -> Result<Self, DriverError> {
        let f = |p: usize| module.load_function(&format!("{name}_{}", Precision::SUFFIX[p]));
        Ok(Self([f(0)?, f(1)?, f(2)?]))
    }

    pub fn get(&self, p: Precision) -> &CudaFunction {
        &self.0[p as usize]
    }

    pub fn all(&self) -> &[CudaFunction; 3] {
        &self.0
    }
}

/// `gpu`'s streaming multiprocessors, which the kernels size their grids by.
pub fn multiprocessors(gpu: &Gpu) -> Result<u32, DriverError> {
    let n = gpu.ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    Ok(u32::try_from(n).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    /// Every kernel source of the worker compiles (NVRTC needs no GPU; `make setup` puts it
    /// beside libtorch), for the Hopper GPUs the benchmarks run on.
    #[test]
    fn every_kernel_compiles() {
        for (name, source) in [
            ("adamw", crate::zero::adamw_cuda::SOURCE),
            ("peer_copy", crate::comm::peer_copy::SOURCE),
            ("cross_entropy", crate::model::lm_head_cuda::SOURCE),
            ("node kernels", crate::model::recompute_cuda::SOURCE),
            // The layer norm's kernel at the GPT-2 presets' widths and at its limit.
            ("layer norm 768", &format!("#define COLS 768\n{}", crate::model::recompute_cuda::LN_SOURCE)),
            ("layer norm 1600", &format!("#define COLS 1600\n{}", crate::model::recompute_cuda::LN_SOURCE)),
            (
                "layer norm at its limit",
                &format!(
                    "#define COLS {}\n{}",
                    crate::model::recompute_cuda::MAX_COLS,
                    crate::model::recompute_cuda::LN_SOURCE
                ),
            ),
        ] {
            let ptx = super::compile(source, (9, 0)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(ptx.to_src().contains(".entry"), "{name}: no kernel in the PTX");
        }
    }

    /// `f2bf` is the hardware's conversion from compute capability 8.0 and rounds by hand before
    /// it: both branches compile, and each architecture gets its own.
    #[test]
    fn bf16_rounding_is_the_hardwares_from_compute_capability_8() {
        let source = r#"extern "C" __global__ void r(const float* x, unsigned short* y) { y[0] = f2bf(x[0]); }"#;
        for (arch, hardware) in [((7, 5), false), ((8, 0), true), ((9, 0), true)] {
            let ptx = super::compile(source, arch).unwrap_or_else(|e| panic!("{arch:?}: {e}")).to_src();
            assert_eq!(ptx.contains("cvt.rn.bf16.f32"), hardware, "{arch:?}");
        }
    }

    /// ptxas's report on `source` (after the shared conversions) compiled through NVRTC to Hopper's
    /// machine code (sm_90): each entry's name, registers, and bytes of registers spilled (stores
    /// and loads). On an H200 the driver's compiler reported the same register counts for the layer
    /// norm's kernels (the GPU self-check's `ln_registers`, 2026-12-02).
    fn sm90_report(source: &str) -> Vec<(String, u32, u32)> {
        use cudarc::nvrtc::result;
        let full = std::ffi::CString::new(format!("{}{source}", super::CONVERSIONS)).unwrap();
        let prog = result::create_program(&full, None).unwrap();
        // SAFETY: a live program, destroyed once its log is read.
        let log = unsafe {
            let compiled = result::compile_program(prog, &["--gpu-architecture=sm_90", "--ptxas-options=-v"]);
            let log = result::get_program_log(prog).unwrap();
            result::destroy_program(prog).unwrap();
            compiled.unwrap_or_else(|e| panic!("{e:?}"));
            log
        };
        let log: Vec<u8> = log.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        let log = String::from_utf8_lossy(&log);
        // "Compiling entry function 'NAME' ...", then "... N bytes spill stores, M bytes spill
        // loads" and "Used R registers, ..." for it.
        let number_before = |line: &str, what: &str| -> Option<u32> {
            let head = &line[..line.find(what)?];
            head.split_whitespace().last()?.parse().ok()
        };
        let mut entries: Vec<(String, u32, u32)> = Vec::new();
        for line in log.lines() {
            if let Some(rest) = line.split("Compiling entry function '").nth(1) {
                let name = rest.split('\'').next().unwrap_or_default().to_string();
                entries.push((name, 0, 0));
            } else if let Some(entry) = entries.last_mut() {
                if let (Some(st), Some(ld)) =
                    (number_before(line, "bytes spill stores"), number_before(line, "bytes spill loads"))
                {
                    entry.2 = st + ld;
                }
                if let Some(r) = number_before(line, "registers") {
                    entry.1 = r;
                }
            }
        }
        entries
    }

    /// No kernel of the worker spills registers on Hopper: the layer norm's at the GPT-2 presets'
    /// widths and at its limit (a lane holds its share of a row in registers), and every other.
    #[test]
    fn no_kernel_spills_registers_on_hopper() {
        let ln = |cols: i64| format!("#define COLS {cols}\n{}", crate::model::recompute_cuda::LN_SOURCE);
        let mut sources: Vec<(String, String)> = vec![
            ("adamw".into(), crate::zero::adamw_cuda::SOURCE.into()),
            ("peer_copy".into(), crate::comm::peer_copy::SOURCE.into()),
            ("cross_entropy".into(), crate::model::lm_head_cuda::SOURCE.into()),
            ("node kernels".into(), crate::model::recompute_cuda::SOURCE.into()),
            ("graph fill".into(), crate::runtime::graph::FILL_SOURCE.into()),
        ];
        for cols in [768, 1024, 1280, 1600, crate::model::recompute_cuda::MAX_COLS] {
            sources.push((format!("layer norm {cols}"), ln(cols)));
        }
        for (name, source) in &sources {
            let report = sm90_report(source);
            // Every kernel names its registers: the report was read.
            assert!(!report.is_empty() && report.iter().all(|(_, registers, _)| *registers > 0), "{name}: {report:?}");
            if name == "graph fill" {
                // The one entry the graphs' memset nodes become (`runtime::graph`).
                assert_eq!(report.iter().map(|(n, _, _)| n.as_str()).collect::<Vec<_>>(), ["graph_fill"]);
            }
            if name.starts_with("layer norm") {
                // Its six kernels: forward and backward, three precisions.
                assert_eq!(report.len(), 6, "{name}: {report:?}");
            }
            let spilled: Vec<_> = report.iter().filter(|(_, _, bytes)| *bytes > 0).collect();
            assert!(spilled.is_empty(), "{name}: spills registers: {spilled:?}");
        }
    }

    /// Every kernel the worker loads with [`super::Instances`] is an entry of its module in each
    /// precision (a name `Instances::load` builds and the source does not define would only fail
    /// on a GPU).
    #[test]
    fn every_instance_is_in_its_module() {
        let ln = format!("#define COLS 768\n{}", crate::model::recompute_cuda::LN_SOURCE);
        for (source, names) in [
            (crate::zero::adamw_cuda::SOURCE, &["adamw", "adamw_vec"][..]),
            (crate::model::lm_head_cuda::SOURCE, &["cross_entropy"][..]),
            (crate::model::recompute_cuda::SOURCE, crate::model::recompute_cuda::INSTANCES),
            (ln.as_str(), crate::model::recompute_cuda::LN_INSTANCES),
        ] {
            let ptx = super::compile(source, (9, 0)).unwrap().to_src();
            for name in names {
                for suffix in super::Precision::SUFFIX {
                    let entry = format!(".entry {name}_{suffix}(");
                    assert!(ptx.contains(&entry), "{name}_{suffix} is not an entry of its module");
                }
            }
        }
    }
}
