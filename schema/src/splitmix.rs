//! SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014):
//! the one seeded generator of the project. The worker's synthetic data, ingest's synthetic logs
//! and the fuzz tests draw from it, so a seed names the same numbers everywhere and a failing case
//! is reproducible from its number.

/// The SplitMix64 output function of `x`: a well-mixed hash of a (seed, index) pair.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `x`'s top 53 bits as a number uniform in [0, 1).
pub fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// The generator: each draw advances the state by the golden-ratio increment and mixes it.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        let out = mix(self.0);
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        out
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        unit(self.next_u64())
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is below 2^-40 for the sizes used here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference sequence of SplitMix64 from seed 1234567 (Vigna's splitmix64.c).
    #[test]
    fn matches_the_reference_sequence() {
        let mut g = SplitMix64(1_234_567);
        let got: Vec<u64> = (0..5).map(|_| g.next_u64()).collect();
        assert_eq!(
            got,
            [6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431, 16408922859458223821]
        );
    }

    #[test]
    fn unit_is_in_the_half_open_interval() {
        assert_eq!(unit(0), 0.0);
        assert!(unit(u64::MAX) < 1.0);
    }

    /// The top 53 bits over 2^53: the top bit alone is one half, all of them 1 − 2^-53.
    #[test]
    fn unit_takes_the_top_53_bits() {
        assert_eq!(unit(1 << 63), 0.5);
        assert_eq!(unit(1 << 11), 1.0 / 9_007_199_254_740_992.0);
        assert_eq!(unit((1 << 11) - 1), 0.0);
        assert_eq!(unit(u64::MAX), 1.0 - 1.0 / 9_007_199_254_740_992.0);
    }

    /// Draws from seed 1234567 follow the reference sequence: its first value's top 53 bits are
    /// 3153236189995295; its first three values modulo 10, 1000 and 7 are 7, 973 and 3.
    #[test]
    fn draws_follow_the_reference_sequence() {
        let u = SplitMix64(1_234_567).unit();
        assert_eq!(u, 3_153_236_189_995_295.0 / 9_007_199_254_740_992.0);
        let mut g = SplitMix64(1_234_567);
        assert_eq!([g.below(10), g.below(1000), g.below(7)], [7, 973, 3]);
    }
}
