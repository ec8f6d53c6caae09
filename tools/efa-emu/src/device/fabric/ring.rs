//! A ring of packets in memory shared by two efa-emu processes: how a
//! packet reaches a peer on the Unix-socket fabric without a system call
//! once that peer has accepted our memory ([`super::share`]).
//!
//! The ring is part of the memfd a sender makes for one receiving port,
//! after its pin slots ([`super::share::PinTable`]), and both map it
//! read-write: one producer (the sender's fabric, which sends under its
//! transport's lock) and one consumer (the receiving device's data-path
//! thread, which takes what arrived at the start of each pass).
//!
//! The consumer sleeps only after it has *armed* the ring (set `waiting`);
//! a producer that finds it armed clears it and wakes the consumer with a
//! datagram ([`KICK`]) on the peer's socket. Both sides put a `SeqCst`
//! fence between their store (`waiting`, `head`) and their load (`head`,
//! `waiting`): of a consumer about to sleep and a producer that just
//! published, at least one sees the other's store, so either the consumer
//! sees the packet and stays up, or the producer sees the consumer armed
//! and wakes it. While the consumer is busy (or naps for microseconds
//! without arming) a packet costs no system call either side.
//!
//! The other process can write anything anywhere in the ring. Each side
//! keeps its own count (`head`, `tail`) and only publishes it; what it
//! reads of the other's is checked: a consumer that finds more entries
//! than the ring has, or an entry longer than a slot, drops what is
//! there ([`Popped::Corrupt`]); a producer that finds the consumer ahead
//! of it sees the ring full, and the packet goes by the socket. An entry
//! is copied out before it is decoded, so the sender cannot change it
//! under the decoder.

use std::sync::atomic::{fence, Ordering};

use crate::shmem::SharedMem;

/// Entries a ring holds: a window of 16 RDMA writes of 1 MiB in 64 KiB
/// segments, each one packet, or four batches of 64 sends.
pub const RING_SLOTS: usize = 256;
/// Bytes of one slot: a length, then a packet's wire form.
pub const SLOT_BYTES: usize = 2048;
/// The longest packet a slot holds (one with [`super::share::MAX_DESCS`]
/// descriptors fits; a packet that carries bytes mostly does not, and goes
/// by the socket).
pub const MAX_ENTRY: usize = SLOT_BYTES - SLOT_HEADER;
/// Bytes of a ring: a page of counts, then the slots.
pub const RING_BYTES: usize = SLOTS_AT + RING_SLOTS * SLOT_BYTES;

// The layout, from the ring's start: both processes' build of this file
// must agree on it (a pin table of another size is refused, and the
// packets then go as datagrams).
/// The producer's count of entries published (`u64`).
pub const HEAD: usize = 0;
/// The consumer's count of entries taken (`u64`), on a line of its own.
pub const TAIL: usize = 64;
/// 1 while the consumer sleeps, or is about to (`u32`).
pub const WAITING: usize = 128;
/// Where slot 0 starts; slot `n % RING_SLOTS` holds entry `n`.
pub const SLOTS_AT: usize = 4096;
/// A slot's entry length (`u32`), padded; the entry follows.
pub const SLOT_HEADER: usize = 8;

/// The datagram that wakes a consumer that armed its ring (to its port's
/// socket; anything of our uid may send it, and it only makes the port
/// look at its rings).
pub const KICK: [u8; 5] = *b"EFAK\x01";

/// What [`Ring::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Published; `kick`: the consumer had armed the ring, wake it.
    Sent {
        /// Send [`KICK`] to the consumer.
        kick: bool,
    },
    /// No room (or the consumer's count makes no sense): nothing written.
    Full,
    /// Longer than [`MAX_ENTRY`]: nothing written.
    TooLong,
}

/// What [`Ring::pop`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Popped {
    /// Nothing published.
    Empty,
    /// An entry, now in the buffer.
    Entry,
    /// The producer's count or an entry's length is impossible: what was
    /// published is dropped.
    Corrupt,
}

/// A view of a ring at `base` in a shared mapping.
#[derive(Debug, Clone, Copy)]
pub struct Ring<'a> {
    mem: &'a SharedMem,
    base: usize,
}

