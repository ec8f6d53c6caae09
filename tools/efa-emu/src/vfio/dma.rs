//! Guest memory as the device reaches it: the regions QEMU offers with
//! DMA_MAP, each an fd (the memfd behind guest RAM) mapped into this process.
//!
//! As with [`crate::shmem`], the memory belongs to another process: it is
//! only ever copied through raw pointers, never referenced, and what is read
//! is guest input.

use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::transport::{Backing, DmaError, GuestMemory, HostRange, Lent};

/// Most DMA regions a client may map at once (QEMU maps a handful: RAM
/// below and above 4 GiB, a few ROMs).
pub const MAX_REGIONS: usize = 1024;

/// One mapped region: guest physical `[iova, iova + len)` at `host`.
struct Mapping {
    iova: u64,
    len: u64,
    host: NonNull<u8>,
    map_base: NonNull<libc::c_void>,
    map_len: usize,
    writable: bool,
    /// The file and the offset of `iova` in it, for offers to other
    /// processes ([`GuestMemory::backing`]).
    file: Arc<File>,
    offset: u64,
}

// SAFETY: a `Mapping` owns its mmap (unmapped only in `drop`); the pointers
// carry no thread affinity, and accesses through them are raw copies whose
// concurrency the table's lock and the module documentation cover.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`; shared use only reads the fields.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `map_base`/`map_len` are exactly what mmap returned and was
        // asked for; the table's write lock (held by whoever drops a mapping)
        // guarantees no copy through it is in flight.
        unsafe { libc::munmap(self.map_base.as_ptr(), self.map_len) };
    }
}

impl Mapping {
    fn end(&self) -> u64 {
        self.iova + self.len
    }
}

/// The mappings, by address, and the same as [`HostRange`]s for
/// [`GuestMemory::lend_all`], kept in step.
#[derive(Default)]
struct Table {
    maps: Vec<Mapping>,
    lent: Vec<HostRange>,
}

impl Table {
    /// `lent` after a change of `maps`.
    fn changed(&mut self) {
        self.lent.clear();
        self.lent.extend(self.maps.iter().map(|m| HostRange {
            iova: m.iova,
            len: m.len,
            host: m.host.as_ptr(),
            writable: m.writable,
        }));
    }
}

/// The device's view of guest memory: the DMA-mapped regions of the current
/// client, usable only while the guest lets the function master the bus.
///
/// Valid across connections: between clients it is empty and every access
/// fails.
pub struct DmaMemory {
    maps: RwLock<Table>,
    bus_master: AtomicBool,
}

impl std::fmt::Debug for DmaMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaMemory")
            .field("regions", &self.regions())
            .field("bus_master", &self.bus_master.load(Ordering::Relaxed))
            .finish()
    }
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n)
        .ok()
        .filter(|n| n.is_power_of_two())
        .unwrap_or(4096)
}

impl DmaMemory {
    pub(super) fn new() -> Self {
        Self {
            maps: RwLock::new(Table::default()),
            bus_master: AtomicBool::new(false),
        }
    }

    /// The mapped regions, `(guest address, length, writable)`, by address.
    pub fn regions(&self) -> Vec<(u64, u64, bool)> {
        let t = self.maps.read().unwrap_or_else(|e| e.into_inner());
        t.maps.iter().map(|m| (m.iova, m.len, m.writable)).collect()
    }

    /// Whether the guest lets the function master the bus (DMA fails if not).
    pub fn bus_master(&self) -> bool {
        self.bus_master.load(Ordering::Acquire)
    }

    pub(super) fn set_bus_master(&self, on: bool) {
        self.bus_master.store(on, Ordering::Release);
    }

    /// Maps `len` bytes of `file` at `offset` as guest `[iova, iova + len)`.
    pub(super) fn map(
        &self,
        iova: u64,
        len: u64,
        file: &File,
        offset: u64,
        writable: bool,
    ) -> io::Result<()> {
        let end = iova.checked_add(len).ok_or_else(einval)?;
        if len == 0 || offset.checked_add(len).is_none() {
            return Err(einval());
        }
        // Mapping past the end of a file turns later accesses into SIGBUS.
        let meta = file.metadata()?;
        if meta.is_file() && offset + len > meta.len() {
            return Err(einval());
        }
        // QEMU seals its RAM memfd against shrinking; try to make sure of it
        // for any other client, since a shrink would crash this process.
        // SAFETY: fcntl on a descriptor we own; failure is harmless.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
        // SAFETY: plain fcntl query on a descriptor we own.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if meta.is_file() && (seals < 0 || seals & libc::F_SEAL_SHRINK == 0) {
            log::warn!(
                "guest memory at {iova:#x} is not sealed against shrinking: \
                 a client that truncates it can crash this server"
            );
        }

