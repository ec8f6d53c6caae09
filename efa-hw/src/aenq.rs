// SPDX-License-Identifier: GPL-2.0-only

//! The asynchronous event notification queue (AENQ).
//!
//! The device writes 64-byte [`AenqEntry`] values into the AENQ ring (base
//! and size in the `AENQ_*` registers), flipping the phase bit each time the
//! ring wraps (the first pass has phase 1), and raises the admin MSI-X
//! vector. The driver consumes entries while their phase matches, dispatches
//! them by [`AenqGroup`], and writes its free-running consumer counter to
//! `AENQ_CONS_DB`.
//!
//! The device reports only the groups the driver enabled with SET_FEATURE
//! `AENQ_CONFIG` (bit `g` of `enabled_groups` for group `g`).
//!
//! The 7.3 headers define no syndromes and no group-specific payload: the C
//! driver only counts keep-alive events and logs the others, so `syndrome`
//! and `inline_data` are opaque here.

use super::wire::{self, Field};

wire::wire_enum! {
    /// Event groups (C `enum efa_admin_aenq_group`).
    pub enum AenqGroup: u16 {
        /// Fatal device error.
        FatalError = 1,
        /// Warning.
        Warning = 2,
        /// Notification.
        Notification = 3,
        /// Periodic keep-alive; the 7.3 driver counts them.
        KeepAlive = 4,
    }
}

impl AenqGroup {
    /// Number of group ids (`EFA_ADMIN_AENQ_GROUPS_NUM`), one more than the
    /// highest.
    pub const GROUPS_NUM: u16 = 5;

    /// The bit of the group in `AenqConfig::supported_groups` and
    /// `enabled_groups`.
    pub const fn bit(self) -> u32 {
        1 << self.raw()
    }
}

/// The groups the 7.3 C driver enables: all four (0x1e). It refuses to
/// start if the device does not support them all.
pub const DRIVER_ENABLED_GROUPS: u32 = AenqGroup::FatalError.bit()
    | AenqGroup::Warning.bit()
    | AenqGroup::Notification.bit()
    | AenqGroup::KeepAlive.bit();

wire::wire_struct! {
    /// Header of an AENQ entry (C `efa_admin_aenq_common_desc`).
    pub struct AenqCommonDesc(16) {
        /// [`AenqGroup`].
        pub group: u16,
        /// Group-specific event code.
        pub syndrome: u16,
        /// [`AenqCommonDesc::PHASE`].
        pub flags: u8,
        /// Reserved, zero.
        pub reserved1: [u8; 3],
        /// Event time, low 32 bits.
        pub timestamp_low: u32,
        /// Event time, high 32 bits.
        pub timestamp_high: u32,
    }
}

impl AenqCommonDesc {
    /// `flags`: phase of the entry (other bits must be zero).
    pub const PHASE: Field<u8> = Field::new(0x1);

    /// The 64-bit timestamp.
    pub const fn timestamp(&self) -> u64 {
        ((self.timestamp_high as u64) << 32) | self.timestamp_low as u64
    }

    /// Sets the 64-bit timestamp.
    pub const fn set_timestamp(&mut self, timestamp: u64) {
        self.timestamp_low = timestamp as u32;
        self.timestamp_high = (timestamp >> 32) as u32;
    }
}

wire::wire_struct! {
    /// An AENQ entry (C `efa_admin_aenq_entry`).
    pub struct AenqEntry(64) {
        /// Header.
        pub aenq_common_desc: AenqCommonDesc,
        /// Group-specific data.
        pub inline_data_w4: [u8; 48],
    }
}

wire::wire_offsets! {
    AenqCommonDesc {
        group: 0, syndrome: 2, flags: 4, reserved1: 5, timestamp_low: 8,
        timestamp_high: 12,
    }
    AenqEntry { aenq_common_desc: 0, inline_data_w4: 16 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::Wire;

    #[test]
    fn groups() {
        assert_eq!(DRIVER_ENABLED_GROUPS, 0x1e);
        assert_eq!(AenqGroup::try_from(4), Ok(AenqGroup::KeepAlive));
        assert_eq!(AenqGroup::try_from(0), Err(0));
        assert_eq!(AenqGroup::try_from(5), Err(5));
        assert_eq!(AenqGroup::ALL.len() as u16, AenqGroup::GROUPS_NUM - 1);
    }

    #[test]
    fn keep_alive_golden_bytes() {
        let mut entry = AenqEntry::ZERO;
        entry.aenq_common_desc.group = AenqGroup::KeepAlive.raw();
        entry.aenq_common_desc.flags = AenqCommonDesc::PHASE.prep(1);
        entry.aenq_common_desc.set_timestamp(0x0102_0304_0506_0708);
        let b = entry.to_bytes();
        assert_eq!(&b[..16], &[4, 0, 0, 0, 1, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[16..], &[0; 48]);
        let back = AenqEntry::decode(&b).unwrap();
        assert_eq!(back, entry);
        assert_eq!(back.aenq_common_desc.timestamp(), 0x0102_0304_0506_0708);
        assert!(AenqEntry::decode(&b[..63]).is_err());
        let _ = AenqEntry::decode_padded(&b[..3]);
    }
}
