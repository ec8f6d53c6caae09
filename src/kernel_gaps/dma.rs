// SPDX-License-Identifier: GPL-2.0

// out of tree: begin
//! The DMA segment boundary, out of tree only: the series adds
//! `dma::Device::dma_set_seg_boundary()` (patches/rust/), which
//! [`DeviceExt`] stands in for with the same name and signature.
//!
//! C header: [`include/linux/dma-mapping.h`](srctree/include/linux/dma-mapping.h)

use kernel::{
    device::{
        self,
        Core, //
    },
    dma::DmaMask,
    prelude::*, //
};

/// The method patches/rust/ adds to `dma::Device`.
pub(crate) trait DeviceExt<'a>: AsRef<device::Device<Core<'a>>> {
    /// Sets the boundary that no DMA segment of the device may cross, as a
    /// mask (`dma_set_seg_boundary()`); the DMA layer's default is 4 GiB.
    ///
    /// # Safety
    ///
    /// No DMA allocation or mapping for the device may run concurrently,
    /// as for `dma::Device::dma_set_max_seg_size`.
    unsafe fn dma_set_seg_boundary(&self, mask: DmaMask) {
        // A boundary beyond what an `unsigned long` holds is no boundary.
        let mask = mask.value().try_into().unwrap_or(c_ulong::MAX);
        // `device::Device` is `#[repr(transparent)]` over
        // `Opaque<struct device>`; `as_raw()` is private to the kernel crate.
        let dev = core::ptr::from_ref(self.as_ref()).cast_mut().cast();
        // SAFETY: `dev` is a valid `struct device`, of a device in the core
        // context, whose DMA parameters its bus set up when it added it (the
        // C function WARNs, and changes nothing, for one without). Our
        // caller promises that nothing maps or allocates for it meanwhile,
        // so the write races with no reader.
        unsafe { super::bindings::dma_set_seg_boundary(dev, mask) }
    }
}

impl<'a, D: kernel::dma::Device<'a>> DeviceExt<'a> for D {}
// out of tree: end
