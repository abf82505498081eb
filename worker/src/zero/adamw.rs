//! AdamW (Loshchilov & Hutter 2019) on flat shards, with exactly the arithmetic of PyTorch's
//! single-tensor `AdamW` so runs can be compared against PyTorch references:
//!
//! ```text
//! p ← p·(1 − lr·wd)
//! m ← m + (1 − β1)(g − m)            v ← β2·v + (1 − β2)·g²
//! p ← p − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + ε)
//! ```
//!
//! `g` is the gradient shard times `grad_scale` (1 / loss scale for fp16). Weight decay applies to
//! every element of the shard, biases and norms included (the shard mixes them; this is what
//! DeepSpeed does with a single parameter group).
//!
//! On CPU the update is one pass over the shard in Rust, parallel over chunks, that also writes the
//! compute-precision copy of the parameters. On CUDA it is one fused kernel
//! ([`super::adamw_cuda`]), or, where NVRTC is missing, the same arithmetic composed of libtorch
//! operations.

use std::sync::Arc;

use rayon::prelude::*;
use tch::{Device, Kind, TchError, Tensor};
use zerobench_schema::config::OptimConfig;

use super::adamw_cuda::{Coeffs, FusedAdamW, Lane};
use crate::runtime::cuda::Gpu;

/// The tensors of one shard. `master`, `exp_avg` and `exp_avg_sq` are fp32; `grad` is in the
/// compute precision; `param_out` receives the updated parameters in the compute precision, or is
/// `None` when `master` is itself the parameter (fp32 training).
pub struct Shard<'a> {
    pub master: &'a Tensor,
    pub exp_avg: &'a Tensor,
    pub exp_avg_sq: &'a Tensor,
    pub grad: &'a Tensor,
    pub param_out: Option<&'a Tensor>,
}

pub struct AdamW {
    pub cfg: OptimConfig,
    fused: Option<FusedAdamW>,
}

const CHUNK: usize = 1 << 15;

impl AdamW {
    /// The optimizer for shards on CPU, or on `gpu` when given (fused kernel if NVRTC works).
    pub fn new(cfg: OptimConfig, gpu: Option<Arc<Gpu>>) -> Self {
        let fused = gpu.and_then(|g| match FusedAdamW::new(g) {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!("{e}; AdamW falls back to libtorch operations");
                None
            }
        });
        Self { cfg, fused }
    }

    /// Which implementation runs the update, for the `setup` record.
    pub fn implementation(&self, device: Device) -> &'static str {
        match (device, &self.fused) {
            (Device::Cpu, _) if wide_simd() => "rust-cpu-avx2",
            (Device::Cpu, _) => "rust-cpu",
            (_, Some(_)) => "cuda-fused",
            (_, None) => "torch-ops",
        }
    }

    fn coeffs(&self, t: u64, grad_scale: f64) -> Coeffs {
        Self::coeffs_for(&self.cfg, t, grad_scale)
    }

    /// The scalars of update number `t` (1-based) with gradients scaled by `grad_scale`.
    pub fn coeffs_for(c: &OptimConfig, t: u64, grad_scale: f64) -> Coeffs {
        let t = i32::try_from(t).unwrap_or(i32::MAX);
        let bc1 = 1.0 - c.beta1.powi(t);
        let bc2 = 1.0 - c.beta2.powi(t);
        Coeffs {
            decay: (1.0 - c.lr * c.weight_decay) as f32,
            one_minus_b1: (1.0 - c.beta1) as f32,
            b2: c.beta2 as f32,
            one_minus_b2: (1.0 - c.beta2) as f32,
            step_size: (c.lr / bc1) as f32,
            inv_bc2_sqrt: (1.0 / bc2.sqrt()) as f32,
            eps: c.eps as f32,
            grad_scale: grad_scale as f32,
        }
    }

    /// Applies update number `t` (1-based) to a shard, on the compute stream where on a GPU.
    pub fn step(&self, t: u64, grad_scale: f64, s: &Shard<'_>) -> Result<(), TchError> {
        match (s.master.device(), &self.fused) {
            (Device::Cpu, _) => {
                step_cpu(&self.coeffs(t, grad_scale), s);
                Ok(())
            }
            (_, Some(_)) => self.step_fused(t, grad_scale, s, Lane::InOrder),
            (_, None) => step_tensor_ops(&self.coeffs(t, grad_scale), s),
        }
    }

    /// Whether a GPU shard's update can run beside the backward ([`Self::step_beside`]): the fused
    /// kernel is there (libtorch's operations run on the compute stream only).
    pub fn runs_beside(&self) -> bool {
        self.fused.is_some()
    }

    /// [`Self::step`] of a GPU shard on the GPU's update stream ([`Lane::Beside`]); the caller
    /// orders it after the shard's gradient and before the parameters' next use.
    pub fn step_beside(&self, t: u64, grad_scale: f64, s: &Shard<'_>) -> Result<(), TchError> {
        self.step_fused(t, grad_scale, s, Lane::Beside)
    }

    /// The fused kernel's update of a GPU shard, launched as `lane` says.
    fn step_fused(&self, t: u64, grad_scale: f64, s: &Shard<'_>, lane: Lane) -> Result<(), TchError> {
        let Some(f) = &self.fused else {
            return Err(TchError::Torch("AdamW's fused kernel is not there (NVRTC)".into()));
        };
        let k = self.coeffs(t, grad_scale);
        f.step(&k, s.master, s.exp_avg, s.exp_avg_sq, s.grad, s.param_out, lane)
            .map_err(|e| TchError::Torch(e.to_string()))
    }
}

