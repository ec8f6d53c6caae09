// SPDX-License-Identifier: GPL-2.0-only

//! The data path: send and receive descriptors, completions, event queue
//! entries and doorbells.
//!
//! * Send queues are low-latency queues (LLQ) in device memory (the memory
//!   BAR): userspace writes whole 64-byte [`TxWqe`] or 128-byte [`TxWqe128`]
//!   entries, then writes its free-running 16-bit producer counter to the
//!   queue's doorbell ([`wq_doorbell`]). The WQE's phase bit starts at 0 and
//!   flips each time the ring wraps.
//! * Receive queues live in host memory: 16-byte [`RxDesc`] entries, one or
//!   more per work request, and the same producer-counter doorbell.
//! * Completion queues live in host memory: a CQ is `num_sub_cqs` rings back
//!   to back, each of 16-byte ([`RxCdesc`], [`TxCdesc`]) or 32-byte
//!   ([`RxCdescEx`]) entries starting with [`CdescCommon`]. The device flips
//!   the phase each time a sub-CQ wraps; the first pass has phase 1. The CQ
//!   doorbell ([`cq_doorbell`]) reports consumption and arms the CQ.
//! * Event queues (interrupt-driven CQs) are host rings of 16-byte [`Eqe`]
//!   entries, phase starting at 1, acknowledged through the `EQ_DB`
//!   register.
//!
//! Masks of bit fields are [`Field`] constants on the structure, named like
//! the C masks without the structure prefix and `_MASK` (C
//! `EFA_IO_TX_META_DESC_PHASE_MASK` is [`TxMetaDesc::PHASE`]). C unions are
//! byte arrays with typed accessors. The 128-byte WQE forms come from
//! rdma-core's copy of the header, which the kernel's lacks.

use super::wire::{self, Field};

/// Buffer descriptors in a 64- or 128-byte send WQE.
pub const TX_DESC_NUM_BUFS: usize = 2;
/// Local buffer descriptors in an RDMA WQE.
pub const TX_DESC_NUM_RDMA_BUFS: usize = 1;
/// Inline data capacity of a 64-byte send WQE.
pub const TX_DESC_INLINE_MAX_SIZE: usize = 32;
/// Inline data capacity of a 128-byte send WQE (rdma-core).
pub const TX_DESC_INLINE_MAX_SIZE_128: usize = 80;
/// Size of immediate data.
pub const TX_DESC_IMM_DATA_SIZE: usize = 4;
/// Page addresses inline in a fast-registration WQE.
pub const TX_DESC_INLINE_PBL_SIZE: usize = 1;
/// Size of a 64-byte send WQE ([`TxWqe`]).
pub const TX_DESC_SIZE_64: usize = 64;
/// Size of a 128-byte send WQE ([`TxWqe128`]).
pub const TX_DESC_SIZE_128: usize = 128;
/// Size of a receive descriptor ([`RxDesc`]).
pub const RX_DESC_SIZE: usize = 16;
/// Size of a basic completion entry ([`RxCdesc`], [`TxCdesc`]).
pub const CDESC_SIZE: usize = 16;
/// Size of an extended completion entry ([`RxCdescEx`]).
pub const CDESC_EX_SIZE: usize = 32;
/// Size of an event queue entry ([`Eqe`]).
pub const EQE_SIZE: usize = 16;
/// Bytes at the start of every UD receive buffer reserved for the GRH
/// (the InfiniBand UD convention the `efa` provider and its users follow:
/// receive buffers are posted 40 bytes longer than the largest message).
pub const RX_UD_GRH_SIZE: usize = 40;

wire::wire_enum! {
    /// Queue of a completion (C `enum efa_io_queue_type`).
    pub enum QueueType: u8 {
        /// Send queue.
        Send = 1,
        /// Receive queue.
        Recv = 2,
    }
}

wire::wire_enum! {
    /// Send operations (C `enum efa_io_send_op_type`).
    pub enum SendOpType: u8 {
        /// Send a message.
        Send = 0,
        /// RDMA read.
        RdmaRead = 1,
        /// RDMA write.
        RdmaWrite = 2,
        /// Fast memory registration (kernel consumers).
        FastReg = 3,
        /// Fast memory invalidation (kernel consumers).
        FastInv = 4,
    }
}

