// SPDX-License-Identifier: GPL-2.0

//! Completion event queues (EQs): one per MSI-X vector after the admin one,
//! created at probe; EQ `i` serves completion vector `i` (MSI-X vector
//! `i + 1`).
//!
//! A CQ created with a completion channel is bound to the EQ of its
//! completion vector. The device writes an event into that EQ when the CQ
//! has new completions and userspace armed it (the ARM bit of the CQ
//! doorbell, written by the efa provider's `ibv_req_notify_cq`), then
//! interrupts on the EQ's vector if the EQ is armed. The handler, in hard
//! interrupt context, consumes the events, passes each to its CQ through a
//! [`CompletionSink`] (the RDMA device's table of CQs, which calls the
//! core's completion handler, waking the CQ's completion channel) and
//! re-arms the EQ. A CQ leaves the table before it is destroyed, so events
//! for CQs that are gone find no entry: they are counted (reported when the
//! EQ goes) and dropped.

use super::{
    Consumer,
    Core, //
};
use crate::{
    hw::{
        admin::CreateEqCmd,
        io::{
            Eqe,
            EqeEventType, //
        },
        regs,
        wire::Wire, //
    },
    recovery::{
        Cause,
        StormQueue, //
    },
    ring::RingPos, //
};
// in tree: use kernel::pci::IrqVectorHandler;
// out of tree: begin
use crate::kernel_gaps::pci::IrqVectorHandler;
use crate::kernel_gaps::ratelimit::dev_warn_ratelimited;
// out of tree: end
use kernel::{
    device::Bound,
    dma::Coherent,
    io::{
        io_project,
        io_read,
        Io, //
    },
    irq::{
        self,
        IrqReturn, //
    },
    new_spinlock,
    pci,
    prelude::*,
    sync::{
        atomic::{
            ordering::Relaxed,
            Atomic, //
        },
        barrier::{
            dma_mb,
            Read, //
        },
        Arc,
        SpinLock, //
    },
    time::Instant, //
};

/// Where an EQ's completion events go: the CQs taking events, by the
/// device's CQ number.
pub(crate) trait CompletionSink: Send + Sync {
    /// Delivers a completion event to CQ `cqn`, from the EQ's interrupt
    /// handler; `false` if there is no such CQ (gone, or never asked for
    /// events).
    fn completion(&self, cqn: u16) -> bool;
}

/// The ring of an event queue, which the device writes.
#[pin_data]
pub(crate) struct EqRing {
    mem: Coherent<[u8]>,
    /// Only the EQ's interrupt handler consumes events.
    #[pin]
    consumer: SpinLock<Consumer>,
    events: Atomic<u64>,
    /// Events for CQs not (or no longer) in the table.
    unknown: Atomic<u64>,
}

impl EqRing {
    fn new(pdev: &pci::Device<Bound>, depth: u16) -> Result<Arc<Self>> {
        let consumer = Consumer::new(depth.into())?;
        let mem = Coherent::<u8>::zeroed_slice(
            pdev.as_ref(),
            usize::from(depth) * Eqe::SIZE,
            GFP_KERNEL,
        )?;
        Arc::pin_init(
            try_pin_init!(Self {
                mem,
                consumer <- new_spinlock!(consumer, "refa_eq"),
                events: Atomic::new(0),
                unknown: Atomic::new(0),
            }? Error),
            GFP_KERNEL,
        )
    }

    /// The event at the consumer position, if the device wrote it.
    fn next(&self, pos: RingPos) -> Result<Option<Eqe>> {
        let offset = pos.slot() * Eqe::SIZE;
        // The phase is bit 0 of the little-endian `common` word.
        let common: u8 = io_read!(&self.mem, [try: offset]);
        if Eqe::PHASE.get(common.into()) != u32::from(pos.phase()) {
            return Ok(None);
        }
        dma_mb(Read);
        let mut bytes = [0u8; Eqe::SIZE];
        io_project!(&self.mem, [try: offset..offset + Eqe::SIZE]).copy_to_slice(&mut bytes);
        Ok(Some(Eqe::from_bytes(&bytes)))
    }
}

/// The interrupt handler of an EQ.
pub(crate) struct EqIrq<'a, S: CompletionSink> {
    core: Arc<Core<'a>>,
    ring: Arc<EqRing>,
    cqs: Arc<S>,
    eqn: u16,
}