#[inline(always)]
fn update(k: &Coeffs, p: &mut f32, m: &mut f32, v: &mut f32, g: f32) {
    let g = g * k.grad_scale;
    *p *= k.decay;
    *m += k.one_minus_b1 * (g - *m);
    *v = k.b2 * *v + k.one_minus_b2 * g * g;
    let denom = v.sqrt() * k.inv_bc2_sqrt + k.eps;
    *p -= k.step_size * *m / denom;
}

/// A contiguous CPU tensor as a mutable slice.
///
/// # Safety
/// The tensor must be contiguous, of element type `T`, on the CPU, and not aliased elsewhere
/// during the borrow.
// A `&Tensor` is a handle; the elements live in libtorch's storage, which Rust's borrows do not
// cover, so handing out a mutable slice from a shared handle is the point of this helper.
#[allow(clippy::mut_from_ref)]
unsafe fn slice_mut<T>(t: &Tensor) -> &mut [T] {
    // SAFETY: forwarded contract.
    unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<T>(), t.numel()) }
}

/// Element types the CPU update reads gradients from and writes parameters to.
trait Float16Or32: Copy + Send + Sync {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl Float16Or32 for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Float16Or32 for half::bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    /// Round to nearest even, NaN kept NaN: written without branches so the loop vectorises
    /// (`half`'s conversion branches).
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        let u = v.to_bits();
        let rounded = (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16;
        let nan = (u & 0x7fff_ffff) > 0x7f80_0000;
        half::bf16::from_bits(if nan { 0x7fc0 } else { rounded })
    }
}

impl Float16Or32 for half::f16 {
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}

/// The update on CPU tensors, on the rayon pool.
pub fn step_cpu(k: &Coeffs, s: &Shard<'_>) {
    let n = s.master.numel();
    assert!(s.master.is_contiguous() && s.master.kind() == Kind::Float && s.master.device() == Device::Cpu);
    for t in [s.exp_avg, s.exp_avg_sq] {
        assert!(t.is_contiguous() && t.kind() == Kind::Float && t.numel() == n);
    }
    assert!(s.grad.is_contiguous() && s.grad.numel() == n);
    if let Some(o) = s.param_out {
        assert!(o.is_contiguous() && o.numel() == n);
    }
    match s.grad.kind() {
        Kind::Float => with_grad::<f32>(k, s),
        Kind::BFloat16 => with_grad::<half::bf16>(k, s),
        Kind::Half => with_grad::<half::f16>(k, s),
        other => panic!("gradient shard of type {other:?}"),
    }
}

fn with_grad<G: Float16Or32>(k: &Coeffs, s: &Shard<'_>) {
    match s.param_out.map(Tensor::kind) {
        None => update_slices::<G, f32>(k, s),
        Some(Kind::Float) => update_slices::<G, f32>(k, s),
        Some(Kind::BFloat16) => update_slices::<G, half::bf16>(k, s),
        Some(Kind::Half) => update_slices::<G, half::f16>(k, s),
        Some(other) => panic!("parameters of type {other:?}"),
    }
}

fn update_slices<G: Float16Or32, O: Float16Or32>(k: &Coeffs, s: &Shard<'_>) {
    // SAFETY: step_cpu checked that these are contiguous CPU tensors of `n` elements of the types
    // dispatched on; the engine allocates master, moments, gradients and output as distinct buffers
    // and nothing else touches them during the update.
    let (p, m, v, g) = unsafe {
        (
            slice_mut::<f32>(s.master),
            slice_mut::<f32>(s.exp_avg),
            slice_mut::<f32>(s.exp_avg_sq),
            &*slice_mut::<G>(s.grad),
        )
    };
    let chunks =
        p.par_chunks_mut(CHUNK).zip(m.par_chunks_mut(CHUNK)).zip(v.par_chunks_mut(CHUNK)).zip(g.par_chunks(CHUNK));
    let wide = wide_simd();
    match s.param_out {
        // SAFETY: as above.
        Some(o) => chunks
            .zip(unsafe { slice_mut::<O>(o) }.par_chunks_mut(CHUNK))
            .for_each(|((((p, m), v), g), o)| run_chunk(wide, k, p, m, v, g, Some(o))),
        None => chunks.for_each(|(((p, m), v), g)| run_chunk::<G, O>(wide, k, p, m, v, g, None)),
    }
}

