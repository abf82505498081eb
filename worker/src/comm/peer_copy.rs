//! Reduce-scatter and all-gather between the GPUs of one host moved by the copy engines (`--copy-engines`).
//!
//! NCCL moves and adds data with thread blocks that share the SMs and memory with the computation
//! they overlap. Here the data crosses NVLink as plain peer copies (the GPUs' DMA engines, no SMs),
//! and only the addition of a reduce-scatter runs as a kernel, a light memory-bound one.
//!
//! Each rank owns an inbox (two parities × one slot per source rank) and a block of flags, both
//! shared with the other ranks through CUDA IPC handles exchanged over the host group. Every piece of a
//! collective has a sequence number `s`, the same on every rank (all ranks issue the same
//! collectives in the same order). On the communication stream, for each peer `p`:
//!
//! 1. wait until `consumed[p] >= s - 2`: `p` has read what this rank last put in the slot it is
//!    about to reuse (the same parity, two pieces ago);
//! 2. copy this rank's data for `p` into `p`'s inbox slot (parity `s % 2`, source this rank);
//! 3. set `arrived[this rank] = s` in `p`'s flags;
//!
//! then wait until `arrived[p] >= s` for every peer, read the slots (add them into the output, or
//! copy them into place), and set `consumed[this rank] = s` in every peer's flags. Waits are
//! `cuStreamWaitValue32` (the stream's front end polls; no SM spins) and flags are set by a
//! one-thread kernel after the copy, in stream order, so a flag is never seen before its data.
//!
//! Collectives larger than a slot go in slot-sized pieces.
//!
//! The inbox and flags live as long as the process: a peer may still set a flag here after this
//! rank is done, and in an error path no collective (a barrier before freeing) is safe to call.

use std::sync::Arc;

use super::group::HostGroup;
use super::{CommError, Elem};
use crate::runtime::cuda::Gpu;
use crate::runtime::kernels;
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};

/// The kernels, after [`kernels`]' shared conversions.
pub(crate) const SOURCE: &str = r#"
/* out[i] = mine[i] + sum over source ranks j != skip of slots[j * stride + i], added in fp32 in
   rank order (for two ranks exactly NCCL's sum). The vector form moves 16 bytes per load and is
   used when every pointer and the stride are 16-byte aligned; it ends with the scalar tail. */
struct alignas(16) V16 { unsigned int w[4]; };
#define SUM(NAME, T, LOAD, STORE)                                                                   \
extern "C" __global__ void NAME(T* out, const T* mine, const T* slots, long long stride, int world, \
                                int skip, long long n, int vec) {                                    \
  const int W = sizeof(V16) / sizeof(T);                                                            \
  long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;                               \
  long long step = (long long)gridDim.x * blockDim.x;                                                \
  long long nv = vec ? n / W : 0;                                                                    \
  for (long long v = first; v < nv; v += step) {                                                     \
    float a[W];                                                                                      \
    for (int k = 0; k < W; k++) a[k] = 0.0f;                                                         \
    for (int j = 0; j < world; j++) {                                                                \
      const T* src = (j == skip) ? mine : slots + j * stride;                                        \
      V16 x = reinterpret_cast<const V16*>(src)[v];                                                  \
      const T* e = reinterpret_cast<const T*>(&x);                                                   \
      for (int k = 0; k < W; k++) a[k] += LOAD(e[k]);                                                \
    }                                                                                                \
    V16 y;                                                                                           \
    T* o = reinterpret_cast<T*>(&y);                                                                 \
    for (int k = 0; k < W; k++) o[k] = STORE(a[k]);                                                  \
    reinterpret_cast<V16*>(out)[v] = y;                                                              \
  }                                                                                                  \
  for (long long i = nv * W + first; i < n; i += step) {                                             \
    float a = 0.0f;                                                                                  \
    for (int j = 0; j < world; j++) a += LOAD((j == skip) ? mine[i] : slots[j * stride + i]);        \
    out[i] = STORE(a);                                                                               \
  }                                                                                                  \
}
SUM(sum_bf16, unsigned short, bf2f, f2bf)
SUM(sum_f16, unsigned short, h2f, f2h)
SUM(sum_f32, float, f2f, f2f)

extern "C" __global__ void signal(unsigned int* flag, unsigned int value) {
  __threadfence_system();
  *(volatile unsigned int*)flag = value;
}
"#;

/// Thread blocks of the reduction kernel: it runs beside the computation, so it takes few SMs
/// (a quarter of an H100's or H200's) and streams through the data with 16-byte loads.
const SUM_BLOCKS: u32 = 32;

/// Device memory of this rank, shared with the other ranks of the host.
struct Shared {
    ptr: CUdeviceptr,
    /// Where each rank's copy of it is mapped in this process (this rank's own at its index).
    peers: Vec<CUdeviceptr>,
}

