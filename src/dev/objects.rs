// SPDX-License-Identifier: GPL-2.0

//! Admin commands for address handles, memory regions and event counters.
//!
//! The device creates one address handle per (PD, destination GID) and
//! refuses a second CREATE_AH for the same pair; the verbs may create as
//! many as userspace asks for. [`AhCache`] counts the users of each handle,
//! as the C driver's AH cache does: the first user creates it on the
//! device, the last one destroys it. Commands for one pair are never in
//! flight at once; commands for different pairs are.

use super::{
    pbl::PageList,
    Core, //
};
use crate::hw::{
    admin::{
        AdminOpcode,
        AttachDetachEventCounterCmd,
        CreateAhCmd,
        CreateAhResp,
        CreateEventCounterCmd,
        CreateEventCounterResp,
        DeregMrCmd,
        DestroyAhCmd,
        DestroyEventCounterCmd,
        EventCounterAttachQpEvents,
        EventCounterAttachType,
        EventCounterModifyOp,
        ModifyEventCounterCmd,
        RegMrCmd,
        RegMrResp, //
    },
    wire::{
        Field,
        Wire, //
    }, //
};
use kernel::{
    new_condvar,
    new_mutex,
    prelude::*,
    rbtree::RBTree,
    sync::{
        CondVar,
        Mutex, //
    }, //
};

/// An address handle is known by its PD and destination GID.
type AhKey = (u16, [u8; 16]);

/// A handle the device has, or is creating or destroying.
#[derive(Clone, Copy)]
struct AhEntry {
    /// The device's number for it.
    ah: u16,
    /// Verbs AHs using it. Zero for a handle the device failed to destroy:
    /// the next user takes it over, the next last release retries.
    users: u32,
    /// A CREATE_AH or DESTROY_AH for it is in flight.
    busy: bool,
}

/// The address handles of a device, with their users.
#[pin_data]
pub(crate) struct AhCache {
    #[pin]
    entries: Mutex<RBTree<AhKey, AhEntry>>,
    /// Notified when a command for an entry completes.
    #[pin]
    settled: CondVar,
}

impl AhCache {
    pub(super) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            entries <- new_mutex!(RBTree::new(), "refa_ah_cache"),
            settled <- new_condvar!("refa_ah_settled"),
        })
    }
}

/// Keys and routing of a registered memory region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RegisteredMr {
    pub(crate) l_key: u32,
    pub(crate) r_key: u32,
    /// The interconnect of each path to the region, where the device says.
    pub(crate) recv_ic_id: Option<u8>,
    pub(crate) rdma_read_ic_id: Option<u8>,
    pub(crate) rdma_recv_ic_id: Option<u8>,
}

/// What REG_MR registers, apart from the page list.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrParams {
    pub(crate) pd: u16,
    /// I/O virtual address of the first byte.
    pub(crate) iova: u64,
    pub(crate) length: u64,
    /// log2 of the size of the pages listed.
    pub(crate) page_shift: u8,
    /// [`RegMrCmd::LOCAL_WRITE_ENABLE`] and the other permission bits.
    pub(crate) permissions: u8,
}

