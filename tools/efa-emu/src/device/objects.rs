//! The device's objects and the tables that hand out their handles.
//!
//! A handle is `index | generation << index_bits`, cut to the width of the
//! field that carries it. Slots are reused round-robin and each reuse bumps
//! the slot's generation, so a stale handle (to a destroyed object, or to
//! a slot that was since reused) is refused rather than reaching another
//! owner's object. The index takes `log2(next_power_of_two(capacity))`
//! bits: rdma-core finds its QPs by `qp_num & (roundup_pow_of_two(max_qp)
//! - 1)`, so the low bits of a QP number must be unique among live QPs.
//!
//! The per-object state here is what the admin commands create; the data
//! path keeps its queue state in the `dp` fields (see `datapath`).

use std::sync::Arc;

use super::fabric::Region;
use efa_hw::admin::{
    BasicStats, MessagesStats, NetworkStats, QpState, QpType, RdmaReadStats, RdmaWriteStats,
};

/// A table of objects with generation-checked handles.
#[derive(Debug)]
pub struct Table<T> {
    slots: Vec<Slot<T>>,
    capacity: usize,
    next: usize,
    live: usize,
    index_bits: u32,
    width: u32,
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

impl<T> Table<T> {
    /// A table of at most `capacity` objects whose handles are `width`
    /// bits wide (16 or 32). `capacity` must leave at least one generation
    /// bit (checked by `Config::validate`).
    pub fn new(capacity: u32, width: u32) -> Self {
        let index_bits = capacity.next_power_of_two().trailing_zeros().max(1);
        debug_assert!(index_bits < width && width <= 32);
        Self {
            slots: Vec::new(),
            capacity: capacity as usize,
            next: 0,
            live: 0,
            index_bits,
            width,
        }
    }

    fn max_generation(&self) -> u32 {
        ((1u64 << (self.width - self.index_bits)) - 1) as u32
    }

    fn encode(&self, index: usize, generation: u32) -> u32 {
        index as u32 | generation << self.index_bits
    }

    fn decode(&self, handle: u32) -> Option<(usize, u32)> {
        if self.width < 32 && handle >> self.width != 0 {
            return None;
        }
        let index = (handle & ((1 << self.index_bits) - 1)) as usize;
        Some((index, handle >> self.index_bits))
    }

    /// Stores `value` in a free slot and returns its handle, or gives the
    /// value back if the table is full.
    pub fn insert(&mut self, value: T) -> Result<u32, T> {
        if self.live >= self.capacity {
            return Err(value);
        }
        if self.slots.len() < self.capacity {
            self.slots.resize_with(self.capacity, || Slot {
                generation: 0,
                value: None,
            });
        }
        let index = (0..self.capacity)
            .map(|i| (self.next + i) % self.capacity)
            .find(|&i| self.slots[i].value.is_none())
            .expect("a table below capacity has a free slot");
        let max = self.max_generation();
        let next = |g: u32| if g >= max { 1 } else { g + 1 };
        let mut generation = next(self.slots[index].generation);
        // 0xffff is "no address handle" in receive completions; keep it out
        // of every 16-bit handle space. Only one generation of the last
        // slot can produce it, so one step away suffices.
        if self.width == 16 && self.encode(index, generation) == 0xffff {
            generation = next(generation);
        }
        self.slots[index] = Slot {
            generation,
            value: Some(value),
        };
        self.next = (index + 1) % self.capacity;
        self.live += 1;
        Ok(self.encode(index, generation))
    }

    fn slot(&self, handle: u32) -> Option<&Slot<T>> {
        let (index, generation) = self.decode(handle)?;
        self.slots
            .get(index)
            .filter(|s| s.generation == generation && s.value.is_some())
    }

    /// The object with `handle`, if it is live.
    pub fn get(&self, handle: u32) -> Option<&T> {
        self.slot(handle)?.value.as_ref()
    }

