// SPDX-License-Identifier: GPL-2.0

//! Attributes a device reports through the query verbs.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)

use super::bindings;
use kernel::prelude::*;

/// Generates setters for plain fields of a wrapped C attribute structure.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident => $field:ident: $ty:ty;)+) => {
        $(
            $(#[$doc])*
            pub(crate) fn $name(&mut self, value: $ty) -> &mut Self {
                self.0.$field = value.into();
                self
            }
        )+
    };
}

/// Device attributes (`struct ib_device_attr`), filled by `query_device`.
/// The core zeroes them before the call.
#[repr(transparent)]
pub(crate) struct DeviceAttr(bindings::ib_device_attr);

impl DeviceAttr {
    /// # Safety
    ///
    /// `ptr` is valid for reads and writes, and not otherwise accessed, for
    /// `'a`.
    pub(super) unsafe fn from_raw<'a>(ptr: *mut bindings::ib_device_attr) -> &'a mut Self {
        // SAFETY: `Self` is a transparent wrapper; validity and exclusivity
        // are the caller's promise.
        unsafe { &mut *ptr.cast::<Self>() }
    }

    setters! {
        /// Largest memory region, in bytes.
        set_max_mr_size => max_mr_size: u64;
        /// Page sizes the device can map, as a bit mask of sizes.
        set_page_size_cap => page_size_cap: u64;
        /// PCI vendor id.
        set_vendor_id => vendor_id: u32;
        /// PCI device id.
        set_vendor_part_id => vendor_part_id: u32;
        /// Hardware version.
        set_hw_ver => hw_ver: u32;
        /// Queue pairs.
        set_max_qp => max_qp: u32;
        /// Work requests per queue.
        set_max_qp_wr => max_qp_wr: u32;
        /// Scatter/gather entries per send work request.
        set_max_send_sge => max_send_sge: u32;
        /// Scatter/gather entries per receive work request.
        set_max_recv_sge => max_recv_sge: u32;
        /// Scatter/gather entries per RDMA read.
        set_max_sge_rd => max_sge_rd: u32;
        /// Completion queues.
        set_max_cq => max_cq: u32;
        /// Entries per completion queue.
        set_max_cqe => max_cqe: u32;
        /// Memory regions.
        set_max_mr => max_mr: u32;
        /// Protection domains.
        set_max_pd => max_pd: u32;
        /// Address handles.
        set_max_ah => max_ah: u32;
        /// P_Key table entries.
        set_max_pkeys => max_pkeys: u16;
    }
}

/// State of a port's logical link (`enum ib_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum PortState {
    /// The link is up and passes traffic.
    Active = bindings::ib_port_state_IB_PORT_ACTIVE,
}

/// State of a port's physical link (`enum ib_port_phys_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum PhysState {
    /// Up.
    LinkUp = bindings::ib_port_phys_state_IB_PORT_PHYS_STATE_LINK_UP as u8,
}

/// A path MTU the core can name (`enum ib_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Mtu {
    /// 256 bytes.
    Mtu256 = bindings::ib_mtu_IB_MTU_256,
    /// 512 bytes.
    Mtu512 = bindings::ib_mtu_IB_MTU_512,
    /// 1024 bytes.
    Mtu1024 = bindings::ib_mtu_IB_MTU_1024,
    /// 2048 bytes.
    Mtu2048 = bindings::ib_mtu_IB_MTU_2048,
    /// 4096 bytes.
    Mtu4096 = bindings::ib_mtu_IB_MTU_4096,
}

impl Mtu {
    /// The largest MTU the core can name that does not exceed `bytes`, as
    /// `ib_mtu_int_to_enum()` picks it; `None` below 256 bytes.
    pub(crate) fn at_most(bytes: u32) -> Option<Self> {
        Some(match bytes {
            4096.. => Self::Mtu4096,
            2048.. => Self::Mtu2048,
            1024.. => Self::Mtu1024,
            512.. => Self::Mtu512,
            256.. => Self::Mtu256,
            _ => return None,
        })
    }
}

/// Lane speed of a port (`enum ib_port_speed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub(crate) enum Speed {
    /// 2.5 Gb/s.
    Sdr = bindings::ib_port_speed_IB_SPEED_SDR as u16,
    /// 5 Gb/s.
    Ddr = bindings::ib_port_speed_IB_SPEED_DDR as u16,
    /// 10 Gb/s (64b/66b).
    Fdr10 = bindings::ib_port_speed_IB_SPEED_FDR10 as u16,
    /// 25 Gb/s.
    Edr = bindings::ib_port_speed_IB_SPEED_EDR as u16,
    /// 50 Gb/s.
    Hdr = bindings::ib_port_speed_IB_SPEED_HDR as u16,
    /// 100 Gb/s.
    Ndr = bindings::ib_port_speed_IB_SPEED_NDR as u16,
    /// 200 Gb/s.
    Xdr = bindings::ib_port_speed_IB_SPEED_XDR as u16,
}

