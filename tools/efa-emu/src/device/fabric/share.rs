//! Guest memory shared between efa-emu processes of one user on one host,
//! so that a receiver in another process copies a payload once, straight
//! from the sender's guest memory, as a receiver in the sender's process
//! does ([`super::payload`]).
//!
//! # Offers
//!
//! A process offers a peer the memfd behind a region of its guest RAM
//! (QEMU's `memory-backend-memfd`, handed over with DMA_MAP) with
//! `SCM_RIGHTS`. The receiver accepts it ([`accept`]) only
//!
//! - from a sender of its own uid (the socket's `SCM_CREDENTIALS`; a
//!   same-uid process could read our memory through `/proc` anyway),
//!   whose pid it knows (to tell when the peer is gone, [`PinTable`]);
//! - if the memfd is sealed `F_SEAL_SHRINK` (`F_GET_SEALS`): otherwise the
//!   sender could truncate it under our mapping and every read of the
//!   missing pages would be a SIGBUS here. QEMU seals its RAM memfds so,
//!   and efa-emu adds the seal to every DMA region it is given when the
//!   memfd allows sealing ([`crate::vfio`]'s DMA map), so what it offers
//!   is sealed whenever it can be; the test harness's guest RAM is a
//!   sealed [`crate::shmem::SharedMem`];
//! - if its length (`fstat`) covers the offered range;
//! - within what the fabric maps of that process and of all its peers
//!   ([`Ledger`]: bytes, regions and GIDs, so that offers of sparse
//!   memfds cannot fill our address space);
//!
//! and maps it `PROT_READ` only: a peer's bug cannot write our process's
//! view of its memory, nor we its guest's. Anything else is refused and
//! counted (`fabric_rejected`), and the sender, told nothing back, keeps
//! sending that peer bytes, and offers it again after a growing wait
//! ([`PeerTx::due_offers`]). Offers and acceptances count only from the
//! socket bound at the GID they name (the Unix transport checks the
//! datagram's source address).
//!
//! # Pins
//!
//! The sender's DEREG_MR (or reset) must not return while a receiver in
//! another process still copies from the MR's memory: in one process the
//! region's retire-and-wait ([`super::Region::retire`]) covers it. Across
//! processes the pin counts live in a [`PinTable`]: a small memfd, sealed
//! against any resize, that the sender creates for one peer and sends
//! along with its offer, which both map read-write. Each slot is one
//! 64-bit word: a generation (upper 32 bits), a retired bit and a count of
//! pins (the receiver's copies under way). See [`PinTable`] for the
//! protocol and its memory ordering. After the slots the same memfd holds
//! the ring that packets to that peer take once it has accepted an offer
//! ([`super::ring`]), so that a packet costs neither side a system call.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::ring::{Ring, RING_BYTES};
use crate::device::Map;
use crate::shmem::SharedMem;

/// Why an offer was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// Its sender is another user, or unknown.
    #[error("from uid {uid} (pid {pid}), not uid {me} or an unknown pid")]
    Stranger {
        /// The sender's uid.
        uid: libc::uid_t,
        /// The sender's pid (0: in another pid namespace).
        pid: libc::pid_t,
        /// Ours.
        me: libc::uid_t,
    },
    /// The memfd may shrink under our mapping.
    #[error("the memfd is not sealed against shrinking (seals {0:#x})")]
    NotSealed(i32),
    /// The memfd is shorter than the range offered.
    #[error("the memfd has {len} bytes, the offer needs {need}")]
    TooShort {
        /// Its size.
        len: u64,
        /// The offer's end.
        need: u64,
    },
    /// The memfd's pages are huge pages: a hole its owner punches
    /// (`fallocate`, which `F_SEAL_SHRINK` allows) is refilled on our read
    /// from the huge page pool, and an empty pool answers with SIGBUS, where
    /// a shmem hole reads as zeros.
    #[error("the memfd is on hugetlbfs: a punched hole could fault our reads")]
    HugeTlb,
    /// Mapping it would pass a limit on what a receiver maps of its peers'
    /// memory ([`Ledger`]).
    #[error("{0}")]
    OverLimit(String),
    /// fstat or mmap failed.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// The seals of `fd` (`F_GET_SEALS`), 0 for a file that has none.
fn seals(fd: BorrowedFd<'_>) -> i32 {
    // SAFETY: F_GET_SEALS on a descriptor the caller holds; no pointers.
    let s = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    s.max(0)
}

/// Whether `fd` is a file of shmem or hugetlbfs (a memfd, say), the only
/// kinds that have seals: closing one waits for nobody, where closing a
/// FUSE file waits for its daemon to answer FLUSH, and a socket with
/// `SO_LINGER` for its data to leave. `F_GET_SEALS` asks the file's
/// filesystem nothing (`fstat` or `fstatfs` of a FUSE file would ask its
/// daemon).
pub fn is_memory(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: F_GET_SEALS on a descriptor the caller holds; no pointers.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) >= 0 }
}

/// The size of `fd` (`fstat`).
fn size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: stat is plain data; zeroed is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a held descriptor into a live stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_size.max(0) as u64)
}

/// Whether `fd` is a file of hugetlbfs (`fstatfs`).
fn on_hugetlbfs(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: statfs is plain data; zeroed is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs on a held descriptor into a live statfs buffer.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type == libc::HUGETLBFS_MAGIC)
}

/// `len` bytes of a peer's memfd from `offset`, mapped here (`MAP_SHARED`).
pub struct Mapped {
    base: NonNull<u8>,
    len: usize,
    /// What it counts against its sender's share ([`Ledger`]), given back
    /// once it is unmapped.
    charge: Option<Charge>,
}

// SAFETY: the mapping is owned by this value and unmapped only by `drop`;
// it is only ever accessed through raw copies and atomics (the other
// process writes it meanwhile, so no Rust reference to it is made).
unsafe impl Send for Mapped {}
// SAFETY: as for `Send`: every method takes `&self` and reads the fields.
unsafe impl Sync for Mapped {}

impl std::fmt::Debug for Mapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapped").field("len", &self.len).finish()
    }
}

