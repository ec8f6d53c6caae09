// SPDX-License-Identifier: GPL-2.0-only

//! PCI identity and the BAR0 register file.
//!
//! All registers are 32 bits wide. The driver only ever writes them: a read
//! is "readless", requested by writing [`MMIO_REG_READ_OFF`] and answered by
//! the device with a [`MmioReadLessResp`] written by DMA to the address in
//! [`MMIO_RESP_LO_OFF`]/[`MMIO_RESP_HI_OFF`].
//!
//! Offsets are `*_OFF` constants (and the [`Register`] enum); the fields of a
//! register are [`Field<u32>`] constants prefixed with the register name,
//! named like the C masks without `EFA_REGS_` and `_MASK`.

use super::wire::{self, Field};

/// PCI vendor id of Amazon.
pub const PCI_VENDOR_ID_AMAZON: u16 = 0x1d0f;
/// PCI device id of the first EFA generation.
pub const PCI_DEV_ID_EFA0_VF: u16 = 0xefa0;
/// PCI device id of the second EFA generation.
pub const PCI_DEV_ID_EFA1_VF: u16 = 0xefa1;
/// PCI device id of the third EFA generation.
pub const PCI_DEV_ID_EFA2_VF: u16 = 0xefa2;
/// PCI device id of the fourth EFA generation.
pub const PCI_DEV_ID_EFA3_VF: u16 = 0xefa3;
/// PCI device id of the fifth EFA generation (in the 7.3 driver's table and
/// known to rdma-core).
pub const PCI_DEV_ID_EFA4_VF: u16 = 0xefa4;
/// Every EFA device id the 7.3 C driver binds.
pub const PCI_DEVICE_IDS: [u16; 5] = [
    PCI_DEV_ID_EFA0_VF,
    PCI_DEV_ID_EFA1_VF,
    PCI_DEV_ID_EFA2_VF,
    PCI_DEV_ID_EFA3_VF,
    PCI_DEV_ID_EFA4_VF,
];

/// BAR holding the register file described by this module.
pub const REG_BAR: u8 = 0;
/// BAR holding device memory: the low-latency send queues (LLQ). The
/// doorbell BAR is whichever BAR `DeviceAttr::db_bar` names; the driver
/// only accepts [`REG_BAR`] or [`MEM_BAR`].
pub const MEM_BAR: u8 = 2;

/// MSI-X vector of the admin completion queue and the AENQ.
pub const MGMNT_MSIX_VEC_IDX: u16 = 0;
/// First MSI-X vector of the completion event queues (EQ `i` uses vector
/// `COMP_EQS_VEC_BASE + i`).
pub const COMP_EQS_VEC_BASE: u16 = 1;

/// Specification version (major 15:8, minor 7:0).
pub const VERSION_OFF: u16 = 0x00;
/// Controller (implementation) version.
pub const CONTROLLER_VERSION_OFF: u16 = 0x04;
/// Device capabilities.
pub const CAPS_OFF: u16 = 0x08;
/// Admin submission queue base address, low 32 bits.
pub const AQ_BASE_LO_OFF: u16 = 0x10;
/// Admin submission queue base address, high 32 bits.
pub const AQ_BASE_HI_OFF: u16 = 0x14;
/// Admin submission queue depth and entry size.
pub const AQ_CAPS_OFF: u16 = 0x18;
/// Admin completion queue base address, low 32 bits.
pub const ACQ_BASE_LO_OFF: u16 = 0x20;
/// Admin completion queue base address, high 32 bits.
pub const ACQ_BASE_HI_OFF: u16 = 0x24;
/// Admin completion queue depth, entry size and MSI-X vector.
pub const ACQ_CAPS_OFF: u16 = 0x28;
/// Admin submission queue doorbell: the free-running producer counter.
pub const AQ_PROD_DB_OFF: u16 = 0x2c;
/// Asynchronous event queue depth, entry size and MSI-X vector.
pub const AENQ_CAPS_OFF: u16 = 0x34;
/// Asynchronous event queue base address, low 32 bits.
pub const AENQ_BASE_LO_OFF: u16 = 0x38;
/// Asynchronous event queue base address, high 32 bits.
pub const AENQ_BASE_HI_OFF: u16 = 0x3c;
/// Asynchronous event queue doorbell: the free-running consumer counter.
pub const AENQ_CONS_DB_OFF: u16 = 0x40;
/// Admin interrupt mask (set = polling mode, no admin interrupts).
pub const INTR_MASK_OFF: u16 = 0x4c;
/// Device control: reset and admin queue restart.
pub const DEV_CTL_OFF: u16 = 0x54;
/// Device status.
pub const DEV_STS_OFF: u16 = 0x58;
/// Readless register read request.
pub const MMIO_REG_READ_OFF: u16 = 0x5c;
/// DMA address of the readless read response, low 32 bits.
pub const MMIO_RESP_LO_OFF: u16 = 0x60;
/// DMA address of the readless read response, high 32 bits.
pub const MMIO_RESP_HI_OFF: u16 = 0x64;
/// Event queue doorbell.
pub const EQ_DB_OFF: u16 = 0x68;

