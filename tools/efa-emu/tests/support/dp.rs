//! The data-path half of the fake driver: queue pairs set up the way the C
//! driver and rdma-core's `efa` provider do, WQEs written into the LLQ in
//! BAR2 with their phase, doorbells written to shared memory, receive
//! descriptors in guest memory, completions polled by phase.

use std::sync::Arc;
use std::time::{Duration, Instant};

use efa_emu::shmem::SharedMem;
use efa_emu::transport::GuestMemory;
use efa_hw::admin::*;
use efa_hw::io::*;
use efa_hw::wire::Wire;

use super::{Fake, Ram, PATIENCE};

/// What an endpoint is made of.
#[derive(Debug, Clone, Copy)]
pub struct EpOpts {
    pub qp_type: QpType,
    pub sq_depth: u32,
    pub wqe_size: u32,
    pub rq_depth: u32,
    pub cq_depth: u16,
    /// 16 or 32.
    pub cqe_size: u16,
    pub src_addr: bool,
    /// Completion events on this EQ.
    pub eqn: Option<u16>,
    pub rnr_retry: u8,
    pub qkey: u32,
    pub qp_flags: u8,
    pub cq_64: bool,
}

impl EpOpts {
    pub fn srd() -> Self {
        Self {
            qp_type: QpType::Srd,
            sq_depth: 64,
            wqe_size: 64,
            rq_depth: 64,
            cq_depth: 256,
            cqe_size: 32,
            src_addr: true,
            eqn: None,
            rnr_retry: 7,
            qkey: 0x1111,
            qp_flags: 0,
            cq_64: false,
        }
    }

    pub fn ud() -> Self {
        Self {
            qp_type: QpType::Ud,
            ..Self::srd()
        }
    }
}

/// A completion as read from a CQ (the 32-byte form; 16-byte entries leave
/// the second half zero).
#[derive(Debug, Clone, Copy)]
pub struct Cqe {
    pub sub: u16,
    pub e: RxCdescEx,
}

impl Cqe {
    pub fn status(&self) -> CompStatus {
        CompStatus::try_from(self.e.base.common.status).expect("known status")
    }
    pub fn is_send(&self) -> bool {
        CdescCommon::Q_TYPE.get(self.e.base.common.flags) == QueueType::Send.raw()
    }
    pub fn op(&self) -> u8 {
        CdescCommon::OP_TYPE.get(self.e.base.common.flags)
    }
    pub fn req_id(&self) -> u16 {
        self.e.base.common.req_id
    }
    pub fn has_imm(&self) -> bool {
        CdescCommon::HAS_IMM.is_set(self.e.base.common.flags)
    }
    pub fn tx(&self) -> TxCdesc {
        TxCdesc::decode_padded(&self.e.to_bytes())
    }
}

/// A registered buffer.
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    /// Guest physical address.
    pub gpa: u64,
    /// Address the MR was registered at (what WQEs carry).
    pub iova: u64,
    pub len: u64,
    pub key: u32,
}

impl Buf {
    /// An SGE for bytes `[off, off + len)`.
    pub fn sge(&self, off: u64, len: u32) -> (u64, u32, u32) {
        (self.iova + off, len, self.key)
    }
}

/// One QP with its own PD, UAR and CQ.
pub struct Ep {
    pub pd: u16,
    pub uar: u16,
    pub qpn: u16,
    pub cq: u16,
    pub opts: EpOpts,
    pub resp: CreateQpResp,
    bar2: Arc<SharedMem>,
    ram: Arc<Ram>,
    cq_ring: u64,
    cq_db: u32,
    cq_cc: Vec<u32>,
    cq_total: u16,
    pub cmd_sn: u8,
    sq_pc: u16,
    rq_base: u64,
    rq_pc: u16,
}