impl Mapped {
    /// Maps `[offset, offset + len)` of `fd` (`offset` page-aligned).
    fn new(fd: BorrowedFd<'_>, offset: u64, len: u64, prot: libc::c_int) -> io::Result<Self> {
        let bad = || io::Error::from_raw_os_error(libc::EINVAL);
        let n = usize::try_from(len)
            .ok()
            .filter(|&n| n > 0 && n <= isize::MAX as usize)
            .ok_or_else(bad)?;
        let off = libc::off_t::try_from(offset).map_err(|_| bad())?;
        // SAFETY: a new shared mapping placed by the kernel (no MAP_FIXED)
        // of a descriptor the caller holds; nothing refers to it yet.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let Some(base) = NonNull::new(p.cast::<u8>()) else {
            // SAFETY: unmapping what mmap just returned, unused so far.
            unsafe { libc::munmap(p, n) };
            return Err(io::Error::other("mmap returned a null mapping"));
        };
        Ok(Self {
            base,
            len: n,
            charge: None,
        })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes at `offset`, if they are all inside the mapping:
    /// every descriptor a peer sends is checked here before anything is
    /// read through it. Only ever to be copied from, never referenced.
    pub fn range(&self, offset: u64, len: usize) -> Option<*const u8> {
        let end = offset.checked_add(len as u64)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: `offset <= end <= self.len`: inside (or one past the end
        // of) the mapping.
        Some(unsafe { self.base.as_ptr().add(offset as usize) }.cast_const())
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are what mmap returned and was asked for, and
        // `&mut self` proves no copy through it is under way.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The checks of the module documentation on a peer's offer of `len`
/// bytes of the memfd `fd` from `offset`.
fn check(
    fd: &OwnedFd,
    offset: u64,
    len: u64,
    sender: (libc::pid_t, libc::uid_t),
) -> Result<(), Refusal> {
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    let (pid, uid) = sender;
    if uid != me || pid <= 0 {
        return Err(Refusal::Stranger { uid, pid, me });
    }
    let s = seals(fd.as_fd());
    if s & libc::F_SEAL_SHRINK == 0 {
        return Err(Refusal::NotSealed(s));
    }
    if on_hugetlbfs(fd.as_fd())? {
        return Err(Refusal::HugeTlb);
    }
    let have = size(fd.as_fd())?;
    let need = offset.checked_add(len).ok_or(Refusal::TooShort {
        len: have,
        need: u64::MAX,
    })?;
    if need > have || len == 0 {
        return Err(Refusal::TooShort { len: have, need });
    }
    Ok(())
}

/// Accepts a peer's offer of `len` bytes of the memfd `fd` from `offset`:
/// the checks of the module documentation, then a read-only mapping, not
/// counted against any limit (a fabric maps with [`accept_charged`]).
pub fn accept(
    fd: &OwnedFd,
    offset: u64,
    len: u64,
    sender: (libc::pid_t, libc::uid_t),
) -> Result<Mapped, Refusal> {
    check(fd, offset, len, sender)?;
    Ok(Mapped::new(fd.as_fd(), offset, len, libc::PROT_READ)?)
}

/// [`accept`], the mapping counted against its sender's share in
/// `ledger` (refused beyond it, before anything is mapped) until it is
/// unmapped.
pub fn accept_charged(
    fd: &OwnedFd,
    offset: u64,
    len: u64,
    sender: (libc::pid_t, libc::uid_t),
    ledger: &Arc<Ledger>,
) -> Result<Mapped, Refusal> {
    check(fd, offset, len, sender)?;
    let charge = ledger.charge_region(sender.0, len)?;
    let mut m = Mapped::new(fd.as_fd(), offset, len, libc::PROT_READ)?;
    m.charge = Some(charge);
    Ok(m)
}

/// Bytes of its peers' memory a fabric maps from one sending process at
/// most. A peer offers its guest's RAM: 1 TiB is the most RAM a guest
/// with QEMU's default 40 physical address bits can have, and what a
/// bigger guest offers past it goes as bytes. The limit is what keeps a
/// same-uid process from offering a sparse memfd of terabytes until our
/// address space (128 TiB on x86-64 and arm64 with 4-level tables) is
/// full, which would fail every later mapping of ours, guest RAM
/// included.
pub const MAX_MAPPED_PER_PID: u64 = 1 << 40;

/// Bytes of its peers' memory a fabric maps at most, from all of them:
/// sixteen peers of the largest guest, an eighth of the address space;
/// what a peer pid could not take alone, many of them (a process is cheap
/// to start) cannot take together either.
pub const MAX_MAPPED: u64 = 16 << 40;

/// Regions a fabric maps at most from one sending process, over all its
/// GIDs (QEMU has a handful of RAM regions, offered once for each pair of
/// ports).
pub const MAX_REGIONS_PER_PID: usize = 64;

/// (sender GID, our port) pairs a fabric keeps offers of one sending
/// process for at most: each holds a pin table mapping and a pidfd. An
/// efa-emu process has one port; a test process a few.
pub const MAX_PEERS_PER_PID: usize = 16;

/// What a fabric maps of its peers' memory, by sending process: the
/// limits above are checked here, before anything is mapped.
#[derive(Debug, Default)]
pub struct Ledger {
    state: Mutex<LedgerState>,
}

#[derive(Debug, Default)]
struct LedgerState {
    bytes: u64,
    pids: HashMap<libc::pid_t, PidUse>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct PidUse {
    bytes: u64,
    regions: usize,
    peers: usize,
}

/// A share of a [`Ledger`] held: given back when dropped.
#[derive(Debug)]
pub struct Charge {
    ledger: Arc<Ledger>,
    pid: libc::pid_t,
    taken: PidUse,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut s = self.ledger.lock();
        s.bytes -= self.taken.bytes;
        if let Some(u) = s.pids.get_mut(&self.pid) {
            u.bytes -= self.taken.bytes;
            u.regions -= self.taken.regions;
            u.peers -= self.taken.peers;
            if *u == PidUse::default() {
                s.pids.remove(&self.pid);
            }
        }
    }
}

impl Ledger {
    /// Nothing mapped yet.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn charge(self: &Arc<Self>, pid: libc::pid_t, take: PidUse) -> Result<Charge, Refusal> {
        let mut s = self.lock();
        let total = s.bytes;
        let u = s.pids.get(&pid).copied().unwrap_or_default();
        let over = |what: String, max: u64| {
            Err(Refusal::OverLimit(format!(
                "pid {pid} would have {what} mapped here, more than {max}"
            )))
        };
        // Saturating: `take.bytes` is a length a peer sent (checked
        // against its memfd's size first, but no sum may wrap anyway).
        let bytes = u.bytes.saturating_add(take.bytes);
        if bytes > MAX_MAPPED_PER_PID {
            return over(format!("{bytes} bytes"), MAX_MAPPED_PER_PID);
        }
        let all = total.saturating_add(take.bytes);
        if all > MAX_MAPPED {
            return Err(Refusal::OverLimit(format!(
                "{all} bytes of peers' memory would be mapped here, more than {MAX_MAPPED}"
            )));
        }
        if u.regions + take.regions > MAX_REGIONS_PER_PID {
            let n = u.regions + take.regions;
            return over(format!("{n} regions"), MAX_REGIONS_PER_PID as u64);
        }
        if u.peers + take.peers > MAX_PEERS_PER_PID {
            let n = u.peers + take.peers;
            return over(format!("{n} GIDs' offers"), MAX_PEERS_PER_PID as u64);
        }
        s.bytes += take.bytes;
        let e = s.pids.entry(pid).or_default();
        e.bytes += take.bytes;
        e.regions += take.regions;
        e.peers += take.peers;
        Ok(Charge {
            ledger: self.clone(),
            pid,
            taken: take,
        })
    }

    /// A region of `bytes` mapped from `pid`.
    pub fn charge_region(
        self: &Arc<Self>,
        pid: libc::pid_t,
        bytes: u64,
    ) -> Result<Charge, Refusal> {
        self.charge(
            pid,
            PidUse {
                bytes,
                regions: 1,
                peers: 0,
            },
        )
    }

    /// The offers of one more GID of `pid` to one of our ports.
    pub fn charge_peer(self: &Arc<Self>, pid: libc::pid_t) -> Result<Charge, Refusal> {
        self.charge(
            pid,
            PidUse {
                bytes: 0,
                regions: 0,
                peers: 1,
            },
        )
    }

    /// Bytes of peers' memory mapped now.
    pub fn mapped(&self) -> u64 {
        self.lock().bytes
    }
}

/// Slots of a pin table: MRs of one device referred to by a peer at once
/// (a slot is taken by an MR the first time a packet to that peer refers
/// to it, and freed by its DEREG_MR).
pub const PIN_SLOTS: usize = 4096;

/// Where in a table's memfd the ring of packets from the table's sender
/// to its receiver starts ([`super::ring`]): after the pin slots.
pub const RING_AT: usize = PIN_SLOTS * 8;
/// Bytes of a table's memfd.
pub const TABLE_BYTES: usize = RING_AT + RING_BYTES;

const RETIRED: u64 = 1 << 31;
const PINS: u64 = RETIRED - 1;

/// Per-peer pin counts in shared memory: one 64-bit word per slot,
/// `generation << 32 | retired << 31 | pins`.
///
/// The sender *arms* a slot for an MR (a new generation, not retired, no
/// pins) before any packet names it, and puts slot and generation in the
/// descriptors. The receiver *pins* before it reads the sender's memory: a
/// compare-and-swap that adds one pin only if the word still has the
/// descriptor's generation and is not retired; it unpins (subtracts one)
/// when its copy is done. DEREG_MR on the sender *retires*: sets the
/// retired bit, then waits until the pins are 0.
///
/// Ordering: every change is a read-modify-write of the one word, so all
/// of them fall in that word's single modification order, and no fence or
/// `SeqCst` is needed. Either the receiver's pin comes first in it, and the
/// retire's `fetch_or` sees the pin and waits; or the retire comes first,
/// and the pin's compare-and-swap sees the retired bit and fails, and the
/// receiver reads nothing. The pin is `Acquire` so that the receiver's reads
/// of the memory cannot move before it; the unpin is `Release`, and the
/// sender's loads while waiting are `Acquire`, so that every read of the
/// receiver's copy happens before the sender sees the count reach 0 and
/// lets DEREG_MR return (and the guest reuse the pages). Atomics are
/// address-free, so two processes' mappings of one page work as one.
///
/// A peer can only hurt itself or our DEREG_MR through this: a peer that
/// never unpins holds DEREG_MR while it lives (as a stopped process does;
/// logged each second), and for at most [`GONE_GRACE`] once it has exited.
pub struct PinTable {
    mem: SharedMem,
}

impl std::fmt::Debug for PinTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinTable").finish_non_exhaustive()
    }
}