    /// The object with `handle`, if it is live.
    pub fn get_mut(&mut self, handle: u32) -> Option<&mut T> {
        self.slot(handle)?;
        let (index, _) = self.decode(handle)?;
        self.slots[index].value.as_mut()
    }

    /// Removes and returns the object with `handle`, if it is live.
    pub fn remove(&mut self, handle: u32) -> Option<T> {
        self.slot(handle)?;
        let (index, _) = self.decode(handle)?;
        self.live -= 1;
        self.slots[index].value.take()
    }

    /// Live objects with their handles.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            s.value
                .as_ref()
                .map(|v| (i as u32 | s.generation << self.index_bits, v))
        })
    }

    /// Live objects with their handles.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        let bits = self.index_bits;
        self.slots.iter_mut().enumerate().filter_map(move |(i, s)| {
            let generation = s.generation;
            s.value.as_mut().map(|v| (i as u32 | generation << bits, v))
        })
    }

    /// Number of live objects.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no object is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Removes every object. Generations survive, so handles from before
    /// stay stale.
    pub fn clear(&mut self) {
        for s in &mut self.slots {
            s.value = None;
        }
        self.live = 0;
    }

    /// Slot index of a live handle (BAR2 pages are laid out by UAR index).
    pub fn index_of(&self, handle: u32) -> Option<usize> {
        self.slot(handle)?;
        self.decode(handle).map(|(i, _)| i)
    }
}

/// Traffic statistics (GET_STATS), of the device or of one QP, counted by
/// the data path.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Packets and bytes.
    pub basic: BasicStats,
    /// Send and receive messages.
    pub messages: MessagesStats,
    /// RDMA reads.
    pub rdma_read: RdmaReadStats,
    /// RDMA writes.
    pub rdma_write: RdmaWriteStats,
    /// Retransmissions and remote health.
    pub network: NetworkStats,
}

/// A protection domain.
#[derive(Debug, Default)]
pub struct Pd;

/// Doorbell slots in a UAR page: 4-byte doorbells, 1024 per 4 KiB page.
pub const DOORBELLS_PER_UAR: usize = 4096 / 4;

/// A user access region: one BAR2 page of doorbells.
#[derive(Debug)]
pub struct Uar {
    /// Which doorbell slots of the page are taken.
    pub used: Vec<bool>,
}

impl Default for Uar {
    fn default() -> Self {
        Self {
            used: vec![false; DOORBELLS_PER_UAR],
        }
    }
}

impl Uar {
    /// Takes a free doorbell slot.
    pub fn take_slot(&mut self) -> Option<usize> {
        let i = self.used.iter().position(|u| !u)?;
        self.used[i] = true;
        Some(i)
    }

    /// Gives a slot back.
    pub fn put_slot(&mut self, slot: usize) {
        if let Some(u) = self.used.get_mut(slot) {
            *u = false;
        }
    }
}

/// A completion queue.
#[derive(Debug, Clone)]
pub struct Cq {
    /// Owning UAR.
    pub uar: u32,
    /// Ring base (all sub-CQs back to back).
    pub ring: u64,
    /// Entries per sub-CQ.
    pub depth: u16,
    /// Entry size in bytes (16 or 32).
    pub entry_size: u16,
    /// Number of sub-CQs.
    pub sub_cqs: u16,
    /// Event queue for completion events, when interrupts were asked for.
    pub eqn: Option<u32>,
    /// Fill the source address of receives.
    pub set_src_addr: bool,
    /// Send completions carry 64-bit request ids.
    pub sq_comp_64: bool,
    /// Doorbell slot in the UAR page and offset of the doorbell in BAR2,
    /// if the device gives CQs doorbells (`Config::cq_doorbells`).
    pub doorbell: Option<(usize, u32)>,
    /// Completion and event state of the data path.
    pub dp: super::datapath::CqData,
}

