// SPDX-License-Identifier: GPL-2.0

//! The RDMA cgroup (`rdma.max`): charging a device object a driver keeps
//! after the core released it.
//!
//! C header: [`include/linux/cgroup_rdma.h`](srctree/include/linux/cgroup_rdma.h)
//!
//! The core charges every object userspace creates to its creator's rdma
//! cgroup (`hca_object`) and uncharges it when the destroy succeeds. A
//! driver that keeps the object on the device past that (because a mapping
//! userspace kept still reaches it) charges it again with an [`HcaCharge`],
//! so that `rdma.max` keeps bounding what the device holds for the cgroup.

use super::{
    bindings,
    device::{
        Device,
        Operations, //
    },
};
use core::ptr::NonNull;
use kernel::prelude::*;

/// One HCA object of a device charged to an rdma cgroup: the calling
/// task's when it was made. Dropping it uncharges that cgroup.
///
/// Drop it before the device leaves the controller, which the core does in
/// `ib_unregister_device()` after it has removed every client: a charge
/// held by something that a user object or mmap entry keeps (refa keeps
/// its charges in the records of kept objects, which the last mapping's
/// `mmap_free` releases, and uverbs frees every mapping of a device when
/// its client is removed) is dropped in time. One dropped later uncharges
/// nothing and logs "Invalid device"; the device reference the charge holds
/// keeps that harmless.
///
/// # Invariants
///
/// `cg` is the cgroup `rdmacg_try_charge()` charged one HCA object of
/// `dev` to (with the reference the charge holds on it), or null on a
/// kernel without the rdma cgroup; `dev` holds a reference on the device's
/// memory.
pub(crate) struct HcaCharge {
    dev: NonNull<bindings::ib_device>,
    cg: *mut bindings::rdma_cgroup,
}

impl HcaCharge {
    /// Charges one HCA object of `dev` to the calling task's rdma cgroup.
    /// `EAGAIN` if that would take the cgroup, or one above it, past its
    /// `hca_object` limit.
    pub(crate) fn try_new<T: Operations>(dev: &Device<T>) -> Result<Self> {
        let raw = dev.as_raw();
        #[cfg_attr(not(CONFIG_CGROUP_RDMA), expect(unused_mut))]
        let mut cg = core::ptr::null_mut();
        // SAFETY: `raw` is a live device; the core registers its cgroup
        // device with the controller before it calls any operation and
        // unregisters it after the last, so the charge is against a
        // registered device. `cg` is valid for writes.
        #[cfg(CONFIG_CGROUP_RDMA)]
        kernel::error::to_result(unsafe {
            bindings::rdmacg_try_charge(
                &mut cg,
                &raw mut (*raw).cg_device,
                bindings::rdmacg_resource_type_RDMACG_RESOURCE_HCA_OBJECT,
            )
        })?;
        // SAFETY: The device is live; the reference is dropped in `drop`.
        unsafe { bindings::ib_device_get(raw) };
        // INVARIANT: Charged just above, with a reference on the device.
        Ok(Self {
            // SAFETY: `as_raw()` of a live device is never null.
            dev: unsafe { NonNull::new_unchecked(raw) },
            cg,
        })
    }
}

impl Drop for HcaCharge {
    fn drop(&mut self) {
        // SAFETY: `cg` was charged one HCA object of `dev` (type
        // invariant), exactly once, and is uncharged once here, which also
        // drops the charge's reference on the cgroup. `dev` is live (the
        // reference taken in `try_new`): the controller only compares its
        // `cg_device` with those it has registered.
        #[cfg(CONFIG_CGROUP_RDMA)]
        unsafe {
            bindings::rdmacg_uncharge(
                self.cg,
                &raw mut (*self.dev.as_ptr()).cg_device,
                bindings::rdmacg_resource_type_RDMACG_RESOURCE_HCA_OBJECT,
            )
        };
        // SAFETY: Taken in `try_new`.
        unsafe { bindings::ib_device_put(self.dev.as_ptr()) };
    }
}

// SAFETY: The controller's functions may be called from any thread, and
// the device reference may be dropped from any.
unsafe impl Send for HcaCharge {}
// SAFETY: Shared references give no access.
unsafe impl Sync for HcaCharge {}
