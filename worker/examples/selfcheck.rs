//! GPU self-check of the worker's device code, run on a GPU host by `bench/gpu/run.sh selfcheck`
//! (CI has no GPU): one JSON line per check, then a summary line; exit 1 if any check fails.
//!
//! * `adamw`: the fused CUDA AdamW kernel against the CPU AdamW (the code offload runs) on the same
//!   random shards, five updates, for fp32, bf16 and fp16 gradients (fp32 updates its master in
//!   place; bf16 and fp16 also write the parameters in their precision), with and without weight
//!   decay, at an odd size, at 2^20 and at one element. The largest difference in master weights
//!   and moments must be within [`STATE_ULPS`] units in the last place of the tensor's largest
//!   element (a normwise bound: where a value cancels to nearly zero, as Adam's first moment and
//!   small weights do, two correct roundings of the same sum are many ulps of that tiny value
//!   apart, so the per-element figure is reported but not bounded). The 16-bit parameters must be
//!   the kernel's own master weights rounded to nearest even, bit for bit; against the CPU's they
//!   are reported, not bounded (where a weight is near zero, masters a few fp32 ulps apart round to
//!   16-bit values more than one of their ulps apart). The two updates differ only in where the
//!   compilers contract multiply-adds. The device tensors start on the vector loads' boundary,
//!   except in one case at the odd size, which starts one element past it.
//! * `adamw_loads`: the kernel with four elements per load and the one with one element per load
//!   (shards not aligned for vectors) give the same bits: the same shard, five updates, fp32, bf16
//!   and fp16 gradients.
//! * `pinned_round_trip`: a page-locked host buffer of an odd size, copied to the device and back
//!   through the engine's copies (`NcclCollectives::copy_to_device` / `copy_to_host`), bit-exact.
//! * `upload_order`: host-to-device copies run on a stream of their own; a copy on the
//!   communication stream issued right after one, reading what it writes (256 MiB), sees every
//!   uploaded value, and the host source overwritten once the upload's `HostCopy` has been waited
//!   for does not reach the device.
//! * `host_state_setup`: offload's host state set up: master weights and bf16 parameters equal
//!   to the shard, moments and gradients zero; what the device copies (master weights, gradient,
//!   bf16 parameters) page-locked, what only the host's update touches (moments, accumulator) not.
//! * `event_clock`: CUDA events on the compute stream against the host clock around the same
//!   synchronised work (bf16 matrix products, about 30 ms): the events may not exceed the host's
//!   interval and must cover at least 90% of it.
//! * `step_clock`: the step-time definition on a synthetic step whose device work outlasts its
//!   issue: the host is done issuing long before the device is done, and `StepClock::finish`
//!   (the end of every step) returns only after the device work, so the step covers it.
//! * `nvml`: the monitor's readings are present and plausible (memory used within the card's,
//!   power between 1 W and 2 kW, utilisation a percentage).
//! * `bf16_rounding`: the kernels' conversion to bf16 (`f2bf` of `runtime::kernels`, the hardware's
//!   on this GPU) against libtorch's, for every one of the 2^32 fp32 bit patterns: the same bits
//!   for every number (infinities and subnormals included), and NaN for every NaN.
//! * `lm_head`: the chunked LM head with the fused cross-entropy kernel against the head composed
//!   of libtorch operations (fp32 loss, autograd) on the same GPU, GPT-2's vocabulary of 50257,
//!   ignored targets: in fp32 the loss within 1e-5 and both gradients within 1e-4
//!   relative (normwise); in bf16 and fp16 within 2e-3 for the loss and 2e-2 for the gradients
//!   (16-bit rounding of the gradients, summed over chunks); in three chunks and in one. The
//!   kernel must be the one used, and in 16 bits each chunk's three products must run through
//!   the timed cuBLASLt plans. On a thread whose libtorch computes on another stream than the
//!   compute stream, the same bf16 head in three chunks must run none of its products through
//!   the plans nor its loss through the kernel (both run on the compute stream), and give the same
//!   loss and gradients.
//! * `recompute`: GPT-2's recomputing nodes (`model::recompute`) against the operations they
//!   stand for, composed on the same GPU, for one block's shapes in fp32 and bf16: the outputs
//!   and every input's gradient within 1e-5 (fp32) or 2e-2 (bf16) relative (normwise). What each
//!   node keeps for its backward pass (what its forward pass leaves allocated once the allocator
//!   has settled every free, less its output) must equal what the same operations leave when run
//!   without autograd holding only the output and, for the MLP, the GELU's input; the composed
//!   operations must keep more. The result records how much more, beside the bytes of the tensors
//!   recomputed (the normalised input, the GELU's output; the layer norm's statistics are kept,
//!   and the plain operations hold tensors of their sizes too): in bf16
//!   the plain operations hold 1 MiB more than their tensors at this shape, which the node's
//!   figure shares. In 16 bits the MLP's two products must run with cuBLASLt's epilogues
//!   (`model::products_cuda`): the GELU after the first, the residual addition in the second;
//!   and every other product of the nodes through cuBLASLt as well (the backward's, and
//!   `ln_linear`'s forward with its bias).
//! * `attention_residual`: the attention sub-block's two nodes joined as GPT-2 joins them
//!   (`ln_linear` gives q, k and v apart, joins their gradients with the bias gradient's column
//!   sums in one kernel, and passes x on to `residual_linear`, whose residual gradient then joins
//!   x's in the layer norm's backward kernel), causal attention between, against the composed
//!   operations (libtorch's split of one product), in fp32 (768 wide) and bf16 (1600): the output
//!   and every input's gradient within 1e-5 or 2e-2 relative, every kernel of both nodes taken.
//! * `ln_recomputed`: the layer norm's output as its backward kernel recomputes it (from the
//!   forward's mean and deviation, for the weight gradient after it) bit-identical to the forward
//!   kernel's, in bf16, fp16 and fp32 at the GPT-2 presets' widths (768, 1024, 1280, 1600) and
//!   `MAX_COLS` (4101 rows); and `ln_registers`: none of the layer norm's kernels at those widths
//!   spills registers to local memory.
//! * `lt_products`: the nodes' plain products through the worker's plans, the fastest of
//!   cuBLASLt's algorithms and libtorch's call timed at a shape's first product
//!   (`LtProducts::matmul`), each operand as rows or a `.t()` view, with and
//!   without a bias, against libtorch's product in bf16 within 1e-2 relative (normwise); the
//!   second product of a shape gives the first one's bits; an output that is also an input, and
//!   fp32 operands, are declined.
//! * `grad_in_place`: the MLP node with its six parameters' gradients placed in a flat buffer
//!   (`shim::grad_into`, as the engine places them) at gpt2-xl's widths: in fp32 and bf16 every
//!   placed gradient (the weights' products, the bias and layer-norm kernels' sums) is the
//!   unplaced node's bits, every `.grad` stays empty, and a second backward placed to add (a
//!   later micro-step: the weights' products add in place, the vectors go back to autograd)
//!   leaves the sum of both within 1e-6 (fp32) or 1e-2 (bf16) relative (normwise; one rounding
//!   of the sum instead of two).
//! * `in_backward`: `shim::run_in_backward` on the GPU runs its function on libtorch's autograd
//!   thread (`pt_autograd_*`), not the caller's, and a backward pass the function runs there
//!   (reentrant, as the trainer's segments) lands the right gradients on the GPU.
//! * `graph_memsets`: a captured graph's memsets of up to `FILL_MAX_BYTES` (32-, 16- and 8-bit, one
//!   of them over part of each row) replayed as kernel nodes write what the memsets wrote, before a
//!   kernel captured after them reads it; a larger memset stays a memset node.
//! * `cuda_graph`: a forward and backward through autograd (its device thread included) captured
//!   with `runtime::graph` on a stream of the rank's own, replayed on three new inputs written
//!   where the graph reads: loss and gradient bit-identical to the same operations run eagerly,
//!   and nothing allocated by a replay. A capture whose work reads a value back to the host fails
//!   with an error, and the stream captures and replays again afterwards. Runs last: it makes
//!   libtorch compute on that stream from then on.
//! * `update_beside`: AdamW beside a replayed backward (`zero::beside`): the urgent stream's
//!   priority above the update stream's; a copy on the update stream after an event recorded
//!   inside a graph (between two runs of products) reads what each of four replays on the urgent
//!   stream wrote before it; three updates beside give the in-order updates' bits (master, moments,
//!   bf16 copy). Runs after `cuda_graph`, on its stream.
//!
//! `mpirun -np 1 target/release/examples/selfcheck`

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use tch::{Device, Kind, Tensor};
use zerobench_schema::config::OptimConfig;
use zerobench_worker::comm::group::HostGroup;
use zerobench_worker::comm::nccl::NcclCollectives;
use zerobench_worker::comm::Collectives;
use zerobench_worker::metrics::clock::{StepClock, StepPhase};
use zerobench_worker::metrics::gpu_monitor::GpuMonitor;
use zerobench_worker::runtime::{cuda, device, identity, pinned, shim};
use zerobench_worker::zero::adamw::{step_cpu, AdamW, Shard};
use zerobench_worker::zero::offload::HostState;

/// Largest difference allowed between the kernel's and the CPU's fp32 master weights and moments,
/// in units in the last place of the tensor's largest element.
const STATE_ULPS: f64 = 16.0;

