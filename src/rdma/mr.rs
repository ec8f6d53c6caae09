// SPDX-License-Identifier: GPL-2.0

//! Memory regions (`struct ib_mr`) registered by userspace.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! Unlike the other objects, MRs are allocated by the driver: the
//! abstraction boxes the `ib_mr` (at offset 0) with the driver's data when
//! [`Operations::reg_user_mr`] succeeds, and hands the data back to
//! [`Operations::dereg_mr`] by value, so the driver decides what to release
//! and what the device may still use.

use super::{
    bindings,
    device::Operations,
    efa_abi::{
        EFA_QUERY_MR_VALIDITY_RDMA_READ_IC_ID,
        EFA_QUERY_MR_VALIDITY_RDMA_RECV_IC_ID,
        EFA_QUERY_MR_VALIDITY_RECV_IC_ID, //
    },
    pd::Pd,
    udata::UData,
    umem::AccessFlags, //
};
use kernel::{
    prelude::*,
    types::Opaque, //
};

/// What a registration asks for (`ib_uverbs_reg_mr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MrRequest {
    /// User address of the first byte.
    pub(crate) start: u64,
    /// Length in bytes.
    pub(crate) length: u64,
    /// The address the device knows the first byte by (same offset in its
    /// page as `start`; the core checks).
    pub(crate) iova: u64,
    /// Access rights; the core has checked their consistency
    /// (`ib_check_mr_access()`), not that the device supports them.
    pub(crate) access: AccessFlags,
}

/// Where the pages of a dma-buf registration come from
/// (`ib_uverbs_reg_dmabuf_mr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DmabufMrRequest {
    /// The dma-buf's file descriptor in the calling process.
    pub(crate) fd: i32,
    /// Offset of the first byte in the dma-buf.
    pub(crate) offset: u64,
    /// Length in bytes.
    pub(crate) length: u64,
    /// The address the device knows the first byte by.
    pub(crate) iova: u64,
    /// Access rights, as for [`MrRequest::access`].
    pub(crate) access: AccessFlags,
}

/// The keys the device gave a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MrKeys {
    /// Local key, used in the region's work requests.
    pub(crate) lkey: u32,
    /// Remote key, given to peers for RDMA.
    pub(crate) rkey: u32,
}

/// The interconnects through which the device reaches a region, by path
/// (`efa-abi.h`'s MR query); `None` where the device did not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MrInterconnects {
    /// For receives into the region.
    pub(crate) recv: Option<u16>,
    /// For RDMA reads of the region by peers.
    pub(crate) rdma_read: Option<u16>,
    /// For RDMA writes into the region by peers.
    pub(crate) rdma_recv: Option<u16>,
}

impl MrInterconnects {
    /// The answer as the method's handler copies it out.
    fn to_raw(self) -> bindings::refa_mr_ic_ids {
        let mut ids = bindings::refa_mr_ic_ids::default();
        let paths = [
            (
                self.recv,
                EFA_QUERY_MR_VALIDITY_RECV_IC_ID,
                &mut ids.recv_ic_id,
            ),
            (
                self.rdma_read,
                EFA_QUERY_MR_VALIDITY_RDMA_READ_IC_ID,
                &mut ids.rdma_read_ic_id,
            ),
            (
                self.rdma_recv,
                EFA_QUERY_MR_VALIDITY_RDMA_RECV_IC_ID,
                &mut ids.rdma_recv_ic_id,
            ),
        ];
        let mut validity = 0;
        for (id, valid, out) in paths {
            if let Some(id) = id {
                *out = id;
                validity |= valid as u16;
            }
        }
        ids.validity = validity;
        ids
    }
}

