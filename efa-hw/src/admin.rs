// SPDX-License-Identifier: GPL-2.0-only

//! The admin queue: entries, completions and every admin command.
//!
//! The driver places commands in the admin submission queue (AQ), rings
//! `AQ_PROD_DB` with its free-running 16-bit producer counter, and the device
//! answers each command with an entry in the admin completion queue (ACQ),
//! matched by command id, in any order.
//!
//! An AQ entry is a 4-byte [`AqCommonDesc`] followed by up to 60 bytes of
//! command ([`AqEntry`], 64 bytes). From API version 0.3 the entry is 128
//! bytes: a 12-byte [`AqCommonDescV2`] with a CRC-16 checksum, then up to 116
//! bytes of command ([`AqEntryV2`]). An ACQ entry is always 64 bytes: an
//! 8-byte [`AcqCommonDesc`] and up to 56 bytes of response; every `*Resp`
//! structure below starts with that descriptor and is a prefix of the ACQ
//! entry. Commands (`*Cmd`) are the entry payload, after the common
//! descriptor.
//!
//! Phases start at 1 in both queues and flip each time the queue wraps.
//!
//! Masks of bit fields are [`Field`] constants on the structure, named like
//! the C masks without the structure prefix and `_MASK` (C
//! `EFA_ADMIN_CREATE_CQ_CMD_VIRT_MASK` is [`CreateCqCmd::VIRT`]). C unions
//! are byte arrays with typed accessors.

use super::wire::{self, Field, Wire};
// in tree: use kernel::crc::crc16;

/// Major version of the admin API these definitions describe.
pub const API_VERSION_MAJOR: u32 = 0;
/// Minor version of the admin API these definitions describe.
pub const API_VERSION_MINOR: u32 = 3;

/// Major version of the common specification (reported in [`HostInfo`]).
pub const COMMON_SPEC_VERSION_MAJOR: u32 = 2;
/// Minor version of the common specification (reported in [`HostInfo`]).
pub const COMMON_SPEC_VERSION_MINOR: u32 = 0;

/// Admin queue depth (AQ and ACQ) the C driver uses.
pub const DRIVER_AQ_DEPTH: u16 = 32;
/// Asynchronous event queue depth the C driver uses.
pub const DRIVER_AENQ_DEPTH: u16 = 16;
/// Admin completion polling interval the C driver uses, in milliseconds.
pub const DRIVER_POLL_INTERVAL_MS: u32 = 100;

wire::wire_enum! {
    /// Admin command opcodes (C `enum efa_admin_aq_opcode`).
    pub enum AdminOpcode: u8 {
        /// Create a queue pair ([`CreateQpCmd`]).
        CreateQp = 1,
        /// Change queue pair state and attributes ([`ModifyQpCmd`]).
        ModifyQp = 2,
        /// Read queue pair state and attributes ([`QueryQpCmd`]).
        QueryQp = 3,
        /// Destroy a queue pair ([`DestroyQpCmd`]).
        DestroyQp = 4,
        /// Create an address handle ([`CreateAhCmd`]).
        CreateAh = 5,
        /// Destroy an address handle ([`DestroyAhCmd`]).
        DestroyAh = 6,
        /// Register a memory region ([`RegMrCmd`]).
        RegMr = 7,
        /// Deregister a memory region ([`DeregMrCmd`]).
        DeregMr = 8,
        /// Create a completion queue ([`CreateCqCmd`]).
        CreateCq = 9,
        /// Destroy a completion queue ([`DestroyCqCmd`]).
        DestroyCq = 10,
        /// Read a feature ([`GetFeatureCmd`]).
        GetFeature = 11,
        /// Write a feature ([`SetFeatureCmd`]).
        SetFeature = 12,
        /// Read statistics ([`GetStatsCmd`]).
        GetStats = 13,
        /// Allocate a protection domain (no payload; [`AllocPdResp`]).
        AllocPd = 14,
        /// Free a protection domain ([`DeallocPdCmd`]).
        DeallocPd = 15,
        /// Allocate a user access region (no payload; [`AllocUarResp`]).
        AllocUar = 16,
        /// Free a user access region ([`DeallocUarCmd`]).
        DeallocUar = 17,
        /// Create an event queue ([`CreateEqCmd`]).
        CreateEq = 18,
        /// Destroy an event queue ([`DestroyEqCmd`]).
        DestroyEq = 19,
        /// Allocate a fast-registration memory region ([`AllocMrCmd`]; not
        /// sent by the 7.3 driver).
        AllocMr = 20,
        /// Vendor service command ([`ServiceCmd`]; not sent by the 7.3
        /// driver).
        Service = 21,
        /// Create an event counter ([`CreateEventCounterCmd`]).
        CreateEventCounter = 25,
        /// Destroy an event counter ([`DestroyEventCounterCmd`]).
        DestroyEventCounter = 26,
        /// Attach an event counter to QP events
        /// ([`AttachDetachEventCounterCmd`]).
        AttachEventCounter = 27,
        /// Set or add to an event counter ([`ModifyEventCounterCmd`]).
        ModifyEventCounter = 28,
        /// Detach an event counter from QP events
        /// ([`AttachDetachEventCounterCmd`]).
        DetachEventCounter = 29,
    }
}

impl AdminOpcode {
    /// Highest opcode defined.
    pub const MAX: u8 = 29;
}

wire::wire_enum! {
    /// Admin completion status (C `enum efa_admin_aq_completion_status`).
    ///
    /// The C driver maps `ResourceAllocationFailure` to `ENOMEM`,
    /// `UnsupportedOpcode` to `EOPNOTSUPP` and everything else to `EINVAL`.
    pub enum AdminStatus: u8 {
        /// The command succeeded.
        Success = 0,
        /// The device ran out of resources.
        ResourceAllocationFailure = 1,
        /// The opcode is invalid.
        BadOpcode = 2,
        /// The opcode is valid but not supported.
        UnsupportedOpcode = 3,
        /// The command is malformed.
        MalformedRequest = 4,
        /// A parameter is invalid.
        IllegalParameter = 5,
        /// Any other error.
        UnknownError = 6,
        /// The resource is busy.
        ResourceBusy = 7,
    }
}

wire::wire_enum! {
    /// Feature ids of GET_FEATURE / SET_FEATURE (C `enum
    /// efa_admin_aq_feature_id`).
    pub enum FeatureId: u8 {
        /// Device attributes ([`DeviceAttr`]); always supported.
        DeviceAttr = 1,
        /// Asynchronous event groups ([`AenqConfig`]).
        AenqConfig = 2,
        /// Network attributes ([`NetworkAttr`]).
        NetworkAttr = 3,
        /// Queue limits ([`QueueAttr1`]).
        QueueAttr1 = 4,
        /// Timeout hints ([`HwHints`]).
        HwHints = 5,
        /// Host information ([`HostInfo`], set only, in a control buffer).
        HostInfo = 6,
        /// Event queue limits ([`EventQueueAttr`]).
        EventQueueAttr = 7,
        /// More queue limits ([`QueueAttr2`]).
        QueueAttr2 = 9,
    }
}

impl FeatureId {
    /// The bit announcing the feature in [`DeviceAttr::supported_features`]
    /// (`1 << id`).
    pub const fn bit(self) -> u64 {
        1 << self.raw()
    }

    /// Whether `supported_features` announces the feature. [`DeviceAttr`]
    /// counts as always supported, as in the C driver.
    ///
    /// [`DeviceAttr`]: FeatureId::DeviceAttr
    pub const fn is_supported(self, supported_features: u64) -> bool {
        matches!(self, Self::DeviceAttr) || supported_features & self.bit() != 0
    }
}

wire::wire_enum! {
    /// Queue pair transport types (C `enum efa_admin_qp_type`).
    pub enum QpType: u8 {
        /// Unreliable datagram.
        Ud = 1,
        /// Scalable reliable datagram.
        Srd = 2,
    }
}

wire::wire_enum! {
    /// Queue pair states (C `enum efa_admin_qp_state`); the values equal
    /// the verbs `IB_QPS_*` ones.
    pub enum QpState: u32 {
        /// Reset.
        Reset = 0,
        /// Initialised.
        Init = 1,
        /// Ready to receive.
        Rtr = 2,
        /// Ready to send.
        Rts = 3,
        /// Send queue drained.
        Sqd = 4,
        /// Send queue error.
        Sqe = 5,
        /// Error.
        Err = 6,
    }
}

wire::wire_enum! {
    /// Statistics sets of GET_STATS (C `enum efa_admin_get_stats_type`).
    pub enum GetStatsType: u8 {
        /// Packet and byte counters ([`BasicStats`]).
        Basic = 0,
        /// Send/receive message counters ([`MessagesStats`]).
        Messages = 1,
        /// RDMA read counters ([`RdmaReadStats`]).
        RdmaRead = 2,
        /// RDMA write counters ([`RdmaWriteStats`]).
        RdmaWrite = 3,
        /// Retransmission and remote health counters ([`NetworkStats`]).
        Network = 4,
    }
}

wire::wire_enum! {
    /// Scope of GET_STATS (C `enum efa_admin_get_stats_scope`).
    pub enum GetStatsScope: u8 {
        /// The whole device.
        All = 0,
        /// One queue (`scope_modifier` names it).
        Queue = 1,
    }
}

wire::wire_enum! {
    /// Operating system types of [`HostInfo::os_type`].
    pub enum OsType: u32 {
        /// Linux.
        Linux = 0,
    }
}

wire::wire_enum! {
    /// What an event counter is attached to (C `enum
    /// efa_admin_event_counter_attach_type`).
    pub enum EventCounterAttachType: u8 {
        /// Events of a queue pair ([`EventCounterAttachQpEvents`]).
        QpEvents = 0,
    }
}

wire::wire_enum! {
    /// Operations of MODIFY_EVENT_COUNTER (C `enum
    /// efa_admin_event_counter_modify_ops`).
    pub enum EventCounterModifyOp: u8 {
        /// Set the counter to the value.
        Set = 0,
        /// Add the value to the counter.
        Add = 1,
    }
}

/// Initial value, and final XOR, of admin checksums.
pub const CRC16_INIT: u16 = 0xffff;

// out of tree: begin
/// CRC-16 of `bytes` from `crc`, as the kernel's `crc16()` computes it.
/// This crate is also the device model's, in userspace, where that is not;
/// in tree the driver calls the kernel's (`kernel::crc::crc16()`).
fn crc16(mut crc: u16, bytes: &[u8]) -> u16 {
    const POLY_REFLECTED: u16 = 0xa001;
    for &byte in bytes {
        crc ^= u16::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY_REFLECTED
            } else {
                crc >> 1
            };
        }
    }
    crc
}
// out of tree: end