/// A float's position on the number line in units in the last place (sign-magnitude to ordered).
fn ordered(bits: u32) -> i64 {
    let magnitude = i64::from(bits & 0x7fff_ffff);
    if bits & 0x8000_0000 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

fn ordered16(bits: u16) -> i64 {
    let magnitude = i64::from(bits & 0x7fff);
    if bits & 0x8000 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

fn f32s(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(&t.to_device(Device::Cpu).contiguous()).expect("fp32 tensor")
}

fn u16s(t: &Tensor) -> Vec<u16> {
    let raw = Vec::<i16>::try_from(&t.to_device(Device::Cpu).contiguous().view_dtype(Kind::Int16)).expect("16-bit");
    raw.into_iter().map(|x| x as u16).collect()
}

fn max_ulps_f32(a: &[f32], b: &[f32]) -> i64 {
    a.iter().zip(b).map(|(x, y)| (ordered(x.to_bits()) - ordered(y.to_bits())).abs()).max().unwrap_or(0)
}

/// The largest difference, in units in the last place of `b`'s largest element.
fn scaled_ulps(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    if scale == 0.0 {
        return if diff == 0.0 { 0.0 } else { f64::INFINITY };
    }
    f64::from(diff) / (f64::from(scale) * f64::from(f32::EPSILON))
}

fn max_ulps_16(a: &[u16], b: &[u16]) -> i64 {
    a.iter().zip(b).map(|(x, y)| (ordered16(*x) - ordered16(*y)).abs()).max().unwrap_or(0)
}

struct Report {
    failed: usize,
    checks: usize,
}

impl Report {
    fn check(&mut self, name: &str, ok: bool, detail: serde_json::Value) {
        self.checks += 1;
        if !ok {
            self.failed += 1;
        }
        println!("{}", json!({"check": name, "ok": ok, "detail": detail}));
    }
}

/// A copy of the flat tensor `t` on the GPU that starts `shift` elements into its allocation
/// (one past the boundary of the AdamW kernel's vector loads when `shift` is 1).
fn shifted_copy(t: &Tensor, shift: i64) -> Tensor {
    let n = t.numel() as i64;
    let room = Tensor::zeros([n + shift], (t.kind(), Device::Cuda(0)));
    let mut view = room.narrow(0, shift, n);
    view.copy_(t);
    view
}

fn adamw(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    let cuda = Device::Cuda(0);
    for grad_kind in [Kind::Float, Kind::BFloat16, Kind::Half] {
        for weight_decay in [0.0, 0.1] {
            // Elements: a tail of 3 after whole vectors of 4, whole vectors only, one; `shift`
            // starts every device tensor one element into its allocation, which the
            // one-element-per-load kernel takes.
            for (n, shift) in [(1_000_003i64, 0i64), (1_048_576, 0), (1, 0), (1_000_003, 1)] {
                let cfg = OptimConfig { weight_decay, ..OptimConfig::default() };
                let opt = AdamW::new(cfg, Some(Arc::clone(gpu)));
                tch::manual_seed(7);
                let master = (Tensor::randn([n], (Kind::Float, Device::Cpu)) * 0.02).contiguous();
                let (m, v) = (master.zeros_like(), master.zeros_like());
                let on_device = |t: &Tensor| shifted_copy(t, shift);
                let (dmaster, dm, dv) = (on_device(&master), on_device(&m), on_device(&v));
                let mixed = grad_kind != Kind::Float;
                let out = mixed.then(|| master.to_kind(grad_kind));
                let dout = out.as_ref().map(on_device);
                for t in 1..=5u64 {
                    let grad = (Tensor::randn([n], (Kind::Float, Device::Cpu)) * 0.01).to_kind(grad_kind).contiguous();
                    let dgrad = on_device(&grad);
                    let host =
                        Shard { master: &master, exp_avg: &m, exp_avg_sq: &v, grad: &grad, param_out: out.as_ref() };
                    step_cpu(&AdamW::coeffs_for(&cfg, t, 1.0), &host);
                    let dev = Shard {
                        master: &dmaster,
                        exp_avg: &dm,
                        exp_avg_sq: &dv,
                        grad: &dgrad,
                        param_out: dout.as_ref(),
                    };
                    opt.step(t, 1.0, &dev).expect("the fused update");
                }
                let pairs = [(f32s(&dmaster), f32s(&master)), (f32s(&dm), f32s(&m)), (f32s(&dv), f32s(&v))];
                let states = pairs.each_ref().map(|(a, b)| scaled_ulps(a, b));
                let elementwise = pairs.each_ref().map(|(a, b)| max_ulps_f32(a, b));
                // The 16-bit parameters: against the kernel's own master weights, rounded by libtorch
                // (nearest even, as the kernel rounds), and against the CPU's.
                let (own, cpu) = match (&dout, &out) {
                    (Some(d), Some(h)) => {
                        let rounded = dmaster.to_kind(grad_kind);
                        (max_ulps_16(&u16s(d), &u16s(&rounded)), max_ulps_16(&u16s(d), &u16s(h)))
                    }
                    _ => (0, 0),
                };
                let fused = opt.implementation(cuda) == "cuda-fused";
                let ok = fused && states.iter().all(|u| *u <= STATE_ULPS) && own == 0;
                r.check(
                    "adamw",
                    ok,
                    json!({"grad": format!("{grad_kind:?}"), "weight_decay": weight_decay, "elements": n,
                           "elements_into_allocation": shift, "updates": 5,
                           "implementation": opt.implementation(cuda),
                           "max_ulps_of_scale": {"master": states[0], "exp_avg": states[1], "exp_avg_sq": states[2]},
                           "max_ulps_elementwise": {"master": elementwise[0], "exp_avg": elementwise[1], "exp_avg_sq": elementwise[2]},
                           "param_out_ulps_from_own_master": own, "param_out_ulps_from_cpu": cpu,
                           "bound": {"states_ulps_of_scale": STATE_ULPS, "param_out_ulps_from_own_master": 0}}),
                );
            }
        }
    }
}

/// The update with four elements per load and with one give the same bits: the same random shard
/// updated five times from a start aligned for the vector loads and from one element past it.
fn adamw_loads(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    let cuda = Device::Cuda(0);
    let n = 1_000_003i64;
    for grad_kind in [Kind::Float, Kind::BFloat16, Kind::Half] {
        let opt = AdamW::new(OptimConfig { weight_decay: 0.1, ..OptimConfig::default() }, Some(Arc::clone(gpu)));
        tch::manual_seed(11);
        let master = (Tensor::randn([n], (Kind::Float, Device::Cpu)) * 0.02).to_device(cuda);
        let grads: Vec<Tensor> = (0..5)
            .map(|_| (Tensor::randn([n], (Kind::Float, Device::Cpu)) * 0.01).to_kind(grad_kind).to_device(cuda))
            .collect();
        let run = |shift: i64| {
            let place = |t: &Tensor| shifted_copy(t, shift);
            let (p, m, v) = (place(&master), place(&master.zeros_like()), place(&master.zeros_like()));
            let out = (grad_kind != Kind::Float).then(|| place(&master.to_kind(grad_kind)));
            for (t, g) in grads.iter().enumerate() {
                let g = place(g);
                let shard = Shard { master: &p, exp_avg: &m, exp_avg_sq: &v, grad: &g, param_out: out.as_ref() };
                opt.step(t as u64 + 1, 1.0, &shard).expect("the fused update");
            }
            let out16 = out.as_ref().map(u16s).unwrap_or_default();
            ([f32s(&p), f32s(&m), f32s(&v)], out16)
        };
        let (vector, single) = (run(0), run(1));
        let same = vector == single;
        r.check(
            "adamw_loads",
            same,
            json!({"grad": format!("{grad_kind:?}"), "elements": n, "updates": 5,
                   "bits_equal": same, "bound": "every state and parameter bit equal"}),
        );
    }
}

fn pinned_round_trip(r: &mut Report, gpu: &Arc<cuda::Gpu>, comm: &mut NcclCollectives) {
    let n = 3_000_017i64;
    let src = Tensor::randn([n], (Kind::BFloat16, Device::Cpu)).contiguous();
    let host_in = pinned::host_zeros(n, Kind::BFloat16).expect("host buffer");
    host_in.shallow_clone().copy_(&src);
    let host_out = pinned::host_zeros(n, Kind::BFloat16).expect("host buffer");
    let _pins = pinned::pin_all(gpu, &[&host_in, &host_out]).expect("page-locked");
    let dev = Tensor::zeros([n], (Kind::BFloat16, Device::Cuda(0)));
    let (p, read) = comm.copy_to_device(&host_in, &dev).expect("h2d");
    read.wait().expect("read");
    comm.wait(p).expect("wait");
    let (p, landed) = comm.copy_to_host(&dev, &host_out).expect("d2h");
    comm.wait(p).expect("wait");
    landed.wait().expect("landed");
    let mismatches = u16s(&src).iter().zip(u16s(&host_out)).filter(|(a, b)| **a != *b).count();
    r.check("pinned_round_trip", mismatches == 0, json!({"elements": n, "mismatches": mismatches}));
}

/// An upload runs on a stream of its own: an operation on the communication stream issued right
/// after it that reads what it writes must still see the uploaded values, and once the upload's
/// `HostCopy` is waited for the host source may be overwritten without the device seeing it.
/// 256 MiB, so that a copy that did not wait would read the buffer mid-upload.
fn upload_order(r: &mut Report, gpu: &Arc<cuda::Gpu>, comm: &mut NcclCollectives) {
    let n = 128 << 20;
    let src = Tensor::randn([n], (Kind::BFloat16, Device::Cpu)).contiguous();
    let host = pinned::host_zeros(n, Kind::BFloat16).expect("host buffer");
    host.shallow_clone().copy_(&src);
    let _pins = pinned::pin_all(gpu, &[&host]).expect("page-locked");
    let dev = Tensor::zeros([n], (Kind::BFloat16, Device::Cuda(0)));
    let dup = Tensor::zeros([n], (Kind::BFloat16, Device::Cuda(0)));
    let (up, read) = comm.copy_to_device(&host, &dev).expect("h2d");
    // Reads `dev` on the communication stream: it must wait for the upload.
    let copied = comm.copy_device(&dev, &dup).expect("d2d");
    read.wait().expect("read");
    let _ = host.shallow_clone().fill_(0.0);
    comm.wait(copied).expect("wait");
    comm.wait(up).expect("wait");
    let expect = src.to_device(Device::Cuda(0));
    let count = |t: &Tensor| t.ne_tensor(&expect).sum(Kind::Int64).int64_value(&[]);
    let (uploaded, copied) = (count(&dev), count(&dup));
    r.check(
        "upload_order",
        uploaded == 0 && copied == 0,
        json!({"elements": n, "mismatches_uploaded": uploaded, "mismatches_copied_after": copied}),
    );
}

/// Offload's host state set up (its pages faulted in by the kernel): the master weights and the
/// bf16 parameters hold the shard, the moments, gradient and accumulator are zero, and only what
/// the device copies is page-locked.
/// The state comes from fresh mappings the kernel gives zeroed; that nothing writes them before
/// the fault-in and that the fault-in changes no byte are the unit tests
/// `host_tensors_are_untouched_zeros_until_faulted_in_and_then_all_resident` and
/// `faulting_in_keeps_every_byte_either_way` (`runtime::pinned`).
fn host_state_setup(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    let n = 50_000_017i64;
    let shard = Tensor::randn([n], (Kind::Float, Device::Cuda(0)));
    let state = HostState::new(&shard, Kind::BFloat16, true, true, Some(gpu)).expect("host state");
    let host_shard = shard.to_device(Device::Cpu);
    let nonzero = |t: &Tensor| t.count_nonzero(0).int64_value(&[]);
    let moments = [&state.exp_avg, &state.exp_avg_sq, &state.grad].into_iter().chain(&state.grad_acc);
    let nonzero_left = moments.map(nonzero).sum::<i64>();
    let master_ok = state.master.equal(&host_shard);
    let param_ok = state.param.as_ref().is_some_and(|p| p.equal(&host_shard.to_kind(Kind::BFloat16)));
    // What the device copies is page-locked, what only the host's update touches is not.
    let copied_locked = state.copied().iter().all(|t| pinned::is_locked(t));
    let host_only_unlocked = state.host_only().iter().all(|t| !pinned::is_locked(t));
    r.check(
        "host_state_setup",
        nonzero_left == 0 && master_ok && param_ok && copied_locked && host_only_unlocked,
        json!({"elements": n, "nonzero_moments_and_gradients": nonzero_left, "master_equal": master_ok,
               "param_equal": param_ok, "copied_locked": copied_locked,
               "moments_and_accumulator_unlocked": host_only_unlocked}),
    );
}

/// `count` bf16 matrix products of `a` with itself (about 1.1 TFLOP each at 8192).
fn products(a: &Tensor, count: usize) {
    for _ in 0..count {
        let _ = a.matmul(a);
    }
}

fn event_clock(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    let a = Tensor::randn([8192, 8192], (Kind::BFloat16, Device::Cuda(0)));
    products(&a, 3);
    gpu.synchronize().expect("sync");
    let t0 = Instant::now();
    let e0 = gpu.mark(&gpu.compute).expect("event");
    products(&a, 40);
    let e1 = gpu.mark(&gpu.compute).expect("event");
    gpu.synchronize().expect("sync");
    let host_ms = t0.elapsed().as_secs_f64() * 1e3;
    let device_ms = gpu.elapsed_ms(e0, e1).expect("elapsed");
    let ok = device_ms <= host_ms && device_ms >= 0.9 * host_ms;
    r.check("event_clock", ok, json!({"device_ms": device_ms, "host_ms": host_ms, "ratio": device_ms / host_ms}));
}

fn step_clock(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    let a = Tensor::randn([8192, 8192], (Kind::BFloat16, Device::Cuda(0)));
    products(&a, 3);
    gpu.synchronize().expect("sync");
    let clock = StepClock::new(Some(Arc::clone(gpu)));
    let t0 = Instant::now();
    clock.start(StepPhase::Optimizer).expect("clock");
    // The synthetic optimizer: device work the host issues in far less time than it runs.
    products(&a, 40);
    clock.stop().expect("clock");
    let issued_ms = t0.elapsed().as_secs_f64() * 1e3;
    let end = clock.finish().expect("finish");
    let step_ms = end.duration_since(t0).as_secs_f64() * 1e3;
    let device_ms = clock.take().expect("phases").optimizer_ms;
    // Version 1 read the clock where the host was done issuing; the step must hold the device's
    // work, and only a little more.
    let ok = issued_ms < 0.5 * device_ms && step_ms >= device_ms && step_ms <= device_ms * 1.02 + 1.0;
    r.check(
        "step_clock",
        ok,
        json!({"host_issued_ms": issued_ms, "device_ms": device_ms, "step_ms": step_ms, "step_over_device": step_ms / device_ms}),
    );
}

fn nvml(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    let (_, total) = gpu.describe();
    let monitor = gpu.uuid().and_then(|u| GpuMonitor::open(&u));
    let Some(m) = monitor else {
        r.check("nvml", false, json!({"error": "NVML does not know this GPU"}));
        return;
    };
    let g = m.read();
    let ok = matches!((g.used_bytes, total), (Some(u), Some(t)) if u > 0 && u <= t)
        && g.power_w.is_some_and(|p| (1.0..2000.0).contains(&p))
        && g.energy_j.is_some_and(|e| e >= 0.0)
        && g.util_pct.is_some_and(|u| u <= 100);
    r.check(
        "nvml",
        ok,
        json!({"used_bytes": g.used_bytes, "total_bytes": total, "power_w": g.power_w, "energy_j": g.energy_j, "util_pct": g.util_pct}),
    );
}

/// ‖a − b‖ / ‖b‖ in fp32 (normwise: elements that cancel to nearly zero do not dominate it).
fn relative_error(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
    (&a - &b).norm().double_value(&[]) / b.norm().double_value(&[]).max(1e-30)
}

/// Writes every fp32 bit pattern from `base` (`n` of them) as a float, and as the kernels round it
/// to bf16 (`f2bf`, which `runtime::kernels` puts before every kernel's source).
const ROUND_ALL: &str = r#"
extern "C" __global__ void round_all(unsigned int base, float* __restrict__ x, unsigned short* __restrict__ y,
    long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float f = __uint_as_float(base + (unsigned int)i);
    x[i] = f;
    y[i] = f2bf(f);
  }
}
"#;

fn bf16_rounding(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    let module = zerobench_worker::runtime::kernels::load(gpu, ROUND_ALL).expect("the rounding kernel");
    let round_all = module.load_function("round_all").expect("round_all");
    let cuda = Device::Cuda(0);
    const CHUNK: i64 = 1 << 28;
    let (mut differing, mut nan_lost, mut nans) = (0i64, 0i64, 0i64);
    for chunk in 0..(1i64 << 32) / CHUNK {
        let x = Tensor::empty([CHUNK], (Kind::Float, cuda));
        let ours = Tensor::empty([CHUNK], (Kind::Int16, cuda));
        let (base, xp, yp) = ((chunk * CHUNK) as u32, x.data_ptr() as u64, ours.data_ptr() as u64);
        let cfg = LaunchConfig { grid_dim: (4096, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        tch::Cuda::synchronize(0);
        let mut launch = gpu.compute.launch_builder(&round_all);
        launch.arg(&base).arg(&xp).arg(&yp).arg(&CHUNK);
        // SAFETY: `x` holds CHUNK floats and `ours` CHUNK 16-bit values; both live until the
        // synchronisation below.
        unsafe { launch.launch(cfg) }.expect("round_all");
        gpu.synchronize().expect("sync");
        let theirs = x.to_kind(Kind::BFloat16).view_dtype(Kind::Int16);
        let nan = x.isnan();
        differing += ours.ne_tensor(&theirs).logical_and(&nan.logical_not()).sum(Kind::Int64).int64_value(&[]);
        // A bf16 NaN: every exponent bit set and a mantissa that is not zero.
        let ours_nan = ours.bitwise_and(0x7fff).gt(0x7f80);
        nan_lost += nan.logical_and(&ours_nan.logical_not()).sum(Kind::Int64).int64_value(&[]);
        nans += nan.sum(Kind::Int64).int64_value(&[]);
    }
    r.check(
        "bf16_rounding",
        differing == 0 && nan_lost == 0 && nans == 2 * ((1 << 23) - 1),
        json!({"inputs": 1i64 << 32, "numbers_differing": differing, "nans": nans, "nans_not_kept": nan_lost}),
    );
}

fn lm_head(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use zerobench_worker::model::lm_head::{
        cuda_kernel_installed, fused_losses, install_cuda, lm_loss_chunked, padded_vocab,
    };
    use zerobench_worker::model::recompute_cuda;
    install_cuda(gpu);
    // The head's 16-bit products run through the nodes' timed cuBLASLt plans.
    recompute_cuda::install(gpu);
    let (n, d, v) = (3000i64, 256i64, 50257i64);
    for (kind, loss_tol, grad_tol) in
        [(Kind::Float, 1e-5, 1e-4), (Kind::BFloat16, 2e-3, 2e-2), (Kind::Half, 2e-3, 2e-2)]
    {
        let ComposedHead { h0, w0, t, plain, h1, w1 } = composed_head(kind, 11, (n, d, v));
        let leaf = |x: &Tensor| x.detach().set_requires_grad(true);
        // 3000 tokens in chunks of 1024 or so (several chunks, the last a short one: the weight's
        // gradient summed in fp32), and in one chunk (its 16-bit product as it is).
        for (chunks, chunk_bytes) in [(3, 1024 * padded_vocab(v) * kind.elt_size_in_bytes() as i64), (1, i64::MAX)] {
            let (h2, w2) = (leaf(&h0), leaf(&w0));
            let (products_before, losses_before) = (recompute_cuda::plain_products(), fused_losses());
            let fused = lm_loss_chunked(&h2, &w2, &t, chunk_bytes).expect("the head");
            // Three products a chunk (logits, and the gradients of h and w), in 16 bits only; the
            // loss kernel once a chunk, in every precision.
            let products = recompute_cuda::plain_products() - products_before;
            let products_expected = if kind == Kind::Float { 0 } else { 3 * chunks };
            let losses = fused_losses() - losses_before;
            fused.backward();
            let (lp, lf) = (plain.double_value(&[]), fused.double_value(&[]));
            let loss_err = (lp - lf).abs() / lp.abs();
            let (gh, gw) = (relative_error(&h2.grad(), &h1.grad()), relative_error(&w2.grad(), &w1.grad()));
            let ok = cuda_kernel_installed()
                && loss_err <= loss_tol
                && gh <= grad_tol
                && gw <= grad_tol
                && products == products_expected
                && losses == chunks;
            r.check(
                "lm_head",
                ok,
                json!({"kind": format!("{kind:?}"), "fused_kernel": cuda_kernel_installed(), "tokens": n, "d_model": d,
                       "vocab": v, "chunks": chunks,
                       "plain_products": products, "plain_products_expected": products_expected,
                       "fused_losses": losses, "fused_losses_expected": chunks,
                       "loss": {"composed": lp, "fused": lf, "relative_error": loss_err},
                       "grad_relative_error": {"h": gh, "w": gw},
                       "bound": {"loss": loss_tol, "grads": grad_tol}}),
            );
        }
    }
    lm_head_on_another_stream(r, gpu);
}

/// The LM head's node multiplies the gradients it was given by the upstream gradient with the
/// worker's kernel on the GPU (two calls): the bits of libtorch's fp32 product rounded once, in
/// each precision, for an upstream factor 16 bits cannot hold (1/3), and in fp16 for 2^16 (fp16's
/// infinity, were the factor rounded to 16 bits first, as libtorch's mul of a 16-bit tensor by it
/// does).
fn given_grads_scaled(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use zerobench_worker::model::recompute_cuda;
    use zerobench_worker::runtime::shim;
    recompute_cuda::install(gpu);
    let cuda = Device::Cuda(0);
    for (kind, factor) in
        [(Kind::BFloat16, 1.0f32 / 3.0), (Kind::Half, 1.0 / 3.0), (Kind::Half, 65536.0), (Kind::Float, 1.0 / 3.0)]
    {
        tch::manual_seed(21);
        // Gradients small enough that 2^16 times them fits fp16.
        let randn = |shape: [i64; 2]| (Tensor::randn(shape, (Kind::Float, cuda)) * 1e-3).to_kind(kind);
        let (h, w) = (randn([333, 64]).set_requires_grad(true), randn([1001, 64]).set_requires_grad(true));
        let (gh, gw) = (randn([333, 64]), randn([1001, 64]));
        let loss = Tensor::from(1.5f32).to_device(cuda);
        let out = shim::given_grads(&loss, &h, &w, &gh, &gw).expect("the node");
        let u = Tensor::from(factor).to_device(cuda);
        let before = recompute_cuda::calls().0;
        shim::backward(&[&out], &[&u]).expect("backward");
        let ran = recompute_cuda::calls().0 - before;
        let fp32_product = |g: &Tensor| (g.to_kind(Kind::Float) * &u).to_kind(kind);
        let (same_h, same_w) = (h.grad().equal(&fp32_product(&gh)), w.grad().equal(&fp32_product(&gw)));
        let finite = w.grad().isfinite().all().int64_value(&[]) == 1;
        r.check(
            "given_grads_scaled",
            same_h && same_w && finite && ran == 2,
            json!({"kind": format!("{kind:?}"), "upstream": factor,
                   "same_bits_as_the_fp32_product": {"h": same_h, "w": same_w}, "finite": finite,
                   "kernel_calls": ran, "kernel_calls_expected": 2}),
        );
    }
}

/// The head's inputs on the GPU (`n` tokens of width `d`, a vocabulary of `v`, the first 7 targets
/// ignored) and the head composed of libtorch operations on them (fp32 loss), its backward done.
struct ComposedHead {
    h0: Tensor,
    w0: Tensor,
    t: Tensor,
    plain: Tensor,
    h1: Tensor,
    w1: Tensor,
}

fn composed_head(kind: Kind, seed: i64, (n, d, v): (i64, i64, i64)) -> ComposedHead {
    use zerobench_worker::model::lm_head::IGNORE_INDEX;
    let cuda = Device::Cuda(0);
    tch::manual_seed(seed);
    let h0 = Tensor::randn([n, d], (Kind::Float, cuda)).to_kind(kind);
    let w0 = (Tensor::randn([v, d], (Kind::Float, cuda)) * 0.05).to_kind(kind);
    let t = Tensor::randint(v, [n], (Kind::Int64, cuda));
    let _ = t.narrow(0, 0, 7).fill_(IGNORE_INDEX);
    let leaf = |x: &Tensor| x.detach().set_requires_grad(true);
    let (h1, w1) = (leaf(&h0), leaf(&w0));
    let plain = h1.linear::<Tensor>(&w1, None).to_kind(Kind::Float).cross_entropy_loss::<Tensor>(
        &t,
        None,
        tch::Reduction::Mean,
        IGNORE_INDEX,
        0.0,
    );
    plain.backward();
    ComposedHead { h0, w0, t, plain, h1, w1 }
}

/// The bf16 head of [`lm_head`] in three chunks on a thread whose libtorch current stream is not the
/// compute stream (the current stream is the thread's own): its products and loss kernel decline
/// and libtorch's operations run on that stream, with the same results as the composed head.
fn lm_head_on_another_stream(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use zerobench_worker::model::lm_head::{fused_losses, lm_loss_chunked, padded_vocab};
    use zerobench_worker::model::recompute_cuda;
    let other = gpu.ctx.new_stream().expect("a stream");
    let gpu = Arc::clone(gpu);
    let (n, d, v, kind) = (3000i64, 256i64, 50257i64, Kind::BFloat16);
    let outcome = std::thread::spawn(move || {
        shim::cuda_set_stream(&other, 0).expect("libtorch's stream on this thread");
        let here = gpu.computes_here().expect("the current stream");
        let ComposedHead { h0, w0, t, plain, h1, w1 } = composed_head(kind, 12, (n, d, v));
        let leaf = |x: &Tensor| x.detach().set_requires_grad(true);
        let (h2, w2) = (leaf(&h0), leaf(&w0));
        let (products_before, losses_before) = (recompute_cuda::plain_products(), fused_losses());
        let fused =
            lm_loss_chunked(&h2, &w2, &t, 1024 * padded_vocab(v) * kind.elt_size_in_bytes() as i64).expect("the head");
        fused.backward();
        let products = recompute_cuda::plain_products() - products_before;
        let losses = fused_losses() - losses_before;
        let (lp, lf) = (plain.double_value(&[]), fused.double_value(&[]));
        let errs = (
            (lp - lf).abs() / lp.abs(),
            relative_error(&h2.grad(), &h1.grad()),
            relative_error(&w2.grad(), &w1.grad()),
        );
        other.synchronize().expect("the thread's stream");
        (here, products, losses, lp, lf, errs)
    })
    .join()
    .expect("the other stream's thread");
    let (here, products, losses, lp, lf, (loss_err, gh, gw)) = outcome;
    let ok = !here && products == 0 && losses == 0 && loss_err <= 2e-3 && gh <= 2e-2 && gw <= 2e-2;
    r.check(
        "lm_head_other_stream",
        ok,
        json!({"computes_on_the_compute_stream": here, "plain_products": products, "plain_products_expected": 0,
               "fused_losses": losses, "fused_losses_expected": 0,
               "loss": {"composed": lp, "chunked": lf, "relative_error": loss_err},
               "grad_relative_error": {"h": gh, "w": gw}, "bound": {"loss": 2e-3, "grads": 2e-2}}),
    );
}

/// The nodes' plain products through the timed plans (`LtProducts::matmul`), each operand as rows or as a
/// `.t()` view, with and without a bias, against libtorch's product: within 1e-2 relative
/// (normwise) in bf16; a second product of the same shape (the choice its plan made at the first)
/// gives the first one's bits; an output that is also an input, and fp32, are declined.
fn lt_products(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use zerobench_worker::model::products_cuda::LtProducts;
    let e = LtProducts::new(Arc::clone(gpu)).expect("cuBLASLt").expect("libcublasLt loads");
    let cuda = Device::Cuda(0);
    let (rows, k, cols) = (1000i64, 1600i64, 4800i64);
    tch::manual_seed(16);
    let randn = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, cuda)).to_kind(Kind::BFloat16);
    for (a_t, b_t, bias) in [(false, false, false), (false, true, true), (true, false, false), (true, true, true)] {
        let a = if a_t { randn(&[k, rows]).tr() } else { randn(&[rows, k]) };
        let b = if b_t { randn(&[cols, k]).tr() } else { randn(&[k, cols]) } / (k as f64).sqrt();
        let bias = bias.then(|| randn(&[cols]));
        let theirs = match &bias {
            Some(c) => c.addmm(&a, &b),
            None => a.mm(&b),
        };
        let out = Tensor::empty([rows, cols], (Kind::BFloat16, cuda));
        let first = e.matmul(&a, &b, bias.as_ref(), &out).expect("product");
        let once = out.copy();
        let again = e.matmul(&a, &b, bias.as_ref(), &out).expect("product");
        let err = relative_error(&once, &theirs);
        let same_bits = once.equal(&out);
        r.check(
            "lt_products",
            first && again && err <= 1e-2 && same_bits,
            json!({"rows": rows, "k": k, "cols": cols, "a_transposed": a_t, "b_transposed": b_t,
                   "bias": bias.is_some(), "relative_error": err, "bound": 1e-2, "second_same_bits": same_bits}),
        );
    }
    let a = randn(&[rows, k]);
    let square = randn(&[k, k]);
    let aliased = e.matmul(&a.narrow(1, 0, k), &square, None, &a).expect("declines");
    let fp32 = e
        .matmul(&a.to_kind(Kind::Float), &square.to_kind(Kind::Float), None, &a.to_kind(Kind::Float))
        .expect("declines");
    r.check("lt_products", !aliased && !fp32, json!({"declined": {"output_is_input": !aliased, "fp32": !fp32}}));
}

/// The node kernels one forward and backward of `ln_linear` runs (`recompute_cuda::calls`): the
/// layer norm's forward and backward and the bias gradient's column sum (with three parts, the
/// join's); in 16 bits also its three products through cuBLASLt (the forward's, and the backward's
/// input and weight gradients).
fn ln_linear_kernels(half: bool) -> u64 {
    if half {
        6
    } else {
        3
    }
}

/// The same for `residual_linear`: the bias gradient's column sum; in 16 bits also the product with
/// the residual in its epilogue and the backward's two products.
fn residual_linear_kernels(half: bool) -> u64 {
    if half {
        4
    } else {
        1
    }
}

/// A node's forward and backward (`ours`, on the leaves `ins`) against the operations it stands for
/// (`theirs`, on fresh leaves of the same values), both backward from `g`, on the GPU.
struct AgainstComposed {
    /// The node kernels run and declined meanwhile (`recompute_cuda::calls`).
    kernels: (u64, u64),
    /// Relative errors (normwise): the output's, each input's gradient's, and the largest.
    value: f64,
    grads: Vec<f64>,
    worst: f64,
}

fn against_composed(
    ins: &[Tensor],
    g: &Tensor,
    ours: impl Fn(&[Tensor]) -> Tensor,
    theirs: impl Fn(&[Tensor]) -> Tensor,
) -> AgainstComposed {
    use zerobench_worker::model::recompute_cuda;
    let twins: Vec<Tensor> = ins.iter().map(|x| x.detach().copy().set_requires_grad(true)).collect();
    let before = recompute_cuda::calls();
    let (y_ours, y_theirs) = (ours(ins), theirs(&twins));
    zerobench_worker::runtime::shim::backward(&[&y_ours], &[g]).expect("backward");
    zerobench_worker::runtime::shim::backward(&[&y_theirs], &[g]).expect("backward");
    let after = recompute_cuda::calls();
    let value = relative_error(&y_ours, &y_theirs);
    let grads: Vec<f64> = ins.iter().zip(&twins).map(|(a, b)| relative_error(&a.grad(), &b.grad())).collect();
    let worst = grads.iter().copied().fold(value, f64::max);
    AgainstComposed { kernels: (after.0 - before.0, after.1 - before.1), value, grads, worst }
}

/// The attention's output projection with its residual addition (`recompute::residual_linear`)
/// against libtorch's linear layer plus the residual on the GPU, values and gradients: its bias
/// gradient from the column-sum kernel and, in bf16, the residual added in the product's epilogue.
fn linear_node(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use zerobench_worker::model::{recompute::residual_linear, recompute_cuda};
    recompute_cuda::install(gpu);
    let cuda = Device::Cuda(0);
    for (kind, tol, rows, d_in, d_out) in [
        (Kind::Float, 1e-5, 4101i64, 768i64, 768i64),
        (Kind::BFloat16, 2e-2, 4101, 768, 768),
        (Kind::BFloat16, 2e-2, 999, 1600, 4800),
    ] {
        tch::manual_seed(13);
        let leaf = |shape: &[i64], scale: f64| {
            (Tensor::randn(shape, (Kind::Float, cuda)) * scale).to_kind(kind).set_requires_grad(true)
        };
        let ins = [
            leaf(&[1, rows, d_out], 1.0),
            leaf(&[1, rows, d_in], 1.0),
            leaf(&[d_out, d_in], 0.05),
            leaf(&[d_out], 0.1),
        ];
        let g = Tensor::randn([1, rows, d_out], (Kind::Float, cuda)).to_kind(kind);
        let epilogues_before = recompute_cuda::epilogue_products();
        let AgainstComposed { kernels, value, grads, worst } = against_composed(
            &ins,
            &g,
            |t| residual_linear(&t[0], &t[1], &t[2], &t[3]).expect("node"),
            |t| &t[0] + t[1].linear(&t[2], Some(&t[3])),
        );
        let epilogues = recompute_cuda::epilogue_products() - epilogues_before;
        // In bf16 one of the kernels is the product with the residual's epilogue.
        let half = kind != Kind::Float;
        let expected = (residual_linear_kernels(half), 0, u64::from(half));
        r.check(
            "linear_node",
            worst <= tol && (kernels.0, kernels.1, epilogues) == expected,
            json!({"kind": format!("{kind:?}"), "rows": rows, "in": d_in, "out": d_out,
                   "output_relative_error": value,
                   "grad_relative_errors": {"res": grads[0], "x": grads[1], "w": grads[2], "b": grads[3]},
                   "bound": tol, "node_kernels": {"ran": kernels.0, "declined": kernels.1, "epilogue_products": epilogues,
                                                  "expected": [expected.0, expected.1, expected.2]}}),
        );
    }
}

/// The attention sub-block's two nodes as GPT-2 joins them (`model::gpt2`): `ln_linear` gives q, k
/// and v apart (their gradients joined in the node, with the bias gradient's column sums, by one
/// kernel) and passes x on, and `residual_linear` adds x after the output projection, so that x's
/// two gradients (the layer norm's and the residual's) are summed in the layer norm's backward
/// kernel. Against the composed operations (libtorch's split of one product) with the same
/// attention between, on the GPU: values and every gradient, and every kernel of both nodes
/// taken, none declined.
fn attention_residual(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use zerobench_worker::model::ops::{merge_heads, split_heads};
    use zerobench_worker::model::recompute::{ln_linear, residual_linear};
    use zerobench_worker::model::recompute_cuda;
    recompute_cuda::install(gpu);
    let cuda = Device::Cuda(0);
    let eps = 1e-5;
    // Causal attention over heads of 64, with GPT-2's own head split and merge.
    let attention = |q: &Tensor, k: &Tensor, v: &Tensor| {
        let heads = |x: &Tensor| split_heads(x, x.size()[2] / 64).expect("heads");
        let y = Tensor::scaled_dot_product_attention(
            &heads(q),
            &heads(k),
            &heads(v),
            None::<Tensor>,
            0.0,
            true,
            None,
            false,
        );
        merge_heads(&y).expect("heads")
    };
    for (kind, tol, rows, d) in [(Kind::Float, 1e-5, 333i64, 768i64), (Kind::BFloat16, 2e-2, 999, 1600)] {
        tch::manual_seed(17);
        let leaf = |shape: &[i64], scale: f64| {
            (Tensor::randn(shape, (Kind::Float, cuda)) * scale).to_kind(kind).set_requires_grad(true)
        };
        // x, gamma, beta, the qkv weight and bias, the output projection's weight and bias.
        let ins = [
            leaf(&[1, rows, d], 1.0),
            leaf(&[d], 1.0),
            leaf(&[d], 0.1),
            leaf(&[3 * d, d], 0.05),
            leaf(&[3 * d], 0.1),
            leaf(&[d, d], 0.05),
            leaf(&[d], 0.1),
        ];
        let g = Tensor::randn([1, rows, d], (Kind::Float, cuda)).to_kind(kind);
        let AgainstComposed { kernels, value, grads, worst } = against_composed(
            &ins,
            &g,
            |t| {
                let o = ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], eps, 3).expect("node");
                residual_linear(&o.residual, &attention(&o.y[0], &o.y[1], &o.y[2]), &t[5], &t[6]).expect("node")
            },
            |t| {
                let qkv = t[0].layer_norm([d], Some(&t[1]), Some(&t[2]), eps, true).linear(&t[3], Some(&t[4]));
                let p = qkv.split(d, 2);
                &t[0] + attention(&p[0], &p[1], &p[2]).linear(&t[5], Some(&t[6]))
            },
        );
        let half = kind != Kind::Float;
        let expected = ln_linear_kernels(half) + residual_linear_kernels(half);
        r.check(
            "attention_residual",
            worst <= tol && kernels == (expected, 0),
            json!({"kind": format!("{kind:?}"), "rows": rows, "d_model": d, "output_relative_error": value,
                   "grad_relative_errors": grads, "bound": tol,
                   "node_kernels": {"ran": kernels.0, "declined": kernels.1, "expected": [expected, 0]}}),
        );
    }
}