impl<'a> Ring<'a> {
    /// The ring at `base` of `mem`; an access outside `mem` fails as a full
    /// or corrupt ring would.
    pub fn new(mem: &'a SharedMem, base: usize) -> Self {
        Self { mem, base }
    }

    fn slot(&self, n: u64) -> usize {
        self.base + SLOTS_AT + (n % RING_SLOTS as u64) as usize * SLOT_BYTES
    }

    /// Producer: publishes `bytes` as entry `*head` (the producer's own
    /// count, never read back from the ring), calling `room` once there is
    /// room and before the consumer can see it (to count the copy before
    /// the receiver can act on it).
    pub fn push(&self, head: &mut u64, bytes: &[u8], room: impl FnOnce()) -> Pushed {
        if bytes.len() > MAX_ENTRY {
            return Pushed::TooLong;
        }
        let Ok(tail) = self.mem.load_u64(self.base + TAIL) else {
            return Pushed::Full;
        };
        // A consumer ahead of us wraps to a huge count: full.
        if head.wrapping_sub(tail) >= RING_SLOTS as u64 {
            return Pushed::Full;
        }
        let at = self.slot(*head);
        room();
        if self.mem.write(at + SLOT_HEADER, bytes).is_err()
            || self.mem.store_u32(at, bytes.len() as u32).is_err()
        {
            return Pushed::Full;
        }
        *head = head.wrapping_add(1);
        // Release: the entry's bytes before the count that publishes them.
        if self.mem.store_u64(self.base + HEAD, *head).is_err() {
            return Pushed::Full;
        }
        // Between the store of `head` and the load of `waiting`, as the
        // consumer has one between its store of `waiting` and its load of
        // `head` (see the module documentation).
        fence(Ordering::SeqCst);
        let kick = self.mem.swap_u32(self.base + WAITING, 0) == Ok(1);
        Pushed::Sent { kick }
    }

    /// Producer: entries published and not yet taken (as far as the
    /// consumer's count says).
    pub fn backlog(&self, head: u64) -> u64 {
        self.mem
            .load_u64(self.base + TAIL)
            .map_or(0, |t| head.wrapping_sub(t))
    }

    /// Producer: a [`KICK`] could not be sent; the next push sends one.
    pub fn rearm(&self) {
        let _ = self.mem.store_u32(self.base + WAITING, 1);
    }

    /// Consumer: takes entry `*tail` (the consumer's own count) into
    /// `buf`.
    pub fn pop(&self, tail: &mut u64, buf: &mut Vec<u8>) -> Popped {
        let Ok(head) = self.mem.load_u64(self.base + HEAD) else {
            return Popped::Corrupt;
        };
        match head.wrapping_sub(*tail) {
            0 => return Popped::Empty,
            n if n > RING_SLOTS as u64 => return self.drop_all(tail, head),
            _ => {}
        }
        let at = self.slot(*tail);
        let len = match self.mem.load_u32(at) {
            Ok(n) if n as usize <= MAX_ENTRY => n as usize,
            _ => return self.drop_all(tail, head),
        };
        buf.clear();
        buf.resize(len, 0);
        if self.mem.read(at + SLOT_HEADER, buf).is_err() {
            return self.drop_all(tail, head);
        }
        *tail = tail.wrapping_add(1);
        // Release: our read of the entry before the producer may reuse it.
        let _ = self.mem.store_u64(self.base + TAIL, *tail);
        Popped::Entry
    }

    fn drop_all(&self, tail: &mut u64, head: u64) -> Popped {
        *tail = head;
        let _ = self.mem.store_u64(self.base + TAIL, head);
        Popped::Corrupt
    }

    /// Consumer: about to sleep until kicked; returns whether something
    /// was published meanwhile (then it should not sleep).
    pub fn arm(&self, tail: u64) -> bool {
        let _ = self.mem.store_u32(self.base + WAITING, 1);
        fence(Ordering::SeqCst);
        self.mem.load_u64(self.base + HEAD).is_ok_and(|h| h != tail)
    }

