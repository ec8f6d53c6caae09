// SPDX-License-Identifier: GPL-2.0

//! Completion contexts of the admin queue: which submitter waits for which
//! completion.
//!
//! Every command in flight owns one of `N` slots, `N` being the admin queue
//! depth. Its command id carries the slot index in the low `log2(N)` bits,
//! so a completion finds its slot directly, in whatever order the device
//! answers, and bits of the producer counter above them, so that an answer
//! meant for an earlier user of the slot is recognised as such.
//!
//! A submitter that stops waiting (timeout, dead device) abandons its slot
//! rather than freeing it: the slot stays reserved until the device answers
//! that command id or the queue is reset. A late answer therefore always
//! lands on the abandoned slot and frees it; it can never be taken for the
//! answer to a newer command.
//!
//! This is plain bookkeeping, without DMA or locking, so that KUnit can test
//! it; the admin queue keeps it under its lock.

use crate::hw::admin::AqCommonDesc;
use kernel::prelude::*;

/// A completion context, identified by its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotId(usize);

impl SlotId {
    /// Index of the slot.
    pub(crate) fn index(self) -> usize {
        self.0
    }
}

#[derive(Clone, Copy)]
enum Slot<E> {
    Free,
    /// Submitted as `cmd_id`; the submitter waits for the answer.
    Waiting {
        cmd_id: u16,
    },
    /// The device answered; the submitter has not collected the answer yet.
    Answered {
        completion: E,
    },
    /// The submitter gave up on `cmd_id`; reserved until the device answers
    /// it or the queue is reset.
    Abandoned {
        cmd_id: u16,
    },
}

/// What became of a completion the device posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// It answers a command whose submitter is waiting.
    Delivered(SlotId),
    /// It answers a command whose submitter gave up; the slot is free again.
    Late(SlotId),
    /// No command in flight has this id: the device is confused, or this is
    /// an answer to a command from before a queue reset.
    Unexpected,
}

/// The completion contexts of a queue of depth `N` (a power of two, at most
/// the 4096 ids a command id can tell apart); `E` is the completion a
/// submitter collects.
pub(crate) struct CommandSlots<E, const N: usize> {
    slots: [Slot<E>; N],
}

impl<E: Copy, const N: usize> CommandSlots<E, N> {
    const SHIFT: u32 = {
        assert!(N.is_power_of_two() && N <= 1 << 12);
        N.trailing_zeros()
    };

    /// All slots free.
    pub(crate) const fn new() -> Self {
        Self {
            slots: [Slot::Free; N],
        }
    }

    /// The command id of a command in `slot` submitted at producer counter
    /// `producer` (the position of its entry in the submission queue).
    pub(crate) fn command_id(slot: SlotId, producer: u16) -> u16 {
        // Truncation is the point: the id is 12 bits, of which the slot takes
        // the low ones and the producer counter what is left.
        AqCommonDesc::COMMAND_ID.get(slot.0 as u16 | producer.wrapping_shl(Self::SHIFT))
    }

    /// The slot a command id belongs to.
    pub(crate) fn slot_of(cmd_id: u16) -> SlotId {
        SlotId(usize::from(cmd_id) & (N - 1))
    }

    /// Takes a free slot for a command about to be submitted at producer
    /// counter `producer`; returns the slot and the command id to put in
    /// the entry, or `None` if every slot is in use.
    pub(crate) fn submit(&mut self, producer: u16) -> Option<(SlotId, u16)> {
        let index = self.slots.iter().position(|s| matches!(s, Slot::Free))?;
        let slot = SlotId(index);
        let cmd_id = Self::command_id(slot, producer);
        self.slots[index] = Slot::Waiting { cmd_id };
        Some((slot, cmd_id))
    }