/// A queue pair.
#[derive(Debug, Clone)]
pub struct Qp {
    /// Owning protection domain.
    pub pd: u32,
    /// Owning UAR.
    pub uar: u32,
    /// UD or SRD.
    pub qp_type: QpType,
    /// Current state.
    pub state: QpState,
    /// Queue key.
    pub qkey: u32,
    /// Send packet sequence number.
    pub sq_psn: u32,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// Notify when the send queue drains.
    pub sq_drained_async_notify: bool,
    /// Service level.
    pub sl: u8,
    /// CREATE_QP flags (unsolicited write receive, 64-bit request ids).
    pub flags: u8,
    /// Send CQ handle.
    pub send_cq: u32,
    /// Receive CQ handle.
    pub recv_cq: u32,
    /// Sub-CQ of send completions.
    pub send_sub_cq: u16,
    /// Sub-CQ of receive completions.
    pub recv_sub_cq: u16,
    /// Send queue depth in WQEs.
    pub sq_depth: u32,
    /// Send ring size in bytes (0: no send queue).
    pub sq_ring_size: u32,
    /// Receive queue depth in WQEs.
    pub rq_depth: u32,
    /// Receive ring size in bytes (0: no receive queue).
    pub rq_ring_size: u32,
    /// Receive ring base address.
    pub rq_base: u64,
    /// Offset of the LLQ (send ring) in BAR2.
    pub llq_offset: u64,
    /// LLQ pages reserved in BAR2.
    pub llq_pages: u64,
    /// Doorbell slots (send, receive) in the UAR page.
    pub db_slots: [usize; 2],
    /// Doorbell offsets (send, receive) in BAR2.
    pub db_offsets: [u32; 2],
    /// Event counters attached, with the events each counts.
    pub counters: Vec<(u32, u32)>,
    /// Traffic of this QP.
    pub stats: Stats,
    /// Queue state of the data path.
    pub dp: super::datapath::QpData,
}

impl Qp {
    /// WQE size in bytes the device infers from ring size and depth (0
    /// without a send queue).
    pub fn sq_wqe_size(&self) -> u32 {
        self.sq_ring_size.checked_div(self.sq_depth).unwrap_or(0)
    }
}

/// An address handle.
#[derive(Debug, Clone)]
pub struct Ah {
    /// Protection domain.
    pub pd: u32,
    /// Destination GID.
    pub gid: [u8; 16],
}

/// A registered memory region. Not `Clone`: dropping it (DEREG_MR, a
/// reset) retires its region, which packets in flight may still refer to
/// (`fabric::payload`).
#[derive(Debug)]
pub struct Mr {
    /// Protection domain.
    pub pd: u32,
    /// I/O virtual address of the first byte.
    pub iova: u64,
    /// Length in bytes.
    pub length: u64,
    /// log2 of the page size.
    pub page_shift: u8,
    /// Access permissions (REG_MR bits).
    pub permissions: u8,
    /// The DMA address of every page, shared with the payloads that refer
    /// to the region.
    pub region: Arc<Region>,
}

impl Drop for Mr {
    fn drop(&mut self) {
        // Waits for copies from the region under way (microseconds): the
        // device is done with the region before DEREG_MR completes.
        self.region.retire();
    }
}

/// An event queue.
#[derive(Debug, Clone)]
pub struct Eq {
    /// Ring base.
    pub ring: u64,
    /// Entries (a power of two).
    pub depth: u16,
    /// MSI-X vector.
    pub msix_vec: u16,
    /// Enabled events.
    pub event_bitmask: u32,
    /// Armed by the EQ doorbell: the next event raises the vector.
    pub armed: bool,
    /// Entries written so far (slot and phase derive from it).
    pub produced: u32,
    /// An entry was written while the EQ was not armed: the next arm
    /// raises the vector at once.
    pub pending: bool,
}

