//! The boundary between the device model and whatever connects it to a guest.
//!
//! The model (registers, admin queue, objects, data path) knows nothing of
//! vfio-user: it sees guest memory through [`GuestMemory`], raises interrupts
//! through [`Interrupts`] and is driven through [`PciFunction`]. The vfio-user
//! adapter implements the first two and calls the third; the in-process test
//! driver does the same with plain memory, so every behaviour can be tested
//! without QEMU.

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::sync::Arc;

use crate::copycount::copied;
use crate::shmem::SharedMem;

/// A DMA access outside the memory the guest gave the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaError {
    /// Guest physical address of the first byte of the failed access.
    pub addr: u64,
    /// Length of the failed access in bytes.
    pub len: usize,
}

impl std::fmt::Display for DmaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DMA of {} bytes at {:#x} is outside guest memory",
            self.len, self.addr
        )
    }
}

impl std::error::Error for DmaError {}

/// Guest physical memory as the device reaches it by DMA.
///
/// An access that is not entirely inside mapped memory fails as a whole and
/// touches nothing.
pub trait GuestMemory: Send + Sync {
    /// Reads `buf.len()` bytes at guest physical address `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError>;
    /// Writes `data` at guest physical address `addr`.
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaError>;

    /// [`GuestMemory::read`] into memory that need not be initialized, so
    /// that a buffer about to be overwritten whole (a packet's payload) is
    /// not cleared first. On success every byte of `buf` is initialized.
    /// The default clears `buf` and reads into it.
    fn read_uninit(&self, addr: u64, buf: &mut [MaybeUninit<u8>]) -> Result<(), DmaError> {
        for b in buf.iter_mut() {
            b.write(0);
        }
        // SAFETY: every element was just initialized, and `MaybeUninit<u8>`
        // has the layout of `u8`.
        let buf = unsafe { &mut *(std::ptr::from_mut(buf) as *mut [u8]) };
        self.read(addr, buf)
    }

    /// Whether a later access of `len` bytes at `addr` (a write if `write`)
    /// would succeed, without making it: the device checks ring and page
    /// addresses when the guest hands them over.
    ///
    /// The default reads one byte of every 4 KiB page of the range, so it
    /// cannot see read-only memory; implementations that know their map do
    /// better.
    fn check(&self, addr: u64, len: u64, write: bool) -> Result<(), DmaError> {
        let _ = write;
        const PAGE: u64 = 4096;
        let err = DmaError {
            addr,
            len: usize::try_from(len).unwrap_or(usize::MAX),
        };
        if len == 0 {
            return Ok(());
        }
        let last = addr.checked_add(len - 1).ok_or(err)?;
        let mut at = addr;
        loop {
            self.read(at, &mut [0u8]).map_err(|_| err)?;
            let next = (at | (PAGE - 1)).checked_add(1);
            match next {
                Some(n) if n <= last => at = n,
                _ => break,
            }
        }
        self.read(last, &mut [0u8]).map_err(|_| err)
    }

    /// Lends the host memory behind `[addr, addr + len)` for [`copy`]: calls
    /// `f(host, at, n)` for each piece (`n` bytes at `host`, `at` bytes into
    /// the access) while the pieces stay mapped, so that a copy between two
    /// guest memories goes from one straight into the other, without a
    /// buffer between them.
    ///
    /// `Ok(true)`: `f` saw the whole range. `Ok(false)`: this memory lends
    /// nothing now, and `f` was not called: never, by default; or lending
    /// would have to wait for a lock, which a lender must not do, since
    /// [`copy`] calls it while the other memory is lent (two lenders
    /// waiting for each other's locks would never return). `Err`: part of
    /// the range is not mapped (or not writable, if `write`), and `f` was
    /// not called.
    ///
    /// Implementations promise that each `host` is valid for `n` bytes of
    /// reads (and writes, if `write`) until `f` returns. The memory may be
    /// another process's, changing under the copy: it is only ever copied
    /// through raw pointers, never referenced.
    fn lend(
        &self,
        addr: u64,
        len: usize,
        write: bool,
        f: &mut dyn FnMut(*mut u8, usize, usize),
    ) -> Result<bool, DmaError> {
        let _ = (addr, len, write, f);
        Ok(false)
    }

