//! The device model driven by an in-process fake driver (tests/support):
//! bring-up, every admin command, bad input, faults, resets.

mod support;

use std::time::Duration;

use efa_emu::device::control;
use efa_emu::device::{InjectMode, InjectRule, BAR0_SIZE};
use efa_emu::transport::{BarBacking, PciFunction};
use efa_hw::admin::*;
use efa_hw::aenq::AenqGroup;
use efa_hw::regs::*;
use efa_hw::wire::Wire;
use support::*;

use AdminStatus::*;

fn pd_uar_cq(f: &mut Fake) -> (u16, u16, u16) {
    let pd = f.alloc_pd().unwrap();
    let uar = f.alloc_uar().unwrap();
    let cq = f.create_cq(uar).unwrap().cq_idx;
    (pd, uar, cq)
}

#[test]
fn pci_identity_and_bars() {
    let f = Fake::new(test_config());
    let id = f.dev.identity();
    assert_eq!((id.vendor, id.device), (0x1d0f, 0xefa2));
    assert_eq!(
        id.class, 0x02_00_00,
        "Ethernet controller, as EFA shows in lspci"
    );
    let bars = f.dev.bars();
    assert_eq!(bars.len(), 2);
    assert_eq!((bars[0].index, bars[0].size), (0, BAR0_SIZE));
    assert!(matches!(bars[0].backing, BarBacking::Trapped));
    assert_eq!(bars[1].index, 2);
    assert!(bars[1].is_64bit && bars[1].prefetchable);
    assert!(matches!(bars[1].backing, BarBacking::Shared(_)));
    assert_eq!(bars[1].size, f.dev.bar2_layout().size);
    assert!(bars[1].size.is_power_of_two());
    assert_eq!(f.dev.msix_vectors(), 4);
}

#[test]
fn readless_reads_and_the_reset_handshake() {
    let mut f = Fake::new(test_config());
    // No response address yet: nothing is written.
    assert_eq!(f.r(VERSION_OFF), None);
    f.set_resp_addr(f.resp);
    assert_eq!(f.r(VERSION_OFF), Some(api_version(0, 3)));
    let caps = f.reg(CAPS_OFF);
    assert_eq!(CAPS_DMA_ADDR_WIDTH.get(caps), 48);
    assert!(CAPS_RESET_TIMEOUT.get(caps) > 0);
    assert_eq!(CAPS_ADMIN_CMD_TO.get(caps), 0, "driver default by default");
    assert!(DEV_STS_READY.is_set(f.reg(DEV_STS_OFF)));
    assert_eq!(f.reg(0x0c), 0, "a hole in the register map reads 0");
    // Plain reads see the same registers.
    assert_eq!(f.mmio(VERSION_OFF.into()), api_version(0, 3));

    // Reset: the address is cleared at once; in progress until DEV_CTL 0.
    f.w(DEV_CTL_OFF, DEV_CTL_DEV_RESET.prep(1));
    assert_eq!(f.r(DEV_STS_OFF), None, "reset clears the readless address");
    assert!(!f.dev.is_fatal(), "and a read without one is ignored");
    f.set_resp_addr(f.resp);
    let sts = f.reg(DEV_STS_OFF);
    assert!(DEV_STS_RESET_IN_PROGRESS.is_set(sts) && DEV_STS_READY.is_set(sts));
    f.w(DEV_CTL_OFF, 0);
    let sts = f.reg(DEV_STS_OFF);
    assert!(!DEV_STS_RESET_IN_PROGRESS.is_set(sts));
    assert!(DEV_STS_RESET_FINISHED.is_set(sts));
    // Unaligned and odd-sized accesses are ignored, not fatal.
    f.dev.bar_write(0, 2, &[1, 2]);
    f.dev.bar_write(0, MMIO_REG_READ_OFF.into(), &[1]);
    let mut b = [0xffu8; 2];
    f.dev.bar_read(0, 0, &mut b);
    assert_eq!(b, [0, 0]);
}

#[test]
fn bring_up_and_every_feature() {
    let mut f = Fake::up(test_config());
    let a = f
        .get_feature(FeatureId::DeviceAttr.raw())
        .unwrap()
        .device_attr();
    assert_eq!(a.db_bar, 2);
    assert!(a.admin_api_version >= 1);
    for id in [
        FeatureId::AenqConfig,
        FeatureId::NetworkAttr,
        FeatureId::QueueAttr1,
        FeatureId::QueueAttr2,
        FeatureId::HwHints,
        FeatureId::HostInfo,
        FeatureId::EventQueueAttr,
    ] {
        assert!(id.is_supported(a.supported_features), "{id:?}");
    }
    assert_eq!(
        a.guid.to_le_bytes(),
        [2, 1, 2, 3, 4, 5, 0, 7],
        "GID interface id"
    );
    assert!(DeviceAttr::RDMA_READ.is_set(a.device_caps));
    assert!(DeviceAttr::RDMA_WRITE.is_set(a.device_caps));
    assert_eq!(a.max_link_speed_gbps, 100);

    let q = f
        .get_feature(FeatureId::QueueAttr1.raw())
        .unwrap()
        .queue_attr_1();
    let l = f.dev.config().limits.clone();
    assert_eq!((q.max_qp, q.max_cq, q.max_pd, q.max_ah), (8, 8, 4, 4));
    assert_eq!(q.sub_cqs_per_cq, l.sub_cqs_per_cq);
    assert_eq!(q.max_llq_size, l.max_llq_size);
    let q2 = f
        .get_feature(FeatureId::QueueAttr2.raw())
        .unwrap()
        .queue_attr_2();
    assert_eq!(q2.inline_buf_size_ex, 80);
    assert_eq!(q2.max_event_counters, 4);
    assert_eq!(q2.supported_event_counter_qp_events, 0x3ff);
    let n = f
        .get_feature(FeatureId::NetworkAttr.raw())
        .unwrap()
        .network_attr();
    assert_eq!(n.addr, f.dev.config().gid);
    assert_eq!(n.mtu, 8928);
    let e = f
        .get_feature(FeatureId::EventQueueAttr.raw())
        .unwrap()
        .event_queue_attr();
    assert_eq!(e.max_eq, 3, "one vector per EQ, vector 0 is admin");
    assert!(e.max_eq_depth.is_power_of_two());
    assert_eq!(e.event_bitmask, 1);
    let h = f.get_feature(FeatureId::HwHints.raw()).unwrap().hw_hints();
    assert_eq!(h.admin_completion_timeout, 0);

    // AENQ config: get, set what the driver sets, refuse more.
    let g = f.get_feature(FeatureId::AenqConfig.raw()).unwrap().aenq();
    assert_eq!((g.supported_groups, g.enabled_groups), (0x1e, 0));
    f.enable_aenq();
    assert_eq!(
        f.get_feature(FeatureId::AenqConfig.raw())
            .unwrap()
            .aenq()
            .enabled_groups,
        0x1e
    );
    assert_eq!(f.set_aenq_groups(0x21), Err(IllegalParameter));

    // HOST_INFO goes by DMA in a control buffer.
    let mut hi = HostInfo::ZERO;
    hi.os_dist_str[..10].copy_from_slice(b"7.3.4-test");
    hi.kernel_ver = 0x70304;
    hi.bdf = HostInfo::BUS.prep(3) | HostInfo::DEVICE.prep(2);
    let buf = f.alloc(HostInfo::SIZE as u64, 8);
    f.ram.put(buf, &hi.to_bytes());
    let mut c = SetFeatureCmd::ZERO;
    c.feature_common.feature_id = FeatureId::HostInfo.raw();
    c.control_buffer = CtrlBuffInfo {
        length: HostInfo::SIZE as u32,
        address: MemAddr::new(buf),
    };
    let ctrl = AqCommonDesc::CTRL_DATA.mask();
    f.cmd::<SetFeatureResp>(AdminOpcode::SetFeature, ctrl, &c)
        .unwrap();
    assert_eq!(f.dev.host_info(), Some(hi));
    // Without the flag, or pointing outside RAM: malformed.
    assert_eq!(
        f.cmd::<SetFeatureResp>(AdminOpcode::SetFeature, 0, &c)
            .err(),
        Some(MalformedRequest)
    );
    c.control_buffer.address = MemAddr::new(OUTSIDE);
    assert_eq!(
        f.cmd::<SetFeatureResp>(AdminOpcode::SetFeature, ctrl, &c)
            .err(),
        Some(MalformedRequest)
    );
    assert!(
        !f.dev.is_fatal(),
        "a command's bad buffer fails the command only"
    );

    // Unknown and write-only features.
    assert_eq!(f.get_feature(8).err(), Some(UnsupportedOpcode));
    assert_eq!(
        f.get_feature(FeatureId::HostInfo.raw()).err(),
        Some(UnsupportedOpcode)
    );
    let mut c = SetFeatureCmd::ZERO;
    c.feature_common.feature_id = FeatureId::DeviceAttr.raw();
    assert_eq!(
        f.cmd::<SetFeatureResp>(AdminOpcode::SetFeature, 0, &c)
            .err(),
        Some(UnsupportedOpcode)
    );
}

#[test]
fn older_api_versions_use_64_byte_entries() {
    for minor in [1, 2] {
        let mut cfg = test_config();
        cfg.api_minor = minor;
        let mut f = Fake::up(cfg);
        assert_eq!(f.esize, 64);
        assert!(f.alloc_pd().is_ok());
        assert!(f.get_feature(FeatureId::DeviceAttr.raw()).is_ok());
    }
}

#[test]
fn malformed_entries_get_error_completions() {
    let mut f = Fake::up(test_config());
    // Bad checksum (128-byte entries).
    let id = f.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]);
    let slot = u64::from((f.pc - 1) % f.depth);
    let at = f.aq + slot * 128 + 100;
    f.ram.put(at, &[0x55]);
    f.ring();
    assert_eq!(
        f.complete(id).acq_common_descriptor.status,
        MalformedRequest.raw()
    );
    // Reserved flag bits, and control data on a command that takes none.
    assert_eq!(
        f.raw(AdminOpcode::AllocPd.raw(), 0x10, &[]).err(),
        Some(MalformedRequest)
    );
    assert_eq!(
        f.raw(
            AdminOpcode::AllocPd.raw(),
            AqCommonDesc::CTRL_DATA.mask(),
            &[]
        )
        .err(),
        Some(MalformedRequest)
    );
    // Wrong phase: the entry the doorbell announces is stale.
    let id = f.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]);
    let slot = u64::from((f.pc - 1) % f.depth);
    let mut e = AqEntryV2::decode(&f.ram.get(f.aq + slot * 128, 128)).unwrap();
    e.aq_common_descriptor.common.flags ^= 1;
    e.seal();
    f.ram.put(f.aq + slot * 128, &e.to_bytes());
    f.ring();
    assert_eq!(
        f.complete(id).acq_common_descriptor.status,
        MalformedRequest.raw()
    );
    // Unknown and unimplemented opcodes.
    for op in [
        0u8,
        22,
        24,
        30,
        200,
        255,
        AdminOpcode::AllocMr.raw(),
        AdminOpcode::Service.raw(),
    ] {
        assert_eq!(
            f.raw(op, 0, &[]).err(),
            Some(UnsupportedOpcode),
            "opcode {op}"
        );
    }
    // Nothing of that hurt the device.
    assert!(f.alloc_pd().is_ok());
    assert!(!f.dev.is_fatal());
}

