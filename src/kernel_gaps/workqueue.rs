// SPDX-License-Identifier: GPL-2.0

//! Waiting for a delayed work item: `flush_delayed_work()`, which 7.3's
//! `kernel::workqueue` does not offer.
//!
//! C header: [`include/linux/workqueue.h`](srctree/include/linux/workqueue.h)

use kernel::{
    bindings,
    workqueue::{
        HasDelayedWork,
        Work, //
    }, //
};

/// Runs the delayed work item `ID` of `this` at once if it is pending (its
/// timer is cut short), and waits until it has finished:
/// `flush_delayed_work()`. Returns whether there was anything to wait for.
///
/// Unlike a cancel, a flush runs the item, so the reference the queue
/// holds on `this` (an `Arc` enqueued leaks one until `run` takes it back)
/// is dropped by `run` as usual. The item is idle on return unless it was
/// queued again after the flush began: the caller must have stopped every
/// path that queues it first.
pub(crate) fn flush_delayed_work<T: HasDelayedWork<T, ID>, const ID: u64>(this: &T) -> bool {
    let ptr = core::ptr::from_ref(this).cast_mut();
    // SAFETY: `ptr` points at a valid `T` (it comes from a reference).
    let work = unsafe { T::raw_get_work(ptr) };
    // SAFETY: `raw_get_work` returns a pointer to the `Work` field of `*ptr`.
    let work = unsafe { Work::raw_get(work) };
    // SAFETY: `HasDelayedWork` promises that the `work_struct` of this
    // field is the `work` member of a `struct delayed_work` (a
    // `DelayedWork`, initialised by `DelayedWork::new`, the only way to
    // make one).
    let dwork = unsafe { kernel::container_of!(work, bindings::delayed_work, work) };
    // SAFETY: `dwork` is an initialised `struct delayed_work`, valid for
    // the call (`this` is borrowed); flushing one that was never queued, or
    // is idle, returns at once.
    unsafe { bindings::flush_delayed_work(dwork) }
}