    /// Lends all of this memory at once, for copies of many pieces
    /// ([`copy_lent`]): calls `f` with a [`Lent`], the host mappings of
    /// the memory, valid until `f` returns. A copy of a packet over
    /// scattered pages then takes one lock (or none) and one closure for
    /// all of it, and finds each page's host pointer itself, where a
    /// [`GuestMemory::lend`] per page costs a closure and a look-up of the
    /// memory's map behind a `dyn` call for each page of each side.
    ///
    /// `true`: `f` was called. `false`: it was not, and the caller goes
    /// piece by piece instead: never, by default; or lending would have to
    /// wait for a lock, which a lender must not do, for the reason
    /// [`GuestMemory::lend`] gives.
    ///
    /// The ranges lent are exactly what `lend` would lend (and `check`
    /// accept) at the time: an access fails on a [`Lent`] where it would
    /// fail there, and since a [`DmaError`] is the access's address and
    /// length, with the same error.
    fn lend_all(&self, f: &mut dyn FnMut(&Lent<'_>)) -> bool {
        let _ = f;
        false
    }

    /// The memfd that holds all of `[addr, addr + len)`, and the offset of
    /// `addr` in it: what the fabric offers another process, so that it
    /// reads the bytes itself ([`crate::device::fabric::share`]). `None`
    /// (the default): no one file holds it, and the bytes go instead.
    fn backing(&self, addr: u64, len: usize) -> Option<Backing> {
        let _ = (addr, len);
        None
    }
}

/// One host mapping of guest memory: guest physical `[iova, iova + len)`
/// at `host`, for reads, and for writes if `writable`
/// ([`GuestMemory::lend_all`]).
#[derive(Debug, Clone, Copy)]
pub struct HostRange {
    /// Guest physical address of the first byte.
    pub iova: u64,
    /// Bytes (more than 0).
    pub len: u64,
    /// Where the first byte is in this process.
    pub host: *mut u8,
    /// Whether the device may write it.
    pub writable: bool,
}

// SAFETY: a `HostRange` is an address and a length; nothing is reached
// through `host` but by `Lent`, under the promise of `Lent::new`, which
// holds whatever thread the range is on.
unsafe impl Send for HostRange {}
// SAFETY: as for `Send`; shared use only reads the fields.
unsafe impl Sync for HostRange {}

/// A guest memory lent whole ([`GuestMemory::lend_all`]): its host
/// mappings, and the last one an access was found in (the next is mostly
/// in it too: guest RAM is a few large mappings).
pub struct Lent<'a> {
    ranges: &'a [HostRange],
    last: Cell<usize>,
}

impl<'a> Lent<'a> {
    /// The memory of `ranges`, sorted by address, none overlapping, none
    /// reaching past the end of the address space (`iova + len` fits).
    ///
    /// # Safety
    ///
    /// Each range's `host` is valid for `len` bytes of reads (and of
    /// writes, if `writable`) until the closure that is given this `Lent`
    /// returns ([`GuestMemory::lend_all`]). The memory may be another
    /// process's, changing under a copy: it is only ever copied through
    /// raw pointers, never referenced.
    pub unsafe fn new(ranges: &'a [HostRange]) -> Self {
        Self {
            ranges,
            last: Cell::new(0),
        }
    }

    /// The host memory behind `[addr, addr + len)`, once all of it is
    /// known to be mapped (writable, if `write`): a pointer to the byte at
    /// `addr` and the bytes of the range there in one piece, `len` unless
    /// the range crosses from one mapping into the next that meets it
    /// (the rest is asked for again, at `addr` plus those bytes). `Err`:
    /// part of it is not, the error `lend` would give.
    ///
    /// The pointer is valid for those bytes of reads (and writes, if
    /// `write`) while the closure given this `Lent` runs
    /// ([`Lent::new`]).
    // Always: a copy looks up every page of both sides, and the call
    // would cost more than the look-up (a hit of `last`, mostly).
    #[inline(always)]
    pub fn host(&self, addr: u64, len: usize, write: bool) -> Result<(*mut u8, usize), DmaError> {
        let err = DmaError { addr, len };
        if len == 0 {
            // As `lend`: nothing to look up.
            return Ok((std::ptr::null_mut(), 0));
        }
        let last = self.last.get();
        // The offset of `addr` in the range it is in, found in `last`
        // mostly; `off < r.len`.
        let (i, r, off) = match self.ranges.get(last) {
            Some(r) if addr.wrapping_sub(r.iova) < r.len => (last, r, addr.wrapping_sub(r.iova)),
            _ => {
                let i = self
                    .ranges
                    .partition_point(|r| r.iova <= addr)
                    .checked_sub(1)
                    .ok_or(err)?;
                let r = &self.ranges[i];
                // `r.iova <= addr`: `partition_point`.
                let off = addr - r.iova;
                if off >= r.len {
                    return Err(err);
                }
                self.last.set(i);
                (i, r, off)
            }
        };
        if write && !r.writable {
            return Err(err);
        }
        // Not below 1: `off < r.len`.
        let room = r.len.wrapping_sub(off);
        if len as u64 > room && !self.continues(i, addr + room, addr, len, write) {
            return Err(err);
        }
        // SAFETY: `off < r.len`, and `r.host` is valid for `r.len` bytes
        // (`Lent::new`), so the result is inside it.
        let host = unsafe { r.host.add(off as usize) };
        Ok((host, len.min(room as usize)))
    }

