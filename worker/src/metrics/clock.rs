//! A step's clock: when the step ends, and how its time splits into disjoint phases.
//!
//! A step ends when all of its work has: [`StepClock::finish`] synchronises the device (every
//! stream of the rank's context: compute, communication, copies) before it reads the host clock,
//! as a user's training loop does with `torch.cuda.synchronize()`. On CPU every operation has
//! completed when its call returns, so the host clock alone measures the work.
//!
//! Phases are spans on the clock that measures work: host instants on CPU, CUDA events on the
//! compute stream on a GPU (read once the step has finished, off the critical path of the work).
//! The collectives report each wait of computation for communication here too
//! ([`StepClock::exposed`]), and each wait is charged to the phase open when it was issued, so
//! forward and backward are computation alone and exposed communication is a phase of its own:
//! forward + backward + exposed + optimizer never exceed the step, and `other` is what is left.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::runtime::cuda::{Event, Gpu};

/// The phases of a step the `step` record breaks out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepPhase {
    Forward,
    Backward,
    Optimizer,
}

/// A point in time: the host clock, or an event on the GPU's compute stream. The step clock and
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

#[derive(Debug, thiserror::Error)]
#[error("timing events failed: {0}")]
pub struct ClockError(String);

/// One step's phases in ms: disjoint, so their sum never exceeds the step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    /// Computation alone (waits for communication taken out).
    pub forward_ms: f64,
    pub backward_ms: f64,
    /// Every wait of computation for communication, in whichever phase it happened.
    pub exposed_comm_ms: f64,
    /// The optimizer phase without its waits for communication, plus every wait of computation
    /// for the host's optimizer (offload) in the other phases: the next step's forward waits for
    /// a unit's host update at the unit's first use, and the delayed update at its harvest.
    pub optimizer_ms: f64,
}

impl PhaseTimes {
    pub fn sum(&self) -> f64 {
        self.forward_ms + self.backward_ms + self.exposed_comm_ms + self.optimizer_ms
    }
}

/// What a span measured: a phase, a wait for communication, or a wait for the host's optimizer
/// (offload), each issued while `in_phase` was open.
#[derive(Debug, Clone, Copy)]
enum SpanKind {
    Phase(StepPhase),
    Exposed { in_phase: Option<StepPhase> },
    HostUpdate { in_phase: Option<StepPhase> },
}

#[derive(Default)]
struct State {
    open: Option<(StepPhase, Mark)>,
    spans: Vec<(SpanKind, Mark, Mark)>,
}

/// The clock of one rank's steps, shared by the training loop (phases, the step's end) and the
/// collectives (their waits).
pub struct StepClock {
    gpu: Option<Arc<Gpu>>,
    state: Mutex<State>,
}

/// A step clock shared between the loop and the collectives.
pub type SharedClock = Arc<StepClock>;

fn slot(p: StepPhase) -> usize {
    match p {
        StepPhase::Forward => 0,
        StepPhase::Backward => 1,
        StepPhase::Optimizer => 2,
    }
}

