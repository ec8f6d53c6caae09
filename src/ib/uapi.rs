// SPDX-License-Identifier: GPL-2.0

//! The EFA uAPI (`include/uapi/rdma/efa-abi.h`): its structures and
//! constants as bindgen generated them from the kernel's header at build
//! time (see `Kbuild`), never retyped; the proof that the structures the
//! driver exchanges with userspace are plain bytes; and the driver's own
//! uverbs methods and attributes, whose tree is C (`uapi.c`).

#[allow(
    clippy::all,
    clippy::as_underscore,
    clippy::cast_lossless,
    clippy::ptr_as_ptr,
    clippy::ref_as_ptr,
    dead_code,
    missing_docs,
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    unreachable_pub,
    clippy::undocumented_unsafe_blocks
)]
mod raw {
    use kernel::ffi;
    use pin_init::MaybeZeroable;

    include!(concat!(env!("REFA_OBJTREE"), "/src/ib/uapi_generated.rs"));
}

pub(crate) use raw::{
    efa_comp_cntr_create_attrs_EFA_IB_ATTR_CREATE_COMP_CNTR_COMP_BUFFER as EFA_IB_ATTR_CREATE_COMP_CNTR_COMP_BUFFER,
    efa_comp_cntr_create_attrs_EFA_IB_ATTR_CREATE_COMP_CNTR_ERR_BUFFER as EFA_IB_ATTR_CREATE_COMP_CNTR_ERR_BUFFER,
    efa_ibv_alloc_pd_resp,
    efa_ibv_alloc_ucontext_cmd,
    efa_ibv_alloc_ucontext_resp,
    efa_ibv_create_ah_resp,
    efa_ibv_create_cq,
    efa_ibv_create_cq_resp,
    efa_ibv_create_qp,
    efa_ibv_create_qp_resp,
    efa_ibv_ex_query_device_resp,
    efa_ibv_user_cmds_supp_udata_EFA_USER_CMDS_SUPP_UDATA_CREATE_AH as EFA_USER_CMDS_SUPP_UDATA_CREATE_AH,
    efa_ibv_user_cmds_supp_udata_EFA_USER_CMDS_SUPP_UDATA_QUERY_DEVICE as EFA_USER_CMDS_SUPP_UDATA_QUERY_DEVICE,
    efa_query_mr_attrs_EFA_IB_ATTR_QUERY_MR_RESP_IC_ID_VALIDITY as EFA_IB_ATTR_QUERY_MR_RESP_IC_ID_VALIDITY,
    efa_query_mr_attrs_EFA_IB_ATTR_QUERY_MR_RESP_RDMA_READ_IC_ID as EFA_IB_ATTR_QUERY_MR_RESP_RDMA_READ_IC_ID,
    efa_query_mr_attrs_EFA_IB_ATTR_QUERY_MR_RESP_RDMA_RECV_IC_ID as EFA_IB_ATTR_QUERY_MR_RESP_RDMA_RECV_IC_ID,
    efa_query_mr_attrs_EFA_IB_ATTR_QUERY_MR_RESP_RECV_IC_ID as EFA_IB_ATTR_QUERY_MR_RESP_RECV_IC_ID,
    EFA_ALLOC_UCONTEXT_CMD_SUPP_CAPS_MIN_SQ_WR,
    EFA_ALLOC_UCONTEXT_CMD_SUPP_CAPS_TX_BATCH,
    EFA_CREATE_CQ_RESP_DB_OFF,
    EFA_CREATE_CQ_WITH_COMPLETION_CHANNEL,
    EFA_CREATE_CQ_WITH_SGID,
    EFA_CREATE_CQ_WITH_SQ_COMP_64_BIT_REQ_ID,
    EFA_CREATE_QP_WITH_SQ_64_BIT_REQ_ID,
    EFA_CREATE_QP_WITH_UNSOLICITED_WRITE_RECV,
    EFA_QP_DRIVER_TYPE_SRD,
    EFA_QUERY_DEVICE_CAPS_COMP_CNTR,
    EFA_QUERY_DEVICE_CAPS_CQ_NOTIFICATIONS,
    EFA_QUERY_DEVICE_CAPS_CQ_WITH_EXT_MEM,
    EFA_QUERY_DEVICE_CAPS_CQ_WITH_SGID,
    EFA_QUERY_DEVICE_CAPS_DATA_POLLING_128,
    EFA_QUERY_DEVICE_CAPS_RDMA_READ,
    EFA_QUERY_DEVICE_CAPS_RDMA_WRITE,
    EFA_QUERY_DEVICE_CAPS_RNR_RETRY,
    EFA_QUERY_DEVICE_CAPS_SQ_64_BIT_REQ_ID,
    EFA_QUERY_DEVICE_CAPS_UNSOLICITED_WRITE_RECV,
    EFA_QUERY_MR_VALIDITY_RDMA_READ_IC_ID,
    EFA_QUERY_MR_VALIDITY_RDMA_RECV_IC_ID,
    EFA_QUERY_MR_VALIDITY_RECV_IC_ID,
    EFA_UVERBS_ABI_VERSION, //
};

use crate::kernel_gaps::transmute::impl_bytes_for_c_struct;

// The structures the driver reads from and writes to userspace.
impl_bytes_for_c_struct! {
    efa_ibv_alloc_ucontext_cmd {
        supported_caps,
        reserved_20
    }
    efa_ibv_alloc_ucontext_resp {
        comp_mask,
        cmds_supp_udata_mask,
        sub_cqs_per_cq,
        inline_buf_size,
        max_llq_size,
        max_tx_batch,
        min_sq_wr,
        inline_buf_size_ex,
        reserved_b0,
    }
    efa_ibv_alloc_pd_resp {
        comp_mask,
        pdn,
        reserved_30
    }
    efa_ibv_ex_query_device_resp {
        comp_mask,
        max_sq_wr,
        max_rq_wr,
        max_sq_sge,
        max_rq_sge,
        max_rdma_size,
        device_caps,
    }
    efa_ibv_create_cq {
        comp_mask,
        cq_entry_size,
        num_sub_cqs,
        flags,
        reserved_58
    }
    efa_ibv_create_cq_resp {
        comp_mask,
        reserved_20,
        q_mmap_key,
        q_mmap_size,
        cq_idx,
        reserved_d0,
        db_off,
        db_mmap_key,
    }
    efa_ibv_create_ah_resp {
        comp_mask,
        efa_address_handle,
        reserved_30
    }
    efa_ibv_create_qp {
        comp_mask,
        rq_ring_size,
        sq_ring_size,
        driver_qp_type,
        flags,
        sl,
        reserved_98
    }
    efa_ibv_create_qp_resp {
        comp_mask,
        rq_db_offset,
        sq_db_offset,
        llq_desc_offset,
        rq_mmap_key,
        rq_mmap_size,
        rq_db_mmap_key,
        sq_db_mmap_key,
        llq_desc_mmap_key,
        send_sub_cq_idx,
        recv_sub_cq_idx,
        reserved_1e0,
    }
}

crate::rdma::uverbs::uapi_definitions!(
    /// The efa uAPI's driver methods and attributes: the MR query method,
    /// and the buffer attributes of completion counter creation
    /// (`refa_efa_uapi_defs` in `uapi.c`).
    pub(crate) fn efa_uapi = refa_efa_uapi_defs
);
