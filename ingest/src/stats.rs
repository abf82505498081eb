//! Order statistics, and the step-time figures of a run made of them (one definition for
//! zerobench's logs and for foreign ones).

use crate::run::RunRow;

// The quantiles live in the schema crate: the worker's `summary.step_ms_median` uses the same ones.
pub use zerobench_schema::stats::{median, quantile, quantile_sorted};

/// `x` rounded to `digits` significant digits: the precision reported figures carry, so that
/// every output format shows the same number.
pub fn round_sig(x: f64, digits: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(digits - 1 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// Rounds an optional figure in place.
pub fn round_opt(x: &mut Option<f64>) {
    if let Some(v) = x.as_mut() {
        *v = round_sig(*v, SIGNIFICANT);
    }
}

/// Significant digits of reported figures.
pub const SIGNIFICANT: i32 = 6;

#[cfg(test)]
mod round_tests {
    use super::*;

    #[test]
    fn significant_digits() {
        assert_eq!(round_sig(123.456789, 6), 123.457);
        assert_eq!(round_sig(0.000123456789, 3), 0.000123);
        assert_eq!(round_sig(-98765.4321, 2), -99000.0);
        assert_eq!(round_sig(0.0, 6), 0.0);
    }
}

/// The sum of `values`, starting from +0.0 (the standard `Sum` starts from −0.0, which would
/// print as `-0.0` for a run without communication).
pub fn fsum(values: impl IntoIterator<Item = f64>) -> f64 {
    values.into_iter().fold(0.0, |a, b| a + b)
}

/// One measured step's times in ms, with its communication where the log has it.
#[derive(Debug, Clone, Copy)]
pub struct StepTimes {
    pub step: f64,
    pub forward: f64,
    pub backward: f64,
    pub optimizer: f64,
    pub comm: Option<f64>,
    pub exposed_comm: Option<f64>,
}

/// Fills in the step-time figures of `row` from its measured steps: median, p10, p90 and mean of
/// the step time, the median and the share of every phase, and the share of communication (Σ communication /
/// Σ step time) where every step has its communication time.
pub fn step_figures(row: &mut RunRow, steps: &[StepTimes]) {
    if steps.is_empty() {
        return;
    }
    let mut t: Vec<f64> = steps.iter().map(|s| s.step).collect();
    let total = fsum(t.iter().copied());
    t.sort_by(f64::total_cmp);
    row.step_ms_median = quantile_sorted(&t, 0.5);
    row.step_ms_p10 = quantile_sorted(&t, 0.1);
    row.step_ms_p90 = quantile_sorted(&t, 0.9);
    row.step_ms_mean = Some(total / t.len() as f64);
    let med = |f: fn(&StepTimes) -> f64| median(&steps.iter().map(f).collect::<Vec<_>>());
    row.forward_ms_median = med(|s| s.forward);
    row.backward_ms_median = med(|s| s.backward);
    row.optimizer_ms_median = med(|s| s.optimizer);
    let phase_share = |f: fn(&StepTimes) -> f64| (total > 0.0).then(|| fsum(steps.iter().map(f)) / total);
    row.forward_frac = phase_share(|s| s.forward);
    row.backward_frac = phase_share(|s| s.backward);
    row.optimizer_frac = phase_share(|s| s.optimizer);
    // A median or share over only the steps that have the time would misstate the run.
    let every = |f: fn(&StepTimes) -> Option<f64>| steps.iter().map(f).collect::<Option<Vec<f64>>>();
    let share = |v: &[f64]| (total > 0.0).then(|| fsum(v.iter().copied()) / total);
    if let Some(comm) = every(|s| s.comm) {
        row.comm_ms_median = median(&comm);
        row.comm_frac = share(&comm);
    }
    if let Some(exposed) = every(|s| s.exposed_comm) {
        row.exposed_comm_ms_median = median(&exposed);
        row.exposed_comm_frac = share(&exposed);
    }
}