    /// Whether the ranges after `i` cover `[from, addr + len)` without a
    /// gap, writable if `write`: an access that crosses from one mapping
    /// into the next is allowed as `lend` allows it.
    #[cold]
    fn continues(&self, i: usize, from: u64, addr: u64, len: usize, write: bool) -> bool {
        let Some(end) = addr.checked_add(len as u64) else {
            return false;
        };
        let mut pos = from;
        for r in &self.ranges[i + 1..] {
            if r.iova != pos || (write && !r.writable) {
                return false;
            }
            pos = r.iova + r.len;
            if pos >= end {
                return true;
            }
        }
        false
    }
}

/// The file behind a piece of guest memory ([`GuestMemory::backing`]).
#[derive(Debug, Clone)]
pub struct Backing {
    /// The memfd (QEMU's guest RAM). One `Arc` per mapping: its address
    /// names the mapping for as long as the `Arc` is held.
    pub file: Arc<std::fs::File>,
    /// The offset in it of the address asked about.
    pub offset: u64,
}

/// Which side of a [`copy`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyError {
    /// Reading the source.
    Source(DmaError),
    /// Writing the destination.
    Dest(DmaError),
}

/// Copies `len` bytes from `src` at `src_addr` to `dst` at `dst_addr`:
/// once, straight from one memory into the other, when both lend their
/// memory ([`GuestMemory::lend`]); otherwise (or if a lender would have
/// to wait) through a buffer, one memory at a time, which is two copies.
/// Both may be one memory, and the ranges may overlap.
///
/// On an error the destination may be written in part: callers that must
/// not leave a trace check the source first.
pub fn copy(
    src: &dyn GuestMemory,
    src_addr: u64,
    dst: &dyn GuestMemory,
    dst_addr: u64,
    len: usize,
) -> Result<(), CopyError> {
    let src_err = |len| DmaError {
        addr: src_addr,
        len,
    };
    if len == 0 {
        return Ok(());
    }
    src_addr
        .checked_add(len as u64)
        .ok_or(CopyError::Source(src_err(len)))?;
    let mut failed = None;
    let mut whole = true;
    let lent = dst
        .lend(dst_addr, len, true, &mut |to, at, n| {
            if failed.is_some() || !whole {
                return;
            }
            let from = src.lend(src_addr + at as u64, n, false, &mut |from, at2, m| {
                // SAFETY: both lenders keep their pieces mapped while their
                // closures run: `m` bytes at `from`, and `to + at2 .. + m`
                // inside the `n` bytes lent at `to` (`at2 + m <= n`).
                // `copy` (memmove), since both may be one memory.
                unsafe { std::ptr::copy(from, to.add(at2), m) };
                copied(m);
            });
            match from {
                Ok(true) => {}
                Ok(false) => whole = false,
                Err(e) => failed = Some(e),
            }
        })
        .map_err(CopyError::Dest)?;
    if let Some(e) = failed {
        return Err(CopyError::Source(e));
    }
    if lent && whole {
        return Ok(());
    }
    // Through a buffer (a lender that would wait, or one that never
    // lends): whatever was copied straight is copied again, the same bytes.
    let mut buf = Vec::with_capacity(len);
    src.read_uninit(src_addr, &mut buf.spare_capacity_mut()[..len])
        .map_err(CopyError::Source)?;
    // SAFETY: `read_uninit` succeeded, so it initialized all `len` bytes.
    unsafe { buf.set_len(len) };
    copied(len);
    dst.write(dst_addr, &buf).map_err(CopyError::Dest)?;
    copied(len);
    Ok(())
}

