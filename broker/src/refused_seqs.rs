//! The refused sequences of an incoming forwarding stream, as compact ranges with their
//! dead-letter class: journaled with the stream's high-water mark, so that a message resent after
//! a lost answer (or a restart of either broker) is refused again instead of passing for a
//! duplicate of a stored one.

/// Most ranges kept per stream. A sender that reports what it has settled
/// (`ForwardRequest.settled_below`) keeps at most its window of unacknowledged batches here; a batch
/// that could take a stream past this is refused whole (`RESOURCE_EXHAUSTED`), never forgotten.
pub(crate) const MAX_REFUSED_RANGES: usize = 16_384;

/// Inclusive ranges `(first, last, class)`, sorted, not overlapping.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct RefusedSeqs {
    ranges: Vec<(u64, u64, i32)>,
}

impl RefusedSeqs {
    /// Records that `seq` was refused with `class`.
    pub(crate) fn insert(&mut self, seq: u64, class: i32) {
        // The common case: seqs arrive in increasing order.
        if let Some(last) = self.ranges.last_mut() {
            if last.1 < seq {
                if last.1 + 1 == seq && last.2 == class {
                    last.1 = seq;
                } else {
                    self.ranges.push((seq, seq, class));
                }
                return;
            }
        } else {
            self.ranges.push((seq, seq, class));
            return;
        }
        if self.class_of(seq).is_some() {
            return;
        }
        let at = self.ranges.partition_point(|r| r.1 < seq);
        self.ranges.insert(at, (seq, seq, class));
    }

    /// The class `seq` was refused with, if it was.
    pub(crate) fn class_of(&self, seq: u64) -> Option<i32> {
        let at = self.ranges.partition_point(|r| r.1 < seq);
        self.ranges
            .get(at)
            .filter(|r| r.0 <= seq)
            .map(|&(_, _, class)| class)
    }

    /// Forgets every seq below `floor` (settled by the sender: never sent again).
    pub(crate) fn prune_below(&mut self, floor: u64) {
        let cut = self.ranges.partition_point(|r| r.1 < floor);
        self.ranges.drain(..cut);
        if let Some(first) = self.ranges.first_mut() {
            first.0 = first.0.max(floor);
        }
    }

    /// Ranges kept.
    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_answer_and_prune() {
        let mut r = RefusedSeqs::default();
        for s in [3, 4, 5, 7, 8] {
            r.insert(s, 1);
        }
        r.insert(9, 2);
        r.insert(1, 1);
        r.insert(4, 1);
        assert_eq!(r.ranges, [(1, 1, 1), (3, 5, 1), (7, 8, 1), (9, 9, 2)]);
        assert_eq!(r.class_of(4), Some(1));
        assert_eq!(r.class_of(6), None);
        assert_eq!(r.class_of(9), Some(2));
        assert_eq!(r.class_of(10), None);
        r.prune_below(4);
        assert_eq!(r.ranges, [(4, 5, 1), (7, 8, 1), (9, 9, 2)]);
        assert_eq!(r.class_of(3), None);
        r.prune_below(100);
        assert!(r.is_empty());
    }
}
