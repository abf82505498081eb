//! Order statistics with one definition for every part: the worker's run summary
//! (`step_ms_median`) and ingest's tables.

/// The `q` quantile (0..=1) of `values` by linear interpolation between closest ranks (numpy's
/// default, "type 7"): position `q·(n−1)` in the sorted values. `None` for no values.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    quantile_sorted(&v, q)
}

/// [`quantile`] of values already sorted ascending.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    let frac = pos - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// The median: [`quantile`] 0.5 (the mean of the middle two of an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    quantile(values, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_linear() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(median(&v), Some(2.5));
        assert_eq!(quantile(&v, 0.1), Some(1.3));
        assert_eq!(quantile(&v, 0.9).map(|x| (x * 1e9).round() / 1e9), Some(3.7));
        assert_eq!(quantile(&[5.0], 0.9), Some(5.0));
        assert_eq!(median(&[]), None);
    }

    /// Logs list step times in step order, not sorted: a quantile that skipped sorting would take
    /// the middle step, not the median.
    #[test]
    fn quantiles_sort_unsorted_input() {
        let v = [9.0, 1.0, 4.0, 100.0, 2.0];
        assert_eq!(median(&v), Some(4.0));
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert_eq!(quantile(&v, 1.0), Some(100.0));
        assert_eq!(quantile(&v, 0.25), Some(2.0));
        // The caller's order is left alone.
        assert_eq!(v, [9.0, 1.0, 4.0, 100.0, 2.0]);
    }
}