#[test]
fn completions_come_out_of_order_and_in_order_on_request() {
    let mut f = Fake::up(test_config());
    let ids: Vec<u16> = (0..3)
        .map(|_| f.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]))
        .collect();
    f.ring();
    let order = f.completion_order(&ids);
    assert_eq!(order, vec![ids[2], ids[1], ids[0]]);

    let mut cfg = test_config();
    cfg.reorder = false;
    let mut f = Fake::up(cfg);
    let ids: Vec<u16> = (0..3)
        .map(|_| f.put_entry(AdminOpcode::AllocUar.raw(), 0, &[]))
        .collect();
    f.ring();
    assert_eq!(f.completion_order(&ids), ids);
}

#[test]
fn the_queue_wraps_with_phases_and_command_ids() {
    let mut f = Fake::up(test_config());
    // Three times around the 32-entry rings, one command at a time and in
    // batches.
    for round in 0..40 {
        let ids: Vec<u16> = (0..(round % 3 + 1))
            .map(|_| {
                let mut c = GetFeatureCmd::ZERO;
                c.feature_common.feature_id = FeatureId::NetworkAttr.raw();
                let mut p = [0u8; 60];
                c.encode(&mut p).unwrap();
                f.put_entry(AdminOpcode::GetFeature.raw(), 0, &p)
            })
            .collect();
        f.ring();
        for id in ids {
            let e = f.complete(id);
            assert_eq!(e.acq_common_descriptor.status, 0);
            assert_eq!(e.resp::<GetFeatureResp>().network_attr().mtu, 8928);
        }
    }
    assert!(f.pc > 2 * f.depth);
}

#[test]
fn interrupts_in_interrupt_mode_only() {
    let mut f = Fake::up(test_config());
    let before = f.irq.count(0);
    f.alloc_pd().unwrap();
    assert!(f.irq.count(0) > before, "interrupt mode signals vector 0");
    f.w(INTR_MASK_OFF, INTR_MASK_EN.prep(1));
    let before = f.irq.count(0);
    f.alloc_pd().unwrap();
    assert_eq!(f.irq.count(0), before, "polling mode: no admin interrupts");
}

