//! Peak throughput per GPU model, for MFU.
//!
//! Dense (no sparsity) tensor-core peaks from NVIDIA's data sheets, in TFLOP/s per GPU: the
//! first column for bf16/fp16 runs, the second for fp32 runs (plain FP32, not TF32). MFU =
//! achieved model TFLOP/s per GPU / this peak. Entries are matched as case-insensitive
//! substrings of the GPU name the run reports, the more specific first; `--peak-tflops` puts the
//! user's entries in front, or replaces the table with one number for every run.

use zerobench_schema::Precision;

/// (name substring, bf16/fp16 TFLOP/s, fp32 TFLOP/s)
const BUILTIN: &[(&str, f64, f64)] = &[
    ("GH200", 989.0, 67.0),
    ("H200", 989.0, 67.0),
    ("H100 PCIe", 756.0, 51.0),
    ("H100", 989.0, 67.0),
    ("A100", 312.0, 19.5),
    ("L40S", 362.0, 91.6),
    ("L4", 121.0, 30.3),
    ("V100", 125.0, 15.7),
];

/// The peak table in force.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeakTable {
    /// User entries (name substring, TFLOP/s for any precision), tried before the built-in ones.
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
        if let Some((_, v)) = self.user.iter().find(|(n, _)| gpu.contains(&n.to_ascii_lowercase())) {
            return Some(*v);
        }
        let (_, half, single) = BUILTIN.iter().find(|(n, _, _)| gpu.contains(&n.to_ascii_lowercase()))?;
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
}