impl Fake {
    /// Runs Reset -> Init -> RTR -> RTS.
    pub fn bring_to_rts(&mut self, qp: u32, qkey: u32, rnr: Option<u8>) {
        let states = [
            (QpState::Init, ModifyQpCmd::QKEY.mask()),
            (QpState::Rtr, 0),
            (
                QpState::Rts,
                ModifyQpCmd::SQ_PSN.mask() | rnr.map_or(0, |_| ModifyQpCmd::RNR_RETRY.mask()),
            ),
        ];
        for (s, m) in states {
            let c = ModifyQpCmd {
                modify_mask: m | ModifyQpCmd::QP_STATE.mask(),
                qp_handle: qp,
                qp_state: s.raw(),
                qkey,
                rnr_retry: rnr.unwrap_or(0),
                ..ModifyQpCmd::ZERO
            };
            self.cmd::<ModifyQpResp>(AdminOpcode::ModifyQp, 0, &c)
                .unwrap_or_else(|e| panic!("modify to {s:?}: {e:?}"));
        }
    }

    pub fn set_state(&mut self, qp: u32, s: QpState) -> Result<(), AdminStatus> {
        let c = ModifyQpCmd {
            modify_mask: ModifyQpCmd::QP_STATE.mask(),
            qp_handle: qp,
            qp_state: s.raw(),
            ..ModifyQpCmd::ZERO
        };
        self.cmd::<ModifyQpResp>(AdminOpcode::ModifyQp, 0, &c)
            .map(|_| ())
    }

    /// An EQ of `depth` entries on MSI-X `vector`: (eqn, ring).
    pub fn create_eq(&mut self, depth: u16, vector: u8) -> (u16, u64) {
        let ring = self.alloc(u64::from(depth) * 16, 4096);
        let c = CreateEqCmd {
            depth,
            msix_vec: vector,
            caps: CreateEqCmd::ENTRY_SIZE_WORDS.prep(4),
            ba: MemAddr::new(ring),
            event_bitmask: CreateEqCmd::COMPLETION_EVENTS.mask(),
            reserved: 0,
        };
        let r: CreateEqResp = self.cmd(AdminOpcode::CreateEq, 0, &c).unwrap();
        (r.eqn, ring)
    }

    /// A PD, UAR, CQ and QP in RTS, as `opts` say.
    pub fn ep(&mut self, o: EpOpts) -> Ep {
        let pd = self.alloc_pd().unwrap();
        self.ep_in(pd, o)
    }

    /// Like [`Fake::ep`] in an existing PD.
    pub fn ep_in(&mut self, pd: u16, o: EpOpts) -> Ep {
        let uar = self.alloc_uar().unwrap();
        let subs = self.dev.config().limits.sub_cqs_per_cq;
        let cq_ring = self.alloc(
            u64::from(o.cq_depth) * u64::from(o.cqe_size) * u64::from(subs),
            4096,
        );
        let mut c = CreateCqCmd::ZERO;
        c.cq_caps_2 = CreateCqCmd::CQ_ENTRY_SIZE_WORDS.prep((o.cqe_size / 4) as u8)
            | CreateCqCmd::SET_SRC_ADDR.prep(o.src_addr.into())
            | CreateCqCmd::SQ_COMP_64_BIT_REQ_ID.prep(o.cq_64.into());
        if let Some(eqn) = o.eqn {
            c.cq_caps_1 = CreateCqCmd::INTERRUPT_MODE_ENABLED.prep(1);
            c.eqn = eqn;
        }
        c.sub_cq_depth = o.cq_depth;
        c.num_sub_cqs = subs;
        c.uar = uar;
        c.cq_ba = MemAddr::new(cq_ring);
        let cq: CreateCqResp = self.cmd(AdminOpcode::CreateCq, 0, &c).unwrap();
        let rq_ring = o.rq_depth * 16;
        let rq_base = if rq_ring > 0 {
            self.alloc(u64::from(rq_ring).max(4096), 4096)
        } else {
            0
        };
        let q = CreateQpCmd {
            pd,
            qp_type: o.qp_type.raw(),
            flags: o.qp_flags,
            rq_base_addr: rq_base,
            send_cq_idx: cq.cq_idx.into(),
            recv_cq_idx: cq.cq_idx.into(),
            qp_alloc_size: QpAllocSize {
                send_queue_ring_size: o.sq_depth * o.wqe_size,
                send_queue_depth: o.sq_depth,
                recv_queue_ring_size: rq_ring,
                recv_queue_depth: o.rq_depth,
            },
            uar,
            ..CreateQpCmd::ZERO
        };
        let resp: CreateQpResp = self.cmd(AdminOpcode::CreateQp, 0, &q).unwrap();
        let rnr = (o.qp_type == QpType::Srd).then_some(o.rnr_retry);
        self.bring_to_rts(resp.qp_handle, o.qkey, rnr);
        Ep {
            pd,
            uar,
            qpn: resp.qp_num,
            cq: cq.cq_idx,
            opts: o,
            resp,
            bar2: self.dev.bar2(),
            ram: self.ram.clone(),
            cq_ring,
            cq_db: cq.db_offset,
            cq_cc: vec![0; subs.into()],
            cq_total: 0,
            cmd_sn: 0,
            sq_pc: 0,
            rq_base,
            rq_pc: 0,
        }
    }

