//! Payload bytes the data path copies, for the benchmark
//! (`benches/datapath.rs`, `make bench-emu`) to report copies per byte.
//!
//! Every place that copies message data calls [`copied`] with the bytes
//! it copied: between guest memory and a buffer of the model, between two
//! buffers, from one guest memory straight into another
//! ([`crate::transport::copy`]), into and out of the socket fabric's
//! datagrams (the kernel's copies in `sendto` and `recvmsg` included). Descriptors, completions
//! and packet headers are not payload and are not counted. Without the
//! `copy-count` feature (which only the benchmark turns on) [`copied`] is
//! empty and [`total`] is `None`.

#[cfg(feature = "copy-count")]
mod imp {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    /// One counter per cache line, so that the data-path threads do not
    /// share one line per copy.
    #[repr(align(128))]
    struct Shard(AtomicU64);

    const SHARDS: usize = 16;
    static COUNTS: [Shard; SHARDS] = [const { Shard(AtomicU64::new(0)) }; SHARDS];
    static NEXT: AtomicUsize = AtomicUsize::new(0);

    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }

    pub fn add(n: usize) {
        let i = MINE.with(|i| *i);
        COUNTS[i].0.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn total() -> u64 {
        COUNTS.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

/// Counts `n` payload bytes copied.
#[inline]
pub fn copied(n: usize) {
    #[cfg(feature = "copy-count")]
    imp::add(n);
    #[cfg(not(feature = "copy-count"))]
    let _ = n;
}

/// Payload bytes copied so far by this process, if counted.
pub fn total() -> Option<u64> {
    #[cfg(feature = "copy-count")]
    return Some(imp::total());
    #[cfg(not(feature = "copy-count"))]
    None
}
