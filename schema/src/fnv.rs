//! FNV-1a, 64 bits (Fowler, Noll and Vo): the project's one fixed hash of a string, the same on
//! every machine and in every build, unlike the standard library's per-process seeded hasher.
//! Where a name must map to the same number everywhere: a long plot label's file name, a run's
//! default rendezvous port, the cost model's fold of a configuration. Hand-written: it is two
//! constants and a fold, less than a dependency's manifest entry.

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0100_0000_01b3;

/// The FNV-1a hash of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(OFFSET_BASIS, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published test vectors of FNV-1a 64.
    #[test]
    fn published_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