        let page = page_size();
        let delta = offset % page;
        let map_len = usize::try_from(len + delta)
            .ok()
            .filter(|&l| l <= isize::MAX as usize)
            .ok_or_else(einval)?;
        let map_offset = libc::off_t::try_from(offset - delta).map_err(|_| einval())?;

        // Kept for offers to other processes (DMA_MAP's fd is closed after).
        let keep = Arc::new(file.try_clone()?);
        let mut t = self.maps.write().unwrap_or_else(|e| e.into_inner());
        let maps = &mut t.maps;
        if maps.iter().any(|m| iova < m.end() && m.iova < end) {
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        if maps.len() >= MAX_REGIONS {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: a new mapping placed by the kernel (no MAP_FIXED) of a file
        // we hold open; nothing refers to it until it enters the table.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                map_offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let Some(map_base) = NonNull::new(ptr) else {
            // SAFETY: unmapping what mmap just returned, unused so far.
            unsafe { libc::munmap(ptr, map_len) };
            return Err(io::Error::other("mmap returned a null mapping"));
        };
        // SAFETY: `delta < page <= map_len`, so the result is inside the
        // mapping (and non-null as an offset from a non-null base).
        let host =
            unsafe { NonNull::new_unchecked(map_base.as_ptr().cast::<u8>().add(delta as usize)) };
        let at = maps.partition_point(|m| m.iova < iova);
        maps.insert(
            at,
            Mapping {
                iova,
                len,
                host,
                map_base,
                map_len,
                writable,
                file: keep,
                offset,
            },
        );
        t.changed();
        log::debug!("DMA map {iova:#x}+{len:#x} (writable: {writable})");
        Ok(())
    }

    /// Unmaps every region inside `[iova, iova + len)`, or all with `all`.
    /// A region only partly inside is an error and nothing is unmapped.
    pub(super) fn unmap(&self, iova: u64, len: u64, all: bool) -> io::Result<()> {
        let mut t = self.maps.write().unwrap_or_else(|e| e.into_inner());
        if all {
            t.maps.clear();
            t.changed();
            return Ok(());
        }
        let end = iova.checked_add(len).ok_or_else(einval)?;
        let overlaps = |m: &Mapping| iova < m.end() && m.iova < end;
        let inside = |m: &Mapping| iova <= m.iova && m.end() <= end;
        if t.maps.iter().any(|m| overlaps(m) && !inside(m)) {
            return Err(einval());
        }
        t.maps.retain(|m| !inside(m));
        t.changed();
        log::debug!("DMA unmap {iova:#x}+{len:#x}");
        Ok(())
    }

    /// Forgets every region (client gone).
    pub(super) fn clear(&self) {
        let mut t = self.maps.write().unwrap_or_else(|e| e.into_inner());
        t.maps.clear();
        t.changed();
        drop(t);
        self.set_bus_master(false);
    }

    /// Runs `copy(host pointer, offset into the access, length)` over the
    /// pieces of `[addr, addr + len)` once the whole range is known to be
    /// mapped (and writable if `write`), under the read lock so no piece is
    /// unmapped meanwhile. Contiguous adjacent regions are crossed.
    fn access(
        &self,
        addr: u64,
        len: usize,
        write: bool,
        copy: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), DmaError> {
        let t = self.maps.read().unwrap_or_else(|e| e.into_inner());
        Self::access_in(&t.maps, self.bus_master(), addr, len, write, copy)
    }