/// The layer norm's output as the backward kernel recomputes it has the forward kernel's bits (what
/// the weight gradients after a layer norm take is then what the forward pass's product took), in
/// each precision at the GPT-2 presets' widths and at the kernels' limit, with a row count that
/// leaves the last blocks partly empty; and no layer-norm kernel spills registers to local memory
/// at those widths (in 16 bits the backward kernel loads a row ahead up to `PREFETCH_VPL` vectors
/// a lane).
fn ln_recomputed(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use zerobench_worker::model::recompute_cuda;
    recompute_cuda::install(gpu);
    let cuda = Device::Cuda(0);
    for d in [768i64, 1024, 1280, 1600, recompute_cuda::MAX_COLS] {
        for kind in [Kind::BFloat16, Kind::Half, Kind::Float] {
            tch::manual_seed(16);
            let x = (Tensor::randn([3, 1367, d], (Kind::Float, cuda)) * 2.0 + 0.5).to_kind(kind);
            let gamma = (Tensor::randn([d], (Kind::Float, cuda)) * 0.2 + 1.0).to_kind(kind);
            let beta = (Tensor::randn([d], (Kind::Float, cuda)) * 0.1).to_kind(kind);
            let pair = recompute_cuda::ln_forward_and_recomputed(&x, &gamma, &beta, 1e-5).expect("kernels");
            let same = pair.as_ref().is_some_and(|(y, xn)| y.equal(xn));
            let differing = pair.as_ref().map(|(y, xn)| y.ne_tensor(xn).sum(Kind::Int64).int64_value(&[]));
            r.check(
                "ln_recomputed",
                same,
                json!({"kind": format!("{kind:?}"), "rows": 3 * 1367, "d_model": d, "ran": pair.is_some(),
                       "elements_differing": differing}),
            );
        }
        let resources = recompute_cuda::ln_resources(d).expect("kernels").unwrap_or_default();
        r.check(
            "ln_registers",
            !resources.is_empty() && resources.iter().all(|k| k.local_bytes == 0),
            json!({"d_model": d, "kernels": resources.iter().map(|k|
                       json!({"kernel": k.name, "registers": k.registers, "local_bytes": k.local_bytes}))
                       .collect::<Vec<_>>()}),
        );
    }
}