/// The checksum of admin entries: CRC-16 with polynomial 0x8005 (processed
/// LSB first, as the kernel's `crc16()`), initial value 0xffff and final
/// XOR 0xffff (the "CRC-16/USB" parameters).
///
/// It covers the whole entry with its checksum field set to zero.
pub fn crc16_checksum(bytes: &[u8]) -> u16 {
    crc16(CRC16_INIT, bytes) ^ CRC16_INIT
}

wire::wire_struct! {
    /// A 64-bit DMA address as two 32-bit halves (C
    /// `efa_common_mem_addr`).
    pub struct MemAddr(8) {
        /// Bits 31:0.
        pub mem_addr_low: u32,
        /// Bits 63:32.
        pub mem_addr_high: u32,
    }
}

impl MemAddr {
    /// Splits `addr` into halves.
    pub const fn new(addr: u64) -> Self {
        Self {
            mem_addr_low: addr as u32,
            mem_addr_high: (addr >> 32) as u32,
        }
    }

    /// The full address.
    pub const fn get(self) -> u64 {
        ((self.mem_addr_high as u64) << 32) | self.mem_addr_low as u64
    }
}

wire::wire_struct! {
    /// A DMA buffer given by length and address (C
    /// `efa_admin_ctrl_buff_info`): the control buffer of an admin command,
    /// and the link at the end of an indirect page-list chunk.
    pub struct CtrlBuffInfo(12) {
        /// Length in bytes.
        pub length: u32,
        /// Address.
        pub address: MemAddr,
    }
}

wire::wire_struct! {
    /// Header of an admin submission entry (C `efa_admin_aq_common_desc`).
    pub struct AqCommonDesc(4) {
        /// Command id ([`AqCommonDesc::COMMAND_ID`]), echoed in the
        /// completion. The C driver puts the completion context index in the
        /// low `log2(depth)` bits and producer-counter bits above it.
        pub command_id: u16,
        /// [`AdminOpcode`].
        pub opcode: u8,
        /// [`AqCommonDesc::PHASE`], [`AqCommonDesc::CTRL_DATA`],
        /// [`AqCommonDesc::CTRL_DATA_INDIRECT`].
        pub flags: u8,
    }
}

impl AqCommonDesc {
    /// `command_id`: bits 11:0 are the id (15:12 reserved).
    pub const COMMAND_ID: Field<u16> = Field::new(0x0fff);
    /// `flags`: phase of the entry; matches the queue's current phase
    /// when the entry is valid.
    pub const PHASE: Field<u8> = Field::new(0x1);
    /// `flags`: the command's `control_buffer` (or `RegMrCmd` page list)
    /// points to valid control data.
    pub const CTRL_DATA: Field<u8> = Field::new(0x2);
    /// `flags`: the control buffer is a chain of page-list chunks listing
    /// the pages of the control data (see [`pbl`]).
    pub const CTRL_DATA_INDIRECT: Field<u8> = Field::new(0x4);
}

wire::wire_struct! {
    /// Header of a 128-byte admin submission entry (C
    /// `efa_admin_aq_common_desc_v2`), used from API version 0.3.
    pub struct AqCommonDescV2(12) {
        /// The 64-byte form's header.
        pub common: AqCommonDesc,
        /// [`crc16_checksum`] of the whole 128-byte entry with this field
        /// zero.
        pub checksum: u16,
        /// Payload version; the 7.3 driver leaves it 0.
        pub payload_ver: u8,
        /// Reserved, zero.
        pub reserved: [u8; 5],
    }
}

wire::wire_struct! {
    /// A 64-byte admin submission entry (C `efa_admin_aq_entry`).
    pub struct AqEntry(64) {
        /// Header.
        pub aq_common_descriptor: AqCommonDesc,
        /// Command payload (one of the `*Cmd` structures), zero-padded.
        pub request_payload: [u8; 60],
    }
}

impl AqEntry {
    /// Byte offset of the payload in the entry.
    pub const PAYLOAD_OFFSET: usize = core::mem::offset_of!(Self, request_payload);
    /// Largest payload.
    pub const MAX_PAYLOAD: usize = 60;

    /// The payload decoded as `T` (bytes past the payload read as zero).
    pub fn payload<T: Wire>(&self) -> T {
        T::decode_padded(&self.request_payload)
    }

    /// Stores `cmd` as the payload, zeroing the rest. Fails if `cmd` does
    /// not fit.
    pub fn set_payload<T: Wire>(&mut self, cmd: &T) -> Result<(), wire::ShortBuffer> {
        let mut payload = [0u8; 60];
        cmd.encode(&mut payload)?;
        self.request_payload = payload;
        Ok(())
    }
}

wire::wire_struct! {
    /// A 128-byte admin submission entry with checksum (C
    /// `efa_admin_aq_entry_v2`), used from API version 0.3.
    pub struct AqEntryV2(128) {
        /// Header.
        pub aq_common_descriptor: AqCommonDescV2,
        /// Command payload (one of the `*Cmd` structures), zero-padded.
        pub request_payload: [u8; 116],
    }
}

impl AqEntryV2 {
    /// Byte offset of the payload in the entry.
    pub const PAYLOAD_OFFSET: usize = core::mem::offset_of!(Self, request_payload);
    /// Largest payload.
    pub const MAX_PAYLOAD: usize = 116;

    /// The payload decoded as `T` (bytes past the payload read as zero).
    pub fn payload<T: Wire>(&self) -> T {
        T::decode_padded(&self.request_payload)
    }

    /// Stores `cmd` as the payload, zeroing the rest. Fails if `cmd` does
    /// not fit.
    pub fn set_payload<T: Wire>(&mut self, cmd: &T) -> Result<(), wire::ShortBuffer> {
        let mut payload = [0u8; 116];
        cmd.encode(&mut payload)?;
        self.request_payload = payload;
        Ok(())
    }

    /// The checksum the entry should carry: [`crc16_checksum`] of its
    /// encoding with the checksum field zero.
    pub fn compute_checksum(&self) -> u16 {
        let mut zeroed = *self;
        zeroed.aq_common_descriptor.checksum = 0;
        crc16_checksum(&zeroed.to_bytes())
    }

    /// Sets the checksum field (do this last).
    pub fn seal(&mut self) {
        self.aq_common_descriptor.checksum = self.compute_checksum();
    }

    /// Whether the checksum field is right.
    pub fn checksum_ok(&self) -> bool {
        self.aq_common_descriptor.checksum == self.compute_checksum()
    }
}

wire::wire_struct! {
    /// Header of an admin completion entry (C `efa_admin_acq_common_desc`).
    pub struct AcqCommonDesc(8) {
        /// Command id of the completed entry ([`AcqCommonDesc::COMMAND_ID`]).
        pub command: u16,
        /// [`AdminStatus`].
        pub status: u8,
        /// [`AcqCommonDesc::PHASE`].
        pub flags: u8,
        /// [`crc16_checksum`] of the whole 64-byte completion with this
        /// field zero; checked by the driver from API version 0.2.
        pub checksum: u16,
        /// Reserved, zero.
        pub reserved: u16,
    }
}

impl AcqCommonDesc {
    /// `command`: bits 11:0 are the command id (15:12 reserved).
    pub const COMMAND_ID: Field<u16> = Field::new(0x0fff);
    /// `flags`: phase of the completion; the driver consumes entries while
    /// it matches its expected phase.
    pub const PHASE: Field<u8> = Field::new(0x1);
}

wire::wire_struct! {
    /// A 64-byte admin completion entry (C `efa_admin_acq_entry`).
    pub struct AcqEntry(64) {
        /// Header.
        pub acq_common_descriptor: AcqCommonDesc,
        /// Response data after the header.
        pub response_specific_data: [u8; 56],
    }
}

impl AcqEntry {
    /// Builds a completion from a response structure `resp` (a `*Resp`,
    /// which starts with the [`AcqCommonDesc`]); bytes it does not cover are
    /// zero. Responses larger than 64 bytes are truncated.
    pub fn from_resp<T: Wire>(resp: &T) -> Self {
        let mut bytes = [0u8; 64];
        resp.encode_truncated(&mut bytes);
        Self::from_bytes(&bytes)
    }

    /// The completion decoded as the response structure `T`.
    pub fn resp<T: Wire>(&self) -> T {
        T::decode_padded(&self.to_bytes())
    }

    /// The checksum the completion should carry: [`crc16_checksum`] of its
    /// encoding with the checksum field zero.
    pub fn compute_checksum(&self) -> u16 {
        let mut zeroed = *self;
        zeroed.acq_common_descriptor.checksum = 0;
        crc16_checksum(&zeroed.to_bytes())
    }

    /// Sets the checksum field (do this after everything else but before
    /// the phase flip is visible to the driver: the phase is covered too).
    pub fn seal(&mut self) {
        self.acq_common_descriptor.checksum = self.compute_checksum();
    }

    /// Whether the checksum field is right.
    pub fn checksum_ok(&self) -> bool {
        self.acq_common_descriptor.checksum == self.compute_checksum()
    }
}

pub mod pbl {
    //! Memory region page lists (PBL).
    //!
    //! REG_MR lists the pages of a region (each `1 << phys_page_size_shift`
    //! bytes) as little-endian `u64` DMA addresses, in one of three forms:
    //!
    //! * inline: up to [`INLINE_PAGES`] addresses in
    //!   [`RegMrCmd::inline_pbl_array`]; header flags clear;
    //! * direct: [`AqCommonDesc::CTRL_DATA`] set; [`RegMrCmd::ctrl_buff`] gives
    //!   address and length (`page_num * 8`) of one contiguous array;
    //! * indirect: `CTRL_DATA` and `CTRL_DATA_INDIRECT` set; the array is split
    //!   into [`PAYLOAD_PAGE_SIZE`]-byte pages, and [`RegMrCmd::ctrl_buff`]
    //!   points to the first of a chain of [`CHUNK_SIZE`]-byte chunks listing
    //!   the DMA addresses of those pages. A chunk holds up to
    //!   [`PTRS_PER_CHUNK`] `u64` addresses followed by a [`CtrlBuffInfo`] link
    //!   (at byte `PTRS_PER_CHUNK * 8`) giving length and address of the next
    //!   chunk. A chunk's length counts its addresses plus the link
    //!   ([`CHUNK_USED_SIZE`] when full); the last chunk's link is zero.
    //!
    //! [`RegMrCmd::inline_pbl_array`]: super::RegMrCmd::inline_pbl_array
    //! [`RegMrCmd::ctrl_buff`]: super::RegMrCmd::ctrl_buff
    //! [`AqCommonDesc::CTRL_DATA`]: super::AqCommonDesc::CTRL_DATA
    //! [`CtrlBuffInfo`]: super::CtrlBuffInfo

