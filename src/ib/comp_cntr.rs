// SPDX-License-Identifier: GPL-2.0

//! Completion counters.
//!
//! A completion counter is two event counters of the device: one counts
//! completions, the other failures. The device keeps each value in eight
//! bytes of user memory that userspace named in the creation call
//! (efa-abi.h's `EFA_IB_ATTR_CREATE_COMP_CNTR_*_BUFFER`) and reads there;
//! the memory stays pinned while the device may write to it.
//!
//! Attaching the counter to a QP for a set of verbs operations attaches
//! both event counters to the QP's device events: a send, receive, RDMA
//! read or RDMA write has an event for its completion and one for its
//! failure; RDMA reads and writes by remote peers only have the former.

use super::{
    data::VerbsData,
    qp::QpData,
    uapi::{
        EFA_IB_ATTR_CREATE_COMP_CNTR_COMP_BUFFER as COMP_BUFFER,
        EFA_IB_ATTR_CREATE_COMP_CNTR_ERR_BUFFER as ERR_BUFFER, //
    },
    ucontext::UContextData,
    RdmaDriver, //
};
use crate::{
    dev::features::DeviceAttrs,
    hw::admin::{
        DeviceAttr as HwDeviceAttr,
        EventCounterAttachQpEvents as Events,
        EventCounterModifyOp, //
    },
    rdma::{
        comp_cntr::{
            CompCntr,
            CompCntrCaps,
            CompCntrEntry,
            CompCntrModifyOp,
            DriverCompCntr,
            QpCounterOp,
            QpCounterOps, //
        },
        device::{
            kind,
            Device,
            DriverObject, //
        },
        qp::Qp,
        ucontext::UContext,
        udata::{
            AttrId,
            UData, //
        },
        umem::{
            Access,
            Umem, //
        }, //
    }, //
};
// out of tree: begin
use crate::kernel_gaps::ratelimit::dev_err_ratelimited;
// out of tree: end
use kernel::prelude::*;

/// Bytes of a counter's value in memory.
const VALUE_SIZE: usize = core::mem::size_of::<u64>();

/// The driver's part of a completion counter.
pub(crate) struct CompCntrData {
    completions: EventCounter,
    errors: EventCounter,
}

impl DriverObject for CompCntrData {
    type Driver = RdmaDriver;
    type Kind = kind::CompCntr;
}

#[vtable]
impl DriverCompCntr for CompCntrData {
    fn caps<'a>(_dev: &Device<RdmaDriver>, data: &VerbsData<'a>) -> Result<CompCntrCaps> {
        caps(&data.attrs).ok_or(EOPNOTSUPP)
    }

    fn create<'a>(
        _dev: &Device<RdmaDriver>,
        data: &VerbsData<'a>,
        ctx: &UContext<UContextData>,
        udata: &mut UData<'_>,
    ) -> Result<Self> {
        create(data, ctx, udata)
    }

    fn destroy<'a>(cc: Self, _dev: &Device<RdmaDriver>, data: &VerbsData<'a>) {
        data.release_event_counter(cc.completions);
        data.release_event_counter(cc.errors);
    }

    fn modify<'a>(
        cc: &CompCntr<Self>,
        _dev: &Device<RdmaDriver>,
        data: &VerbsData<'a>,
        entry: CompCntrEntry,
        op: CompCntrModifyOp,
        value: u64,
    ) -> Result {
        modify(data, &cc.data(), entry, op, value)
    }

    fn attach<'a>(
        cc: &CompCntr<Self>,
        qp: &Qp<QpData>,
        _dev: &Device<RdmaDriver>,
        data: &VerbsData<'a>,
        ops: QpCounterOps,
    ) -> Result {
        attach(data, qp, &cc.data(), ops)
    }
}

/// An event counter of the device and the memory it writes its value to.
struct EventCounter {
    handle: u32,
    memory: Umem,
}