wire::wire_enum! {
    /// Completion status (C `enum efa_io_comp_status`).
    pub enum CompStatus: u8 {
        /// Success.
        Ok = 0,
        /// Flushed when the queue pair was destroyed or failed.
        Flushed = 1,
        /// Internal queue pair error.
        LocalErrorQpInternalError = 2,
        /// Unsupported operation.
        LocalErrorUnsupportedOp = 3,
        /// Invalid address handle.
        LocalErrorInvalidAh = 4,
        /// Local key unknown or not covering the buffer.
        LocalErrorInvalidLkey = 5,
        /// Message too long.
        LocalErrorBadLength = 6,
        /// Remote key unknown or not covering the remote buffer.
        RemoteErrorBadAddress = 7,
        /// Connection reset by the remote side.
        RemoteErrorAbort = 8,
        /// Destination queue pair missing or in error.
        RemoteErrorBadDestQpn = 9,
        /// Receiver not ready (no receive WQE posted).
        RemoteErrorRnr = 10,
        /// Receive buffers too short.
        RemoteErrorBadLength = 11,
        /// Unexpected status from the responder.
        RemoteErrorBadStatus = 12,
        /// Remote stopped responding.
        LocalErrorUnrespRemote = 13,
        /// Remote has no address handle for us (needed for RDMA).
        RemoteErrorUnknownPeer = 14,
        /// Remote never responded.
        LocalErrorUnreachRemote = 15,
        /// Remote lacks a needed feature.
        RemoteErrorFeatureMismatch = 18,
    }
}

wire::wire_enum! {
    /// Page list forms of fast registration (C `enum efa_io_frwr_pbl_mode`).
    pub enum FrwrPblMode: u8 {
        /// The page address is inline.
        InlinePbl = 0,
        /// `pbl` is the address of a page list.
        DirectPbl = 1,
    }
}

/// Processing hint of [`TxMetaDesc::PROCESSING_HINTS`]: optimise for
/// packets per second.
pub const PROCESSING_HINT_BURST_PPS_SENSITIVE: u8 = 1 << 0;

wire::wire_struct! {
    /// Bits 63:16 of a 64-bit request id (C `efa_io_req_id_ex`).
    pub struct ReqIdEx(6) {
        /// Bits 31:16, 47:32 and 63:48.
        pub w: [u16; 3],
    }
}

impl ReqIdEx {
    /// The high 48 bits of `id`.
    pub const fn from_id(id: u64) -> Self {
        Self {
            w: [(id >> 16) as u16, (id >> 32) as u16, (id >> 48) as u16],
        }
    }

    /// The 64-bit id whose low 16 bits are `low`.
    pub const fn id(&self, low: u16) -> u64 {
        low as u64 | (self.w[0] as u64) << 16 | (self.w[1] as u64) << 32 | (self.w[2] as u64) << 48
    }
}

wire::wire_struct! {
    /// First 32 bytes of a send WQE (C `efa_io_tx_meta_desc`).
    pub struct TxMetaDesc(32) {
        /// Request id, echoed in the send completion (low 16 bits when
        /// 64-bit ids are on).
        pub req_id: u16,
        /// [`TxMetaDesc::OP_TYPE`], [`TxMetaDesc::HAS_IMM`],
        /// [`TxMetaDesc::INLINE_MSG`], [`TxMetaDesc::META_EXTENSION`],
        /// [`TxMetaDesc::META_DESC`].
        pub ctrl1: u8,
        /// [`TxMetaDesc::PHASE`], [`TxMetaDesc::FIRST`],
        /// [`TxMetaDesc::LAST`], [`TxMetaDesc::COMP_REQ`].
        pub ctrl2: u8,
        /// Destination queue pair number.
        pub dest_qp_num: u16,
        /// Inline message length in bytes with `INLINE_MSG`, otherwise the
        /// number of buffer descriptors.
        pub length: u16,
        /// Immediate data, with `HAS_IMM`.
        pub immediate_data: u32,
        /// Destination address handle.
        pub ah: u16,
        /// [`TxMetaDesc::PROCESSING_HINTS`].
        pub ctrl3: u8,
        /// Reserved, zero.
        pub reserved: u8,
        /// Queue key.
        pub qkey: u32,
        /// Reserved, zero.
        pub reserved2: [u8; 6],
        /// Request id bits 63:16, when 64-bit ids are on.
        pub req_id_ex: ReqIdEx,
    }
}

impl TxMetaDesc {
    /// `ctrl1`: [`SendOpType`].
    pub const OP_TYPE: Field<u8> = Field::new(0x0f);
    /// `ctrl1`: `immediate_data` is valid.
    pub const HAS_IMM: Field<u8> = Field::new(0x10);
    /// `ctrl1`: the message is inline after this descriptor.
    pub const INLINE_MSG: Field<u8> = Field::new(0x20);
    /// `ctrl1`: extended metadata (must be zero).
    pub const META_EXTENSION: Field<u8> = Field::new(0x40);
    /// `ctrl1`: this is a metadata descriptor (must be set).
    pub const META_DESC: Field<u8> = Field::new(0x80);
    /// `ctrl2`: phase of the WQE.
    pub const PHASE: Field<u8> = Field::new(0x01);
    /// `ctrl2`: first descriptor of the request (must be set).
    pub const FIRST: Field<u8> = Field::new(0x04);
    /// `ctrl2`: last descriptor of the request (must be set).
    pub const LAST: Field<u8> = Field::new(0x08);
    /// `ctrl2`: post a completion once sent.
    pub const COMP_REQ: Field<u8> = Field::new(0x10);
    /// `ctrl3`: processing hints
    /// ([`PROCESSING_HINT_BURST_PPS_SENSITIVE`]).
    pub const PROCESSING_HINTS: Field<u8> = Field::new(0x03);