impl Core<'_> {
    /// Gets the address handle of `gid` in PD `pd`: creates it on the
    /// device for its first user, counts one more user otherwise.
    pub(crate) fn get_ah(&self, pd: u16, gid: [u8; 16]) -> Result<u16> {
        let key = (pd, gid);
        let cache = &self.ahs;
        let mut entries = cache.entries.lock();
        loop {
            match entries.get_mut(&key) {
                None => break,
                Some(e) if !e.busy => {
                    e.users = e.users.checked_add(1).ok_or(ENOMEM)?;
                    return Ok(e.ah);
                }
                Some(_) => cache.settled.wait(&mut entries),
            }
        }
        let busy = AhEntry {
            ah: 0,
            users: 0,
            busy: true,
        };
        entries.try_create_and_insert(key, busy, GFP_KERNEL)?;
        drop(entries);

        let cmd = CreateAhCmd {
            dest_addr: gid,
            pd,
            reserved: 0,
        };
        let created = self
            .exec(AdminOpcode::CreateAh, 0, &cmd)
            .map(|entry| entry.resp::<CreateAhResp>().ah);
        let mut entries = cache.entries.lock();
        match created {
            Ok(ah) => {
                if let Some(e) = entries.get_mut(&key) {
                    *e = AhEntry {
                        ah,
                        users: 1,
                        busy: false,
                    };
                }
            }
            Err(_) => drop(entries.remove(&key)),
        }
        drop(entries);
        cache.settled.notify_all();
        created
    }

    /// Drops a user of the address handle of `gid` in PD `pd`; the last
    /// one destroys it on the device. If that fails, the device keeps the
    /// handle and so does the cache, for the next user or the next try.
    pub(crate) fn put_ah(&self, pd: u16, gid: [u8; 16]) -> Result {
        let key = (pd, gid);
        let cache = &self.ahs;
        let mut entries = cache.entries.lock();
        let ah = loop {
            match entries.get_mut(&key) {
                None => return Err(EINVAL),
                Some(e) if e.busy => cache.settled.wait(&mut entries),
                Some(e) if e.users > 1 => {
                    e.users -= 1;
                    return Ok(());
                }
                Some(e) => {
                    e.busy = true;
                    break e.ah;
                }
            }
        };
        drop(entries);

        let cmd = DestroyAhCmd { ah, pd };
        let destroyed = self.exec(AdminOpcode::DestroyAh, 0, &cmd).map(|_| ());
        let mut entries = cache.entries.lock();
        match destroyed {
            Ok(()) => drop(entries.remove(&key)),
            Err(_) => {
                if let Some(e) = entries.get_mut(&key) {
                    e.users = 0;
                    e.busy = false;
                }
            }
        }
        drop(entries);
        cache.settled.notify_all();
        destroyed
    }

    /// Registers a memory region whose pages (of `1 << params.page_shift`
    /// bytes) `list` lists, which `memory` keeps (pinned user memory);
    /// gives `memory` back with the keys. Should the device be left with
    /// the command, the list and `memory` stay until it is reset: it may
    /// still read the one and, through a region it created late, write
    /// the other.
    pub(crate) fn reg_mr<M: Send + 'static>(
        &self,
        params: &MrParams,
        list: PageList,
        memory: M,
    ) -> Result<(RegisteredMr, M)> {
        let mut cmd = RegMrCmd {
            pd: params.pd,
            mr_length: params.length,
            flags: RegMrCmd::PHYS_PAGE_SIZE_SHIFT.prep(params.page_shift),
            permissions: params.permissions,
            iova: params.iova,
            // Redundant with the length and page size; the C driver leaves
            // it 0, so devices accept that.
            page_num: 0,
            ..RegMrCmd::ZERO
        };
        let flags = list.apply(&mut cmd);
        let (entry, (_list, memory)) =
            self.exec_with(AdminOpcode::RegMr, flags, &cmd, (list, memory))?;
        let resp = entry.resp::<RegMrResp>();
        let valid = |field: Field<u8>, id: u8| (field.get(resp.validity) != 0).then_some(id);
        let registered = RegisteredMr {
            l_key: resp.l_key,
            r_key: resp.r_key,
            recv_ic_id: valid(RegMrResp::RECV_IC_ID, resp.recv_ic_id),
            rdma_read_ic_id: valid(RegMrResp::RDMA_READ_IC_ID, resp.rdma_read_ic_id),
            rdma_recv_ic_id: valid(RegMrResp::RDMA_RECV_IC_ID, resp.rdma_recv_ic_id),
        };
        Ok((registered, memory))
    }

    /// Deregisters the memory region with local key `l_key`.
    pub(crate) fn dereg_mr(&self, l_key: u32) -> Result {
        let cmd = DeregMrCmd { l_key };
        self.exec(AdminOpcode::DeregMr, 0, &cmd).map(|_| ())
    }

    /// Creates an event counter of UAR `uar` whose value the device keeps
    /// in the eight bytes at DMA address `addr` (it writes 0 first), which
    /// `memory` keeps; returns its handle and `memory`. Should the device
    /// be left with the command, `memory` stays until it is reset.
    pub(crate) fn create_event_counter<M: Send + 'static>(
        &self,
        uar: u16,
        addr: u64,
        memory: M,
    ) -> Result<(u32, M)> {
        let cmd = CreateEventCounterCmd {
            uar,
            reserved: 0,
            paddr: addr,
        };
        let (entry, memory) = self.exec_with(AdminOpcode::CreateEventCounter, 0, &cmd, memory)?;
        Ok((entry.resp::<CreateEventCounterResp>().cntr_handle, memory))
    }

    /// Destroys event counter `handle`; the device writes its value no
    /// more once this succeeded.
    pub(crate) fn destroy_event_counter(&self, handle: u32) -> Result {
        let cmd = DestroyEventCounterCmd {
            cntr_handle: handle,
        };
        self.exec(AdminOpcode::DestroyEventCounter, 0, &cmd)
            .map(|_| ())
    }

    /// Makes event counter `handle` count `events`
    /// ([`EventCounterAttachQpEvents::SEND_COMP`] ...) of QP `qp_handle`
    /// (`attach`), or stop counting them.
    pub(crate) fn attach_event_counter(
        &self,
        handle: u32,
        qp_handle: u32,
        events: u32,
        attach: bool,
    ) -> Result {
        let mut cmd = AttachDetachEventCounterCmd {
            cntr_handle: handle,
            attach_type: EventCounterAttachType::QpEvents.raw(),
            ..AttachDetachEventCounterCmd::ZERO
        };
        cmd.set_qp_events(&EventCounterAttachQpEvents { qp_handle, events });
        let opcode = if attach {
            AdminOpcode::AttachEventCounter
        } else {
            AdminOpcode::DetachEventCounter
        };
        self.exec(opcode, 0, &cmd).map(|_| ())
    }

    /// Sets event counter `handle` to `value`, or adds `value` to it.
    pub(crate) fn modify_event_counter(
        &self,
        handle: u32,
        op: EventCounterModifyOp,
        value: u64,
    ) -> Result {
        let cmd = ModifyEventCounterCmd {
            cntr_handle: handle,
            operation: op.raw(),
            value,
            ..ModifyEventCounterCmd::ZERO
        };
        self.exec(AdminOpcode::ModifyEventCounter, 0, &cmd)
            .map(|_| ())
    }
}