/// Each verbs operation with its completion and failure events; remote
/// operations fail on the peer that issued them, so they have no failure
/// event here.
const OP_EVENTS: [(QpCounterOp, u32, u32); 6] = [
    (
        QpCounterOp::Send,
        Events::SEND_COMP.mask(),
        Events::SEND_COMP_ERR.mask(),
    ),
    (
        QpCounterOp::Recv,
        Events::RECV_COMP.mask(),
        Events::RECV_COMP_ERR.mask(),
    ),
    (
        QpCounterOp::RdmaRead,
        Events::READ_COMP.mask(),
        Events::READ_COMP_ERR.mask(),
    ),
    (
        QpCounterOp::RdmaWrite,
        Events::WRITE_COMP.mask(),
        Events::WRITE_COMP_ERR.mask(),
    ),
    (
        QpCounterOp::RemoteRdmaRead,
        Events::REMOTE_READ_COMP.mask(),
        0,
    ),
    (
        QpCounterOp::RemoteRdmaWrite,
        Events::REMOTE_WRITE_COMP.mask(),
        0,
    ),
];

/// The device events of `ops`: (completion events, failure events).
fn events_of(ops: QpCounterOps) -> (u32, u32) {
    OP_EVENTS
        .iter()
        .filter(|(op, _, _)| ops.contains(*op))
        .fold((0, 0), |(comp, err), (_, c, e)| (comp | c, err | e))
}

/// The operations a device counting `events` (a `QUEUE_ATTR_2` event
/// mask) can count: those whose completion and failure events it has.
fn ops_of(events: u32) -> QpCounterOps {
    OP_EVENTS
        .iter()
        .filter(|(_, c, e)| events & (c | e) == c | e)
        .fold(QpCounterOps::empty(), |ops, (op, _, _)| ops | *op)
}

/// What a device with `attrs` offers of completion counters, if anything:
/// it needs event counters, two per completion counter.
pub(super) fn caps(attrs: &DeviceAttrs) -> Option<CompCntrCaps> {
    let q = attrs.queues_ex?;
    let caps = CompCntrCaps {
        max_counters: q.max_event_counters / 2,
        max_value: q.event_counter_max_val,
        qp_ops: ops_of(q.supported_event_counter_qp_events),
    };
    (attrs.has_cap(HwDeviceAttr::EVENT_COUNTERS) && caps.max_counters > 0).then_some(caps)
}

impl VerbsData<'_> {
    /// Creates an event counter of UAR `uar` writing to `memory`. On
    /// failure the memory is released, unless the device may have the
    /// counter after all (a command it was left with: see
    /// [`crate::dev::Core::exec_with`]).
    fn new_event_counter(&self, uar: u16, memory: Umem) -> Result<EventCounter> {
        let addr = memory.start_dma_address();
        let (handle, memory) = self.core.create_event_counter(uar, addr, memory)?;
        Ok(EventCounter { handle, memory })
    }

    /// Destroys an event counter; its memory stays pinned until the device
    /// is reset if the device does not confirm.
    fn release_event_counter(&self, counter: EventCounter) {
        if let Err(e) = self.core.destroy_event_counter(counter.handle) {
            dev_err_ratelimited!(
                self.core.dev(),
                "destroying event counter {:#x} failed ({}); its memory stays pinned until the device is reset\n",
                counter.handle,
                e.to_errno()
            );
            self.core.keep_until_reset(counter.memory);
        }
    }
}

fn create(
    dev: &VerbsData<'_>,
    ctx: &UContext<UContextData>,
    udata: &mut UData<'_>,
) -> Result<CompCntrData> {
    caps(&dev.attrs).ok_or(EOPNOTSUPP)?;
    let uar = ctx.data().uar;
    let write = Access::LocalWrite.into();
    let comp_memory = Umem::from_buffer_attr(udata, AttrId::new(COMP_BUFFER)?, VALUE_SIZE, write)?;
    let err_memory = Umem::from_buffer_attr(udata, AttrId::new(ERR_BUFFER)?, VALUE_SIZE, write)?;
    // The device writes whole values.
    let aligned = |m: &Umem| m.start_dma_address() % VALUE_SIZE as u64 == 0;
    if !aligned(&comp_memory) || !aligned(&err_memory) {
        dev_dbg!(
            dev.core.dev(),
            "completion counter memory is not 8-byte aligned\n"
        );
        return Err(EINVAL);
    }
    let completions = dev.new_event_counter(uar, comp_memory)?;
    match dev.new_event_counter(uar, err_memory) {
        Ok(errors) => Ok(CompCntrData {
            completions,
            errors,
        }),
        Err(e) => {
            dev.release_event_counter(completions);
            Err(e)
        }
    }
}

