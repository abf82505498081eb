//! Small validated values of a spec. Each checks itself while the YAML is parsed, so a bad value
//! is reported by serde_yaml with the key path, line and column, and nothing downstream has to
//! check again.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Generates `Deserialize` through `FromStr` for a string newtype, and `Display`/`Serialize` as
/// the stored text.
macro_rules! string_value {
    ($ty:ident) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
        impl Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// A value of the program's own, such as a default, that is known to pass its check.
pub(crate) fn builtin<T: FromStr<Err = String>>(s: &'static str) -> T {
    s.parse().unwrap_or_else(|e| unreachable!("built-in value {s}: {e}"))
}

/// A Slurm partition, account or QOS name: letters, digits, `_`, `-`, `.`. Slurm itself allows
/// little more, and this keeps `#SBATCH` lines free of anything sbatch or bash would interpret.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlurmName(String);
string_value!(SlurmName);

impl SlurmName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for SlurmName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() || s.len() > 64 {
            return Err(format!("'{}' must be 1 to 64 characters", s.escape_debug()));
        }
        if let Some(c) = s.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))) {
            return Err(format!(
                "'{}' contains '{}'; Slurm names are letters, digits, '_', '-' and '.'",
                s.escape_debug(),
                c.escape_debug()
            ));
        }
        Ok(SlurmName(s.to_string()))
    }
}

/// A Slurm time limit in one of sbatch's forms: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`
/// (`0` means no limit). Stored as written and as seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeLimit {
    text: String,
    seconds: u64,
}
string_value!(TimeLimit);

impl TimeLimit {
    pub fn as_str(&self) -> &str {
        &self.text
    }
    /// The limit in seconds; `None` for `0` (unlimited).
    pub fn seconds(&self) -> Option<u64> {
        (self.seconds > 0).then_some(self.seconds)
    }
}

impl FromStr for TimeLimit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{}' is not a Slurm time (minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S)", s.escape_debug());
        let num = |t: &str| -> Result<u64, String> {
            if t.is_empty() || t.len() > 7 || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            t.parse().map_err(|_| bad())
        };
        let (days, rest) = match s.split_once('-') {
            Some((d, r)) => (Some(num(d)?), r),
            None => (None, s),
        };
        let parts: Vec<u64> = rest.split(':').map(num).collect::<Result<_, _>>()?;
        let seconds = match (days, parts.as_slice()) {
            (None, [m]) => m * 60,
            (None, [m, s]) => m * 60 + s,
            (None, [h, m, s]) => h * 3600 + m * 60 + s,
            (Some(d), [h]) => d * 86400 + h * 3600,
            (Some(d), [h, m]) => d * 86400 + h * 3600 + m * 60,
            (Some(d), [h, m, s]) => d * 86400 + h * 3600 + m * 60 + s,
            _ => return Err(bad()),
        };
        Ok(TimeLimit { text: s.to_string(), seconds })
    }
}

/// An environment variable name: `[A-Za-z_][A-Za-z0-9_]*`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EnvName(String);
string_value!(EnvName);

impl EnvName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for EnvName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let ok = s.len() <= 128
            && s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(format!(
                "'{}' is not an environment variable name (letters, digits and '_', not starting with a digit)",
                s.escape_debug()
            ));
        }
        Ok(EnvName(s.to_string()))
    }
}

/// Free text that ends up in a script (a module name, an environment value, a path): anything but
/// NUL, which no argument or environment variable can hold. Quoting makes the rest harmless.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Text(String);
string_value!(Text);

impl Text {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for Text {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.contains('\0') {
            return Err("contains a NUL byte, which no argument or environment variable can hold".into());
        }
        if s.is_empty() {
            return Err("must not be empty".into());
        }
        Ok(Text(s.to_string()))
    }
}

