//! Order statistics, sums and the rounding of reported figures.

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

/// The sum of `values`, starting from +0.0 (the standard `Sum` starts from −0.0, which would
/// print as `-0.0` for a run without communication).
pub fn fsum(values: impl IntoIterator<Item = f64>) -> f64 {
    values.into_iter().fold(0.0, |a, b| a + b)
}

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
