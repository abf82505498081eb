//! Order statistics.

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
}

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