wire::wire_enum! {
    /// The registers of BAR0, by offset.
    pub enum Register: u16 {
        /// [`VERSION_OFF`].
        Version = 0x00,
        /// [`CONTROLLER_VERSION_OFF`].
        ControllerVersion = 0x04,
        /// [`CAPS_OFF`].
        Caps = 0x08,
        /// [`AQ_BASE_LO_OFF`].
        AqBaseLo = 0x10,
        /// [`AQ_BASE_HI_OFF`].
        AqBaseHi = 0x14,
        /// [`AQ_CAPS_OFF`].
        AqCaps = 0x18,
        /// [`ACQ_BASE_LO_OFF`].
        AcqBaseLo = 0x20,
        /// [`ACQ_BASE_HI_OFF`].
        AcqBaseHi = 0x24,
        /// [`ACQ_CAPS_OFF`].
        AcqCaps = 0x28,
        /// [`AQ_PROD_DB_OFF`].
        AqProdDb = 0x2c,
        /// [`AENQ_CAPS_OFF`].
        AenqCaps = 0x34,
        /// [`AENQ_BASE_LO_OFF`].
        AenqBaseLo = 0x38,
        /// [`AENQ_BASE_HI_OFF`].
        AenqBaseHi = 0x3c,
        /// [`AENQ_CONS_DB_OFF`].
        AenqConsDb = 0x40,
        /// [`INTR_MASK_OFF`].
        IntrMask = 0x4c,
        /// [`DEV_CTL_OFF`].
        DevCtl = 0x54,
        /// [`DEV_STS_OFF`].
        DevSts = 0x58,
        /// [`MMIO_REG_READ_OFF`].
        MmioRegRead = 0x5c,
        /// [`MMIO_RESP_LO_OFF`].
        MmioRespLo = 0x60,
        /// [`MMIO_RESP_HI_OFF`].
        MmioRespHi = 0x64,
        /// [`EQ_DB_OFF`].
        EqDb = 0x68,
    }
}

impl Register {
    /// Byte offset of the register in BAR0.
    pub const fn offset(self) -> u16 {
        self.raw()
    }

    /// The register at byte offset `offset`, if there is one.
    pub const fn from_offset(offset: u64) -> Option<Self> {
        if offset > u16::MAX as u64 {
            return None;
        }
        Self::from_raw(offset as u16)
    }
}

/// Size in bytes of the register file (the last register ends here).
pub const REG_FILE_SIZE: u16 = EQ_DB_OFF + 4;

/// `VERSION`: minor version of the device specification.
pub const VERSION_MINOR_VERSION: Field<u32> = Field::new(0xff);
/// `VERSION`: major version of the device specification.
pub const VERSION_MAJOR_VERSION: Field<u32> = Field::new(0xff00);

/// `CONTROLLER_VERSION`: sub-minor version.
pub const CONTROLLER_VERSION_SUBMINOR_VERSION: Field<u32> = Field::new(0xff);
/// `CONTROLLER_VERSION`: minor version.
pub const CONTROLLER_VERSION_MINOR_VERSION: Field<u32> = Field::new(0xff00);
/// `CONTROLLER_VERSION`: major version.
pub const CONTROLLER_VERSION_MAJOR_VERSION: Field<u32> = Field::new(0xff_0000);
/// `CONTROLLER_VERSION`: implementation id (ignored in version checks).
pub const CONTROLLER_VERSION_IMPL_ID: Field<u32> = Field::new(0xff00_0000);

/// `CAPS`: queues must be physically contiguous.
pub const CAPS_CONTIGUOUS_QUEUE_REQUIRED: Field<u32> = Field::new(0x1);
/// `CAPS`: reset timeout in units of [`CAPS_TIMEOUT_UNIT_MS`]; must not be 0.
pub const CAPS_RESET_TIMEOUT: Field<u32> = Field::new(0x3e);
/// `CAPS`: DMA address width in bits (the driver requires 32..=64).
pub const CAPS_DMA_ADDR_WIDTH: Field<u32> = Field::new(0xff00);
/// `CAPS`: admin command timeout in units of [`CAPS_TIMEOUT_UNIT_MS`]; 0
/// means the driver's default ([`DEFAULT_ADMIN_CMD_TIMEOUT_US`]).
pub const CAPS_ADMIN_CMD_TO: Field<u32> = Field::new(0xf_0000);