    /// A buffer of `len` bytes registered in `pd` with `perms`, filled with
    /// `fill`. Its registered address differs from its guest address.
    pub fn mr(&mut self, pd: u16, len: u64, perms: u8, fill: u8) -> Buf {
        let shift = len.next_power_of_two().trailing_zeros().max(12);
        let size = 1u64 << shift;
        let gpa = self.alloc(size, size);
        self.ram.put(gpa, &vec![fill; size as usize]);
        let iova = 0x7000_0000_0000 | gpa;
        let mut c = RegMrCmd {
            pd,
            mr_length: len,
            flags: RegMrCmd::PHYS_PAGE_SIZE_SHIFT.prep(shift as u8),
            permissions: perms,
            iova,
            ..RegMrCmd::ZERO
        };
        c.set_inline_pbl_array(&[gpa, 0, 0, 0]);
        let r: RegMrResp = self.cmd(AdminOpcode::RegMr, 0, &c).unwrap();
        Buf {
            gpa,
            iova,
            len,
            key: r.l_key,
        }
    }

    /// A buffer of `len` bytes (a multiple of 4 KiB) registered in `pd`
    /// with `perms` and 4 KiB pages, filled with `fill`, whose pages lie in
    /// guest memory in reverse order: as a guest's user pages do, no two
    /// neighbours in the buffer are neighbours in memory. `gpa` is its
    /// first page's address.
    pub fn mr_scattered(&mut self, pd: u16, len: u64, perms: u8, fill: u8) -> Buf {
        assert!(len > 0 && len % 4096 == 0);
        let n = len / 4096;
        let base = self.alloc(len, 4096);
        self.ram.put(base, &vec![fill; len as usize]);
        let pages: Vec<u64> = (0..n).rev().map(|i| base + i * 4096).collect();
        let iova = 0x7000_0000_0000 | base;
        let mut c = RegMrCmd {
            pd,
            mr_length: len,
            flags: RegMrCmd::PHYS_PAGE_SIZE_SHIFT.prep(12),
            permissions: perms,
            iova,
            ..RegMrCmd::ZERO
        };
        let mut flags = 0;
        if pages.len() <= 4 {
            let mut inline = [0u64; 4];
            inline[..pages.len()].copy_from_slice(&pages);
            c.set_inline_pbl_array(&inline);
        } else {
            let (first, _) = super::indirect_pbl(self, &pages);
            c.set_ctrl_buff(&first);
            flags = AqCommonDesc::CTRL_DATA.mask() | AqCommonDesc::CTRL_DATA_INDIRECT.mask();
        }
        let r: RegMrResp = self.cmd(AdminOpcode::RegMr, flags, &c).unwrap();
        Buf {
            gpa: pages[0],
            iova,
            len,
            key: r.l_key,
        }
    }

    pub fn ah(&mut self, pd: u16, gid: [u8; 16]) -> u16 {
        let c = CreateAhCmd {
            dest_addr: gid,
            pd,
            reserved: 0,
        };
        self.cmd::<CreateAhResp>(AdminOpcode::CreateAh, 0, &c)
            .unwrap()
            .ah
    }

