//! A packet's payload: bytes, or a reference to the sender's guest memory
//! that the receiver copies from, once, straight into its own.
//!
//! # Why a reference
//!
//! Between two devices of one process a payload of bytes costs two copies
//! of every byte: the sender gathers it from its guest memory into the
//! packet, the receiver scatters it from the packet into its guest memory.
//! A real device has no such buffer either: it reads host memory when it
//! puts the packet on the wire. So an SRD send or RDMA write segment
//! carries a [`Gather`] instead: the sender's guest memory and the
//! resolved pieces of its buffers (each an MR's [`Region`] and an I/O
//! virtual address range in it), checked against their MRs when the WQE
//! was taken. The receiver, when it delivers, copies from the sender's
//! guest memory into its own ([`Source::copy_to_pages`]: both memories
//! lent whole, [`crate::transport::GuestMemory::lend_all`], and the pages
//! of both sides walked in step; or, where a memory does not lend so,
//! one [`crate::transport::copy`] per page piece); the answer to an RDMA read
//! refers to the responder's MR the same way, and the requester copies
//! from it. A retransmission, a duplicate injected by the fabric and a
//! packet held back by an injected delay share the reference, not bytes.
//!
//! What the receiver gets is what the buffer holds when it copies, not
//! when the WQE was posted. That is within the verbs contract: a sender's
//! buffer must not change until its work request completes, and an SRD
//! WQE completes only after the answer, which the receiver sends after
//! its copy (an RDMA read's requester copies before it completes). UD
//! sends complete as they leave, before any receiver copies, so UD
//! payloads stay bytes, gathered when the WQE is taken; so do inline data
//! (already copied out of the LLQ) and everything decoded from a UDP
//! datagram.
//!
//! # A region deregistered under a packet
//!
//! The guest may deregister an MR (or reset the device) while a packet
//! that refers to it is in flight: its memory may be given to someone else
//! by then, and must not be read. A real device finishes its DMA from a
//! region before it answers DEREG_MR, and fails the work requests that
//! would still need it. Here each MR's [`Region`] is shared between the
//! MR and the payloads that refer to it; the receiver *pins* it for the
//! copy ([`Data::source`]), which fails once it is retired, and DEREG_MR
//! (and a reset, which drops every MR) retires it, waiting for the pins
//! held: a copy under way, a few microseconds, never a packet in flight.
//! A receiver that finds the region retired delivers nothing and answers
//! `LOCAL_ERROR_INVALID_LKEY`, which the requester's WQE completes with
//! ([`Fault::requester_status`]). Waiting for every packet in flight
//! instead would hold DEREG_MR for a retransmission timeout or a delay
//! injected on the link, for nothing the guest could use.
//!
//! # Locks
//!
//! The receiver copies on its own data-path thread, holding its own
//! device's state lock, and never takes the sender's: two devices
//! receiving from each other at once would each hold its own lock and
//! wait for the other's. The pin is the only thing of the sender it takes,
//! an atomic count of the [`Region`]'s own (whose lock only a retire and
//! the last pin it waits for take, last: whoever holds it takes nothing
//! else), and a pin holder waits for no device lock. DEREG_MR retires under the sender's state lock and
//! waits for the pins, whose holders wait for nothing of the sender's;
//! on one device (loopback) a pin is only held under that device's lock,
//! so DEREG_MR cannot even start while one is. Guest memory locks (the
//! vfio-user table of mappings) are taken inside all of these; two at
//! once only in [`crate::transport::copy`] and [`Source::copy_to_pages`],
//! whose inner one never waits (and whose outer one neither: a lender
//! gives up rather than wait behind a DMA_MAP).
//!
//! # Across processes
//!
//! A reference means nothing in another process as it is. Over the Unix
//! sockets, to a peer that accepted this process's guest memory
//! ([`super::share`]), the fabric sends it as descriptors of that memory
//! ([`Data::describe`]: the offered memfd's offsets, and the MR's slot
//! in the pin table for that peer); the receiver decodes them into a
//! [`share::Remote`] payload and copies from its read-only mapping of our
//! memory straight into its guest's, once per byte, pinning the slot for
//! the copy as a receiver here pins the [`Region`]. DEREG_MR and reset
//! retire the region's slots in every peer's pin table too, and wait for
//! them ([`share::PinTable::retire`]). Until a peer has accepted (and
//! always over UDP, or to a peer that refused), the fabric turns the
//! reference into bytes at the socket boundary ([`super::Fabric::send`];
//! that copy is the gather, counted there). A capture of a packet between
//! two ports of one process reads its payload for the record only (a
//! copy only while capturing).

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use efa_hw::io::{CompStatus, TX_DESC_NUM_BUFS};

use super::share::{self, Desc, PeerTx};
use crate::copycount::copied;
use crate::transport::{self, CopyError, DmaError, GuestMemory, Lent};

/// The pages behind a memory region, and whether it is still registered:
/// shared by the MR and by every payload that refers to it.
pub struct Region {
    iova: u64,
    page_shift: u8,
    pages: Vec<u64>,
    /// The pins held ([`Region::pin`]), and [`RETIRED`] once it was. An
    /// atomic, not under `state`: the sender pins its buffer as it sends
    /// and the receiver as it copies, each thread several times per
    /// message, so a lock would be taken and passed between the two
    /// threads for every packet.
    pins: AtomicU32,
    state: Mutex<Use>,
    /// Signalled (under `state`) by the last pin dropped once retired.
    idle: Condvar,
}

/// The bit of [`Region::pins`] that says it was retired.
const RETIRED: u32 = 1 << 31;

#[derive(Debug, Default)]
struct Use {
    /// The slots of the pin tables of the peers in other processes that
    /// packets referring to the region went to ([`share`]).
    shared: Vec<(Arc<PeerTx>, u16, u32)>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("iova", &self.iova)
            .field("page_shift", &self.page_shift)
            .field("pages", &self.pages.len())
            .finish_non_exhaustive()
    }
}

impl Region {
    /// A registered region starting at `iova`, of pages of `2^page_shift`
    /// bytes at the DMA addresses `pages`.
    pub fn new(iova: u64, page_shift: u8, pages: Vec<u64>) -> Arc<Self> {
        Arc::new(Self {
            iova,
            page_shift,
            pages,
            pins: AtomicU32::new(0),
            state: Mutex::new(Use::default()),
            idle: Condvar::new(),
        })
    }

    /// The DMA address of every page.
    pub fn pages(&self) -> &[u64] {
        &self.pages
    }

    fn lock(&self) -> MutexGuard<'_, Use> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls `f(dma address, offset in the range, length)` for the page
    /// pieces of `[addr, addr + len)`, an I/O virtual range the caller
    /// checked lies inside the region; `no_page` if it does not.
    pub fn walk<E>(
        &self,
        addr: u64,
        len: usize,
        no_page: E,
        mut f: impl FnMut(u64, usize, usize) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut pages = self.pieces(addr, len);
        let mut done = 0;
        while let Some(p) = pages.next() {
            let Some((gpa, n)) = p else {
                return Err(no_page);
            };
            f(gpa, done, n)?;
            done += n;
        }
        Ok(())
    }