/// How long a retire waits for the pins of a peer that has exited: its
/// mapping is gone with it, so no copy can be under way, but a copy of a
/// peer killed mid-way left its pin.
pub const GONE_GRACE: Duration = Duration::from_secs(1);

/// How a retire ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retired {
    /// The pins were released.
    Clear,
    /// The peer was gone and its pins were left.
    PeerGone,
}

/// What the receiver holds while it copies ([`PinTable::pin`]).
pub struct PinGuard<'a> {
    table: &'a PinTable,
    slot: usize,
}

impl Drop for PinGuard<'_> {
    fn drop(&mut self) {
        if let Some(w) = self.table.word(self.slot) {
            // Release: the copy's reads happen before the sender sees the
            // count drop (see the type's documentation).
            w.fetch_sub(1, Ordering::Release);
        }
    }
}

impl PinTable {
    /// A new table (the sender's, for one peer).
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            mem: SharedMem::new("efa-emu-pins", TABLE_BYTES)?,
        })
    }

    /// The receiver's view of a peer's table: refused unless it is sealed
    /// against shrinking and exactly a table's size.
    pub fn open(fd: OwnedFd) -> Result<Self, Refusal> {
        let s = seals(fd.as_fd());
        if s & libc::F_SEAL_SHRINK == 0 {
            return Err(Refusal::NotSealed(s));
        }
        let have = size(fd.as_fd())?;
        if have != TABLE_BYTES as u64 {
            return Err(Refusal::TooShort {
                len: have,
                need: TABLE_BYTES as u64,
            });
        }
        Ok(Self {
            mem: SharedMem::map(fd, TABLE_BYTES)?,
        })
    }

    /// The ring of packets from the table's sender to its receiver, after
    /// the pin slots.
    pub fn ring(&self) -> Ring<'_> {
        Ring::new(&self.mem, RING_AT)
    }

    /// The memfd, to send along with an offer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.mem.fd()
    }

    fn word(&self, slot: usize) -> Option<&AtomicU64> {
        if slot >= PIN_SLOTS {
            return None;
        }
        let p = self.mem.ptr(slot * 8, 8).ok()?;
        // SAFETY: `p` is 8-aligned (the mapping is page-aligned, the offset a
        // multiple of 8) and inside the mapping, which lives as long as
        // `&self`; the word is only ever accessed atomically, here and in
        // the peer (address-free atomics).
        Some(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// Sender: slot `slot` now belongs to an MR; returns its generation,
    /// for the descriptors. The slot must be free (retired, no pins).
    pub fn arm(&self, slot: usize) -> u32 {
        let w = self.word(slot).expect("a slot of the table");
        let old = w.load(Ordering::Acquire);
        let gen = ((old >> 32) as u32).wrapping_add(1);
        // Release: nothing of ours to publish, but a pin that sees the new
        // generation sees the slot as it is now.
        w.store(u64::from(gen) << 32, Ordering::Release);
        gen
    }

    /// Receiver: pins slot `slot` of generation `gen` for a copy; `None`
    /// if the MR was deregistered (or the slot is not one).
    pub fn pin(&self, slot: usize, gen: u32) -> Option<PinGuard<'_>> {
        let w = self.word(slot)?;
        let mut cur = w.load(Ordering::Relaxed);
        loop {
            if (cur >> 32) as u32 != gen || cur & RETIRED != 0 || cur & PINS == PINS {
                return None;
            }
            // Acquire on success: the reads of the copy stay after the pin.
            match w.compare_exchange_weak(cur, cur + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Some(PinGuard { table: self, slot }),
                Err(now) => cur = now,
            }
        }
    }

    /// Sender: DEREG_MR of the MR in `slot`: no pin is given from now on,
    /// and this returns once the peer's pins are released, or
    /// [`GONE_GRACE`] after `peer_alive` says the peer has gone. A live
    /// peer that holds a pin (stopped, say) holds this, logged each second.
    pub fn retire(&self, slot: usize, peer_alive: impl Fn() -> bool) -> Retired {
        let Some(w) = self.word(slot) else {
            return Retired::Clear;
        };
        // Acquire: a copy that ended before we set the bit is ordered
        // before our return.
        let mut cur = w.fetch_or(RETIRED, Ordering::Acquire);
        let start = Instant::now();
        let mut gone_at: Option<Instant> = None;
        let mut logged = 0;
        let mut nap = Duration::from_micros(20);
        while cur & PINS != 0 {
            if gone_at.is_none() && !peer_alive() {
                gone_at = Some(Instant::now());
            }
            if gone_at.is_some_and(|t| t.elapsed() >= GONE_GRACE) {
                log::warn!(
                    "fabric: a peer that exited left {} pin(s) on a deregistered MR",
                    cur & PINS
                );
                return Retired::PeerGone;
            }
            let secs = start.elapsed().as_secs();
            if secs > logged {
                logged = secs;
                log::warn!(
                    "fabric: DEREG_MR waits {secs} s for a peer process still copying \
                     from the MR (stopped?)"
                );
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(5));
            cur = w.load(Ordering::Acquire);
        }
        Retired::Clear
    }
}