    /// The 64-bit request id (`req_id` and `req_id_ex`).
    pub const fn req_id_64(&self) -> u64 {
        self.req_id_ex.id(self.req_id)
    }

    /// Sets `req_id` and `req_id_ex` from a 64-bit request id.
    pub const fn set_req_id_64(&mut self, id: u64) {
        self.req_id = id as u16;
        self.req_id_ex = ReqIdEx::from_id(id);
    }
}

wire::wire_struct! {
    /// A local buffer of a send WQE (C `efa_io_tx_buf_desc`).
    pub struct TxBufDesc(16) {
        /// Length in bytes.
        pub length: u32,
        /// [`TxBufDesc::LKEY`].
        pub lkey: u32,
        /// Address bits 31:0.
        pub buf_addr_lo: u32,
        /// Address bits 63:32.
        pub buf_addr_hi: u32,
    }
}

impl TxBufDesc {
    /// `lkey`: local memory key (bits 31:24 reserved).
    pub const LKEY: Field<u32> = Field::new(0x00ff_ffff);

    /// The buffer address.
    pub const fn buf_addr(&self) -> u64 {
        ((self.buf_addr_hi as u64) << 32) | self.buf_addr_lo as u64
    }

    /// Sets the buffer address.
    pub const fn set_buf_addr(&mut self, addr: u64) {
        self.buf_addr_lo = addr as u32;
        self.buf_addr_hi = (addr >> 32) as u32;
    }
}

wire::wire_struct! {
    /// Remote buffer of an RDMA WQE (C `efa_io_remote_mem_addr`).
    pub struct RemoteMemAddr(16) {
        /// Length in bytes.
        pub length: u32,
        /// Remote memory key.
        pub rkey: u32,
        /// Address bits 31:0.
        pub buf_addr_lo: u32,
        /// Address bits 63:32.
        pub buf_addr_hi: u32,
    }
}

impl RemoteMemAddr {
    /// The remote address.
    pub const fn buf_addr(&self) -> u64 {
        ((self.buf_addr_hi as u64) << 32) | self.buf_addr_lo as u64
    }

    /// Sets the remote address.
    pub const fn set_buf_addr(&mut self, addr: u64) {
        self.buf_addr_lo = addr as u32;
        self.buf_addr_hi = (addr >> 32) as u32;
    }
}

wire::wire_struct! {
    /// Body of a 64-byte RDMA WQE (C `efa_io_rdma_req`).
    pub struct RdmaReq(32) {
        /// Remote buffer.
        pub remote_mem: RemoteMemAddr,
        /// Local buffer.
        pub local_mem: [TxBufDesc; 1],
    }
}

wire::wire_struct! {
    /// Body of a fast-registration WQE (C `efa_io_fast_mr_reg_req`).
    pub struct FastMrRegReq(32) {
        /// New local key of the region.
        pub lkey: u32,
        /// [`FastMrRegReq::LOCAL_WRITE_ENABLE`] ...
        pub permissions: u8,
        /// [`FastMrRegReq::PHYS_PAGE_SIZE_SHIFT`],
        /// [`FastMrRegReq::PBL_MODE`].
        pub flags: u8,
        /// Reserved, zero.
        pub reserved: [u8; 2],
        /// I/O virtual address of the region.
        pub iova: u64,
        /// Region length in bytes.
        pub mr_length: u64,
        /// Page list union: the single page address
        /// ([`FrwrPblMode::InlinePbl`]) or the page list address
        /// ([`FrwrPblMode::DirectPbl`]); both are one `u64`.
        pub pbl: u64,
    }
}

impl FastMrRegReq {
    /// `permissions`: local write.
    pub const LOCAL_WRITE_ENABLE: Field<u8> = Field::new(0x1);
    /// `permissions`: remote write.
    pub const REMOTE_WRITE_ENABLE: Field<u8> = Field::new(0x2);
    /// `permissions`: remote read.
    pub const REMOTE_READ_ENABLE: Field<u8> = Field::new(0x4);
    /// `flags`: log2 of the page size.
    pub const PHYS_PAGE_SIZE_SHIFT: Field<u8> = Field::new(0x1f);
    /// `flags`: [`FrwrPblMode`].
    pub const PBL_MODE: Field<u8> = Field::new(0x60);
}