/// A byte count: a number of bytes, or a number with a unit (`80GB`, `80 GiB`, `40960MiB`).
/// Decimal units are powers of 1000, binary ones of 1024; `G` alone means GiB as in Slurm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let value: f64 = num.parse().map_err(|_| format!("'{}' is not a size like 80GB or 80GiB", s.escape_debug()))?;
        let mult: f64 = match unit.trim() {
            "" | "B" => 1.0,
            "kB" | "KB" => 1e3,
            "MB" => 1e6,
            "GB" => 1e9,
            "TB" => 1e12,
            "K" | "KiB" => 1024.0,
            "M" | "MiB" => 1024f64.powi(2),
            "G" | "GiB" => 1024f64.powi(3),
            "T" | "TiB" => 1024f64.powi(4),
            u => {
                return Err(format!("unknown size unit '{}' (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)", u.escape_debug()))
            }
        };
        let bytes = value * mult;
        if !(1.0..1e18).contains(&bytes) {
            return Err(format!("'{}' is not a size between 1 byte and 1 EB", s.escape_debug()));
        }
        Ok(ByteSize(bytes.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&human_bytes(self.0))
    }
}

/// Bytes in GiB/MiB/KiB with two decimals, for tables.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [(&str, f64); 4] =
        [("TiB", 1099511627776.0), ("GiB", 1073741824.0), ("MiB", 1048576.0), ("KiB", 1024.0)];
    let x = b as f64;
    for (name, size) in UNITS {
        if x >= size {
            return format!("{:.2} {name}", x / size);
        }
    }
    format!("{b} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_names() {
        assert!("gpu-a100_x.1".parse::<SlurmName>().is_ok());
        for bad in ["", "a b", "a;b", "a\nb", "$(x)", "a'b", "ü"] {
            assert!(bad.parse::<SlurmName>().is_err(), "{bad:?}");
        }
        // Up to 64 characters.
        assert!("a".repeat(64).parse::<SlurmName>().is_ok());
        let e = "a".repeat(65).parse::<SlurmName>().unwrap_err();
        assert!(e.contains("must be 1 to 64 characters"), "{e}");
    }

    #[test]
    fn time_limits_in_every_sbatch_form() {
        let secs = |s: &str| s.parse::<TimeLimit>().unwrap().seconds();
        assert_eq!(secs("30"), Some(1800));
        assert_eq!(secs("30:15"), Some(1815));
        assert_eq!(secs("01:00:00"), Some(3600));
        assert_eq!(secs("2-0"), Some(172800));
        assert_eq!(secs("1-02:03"), Some(93780));
        assert_eq!(secs("1-00:00:01"), Some(86401));
        assert_eq!(secs("01:02:03"), Some(3723));
        assert_eq!(secs("1-02:03:04"), Some(93784));
        assert_eq!(secs("2-3"), Some(183_600));
        // Seven digits a number at most (a week of minutes is five).
        assert_eq!(secs("9999999"), Some(599_999_940));
        assert_eq!("1-02:03".parse::<TimeLimit>().unwrap().as_str(), "1-02:03");
        assert_eq!(secs("0"), None);
        for bad in ["", "1:2:3:4", "x", "1-", "-1", "1--2", "1h", "1-1:1:1:1", "99999999"] {
            assert!(bad.parse::<TimeLimit>().is_err(), "{bad}");
        }
    }

    #[test]
    fn env_names_and_sizes() {
        assert!("NCCL_DEBUG".parse::<EnvName>().is_ok());
        assert!("_X1".parse::<EnvName>().is_ok());
        for bad in ["1X", "A-B", "", "A B", "A=B"] {
            assert!(bad.parse::<EnvName>().is_err(), "{bad}");
        }
        assert_eq!("80GB".parse::<ByteSize>().unwrap().0, 80_000_000_000);
        assert_eq!("80 GiB".parse::<ByteSize>().unwrap().0, 80 << 30);
        assert_eq!("1.5G".parse::<ByteSize>().unwrap().0, 3 << 29);
        assert!("80 parsecs".parse::<ByteSize>().is_err());
        assert!("0GB".parse::<ByteSize>().is_err());
        // Shown as tables show bytes.
        assert_eq!("1.5G".parse::<ByteSize>().unwrap().to_string(), human_bytes(3 << 29));
        assert_eq!(human_bytes(3 << 29), "1.50 GiB");
        assert_eq!(human_bytes(3 << 29), "1.50 GiB");
    }
}
