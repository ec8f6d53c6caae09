// SPDX-License-Identifier: GPL-2.0

//! Completion events of CQs, delivered from any context.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! A device raises an interrupt when a CQ that asked for it has new
//! completions; the driver's handler finds the CQ by the number the device
//! gives and calls the handler the core installed in the CQ (for user CQs,
//! the one that wakes the completion channel). [`CompletionTable`] is that
//! lookup: the CQs of a device that take events, by number. Which table a
//! CQ goes into, under which number, and what the interrupt handler does
//! with events for numbers it does not know is the driver's policy; that
//! the table never holds a CQ that is gone is the layer's guarantee: a CQ
//! enters the table when its creation succeeds ([`CompletionEvents`],
//! returned by the driver's `create`) and leaves it when it is destroyed,
//! before the driver's `destroy` runs, both under the table's lock, which
//! [`CompletionTable::notify`] holds while it calls the handler.
//!
//! A number can be in the table once. A device that gives out a number
//! still in use is refused the second CQ (`EBUSY`, the layer then destroys
//! it again): the CQ that has the number keeps its events, and destroying
//! either CQ never takes the other's entry away.

use super::bindings;
use core::ptr::NonNull;
use kernel::{
    c_str,
    prelude::*,
    rbtree::{
        RBTree,
        RBTreeNodeReservation, //
    },
    static_lock_class,
    sync::{
        Arc,
        SpinLockIrq, //
    }, //
};

/// A CQ in a table.
///
/// # Invariants
///
/// Points to a live `ib_cq` whose creation succeeded, with `comp_handler`
/// and `cq_context` set by the core, for as long as it is in a table.
struct TableCq(NonNull<bindings::ib_cq>);

// SAFETY: The pointer is dereferenced only under the table's lock while the
// CQ is in the table, where it is alive (type invariant); the core's
// completion handler may be called from any context.
unsafe impl Send for TableCq {}

/// The CQs of a device that take completion events, by the device's number
/// for them.
#[pin_data]
pub(crate) struct CompletionTable {
    #[pin]
    cqs: SpinLockIrq<RBTree<u32, TableCq>>,
}

/// The name of the table's lock class, a static so that it is this crate's.
/// The initialiser runs in the driver's code (it is generic), where a
/// literal would be the driver module's data: in tree, where the class is
/// the kernel's, each load of the module gave the kernel's class another
/// name, and lockdep warned at the first lock after a reload.
static CQS_LOCK_NAME: &CStr = c_str!("CompletionTable::cqs");

impl CompletionTable {
    /// An empty table.
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            cqs <- SpinLockIrq::new(RBTree::new(), CQS_LOCK_NAME, static_lock_class!()),
        })
    }

    /// Delivers a completion event to the CQ with number `key`, from any
    /// context. Returns `false` if there is none: the CQ is gone, or never
    /// asked for events.
    pub(crate) fn notify(&self, key: u32) -> bool {
        let cqs = self.cqs.lock();
        let Some(cq) = cqs.get(&key) else {
            return false;
        };
        let cq = cq.0.as_ptr();
        // SAFETY: A CQ in the table is alive (the invariant of `TableCq`): it
        // leaves the table, under this lock, before it is destroyed. The core
        // set `comp_handler` and `cq_context` before creating it and does not
        // change them.
        unsafe {
            if let Some(handler) = (*cq).comp_handler {
                handler(cq, (*cq).cq_context);
            }
        }
        true
    }
}

/// Where a new CQ's completion events come from: the table to put it in and
/// its number there. The driver's `create` returns it for a CQ that takes
/// events.
pub(crate) struct CompletionEvents {
    table: Arc<CompletionTable>,
    key: u32,
}

impl CompletionEvents {
    /// Events for number `key` of `table`.
    pub(crate) fn new(table: Arc<CompletionTable>, key: u32) -> Self {
        Self { table, key }
    }
}

/// Room for one CQ in a [`CompletionTable`].
pub(super) struct Reservation(RBTreeNodeReservation<u32, TableCq>);

/// A CQ's place in a table, held by the layer's part of the CQ.
///
/// # Invariants
///
/// `cq` is in `table` under `key`, and stays alive until this is dropped.
pub(super) struct Registered {
    table: Arc<CompletionTable>,
    key: u32,
    cq: NonNull<bindings::ib_cq>,
}

