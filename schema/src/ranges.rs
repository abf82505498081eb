//! Sorted integers written as runs of consecutive ones ("0-2,5,7-8"), as messages name ranks and CPUs.

use std::fmt::Display;
use std::ops::Add;

/// `xs` (sorted, without repeats) as comma-separated runs: "0-2,5,7-8" for [0, 1, 2, 5, 7, 8].
pub fn ranges<T: Copy + Display + PartialEq + Add<Output = T> + From<u8>>(xs: &[T]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < xs.len() {
        let mut j = i;
        // xs[j] < xs[j + 1], so xs[j] + 1 does not overflow.
        while j + 1 < xs.len() && xs[j] + T::from(1) == xs[j + 1] {
            j += 1;
        }
        out.push(if i == j { xs[i].to_string() } else { format!("{}-{}", xs[i], xs[j]) });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::ranges;

    #[test]
    fn runs_of_consecutive_numbers_are_ranges() {
        assert_eq!(ranges(&[0u32, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(ranges(&[3u32]), "3");
        assert_eq!(ranges::<u32>(&[]), "");
        assert_eq!(ranges(&[0usize, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(ranges(&[u32::MAX - 1, u32::MAX]), "4294967294-4294967295");
    }
}
