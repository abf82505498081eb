//! The order in which one micro-step uses the units: every segment forward, then every segment
//! backward in reverse. The last segment's forward is directly followed by its backward. The
//! worker's engine gathers, harvests and releases by it; the planner replays stage 3's gathers over
//! it (`crate::traffic`).

/// Forward or backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Forward,
    Backward,
}

/// One segment running in one phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub segment: usize,
    pub unit: usize,
    pub phase: Phase,
}

#[derive(Debug, Clone)]
pub struct Schedule {
    pub positions: Vec<Position>,
    /// For each unit, the index of the last position that uses it in backward: after it, the
    /// unit's gradients for this micro-step are complete.
    pub final_backward: Vec<usize>,
    /// For each unit, the index of the first position that uses it in backward: from it on, the
    /// unit's gradients for this micro-step are being computed.
    pub first_backward: Vec<usize>,
    /// For each unit, the index of the first position that uses it (in forward).
    pub first_use: Vec<usize>,
    /// Every unit, in the order forward first uses them.
    pub forward_order: Vec<usize>,
}

impl Schedule {
    /// `segment_units[s]` is the unit segment `s` uses.
    pub fn new(segment_units: &[usize], n_units: usize) -> Self {
        let s = segment_units.len();
        let mut positions: Vec<Position> = segment_units
            .iter()
            .enumerate()
            .map(|(segment, &unit)| Position { segment, unit, phase: Phase::Forward })
            .collect();
        positions.extend(segment_units.iter().enumerate().rev().map(|(segment, &unit)| Position {
            segment,
            unit,
            phase: Phase::Backward,
        }));
        let mut final_backward = vec![usize::MAX; n_units];
        for (i, p) in positions.iter().enumerate().skip(s) {
            final_backward[p.unit] = i;
        }
        let mut first_backward = vec![usize::MAX; n_units];
        for (i, p) in positions.iter().enumerate().skip(s).rev() {
            first_backward[p.unit] = i;
        }
        assert!(final_backward.iter().all(|&i| i != usize::MAX), "every unit is used by some segment");
        let mut first_use = vec![usize::MAX; n_units];
        for (i, p) in positions.iter().enumerate().take(s).rev() {
            first_use[p.unit] = i;
        }
        let mut forward_order: Vec<usize> = (0..n_units).collect();
        forward_order.sort_by_key(|&u| first_use[u]);
        Self { positions, final_backward, first_backward, first_use, forward_order }
    }

    /// Index of segment `s`'s backward position.
    pub fn backward_index(&self, segment: usize) -> usize {
        self.positions.len() - 1 - segment
    }

    /// The first `n` distinct units used strictly after position `i` within this micro-step.
    pub fn upcoming_units(&self, i: usize, n: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(n.min(self.positions.len()));
        for p in &self.positions[(i + 1).min(self.positions.len())..] {
            if out.len() == n {
                break;
            }
            if !out.contains(&p.unit) {
                out.push(p.unit);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_like_schedule() {
        // embed(u0), block0(u1), block1(u2), head(u0)
        let s = Schedule::new(&[0, 1, 2, 0], 3);
        let units: Vec<usize> = s.positions.iter().map(|p| p.unit).collect();
        assert_eq!(units, vec![0, 1, 2, 0, 0, 2, 1, 0]);
        // u0's gradients are complete only after the embedding's backward, the very last.
        assert_eq!(s.final_backward, vec![7, 6, 5]);
        // ... and are first computed in the head's, the first.
        assert_eq!(s.first_backward, vec![4, 6, 5]);
        assert_eq!(s.first_use, vec![0, 1, 2]);
        assert_eq!(Schedule::new(&[2, 0, 1, 2], 3).forward_order, vec![2, 0, 1]);
        assert_eq!(s.backward_index(3), 4);
        assert_eq!(s.upcoming_units(2, 2), vec![0, 2]);
        assert_eq!(s.upcoming_units(7, 2), Vec::<usize>::new());
    }
}