/// Most descriptors a packet has (a 64 KiB segment of 4 KiB pages, not
/// contiguous in the memfd, has 17).
pub const MAX_DESCS: usize = 64;

/// Bytes of one descriptor on the wire.
pub const DESC_BYTES: usize = 22;

/// A piece of a payload in memory offered by the packet's sender: `len`
/// bytes at `offset` of its offered region `region`, of the MR whose pins
/// are in slot `slot`, generation `gen`, of the sender's [`PinTable`] for
/// the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    /// The offer's id.
    pub region: u32,
    /// Offset in the offered memfd.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
    /// Pin table slot of the MR.
    pub slot: u16,
    /// Its generation.
    pub gen: u32,
}

impl Desc {
    /// Its wire form: the fields in order, little-endian.
    pub fn to_wire(&self) -> [u8; DESC_BYTES] {
        let mut b = [0; DESC_BYTES];
        b[0..4].copy_from_slice(&self.region.to_le_bytes());
        b[4..12].copy_from_slice(&self.offset.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..18].copy_from_slice(&self.slot.to_le_bytes());
        b[18..22].copy_from_slice(&self.gen.to_le_bytes());
        b
    }

    /// Parses [`Desc::to_wire`]'s form: one fixed-size read, where a
    /// field at a time checked the length five times per descriptor, and a
    /// 64 KiB segment of scattered pages has 16 of them.
    pub fn from_wire(b: &[u8; DESC_BYTES]) -> Self {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Self {
            region: u32_at(0),
            offset: u64::from_le_bytes(b[4..12].try_into().expect("8 bytes")),
            len: u32_at(12),
            slot: u16::from_le_bytes([b[16], b[17]]),
            gen: u32_at(18),
        }
    }
}

/// Most regions one peer may offer (QEMU has a handful of RAM regions).
pub const MAX_OFFERS: usize = 64;

/// What a receiver has of one sending peer (process and GID): the regions
/// it offered, mapped, and its pin table.
#[derive(Debug)]
pub struct PeerRx {
    /// The peer's pin table for us.
    pub pins: Arc<PinTable>,
    /// Its regions, by offer id: added to by the port's receive thread
    /// as offers come, read by whichever thread decodes a packet (the
    /// receive thread for a datagram, the data-path thread for an entry
    /// of the peer's ring).
    pub regions: Mutex<Map<u32, Arc<Mapped>>>,
    /// The sender's process: once it has exited, what it offered is let
    /// go (a mapping keeps its guest RAM allocated).
    pub sender: OwnedFd,
    /// Its place among its process's peers in the fabric's [`Ledger`].
    pub charge: Charge,
}

impl PeerRx {
    /// Whether the process that offered this still runs.
    pub fn sender_alive(&self) -> bool {
        alive(self.sender.as_fd())
    }
}

/// The descriptors of a packet that fit in a [`Remote`] without an
/// allocation: one per piece of a send of two SGEs, each contiguous in its
/// memfd (a packet's payload is resolved once per packet received).
pub const INLINE_DESCS: usize = 2;

/// A payload in a peer's memory, as a receiver decoded it: every
/// descriptor checked to lie inside its mapping.
#[derive(Debug, Clone)]
pub struct Remote {
    /// The peer's pin table.
    pub pins: Arc<PinTable>,
    /// The descriptors and their mappings; the decoder checked that their
    /// lengths add up to the packet's.
    pub descs: SmallVec<[(Arc<Mapped>, Desc); INLINE_DESCS]>,
}

impl Remote {
    /// Bytes in all.
    pub fn byte_len(&self) -> usize {
        self.descs.iter().map(|(_, d)| d.len as usize).sum()
    }

    /// Whether `other` is the same memory: the same pin table, mappings
    /// and ranges.
    pub fn same(&self, other: &Remote) -> bool {
        Arc::ptr_eq(&self.pins, &other.pins)
            && self.descs.len() == other.descs.len()
            && self
                .descs
                .iter()
                .zip(&other.descs)
                .all(|((m, d), (n, e))| Arc::ptr_eq(m, n) && d == e)
    }
}

impl PeerRx {
    /// The payload of `descs`, if every descriptor names a region offered
    /// and lies inside it, and they name at most `max_slots` MRs; `None`
    /// drops the packet.
    pub fn resolve(&self, descs: &[Desc], max_slots: usize) -> Option<Remote> {
        let mut v = SmallVec::with_capacity(descs.len());
        // On the stack: a packet has at most MAX_DESCS descriptors, and
        // this runs for every packet received.
        let mut slots = [(0u16, 0u32); MAX_DESCS];
        let mut n = 0;
        let regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        // The descriptors of a packet are mostly of one region (guest RAM
        // is one memfd or a few): looked up once per run of them.
        let mut last: Option<(u32, &Arc<Mapped>)> = None;
        for d in descs {
            let m = match last {
                Some((id, m)) if id == d.region => m,
                _ => {
                    let m = regions.get(&d.region)?;
                    last = Some((d.region, m));
                    m
                }
            };
            m.range(d.offset, d.len as usize)?;
            if !slots[..n].contains(&(d.slot, d.gen)) {
                if n == max_slots.min(MAX_DESCS) {
                    return None;
                }
                slots[n] = (d.slot, d.gen);
                n += 1;
            }
            v.push((m.clone(), *d));
        }
        Some(Remote {
            pins: self.pins.clone(),
            descs: v,
        })
    }
}