    /// Most pages listed inline in REG_MR.
    pub const INLINE_PAGES: usize = 4;
    /// Size of a chunk buffer.
    pub const CHUNK_SIZE: usize = 4096;
    /// Size of the page-list pages a chunk points to.
    pub const PAYLOAD_PAGE_SIZE: usize = 4096;
    /// Size of one address in a chunk or page list.
    pub const PTR_SIZE: usize = 8;
    /// Size of the link at the end of a chunk.
    pub const LINK_SIZE: usize = 12;
    /// Addresses per chunk: (4096 - 12) / 8.
    pub const PTRS_PER_CHUNK: usize = (CHUNK_SIZE - LINK_SIZE) / PTR_SIZE;
    /// Length of a full chunk: its addresses and the link.
    pub const CHUNK_USED_SIZE: usize = PTRS_PER_CHUNK * PTR_SIZE + LINK_SIZE;

    /// Number of addresses in a chunk of `length` bytes, if `length` is a
    /// valid chunk length (at least the link, whole addresses, at most
    /// [`CHUNK_USED_SIZE`]).
    pub const fn chunk_ptrs(length: u32) -> Option<usize> {
        let length = length as usize;
        if length < LINK_SIZE || length > CHUNK_USED_SIZE {
            return None;
        }
        let payload = length - LINK_SIZE;
        if payload & (PTR_SIZE - 1) != 0 {
            return None;
        }
        Some(payload / PTR_SIZE)
    }

    /// Byte offset of the link in a chunk of `length` bytes.
    pub const fn link_offset(length: u32) -> usize {
        (length as usize).saturating_sub(LINK_SIZE)
    }
}

wire::wire_struct! {
    /// Queue sizes requested at queue pair creation (C
    /// `efa_admin_qp_alloc_size`).
    pub struct QpAllocSize(16) {
        /// Send ring size in bytes (depth times WQE size, 64 or 128).
        pub send_queue_ring_size: u32,
        /// Most outstanding send WQEs.
        pub send_queue_depth: u32,
        /// Receive ring size in bytes.
        pub recv_queue_ring_size: u32,
        /// Most outstanding receive WQEs.
        pub recv_queue_depth: u32,
    }
}

wire::wire_struct! {
    /// CREATE_QP command (C `efa_admin_create_qp_cmd`, packed: the 64-bit
    /// addresses are at unaligned offsets).
    pub struct CreateQpCmd(60, packed) {
        /// Protection domain.
        pub pd: u16,
        /// [`QpType`].
        pub qp_type: u8,
        /// [`CreateQpCmd::SQ_VIRT`], [`CreateQpCmd::RQ_VIRT`],
        /// [`CreateQpCmd::UNSOLICITED_WRITE_RECV`],
        /// [`CreateQpCmd::SQ_64_BIT_REQ_ID`].
        pub flags: u8,
        /// Send ring base address; unused for LLQ send queues (always, with
        /// the 7.3 driver).
        pub sq_base_addr: u64,
        /// Receive ring base address.
        pub rq_base_addr: u64,
        /// CQ for send completions.
        pub send_cq_idx: u32,
        /// CQ for receive completions.
        pub recv_cq_idx: u32,
        /// Memory key of the send ring when `SQ_VIRT`.
        pub sq_l_key: u32,
        /// Memory key of the receive ring when `RQ_VIRT`.
        pub rq_l_key: u32,
        /// Requested queue sizes.
        pub qp_alloc_size: QpAllocSize,
        /// User access region of the doorbells.
        pub uar: u16,
        /// Service level (0 is the default).
        pub sl: u8,
        /// Reserved, zero.
        pub reserved: u8,
        /// Reserved, zero.
        pub reserved2: u32,
    }
}

impl CreateQpCmd {
    /// `flags`: the send ring address is an IOVA of a registered region.
    pub const SQ_VIRT: Field<u8> = Field::new(0x1);
    /// `flags`: the receive ring address is an IOVA of a registered region.
    pub const RQ_VIRT: Field<u8> = Field::new(0x2);
    /// `flags`: incoming RDMA write with immediate consumes no receive WQE.
    pub const UNSOLICITED_WRITE_RECV: Field<u8> = Field::new(0x4);
    /// `flags`: send requests carry 64-bit ids (the send CQ must too).
    pub const SQ_64_BIT_REQ_ID: Field<u8> = Field::new(0x8);
}

wire::wire_struct! {
    /// CREATE_QP response (C `efa_admin_create_qp_resp`).
    pub struct CreateQpResp(32) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// Handle for later commands on the queue pair.
        pub qp_handle: u32,
        /// Queue pair number, unique in the device.
        pub qp_num: u16,
        /// Reserved, zero.
        pub reserved: u16,
        /// Sub-CQ receiving send completions.
        pub send_sub_cq_idx: u16,
        /// Sub-CQ receiving receive completions.
        pub recv_sub_cq_idx: u16,
        /// Send doorbell offset in the doorbell BAR.
        pub sq_db_offset: u32,
        /// Receive doorbell offset in the doorbell BAR.
        pub rq_db_offset: u32,
        /// Send ring (LLQ) offset in the memory BAR.
        pub llq_descriptors_offset: u32,
    }
}

wire::wire_struct! {
    /// MODIFY_QP command (C `efa_admin_modify_qp_cmd`).
    pub struct ModifyQpCmd(28) {
        /// Which attributes to change ([`ModifyQpCmd::QP_STATE`] ...).
        pub modify_mask: u32,
        /// Queue pair handle.
        pub qp_handle: u32,
        /// New [`QpState`].
        pub qp_state: u32,
        /// Assumed current [`QpState`].
        pub cur_qp_state: u32,
        /// Queue key.
        pub qkey: u32,
        /// Send packet sequence number.
        pub sq_psn: u32,
        /// Notify asynchronously when the send queue is drained.
        pub sq_drained_async_notify: u8,
        /// RNR retry count (SRD only).
        pub rnr_retry: u8,
        /// Reserved, zero.
        pub reserved2: u16,
    }
}

impl ModifyQpCmd {
    /// `modify_mask`: change `qp_state`.
    pub const QP_STATE: Field<u32> = Field::new(0x1);
    /// `modify_mask`: use `cur_qp_state`.
    pub const CUR_QP_STATE: Field<u32> = Field::new(0x2);
    /// `modify_mask`: change `qkey`.
    pub const QKEY: Field<u32> = Field::new(0x4);
    /// `modify_mask`: change `sq_psn`.
    pub const SQ_PSN: Field<u32> = Field::new(0x8);
    /// `modify_mask`: change `sq_drained_async_notify`.
    pub const SQ_DRAINED_ASYNC_NOTIFY: Field<u32> = Field::new(0x10);
    /// `modify_mask`: change `rnr_retry`.
    pub const RNR_RETRY: Field<u32> = Field::new(0x20);
}

wire::wire_struct! {
    /// MODIFY_QP response (C `efa_admin_modify_qp_resp`).
    pub struct ModifyQpResp(8) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
    }
}

wire::wire_struct! {
    /// QUERY_QP command (C `efa_admin_query_qp_cmd`).
    pub struct QueryQpCmd(4) {
        /// Queue pair handle.
        pub qp_handle: u32,
    }
}

wire::wire_struct! {
    /// QUERY_QP response (C `efa_admin_query_qp_resp`).
    pub struct QueryQpResp(24) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// [`QpState`].
        pub qp_state: u32,
        /// Queue key.
        pub qkey: u32,
        /// Send packet sequence number.
        pub sq_psn: u32,
        /// The send queue is draining.
        pub sq_draining: u8,
        /// RNR retry count (SRD only).
        pub rnr_retry: u8,
        /// Reserved, zero.
        pub reserved2: u16,
    }
}

wire::wire_struct! {
    /// DESTROY_QP command (C `efa_admin_destroy_qp_cmd`).
    pub struct DestroyQpCmd(4) {
        /// Queue pair handle.
        pub qp_handle: u32,
    }
}

wire::wire_struct! {
    /// DESTROY_QP response (C `efa_admin_destroy_qp_resp`).
    pub struct DestroyQpResp(8) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
    }
}

wire::wire_struct! {
    /// CREATE_AH command (C `efa_admin_create_ah_cmd`). The driver sends it
    /// once per (PD, destination) and reference-counts the handle.
    pub struct CreateAhCmd(20) {
        /// Destination address (GID), network byte order.
        pub dest_addr: [u8; 16],
        /// Protection domain.
        pub pd: u16,
        /// Reserved, zero.
        pub reserved: u16,
    }
}

wire::wire_struct! {
    /// CREATE_AH response (C `efa_admin_create_ah_resp`).
    pub struct CreateAhResp(12) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// Address handle, used in send WQEs.
        pub ah: u16,
        /// Reserved, zero.
        pub reserved: u16,
    }
}

wire::wire_struct! {
    /// DESTROY_AH command (C `efa_admin_destroy_ah_cmd`).
    pub struct DestroyAhCmd(4) {
        /// Address handle.
        pub ah: u16,
        /// Protection domain.
        pub pd: u16,
    }
}

wire::wire_struct! {
    /// DESTROY_AH response (C `efa_admin_destroy_ah_resp`).
    pub struct DestroyAhResp(8) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
    }
}

wire::wire_struct! {
    /// REG_MR command (C `efa_admin_reg_mr_cmd`, packed: the page list
    /// union starts at byte 4 and `mr_length` at byte 36).
    pub struct RegMrCmd(60, packed) {
        /// Protection domain.
        pub pd: u16,
        /// Reserved, zero.
        pub reserved16_w1: u16,
        /// Page list union: [`RegMrCmd::inline_pbl_array`] or
        /// [`RegMrCmd::ctrl_buff`] (see [`pbl`]).
        pub pbl: [u8; 32],
        /// Region length in bytes.
        pub mr_length: u64,
        /// [`RegMrCmd::PHYS_PAGE_SIZE_SHIFT`],
        /// [`RegMrCmd::MEM_ADDR_PHY_MODE_EN`].
        pub flags: u8,
        /// [`RegMrCmd::LOCAL_WRITE_ENABLE`],
        /// [`RegMrCmd::REMOTE_WRITE_ENABLE`],
        /// [`RegMrCmd::REMOTE_READ_ENABLE`] (equal to the verbs
        /// `IB_ACCESS_*` bits).
        pub permissions: u8,
        /// Reserved, zero.
        pub reserved16_w5: u16,
        /// Number of pages in the page list. Redundant (the C header says
        /// so): the 7.3 driver never sets it and sends 0, so a device
        /// derives the count from `iova`, `mr_length` and the page size.
        pub page_num: u32,
        /// I/O virtual address of the region's first byte (the physical
        /// address when `MEM_ADDR_PHY_MODE_EN`).
        pub iova: u64,
    }
}