    /// Records a completion the device posted for `cmd_id`.
    pub(crate) fn complete(&mut self, cmd_id: u16, completion: E) -> Answer {
        let slot = Self::slot_of(cmd_id);
        let entry = &mut self.slots[slot.0];
        match *entry {
            Slot::Waiting { cmd_id: expected } if expected == cmd_id => {
                *entry = Slot::Answered { completion };
                Answer::Delivered(slot)
            }
            Slot::Abandoned { cmd_id: expected } if expected == cmd_id => {
                *entry = Slot::Free;
                Answer::Late(slot)
            }
            _ => Answer::Unexpected,
        }
    }

    /// Gives `slot` back without the command having reached the device.
    pub(crate) fn withdraw(&mut self, slot: SlotId) {
        if matches!(self.slots[slot.0], Slot::Waiting { .. }) {
            self.slots[slot.0] = Slot::Free;
        }
    }

    /// The answer to the command in `slot`, once there is one; the slot is
    /// free again afterwards.
    pub(crate) fn collect(&mut self, slot: SlotId) -> Option<E> {
        match self.slots[slot.0] {
            Slot::Answered { completion } => {
                self.slots[slot.0] = Slot::Free;
                Some(completion)
            }
            _ => None,
        }
    }

    /// The submitter of the command in `slot` stops waiting. If the answer
    /// came in meanwhile it is returned (and the slot freed); otherwise the
    /// slot stays reserved until the answer comes or the queue is reset.
    pub(crate) fn abandon(&mut self, slot: SlotId) -> Option<E> {
        match self.slots[slot.0] {
            Slot::Waiting { cmd_id } => {
                self.slots[slot.0] = Slot::Abandoned { cmd_id };
                None
            }
            _ => self.collect(slot),
        }
    }

    /// Frees the slots of abandoned commands; for a queue the device has
    /// just been reset under, which will never answer them. Returns how many
    /// were freed.
    pub(crate) fn forget_abandoned(&mut self) -> usize {
        let mut freed = 0;
        for slot in self.slots.iter_mut() {
            if matches!(slot, Slot::Abandoned { .. }) {
                *slot = Slot::Free;
                freed += 1;
            }
        }
        freed
    }

    /// Number of slots held by abandoned commands.
    pub(crate) fn abandoned(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s, Slot::Abandoned { .. }))
            .count()
    }
}

#[kunit_tests(refa_admin_slots)]
mod tests {
    use super::*;

    type Slots = CommandSlots<u32, 32>;

    #[test]
    fn command_id_carries_slot_and_producer_bits() {
        assert_eq!(Slots::command_id(SlotId(3), 0), 3);
        assert_eq!(Slots::command_id(SlotId(3), 1), 0x23);
        assert_eq!(Slots::command_id(SlotId(31), 0x7f), 0xfff);
        // Only 7 producer bits fit next to 5 slot bits in 12: the id wraps
        // every 128 submissions, and so does the free-running counter.
        assert_eq!(Slots::command_id(SlotId(3), 0x80), 3);
        assert_eq!(
            Slots::command_id(SlotId(3), u16::MAX),
            Slots::command_id(SlotId(3), 0x7f)
        );
        for producer in [0, 1, 0x7f, 0x80, 0x1234, u16::MAX] {
            for slot in [0, 1, 17, 31] {
                let id = Slots::command_id(SlotId(slot), producer);
                assert!(id <= 0xfff);
                assert_eq!(Slots::slot_of(id), SlotId(slot));
            }
        }
    }

    #[test]
    fn slots_run_out_and_come_back() {
        let mut slots = Slots::new();
        for i in 0..32u16 {
            assert!(slots.submit(i).is_some());
        }
        assert_eq!(slots.submit(32), None);
        let id = Slots::command_id(SlotId(7), 7);
        assert_eq!(slots.complete(id, 70), Answer::Delivered(SlotId(7)));
        // Answered but not collected: still taken.
        assert_eq!(slots.submit(32), None);
        assert_eq!(slots.collect(SlotId(7)), Some(70));
        assert_eq!(
            slots.submit(32),
            Some((SlotId(7), Slots::command_id(SlotId(7), 32)))
        );
    }