impl StepClock {
    /// Host clocks when `gpu` is `None`, CUDA events on its compute stream otherwise.
    pub fn new(gpu: Option<Arc<Gpu>>) -> SharedClock {
        Arc::new(Self { gpu, state: Mutex::new(State::default()) })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn mark(&self) -> Result<Mark, ClockError> {
        Mark::now(self.gpu.as_deref()).map_err(ClockError)
    }

    /// Opens `phase`; phases do not nest.
    pub fn start(&self, phase: StepPhase) -> Result<(), ClockError> {
        let m = self.mark()?;
        let mut s = self.state();
        debug_assert!(s.open.is_none(), "phases do not nest");
        s.open = Some((phase, m));
        Ok(())
    }

    /// Closes the open phase (if any).
    pub fn stop(&self) -> Result<(), ClockError> {
        let m = self.mark()?;
        let mut s = self.state();
        if let Some((phase, start)) = s.open.take() {
            s.spans.push((SpanKind::Phase(phase), start, m));
        }
        Ok(())
    }

    /// A wait of computation for communication, from `a` to `b` on this clock (host instants on
    /// CPU, compute-stream events on a GPU; the clock recycles the events).
    pub fn exposed(&self, a: Mark, b: Mark) {
        let mut s = self.state();
        let in_phase = s.open.map(|(p, _)| p);
        s.spans.push((SpanKind::Exposed { in_phase }, a, b));
    }

    /// Runs `wait`, a wait of computation for the host's optimizer, and charges the time the
    /// clock sees pass (on a GPU, the compute stream's: its idling, if the wait starved it) to
    /// the optimizer, out of the phase open.
    pub fn host_update_wait<T>(&self, wait: impl FnOnce() -> T) -> Result<T, ClockError> {
        let a = self.mark()?;
        let out = wait();
        let b = self.mark()?;
        let mut s = self.state();
        let in_phase = s.open.map(|(p, _)| p);
        s.spans.push((SpanKind::HostUpdate { in_phase }, a, b));
        Ok(out)
    }

    /// Ends the step: waits until every stream of the device has finished the work issued so far,
    /// then reads the host clock. The step's time is measured up to this instant.
    pub fn finish(&self) -> Result<Instant, ClockError> {
        if let Some(g) = &self.gpu {
            g.synchronize().map_err(|e| ClockError(e.to_string()))?;
        }
        Ok(Instant::now())
    }

    /// The phases of the step just finished (after [`Self::finish`], so reading the events does
    /// not wait); starts the next step's.
    pub fn take(&self) -> Result<PhaseTimes, ClockError> {
        let spans = std::mem::take(&mut self.state().spans);
        let mut phase = [0.0f64; 3];
        let mut waited = [0.0f64; 3];
        let (mut exposed, mut host_update) = (0.0, 0.0);
        for (kind, a, b) in spans {
            let ms = self.elapsed_ms(a, b)?;
            let (total, in_phase) = match kind {
                SpanKind::Phase(p) => {
                    phase[slot(p)] += ms;
                    continue;
                }
                SpanKind::Exposed { in_phase } => (&mut exposed, in_phase),
                SpanKind::HostUpdate { in_phase } => (&mut host_update, in_phase),
            };
            *total += ms;
            if let Some(p) = in_phase {
                waited[slot(p)] += ms;
            }
        }
        // A wait lies inside its phase's span; rounding of the two clocks aside, never longer.
        let net = |i: usize| (phase[i] - waited[i]).max(0.0);
        Ok(PhaseTimes {
            forward_ms: net(0),
            backward_ms: net(1),
            exposed_comm_ms: exposed,
            optimizer_ms: net(2) + host_update,
        })
    }

    fn elapsed_ms(&self, a: Mark, b: Mark) -> Result<f64, ClockError> {
        match (a, b, &self.gpu) {
            (Mark::Host(a), Mark::Host(b), _) => Ok(b.saturating_duration_since(a).as_secs_f64() * 1e3),
            (Mark::Device(a), Mark::Device(b), Some(g)) => {
                let ms = g.elapsed_ms(a, b).map_err(|e| ClockError(e.to_string()));
                g.recycle(a);
                g.recycle(b);
                ms
            }
            _ => Err(ClockError("a span mixes the host's clock and the device's".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(base: Instant, ms: u64) -> Mark {
        Mark::Host(base + Duration::from_millis(ms))
    }

    /// Records a span of `kind` from `a` to `b` ms after `base`.
    fn span(c: &StepClock, kind: SpanKind, base: Instant, a: u64, b: u64) {
        c.state().spans.push((kind, at(base, a), at(base, b)));
    }

    #[test]
    fn waits_are_taken_out_of_the_phase_they_happened_in() {
        let c = StepClock::new(None);
        let t = Instant::now();
        span(&c, SpanKind::Phase(StepPhase::Forward), t, 0, 10);
        span(&c, SpanKind::Exposed { in_phase: Some(StepPhase::Forward) }, t, 2, 5);
        span(&c, SpanKind::Phase(StepPhase::Backward), t, 10, 30);
        span(&c, SpanKind::Exposed { in_phase: Some(StepPhase::Backward) }, t, 20, 24);
        span(&c, SpanKind::Phase(StepPhase::Optimizer), t, 30, 33);
        // A wait outside every phase counts as exposed and is taken out of no phase.
        span(&c, SpanKind::Exposed { in_phase: None }, t, 33, 34);
        let p = c.take().unwrap();
        assert_eq!(p, PhaseTimes { forward_ms: 7.0, backward_ms: 16.0, exposed_comm_ms: 8.0, optimizer_ms: 3.0 });
        assert_eq!(p.sum(), 34.0);
        // Taken: the next step starts empty.
        assert_eq!(c.take().unwrap(), PhaseTimes::default());
    }

    /// A wait for the host's update leaves the phase it happened in for the optimizer's; outside
    /// every phase it is the optimizer's and taken out of none. The sum still covers the step.
    #[test]
    fn a_wait_for_the_host_update_is_the_optimizers() {
        let c = StepClock::new(None);
        let t = Instant::now();
        span(&c, SpanKind::Phase(StepPhase::Forward), t, 0, 10);
        span(&c, SpanKind::HostUpdate { in_phase: Some(StepPhase::Forward) }, t, 1, 7);
        span(&c, SpanKind::Exposed { in_phase: Some(StepPhase::Forward) }, t, 7, 8);
        span(&c, SpanKind::Phase(StepPhase::Optimizer), t, 10, 12);
        span(&c, SpanKind::HostUpdate { in_phase: None }, t, 12, 15);
        let p = c.take().unwrap();
        assert_eq!(p, PhaseTimes { forward_ms: 3.0, backward_ms: 0.0, exposed_comm_ms: 1.0, optimizer_ms: 11.0 });
        assert_eq!(p.sum(), 15.0);
    }

    /// `host_update_wait` runs the wait between its two marks and charges it to the phase open.
    #[test]
    fn host_update_wait_runs_the_wait_inside_its_span() {
        let c = StepClock::new(None);
        c.start(StepPhase::Forward).unwrap();
        let got = c
            .host_update_wait(|| {
                std::thread::sleep(Duration::from_millis(20));
                7
            })
            .unwrap();
        c.stop().unwrap();
        assert_eq!(got, 7, "the wait's result comes back");
        let p = c.take().unwrap();
        assert!(p.optimizer_ms >= 20.0, "{p:?}");
        assert!(p.forward_ms < 5.0, "{p:?}");
    }

    #[test]
    fn an_exposed_wait_is_charged_to_the_phase_open_when_it_is_reported() {
        let c = StepClock::new(None);
        let t = Instant::now();
        c.start(StepPhase::Backward).unwrap();
        c.exposed(at(t, 0), at(t, 0));
        c.stop().unwrap();
        c.exposed(at(t, 0), at(t, 0));
        let s = c.state();
        assert!(matches!(s.spans[0].0, SpanKind::Exposed { in_phase: Some(StepPhase::Backward) }));
        assert!(matches!(s.spans[1].0, SpanKind::Phase(StepPhase::Backward)));
        assert!(matches!(s.spans[2].0, SpanKind::Exposed { in_phase: None }));
    }
}