    /// GET_STATS of type `t` for the device (`qp` None) or one QP.
    pub fn stats(&mut self, t: GetStatsType, qp: Option<u16>) -> GetStatsResp {
        let c = GetStatsCmd {
            type_: t.raw(),
            scope: if qp.is_some() {
                GetStatsScope::Queue.raw()
            } else {
                GetStatsScope::All.raw()
            },
            scope_modifier: qp.unwrap_or(0),
            ..GetStatsCmd::ZERO
        };
        self.cmd(AdminOpcode::GetStats, 0, &c).unwrap()
    }
}

/// Permissions: local write, remote read, remote write.
pub const ALL_PERMS: u8 = 0x7;

/// A send WQE (64-byte layout; its first 64 bytes are the same in the
/// 128-byte form).
pub fn send_wqe(
    req_id: u16,
    ah: u16,
    dest_qp: u16,
    qkey: u32,
    sges: &[(u64, u32, u32)],
    imm: Option<u32>,
) -> Vec<u8> {
    let mut w = TxWqe::ZERO;
    meta(
        &mut w.meta,
        SendOpType::Send,
        req_id,
        ah,
        dest_qp,
        qkey,
        imm,
    );
    w.meta.length = sges.len() as u16;
    let mut sgl = [TxBufDesc::ZERO; 2];
    for (d, &(addr, len, key)) in sgl.iter_mut().zip(sges) {
        d.length = len;
        d.lkey = key;
        d.set_buf_addr(addr);
    }
    w.set_sgl(&sgl);
    w.to_bytes().to_vec()
}

/// An inline send of `data` in a WQE of `size` bytes.
pub fn inline_wqe(
    req_id: u16,
    ah: u16,
    dest_qp: u16,
    qkey: u32,
    data: &[u8],
    size: usize,
) -> Vec<u8> {
    let mut w = TxWqe128::ZERO;
    meta(
        &mut w.meta,
        SendOpType::Send,
        req_id,
        ah,
        dest_qp,
        qkey,
        None,
    );
    TxMetaDesc::INLINE_MSG.set(&mut w.meta.ctrl1, 1);
    w.meta.length = data.len() as u16;
    w.data[..data.len()].copy_from_slice(data);
    w.to_bytes()[..size].to_vec()
}

/// An RDMA read or write of `local` to or from `rkey`/`raddr`.
#[allow(clippy::too_many_arguments)]
pub fn rdma_wqe(
    op: SendOpType,
    req_id: u16,
    ah: u16,
    dest_qp: u16,
    qkey: u32,
    rkey: u32,
    raddr: u64,
    local: (u64, u32, u32),
    imm: Option<u32>,
) -> Vec<u8> {
    let mut w = TxWqe::ZERO;
    meta(&mut w.meta, op, req_id, ah, dest_qp, qkey, imm);
    w.meta.length = 1;
    let mut r = RdmaReq::ZERO;
    r.remote_mem.length = local.1;
    r.remote_mem.rkey = rkey;
    r.remote_mem.set_buf_addr(raddr);
    r.local_mem[0].length = local.1;
    r.local_mem[0].lkey = local.2;
    r.local_mem[0].set_buf_addr(local.0);
    w.set_rdma_req(&r);
    w.to_bytes().to_vec()
}

/// An inline RDMA write (128-byte WQEs only).
pub fn inline_write_wqe(
    req_id: u16,
    ah: u16,
    dest_qp: u16,
    qkey: u32,
    rkey: u32,
    raddr: u64,
    data: &[u8],
) -> Vec<u8> {
    let mut w = TxWqe128::ZERO;
    meta(
        &mut w.meta,
        SendOpType::RdmaWrite,
        req_id,
        ah,
        dest_qp,
        qkey,
        None,
    );
    TxMetaDesc::INLINE_MSG.set(&mut w.meta.ctrl1, 1);
    w.meta.length = data.len() as u16;
    let mut r = RdmaReq128::ZERO;
    r.remote_mem.length = data.len() as u32;
    r.remote_mem.rkey = rkey;
    r.remote_mem.set_buf_addr(raddr);
    r.u[..data.len()].copy_from_slice(data);
    w.set_rdma_req(&r);
    w.to_bytes().to_vec()
}