impl Registered {
    /// Room for a CQ in a table, allocated before the CQ exists on the
    /// device, so that [`Registered::insert`] cannot run out of memory.
    pub(super) fn reserve() -> Result<Reservation> {
        Ok(Reservation(RBTreeNodeReservation::new(GFP_KERNEL)?))
    }

    /// Puts `cq` into the table `events` names, in `room`; `EBUSY` if its
    /// number is taken.
    ///
    /// # Safety
    ///
    /// `cq` is a CQ whose creation succeeded (the core set its handler), and
    /// it stays alive until the returned value is dropped.
    pub(super) unsafe fn insert(
        events: CompletionEvents,
        cq: NonNull<bindings::ib_cq>,
        room: Reservation,
    ) -> Result<Self> {
        let CompletionEvents { table, key } = events;
        let mut cqs = table.cqs.lock();
        if cqs.get(&key).is_some() {
            return Err(EBUSY);
        }
        // INVARIANT: `cq` is alive per the safety requirements, and in the
        // table from here on.
        cqs.insert(room.0.into_node(key, TableCq(cq)));
        drop(cqs);
        Ok(Self { table, key, cq })
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut cqs = self.table.cqs.lock();
        // Only the entry of this CQ: a number is never in the table twice.
        if cqs.get(&self.key).map(|c| c.0) == Some(self.cq) {
            drop(cqs.remove_node(&self.key));
        }
    }
}

// SAFETY: The CQ pointer is only compared, never dereferenced; the table is
// shared through an `Arc` and locked for every access.
unsafe impl Send for Registered {}
// SAFETY: Shared references give no access.
unsafe impl Sync for Registered {}

#[kunit_tests(refa_rdma_completion)]
mod tests {
    use super::*;
    use kernel::sync::atomic::{
        ordering::Relaxed,
        Atomic, //
    };

    /// Counts the events of a test CQ (its `cq_context`).
    ///
    /// # Safety
    ///
    /// `context` points to a live counter.
    unsafe extern "C" fn count(_cq: *mut bindings::ib_cq, context: *mut kernel::ffi::c_void) {
        // SAFETY: The tests set `cq_context` to a live counter.
        unsafe { &*context.cast::<Atomic<u32>>() }.add(1, Relaxed);
    }

    /// A zeroed CQ whose handler counts in `events`.
    fn test_cq(events: &Atomic<u32>) -> Result<KBox<bindings::ib_cq>> {
        let mut cq = KBox::new(bindings::ib_cq::default(), GFP_KERNEL)?;
        cq.comp_handler = Some(count);
        cq.cq_context = core::ptr::from_ref(events).cast_mut().cast();
        Ok(cq)
    }

    /// A number the device gives out twice is refused the second time: the
    /// CQ that has it keeps its events, also after the second CQ is gone.
    #[test]
    fn a_cq_number_in_use_is_refused() -> Result {
        let table = Arc::pin_init(CompletionTable::new(), GFP_KERNEL)?;
        let (first_events, second_events) = (Atomic::new(0u32), Atomic::new(0u32));
        let mut first = test_cq(&first_events)?;
        let mut second = test_cq(&second_events)?;
        let cq = |cq: &mut KBox<bindings::ib_cq>| NonNull::from(&mut **cq);

        let events = CompletionEvents::new(table.clone(), 7);
        // SAFETY: The CQ lives until the end of the test, after the
        // registration.
        let live = unsafe { Registered::insert(events, cq(&mut first), Registered::reserve()?) }?;
        let events = CompletionEvents::new(table.clone(), 7);
        // SAFETY: As above.
        let stale = unsafe { Registered::insert(events, cq(&mut second), Registered::reserve()?) };
        assert_eq!(stale.err(), Some(EBUSY));

        assert!(table.notify(7));
        assert_eq!(first_events.load(Relaxed), 1);
        assert_eq!(second_events.load(Relaxed), 0);
        assert!(!table.notify(8));

        drop(live);
        assert!(!table.notify(7));
        assert_eq!(first_events.load(Relaxed), 1);
        Ok(())
    }
}
