//! Where each parameter lives in its unit's flat buffer, and which slice each rank owns.

use std::ops::Range;

use zerobench_schema::memory::padded_unit;

use crate::model::UnitDef;

/// One parameter's place in the flat buffer.
#[derive(Debug, Clone)]
pub struct ParamSlot {
    pub offset: usize,
    pub numel: usize,
    pub shape: Vec<i64>,
}

/// The flat layout of one unit for a given number of ranks.
#[derive(Debug, Clone)]
pub struct UnitLayout {
    pub name: String,
    /// Real elements (the parameters, back to back).
    pub numel: usize,
    /// Elements after padding: a multiple of world × alignment, zero beyond `numel`.
    pub padded: usize,
    pub params: Vec<ParamSlot>,
}

impl UnitLayout {
    pub fn new(unit: &UnitDef, world: usize) -> Self {
        let mut offset = 0;
        let params = unit
            .params
            .iter()
            .map(|p| {
                let slot = ParamSlot { offset, numel: p.numel(), shape: p.shape.clone() };
                offset += p.numel();
                slot
            })
            .collect();
        let padded = usize::try_from(padded_unit(offset as u64, world as u64)).expect("fits");
        Self { name: unit.name.clone(), numel: offset, padded, params }
    }

    /// Elements of one rank's shard when `owners` ranks share the unit.
    pub fn shard_len(&self, owners: usize) -> usize {
        self.padded / owners
    }

    /// The slice of the flat buffer that `index` of `owners` owns.
    pub fn shard_range(&self, owners: usize, index: usize) -> Range<usize> {
        let n = self.shard_len(owners);
        index * n..(index + 1) * n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Init, ParamDef};

    #[test]
    fn shards_tile_the_padded_buffer() {
        let unit = UnitDef {
            name: "u".into(),
            params: vec![ParamDef::new("a", &[3, 5], Init::Zeros), ParamDef::new("b", &[7], Init::Zeros)],
        };
        let l = UnitLayout::new(&unit, 3);
        assert_eq!(l.numel, 22);
        assert_eq!(l.params[1].offset, 15);
        assert_eq!(l.padded % 3, 0);
        assert!(l.padded >= 22);
        let ranges: Vec<_> = (0..3).map(|r| l.shard_range(3, r)).collect();
        assert_eq!(ranges[0].start, 0);
        assert_eq!(ranges[2].end, l.padded);
        assert_eq!(ranges[0].end, ranges[1].start);
    }
}
