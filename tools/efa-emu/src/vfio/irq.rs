//! MSI-X delivery: one eventfd per vector, handed over by QEMU with SET_IRQS
//! when the guest enables and unmasks the vector. Signalling is an 8-byte
//! write; QEMU turns it into the MSI message the guest programmed.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use crate::transport::Interrupts;

/// The MSI-X vectors of the current client. Valid across connections:
/// between clients no vector is set and every signal is dropped.
#[derive(Debug, Default)]
pub struct MsixVectors {
    fds: RwLock<Vec<Option<File>>>,
    delivered: AtomicU64,
    dropped: AtomicU64,
}

impl MsixVectors {
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// Sizes the table for a new client, with no vector set.
    pub(super) fn configure(&self, vectors: u16) {
        let mut fds = self.fds.write().unwrap_or_else(|e| e.into_inner());
        fds.clear();
        fds.resize_with(usize::from(vectors), || None);
    }

    /// Number of vectors in the table.
    pub fn len(&self) -> usize {
        self.fds.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether the table is empty (no MSI-X, or no client).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether QEMU has given an eventfd for `vector`.
    pub fn is_set(&self, vector: u16) -> bool {
        let fds = self.fds.read().unwrap_or_else(|e| e.into_inner());
        matches!(fds.get(usize::from(vector)), Some(Some(_)))
    }

    /// Signals delivered to an eventfd so far.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// Signals dropped so far (vector not set, or the write failed).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Sets vectors `start..start + count` to `fds`, or unsets them if `fds`
    /// is empty. Errors (EINVAL) leave the table unchanged.
    pub(super) fn set(&self, start: u32, count: u32, fds: Vec<File>) -> io::Result<()> {
        let einval = || io::Error::from_raw_os_error(libc::EINVAL);
        let mut table = self.fds.write().unwrap_or_else(|e| e.into_inner());
        let start = usize::try_from(start).map_err(|_| einval())?;
        let count = usize::try_from(count).map_err(|_| einval())?;
        let end = start
            .checked_add(count)
            .filter(|&e| e <= table.len())
            .ok_or_else(einval)?;
        if !fds.is_empty() && fds.len() != count {
            return Err(einval());
        }
        for fd in &fds {
            // Signalling must never block the model's thread, whatever the
            // client handed over. QEMU's own eventfds are non-blocking
            // already, so changing the shared file status flags is harmless.
            // SAFETY: fcntl on descriptors we own.
            let ok = unsafe {
                let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
                flags >= 0
                    && libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
            };
            if !ok {
                return Err(io::Error::last_os_error());
            }
        }
        if fds.is_empty() {
            table[start..end].iter_mut().for_each(|slot| *slot = None);
        } else {
            for (slot, fd) in table[start..end].iter_mut().zip(fds) {
                *slot = Some(fd);
            }
        }
        log::debug!(
            "MSI-X vectors {start}..{end} {}",
            if table[start..end].iter().any(Option::is_some) {
                "set"
            } else {
                "unset"
            }
        );
        Ok(())
    }

    /// Unsets every vector (MSI-X disabled).
    pub(super) fn unset_all(&self) {
        let mut table = self.fds.write().unwrap_or_else(|e| e.into_inner());
        table.iter_mut().for_each(|slot| *slot = None);
        log::debug!("MSI-X vectors all unset");
    }
}

impl Interrupts for MsixVectors {
    fn signal(&self, vector: u16) {
        let table = self.fds.read().unwrap_or_else(|e| e.into_inner());
        let Some(Some(fd)) = table.get(usize::from(vector)) else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match (&*fd).write(&1u64.to_ne_bytes()) {
            Ok(8) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
            // EAGAIN means the counter is saturated: an interrupt is pending
            // anyway. Anything else is the client's broken fd.
            other => {
                log::debug!("MSI-X vector {vector}: eventfd write: {other:?}");
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::FromRawFd;

    fn eventfd() -> File {
        // SAFETY: eventfd(2) with valid flags; the new fd is ours alone.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        unsafe { File::from_raw_fd(fd) }
    }

    #[test]
    fn set_signal_unset() {
        let v = MsixVectors::new();
        v.configure(4);
        v.signal(1);
        assert_eq!((v.delivered(), v.dropped()), (0, 1));
        let ev = eventfd();
        v.set(1, 1, vec![ev.try_clone().unwrap()]).unwrap();
        assert!(v.is_set(1) && !v.is_set(0));
        v.signal(1);
        v.signal(1);
        let mut n = [0u8; 8];
        (&ev).read_exact(&mut n).unwrap();
        assert_eq!(u64::from_ne_bytes(n), 2);
        v.set(0, 2, vec![]).unwrap();
        assert!(!v.is_set(1));
        v.signal(9);
        assert_eq!((v.delivered(), v.dropped()), (2, 2));
        assert!(v.set(3, 2, vec![]).is_err(), "past the table");
        assert!(v.set(0, 2, vec![eventfd()]).is_err(), "fd count mismatch");
        assert!(v.set(u32::MAX, 2, vec![]).is_err());
    }
}