    #[test]
    fn answers_in_any_order_reach_their_submitters() {
        let mut slots = Slots::new();
        let (a, ida) = slots.submit(10).unwrap();
        let (b, idb) = slots.submit(11).unwrap();
        let (c, idc) = slots.submit(12).unwrap();
        assert_eq!(slots.complete(idc, 3), Answer::Delivered(c));
        assert_eq!(slots.complete(ida, 1), Answer::Delivered(a));
        assert_eq!(slots.collect(b), None);
        assert_eq!(slots.complete(idb, 2), Answer::Delivered(b));
        assert_eq!(
            [slots.collect(a), slots.collect(b), slots.collect(c)],
            [Some(1), Some(2), Some(3)]
        );
        // Each answer is collected once.
        assert_eq!(slots.collect(a), None);
    }

    #[test]
    fn answers_with_the_wrong_id_are_refused() {
        let mut slots = Slots::new();
        let (a, id) = slots.submit(5).unwrap();
        // Same slot, other producer bits: an answer to an older command.
        let stale = Slots::command_id(a, 4);
        assert_ne!(stale, id);
        assert_eq!(slots.complete(stale, 9), Answer::Unexpected);
        assert_eq!(slots.collect(a), None);
        // A slot nobody uses.
        assert_eq!(
            slots.complete(Slots::command_id(SlotId(20), 5), 9),
            Answer::Unexpected
        );
        assert_eq!(slots.complete(id, 1), Answer::Delivered(a));
        // A duplicate answer.
        assert_eq!(slots.complete(id, 2), Answer::Unexpected);
        assert_eq!(slots.collect(a), Some(1));
    }

    #[test]
    fn a_late_answer_frees_the_abandoned_slot_and_nothing_else() {
        let mut slots = Slots::new();
        let (a, ida) = slots.submit(0).unwrap();
        assert_eq!(slots.abandon(a), None);
        assert_eq!(slots.abandoned(), 1);
        // The abandoned slot is not handed out again...
        let mut others = KVec::new();
        for producer in 1..32u16 {
            let (slot, id) = slots.submit(producer).unwrap();
            assert_ne!(slot, a);
            others.push((slot, id), GFP_KERNEL).unwrap();
        }
        assert_eq!(slots.submit(32), None);
        // ...so its late answer cannot reach anyone else.
        assert_eq!(slots.complete(ida, 99), Answer::Late(a));
        assert_eq!(slots.abandoned(), 0);
        for &(slot, _) in others.iter() {
            assert_eq!(slots.collect(slot), None);
        }
        // And the slot is usable again.
        assert_eq!(slots.submit(32).map(|(s, _)| s), Some(a));
    }

    #[test]
    fn abandoning_after_the_answer_came_returns_it() {
        let mut slots = Slots::new();
        let (a, id) = slots.submit(0).unwrap();
        assert_eq!(slots.complete(id, 5), Answer::Delivered(a));
        assert_eq!(slots.abandon(a), Some(5));
        assert_eq!(slots.abandoned(), 0);
        assert_eq!(slots.submit(1).map(|(s, _)| s), Some(a));
    }

    #[test]
    fn a_queue_reset_forgets_abandoned_commands() {
        let mut slots = Slots::new();
        let (a, ida) = slots.submit(0).unwrap();
        let (b, _) = slots.submit(1).unwrap();
        assert_eq!(slots.abandon(a), None);
        assert_eq!(slots.forget_abandoned(), 1);
        // The waiting command is untouched.
        assert_eq!(slots.abandon(b), None);
        assert_eq!(slots.forget_abandoned(), 1);
        // The slot is reused; a stale answer from before the reset is not
        // delivered to the new command.
        let (again, id) = slots.submit(0x40).unwrap();
        assert_eq!(again, a);
        assert_ne!(id, ida);
        assert_eq!(slots.complete(ida, 1), Answer::Unexpected);
        assert_eq!(slots.collect(again), None);
    }
}