/// An event counter: a 64-bit value the device keeps in host memory.
#[derive(Debug, Clone)]
pub struct EventCounter {
    /// Owning UAR.
    pub uar: u32,
    /// Where the value lives.
    pub addr: u64,
    /// The value.
    pub value: u64,
}

/// Every object table of one device.
#[derive(Debug)]
pub struct Objects {
    /// Protection domains (16-bit handles).
    pub pds: Table<Pd>,
    /// User access regions (16-bit handles).
    pub uars: Table<Uar>,
    /// Completion queues (16-bit handles).
    pub cqs: Table<Cq>,
    /// Queue pairs: the handle is the QP number (16 bits).
    pub qps: Table<Qp>,
    /// Address handles (16-bit).
    pub ahs: Table<Ah>,
    /// Memory regions: the handle is the lkey (24 bits, as in WQEs).
    pub mrs: Table<Mr>,
    /// Event queues (16-bit handles).
    pub eqs: Table<Eq>,
    /// Event counters (32-bit handles).
    pub counters: Table<EventCounter>,
    /// Pages held by all memory regions.
    pub mr_pages: u64,
}

impl Objects {
    /// Empty tables sized by the limits.
    pub fn new(l: &super::Limits) -> Self {
        Self {
            pds: Table::new(l.max_pd, 16),
            uars: Table::new(l.max_uar, 16),
            cqs: Table::new(l.max_cq, 16),
            qps: Table::new(l.max_qp, 16),
            ahs: Table::new(l.max_ah, 16),
            mrs: Table::new(l.max_mr, 24),
            eqs: Table::new(l.max_eq.max(1), 16),
            counters: Table::new(l.max_event_counters.max(1), 32),
            mr_pages: 0,
        }
    }

    /// Drops every object (device reset); handles from before stay stale.
    pub fn clear(&mut self) {
        self.pds.clear();
        self.uars.clear();
        self.cqs.clear();
        self.qps.clear();
        self.ahs.clear();
        self.mrs.clear();
        self.eqs.clear();
        self.counters.clear();
        self.mr_pages = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_generation_checked_and_reused_round_robin() {
        let mut t: Table<u32> = Table::new(3, 16);
        let a = t.insert(10).unwrap();
        let b = t.insert(11).unwrap();
        let c = t.insert(12).unwrap();
        assert_eq!(t.insert(13), Err(13), "full");
        assert_eq!((a & 3, b & 3, c & 3), (0, 1, 2));
        assert_eq!(t.remove(b), Some(11));
        assert_eq!(t.get(b), None, "destroyed");
        assert_eq!(t.remove(b), None, "twice");
        let d = t.insert(14).unwrap();
        assert_eq!(d & 3, 1, "the only free slot");
        assert_ne!(d, b, "a new generation");
        assert_eq!(t.get(b), None, "stale handle to a reused slot");
        assert_eq!(t.get(d), Some(&14));
        assert_eq!(t.get(3), None, "index past capacity");
        assert_eq!(t.get(0x1_0000 | a), None, "bits past the width");
        t.clear();
        assert!(t.is_empty() && t.get(a).is_none());
        let e = t.insert(15).unwrap();
        assert_ne!(e, a);
    }

    #[test]
    fn sixteen_bit_handles_skip_ffff_and_qp_numbers_keep_low_bits() {
        let mut t: Table<()> = Table::new(4, 16);
        for _ in 0..20_000 {
            let h = t.insert(()).unwrap();
            assert_ne!(h, 0xffff);
            assert!(h >= 4, "a generation is always set");
            t.remove(h).unwrap();
        }
        let mut q: Table<()> = Table::new(256, 16);
        let hs: Vec<u32> = (0..256).map(|_| q.insert(()).unwrap()).collect();
        let mut low: Vec<u32> = hs.iter().map(|h| h & 255).collect();
        low.sort();
        low.dedup();
        assert_eq!(low.len(), 256);
    }
}