    /// Consumer: awake again; publishing needs no kick.
    pub fn disarm(&self) {
        let _ = self.mem.store_u32(self.base + WAITING, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> SharedMem {
        SharedMem::new("ring-test", 4096 + RING_BYTES).unwrap()
    }

    #[test]
    fn entries_arrive_in_order_across_the_wrap_and_a_full_ring_takes_nothing() {
        let m = mem();
        let r = Ring::new(&m, 4096);
        let (mut head, mut tail) = (0u64, 0u64);
        let mut buf = Vec::new();
        for round in 0..3u64 {
            for i in 0..RING_SLOTS as u64 {
                let n = (round * 7 + i) as usize % MAX_ENTRY + 1;
                let entry = vec![(i + round) as u8; n];
                let mut counted = false;
                assert_eq!(
                    r.push(&mut head, &entry, || counted = true),
                    Pushed::Sent { kick: false }
                );
                assert!(counted);
            }
            let mut counted = false;
            assert_eq!(r.push(&mut head, b"x", || counted = true), Pushed::Full);
            assert!(!counted, "no room: nothing counted");
            for i in 0..RING_SLOTS as u64 {
                let n = (round * 7 + i) as usize % MAX_ENTRY + 1;
                assert_eq!(r.pop(&mut tail, &mut buf), Popped::Entry);
                assert_eq!(buf, vec![(i + round) as u8; n], "entry {i}");
            }
            assert_eq!(r.pop(&mut tail, &mut buf), Popped::Empty);
        }
        assert_eq!(
            r.push(&mut head, &[0; MAX_ENTRY + 1], || {}),
            Pushed::TooLong
        );
        assert_eq!(r.pop(&mut tail, &mut buf), Popped::Empty);
    }

    #[test]
    fn an_armed_consumer_is_kicked_once_and_sees_what_came_before_it_armed() {
        let m = mem();
        let r = Ring::new(&m, 0);
        let (mut head, mut tail) = (0u64, 0u64);
        let mut buf = Vec::new();
        assert!(!r.arm(tail), "nothing published");
        assert_eq!(r.push(&mut head, b"a", || {}), Pushed::Sent { kick: true });
        assert_eq!(
            r.push(&mut head, b"b", || {}),
            Pushed::Sent { kick: false },
            "one kick per sleep"
        );
        assert!(r.arm(tail), "published before it armed: it stays up");
        r.disarm();
        assert_eq!(r.push(&mut head, b"c", || {}), Pushed::Sent { kick: false });
        r.rearm();
        assert_eq!(r.push(&mut head, b"d", || {}), Pushed::Sent { kick: true });
        for e in [b"a", b"b", b"c", b"d"] {
            assert_eq!(r.pop(&mut tail, &mut buf), Popped::Entry);
            assert_eq!(buf, e);
        }
    }

    #[test]
    fn a_peer_that_writes_impossible_counts_or_lengths_loses_only_its_entries() {
        let m = mem();
        let r = Ring::new(&m, 0);
        let mut tail = 0u64;
        let mut buf = Vec::new();
        // The producer claims more than the ring holds.
        m.store_u64(HEAD, 10_000).unwrap();
        assert_eq!(r.pop(&mut tail, &mut buf), Popped::Corrupt);
        assert_eq!(tail, 10_000);
        assert_eq!(
            r.pop(&mut tail, &mut buf),
            Popped::Empty,
            "dropped, not stuck"
        );
        // An entry longer than a slot.
        let mut head = 10_000;
        assert_eq!(
            r.push(&mut head, b"ok", || {}),
            Pushed::Sent { kick: false }
        );
        m.store_u32(r.slot(10_000), u32::MAX).unwrap();
        assert_eq!(r.pop(&mut tail, &mut buf), Popped::Corrupt);
        assert_eq!(r.pop(&mut tail, &mut buf), Popped::Empty);
        // A consumer that claims to be ahead of the producer: full, not a
        // write over entries not taken.
        m.store_u64(TAIL, head + 5).unwrap();
        assert_eq!(r.push(&mut head, b"no", || {}), Pushed::Full);
        // A ring outside the mapping: full, corrupt, never a fault.
        let r = Ring::new(&m, m.len());
        assert_eq!(r.push(&mut 0, b"no", || {}), Pushed::Full);
        assert_eq!(r.pop(&mut 0, &mut buf), Popped::Corrupt);
        assert!(!r.arm(0));
    }
}