    /// The page pieces of `[addr, addr + len)`, one at a time, as
    /// [`Region::walk`] goes through them.
    fn pieces(&self, addr: u64, len: usize) -> PagePieces<'_> {
        PagePieces {
            pages: &self.pages,
            shift: self.page_shift.into(),
            first: self.iova >> self.page_shift,
            addr,
            left: len,
        }
    }

    /// Holds the region registered until the pin is dropped; `None` once
    /// it was retired.
    fn pin(&self) -> Option<Pin<'_>> {
        // Counted first, then checked: a retire that comes after the count
        // waits for this pin, one that came before refuses it.
        if self.pins.fetch_add(1, Ordering::Acquire) & RETIRED != 0 {
            // Uncounted again (and the retire told, if it waits for it).
            drop(Pin(self));
            return None;
        }
        Some(Pin(self))
    }

    /// Deregistration: no pin is given from now on, and this returns once
    /// the pins held (copies under way) are dropped, here and in the peer
    /// processes that were sent descriptors of it.
    ///
    /// A sender describing the region to a peer holds a pin of it while
    /// it takes the peer's slot ([`Region::slot_for`]), so once the pins
    /// here are 0 no slot can be added: the list taken then is complete.
    pub fn retire(&self) {
        let mut u = self.lock();
        // Under the lock, which the last pin takes to signal: that signal
        // cannot fall between the look at the count and the wait.
        self.pins.fetch_or(RETIRED, Ordering::AcqRel);
        while self.pins.load(Ordering::Acquire) & !RETIRED > 0 {
            u = self.idle.wait(u).unwrap_or_else(|e| e.into_inner());
        }
        let shared = std::mem::take(&mut u.shared);
        // The peers' pins are waited for without the lock: a pin here is
        // refused meanwhile anyway (retired).
        drop(u);
        for (peer, slot, _) in shared {
            peer.release(slot);
        }
    }

    /// The slot and generation of the region in `peer`'s pin table, taken
    /// now if it has none; `None` if the table is full or not made yet
    /// (nothing offered to the peer). The caller holds a pin of the region
    /// (so it is not retired).
    fn slot_for(&self, peer: &Arc<PeerTx>) -> Option<(u16, u32)> {
        let mut u = self.lock();
        debug_assert!(
            {
                let n = self.pins.load(Ordering::Acquire);
                n & RETIRED == 0 && n > 0
            },
            "described under a pin"
        );
        if let Some((_, slot, gen)) = u.shared.iter().find(|(p, ..)| Arc::ptr_eq(p, peer)) {
            return Some((*slot, *gen));
        }
        let (slot, gen) = peer.take_slot()?;
        // The peers that are gone (a new process at the GID is `peer`,
        // say) have nothing of the region to wait for: let them go.
        u.shared.retain(|(p, ..)| !p.is_forgotten());
        u.shared.push((peer.clone(), slot, gen));
        Some((slot, gen))
    }

    /// Whether it was retired.
    pub fn is_retired(&self) -> bool {
        self.pins.load(Ordering::Acquire) & RETIRED != 0
    }
}

/// A walk through a region's pages ([`Region::pieces`]).
struct PagePieces<'a> {
    pages: &'a [u64],
    /// The region's page shift (one of `PAGE_SIZE_CAP`'s, which REG_MR
    /// checks), and its first page number.
    shift: u32,
    first: u64,
    /// The next byte, and the bytes from it still to go.
    addr: u64,
    left: usize,
}

impl PagePieces<'_> {
    /// The DMA address and length of the next piece, within one page;
    /// `Some(None)` if the region has no page for it (and then again);
    /// `None` once the range is done.
    #[inline]
    fn next(&mut self) -> Option<Option<(u64, usize)>> {
        if self.left == 0 {
            return None;
        }
        let a = self.addr;
        let Some(index) = (a >> self.shift).checked_sub(self.first) else {
            return Some(None);
        };
        let Some(&page) = self.pages.get(index as usize) else {
            return Some(None);
        };
        let psize = 1u64 << self.shift;
        let in_page = a & (psize - 1);
        // Exact: `in_page < psize`, and `n <= left`.
        let n = (psize.wrapping_sub(in_page) as usize).min(self.left);
        self.left = self.left.wrapping_sub(n);
        // Wraps only past the range's last byte, at the end of the address
        // space, and is then never looked at (`left` is 0).
        self.addr = a.wrapping_add(n as u64);
        Some(Some((page + in_page, n)))
    }
}

/// A pinned region ([`Region::pin`]).
struct Pin<'a>(&'a Region);

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        // The last pin of a retired region signals, under the lock that
        // the retire holds while it looks at the count (`Region::retire`).
        if self.0.pins.fetch_sub(1, Ordering::Release) == RETIRED | 1 {
            let _u = self.0.lock();
            self.0.idle.notify_all();
        }
    }
}

/// Most pieces a reference has: the SGEs of a send WQE (an RDMA segment
/// and a read answer have one).
pub const MAX_PIECES: usize = TX_DESC_NUM_BUFS;

/// A range of a sender's buffer: `len` bytes at I/O virtual address
/// `addr` of `region`.
#[derive(Debug, Clone)]
pub struct Piece {
    /// The MR's region.
    pub region: Arc<Region>,
    /// I/O virtual address of the first byte.
    pub addr: u64,
    /// Bytes.
    pub len: usize,
}

/// A payload that stays in the sender's guest memory until the receiver
/// copies it. Held in the payload itself, not behind an `Arc` of its own:
/// a packet allocates nothing (a clone, for a retransmission's copy, takes
/// references to the memory and the regions).
#[derive(Clone)]
pub struct Gather {
    mem: Arc<dyn GuestMemory>,
    pieces: [Option<Piece>; MAX_PIECES],
    len: usize,
}

impl std::fmt::Debug for Gather {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gather")
            .field("pieces", &self.pieces)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// Why a reference cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A region it refers to was deregistered (or the device reset).
    Gone,
    /// The sender's guest memory refused the DMA.
    Dma(DmaError),
}

impl Fault {
    /// The completion status of the request whose data this was, as its
    /// requester's device would report a failed DMA read of its own
    /// buffer.
    pub fn requester_status(&self) -> CompStatus {
        match self {
            Fault::Gone => CompStatus::LocalErrorInvalidLkey,
            Fault::Dma(_) => CompStatus::LocalErrorQpInternalError,
        }
    }
}

#[derive(Clone, Default)]
enum Repr {
    #[default]
    Empty,
    Bytes(Arc<[u8]>),
    Guest(Gather),
    /// Memory of a sender in another process, described by a packet.
    Remote(share::Remote),
}

/// A packet's payload. Clones share it.
#[derive(Clone, Default)]
pub struct Data(Repr);

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Repr::Empty => write!(f, "Data(empty)"),
            Repr::Bytes(b) => write!(f, "Data({} bytes)", b.len()),
            Repr::Guest(g) => write!(f, "Data({g:?})"),
            Repr::Remote(r) => write!(f, "Data({} bytes in a peer, {:?})", r.byte_len(), r.descs),
        }
    }
}

/// Bytes compare by content, references by identity (the same memory,
/// regions and ranges).
impl PartialEq for Data {
    fn eq(&self, other: &Self) -> bool {
        match (self.as_bytes(), other.as_bytes()) {
            (Some(a), Some(b)) => a == b,
            _ => match (&self.0, &other.0) {
                (Repr::Guest(a), Repr::Guest(b)) => {
                    let same = |p: &Option<Piece>, q: &Option<Piece>| match (p, q) {
                        (None, None) => true,
                        (Some(p), Some(q)) => {
                            Arc::ptr_eq(&p.region, &q.region) && (p.addr, p.len) == (q.addr, q.len)
                        }
                        _ => false,
                    };
                    Arc::ptr_eq(&a.mem, &b.mem)
                        && a.pieces.iter().zip(&b.pieces).all(|(p, q)| same(p, q))
                }
                (Repr::Remote(a), Repr::Remote(b)) => a.same(b),
                _ => false,
            },
        }
    }
}

impl Eq for Data {}

