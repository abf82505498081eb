//! The `predicted` table: each run next to what a cost model predicted for its configuration, and
//! the error. Ingest does not predict (the cost model is a crate of its own, and a caller fills
//! [`crate::tables::Tables::predicted`]); it writes the table in every format and draws
//! `predicted-vs-measured.svg` from it.

use serde::Serialize;

/// One run, measured and predicted. Errors are (predicted / measured − 1) in percent.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PredictedRow {
    pub run_id: String,
    pub model: String,
    pub stage: Option<u8>,
    pub offload: String,
    pub micro_batch: Option<u32>,
    pub seq_len: Option<u32>,
    pub gpus: Option<u32>,
    pub step_ms: Option<f64>,
    pub predicted_step_ms: Option<f64>,
    pub step_error_pct: Option<f64>,
    pub peak_allocated_bytes: Option<u64>,
    pub predicted_peak_allocated_bytes: Option<u64>,
    pub memory_error_pct: Option<f64>,
    /// With offload: the host AdamW rate (1e9 parameters/s) the host's update was priced at.
    pub host_adamw_gparams_per_s: Option<f64>,
    /// The terms extrapolated for this configuration, or why there is no prediction.
    pub notes: String,
}

impl PredictedRow {
    /// Every figure to [`crate::stats::SIGNIFICANT`] digits, as the other tables print them.
    pub fn round(mut self) -> Self {
        for v in [
            &mut self.step_ms,
            &mut self.predicted_step_ms,
            &mut self.step_error_pct,
            &mut self.memory_error_pct,
            &mut self.host_adamw_gparams_per_s,
        ] {
            crate::stats::round_opt(v);
        }
        self
    }
}

/// One group of runs that differ only in the stage, as a cost model chooses among them: the
/// stage it prices fastest against the stage measured fastest (the median of each stage's runs).
/// A caller fills [`crate::tables::Tables::stage_choice`] (`zerobench ingest --cost-model`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StageChoiceRow {
    pub model: String,
    pub variant: String,
    pub offload: String,
    pub micro_batch: Option<u32>,
    pub seq_len: Option<u32>,
    pub grad_accum: Option<u32>,
    pub gpus: Option<u32>,
    pub nodes: Option<u32>,
    /// The worker's build, as the other tables name it ([`crate::run::BuildNames`]): a group holds
    /// the runs of one build.
    pub build: String,
    /// The stages measured, and for each (in that order, `;`-separated) its runs, the median of
    /// their step times and the model's price of it.
    pub stages: String,
    pub runs: String,
    pub step_ms: String,
    pub predicted_step_ms: String,
    pub chosen_stage: u8,
    pub fastest_stage: u8,
    /// The chosen stage is the fastest measured; within 2% of it; not, and its repeats and the
    /// fastest's separate (three runs each or more, every run of one faster than every run of the
    /// other).
    pub right: bool,
    pub right_within_tie: bool,
    pub shown_slower: bool,
    /// Every stage has three runs or more and the fastest stage's runs are all faster than all of
    /// the others': the repeats say which stage is fastest.
    pub decided: bool,
    /// Every run of the group kept the GPU 90% busy or more.
    pub device_bound: bool,
    /// The chosen stage's measured median over the fastest's, minus 1, in percent.
    pub regret_pct: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounding keeps every field and cuts only the figures, to six significant digits.
    #[test]
    fn rounding_cuts_figures_and_keeps_the_rest() {
        let row = PredictedRow {
            run_id: "r".into(),
            gpus: Some(2),
            step_ms: Some(123.456_789),
            predicted_step_ms: Some(0.012_345_678),
            step_error_pct: Some(-12.345_678_9),
            peak_allocated_bytes: Some(123_456_789),
            memory_error_pct: Some(1.0),
            notes: "n".into(),
            ..PredictedRow::default()
        };
        let want = PredictedRow {
            step_ms: Some(123.457),
            predicted_step_ms: Some(0.012_345_7),
            step_error_pct: Some(-12.345_7),
            ..row.clone()
        };
        assert_eq!(row.round(), want);
    }
}