/// Rows the layer norm's kernels do not take (wider than `MAX_COLS`): the node falls back to
/// libtorch's layer norm for its forward, recomputed and backward passes (the forward and the
/// recomputation declined; the backward then does not ask)
/// and still takes the bias kernel and its three products through cuBLASLt, with the composed
/// operations' results.
fn declined_falls_back(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use zerobench_worker::model::{recompute::ln_linear, recompute_cuda};
    recompute_cuda::install(gpu);
    let cuda = Device::Cuda(0);
    let (rows, d, out, eps) = (300i64, recompute_cuda::MAX_COLS + 8, 64i64, 1e-5);
    tch::manual_seed(14);
    let leaf = |shape: &[i64], scale: f64| {
        (Tensor::randn(shape, (Kind::Float, cuda)) * scale).to_kind(Kind::BFloat16).set_requires_grad(true)
    };
    let ins = [leaf(&[1, rows, d], 1.0), leaf(&[d], 1.0), leaf(&[d], 0.1), leaf(&[out, d], 0.05), leaf(&[out], 0.1)];
    let g = Tensor::randn([1, rows, out], (Kind::Float, cuda)).to_kind(Kind::BFloat16);
    let AgainstComposed { kernels, value, grads, worst } = against_composed(
        &ins,
        &g,
        |t| ln_linear(&t[0], &t[1], &t[2], &t[3], &t[4], eps, 1).expect("node").y.remove(0),
        |t| t[0].layer_norm([d], Some(&t[1]), Some(&t[2]), eps, true).linear(&t[3], Some(&t[4])),
    );
    r.check(
        "declined_falls_back",
        worst <= 2e-2 && kernels == (4, 2),
        json!({"kind": "BFloat16", "rows": rows, "d_model": d, "max_cols": recompute_cuda::MAX_COLS,
               "output_relative_error": value, "grad_relative_errors": grads, "bound": 2e-2,
               "node_kernels": {"ran": kernels.0, "declined": kernels.1, "expected": [4, 2]}}),
    );
}

