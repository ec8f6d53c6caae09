// SPDX-License-Identifier: GPL-2.0

//! Hardware counters (`struct rdma_hw_stats`), shown by `rdma statistic`
//! and in sysfs under `hw_counters`.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! A driver names its counters once, in static [`HwCounters`] tables built
//! with [`hw_counters!`]: one for the device as a whole and one per port.
//! The core allocates the value arrays from them and asks the driver to
//! fill them ([`Operations::get_hw_stats`]) at most once per lifespan.
//!
//! [`Operations::get_hw_stats`]: super::device::Operations::get_hw_stats

use super::bindings;
use kernel::prelude::*;

/// The names of a set of counters, in the order of their values.
pub(crate) struct HwCounters(&'static [bindings::rdma_stat_desc]);

// SAFETY: The descriptors only point to static, immutable C strings (the
// invariant `from_descs` asks of its callers).
unsafe impl Sync for HwCounters {}

impl HwCounters {
    /// Counters named by `descs`, which [`hw_counters!`] builds.
    ///
    /// # Safety
    ///
    /// Every descriptor comes from [`HwCounters::desc`].
    #[doc(hidden)]
    pub(crate) const unsafe fn from_descs(descs: &'static [bindings::rdma_stat_desc]) -> Self {
        Self(descs)
    }

    /// A descriptor naming one counter.
    #[doc(hidden)]
    #[allow(
        clippy::disallowed_methods,
        reason = "`as_char_ptr()` is not `const`; the cast yields the kernel's `char`"
    )]
    pub(crate) const fn desc(name: &'static CStr) -> bindings::rdma_stat_desc {
        bindings::rdma_stat_desc {
            name: name.as_ptr().cast(),
            flags: 0,
            priv_: core::ptr::null(),
        }
    }

    /// Number of counters.
    pub(crate) const fn len(&self) -> usize {
        self.0.len()
    }

    /// Allocates the core's value array for these counters; null when out
    /// of memory, which the core expects.
    pub(super) fn alloc(&'static self) -> *mut bindings::rdma_hw_stats {
        let len = kernel::ffi::c_int::try_from(self.0.len()).unwrap_or(0);
        // SAFETY: The descriptors are static, so they outlive the
        // allocation, which keeps a pointer to them.
        unsafe {
            bindings::rdma_alloc_hw_stats_struct(
                self.0.as_ptr(),
                len,
                bindings::RDMA_HW_STATS_DEFAULT_LIFESPAN as kernel::ffi::c_ulong,
            )
        }
    }
}

/// Declares a static [`HwCounters`] table named `$name` with the counters
/// named by the C string literals, in order.
#[macro_export]
macro_rules! hw_counters {
    ($vis:vis $name:ident = [$($counter:literal),+ $(,)?]) => {
        $vis static $name: $crate::rdma::stats::HwCounters = {
            const DESCS: &[$crate::rdma::bindings::rdma_stat_desc] =
                &[$($crate::rdma::stats::HwCounters::desc($counter)),+];
            // SAFETY: Every descriptor comes from `HwCounters::desc`.
            unsafe { $crate::rdma::stats::HwCounters::from_descs(DESCS) }
        };
    };
}
pub(crate) use crate::hw_counters;

/// Where counters are counted: the whole device or one port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatsScope {
    /// The device as a whole.
    Device,
    /// Port `n` (1-based).
    Port(u32),
}

impl StatsScope {
    /// The scope of the core's `port_num` argument: 0 is the device.
    pub(super) fn from_port(port: u32) -> Self {
        if port == 0 {
            Self::Device
        } else {
            Self::Port(port)
        }
    }
}

/// The values of counters the core asks the driver to fill.
pub(crate) struct HwStatsValues<'a>(&'a mut [u64]);

impl<'a> HwStatsValues<'a> {
    /// Borrows the value array of `stats`.
    ///
    /// # Safety
    ///
    /// `stats` was allocated by [`HwCounters::alloc`] and is not otherwise
    /// accessed for `'a` (the core holds its lock during the call).
    pub(super) unsafe fn from_raw(stats: *mut bindings::rdma_hw_stats) -> Self {
        // SAFETY: The allocation holds `num_counters` values after the
        // header, exclusively ours for the call.
        unsafe {
            let len = usize::try_from((*stats).num_counters).unwrap_or(0);
            Self(core::slice::from_raw_parts_mut(
                (*stats).value.as_mut_ptr(),
                len,
            ))
        }
    }

    /// The values, in the order the counters were named.
    pub(crate) fn values(&mut self) -> &mut [u64] {
        self.0
    }
}