wire::wire_struct! {
    /// Body of a fast-invalidation WQE (C `efa_io_fast_mr_inv_req`).
    pub struct FastMrInvReq(32) {
        /// Local key of the region to invalidate.
        pub lkey: u32,
        /// Reserved, zero.
        pub reserved: [u8; 28],
    }
}

wire::wire_struct! {
    /// A 64-byte send WQE (C `efa_io_tx_wqe`).
    pub struct TxWqe(64) {
        /// Metadata.
        pub meta: TxMetaDesc,
        /// Body union, by operation; inline data is the bytes themselves.
        pub data: [u8; 32],
    }
}

wire::wire_union! {
    TxWqe.data[32] {
        /// Local buffers of a send ([`TxMetaDesc::length`] of them).
        sgl / set_sgl: [TxBufDesc; 2],
        /// Remote and local buffer of an RDMA read or write.
        rdma_req / set_rdma_req: RdmaReq,
        /// Fast registration.
        reg_mr_req / set_reg_mr_req: FastMrRegReq,
        /// Fast invalidation.
        inv_mr_req / set_inv_mr_req: FastMrInvReq,
    }
}

wire::wire_struct! {
    /// Body of a 128-byte RDMA WQE (rdma-core `efa_io_rdma_req_128`).
    pub struct RdmaReq128(96) {
        /// Remote buffer.
        pub remote_mem: RemoteMemAddr,
        /// Union of the local buffer ([`RdmaReq128::local_mem`]) and inline
        /// write data (the bytes themselves).
        pub u: [u8; 80],
    }
}

wire::wire_union! {
    RdmaReq128.u[80] {
        /// Local buffer.
        local_mem / set_local_mem: [TxBufDesc; 1],
    }
}

wire::wire_struct! {
    /// A 128-byte send WQE (rdma-core `efa_io_tx_wqe_128`), used for inline
    /// data beyond 32 bytes and inline RDMA write. Its body variants start
    /// like the 64-byte ones.
    pub struct TxWqe128(128) {
        /// Metadata.
        pub meta: TxMetaDesc,
        /// Body union, by operation; inline data is the bytes themselves.
        pub data: [u8; 96],
    }
}

wire::wire_union! {
    TxWqe128.data[96] {
        /// Local buffers of a send.
        sgl / set_sgl: [TxBufDesc; 2],
        /// RDMA request with a local buffer or inline data.
        rdma_req / set_rdma_req: RdmaReq128,
    }
}

wire::wire_struct! {
    /// A receive descriptor (C `efa_io_rx_desc`).
    pub struct RxDesc(16) {
        /// Address bits 31:0.
        pub buf_addr_lo: u32,
        /// Address bits 63:32.
        pub buf_addr_hi: u32,
        /// Request id, echoed in the receive completion.
        pub req_id: u16,
        /// Length in bytes.
        pub length: u16,
        /// [`RxDesc::LKEY`], [`RxDesc::FIRST`], [`RxDesc::LAST`].
        pub lkey_ctrl: u32,
    }
}

impl RxDesc {
    /// `lkey_ctrl`: local memory key.
    pub const LKEY: Field<u32> = Field::new(0x00ff_ffff);
    /// `lkey_ctrl`: first descriptor of the work request.
    pub const FIRST: Field<u32> = Field::new(1 << 30);
    /// `lkey_ctrl`: last descriptor of the work request.
    pub const LAST: Field<u32> = Field::new(1 << 31);

    /// The buffer address.
    pub const fn buf_addr(&self) -> u64 {
        ((self.buf_addr_hi as u64) << 32) | self.buf_addr_lo as u64
    }

    /// Sets the buffer address.
    pub const fn set_buf_addr(&mut self, addr: u64) {
        self.buf_addr_lo = addr as u32;
        self.buf_addr_hi = (addr >> 32) as u32;
    }
}

wire::wire_struct! {
    /// Start of every completion entry (C `efa_io_cdesc_common`).
    pub struct CdescCommon(6) {
        /// Request id of the completed WQE (low 16 bits when 64-bit ids are
        /// on).
        pub req_id: u16,
        /// [`CompStatus`].
        pub status: u8,
        /// [`CdescCommon::PHASE`], [`CdescCommon::Q_TYPE`],
        /// [`CdescCommon::HAS_IMM`], [`CdescCommon::OP_TYPE`],
        /// [`CdescCommon::UNSOLICITED`].
        pub flags: u8,
        /// Local queue pair number.
        pub qp_num: u16,
    }
}