    /// [`DmaMemory::access`] over `maps`, which the caller keeps locked.
    fn access_in(
        maps: &[Mapping],
        bus_master: bool,
        addr: u64,
        len: usize,
        write: bool,
        mut copy: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), DmaError> {
        let err = DmaError { addr, len };
        if len == 0 {
            return Ok(());
        }
        let end = u64::try_from(len)
            .ok()
            .and_then(|l| addr.checked_add(l))
            .ok_or(err)?;
        if !bus_master {
            return Err(err);
        }
        let first = maps.partition_point(|m| m.iova <= addr);
        let first = first.checked_sub(1).ok_or(err)?;
        // Check every piece before touching any, so a failed access has no
        // effect.
        let mut pos = addr;
        let mut last = first;
        for (i, m) in maps.iter().enumerate().skip(first) {
            if m.iova != pos && i != first || pos >= m.end() || (write && !m.writable) {
                return Err(err);
            }
            last = i;
            pos = m.end().min(end);
            if pos == end {
                break;
            }
        }
        if pos != end {
            return Err(err);
        }
        let mut pos = addr;
        for m in &maps[first..=last] {
            let piece_end = m.end().min(end);
            let n = (piece_end - pos) as usize;
            // SAFETY: `pos - m.iova < m.len`, checked above, and
            // `m.host..m.host + m.len` is inside the live mapping.
            let host = unsafe { m.host.as_ptr().add((pos - m.iova) as usize) };
            copy(host, (pos - addr) as usize, n);
            pos = piece_end;
        }
        Ok(())
    }
}

impl GuestMemory for DmaMemory {
    fn check(&self, addr: u64, len: u64, write: bool) -> Result<(), DmaError> {
        let len = usize::try_from(len).map_err(|_| DmaError {
            addr,
            len: usize::MAX,
        })?;
        self.access(addr, len, write, |_, _, _| {})
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let dst = buf.as_mut_ptr();
        self.access(addr, buf.len(), false, |host, at, n| {
            // SAFETY: `access` hands out `n` mapped bytes at `host`, readable
            // and kept mapped by its read lock; `at + n <= buf.len()`. The
            // guest's concurrent stores can only tear the copy.
            unsafe { std::ptr::copy_nonoverlapping(host, dst.add(at), n) }
        })
    }

    fn read_uninit(&self, addr: u64, buf: &mut [MaybeUninit<u8>]) -> Result<(), DmaError> {
        let dst = buf.as_mut_ptr().cast::<u8>();
        self.access(addr, buf.len(), false, |host, at, n| {
            // SAFETY: as in `read`; writing initializes the bytes, and
            // `access` covers all of `buf` or fails before any copy.
            unsafe { std::ptr::copy_nonoverlapping(host, dst.add(at), n) }
        })
    }

    fn backing(&self, addr: u64, len: usize) -> Option<Backing> {
        let t = self.maps.read().unwrap_or_else(|e| e.into_inner());
        let i = t.maps.partition_point(|m| m.iova <= addr).checked_sub(1)?;
        let m = &t.maps[i];
        let end = addr.checked_add(len as u64)?;
        (end <= m.end()).then(|| Backing {
            file: m.file.clone(),
            offset: m.offset + (addr - m.iova),
        })
    }

    /// Lends under the read lock, if it is free of writers: a lender must
    /// not wait (see [`GuestMemory::lend`]); a DMA_MAP or DMA_UNMAP waiting
    /// for the lock makes `copy` go through a buffer instead.
    fn lend(
        &self,
        addr: u64,
        len: usize,
        write: bool,
        f: &mut dyn FnMut(*mut u8, usize, usize),
    ) -> Result<bool, DmaError> {
        let maps = match self.maps.try_read() {
            Ok(m) => m,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(false),
        };
        Self::access_in(&maps.maps, self.bus_master(), addr, len, write, f).map(|()| true)
    }

