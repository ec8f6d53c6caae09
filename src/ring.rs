// SPDX-License-Identifier: GPL-2.0

//! Positions in the device's power-of-two rings.
//!
//! Every EFA ring (admin queue and completion queue, AENQ, event queues) is
//! indexed by a free-running counter: the slot is the counter modulo the
//! depth, and the phase bit, which tells entries of this pass from stale ones
//! of the previous pass, is 1 on the first pass and flips on every wrap.
//! Doorbells carry the counter itself, truncated to 16 bits. Because depths
//! are powers of two, all of this stays consistent when the 32-bit counter
//! itself wraps.

use kernel::prelude::*;

/// A position in a ring of `1 << shift` entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingPos {
    counter: u32,
    shift: u32,
}

impl RingPos {
    /// The start of a ring of `depth` entries; `depth` must be a power of
    /// two that a 16-bit doorbell can count past.
    pub(crate) fn new(depth: u32) -> Result<Self> {
        if !depth.is_power_of_two() || depth > 1 << 15 {
            return Err(EINVAL);
        }
        Ok(Self {
            counter: 0,
            shift: depth.trailing_zeros(),
        })
    }

    /// Number of entries in the ring.
    pub(crate) fn depth(self) -> u32 {
        1 << self.shift
    }

    /// Index of the entry this position refers to.
    pub(crate) fn slot(self) -> usize {
        (self.counter & (self.depth() - 1)) as usize
    }

    /// Phase bit of entries written during the current pass.
    pub(crate) fn phase(self) -> u8 {
        (!(self.counter >> self.shift) & 1) as u8
    }

    /// The free-running counter as 16-bit doorbell registers carry it.
    pub(crate) fn doorbell(self) -> u16 {
        self.counter as u16
    }

    /// The whole free-running counter, for 32-bit doorbells (`AENQ_CONS_DB`).
    pub(crate) fn counter(self) -> u32 {
        self.counter
    }

    /// The position `n` entries further on.
    #[must_use]
    pub(crate) fn advanced(self, n: u32) -> Self {
        Self {
            counter: self.counter.wrapping_add(n),
            ..self
        }
    }

    /// Entries from `earlier` up to `self`: how far a producer is ahead of
    /// a consumer. Never more than the depth for a well-behaved pair.
    pub(crate) fn distance_from(self, earlier: Self) -> u32 {
        self.counter.wrapping_sub(earlier.counter)
    }

    /// Whether a producer at `self` may write another entry before the
    /// consumer at `consumer` has freed one.
    pub(crate) fn has_room(self, consumer: Self) -> bool {
        self.distance_from(consumer) < self.depth()
    }

    #[cfg(CONFIG_KUNIT)]
    fn at(depth: u32, counter: u32) -> Self {
        Self {
            counter,
            ..Self::new(depth).unwrap()
        }
    }
}

#[kunit_tests(refa_ring)]
mod tests {
    use super::*;

    #[test]
    fn depth_must_be_a_power_of_two() {
        assert!(RingPos::new(0).is_err());
        assert!(RingPos::new(3).is_err());
        assert!(RingPos::new(48).is_err());
        assert!(RingPos::new(1 << 16).is_err());
        assert_eq!(RingPos::new(1).map(RingPos::depth), Ok(1));
        assert_eq!(RingPos::new(32).map(RingPos::depth), Ok(32));
    }

    #[test]
    fn first_pass_has_phase_one_and_flips_on_wrap() {
        let start = RingPos::new(4).unwrap();
        let slots: [(usize, u8); 9] = core::array::from_fn(|i| {
            let p = start.advanced(i as u32);
            (p.slot(), p.phase())
        });
        assert_eq!(
            slots,
            [
                (0, 1),
                (1, 1),
                (2, 1),
                (3, 1),
                (0, 0),
                (1, 0),
                (2, 0),
                (3, 0),
                (0, 1)
            ]
        );
    }

    #[test]
    fn doorbell_is_the_counter_truncated() {
        let p = RingPos::at(32, 0x1_0005);
        assert_eq!(p.doorbell(), 5);
        assert_eq!(p.slot(), 5);
        assert_eq!(RingPos::at(32, 0xffff).advanced(1).doorbell(), 0);
    }

    #[test]
    fn counter_wrap_keeps_slot_and_phase_sequence() {
        // Counter u32::MAX is the last slot of an odd pass (phase 0); the
        // next entry starts an even pass at slot 0 with phase 1, exactly as
        // if the counter had not wrapped.
        let last = RingPos::at(16, u32::MAX);
        assert_eq!((last.slot(), last.phase()), (15, 0));
        let next = last.advanced(1);
        assert_eq!((next.slot(), next.phase()), (0, 1));
        assert_eq!(next, RingPos::new(16).unwrap());
    }

    #[test]
    fn room_and_distance_across_wrap() {
        let consumer = RingPos::at(8, u32::MAX - 2);
        let producer = consumer.advanced(7);
        assert_eq!(producer.distance_from(consumer), 7);
        assert!(producer.has_room(consumer));
        assert!(!producer.advanced(1).has_room(consumer));
        assert!(producer.advanced(1).has_room(consumer.advanced(1)));
    }
}
