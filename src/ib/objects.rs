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
    data::{
        counted,
        VerbsData, //
    },
    pd::PdData,
    uapi::*,
    RdmaDriver, //
};
use crate::{
    dev::{
        features::DeviceAttrs,
        objects::MrParams,
        pbl::PageList, //
    },
    hw::admin::{
        DeviceAttr as HwDeviceAttr,
        RegMrCmd, //
    },
    rdma::{
        ah::{
            Ah,
            AhAttr,
            DriverAh, //
        },
        device::{
            kind,
            Device,
            DriverObject,
            RegData, //
        },
        mr::{
            DmabufMrRequest,
            DriverMr,
            Mr,
            MrKeys,
            MrRequest, //
        },
        pd::Pd,
        udata::{
            AttrId,
            UData, //
        },
        umem::{
            Access,
            AccessFlags,
            Umem, //
        },
        verbs::Gid, //
    }, //
};
// out of tree: begin
use crate::kernel_gaps::ratelimit::dev_err_ratelimited;
// out of tree: end
use kernel::{
    page::PAGE_SIZE,
    prelude::*, //
};

/// The driver's part of an address handle: the device's handle it uses.
pub(crate) struct AhData {
    pdn: u16,
    gid: Gid,
}

impl DriverObject for AhData {
    type Driver = RdmaDriver;
    type Kind = kind::Ah;
}

#[vtable]
impl DriverAh for AhData {
    fn create<'a>(
        _dev: &Device<RdmaDriver>,
        data: &RegData<'a, RdmaDriver>,
        pd: &Pd<PdData>,
        attr: &AhAttr,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self>> {
        counted(
            &data.errors.create_ah,
            create_ah(data, pd.data().pdn, attr, udata),
        )
    }

    fn destroy<'a>(ah: &Ah<Self>, _dev: &Device<RdmaDriver>, data: &VerbsData<'a>) {
        release_ah(data, ah.data().pdn, ah.data().gid);
    }
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

/// The driver's part of a memory region.
pub(crate) struct MrData {
    l_key: u32,
    /// What the MR query method reports.
    interconnects: MrInterconnects,
    /// The pinned memory the device reaches through the region.
    umem: Umem,
}

impl DriverObject for MrData {
    type Driver = RdmaDriver;
    type Kind = kind::Mr;
}

#[vtable]
impl DriverMr for MrData {
    fn reg_user<'a>(
        _dev: &Device<RdmaDriver>,
        data: &VerbsData<'a>,
        pd: &Pd<PdData>,
        req: &MrRequest,
        udata: &mut UData<'_>,
    ) -> Result<(MrKeys, Self)> {
        counted(&data.errors.reg_mr, reg_user_mr(data, pd, req, udata))
    }

    fn reg_dmabuf<'a>(
        _dev: &Device<RdmaDriver>,
        data: &VerbsData<'a>,
        pd: &Pd<PdData>,
        req: &DmabufMrRequest,
        udata: &mut UData<'_>,
    ) -> Result<(MrKeys, Self)> {
        counted(
            &data.errors.reg_mr,
            reg_user_mr_dmabuf(data, pd, req, udata),
        )
    }

    fn dereg<'a>(mr: Self, _dev: &Device<RdmaDriver>, data: &VerbsData<'a>) {
        dereg_mr(data, mr);
    }
}

crate::rdma::mr::mr_method!(
    /// The answer to the efa uAPI's MR query method (`efadv_query_mr`), for
    /// its C handler in `uapi.c`.
    refa_efa_query_mr: RdmaDriver => query_mr
);

/// The efa uAPI's MR query method (`efadv_query_mr`): the interconnect ids
/// REG_MR returned, with their validity bits.
fn query_mr<'a>(
    mr: &Mr<MrData>,
    _dev: &Device<RdmaDriver>,
    _data: &VerbsData<'a>,
    udata: &mut UData<'_>,
) -> Result {
    let ids = mr.data().interconnects;
    let paths = [
        (ids.recv, EFA_QUERY_MR_VALIDITY_RECV_IC_ID),
        (ids.rdma_read, EFA_QUERY_MR_VALIDITY_RDMA_READ_IC_ID),
        (ids.rdma_recv, EFA_QUERY_MR_VALIDITY_RDMA_RECV_IC_ID),
    ];
    let validity = paths
        .iter()
        .filter(|(id, _)| id.is_some())
        .fold(0u16, |v, (_, bit)| v | *bit as u16);
    udata.copy_to_attr(
        AttrId::new(EFA_IB_ATTR_QUERY_MR_RESP_IC_ID_VALIDITY)?,
        &validity,
    )?;
    udata.copy_to_attr(
        AttrId::new(EFA_IB_ATTR_QUERY_MR_RESP_RECV_IC_ID)?,
        &ids.recv.unwrap_or(0),
    )?;
    udata.copy_to_attr(
        AttrId::new(EFA_IB_ATTR_QUERY_MR_RESP_RDMA_READ_IC_ID)?,
        &ids.rdma_read.unwrap_or(0),
    )?;
    udata.copy_to_attr(
        AttrId::new(EFA_IB_ATTR_QUERY_MR_RESP_RDMA_RECV_IC_ID)?,
        &ids.rdma_recv.unwrap_or(0),
    )
}

