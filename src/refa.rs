// SPDX-License-Identifier: GPL-2.0

//! refa: a driver for devices with the Elastic Fabric Adapter interface.
//!
//! Binds EFA PCI functions and, as it grows, brings them up through their
//! admin queue and registers them with the RDMA core, speaking the uAPI of
//! `include/uapi/rdma/efa-abi.h` so that rdma-core's `efa` provider works
//! unchanged.

use kernel::{
    device::Core,
    pci,
    prelude::*, //
};

mod rdma;
mod ring;

/// Size of the register file at the start of BAR0 (up to and including the
/// event queue doorbell).
const REG_FILE_SIZE: usize = 0x6c;
const REG_BAR: u32 = 0;

struct RefaDriver;

struct RefaDevice<'bound> {
    pdev: &'bound pci::Device,
    _regs: pci::Bar<'bound, REG_FILE_SIZE>,
}

kernel::pci_device_table!(
    PCI_TABLE,
    <RefaDriver as pci::Driver>::IdInfo,
    [
        (pci::DeviceId::from_id(pci::Vendor::AMAZON, 0xefa0), ()),
        (pci::DeviceId::from_id(pci::Vendor::AMAZON, 0xefa1), ()),
        (pci::DeviceId::from_id(pci::Vendor::AMAZON, 0xefa2), ()),
        (pci::DeviceId::from_id(pci::Vendor::AMAZON, 0xefa3), ()),
    ]
);

impl pci::Driver for RefaDriver {
    type IdInfo = ();
    type Data<'bound> = RefaDevice<'bound>;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        pdev.enable_device_mem()?;
        pdev.set_master();
        let regs = pdev.iomap_region_sized::<REG_FILE_SIZE>(REG_BAR, c"refa")?;
        dev_info!(
            pdev,
            "EFA device {}:{:04x} rev {}, registers mapped\n",
            pdev.vendor_id(),
            pdev.device_id(),
            pdev.revision_id()
        );
        Ok(RefaDevice { pdev, _regs: regs })
    }
}

impl Drop for RefaDevice<'_> {
    fn drop(&mut self) {
        dev_dbg!(self.pdev, "unbound\n");
    }
}

kernel::module_pci_driver! {
    type: RefaDriver,
    name: "refa",
    authors: ["The refa developers"],
    description: "Rust driver for Elastic Fabric Adapter devices",
    license: "GPL",
}