impl RegMrCmd {
    /// `flags`: log2 of the page size of the page list.
    pub const PHYS_PAGE_SIZE_SHIFT: Field<u8> = Field::new(0x3f);
    /// `flags`: physical registration without translation (privileged; the
    /// page list has a single entry).
    pub const MEM_ADDR_PHY_MODE_EN: Field<u8> = Field::new(0x80);
    /// `permissions`: local write (needed for receive buffers and RDMA read
    /// targets).
    pub const LOCAL_WRITE_ENABLE: Field<u8> = Field::new(0x1);
    /// `permissions`: remote write (RDMA write target).
    pub const REMOTE_WRITE_ENABLE: Field<u8> = Field::new(0x2);
    /// `permissions`: remote read (RDMA read source).
    pub const REMOTE_READ_ENABLE: Field<u8> = Field::new(0x4);
}

wire::wire_union! {
    RegMrCmd.pbl[32] {
        /// The inline page list (header flags clear; `page_num` <= 4).
        inline_pbl_array / set_inline_pbl_array: [u64; 4],
        /// The page list buffer or first chunk (header `CTRL_DATA` set).
        ctrl_buff / set_ctrl_buff: CtrlBuffInfo,
    }
}

wire::wire_struct! {
    /// REG_MR response (C `efa_admin_reg_mr_resp`).
    pub struct RegMrResp(20) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// Local key.
        pub l_key: u32,
        /// Remote key.
        pub r_key: u32,
        /// Which interconnect ids are valid ([`RegMrResp::RECV_IC_ID`] ...).
        pub validity: u8,
        /// Interconnect used to reach the region for receives.
        pub recv_ic_id: u8,
        /// Interconnect used to reach the region for RDMA read.
        pub rdma_read_ic_id: u8,
        /// Interconnect used to reach the region for incoming RDMA write.
        pub rdma_recv_ic_id: u8,
    }
}

impl RegMrResp {
    /// `validity`: `recv_ic_id` is valid.
    pub const RECV_IC_ID: Field<u8> = Field::new(0x1);
    /// `validity`: `rdma_read_ic_id` is valid.
    pub const RDMA_READ_IC_ID: Field<u8> = Field::new(0x2);
    /// `validity`: `rdma_recv_ic_id` is valid.
    pub const RDMA_RECV_IC_ID: Field<u8> = Field::new(0x4);
}

wire::wire_struct! {
    /// DEREG_MR command (C `efa_admin_dereg_mr_cmd`).
    pub struct DeregMrCmd(4) {
        /// Local key of the region.
        pub l_key: u32,
    }
}

wire::wire_struct! {
    /// DEREG_MR response (C `efa_admin_dereg_mr_resp`).
    pub struct DeregMrResp(8) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
    }
}

wire::wire_struct! {
    /// ALLOC_MR command (C `efa_admin_alloc_mr_cmd`).
    pub struct AllocMrCmd(8) {
        /// Protection domain.
        pub pd: u16,
        /// Reserved, zero.
        pub reserved1: u16,
        /// Most pages the region can map.
        pub max_pages: u32,
    }
}

wire::wire_struct! {
    /// ALLOC_MR response (C `efa_admin_alloc_mr_resp`).
    pub struct AllocMrResp(16) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// Local key.
        pub l_key: u32,
        /// Remote key.
        pub r_key: u32,
    }
}

wire::wire_struct! {
    /// CREATE_CQ command (C `efa_admin_create_cq_cmd`).
    pub struct CreateCqCmd(24) {
        /// [`CreateCqCmd::INTERRUPT_MODE_ENABLED`], [`CreateCqCmd::VIRT`].
        pub cq_caps_1: u8,
        /// [`CreateCqCmd::CQ_ENTRY_SIZE_WORDS`],
        /// [`CreateCqCmd::SET_SRC_ADDR`],
        /// [`CreateCqCmd::SQ_COMP_64_BIT_REQ_ID`].
        pub cq_caps_2: u8,
        /// Entries per sub-CQ (a power of two).
        pub sub_cq_depth: u16,
        /// Event queue for completion events (with `INTERRUPT_MODE_ENABLED`).
        pub eqn: u16,
        /// Reserved, zero.
        pub reserved: u16,
        /// Ring base address (all sub-CQs back to back).
        pub cq_ba: MemAddr,
        /// Memory key of the ring when `VIRT`.
        pub l_key: u32,
        /// Number of sub-CQs (`QueueAttr1::sub_cqs_per_cq`).
        pub num_sub_cqs: u16,
        /// User access region of the doorbell.
        pub uar: u16,
    }
}

impl CreateCqCmd {
    /// `cq_caps_1`: generate completion events on the EQ `eqn`.
    pub const INTERRUPT_MODE_ENABLED: Field<u8> = Field::new(0x20);
    /// `cq_caps_1`: the ring address is an IOVA of a registered region.
    pub const VIRT: Field<u8> = Field::new(0x40);
    /// `cq_caps_2`: entry size in 32-bit words (4 or 8).
    pub const CQ_ENTRY_SIZE_WORDS: Field<u8> = Field::new(0x1f);
    /// `cq_caps_2`: fill the source address of receives from unknown
    /// senders (needs 8-word entries).
    pub const SET_SRC_ADDR: Field<u8> = Field::new(0x20);
    /// `cq_caps_2`: send completions carry 64-bit request ids.
    pub const SQ_COMP_64_BIT_REQ_ID: Field<u8> = Field::new(0x40);
}

wire::wire_struct! {
    /// CREATE_CQ response (C `efa_admin_create_cq_resp`).
    pub struct CreateCqResp(20) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// Completion queue number.
        pub cq_idx: u16,
        /// Actual entries per sub-CQ.
        pub sub_cq_actual_depth: u16,
        /// Doorbell offset in the doorbell BAR (valid with `DB_VALID`).
        pub db_offset: u32,
        /// [`CreateCqResp::DB_VALID`].
        pub flags: u32,
    }
}

impl CreateCqResp {
    /// `flags`: `db_offset` is valid (always set when interrupts were
    /// requested).
    pub const DB_VALID: Field<u32> = Field::new(0x1);
}

wire::wire_struct! {
    /// DESTROY_CQ command (C `efa_admin_destroy_cq_cmd`).
    pub struct DestroyCqCmd(4) {
        /// Completion queue number.
        pub cq_idx: u16,
        /// Reserved, zero.
        pub reserved1: u16,
    }
}

wire::wire_struct! {
    /// DESTROY_CQ response (C `efa_admin_destroy_cq_resp`).
    pub struct DestroyCqResp(8) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
    }
}

wire::wire_struct! {
    /// GET_STATS command (C `efa_admin_aq_get_stats_cmd`).
    pub struct GetStatsCmd(16) {
        /// Buffer for extended statistics (unused by the 7.3 driver).
        pub control_buffer: CtrlBuffInfo,
        /// [`GetStatsType`].
        pub type_: u8,
        /// [`GetStatsScope`].
        pub scope: u8,
        /// Queue for [`GetStatsScope::Queue`].
        pub scope_modifier: u16,
    }
}

wire::wire_struct! {
    /// Basic statistics (C `efa_admin_basic_stats`).
    pub struct BasicStats(48) {
        /// Bytes sent.
        pub tx_bytes: u64,
        /// Packets sent.
        pub tx_pkts: u64,
        /// Bytes received.
        pub rx_bytes: u64,
        /// Packets received.
        pub rx_pkts: u64,
        /// Packets dropped on receive.
        pub rx_drops: u64,
        /// Packets dropped for a wrong queue key.
        pub qkey_viol: u64,
    }
}

wire::wire_struct! {
    /// Message statistics (C `efa_admin_messages_stats`).
    pub struct MessagesStats(32) {
        /// Bytes of sends.
        pub send_bytes: u64,
        /// Send work requests.
        pub send_wrs: u64,
        /// Bytes of receives.
        pub recv_bytes: u64,
        /// Receive work requests.
        pub recv_wrs: u64,
    }
}

wire::wire_struct! {
    /// RDMA read statistics (C `efa_admin_rdma_read_stats`).
    pub struct RdmaReadStats(32) {
        /// Read work requests.
        pub read_wrs: u64,
        /// Bytes read.
        pub read_bytes: u64,
        /// Read work requests that failed.
        pub read_wr_err: u64,
        /// Bytes returned to remote readers.
        pub read_resp_bytes: u64,
    }
}

wire::wire_struct! {
    /// RDMA write statistics (C `efa_admin_rdma_write_stats`).
    pub struct RdmaWriteStats(32) {
        /// Write work requests.
        pub write_wrs: u64,
        /// Bytes written.
        pub write_bytes: u64,
        /// Write work requests that failed.
        pub write_wr_err: u64,
        /// Bytes written by remote writers.
        pub write_recv_bytes: u64,
    }
}

wire::wire_struct! {
    /// Network statistics (C `efa_admin_network_stats`).
    pub struct NetworkStats(40) {
        /// Bytes retransmitted.
        pub retrans_bytes: u64,
        /// Packets retransmitted.
        pub retrans_pkts: u64,
        /// Retransmission timeouts.
        pub retrans_timeout_events: u64,
        /// Remotes that stopped responding.
        pub unresponsive_remote_events: u64,
        /// Connections to impaired remotes.
        pub impaired_remote_conn_events: u64,
    }
}

wire::wire_struct! {
    /// GET_STATS response (C `efa_admin_acq_get_stats_resp`); 56 bytes, the
    /// union being as large as [`BasicStats`].
    pub struct GetStatsResp(56) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// Statistics union, by the command's type.
        pub u: [u8; 48],
    }
}

wire::wire_union! {
    GetStatsResp.u[48] {
        /// [`GetStatsType::Basic`] statistics.
        basic_stats / set_basic_stats: BasicStats,
        /// [`GetStatsType::Messages`] statistics.
        messages_stats / set_messages_stats: MessagesStats,
        /// [`GetStatsType::RdmaRead`] statistics.
        rdma_read_stats / set_rdma_read_stats: RdmaReadStats,
        /// [`GetStatsType::RdmaWrite`] statistics.
        rdma_write_stats / set_rdma_write_stats: RdmaWriteStats,
        /// [`GetStatsType::Network`] statistics.
        network_stats / set_network_stats: NetworkStats,
    }
}

