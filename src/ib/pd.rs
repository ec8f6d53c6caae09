// SPDX-License-Identifier: GPL-2.0

//! Protection domains: ALLOC_PD / DEALLOC_PD; the number goes back to
//! userspace.

use super::{
    data::{
        counted,
        VerbsData, //
    },
    uapi::efa_ibv_alloc_pd_resp,
    RdmaDriver, //
};
use crate::{
    dev::lifetime::{
        ObjectId,
        RecordSlot, //
    },
    rdma::{
        device::{
            kind,
            Device,
            DriverObject,
            RegData, //
        },
        pd::{
            DriverPd,
            Pd, //
        },
        udata::UData, //
    }, //
};
use kernel::prelude::*;

/// The driver's part of a protection domain, held in the device's records.
pub(crate) struct PdData {
    pub(super) pdn: u16,
}

impl DriverObject for PdData {
    type Driver = RdmaDriver;
    type Kind = kind::Pd;
}

impl DriverPd for PdData {
    fn alloc<'a>(
        _dev: &Device<RdmaDriver>,
        data: &RegData<'a, RdmaDriver>,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self>> {
        counted(&data.errors.alloc_pd, alloc(data, udata))
    }

    fn dealloc<'a>(pd: &Pd<Self>, _dev: &Device<RdmaDriver>, data: &VerbsData<'a>) {
        data.core.release(ObjectId::Pd(pd.data().pdn));
    }

    fn may_dealloc<'a>(pd: &Pd<Self>, dev: &Device<RdmaDriver>, data: &VerbsData<'a>) -> Result {
        // A QP kept on the device after its verbs object (its send queue is
        // still mapped) holds its PD there.
        data.charge_if_kept(dev, ObjectId::Pd(pd.data().pdn))
    }
}

fn alloc(data: &VerbsData<'_>, udata: &mut UData<'_>) -> Result<PdData> {
    udata.require_no_request()?;
    let slot = RecordSlot::new::<()>(None)?;
    let pdn = data.core.alloc_pd()?;
    data.core.record(slot, ObjectId::Pd(pdn), &[])?;
    let resp = efa_ibv_alloc_pd_resp {
        comp_mask: 0,
        pdn,
        reserved_30: [0; 2],
    };
    if let Err(e) = udata.respond(&resp) {
        data.core.release(ObjectId::Pd(pdn));
        return Err(e);
    }
    Ok(PdData { pdn })
}
