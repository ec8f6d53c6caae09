// SPDX-License-Identifier: GPL-2.0

//! How long an object lives on the device, which is not always how long
//! its verbs object lives.
//!
//! A QP's send queue (its LLQ) is device memory that userspace maps and
//! writes descriptors to. When the QP is destroyed, the RDMA core removes
//! the mapping's cookie but leaves mappings that exist in place
//! (`rdma_user_mmap_entry_remove()` does not zap VMAs, and 7.3 offers a
//! driver no way to zap one entry's). If the device then gave those pages
//! to the next QP, a process that kept its mapping could write into the
//! send queue of another process. So a QP stays on the device, stopped,
//! until the last mapping of its LLQ is gone, as mlx5 keeps a UAR until
//! `mmap_free`.
//!
//! That outliving cascades: the device refuses to destroy a PD, a CQ or a
//! UAR that a QP still uses (and a UAR that a CQ uses), while userspace
//! must see every destroy succeed as it does today. So each UAR, PD, CQ
//! and QP the device created is recorded here with a count of its users:
//! the verbs object that created it, every object on the device that uses
//! it, and, for a QP, the mapping of its send queue. When the count drops
//! to zero the destroy command goes to the device; then the memory the
//! device used for the object is freed (or, if the device refuses the
//! destroy, kept until it is reset); then the objects it used each lose a
//! user.
//!
//! When nothing keeps a mapping, the count drops to zero at the verbs
//! destroy, which sends the same commands in the same order as before: no
//! command is added, only a record per object.

use super::Core;
use crate::{
    rdma::cgroup::HcaCharge, //
};
// out of tree: begin
use crate::kernel_gaps::ratelimit::dev_err_ratelimited;
// out of tree: end
use kernel::{
    new_mutex,
    page::PAGE_SIZE,
    prelude::*,
    rbtree::{
        RBTree,
        RBTreeNodeReservation, //
    },
    sync::Mutex, //
};

/// An object the device created, by kind and number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ObjectId {
    /// A user access region (doorbell page).
    Uar(u16),
    /// A protection domain.
    Pd(u16),
    /// A completion queue.
    Cq(u16),
    /// A queue pair, by its device handle.
    Qp(u32),
}

impl ObjectId {
    /// What the object is called in messages.
    fn kind(self) -> &'static str {
        match self {
            Self::Uar(_) => "UAR",
            Self::Pd(_) => "PD",
            Self::Cq(_) => "CQ",
            Self::Qp(_) => "QP",
        }
    }

    /// What its destroy command does, in messages (the admin commands'
    /// names: DEALLOC_UAR, DEALLOC_PD, DESTROY_CQ, DESTROY_QP).
    fn destroy_verb(self) -> &'static str {
        match self {
            Self::Uar(_) | Self::Pd(_) => "freeing",
            Self::Cq(_) | Self::Qp(_) => "destroying",
        }
    }
}

/// The most objects one object uses: a QP's PD, send CQ, receive CQ and
/// UAR.
const MAX_USES: usize = 4;

/// What is known of a recorded object.
struct Record {
    /// Holders of the object; it is destroyed when the last one goes.
    users: u32,
    /// The rdma cgroup charge of an object kept on the device after its
    /// verbs object was destroyed (see [`Core::charge_kept`]); uncharged
    /// when the device destroyed it.
    charge: Option<HcaCharge>,
    /// Memory the device uses for the object (a ring): freed once the
    /// device destroyed it.
    memory: Option<KBox<dyn Send>>,
    /// The recorded objects it holds a use of.
    uses: [Option<ObjectId>; MAX_USES],
    /// For a UAR: the page of its doorbells, from the first the device
    /// placed; every later one must be there ([`Core::claim_pages`]).
    doorbells: Option<u64>,
}

/// Whose a page of device memory handed to userspace is.
///
/// The device says where doorbells and send queues are; userspace maps the
/// pages. A device that places them wrongly (a doorbell in another UAR's
/// page, a send queue over another QP's or over doorbells) would give one
/// process another's queues, so each page is recorded with its owner
/// while the owner lives on the device, and a second owner is refused.
///
/// A UAR is one page of doorbells (the unit the C driver and rdma-core map
/// for a context, and the kernel's isolation unit): the page of the first
/// doorbell the device places for a UAR is that UAR's, and a doorbell of
/// it anywhere else is refused, so that a UAR never collects a page the
/// device meant for another (issue 31). The EFA interface names no page
/// for a UAR (ALLOC_UAR answers a number, CREATE_CQ and CREATE_QP the
/// doorbells' offsets), so the first doorbell decides; a page is never
/// two UARs', so whichever of two contexts the device misplaced, neither
/// maps the other's doorbells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PageOwner {
    /// The doorbell page of a UAR (its CQs' and QPs' doorbells).
    Doorbells(u16),
    /// The send queue (LLQ) of a QP, by its device handle.
    SendQueue(u32),
}