/// Whether this CPU has AVX2 and FMA (8-wide f32 arithmetic): the chunks are then run by a copy of
/// the loop compiled for them. The default x86-64 target stops at SSE2.
fn wide_simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[inline(always)]
fn chunk_body<G: Float16Or32, O: Float16Or32>(
    k: &Coeffs,
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[G],
    o: Option<&mut [O]>,
) {
    let n = p.len();
    let (m, v, g) = (&mut m[..n], &mut v[..n], &g[..n]);
    match o {
        Some(o) => {
            let o = &mut o[..n];
            for i in 0..n {
                update(k, &mut p[i], &mut m[i], &mut v[i], g[i].to_f32());
                o[i] = O::from_f32(p[i]);
            }
        }
        None => {
            for i in 0..n {
                update(k, &mut p[i], &mut m[i], &mut v[i], g[i].to_f32());
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn chunk_avx2<G: Float16Or32, O: Float16Or32>(
    k: &Coeffs,
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[G],
    o: Option<&mut [O]>,
) {
    chunk_body(k, p, m, v, g, o);
}

fn run_chunk<G: Float16Or32, O: Float16Or32>(
    wide: bool,
    k: &Coeffs,
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[G],
    o: Option<&mut [O]>,
) {
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: `wide` is true only when the CPU has AVX2 and FMA.
        return unsafe { chunk_avx2(k, p, m, v, g, o) };
    }
    let _ = wide;
    chunk_body(k, p, m, v, g, o);
}

/// The same update as libtorch operations, for devices the Rust loop cannot touch.
fn step_tensor_ops(k: &Coeffs, s: &Shard<'_>) -> Result<(), TchError> {
    let _guard = tch::no_grad_guard();
    let g = s.grad.f_to_kind(Kind::Float)?;
    let g = if k.grad_scale == 1.0 { g } else { g.f_mul_scalar(f64::from(k.grad_scale))? };
    let mut p = s.master.shallow_clone();
    let mut m = s.exp_avg.shallow_clone();
    let mut v = s.exp_avg_sq.shallow_clone();
    let _ = p.f_mul_scalar_(f64::from(k.decay))?;
    let _ = m.f_lerp_(&g, f64::from(k.one_minus_b1))?;
    let _ = v.f_mul_scalar_(f64::from(k.b2))?;
    let _ = v.f_addcmul_(&g, &g.f_mul_scalar(f64::from(k.one_minus_b2))?)?;
    let denom = v.f_sqrt()?.f_mul_scalar(f64::from(k.inv_bc2_sqrt))?.f_add_scalar(f64::from(k.eps))?;
    let _ = p.f_sub_(&m.f_div(&denom)?.f_mul_scalar(f64::from(k.step_size))?)?;
    if let Some(out) = s.param_out {
        out.shallow_clone().f_copy_(&p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Rust loop and the libtorch composition agree, and both follow PyTorch's formula, checked
    /// against a hand computation for one element.
    #[test]
    fn cpu_loop_matches_tensor_ops_and_the_formula() {
        let opt = AdamW::new(OptimConfig { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 }, None);
        let n = 100_003;
        let (master, grad) = crate::model::with_seed(1, || {
            (Tensor::randn([n], (Kind::Float, Device::Cpu)), Tensor::randn([n], (Kind::Float, Device::Cpu)))
        });
        let (m, v) = (Tensor::zeros([n], (Kind::Float, Device::Cpu)), Tensor::zeros([n], (Kind::Float, Device::Cpu)));
        let (master2, m2, v2) = (master.copy(), m.copy(), v.copy());
        let out = Tensor::zeros([n], (Kind::BFloat16, Device::Cpu));
        let p0 = master.double_value(&[0]);
        let g0 = grad.double_value(&[0]);
        for t in 1..=3 {
            let s = Shard { master: &master, exp_avg: &m, exp_avg_sq: &v, grad: &grad, param_out: Some(&out) };
            opt.step(t, 0.5, &s).unwrap();
            let k = opt.coeffs(t, 0.5);
            let s2 = Shard { master: &master2, exp_avg: &m2, exp_avg_sq: &v2, grad: &grad, param_out: None };
            step_tensor_ops(&k, &s2).unwrap();
        }
        let diff = (&master - &master2).abs().max().double_value(&[]);
        assert!(diff < 1e-6, "{diff}");
        // bf16 keeps 8 significant bits: the copy is the master rounded to within 2^-8 relative.
        let rounding = (&out.to_kind(Kind::Float) - &master).abs() - master.abs() * 2f64.powi(-8);
        assert!(rounding.max().double_value(&[]) <= 0.0);
        // One element by hand (first step): m = 0.1 g', v = 0.05 g'^2, p = p0(1-1e-3) - 1e-2 * sign(g')
        let mut p = p0 as f32;
        let (mut mm, mut vv) = (0.0f32, 0.0f32);
        update(&opt.coeffs(1, 0.5), &mut p, &mut mm, &mut vv, g0 as f32);
        let expect = p0 * (1.0 - 1e-3) - 1e-2 * (0.5 * g0).signum() * (1.0 / (1.0 + 1e-8 / (0.5 * g0).abs()));
        assert!((f64::from(p) - expect).abs() < 1e-5, "{p} vs {expect}");
    }
}