/// Defines `refa_rdma_mr_query()`, which the C handler of the efa uAPI's
/// MR query method calls (`src/rdma/helpers.c`), for the driver `$ops`.
/// The method is offered (`driver_def`) only by drivers that implement
/// [`Operations::query_mr`]; invoke this once, for the one driver that does.
macro_rules! mr_query_method {
    ($ops:ty) => {
        /// # Safety
        ///
        /// Called by the efa MR query method's handler with an MR of a
        /// device of `$ops`, held by the method (read access), and `ids`
        /// valid for writes.
        #[no_mangle]
        unsafe extern "C" fn refa_rdma_mr_query(
            mr: *mut $crate::rdma::bindings::ib_mr,
            ids: *mut $crate::rdma::bindings::refa_mr_ic_ids,
        ) -> ::kernel::ffi::c_int {
            // SAFETY: Per the function's safety requirements; only devices of
            // `$ops` offer the method, so the MR is a `Mr<$ops>`.
            unsafe { $crate::rdma::mr::Mr::<$ops>::query_callback(mr, ids) }
        }
    };
}
pub(crate) use mr_query_method;

/// A memory region with the driver's data `O::Mr`.
///
/// # Invariants
///
/// Allocated by `reg_callback` as a `KBox<Self>` whose ownership the core
/// holds (through the `ib_mr` at offset 0) until `dereg_callback` takes it
/// back.
#[repr(C)]
pub(crate) struct Mr<O: Operations> {
    ib: Opaque<bindings::ib_mr>,
    data: O::Mr,
}

impl<O: Operations> Mr<O> {
    /// `reg_user_mr` of the `ib_device_ops` table.
    ///
    /// # Safety
    ///
    /// Called by the core with an initialised `Pd<O>` of a registered
    /// device, and `udata` null or valid for the call.
    pub(super) unsafe extern "C" fn reg_callback(
        pd: *mut bindings::ib_pd,
        start: u64,
        length: u64,
        iova: u64,
        access: kernel::ffi::c_int,
        dmah: *mut bindings::ib_dmah,
        udata: *mut bindings::ib_udata,
    ) -> *mut bindings::ib_mr {
        const_assert!(
            core::mem::offset_of!(Self, ib) == 0,
            "struct ib_mr must be at offset 0"
        );
        if !dmah.is_null() {
            // DMA handles (TPH steering) are not offered to drivers.
            return EOPNOTSUPP.to_ptr();
        }
        // SAFETY: An initialised `Pd<O>` per the safety requirements.
        let pd = unsafe { Pd::<O>::from_raw(pd) };
        // SAFETY: Null or valid for the call.
        let mut udata = unsafe { UData::from_raw(udata) };
        let req = MrRequest {
            start,
            length,
            iova,
            // The core passes `ib_access_flags` bits in an int.
            access: AccessFlags::from_raw(access as u32),
        };
        let dev = pd.device();
        // SAFETY: Operations are called only while the device is registered.
        Self::register(length, || unsafe {
            dev.with_registration_data(|reg| O::reg_user_mr(reg, pd, &req, &mut udata))
        })
    }

    /// `reg_user_mr_dmabuf` of the `ib_device_ops` table.
    ///
    /// # Safety
    ///
    /// Called by the core with an initialised `Pd<O>` of a registered
    /// device, and `attrs` the bundle of a user call, valid for the call.
    pub(super) unsafe extern "C" fn reg_dmabuf_callback(
        pd: *mut bindings::ib_pd,
        offset: u64,
        length: u64,
        iova: u64,
        fd: kernel::ffi::c_int,
        access: kernel::ffi::c_int,
        dmah: *mut bindings::ib_dmah,
        attrs: *mut bindings::uverbs_attr_bundle,
    ) -> *mut bindings::ib_mr {
        if !dmah.is_null() {
            // DMA handles (TPH steering) are not offered to drivers.
            return EOPNOTSUPP.to_ptr();
        }
        // SAFETY: An initialised `Pd<O>` per the safety requirements.
        let pd = unsafe { Pd::<O>::from_raw(pd) };
        // SAFETY: The driver udata lives in the bundle, valid for the call.
        let mut udata = unsafe { UData::from_raw(bindings::refa_attrs_driver_udata(attrs)) };
        let req = DmabufMrRequest {
            fd,
            offset,
            length,
            iova,
            // The core passes `ib_access_flags` bits in an int.
            access: AccessFlags::from_raw(access as u32),
        };
        let dev = pd.device();
        // SAFETY: Operations are called only while the device is registered.
        Self::register(length, || unsafe {
            dev.with_registration_data(|reg| O::reg_user_mr_dmabuf(reg, pd, &req, &mut udata))
        })
    }

