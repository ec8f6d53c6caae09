// SPDX-License-Identifier: GPL-2.0

//! The register file in BAR0: writes, readless reads and the device reset.
//!
//! The driver never reads a register with a plain MMIO read: it writes the
//! register's offset and a sequence number to `MMIO_REG_READ`, and the device
//! answers by DMA into a small response buffer. The device forgets the
//! buffer's address when it resets, so the reset sequence writes it again.

use crate::hw::{
    regs::{
        self,
        MmioReadLessResp,
        ResetReason, //
    },
    wire::Wire, //
};
// out of tree: begin
use crate::kernel_gaps::pci::BoundExt as _;
// out of tree: end
use kernel::{
    device::Bound,
    dma::Coherent,
    io::{
        io_project,
        Io, //
    },
    new_mutex,
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
        Mutex, //
    },
    time::Delta, //
};

/// BAR0 mapped up to the end of the register file.
pub(crate) type RegBar<'a> = pci::Bar<'a, { regs::REG_FILE_SIZE as usize }>;

/// Added to the sequence number to fill the response buffer before a read,
/// so that a stale answer can never match (the C driver's value).
const REQ_ID_POISON: u16 = 0x9a;
/// Poll interval of the reset state, far below the reset timeout's unit.
const RESET_POLL: Delta = Delta::from_millis(1);

/// What `CAPS` says, read at reset.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caps {
    /// Widest DMA address the device handles, in bits.
    pub(crate) dma_addr_width: u32,
    /// Admin command timeout; `None` for the driver's default.
    pub(crate) admin_timeout: Option<Delta>,
}

impl Caps {
    fn decode(caps: u32) -> Self {
        let admin_to = regs::CAPS_ADMIN_CMD_TO.get(caps);
        Self {
            dma_addr_width: regs::CAPS_DMA_ADDR_WIDTH.get(caps),
            admin_timeout: (admin_to != 0)
                .then(|| Delta::from_millis(i64::from(admin_to * regs::CAPS_TIMEOUT_UNIT_MS))),
        }
    }
}

struct Readless {
    seq: u16,
    timeout: Delta,
}

/// The registers of one device.
#[pin_data]
pub(crate) struct Regs<'a> {
    pdev: &'a pci::Device<Bound>,
    bar: RegBar<'a>,
    /// Serialises readless reads: there is one response buffer.
    #[pin]
    readless: Mutex<Readless>,
    /// Where the device writes a [`MmioReadLessResp`].
    resp: Coherent<[u8]>,
    /// A reset went unacknowledged and bus mastering was turned off; it
    /// stays off (see [`Self::stop_dma`]).
    dma_stopped: Atomic<bool>,
}