pub struct PeerCopy {
    gpu: Arc<Gpu>,
    rank: usize,
    world: usize,
    /// Bytes per inbox slot.
    slot_bytes: usize,
    inbox: Shared,
    /// `arrived[world]` then `consumed[world]`, u32 each.
    flags: Shared,
    seq: u32,
    _module: Arc<CudaModule>,
    sum_bf16: CudaFunction,
    sum_f16: CudaFunction,
    sum_f32: CudaFunction,
    signal: CudaFunction,
}

fn cu(op: &'static str, r: sys::CUresult) -> Result<(), CommError> {
    r.result().map_err(|e| CommError::Failed { op, message: format!("CUDA: {e}") })
}

impl PeerCopy {
    /// Sets up the inboxes and flags of every rank of `host` (all on this host, each on its own
    /// GPU); collective over `host`.
    pub fn new(host: &mut HostGroup, gpu: Arc<Gpu>, slot_bytes: usize) -> Result<Self, CommError> {
        const OP: &str = "copy-engine setup";
        let (rank, world) = (host.rank(), host.size());
        gpu.ctx.bind_to_thread().map_err(|e| CommError::Failed { op: OP, message: e.to_string() })?;
        let inbox = Self::share(host, 2 * world * slot_bytes, rank)?;
        let flags = Self::share(host, 2 * world * 4, rank)?;
        let module = kernels::load(&gpu, SOURCE).map_err(|e| CommError::Failed { op: OP, message: e.to_string() })?;
        let f = |name| module.load_function(name).map_err(|e| CommError::Failed { op: OP, message: e.to_string() });
        Ok(Self {
            sum_bf16: f("sum_bf16")?,
            sum_f16: f("sum_f16")?,
            sum_f32: f("sum_f32")?,
            signal: f("signal")?,
            _module: module,
            gpu,
            rank,
            world,
            slot_bytes,
            inbox,
            flags,
            seq: 0,
        })
    }