    /// Boxes the MR the driver registers with `register_with`, for the core.
    fn register(
        length: u64,
        register_with: impl FnOnce() -> Result<(MrKeys, O::Mr)>,
    ) -> *mut bindings::ib_mr {
        // Allocated first: once the driver has registered the region,
        // nothing may fail.
        let slot = match KBox::<Self>::new_uninit(GFP_KERNEL) {
            Ok(slot) => slot,
            Err(_) => return ENOMEM.to_ptr(),
        };
        let (keys, data) = match register_with() {
            Ok(r) => r,
            Err(e) => return e.to_ptr(),
        };
        let this = KBox::write(
            slot,
            Self {
                ib: Opaque::zeroed(),
                data,
            },
        );
        let raw = KBox::into_raw(this);
        // SAFETY: Just allocated; the core reads the keys after this returns
        // and sets the remaining fields itself.
        unsafe {
            let ib = (*raw).ib.get();
            (*ib).lkey = keys.lkey;
            (*ib).rkey = keys.rkey;
            (*ib).length = length;
        }
        raw.cast()
    }

    /// The answer to the efa uAPI's MR query method, from
    /// [`Operations::query_mr`].
    ///
    /// # Safety
    ///
    /// `mr` is an MR `reg_callback` returned, of a registered `Device<O>`,
    /// held by the method for the call; `ids` is valid for writes.
    pub(crate) unsafe fn query_callback(
        mr: *mut bindings::ib_mr,
        ids: *mut bindings::refa_mr_ic_ids,
    ) -> kernel::ffi::c_int {
        // SAFETY: The core set the device after registration; it outlives
        // the MR.
        let dev = unsafe { super::device::Device::<O>::from_raw((*mr).device) };
        // SAFETY: `mr` is the `KBox<Self>` `reg_callback` leaked, alive while
        // the method holds it.
        let this = unsafe { &*mr.cast::<Self>() };
        // SAFETY: Methods run only while the device is registered.
        let ret = unsafe { dev.with_registration_data(|reg| O::query_mr(reg, &this.data)) };
        kernel::error::from_result(|| {
            let answer = ret?.to_raw();
            // SAFETY: `ids` is valid for writes per the safety requirements.
            unsafe { ids.write(answer) };
            Ok(0)
        })
    }

    /// `dereg_mr` of the `ib_device_ops` table.
    ///
    /// Always succeeds: the driver gets its data back and keeps whatever
    /// the device may still use.
    ///
    /// # Safety
    ///
    /// Called by the core once, for an MR `reg_callback` returned, whose
    /// `device` is a registered `Device<O>`, with `udata` null or valid for
    /// the call.
    pub(super) unsafe extern "C" fn dereg_callback(
        mr: *mut bindings::ib_mr,
        udata: *mut bindings::ib_udata,
    ) -> kernel::ffi::c_int {
        // SAFETY: The core set the device after registration; it outlives
        // the MR.
        let dev = unsafe { super::device::Device::<O>::from_raw((*mr).device) };
        // SAFETY: Null or valid for the call.
        let mut udata = unsafe { UData::from_raw(udata) };
        // SAFETY: `mr` is the `KBox` `reg_callback` leaked, handed back for
        // the last time; the core does not touch it after this returns 0.
        let this = unsafe { KBox::from_raw(mr.cast::<Self>()) };
        let data = KBox::into_inner(this).data;
        // SAFETY: Operations are called only while the device is registered.
        unsafe { dev.with_registration_data(|reg| O::dereg_mr(reg, data, &mut udata)) };
        0
    }
}