fn meta(
    m: &mut TxMetaDesc,
    op: SendOpType,
    req_id: u16,
    ah: u16,
    dest_qp: u16,
    qkey: u32,
    imm: Option<u32>,
) {
    TxMetaDesc::META_DESC.set(&mut m.ctrl1, 1);
    TxMetaDesc::OP_TYPE.set(&mut m.ctrl1, op.raw());
    TxMetaDesc::FIRST.set(&mut m.ctrl2, 1);
    TxMetaDesc::LAST.set(&mut m.ctrl2, 1);
    TxMetaDesc::COMP_REQ.set(&mut m.ctrl2, 1);
    m.req_id = req_id;
    m.ah = ah;
    m.dest_qp_num = dest_qp;
    m.qkey = qkey;
    if let Some(v) = imm {
        TxMetaDesc::HAS_IMM.set(&mut m.ctrl1, 1);
        m.immediate_data = v;
    }
}

impl Ep {
    /// Copies `wqe` into the next LLQ slot with the pass's phase, as the
    /// provider does; the doorbell is separate ([`Ep::ring_sq`]).
    pub fn put_wqe(&mut self, wqe: &[u8]) {
        let o = &self.opts;
        let size = o.wqe_size as usize;
        // On the stack: the benchmark posts through here and counts the
        // model's allocations, not its own.
        let mut buf = [0u8; TX_DESC_SIZE_128];
        let w = &mut buf[..size];
        w[..wqe.len()].copy_from_slice(wqe);
        let pc = u32::from(self.sq_pc);
        let phase = ((pc / o.sq_depth) & 1) as u8;
        TxMetaDesc::PHASE.set(&mut w[3], phase);
        let at = self.resp.llq_descriptors_offset as usize + (pc % o.sq_depth) as usize * size;
        self.bar2.write(at, w).unwrap();
        self.sq_pc = self.sq_pc.wrapping_add(1);
    }

    pub fn ring_sq(&self) {
        self.bar2
            .store_u32(self.resp.sq_db_offset as usize, self.sq_pc.into())
            .unwrap();
    }

    /// Writes a raw SQ doorbell value.
    pub fn ring_sq_raw(&self, v: u32) {
        self.bar2
            .store_u32(self.resp.sq_db_offset as usize, v)
            .unwrap();
    }

    pub fn post_send(&mut self, wqe: &[u8]) {
        self.put_wqe(wqe);
        self.ring_sq();
    }

    /// The provider's view after the QP went back through Reset: its
    /// producer counters start over.
    pub fn restart(mut self) -> Self {
        self.sq_pc = 0;
        self.rq_pc = 0;
        self
    }

    /// Writes receive descriptors as given: (address, length, key, FIRST,
    /// LAST), then rings.
    pub fn post_recv_raw(&mut self, descs: &[(u64, u32, u32, bool, bool)]) {
        let ring = self.opts.rq_depth;
        for &(addr, len, key, first, last) in descs {
            let mut d = RxDesc {
                length: len as u16,
                lkey_ctrl: RxDesc::LKEY.prep(key)
                    | RxDesc::FIRST.prep(first.into())
                    | RxDesc::LAST.prep(last.into()),
                ..RxDesc::ZERO
            };
            d.set_buf_addr(addr);
            let at = self.rq_base + u64::from(u32::from(self.rq_pc) % ring) * 16;
            self.ram.put(at, &d.to_bytes());
            self.rq_pc = self.rq_pc.wrapping_add(1);
        }
        self.bar2
            .store_u32(self.resp.rq_db_offset as usize, self.rq_pc.into())
            .unwrap();
    }