impl CdescCommon {
    /// `flags`: phase of the entry.
    pub const PHASE: Field<u8> = Field::new(0x01);
    /// `flags`: [`QueueType`].
    pub const Q_TYPE: Field<u8> = Field::new(0x06);
    /// `flags`: `imm` is valid (receive completions).
    pub const HAS_IMM: Field<u8> = Field::new(0x08);
    /// `flags`: [`SendOpType`] of the completed operation.
    pub const OP_TYPE: Field<u8> = Field::new(0x70);
    /// `flags`: no receive WQE was consumed (RDMA write with immediate
    /// into a queue pair with unsolicited write receive).
    pub const UNSOLICITED: Field<u8> = Field::new(0x80);
}

wire::wire_struct! {
    /// A send completion (C `efa_io_tx_cdesc`).
    pub struct TxCdesc(16) {
        /// Common part.
        pub common: CdescCommon,
        /// Request id bits 63:16, when the CQ has 64-bit send ids.
        pub req_id_ex: ReqIdEx,
        /// Reserved, zero.
        pub reserved: [u8; 4],
    }
}

impl TxCdesc {
    /// The 64-bit request id.
    pub const fn req_id_64(&self) -> u64 {
        self.req_id_ex.id(self.common.req_id)
    }
}

wire::wire_struct! {
    /// A receive completion (C `efa_io_rx_cdesc`).
    pub struct RxCdesc(16) {
        /// Common part.
        pub common: CdescCommon,
        /// Received length, bits 15:0.
        pub length: u16,
        /// Address handle of the sender, [`RxCdesc::AH_INVALID`] if unknown.
        pub ah: u16,
        /// Queue pair number of the sender.
        pub src_qp_num: u16,
        /// Immediate data, with `HAS_IMM`.
        pub imm: u32,
    }
}

impl RxCdesc {
    /// `ah` of a sender without an address handle.
    pub const AH_INVALID: u16 = 0xffff;
}

wire::wire_struct! {
    /// RDMA write part of an extended receive completion (C
    /// `efa_io_rx_cdesc_rdma_write`).
    pub struct RxCdescRdmaWrite(2) {
        /// Received length, bits 31:16.
        pub length_hi: u16,
    }
}

wire::wire_struct! {
    /// An extended (32-byte) receive completion (C `efa_io_rx_cdesc_ex`).
    pub struct RxCdescEx(32) {
        /// Basic receive completion.
        pub base: RxCdesc,
        /// Union: [`RxCdescEx::rdma_write`] for RDMA write with immediate,
        /// otherwise the sender's address (GID) when `ah` is
        /// [`RxCdesc::AH_INVALID`] and the CQ has `SET_SRC_ADDR`.
        pub u: [u8; 16],
    }
}

wire::wire_union! {
    RxCdescEx.u[16] {
        /// High bits of the length of an RDMA write.
        rdma_write / set_rdma_write: RxCdescRdmaWrite,
    }
}

impl RxCdescEx {
    /// The sender's address (the union read as `src_addr`).
    pub const fn src_addr(&self) -> [u8; 16] {
        self.u
    }

    /// Sets the sender's address (the union written as `src_addr`).
    pub const fn set_src_addr(&mut self, addr: [u8; 16]) {
        self.u = addr;
    }

    /// The full 32-bit length of an RDMA write with immediate.
    pub fn rdma_write_length(&self) -> u32 {
        u32::from(self.base.length) | u32::from(self.rdma_write().length_hi) << 16
    }
}

wire::wire_enum! {
    /// Event types of [`Eqe::EVENT_TYPE`] (C `enum
    /// efa_admin_eqe_event_type`).
    pub enum EqeEventType: u8 {
        /// A CQ has completions ([`Eqe::comp_event`]).
        Completion = 0,
    }
}

wire::wire_struct! {
    /// Completion event data (C `efa_admin_comp_event`).
    pub struct CompEvent(8) {
        /// Completion queue number.
        pub cqn: u16,
        /// Reserved, zero.
        pub reserved: u16,
        /// Reserved, zero.
        pub reserved2: u32,
    }
}

wire::wire_struct! {
    /// An event queue entry (C `efa_admin_eqe`).
    pub struct Eqe(16) {
        /// [`Eqe::PHASE`], [`Eqe::EVENT_TYPE`].
        pub common: u32,
        /// Reserved, zero.
        pub reserved: u32,
        /// Event data union, by event type.
        pub u: [u8; 8],
    }
}

impl Eqe {
    /// `common`: phase of the entry.
    pub const PHASE: Field<u32> = Field::new(0x1);
    /// `common`: [`EqeEventType`].
    pub const EVENT_TYPE: Field<u32> = Field::new(0x1fe);
}

wire::wire_union! {
    Eqe.u[8] {
        /// Raw event data.
        event_data / set_event_data: [u32; 2],
        /// [`EqeEventType::Completion`] data.
        comp_event / set_comp_event: CompEvent,
    }
}

