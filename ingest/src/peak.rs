//! Peak throughput per GPU model, for MFU.
//!
//! Dense (no sparsity) tensor-core peaks from NVIDIA's data sheets, in TFLOP/s per GPU: the
//! first column for bf16/fp16 runs, the second for fp32 runs (plain FP32, not TF32). MFU =
//! achieved model TFLOP/s per GPU / this peak. An entry matches a GPU name the run reports where
//! it occurs in it, case-insensitively, as whole tokens: neither the character before it nor the
//! one after it is a letter or digit (`L4` is not the `L40`'s or the `L40S`'s entry, nor `A100`
//! the `A100X`'s, nor `V100` the `V100S`'s; `H100` is the `NVIDIA H100 80GB HBM3`'s and the
//! `NVIDIA A100-SXM4-80GB` is an `A100`). The more specific entries come first (`H100 PCIe`
//! before `H100`); `--peak-tflops` puts the user's entries in front, matched the same way, or
//! replaces the table with one number for every run. A GPU no entry names has no peak, so no MFU.

use zerobench_schema::Precision;

/// (name token(s), bf16/fp16 TFLOP/s, fp32 TFLOP/s)
const BUILTIN: &[(&str, f64, f64)] = &[
    ("GH200", 989.0, 67.0),
    ("H200", 989.0, 67.0),
    ("H100 PCIe", 756.0, 51.0),
    ("H100", 989.0, 67.0),
    ("A100", 312.0, 19.5),
    ("L40S", 362.0, 91.6),
    ("L4", 121.0, 30.3),
    // NVIDIA V100S PCIe data sheet: 130 TFLOPS tensor (fp16), 16.4 TFLOPS single precision.
    ("V100S", 130.0, 16.4),
    ("V100", 125.0, 15.7),
];

/// Whether `name` (lower case) occurs in `gpu` (lower case) as whole tokens: at a place where
/// the characters on either side of it, if any, are neither letters nor digits.
fn names(gpu: &str, name: &str) -> bool {
    let token = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    !name.is_empty()
        && gpu
            .match_indices(name)
            .any(|(at, _)| !token(gpu[..at].chars().next_back()) && !token(gpu[at + name.len()..].chars().next()))
}

/// The peak table in force.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeakTable {
    /// User entries (name token(s), TFLOP/s for any precision), tried before the built-in ones.
    user: Vec<(String, f64)>,
    /// One peak for every run, whatever its device (CPU runs included).
    all: Option<f64>,
}

/// Why a `--peak-tflops` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid peak '{0}': expected a number of TFLOP/s, or NAME=TFLOPS pairs separated by commas")]
pub struct PeakParseError(pub String);

impl PeakTable {
    /// Parses `989` or `H100=989,RTX 4090=165`.
    pub fn parse(spec: &str) -> Result<Self, PeakParseError> {
        let mut t = PeakTable::default();
        t.add(spec)?;
        Ok(t)
    }

