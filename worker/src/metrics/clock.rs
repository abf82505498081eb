//! Phase timing. On CPU, host clocks measure what the work took, because every operation completes
//! before the call returns. (On GPUs, CUDA events on the compute stream will take their place.)

use std::time::Instant;

/// The phases of a step the `step` record breaks out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepPhase {
    Forward,
    Backward,
    Optimizer,
}

/// Accumulates the time spent in each phase during one step.
#[derive(Debug, Default)]
pub struct PhaseTimer {
    forward_ms: f64,
    backward_ms: f64,
    optimizer_ms: f64,
    open: Option<(StepPhase, Instant)>,
}

impl PhaseTimer {
    pub fn start(&mut self, phase: StepPhase) {
        debug_assert!(self.open.is_none(), "phases do not nest");
        self.open = Some((phase, Instant::now()));
    }

    pub fn stop(&mut self) {
        if let Some((phase, t0)) = self.open.take() {
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            match phase {
                StepPhase::Forward => self.forward_ms += ms,
                StepPhase::Backward => self.backward_ms += ms,
                StepPhase::Optimizer => self.optimizer_ms += ms,
            }
        }
    }

    /// (forward, backward, optimizer) in ms, and a fresh timer for the next step.
    pub fn take(&mut self) -> (f64, f64, f64) {
        let t = (self.forward_ms, self.backward_ms, self.optimizer_ms);
        *self = Self::default();
        t
    }
}