/// A page's owner, and whether the owner is being destroyed.
///
/// Once an object's last holder is gone nothing maps its pages, and the
/// device may give them to the next object as soon as it has executed the
/// destroy, which can be before the destroy's caller sees the completion
/// (another process's create, on another thread): so the pages of an
/// object being destroyed are free for a new owner from the moment the
/// command is sent. Should the destroy fail, the device keeps the object
/// on them, and they go back to it unless a new owner took them.
#[derive(Clone, Copy, Debug)]
struct Claim {
    owner: PageOwner,
    releasing: bool,
}

/// The recorded objects of a device.
#[pin_data(PinnedDrop)]
pub(crate) struct Lifetimes {
    #[pin]
    records: Mutex<RBTree<ObjectId, Record>>,
    /// Pages of device memory handed to userspace, by physical address.
    #[pin]
    pages: Mutex<RBTree<u64, Claim>>,
}

impl Lifetimes {
    pub(super) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            records <- new_mutex!(RBTree::new(), "refa_lifetimes"),
            pages <- new_mutex!(RBTree::new(), "refa_bar_pages"),
        })
    }
}

#[pinned_drop]
impl PinnedDrop for Lifetimes {
    fn drop(self: Pin<&mut Self>) {
        // Every holder releases before the device goes (the RDMA core
        // destroys all user objects and frees all mmap entries while it
        // unregisters the device): a record left is a missed release.
        let left = self.records.lock().iter().count();
        kernel::warn_on!(left != 0);
    }
}

/// Room for the record of an object the device is about to create, with
/// the memory it will use: reserved first, so that recording cannot fail
/// once the device has the object.
pub(crate) struct RecordSlot {
    node: RBTreeNodeReservation<ObjectId, Record>,
    memory: Option<KBox<dyn Send>>,
}

impl RecordSlot {
    /// A slot for an object the device uses `memory` for.
    pub(crate) fn new<M: Send + 'static>(memory: Option<M>) -> Result<Self> {
        let memory = match memory {
            Some(m) => {
                let boxed: KBox<dyn Send> = KBox::new(m, GFP_KERNEL)?;
                Some(boxed)
            }
            None => None,
        };
        Ok(Self {
            node: RBTreeNodeReservation::new(GFP_KERNEL)?,
            memory,
        })
    }
}