impl<'a> Regs<'a> {
    /// Takes over `bar` and points the device at a new readless response
    /// buffer.
    ///
    /// The buffer is the one DMA allocation probe makes before it sets the
    /// device's DMA mask, and it must be: the mask comes from `CAPS`, which
    /// only a readless read can get. It is allocated under the default
    /// 32-bit mask, which every device takes (as `efa.ko` does).
    pub(crate) fn new(
        pdev: &'a pci::Device<Bound>,
        bar: RegBar<'a>,
    ) -> Result<impl PinInit<Self, Error> + 'a> {
        let resp = Coherent::<u8>::zeroed_slice(pdev.as_ref(), MmioReadLessResp::SIZE, GFP_KERNEL)?;
        resp_address_init(&bar, &resp);
        Ok(try_pin_init!(Self {
            pdev,
            bar,
            readless <- new_mutex!(
                Readless {
                    seq: 0,
                    timeout: Delta::from_micros(regs::DEFAULT_MMIO_READ_TIMEOUT_US.into()),
                },
                "refa_readless"
            ),
            resp,
            dma_stopped: Atomic::new(false),
        }? Error))
    }

    /// Turns the device's bus mastering off for good, for a device that
    /// did not acknowledge its reset: from here on it cannot reach memory,
    /// and what it was given may be freed.
    ///
    /// For good: the device may still hold the addresses of queues freed
    /// after this, and turning bus mastering on again would let it write
    /// into them. Only an unbind (and the next probe) goes past it.
    pub(crate) fn stop_dma(&self) {
        self.pdev.clear_master();
        self.dma_stopped.store(true, Relaxed);
    }

    /// Whether [`Self::stop_dma`] was called.
    pub(crate) fn dma_stopped(&self) -> bool {
        self.dma_stopped.load(Relaxed)
    }

    /// Writes `value` to the register at `offset`.
    #[inline(always)]
    pub(crate) fn write(&self, offset: u16, value: u32) {
        self.bar.write32(value, offset.into());
    }

    /// Reads the register at `offset` the readless way.
    pub(crate) fn read(&self, offset: u16) -> Result<u32> {
        let mut readless = self.readless.lock();
        readless.seq = readless.seq.wrapping_add(1);
        let seq = readless.seq;

        io_project!(&self.resp, [try: 0..2])
            .copy_from_slice(&seq.wrapping_add(REQ_ID_POISON).to_le_bytes());
        self.write(regs::MMIO_REG_READ_OFF, regs::mmio_reg_read(seq, offset));

        let answered = kernel::io::poll::read_poll_timeout(
            || {
                Ok(io_project!(&self.resp, [try: 0..2])
                    .try_cast::<u16>()?
                    .read_val())
            },
            |&req_id| req_id == seq,
            Delta::from_micros(1),
            readless.timeout,
        );
        if answered.is_err() {
            dev_err!(
                self.bar_device(),
                "readless read of register {:#x} timed out\n",
                offset
            );
            return Err(ETIMEDOUT);
        }
        // The device writes the request id last; read the rest after it.
        dma_mb(Read);
        let mut bytes = [0u8; MmioReadLessResp::SIZE];
        (&self.resp).copy_to_slice(&mut bytes);
        let resp = MmioReadLessResp::from_bytes(&bytes);
        if resp.reg_off != offset {
            dev_err!(
                self.bar_device(),
                "readless read of register {:#x} answered for {:#x}\n",
                offset,
                resp.reg_off
            );
            return Err(EIO);
        }
        Ok(resp.reg_val)
    }

    /// Sets the readless read timeout (from the device's hints).
    pub(crate) fn set_read_timeout(&self, timeout: Delta) {
        self.readless.lock().timeout = timeout;
    }

    /// Resets the device as the EFA interface prescribes, giving `reason`;
    /// returns what `CAPS` says afterwards.
    pub(crate) fn reset(&self, reason: ResetReason) -> Result<Caps> {
        let status = self.read(regs::DEV_STS_OFF)?;
        let caps = self.read(regs::CAPS_OFF)?;
        if !regs::DEV_STS_READY.is_set(status) {
            dev_err!(self.bar_device(), "device not ready for a reset\n");
            return Err(EINVAL);
        }
        let units = regs::CAPS_RESET_TIMEOUT.get(caps);
        if units == 0 {
            dev_err!(self.bar_device(), "device gives no reset timeout\n");
            return Err(EINVAL);
        }
        let timeout = Delta::from_millis(i64::from(units * regs::CAPS_TIMEOUT_UNIT_MS));

        self.write(
            regs::DEV_CTL_OFF,
            regs::DEV_CTL_DEV_RESET.prep(1) | regs::DEV_CTL_RESET_REASON.prep(reason.raw()),
        );
        // The reset made the device forget the response buffer.
        resp_address_init(&self.bar, &self.resp);
        self.wait_reset_in_progress(true, timeout)?;
        self.write(regs::DEV_CTL_OFF, 0);
        self.wait_reset_in_progress(false, timeout)?;

        Ok(Caps::decode(self.read(regs::CAPS_OFF)?))
    }

    fn wait_reset_in_progress(&self, on: bool, timeout: Delta) -> Result {
        kernel::io::poll::read_poll_timeout(
            || self.read(regs::DEV_STS_OFF),
            |&status| regs::DEV_STS_RESET_IN_PROGRESS.is_set(status) == on,
            RESET_POLL,
            timeout,
        )
        .map(|_| ())
        .inspect_err(|&e| {
            if e == ETIMEDOUT {
                dev_err!(
                    self.bar_device(),
                    "reset in progress did not turn {} within {} ms\n",
                    if on { "on" } else { "off" },
                    timeout.as_millis()
                );
            }
        })
    }

    fn bar_device(&self) -> &pci::Device<Bound> {
        self.pdev
    }

    /// The device the registers belong to.
    pub(crate) fn device(&self) -> &'a pci::Device<Bound> {
        self.pdev
    }
}

/// Tells the device where to answer readless reads. The address is valid
/// once the low half is written, so that goes last.
fn resp_address_init(bar: &RegBar<'_>, resp: &Coherent<[u8]>) {
    let addr = resp.dma_address();
    bar.write32((addr >> 32) as u32, regs::MMIO_RESP_HI_OFF.into());
    bar.write32(addr as u32, regs::MMIO_RESP_LO_OFF.into());
}