impl From<Arc<[u8]>> for Data {
    fn from(b: Arc<[u8]>) -> Self {
        if b.is_empty() {
            Self(Repr::Empty)
        } else {
            Self(Repr::Bytes(b))
        }
    }
}

impl From<&[u8]> for Data {
    fn from(b: &[u8]) -> Self {
        if b.is_empty() {
            Self(Repr::Empty)
        } else {
            Self(Repr::Bytes(b.into()))
        }
    }
}

impl From<Vec<u8>> for Data {
    fn from(b: Vec<u8>) -> Self {
        Self::from(&b[..])
    }
}

impl Data {
    /// A reference to `pieces` of the sender's guest memory `mem` (at most
    /// [`MAX_PIECES`]; empty ones are left out). The caller checked them
    /// against their MRs.
    pub fn guest(mem: Arc<dyn GuestMemory>, pieces: impl IntoIterator<Item = Piece>) -> Self {
        let mut g = Gather {
            mem,
            pieces: Default::default(),
            len: 0,
        };
        let mut n = 0;
        for p in pieces.into_iter().filter(|p| p.len > 0) {
            assert!(n < MAX_PIECES, "at most {MAX_PIECES} pieces");
            g.len += p.len;
            g.pieces[n] = Some(p);
            n += 1;
        }
        if n == 0 {
            return Self(Repr::Empty);
        }
        Self(Repr::Guest(g))
    }

    /// Bytes of payload.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Empty => 0,
            Repr::Bytes(b) => b.len(),
            Repr::Guest(g) => g.len,
            Repr::Remote(r) => r.byte_len(),
        }
    }

    /// A payload in a peer process's memory.
    pub fn remote(r: share::Remote) -> Self {
        Self(Repr::Remote(r))
    }

    /// The descriptors of a reference to this process's guest memory for
    /// `peer` into `out`, each page piece's memfd offered to it
    /// (`offer(file, id)` for one not offered yet): `Ok(true)` if all of it
    /// could be described; `Ok(false)` if not (a memfd not yet accepted,
    /// too many pieces, not a reference), and then the bytes go.
    /// `Err`: a region was retired, as [`Data::source`].
    pub fn describe(
        &self,
        peer: &Arc<PeerTx>,
        out: &mut Vec<Desc>,
        offer: &mut dyn FnMut(&Arc<std::fs::File>, u32),
    ) -> Result<bool, Fault> {
        out.clear();
        let Repr::Guest(g) = &self.0 else {
            return Ok(false);
        };
        // Pinned while the slots are taken (see `Region::retire`).
        let _src = self.source()?;
        let mut whole = true;
        // The memfd of the page before, accepted under this id: the pages
        // of a buffer are mostly in one, looked up once (under the peer's
        // lock) per run of them, not once a page.
        let mut ready: Option<(Arc<std::fs::File>, u32)> = None;
        for p in g.pieces.iter().flatten() {
            // No slot (no pin table before the first offer): the memfds
            // are still looked up, so that they are offered.
            let slot = p.region.slot_for(peer);
            let r = p.region.walk(p.addr, p.len, (), |gpa, _, n| {
                let b = g.mem.backing(gpa, n).ok_or(())?;
                let found = match &ready {
                    Some((f, id)) if Arc::ptr_eq(f, &b.file) => share::Offer::Ready(*id),
                    _ => peer.region(&b.file),
                };
                let region = match found {
                    share::Offer::Ready(id) => {
                        ready = Some((b.file, id));
                        id
                    }
                    share::Offer::New(id) => {
                        offer(&b.file, id);
                        whole = false;
                        return Ok(());
                    }
                    share::Offer::Pending | share::Offer::Full => {
                        whole = false;
                        return Ok(());
                    }
                };
                let Some((slot, gen)) = slot else {
                    whole = false;
                    return Ok(());
                };
                let len = n as u32;
                if let Some(last) = out.last_mut().filter(|d| {
                    d.region == region
                        && d.slot == slot
                        && d.gen == gen
                        && d.offset + u64::from(d.len) == b.offset
                }) {
                    last.len += len;
                } else if out.len() < share::MAX_DESCS {
                    out.push(Desc {
                        region,
                        offset: b.offset,
                        len,
                        slot,
                        gen,
                    });
                } else {
                    return Err(());
                }
                Ok(())
            });
            if r.is_err() {
                return Ok(false);
            }
        }
        Ok(whole)
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, unless it refers to guest memory.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Repr::Empty => Some(&[]),
            Repr::Bytes(b) => Some(b),
            Repr::Guest(_) | Repr::Remote(_) => None,
        }
    }

    /// Whether it refers to guest memory of this process.
    pub fn is_reference(&self) -> bool {
        matches!(self.0, Repr::Guest(_))
    }

    /// Whether it refers to guest memory of a peer process.
    pub fn is_remote(&self) -> bool {
        matches!(self.0, Repr::Remote(_))
    }

    /// The payload to copy from: a reference's regions pinned, so that
    /// they stay registered until the source is dropped.
    pub fn source(&self) -> Result<Source<'_>, Fault> {
        let g = match &self.0 {
            Repr::Empty => return Ok(Source(Src::Bytes(&[]))),
            Repr::Bytes(b) => return Ok(Source(Src::Bytes(b))),
            Repr::Guest(g) => g,
            Repr::Remote(r) => {
                // One pin per MR (the decoder let through at most
                // `MAX_PIECES` of them).
                let mut pins: [Option<share::PinGuard<'_>>; MAX_PIECES] = Default::default();
                let mut held: [(u16, u32); MAX_PIECES] = [(0, 0); MAX_PIECES];
                let mut n = 0;
                for (_, d) in &r.descs {
                    if held[..n].contains(&(d.slot, d.gen)) {
                        continue;
                    }
                    let pin = r.pins.pin(d.slot.into(), d.gen).ok_or(Fault::Gone)?;
                    let (Some(h), Some(p)) = (held.get_mut(n), pins.get_mut(n)) else {
                        return Err(Fault::Gone);
                    };
                    *h = (d.slot, d.gen);
                    *p = Some(pin);
                    n += 1;
                }
                return Ok(Source(Src::Remote {
                    remote: r,
                    _pins: pins,
                }));
            }
        };
        let mut pins: [Option<Pin<'_>>; MAX_PIECES] = Default::default();
        for (pin, p) in pins.iter_mut().zip(&g.pieces) {
            if let Some(p) = p {
                *pin = Some(p.region.pin().ok_or(Fault::Gone)?);
            }
        }
        Ok(Source(Src::Guest {
            gather: g,
            _pins: pins,
        }))
    }

    /// The payload as bytes: a reference is read (one copy).
    pub fn to_bytes(&self) -> Result<Data, Fault> {
        if !self.is_reference() {
            return Ok(self.clone());
        }
        let src = self.source()?;
        let mut d = Arc::<[u8]>::new_uninit_slice(self.len());
        src.read(Arc::get_mut(&mut d).expect("a new Arc is unique"))?;
        // SAFETY: `read` succeeded, so it initialized every byte.
        Ok(Data::from(unsafe { d.assume_init() }))
    }
}

/// A walk through the page pieces of a reference's buffers from byte
/// `off` on, as [`Source::walk`] goes through them.
struct GatherPieces<'a> {
    pieces: std::iter::Flatten<std::slice::Iter<'a, Option<Piece>>>,
    /// The pages of the current buffer from the byte reached on.
    cur: Option<PagePieces<'a>>,
    skip: usize,
}

impl<'a> GatherPieces<'a> {
    fn new(g: &'a Gather, off: usize) -> Self {
        Self {
            pieces: g.pieces.iter().flatten(),
            cur: None,
            skip: off,
        }
    }