    /// Lends the table under its read lock, as [`GuestMemory::lend`]
    /// does (and, as it, not if that would wait): one lock for a packet's
    /// pages.
    fn lend_all(&self, f: &mut dyn FnMut(&Lent<'_>)) -> bool {
        let t = match self.maps.try_read() {
            Ok(t) => t,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        // Without bus mastering every access fails, as `access` fails
        // them: nothing is lent.
        let ranges: &[HostRange] = if self.bus_master() { &t.lent } else { &[] };
        // SAFETY: `lent` is `maps` as they are (`Table::changed` after
        // every change of them), sorted and apart as `map` keeps them,
        // each range inside its live mmap and mapped writable where it
        // says so; a mapping is only unmapped under the write lock, which
        // the read guard `t` keeps out until after `f` returns.
        let lent = unsafe { Lent::new(ranges) };
        f(&lent);
        true
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        let src = data.as_ptr();
        self.access(addr, data.len(), true, |host, at, n| {
            // SAFETY: as in `read`, and `access` checked every piece is
            // mapped writable, so the store cannot fault.
            unsafe { std::ptr::copy_nonoverlapping(src.add(at), host, n) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shmem::SharedMem;
    use std::os::fd::AsFd;

    fn memfd(len: usize) -> (SharedMem, File) {
        let m = SharedMem::new("guest", len).unwrap();
        let f = File::from(m.fd().as_fd().try_clone_to_owned().unwrap());
        (m, f)
    }

    #[test]
    fn accesses_inside_and_across_regions() {
        let (ram, f) = memfd(0x4000);
        let d = DmaMemory::new();
        d.map(0x10000, 0x2000, &f, 0, true).unwrap();
        d.map(0x12000, 0x2000, &f, 0x2000, true).unwrap();
        let mut b = [0u8; 8];
        assert!(d.read(0x10000, &mut b).is_err(), "bus mastering is off");
        d.set_bus_master(true);
        d.write(0x11ffc, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        assert_eq!(ram.load_u64(0x1ff8).unwrap() >> 32, 0x0403_0201);
        assert_eq!(ram.load_u32(0x2000).unwrap(), 0x0807_0605);
        d.read(0x11ffc, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            d.read(0x13ffc, &mut b),
            Err(DmaError {
                addr: 0x13ffc,
                len: 8
            })
        );
        assert!(
            d.read(0xfffc, &mut b).is_err(),
            "starts before the first region"
        );
        assert!(d.read(u64::MAX - 2, &mut b).is_err());
        d.read(0x13ff8, &mut b).unwrap();
    }

    #[test]
    fn gaps_read_only_and_overlaps_are_refused() {
        let (_ram, f) = memfd(0x4000);
        let d = DmaMemory::new();
        d.set_bus_master(true);
        d.map(0x0, 0x1000, &f, 0, true).unwrap();
        d.map(0x2000, 0x1000, &f, 0x1000, false).unwrap();
        assert!(d.read(0xffc, &mut [0; 8]).is_err(), "gap between regions");
        assert!(d.write(0x2000, &[1]).is_err(), "read-only region");
        d.read(0x2000, &mut [0; 8]).unwrap();
        assert!(d.map(0x800, 0x1000, &f, 0, true).is_err(), "overlap");
        assert!(
            d.map(0x8000, 0x1000, &f, 0x3800, true).is_err(),
            "past the file end"
        );
        assert!(d.map(u64::MAX, 2, &f, 0, true).is_err());
        assert!(d.unmap(0x0, 0x800, false).is_err(), "partial unmap");
        d.unmap(0x0, 0x1000, false).unwrap();
        assert!(d.read(0x0, &mut [0; 1]).is_err());
        assert_eq!(d.regions(), vec![(0x2000, 0x1000, false)]);
        d.unmap(0, 0, true).unwrap();
        assert!(d.regions().is_empty());
    }

    #[test]
    fn copies_go_straight_between_two_guests_and_never_wait_for_a_lock() {
        use crate::transport::{copy, CopyError};
        let (ram_a, fa) = memfd(0x3000);
        let (ram_b, fb) = memfd(0x3000);
        let (a, b) = (DmaMemory::new(), DmaMemory::new());
        for (d, f) in [(&a, &fa), (&b, &fb)] {
            d.set_bus_master(true);
            // Two regions that meet: a copy crosses from one to the other.
            d.map(0x10000, 0x1000, f, 0x1000, true).unwrap();
            d.map(0x11000, 0x1000, f, 0x2000, true).unwrap();
        }
        let data: Vec<u8> = (0..0x1800u32).map(|i| (i * 7) as u8).collect();
        ram_a.write(0x1400, &data).unwrap();
        copy(&a, 0x10400, &b, 0x10200, data.len()).unwrap();
        let mut got = vec![0; data.len()];
        ram_b.read(0x1200, &mut got).unwrap();
        assert_eq!(got, data);
        // Within one guest, overlapping: a memmove.
        copy(&a, 0x10400, &a, 0x10401, 0x100).unwrap();
        let mut got = vec![0; 0x100];
        ram_a.read(0x1401, &mut got).unwrap();
        assert_eq!(got, data[..0x100]);
        assert!(matches!(
            copy(&a, 0x11f00, &b, 0x10000, 0x200),
            Err(CopyError::Source(_))
        ));
        assert!(matches!(
            copy(&a, 0x10000, &b, 0x11f00, 0x200),
            Err(CopyError::Dest(_))
        ));
        // A DMA_UNMAP waiting for the table (held here as a copy would
        // hold it): lending would have to wait behind it, so it lends
        // nothing, and a copy goes through a buffer, one table at a time.
        let held = a.maps.read().unwrap();
        std::thread::scope(|s| {
            let t = s.spawn(|| a.unmap(0x11000, 0x1000, false));
            // Until the unmap is waiting (it lends before that).
            let t0 = std::time::Instant::now();
            loop {
                let mut called = false;
                let lent = a.lend(0x10000, 8, false, &mut |_, _, _| called = true);
                assert_eq!(lent.unwrap(), called);
                if !called {
                    break;
                }
                assert!(t0.elapsed().as_secs() < 10, "the unmap never waited");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            drop(held);
            t.join().unwrap().unwrap();
        });
        assert_eq!(a.lend(0x10000, 8, false, &mut |_, _, _| {}), Ok(true));
        assert!(
            a.lend(0x11000, 8, false, &mut |_, _, _| {}).is_err(),
            "unmapped"
        );
    }

    #[test]
    fn lent_whole_the_table_refuses_and_finds_what_lend_does() {
        let (_ram, f) = memfd(0x6000);
        let d = DmaMemory::new();
        // Two regions that meet, a gap, a read-only region.
        d.map(0x10000, 0x1000, &f, 0x1000, true).unwrap();
        d.map(0x11000, 0x1000, &f, 0x2000, true).unwrap();
        d.map(0x13000, 0x1000, &f, 0x3000, false).unwrap();
        let cases = [
            (0x10000, 0x1000),
            (0x10ff0, 0x20),
            (0x11ff0, 0x20),
            (0x12000, 1),
            (0x13000, 0x1000),
            (0x13ff0, 0x20),
            (0xffff, 2),
            (0x10000, 0x2000),
            (0x10000, 0x2001),
            (u64::MAX - 1, 4),
            (0x10100, 0),
        ];
        for bus_master in [false, true] {
            d.set_bus_master(bus_master);
            for (addr, len) in cases {
                for write in [false, true] {
                    let mut first = None;
                    let lent = d.lend(addr, len, write, &mut |p, at, n| {
                        if at == 0 {
                            first = Some((p, n));
                        }
                    });
                    let mut whole = None;
                    assert!(d.lend_all(&mut |l| whole = Some(l.host(addr, len, write))));
                    let whole = whole.unwrap();
                    let what = format!("{addr:#x}+{len:#x} write {write} bus master {bus_master}");
                    match lent {
                        Ok(true) if len == 0 => assert_eq!(whole.map(|h| h.1), Ok(0), "{what}"),
                        Ok(true) => assert_eq!(whole, Ok(first.unwrap()), "{what}"),
                        Ok(false) => panic!("{what}: lends nothing"),
                        Err(e) => assert_eq!(whole, Err(e), "{what}"),
                    }
                }
            }
        }
        // Not while an unmap waits for the table.
        let held = d.maps.read().unwrap();
        std::thread::scope(|s| {
            let t = s.spawn(|| d.unmap(0x13000, 0x1000, false));
            let t0 = std::time::Instant::now();
            while d.lend_all(&mut |_| {}) {
                assert!(t0.elapsed().as_secs() < 10, "the unmap never waited");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            drop(held);
            t.join().unwrap().unwrap();
        });
        assert!(d.lend_all(&mut |l| assert!(l.host(0x13000, 1, false).is_err())));
    }

    #[test]
    fn unaligned_file_offsets_map() {
        let (ram, f) = memfd(0x3000);
        ram.write(0x1234, b"hello").unwrap();
        let d = DmaMemory::new();
        d.set_bus_master(true);
        d.map(0x5000, 0x100, &f, 0x1234, true).unwrap();
        let mut b = [0u8; 5];
        d.read(0x5000, &mut b).unwrap();
        assert_eq!(&b, b"hello");
    }

    #[test]
    fn a_client_maps_a_bounded_number_of_regions() {
        let (_ram, f) = memfd(0x1000);
        let d = DmaMemory::new();
        for i in 0..MAX_REGIONS as u64 {
            d.map(i << 12, 0x1000, &f, 0, true).unwrap();
        }
        let e = d.map((MAX_REGIONS as u64) << 12, 0x1000, &f, 0, true);
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        d.unmap(0, 0x1000, false).unwrap();
        d.map((MAX_REGIONS as u64) << 12, 0x1000, &f, 0, true)
            .unwrap();
    }
}
