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
    IbDevice,
    RefaIb, //
};
use crate::{
    dev::features::DeviceAttrs,
    hw::admin::{
        DeviceAttr as HwDeviceAttr,
        EventCounterAttachQpEvents as Events,
        EventCounterModifyOp, //
    },
    kernel_gaps::ratelimit::dev_ratelimited,
    rdma::{
        bindings::{
            efa_comp_cntr_create_attrs_EFA_IB_ATTR_CREATE_COMP_CNTR_COMP_BUFFER as COMP_BUFFER,
            efa_comp_cntr_create_attrs_EFA_IB_ATTR_CREATE_COMP_CNTR_ERR_BUFFER as ERR_BUFFER,
        },
        comp_cntr::{
            CompCntrAttrs,
            CompCntrCaps,
            CompCntrEntry,
            CompCntrModifyOp,
            QpCounterOps, //
        },
        qp::Qp,
        ucontext::UContext,
        umem::{
            AccessFlags,
            Umem, //
        }, //
    }, //
};
use kernel::prelude::*;

/// Bytes of a counter's value in memory.
const VALUE_SIZE: usize = core::mem::size_of::<u64>();

/// The driver's part of a completion counter.
pub(crate) struct CompCntrData {
    completions: EventCounter,
    errors: EventCounter,
}

/// An event counter of the device and the memory it writes its value to.
struct EventCounter {
    handle: u32,
    memory: Umem,
}

/// Each verbs operation with its completion and failure events; remote
/// operations fail on the peer that issued them, so they have no failure
/// event here.
const OP_EVENTS: [(QpCounterOps, u32, u32); 6] = [
    (
        QpCounterOps::SEND,
        Events::SEND_COMP.mask(),
        Events::SEND_COMP_ERR.mask(),
    ),
    (
        QpCounterOps::RECV,
        Events::RECV_COMP.mask(),
        Events::RECV_COMP_ERR.mask(),
    ),
    (
        QpCounterOps::RDMA_READ,
        Events::READ_COMP.mask(),
        Events::READ_COMP_ERR.mask(),
    ),
    (
        QpCounterOps::RDMA_WRITE,
        Events::WRITE_COMP.mask(),
        Events::WRITE_COMP_ERR.mask(),
    ),
    (
        QpCounterOps::REMOTE_RDMA_READ,
        Events::REMOTE_READ_COMP.mask(),
        0,
    ),
    (
        QpCounterOps::REMOTE_RDMA_WRITE,
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

impl IbDevice<'_> {
    /// Creates an event counter of UAR `uar` writing to `memory`. On
    /// failure the memory is released, unless the device may have the
    /// counter after all (a command that timed out).
    fn new_event_counter(&self, uar: u16, memory: Umem) -> Result<EventCounter> {
        let addr = memory.start_dma_address();
        match self.core.create_event_counter(uar, addr) {
            Ok(handle) => Ok(EventCounter { handle, memory }),
            Err(e) => {
                if e == ETIMEDOUT {
                    self.core.keep_until_reset(memory);
                }
                Err(e)
            }
        }
    }

    /// Destroys an event counter; its memory stays pinned until the device
    /// is reset if the device does not confirm.
    fn release_event_counter(&self, counter: EventCounter) {
        if let Err(e) = self.core.destroy_event_counter(counter.handle) {
            dev_ratelimited!(
                dev_err,
                self.core.dev(),
                "destroying event counter {:#x} failed ({}); its memory stays pinned until the device is reset\n",
                counter.handle,
                e.to_errno()
            );
            self.core.keep_until_reset(counter.memory);
        }
    }
}

pub(super) fn query_caps(dev: &IbDevice<'_>) -> Result<CompCntrCaps> {
    caps(&dev.attrs).ok_or(EOPNOTSUPP)
}

pub(super) fn create(
    dev: &IbDevice<'_>,
    ctx: &UContext<RefaIb>,
    attrs: &CompCntrAttrs<'_>,
) -> Result<CompCntrData> {
    caps(&dev.attrs).ok_or(EOPNOTSUPP)?;
    let uar = ctx.data().uar;
    let comp_memory = attrs.pin_buffer(COMP_BUFFER as u16, VALUE_SIZE, AccessFlags::LOCAL_WRITE)?;
    let err_memory = attrs.pin_buffer(ERR_BUFFER as u16, VALUE_SIZE, AccessFlags::LOCAL_WRITE)?;
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

pub(super) fn destroy(dev: &IbDevice<'_>, cc: CompCntrData) {
    dev.release_event_counter(cc.completions);
    dev.release_event_counter(cc.errors);
}

pub(super) fn modify(
    dev: &IbDevice<'_>,
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

pub(super) fn attach(
    dev: &IbDevice<'_>,
    qp: &Qp<RefaIb>,
    cc: &CompCntrData,
    ops: QpCounterOps,
) -> Result {
    let supported = caps(&dev.attrs).ok_or(EOPNOTSUPP)?.qp_ops;
    if !supported.contains(ops) {
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
            dev_ratelimited!(
                dev_err,
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

    #[test]
    fn operations_map_to_completion_and_failure_events() {
        assert_eq!(events_of(QpCounterOps::SEND), (0x1, 0x2));
        assert_eq!(events_of(QpCounterOps::RECV), (0x4, 0x8));
        assert_eq!(
            events_of(QpCounterOps::RDMA_READ | QpCounterOps::RDMA_WRITE),
            (0x10 | 0x40, 0x20 | 0x80)
        );
        // Remote operations fail on the peer: no failure event here.
        assert_eq!(
            events_of(QpCounterOps::REMOTE_RDMA_READ | QpCounterOps::REMOTE_RDMA_WRITE),
            (0x100 | 0x200, 0)
        );
        assert_eq!(events_of(QpCounterOps::from_raw(0x3f)), (0x355, 0xaa));
    }

    #[test]
    fn an_operation_needs_all_its_events() {
        assert_eq!(ops_of(0x3ff), QpCounterOps::from_raw(0x3f));
        assert_eq!(ops_of(0), QpCounterOps::empty());
        // Completions of sends without their failures: sends are not
        // counted; receives are.
        assert_eq!(ops_of(0x1 | 0x4 | 0x8), QpCounterOps::RECV);
        assert_eq!(ops_of(0x100), QpCounterOps::REMOTE_RDMA_READ);
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
                qp_ops: QpCounterOps::from_raw(0x3f),
            })
        );
        assert_eq!(with(cap, 1), None);
        assert_eq!(with(0, 64), None);
        assert_eq!(caps(&DeviceAttrs::with_device_caps(cap)), None);
    }
}
