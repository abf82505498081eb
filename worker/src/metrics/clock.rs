//! Phase timing. On CPU, host clocks measure what the work took, because every operation completes
//! before its call returns. On a GPU the host runs ahead of the device, so phases are bracketed by
//! CUDA events on the compute stream and read once the step has finished.

use std::sync::Arc;
use std::time::Instant;

use crate::runtime::cuda::{Event, Gpu};

/// The phases of a step the `step` record breaks out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepPhase {
    Forward,
    Backward,
    Optimizer,
}

/// A point in time: the host clock, or an event on the GPU's compute stream. The phase timer and
/// the timeline both take their marks here.
#[derive(Debug, Clone, Copy)]
pub enum Mark {
    Host(Instant),
    Device(Event),
}

impl Mark {
    /// Now, on the clock that measures work on `gpu` (the host's when there is none).
    pub fn now(gpu: Option<&Gpu>) -> Result<Mark, String> {
        match gpu {
            None => Ok(Mark::Host(Instant::now())),
            Some(g) => g.mark(&g.compute).map(Mark::Device).map_err(|e| e.to_string()),
        }
    }
}

/// Accumulates the time spent in each phase during one step.
pub struct PhaseTimer {
    gpu: Option<Arc<Gpu>>,
    open: Option<(StepPhase, Mark)>,
    host_ms: [f64; 3],
    device_spans: Vec<(StepPhase, Event, Event)>,
}

#[derive(Debug, thiserror::Error)]
#[error("timing events failed: {0}")]
pub struct ClockError(String);

fn slot(p: StepPhase) -> usize {
    match p {
        StepPhase::Forward => 0,
        StepPhase::Backward => 1,
        StepPhase::Optimizer => 2,
    }
}

impl PhaseTimer {
    /// Host clocks when `gpu` is `None`, CUDA events on its compute stream otherwise.
    pub fn new(gpu: Option<Arc<Gpu>>) -> Self {
        Self { gpu, open: None, host_ms: [0.0; 3], device_spans: Vec::new() }
    }

    fn mark(&self) -> Result<Mark, ClockError> {
        Mark::now(self.gpu.as_deref()).map_err(ClockError)
    }

    pub fn start(&mut self, phase: StepPhase) -> Result<(), ClockError> {
        debug_assert!(self.open.is_none(), "phases do not nest");
        self.open = Some((phase, self.mark()?));
        Ok(())
    }

    pub fn stop(&mut self) -> Result<(), ClockError> {
        let Some((phase, start)) = self.open.take() else { return Ok(()) };
        match (start, self.mark()?) {
            (Mark::Host(t0), Mark::Host(_)) => self.host_ms[slot(phase)] += t0.elapsed().as_secs_f64() * 1e3,
            (Mark::Device(a), Mark::Device(b)) => self.device_spans.push((phase, a, b)),
            _ => unreachable!("one clock per timer"),
        }
        Ok(())
    }

    /// (forward, backward, optimizer) in ms for the step just finished; starts the next.
    pub fn take(&mut self) -> Result<(f64, f64, f64), ClockError> {
        let mut ms = std::mem::take(&mut self.host_ms);
        if let Some(g) = &self.gpu {
            for (phase, a, b) in self.device_spans.drain(..) {
                ms[slot(phase)] += g.elapsed_ms(a, b).map_err(|e| ClockError(e.to_string()))?;
                g.recycle(a);
                g.recycle(b);
            }
        }
        Ok((ms[0], ms[1], ms[2]))
    }
}
