//! Collectives on CPU tensors over MPI (rsmpi's raw bindings, because rsmpi's safe API has no
//! in-place variants and no 16-bit floats).
//!
//! bf16 and fp16 travel as 16-bit words and are summed by MPI operators defined here, which add in
//! fp32 and round once per pairwise reduction, as NCCL does.

use std::ffi::{c_int, c_void};

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use tch::Tensor;

use super::{flat, is_rank_slice, Blocking, CollectiveKind, Collectives, CommError, Elem, HostCopy, Pending, StepComm};
use crate::metrics::clock::SharedClock;
use crate::metrics::timeline::SharedTimeline;
use crate::runtime::shim;

pub struct MpiCollectives {
    comm: SimpleCommunicator,
    rank: usize,
    world: usize,
    sum_bf16: ffi::MPI_Op,
    sum_f16: ffi::MPI_Op,
    calls: Blocking,
}

unsafe extern "C" fn sum_bf16(inv: *mut c_void, inout: *mut c_void, len: *mut c_int, _dt: *mut ffi::MPI_Datatype) {
    // SAFETY: MPI passes two buffers of `*len` elements of the datatype we used (16-bit words).
    unsafe {
        let n = usize::try_from(*len).unwrap_or(0);
        let a = std::slice::from_raw_parts(inv.cast::<half::bf16>(), n);
        let b = std::slice::from_raw_parts_mut(inout.cast::<half::bf16>(), n);
        for (y, x) in b.iter_mut().zip(a) {
            *y = half::bf16::from_f32(y.to_f32() + x.to_f32());
        }
    }
}

unsafe extern "C" fn sum_f16(inv: *mut c_void, inout: *mut c_void, len: *mut c_int, _dt: *mut ffi::MPI_Datatype) {
    // SAFETY: as in sum_bf16.
    unsafe {
        let n = usize::try_from(*len).unwrap_or(0);
        let a = std::slice::from_raw_parts(inv.cast::<half::f16>(), n);
        let b = std::slice::from_raw_parts_mut(inout.cast::<half::f16>(), n);
        for (y, x) in b.iter_mut().zip(a) {
            *y = half::f16::from_f32(y.to_f32() + x.to_f32());
        }
    }
}

fn mpi_rc(rc: c_int) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("MPI error code {rc}"))
    }
}

fn create_op(f: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut ffi::MPI_Datatype)) -> ffi::MPI_Op {
    // SAFETY: MPI_Op is a plain handle; zero-initialised storage is overwritten by MPI_Op_create.
    let mut op: ffi::MPI_Op = unsafe { std::mem::zeroed() };
    // SAFETY: valid function pointer and out-pointer; commutative addition.
    let rc = unsafe { ffi::MPI_Op_create(Some(f), 1, &mut op) };
    assert_eq!(rc, 0, "MPI_Op_create failed");
    op
}

/// `values` := their element-wise maximum over the ranks of `comm`: host values, over MPI for
/// both transports (NCCL's ranks keep the MPI communicator they bootstrapped from).
pub(crate) fn host_max(comm: &SimpleCommunicator, values: &mut [f64]) {
    let local = values.to_vec();
    mpi::collective::CommunicatorCollectives::all_reduce_into(
        comm,
        &local[..],
        values,
        mpi::collective::SystemOperation::max(),
    );
}

impl MpiCollectives {
    pub fn new(comm: SimpleCommunicator) -> Self {
        let rank = usize::try_from(comm.rank()).expect("rank");
        let world = usize::try_from(comm.size()).expect("size");
        Self {
            comm,
            rank,
            world,
            sum_bf16: create_op(sum_bf16),
            sum_f16: create_op(sum_f16),
            calls: Blocking::default(),
        }
    }

    fn dtype_op(&self, e: Elem) -> (ffi::MPI_Datatype, ffi::MPI_Op) {
        // SAFETY: reading MPI's predefined handles after MPI_Init.
        unsafe {
            match e {
                Elem::F32 => (ffi::RSMPI_FLOAT, ffi::RSMPI_SUM),
                Elem::Bf16 => (ffi::RSMPI_UINT16_T, self.sum_bf16),
                Elem::F16 => (ffi::RSMPI_UINT16_T, self.sum_f16),
            }
        }
    }

    fn count(op: &'static str, n: usize) -> Result<c_int, CommError> {
        c_int::try_from(n)
            .map_err(|_| CommError::BadTensor { op, reason: format!("{n} elements exceed MPI's int count") })
    }
}

