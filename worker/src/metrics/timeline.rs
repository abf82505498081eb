//! A timeline of what ran when, for `--trace` (Chrome/Perfetto trace-event JSON per rank) and
//! `--profile-step` (per-module times). Spans are bracketed by host instants on CPU and by CUDA
//! events on a GPU (computation on the compute stream, collectives on the communication stream);
//! they are read once a step has finished, relative to a base mark taken when the timeline starts.
//!
//! Nothing is recorded unless a step is being traced or profiled: the hot path then costs one
//! branch per span.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use crate::metrics::clock::Mark;
use crate::runtime::cuda::{Event, Gpu};

/// Where a span is drawn: one track per kind of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Track {
    Compute,
    Optimizer,
    Copy,
    Comm(&'static str),
}

impl Track {
    fn id(self) -> u32 {
        match self {
            Track::Compute => 1,
            Track::Optimizer => 2,
            Track::Copy => 3,
            Track::Comm("all_reduce") => 10,
            Track::Comm("reduce_scatter") => 11,
            Track::Comm("all_gather") => 12,
            Track::Comm("d2h") => 14,
            Track::Comm("h2d") => 15,
            Track::Comm("d2d") => 16,
            Track::Comm(_) => 13,
        }
    }
    fn label(self) -> String {
        match self {
            Track::Compute => "compute".into(),
            Track::Optimizer => "optimizer".into(),
            Track::Copy => "host-device copies".into(),
            Track::Comm(k) => format!("comm {k}"),
        }
    }
}

/// What a span measured, beyond its name.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpanInfo {
    /// The model segment and whether it ran backward.
    pub segment: Option<(usize, bool)>,
    pub bytes: Option<u64>,
}

/// A span once its marks have been read.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub track: Track,
    pub name: String,
    pub step: u32,
    pub start_us: f64,
    pub dur_us: f64,
    pub info: SpanInfo,
}

struct Pending {
    track: Track,
    name: String,
    step: u32,
    start: Mark,
    end: Mark,
    info: SpanInfo,
}

pub struct Timeline {
    gpu: Option<Arc<Gpu>>,
    base_host: Instant,
    base_device: Option<Event>,
    recording: Option<u32>,
    pending: Vec<Pending>,
}

/// The handle the trainer and the collectives share.
pub type SharedTimeline = Arc<Mutex<Timeline>>;

#[derive(Debug, thiserror::Error)]
#[error("timeline: {0}")]
pub struct TimelineError(String);

impl Timeline {
    pub fn new(gpu: Option<Arc<Gpu>>) -> Result<SharedTimeline, TimelineError> {
        let base_device = match &gpu {
            Some(g) => Some(g.mark(&g.compute).map_err(|e| TimelineError(e.to_string()))?),
            None => None,
        };
        Ok(Arc::new(Mutex::new(Self {
            gpu,
            base_host: Instant::now(),
            base_device,
            recording: None,
            pending: Vec::new(),
        })))
    }

    /// Records spans of `step` from now on, or nothing (`None`).
    pub fn record_step(&mut self, step: Option<u32>) {
        self.recording = step;
    }

    /// A mark on the compute stream (or the host clock), if recording.
    pub fn mark(&self) -> Result<Option<Mark>, TimelineError> {
        if self.recording.is_none() {
            return Ok(None);
        }
        Mark::now(self.gpu.as_deref()).map(Some).map_err(TimelineError)
    }

    /// Adds a span between two marks (taken while recording).
    pub fn span(&mut self, track: Track, name: impl Into<String>, start: Mark, end: Mark, info: SpanInfo) {
        if let Some(step) = self.recording {
            self.pending.push(Pending { track, name: name.into(), step, start, end, info });
        }
    }

    /// Adds a span of a given step whatever is being recorded now: collectives that finish after
    /// their step ended still land in it.
    pub fn span_in(
        &mut self,
        step: u32,
        track: Track,
        name: impl Into<String>,
        start: Mark,
        end: Mark,
        info: SpanInfo,
    ) {
        self.pending.push(Pending { track, name: name.into(), step, start, end, info });
    }

    /// The step being recorded, if any.
    pub fn recording_step(&self) -> Option<u32> {
        self.recording
    }

    /// Reads every pending span; call once the step's work has finished.
    pub fn resolve(&mut self) -> Result<Vec<Resolved>, TimelineError> {
        let mut out = Vec::with_capacity(self.pending.len());
        for p in self.pending.drain(..) {
            let at = |m: Mark| -> Result<f64, TimelineError> {
                match (m, &self.gpu, self.base_device) {
                    (Mark::Host(t), _, _) => Ok(t.duration_since(self.base_host).as_secs_f64() * 1e6),
                    (Mark::Device(e), Some(g), Some(base)) => {
                        g.elapsed_ms(base, e).map(|ms| ms * 1e3).map_err(|e| TimelineError(e.to_string()))
                    }
                    _ => Err(TimelineError("a device mark without a device".into())),
                }
            };
            let (s, e) = (at(p.start)?, at(p.end)?);
            out.push(Resolved {
                track: p.track,
                name: p.name,
                step: p.step,
                start_us: s,
                dur_us: (e - s).max(0.0),
                info: p.info,
            });
            if let Some(g) = &self.gpu {
                for m in [p.start, p.end] {
                    if let Mark::Device(ev) = m {
                        g.recycle(ev);
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Writes spans as a Chrome trace-event JSON file (chrome://tracing, ui.perfetto.dev): one process
/// per rank, one thread per track.
pub fn write_chrome_trace(
    path: &Path,
    rank: u32,
    spans: &[Resolved],
    overwrite: bool,
) -> Result<(), zerobench_files::Error> {
    let mut events = Vec::with_capacity(spans.len() + 8);
    let mut tracks: Vec<Track> = spans.iter().map(|s| s.track).collect();
    tracks.sort();
    tracks.dedup();
    events.push(
        serde_json::json!({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": format!("rank {rank}")}}),
    );
    for t in tracks {
        events.push(serde_json::json!({"ph": "M", "name": "thread_name", "pid": rank, "tid": t.id(), "args": {"name": t.label()}}));
    }
    for s in spans {
        let mut args = serde_json::json!({"step": s.step});
        if let Some(b) = s.info.bytes {
            args["bytes"] = b.into();
        }
        events.push(serde_json::json!({
            "ph": "X", "name": s.name, "pid": rank, "tid": s.track.id(),
            "ts": s.start_us, "dur": s.dur_us, "args": args,
        }));
    }
    let doc = serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms"});
    let bytes = doc.to_string().into_bytes();
    // As the rank's log: an earlier trace is replaced only with `--overwrite`, and a link planted
    // under the name is never written through.
    if overwrite {
        zerobench_files::replace(path, &bytes)
    } else {
        zerobench_files::create_new(path, &bytes)
    }
}