fn modify(
    dev: &VerbsData<'_>,
    cc: &CompCntrData,
    entry: CompCntrEntry,
    op: CompCntrModifyOp,
    value: u64,
) -> Result {
    let handle = match entry {
        CompCntrEntry::Completions => cc.completions.handle,
        CompCntrEntry::Errors => cc.errors.handle,
    };
    let op = match op {
        CompCntrModifyOp::Set => EventCounterModifyOp::Set,
        CompCntrModifyOp::Add => EventCounterModifyOp::Add,
    };
    dev.core.modify_event_counter(handle, op, value)
}

fn attach(dev: &VerbsData<'_>, qp: &Qp<QpData>, cc: &CompCntrData, ops: QpCounterOps) -> Result {
    let supported = caps(&dev.attrs).ok_or(EOPNOTSUPP)?.qp_ops;
    if !supported.contains_all(ops) {
        dev_dbg!(
            dev.core.dev(),
            "counting QP operations {:#x}, the device counts {:#x}\n",
            ops.bits(),
            supported.bits()
        );
        return Err(EOPNOTSUPP);
    }
    let qp_handle = qp.data().handle();
    let (comp_events, err_events) = events_of(ops);
    let core = &dev.core;
    core.attach_event_counter(cc.completions.handle, qp_handle, comp_events, true)?;
    if err_events == 0 {
        return Ok(());
    }
    let attached = core.attach_event_counter(cc.errors.handle, qp_handle, err_events, true);
    if attached.is_err() {
        // All or nothing: the core records no attachment.
        if let Err(e) =
            core.attach_event_counter(cc.completions.handle, qp_handle, comp_events, false)
        {
            dev_err_ratelimited!(
                core.dev(),
                "detaching event counter {:#x} from QP {} failed ({}); it counts until the QP goes\n",
                cc.completions.handle,
                qp_handle,
                e.to_errno()
            );
        }
    }
    attached
}

#[kunit_tests(refa_ib_comp_cntr)]
mod tests {
    use super::*;
    use crate::hw::{
        admin::QueueAttr2,
        wire::Wire, //
    };

    /// Every operation a counter can count (`0x3f`).
    fn all_ops() -> QpCounterOps {
        QpCounterOp::Send
            | QpCounterOp::Recv
            | QpCounterOp::RdmaRead
            | QpCounterOp::RdmaWrite
            | QpCounterOp::RemoteRdmaRead
            | QpCounterOp::RemoteRdmaWrite
    }

    #[test]
    fn operations_map_to_completion_and_failure_events() {
        assert_eq!(events_of(QpCounterOp::Send.into()), (0x1, 0x2));
        assert_eq!(events_of(QpCounterOp::Recv.into()), (0x4, 0x8));
        assert_eq!(
            events_of(QpCounterOp::RdmaRead | QpCounterOp::RdmaWrite),
            (0x10 | 0x40, 0x20 | 0x80)
        );
        // Remote operations fail on the peer: no failure event here.
        assert_eq!(
            events_of(QpCounterOp::RemoteRdmaRead | QpCounterOp::RemoteRdmaWrite),
            (0x100 | 0x200, 0)
        );
        assert_eq!(events_of(all_ops()), (0x355, 0xaa));
    }

    #[test]
    fn an_operation_needs_all_its_events() {
        assert_eq!(ops_of(0x3ff), all_ops());
        assert_eq!(ops_of(0), QpCounterOps::empty());
        // Completions of sends without their failures: sends are not
        // counted; receives are.
        assert_eq!(ops_of(0x1 | 0x4 | 0x8), QpCounterOp::Recv.into());
        assert_eq!(ops_of(0x100), QpCounterOp::RemoteRdmaRead.into());
    }

    #[test]
    fn counters_need_the_capability_and_two_event_counters() {
        let with = |device_caps: u32, max: u32| {
            let mut attrs = DeviceAttrs::with_device_caps(device_caps);
            attrs.queues_ex = Some(QueueAttr2 {
                supported_event_counter_qp_events: 0x3ff,
                max_event_counters: max,
                event_counter_max_val: u64::MAX,
                ..QueueAttr2::ZERO
            });
            caps(&attrs)
        };
        let cap = HwDeviceAttr::EVENT_COUNTERS.mask();
        assert_eq!(
            with(cap, 64),
            Some(CompCntrCaps {
                max_counters: 32,
                max_value: u64::MAX,
                qp_ops: all_ops(),
            })
        );
        assert_eq!(with(cap, 1), None);
        assert_eq!(with(0, 64), None);
        assert_eq!(caps(&DeviceAttrs::with_device_caps(cap)), None);
    }
}