/// Number of lanes of a port (`enum ib_port_width`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Width {
    /// One lane.
    X1 = bindings::ib_port_width_IB_WIDTH_1X as u8,
    /// Four lanes.
    X4 = bindings::ib_port_width_IB_WIDTH_4X as u8,
    /// Eight lanes.
    X8 = bindings::ib_port_width_IB_WIDTH_8X as u8,
    /// Twelve lanes.
    X12 = bindings::ib_port_width_IB_WIDTH_12X as u8,
}

/// Port attributes (`struct ib_port_attr`), filled by `query_port`. The
/// core zeroes them before the call.
#[repr(transparent)]
pub(crate) struct PortAttr(bindings::ib_port_attr);

impl PortAttr {
    /// # Safety
    ///
    /// `ptr` is valid for reads and writes, and not otherwise accessed, for
    /// `'a`.
    pub(super) unsafe fn from_raw<'a>(ptr: *mut bindings::ib_port_attr) -> &'a mut Self {
        // SAFETY: `Self` is a transparent wrapper; validity and exclusivity
        // are the caller's promise.
        unsafe { &mut *ptr.cast::<Self>() }
    }

    /// Logical and physical link state.
    pub(crate) fn set_state(&mut self, state: PortState, phys: PhysState) -> &mut Self {
        self.0.state = state as u32;
        self.0.phys_state = phys as u8;
        self
    }

    /// Largest and current path MTU.
    pub(crate) fn set_mtu(&mut self, max: Mtu, active: Mtu) -> &mut Self {
        self.0.max_mtu = max as u32;
        self.0.active_mtu = active as u32;
        self
    }

    /// Link speed as lane speed and number of lanes.
    pub(crate) fn set_speed(&mut self, speed: Speed, width: Width) -> &mut Self {
        self.0.active_speed = speed as u16;
        self.0.active_width = width as u8;
        self
    }

    setters! {
        /// Largest message, in bytes.
        set_max_msg_sz => max_msg_sz: u32;
        /// GID table entries.
        set_gid_tbl_len => gid_tbl_len: i32;
        /// P_Key table entries.
        set_pkey_tbl_len => pkey_tbl_len: u16;
        /// LID mask control.
        set_lmc => lmc: u8;
        /// Virtual lanes.
        set_max_vl_num => max_vl_num: u8;
    }
}

/// What never changes about a port (`struct ib_port_immutable`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PortImmutable {
    /// P_Key table entries.
    pub(crate) pkey_tbl_len: u16,
    /// GID table entries.
    pub(crate) gid_tbl_len: u16,
    /// `RDMA_CORE_CAP_*` / `RDMA_CORE_PORT_*` flags; none for a device
    /// without a standard link layer.
    pub(crate) core_cap_flags: u32,
    /// Largest MAD; zero without MAD support.
    pub(crate) max_mad_size: u32,
}

impl PortImmutable {
    pub(super) fn into_raw(self) -> bindings::ib_port_immutable {
        bindings::ib_port_immutable {
            pkey_tbl_len: self.pkey_tbl_len.into(),
            gid_tbl_len: self.gid_tbl_len.into(),
            core_cap_flags: self.core_cap_flags,
            max_mad_size: self.max_mad_size,
        }
    }
}

/// Link layer of a port (`enum rdma_link_layer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LinkLayer {
    /// Neither InfiniBand nor Ethernet: the device's own addressing.
    Unspecified,
}

impl LinkLayer {
    /// The value of the C enum.
    pub(super) const fn into_raw(self) -> bindings::rdma_link_layer {
        match self {
            Self::Unspecified => bindings::rdma_link_layer_IB_LINK_LAYER_UNSPECIFIED,
        }
    }
}

/// A global identifier (`union ib_gid`), as 16 bytes in network order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Gid(pub(crate) [u8; 16]);

#[kunit_tests(refa_rdma_verbs)]
mod tests {
    use super::*;

    #[test]
    fn mtu_rounds_down_to_a_named_size() {
        assert_eq!(Mtu::at_most(255), None);
        assert_eq!(Mtu::at_most(256), Some(Mtu::Mtu256));
        assert_eq!(Mtu::at_most(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::at_most(8900), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::at_most(u32::MAX), Some(Mtu::Mtu4096));
    }
}