impl Core<'_> {
    /// Records `id`, which the device just created, with one holder (its
    /// creator) and a use of each object of `uses`; gives back `id`. A
    /// device that hands out a number already recorded (live) gets `EIO`:
    /// the new object is left to the device, its memory kept until reset.
    ///
    /// Objects of `uses` that are not recorded are skipped (the device
    /// created `id` with them, so they exist there; not recording them
    /// would be a driver bug, reported once).
    pub(crate) fn record(
        &self,
        slot: RecordSlot,
        id: ObjectId,
        uses: &[ObjectId],
    ) -> Result<ObjectId> {
        let mut records = self.lifetimes.records.lock();
        if records.get(&id).is_some() {
            // The device gave out a number it had not taken back: the new
            // object cannot be told from the live one, and destroying it by
            // that number would destroy the live one. Refuse it; the device
            // keeps it (and may use its memory) until it is reset.
            drop(records);
            dev_err_ratelimited!(
                self.dev(),
                "the device gave out {} {:#x} again while it was in use; refused\n",
                id.kind(),
                match id {
                    ObjectId::Uar(n) | ObjectId::Pd(n) | ObjectId::Cq(n) => u32::from(n),
                    ObjectId::Qp(n) => n,
                }
            );
            if let Some(memory) = slot.memory {
                self.keep_until_reset(memory);
            }
            return Err(EIO);
        }
        let mut held = [None; MAX_USES];
        for (used, held) in uses.iter().zip(held.iter_mut()) {
            match records.get_mut(used) {
                Some(r) => {
                    r.users += 1;
                    *held = Some(*used);
                }
                None => {
                    kernel::warn_on!(true);
                }
            }
        }
        kernel::warn_on!(uses.len() > MAX_USES);
        let record = Record {
            users: 1,
            charge: None,
            memory: slot.memory,
            uses: held,
            doorbells: None,
        };
        // Not there, checked above under the same lock.
        let _ = records.insert(slot.node.into_node(id, record));
        Ok(id)
    }

    /// One more holder of `id`, which must be recorded (a holder keeps it
    /// so).
    pub(crate) fn hold(&self, id: ObjectId) {
        match self.lifetimes.records.lock().get_mut(&id) {
            Some(r) => r.users += 1,
            None => {
                kernel::warn_on!(true);
            }
        }
    }

    /// Gives `id`, whose verbs object is about to be destroyed, the rdma
    /// cgroup charge it keeps for as long as it outlives that on the
    /// device: dropped when the device destroyed it, at once if nothing
    /// keeps it.
    ///
    /// The core uncharges an object when its verbs destroy succeeds; a QP
    /// kept because userspace still maps its send queue (and the PD, CQs
    /// and UAR such a QP uses, when those are destroyed in turn) would
    /// otherwise cost the cgroup nothing, and one process could keep any
    /// number of them (issue 31).
    pub(crate) fn charge_kept(&self, id: ObjectId, charge: HcaCharge) {
        if let Some(r) = self.lifetimes.records.lock().get_mut(&id) {
            r.charge = Some(charge);
        }
    }

    /// How many hold `id` (0 if it is not recorded).
    pub(crate) fn holders(&self, id: ObjectId) -> u32 {
        self.lifetimes
            .records
            .lock()
            .get(&id)
            .map_or(0, |r| r.users)
    }

    /// A holder of `id` lets go; the last one destroys it on the device,
    /// frees its memory and lets go of what it used.
    ///
    /// May sleep (admin commands). Called from `mmap_free` too, which the
    /// RDMA core may run with the mm's lock held: nothing here takes that
    /// lock or touches user memory, and the record lock is not held across
    /// the command.
    pub(crate) fn release(&self, id: ObjectId) {
        let record = {
            let mut records = self.lifetimes.records.lock();
            let Some(r) = records.get_mut(&id) else {
                kernel::warn_on!(true);
                return;
            };
            r.users -= 1;
            if r.users > 0 {
                return;
            }
            records.remove(&id)
        };
        let Some(record) = record else {
            return;
        };
        self.destroy_object(id, record.memory);
        // The device no longer has it (or keeps its memory until reset,
        // which is the driver's, not the cgroup's): uncharged.
        drop(record.charge);
        // At most three levels (QP, CQ, UAR).
        for used in record.uses.into_iter().flatten() {
            self.release(used);
        }
    }

    /// Records `count` pages of device memory from physical address
    /// `first` as `owner`'s, which the device just placed there. `EIO`
    /// (nothing recorded) if one of them is another owner's: the device
    /// put one object's queue or doorbells on another's.
    pub(crate) fn claim_pages(&self, first: u64, count: u64, owner: PageOwner) -> Result {
        let page = PAGE_SIZE as u64;
        // A UAR's doorbells share one page (see `PageOwner`); its record
        // says which once it has one. Lock order: records, then pages.
        let mut records = self.lifetimes.records.lock();
        if let PageOwner::Doorbells(uar) = owner {
            let theirs = records.get(&ObjectId::Uar(uar)).and_then(|r| r.doorbells);
            if let Some(at) = theirs.filter(|&at| at != first || count != 1) {
                drop(records);
                dev_err_ratelimited!(
                    self.dev(),
                    "the device placed a doorbell of UAR {} on page {:#x}, its doorbells are on {:#x}; refused\n",
                    uar,
                    first,
                    at
                );
                return Err(EIO);
            }
        }
        let mut pages = self.lifetimes.pages.lock();
        for i in 0..count {
            let at = first + i * page;
            match pages.get(&at) {
                Some(&Claim {
                    owner: o,
                    releasing: false,
                }) if o != owner || matches!(owner, PageOwner::SendQueue(_)) => {
                    drop(pages);
                    drop(records);
                    dev_err_ratelimited!(
                        self.dev(),
                        "the device placed {:?} on page {:#x}, which is {:?}'s; refused\n",
                        owner,
                        at,
                        o
                    );
                    return Err(EIO);
                }
                _ => {}
            }
        }
        let claim = Claim {
            owner,
            releasing: false,
        };
        for i in 0..count {
            let at = first + i * page;
            match pages.get_mut(&at) {
                // The page of an object being destroyed: free.
                Some(c) if c.releasing => *c = claim,
                // A doorbell page of this UAR.
                Some(_) => {}
                None => {
                    if let Err(e) = pages.try_create_and_insert(at, claim, GFP_KERNEL) {
                        // A send queue's pages were all its own: take them
                        // back (those of an object being destroyed were free).
                        if let PageOwner::SendQueue(_) = owner {
                            for j in 0..i {
                                pages.remove(&(first + j * page));
                            }
                        }
                        return Err(e);
                    }
                }
            }
        }
        if let PageOwner::Doorbells(uar) = owner {
            if let Some(r) = records.get_mut(&ObjectId::Uar(uar)) {
                r.doorbells.get_or_insert(first);
            }
        }
        Ok(())
    }

    /// Marks the pages of `owner` as being released (`releasing`): nobody
    /// maps them any more and its destroy is about to be sent, so they are
    /// free for a new owner (see [`Claim`]); or, when the device refused the
    /// destroy, as its own again. Allocates nothing.
    fn releasing_pages(&self, owner: PageOwner, releasing: bool) {
        let mut pages = self.lifetimes.pages.lock();
        let mut cursor = pages.cursor_front_mut();
        while let Some(mut c) = cursor {
            let (_, claim) = c.current_mut();
            if claim.owner == owner {
                claim.releasing = releasing;
            }
            cursor = c.move_next();
        }
    }

    /// The pages of `owner`, which the device no longer has, are free; the
    /// ones a new owner took meanwhile are the new owner's.
    ///
    /// Nothing here may allocate: pages left claimed by an object the device
    /// no longer has would make refa refuse the next object the device puts
    /// on them (`tests/vm/refa-failalloc` found it with a failing slab
    /// allocation in destroy_qp).
    fn release_pages(&self, owner: PageOwner) {
        let mut pages = self.lifetimes.pages.lock();
        let mut cursor = pages.cursor_front_mut();
        while let Some(c) = cursor {
            let (at, claim) = {
                let (at, claim) = c.current();
                (*at, *claim)
            };
            if claim.owner != owner {
                cursor = c.move_next();
                continue;
            }
            // Past the last node the cursor goes back to one already seen.
            let (next, _freed) = c.remove_current();
            cursor = next.filter(|n| *n.current().0 > at);
        }
    }

    /// Sends the destroy command of `id`; if the device refuses, it may
    /// still use `memory`, which is then kept until the device is reset.
    fn destroy_object(&self, id: ObjectId, memory: Option<KBox<dyn Send>>) {
        let pages = match id {
            ObjectId::Uar(uar) => Some(PageOwner::Doorbells(uar)),
            ObjectId::Qp(qp) => Some(PageOwner::SendQueue(qp)),
            _ => None,
        };
        if let Some(owner) = pages {
            self.releasing_pages(owner, true);
        }
        let result = match id {
            ObjectId::Uar(uar) => self.dealloc_uar(uar),
            ObjectId::Pd(pd) => self.dealloc_pd(pd),
            ObjectId::Cq(cq) => self.destroy_cq(cq),
            ObjectId::Qp(qp) => self.destroy_qp(qp),
        };
        // Pages the device took back may go to another object; those of an
        // object it kept are its own again.
        match (pages, &result) {
            (Some(owner), Ok(())) => self.release_pages(owner),
            (Some(owner), Err(_)) => self.releasing_pages(owner, false),
            _ => {}
        }
        if let Err(e) = result {
            let kept = if memory.is_some() {
                "; keeping its memory until the device is reset"
            } else {
                ""
            };
            match id {
                ObjectId::Uar(n) | ObjectId::Pd(n) | ObjectId::Cq(n) => dev_err_ratelimited!(
                    self.dev(),
                    "{} {} {} failed ({}){}\n",
                    id.destroy_verb(),
                    id.kind(),
                    n,
                    e.to_errno(),
                    kept
                ),
                ObjectId::Qp(n) => dev_err_ratelimited!(
                    self.dev(),
                    "{} {} {:#x} failed ({}){}\n",
                    id.destroy_verb(),
                    id.kind(),
                    n,
                    e.to_errno(),
                    kept
                ),
            }
            if let Some(memory) = memory {
                self.keep_until_reset(memory);
            }
        }
    }
}
