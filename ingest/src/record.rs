//! Borrowed views of worker log lines that keep only what ingest aggregates.
//!
//! Most of a log is `step` records, so they get a fast path: the writer serialises the
//! internally tagged `Record` enum, which puts `{"event":"step","v":1,` first on every step line.
//! A line with that exact prefix is parsed straight into [`StepLine`], whose fields borrow from
//! the line and which ignores every field it does not name (serde skips them without converting
//! numbers). Going through `Record` would make serde buffer each line into its own tree first to
//! find the tag. Any other line (other records, another key order, another version) takes the
//! general path through the schema crate's own parser.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use zerobench_schema::log::{MemorySample, Step};

use crate::collective::Collective;

/// The first bytes of every step line of the current schema version.
pub const STEP_PREFIX: &[u8] = b"{\"event\":\"step\",\"v\":1,";

/// The fields of a `step` record that ingest uses.
#[derive(Debug, Deserialize)]
pub struct StepLine<'a> {
    pub rank: u32,
    pub step: u32,
    #[serde(default)]
    pub skipped: bool,
    pub loss: f64,
    pub tokens: u64,
    pub samples: u64,
    pub step_ms: f64,
    pub forward_ms: f64,
    pub backward_ms: f64,
    pub optimizer_ms: f64,
    pub comm_ms: f64,
    pub exposed_comm_ms: f64,
    #[serde(borrow, default)]
    pub comm: CommLines<'a>,
    #[serde(default)]
    pub memory: MemLine,
    #[serde(default)]
    pub energy_j: Option<f64>,
}

impl StepLine<'_> {
    /// Times must be finite, not negative and below [`MAX_MS`]; JSON already excludes NaN and
    /// infinities.
    pub fn check(&self) -> Result<(), String> {
        let times = [
            ("step_ms", self.step_ms),
            ("forward_ms", self.forward_ms),
            ("backward_ms", self.backward_ms),
            ("optimizer_ms", self.optimizer_ms),
            ("comm_ms", self.comm_ms),
            ("exposed_comm_ms", self.exposed_comm_ms),
        ];
        for (name, v) in times {
            plausible(v).map_err(|why| format!("{name} {why}"))?;
        }
        for (kind, c) in self.comm.iter() {
            // The name is only formatted for the message.
            plausible(c.ms).map_err(|why| format!("comm.{kind}.ms {why}"))?;
        }
        Ok(())
    }
}

/// The longest duration accepted, in ms (a million seconds, over 11 days): anything longer in a
/// step record is a corrupt value, and would swamp every sum it entered.
pub const MAX_MS: f64 = 1e9;

/// Why a duration is refused, if it is.
fn plausible(v: f64) -> Result<(), String> {
    if v < 0.0 {
        return Err(format!("is negative ({v})"));
    }
    if v > MAX_MS {
        return Err(format!("of {v} ms is implausible (over {MAX_MS} ms)"));
    }
    Ok(())
}

impl<'a> From<&'a Step> for StepLine<'a> {
    fn from(s: &'a Step) -> Self {
        let mut comm = CommLines::default();
        for (k, c) in &s.comm {
            comm.push(Cow::Borrowed(k.as_str()), CommLine { calls: c.calls, bytes: c.bytes, ms: c.ms });
        }
        StepLine {
            rank: s.rank,
            step: s.step,
            skipped: s.skipped,
            loss: s.loss,
            tokens: s.tokens,
            samples: s.samples,
            step_ms: s.step_ms,
            forward_ms: s.forward_ms,
            backward_ms: s.backward_ms,
            optimizer_ms: s.optimizer_ms,
            comm_ms: s.comm_ms,
            exposed_comm_ms: s.exposed_comm_ms,
            comm,
            memory: MemLine::from(&s.memory),
            energy_j: s.energy_j,
        }
    }
}

/// One collective kind within a step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
pub struct CommLine {
    #[serde(default)]
    pub calls: u64,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub ms: f64,
}

/// The `comm` map of a step: known kinds in fixed slots (no allocation), any other name in a
/// list that stays empty, and so unallocated, for the worker's own kinds.
#[derive(Debug, Default)]
pub struct CommLines<'a> {
    pub known: [Option<CommLine>; Collective::ALL.len()],
    pub other: Vec<(Cow<'a, str>, CommLine)>,
}

impl<'a> CommLines<'a> {
    pub(crate) fn push(&mut self, name: Cow<'a, str>, c: CommLine) {
        match Collective::from_name(&name) {
            Some(k) => self.known[k.index()] = Some(c),
            None => self.other.push((name, c)),
        }
    }

    /// Every entry with its name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &CommLine)> {
        let known = Collective::ALL.iter().filter_map(|k| self.known[k.index()].as_ref().map(|c| (k.as_str(), c)));
        known.chain(self.other.iter().map(|(n, c)| (n.as_ref(), c)))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for CommLines<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = CommLines<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from collective kind to its statistics")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Self::Value, M::Error> {
                let mut out = CommLines::default();
                while let Some(Key(k)) = m.next_key::<Key<'de>>()? {
                    let c: CommLine = m.next_value()?;
                    out.push(k, c);
                }
                Ok(out)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// A map key that borrows from the input when it can (no escapes) and owns it otherwise.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// The memory figures of a step that ingest takes peaks of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct MemLine {
    #[serde(default)]
    pub allocated_bytes: Option<u64>,
    #[serde(default)]
    pub peak_allocated_bytes: Option<u64>,
    #[serde(default)]
    pub reserved_bytes: Option<u64>,
    #[serde(default)]
    pub peak_reserved_bytes: Option<u64>,
    #[serde(default)]
    pub nvml_used_bytes: Option<u64>,
    #[serde(default)]
    pub rss_bytes: Option<u64>,
}

impl From<&MemorySample> for MemLine {
    fn from(m: &MemorySample) -> Self {
        MemLine {
            allocated_bytes: m.allocated_bytes,
            peak_allocated_bytes: m.peak_allocated_bytes,
            reserved_bytes: m.reserved_bytes,
            peak_reserved_bytes: m.peak_reserved_bytes,
            nvml_used_bytes: m.nvml_used_bytes,
            rss_bytes: Some(m.rss_bytes),
        }
    }
}

/// The version of any record: enough to tell an unknown version from a broken line.
#[derive(Debug, Deserialize)]
pub struct Envelope {
    #[serde(default)]
    pub v: Option<u64>,
}
