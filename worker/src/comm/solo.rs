//! The collectives of a run of one rank on one GPU whose steps are replayed from CUDA graphs
//! (`--cuda-graph`): over one rank a sum is the rank's own values, so every collective is nothing
//! (in place) or a copy on the compute stream, issued through libtorch like the computation
//! around it and captured with it. Nothing crosses a link, so nothing is counted as
//! communication. (Without graphs one rank keeps NCCL, whose calls the graph could not hold
//! beside the events that time them.)

use tch::Tensor;

use super::{flat, matching, Collectives, CommError, HostCopy, Pending, StepComm};
use crate::metrics::clock::SharedClock;
use crate::metrics::timeline::SharedTimeline;

#[derive(Default)]
pub struct SoloCollectives;

/// `dst` := `src`, unless they are the same memory.
fn copy(op: &'static str, src: &Tensor, dst: &Tensor) -> Result<Pending, CommError> {
    matching(src, dst, op)?;
    if src.data_ptr() != dst.data_ptr() {
        let mut d = dst.shallow_clone();
        d.f_copy_(src).map_err(|err| CommError::Failed { op, message: err.to_string() })?;
    }
    Ok(Pending::done())
}

impl Collectives for SoloCollectives {
    fn rank(&self) -> usize {
        0
    }

    fn world(&self) -> usize {
        1
    }

    fn all_reduce(&mut self, buf: &Tensor) -> Result<Pending, CommError> {
        flat(buf, "all_reduce")?;
        Ok(Pending::done())
    }

    fn reduce_scatter(&mut self, input: &Tensor, output: &Tensor) -> Result<Pending, CommError> {
        copy("reduce_scatter", input, output)
    }

    fn all_gather(&mut self, input: &Tensor, output: &Tensor) -> Result<Pending, CommError> {
        copy("all_gather", input, output)
    }

    fn broadcast(&mut self, buf: &Tensor, _root: usize) -> Result<Pending, CommError> {
        flat(buf, "broadcast")?;
        Ok(Pending::done())
    }

    fn wait(&mut self, _pending: Pending) -> Result<(), CommError> {
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        Ok(())
    }

    fn copy_to_host(&mut self, src: &Tensor, dst: &Tensor) -> Result<(Pending, HostCopy), CommError> {
        Ok((copy("copy_to_host", src, dst)?, HostCopy::Done))
    }

    fn copy_to_device(&mut self, src: &Tensor, dst: &Tensor) -> Result<(Pending, HostCopy), CommError> {
        Ok((copy("copy_to_device", src, dst)?, HostCopy::Done))
    }

    fn copy_device(&mut self, src: &Tensor, dst: &Tensor) -> Result<Pending, CommError> {
        copy("copy_device", src, dst)
    }

    fn reduce_control(&mut self, _buf: &Tensor) -> Result<(), CommError> {
        Ok(())
    }

    fn max_over_ranks(&mut self, _values: &mut [f64]) -> Result<(), CommError> {
        Ok(())
    }

    fn take_stats(&mut self) -> Result<StepComm, CommError> {
        Ok(StepComm::default())
    }

    fn set_timeline(&mut self, _timeline: SharedTimeline) {}

    fn set_clock(&mut self, _clock: SharedClock) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// In place is nothing, another buffer a copy, a mismatch an error.
    #[test]
    fn collectives_of_one_rank_copy_or_do_nothing() {
        let mut c = SoloCollectives;
        let a = Tensor::arange(6, (Kind::Float, Device::Cpu));
        let b = Tensor::zeros([6], (Kind::Float, Device::Cpu));
        let _ = c.all_reduce(&a).unwrap();
        assert!(a.equal(&Tensor::arange(6, (Kind::Float, Device::Cpu))));
        let _ = c.reduce_scatter(&a, &b).unwrap();
        assert!(b.equal(&a));
        let _ = c.all_gather(&a, &a).unwrap();
        assert!(a.equal(&b));
        let short = Tensor::zeros([5], (Kind::Float, Device::Cpu));
        assert!(c.all_gather(&a, &short).is_err());
        assert!(c.take_stats().unwrap().by_kind.is_empty());
    }
}