/// The MLP node's weight gradients written in place against the same node's returned ones.
fn grad_in_place(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use zerobench_worker::model::recompute::residual_ln_gelu_mlp;
    use zerobench_worker::runtime::shim;
    zerobench_worker::model::recompute_cuda::install(gpu);
    let cuda = Device::Cuda(0);
    let (rows, d, eps) = (2048i64, 1600i64, 1e-5);
    for (kind, tol) in [(Kind::Float, 1e-6), (Kind::BFloat16, 1e-2)] {
        tch::manual_seed(15);
        let leaf = |shape: &[i64], scale: f64| {
            (Tensor::randn(shape, (Kind::Float, cuda)) * scale).to_kind(kind).set_requires_grad(true)
        };
        let shapes: [(&[i64], f64); 7] = [
            (&[1, rows, d], 1.0),
            (&[d], 1.0),
            (&[d], 0.1),
            (&[4 * d, d], 0.05),
            (&[4 * d], 0.1),
            (&[d, 4 * d], 0.05),
            (&[d], 0.1),
        ];
        let ins: Vec<Tensor> = shapes.iter().map(|(s, k)| leaf(s, *k)).collect();
        let twins: Vec<Tensor> = ins.iter().map(|x| x.detach().copy().set_requires_grad(true)).collect();
        let g = Tensor::randn([1, rows, d], (Kind::Float, cuda)).to_kind(kind);
        let mlp =
            |t: &[Tensor]| residual_ln_gelu_mlp(&t[0], [&t[1], &t[2], &t[3], &t[4], &t[5], &t[6]], eps).expect("node");
        // The node's six parameters back to back, as in a GPT-2 block: the layer norm's scale and
        // shift, w1, b1, w2, b2.
        let params: Vec<Tensor> = ins[1..].iter().map(Tensor::shallow_clone).collect();
        let offsets: Vec<usize> = params
            .iter()
            .scan(0usize, |at, p| {
                let here = *at;
                *at += p.numel();
                Some(here)
            })
            .collect();
        let total: usize = params.iter().map(Tensor::numel).sum();
        let buf = Tensor::zeros([total as i64], (kind, cuda));
        let place = |accumulate: bool| {
            for (p, &o) in params.iter().zip(&offsets) {
                shim::grad_into(p, &buf, o, accumulate).expect("place");
            }
        };
        place(false);
        shim::backward(&[&mlp(&ins)], &[&g]).expect("backward");
        shim::backward(&[&mlp(&twins)], &[&g]).expect("backward");
        let empty = params.iter().all(|p| !p.grad().defined());
        // Every parameter written in place by the node's kernels and products.
        let taken = shim::take_grads(&params, &offsets, &buf, false).expect("take") == params.len();
        let placed = |i: usize| buf.narrow(0, offsets[i] as i64, params[i].numel() as i64);
        let fresh: Vec<Tensor> = twins[1..].iter().map(|t| t.grad().reshape([-1])).collect();
        let same_bits = (0..params.len()).all(|i| placed(i).equal(&fresh[i]));
        // A later micro-step: the same backward again, placed to add. The weights' products add
        // in place; the vectors go back to autograd and the engine adds them.
        place(true);
        shim::backward(&[&mlp(&ins)], &[&g]).expect("backward");
        let taken_again = shim::take_grads(&params, &offsets, &buf, true).expect("take") == 2;
        let sums: Vec<f64> = (0..params.len()).map(|i| relative_error(&placed(i), &(&fresh[i] * 2.0))).collect();
        let worst = sums.iter().copied().fold(0.0, f64::max);
        r.check(
            "grad_in_place",
            taken && taken_again && empty && same_bits && worst <= tol,
            json!({"kind": format!("{kind:?}"), "rows": rows, "d_model": d, "taken": [taken, taken_again],
                   "grad_left_empty": empty, "placed_equals_returned_bits": same_bits,
                   "accumulated_relative_errors": sums, "bound": tol}),
        );
    }
}

