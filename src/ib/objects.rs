// SPDX-License-Identifier: GPL-2.0

//! Address handles and memory regions.
//!
//! - An AH is the device's handle for a destination GID in a PD. The
//!   device has one per (PD, GID), shared by every verbs AH for that pair
//!   (see [`crate::dev::objects`]); its number goes back to userspace,
//!   which puts it into send requests.
//! - An MR pins user memory ([`Umem`]), describes it to the device with
//!   the largest page size the device supports and the memory allows, and
//!   carries the rights the device can enforce: local write always, remote
//!   read and write where the device does RDMA read and write. Rights it
//!   cannot enforce are refused rather than silently dropped.

use super::{
    IbDevice,
    RefaIb, //
};
use crate::{
    dev::{
        features::DeviceAttrs,
        objects::MrParams, //
    },
    hw::admin::{
        DeviceAttr as HwDeviceAttr,
        RegMrCmd, //
    },
    kernel_gaps::ratelimit::dev_ratelimited,
    rdma::{
        ah::{
            Ah,
            AhAttr, //
        },
        efa_abi::efa_ibv_create_ah_resp,
        mr::{
            DmabufMrRequest,
            MrInterconnects,
            MrKeys,
            MrRequest, //
        },
        pd::Pd,
        udata::UData,
        umem::{
            AccessFlags,
            Umem, //
        },
        verbs::Gid, //
    }, //
};
use kernel::{
    page::PAGE_SIZE,
    prelude::*, //
};

/// The driver's part of an address handle: the device's handle it uses.
pub(crate) struct AhData {
    pdn: u16,
    gid: Gid,
}

/// The driver's part of a memory region.
pub(crate) struct MrData {
    l_key: u32,
    /// What the MR query method reports.
    interconnects: MrInterconnects,
    /// The pinned memory the device reaches through the region.
    umem: Umem,
}

pub(super) fn create_ah(
    dev: &IbDevice<'_>,
    pdn: u16,
    attr: &AhAttr,
    udata: &mut UData<'_>,
) -> Result<impl PinInit<AhData, Error>> {
    udata.require_no_request()?;
    // An EFA address is a GID: an AH without one addresses nothing. (The
    // C driver sends whatever the unused GRH holds.)
    let gid = attr.dgid.ok_or(EINVAL)?;
    let ah = dev.core.get_ah(pdn, gid.0)?;
    let resp = efa_ibv_create_ah_resp {
        comp_mask: 0,
        efa_address_handle: ah,
        reserved_30: [0; 2],
    };
    if let Err(e) = udata.respond(&resp) {
        release_ah(dev, pdn, gid);
        return Err(e);
    }
    Ok(try_init!(AhData { pdn, gid }? Error))
}

pub(super) fn destroy_ah(dev: &IbDevice<'_>, ah: &Ah<RefaIb>) {
    release_ah(dev, ah.data().pdn, ah.data().gid);
}

fn release_ah(dev: &IbDevice<'_>, pdn: u16, gid: Gid) {
    if let Err(e) = dev.core.put_ah(pdn, gid.0) {
        dev_ratelimited!(
            dev_err,
            dev.core.dev(),
            "destroying the AH of PD {} failed: {}\n",
            pdn,
            e.to_errno()
        );
    }
}

/// The rights a device with `attrs` can enforce on a memory region.
fn supported_access(attrs: &DeviceAttrs) -> AccessFlags {
    let mut supported = AccessFlags::LOCAL_WRITE;
    if attrs.has_cap(HwDeviceAttr::RDMA_READ) {
        supported = supported | AccessFlags::REMOTE_READ;
    }
    if attrs.has_cap(HwDeviceAttr::RDMA_WRITE) {
        supported = supported | AccessFlags::REMOTE_WRITE;
    }
    supported
}

/// The REG_MR permissions for `access` on a device with `attrs`:
/// `EOPNOTSUPP` for rights it cannot enforce. Optional hints (relaxed
/// ordering) are no reason to refuse.
fn mr_permissions(access: AccessFlags, attrs: &DeviceAttrs) -> Result<u8> {
    let asked = access.without(AccessFlags::OPTIONAL);
    if !asked.without(supported_access(attrs)).is_empty() {
        return Err(EOPNOTSUPP);
    }
    let map = [
        (AccessFlags::LOCAL_WRITE, RegMrCmd::LOCAL_WRITE_ENABLE),
        (AccessFlags::REMOTE_WRITE, RegMrCmd::REMOTE_WRITE_ENABLE),
        (AccessFlags::REMOTE_READ, RegMrCmd::REMOTE_READ_ENABLE),
    ];
    Ok(map
        .iter()
        .filter(|(flag, _)| asked.contains(*flag))
        .fold(0, |perms, (_, field)| perms | field.mask()))
}

pub(super) fn reg_user_mr(
    dev: &IbDevice<'_>,
    pd: &Pd<RefaIb>,
    req: &MrRequest,
    udata: &mut UData<'_>,
) -> Result<(MrKeys, MrData)> {
    udata.require_no_request()?;
    let permissions = mr_permissions_of(dev, req.access)?;
    check_mr_length(dev, req.length)?;
    let umem = Umem::get(pd.device(), req.start, req.length, req.access)?;
    register_mr(dev, pd, umem, req.iova, req.length, permissions)
}