impl Collectives for MpiCollectives {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, buf: &Tensor) -> Result<Pending, CommError> {
        const OP: &str = "all_reduce";
        let (e, n) = flat(buf, OP)?;
        let count = Self::count(OP, n)?;
        let (dt, op) = self.dtype_op(e);
        let comm = self.comm.as_raw();
        let ptr = buf.data_ptr();
        self.calls.timed(CollectiveKind::AllReduce, n * e.size(), || {
            // SAFETY: `buf` is a contiguous CPU tensor of `n` elements, alive during the call.
            mpi_rc(unsafe { ffi::MPI_Allreduce(shim::mpi_in_place(), ptr, count, dt, op, comm) })
        })
    }

    fn reduce_scatter(&mut self, input: &Tensor, output: &Tensor) -> Result<Pending, CommError> {
        const OP: &str = "reduce_scatter";
        let (e, n) = flat(input, OP)?;
        let (eo, m) = flat(output, OP)?;
        if e != eo || m * self.world != n {
            return Err(CommError::BadTensor {
                op: OP,
                reason: format!("input {n} and output {m} elements on {} ranks", self.world),
            });
        }
        let count = Self::count(OP, m)?;
        let (dt, op) = self.dtype_op(e);
        let comm = self.comm.as_raw();
        let (inp, out) = (input.data_ptr(), output.data_ptr());
        if is_rank_slice(output, input, self.rank, self.world) {
            // MPI's in-place reduce-scatter leaves the result at the start of the buffer, NCCL's at
            // the rank's slice: move it there.
            let p = self.calls.timed(CollectiveKind::ReduceScatter, n * e.size(), || {
                // SAFETY: contiguous tensors of the checked sizes.
                mpi_rc(unsafe { ffi::MPI_Reduce_scatter_block(shim::mpi_in_place(), inp, count, dt, op, comm) })
            })?;
            if self.rank != 0 {
                // SAFETY: both ranges lie in `input`; `copy` handles the overlap-free move (slices
                // of equal size at different offsets never overlap).
                unsafe { std::ptr::copy_nonoverlapping(inp.cast::<u8>(), out.cast::<u8>(), m * e.size()) };
            }
            Ok(p)
        } else {
            self.calls.timed(CollectiveKind::ReduceScatter, n * e.size(), || {
                // SAFETY: contiguous, distinct tensors of the checked sizes.
                mpi_rc(unsafe { ffi::MPI_Reduce_scatter_block(inp, out, count, dt, op, comm) })
            })
        }
    }

    fn all_gather(&mut self, input: &Tensor, output: &Tensor) -> Result<Pending, CommError> {
        const OP: &str = "all_gather";
        let (e, n) = flat(input, OP)?;
        let (eo, m) = flat(output, OP)?;
        if e != eo || n * self.world != m {
            return Err(CommError::BadTensor {
                op: OP,
                reason: format!("input {n} and output {m} elements on {} ranks", self.world),
            });
        }
        let count = Self::count(OP, n)?;
        let (dt, _) = self.dtype_op(e);
        let comm = self.comm.as_raw();
        let (inp, out) = (input.data_ptr(), output.data_ptr());
        let send = if is_rank_slice(input, output, self.rank, self.world) { shim::mpi_in_place() } else { inp };
        self.calls.timed(CollectiveKind::AllGather, m * e.size(), || {
            // SAFETY: contiguous tensors of the checked sizes; in place, MPI reads this rank's slice
            // of the output.
            mpi_rc(unsafe { ffi::MPI_Allgather(send, count, dt, out, count, dt, comm) })
        })
    }

    fn broadcast(&mut self, buf: &Tensor, root: usize) -> Result<Pending, CommError> {
        const OP: &str = "broadcast";
        let (e, n) = flat(buf, OP)?;
        let count = Self::count(OP, n)?;
        let (dt, _) = self.dtype_op(e);
        let comm = self.comm.as_raw();
        let ptr = buf.data_ptr();
        let root = c_int::try_from(root).expect("rank");
        self.calls.timed(CollectiveKind::Broadcast, n * e.size(), || {
            // SAFETY: contiguous tensor of `n` elements.
            mpi_rc(unsafe { ffi::MPI_Bcast(ptr, count, dt, root, comm) })
        })
    }

    fn wait(&mut self, _pending: Pending) -> Result<(), CommError> {
        Ok(())
    }

    fn max_over_ranks(&mut self, values: &mut [f64]) -> Result<(), CommError> {
        host_max(&self.comm, values);
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        mpi::collective::CommunicatorCollectives::barrier(&self.comm);
        Ok(())
    }

    fn copy_to_host(&mut self, src: &Tensor, dst: &Tensor) -> Result<(Pending, HostCopy), CommError> {
        let p = self.calls.host_copy(CollectiveKind::DeviceToHost, src, dst)?;
        Ok((p, HostCopy::Done))
    }

    fn copy_to_device(&mut self, src: &Tensor, dst: &Tensor) -> Result<(Pending, HostCopy), CommError> {
        let p = self.calls.host_copy(CollectiveKind::HostToDevice, src, dst)?;
        Ok((p, HostCopy::Done))
    }

    fn copy_device(&mut self, src: &Tensor, dst: &Tensor) -> Result<Pending, CommError> {
        self.calls.host_copy(CollectiveKind::DeviceToDevice, src, dst)
    }

    fn reduce_control(&mut self, buf: &Tensor) -> Result<(), CommError> {
        const OP: &str = "reduce_control";
        let (e, n) = flat(buf, OP)?;
        if e != Elem::F32 || buf.device() != tch::Device::Cpu {
            return Err(CommError::BadTensor { op: OP, reason: "control values are fp32 on the CPU".into() });
        }
        let count = Self::count(OP, n)?;
        let (dt, op) = self.dtype_op(e);
        // SAFETY: contiguous fp32 CPU tensor of `n` elements.
        let rc = unsafe { ffi::MPI_Allreduce(shim::mpi_in_place(), buf.data_ptr(), count, dt, op, self.comm.as_raw()) };
        if rc != 0 {
            return Err(CommError::Failed { op: OP, message: format!("MPI error code {rc}") });
        }
        Ok(())
    }

    fn take_stats(&mut self) -> Result<StepComm, CommError> {
        Ok(std::mem::take(&mut self.calls.stats))
    }

    fn set_clock(&mut self, clock: SharedClock) {
        self.calls.clock = Some(clock);
    }

    fn set_timeline(&mut self, timeline: SharedTimeline) {
        self.calls.timeline = Some(timeline);
    }
}