/// Unit of the timeouts in `CAPS`, in milliseconds.
pub const CAPS_TIMEOUT_UNIT_MS: u32 = 100;
/// Admin command timeout the C driver uses when `CAPS` gives none.
pub const DEFAULT_ADMIN_CMD_TIMEOUT_US: u32 = 30_000_000;
/// Smallest DMA address width the C driver accepts.
pub const MIN_DMA_ADDR_WIDTH: u32 = 32;
/// Largest DMA address width the C driver accepts.
pub const MAX_DMA_ADDR_WIDTH: u32 = 64;

/// `AQ_CAPS`: number of admin submission queue entries.
pub const AQ_CAPS_AQ_DEPTH: Field<u32> = Field::new(0xffff);
/// `AQ_CAPS`: size in bytes of an admin submission queue entry (64, or 128
/// from API version 0.3).
pub const AQ_CAPS_AQ_ENTRY_SIZE: Field<u32> = Field::new(0xffff_0000);

/// `ACQ_CAPS`: number of admin completion queue entries.
pub const ACQ_CAPS_ACQ_DEPTH: Field<u32> = Field::new(0xffff);
/// `ACQ_CAPS`: size in bytes of an admin completion queue entry (64).
pub const ACQ_CAPS_ACQ_ENTRY_SIZE: Field<u32> = Field::new(0xff_0000);
/// `ACQ_CAPS`: MSI-X vector for admin completions.
pub const ACQ_CAPS_ACQ_MSIX_VECTOR: Field<u32> = Field::new(0xff00_0000);

/// `AENQ_CAPS`: number of asynchronous event queue entries.
pub const AENQ_CAPS_AENQ_DEPTH: Field<u32> = Field::new(0xffff);
/// `AENQ_CAPS`: size in bytes of an asynchronous event queue entry (64).
pub const AENQ_CAPS_AENQ_ENTRY_SIZE: Field<u32> = Field::new(0xff_0000);
/// `AENQ_CAPS`: MSI-X vector for asynchronous events.
pub const AENQ_CAPS_AENQ_MSIX_VECTOR: Field<u32> = Field::new(0xff00_0000);

/// `INTR_MASK`: admin completion interrupts are masked (polling mode).
pub const INTR_MASK_EN: Field<u32> = Field::new(0x1);

/// `DEV_CTL`: start a device reset (write 1, then write 0 once
/// `DEV_STS_RESET_IN_PROGRESS` shows 1).
pub const DEV_CTL_DEV_RESET: Field<u32> = Field::new(0x1);
/// `DEV_CTL`: restart the admin queue.
pub const DEV_CTL_AQ_RESTART: Field<u32> = Field::new(0x2);
/// `DEV_CTL`: why the reset is requested ([`ResetReason`]).
pub const DEV_CTL_RESET_REASON: Field<u32> = Field::new(0xf000_0000);

/// `DEV_STS`: the device is ready (required before reset and admin init).
pub const DEV_STS_READY: Field<u32> = Field::new(0x1);
/// `DEV_STS`: an admin queue restart is in progress.
pub const DEV_STS_AQ_RESTART_IN_PROGRESS: Field<u32> = Field::new(0x2);
/// `DEV_STS`: an admin queue restart has finished.
pub const DEV_STS_AQ_RESTART_FINISHED: Field<u32> = Field::new(0x4);
/// `DEV_STS`: a reset is in progress.
pub const DEV_STS_RESET_IN_PROGRESS: Field<u32> = Field::new(0x8);
/// `DEV_STS`: a reset has finished.
pub const DEV_STS_RESET_FINISHED: Field<u32> = Field::new(0x10);
/// `DEV_STS`: the device hit a fatal error.
pub const DEV_STS_FATAL_ERROR: Field<u32> = Field::new(0x20);

/// `MMIO_REG_READ`: request id, echoed in [`MmioReadLessResp::req_id`].
pub const MMIO_REG_READ_REQ_ID: Field<u32> = Field::new(0xffff);
/// `MMIO_REG_READ`: offset of the register to read.
pub const MMIO_REG_READ_REG_OFF: Field<u32> = Field::new(0xffff_0000);

/// `EQ_DB`: event queue number.
pub const EQ_DB_EQN: Field<u32> = Field::new(0xffff);
/// `EQ_DB`: arm the event queue (raise an interrupt on the next event).
pub const EQ_DB_ARM: Field<u32> = Field::new(0x8000_0000);