/// [`copy`] between two memories lent whole ([`GuestMemory::lend_all`]):
/// the same result, and the same bytes written up to where an error stops
/// it, as `copy` between memories that lend, with each side's host
/// pointer looked up in its [`Lent`] and no closure. Returns the bytes
/// copied (all of `len`, or on an error those before it), which the
/// caller counts ([`copied`]), once for all of a packet's pieces.
#[inline(never)]
pub fn copy_lent(
    src: &Lent<'_>,
    src_addr: u64,
    dst: &Lent<'_>,
    dst_addr: u64,
    len: usize,
) -> (usize, Result<(), CopyError>) {
    if len == 0 {
        return (0, Ok(()));
    }
    // As `copy`: a source range that wraps fails before the destination
    // is looked at.
    if src_addr.checked_add(len as u64).is_none() {
        let e = DmaError {
            addr: src_addr,
            len,
        };
        return (0, Err(CopyError::Source(e)));
    }
    // The pieces `copy` goes by: the destination checked whole, then each
    // destination piece `[at, at + n)` at `to` (one mapping), the source
    // for it checked whole, then copied piece by piece. Mostly one of
    // each: a page inside one mapping. `host` gives at least 1 and at
    // most the bytes asked for.
    let (mut to, mut n) = match dst.host(dst_addr, len, true) {
        Ok(h) => h,
        Err(e) => return (0, Err(CopyError::Dest(e))),
    };
    let mut at = 0;
    loop {
        let mut at2 = 0;
        while at2 < n {
            let (from, m) = match src.host(src_addr + (at + at2) as u64, n - at2, false) {
                Ok(h) => h,
                Err(e) => return (at + at2, Err(CopyError::Source(e))),
            };
            // SAFETY: `host` found `m` bytes at `from` mapped readable and
            // `n` at `to` writable, which their lenders keep mapped while
            // the closures given to `lend_all` run, as they do around
            // this call; `at2 + m <= n`. `copy` (memmove), since both may
            // be one memory.
            unsafe { std::ptr::copy(from, to.add(at2), m) };
            at2 += m;
        }
        at += n;
        if at == len {
            return (len, Ok(()));
        }
        // Checked whole above; an error now (the memory changed, which
        // a lender's lock rules out) is still the destination's.
        (to, n) = match dst.host(dst_addr + at as u64, len - at, true) {
            Ok(h) => h,
            Err(e) => return (at, Err(CopyError::Dest(e))),
        };
    }
}

/// MSI-X delivery to the guest.
pub trait Interrupts: Send + Sync {
    /// Signals MSI-X `vector`. A vector the guest has not set up is dropped.
    fn signal(&self, vector: u16);
}

/// PCI identity of the function, as config space shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciIdentity {
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Subsystem vendor ID.
    pub subsystem_vendor: u16,
    /// Subsystem ID.
    pub subsystem: u16,
    /// Revision ID.
    pub revision: u8,
    /// Class code: base class, subclass, programming interface (24 bits).
    pub class: u32,
}

/// How a BAR's contents reach the model.
#[derive(Clone)]
pub enum BarBacking {
    /// Every guest access traps into [`PciFunction::bar_read`] or
    /// [`PciFunction::bar_write`].
    Trapped,
    /// The guest maps this memory directly; its stores land in the model's
    /// memory without a message (doorbells, LLQ). The model polls it.
    Shared(Arc<SharedMem>),
}

/// One memory BAR of the function.
#[derive(Clone)]
pub struct Bar {
    /// BAR index (0..=5). A 64-bit BAR also uses `index + 1`.
    pub index: u8,
    /// Size in bytes, a power of two of at least 4 KiB.
    pub size: u64,
    /// 64-bit BAR.
    pub is_64bit: bool,
    /// Prefetchable.
    pub prefetchable: bool,
    /// Declared as I/O space instead of memory (32-bit, not prefetchable,
    /// trapped). Never on an EFA device: only efa-emu's hostile mode
    /// declares one (`bar-io`), to see that a driver refuses it.
    pub io_space: bool,
    /// Where the contents live.
    pub backing: BarBacking,
}

/// Where the MSI-X table and pending-bit array live: the upper half of BAR0,
/// as on real EFA and ENA devices (16 KiB BAR0, table at 0x2000, PBA at
/// 0x3000). The table starts at half the BAR, the PBA on the next page
/// boundary after the table; both must fit in the BAR.
///
/// The transport owns that half: guest accesses to it never reach
/// [`PciFunction::bar_read`] or [`PciFunction::bar_write`] (QEMU emulates the
/// table; PBA reads return no pending bits). The model keeps its registers in
/// the lower half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsixLayout {
    /// Number of vectors (table entries).
    pub vectors: u16,
    /// BAR index holding table and PBA (always 0).
    pub bar: u8,
    /// Offset of the table in the BAR.
    pub table_offset: u64,
    /// Offset of the PBA in the BAR.
    pub pba_offset: u64,
}