/// What a sender has of one receiving peer (a GID of another process):
/// the regions offered to it, its pin table once an offer went out, and
/// the peer's pid once it accepted one.
#[derive(Debug, Default)]
pub struct PeerTx {
    state: Mutex<TxState>,
    /// The peer process is known to have exited, and what this held for
    /// it is let go ([`PeerTx::forget`]).
    forgotten: AtomicBool,
}

#[derive(Debug, Default)]
struct TxState {
    offers: Vec<TxOffer>,
    next_id: u32,
    free: Vec<u16>,
    next_slot: usize,
    /// Our pin table for the peer: made when the first offer goes out,
    /// so that a GID nobody is at costs no memfd.
    pins: Option<Arc<PinTable>>,
    /// The process that accepted, and its pid (only it may accept more).
    pidfd: Option<(OwnedFd, libc::pid_t)>,
}

/// One memfd offered to a peer, or our pin table alone (its ring).
#[derive(Debug)]
struct TxOffer {
    /// Held, so that the `Arc`'s address names that mapping; `None` for
    /// the ring alone ([`PeerTx::ring_alone`]).
    file: Option<Arc<File>>,
    id: u32,
    accepted: bool,
    /// When it is (sent) again if not accepted by then: `None` now.
    next_try: Option<Instant>,
    /// The wait after the next try.
    backoff: Duration,
    /// The wait after a try that found the peer's queue full.
    busy: Duration,
}

impl TxState {
    /// A new offer of `file` (or of the ring alone): its id.
    fn push_offer(&mut self, file: Option<Arc<File>>) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.offers.push(TxOffer {
            file,
            id,
            accepted: false,
            next_try: None,
            backoff: OFFER_RETRY,
            busy: OFFER_BUSY_RETRY,
        });
        id
    }
}

/// The wait before an offer not accepted is sent again, the first time:
/// an acceptance takes a round trip of the receive threads, well under a
/// millisecond; this is one that was lost or refused. A peer sends its
/// acceptance without waiting, and it is lost whenever our queue is full,
/// as it is under the traffic that made the offer, so the first waits are
/// short: the packets to that peer go as bytes until it is offered again.
/// A refusing peer is asked a few more times in the first second, each
/// refusal a log line.
pub const OFFER_RETRY: Duration = Duration::from_millis(20);
/// The longest wait between offers of one memfd to a peer that does not
/// accept it (doubled from [`OFFER_RETRY`]): a peer that refuses is
/// asked again, and logs its refusal, this often.
pub const OFFER_RETRY_MAX: Duration = Duration::from_secs(60);
/// The wait before an offer that found the peer's queue full is sent
/// again, the first time; doubled while it finds it full, up to
/// [`OFFER_BUSY_MAX`]. A queue drains in microseconds unless its reader is
/// stuck, and the offer's packets go as bytes meanwhile (six copies a
/// byte, not one).
pub const OFFER_BUSY_RETRY: Duration = Duration::from_millis(5);
/// The longest of those waits, after which a full queue counts as a peer
/// that did not answer ([`OFFER_RETRY`] and its doublings): a stuck peer
/// is asked less and less often.
pub const OFFER_BUSY_MAX: Duration = Duration::from_secs(1);

/// What [`PeerTx::region`] found.
pub enum Offer {
    /// Accepted: use this id.
    Ready(u32),
    /// Offered, not (yet) accepted: send bytes.
    Pending,
    /// New: to be offered with this id (by the fabric's offer thread,
    /// [`PeerTx::due_offers`]), and send bytes meanwhile.
    New(u32),
    /// Too many offers already: send bytes.
    Full,
}

impl PeerTx {
    /// A peer nothing was offered to yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TxState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The offer of `file` to this peer (on a device's data path: no
    /// system call, and an allocation only the first time).
    pub fn region(&self, file: &Arc<File>) -> Offer {
        let mut s = self.lock();
        if let Some(o) = s
            .offers
            .iter()
            .find(|o| o.file.as_ref().is_some_and(|f| Arc::ptr_eq(f, file)))
        {
            return if o.accepted {
                Offer::Ready(o.id)
            } else {
                Offer::Pending
            };
        }
        if s.offers.len() >= MAX_OFFERS || self.is_forgotten() {
            return Offer::Full;
        }
        Offer::New(s.push_offer(Some(file.clone())))
    }

    /// A peer this port sends only packets without descriptors (the
    /// acknowledgements and read requests of a port that is sent
    /// descriptors, but describes nothing itself) is offered our pin
    /// table alone, so that those packets take its ring as well, not a
    /// `sendto` each: whether an offer is new (for the offer thread, as
    /// [`Offer::New`]); `false` once anything was offered. On a device's
    /// data path: no system call.
    pub fn ring_alone(&self) -> bool {
        let mut s = self.lock();
        if !s.offers.is_empty() || self.is_forgotten() {
            return false;
        }
        s.push_offer(None);
        true
    }