impl<S: CompletionSink> irq::Handler for EqIrq<'_, S> {
    fn handle(&self) -> IrqReturn {
        let mut consumer = self.ring.consumer.lock();
        let start = consumer.pos;
        let mut pos = start;
        // At most a ring's worth: a device that flips phase bits as fast as
        // they are consumed must not keep this hard-IRQ handler going for
        // ever. The rest waits for the next interrupt, which arming asks
        // for; a device that keeps this up fails (`StormWatch`).
        for _ in 0..pos.depth() {
            let Ok(Some(eqe)) = self.ring.next(pos) else {
                break;
            };
            pos = pos.advanced(1);
            match EqeEventType::from_raw(Eqe::EVENT_TYPE.get(eqe.common) as u8) {
                Some(EqeEventType::Completion) => {
                    self.ring.events.add(1, Relaxed);
                    if !self.cqs.completion(eqe.comp_event().cqn) {
                        self.ring.unknown.add(1, Relaxed);
                    }
                }
                None => dev_warn_ratelimited!(
                    self.core.dev(),
                    "EQ {}: unknown event type {}\n",
                    self.eqn,
                    Eqe::EVENT_TYPE.get(eqe.common)
                ),
            }
        }
        consumer.pos = pos;
        let over_budget =
            pos.distance_from(start) == pos.depth() && matches!(self.ring.next(pos), Ok(Some(_)));
        if over_budget {
            dev_warn_ratelimited!(
                self.core.dev(),
                "EQ {}: more than {} events at once; the rest waits\n",
                self.eqn,
                pos.depth()
            );
        }
        let storm = consumer.storm.pass(over_budget, Instant::now());
        drop(consumer);
        if storm {
            self.core.fail(Cause::InterruptStorm {
                queue: StormQueue::Eq { eqn: self.eqn },
            });
        }
        self.core.arm_eq(self.eqn);
        IrqReturn::Handled
    }
}

/// An EQ as the device knows it; dropping it destroys it on the device.
struct EqObject<'a> {
    core: Arc<Core<'a>>,
    ring: Arc<EqRing>,
    eqn: u16,
}

impl Drop for EqObject<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.core.destroy_eq(self.eqn) {
            dev_err!(
                self.core.dev(),
                "destroying EQ {} failed: {}\n",
                self.eqn,
                e.to_errno()
            );
            // The device may still write events until it is reset.
            self.core.keep_until_reset(self.ring.clone());
        }
    }
}

/// A completion event queue with its interrupt handler.
pub(crate) struct EventQueue<'a, S: CompletionSink> {
    // Field order is teardown order: the handler goes before the EQ.
    irq: Pin<KBox<IrqVectorHandler<'a, EqIrq<'a, S>>>>,
    object: EqObject<'a>,
}

impl<'a, S: CompletionSink + 'a> EventQueue<'a, S> {
    /// Creates an EQ of `depth` events interrupting on MSI-X vector
    /// `vector`, registers its handler, which passes events to the CQs of
    /// `cqs`, and arms it.
    pub(crate) fn new(
        core: &Arc<Core<'a>>,
        vectors: &Arc<pci::IrqVectorRegistration<'a>>,
        vector: u16,
        depth: u16,
        cqs: &Arc<S>,
    ) -> Result<Self> {
        let ring = EqRing::new(core.dev(), depth)?;
        let eqn = core.create_eq(
            &CreateEqCmd {
                depth,
                msix_vec: vector.try_into()?,
                caps: CreateEqCmd::ENTRY_SIZE_WORDS.prep((Eqe::SIZE / 4) as u8),
                ba: crate::hw::admin::MemAddr::new(ring.mem.dma_address()),
                event_bitmask: CreateEqCmd::COMPLETION_EVENTS.prep(1),
                reserved: 0,
            },
            ring.clone(),
        )?;
        let object = EqObject {
            core: core.clone(),
            ring: ring.clone(),
            eqn,
        };
        // SAFETY: The handler lives in the returned `EventQueue`, which a
        // bring-up keeps in `EventQueues` in the device's incarnation (`Live`)
        // in the bound device's driver data (`Binding`), dropped when
        // recovery ends the incarnation or at unbind, or drops on a failed
        // bring-up; nothing leaks it.
        // No cycle keeps it alive either: the handler holds `Arc`s of the
        // `Core`, the ring and the CQ table, none of which holds an `EventQueue`.
        let irq = unsafe {
            IrqVectorHandler::new(
                vectors,
                vector.into(),
                irq::Flags::TRIGGER_NONE,
                c"refa-comp",
                Ok::<_, Error>(EqIrq {
                    core: core.clone(),
                    ring,
                    cqs: cqs.clone(),
                    eqn,
                }),
            )
        };
        let irq = KBox::pin_init(irq, GFP_KERNEL)?;
        // One CPU per completion vector, as the C driver (vector 1 on the
        // first CPU, ...), counted from the device's NUMA node. A failure
        // leaves the interrupt where it was, as in efa.ko.
        let _ = irq.spread_affinity(u32::from(vector - crate::hw::regs::COMP_EQS_VEC_BASE));
        core.arm_eq(eqn);
        Ok(Self { irq, object })
    }

    /// The device's number for the EQ.
    pub(crate) fn eqn(&self) -> u16 {
        self.object.eqn
    }
}

impl<S: CompletionSink> Drop for EventQueue<'_, S> {
    fn drop(&mut self) {
        dev_dbg!(
            self.object.core.dev(),
            "EQ {}: {} completion events, {} for unknown CQs\n",
            self.object.eqn,
            self.irq.handler().ring.events.load(Relaxed),
            self.irq.handler().ring.unknown.load(Relaxed)
        );
    }
}

impl Core<'_> {
    /// Acknowledges the events of EQ `eqn` and asks for an interrupt on the
    /// next one.
    pub(crate) fn arm_eq(&self, eqn: u16) {
        self.regs()
            .write(regs::EQ_DB_OFF, regs::eq_doorbell(eqn, true));
    }
}