impl MsixLayout {
    /// The most vectors MSI-X allows.
    pub const MAX_VECTORS: u16 = 2048;

    /// The layout for `vectors` vectors in a BAR0 of `bar0_size` bytes, or
    /// `None` if `vectors` is 0 or above [`Self::MAX_VECTORS`] or the table
    /// and PBA do not fit in the upper half.
    pub fn new(bar0_size: u64, vectors: u16) -> Option<Self> {
        const PAGE: u64 = 4096;
        if vectors == 0 || vectors > Self::MAX_VECTORS || !bar0_size.is_power_of_two() {
            return None;
        }
        let n = u64::from(vectors);
        let table_offset = bar0_size / 2;
        let pba_offset = table_offset + (n * 16).div_ceil(PAGE) * PAGE;
        let pba_end = pba_offset + n.div_ceil(64) * 8;
        (table_offset >= PAGE && pba_end <= bar0_size).then_some(Self {
            vectors,
            bar: 0,
            table_offset,
            pba_offset,
        })
    }

    /// Whether `offset` in BAR [`Self::bar`] belongs to the table or PBA.
    pub fn owns(&self, offset: u64) -> bool {
        offset >= self.table_offset
    }
}

/// A PCI function the transport serves to a guest.
///
/// Threads: the vfio-user transport calls `bar_read`, `bar_write` and `reset`
/// from one thread, one call at a time, in the order the guest's accesses
/// arrive; while a call runs no other message (DMA map, interrupt setup) is
/// handled. A read keeps its vCPU waiting for the answer; writes are posted
/// (QEMU 11 does not wait for them), so a vCPU may run on before
/// `bar_write` returns, but its next access to the device is handled after
/// it. QEMU gives up on an answer after 5 s (`x-msg-timeout`). A callback may
/// therefore take a lock or do DMA, but must return promptly and never wait
/// for something the guest or QEMU has yet to do. `shutdown` is called from
/// the thread that runs the transport, after the last callback has returned.
/// A control socket (`crate::control_socket`) calls `bar_read` and
/// `bar_write` too, from a thread of its own, at any time (between
/// sessions as well): a function it serves must take that (the EFA model's
/// callbacks hold its state lock).
pub trait PciFunction: Send + Sync {
    /// Identity shown in config space.
    fn identity(&self) -> PciIdentity;
    /// The memory BARs. BAR0 must be [`BarBacking::Trapped`] and large enough
    /// for the MSI-X table in its upper half (see [`MsixLayout`]).
    fn bars(&self) -> Vec<Bar>;
    /// Number of MSI-X vectors (table size); 0 for no MSI-X capability.
    fn msix_vectors(&self) -> u16;
    /// A guest read of a trapped BAR. `data.len()` is 1, 2, 4 or 8 and the
    /// access lies inside the BAR (not necessarily aligned).
    fn bar_read(&self, bar: u8, offset: u64, data: &mut [u8]);
    /// A guest write to a trapped BAR. `data.len()` is 1, 2, 4 or 8 and the
    /// access lies inside the BAR (not necessarily aligned).
    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]);
    /// Function-level reset requested by the transport (or guest FLR). The
    /// transport also calls it when a new client connects, so a model reused
    /// after [`PciFunction::shutdown`] starts from its power-on state.
    fn reset(&self);
    /// The guest is gone (disconnect): stop all device activity. DMA and
    /// interrupts fail or are dropped from now on.
    fn shutdown(&self);
}

#[cfg(test)]
mod tests {
    use super::MsixLayout;

    #[test]
    fn msix_layout_matches_real_efa_and_refuses_misfits() {
        let l = MsixLayout::new(16384, 33).unwrap();
        assert_eq!((l.table_offset, l.pba_offset), (0x2000, 0x3000));
        assert!(l.owns(0x2000) && l.owns(0x3ffc) && !l.owns(0x1ffc));
        assert_eq!(
            MsixLayout::new(16384, 256).map(|l| l.pba_offset),
            Some(0x3000)
        );
        assert_eq!(
            MsixLayout::new(16384, 257),
            None,
            "table spills into the PBA page's end"
        );
        assert_eq!(MsixLayout::new(16384, 0), None);
        assert_eq!(
            MsixLayout::new(4096, 1),
            None,
            "no room for a register page"
        );
        assert_eq!(MsixLayout::new(12288, 1), None, "not a power of two");
        assert_eq!(
            MsixLayout::new(1 << 20, 2048).map(|l| l.table_offset),
            Some(1 << 19)
        );
        assert_eq!(MsixLayout::new(1 << 20, 2049), None);
    }
}