    /// Offer thread: the offers due at `now` (not accepted, and not sent
    /// since their wait began) into `out` (`None` for the ring alone),
    /// each to be sent now and again after a wait twice as long as the
    /// last, up to [`OFFER_RETRY_MAX`]; returns when the next one is due.
    pub fn due_offers(
        &self,
        now: Instant,
        out: &mut Vec<(Option<Arc<File>>, u32)>,
    ) -> Option<Instant> {
        let mut s = self.lock();
        let mut next: Option<Instant> = None;
        for o in s.offers.iter_mut().filter(|o| !o.accepted) {
            if o.next_try.is_none_or(|t| t <= now) {
                out.push((o.file.clone(), o.id));
                o.next_try = Some(now + o.backoff);
                o.backoff = (o.backoff * 2).min(OFFER_RETRY_MAX);
            }
            next = match (next, o.next_try) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        next
    }

    /// Offer thread: offer `id`, just taken from [`PeerTx::due_offers`],
    /// could not be sent, the peer's queue full: it is due again after a
    /// short wait, which doubles while the queue stays full, and that try
    /// does not count towards the wait of an offer not answered; `None`
    /// once the short wait has grown to [`OFFER_BUSY_MAX`] (then the usual
    /// waits hold).
    pub fn offer_busy(&self, id: u32, now: Instant) -> Option<Instant> {
        let mut s = self.lock();
        let o = s.offers.iter_mut().find(|o| o.id == id && !o.accepted)?;
        if o.busy >= OFFER_BUSY_MAX {
            return None;
        }
        let at = now + o.busy;
        o.busy *= 2;
        o.backoff = (o.backoff / 2).max(OFFER_RETRY);
        o.next_try = Some(at);
        Some(at)
    }

    /// Offer thread: offer `id` was sent: a later full queue starts with
    /// the shortest wait again.
    pub fn offer_sent(&self, id: u32) {
        if let Some(o) = self.lock().offers.iter_mut().find(|o| o.id == id) {
            o.busy = OFFER_BUSY_RETRY;
        }
    }

    /// Offer thread: the pin table to send with an offer, made now if
    /// there is none.
    pub fn pins_for_offer(&self) -> io::Result<Arc<PinTable>> {
        let mut s = self.lock();
        if let Some(p) = &s.pins {
            return Ok(p.clone());
        }
        let p = Arc::new(PinTable::new()?);
        s.pins = Some(p.clone());
        Ok(p)
    }

    /// Offer thread: nobody is at the peer's socket. The pin table is let
    /// go unless an MR has a slot in it (a packet referred to one since)
    /// or an offer was accepted: a GID nobody is at holds no memfd while
    /// its offers wait to be tried again.
    pub fn nobody_there(&self) {
        let mut s = self.lock();
        if s.next_slot == 0 && s.pidfd.is_none() {
            s.pins = None;
        }
    }

    /// Whether it holds a pin table.
    pub fn has_pins(&self) -> bool {
        self.lock().pins.is_some()
    }

    /// Whether the process that accepted our offers has exited: a new one
    /// at its GID has mapped nothing of ours, so everything is offered
    /// again (to a new `PeerTx`), and this one is to be forgotten. A poll
    /// of its pidfd: for a thread that looks now and then, not a data
    /// path (the Unix transport learns it per packet from its socket).
    pub fn gone(&self) -> bool {
        self.lock()
            .pidfd
            .as_ref()
            .is_some_and(|(fd, _)| !alive(fd.as_fd()))
    }

    /// The peer is gone: its pin table, its pidfd and the offers are let
    /// go now, not when the last MR described to it is deregistered (a
    /// region keeps the `PeerTx` of each peer it was described to until
    /// then, or until it is described to the GID's next process,
    /// [`PeerTx::is_forgotten`]). An MR deregistered after this waits for
    /// nothing of this peer's: its mapping went with its process.
    pub fn forget(&self) {
        self.forgotten.store(true, Ordering::Release);
        let mut s = self.lock();
        s.pins = None;
        s.pidfd = None;
        s.offers = Vec::new();
        s.free = Vec::new();
    }

    /// Whether [`PeerTx::forget`] was called.
    pub fn is_forgotten(&self) -> bool {
        self.forgotten.load(Ordering::Acquire)
    }

    /// The peer (process `pid`) accepted offer `id`: `false` if another
    /// process accepted offers of this `PeerTx` before (a process that
    /// took over the GID is a new peer, once the old one is gone).
    ///
    /// The first acceptance opens the acceptor's pidfd and counts only if
    /// it shows the process alive: a transport that connects to the
    /// acceptor's socket before this call knows that it reached the socket
    /// of a process alive after the acceptance, not one bound at its
    /// address after it exited.
    pub fn accepted(&self, id: u32, pid: libc::pid_t) -> bool {
        let mut s = self.lock();
        match &s.pidfd {
            Some((_, p)) if *p != pid => return false,
            Some(_) => {}
            None if self.is_forgotten() => return false,
            None => match pidfd(pid) {
                Ok(fd) => {
                    let live = alive(fd.as_fd());
                    // Kept though dead, so that `gone` says so.
                    s.pidfd = Some((fd, pid));
                    if !live {
                        return true;
                    }
                }
                Err(e) => {
                    // Without a pidfd a retire could not tell a peer that
                    // exited: offer nothing then.
                    log::warn!("fabric: no pidfd for peer pid {pid} ({e}): sending it bytes");
                    return true;
                }
            },
        }
        if let Some(o) = s.offers.iter_mut().find(|o| o.id == id) {
            o.accepted = true;
        }
        true
    }

    /// A slot for an MR, armed: `(slot, generation)`; `None` if the table
    /// is full, or there is none yet (nothing was offered).
    pub fn take_slot(&self) -> Option<(u16, u32)> {
        let mut s = self.lock();
        let pins = s.pins.clone()?;
        let slot = match s.free.pop() {
            Some(n) => n as usize,
            None if s.next_slot < PIN_SLOTS => {
                s.next_slot += 1;
                s.next_slot - 1
            }
            None => return None,
        };
        Some((slot as u16, pins.arm(slot)))
    }

    /// DEREG_MR of the MR in `slot`: waits for the peer's pins
    /// ([`PinTable::retire`]), then frees the slot.
    pub fn release(&self, slot: u16) {
        let Some(pins) = self.lock().pins.clone() else {
            // Forgotten: the peer is gone.
            return;
        };
        let alive = || {
            if self.is_forgotten() {
                return false;
            }
            let s = self.lock();
            s.pidfd.as_ref().is_none_or(|(fd, _)| alive(fd.as_fd()))
        };
        pins.retire(slot.into(), alive);
        let mut s = self.lock();
        if !self.is_forgotten() {
            s.free.push(slot);
        }
    }
}

const OFFER_MAGIC: u32 = 0x4f41_4645; // "EFAO"
const ACCEPT_MAGIC: u32 = 0x4141_4645; // "EFAA"
const RING_MAGIC: u32 = 0x5241_4645; // "EFAR"
const CONTROL_VERSION: u8 = 1;
/// Bytes of an offer and of an acceptance.
pub const OFFER_BYTES: usize = 4 + 1 + 16 + 16 + 4 + 8;
/// Bytes of an acceptance, and of an offer of the ring alone.
pub const ACCEPT_BYTES: usize = 4 + 1 + 16 + 16 + 4;

/// A control message between the Unix sockets of two fabrics (not a
/// packet; see efa-emu.md's Packet format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// `from` offers `to` `len` bytes of a memfd (sent along with the pin
    /// table's, `SCM_RIGHTS`) as region `id`.
    Offer {
        /// The offering port's GID.
        from: [u8; 16],
        /// The port offered to.
        to: [u8; 16],
        /// The region's id in descriptors.
        id: u32,
        /// Bytes of the memfd offered (from offset 0).
        len: u64,
    },
    /// `from` offers `to` its pin table alone (sent along, `SCM_RIGHTS`),
    /// as offer `id`: the ring in it, for packets without descriptors.
    Ring {
        /// The offering port's GID.
        from: [u8; 16],
        /// The port offered to.
        to: [u8; 16],
        /// The offer, as an acceptance names it.
        id: u32,
    },
    /// `from` accepted `to`'s offer `id`.
    Accept {
        /// The accepting port's GID.
        from: [u8; 16],
        /// The offering port.
        to: [u8; 16],
        /// The offer.
        id: u32,
    },
}