    /// Adds one `--peak-tflops` value.
    pub fn add(&mut self, spec: &str) -> Result<(), PeakParseError> {
        let bad = || PeakParseError(spec.to_string());
        if let Ok(v) = spec.trim().parse::<f64>() {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad());
            }
            self.all = Some(v);
            return Ok(());
        }
        let parts: Vec<&str> = spec.split(',').filter(|p| !p.trim().is_empty()).collect();
        if parts.is_empty() {
            return Err(bad());
        }
        for part in parts {
            let (name, v) = part.split_once('=').ok_or_else(bad)?;
            let v: f64 = v.trim().parse().map_err(|_| bad())?;
            if name.trim().is_empty() || !(v.is_finite() && v > 0.0) {
                return Err(bad());
            }
            self.user.push((name.trim().to_string(), v));
        }
        Ok(())
    }

    /// The peak TFLOP/s per GPU for a device name and precision, if known.
    pub fn lookup(&self, gpu: Option<&str>, precision: Option<Precision>) -> Option<f64> {
        if let Some(v) = self.all {
            return Some(v);
        }
        let gpu = gpu?.to_ascii_lowercase();
        if let Some((_, v)) = self.user.iter().find(|(n, _)| names(&gpu, &n.to_ascii_lowercase())) {
            return Some(*v);
        }
        let (_, half, single) = BUILTIN.iter().find(|(n, _, _)| names(&gpu, &n.to_ascii_lowercase()))?;
        Some(match precision {
            Some(Precision::Fp32) => *single,
            _ => *half,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_and_overrides() {
        let t = PeakTable::default();
        assert_eq!(t.lookup(Some("NVIDIA H100 80GB HBM3"), Some(Precision::Bf16)), Some(989.0));
        assert_eq!(t.lookup(Some("NVIDIA H100 PCIe"), None), Some(756.0));
        assert_eq!(t.lookup(Some("NVIDIA A100-SXM4-80GB"), Some(Precision::Fp32)), Some(19.5));
        assert_eq!(t.lookup(Some("NVIDIA L40S"), None), Some(362.0));
        assert_eq!(t.lookup(Some("Intel Xeon"), None), None);
        assert_eq!(t.lookup(None, None), None);
        let u = PeakTable::parse("h100=800, RTX 4090=165").unwrap();
        assert_eq!(u.lookup(Some("NVIDIA H100 80GB HBM3"), None), Some(800.0));
        assert_eq!(u.lookup(Some("NVIDIA GeForce RTX 4090"), None), Some(165.0));
        assert_eq!(u.lookup(Some("NVIDIA A100"), None), Some(312.0));
        assert_eq!(PeakTable::parse("2.5").unwrap().lookup(Some("cpu"), None), Some(2.5));
        for bad in ["", "x", "h100", "h100=", "=5", "h100=-1", "h100=0", "0", "nan"] {
            assert!(PeakTable::parse(bad).is_err(), "{bad}");
        }
    }

    /// An entry is a whole token of the GPU's name: the L4's is not the L40's (whose peak the
    /// table does not know), nor the A100's an A10's; every entry names its own GPU's reported
    /// names, and a name that only begins with an entry's gets none.
    #[test]
    fn entries_match_whole_tokens_only() {
        let t = PeakTable::default();
        let peak = |gpu: &str| t.lookup(Some(gpu), Some(Precision::Bf16));
        for unknown in ["NVIDIA L40", "NVIDIA L40-48GB", "NVIDIA A10", "NVIDIA A10G", "NVIDIA A100X", "NVIDIA H1000"] {
            assert_eq!(peak(unknown), None, "{unknown}");
        }
        for (gpu, want) in [
            ("NVIDIA GH200 480GB", 989.0),
            ("NVIDIA H200", 989.0),
            ("NVIDIA H100 PCIe", 756.0),
            ("NVIDIA H100 80GB HBM3", 989.0),
            ("NVIDIA H100", 989.0),
            ("NVIDIA A100-SXM4-80GB", 312.0),
            ("NVIDIA A100 80GB PCIe", 312.0),
            ("NVIDIA L40S", 362.0),
            ("NVIDIA L4", 121.0),
            ("Tesla V100S-PCIE-32GB", 130.0),
            ("Tesla V100-SXM2-16GB", 125.0),
        ] {
            assert_eq!(peak(gpu), Some(want), "{gpu}");
        }
        // The user's entries too: `A10` is not every A100's.
        let u = PeakTable::parse("A10=125").unwrap();
        assert_eq!(u.lookup(Some("NVIDIA A10"), None), Some(125.0));
        assert_eq!(u.lookup(Some("NVIDIA A100-SXM4-80GB"), None), Some(312.0));
        assert!(names("nvidia l4", "l4") && !names("nvidia l40s", "l4") && !names("gl4", "l4") && !names("l4", ""));
    }
}