fn create_ah(
    data: &VerbsData<'_>,
    pdn: u16,
    attr: &AhAttr,
    udata: &mut UData<'_>,
) -> Result<AhData> {
    udata.require_no_request()?;
    // An EFA address is a GID: an AH without one addresses nothing. (The
    // C driver sends whatever the unused GRH holds.)
    let gid = attr.dgid.ok_or(EINVAL)?;
    let ah = data.core.get_ah(pdn, gid.0)?;
    let resp = efa_ibv_create_ah_resp {
        comp_mask: 0,
        efa_address_handle: ah,
        reserved_30: [0; 2],
    };
    if let Err(e) = udata.respond(&Uapi(resp)) {
        release_ah(data, pdn, gid);
        return Err(e);
    }
    Ok(AhData { pdn, gid })
}

fn release_ah(data: &VerbsData<'_>, pdn: u16, gid: Gid) {
    if let Err(e) = data.core.put_ah(pdn, gid.0) {
        dev_err_ratelimited!(
            data.core.dev(),
            "destroying the AH of PD {} failed: {}\n",
            pdn,
            e.to_errno()
        );
    }
}

/// The rights a device with `attrs` can enforce on a memory region.
fn supported_access(attrs: &DeviceAttrs) -> AccessFlags {
    let mut supported = AccessFlags::from(Access::LocalWrite);
    if attrs.has_cap(HwDeviceAttr::RDMA_READ) {
        supported |= Access::RemoteRead;
    }
    if attrs.has_cap(HwDeviceAttr::RDMA_WRITE) {
        supported |= Access::RemoteWrite;
    }
    supported
}

/// The REG_MR permissions for `access` on a device with `attrs`:
/// `EOPNOTSUPP` for rights it cannot enforce. Optional hints (relaxed
/// ordering) are no reason to refuse.
fn mr_permissions(access: AccessFlags, attrs: &DeviceAttrs) -> Result<u8> {
    // Unknown bits count as rights the device cannot enforce; optional
    // hints do not.
    let known = supported_access(attrs) | Access::Optional;
    if access.outside(known) != 0 {
        return Err(EOPNOTSUPP);
    }
    let map = [
        (Access::LocalWrite, RegMrCmd::LOCAL_WRITE_ENABLE),
        (Access::RemoteWrite, RegMrCmd::REMOTE_WRITE_ENABLE),
        (Access::RemoteRead, RegMrCmd::REMOTE_READ_ENABLE),
    ];
    Ok(map
        .iter()
        .filter(|(flag, _)| access.contains(*flag))
        .fold(0, |perms, (_, field)| perms | field.mask()))
}

fn reg_user_mr(
    dev: &VerbsData<'_>,
    pd: &Pd<PdData>,
    req: &MrRequest,
    udata: &mut UData<'_>,
) -> Result<(MrKeys, MrData)> {
    udata.require_no_request()?;
    let permissions = mr_permissions_of(dev, req.access)?;
    check_mr_length(dev, req.length)?;
    let umem = Umem::get(udata, req.start, req.length, req.access)?;
    register_mr(dev, pd, umem, req.iova, req.length, permissions)
}

fn reg_user_mr_dmabuf(
    dev: &VerbsData<'_>,
    pd: &Pd<PdData>,
    req: &DmabufMrRequest,
    udata: &mut UData<'_>,
) -> Result<(MrKeys, MrData)> {
    udata.require_no_request()?;
    let permissions = mr_permissions_of(dev, req.access)?;
    check_mr_length(dev, req.length)?;
    let umem = Umem::get_dmabuf(udata, req.offset, req.length, req.fd, req.access)?;
    register_mr(dev, pd, umem, req.iova, req.length, permissions)
}

/// Refuses an empty region, and one longer than the device registers
/// (`max_mr_size` of query_device), before any memory is pinned.
fn check_mr_length(dev: &VerbsData<'_>, length: u64) -> Result {
    let max = u64::from(dev.attrs.queues.max_mr_pages).saturating_mul(PAGE_SIZE as u64);
    if length == 0 || length > max {
        return Err(EINVAL);
    }
    Ok(())
}

/// The REG_MR permissions for `access`, or `EOPNOTSUPP` (logged) for
/// rights the device cannot enforce.
fn mr_permissions_of(dev: &VerbsData<'_>, access: AccessFlags) -> Result<u8> {
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
    dev: &VerbsData<'_>,
    pd: &Pd<PdData>,
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
    let list = PageList::new(dev.core.dev().as_ref(), blocks)?;
    // On failure the pages stay pinned if the device may still use them.
    let (registered, umem) = dev.core.reg_mr(&params, list, umem)?;
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

fn dereg_mr(dev: &VerbsData<'_>, mr: MrData) {
    if let Err(e) = dev.core.dereg_mr(mr.l_key) {
        dev_err_ratelimited!(
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
        let local = AccessFlags::from(Access::LocalWrite);
        let read = AccessFlags::from(Access::RemoteRead);
        let write = AccessFlags::from(Access::RemoteWrite);
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
        let local = AccessFlags::from(Access::LocalWrite);
        assert_eq!(
            mr_permissions(local | Access::RemoteAtomic, &rdma),
            Err(EOPNOTSUPP)
        );
        assert_eq!(
            mr_permissions(Access::MwBind.into(), &rdma),
            Err(EOPNOTSUPP)
        );
        assert_eq!(
            mr_permissions(local | Access::RelaxedOrdering, &rdma),
            Ok(0x1)
        );
        assert_eq!(
            supported_access(&rdma),
            Access::LocalWrite | Access::RemoteRead | Access::RemoteWrite
        );
    }
}