/// Allocated bytes on the GPU now.
fn allocated() -> i64 {
    zerobench_worker::runtime::shim::cuda_stats(0).expect("allocator statistics").allocated
}

fn recompute(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use zerobench_worker::model::recompute::{ln_linear, residual_ln_gelu_mlp};
    use zerobench_worker::model::recompute_cuda;
    recompute_cuda::install(gpu);
    let cuda = Device::Cuda(0);
    let eps = 1e-5;
    // Widths of the kernels' vector lengths and of gpt2 and gpt2-xl; row counts that leave the
    // last block rows and warps partly empty.
    for (kind, tol, b, t, d) in [
        (Kind::Float, 1e-5, 2i64, 512i64, 256i64),
        (Kind::BFloat16, 2e-2, 2, 512, 256),
        (Kind::BFloat16, 2e-2, 3, 1367, 768),
        (Kind::Half, 2e-2, 2, 701, 768),
        (Kind::BFloat16, 2e-2, 2, 1001, 1600),
        (Kind::Float, 1e-5, 1, 333, 1600),
        // fp32 rows this wide are read twice by the layer norm's backward kernel, not held.
        (Kind::Float, 1e-5, 1, 333, recompute_cuda::MAX_COLS),
    ] {
        tch::manual_seed(12);
        // x, then the parameters as the engine keeps them (views of one flat buffer, each a leaf):
        // gamma, beta, w1 [4d, d], b1, w2 [d, 4d], b2, the attention's qkv weight [3d, d] and bias.
        let shapes: [&[i64]; 8] = [&[d], &[d], &[4 * d, d], &[4 * d], &[d, 4 * d], &[d], &[3 * d, d], &[3 * d]];
        let scales = [1.0, 0.1, 0.05, 0.1, 0.05, 0.1, 0.05, 0.1];
        let total: i64 = shapes.iter().map(|s| s.iter().product::<i64>()).sum();
        let flat = Tensor::zeros([total], (kind, cuda));
        let mut at = 0;
        let mut ins = vec![(Tensor::randn([b, t, d], (Kind::Float, cuda))).to_kind(kind).set_requires_grad(true)];
        for (shape, scale) in shapes.iter().zip(scales) {
            let n: i64 = shape.iter().product();
            let view = flat.narrow(0, at, n).view(*shape);
            view.detach().copy_(&(Tensor::randn(*shape, (Kind::Float, cuda)) * scale).to_kind(kind));
            ins.push(view.set_requires_grad(true));
            at += n;
        }
        let twins: Vec<Tensor> = ins.iter().map(|x| x.detach().copy().set_requires_grad(true)).collect();
        let g = (Tensor::randn([b, t, d], (Kind::Float, cuda))).to_kind(kind);
        let g3 = (Tensor::randn([b, t, 3 * d], (Kind::Float, cuda))).to_kind(kind);
        let composed_norm = |x: &[Tensor]| x[0].layer_norm([d], Some(&x[1]), Some(&x[2]), eps, true);
        let normed_rows = |x: &[Tensor]| composed_norm(x).view([-1, d]);
        let composed_mlp =
            |x: &[Tensor]| &x[0] + composed_norm(x).linear(&x[3], Some(&x[4])).gelu("tanh").linear(&x[5], Some(&x[6]));
        let composed_qkv = |x: &[Tensor]| composed_norm(x).linear(&x[7], Some(&x[8]));
        let ours_mlp =
            |x: &[Tensor]| residual_ln_gelu_mlp(&x[0], [&x[1], &x[2], &x[3], &x[4], &x[5], &x[6]], eps).expect("node");
        let ours_qkv = |x: &[Tensor]| ln_linear(&x[0], &x[1], &x[2], &x[7], &x[8], eps, 1).expect("node").y.remove(0);
        // Once each first: cuBLAS's workspace and the allocator's pools are in place before anything
        // is measured.
        let _ = (ours_mlp(&ins), composed_mlp(&twins), ours_qkv(&ins), composed_qkv(&twins));
        // What stays allocated once the allocator has settled every free (emptying its cache
        // waits for the device and takes back every block freed, whichever stream used it).
        let settled = || {
            zerobench_worker::runtime::shim::cuda_empty_cache().expect("empty the cache");
            allocated()
        };
        // `f` returns the output first and, after it, anything else to hold alive while measured.
        let kept = |f: &dyn Fn() -> Vec<Tensor>| {
            let before = settled();
            let mut held = f();
            let bytes = settled() - before - (held[0].numel() as i64 * kind.elt_size_in_bytes() as i64);
            (bytes, held.swap_remove(0))
        };
        // The same operations without autograd, holding only what the node is to keep (the GELU's
        // input) beside the output.
        // ... and the layer norm's mean and reciprocal deviation (fp32, a value per row each).
        let stats = || (0..2).map(|_| Tensor::empty([b, t, 1], (Kind::Float, cuda))).collect::<Vec<_>>();
        let plain_mlp = |x: &[Tensor]| {
            tch::no_grad(|| {
                let h = x[4].addmm(&normed_rows(x), &x[3].tr());
                let out = x[6].addmm(&h.gelu("tanh"), &x[5].tr()) + x[0].view([-1, d]);
                [out, h].into_iter().chain(stats()).collect()
            })
        };
        let plain_qkv = |x: &[Tensor]| {
            tch::no_grad(|| std::iter::once(x[8].addmm(&normed_rows(x), &x[7].tr())).chain(stats()).collect())
        };
        let elt = kind.elt_size_in_bytes() as i64;
        type Forward<'a> = &'a dyn Fn(&[Tensor]) -> Tensor;
        type Plain<'a> = &'a dyn Fn(&[Tensor]) -> Vec<Tensor>;
        // Each node, the inputs it takes (indices into `ins`), and the bytes of what it recomputes.
        for (node, ours, theirs, plain, grad, used, recomputed) in [
            (
                "residual_ln_gelu_mlp",
                &ours_mlp as Forward,
                &composed_mlp as Forward,
                &plain_mlp as Plain,
                &g,
                &[0, 1, 2, 3, 4, 5, 6][..],
                b * t * d * elt + b * t * 4 * d * elt,
            ),
            ("ln_linear", &ours_qkv, &composed_qkv, &plain_qkv, &g3, &[0, 1, 2, 7, 8][..], b * t * d * elt),
        ] {
            let (ran_before, declined_before) = recompute_cuda::calls();
            let epilogues_before = recompute_cuda::epilogue_products();
            let products_before = recompute_cuda::plain_products();
            let (kept_plain, _) = kept(&|| plain(&ins));
            let (kept_ours, y_ours) = kept(&|| vec![ours(&ins)]);
            let (kept_theirs, y_theirs) = kept(&|| vec![theirs(&twins)]);
            let value = relative_error(&y_ours, &y_theirs);
            zerobench_worker::runtime::shim::backward(&[&y_ours], &[grad]).expect("backward");
            zerobench_worker::runtime::shim::backward(&[&y_theirs], &[grad]).expect("backward");
            let grads: Vec<f64> = used.iter().map(|&i| relative_error(&ins[i].grad(), &twins[i].grad())).collect();
            let worst = grads.iter().copied().fold(value, f64::max);
            let saved = kept_theirs - kept_ours;
            // The layer norm's kernels (forward, and backward with the recomputed output) and the
            // bias gradients' (two in the MLP, the second with the GELU's gradient and recomputed
            // output), and the MLP's
            // forward GELU: in 16 bits in the epilogue of the first product and the residual in the
            // second's (cuBLASLt), in fp32 the GELU as a kernel; none left to libtorch. In 16 bits
            // the other products go through cuBLASLt too: the backward's two per linear layer
            // (the input's gradient and the weight's) and the projection's forward in `ln_linear`.
            let (ran, declined) = recompute_cuda::calls();
            let (ran, declined) = (ran - ran_before, declined - declined_before);
            let half = kind != Kind::Float;
            let epilogues = recompute_cuda::epilogue_products() - epilogues_before;
            let products = recompute_cuda::plain_products() - products_before;
            let (kernels_expected, epilogues_expected, products_expected) = match (node, half) {
                ("residual_ln_gelu_mlp", true) => (10, 2, 4),
                ("residual_ln_gelu_mlp", false) => (5, 0, 0),
                (_, true) => (ln_linear_kernels(true), 0, 3),
                (_, false) => (ln_linear_kernels(false), 0, 0),
            };
            let ok = worst <= tol
                && kept_ours == kept_plain
                && saved > 0
                && recompute_cuda::installed()
                && recompute_cuda::epilogues_installed()
                && ran == kernels_expected
                && epilogues == epilogues_expected
                && products == products_expected
                && declined == 0;
            r.check(
                "recompute",
                ok,
                json!({"node": node, "kind": format!("{kind:?}"), "tokens": b * t, "d_model": d,
                       "node_kernels": {"ran": ran, "declined": declined, "expected": kernels_expected,
                                        "epilogue_products": epilogues, "epilogue_products_expected": epilogues_expected,
                                        "plain_products": products, "plain_products_expected": products_expected},
                       "output_relative_error": value, "grad_relative_errors": grads, "bound": tol,
                       "kept_bytes": {"node": kept_ours, "plain_operations_holding_what_the_node_keeps": kept_plain,
                                      "composed": kept_theirs, "less": saved, "recomputed_tensors": recomputed}}),
            );
            for &i in used {
                zerobench_worker::runtime::shim::clear_grad(&ins[i]).expect("clear");
                zerobench_worker::runtime::shim::clear_grad(&twins[i]).expect("clear");
            }
        }
    }
}