impl Control {
    /// The wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(OFFER_BYTES);
        match self {
            Control::Offer { from, to, id, len } => {
                b.extend_from_slice(&OFFER_MAGIC.to_le_bytes());
                b.push(CONTROL_VERSION);
                b.extend_from_slice(from);
                b.extend_from_slice(to);
                b.extend_from_slice(&id.to_le_bytes());
                b.extend_from_slice(&len.to_le_bytes());
            }
            Control::Ring { from, to, id } | Control::Accept { from, to, id } => {
                let magic = if matches!(self, Control::Ring { .. }) {
                    RING_MAGIC
                } else {
                    ACCEPT_MAGIC
                };
                b.extend_from_slice(&magic.to_le_bytes());
                b.push(CONTROL_VERSION);
                b.extend_from_slice(from);
                b.extend_from_slice(to);
                b.extend_from_slice(&id.to_le_bytes());
            }
        }
        b
    }

    /// Parses one; `None` if it is not one (a packet, or garbage).
    pub fn decode(b: &[u8]) -> Option<Self> {
        let magic = u32::from_le_bytes(b.get(..4)?.try_into().ok()?);
        if *b.get(4)? != CONTROL_VERSION {
            return None;
        }
        let gid = |at: usize| -> Option<[u8; 16]> { b.get(at..at + 16)?.try_into().ok() };
        let (from, to) = (gid(5)?, gid(21)?);
        let id = u32::from_le_bytes(b.get(37..41)?.try_into().ok()?);
        match magic {
            OFFER_MAGIC if b.len() == OFFER_BYTES => Some(Control::Offer {
                from,
                to,
                id,
                len: u64::from_le_bytes(b.get(41..49)?.try_into().ok()?),
            }),
            ACCEPT_MAGIC if b.len() == ACCEPT_BYTES => Some(Control::Accept { from, to, id }),
            RING_MAGIC if b.len() == ACCEPT_BYTES => Some(Control::Ring { from, to, id }),
            _ => None,
        }
    }

    /// Whether `b` starts as a control message does (its magic).
    pub fn is_control(b: &[u8]) -> bool {
        b.get(..4)
            .and_then(|m| m.try_into().ok())
            .map(u32::from_le_bytes)
            .is_some_and(|m| [OFFER_MAGIC, ACCEPT_MAGIC, RING_MAGIC].contains(&m))
    }
}