/// Value the C driver substitutes for a register whose readless read failed.
pub const MMIO_READ_INVALID: u32 = 0xffff_ffff;
/// Readless read timeout the C driver uses, in microseconds.
pub const DEFAULT_MMIO_READ_TIMEOUT_US: u32 = 50_000;

wire::wire_enum! {
    /// Reason given with a device reset ([`DEV_CTL_RESET_REASON`]).
    pub enum ResetReason: u32 {
        /// Orderly reset (probe, removal).
        Normal = 0,
        /// Keep-alive events stopped arriving.
        KeepAliveTo = 1,
        /// An admin command timed out.
        AdminTo = 2,
        /// Initialisation failed.
        InitErr = 3,
        /// The driver found the device in an invalid state.
        DriverInvalidState = 4,
        /// Requested by the operating system.
        OsTrigger = 5,
        /// System shutdown.
        Shutdown = 6,
        /// Requested by the user.
        UserTrigger = 7,
        /// Any other reason.
        Generic = 8,
    }
}

/// A device specification version as the `VERSION` register encodes it;
/// versions compare as integers.
pub const fn api_version(major: u32, minor: u32) -> u32 {
    VERSION_MAJOR_VERSION.prep(major) | VERSION_MINOR_VERSION.prep(minor)
}

/// Lowest `VERSION` the C driver accepts (0.1).
pub const MIN_API_VERSION: u32 = api_version(0, 1);
/// From this `VERSION` (0.2) on, the driver checks admin completion
/// checksums.
pub const CRC_MIN_API_VERSION: u32 = api_version(0, 2);
/// From this `VERSION` (0.3) on, the driver uses 128-byte admin submission
/// entries with a checksum (`AqEntryV2`).
pub const ADMIN_V2_MIN_API_VERSION: u32 = api_version(0, 3);

/// A controller version as `CONTROLLER_VERSION` encodes it (without the
/// implementation id).
pub const fn controller_version(major: u32, minor: u32, subminor: u32) -> u32 {
    CONTROLLER_VERSION_MAJOR_VERSION.prep(major)
        | CONTROLLER_VERSION_MINOR_VERSION.prep(minor)
        | CONTROLLER_VERSION_SUBMINOR_VERSION.prep(subminor)
}

/// Lowest controller version the C driver accepts (0.0.1).
///
/// Note: the C driver compares this with the bitwise OR of the major,
/// minor and sub-minor values, each shifted down to bit 0, so it only
/// requires one of them to be non-zero.
pub const MIN_CTRL_VERSION: u32 = controller_version(0, 0, 1);

/// The `MMIO_REG_READ` value requesting a readless read of `offset`.
pub const fn mmio_reg_read(req_id: u16, offset: u16) -> u32 {
    MMIO_REG_READ_REQ_ID.prep(req_id as u32) | MMIO_REG_READ_REG_OFF.prep(offset as u32)
}

/// The `EQ_DB` value acknowledging events of queue `eqn` and, with `arm`,
/// requesting an interrupt for the next one.
pub const fn eq_doorbell(eqn: u16, arm: bool) -> u32 {
    EQ_DB_EQN.prep(eqn as u32) | EQ_DB_ARM.prep(arm as u32)
}

wire::wire_struct! {
    /// The answer to a readless register read, written by the device to the
    /// address in `MMIO_RESP_LO/HI` (C `efa_admin_mmio_req_read_less_resp`).
    ///
    /// The driver polls `req_id` until it equals the id it wrote to
    /// `MMIO_REG_READ`, then checks `reg_off`.
    pub struct MmioReadLessResp(8) {
        /// Request id from `MMIO_REG_READ`.
        pub req_id: u16,
        /// Offset of the register read.
        pub reg_off: u16,
        /// Value of the register.
        pub reg_val: u32,
    }
}

wire::wire_offsets!(MmioReadLessResp {
    req_id: 0,
    reg_off: 2,
    reg_val: 4
});

#[cfg(test)]
mod tests {
    use super::*;
    use wire::Wire;

