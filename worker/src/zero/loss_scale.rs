//! Dynamic loss scaling for fp16 (the scheme of Micikevicius et al. 2018 as DeepSpeed and
//! torch.amp run it): multiply the loss by a scale before backward; a step whose gradients
//! overflow is skipped and the scale halved; after `growth_interval` good steps in a row the scale
//! doubles.

#[derive(Debug, Clone)]
pub struct LossScaler {
    scale: f64,
    good_steps: u32,
    growth_interval: u32,
    min_scale: f64,
}

impl LossScaler {
    /// Starts at 2^`power`.
    pub fn new(power: u32) -> Self {
        Self { scale: 2f64.powi(power as i32), good_steps: 0, growth_interval: 1000, min_scale: 1.0 }
    }

    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Records the outcome of a step; returns whether the step is to be applied.
    pub fn update(&mut self, overflow: bool) -> bool {
        if overflow {
            self.scale = (self.scale / 2.0).max(self.min_scale);
            self.good_steps = 0;
            false
        } else {
            self.good_steps += 1;
            if self.good_steps == self.growth_interval {
                self.scale *= 2.0;
                self.good_steps = 0;
            }
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_on_overflow_and_grows_after_a_window() {
        let mut s = LossScaler::new(16);
        assert!(!s.update(true));
        assert_eq!(s.scale(), 32768.0);
        for _ in 0..999 {
            assert!(s.update(false));
        }
        assert_eq!(s.scale(), 32768.0);
        assert!(s.update(false));
        assert_eq!(s.scale(), 65536.0);
        for _ in 0..40 {
            s.update(true);
        }
        assert_eq!(s.scale(), 1.0);
    }
}
