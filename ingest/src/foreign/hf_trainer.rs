//! Hugging Face Trainer result dicts, printed at the end of `trainer.train()`:
//! `{'train_runtime': 742.5369, 'train_samples_per_second': 227.686, 'train_steps_per_second':
//! 7.119, 'train_loss': 0.1686, 'epoch': 3.0}`, possibly behind a host prefix added by the
//! launcher (`10.254.21.77: {...}`). Each such line is one process's report; the samples per
//! second are global (all processes). Of the evaluation dicts (`{'eval_loss': ...}`) the last
//! loss is kept; logging dicts (`{'loss': ...}`) are recognised and not used. ANSI colour escapes
//! are taken out of a line first ([`strip_ansi`]); a runtime, rate or epoch that is `nan`, infinite
//! or negative is no value ([`quantity`]), a loss that is not finite neither.

use std::sync::LazyLock;

use regex::Regex;

use super::text::{quantity, strip_ansi};

static DICT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\{'(?:train_runtime|eval_loss|loss)':[^}]*\}").expect("valid regex"));
static PAIR: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"'(\w+)': ([-+0-9.eE]+|nan|inf)").expect("valid regex"));

/// One `train_runtime` dict.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TrainResult {
    pub runtime_s: Option<f64>,
    pub samples_per_s: Option<f64>,
    pub steps_per_s: Option<f64>,
    pub loss: Option<f64>,
    pub epoch: Option<f64>,
}

/// What the Trainer lines of one run say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HfTrainer {
    pub lines: u64,
    pub results: Vec<TrainResult>,
    /// The last evaluation loss printed.
    pub eval_loss: Option<f64>,
}

impl HfTrainer {
    /// Adds another file's reports of the same run.
    pub fn merge(&mut self, o: &HfTrainer) {
        self.lines += o.lines;
        self.results.extend_from_slice(&o.results);
        self.eval_loss = self.eval_loss.or(o.eval_loss);
    }

    /// Reads one line; returns whether it held a Trainer dict.
    pub fn line(&mut self, line: &str) -> bool {
        let line = strip_ansi(line);
        let Some(m) = DICT.find(&line) else { return false };
        self.lines += 1;
        let dict = m.as_str();
        if dict.starts_with("{'eval_loss'") {
            if let Some(l) = PAIR.captures_iter(dict).find(|c| &c[1] == "eval_loss").and_then(|c| loss(&c[2])) {
                self.eval_loss = Some(l);
            }
            return true;
        }
        if !dict.starts_with("{'train_runtime'") {
            return true;
        }
        let mut r = TrainResult::default();
        for c in PAIR.captures_iter(dict) {
            // `nan` and `inf` (a diverged loss) are recognised and left out; so is a time, rate
            // or epoch below 0.
            let v = &c[2];
            match &c[1] {
                "train_runtime" => r.runtime_s = quantity(v),
                "train_samples_per_second" => r.samples_per_s = quantity(v),
                "train_steps_per_second" => r.steps_per_s = quantity(v),
                "train_loss" => r.loss = loss(v),
                "epoch" => r.epoch = quantity(v),
                _ => {}
            }
        }
        self.results.push(r);
        true
    }
}

/// A loss: any finite number (some objectives go below 0); `nan` and `inf` are none.
fn loss(v: &str) -> Option<f64> {
    v.parse().ok().filter(|v: &f64| v.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dicts_with_host_prefixes_and_nan() {
        let mut h = HfTrainer::default();
        assert!(h.line(
            "10.0.0.1: {'train_runtime': 10.5, 'train_samples_per_second': 3.2, 'train_loss': nan, 'epoch': 1.0}"
        ));
        assert!(h.line("{'eval_loss': 0.05, 'epoch': 3.0}"));
        assert!(!h.line("{'something': 1}"));
        assert_eq!(
            h.results,
            [TrainResult {
                runtime_s: Some(10.5),
                samples_per_s: Some(3.2),
                steps_per_s: None,
                loss: None,
                epoch: Some(1.0)
            }]
        );
        assert_eq!(h.lines, 2);
    }

    /// A runtime, rate or epoch that is `nan`, infinite or negative is no value (a loss may be
    /// negative, not infinite); colour escapes around a dict are no part of it.
    #[test]
    fn figures_that_measure_nothing_and_colours() {
        let mut h = HfTrainer::default();
        assert!(h.line(
            "\x1b[36m{'train_runtime': -10.5, 'train_samples_per_second': inf, 'train_steps_per_second': 1e400, \
             'train_loss': -0.25, 'epoch': nan}\x1b[0m"
        ));
        assert!(h.line("{'train_runtime': \x1b[1m10.5\x1b[0m, 'train_samples_per_second': 3.2, 'train_loss': inf}"));
        assert!(h.line("\x1b[1m{'eval_loss': nan, 'epoch': 3.0}"));
        assert_eq!(
            h.results,
            [
                TrainResult { loss: Some(-0.25), ..TrainResult::default() },
                TrainResult { runtime_s: Some(10.5), samples_per_s: Some(3.2), ..TrainResult::default() }
            ]
        );
        assert_eq!((h.lines, h.eval_loss), (3, None));
    }

    /// Two files of one run: their lines and results together, the later evaluation kept.
    #[test]
    fn merged_files_keep_every_result() {
        let (mut a, mut b) = (HfTrainer::default(), HfTrainer::default());
        assert!(a.line("{'train_runtime': 10.5, 'train_samples_per_second': 3.2, 'epoch': 1.0}"));
        assert!(b.line("{'train_runtime': 11.5, 'train_samples_per_second': 3.0, 'epoch': 1.0}"));
        assert!(b.line("{'eval_loss': 0.05, 'epoch': 1.0}"));
        a.merge(&b);
        assert_eq!((a.lines, a.results.len(), a.eval_loss), (3, 2, Some(0.05)));
    }
}