wire::wire_struct! {
    /// Feature selector of GET/SET_FEATURE (C
    /// `efa_admin_get_set_feature_common_desc`).
    pub struct GetSetFeatureCommonDesc(4) {
        /// Reserved, zero.
        pub reserved0: u8,
        /// [`FeatureId`].
        pub feature_id: u8,
        /// Reserved, zero.
        pub reserved16: u16,
    }
}

wire::wire_struct! {
    /// Device attributes, feature [`FeatureId::DeviceAttr`] (C
    /// `efa_admin_feature_device_attr_desc`).
    pub struct DeviceAttr(56) {
        /// Supported features: bit `id` for each [`FeatureId`].
        pub supported_features: u64,
        /// Page sizes usable in REG_MR (bit `n` = `1 << n` bytes).
        pub page_size_cap: u64,
        /// Firmware version.
        pub fw_version: u32,
        /// Admin API version (the driver requires at least 1).
        pub admin_api_version: u32,
        /// Device version.
        pub device_version: u32,
        /// BAR of the send/receive/CQ doorbells.
        pub db_bar: u16,
        /// Physical address width in bits.
        pub phys_addr_width: u8,
        /// Virtual address width in bits.
        pub virt_addr_width: u8,
        /// Capability bits ([`DeviceAttr::RDMA_READ`] ...).
        pub device_caps: u32,
        /// Largest RDMA transfer in bytes.
        pub max_rdma_size: u32,
        /// Globally unique device id.
        pub guid: u64,
        /// Link speed in Gbit/s (0: the driver assumes 100).
        pub max_link_speed_gbps: u16,
        /// Reserved, zero.
        pub reserved0: u16,
        /// Reserved, zero.
        pub reserved1: u32,
    }
}

impl DeviceAttr {
    /// `device_caps`: RDMA read on send queues.
    pub const RDMA_READ: Field<u32> = Field::new(1 << 0);
    /// `device_caps`: RNR retry in MODIFY_QP.
    pub const RNR_RETRY: Field<u32> = Field::new(1 << 1);
    /// `device_caps`: 128-byte data polling.
    pub const DATA_POLLING_128: Field<u32> = Field::new(1 << 2);
    /// `device_caps`: RDMA write on send queues.
    pub const RDMA_WRITE: Field<u32> = Field::new(1 << 3);
    /// `device_caps`: unsolicited write-with-immediate receive.
    pub const UNSOLICITED_WRITE_RECV: Field<u32> = Field::new(1 << 4);
    /// `device_caps`: event counters.
    pub const EVENT_COUNTERS: Field<u32> = Field::new(1 << 5);
    /// `device_caps`: 64-bit send request ids.
    pub const SQ_64_BIT_REQ_ID: Field<u32> = Field::new(1 << 10);
    /// Link speed the C driver assumes when `max_link_speed_gbps` is 0.
    pub const DEFAULT_LINK_SPEED_GBPS: u16 = 100;
}

wire::wire_struct! {
    /// Queue limits, feature [`FeatureId::QueueAttr1`] (C
    /// `efa_admin_feature_queue_attr_desc_1`).
    pub struct QueueAttr1(56) {
        /// Most queue pairs.
        pub max_qp: u32,
        /// Most send WQEs per queue.
        pub max_sq_depth: u32,
        /// Largest inline send (superseded by
        /// [`QueueAttr2::inline_buf_size_ex`] where supported).
        pub inline_buf_size: u32,
        /// Most receive descriptors per queue.
        pub max_rq_depth: u32,
        /// Most completion queues.
        pub max_cq: u32,
        /// Most entries per completion queue.
        pub max_cq_depth: u32,
        /// Sub-CQs per CQ.
        pub sub_cqs_per_cq: u16,
        /// Fewest send WQEs per queue.
        pub min_sq_depth: u16,
        /// Most buffers per send WQE.
        pub max_wr_send_sges: u16,
        /// Most buffers per receive WQE.
        pub max_wr_recv_sges: u16,
        /// Most memory regions.
        pub max_mr: u32,
        /// Most pages registered in total.
        pub max_mr_pages: u32,
        /// Most protection domains.
        pub max_pd: u32,
        /// Most address handles.
        pub max_ah: u32,
        /// Largest LLQ in bytes.
        pub max_llq_size: u32,
        /// Most buffers per RDMA WQE.
        pub max_wr_rdma_sges: u16,
        /// Most bytes written to a send queue between doorbells, in units
        /// of 64 bytes; 0 is unlimited.
        pub max_tx_batch: u16,
    }
}

wire::wire_struct! {
    /// More queue limits, feature [`FeatureId::QueueAttr2`] (C
    /// `efa_admin_feature_queue_attr_desc_2`).
    pub struct QueueAttr2(24) {
        /// Largest inline send.
        pub inline_buf_size_ex: u16,
        /// Reserved, zero.
        pub reserved: [u8; 6],
        /// QP events an event counter can count ([`QueueAttr2::SEND_COMP`]
        /// ...).
        pub supported_event_counter_qp_events: u32,
        /// Most event counters.
        pub max_event_counters: u32,
        /// Counters wrap to 0 after this value.
        pub event_counter_max_val: u64,
    }
}

impl QueueAttr2 {
    /// `supported_event_counter_qp_events`: successful sends.
    pub const SEND_COMP: Field<u32> = Field::new(1 << 0);
    /// `supported_event_counter_qp_events`: failed sends.
    pub const SEND_COMP_ERR: Field<u32> = Field::new(1 << 1);
    /// `supported_event_counter_qp_events`: successful receives.
    pub const RECV_COMP: Field<u32> = Field::new(1 << 2);
    /// `supported_event_counter_qp_events`: failed receives.
    pub const RECV_COMP_ERR: Field<u32> = Field::new(1 << 3);
    /// `supported_event_counter_qp_events`: successful RDMA reads.
    pub const READ_COMP: Field<u32> = Field::new(1 << 4);
    /// `supported_event_counter_qp_events`: failed RDMA reads.
    pub const READ_COMP_ERR: Field<u32> = Field::new(1 << 5);
    /// `supported_event_counter_qp_events`: successful RDMA writes.
    pub const WRITE_COMP: Field<u32> = Field::new(1 << 6);
    /// `supported_event_counter_qp_events`: failed RDMA writes.
    pub const WRITE_COMP_ERR: Field<u32> = Field::new(1 << 7);
    /// `supported_event_counter_qp_events`: RDMA reads by remotes.
    pub const REMOTE_READ_COMP: Field<u32> = Field::new(1 << 8);
    /// `supported_event_counter_qp_events`: RDMA writes by remotes.
    pub const REMOTE_WRITE_COMP: Field<u32> = Field::new(1 << 9);
}

wire::wire_struct! {
    /// Event queue limits, feature [`FeatureId::EventQueueAttr`] (C
    /// `efa_admin_event_queue_attr_desc`).
    pub struct EventQueueAttr(12) {
        /// Most event queues.
        pub max_eq: u32,
        /// Most entries per event queue.
        pub max_eq_depth: u32,
        /// Supported event types (bit 0: completion events, see
        /// [`CreateEqCmd::COMPLETION_EVENTS`]).
        pub event_bitmask: u32,
    }
}

wire::wire_struct! {
    /// Asynchronous event groups, feature [`FeatureId::AenqConfig`] (C
    /// `efa_admin_feature_aenq_desc`). Bit `g` stands for `AenqGroup` `g`.
    pub struct AenqConfig(8) {
        /// Groups the device can report.
        pub supported_groups: u32,
        /// Groups to report.
        pub enabled_groups: u32,
    }
}

wire::wire_struct! {
    /// Network attributes, feature [`FeatureId::NetworkAttr`] (C
    /// `efa_admin_feature_network_attr_desc`).
    pub struct NetworkAttr(20) {
        /// Device address (the GID), network byte order.
        pub addr: [u8; 16],
        /// Largest packet payload in bytes.
        pub mtu: u32,
    }
}

wire::wire_struct! {
    /// Timeout hints, feature [`FeatureId::HwHints`] (C
    /// `efa_admin_hw_hints`); 0 means "use the driver's default".
    pub struct HwHints(8) {
        /// Readless read timeout (ms).
        pub mmio_read_timeout: u16,
        /// Keep-alive watchdog timeout (ms).
        pub driver_watchdog_timeout: u16,
        /// Admin completion timeout (ms). The 7.3 C driver takes the value
        /// as microseconds, so a device should report 0 (driver default)
        /// or a value that is long enough in both units.
        pub admin_completion_timeout: u16,
        /// Admin polling interval (ms).
        pub poll_interval: u16,
    }
}

wire::wire_struct! {
    /// GET_FEATURE command (C `efa_admin_get_feature_cmd`).
    pub struct GetFeatureCmd(60) {
        /// Buffer for large features (header `CTRL_DATA` set when used).
        pub control_buffer: CtrlBuffInfo,
        /// Feature to read.
        pub feature_common: GetSetFeatureCommonDesc,
        /// Raw feature-specific data.
        pub raw: [u8; 44],
    }
}

wire::wire_struct! {
    /// GET_FEATURE response (C `efa_admin_get_feature_resp`).
    pub struct GetFeatureResp(64) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// Feature union, by the command's feature id.
        pub u: [u8; 56],
    }
}

wire::wire_union! {
    GetFeatureResp.u[56] {
        /// [`FeatureId::DeviceAttr`].
        device_attr / set_device_attr: DeviceAttr,
        /// [`FeatureId::AenqConfig`].
        aenq / set_aenq: AenqConfig,
        /// [`FeatureId::NetworkAttr`].
        network_attr / set_network_attr: NetworkAttr,
        /// [`FeatureId::QueueAttr1`].
        queue_attr_1 / set_queue_attr_1: QueueAttr1,
        /// [`FeatureId::QueueAttr2`].
        queue_attr_2 / set_queue_attr_2: QueueAttr2,
        /// [`FeatureId::EventQueueAttr`].
        event_queue_attr / set_event_queue_attr: EventQueueAttr,
        /// [`FeatureId::HwHints`].
        hw_hints / set_hw_hints: HwHints,
    }
}

wire::wire_struct! {
    /// SET_FEATURE command (C `efa_admin_set_feature_cmd`).
    pub struct SetFeatureCmd(60) {
        /// Buffer for large features such as [`HostInfo`] (header
        /// `CTRL_DATA` set when used).
        pub control_buffer: CtrlBuffInfo,
        /// Feature to write.
        pub feature_common: GetSetFeatureCommonDesc,
        /// Feature union, by feature id.
        pub u: [u8; 44],
    }
}