pub(super) fn reg_user_mr_dmabuf(
    dev: &IbDevice<'_>,
    pd: &Pd<RefaIb>,
    req: &DmabufMrRequest,
    udata: &mut UData<'_>,
) -> Result<(MrKeys, MrData)> {
    udata.require_no_request()?;
    let permissions = mr_permissions_of(dev, req.access)?;
    check_mr_length(dev, req.length)?;
    let umem = Umem::get_dmabuf(pd.device(), req.offset, req.length, req.fd, req.access)?;
    register_mr(dev, pd, umem, req.iova, req.length, permissions)
}

/// Refuses an empty region, and one longer than the device registers
/// (`max_mr_size` of query_device), before any memory is pinned.
fn check_mr_length(dev: &IbDevice<'_>, length: u64) -> Result {
    let max = u64::from(dev.attrs.queues.max_mr_pages).saturating_mul(PAGE_SIZE as u64);
    if length == 0 || length > max {
        return Err(EINVAL);
    }
    Ok(())
}

/// The REG_MR permissions for `access`, or `EOPNOTSUPP` (logged) for
/// rights the device cannot enforce.
fn mr_permissions_of(dev: &IbDevice<'_>, access: AccessFlags) -> Result<u8> {
    mr_permissions(access, &dev.attrs).inspect_err(|_| {
        dev_dbg!(
            dev.core.dev(),
            "MR access {:#x}, the device supports {:#x}\n",
            access.bits(),
            supported_access(&dev.attrs).bits()
        )
    })
}

/// Registers the pinned memory `umem` as a region of `length` bytes the
/// device knows at `iova`.
fn register_mr(
    dev: &IbDevice<'_>,
    pd: &Pd<RefaIb>,
    mut umem: Umem,
    iova: u64,
    length: u64,
    permissions: u8,
) -> Result<(MrKeys, MrData)> {
    let page_size = umem
        .best_page_size(dev.attrs.device.page_size_cap, iova)
        .ok_or(EOPNOTSUPP)?;
    let params = MrParams {
        pd: pd.data().pdn,
        iova,
        length,
        page_shift: page_size.trailing_zeros() as u8,
        permissions,
    };
    let blocks = umem.dma_blocks(page_size)?;
    // The page list is kernel memory sized by the user's region: no longer
    // than the device takes. (Pages smaller than the kernel's can exceed
    // the count `check_mr_length` allowed.)
    if blocks.len() > dev.attrs.queues.max_mr_pages as usize {
        return Err(EINVAL);
    }
    let registered = dev.core.reg_mr(&params, blocks)?;
    Ok((
        MrKeys {
            lkey: registered.l_key,
            rkey: registered.r_key,
        },
        MrData {
            l_key: registered.l_key,
            interconnects: MrInterconnects {
                recv: registered.recv_ic_id.map(u16::from),
                rdma_read: registered.rdma_read_ic_id.map(u16::from),
                rdma_recv: registered.rdma_recv_ic_id.map(u16::from),
            },
            umem,
        },
    ))
}

pub(super) fn query_mr(mr: &MrData) -> MrInterconnects {
    mr.interconnects
}

pub(super) fn dereg_mr(dev: &IbDevice<'_>, mr: MrData) {
    if let Err(e) = dev.core.dereg_mr(mr.l_key) {
        dev_ratelimited!(
            dev_err,
            dev.core.dev(),
            "deregistering MR {:#x} failed ({}); its pages stay pinned until the device is reset\n",
            mr.l_key,
            e.to_errno()
        );
        // The device may still reach the pages through the region.
        dev.core.keep_until_reset(mr.umem);
    }
}

#[kunit_tests(refa_ib_objects)]
mod tests {
    use super::*;

    #[test]
    fn mr_access_is_what_the_device_enforces() {
        let local = AccessFlags::LOCAL_WRITE;
        let read = AccessFlags::REMOTE_READ;
        let write = AccessFlags::REMOTE_WRITE;
        let plain = DeviceAttrs::with_device_caps(0);
        assert_eq!(mr_permissions(AccessFlags::empty(), &plain), Ok(0));
        assert_eq!(mr_permissions(local, &plain), Ok(0x1));
        assert_eq!(mr_permissions(local | read, &plain), Err(EOPNOTSUPP));
        assert_eq!(mr_permissions(local | write, &plain), Err(EOPNOTSUPP));

        let rdma = DeviceAttrs::with_device_caps(
            HwDeviceAttr::RDMA_READ.mask() | HwDeviceAttr::RDMA_WRITE.mask(),
        );
        assert_eq!(mr_permissions(local | read | write, &rdma), Ok(0x7));
        assert_eq!(mr_permissions(read, &rdma), Ok(0x4));
        let read_only = DeviceAttrs::with_device_caps(HwDeviceAttr::RDMA_READ.mask());
        assert_eq!(mr_permissions(local | read, &read_only), Ok(0x5));
        assert_eq!(mr_permissions(local | write, &read_only), Err(EOPNOTSUPP));
    }

    #[test]
    fn mr_access_refuses_unsupported_rights_but_not_hints() {
        let rdma = DeviceAttrs::with_device_caps(
            HwDeviceAttr::RDMA_READ.mask() | HwDeviceAttr::RDMA_WRITE.mask(),
        );
        let local = AccessFlags::LOCAL_WRITE;
        assert_eq!(
            mr_permissions(local | AccessFlags::REMOTE_ATOMIC, &rdma),
            Err(EOPNOTSUPP)
        );
        assert_eq!(mr_permissions(AccessFlags::MW_BIND, &rdma), Err(EOPNOTSUPP));
        assert_eq!(
            mr_permissions(local | AccessFlags::RELAXED_ORDERING, &rdma),
            Ok(0x1)
        );
        assert_eq!(
            supported_access(&rdma),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE
        );
    }
}