#[test]
fn keep_alives_fill_the_aenq_and_respect_the_consumer() {
    let mut cfg = test_config();
    cfg.keep_alive_ms = 5;
    let mut f = Fake::up(cfg);
    std::thread::sleep(Duration::from_millis(60));
    assert!(f.aenq_events().is_empty(), "no group enabled yet");
    f.enable_aenq();
    let t = std::time::Instant::now();
    let mut seen = Vec::new();
    while seen.len() < 20 {
        seen.extend(f.aenq_events());
        assert!(t.elapsed() < PATIENCE, "keep-alives stopped");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(seen
        .iter()
        .all(|e| e.aenq_common_desc.group == AenqGroup::KeepAlive.raw()));
    assert!(seen
        .windows(2)
        .all(|w| w[0].aenq_common_desc.timestamp() <= w[1].aenq_common_desc.timestamp()));
    assert!(f.irq.count(0) > 0);
    // Stop consuming: the device fills the 16 entries and then drops.
    std::thread::sleep(Duration::from_millis(200));
    let c = f.dev.counters();
    assert!(c.aenq_dropped > 0, "{c:?}");
    assert!(f.aenq_events().len() <= usize::from(f.aenq_depth));
}

#[test]
fn pds_and_uars_have_limits_and_stale_handles_fail() {
    let mut f = Fake::up(test_config());
    let pds: Vec<u16> = (0..4).map(|_| f.alloc_pd().unwrap()).collect();
    assert_eq!(f.alloc_pd(), Err(ResourceAllocationFailure));
    let dealloc = |f: &mut Fake, pd: u16| {
        f.cmd::<DeallocPdResp>(AdminOpcode::DeallocPd, 0, &DeallocPdCmd { pd, reserved: 0 })
            .map(|_| ())
    };
    dealloc(&mut f, pds[1]).unwrap();
    assert_eq!(dealloc(&mut f, pds[1]), Err(IllegalParameter), "twice");
    let again = f.alloc_pd().unwrap();
    assert_ne!(again, pds[1], "a reused slot gets a new handle");
    assert_eq!(dealloc(&mut f, pds[1]), Err(IllegalParameter), "stale");
    assert_eq!(dealloc(&mut f, 0xffff), Err(IllegalParameter));

    let uars: Vec<u16> = (0..4).map(|_| f.alloc_uar().unwrap()).collect();
    assert_eq!(f.alloc_uar(), Err(ResourceAllocationFailure));
    let dealloc_uar = |f: &mut Fake, uar: u16| {
        f.cmd::<DeallocUarResp>(
            AdminOpcode::DeallocUar,
            0,
            &DeallocUarCmd { uar, reserved: 0 },
        )
        .map(|_| ())
    };
    // In use by a CQ: busy until the CQ goes.
    let cq = f.create_cq(uars[0]).unwrap().cq_idx;
    assert_eq!(dealloc_uar(&mut f, uars[0]), Err(ResourceBusy));
    f.cmd::<DestroyCqResp>(
        AdminOpcode::DestroyCq,
        0,
        &DestroyCqCmd {
            cq_idx: cq,
            reserved1: 0,
        },
    )
    .unwrap();
    dealloc_uar(&mut f, uars[0]).unwrap();
    assert_eq!(dealloc_uar(&mut f, uars[0]), Err(IllegalParameter));
}

#[test]
fn cqs_are_checked_and_own_a_doorbell_in_their_uar_page() {
    let mut f = Fake::up(test_config());
    let uar = f.alloc_uar().unwrap();
    let uar2 = f.alloc_uar().unwrap();
    let r = f.create_cq(uar).unwrap();
    assert!(CreateCqResp::DB_VALID.is_set(r.flags));
    assert_eq!(r.sub_cq_actual_depth, 64, "the driver WARNs unless equal");
    let r2 = f.create_cq(uar).unwrap();
    let r3 = f.create_cq(uar2).unwrap();
    let page = |off: u32| u64::from(off) / 4096;
    assert_eq!(page(r.db_offset), page(r2.db_offset), "same UAR, same page");
    assert_ne!(r.db_offset, r2.db_offset);
    assert_ne!(
        page(r.db_offset),
        page(r3.db_offset),
        "other UAR, other page"
    );
    assert!(u64::from(r3.db_offset) < f.dev.bar2_layout().llq_offset);

    let run =
        |f: &mut Fake, c: &CreateCqCmd| f.cmd::<CreateCqResp>(AdminOpcode::CreateCq, 0, c).err();
    let good = f.cq_cmd(uar, 64);
    let mut c = good;
    c.cq_caps_2 = CreateCqCmd::CQ_ENTRY_SIZE_WORDS.prep(5);
    assert_eq!(run(&mut f, &c), Some(IllegalParameter), "20-byte entries");
    c.cq_caps_2 = CreateCqCmd::CQ_ENTRY_SIZE_WORDS.prep(4) | CreateCqCmd::SET_SRC_ADDR.prep(1);
    assert_eq!(
        run(&mut f, &c),
        Some(IllegalParameter),
        "source address needs 32 B"
    );
    let mut c = good;
    c.num_sub_cqs += 1;
    assert_eq!(run(&mut f, &c), Some(IllegalParameter), "sub-CQ count");
    let mut c = good;
    c.sub_cq_depth = 48;
    assert_eq!(
        run(&mut f, &c),
        Some(IllegalParameter),
        "not a power of two"
    );
    c.sub_cq_depth = 16384;
    assert_eq!(
        run(&mut f, &c),
        Some(IllegalParameter),
        "deeper than max_cq_depth"
    );
    let mut c = good;
    c.uar = 0x3333;
    assert_eq!(run(&mut f, &c), Some(IllegalParameter), "no such UAR");
    let mut c = good;
    c.cq_caps_1 = CreateCqCmd::INTERRUPT_MODE_ENABLED.prep(1);
    c.eqn = 5;
    assert_eq!(run(&mut f, &c), Some(IllegalParameter), "no such EQ");
    let mut c = good;
    c.cq_caps_1 = CreateCqCmd::VIRT.prep(1);
    assert_eq!(run(&mut f, &c), Some(IllegalParameter), "virtual rings");
    let mut c = good;
    c.cq_caps_1 = 0x1;
    assert_eq!(
        run(&mut f, &c),
        Some(MalformedRequest),
        "reserved caps bits"
    );
    let mut c = good;
    c.cq_ba = MemAddr::new(OUTSIDE);
    assert_eq!(run(&mut f, &c), Some(IllegalParameter), "ring outside RAM");
    assert!(!f.dev.is_fatal());

    // Exhaustion: 8 CQs in all.
    for _ in 3..8 {
        f.create_cq(uar2).unwrap();
    }
    assert_eq!(f.create_cq(uar2).err(), Some(ResourceAllocationFailure));
    let destroy = |f: &mut Fake, cq_idx: u16| {
        f.cmd::<DestroyCqResp>(
            AdminOpcode::DestroyCq,
            0,
            &DestroyCqCmd {
                cq_idx,
                reserved1: 0,
            },
        )
        .map(|_| ())
    };
    destroy(&mut f, r.cq_idx).unwrap();
    assert_eq!(destroy(&mut f, r.cq_idx), Err(IllegalParameter));
    assert!(f.create_cq(uar).is_ok());
}

#[test]
fn qps_get_bar2_offsets_and_are_owned() {
    let mut f = Fake::up(test_config());
    let (pd, uar, cq) = pd_uar_cq(&mut f);
    let layout = f.dev.bar2_layout();
    let a = f.create_qp(pd, uar, cq).unwrap();
    let b = f.create_qp(pd, uar, cq).unwrap();
    for q in [a, b] {
        assert_eq!(q.qp_handle & 0xffff, u32::from(q.qp_num));
        assert!(u64::from(q.sq_db_offset) < layout.llq_offset);
        assert_eq!(q.sq_db_offset / 4096, q.rq_db_offset / 4096, "one UAR page");
        assert_ne!(q.sq_db_offset, q.rq_db_offset);
        let llq = u64::from(q.llq_descriptors_offset);
        assert!(llq >= layout.llq_offset && llq < layout.size);
        assert_eq!(llq % 4096, 0, "an LLQ starts on its own page");
        assert!(q.send_sub_cq_idx < 4 && q.recv_sub_cq_idx < 4);
    }
    assert_ne!(a.llq_descriptors_offset, b.llq_descriptors_offset);
    assert_ne!(
        a.qp_num & 7,
        b.qp_num & 7,
        "rdma-core indexes QPs by low bits"
    );
    assert!(a.qp_num > 1, "never QP0/QP1");

    // Guest stores land in BAR2; destroying the QP scrubs them.
    let bar = f.dev.bar2();
    bar.store_u32(a.sq_db_offset as usize, 0x1234).unwrap();
    bar.store_u64(a.llq_descriptors_offset as usize, u64::MAX)
        .unwrap();
    f.cmd::<DestroyQpResp>(
        AdminOpcode::DestroyQp,
        0,
        &DestroyQpCmd {
            qp_handle: a.qp_handle,
        },
    )
    .unwrap();
    assert_eq!(bar.load_u32(a.sq_db_offset as usize).unwrap(), 0);
    assert_eq!(bar.load_u64(a.llq_descriptors_offset as usize).unwrap(), 0);
    assert_eq!(
        f.cmd::<DestroyQpResp>(
            AdminOpcode::DestroyQp,
            0,
            &DestroyQpCmd {
                qp_handle: a.qp_handle
            }
        )
        .err(),
        Some(IllegalParameter),
        "destroyed twice"
    );
    assert_eq!(
        f.query(a.qp_handle).err(),
        Some(IllegalParameter),
        "stale QP handle"
    );

    // Ownership: the CQ must belong to the QP's UAR; the PD must exist.
    let uar2 = f.alloc_uar().unwrap();
    let run =
        |f: &mut Fake, c: &CreateQpCmd| f.cmd::<CreateQpResp>(AdminOpcode::CreateQp, 0, c).err();
    let c = f.qp_cmd(pd, uar2, cq, 16, 16);
    assert_eq!(run(&mut f, &c), Some(IllegalParameter), "CQ of another UAR");
    let c = f.qp_cmd(pd ^ 0x100, uar, cq, 16, 16);
    assert_eq!(run(&mut f, &c), Some(IllegalParameter), "no such PD");
    let c = f.qp_cmd(pd, uar, cq ^ 0x100, 16, 16);
    assert_eq!(run(&mut f, &c), Some(IllegalParameter), "no such CQ");
    let mut c = f.qp_cmd(pd, uar, cq, 16, 16);
    c.qp_type = 3;
    assert_eq!(run(&mut f, &c), Some(IllegalParameter), "QP type");
    let mut c = f.qp_cmd(pd, uar, cq, 16, 16);
    c.qp_alloc_size.send_queue_ring_size = 16 * 96;
    assert_eq!(run(&mut f, &c), Some(IllegalParameter), "96-byte WQEs");
    let c = f.qp_cmd(pd, uar, cq, 8192, 16);
    assert_eq!(
        run(&mut f, &c),
        Some(IllegalParameter),
        "deeper than max_sq_depth"
    );
    let c = f.qp_cmd(pd, uar, cq, 16, 16384);
    assert_eq!(
        run(&mut f, &c),
        Some(IllegalParameter),
        "deeper than max_rq_depth"
    );
    let mut c = f.qp_cmd(pd, uar, cq, 16, 16);
    c.rq_base_addr = OUTSIDE;
    assert_eq!(
        run(&mut f, &c),
        Some(IllegalParameter),
        "RQ ring outside RAM"
    );
    let mut c = f.qp_cmd(pd, uar, cq, 16, 16);
    c.flags = CreateQpCmd::SQ_64_BIT_REQ_ID.mask();
    assert_eq!(
        run(&mut f, &c),
        Some(IllegalParameter),
        "64-bit ids need a 64-bit CQ"
    );
    let mut c = f.qp_cmd(pd, uar, cq, 16, 16);
    c.flags = CreateQpCmd::SQ_VIRT.mask();
    assert_eq!(run(&mut f, &c), Some(IllegalParameter));
    let mut c = f.qp_cmd(pd, uar, cq, 16, 16);
    c.flags = 0x80;
    assert_eq!(run(&mut f, &c), Some(MalformedRequest));
    // A UD QP without a receive queue is fine, and 128-byte WQEs too.
    let mut c = f.qp_cmd(pd, uar, cq, 16, 0);
    c.qp_type = QpType::Ud.raw();
    c.qp_alloc_size.send_queue_ring_size = 16 * 128;
    f.cmd::<CreateQpResp>(AdminOpcode::CreateQp, 0, &c).unwrap();

    // While QPs use them, the CQ, the PD and the UAR are busy.
    assert_eq!(
        f.cmd::<DestroyCqResp>(
            AdminOpcode::DestroyCq,
            0,
            &DestroyCqCmd {
                cq_idx: cq,
                reserved1: 0
            }
        )
        .err(),
        Some(ResourceBusy)
    );
    assert_eq!(
        f.cmd::<DeallocPdResp>(AdminOpcode::DeallocPd, 0, &DeallocPdCmd { pd, reserved: 0 })
            .err(),
        Some(ResourceBusy)
    );
    assert_eq!(
        f.cmd::<DeallocUarResp>(
            AdminOpcode::DeallocUar,
            0,
            &DeallocUarCmd { uar, reserved: 0 }
        )
        .err(),
        Some(ResourceBusy)
    );
}

#[test]
fn qp_limits_and_the_llq_pool_run_out() {
    let mut cfg = test_config();
    cfg.llq_pool_size = 8 * 4096;
    cfg.limits.max_llq_size = 8 * 4096;
    let mut f = Fake::up(cfg);
    let (pd, uar, cq) = pd_uar_cq(&mut f);
    // 4 pages each: two fit, the third does not.
    let c = f.qp_cmd(pd, uar, cq, 256, 16);
    let first = f.cmd::<CreateQpResp>(AdminOpcode::CreateQp, 0, &c).unwrap();
    f.cmd::<CreateQpResp>(AdminOpcode::CreateQp, 0, &c).unwrap();
    assert_eq!(
        f.cmd::<CreateQpResp>(AdminOpcode::CreateQp, 0, &c).err(),
        Some(ResourceAllocationFailure)
    );
    f.cmd::<DestroyQpResp>(
        AdminOpcode::DestroyQp,
        0,
        &DestroyQpCmd {
            qp_handle: first.qp_handle,
        },
    )
    .unwrap();
    f.cmd::<CreateQpResp>(AdminOpcode::CreateQp, 0, &c).unwrap();
    assert_eq!(f.dev.object_counts()[8], 8, "LLQ pages in use");

    let mut f = Fake::up(test_config());
    let (pd, uar, cq) = pd_uar_cq(&mut f);
    for _ in 0..8 {
        f.create_qp(pd, uar, cq).unwrap();
    }
    assert_eq!(
        f.create_qp(pd, uar, cq).err(),
        Some(ResourceAllocationFailure),
        "max_qp"
    );
}

#[test]
fn the_qp_state_machine() {
    use QpState::{Init, Reset, Rtr, Rts, Sqd};
    let mut f = Fake::up(test_config());
    let (pd, uar, cq) = pd_uar_cq(&mut f);
    let qp = f.create_qp(pd, uar, cq).unwrap().qp_handle;
    let st = ModifyQpCmd::QP_STATE.mask() | ModifyQpCmd::CUR_QP_STATE.mask();
    let qkey = ModifyQpCmd::QKEY.mask();
    let psn = ModifyQpCmd::SQ_PSN.mask();
    let rnr = ModifyQpCmd::RNR_RETRY.mask();
    assert_eq!(f.query(qp).unwrap().qp_state, Reset.raw());
    assert_eq!(
        f.modify(qp, st, Init, Reset),
        Err(IllegalParameter),
        "qkey missing"
    );
    assert_eq!(
        f.modify(qp, st | qkey, Rts, Reset),
        Err(IllegalParameter),
        "skips states"
    );
    f.modify(qp, st | qkey, Init, Reset).unwrap();
    assert_eq!(
        f.modify(qp, st, Rtr, Reset),
        Err(IllegalParameter),
        "wrong current state"
    );
    f.modify(qp, st, Rtr, Init).unwrap();
    f.modify(qp, st | psn | rnr, Rts, Rtr).unwrap();
    let q = f.query(qp).unwrap();
    assert_eq!(
        (q.qp_state, q.qkey, q.sq_psn, q.rnr_retry),
        (Rts.raw(), 0x1234, 77, 5)
    );
    assert_eq!(
        f.modify(qp, 0x40, Rts, Rts),
        Err(IllegalParameter),
        "unknown mask bit"
    );
    f.modify(qp, qkey, Rts, Rts).unwrap();
    f.modify(qp, st, Sqd, Rts).unwrap();
    f.modify(qp, st, Rts, Sqd).unwrap();
    f.modify(qp, st, QpState::Err, Rts).unwrap();
    assert_eq!(f.modify(qp, st, Rts, QpState::Err), Err(IllegalParameter));
    // To RESET from anything, even with a stale idea of the state.
    f.modify(qp, st, Reset, Rtr).unwrap();
    assert_eq!(f.query(qp).unwrap().qp_state, Reset.raw());
    let mut c = ModifyQpCmd::ZERO;
    c.modify_mask = ModifyQpCmd::QP_STATE.mask();
    c.qp_handle = qp;
    c.qp_state = 9;
    assert_eq!(
        f.cmd::<ModifyQpResp>(AdminOpcode::ModifyQp, 0, &c).err(),
        Some(IllegalParameter)
    );

    // UD QPs have no RNR retry.
    let mut c = f.qp_cmd(pd, uar, cq, 16, 16);
    c.qp_type = QpType::Ud.raw();
    let ud = f
        .cmd::<CreateQpResp>(AdminOpcode::CreateQp, 0, &c)
        .unwrap()
        .qp_handle;
    f.modify(ud, st | qkey, Init, Reset).unwrap();
    f.modify(ud, st, Rtr, Init).unwrap();
    assert_eq!(
        f.modify(ud, st | psn | rnr, Rts, Rtr),
        Err(IllegalParameter)
    );
    f.modify(ud, st | psn, Rts, Rtr).unwrap();
}

#[test]
fn address_handles() {
    let mut f = Fake::up(test_config());
    let pd = f.alloc_pd().unwrap();
    let pd2 = f.alloc_pd().unwrap();
    let ah = |f: &mut Fake, pd: u16, last: u8| {
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[15] = last;
        f.cmd::<CreateAhResp>(
            AdminOpcode::CreateAh,
            0,
            &CreateAhCmd {
                dest_addr: gid,
                pd,
                reserved: 0,
            },
        )
        .map(|r| r.ah)
    };
    let a = ah(&mut f, pd, 1).unwrap();
    assert_eq!(ah(&mut f, pd, 1), Err(ResourceBusy), "one AH per (PD, GID)");
    let b = ah(&mut f, pd2, 1).unwrap();
    assert_ne!(a, b);
    assert_eq!(ah(&mut f, 0x7777, 2), Err(IllegalParameter), "no such PD");
    let destroy = |f: &mut Fake, ah: u16, pd: u16| {
        f.cmd::<DestroyAhResp>(AdminOpcode::DestroyAh, 0, &DestroyAhCmd { ah, pd })
            .map(|_| ())
    };
    assert_eq!(destroy(&mut f, a, pd2), Err(IllegalParameter), "wrong PD");
    destroy(&mut f, a, pd).unwrap();
    assert_eq!(destroy(&mut f, a, pd), Err(IllegalParameter), "stale");
    for last in 3..6 {
        ah(&mut f, pd, last).unwrap();
    }
    assert_eq!(ah(&mut f, pd, 9), Err(ResourceAllocationFailure));
    assert!(f.dev.object_counts()[4] == 4);
}

fn reg_mr(f: &mut Fake, flags: u8, c: &RegMrCmd) -> Result<RegMrResp, AdminStatus> {
    f.cmd(AdminOpcode::RegMr, flags, c)
}

/// A REG_MR as the 7.3 C driver sends it: `page_num` left 0 (`pages` is
/// only what the caller expects the span to be).
fn mr_cmd(pd: u16, iova: u64, len: u64, pages: u32) -> RegMrCmd {
    let _ = pages;
    RegMrCmd {
        pd,
        reserved16_w1: 0,
        pbl: [0; 32],
        mr_length: len,
        flags: RegMrCmd::PHYS_PAGE_SIZE_SHIFT.prep(12),
        permissions: RegMrCmd::LOCAL_WRITE_ENABLE.mask(),
        reserved16_w5: 0,
        page_num: 0,
        iova,
    }
}

fn dereg(f: &mut Fake, l_key: u32) -> Result<(), AdminStatus> {
    f.cmd::<DeregMrResp>(AdminOpcode::DeregMr, 0, &DeregMrCmd { l_key })
        .map(|_| ())
}

#[test]
fn memory_regions_inline_and_direct() {
    let mut f = Fake::up(test_config());
    let pd = f.alloc_pd().unwrap();
    let buf = f.alloc(3 * 4096, 4096);
    // Inline: a region of 3 pages starting mid-page.
    let mut c = mr_cmd(pd, 0x7000_0800, 2 * 4096, 3);
    c.set_inline_pbl_array(&[buf, buf + 4096, buf + 8192, 0]);
    let r = reg_mr(&mut f, 0, &c).unwrap();
    assert!(r.l_key < 1 << 24, "lkeys fit the 24 bits of WQEs");
    assert_eq!(r.l_key, r.r_key);
    // One interconnect, the device's index, serves every path.
    assert_eq!(r.validity, 0x7);
    let index = test_config().index as u8;
    assert_eq!(
        (r.recv_ic_id, r.rdma_read_ic_id, r.rdma_recv_ic_id),
        (index, index, index)
    );
    let k = r.l_key;
    // A page count, when given, must match the span.
    let mut bad = c;
    bad.page_num = 2;
    assert_eq!(reg_mr(&mut f, 0, &bad).err(), Some(IllegalParameter));
    let mut given = c;
    given.page_num = 3;
    let k3 = reg_mr(&mut f, 0, &given).unwrap().l_key;
    dereg(&mut f, k3).unwrap();
    // The span decides how many pages are read: one page more than the
    // list holds reads a zero address, which is not in guest memory.
    let mut longer = c;
    longer.mr_length = 3 * 4096;
    assert_eq!(reg_mr(&mut f, 0, &longer).err(), Some(IllegalParameter));
    // Misaligned page, page outside RAM, unsupported page size.
    let mut bad = c;
    bad.set_inline_pbl_array(&[buf + 8, buf + 4096, buf + 8192, 0]);
    assert_eq!(reg_mr(&mut f, 0, &bad).err(), Some(IllegalParameter));
    let mut bad = c;
    bad.set_inline_pbl_array(&[buf, OUTSIDE, buf, 0]);
    assert_eq!(reg_mr(&mut f, 0, &bad).err(), Some(IllegalParameter));
    let mut bad = c;
    bad.flags = RegMrCmd::PHYS_PAGE_SIZE_SHIFT.prep(11);
    assert_eq!(reg_mr(&mut f, 0, &bad).err(), Some(IllegalParameter));
    let mut bad = c;
    bad.flags |= RegMrCmd::MEM_ADDR_PHY_MODE_EN.mask();
    assert_eq!(reg_mr(&mut f, 0, &bad).err(), Some(IllegalParameter));
    let mut bad = c;
    bad.permissions = 0x8;
    assert_eq!(
        reg_mr(&mut f, 0, &bad).err(),
        Some(IllegalParameter),
        "unknown access"
    );
    let mut bad = c;
    bad.mr_length = 0;
    assert_eq!(reg_mr(&mut f, 0, &bad).err(), Some(IllegalParameter));
    let mut bad = c;
    bad.pd = 0x1234;
    assert_eq!(reg_mr(&mut f, 0, &bad).err(), Some(IllegalParameter));
    // More than 4 pages do not fit inline.
    let mut bad = mr_cmd(pd, 0, 5 * 4096, 5);
    bad.set_inline_pbl_array(&[buf; 4]);
    assert_eq!(reg_mr(&mut f, 0, &bad).err(), Some(MalformedRequest));

    // Direct: one contiguous list.
    let n = 100u32;
    let list = f.alloc(u64::from(n) * 8, 8);
    for i in 0..u64::from(n) {
        f.ram
            .put(list + i * 8, &(buf + (i % 3) * 4096).to_le_bytes());
    }
    let mut c = mr_cmd(pd, 0x10_0000, u64::from(n) * 4096, n);
    c.permissions |= RegMrCmd::REMOTE_READ_ENABLE.mask() | RegMrCmd::REMOTE_WRITE_ENABLE.mask();
    c.set_ctrl_buff(&CtrlBuffInfo {
        length: n * 8,
        address: MemAddr::new(list),
    });
    let ctrl = AqCommonDesc::CTRL_DATA.mask();
    let k2 = reg_mr(&mut f, ctrl, &c).unwrap().l_key;
    let mut bad = c;
    bad.set_ctrl_buff(&CtrlBuffInfo {
        length: n * 8 - 8,
        address: MemAddr::new(list),
    });
    assert_eq!(
        reg_mr(&mut f, ctrl, &bad).err(),
        Some(MalformedRequest),
        "short list"
    );
    let mut bad = c;
    bad.set_ctrl_buff(&CtrlBuffInfo {
        length: n * 8,
        address: MemAddr::new(OUTSIDE),
    });
    assert_eq!(
        reg_mr(&mut f, ctrl, &bad).err(),
        Some(MalformedRequest),
        "list outside RAM"
    );
    assert!(!f.dev.is_fatal());
    assert_eq!(
        reg_mr(&mut f, AqCommonDesc::CTRL_DATA_INDIRECT.mask(), &c).err(),
        Some(MalformedRequest),
        "indirect without control data"
    );

    dereg(&mut f, k).unwrap();
    assert_eq!(dereg(&mut f, k), Err(IllegalParameter), "stale key");
    assert_eq!(dereg(&mut f, 0xffff_ffff), Err(IllegalParameter));
    // The PD is busy while a region uses it.
    assert_eq!(
        f.cmd::<DeallocPdResp>(AdminOpcode::DeallocPd, 0, &DeallocPdCmd { pd, reserved: 0 })
            .err(),
        Some(ResourceBusy)
    );
    dereg(&mut f, k2).unwrap();
}

#[test]
fn memory_regions_with_chained_page_lists() {
    let mut f = Fake::up(test_config());
    let pd = f.alloc_pd().unwrap();
    let page = f.alloc(4096, 4096);
    let flags = AqCommonDesc::CTRL_DATA.mask() | AqCommonDesc::CTRL_DATA_INDIRECT.mask();
    // One chunk: 1000 pages in two list pages.
    let n = 1000;
    let (first, _) = indirect_pbl(&mut f, &vec![page; n]);
    let mut c = mr_cmd(pd, 0, n as u64 * 4096, n as u32);
    c.set_ctrl_buff(&first);
    reg_mr(&mut f, flags, &c).unwrap();
    // Two chunks: more list pages than one chunk addresses (509 * 512).
    let n = 509 * 512 + 700;
    let (first, chunks) = indirect_pbl(&mut f, &vec![page; n]);
    assert_eq!(chunks.len(), 2);
    let mut c = mr_cmd(pd, 0, n as u64 * 4096, n as u32);
    c.set_ctrl_buff(&first);
    let big = reg_mr(&mut f, flags, &c).unwrap();

    // A chain that ends early, a bad chunk length, a misaligned list page,
    // a page outside RAM deep in the list.
    let link_at = chunks[0] + (efa_hw::admin::pbl::PTRS_PER_CHUNK * 8) as u64;
    let saved = f.ram.get(link_at, 12);
    f.ram.put(link_at, &[0; 12]);
    assert_eq!(
        reg_mr(&mut f, flags, &c).err(),
        Some(MalformedRequest),
        "chain too short"
    );
    f.ram.put(link_at, &saved);
    let mut bad = c;
    bad.set_ctrl_buff(&CtrlBuffInfo {
        length: 100,
        address: first.address,
    });
    assert_eq!(
        reg_mr(&mut f, flags, &bad).err(),
        Some(MalformedRequest),
        "chunk length"
    );
    bad.set_ctrl_buff(&CtrlBuffInfo {
        length: 12,
        address: first.address,
    });
    assert_eq!(
        reg_mr(&mut f, flags, &bad).err(),
        Some(MalformedRequest),
        "empty chunk"
    );
    let mut pages = vec![page; 600];
    pages[555] = OUTSIDE;
    let (first_bad, _) = indirect_pbl(&mut f, &pages);
    let mut bad = mr_cmd(pd, 0, 600 * 4096, 600);
    bad.set_ctrl_buff(&first_bad);
    assert_eq!(
        reg_mr(&mut f, flags, &bad).err(),
        Some(IllegalParameter),
        "page outside"
    );
    let (first_ok, _) = indirect_pbl(&mut f, &vec![page; 600]);
    let list0 = f.ram.u64(first_ok.address.get());
    f.ram
        .put(first_ok.address.get(), &(list0 + 8).to_le_bytes());
    let mut bad = mr_cmd(pd, 0, 600 * 4096, 600);
    bad.set_ctrl_buff(&first_ok);
    assert_eq!(
        reg_mr(&mut f, flags, &bad).err(),
        Some(MalformedRequest),
        "list page misaligned"
    );
    // A chunk linking to itself ends when the pages run out.
    let (first_loop, loop_chunks) = indirect_pbl(&mut f, &vec![page; 509 * 512 + 1]);
    let link = CtrlBuffInfo {
        length: first_loop.length,
        address: first_loop.address,
    };
    f.ram.put(
        loop_chunks[0] + (efa_hw::admin::pbl::PTRS_PER_CHUNK * 8) as u64,
        &link.to_bytes(),
    );
    let mut looped = mr_cmd(pd, 0, (509 * 512 + 1) * 4096, 509 * 512 + 1);
    looped.set_ctrl_buff(&first_loop);
    assert!(
        reg_mr(&mut f, flags, &looped).is_ok(),
        "bounded by the page count"
    );

    // The page budget (max_mr_pages) runs out.
    let mut cfg = test_config();
    cfg.limits.max_mr_pages = 1500;
    let mut g = Fake::up(cfg);
    let pd = g.alloc_pd().unwrap();
    let page = g.alloc(4096, 4096);
    let (first, _) = indirect_pbl(&mut g, &vec![page; 1000]);
    let mut c = mr_cmd(pd, 0, 1000 * 4096, 1000);
    c.set_ctrl_buff(&first);
    let k = reg_mr(&mut g, flags, &c).unwrap().l_key;
    assert_eq!(
        reg_mr(&mut g, flags, &c).err(),
        Some(ResourceAllocationFailure)
    );
    dereg(&mut g, k).unwrap();
    reg_mr(&mut g, flags, &c).unwrap();
    dereg(&mut f, big.l_key).unwrap();
}

#[test]
fn too_many_memory_regions() {
    let mut f = Fake::up(test_config());
    let pd = f.alloc_pd().unwrap();
    let buf = f.alloc(4096, 4096);
    let mut c = mr_cmd(pd, 0, 4096, 1);
    c.set_inline_pbl_array(&[buf, 0, 0, 0]);
    for _ in 0..8 {
        reg_mr(&mut f, 0, &c).unwrap();
    }
    assert_eq!(reg_mr(&mut f, 0, &c).err(), Some(ResourceAllocationFailure));
}

#[test]
fn event_queues() {
    let mut f = Fake::up(test_config());
    let eq_cmd = |f: &mut Fake, vec: u8, depth: u16| {
        let ring = f.alloc(u64::from(depth) * 16, 4096);
        CreateEqCmd {
            depth,
            msix_vec: vec,
            caps: CreateEqCmd::ENTRY_SIZE_WORDS.prep(4),
            ba: MemAddr::new(ring),
            event_bitmask: 1,
            reserved: 0,
        }
    };
    let create = |f: &mut Fake, c: &CreateEqCmd| {
        f.cmd::<CreateEqResp>(AdminOpcode::CreateEq, 0, c)
            .map(|r| r.eqn)
    };
    let c = eq_cmd(&mut f, 1, 64);
    let eqn = create(&mut f, &c).unwrap();
    f.w(EQ_DB_OFF, eq_doorbell(eqn, true));
    f.w(EQ_DB_OFF, eq_doorbell(0x7777, true));
    let mut bad = c;
    bad.msix_vec = 0;
    assert_eq!(
        create(&mut f, &bad),
        Err(IllegalParameter),
        "vector 0 is admin"
    );
    bad.msix_vec = 4;
    assert_eq!(
        create(&mut f, &bad),
        Err(IllegalParameter),
        "past the MSI-X table"
    );
    let mut bad = c;
    bad.depth = 100;
    assert_eq!(create(&mut f, &bad), Err(IllegalParameter));
    let mut bad = c;
    bad.caps = CreateEqCmd::ENTRY_SIZE_WORDS.prep(8);
    assert_eq!(create(&mut f, &bad), Err(IllegalParameter));
    let mut bad = c;
    bad.ba = MemAddr::new(OUTSIDE);
    assert_eq!(create(&mut f, &bad), Err(IllegalParameter));
    let mut bad = c;
    bad.event_bitmask = 2;
    assert_eq!(create(&mut f, &bad), Err(IllegalParameter));
    let c2 = eq_cmd(&mut f, 2, 64);
    create(&mut f, &c2).unwrap();
    let c3 = eq_cmd(&mut f, 3, 64);
    create(&mut f, &c3).unwrap();
    assert_eq!(
        create(&mut f, &c3),
        Err(ResourceAllocationFailure),
        "3 EQs for 4 vectors"
    );

    // A CQ with interrupts uses an EQ, which is then busy.
    let uar = f.alloc_uar().unwrap();
    let mut cq = f.cq_cmd(uar, 64);
    cq.cq_caps_1 = CreateCqCmd::INTERRUPT_MODE_ENABLED.prep(1);
    cq.eqn = eqn;
    f.cmd::<CreateCqResp>(AdminOpcode::CreateCq, 0, &cq)
        .unwrap();
    let destroy = |f: &mut Fake, eqn: u16| {
        f.cmd::<DestroyEqResp>(
            AdminOpcode::DestroyEq,
            0,
            &DestroyEqCmd { eqn, reserved: 0 },
        )
        .map(|_| ())
    };
    assert_eq!(destroy(&mut f, eqn), Err(ResourceBusy));
    assert_eq!(destroy(&mut f, 0x4242), Err(IllegalParameter));
}

#[test]
fn statistics() {
    let mut f = Fake::up(test_config());
    let stats = |f: &mut Fake, type_: u8, scope: u8, scope_modifier: u16| {
        let c = GetStatsCmd {
            control_buffer: CtrlBuffInfo::ZERO,
            type_,
            scope,
            scope_modifier,
        };
        f.cmd::<GetStatsResp>(AdminOpcode::GetStats, 0, &c)
    };
    for t in 0..=4 {
        let r = stats(&mut f, t, 0, 0).unwrap();
        assert_eq!(r.u, [0; 48], "nothing counted without a data path");
    }
    assert_eq!(stats(&mut f, 5, 0, 0).err(), Some(IllegalParameter));
    assert_eq!(stats(&mut f, 0, 2, 0).err(), Some(IllegalParameter));
    assert_eq!(
        stats(&mut f, 0, 1, 0x55).err(),
        Some(IllegalParameter),
        "no such QP"
    );
    let (pd, uar, cq) = pd_uar_cq(&mut f);
    let qp = f.create_qp(pd, uar, cq).unwrap();
    assert!(stats(&mut f, 1, 1, qp.qp_num).is_ok());
    let mut cfg = test_config();
    cfg.device_caps &= !DeviceAttr::RDMA_WRITE.mask();
    let mut g = Fake::up(cfg);
    assert_eq!(
        stats(&mut g, 3, 0, 0).err(),
        Some(IllegalParameter),
        "no RDMA write"
    );
}

#[test]
fn event_counters() {
    let mut f = Fake::up(test_config());
    let (pd, uar, cq) = pd_uar_cq(&mut f);
    let uar2 = f.alloc_uar().unwrap();
    let qp = f.create_qp(pd, uar, cq).unwrap().qp_handle;
    let value = f.alloc(8, 8);
    f.ram.put(value, &u64::MAX.to_le_bytes());
    let create = |f: &mut Fake, uar: u16, paddr: u64| {
        f.cmd::<CreateEventCounterResp>(
            AdminOpcode::CreateEventCounter,
            0,
            &CreateEventCounterCmd {
                uar,
                reserved: 0,
                paddr,
            },
        )
        .map(|r| r.cntr_handle)
    };
    let h = create(&mut f, uar, value).unwrap();
    assert_eq!(f.ram.u64(value), 0, "a new counter starts at 0");
    assert_eq!(
        create(&mut f, uar, value + 4).err(),
        Some(IllegalParameter),
        "misaligned"
    );
    assert_eq!(create(&mut f, uar, OUTSIDE).err(), Some(IllegalParameter));
    assert_eq!(create(&mut f, 0x999, value).err(), Some(IllegalParameter));
    let modify = |f: &mut Fake, h: u32, op: u8, v: u64| {
        f.cmd::<ModifyEventCounterResp>(
            AdminOpcode::ModifyEventCounter,
            0,
            &ModifyEventCounterCmd {
                cntr_handle: h,
                operation: op,
                reserved: [0; 7],
                value: v,
            },
        )
        .map(|_| ())
    };
    modify(&mut f, h, EventCounterModifyOp::Set.raw(), 40).unwrap();
    modify(&mut f, h, EventCounterModifyOp::Add.raw(), 2).unwrap();
    assert_eq!(f.ram.u64(value), 42);
    assert_eq!(modify(&mut f, h, 7, 1), Err(IllegalParameter));
    assert_eq!(
        modify(&mut f, h ^ 0x10000, 0, 1),
        Err(IllegalParameter),
        "stale"
    );

    let attach = |f: &mut Fake, op: AdminOpcode, h: u32, qp: u32, events: u32| {
        let mut c = AttachDetachEventCounterCmd::ZERO;
        c.cntr_handle = h;
        c.attach_type = EventCounterAttachType::QpEvents.raw();
        c.set_qp_events(&EventCounterAttachQpEvents {
            qp_handle: qp,
            events,
        });
        f.cmd::<AttachDetachEventCounterResp>(op, 0, &c).map(|_| ())
    };
    use AdminOpcode::{AttachEventCounter as Att, DetachEventCounter as Det};
    attach(&mut f, Att, h, qp, 0x5).unwrap();
    assert_eq!(
        attach(&mut f, Att, h, qp, 0x400),
        Err(IllegalParameter),
        "unknown event"
    );
    assert_eq!(attach(&mut f, Att, h, qp, 0), Err(IllegalParameter));
    assert_eq!(
        attach(&mut f, Att, h, 0x4242, 1),
        Err(IllegalParameter),
        "no QP"
    );
    let other = f.alloc(8, 8);
    let h2 = create(&mut f, uar2, other).unwrap();
    assert_eq!(
        attach(&mut f, Att, h2, qp, 1),
        Err(IllegalParameter),
        "other UAR"
    );
    attach(&mut f, Det, h, qp, 0x1).unwrap();
    assert_eq!(
        attach(&mut f, Det, h, qp, 0x1),
        Err(IllegalParameter),
        "not attached"
    );
    attach(&mut f, Det, h, qp, 0x4).unwrap();
    // The UAR is busy while it has counters.
    assert_eq!(
        f.cmd::<DeallocUarResp>(
            AdminOpcode::DeallocUar,
            0,
            &DeallocUarCmd {
                uar: uar2,
                reserved: 0
            }
        )
        .err(),
        Some(ResourceBusy)
    );
    let destroy = |f: &mut Fake, h: u32| {
        f.cmd::<DestroyEventCounterResp>(
            AdminOpcode::DestroyEventCounter,
            0,
            &DestroyEventCounterCmd { cntr_handle: h },
        )
        .map(|_| ())
    };
    destroy(&mut f, h2).unwrap();
    assert_eq!(destroy(&mut f, h2), Err(IllegalParameter));
    for _ in 0..3 {
        create(&mut f, uar, value).unwrap();
    }
    assert_eq!(
        create(&mut f, uar, value).err(),
        Some(ResourceAllocationFailure)
    );
}

#[test]
fn injected_failures_and_timeouts() {
    let mut cfg = test_config();
    cfg.inject
        .push(InjectRule::parse("opcode=alloc_pd,count=2,mode=fail,status=1").unwrap());
    cfg.inject.push(InjectRule {
        opcode: AdminOpcode::AllocUar.raw(),
        skip: 0,
        count: 1,
        mode: InjectMode::Timeout,
    });
    cfg.inject
        .push(InjectRule::parse("opcode=create_ah,count=0").unwrap());
    let mut f = Fake::up(cfg);
    assert_eq!(f.alloc_pd(), Err(ResourceAllocationFailure));
    assert_eq!(f.alloc_pd(), Err(ResourceAllocationFailure));
    assert!(f.alloc_pd().is_ok(), "two only");
    assert_eq!(f.dev.object_counts()[0], 1, "failed commands did nothing");
    let id = f.put_entry(AdminOpcode::AllocUar.raw(), 0, &[]);
    f.ring();
    assert!(
        f.wait_for(id, Duration::from_millis(300)).is_none(),
        "never completes"
    );
    assert!(f.alloc_uar().is_ok(), "the queue goes on");
    assert_eq!(f.mmio(control::BASE + control::INJECTED), 3);
    let pd = f.alloc_pd().unwrap();
    let ah = CreateAhCmd {
        dest_addr: [1; 16],
        pd,
        reserved: 0,
    };
    assert!(
        f.cmd::<CreateAhResp>(AdminOpcode::CreateAh, 0, &ah).is_ok(),
        "a rule for 0 commands is no rule"
    );

    // The same through the control window, as a guest test does it.
    assert_eq!(f.mmio(control::BASE + control::MAGIC), control::MAGIC_VALUE);
    assert_eq!(f.mmio(control::BASE + control::WINDOW_VERSION), 10);
    let v = control::inject_value(
        AdminOpcode::CreateCq.raw(),
        0,
        1,
        InjectMode::Fail(ResourceBusy),
    );
    f.win(control::INJECT, v);
    assert_eq!(f.mmio(control::BASE + control::INJECT), v);
    let uar = f.alloc_uar().unwrap();
    assert_eq!(f.create_cq(uar).err(), Some(ResourceBusy));
    assert!(f.create_cq(uar).is_ok());
    f.win(
        control::INJECT,
        control::inject_value(AdminOpcode::CreateCq.raw(), 0, 5, InjectMode::Timeout),
    );
    f.win(
        control::INJECT,
        control::inject_value(AdminOpcode::CreateCq.raw(), 0, 0, InjectMode::Timeout),
    );
    assert!(f.create_cq(uar).is_ok(), "count 0 disarms");
    f.win(
        control::INJECT,
        control::inject_value(
            AdminOpcode::CreateCq.raw(),
            0,
            5,
            InjectMode::Fail(MalformedRequest),
        ),
    );
    f.win(control::COMMAND, control::CMD_CLEAR_INJECT);
    assert!(f.create_cq(uar).is_ok(), "all disarmed");
    // Status 0 means the default; injected commands count as errors.
    f.win(
        control::INJECT,
        0x0010_0000 | u32::from(AdminOpcode::AllocPd.raw()),
    );
    assert_eq!(f.alloc_pd(), Err(UnknownError));
    // Skipped commands run: the second CREATE_CQ of a test can be failed.
    f.win(
        control::INJECT,
        control::inject_value(
            AdminOpcode::CreateCq.raw(),
            1,
            1,
            InjectMode::Fail(ResourceBusy),
        ),
    );
    assert!(f.create_cq(uar).is_ok(), "one skipped");
    assert_eq!(f.create_cq(uar).err(), Some(ResourceBusy));
    assert!(f.create_cq(uar).is_ok(), "one failed");
    assert!(f.mmio(control::BASE + control::ADMIN_ERRORS) >= 4);
    assert!(f.mmio(control::BASE + control::ADMIN_CMDS) > 10);
    assert_eq!(f.mmio(control::BASE + control::INDEX), 7);
}

#[test]
fn control_window_counts_objects() {
    let mut f = Fake::up(test_config());
    let live = |f: &Fake| {
        [
            control::LIVE_QPS,
            control::LIVE_CQS,
            control::LIVE_PDS,
            control::LIVE_UARS,
        ]
        .map(|reg| f.mmio(control::BASE + reg))
    };
    assert_eq!(live(&f), [0; 4]);
    assert_eq!(f.mmio(control::BASE + control::LLQ_PAGES), 0);
    let pd = f.alloc_pd().unwrap();
    let uar = f.alloc_uar().unwrap();
    let cq = f.create_cq(uar).unwrap().cq_idx;
    let qp = f.create_qp(pd, uar, cq).unwrap();
    assert_eq!(live(&f), [1, 1, 1, 1]);
    let llq_pages = f.mmio(control::BASE + control::LLQ_PAGES);
    assert!(llq_pages > 0, "the QP's send queue takes LLQ pages");
    f.cmd::<DestroyQpResp>(
        AdminOpcode::DestroyQp,
        0,
        &DestroyQpCmd {
            qp_handle: qp.qp_handle,
        },
    )
    .unwrap();
    assert_eq!(live(&f), [0, 1, 1, 1]);
    assert_eq!(f.mmio(control::BASE + control::LLQ_PAGES), 0);
}

#[test]
fn control_window_commands() {
    let mut f = Fake::up(test_config());
    f.win(control::ADMIN_TIMEOUT, 15);
    assert_eq!(CAPS_ADMIN_CMD_TO.get(f.reg(CAPS_OFF)), 15);
    f.win(control::ADMIN_TIMEOUT, 99);
    assert_eq!(
        CAPS_ADMIN_CMD_TO.get(f.reg(CAPS_OFF)),
        15,
        "clamped to the field"
    );
    f.enable_aenq();
    f.win(control::COMMAND, control::CMD_AENQ_WARNING);
    f.win(control::COMMAND, control::CMD_AENQ_NOTIFICATION);
    let groups: Vec<u16> = f
        .aenq_events()
        .iter()
        .map(|e| e.aenq_common_desc.group)
        .collect();
    assert_eq!(
        groups,
        [AenqGroup::Warning.raw(), AenqGroup::Notification.raw()]
    );
    f.win(control::KEEP_ALIVE_MS, 5);
    assert_eq!(f.mmio(control::BASE + control::KEEP_ALIVE_MS), 5);
    let t = std::time::Instant::now();
    while f.mmio(control::BASE + control::KEEP_ALIVES) < 3 {
        assert!(t.elapsed() < PATIENCE);
        f.aenq_events();
        std::thread::sleep(Duration::from_millis(2));
    }
    f.win(control::KEEP_ALIVE_MS, 0);
    f.win(control::COMMAND, 99);
    f.win(control::COMMAND, control::CMD_FATAL);
    assert!(DEV_STS_FATAL_ERROR.is_set(f.reg(DEV_STS_OFF)));
    let last = f.aenq_events();
    assert_eq!(
        last.last().unwrap().aenq_common_desc.group,
        AenqGroup::FatalError.raw()
    );
    f.win(control::COMMAND, control::CMD_EXIT);
    assert_eq!(f.exits.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[test]
fn a_silent_fatal_error_shows_only_in_dev_sts() {
    let mut f = Fake::up(test_config());
    f.enable_aenq();
    f.win(control::COMMAND, control::CMD_FATAL_SILENT);
    assert!(f.dev.is_fatal());
    assert!(DEV_STS_FATAL_ERROR.is_set(f.reg(DEV_STS_OFF)));
    assert!(
        !f.aenq_events()
            .iter()
            .any(|e| e.aenq_common_desc.group == AenqGroup::FatalError.raw()),
        "the fatal error was posted"
    );
    let id = f.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]);
    f.ring();
    assert!(
        f.wait_for(id, Duration::from_millis(100)).is_none(),
        "a fatal device executed a command"
    );
    f.bring_up();
    assert!(!DEV_STS_FATAL_ERROR.is_set(f.reg(DEV_STS_OFF)));
    assert!(f.alloc_pd().is_ok());
}

#[test]
fn dma_faults_on_device_queues_are_fatal_until_reset() {
    // The AQ outside RAM.
    let mut f = Fake::up(test_config());
    f.enable_aenq();
    f.w(AQ_BASE_LO_OFF, OUTSIDE as u32);
    f.w(AQ_BASE_HI_OFF, 0);
    let id = f.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]);
    f.ring();
    let t = std::time::Instant::now();
    while !f.dev.is_fatal() {
        assert!(t.elapsed() < PATIENCE);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        DEV_STS_FATAL_ERROR.is_set(f.reg(DEV_STS_OFF)),
        "readless reads still work"
    );
    assert!(f.wait_for(id, Duration::from_millis(100)).is_none());
    let ev = f.aenq_events();
    assert_eq!(ev[0].aenq_common_desc.group, AenqGroup::FatalError.raw());
    assert!(f.dev.counters().dma_errors > 0);
    // A reset brings it back.
    f.bring_up();
    assert!(!DEV_STS_FATAL_ERROR.is_set(f.reg(DEV_STS_OFF)));
    assert!(f.alloc_pd().is_ok());

    // The ACQ outside RAM.
    let mut f = Fake::up(test_config());
    f.w(ACQ_BASE_LO_OFF, (BASE - 0x100) as u32);
    f.w(ACQ_BASE_HI_OFF, 0);
    f.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]);
    f.ring();
    let t = std::time::Instant::now();
    while !DEV_STS_FATAL_ERROR.is_set(dev_sts(&f)) {
        assert!(t.elapsed() < PATIENCE);
        std::thread::sleep(Duration::from_millis(1));
    }

    // The readless response outside RAM.
    let f = Fake::up(test_config());
    f.set_resp_addr(OUTSIDE);
    f.w(MMIO_REG_READ_OFF, mmio_reg_read(1, DEV_STS_OFF));
    assert!(DEV_STS_FATAL_ERROR.is_set(dev_sts(&f)));

    // The AENQ outside RAM: the keep-alive that cannot be written. The
    // base moves before the keep-alive group is enabled: moved after, a
    // test thread held up for the 16 keep-alives of 32 ms found the queue
    // full, and a keep-alive dropped for want of room is no DMA at all.
    let mut cfg = test_config();
    cfg.keep_alive_ms = 2;
    let mut f = Fake::up(cfg);
    f.w(AENQ_BASE_LO_OFF, OUTSIDE as u32);
    f.enable_aenq();
    let t = std::time::Instant::now();
    while !DEV_STS_FATAL_ERROR.is_set(dev_sts(&f)) {
        assert!(t.elapsed() < PATIENCE);
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn bad_doorbells_are_fatal_not_fatal_to_the_model() {
    // A doorbell past the ring.
    let f = Fake::up(test_config());
    f.w(AQ_PROD_DB_OFF, 40);
    let t = std::time::Instant::now();
    while !f.dev.is_fatal() {
        assert!(t.elapsed() < PATIENCE);
        std::thread::sleep(Duration::from_millis(1));
    }
    // A doorbell before the queues exist.
    let mut f = Fake::new(test_config());
    f.w(AQ_PROD_DB_OFF, 1);
    let t = std::time::Instant::now();
    while !f.dev.is_fatal() {
        assert!(t.elapsed() < PATIENCE);
        std::thread::sleep(Duration::from_millis(1));
    }
    f.bring_up();
    assert!(f.alloc_pd().is_ok());
}

#[test]
fn a_reset_in_the_middle_of_work_forgets_everything() {
    let mut f = Fake::up(test_config());
    f.enable_aenq();
    let (pd, uar, cq) = pd_uar_cq(&mut f);
    let qp = f.create_qp(pd, uar, cq).unwrap();
    let bar = f.dev.bar2();
    bar.store_u32(qp.sq_db_offset as usize, 7).unwrap();
    bar.store_u64(qp.llq_descriptors_offset as usize, 9)
        .unwrap();
    // Commands in flight when the reset comes.
    for _ in 0..8 {
        f.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]);
    }
    f.ring();
    f.w(DEV_CTL_OFF, DEV_CTL_DEV_RESET.prep(1));
    assert_eq!(f.r(DEV_STS_OFF), None, "the readless address is gone");
    assert!(!f.dev.is_fatal());
    f.set_resp_addr(f.resp);
    f.wait_reset_state(true);
    assert_eq!(f.dev.object_counts(), [0; 9], "no objects, no LLQ pages");
    assert_eq!(bar.load_u32(qp.sq_db_offset as usize).unwrap(), 0);
    assert_eq!(bar.load_u64(qp.llq_descriptors_offset as usize).unwrap(), 0);
    // Nothing from before the reset reaches the old rings afterwards.
    let acq = f.ram.get(f.acq, 64 * usize::from(f.depth));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(f.ram.get(f.acq, 64 * usize::from(f.depth)), acq);
    f.w(DEV_CTL_OFF, 0);
    f.wait_reset_state(false);
    for reg in [AQ_BASE_LO_OFF, AQ_CAPS_OFF, ACQ_CAPS_OFF, AENQ_CAPS_OFF] {
        assert_eq!(f.reg(reg), 0, "queue register {reg:#x} cleared");
    }

    // A second bring-up starts from scratch; old handles are stale.
    f.bring_up();
    assert_eq!(
        f.get_feature(FeatureId::AenqConfig.raw())
            .unwrap()
            .aenq()
            .enabled_groups,
        0,
        "AENQ groups reset"
    );
    assert_eq!(f.query(qp.qp_handle).err(), Some(IllegalParameter));
    assert_eq!(
        f.create_cq(uar).err(),
        Some(IllegalParameter),
        "the UAR is gone"
    );
    let (pd2, uar2, cq2) = pd_uar_cq(&mut f);
    let qp2 = f.create_qp(pd2, uar2, cq2).unwrap();
    assert_ne!(qp2.qp_handle, qp.qp_handle);
    assert_eq!(bar.load_u32(qp2.sq_db_offset as usize).unwrap(), 0);

    // The transport's reset (new client, FLR) does the same.
    f.dev.reset();
    assert_eq!(f.dev.object_counts(), [0; 9]);
    assert_eq!(f.r(VERSION_OFF), None);
    f.bring_up();
    assert!(f.alloc_pd().is_ok());
}