fn cuda_graph(r: &mut Report) {
    // The worker's own failure type: libtorch's errors and the capture's convert into it.
    use zerobench_worker::failure::Failure;
    use zerobench_worker::runtime::graph::GraphPool;
    let cuda = Device::Cuda(0);
    let gpu = cuda::Gpu::new(0, cuda::ComputeStream::Own).expect("CUDA context with a stream of its own");
    let allocated = || zerobench_worker::runtime::shim::cuda_stats(0).expect("allocator statistics").allocated;
    tch::manual_seed(21);
    let x = Tensor::randn([512, 384], (Kind::Float, cuda));
    let w = (Tensor::randn([384, 256], (Kind::Float, cuda)) * 0.05).set_requires_grad(true);
    let step = |x: &Tensor, w: &Tensor| -> Result<Tensor, Failure> {
        let loss = x.f_matmul(w)?.f_tanh()?.f_square()?.f_sum(Kind::Float)?;
        loss.f_backward()?;
        Ok(loss.f_detach()?)
    };
    // One eager step first, as the worker's warm-up does (cuBLAS's workspace on this stream).
    let _ = step(&x, &w).expect("eager step");
    zerobench_worker::runtime::shim::clear_grad(&w).expect("clear");
    gpu.synchronize().expect("sync");
    let mut pool = GraphPool::new(Arc::clone(&gpu));
    let captured = pool.capture(|| step(&x, &w));
    let Ok((graph, loss)) = captured else {
        r.check("cuda_graph", false, json!({"capture": captured.err().map(|e| e.to_string())}));
        return;
    };
    let grad = w.grad();
    let (mut worst_loss, mut worst_grad, mut grew) = (0.0f64, 0.0f64, 0i64);
    for k in 0..3 {
        let fresh = Tensor::randn([512, 384], (Kind::Float, cuda));
        x.shallow_clone().copy_(&fresh);
        let before = allocated();
        pool.replay(&graph).expect("replay");
        gpu.synchronize().expect("sync");
        grew = grew.max(allocated() - before);
        let twin = w.detach().copy().set_requires_grad(true);
        let want = step(&fresh, &twin).expect("eager twin");
        worst_loss = worst_loss.max((&loss - &want).abs().max().double_value(&[]));
        worst_grad = worst_grad.max((&grad - twin.grad()).abs().max().double_value(&[]));
        let _ = k;
    }
    // A capture that reads a value back to the host cannot hold: it fails, and leaves the stream
    // able to capture again.
    let bad = pool.capture(|| step(&x, &w).and_then(|l| Ok(l.f_double_value(&[])?)));
    let again = pool.capture(|| Ok::<_, Failure>(x.f_mul_scalar(2.0)?));
    let recovered = match &again {
        Ok((g, doubled)) => {
            pool.replay(g).expect("replay");
            gpu.synchronize().expect("sync");
            doubled.equal(&(&x * 2.0))
        }
        Err(_) => false,
    };
    let ok = worst_loss == 0.0 && worst_grad == 0.0 && grew == 0 && bad.is_err() && recovered;
    r.check(
        "cuda_graph",
        ok,
        json!({"replays": 3, "loss_max_abs_diff": worst_loss, "grad_max_abs_diff": worst_grad,
               "allocated_by_replay_bytes": grew, "host_read_capture": bad.err().map(|e| e.to_string()),
               "capture_after_failure": recovered, "memsets_as_kernels": graph.memsets_as_kernels,
               "kept_memsets": graph.kept_memsets}),
    );
    graph_memsets(r, &gpu);
    update_beside(r, &gpu);
}