    /// Posts a receive of one descriptor per SGE.
    pub fn post_recv(&mut self, req_id: u16, sges: &[(u64, u32, u32)]) {
        let ring = self.opts.rq_depth;
        for (i, &(addr, len, key)) in sges.iter().enumerate() {
            let mut d = RxDesc {
                req_id: if i == 0 { req_id } else { 0 },
                length: len as u16,
                lkey_ctrl: RxDesc::LKEY.prep(key)
                    | RxDesc::FIRST.prep((i == 0).into())
                    | RxDesc::LAST.prep((i + 1 == sges.len()).into()),
                ..RxDesc::ZERO
            };
            d.set_buf_addr(addr);
            let at = self.rq_base + u64::from(u32::from(self.rq_pc) % ring) * 16;
            self.ram.put(at, &d.to_bytes());
            self.rq_pc = self.rq_pc.wrapping_add(1);
        }
        self.bar2
            .store_u32(self.resp.rq_db_offset as usize, self.rq_pc.into())
            .unwrap();
    }

    /// Entry `n` (free-running) of sub-CQ `sub`, if the device wrote it.
    /// Read into a stack buffer: the benchmark polls through this and
    /// counts allocations.
    fn entry(&self, sub: usize, n: u32) -> Option<RxCdescEx> {
        let (depth, es) = (u32::from(self.opts.cq_depth), u64::from(self.opts.cqe_size));
        let phase = u8::from((n / depth) % 2 == 0);
        let at = self.cq_ring + (sub as u64 * u64::from(depth) + u64::from(n % depth)) * es;
        let mut bytes = [0u8; 32];
        let b = &mut bytes[..es as usize];
        self.ram.read(at, b).unwrap();
        let e = RxCdescEx::decode_padded(b);
        (CdescCommon::PHASE.get(e.base.common.flags) == phase).then_some(e)
    }

    /// Completions written and not polled yet (the consumer count and the
    /// CQ doorbell stay as they are).
    pub fn unpolled(&self) -> usize {
        (0..self.cq_cc.len())
            .map(|sub| {
                (self.cq_cc[sub]..)
                    .take_while(|&n| self.entry(sub, n).is_some())
                    .count()
            })
            .sum()
    }

    /// Every new completion, sub-CQ by sub-CQ.
    pub fn poll(&mut self) -> Vec<Cqe> {
        let mut out = Vec::new();
        self.poll_each(|c| out.push(c));
        out
    }

    /// Hands every new completion to `f`, sub-CQ by sub-CQ, allocating
    /// nothing; returns how many there were.
    pub fn poll_each(&mut self, mut f: impl FnMut(Cqe)) -> usize {
        let mut n_new = 0;
        for sub in 0..self.cq_cc.len() {
            while let Some(e) = self.entry(sub, self.cq_cc[sub]) {
                assert_eq!(e.base.common.qp_num, self.qpn, "completion of another QP");
                f(Cqe { sub: sub as u16, e });
                n_new += 1;
                self.cq_cc[sub] += 1;
                self.cq_total = self.cq_total.wrapping_add(1);
            }
        }
        if n_new > 0 {
            self.write_cq_db(false);
        }
        n_new
    }

    /// The CQ doorbell as rdma-core writes it.
    pub fn write_cq_db(&self, arm: bool) {
        self.bar2
            .store_u32(
                self.cq_db as usize,
                cq_doorbell(self.cq_total, self.cmd_sn, arm),
            )
            .unwrap();
    }

    /// Polls until `n` completions came (or panics after `PATIENCE`).
    pub fn wait(&mut self, n: usize) -> Vec<Cqe> {
        self.wait_for(n, PATIENCE)
    }

    pub fn wait_for(&mut self, n: usize, patience: Duration) -> Vec<Cqe> {
        let t = Instant::now();
        let mut got = Vec::new();
        while got.len() < n {
            got.extend(self.poll());
            if got.len() >= n {
                break;
            }
            assert!(
                t.elapsed() < patience,
                "QP {:#x}: {} of {n} completions after {patience:?}: {got:#?}",
                self.qpn,
                got.len()
            );
            std::thread::sleep(Duration::from_micros(100));
        }
        got
    }

    /// Asserts that nothing completes within `d`.
    pub fn quiet(&mut self, d: Duration) {
        std::thread::sleep(d);
        let got = self.poll();
        assert!(got.is_empty(), "unexpected completions: {got:#?}");
    }
}