    /// The DMA address and length of the next page piece; `None` past
    /// the end, or where a region has no page.
    #[inline]
    fn next(&mut self) -> Option<(u64, usize)> {
        loop {
            if let Some(c) = &mut self.cur {
                match c.next() {
                    Some(p) => return p,
                    None => self.cur = None,
                }
            }
            let p = self.pieces.next()?;
            if self.skip >= p.len {
                self.skip -= p.len;
                continue;
            }
            self.cur = Some(
                p.region
                    .pieces(p.addr + self.skip as u64, p.len - self.skip),
            );
            self.skip = 0;
        }
    }
}

/// A payload ready to copy from ([`Data::source`]).
pub struct Source<'a>(Src<'a>);

enum Src<'a> {
    /// Bytes of the packet.
    Bytes(&'a [u8]),
    /// The sender's guest memory, its regions pinned while `_pins` live.
    Guest {
        gather: &'a Gather,
        _pins: [Option<Pin<'a>>; MAX_PIECES],
    },
    /// A peer process's memory, its MRs pinned in its table while `_pins`
    /// live.
    Remote {
        remote: &'a share::Remote,
        _pins: [Option<share::PinGuard<'a>>; MAX_PIECES],
    },
}

impl Source<'_> {
    /// Bytes.
    pub fn len(&self) -> usize {
        match &self.0 {
            Src::Bytes(b) => b.len(),
            Src::Guest { gather: g, .. } => g.len,
            Src::Remote { remote: r, .. } => r.byte_len(),
        }
    }

    /// Calls `f(host pointer, offset, length)` for the pieces of bytes
    /// `[off, off + len)` of a peer's payload, each checked against its
    /// mapping; `false` if the range is past its end.
    fn walk_remote(
        r: &share::Remote,
        off: usize,
        len: usize,
        mut f: impl FnMut(*const u8, usize, usize) -> bool,
    ) -> bool {
        let mut skip = off;
        let mut done = 0;
        for (m, d) in &r.descs {
            let dlen = d.len as usize;
            if done == len {
                break;
            }
            if skip >= dlen {
                skip -= dlen;
                continue;
            }
            let take = (dlen - skip).min(len - done);
            // Checked when the packet was decoded; again, since a wrong
            // pointer here would read outside the mapping.
            let Some(from) = m.range(d.offset + skip as u64, take) else {
                return false;
            };
            if !f(from, done, take) {
                return false;
            }
            done += take;
            skip = 0;
        }
        done == len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f(memory, DMA address, offset, length)` for the page pieces
    /// of bytes `[off, off + len)` of a reference; `Err(None)` if the range
    /// is past its end.
    fn walk<E>(
        g: &Gather,
        off: usize,
        len: usize,
        mut f: impl FnMut(u64, usize, usize) -> Result<(), E>,
    ) -> Result<(), Option<E>> {
        let mut skip = off;
        let mut done = 0;
        for p in g.pieces.iter().flatten() {
            if done == len {
                break;
            }
            if skip >= p.len {
                skip -= p.len;
                continue;
            }
            let take = (p.len - skip).min(len - done);
            p.region
                .walk(p.addr + skip as u64, take, None, |gpa, at, n| {
                    f(gpa, done + at, n).map_err(Some)
                })?;
            done += take;
            skip = 0;
        }
        if done < len {
            return Err(None);
        }
        Ok(())
    }

    /// Whether every byte can be read now (the sender's memory is there),
    /// without reading: a receiver checks before it takes a receive or
    /// writes anything.
    pub fn check(&self) -> Result<(), Fault> {
        let Src::Guest { gather: g, .. } = &self.0 else {
            return Ok(());
        };
        let missing = Fault::Dma(DmaError {
            addr: 0,
            len: g.len,
        });
        // Every page looked up under one lend of the memory, whose look-up
        // fails where `check` would, as `check` would; one lock (or
        // none), not one a page.
        let mut lent = None;
        g.mem.lend_all(&mut |s| {
            lent = Some(Self::walk(g, 0, g.len, |gpa, _, n| {
                s.host(gpa, n, false).map(drop).map_err(Fault::Dma)
            }));
        });
        lent.unwrap_or_else(|| {
            Self::walk(g, 0, g.len, |gpa, _, n| {
                g.mem.check(gpa, n as u64, false).map_err(Fault::Dma)
            })
        })
        .map_err(|e| e.unwrap_or(missing))
    }

    /// Copies bytes `[off, off + len)` into the pages of `region`, an MR
    /// of `dst`, from I/O virtual address `addr` on: what
    /// `region.walk(addr, len, None, |gpa, at, n| self.copy_to(off + at,
    /// dst, gpa, n).map_err(Some))` does, with the same result and the
    /// same bytes written (up to where an error stops it), and the same
    /// copies counted. `Err(None)`: `region` has no page for part of the
    /// range.
    ///
    /// From a reference, when both memories lend themselves whole
    /// ([`GuestMemory::lend_all`]; from a peer's memory, the destination
    /// alone), the destination's pages and the source's are walked in
    /// step and each page's host pointers looked
    /// up directly ([`Lent::host`]): a 4 KiB page of a 64 KiB RDMA write
    /// in `make bench-emu` costs the responder about 110 instructions
    /// besides its copy (some 430), where a `copy_to` per page (two
    /// nested [`GuestMemory::lend`] closures for each page of each side)
    /// cost about 330.
    pub fn copy_to_pages(
        &self,
        off: usize,
        dst: &dyn GuestMemory,
        region: &Region,
        addr: u64,
        len: usize,
    ) -> Result<(), Option<CopyError>> {
        let mut done = None;
        match &self.0 {
            // Both lent before anything is copied: a memory that would
            // wait (or does not lend so) leaves the whole copy to the
            // walk below, never half of it. The inner lend never waits,
            // as `transport::copy`'s does not.
            Src::Guest { gather: g, .. } => {
                dst.lend_all(&mut |d| {
                    g.mem.lend_all(&mut |s| {
                        done = Some(Self::copy_lent(g, off, s, d, region, addr, len));
                    });
                });
            }
            // The peer's mapping is ours for as long as `r` is: only the
            // destination is lent.
            Src::Remote { remote: r, .. } => {
                dst.lend_all(&mut |d| {
                    done = Some(Self::copy_remote_lent(r, off, d, region, addr, len));
                });
            }
            Src::Bytes(_) => {}
        }
        if let Some(r) = done {
            return r;
        }
        region.walk(addr, len, None, |gpa, at, n| {
            self.copy_to(off + at, dst, gpa, n).map_err(Some)
        })
    }

    /// [`Source::copy_to_pages`] from the peer's memory of `r` into `d`:
    /// the destination's page pieces and the descriptors' pieces taken in
    /// step, as [`Source::copy_lent`] takes two lent memories' (before, a
    /// `lend` of the destination per piece: 16 for a 64 KiB RDMA write
    /// over scattered pages), with the errors `copy_to` of each
    /// destination piece would give.
    fn copy_remote_lent(
        r: &share::Remote,
        off: usize,
        d: &Lent<'_>,
        region: &Region,
        addr: u64,
        len: usize,
    ) -> Result<(), Option<CopyError>> {
        let mut dst = region.pieces(addr, len);
        // The destination's current piece: where its next byte goes, its
        // bytes left, and its length (for a source too short for it).
        let (mut to, mut to_left, mut to_len) = (0u64, 0usize, 0usize);
        let mut total = 0;
        let mut err = None;
        let whole = Self::walk_remote(r, off, len, |from, _, n| {
            let mut at = 0;
            while at < n {
                if to_left == 0 {
                    match dst.next() {
                        // `region.pieces` yields `len` bytes, as many as
                        // the walk: not before the source's last.
                        None => return false,
                        Some(None) => {
                            err = Some(None);
                            return false;
                        }
                        Some(Some((gpa, m))) => (to, to_left, to_len) = (gpa, m, m),
                    }
                }
                // What `copy_to` of the piece would lend: the destination
                // piece's part in this descriptor's.
                let k = to_left.min(n - at);
                let mut put = 0;
                while put < k {
                    let (t, tn) = match d.host(to + put as u64, k - put, true) {
                        Ok(h) => h,
                        // A later part of a piece that crosses mappings
                        // was found mapped with its first: only the first
                        // fails, with the error of the whole.
                        Err(e) => {
                            err = Some(Some(CopyError::Dest(e)));
                            return false;
                        }
                    };
                    // SAFETY: `from` is valid for `n` bytes of reads (inside
                    // the peer's mapping, `walk_remote`), `at + put + tn <=
                    // n`; `host` found `tn` bytes at `t` mapped writable,
                    // which the lender keeps mapped while the closure given
                    // to `lend_all` runs, as it does around this call. The
                    // peer's mapping is read-only and another process's:
                    // never the destination, so no overlap.
                    unsafe { std::ptr::copy_nonoverlapping(from.add(at + put), t, tn) };
                    put += tn;
                }
                total += k;
                at += k;
                to = to.wrapping_add(k as u64);
                to_left -= k;
            }
            true
        });
        copied(total);
        match (whole, err) {
            (true, _) => Ok(()),
            (false, Some(e)) => Err(e),
            // The descriptors end first: in the destination's piece, or
            // where its next begins, which `copy_to` would have been
            // called for.
            (false, None) => {
                if to_left == 0 {
                    match dst.next() {
                        Some(None) => return Err(None),
                        Some(Some((_, m))) => to_len = m,
                        None => {}
                    }
                }
                Err(Some(CopyError::Source(DmaError {
                    addr: 0,
                    len: to_len,
                })))
            }
        }
    }

    /// [`Source::copy_to_pages`] from `g`, lent as `s`, into `d`: the
    /// destination's page pieces and the source's taken in step, and
    /// copied where they overlap, as `copy_to` of each destination piece
    /// goes through the source's page pieces for it.
    fn copy_lent(
        g: &Gather,
        off: usize,
        s: &Lent<'_>,
        d: &Lent<'_>,
        region: &Region,
        addr: u64,
        len: usize,
    ) -> Result<(), Option<CopyError>> {
        let mut dst = region.pieces(addr, len);
        let mut src = GatherPieces::new(g, off);
        // The current piece of each side: where its next byte is, and
        // its bytes left; and the length of the destination's, which
        // `copy_to` of it would report a source too short for.
        let (mut to, mut to_left, mut to_len) = (0u64, 0usize, 0usize);
        let (mut from, mut from_left) = (0u64, 0usize);
        let mut total = 0;
        let r = loop {
            if to_left == 0 {
                match dst.next() {
                    None => break Ok(()),
                    Some(None) => break Err(None),
                    Some(Some((gpa, n))) => (to, to_left, to_len) = (gpa, n, n),
                }
            }
            if from_left == 0 {
                let Some((gpa, n)) = src.next() else {
                    break Err(Some(CopyError::Source(DmaError {
                        addr: 0,
                        len: to_len,
                    })));
                };
                (from, from_left) = (gpa, n);
            }
            let n = to_left.min(from_left);
            match (d.host(to, n, true), s.host(from, n, false)) {
                // Mostly: each side's piece in one mapping.
                (Ok((t, tn)), Ok((f, fn_))) if tn == n && fn_ == n => {
                    // SAFETY: `host` found `n` bytes at `f` mapped readable
                    // and at `t` writable, which their lenders keep mapped
                    // while the closures given to `lend_all` run, as they
                    // do around this call. `copy` (memmove), since both
                    // may be one memory.
                    unsafe { std::ptr::copy(f, t, n) };
                    total += n;
                }
                // An error, or a piece that crosses mappings: `copy`'s
                // way through it, with `copy`'s error.
                _ => {
                    let (c, r) = transport::copy_lent(s, from, d, to, n);
                    total += c;
                    if let Err(e) = r {
                        break Err(Some(e));
                    }
                }
            }
            // Past a page at the end of the address space these wrap, and
            // are then not looked at (nothing is left of the piece).
            (to, to_left) = (to.wrapping_add(n as u64), to_left - n);
            (from, from_left) = (from.wrapping_add(n as u64), from_left - n);
        };
        copied(total);
        r
    }

    /// Copies bytes `[off, off + len)` to `dst` at `addr`: once, from the
    /// packet or from the sender's guest memory. A source error is a
    /// [`CopyError::Source`] (the destination may be written in part).
    pub fn copy_to(
        &self,
        off: usize,
        dst: &dyn GuestMemory,
        addr: u64,
        len: usize,
    ) -> Result<(), CopyError> {
        let past = CopyError::Source(DmaError { addr: 0, len });
        match &self.0 {
            Src::Bytes(b) => {
                let end = off.checked_add(len).filter(|&e| e <= b.len()).ok_or(past)?;
                dst.write(addr, &b[off..end]).map_err(CopyError::Dest)?;
                copied(len);
                Ok(())
            }
            Src::Guest { gather: g, .. } => Self::walk(g, off, len, |gpa, at, n| {
                transport::copy(&*g.mem, gpa, dst, addr + at as u64, n)
            })
            .map_err(|e| e.unwrap_or(past)),
            Src::Remote { remote: r, .. } => {
                let mut err = None;
                let ok = Self::walk_remote(r, off, len, |from, at, n| {
                    let lent = dst.lend(addr + at as u64, n, true, &mut |to, at2, m| {
                        // SAFETY: `from` is valid for `n` bytes of reads
                        // (inside the peer's mapping, `walk_remote`), and the
                        // lender keeps `m` bytes at `to` mapped writable
                        // while this runs, `at2 + m <= n`. The mapping is
                        // read-only and another process's: never the
                        // destination, so no overlap.
                        unsafe { std::ptr::copy_nonoverlapping(from.add(at2), to, m) };
                        copied(m);
                    });
                    match lent {
                        Ok(true) => true,
                        Ok(false) => {
                            // Through a buffer: a lender that would wait.
                            let mut buf = vec![0u8; n];
                            // SAFETY: as above for `from`; `buf` is ours.
                            unsafe { std::ptr::copy_nonoverlapping(from, buf.as_mut_ptr(), n) };
                            copied(n);
                            match dst.write(addr + at as u64, &buf) {
                                Ok(()) => {
                                    copied(n);
                                    true
                                }
                                Err(e) => {
                                    err = Some(CopyError::Dest(e));
                                    false
                                }
                            }
                        }
                        Err(e) => {
                            err = Some(CopyError::Dest(e));
                            false
                        }
                    }
                });
                match (ok, err) {
                    (true, _) => Ok(()),
                    (false, Some(e)) => Err(e),
                    (false, None) => Err(past),
                }
            }
        }
    }

    /// Reads all of it into `buf` (of [`Source::len`] bytes; one copy),
    /// which is then initialized.
    pub fn read(&self, buf: &mut [MaybeUninit<u8>]) -> Result<(), Fault> {
        assert_eq!(buf.len(), self.len(), "a buffer of the payload's length");
        match &self.0 {
            Src::Bytes(b) => {
                // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and
                // the lengths are equal.
                unsafe {
                    std::ptr::copy_nonoverlapping(b.as_ptr(), buf.as_mut_ptr().cast(), b.len())
                };
                copied(b.len());
                Ok(())
            }
            Src::Guest { gather: g, .. } => {
                let missing = Fault::Dma(DmaError {
                    addr: 0,
                    len: g.len,
                });
                Self::walk(g, 0, g.len, |gpa, at, n| {
                    g.mem
                        .read_uninit(gpa, &mut buf[at..at + n])
                        .map_err(Fault::Dma)?;
                    copied(n);
                    Ok(())
                })
                .map_err(|e| e.unwrap_or(missing))
            }
            Src::Remote { remote: r, .. } => {
                let dst = buf.as_mut_ptr().cast::<u8>();
                let len = r.byte_len();
                let ok = Self::walk_remote(r, 0, len, |from, at, n| {
                    // SAFETY: `from` is valid for `n` bytes (inside the
                    // mapping), `at + n <= buf.len()` (the walk covers the
                    // payload's length, which `buf` has), and a peer's
                    // mapping is not our buffer.
                    unsafe { std::ptr::copy_nonoverlapping(from, dst.add(at), n) };
                    copied(n);
                    true
                });
                if ok {
                    Ok(())
                } else {
                    Err(Fault::Dma(DmaError { addr: 0, len }))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::HostRange;

    /// Plain memory at address 0 that lends nothing (the trait's default),
    /// beside one that lends.
    struct Mem(Mutex<Vec<u8>>, bool);

    impl GuestMemory for Mem {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
            let m = self.0.lock().unwrap();
            let a = addr as usize;
            let s = m.get(a..a + buf.len()).ok_or(DmaError {
                addr,
                len: buf.len(),
            })?;
            buf.copy_from_slice(s);
            Ok(())
        }
        fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
            let mut m = self.0.lock().unwrap();
            let a = addr as usize;
            let s = m.get_mut(a..a + data.len()).ok_or(DmaError {
                addr,
                len: data.len(),
            })?;
            s.copy_from_slice(data);
            Ok(())
        }
        fn lend(
            &self,
            addr: u64,
            len: usize,
            _write: bool,
            f: &mut dyn FnMut(*mut u8, usize, usize),
        ) -> Result<bool, DmaError> {
            if !self.1 {
                return Ok(false);
            }
            // A lock that is held while lent: `copy` must never take it
            // twice (it would deadlock here, as a vfio-user table with a
            // writer waiting would).
            let Ok(mut m) = self.0.try_lock() else {
                return Ok(false);
            };
            let a = addr as usize;
            let s = m.get_mut(a..a + len).ok_or(DmaError { addr, len })?;
            f(s.as_mut_ptr(), 0, len);
            Ok(true)
        }
    }

    fn mem(n: usize, lends: bool) -> Arc<Mem> {
        Arc::new(Mem(Mutex::new((0..n).map(|i| i as u8).collect()), lends))
    }

    #[test]
    fn a_reference_reads_across_pages_and_pieces_and_a_retired_region_refuses() {
        let src = mem(0x4000, true);
        // Pages in reverse: IOVA 0x10000.. maps to 0x3000, 0x2000, ...
        let r = Region::new(0x10000, 12, vec![0x3000, 0x2000, 0x1000, 0x0]);
        let d = Data::guest(
            src.clone(),
            [
                Piece {
                    region: r.clone(),
                    addr: 0x10ff0,
                    len: 0x20,
                },
                Piece {
                    region: r.clone(),
                    addr: 0x12000,
                    len: 4,
                },
            ],
        );
        assert_eq!(d.len(), 0x24);
        let want: Vec<u8> = (0x3ff0..0x4000)
            .chain(0x2000..0x2010)
            .chain(0x1000..0x1004)
            .map(|i| i as u8)
            .collect();
        assert_eq!(d.to_bytes().unwrap().as_bytes(), Some(&want[..]));
        for lends in [true, false] {
            let dst = mem(0x100, lends);
            let s = d.source().unwrap();
            s.check().unwrap();
            s.copy_to(3, &*dst, 0x10, 0x20).unwrap();
            let got = dst.0.lock().unwrap()[0x10..0x30].to_vec();
            assert_eq!(got, want[3..0x23], "lends: {lends}");
            assert!(s.copy_to(0x20, &*dst, 0, 5).is_err(), "past the end");
            assert!(
                matches!(s.copy_to(0, &*dst, 0xf0, 0x20), Err(CopyError::Dest(_))),
                "past the destination's end"
            );
        }
        // One memory, overlapping ranges: a memmove.
        let one = Data::guest(
            src.clone(),
            [Piece {
                region: Region::new(0, 12, vec![0]),
                addr: 0,
                len: 8,
            }],
        );
        one.source().unwrap().copy_to(0, &*src, 4, 8).unwrap();
        assert_eq!(
            src.0.lock().unwrap()[..12],
            [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]
        );

        r.retire();
        assert_eq!(d.source().err(), Some(Fault::Gone));
        assert_eq!(d.to_bytes().err(), Some(Fault::Gone));
        assert_eq!(
            Fault::Gone.requester_status(),
            CompStatus::LocalErrorInvalidLkey
        );
    }

    #[test]
    fn retiring_waits_for_the_copies_under_way() {
        let r = Region::new(0, 12, vec![0]);
        let d = Data::guest(
            mem(0x1000, true),
            [Piece {
                region: r.clone(),
                addr: 0,
                len: 1,
            }],
        );
        let s = d.source().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let r2 = r.clone();
        let t = std::thread::spawn(move || {
            r2.retire();
            tx.send(()).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "DEREG_MR waits for the copy");
        assert!(r.is_retired(), "and refuses new pins meanwhile");
        assert!(d.source().is_err());
        drop(s);
        rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_retire_racing_copies_returns_once_the_last_is_done_and_refuses_the_rest() {
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
        use std::time::Duration;
        for _ in 0..200 {
            let r = Region::new(0, 12, vec![0]);
            let d = Arc::new(Data::guest(
                mem(0x1000, true),
                [Piece {
                    region: r.clone(),
                    addr: 0,
                    len: 1,
                }],
            ));
            // Copies under way (counted while their pin is held), from
            // two threads as a sender's and a receiver's.
            let copying = Arc::new(AtomicU32::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (d, copying, stop) = (d.clone(), copying.clone(), stop.clone());
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            if let Ok(s) = d.source() {
                                copying.fetch_add(1, Ordering::SeqCst);
                                std::hint::spin_loop();
                                copying.fetch_sub(1, Ordering::SeqCst);
                                drop(s);
                            }
                        }
                    })
                })
                .collect();
            std::thread::yield_now();
            let (tx, rx) = std::sync::mpsc::channel();
            let r2 = r.clone();
            let t = std::thread::spawn(move || {
                r2.retire();
                tx.send(()).unwrap();
            });
            rx.recv_timeout(Duration::from_secs(5))
                .expect("the retire returns once the copies are done");
            assert_eq!(copying.load(Ordering::SeqCst), 0, "a copy outlived it");
            assert!(d.source().is_err(), "a pin after it");
            stop.store(true, Ordering::Relaxed);
            for th in threads {
                th.join().unwrap();
            }
            t.join().unwrap();
        }
    }

    /// Memory at address 0 with an unmapped page at `hole`, in host
    /// mappings that meet at `SPLIT` (mid-page: a page piece there
    /// crosses from one into the next) and around the hole: lends by
    /// piece (`lend`) and, if `all`, whole (`lend_all`), so that one
    /// copy goes the old way and the new over the same memory.
    struct Holey {
        bytes: Mutex<Vec<u8>>,
        hole: u64,
        all: bool,
        lent_all: std::sync::atomic::AtomicUsize,
    }

    const SPLIT: u64 = 0x2800;

    impl Holey {
        fn new(n: usize, hole: u64, all: bool, seed: u8) -> Arc<Self> {
            Arc::new(Self {
                bytes: Mutex::new((0..n).map(|i| (i as u8) ^ seed).collect()),
                hole,
                all,
                lent_all: Default::default(),
            })
        }

        fn maps(&self, n: usize) -> [(u64, u64); 3] {
            [
                (0, SPLIT),
                (SPLIT, self.hole),
                (self.hole + 0x1000, n as u64),
            ]
        }

        /// The mapping pieces of an access, as `DmaMemory::access_in`
        /// finds them: all of it mapped, or the access's error.
        fn pieces(&self, n: usize, addr: u64, len: usize) -> Result<Vec<(u64, usize)>, DmaError> {
            let err = DmaError { addr, len };
            let end = addr.checked_add(len as u64).ok_or(err)?;
            let mut out = Vec::new();
            let mut pos = addr;
            for (a, b) in self.maps(n) {
                if pos == end {
                    break;
                }
                if out.is_empty() {
                    if pos < a || pos >= b {
                        continue;
                    }
                } else if a != pos {
                    return Err(err);
                }
                let e = b.min(end);
                out.push((pos, (e - pos) as usize));
                pos = e;
            }
            if pos != end {
                return Err(err);
            }
            Ok(out)
        }
    }

    impl GuestMemory for Holey {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
            let m = self.bytes.lock().unwrap();
            let mut at = 0;
            for (a, n) in self.pieces(m.len(), addr, buf.len())? {
                buf[at..at + n].copy_from_slice(&m[a as usize..a as usize + n]);
                at += n;
            }
            Ok(())
        }
        fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
            let mut m = self.bytes.lock().unwrap();
            let mut at = 0;
            for (a, n) in self.pieces(m.len(), addr, data.len())? {
                m[a as usize..a as usize + n].copy_from_slice(&data[at..at + n]);
                at += n;
            }
            Ok(())
        }
        fn lend(
            &self,
            addr: u64,
            len: usize,
            _write: bool,
            f: &mut dyn FnMut(*mut u8, usize, usize),
        ) -> Result<bool, DmaError> {
            let Ok(mut m) = self.bytes.try_lock() else {
                return Ok(false);
            };
            let mut at = 0;
            for (a, n) in self.pieces(m.len(), addr, len)? {
                f(m[a as usize..].as_mut_ptr(), at, n);
                at += n;
            }
            Ok(true)
        }
        fn lend_all(&self, f: &mut dyn FnMut(&Lent<'_>)) -> bool {
            if !self.all {
                return false;
            }
            let Ok(mut m) = self.bytes.try_lock() else {
                return false;
            };
            self.lent_all
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let n = m.len();
            let base = m.as_mut_ptr();
            let ranges = self.maps(n).map(|(a, b)| HostRange {
                iova: a,
                len: b - a,
                // SAFETY: `a < b <= n`, inside the buffer.
                host: unsafe { base.add(a as usize) },
                writable: true,
            });
            // SAFETY: the ranges are inside the buffer, sorted and apart,
            // and the guard `m` keeps it (unmoved: nothing resizes it)
            // and ours alone until after `f` returns.
            let lent = unsafe { Lent::new(&ranges) };
            f(&lent);
            drop(m);
            true
        }
    }

    #[test]
    fn a_copy_over_lent_memory_does_what_a_copy_page_by_page_does_even_where_it_fails() {
        use std::sync::atomic::Ordering;
        const N: usize = 0x8000;
        // Source pages at 0x1000 (then 0x2000, crossing SPLIT), 0x3000,
        // 0x6000 (the hole in the source) and 0x4000; destination pages
        // scattered likewise, 0x5000 its hole.
        let src_region = Region::new(0x10000, 12, vec![0x1000, 0x2000, 0x3000, 0x6000]);
        let src_short = Region::new(0x30000, 12, vec![0x4000]);
        let dst_region = Region::new(0x20000, 12, vec![0x7000, 0x2000, 0x0, 0x5000, 0x3000]);
        let piece = |region: &Arc<Region>, addr, len| Piece {
            region: region.clone(),
            addr,
            len,
        };
        // (what, source pieces, offset, destination address, length)
        type Case = (&'static str, Vec<Piece>, usize, u64, usize);
        let cases: Vec<Case> = vec![
            (
                "across pages, pieces and SPLIT, unaligned",
                vec![
                    piece(&src_region, 0x10010, 0x2ff0),
                    piece(&src_short, 0x30100, 0x800),
                ],
                0x7,
                0x20123,
                0x2400,
            ),
            (
                "the destination's hole mid-run",
                vec![piece(&src_region, 0x10000, 0x3000)],
                0,
                0x20800,
                0x2c00,
            ),
            (
                "the source past its end",
                vec![piece(&src_region, 0x10000, 0x1800)],
                0x100,
                0x20000,
                0x2000,
            ),
            (
                "the source's hole mid-run",
                vec![piece(&src_region, 0x12000, 0x2000)],
                0,
                0x20000,
                0x2000,
            ),
            (
                "a source region without the page",
                vec![piece(&src_short, 0x30800, 0x1000)],
                0,
                0x20000,
                0x1000,
            ),
            (
                "a destination region without the page",
                vec![piece(&src_region, 0x10000, 0x3000)],
                0,
                0x24800,
                0x1000,
            ),
        ];
        for (what, pieces, off, addr, len) in cases {
            let run = |all: bool| {
                let src = Holey::new(N, 0x6000, all, 0);
                let dst = Holey::new(N, 0x5000, all, 0x5a);
                let d = Data::guest(src.clone(), pieces.clone());
                let s = d.source().unwrap();
                let r = s.copy_to_pages(off, &*dst, &dst_region, addr, len);
                let lent =
                    src.lent_all.load(Ordering::Relaxed) + dst.lent_all.load(Ordering::Relaxed);
                let check = s.check();
                let bytes = dst.bytes.lock().unwrap().clone();
                (r, check, bytes, lent)
            };
            let (old, old_check, old_bytes, none) = run(false);
            let (new, new_check, new_bytes, lent) = run(true);
            assert_eq!(none, 0, "{what}");
            assert_eq!(lent, 2, "{what}: went the new way");
            assert_eq!(new, old, "{what}");
            assert_eq!(new_check, old_check, "{what}: check");
            assert!(new_bytes == old_bytes, "{what}: the same bytes written");
            eprintln!("{what}: {old:?}, check {old_check:?}");
        }
    }

    /// A peer's memory of `n` bytes, byte `i` being `i * 7 + 3`, mapped as
    /// a receiver maps an offer; its pin table with slot 0 armed.
    fn peer_memory(n: usize) -> (Arc<share::Mapped>, Arc<share::PinTable>, u32) {
        let mem = crate::shmem::SharedMem::new("peer", n).expect("a sealed memfd");
        let bytes: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
        mem.write(0, &bytes).expect("inside it");
        let fd = mem.fd().try_clone_to_owned().expect("a descriptor");
        // SAFETY: getpid and getuid have no preconditions.
        let me = unsafe { (libc::getpid(), libc::getuid()) };
        let m = share::accept(&fd, 0, n as u64, me).expect("our own offer");
        let pins = share::PinTable::new().expect("a pin table");
        let gen = pins.arm(0);
        (Arc::new(m), Arc::new(pins), gen)
    }

    #[test]
    fn a_copy_from_a_peer_over_lent_memory_does_what_a_copy_page_by_page_does_even_where_it_fails()
    {
        use std::sync::atomic::Ordering;
        const N: usize = 0x8000;
        let (mapped, pins, gen) = peer_memory(0x4000);
        let desc = |offset, len| share::Desc {
            region: 0,
            offset,
            len,
            slot: 0,
            gen,
        };
        // The destination's pages as in the test above: 0x5000 its hole,
        // 0x2000 crossing SPLIT.
        let dst_region = Region::new(0x20000, 12, vec![0x7000, 0x2000, 0x0, 0x5000, 0x3000]);
        // (what, descriptors, offset, destination address, length)
        type Case = (&'static str, Vec<share::Desc>, usize, u64, usize);
        let cases: Vec<Case> = vec![
            (
                "across pages, descriptors and SPLIT, unaligned",
                vec![desc(0x10, 0x1ff0), desc(0x3000, 0x800), desc(0x2100, 0x400)],
                0x7,
                0x20123,
                0x2400,
            ),
            (
                "the destination's hole mid-run",
                vec![desc(0, 0x3000)],
                0,
                0x20800,
                0x2c00,
            ),
            (
                "the descriptors end mid-page",
                vec![desc(0, 0x1800)],
                0x100,
                0x20000,
                0x2000,
            ),
            (
                "the descriptors end where a page begins",
                vec![desc(0, 0x1000)],
                0,
                0x20000,
                0x2000,
            ),
            (
                "the descriptors end where the destination has no page",
                vec![desc(0, 0x1000)],
                0,
                0x24000,
                0x2000,
            ),
            (
                "a destination region without the page",
                vec![desc(0, 0x3000)],
                0,
                0x24800,
                0x1000,
            ),
        ];
        for (what, descs, off, addr, len) in cases {
            let run = |all: bool| {
                let dst = Holey::new(N, 0x5000, all, 0x5a);
                let d = Data::remote(share::Remote {
                    pins: pins.clone(),
                    descs: descs.iter().map(|d| (mapped.clone(), *d)).collect(),
                });
                let s = d.source().unwrap();
                let r = s.copy_to_pages(off, &*dst, &dst_region, addr, len);
                let lent = dst.lent_all.load(Ordering::Relaxed);
                let bytes = dst.bytes.lock().unwrap().clone();
                (r, bytes, lent)
            };
            let (old, old_bytes, none) = run(false);
            let (new, new_bytes, lent) = run(true);
            assert_eq!(none, 0, "{what}");
            assert_eq!(lent, 1, "{what}: went the new way");
            assert_eq!(new, old, "{what}");
            assert!(new_bytes == old_bytes, "{what}: the same bytes written");
            eprintln!("{what}: {old:?}");
        }
    }

    #[test]
    fn bytes_compare_by_content_and_references_by_identity() {
        assert_eq!(Data::from(vec![1, 2]), Data::from(&[1u8, 2][..]));
        assert_eq!(Data::default(), Data::from(Vec::new()));
        let g = Data::guest(
            mem(16, true),
            [Piece {
                region: Region::new(0, 12, vec![0]),
                addr: 0,
                len: 2,
            }],
        );
        assert_eq!(g, g.clone());
        assert_ne!(g, g.to_bytes().unwrap(), "a reference is not its bytes");
        assert_eq!(g.to_bytes().unwrap(), Data::from(vec![0, 1]));
    }

    #[test]
    fn a_region_lets_go_of_peers_that_are_gone_when_described_to_another() {
        let region = Region::new(0x5000, 12, vec![0]);
        let _pin = region.pin().unwrap();
        let old = Arc::new(PeerTx::new());
        // No pin table before an offer went out: no slot.
        assert!(region.slot_for(&old).is_none());
        assert!(region.lock().shared.is_empty());
        old.pins_for_offer().unwrap();
        region.slot_for(&old).unwrap();
        assert_eq!(Arc::strong_count(&old), 2, "the region holds it");
        // The process at the GID exits, a new one takes its place.
        old.forget();
        let new = Arc::new(PeerTx::new());
        new.pins_for_offer().unwrap();
        region.slot_for(&new).unwrap();
        assert_eq!(Arc::strong_count(&old), 1, "let go");
        assert_eq!(region.lock().shared.len(), 1);
    }

    #[test]
    fn references_stay_references_in_one_process_and_go_as_bytes_between_two() {
        use super::super::{Body, Capture, Fabric, NetFaults, Packet, Port, Remote};
        use crate::health::Health;
        use std::time::{Duration, Instant};
        let dir = std::env::temp_dir().join(format!("efa-payload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pcap = dir.join("local.pcap");
        let cap = Arc::new(Capture::create(&pcap).unwrap());
        let sockets = dir.join("sockets");
        let one = Fabric::new(Remote::Unix(sockets.clone()), Health::new(), Some(cap)).unwrap();
        let two = Fabric::with_dir(&sockets, Health::new()).unwrap();
        let port = |f: &Fabric, n: u8, faults| {
            let p = Port::new([n; 16], faults, Health::new());
            f.attach(&p).unwrap();
            p
        };
        let sender = port(&one, 1, NetFaults::default());
        // Every packet twice: a duplicate shares the reference.
        let dup = NetFaults {
            dup_ppm: 1_000_000,
            ..Default::default()
        };
        let local = port(&one, 2, dup);
        let remote = port(&two, 3, NetFaults::default());
        let src = mem(0x1000, true);
        src.0.lock().unwrap()[0x100..0x140].fill(0xc3);
        let region = Region::new(0x5000, 12, vec![0]);
        let data = Data::guest(
            src.clone(),
            [Piece {
                region: region.clone(),
                addr: 0x5100,
                len: 0x40,
            }],
        );
        let send = |to: u8| Packet {
            src_gid: [1; 16],
            dst_gid: [to; 16],
            src_qpn: 3,
            dst_qpn: 4,
            body: Body::Send {
                seq: 0x700,
                qkey: 1,
                imm: None,
                data: data.clone(),
            },
        };
        let take = |p: &Port| {
            let t = Instant::now();
            loop {
                let (got, _) = p.take_due(Instant::now(), usize::MAX);
                if !got.is_empty() {
                    return got;
                }
                assert!(t.elapsed() < Duration::from_secs(5), "nothing arrived");
                p.wait(Some(Duration::from_millis(5)));
            }
        };
        assert!(one.send(send(2)));
        let got = take(&local);
        assert_eq!(got.len(), 2, "and its duplicate");
        for p in &got {
            assert_eq!(p, &send(2), "the same reference, not a copy");
        }
        // The capture has the bytes, read for it.
        let file = std::fs::read(&pcap).unwrap();
        assert!(file.windows(0x40).any(|w| w == [0xc3; 0x40]), "captured");
        // Another process gets the bytes.
        assert!(one.send(send(3)));
        let got = take(&remote);
        let Body::Send { data: d, .. } = &got[0].body else {
            panic!("{got:?}")
        };
        assert_eq!(d.as_bytes(), Some(&[0xc3; 0x40][..]));
        // Deregistered meanwhile: refused to its sender, as a receiver in
        // this process would.
        region.retire();
        assert!(one.send(send(3)));
        let got = take(&sender);
        let want = Packet {
            src_gid: [3; 16],
            dst_gid: [1; 16],
            src_qpn: 4,
            dst_qpn: 3,
            body: Body::Resp {
                seq: 0x700,
                status: CompStatus::LocalErrorInvalidLkey.raw(),
                data: Data::default(),
            },
        };
        assert_eq!(got, vec![want]);
        drop((sender, local, remote, one, two));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