/// AdamW beside a replayed backward (`zero::beside`): the urgent stream outranks the update
/// stream; a copy on the update stream after an event a graph records between two runs of
/// products reads what that replay wrote before the event, in each of four replays on the urgent
/// stream whose input changes (a wait that did not order with the replay's event would read the
/// last replay's value, the products before it taking far longer than the copy); and an update
/// beside gives the in-order update's bits. Runs after `cuda_graph`, on its stream.
fn update_beside(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use cudarc::driver::sys;
    use zerobench_worker::failure::Failure;
    use zerobench_worker::runtime::graph::GraphPool;
    let cuda = Device::Cuda(0);
    let (urgent, default) = gpu.priorities().expect("stream priorities");
    const N: i64 = 1 << 20;
    tch::manual_seed(23);
    let a = Tensor::randn([2048, 2048], (Kind::BFloat16, cuda)) * 0.02;
    let s = Tensor::zeros([1], (Kind::Float, cuda));
    let g = Tensor::zeros([N], (Kind::Float, cuda));
    let event = gpu.event().expect("event");
    gpu.synchronize().expect("sync");
    let mut pool = GraphPool::new(Arc::clone(gpu));
    let captured = pool.capture(|| {
        let mut acc = a.shallow_clone();
        for _ in 0..16 {
            acc = acc.f_mm(&a)?;
        }
        g.shallow_clone().f_copy_(&s.f_expand([N], false)?)?;
        gpu.record_in_capture(event, &gpu.compute).map_err(|e| Failure::Internal(e.to_string()))?;
        for _ in 0..16 {
            acc = acc.f_mm(&a)?;
        }
        Ok::<_, Failure>(acc)
    });
    let Ok((graph, _)) = captured else {
        r.check("update_beside", false, json!({"capture": captured.err().map(|e| e.to_string())}));
        return;
    };
    let outs = Tensor::zeros([4, N], (Kind::Float, cuda));
    for k in 0..4i64 {
        let _ = s.shallow_clone().fill_(k as f64 + 1.0);
        pool.replay_urgent(&graph).expect("replay on the urgent stream");
        gpu.wait(&gpu.update, event).expect("wait");
        let dst = outs.get(k);
        // SAFETY: device buffers of N floats each, alive until the synchronisation below.
        unsafe {
            sys::cuMemcpyDtoDAsync_v2(
                dst.data_ptr() as u64,
                g.data_ptr() as u64,
                (4 * N) as usize,
                gpu.update.cu_stream(),
            )
            .result()
            .expect("copy on the update stream");
        }
        let done = gpu.mark(&gpu.update).expect("mark");
        gpu.wait(&gpu.compute, done).expect("wait");
        gpu.recycle(done);
    }
    gpu.synchronize().expect("sync");
    let seen: Vec<f64> = (0..4).map(|k| outs.get(k).mean(Kind::Float).double_value(&[])).collect();
    let spread: Vec<f64> = (0..4).map(|k| (outs.get(k).max() - outs.get(k).min()).double_value(&[])).collect();
    let ordered = seen.iter().zip(&spread).enumerate().all(|(k, (m, d))| *m == k as f64 + 1.0 && *d == 0.0);

    // The update beside against the update in order, from equal shards (bf16 gradient and copy).
    let opt = AdamW::new(OptimConfig { weight_decay: 0.1, ..OptimConfig::default() }, Some(Arc::clone(gpu)));
    let n = 1_000_003; // not a multiple of the vector width: the tail too
    let shard = |seed: i64| {
        tch::manual_seed(seed);
        let f = |scale: f64| Tensor::randn([n], (Kind::Float, cuda)) * scale;
        (f(0.02), f(1e-3), f(1e-6).abs(), (f(1e-2)).to_kind(Kind::BFloat16), Tensor::zeros([n], (Kind::BFloat16, cuda)))
    };
    let (mut bits_equal, mut steps) = (true, 0);
    let (p0, m0, v0, g0, o0) = shard(5);
    let (p1, m1, v1, g1, o1) = (p0.copy(), m0.copy(), v0.copy(), g0.copy(), o0.copy());
    let ready = gpu.mark(&gpu.compute).expect("mark");
    gpu.wait(&gpu.update, ready).expect("wait");
    gpu.recycle(ready);
    for t in 1..=3u64 {
        let in_order = Shard { master: &p0, exp_avg: &m0, exp_avg_sq: &v0, grad: &g0, param_out: Some(&o0) };
        let beside = Shard { master: &p1, exp_avg: &m1, exp_avg_sq: &v1, grad: &g1, param_out: Some(&o1) };
        opt.step(t, 1.0, &in_order).expect("update in order");
        opt.step_beside(t, 1.0, &beside).expect("update beside");
        steps += 1;
    }
    gpu.synchronize().expect("sync");
    for (x, y) in [(&p0, &p1), (&m0, &m1), (&v0, &v1), (&o0, &o1)] {
        bits_equal &= x.equal(y);
    }
    let changed = !p0.equal(&shard(5).0);
    let ok = urgent < default && ordered && bits_equal && changed && opt.runs_beside();
    r.check(
        "update_beside",
        ok,
        json!({"priorities": {"urgent": urgent, "update": default}, "copies_read": seen, "copies_spread": spread,
               "updates": steps, "bits_equal": bits_equal, "parameters_changed": changed}),
    );
}

/// A captured graph's small memsets become kernel nodes (`runtime::graph`) that write what the
/// memsets wrote, ordered as they were: 32-, 16- and 8-bit memsets (the last over 60 of each
/// 100-byte row, the rest of each row kept) replaced, one past `FILL_MAX_BYTES` kept, and a kernel
/// captured after them reading what they wrote.
/// Runs after `cuda_graph`, on its stream.
fn graph_memsets(r: &mut Report, gpu: &Arc<cuda::Gpu>) {
    use cudarc::driver::sys;
    use zerobench_worker::failure::Failure;
    use zerobench_worker::runtime::graph::{GraphPool, FILL_MAX_BYTES};
    let cuda = Device::Cuda(0);
    let t32 = Tensor::full([1000], 7, (Kind::Int, cuda));
    let t16 = Tensor::full([1000], 7, (Kind::Int16, cuda));
    let t8 = Tensor::full([64, 100], 7, (Kind::Uint8, cuda));
    let big_len = FILL_MAX_BYTES / 4 + 1000;
    let big = Tensor::full([big_len as i64], 7, (Kind::Int, cuda));
    gpu.synchronize().expect("sync");
    let stream = gpu.compute.cu_stream();
    let ptr = |t: &Tensor| t.data_ptr() as u64;
    let mut pool = GraphPool::new(Arc::clone(gpu));
    let captured = pool.capture(|| {
        // SAFETY: device tensors of these sizes, alive past the replays; the stream captures.
        unsafe {
            sys::cuMemsetD32Async(ptr(&t32), 0x0102_0304, 1000, stream).result().expect("memset 32");
            sys::cuMemsetD16Async(ptr(&t16), 0xbeef, 1000, stream).result().expect("memset 16");
            sys::cuMemsetD2D8Async(ptr(&t8), 100, 0x5a, 60, 64, stream).result().expect("memset 2D");
            sys::cuMemsetD32Async(ptr(&big), 5, big_len, stream).result().expect("memset big");
        }
        Ok::<_, Failure>(t32.f_add_scalar(1)?)
    });
    let Ok((graph, after)) = captured else {
        r.check("graph_memsets", false, json!({"capture": captured.err().map(|e| e.to_string())}));
        return;
    };
    for t in [&t32, &t16, &t8, &big] {
        let _ = t.shallow_clone().fill_(7);
    }
    pool.replay(&graph).expect("replay");
    gpu.synchronize().expect("sync");
    let all = |t: &Tensor, v: i64| t.eq(v).all().int64_value(&[]) == 1;
    let values = json!({
        "d32": all(&t32, 0x0102_0304), "read_after": all(&after, 0x0102_0305),
        "d16": all(&t16, 0xbeefu16 as i16 as i64),
        "d2d8_set": all(&t8.narrow(1, 0, 60), 0x5a), "d2d8_kept": all(&t8.narrow(1, 60, 40), 7),
        "big": all(&big, 5),
    });
    let right = values.as_object().is_some_and(|m| m.values().all(|v| v == true));
    r.check(
        "graph_memsets",
        right && graph.memsets_as_kernels == 3,
        json!({"values_right": values, "memsets_as_kernels": graph.memsets_as_kernels, "expected": 3,
               "kept_memsets": graph.kept_memsets, "fill_max_bytes": FILL_MAX_BYTES}),
    );
}

fn in_backward(r: &mut Report) {
    let dev = Device::Cuda(0);
    let w = Tensor::from_slice(&[1.5f32, -2.0, 3.0]).to_device(dev).set_requires_grad(true);
    let run = shim::run_in_backward(Some(0), || {
        (&w * &w).sum(Kind::Float).backward();
        let name = std::fs::read_to_string("/proc/thread-self/comm").unwrap_or_default();
        (name.trim().to_string(), std::thread::current().id())
    });
    let grad = f32s(&w.grad());
    let (thread, elsewhere, error) = match run {
        Ok((name, id)) => (name, id != std::thread::current().id(), None),
        Err(e) => (String::new(), false, Some(e.0)),
    };
    let ok = error.is_none() && thread.starts_with("pt_autograd_") && elsewhere && grad == [3.0, -4.0, 6.0];
    r.check("in_backward", ok, json!({"error": error, "thread": thread, "not_the_caller": elsewhere, "grad": grad}));
}

fn main() {
    // Before MPI starts, as the worker does: MPI may initialise CUDA.
    cuda::bind_local_gpu(identity::local_rank_hint().unwrap_or(0));
    let universe = mpi::initialize().expect("MPI");
    let _ = device::select(zerobench_schema::DeviceRequest::Cuda).expect("a GPU");
    let gpu = cuda::Gpu::new(0, cuda::ComputeStream::Legacy).expect("CUDA context");
    let mut comm = NcclCollectives::new(HostGroup::Mpi(universe.world()), Arc::clone(&gpu), None, None).expect("NCCL");
    let mut r = Report { failed: 0, checks: 0 };
    adamw(&mut r, &gpu);
    adamw_loads(&mut r, &gpu);
    pinned_round_trip(&mut r, &gpu, &mut comm);
    upload_order(&mut r, &gpu, &mut comm);
    host_state_setup(&mut r, &gpu);
    event_clock(&mut r, &gpu);
    step_clock(&mut r, &gpu);
    nvml(&mut r, &gpu);
    bf16_rounding(&mut r, &gpu);
    lm_head(&mut r, &gpu);
    given_grads_scaled(&mut r, &gpu);
    recompute(&mut r, &gpu);
    attention_residual(&mut r, &gpu);
    ln_recomputed(&mut r, &gpu);
    lt_products(&mut r, &gpu);
    linear_node(&mut r, &gpu);
    declined_falls_back(&mut r, &gpu);
    grad_in_place(&mut r, &gpu);
    in_backward(&mut r);
    cuda_graph(&mut r);
    println!("{}", json!({"summary": {"checks": r.checks, "failed": r.failed, "gpu": gpu.describe().0}}));
    drop(comm);
    // MPI_Finalize runs when the universe drops; `exit` would skip it and mpirun would fail the run.
    drop(universe);
    std::process::exit(i32::from(r.failed > 0));
}
