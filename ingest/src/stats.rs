//! Order statistics, sums and the rounding of reported figures.

// The quantiles live in the schema crate: the worker's `summary.step_ms_median` uses the same ones.
pub use zerobench_schema::stats::{median, quantile, quantile_sorted};

/// `x` rounded to `digits` significant digits (at least one): the precision reported figures
/// carry, so that every output format shows the same number.
///
/// The rounding is decimal: the shortest decimal that reads back as `x` (the digits `x` prints
/// as) is cut to `digits` digits, half away from zero, and the result is the number nearest that
/// decimal, so it prints as those digits (13110700000, not the 13110699999.999998 that dividing by
/// an inexact power of ten gave). Ties are those of the printed digits: 0.15 to one digit is 0.2.
pub fn round_sig(x: f64, digits: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let digits = usize::try_from(digits).unwrap_or(0).max(1);
    // `d.ddddde±x`, at most 17 digits.
    let shortest = format!("{:e}", x.abs());
    let Some((mantissa, exp)) = shortest.split_once('e') else { return x };
    let Ok(exp) = exp.parse::<i32>() else { return x };
    let kept: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
    if kept.len() <= digits {
        return x;
    }
    let mut significand = kept[..digits].iter().fold(0u64, |m, d| m * 10 + u64::from(d - b'0'));
    if kept[digits] >= b'5' {
        significand += 1;
    }
    let sign = if x < 0.0 { "-" } else { "" };
    // Parsing rounds correctly: the nearest number to the decimal (a carry, 999999.5 to
    // 1000000, is only a longer significand).
    let scale = exp - (digits as i32 - 1);
    format!("{sign}{significand}e{scale}").parse().unwrap_or(x)
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
        assert_eq!(round_sig(-0.0, 6).to_bits(), (-0.0f64).to_bits());
        assert_eq!(round_sig(1092096.0, 6), 1092100.0);
        assert_eq!(round_sig(999999.5, 6), 1000000.0);
        assert_eq!(round_sig(-999999.5, 6), -1000000.0);
        assert_eq!(round_sig(1234565.0, 6), 1234570.0);
        assert_eq!(round_sig(0.15, 1), 0.2);
        assert_eq!(round_sig(2.5, 1), 3.0);
        assert_eq!(round_sig(-2.5, 1), -3.0);
        assert_eq!(round_sig(42.0, 6), 42.0);
        assert_eq!(round_sig(1.5e-300, 6), 1.5e-300);
        assert_eq!(round_sig(1.23456789e300, 3), 1.23e300);
        assert_eq!(round_sig(f64::MAX, 6), 1.79769e308);
        assert_eq!(round_sig(f64::MIN_POSITIVE, 3), 2.23e-308);
        assert_eq!(round_sig(5e-324, 6), 5e-324);
        assert!(round_sig(f64::NAN, 6).is_nan());
        assert_eq!(round_sig(f64::INFINITY, 6), f64::INFINITY);
        // Fewer digits than one: one.
        assert_eq!(round_sig(123.0, 0), 100.0);
    }

    /// Rounding leaves no noise behind: the result prints as the rounded digits, where dividing
    /// by a rounded power of ten left 13110699999.999998 and 0.30000000000000004-like tails.
    #[test]
    fn rounded_figures_print_as_their_digits() {
        let cases = [
            (13110699999.999998, "13110700000"),
            (13110700000.000002, "13110700000"),
            (1.3110699999999998e10, "13110700000"),
            (0.30000000000000004, "0.3"),
            (1.0000000000000002, "1"),
            (123.456789, "123.457"),
            (0.000123456789, "0.000123457"),
            (-98765.4321, "-98765.4"),
            (6.02214076e23, "602214000000000000000000"),
            (1.602176634e-19, "0.000000000000000000160218"),
            (29.999999999999996, "30"),
        ];
        for (x, want) in cases {
            let r = round_sig(x, 6);
            assert_eq!(format!("{r}"), want, "{x:e}");
            assert_eq!(r, want.parse::<f64>().unwrap(), "{x:e}");
        }
        // Every figure of a few digits is itself; a long one is its first six digits' number.
        for m in 1..=20_000u32 {
            for scale in [1e-9, 1e-3, 0.1, 1.0, 7.0, 1e3, 1e9, 1e15] {
                let x = f64::from(m) * scale;
                let r = round_sig(x, 6);
                let printed = format!("{r:e}");
                let (mantissa, _) = printed.split_once('e').unwrap();
                assert!(mantissa.bytes().filter(u8::is_ascii_digit).count() <= 6, "{x:e} gave {printed}");
                assert_eq!(round_sig(r, 6), r, "{x:e}");
            }
        }
    }
}
