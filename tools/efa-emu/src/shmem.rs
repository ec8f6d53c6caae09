//! Memory the device shares with the guest: a memfd mapped here and, through
//! its fd, by QEMU into a BAR (doorbells, LLQ).
//!
//! The other side of the mapping is another process, so Rust's memory model
//! has no say over its stores. The accessors never create a Rust reference to
//! the mapping: single values go through atomics (a doorbell is never torn,
//! and an acquire load orders the reads of the entries it publishes), byte
//! ranges through raw copies, which may see a torn mix of old and new bytes
//! when the guest writes at the same time. Everything read here is guest
//! input and must be validated as such.

use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

/// An access that is not entirely inside the mapping, or is misaligned for
/// its width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadAccess {
    /// Offset of the first byte.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl std::fmt::Display for BadAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "access of {} bytes at offset {:#x} is outside the shared memory or misaligned",
            self.len, self.offset
        )
    }
}

impl std::error::Error for BadAccess {}

/// A shared, read/write memfd mapping of a fixed size.
pub struct SharedMem {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: `base` points to a MAP_SHARED mapping owned by this value and
// unmapped only by `drop`; no method hands out references into it or keeps
// per-thread state, and every access is an atomic or a raw copy, so using it
// from several threads is no different from the guest using it concurrently.
unsafe impl Send for SharedMem {}
// SAFETY: as for `Send`: all methods take `&self` and touch the mapping only
// through atomics or raw copies bounded by `len`.
unsafe impl Sync for SharedMem {}

impl std::fmt::Debug for SharedMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMem")
            .field("fd", &self.fd.as_raw_fd())
            .field("len", &self.len)
            .finish()
    }
}

macro_rules! atomic_accessors {
    ($load:ident, $store:ident, $ty:ty, $atomic:ty) => {
        #[doc = concat!("Acquire load of a `", stringify!($ty), "` at `offset` (naturally aligned).")]
        pub fn $load(&self, offset: usize) -> Result<$ty, BadAccess> {
            let p = self.at(offset, size_of::<$ty>(), align_of::<$atomic>())?;
            // SAFETY: `at` checked that `p` is aligned for the atomic type and
            // that all of its bytes lie inside the mapping, which lives as long
            // as `&self`. Atomics are address-free, so the other process's
            // view of the same page does not matter.
            let cell = unsafe { <$atomic>::from_ptr(p.cast()) };
            Ok(cell.load(Ordering::Acquire))
        }

        #[doc = concat!("Release store of a `", stringify!($ty), "` at `offset` (naturally aligned).")]
        pub fn $store(&self, offset: usize, value: $ty) -> Result<(), BadAccess> {
            let p = self.at(offset, size_of::<$ty>(), align_of::<$atomic>())?;
            // SAFETY: as in the load: aligned, in bounds, mapping alive.
            let cell = unsafe { <$atomic>::from_ptr(p.cast()) };
            cell.store(value, Ordering::Release);
            Ok(())
        }
    };
}

