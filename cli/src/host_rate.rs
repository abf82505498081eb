//! The AdamW rate of the host a run ran on, for the cost model's offload terms
//! (docs/cost-model.md, "The host's AdamW rate"). It is `examples/cpu_adamw`'s output saved as
//! `cpu_adamw.json` beside the runs: in a run's folder or a folder above it, up to the folder the
//! command was given, the nearest one counting. `bench/gpu/run.sh` saves it there for each host.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};

/// The file's name.
pub const FILE: &str = "cpu_adamw.json";
/// Its field: parameters updated per second, all the host's cores.
const FIELD: &str = "adamw_params_per_s";

/// Finds each run's host rate, looking at each folder once: runs of one sweep share their folders.
pub struct HostRates<'a> {
    roots: &'a [PathBuf],
    /// Folder -> the rate found at or above it (`None`: no file up to its root).
    seen: HashMap<PathBuf, Option<f64>>,
}

impl<'a> HostRates<'a> {
    /// `roots`: the folders the command was given; no file above them is looked at.
    pub fn new(roots: &'a [PathBuf]) -> Self {
        HostRates { roots, seen: HashMap::new() }
    }

    /// The rate of the nearest file at or above `run_dir`, in 1e9 parameters/s; `None` where there
    /// is none. A file that cannot be read or holds no rate is an error naming it.
    pub fn of(&mut self, run_dir: &Path) -> anyhow::Result<Option<f64>> {
        // The deepest root the run lies in bounds the search (a run outside every root: its own
        // folder only). Every run that reaches a folder has the same deepest root, so what a
        // folder found holds for all of them.
        let root = self.roots.iter().filter(|r| run_dir.starts_with(r)).max_by_key(|r| r.components().count());
        let (mut walked, mut found) = (Vec::new(), None);
        for dir in run_dir.ancestors() {
            if let Some(&rate) = self.seen.get(dir) {
                found = rate;
                break;
            }
            walked.push(dir.to_path_buf());
            let file = dir.join(FILE);
            if file.is_file() {
                found = Some(read(&file)?);
                break;
            }
            if root.is_none_or(|r| dir == r.as_path()) {
                break;
            }
        }
        for dir in walked {
            self.seen.insert(dir, found);
        }
        Ok(found)
    }
}

/// The last JSON line of `file` that holds the rate (the example prints one object; other lines
/// are what else its run printed), in 1e9 parameters/s.
fn read(file: &Path) -> anyhow::Result<f64> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let mut rate = None;
    for (i, line) in text.lines().enumerate() {
        let at = || format!("{}:{}", file.display(), i + 1);
        if !line.trim_start().starts_with('{') {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| anyhow!("{}: not a JSON object ({e})", at()))?;
        let Some(field) = v.get(FIELD) else { continue };
        match field.as_f64() {
            Some(r) if r.is_finite() && r > 0.0 => rate = Some(r / 1e9),
            _ => bail!("{}: {FIELD} is {field}, not a positive number", at()),
        }
    }
    rate.ok_or_else(|| anyhow!("{}: no line with {FIELD} (examples/cpu_adamw's output)", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(FILE), text).unwrap();
    }

    /// The nearest file counts, never one above the folder given; the last rate in a file counts.
    #[test]
    fn the_nearest_file_within_the_folder_given_counts() {
        let t = tempfile::tempdir().unwrap();
        let sweep = t.path().join("host-a/runs");
        let run = sweep.join("cm-fit/gpt2_z2");
        std::fs::create_dir_all(&run).unwrap();
        write(t.path(), r#"{"adamw_params_per_s": 9e9}"#);
        write(&sweep, "cpu_adamw: starting\n{\"adamw_params_per_s\": 4.0e9}\n{\"adamw_params_per_s\": 4.5e9}\n");
        let roots = [sweep.join("cm-fit")];
        let mut rates = HostRates::new(&roots);
        // Given cm-fit, the sweep's file above it is out of bounds; given the sweep, it counts.
        assert_eq!(rates.of(&run).unwrap(), None);
        let roots = [t.path().join("host-a")];
        assert_eq!(HostRates::new(&roots).of(&run).unwrap(), Some(4.5));
        // A file in the run's own folder is nearer.
        write(&run, r#"{"adamw_params_per_s": 6e9}"#);
        assert_eq!(HostRates::new(&roots).of(&run).unwrap(), Some(6.0));
        // One lookup serves a sweep: a second run of it is answered from the folders the first
        // walked (the sweep's file, gone since, is not read again), and a run with a file of its
        // own still finds that one.
        let mut rates = HostRates::new(&roots);
        let (second, own) = (sweep.join("cm-fit/gpt2_z3"), sweep.join("cm-fit/gpt2_z1"));
        write(&own, r#"{"adamw_params_per_s": 7e9}"#);
        std::fs::create_dir_all(&second).unwrap();
        assert_eq!(rates.of(&run.parent().unwrap().join("gpt2_z0")).unwrap(), Some(4.5));
        std::fs::remove_file(sweep.join(FILE)).unwrap();
        assert_eq!((rates.of(&second).unwrap(), rates.of(&own).unwrap()), (Some(4.5), Some(7.0)));
        assert_eq!(HostRates::new(&roots).of(&second).unwrap(), None);
    }

    /// A file without a rate, with a line that is not JSON or a rate that is not positive: an
    /// error naming the file (and line).
    #[test]
    fn a_bad_file_is_an_error_naming_it() {
        let t = tempfile::tempdir().unwrap();
        let roots = [t.path().to_path_buf()];
        for (text, says) in [
            ("{\"threads\": 16}\n", "no line with adamw_params_per_s"),
            ("{\"adamw_params_per_s\": 4e9}\n{not json\n", ":2: not a JSON object"),
            ("{\"adamw_params_per_s\": -1}\n", ":1: adamw_params_per_s is -1"),
            ("{\"adamw_params_per_s\": \"fast\"}\n", ":1: adamw_params_per_s is \"fast\""),
        ] {
            write(t.path(), text);
            let e = HostRates::new(&roots).of(t.path()).unwrap_err().to_string();
            assert!(e.contains(FILE) && e.contains(says), "{text:?}: {e}");
        }
    }
}