/// `CQ_DB`: consumer counter of the CQ.
pub const CQ_DB_CONSUMER_INDEX: Field<u32> = Field::new(0xffff);
/// `CQ_DB`: command sequence number, incremented by userspace for each
/// completion event it receives (2 bits).
pub const CQ_DB_CMD_SN: Field<u32> = Field::new(0x6000_0000);
/// `CQ_DB`: arm the CQ (send an event on the next completion).
pub const CQ_DB_ARM: Field<u32> = Field::new(0x8000_0000);

/// The CQ doorbell value as rdma-core writes it: consumer counter, command
/// sequence number (low 2 bits kept) and arm flag.
pub const fn cq_doorbell(consumer_index: u16, cmd_sn: u8, arm: bool) -> u32 {
    CQ_DB_CONSUMER_INDEX.prep(consumer_index as u32)
        | CQ_DB_CMD_SN.prep(cmd_sn as u32)
        | CQ_DB_ARM.prep(arm as u32)
}

/// The send or receive doorbell value: the queue's free-running 16-bit
/// producer counter (in WQEs for send queues, descriptors for receive
/// queues), written as a 32-bit value.
pub const fn wq_doorbell(producer_counter: u16) -> u32 {
    producer_counter as u32
}

wire::wire_offsets! {
    ReqIdEx { w: 0 }
    TxMetaDesc {
        req_id: 0, ctrl1: 2, ctrl2: 3, dest_qp_num: 4, length: 6,
        immediate_data: 8, ah: 12, ctrl3: 14, reserved: 15, qkey: 16,
        reserved2: 20, req_id_ex: 26,
    }
    TxBufDesc { length: 0, lkey: 4, buf_addr_lo: 8, buf_addr_hi: 12 }
    RemoteMemAddr { length: 0, rkey: 4, buf_addr_lo: 8, buf_addr_hi: 12 }
    RdmaReq { remote_mem: 0, local_mem: 16 }
    FastMrRegReq {
        lkey: 0, permissions: 4, flags: 5, reserved: 6, iova: 8,
        mr_length: 16, pbl: 24,
    }
    FastMrInvReq { lkey: 0, reserved: 4 }
    TxWqe { meta: 0, data: 32 }
    RdmaReq128 { remote_mem: 0, u: 16 }
    TxWqe128 { meta: 0, data: 32 }
    RxDesc { buf_addr_lo: 0, buf_addr_hi: 4, req_id: 8, length: 10, lkey_ctrl: 12 }
    CdescCommon { req_id: 0, status: 2, flags: 3, qp_num: 4 }
    TxCdesc { common: 0, req_id_ex: 6, reserved: 12 }
    RxCdesc { common: 0, length: 6, ah: 8, src_qp_num: 10, imm: 12 }
    RxCdescEx { base: 0, u: 16 }
    CompEvent { cqn: 0, reserved: 2, reserved2: 4 }
    Eqe { common: 0, reserved: 4, u: 8 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::Wire;

    #[test]
    fn sizes() {
        assert_eq!(TxWqe::SIZE, TX_DESC_SIZE_64);
        assert_eq!(TxWqe128::SIZE, TX_DESC_SIZE_128);
        assert_eq!(RxDesc::SIZE, RX_DESC_SIZE);
        assert_eq!(RxCdesc::SIZE, CDESC_SIZE);
        assert_eq!(TxCdesc::SIZE, CDESC_SIZE);
        assert_eq!(RxCdescEx::SIZE, CDESC_EX_SIZE);
        assert_eq!(Eqe::SIZE, EQE_SIZE);
        assert_eq!(
            RdmaReq128::SIZE - RemoteMemAddr::SIZE,
            TX_DESC_INLINE_MAX_SIZE_128
        );
    }

    /// A send WQE as rdma-core's `efa_post_send` builds it.
    #[test]
    fn send_wqe_golden_bytes() {
        let mut wqe = TxWqe::ZERO;
        let m = &mut wqe.meta;
        m.req_id = 0x0102;
        TxMetaDesc::META_DESC.set(&mut m.ctrl1, 1);
        TxMetaDesc::OP_TYPE.set(&mut m.ctrl1, SendOpType::Send.raw());
        TxMetaDesc::HAS_IMM.set(&mut m.ctrl1, 1);
        TxMetaDesc::PHASE.set(&mut m.ctrl2, 1);
        TxMetaDesc::FIRST.set(&mut m.ctrl2, 1);
        TxMetaDesc::LAST.set(&mut m.ctrl2, 1);
        TxMetaDesc::COMP_REQ.set(&mut m.ctrl2, 1);
        m.dest_qp_num = 5;
        m.length = 1;
        m.immediate_data = 0xaabb_ccdd;
        m.ah = 9;
        m.qkey = 0x1111_2222;
        let mut buf = TxBufDesc {
            length: 100,
            lkey: TxBufDesc::LKEY.prep(0x12_3456),
            ..TxBufDesc::ZERO
        };
        buf.set_buf_addr(0x0000_7fff_0000_1000);
        wqe.set_sgl(&[buf, TxBufDesc::ZERO]);

        let b = wqe.to_bytes();
        assert_eq!(
            &b[..32],
            &[
                0x02, 0x01, 0x90, 0x1d, 5, 0, 1, 0, 0xdd, 0xcc, 0xbb, 0xaa, 9, 0, 0, 0, 0x22, 0x22,
                0x11, 0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
            ]
        );
        assert_eq!(
            &b[32..48],
            &[100, 0, 0, 0, 0x56, 0x34, 0x12, 0, 0, 0x10, 0, 0, 0xff, 0x7f, 0, 0]
        );
        assert_eq!(&b[48..], &[0; 16]);

        let back = TxWqe::from_bytes(&b);
        assert_eq!(back, wqe);
        assert_eq!(
            SendOpType::try_from(TxMetaDesc::OP_TYPE.get(back.meta.ctrl1)),
            Ok(SendOpType::Send)
        );
        assert_eq!(back.sgl()[0].buf_addr(), 0x0000_7fff_0000_1000);
        assert_eq!(TxBufDesc::LKEY.get(back.sgl()[0].lkey), 0x12_3456);
    }

    #[test]
    fn rdma_and_128_byte_wqes_share_prefixes() {
        let mut req = RdmaReq {
            remote_mem: RemoteMemAddr {
                length: 4096,
                rkey: 7,
                ..RemoteMemAddr::ZERO
            },
            local_mem: [TxBufDesc {
                length: 4096,
                lkey: 8,
                ..TxBufDesc::ZERO
            }],
        };
        req.remote_mem.set_buf_addr(0x1234_5678_9000);
        let mut w64 = TxWqe::ZERO;
        w64.set_rdma_req(&req);

        let mut req128 = RdmaReq128 {
            remote_mem: req.remote_mem,
            ..RdmaReq128::ZERO
        };
        req128.set_local_mem(&req.local_mem);
        let mut w128 = TxWqe128::ZERO;
        w128.set_rdma_req(&req128);
        assert_eq!(&w64.to_bytes()[..], &w128.to_bytes()[..64]);
        assert_eq!(w128.rdma_req().local_mem(), req.local_mem);

        // Inline RDMA write data follows the remote address.
        let mut inline = RdmaReq128::ZERO;
        inline.u = [0x5a; 80];
        w128.set_rdma_req(&inline);
        assert_eq!(&w128.to_bytes()[48..], &[0x5a; 80]);

        let mut reg = FastMrRegReq::ZERO;
        reg.flags = FastMrRegReq::PHYS_PAGE_SIZE_SHIFT.prep(12)
            | FastMrRegReq::PBL_MODE.prep(FrwrPblMode::DirectPbl.raw());
        reg.pbl = 0xabc000;
        w64.set_reg_mr_req(&reg);
        assert_eq!(w64.data[5], 0x2c);
        assert_eq!(&w64.data[24..], &0xabc000u64.to_le_bytes());
        assert_eq!(w64.reg_mr_req(), reg);
    }

    #[test]
    fn completions() {
        // A send completion with a 64-bit request id.
        let mut tx = TxCdesc::ZERO;
        tx.common.req_id = 0x4444;
        tx.req_id_ex = ReqIdEx::from_id(0x1111_2222_3333_4444);
        tx.common.flags =
            CdescCommon::PHASE.prep(1) | CdescCommon::Q_TYPE.prep(QueueType::Send.raw());
        tx.common.qp_num = 3;
        assert_eq!(tx.req_id_64(), 0x1111_2222_3333_4444);
        assert_eq!(
            tx.to_bytes(),
            [0x44, 0x44, 0, 0x03, 3, 0, 0x33, 0x33, 0x22, 0x22, 0x11, 0x11, 0, 0, 0, 0]
        );

        let mut meta = TxMetaDesc::ZERO;
        meta.set_req_id_64(0x1111_2222_3333_4444);
        assert_eq!(meta.req_id, 0x4444);
        assert_eq!(meta.req_id_64(), 0x1111_2222_3333_4444);

        // A receive completion from an unknown sender, with its GID.
        let mut rx = RxCdescEx::ZERO;
        rx.base.common.status = CompStatus::Ok.raw();
        rx.base.common.flags = CdescCommon::PHASE.prep(1)
            | CdescCommon::Q_TYPE.prep(QueueType::Recv.raw())
            | CdescCommon::HAS_IMM.prep(1);
        rx.base.length = 0x100;
        rx.base.ah = RxCdesc::AH_INVALID;
        rx.base.src_qp_num = 12;
        rx.base.imm = 0x0102_0304;
        rx.set_src_addr([0xfe; 16]);
        let b = rx.to_bytes();
        assert_eq!(
            &b[..16],
            &[0, 0, 0, 0x0d, 0, 0, 0, 1, 0xff, 0xff, 12, 0, 4, 3, 2, 1]
        );
        assert_eq!(&b[16..], &[0xfe; 16]);
        let c = RxCdescEx::from_bytes(&b).base.common;
        assert_eq!(
            QueueType::try_from(CdescCommon::Q_TYPE.get(c.flags)),
            Ok(QueueType::Recv)
        );

        // RDMA write with immediate: 32-bit length split in two.
        let mut w = RxCdescEx::ZERO;
        w.base.length = 0x5678;
        w.set_rdma_write(&RxCdescRdmaWrite { length_hi: 0x1234 });
        assert_eq!(w.rdma_write_length(), 0x1234_5678);
        assert_eq!(&w.to_bytes()[16..18], &[0x34, 0x12]);

        assert_eq!(
            CompStatus::try_from(18),
            Ok(CompStatus::RemoteErrorFeatureMismatch)
        );
        assert_eq!(CompStatus::try_from(16), Err(16));
    }

    #[test]
    fn receive_descriptor() {
        let mut d = RxDesc {
            req_id: 3,
            length: 2048,
            lkey_ctrl: RxDesc::LKEY.prep(0xab_cdef) | RxDesc::FIRST.prep(1) | RxDesc::LAST.prep(1),
            ..RxDesc::ZERO
        };
        d.set_buf_addr(0x1_0000_2000);
        assert_eq!(
            d.to_bytes(),
            [0, 0x20, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0x08, 0xef, 0xcd, 0xab, 0xc0]
        );
    }

    #[test]
    fn event_queue_entry() {
        let mut e = Eqe {
            common: Eqe::PHASE.prep(1)
                | Eqe::EVENT_TYPE.prep(EqeEventType::Completion.raw().into()),
            ..Eqe::ZERO
        };
        e.set_comp_event(&CompEvent {
            cqn: 0x0203,
            ..CompEvent::ZERO
        });
        assert_eq!(
            e.to_bytes(),
            [1, 0, 0, 0, 0, 0, 0, 0, 3, 2, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(e.event_data(), [0x0203, 0]);
        let e = Eqe {
            common: Eqe::EVENT_TYPE.prep(0xff),
            ..e
        };
        assert_eq!(e.common, 0x1fe);
        assert_eq!(
            EqeEventType::try_from(Eqe::EVENT_TYPE.get(e.common) as u8),
            Err(0xff)
        );
    }

    #[test]
    fn doorbells() {
        assert_eq!(cq_doorbell(0x1234, 0, false), 0x0000_1234);
        assert_eq!(cq_doorbell(0x1234, 1, true), 0xa000_1234);
        assert_eq!(cq_doorbell(0xffff, 7, true), 0xe000_ffff);
        assert_eq!(CQ_DB_CMD_SN.get(0xe000_ffff), 3);
        assert_eq!(wq_doorbell(0xfffe), 0xfffe);
    }

    /// Decoding arbitrary and short input never panics.
    #[test]
    fn garbage_never_panics() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut buf = [0u8; 160];
        for len in 0..buf.len() {
            for byte in buf.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *byte = (seed >> 24) as u8;
            }
            let input = &buf[..len];
            let w = TxWqe128::decode_padded(input);
            let _ = (w.sgl(), w.rdma_req().local_mem(), w.meta.req_id_64());
            let _ = SendOpType::try_from(TxMetaDesc::OP_TYPE.get(w.meta.ctrl1));
            let w = TxWqe::decode_padded(input);
            let _ = (w.sgl(), w.rdma_req(), w.reg_mr_req(), w.inv_mr_req());
            let _ = TxWqe::decode(input);
            let _ = RxDesc::decode(input).map(|d| d.buf_addr());
            let rx = RxCdescEx::decode_padded(input);
            let _ = (rx.rdma_write_length(), rx.src_addr());
            let _ = CompStatus::try_from(rx.base.common.status);
            let _ = QueueType::try_from(CdescCommon::Q_TYPE.get(rx.base.common.flags));
            let _ = TxCdesc::decode_padded(input).req_id_64();
            let e = Eqe::decode_padded(input);
            let _ = (
                e.comp_event(),
                e.event_data(),
                Eqe::EVENT_TYPE.get(e.common),
            );
        }
    }
}