    #[test]
    fn offsets_match_the_register_enum() {
        let offs = [
            (VERSION_OFF, Register::Version),
            (CONTROLLER_VERSION_OFF, Register::ControllerVersion),
            (CAPS_OFF, Register::Caps),
            (AQ_BASE_LO_OFF, Register::AqBaseLo),
            (AQ_BASE_HI_OFF, Register::AqBaseHi),
            (AQ_CAPS_OFF, Register::AqCaps),
            (ACQ_BASE_LO_OFF, Register::AcqBaseLo),
            (ACQ_BASE_HI_OFF, Register::AcqBaseHi),
            (ACQ_CAPS_OFF, Register::AcqCaps),
            (AQ_PROD_DB_OFF, Register::AqProdDb),
            (AENQ_CAPS_OFF, Register::AenqCaps),
            (AENQ_BASE_LO_OFF, Register::AenqBaseLo),
            (AENQ_BASE_HI_OFF, Register::AenqBaseHi),
            (AENQ_CONS_DB_OFF, Register::AenqConsDb),
            (INTR_MASK_OFF, Register::IntrMask),
            (DEV_CTL_OFF, Register::DevCtl),
            (DEV_STS_OFF, Register::DevSts),
            (MMIO_REG_READ_OFF, Register::MmioRegRead),
            (MMIO_RESP_LO_OFF, Register::MmioRespLo),
            (MMIO_RESP_HI_OFF, Register::MmioRespHi),
            (EQ_DB_OFF, Register::EqDb),
        ];
        assert_eq!(offs.len(), Register::ALL.len());
        for (off, reg) in offs {
            assert_eq!(reg.offset(), off);
            assert_eq!(Register::from_offset(off.into()), Some(reg));
        }
        assert_eq!(Register::from_offset(0x0c), None);
        assert_eq!(Register::from_offset(0x1_0000), None);
        assert_eq!(Register::from_offset(u64::MAX), None);
    }

    #[test]
    fn register_fields() {
        // CAPS as a device might report it: contiguous, reset timeout 10,
        // DMA width 48, admin timeout 3.
        let caps = CAPS_CONTIGUOUS_QUEUE_REQUIRED.prep(1)
            | CAPS_RESET_TIMEOUT.prep(10)
            | CAPS_DMA_ADDR_WIDTH.prep(48)
            | CAPS_ADMIN_CMD_TO.prep(3);
        assert_eq!(caps, 0x0003_3015);
        assert_eq!(CAPS_RESET_TIMEOUT.get(caps), 10);
        assert_eq!(CAPS_DMA_ADDR_WIDTH.get(caps), 48);
        assert_eq!(CAPS_RESET_TIMEOUT.max(), 31);

        let aq_caps = AQ_CAPS_AQ_DEPTH.prep(32) | AQ_CAPS_AQ_ENTRY_SIZE.prep(128);
        assert_eq!(aq_caps, 0x0080_0020);
        let acq_caps = ACQ_CAPS_ACQ_DEPTH.prep(32)
            | ACQ_CAPS_ACQ_ENTRY_SIZE.prep(64)
            | ACQ_CAPS_ACQ_MSIX_VECTOR.prep(0);
        assert_eq!(acq_caps, 0x0040_0020);

        let reset =
            DEV_CTL_DEV_RESET.prep(1) | DEV_CTL_RESET_REASON.prep(ResetReason::Normal.raw());
        assert_eq!(reset, 1);
        let reset =
            DEV_CTL_DEV_RESET.prep(1) | DEV_CTL_RESET_REASON.prep(ResetReason::KeepAliveTo.raw());
        assert_eq!(reset, 0x1000_0001);
        assert_eq!(
            ResetReason::try_from(DEV_CTL_RESET_REASON.get(reset)),
            Ok(ResetReason::KeepAliveTo)
        );

        assert_eq!(mmio_reg_read(7, DEV_STS_OFF), 0x0058_0007);
        assert_eq!(eq_doorbell(3, true), 0x8000_0003);
        assert_eq!(eq_doorbell(0xffff, false), 0x0000_ffff);

        assert_eq!(MIN_API_VERSION, 1);
        assert_eq!(CRC_MIN_API_VERSION, 2);
        assert_eq!(ADMIN_V2_MIN_API_VERSION, 3);
        assert_eq!(api_version(1, 0), 0x100);
        assert_eq!(MIN_CTRL_VERSION, 1);
        assert_eq!(controller_version(1, 2, 3), 0x0001_0203);
    }

    #[test]
    fn readless_response() {
        let resp = MmioReadLessResp {
            req_id: 0x1234,
            reg_off: DEV_STS_OFF,
            reg_val: 0xdead_beef,
        };
        assert_eq!(
            resp.to_bytes(),
            [0x34, 0x12, 0x58, 0x00, 0xef, 0xbe, 0xad, 0xde]
        );
        assert_eq!(MmioReadLessResp::decode(&resp.to_bytes()), Ok(resp));
        assert!(MmioReadLessResp::decode(&[0; 7]).is_err());
    }
}
