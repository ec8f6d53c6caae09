// SPDX-License-Identifier: GPL-2.0

// out of tree: begin
//! Waiting for a delayed work item, out of tree only: the series adds
//! `DelayedWork::flush()` (patches/rust/), over `flush_delayed_work()`,
//! which [`DelayedWorkExt`] stands in for with the same name and signature.
//!
//! C header: [`include/linux/workqueue.h`](srctree/include/linux/workqueue.h)

use kernel::{
    bindings,
    workqueue::{
        DelayedWork,
        Work, //
    }, //
};

/// The method patches/rust/ adds to `DelayedWork`.
pub(crate) trait DelayedWorkExt {
    /// Runs the work item at once if its timer is pending, and waits until
    /// it has finished (`flush_delayed_work()`). Returns whether there was
    /// anything to wait for.
    ///
    /// The run waited for consumes the pointer enqueued, as any run does.
    /// The item is idle on return unless it was enqueued again after the
    /// flush began. It may sleep, and must not be called from the item.
    fn flush(&self) -> bool;
}

impl<T: ?Sized, const ID: u64> DelayedWorkExt for DelayedWork<T, ID> {
    fn flush(&self) -> bool {
        // SAFETY: `self` is a valid `DelayedWork` (a reference), so the
        // pointer is aligned and not dangling.
        let work = unsafe { DelayedWork::raw_as_work(self) };
        // SAFETY: `raw_as_work` returns a pointer to the `Work` of `self`.
        let work = unsafe { Work::raw_get(work) };
        // SAFETY: The `work_struct` of a `DelayedWork` is the `work` member
        // of its `struct delayed_work` (what `raw_as_work` points at).
        let dwork = unsafe { kernel::container_of!(work, bindings::delayed_work, work) };
        // SAFETY: `dwork` is the `struct delayed_work` of `self`,
        // initialised by `DelayedWork::new()`, the only way to make one, and
        // valid for the call (`self` is borrowed). Flushing an item that was
        // never enqueued, or is idle, returns at once.
        unsafe { bindings::flush_delayed_work(dwork) }
    }
}
// out of tree: end