#[test]
fn a_restarted_admin_queue_starts_empty() {
    let mut f = Fake::up(test_config());
    f.alloc_pd().unwrap();
    f.w(DEV_CTL_OFF, DEV_CTL_AQ_RESTART.prep(1));
    assert!(DEV_STS_AQ_RESTART_FINISHED.is_set(f.reg(DEV_STS_OFF)));
    f.w(DEV_CTL_OFF, 0);
    f.ram.put(f.acq, &vec![0; 64 * usize::from(f.depth)]);
    f.pc = 0;
    f.set_resp_addr(f.resp);
    let mut g = f;
    // Producer and consumer both start over at 0.
    let id = g.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]);
    g.ring();
    let first = AcqEntry::decode(&g.ram.get(g.acq, 64)).unwrap();
    let _ = first;
    let t = std::time::Instant::now();
    loop {
        let e = AcqEntry::decode(&g.ram.get(g.acq, 64)).unwrap();
        if AcqCommonDesc::PHASE.get(e.acq_common_descriptor.flags) == 1 {
            assert_eq!(
                AcqCommonDesc::COMMAND_ID.get(e.acq_common_descriptor.command),
                id
            );
            break;
        }
        assert!(t.elapsed() < PATIENCE);
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn garbage_from_the_guest_never_brings_the_model_down() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut f = Fake::up(test_config());
    f.enable_aenq();
    let (pd, uar, cq) = pd_uar_cq(&mut f);
    f.create_qp(pd, uar, cq).unwrap();
    // Random well-formed entries with random payloads, and random opcodes.
    for i in 0..400 {
        let opcode = if i % 4 == 0 {
            rng.next() as u8
        } else {
            (rng.next() % 30) as u8
        };
        let flags = (rng.next() & 0x6) as u8;
        let mut payload = [0u8; 116];
        for b in payload.iter_mut() {
            *b = rng.next() as u8;
        }
        // Sometimes aim handles at live objects.
        if i % 3 == 0 {
            payload[..2].copy_from_slice(&pd.to_le_bytes());
        }
        let id = f.put_entry(opcode, flags, &payload);
        f.ring();
        let e = f.complete(id);
        assert!(AdminStatus::from_raw(e.acq_common_descriptor.status).is_some());
    }
    assert!(
        !f.dev.is_fatal(),
        "bad commands are the driver's problem, not the device's"
    );
    // Random register and window writes (but not an exit).
    for _ in 0..2000 {
        let off = (rng.next() % 0x2000) & !3;
        if off == control::BASE + control::COMMAND {
            continue;
        }
        let v = rng.next() as u32;
        let len = [4usize, 8, 1, 2][(rng.next() % 4) as usize];
        f.dev.bar_write(0, off, &v.to_le_bytes().repeat(2)[..len]);
        let mut b = [0u8; 4];
        f.dev.bar_read(0, rng.next() % BAR0_SIZE, &mut b);
    }
    f.dev.bar_write(2, 0, &[1, 2, 3, 4]);
    // Whatever state that left, a reset and a bring-up recover it.
    f.w(control::BASE as u16 + control::INJECT as u16, 0);
    f.dev.bar_write(
        0,
        control::BASE + control::COMMAND,
        &control::CMD_CLEAR_INJECT.to_le_bytes(),
    );
    f.dev.reset();
    f.bring_up();
    assert!(f.alloc_pd().is_ok());
    assert_eq!(f.exits.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[test]
fn shutdown_stops_and_a_new_session_starts_clean() {
    let mut f = Fake::up(test_config());
    f.alloc_pd().unwrap();
    f.dev.shutdown();
    assert_eq!(f.dev.object_counts(), [0; 9]);
    f.dev.reset();
    f.bring_up();
    assert!(f.alloc_pd().is_ok());
}

#[test]
fn a_first_generation_device_has_no_cq_notifications_and_no_cq_doorbells() {
    let mut cfg = test_config();
    let mut limits = cfg.limits.clone();
    efa_emu::device::profile::Profile::by_name("efa0")
        .unwrap()
        .apply(&mut cfg, &mut limits);
    cfg.limits = limits;
    let mut f = Fake::up(cfg);
    assert_eq!(f.dev.identity().device, PCI_DEV_ID_EFA0_VF);
    let a = f
        .get_feature(FeatureId::DeviceAttr.raw())
        .unwrap()
        .device_attr();
    assert_eq!(a.device_caps, 0);
    for id in [FeatureId::EventQueueAttr, FeatureId::QueueAttr2] {
        assert!(!id.is_supported(a.supported_features), "{id:?}");
        assert_eq!(
            f.get_feature(id.raw()).err(),
            Some(UnsupportedOpcode),
            "{id:?}"
        );
    }
    let (pd, uar, _) = pd_uar_cq(&mut f);
    let r = f.create_cq(uar).unwrap();
    assert!(!CreateCqResp::DB_VALID.is_set(r.flags));
    assert_eq!(r.db_offset, 0);
    // Polled CQs serve QPs as before, and go without a doorbell to give back.
    let qp = f.create_qp(pd, uar, r.cq_idx).unwrap();
    assert!(f
        .cmd::<DestroyQpResp>(
            AdminOpcode::DestroyQp,
            0,
            &DestroyQpCmd {
                qp_handle: qp.qp_handle
            }
        )
        .is_ok());
    let destroy = DestroyCqCmd {
        cq_idx: r.cq_idx,
        reserved1: 0,
    };
    assert!(f
        .cmd::<DestroyCqResp>(AdminOpcode::DestroyCq, 0, &destroy)
        .is_ok());
    // Interrupt mode needs an EQ, which such a device cannot create.
    let mut c = f.cq_cmd(uar, 64);
    c.cq_caps_1 = CreateCqCmd::INTERRUPT_MODE_ENABLED.mask();
    assert_eq!(
        f.cmd::<CreateCqResp>(AdminOpcode::CreateCq, 0, &c).err(),
        Some(IllegalParameter)
    );
}

#[test]
fn cq_doorbells_go_with_event_queues() {
    let mut cfg = test_config();
    cfg.cq_doorbells = false;
    assert!(cfg.validate().is_err(), "event queues without CQ doorbells");
    cfg.limits.max_eq = 0;
    cfg.validate().unwrap();
}

#[test]
fn late_completions_write_what_the_command_named_unless_reset() {
    let mut f = Fake::up(test_config());
    let (pd, uar, _) = pd_uar_cq(&mut f);
    let late = |opcode: AdminOpcode| {
        control::inject_value(opcode.raw(), 0, 1, InjectMode::Late(UnknownError))
    };
    assert_eq!(
        InjectRule::parse("opcode=reg_mr,mode=late").unwrap().mode,
        InjectMode::Late(UnknownError)
    );
    assert_eq!(f.mmio(control::BASE + control::WINDOW_VERSION), 10);

    // A REG_MR with a page list buffer, and an event counter: both held.
    f.win(control::INJECT, late(AdminOpcode::RegMr));
    let region = f.alloc(8 * 4096, 4096);
    let pages: Vec<u64> = (0..8).map(|i| region + i * 4096).collect();
    let list = f.alloc(64, 64);
    for (i, p) in pages.iter().enumerate() {
        f.ram.put(list + 8 * i as u64, &p.to_le_bytes());
    }
    let mut mr = mr_cmd(pd, 0x10_0100, 8 * 4096 - 0x100, 8);
    mr.set_ctrl_buff(&CtrlBuffInfo {
        length: 64,
        address: MemAddr::new(list),
    });
    let mr_id = f.put_entry(
        AdminOpcode::RegMr.raw(),
        AqCommonDesc::CTRL_DATA.prep(1),
        &mr.to_bytes(),
    );
    f.ring();
    assert!(f.wait_for(mr_id, Duration::from_millis(200)).is_none());
    assert_eq!(f.mmio(control::BASE + control::LATE_ADDR_LO), list as u32);
    assert_eq!(
        f.mmio(control::BASE + control::LATE_ADDR_HI),
        (list >> 32) as u32
    );
    f.win(control::INJECT, late(AdminOpcode::CreateEventCounter));
    let value = f.alloc(8, 8);
    let counter = CreateEventCounterCmd {
        uar,
        reserved: 0,
        paddr: value,
    };
    let cntr_id = f.put_entry(
        AdminOpcode::CreateEventCounter.raw(),
        0,
        &counter.to_bytes(),
    );
    f.ring();
    assert!(f.wait_for(cntr_id, Duration::from_millis(200)).is_none());
    assert_eq!(f.mmio(control::BASE + control::LATE_HELD), 2);
    assert_eq!(
        f.ram.get(list, 8),
        pages[0].to_le_bytes(),
        "nothing written yet"
    );
    assert!(f.alloc_pd().is_ok(), "the queue goes on");

    f.win(control::COMMAND, control::CMD_COMPLETE_LATE);
    let e = f.complete(mr_id);
    assert_eq!(e.acq_common_descriptor.status, UnknownError.raw());
    let e = f.complete(cntr_id);
    assert_eq!(e.acq_common_descriptor.status, UnknownError.raw());
    assert_eq!(f.ram.get(list, 8), control::LATE_MARKER, "the page list");
    assert_eq!(
        f.ram.get(region + 0x100, 8),
        control::LATE_MARKER,
        "the region"
    );
    assert_eq!(f.ram.get(region, 8), [0; 8], "only the region");
    assert_eq!(f.ram.get(value, 8), control::LATE_MARKER, "the counter");
    assert_eq!(f.mmio(control::BASE + control::LATE_WRITES), 3);
    assert_eq!(f.mmio(control::BASE + control::LATE_HELD), 0);
    let counts = f.dev.object_counts();
    assert_eq!((counts[5], counts[7]), (0, 0), "no MR, no counter created");

    // A reset forgets a held command: nothing is written afterwards.
    f.win(control::INJECT, late(AdminOpcode::CreateEventCounter));
    f.ram.put(value, &[0; 8]);
    let id = f.put_entry(
        AdminOpcode::CreateEventCounter.raw(),
        0,
        &counter.to_bytes(),
    );
    f.ring();
    assert!(f.wait_for(id, Duration::from_millis(200)).is_none());
    assert_eq!(f.mmio(control::BASE + control::LATE_HELD), 1);
    f.reset_device(ResetReason::Normal);
    assert_eq!(f.mmio(control::BASE + control::LATE_HELD), 0);
    f.win(control::COMMAND, control::CMD_COMPLETE_LATE);
    assert_eq!(f.ram.get(value, 8), [0; 8]);
    assert_eq!(f.mmio(control::BASE + control::LATE_WRITES), 3);
}

/// A reset requested while a command is held completes only after the
/// device has had time to finish it, and then checks that the control
/// buffer it was given is still as it was given: a driver that let the
/// command go before the reset (refa's shutdown once did, issue 34) and
/// freed its page list is caught.
#[test]
fn a_reset_with_a_command_held_checks_what_the_command_was_given() {
    use efa_emu::health::Class;
    let mut f = Fake::up(test_config());
    let (pd, _, _) = pd_uar_cq(&mut f);
    let health = f.dev.config().health.clone();
    let region = f.alloc(8 * 4096, 4096);
    let list = f.alloc(64, 64);
    let hold = |f: &mut Fake, pd: u16| {
        f.win(
            control::INJECT,
            control::inject_value(
                AdminOpcode::RegMr.raw(),
                0,
                1,
                InjectMode::Late(UnknownError),
            ),
        );
        for i in 0..8u64 {
            f.ram.put(list + 8 * i, &(region + i * 4096).to_le_bytes());
        }
        let mut mr = mr_cmd(pd, 0x10_0000, 8 * 4096, 8);
        mr.set_ctrl_buff(&CtrlBuffInfo {
            length: 64,
            address: MemAddr::new(list),
        });
        let id = f.put_entry(
            AdminOpcode::RegMr.raw(),
            AqCommonDesc::CTRL_DATA.prep(1),
            &mr.to_bytes(),
        );
        f.ring();
        assert!(f.wait_for(id, Duration::from_millis(200)).is_none());
        assert_eq!(f.mmio(control::BASE + control::LATE_HELD), 1);
    };

    // Left alone: the reset takes its time, and nothing is reported.
    hold(&mut f, pd);
    let t = std::time::Instant::now();
    f.reset_device(ResetReason::Normal);
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(health.counts().get(Class::GuestBug), 0);

    // Freed (zeroed, as init_on_free does) before the reset completes.
    f.bring_up();
    let (pd, _, _) = pd_uar_cq(&mut f);
    hold(&mut f, pd);
    f.ram.put(list, &[0; 64]);
    f.reset_device(ResetReason::Normal);
    assert_eq!(
        health.counts().get(Class::GuestBug),
        1,
        "the freed page list is caught"
    );
    assert_eq!(f.mmio(control::BASE + control::LATE_HELD), 0);
}

/// A driver's AENQ handler: takes the events the device wrote from
/// consumer position `cc` on, at most `budget` of them, each costing
/// `per_event` (a driver does some work per event; without it this thread
/// would outrun any producer), then writes the consumer doorbell. Returns
/// how many it took.
fn take_aenq(f: &Fake, cc: &mut u32, budget: Option<u32>, per_event: Duration) -> u32 {
    let depth = u32::from(f.aenq_depth);
    let mut n = 0;
    while budget.is_none_or(|b| n < b) {
        let phase = u8::from((*cc / depth) % 2 == 0);
        // The phase is in `flags`, byte 4 of the entry.
        let flags = f.ram.get(f.aenq + u64::from(*cc % depth) * 64 + 4, 1)[0];
        if efa_hw::aenq::AenqCommonDesc::PHASE.get(flags) != phase {
            break;
        }
        let t = std::time::Instant::now();
        while t.elapsed() < per_event {
            std::hint::spin_loop();
        }
        *cc = cc.wrapping_add(1);
        n += 1;
    }
    if n > 0 {
        f.w(AENQ_CONS_DB_OFF, *cc);
    }
    n
}

/// Runs a storm of at most `ms` against a handler with `budget`, stopped
/// once a pass took `enough` events; returns the most events one pass
/// took and the passes, after checking that the model measured the same
/// from the doorbell.
fn storm_against(f: &Fake, cc: &mut u32, ms: u32, budget: Option<u32>, enough: u32) -> (u32, u32) {
    f.win(control::STORM_MS, ms);
    let t = std::time::Instant::now();
    let (mut max, mut passes) = (0, 0);
    while f.mmio(control::BASE + control::STORM_MS) != 0 {
        assert!(t.elapsed() < PATIENCE, "the storm did not end");
        let n = take_aenq(f, cc, budget, Duration::from_micros(3));
        if n > 0 {
            passes += 1;
            max = max.max(n);
        }
        if max >= enough {
            f.win(control::STORM_MS, 0);
        }
    }
    assert_eq!(f.mmio(control::BASE + control::STORM_MAX_PASS), max);
    assert_eq!(f.mmio(control::BASE + control::STORM_PASSES), passes);
    assert!(f.mmio(control::BASE + control::STORM_EVENTS) >= passes);
    (max, passes)
}

/// After a storm the AENQ works as before: keep-alives arrive at the
/// consumer, one at a time.
fn keep_alives_flow(f: &Fake, cc: &mut u32) {
    // What the storm left for the handler.
    take_aenq(f, cc, None, Duration::ZERO);
    const PERIOD_MS: u32 = 2;
    f.win(control::KEEP_ALIVE_MS, PERIOD_MS);
    let t = std::time::Instant::now();
    let mut last = t;
    let mut got = 0;
    while got < 5 {
        assert!(t.elapsed() < PATIENCE, "no keep-alive after the storm");
        let n = take_aenq(f, cc, None, Duration::ZERO);
        // Keep-alives only, at their period: as many as the time since the
        // last look allows (a loaded machine may not run this thread for
        // a while), and one more either side.
        let since = last.elapsed().as_millis() as u32;
        last = std::time::Instant::now();
        assert!(
            n <= since / PERIOD_MS + 2,
            "{n} events at once after the storm, in {since} ms"
        );
        got += n;
        std::thread::sleep(Duration::from_millis(1));
    }
    f.win(control::KEEP_ALIVE_MS, 0);
}

#[test]
fn aenq_storm_keeps_an_unbounded_handler_taking_events() {
    let mut f = Fake::up(test_config());
    f.enable_aenq();
    let mut cc = 0;
    let (max, passes) = storm_against(&f, &mut cc, 5000, None, u32::from(f.aenq_depth) + 1);
    // The storm stayed ahead of a handler that takes all it finds for
    // longer than a ring's worth: such a handler never returns while
    // a device keeps this up.
    assert!(
        max > u32::from(f.aenq_depth),
        "the storm kept the handler for at most {max} events in {passes} passes"
    );
    keep_alives_flow(&f, &mut cc);
}

#[test]
fn aenq_storm_against_a_handler_with_a_budget() {
    let mut f = Fake::up(test_config());
    f.enable_aenq();
    let mut cc = 0;
    let depth = u32::from(f.aenq_depth);
    let (max, passes) = storm_against(&f, &mut cc, 5000, Some(depth), depth);
    // The budget was reached (the storm outran the handler) and the model
    // saw no pass longer than it.
    assert_eq!(max, depth, "{passes} passes");
    // A reset ends a storm at once, and a stop request too.
    f.win(control::STORM_MS, 60_000);
    f.win(control::STORM_MS, 0);
    let t = std::time::Instant::now();
    while f.mmio(control::BASE + control::STORM_MS) != 0 {
        assert!(t.elapsed() < PATIENCE, "the storm did not stop");
        take_aenq(&f, &mut cc, Some(depth), Duration::ZERO);
    }
    keep_alives_flow(&f, &mut cc);
}

#[test]
fn control_window_counts_the_drivers_register_accesses_and_interrupts() {
    let mut f = Fake::up(test_config());
    let count = |f: &Fake, reg| f.mmio(control::BASE + reg);
    let irqs = |f: &Fake| (0..8).map(|v| f.irq.count(v)).sum::<u64>();
    let (reads, writes, ints) = (
        count(&f, control::REG_READS),
        count(&f, control::REG_WRITES),
        count(&f, control::INTERRUPTS),
    );
    assert!(
        writes > 0,
        "the bring-up wrote registers (its reads are readless ones)"
    );
    assert_eq!(
        u64::from(ints),
        irqs(&f),
        "every interrupt signalled counts"
    );

    // The window's own accesses are the test's, not the driver's.
    f.win(control::KEEP_ALIVE_MS, 0);
    assert_eq!(count(&f, control::REG_READS), reads);
    assert_eq!(count(&f, control::REG_WRITES), writes);

    // A plain read is one read; a readless read one write (and no read).
    dev_sts(&f);
    assert_eq!(count(&f, control::REG_READS), reads + 1);
    f.reg(VERSION_OFF);
    assert_eq!(count(&f, control::REG_WRITES), writes + 1);
    assert_eq!(count(&f, control::REG_READS), reads + 1);

    // An admin command: its doorbell is one write, its completion one
    // interrupt of the management vector (interrupts unmasked at bring-up).
    let before = irqs(&f);
    f.alloc_pd().unwrap();
    assert_eq!(count(&f, control::REG_WRITES), writes + 2);
    assert_eq!(irqs(&f), before + 1);
    assert_eq!(u64::from(count(&f, control::INTERRUPTS)), irqs(&f));
}