impl SharedMem {
    /// Creates a zero-filled memfd of `len` bytes (`name` shows in
    /// `/proc/<pid>/maps`) and maps it. The size is sealed, so a peer holding
    /// the fd cannot shrink it under this mapping (which would turn accesses
    /// into SIGBUS).
    pub fn new(name: &str, len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty shared memory",
            ));
        }
        let size = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "shared memory too large"))?;
        let cname = CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in memfd name"))?;
        // SAFETY: `cname` is a valid NUL-terminated string that outlives the
        // call; the flags are defined by memfd_create(2).
        let raw = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: plain fcntl on a descriptor we own; F_ADD_SEALS takes an int.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Self::map(fd, len)
    }

    /// Maps `len` bytes of a sealed memfd (ours, or one a peer created: the
    /// caller checked that it cannot shrink below `len`), read-write.
    pub fn map(fd: OwnedFd, len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty shared memory",
            ));
        }
        // SAFETY: a new shared mapping chosen by the kernel (no MAP_FIXED)
        // of a descriptor we own; nothing else refers to it yet.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let Some(base) = NonNull::new(ptr.cast::<u8>()) else {
            // SAFETY: unmapping what mmap just returned, unused so far.
            unsafe { libc::munmap(ptr, len) };
            return Err(io::Error::other("mmap returned a null mapping"));
        };
        Ok(Self { fd, base, len })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a `SharedMem` has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd, for handing to the peer (QEMU maps it into a BAR).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Pointer to `offset` if `[offset, offset + len)` lies inside the mapping
    /// and `offset` is a multiple of `align` (the base is page-aligned, so the
    /// offset's alignment is the address's).
    fn at(&self, offset: usize, len: usize, align: usize) -> Result<*mut u8, BadAccess> {
        let bad = BadAccess { offset, len };
        let end = offset.checked_add(len).ok_or(bad)?;
        if end > self.len || offset % align != 0 {
            return Err(bad);
        }
        // SAFETY: `offset <= end <= self.len`, so the result stays inside (or
        // one past the end of) the mapping.
        Ok(unsafe { self.base.as_ptr().add(offset) })
    }

    /// A pointer to the `len` bytes at `offset`, valid while `self` is:
    /// for copies straight from one mapping into another
    /// ([`crate::transport::GuestMemory::lend`]). It is only ever to be
    /// copied through, never made a reference (see the module
    /// documentation).
    pub fn ptr(&self, offset: usize, len: usize) -> Result<*mut u8, BadAccess> {
        self.at(offset, len, 1)
    }

    atomic_accessors!(load_u16, store_u16, u16, AtomicU16);
    atomic_accessors!(load_u32, store_u32, u32, AtomicU32);
    atomic_accessors!(load_u64, store_u64, u64, AtomicU64);

    /// Swaps the `u32` at `offset` (naturally aligned) for `value`, and
    /// returns what was there: one read-modify-write, so that of two
    /// processes that swap, each sees the other's value or its own.
    pub fn swap_u32(&self, offset: usize, value: u32) -> Result<u32, BadAccess> {
        let p = self.at(offset, size_of::<u32>(), align_of::<AtomicU32>())?;
        // SAFETY: as in the loads: aligned, in bounds, mapping alive.
        let cell = unsafe { AtomicU32::from_ptr(p.cast()) };
        Ok(cell.swap(value, Ordering::AcqRel))
    }

    /// Copies `buf.len()` bytes at `offset` out of the mapping (e.g. an LLQ
    /// entry).
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), BadAccess> {
        let p = self.at(offset, buf.len(), 1)?;
        // SAFETY: the source range is inside the live mapping (checked by
        // `at`), the destination is our own buffer of the same length, and
        // the two cannot overlap (the mapping is never lent out as a Rust
        // object). A concurrent guest store may tear the copy, which the
        // module documentation makes the caller's concern.
        unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// [`SharedMem::read`] into memory that need not be initialized; on
    /// success all of `buf` is.
    pub fn read_uninit(&self, offset: usize, buf: &mut [MaybeUninit<u8>]) -> Result<(), BadAccess> {
        let p = self.at(offset, buf.len(), 1)?;
        // SAFETY: as in `read`; the copy initializes every byte of `buf`.
        unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr().cast::<u8>(), buf.len()) };
        Ok(())
    }

    /// Copies `data` into the mapping at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), BadAccess> {
        let p = self.at(offset, data.len(), 1)?;
        // SAFETY: as in `read`, with source and destination swapped.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// Sets `len` bytes at `offset` to `byte` (e.g. clearing the LLQ on
    /// reset).
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), BadAccess> {
        let p = self.at(offset, len, 1)?;
        // SAFETY: `[p, p + len)` is inside the live mapping (checked by `at`).
        unsafe { std::ptr::write_bytes(p, byte, len) };
        Ok(())
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` describe the mapping created in `new`, which
        // only this value owns; `&mut self` proves no accessor is running.
        // The peer's own mapping of the memfd is unaffected.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_bounds_hold() {
        let m = SharedMem::new("test", 8192).unwrap();
        assert_eq!(m.len(), 8192);
        assert_eq!(m.load_u64(0), Ok(0));
        m.store_u32(0x100, 0xdead_beef).unwrap();
        assert_eq!(m.load_u32(0x100), Ok(0xdead_beef));
        assert_eq!(m.load_u16(0x100), Ok(0xbeef));
        m.store_u64(8184, u64::MAX).unwrap();
        assert_eq!(m.load_u64(8184), Ok(u64::MAX));
        assert!(m.load_u64(8188).is_err(), "misaligned");
        assert!(m.load_u32(8192).is_err(), "past the end");
        assert!(m.store_u16(8191, 1).is_err());
        assert!(m.load_u64(usize::MAX - 3).is_err(), "overflowing offset");
    }

    #[test]
    fn ranges_copy_and_check() {
        let m = SharedMem::new("test", 4096).unwrap();
        m.write(10, &[1, 2, 3]).unwrap();
        let mut buf = [0u8; 5];
        m.read(9, &mut buf).unwrap();
        assert_eq!(buf, [0, 1, 2, 3, 0]);
        m.read(4096, &mut []).unwrap();
        assert!(m.read(4094, &mut buf).is_err());
        assert!(m.write(usize::MAX, &[1]).is_err());
        m.fill(0, 4096, 0xaa).unwrap();
        assert_eq!(m.load_u32(4092), Ok(0xaaaa_aaaa));
        assert!(m.fill(1, 4096, 0).is_err());
    }

    #[test]
    fn the_fd_shows_the_same_bytes_and_cannot_shrink() {
        let m = SharedMem::new("test", 4096).unwrap();
        m.store_u32(4, 0x1234_5678).unwrap();
        let mut word = [0u8; 4];
        // SAFETY: pread into a local buffer of the length passed.
        let n = unsafe { libc::pread(m.fd().as_raw_fd(), word.as_mut_ptr().cast(), 4, 4) };
        assert_eq!(n, 4);
        assert_eq!(u32::from_ne_bytes(word), 0x1234_5678);
        // SAFETY: ftruncate on a descriptor we borrow; it must be refused.
        assert_ne!(unsafe { libc::ftruncate(m.fd().as_raw_fd(), 0) }, 0);
    }

    #[test]
    fn empty_is_refused() {
        assert!(SharedMem::new("test", 0).is_err());
    }
}