wire::wire_union! {
    SetFeatureCmd.u[44] {
        /// [`FeatureId::AenqConfig`] (only `enabled_groups` is meaningful).
        aenq / set_aenq: AenqConfig,
    }
}

wire::wire_struct! {
    /// SET_FEATURE response (C `efa_admin_set_feature_resp`).
    pub struct SetFeatureResp(64) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// Raw feature-specific data (a union with a single `raw` member).
        pub u: [u8; 56],
    }
}

wire::wire_struct! {
    /// ALLOC_PD response (C `efa_admin_alloc_pd_resp`).
    pub struct AllocPdResp(12) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// Protection domain number.
        pub pd: u16,
        /// Reserved, zero.
        pub reserved: u16,
    }
}

wire::wire_struct! {
    /// DEALLOC_PD command (C `efa_admin_dealloc_pd_cmd`).
    pub struct DeallocPdCmd(4) {
        /// Protection domain number.
        pub pd: u16,
        /// Reserved, zero.
        pub reserved: u16,
    }
}

wire::wire_struct! {
    /// DEALLOC_PD response (C `efa_admin_dealloc_pd_resp`).
    pub struct DeallocPdResp(8) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
    }
}

wire::wire_struct! {
    /// ALLOC_UAR response (C `efa_admin_alloc_uar_resp`).
    pub struct AllocUarResp(12) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// User access region number.
        pub uar: u16,
        /// Reserved, zero.
        pub reserved: u16,
    }
}

wire::wire_struct! {
    /// DEALLOC_UAR command (C `efa_admin_dealloc_uar_cmd`).
    pub struct DeallocUarCmd(4) {
        /// User access region number.
        pub uar: u16,
        /// Reserved, zero.
        pub reserved: u16,
    }
}

wire::wire_struct! {
    /// DEALLOC_UAR response (C `efa_admin_dealloc_uar_resp`).
    pub struct DeallocUarResp(8) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
    }
}

wire::wire_struct! {
    /// CREATE_EQ command (C `efa_admin_create_eq_cmd`).
    pub struct CreateEqCmd(20) {
        /// Entries (a power of two).
        pub depth: u16,
        /// MSI-X vector.
        pub msix_vec: u8,
        /// [`CreateEqCmd::ENTRY_SIZE_WORDS`].
        pub caps: u8,
        /// Ring base address.
        pub ba: MemAddr,
        /// Enabled events ([`CreateEqCmd::COMPLETION_EVENTS`]).
        pub event_bitmask: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

impl CreateEqCmd {
    /// `caps`: entry size in 32-bit words (4 for `io::Eqe`).
    pub const ENTRY_SIZE_WORDS: Field<u8> = Field::new(0x1f);
    /// `event_bitmask`: completion events.
    pub const COMPLETION_EVENTS: Field<u32> = Field::new(0x1);
}

wire::wire_struct! {
    /// CREATE_EQ response (C `efa_admin_create_eq_resp`).
    pub struct CreateEqResp(12) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// Event queue number.
        pub eqn: u16,
        /// Reserved, zero.
        pub reserved: u16,
    }
}

wire::wire_struct! {
    /// DESTROY_EQ command (C `efa_admin_destroy_eq_cmd`).
    pub struct DestroyEqCmd(4) {
        /// Event queue number.
        pub eqn: u16,
        /// Reserved, zero.
        pub reserved: u16,
    }
}

wire::wire_struct! {
    /// DESTROY_EQ response (C `efa_admin_destroy_eq_resp`).
    pub struct DestroyEqResp(8) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
    }
}

wire::wire_struct! {
    /// Host information, feature [`FeatureId::HostInfo`] (C
    /// `efa_admin_host_info`), passed in a SET_FEATURE control buffer.
    pub struct HostInfo(180) {
        /// OS distribution (NUL-terminated; Linux puts the kernel release).
        pub os_dist_str: [u8; 128],
        /// [`OsType`].
        pub os_type: u32,
        /// Kernel version string (NUL-terminated).
        pub kernel_ver_str: [u8; 32],
        /// Kernel version number (`LINUX_VERSION_CODE`).
        pub kernel_ver: u32,
        /// Driver version ([`HostInfo::DRIVER_MAJOR`] ...).
        pub driver_ver: u32,
        /// PCI bus/device/function ([`HostInfo::BUS`] ...).
        pub bdf: u16,
        /// Common specification version ([`HostInfo::SPEC_MAJOR`] ...).
        pub spec_ver: u16,
        /// [`HostInfo::INTREE`], [`HostInfo::GDR`].
        pub flags: u32,
    }
}

impl HostInfo {
    /// `driver_ver`: module type.
    pub const DRIVER_MODULE_TYPE: Field<u32> = Field::new(0xff);
    /// `driver_ver`: sub-minor version.
    pub const DRIVER_SUB_MINOR: Field<u32> = Field::new(0xff00);
    /// `driver_ver`: minor version.
    pub const DRIVER_MINOR: Field<u32> = Field::new(0xff_0000);
    /// `driver_ver`: major version.
    pub const DRIVER_MAJOR: Field<u32> = Field::new(0xff00_0000);
    /// `bdf`: PCI function.
    pub const FUNCTION: Field<u16> = Field::new(0x7);
    /// `bdf`: PCI device (slot).
    pub const DEVICE: Field<u16> = Field::new(0xf8);
    /// `bdf`: PCI bus.
    pub const BUS: Field<u16> = Field::new(0xff00);
    /// `spec_ver`: minor version.
    pub const SPEC_MINOR: Field<u16> = Field::new(0xff);
    /// `spec_ver`: major version.
    pub const SPEC_MAJOR: Field<u16> = Field::new(0xff00);
    /// `flags`: the driver is the in-tree one.
    pub const INTREE: Field<u32> = Field::new(0x1);
    /// `flags`: GPUDirect RDMA is supported.
    pub const GDR: Field<u32> = Field::new(0x2);
}

wire::wire_struct! {
    /// SERVICE command (C `efa_admin_service_cmd`).
    pub struct ServiceCmd(60) {
        /// Opaque data.
        pub buffer: [u8; 60],
    }
}

wire::wire_struct! {
    /// SERVICE response (C `efa_admin_service_resp`).
    pub struct ServiceResp(64) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// Opaque data.
        pub buffer: [u8; 56],
    }
}

wire::wire_struct! {
    /// CREATE_EVENT_COUNTER command (C
    /// `efa_admin_create_event_counter_cmd`, packed: `paddr` is at byte 4).
    pub struct CreateEventCounterCmd(12, packed) {
        /// User access region.
        pub uar: u16,
        /// Reserved, zero.
        pub reserved: u16,
        /// DMA address of the 64-bit counter.
        pub paddr: u64,
    }
}

wire::wire_struct! {
    /// CREATE_EVENT_COUNTER response (C
    /// `efa_admin_create_event_counter_resp`).
    pub struct CreateEventCounterResp(16) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
        /// Counter handle.
        pub cntr_handle: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}

wire::wire_struct! {
    /// DESTROY_EVENT_COUNTER command (C
    /// `efa_admin_destroy_event_counter_cmd`).
    pub struct DestroyEventCounterCmd(4) {
        /// Counter handle.
        pub cntr_handle: u32,
    }
}

wire::wire_struct! {
    /// DESTROY_EVENT_COUNTER response (C
    /// `efa_admin_destroy_event_counter_resp`).
    pub struct DestroyEventCounterResp(8) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
    }
}

wire::wire_struct! {
    /// QP events counted by an event counter (C
    /// `efa_admin_event_counter_attach_qp_events`).
    pub struct EventCounterAttachQpEvents(8) {
        /// Queue pair handle.
        pub qp_handle: u32,
        /// Events ([`EventCounterAttachQpEvents::SEND_COMP`] ...; the same
        /// bits as [`QueueAttr2::supported_event_counter_qp_events`]).
        pub events: u32,
    }
}

impl EventCounterAttachQpEvents {
    /// `events`: successful sends.
    pub const SEND_COMP: Field<u32> = Field::new(1 << 0);
    /// `events`: failed sends.
    pub const SEND_COMP_ERR: Field<u32> = Field::new(1 << 1);
    /// `events`: successful receives.
    pub const RECV_COMP: Field<u32> = Field::new(1 << 2);
    /// `events`: failed receives.
    pub const RECV_COMP_ERR: Field<u32> = Field::new(1 << 3);
    /// `events`: successful RDMA reads.
    pub const READ_COMP: Field<u32> = Field::new(1 << 4);
    /// `events`: failed RDMA reads.
    pub const READ_COMP_ERR: Field<u32> = Field::new(1 << 5);
    /// `events`: successful RDMA writes.
    pub const WRITE_COMP: Field<u32> = Field::new(1 << 6);
    /// `events`: failed RDMA writes.
    pub const WRITE_COMP_ERR: Field<u32> = Field::new(1 << 7);
    /// `events`: RDMA reads by remotes.
    pub const REMOTE_READ_COMP: Field<u32> = Field::new(1 << 8);
    /// `events`: RDMA writes by remotes.
    pub const REMOTE_WRITE_COMP: Field<u32> = Field::new(1 << 9);
}

wire::wire_struct! {
    /// ATTACH_EVENT_COUNTER and DETACH_EVENT_COUNTER command (C
    /// `efa_admin_attach_detach_event_counter_cmd`).
    pub struct AttachDetachEventCounterCmd(16) {
        /// Counter handle.
        pub cntr_handle: u32,
        /// [`EventCounterAttachType`].
        pub attach_type: u8,
        /// Reserved, zero.
        pub reserved: [u8; 3],
        /// Attachment union, by `attach_type`.
        pub u: [u8; 8],
    }
}

wire::wire_union! {
    AttachDetachEventCounterCmd.u[8] {
        /// [`EventCounterAttachType::QpEvents`].
        qp_events / set_qp_events: EventCounterAttachQpEvents,
    }
}

wire::wire_struct! {
    /// ATTACH/DETACH_EVENT_COUNTER response (C
    /// `efa_admin_attach_detach_event_counter_resp`).
    pub struct AttachDetachEventCounterResp(8) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
    }
}

wire::wire_struct! {
    /// MODIFY_EVENT_COUNTER command (C
    /// `efa_admin_modify_event_counter_cmd`, packed: `value` is at byte 12).
    pub struct ModifyEventCounterCmd(20, packed) {
        /// Counter handle.
        pub cntr_handle: u32,
        /// [`EventCounterModifyOp`].
        pub operation: u8,
        /// Reserved, zero.
        pub reserved: [u8; 7],
        /// Value to set or add.
        pub value: u64,
    }
}