    /// Allocates `bytes` of zeroed device memory and maps every rank's allocation here.
    fn share(host: &mut HostGroup, bytes: usize, rank: usize) -> Result<Shared, CommError> {
        const OP: &str = "copy-engine setup";
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: plain driver calls on the current (this rank's) context.
        unsafe {
            cu(OP, sys::cuMemAlloc_v2(&mut ptr, bytes))?;
            cu(OP, sys::cuMemsetD8_v2(ptr, 0, bytes))?;
            cu(OP, sys::cuCtxSynchronize())?;
        }
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `ptr` is the base of an allocation of this context.
        unsafe { cu(OP, sys::cuIpcGetMemHandle(&mut handle, ptr))? };
        let mine: Vec<u8> = handle.reserved.iter().map(|&c| c as u8).collect();
        // Also the barrier that orders every rank's zeroing before any peer's first signal.
        let all = host.all_gather_bytes(&mine)?;
        let mut peers = Vec::with_capacity(all.len());
        for (r, h) in all.iter().enumerate() {
            if r == rank {
                peers.push(ptr);
                continue;
            }
            let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
            for (d, s) in handle.reserved.iter_mut().zip(h) {
                *d = *s as std::ffi::c_char;
            }
            let mut mapped: CUdeviceptr = 0;
            // SAFETY: a handle another process of this host made for a live allocation.
            unsafe {
                cu(
                    OP,
                    sys::cuIpcOpenMemHandle_v2(
                        &mut mapped,
                        handle,
                        sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                    ),
                )?
            };
            peers.push(mapped);
        }
        Ok(Shared { ptr, peers })
    }

    /// Device memory of this rank's inbox and flags.
    pub fn bytes(&self) -> u64 {
        (2 * self.world * self.slot_bytes + 2 * self.world * 4) as u64
    }

    /// The largest piece, in elements of size `es`.
    fn piece(&self, es: usize) -> usize {
        self.slot_bytes / es
    }

    fn slot(&self, base: CUdeviceptr, parity: usize, src: usize) -> CUdeviceptr {
        base + ((parity * self.world + src) * self.slot_bytes) as u64
    }

    fn arrived(&self, base: CUdeviceptr, src: usize) -> CUdeviceptr {
        base + (src * 4) as u64
    }

    fn consumed(&self, base: CUdeviceptr, src: usize) -> CUdeviceptr {
        base + ((self.world + src) * 4) as u64
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.gpu.comm
    }

    fn wait_flag(&self, op: &'static str, addr: CUdeviceptr, value: u32) -> Result<(), CommError> {
        // SAFETY: `addr` is in this rank's flag block; the stream is ours.
        unsafe {
            cu(
                op,
                sys::cuStreamWaitValue32_v2(
                    self.stream().cu_stream(),
                    addr,
                    value,
                    sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
                ),
            )
        }
    }

    fn set_flag(&self, op: &'static str, addr: CUdeviceptr, value: u32) -> Result<(), CommError> {
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
        let mut launch = self.stream().launch_builder(&self.signal);
        launch.arg(&addr).arg(&value);
        // SAFETY: `addr` is a flag of a live, mapped flag block; the arguments match the kernel.
        unsafe { launch.launch(cfg) }.map(|_| ()).map_err(|e| CommError::Failed { op, message: e.to_string() })
    }

    fn copy(&self, op: &'static str, dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> Result<(), CommError> {
        if dst == src || bytes == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie in live device allocations (checked by the callers' sizes).
        unsafe { cu(op, sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream().cu_stream()))? };
        Ok(())
    }

    /// Steps 1-3 of the protocol for one piece: sends `bytes` at `src_of(p)` to every peer `p`.
    fn send(
        &self,
        op: &'static str,
        s: u32,
        bytes: usize,
        src_of: impl Fn(usize) -> CUdeviceptr,
    ) -> Result<(), CommError> {
        let parity = (s % 2) as usize;
        for p in (0..self.world).filter(|&p| p != self.rank) {
            if s > 2 {
                self.wait_flag(op, self.consumed(self.flags.ptr, p), s - 2)?;
            }
            self.copy(op, self.slot(self.inbox.peers[p], parity, self.rank), src_of(p), bytes)?;
            self.set_flag(op, self.arrived(self.flags.peers[p], self.rank), s)?;
        }
        for p in (0..self.world).filter(|&p| p != self.rank) {
            self.wait_flag(op, self.arrived(self.flags.ptr, p), s)?;
        }
        Ok(())
    }

    fn release(&self, op: &'static str, s: u32) -> Result<(), CommError> {
        for p in (0..self.world).filter(|&p| p != self.rank) {
            self.set_flag(op, self.consumed(self.flags.peers[p], self.rank), s)?;
        }
        Ok(())
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Enqueues on the communication stream: `output` (`m` elements) := this rank's slice of the
    /// sum over ranks of `input` (`m * world` elements); `output` may be that slice of `input`.
    pub fn reduce_scatter(
        &mut self,
        input: CUdeviceptr,
        output: CUdeviceptr,
        m: usize,
        e: Elem,
    ) -> Result<(), CommError> {
        const OP: &str = "reduce_scatter";
        let es = e.size();
        let func = match e {
            Elem::Bf16 => &self.sum_bf16,
            Elem::F16 => &self.sum_f16,
            Elem::F32 => &self.sum_f32,
        }
        .clone();
        let mut o = 0;
        while o < m {
            let k = self.piece(es).min(m - o);
            let s = self.next_seq();
            let off = |r: usize| input + ((r * m + o) * es) as u64;
            self.send(OP, s, k * es, off)?;
            let (dst, mine) = (output + (o * es) as u64, off(self.rank));
            let slots = self.slot(self.inbox.ptr, (s % 2) as usize, 0);
            let (stride, world, skip, n) =
                ((self.slot_bytes / es) as i64, self.world as i32, self.rank as i32, k as i64);
            let vec = i32::from((dst | mine | slots) % 16 == 0 && self.slot_bytes % 16 == 0);
            let threads = 512u32;
            let blocks = u32::try_from(k.div_ceil(threads as usize * 8)).unwrap_or(u32::MAX).clamp(1, SUM_BLOCKS);
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
            let mut launch = self.stream().launch_builder(&func);
            launch.arg(&dst).arg(&mine).arg(&slots).arg(&stride).arg(&world).arg(&skip).arg(&n).arg(&vec);
            // SAFETY: `dst` and `mine` hold `k` elements of type `e` (checked by the caller's sizes),
            // `slots` `world` slots of `stride` elements; the arguments match the kernel.
            unsafe { launch.launch(cfg) }.map_err(|err| CommError::Failed { op: OP, message: err.to_string() })?;
            self.release(OP, s)?;
            o += k;
        }
        Ok(())
    }

    /// Enqueues on the communication stream: `output` (`n * world` elements) := the concatenation
    /// over ranks of `input` (`n` elements); `input` may be this rank's slice of `output`.
    pub fn all_gather(&mut self, input: CUdeviceptr, output: CUdeviceptr, n: usize, e: Elem) -> Result<(), CommError> {
        const OP: &str = "all_gather";
        let es = e.size();
        let mut o = 0;
        while o < n {
            let k = self.piece(es).min(n - o);
            let s = self.next_seq();
            let src = input + (o * es) as u64;
            self.send(OP, s, k * es, |_| src)?;
            self.copy(OP, output + ((self.rank * n + o) * es) as u64, src, k * es)?;
            for p in (0..self.world).filter(|&p| p != self.rank) {
                let slot = self.slot(self.inbox.ptr, (s % 2) as usize, p);
                self.copy(OP, output + ((p * n + o) * es) as u64, slot, k * es)?;
            }
            self.release(OP, s)?;
            o += k;
        }
        Ok(())
    }
}