/// A pidfd for `pid`, to tell when a peer has exited.
pub fn pidfd(pid: libc::pid_t) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open(2) with a pid and no flags; no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Whether the process behind `pidfd` still runs (a pidfd polls readable
/// once it has exited).
pub fn alive(pidfd: BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, no timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    // A failed poll (EINTR, ENOMEM) says nothing: alive, so that a retire
    // keeps waiting rather than let the guest reuse pages a peer may read.
    !(n > 0 && p.revents & libc::POLLIN != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    #[test]
    fn each_control_message_reads_back_as_written_and_no_other_length_does() {
        let (from, to) = ([1; 16], [2; 16]);
        for c in [
            Control::Offer {
                from,
                to,
                id: 3,
                len: 1 << 20,
            },
            Control::Accept { from, to, id: 4 },
            Control::Ring { from, to, id: 5 },
        ] {
            let b = c.encode();
            assert!(Control::is_control(&b));
            assert_eq!(Control::decode(&b), Some(c));
            assert_eq!(Control::decode(&b[..b.len() - 1]), None, "{c:?} cut short");
            let mut long = b.clone();
            long.push(0);
            assert_eq!(Control::decode(&long), None, "{c:?} with a byte more");
        }
        // A ring offer is never read as an acceptance, nor one as the other.
        let ring = Control::Ring { from, to, id: 5 }.encode();
        let accept = Control::Accept { from, to, id: 5 }.encode();
        assert_ne!(ring, accept);
        assert_eq!(ring.len(), ACCEPT_BYTES);
    }

    fn me() -> (libc::pid_t, libc::uid_t) {
        // SAFETY: getpid/getuid have no preconditions.
        unsafe { (libc::getpid(), libc::getuid()) }
    }

    fn memfd(len: i64, seal: bool) -> OwnedFd {
        memfd_flags(len, seal, 0)
    }

    fn memfd_flags(len: i64, seal: bool, flags: libc::c_uint) -> OwnedFd {
        // SAFETY: memfd_create with a literal name and defined flags.
        let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_ALLOW_SEALING | flags) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscalls on our descriptor.
        unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), len), 0);
            if seal {
                libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK);
            }
        }
        fd
    }

    #[test]
    fn offers_are_refused_unless_sealed_long_enough_and_ours() {
        let good = memfd(0x4000, true);
        let m = accept(&good, 0x1000, 0x2000, me()).unwrap();
        assert_eq!(m.len(), 0x2000);
        assert!(m.range(0x1ff0, 0x10).is_some());
        assert!(m.range(0x1ff0, 0x11).is_none(), "past the mapping");
        assert!(m.range(u64::MAX, 2).is_none(), "wraps");
        let unsealed = memfd(0x4000, false);
        assert!(matches!(
            accept(&unsealed, 0, 0x1000, me()),
            Err(Refusal::NotSealed(_))
        ));
        assert!(matches!(
            accept(&good, 0x1000, 0x4000, me()),
            Err(Refusal::TooShort { .. })
        ));
        // Sized without a page of the pool: ftruncate reserves none.
        let huge = memfd_flags(2 << 20, true, libc::MFD_HUGETLB);
        assert!(matches!(
            accept(&huge, 0, 0x1000, me()),
            Err(Refusal::HugeTlb)
        ));
        let (pid, uid) = me();
        assert!(matches!(
            accept(&good, 0, 0x1000, (pid, uid + 1)),
            Err(Refusal::Stranger { .. })
        ));
        assert!(matches!(
            accept(&good, 0, 0x1000, (0, uid)),
            Err(Refusal::Stranger { .. })
        ));
    }

    #[test]
    fn pins_hold_a_retire_and_refuse_after_it() {
        let t = PinTable::new().unwrap();
        // The receiver's view: the same memfd mapped again.
        let dup = t.fd().try_clone_to_owned().unwrap();
        let r = PinTable::open(dup).unwrap();
        let g = t.arm(7);
        assert!(r.pin(7, g.wrapping_add(1)).is_none(), "another generation");
        assert!(r.pin(PIN_SLOTS, g).is_none());
        let pin = r.pin(7, g).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| tx.send(t.retire(7, || true)).unwrap());
            // Until the retire has begun (on a loaded host its thread may
            // not have run at all yet), then a while longer.
            let t0 = Instant::now();
            while r.word(7).unwrap().load(Ordering::Acquire) & RETIRED == 0 {
                assert!(t0.elapsed() < Duration::from_secs(5), "no retire");
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(50));
            assert!(rx.try_recv().is_err(), "waits for the pin");
            assert!(r.pin(7, g).is_none(), "and refuses new ones");
            drop(pin);
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(5)).unwrap(),
                Retired::Clear
            );
        });
        // A new MR in the slot: the old generation stays refused.
        let g2 = t.arm(7);
        assert!(r.pin(7, g).is_none());
        let p = r.pin(7, g2).unwrap();
        // A peer gone with its pin: bounded.
        let t0 = Instant::now();
        assert_eq!(t.retire(7, || false), Retired::PeerGone);
        assert!(t0.elapsed() >= GONE_GRACE);
        std::mem::forget(p);
    }

    #[test]
    fn an_unsealed_or_wrong_sized_pin_table_is_refused() {
        assert!(PinTable::open(memfd(TABLE_BYTES as i64, false)).is_err());
        assert!(PinTable::open(memfd(4096, true)).is_err());
        assert!(
            PinTable::open(memfd((PIN_SLOTS * 8) as i64, true)).is_err(),
            "no room for the ring"
        );
        assert!(PinTable::open(memfd(TABLE_BYTES as i64, true)).is_ok());
    }

    #[test]
    fn a_ledger_refuses_past_each_limit_and_takes_back_what_is_unmapped() {
        let l = Ledger::new();
        let big = l.charge_region(10, MAX_MAPPED_PER_PID).unwrap();
        assert!(matches!(l.charge_region(10, 1), Err(Refusal::OverLimit(_))));
        assert!(l.charge_region(10, u64::MAX).is_err(), "no sum wraps");
        // Another process has a share of its own...
        let mut others = vec![l.charge_region(11, 4096).unwrap()];
        drop(big);
        // ...and the bytes come back when the mapping goes.
        assert_eq!(l.mapped(), 4096);
        others.extend((1..MAX_REGIONS_PER_PID).map(|_| l.charge_region(11, 4096).unwrap()));
        assert!(l.charge_region(11, 4096).is_err(), "regions of one process");
        let peers: Vec<_> = (0..MAX_PEERS_PER_PID)
            .map(|_| l.charge_peer(12).unwrap())
            .collect();
        assert!(l.charge_peer(12).is_err(), "GIDs of one process");
        drop((others, peers));
        assert_eq!(l.mapped(), 0);
        assert!(l.lock().pids.is_empty(), "nothing kept of gone processes");
        // All processes together: no more than MAX_MAPPED.
        let n = MAX_MAPPED / MAX_MAPPED_PER_PID;
        let all: Vec<_> = (0..n as i32)
            .map(|p| l.charge_region(100 + p, MAX_MAPPED_PER_PID).unwrap())
            .collect();
        assert!(l.charge_region(99, 1).is_err(), "all processes together");
        drop(all);
        // Refused before anything is mapped: a fabric maps no more.
        let fd = memfd(0x4000, true);
        let l = Ledger::new();
        let _hold: Vec<_> = (0..MAX_REGIONS_PER_PID)
            .map(|_| accept_charged(&fd, 0, 0x1000, me(), &l).unwrap())
            .collect();
        assert!(matches!(
            accept_charged(&fd, 0, 0x1000, me(), &l),
            Err(Refusal::OverLimit(_))
        ));
    }

    #[test]
    fn a_peer_has_no_pin_table_until_an_offer_goes_out_and_none_once_forgotten() {
        let p = PeerTx::new();
        let file = Arc::new(File::from(memfd(0x1000, true)));
        assert!(matches!(p.region(&file), Offer::New(0)));
        assert!(!p.has_pins(), "no memfd for a GID nobody may be at");
        assert!(p.take_slot().is_none(), "so no slot either");
        // The offer thread: due now, then after OFFER_RETRY.
        let now = Instant::now();
        let mut due = Vec::new();
        assert_eq!(p.due_offers(now, &mut due), Some(now + OFFER_RETRY));
        assert_eq!(due.len(), 1);
        due.clear();
        assert_eq!(p.due_offers(now, &mut due), Some(now + OFFER_RETRY));
        assert!(due.is_empty(), "not again before the wait");
        let later = now + OFFER_RETRY;
        assert_eq!(p.due_offers(later, &mut due), Some(later + 2 * OFFER_RETRY));
        assert_eq!(due.len(), 1, "again, and the wait doubles");
        // That try met a full queue: soon again, the waits doubling from
        // OFFER_BUSY_RETRY; it does not count towards the usual wait.
        let mut at = later;
        let mut wait = OFFER_BUSY_RETRY;
        while wait < OFFER_BUSY_MAX {
            assert_eq!(p.offer_busy(0, at), Some(at + wait));
            due.clear();
            assert_eq!(
                p.due_offers(at + wait, &mut due),
                Some(at + wait + 2 * OFFER_RETRY)
            );
            assert_eq!(due.len(), 1);
            at += wait;
            wait *= 2;
        }
        assert_eq!(p.offer_busy(0, at), None, "then the usual waits");
        p.offer_sent(0);
        assert_eq!(
            p.offer_busy(0, at),
            Some(at + OFFER_BUSY_RETRY),
            "sent: short again"
        );
        p.pins_for_offer().unwrap();
        assert!(p.has_pins());
        // Nobody at the socket: the table goes again.
        p.nobody_there();
        assert!(!p.has_pins());
        p.pins_for_offer().unwrap();
        let (slot, _) = p.take_slot().unwrap();
        p.nobody_there();
        assert!(p.has_pins(), "kept: an MR has a slot in it");
        // Accepted by one process: another may not accept for it.
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        assert!(p.accepted(0, pid));
        assert!(matches!(p.region(&file), Offer::Ready(0)));
        assert!(!p.accepted(0, pid + 1));
        // Gone: everything is let go; a retire waits for nothing.
        p.forget();
        assert!(p.is_forgotten() && !p.has_pins());
        assert!(matches!(p.region(&file), Offer::Full));
        let t = Instant::now();
        p.release(slot);
        assert!(t.elapsed() < GONE_GRACE);
        assert!(!p.accepted(0, pid), "nothing accepted once forgotten");
    }

    #[test]
    fn a_pidfd_tells_an_exited_process() {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let fd = pidfd(c.id() as libc::pid_t).unwrap();
        c.wait().unwrap();
        assert!(!alive(fd.as_fd()));
        // SAFETY: getpid has no preconditions.
        let me = pidfd(unsafe { libc::getpid() }).unwrap();
        assert!(alive(me.as_fd()));
    }
}