wire::wire_struct! {
    /// MODIFY_EVENT_COUNTER response (C
    /// `efa_admin_modify_event_counter_resp`).
    pub struct ModifyEventCounterResp(8) {
        /// Completion header.
        pub acq_common_desc: AcqCommonDesc,
    }
}

// Offsets given by the C compiler for the 7.3 headers (`offsetof`), for the
// first field of each sub-structure, fields after arrays and unions, and
// every field of the packed commands.
wire::wire_offsets! {
    CtrlBuffInfo { length: 0, address: 4 }
    AqCommonDesc { command_id: 0, opcode: 2, flags: 3 }
    AqCommonDescV2 { common: 0, checksum: 4, payload_ver: 6, reserved: 7 }
    AqEntry { aq_common_descriptor: 0, request_payload: 4 }
    AqEntryV2 { aq_common_descriptor: 0, request_payload: 12 }
    AcqCommonDesc { command: 0, status: 2, flags: 3, checksum: 4, reserved: 6 }
    AcqEntry { acq_common_descriptor: 0, response_specific_data: 8 }
    CreateQpCmd {
        pd: 0, qp_type: 2, flags: 3, sq_base_addr: 4, rq_base_addr: 12,
        send_cq_idx: 20, recv_cq_idx: 24, sq_l_key: 28, rq_l_key: 32,
        qp_alloc_size: 36, uar: 52, sl: 54, reserved: 55, reserved2: 56,
    }
    CreateQpResp {
        acq_common_desc: 0, qp_handle: 8, qp_num: 12, send_sub_cq_idx: 16,
        recv_sub_cq_idx: 18, sq_db_offset: 20, rq_db_offset: 24,
        llq_descriptors_offset: 28,
    }
    ModifyQpCmd { qp_handle: 4, sq_psn: 20, sq_drained_async_notify: 24, rnr_retry: 25 }
    QueryQpResp { qp_state: 8, sq_psn: 16, sq_draining: 20, rnr_retry: 21 }
    CreateAhCmd { dest_addr: 0, pd: 16, reserved: 18 }
    CreateAhResp { ah: 8 }
    RegMrCmd {
        pd: 0, reserved16_w1: 2, pbl: 4, mr_length: 36, flags: 44,
        permissions: 45, reserved16_w5: 46, page_num: 48, iova: 52,
    }
    RegMrResp { l_key: 8, r_key: 12, validity: 16, rdma_recv_ic_id: 19 }
    AllocMrCmd { max_pages: 4 }
    AllocMrResp { l_key: 8, r_key: 12 }
    CreateCqCmd { eqn: 4, cq_ba: 8, l_key: 16, num_sub_cqs: 20, uar: 22 }
    CreateCqResp { cq_idx: 8, sub_cq_actual_depth: 10, db_offset: 12, flags: 16 }
    GetStatsCmd { control_buffer: 0, type_: 12, scope: 13, scope_modifier: 14 }
    GetStatsResp { u: 8 }
    NetworkStats { impaired_remote_conn_events: 32 }
    DeviceAttr {
        supported_features: 0, page_size_cap: 8, fw_version: 16,
        admin_api_version: 20, device_version: 24, db_bar: 28,
        phys_addr_width: 30, virt_addr_width: 31, device_caps: 32,
        max_rdma_size: 36, guid: 40, max_link_speed_gbps: 48,
    }
    QueueAttr1 {
        sub_cqs_per_cq: 24, min_sq_depth: 26, max_wr_send_sges: 28,
        max_wr_recv_sges: 30, max_mr: 32, max_llq_size: 48,
        max_wr_rdma_sges: 52, max_tx_batch: 54,
    }
    QueueAttr2 {
        inline_buf_size_ex: 0, supported_event_counter_qp_events: 8,
        max_event_counters: 12, event_counter_max_val: 16,
    }
    NetworkAttr { mtu: 16 }
    GetFeatureCmd { control_buffer: 0, feature_common: 12, raw: 16 }
    GetFeatureResp { u: 8 }
    SetFeatureCmd { control_buffer: 0, feature_common: 12, u: 16 }
    SetFeatureResp { u: 8 }
    AllocPdResp { pd: 8 }
    AllocUarResp { uar: 8 }
    CreateEqCmd { msix_vec: 2, caps: 3, ba: 4, event_bitmask: 12, reserved: 16 }
    CreateEqResp { eqn: 8 }
    HostInfo {
        os_dist_str: 0, os_type: 128, kernel_ver_str: 132, kernel_ver: 164,
        driver_ver: 168, bdf: 172, spec_ver: 174, flags: 176,
    }
    ServiceResp { buffer: 8 }
    CreateEventCounterCmd { uar: 0, reserved: 2, paddr: 4 }
    CreateEventCounterResp { cntr_handle: 8 }
    AttachDetachEventCounterCmd { attach_type: 4, reserved: 5, u: 8 }
    ModifyEventCounterCmd { cntr_handle: 0, operation: 4, reserved: 5, value: 12 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command fits the 64-byte entry's payload, every response the
    /// 64-byte completion.
    #[test]
    fn commands_and_responses_fit() {
        let cmds = [
            CreateQpCmd::SIZE,
            ModifyQpCmd::SIZE,
            QueryQpCmd::SIZE,
            DestroyQpCmd::SIZE,
            CreateAhCmd::SIZE,
            DestroyAhCmd::SIZE,
            RegMrCmd::SIZE,
            DeregMrCmd::SIZE,
            AllocMrCmd::SIZE,
            CreateCqCmd::SIZE,
            DestroyCqCmd::SIZE,
            GetStatsCmd::SIZE,
            GetFeatureCmd::SIZE,
            SetFeatureCmd::SIZE,
            DeallocPdCmd::SIZE,
            DeallocUarCmd::SIZE,
            CreateEqCmd::SIZE,
            DestroyEqCmd::SIZE,
            ServiceCmd::SIZE,
            CreateEventCounterCmd::SIZE,
            DestroyEventCounterCmd::SIZE,
            AttachDetachEventCounterCmd::SIZE,
            ModifyEventCounterCmd::SIZE,
        ];
        for size in cmds {
            assert!(size <= AqEntry::MAX_PAYLOAD);
        }
        let resps = [
            CreateQpResp::SIZE,
            ModifyQpResp::SIZE,
            QueryQpResp::SIZE,
            DestroyQpResp::SIZE,
            CreateAhResp::SIZE,
            DestroyAhResp::SIZE,
            RegMrResp::SIZE,
            DeregMrResp::SIZE,
            AllocMrResp::SIZE,
            CreateCqResp::SIZE,
            DestroyCqResp::SIZE,
            GetStatsResp::SIZE,
            GetFeatureResp::SIZE,
            SetFeatureResp::SIZE,
            AllocPdResp::SIZE,
            DeallocPdResp::SIZE,
            AllocUarResp::SIZE,
            DeallocUarResp::SIZE,
            CreateEqResp::SIZE,
            DestroyEqResp::SIZE,
            ServiceResp::SIZE,
            CreateEventCounterResp::SIZE,
            DestroyEventCounterResp::SIZE,
            AttachDetachEventCounterResp::SIZE,
            ModifyEventCounterResp::SIZE,
        ];
        for size in resps {
            assert!(size <= AcqEntry::SIZE);
        }
        assert_eq!(AqEntry::PAYLOAD_OFFSET, 4);
        assert_eq!(AqEntryV2::PAYLOAD_OFFSET, 12);
    }

    #[test]
    fn aq_entry_golden_bytes() {
        // GET_FEATURE(DEVICE_ATTR) with command id 0x123, phase 1, the way
        // the C driver builds it.
        let mut entry = AqEntry::ZERO;
        entry.aq_common_descriptor = AqCommonDesc {
            command_id: 0x123,
            opcode: AdminOpcode::GetFeature.raw(),
            flags: AqCommonDesc::PHASE.prep(1),
        };
        let mut cmd = GetFeatureCmd::ZERO;
        cmd.feature_common.feature_id = FeatureId::DeviceAttr.raw();
        entry.set_payload(&cmd).unwrap();
        let bytes = entry.to_bytes();
        let mut expected = [0u8; 64];
        expected[..4].copy_from_slice(&[0x23, 0x01, 0x0b, 0x01]);
        expected[4 + 13] = 1;
        assert_eq!(bytes, expected);

        let back = AqEntry::from_bytes(&bytes);
        assert_eq!(back, entry);
        let desc = back.aq_common_descriptor;
        assert_eq!(AqCommonDesc::COMMAND_ID.get(desc.command_id), 0x123);
        assert_eq!(
            AdminOpcode::try_from(desc.opcode),
            Ok(AdminOpcode::GetFeature)
        );
        assert!(AqCommonDesc::PHASE.is_set(desc.flags));
        assert!(!AqCommonDesc::CTRL_DATA.is_set(desc.flags));
        let got: GetFeatureCmd = back.payload();
        assert_eq!(
            FeatureId::from_raw(got.feature_common.feature_id),
            Some(FeatureId::DeviceAttr)
        );

        // Flags of an indirect REG_MR.
        let flags = AqCommonDesc::PHASE.prep(1)
            | AqCommonDesc::CTRL_DATA.prep(1)
            | AqCommonDesc::CTRL_DATA_INDIRECT.prep(1);
        assert_eq!(flags, 0x07);
    }

    #[test]
    fn packed_commands_golden_bytes() {
        let cmd = CreateQpCmd {
            pd: 0x0102,
            qp_type: QpType::Srd.raw(),
            flags: CreateQpCmd::SQ_64_BIT_REQ_ID.prep(1),
            sq_base_addr: 0x1122_3344_5566_7788,
            rq_base_addr: 0x99aa_bbcc_ddee_ff00,
            send_cq_idx: 3,
            recv_cq_idx: 4,
            sq_l_key: 0,
            rq_l_key: 0,
            qp_alloc_size: QpAllocSize {
                send_queue_ring_size: 0x1000,
                send_queue_depth: 64,
                recv_queue_ring_size: 0x400,
                recv_queue_depth: 64,
            },
            uar: 7,
            sl: 8,
            reserved: 0,
            reserved2: 0,
        };
        let b = cmd.to_bytes();
        assert_eq!(&b[..4], &[0x02, 0x01, 0x02, 0x08]);
        assert_eq!(&b[4..12], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[12..20], &0x99aa_bbcc_ddee_ff00u64.to_le_bytes());
        assert_eq!(&b[20..24], &3u32.to_le_bytes());
        assert_eq!(&b[36..40], &0x1000u32.to_le_bytes());
        assert_eq!(&b[52..56], &[7, 0, 8, 0]);
        assert_eq!(CreateQpCmd::from_bytes(&b), cmd);

        let mut mr = RegMrCmd::ZERO;
        mr.pd = 5;
        mr.set_inline_pbl_array(&[0x1000, 0x2000, 0x3000, 0x4000]);
        mr.mr_length = 0x4000;
        mr.flags = RegMrCmd::PHYS_PAGE_SIZE_SHIFT.prep(12);
        mr.permissions = RegMrCmd::LOCAL_WRITE_ENABLE.mask() | RegMrCmd::REMOTE_READ_ENABLE.mask();
        mr.page_num = 4;
        mr.iova = 0x7f00_0000_0000;
        let b = mr.to_bytes();
        assert_eq!(&b[4..12], &0x1000u64.to_le_bytes());
        assert_eq!(&b[28..36], &0x4000u64.to_le_bytes());
        assert_eq!(&b[36..44], &0x4000u64.to_le_bytes());
        assert_eq!(&b[44..48], &[12, 5, 0, 0]);
        assert_eq!(&b[48..52], &4u32.to_le_bytes());
        assert_eq!(&b[52..60], &0x7f00_0000_0000u64.to_le_bytes());
        assert_eq!(RegMrCmd::from_bytes(&b).inline_pbl_array()[3], 0x4000);

        mr.set_ctrl_buff(&CtrlBuffInfo {
            length: pbl::CHUNK_USED_SIZE as u32,
            address: MemAddr::new(0x1_2345_6000),
        });
        let b = mr.to_bytes();
        assert_eq!(
            &b[4..16],
            &[0xfc, 0x0f, 0, 0, 0x00, 0x60, 0x45, 0x23, 1, 0, 0, 0]
        );
        assert_eq!(&b[16..36], &[0; 20], "the rest of the union is cleared");
        assert_eq!(mr.ctrl_buff().address.get(), 0x1_2345_6000);

        let ec = CreateEventCounterCmd {
            uar: 1,
            reserved: 0,
            paddr: 0x0807_0605_0403_0201,
        };
        assert_eq!(ec.to_bytes(), [1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        let me = ModifyEventCounterCmd {
            cntr_handle: 9,
            operation: EventCounterModifyOp::Add.raw(),
            reserved: [0; 7],
            value: 0x10,
        };
        let b = me.to_bytes();
        assert_eq!(&b[..5], &[9, 0, 0, 0, 1]);
        assert_eq!(&b[12..], &[0x10, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn feature_unions() {
        let attr = DeviceAttr {
            supported_features: FeatureId::DeviceAttr.bit()
                | FeatureId::QueueAttr1.bit()
                | FeatureId::QueueAttr2.bit(),
            page_size_cap: 0xffff_f000,
            admin_api_version: 1,
            db_bar: 2,
            device_caps: DeviceAttr::RDMA_READ.mask() | DeviceAttr::SQ_64_BIT_REQ_ID.mask(),
            guid: 0x0123_4567_89ab_cdef,
            ..DeviceAttr::ZERO
        };
        assert_eq!(attr.supported_features, 0x212);
        assert!(FeatureId::QueueAttr2.is_supported(attr.supported_features));
        assert!(!FeatureId::HwHints.is_supported(attr.supported_features));
        assert!(FeatureId::DeviceAttr.is_supported(0));

        let mut resp = GetFeatureResp::ZERO;
        resp.acq_common_desc.flags = AcqCommonDesc::PHASE.prep(1);
        resp.set_device_attr(&attr);
        assert_eq!(resp.device_attr(), attr);
        let entry = AcqEntry::from_resp(&resp);
        assert_eq!(&entry.response_specific_data[..8], &0x212u64.to_le_bytes());
        assert_eq!(entry.response_specific_data[28], 2);
        assert_eq!(
            &entry.response_specific_data[32..36],
            &0x401u32.to_le_bytes()
        );
        let back: GetFeatureResp = entry.resp();
        assert_eq!(back.device_attr(), attr);

        let mut resp = GetFeatureResp::ZERO;
        let hints = HwHints {
            mmio_read_timeout: 1,
            driver_watchdog_timeout: 2,
            admin_completion_timeout: 3,
            poll_interval: 4,
        };
        resp.set_hw_hints(&hints);
        assert_eq!(&resp.u[..8], &[1, 0, 2, 0, 3, 0, 4, 0]);
        assert_eq!(resp.u[8..], [0; 48]);

        let mut set = SetFeatureCmd::ZERO;
        set.feature_common.feature_id = FeatureId::AenqConfig.raw();
        set.set_aenq(&AenqConfig {
            supported_groups: 0,
            enabled_groups: 0x1e,
        });
        let b = set.to_bytes();
        assert_eq!(b[13], 2);
        assert_eq!(&b[16..24], &[0, 0, 0, 0, 0x1e, 0, 0, 0]);

        let mut stats = GetStatsResp::ZERO;
        stats.set_network_stats(&NetworkStats {
            impaired_remote_conn_events: 5,
            ..NetworkStats::ZERO
        });
        assert_eq!(stats.to_bytes()[8 + 32], 5);
        assert_eq!(stats.network_stats().impaired_remote_conn_events, 5);
    }

    #[test]
    fn crc16() {
        assert_eq!(crc16_checksum(b"123456789"), 0xb4c8);
        assert_eq!(crc16_checksum(&[]), 0);

        let mut cqe = AcqEntry::from_resp(&AllocPdResp {
            acq_common_desc: AcqCommonDesc {
                command: 0x0a5,
                status: AdminStatus::Success.raw(),
                flags: 1,
                checksum: 0,
                reserved: 0,
            },
            pd: 3,
            reserved: 0,
        });
        cqe.seal();
        assert!(cqe.checksum_ok());
        let sum = cqe.acq_common_descriptor.checksum;
        let mut bytes = cqe.to_bytes();
        bytes[4] = 0;
        bytes[5] = 0;
        assert_eq!(crc16_checksum(&bytes), sum);
        cqe.response_specific_data[0] ^= 1;
        assert!(!cqe.checksum_ok());

        let mut aqe = AqEntryV2::ZERO;
        aqe.aq_common_descriptor.common.opcode = AdminOpcode::AllocPd.raw();
        aqe.aq_common_descriptor.common.flags = 1;
        aqe.seal();
        assert!(aqe.checksum_ok());
        let sum = aqe.aq_common_descriptor.checksum;
        let mut bytes = aqe.to_bytes();
        assert_eq!(&bytes[4..6], &sum.to_le_bytes());
        bytes[4] = 0;
        bytes[5] = 0;
        assert_eq!(crc16_checksum(&bytes), sum);
    }

    #[test]
    fn page_list_chunks() {
        assert_eq!(pbl::PTRS_PER_CHUNK, 510);
        assert_eq!(pbl::CHUNK_USED_SIZE, 4092);
        assert_eq!(pbl::chunk_ptrs(4092), Some(510));
        assert_eq!(pbl::chunk_ptrs(3 * 8 + 12), Some(3));
        assert_eq!(pbl::chunk_ptrs(12), Some(0));
        assert_eq!(pbl::chunk_ptrs(11), None);
        assert_eq!(pbl::chunk_ptrs(4093), None);
        assert_eq!(pbl::chunk_ptrs(4096), None);
        assert_eq!(pbl::chunk_ptrs(21), None);
        assert_eq!(pbl::chunk_ptrs(u32::MAX), None);
        assert_eq!(pbl::link_offset(4092), 4080);
        assert_eq!(pbl::link_offset(0), 0);
        let link = CtrlBuffInfo::decode(&[0xfc, 0x0f, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(link.length, 4092);
        assert_eq!(link.address.get(), 0x1000);
    }

    #[test]
    fn enums_and_ids() {
        assert_eq!(AdminOpcode::ALL.len(), 26);
        assert_eq!(
            AdminOpcode::try_from(29),
            Ok(AdminOpcode::DetachEventCounter)
        );
        assert_eq!(AdminOpcode::try_from(22), Err(22));
        assert_eq!(AdminOpcode::try_from(0), Err(0));
        assert_eq!(AdminOpcode::MAX, AdminOpcode::DetachEventCounter.raw());
        assert_eq!(FeatureId::try_from(8), Err(8));
        assert_eq!(FeatureId::QueueAttr2.bit(), 1 << 9);
        assert_eq!(QpState::Err.raw(), 6);
        assert_eq!(QpType::try_from(2), Ok(QpType::Srd));
        assert_eq!(AdminStatus::from_raw(7), Some(AdminStatus::ResourceBusy));
        assert_eq!(AdminStatus::from_raw(8), None);
        assert_eq!(GetStatsType::from_raw(4), Some(GetStatsType::Network));
        assert_eq!(
            MemAddr::new(0x1234_5678_9abc_def0).mem_addr_high,
            0x1234_5678
        );
        assert_eq!(HostInfo::DEVICE.prep(0x1f), 0xf8);
        assert_eq!(
            HostInfo::SPEC_MAJOR.prep(COMMON_SPEC_VERSION_MAJOR as u16),
            0x200
        );
    }

    /// Decoding arbitrary and short input never panics.
    #[test]
    fn garbage_never_panics() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut buf = [0u8; 200];
        for len in 0..buf.len() {
            for byte in buf.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *byte = seed as u8;
            }
            let input = &buf[..len];
            let entry = AqEntry::decode_padded(input);
            let _ = AqEntry::decode(input);
            let _ = AqEntryV2::decode(input).map(|e| e.checksum_ok());
            let _ = AcqEntry::decode(input).map(|e| e.checksum_ok());
            let _ = AdminOpcode::try_from(entry.aq_common_descriptor.opcode);
            let _ = entry.payload::<CreateQpCmd>();
            let mr = entry.payload::<RegMrCmd>();
            let _ = (mr.inline_pbl_array(), mr.ctrl_buff());
            let _ = pbl::chunk_ptrs(mr.ctrl_buff().length);
            let _ = pbl::link_offset(mr.ctrl_buff().length);
            let gf = GetFeatureResp::decode_padded(input);
            let _ = (gf.device_attr(), gf.queue_attr_1(), gf.queue_attr_2());
            let _ = (
                gf.network_attr(),
                gf.aenq(),
                gf.event_queue_attr(),
                gf.hw_hints(),
            );
            let _ = GetStatsResp::decode_padded(input).basic_stats();
            let _ = AttachDetachEventCounterCmd::decode_padded(input).qp_events();
            let _ = HostInfo::decode(input);
            let _ = crc16_checksum(input);
        }
    }
}
