//! BAR2: the memory BAR the guest maps (doorbells uncached, LLQ
//! write-combining), shared with the model so that guest stores never trap.
//!
//! ```text
//! 0                       doorbell pages: page i belongs to UAR slot i
//!                           (4-byte doorbells: SQ, RQ and CQ of that UAR)
//! max_uar * 4 KiB         LLQ pool: each QP's send ring, whole pages
//! size                    (a power of two; the tail past the pool is unused)
//! ```
//!
//! Each QP's LLQ starts on a page of its own and each UAR's doorbells fill
//! a page of their own, because the kernel maps whole pages to userspace:
//! nothing of one context may share a page with another's.

use std::sync::Arc;

use crate::shmem::SharedMem;

/// The page size of BAR2 allocations (the guest's page size).
pub const PAGE: u64 = 4096;

/// Where things are in BAR2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Number of doorbell pages (one per UAR slot).
    pub db_pages: u64,
    /// Offset of the LLQ pool.
    pub llq_offset: u64,
    /// Size of the LLQ pool.
    pub llq_size: u64,
    /// BAR size.
    pub size: u64,
}

impl Layout {
    /// The layout for `max_uar` doorbell pages and an LLQ pool of
    /// `llq_size` bytes (a multiple of [`PAGE`]).
    pub fn new(max_uar: u32, llq_size: u64) -> Self {
        let db_pages = u64::from(max_uar);
        let llq_offset = db_pages * PAGE;
        Self {
            db_pages,
            llq_offset,
            llq_size,
            size: (llq_offset + llq_size).next_power_of_two(),
        }
    }

    /// Offset of doorbell `slot` of UAR slot `uar_index`.
    pub fn doorbell(&self, uar_index: usize, slot: usize) -> u64 {
        uar_index as u64 * PAGE + slot as u64 * 4
    }
}

/// First-fit allocator of whole pages of the LLQ pool.
#[derive(Debug)]
pub struct LlqPool {
    used: Vec<bool>,
    base: u64,
}

impl LlqPool {
    /// An empty pool for `layout`.
    pub fn new(layout: &Layout) -> Self {
        Self {
            used: vec![false; (layout.llq_size / PAGE) as usize],
            base: layout.llq_offset,
        }
    }

    /// Reserves `pages` contiguous pages; returns the BAR2 offset.
    pub fn alloc(&mut self, pages: u64) -> Option<u64> {
        let n = usize::try_from(pages).ok().filter(|&n| n > 0)?;
        let mut run = 0;
        for i in 0..self.used.len() {
            run = if self.used[i] { 0 } else { run + 1 };
            if run == n {
                let first = i + 1 - n;
                self.used[first..=i].iter_mut().for_each(|u| *u = true);
                return Some(self.base + first as u64 * PAGE);
            }
        }
        None
    }

    /// Gives back `pages` pages at `offset`.
    pub fn free(&mut self, offset: u64, pages: u64) {
        let first = ((offset - self.base) / PAGE) as usize;
        if let Some(run) = self.used.get_mut(first..first + pages as usize) {
            run.iter_mut().for_each(|u| *u = false);
        }
    }

    /// Frees everything.
    pub fn clear(&mut self) {
        self.used.iter_mut().for_each(|u| *u = false);
    }

    /// Pages in use.
    pub fn used_pages(&self) -> usize {
        self.used.iter().filter(|u| **u).count()
    }
}

/// Zeroes `len` bytes of BAR2 at `offset`, so that a new owner never sees
/// the previous one's doorbell values or WQEs.
pub fn scrub(bar: &Arc<SharedMem>, offset: u64, len: u64) {
    if let Err(e) = bar.fill(offset as usize, len as usize, 0) {
        log::error!("BAR2 scrub: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_first_fit() {
        let l = Layout::new(256, 63 << 20);
        assert_eq!(l.llq_offset, 1 << 20);
        assert_eq!(l.size, 64 << 20);
        assert_eq!(l.doorbell(3, 5), 3 * 4096 + 20);
        let small = Layout::new(2, 4 * PAGE);
        assert_eq!(small.size, 8 * PAGE);
        let mut p = LlqPool::new(&small);
        let a = p.alloc(2).unwrap();
        let b = p.alloc(1).unwrap();
        assert_eq!((a, b), (2 * PAGE, 4 * PAGE));
        assert_eq!(p.alloc(2), None, "one page left");
        p.free(a, 2);
        assert_eq!(p.alloc(2), Some(a));
        assert_eq!(p.alloc(0), None);
        assert_eq!(p.used_pages(), 3);
        p.clear();
        assert_eq!(p.used_pages(), 0);
    }
}
