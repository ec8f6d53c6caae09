//! The data path driven by the in-process fake driver: UD and SRD sends,
//! RDMA read and write, completions and their events, every error
//! completion, protection, reliability under loss, statistics.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use efa_emu::device::config::Config;
use efa_emu::device::fabric::NetFaults;
use efa_hw::admin::*;
use efa_hw::io::*;
use efa_hw::wire::Wire;
use support::dp::*;
use support::*;

use CompStatus as S;

const GRH: usize = RX_UD_GRH_SIZE;

fn gid(f: &Fake) -> [u8; 16] {
    f.dev.config().gid
}

#[test]
fn ud_send_and_receive_on_one_device_with_the_grh_area() {
    let mut f = Fake::up(test_config());
    let mut a = f.ep(EpOpts::ud());
    let mut b = f.ep(EpOpts::ud());
    let g = gid(&f);
    let ah_a = f.ah(a.pd, g);
    let ah_b = f.ah(b.pd, g);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0);
    let rx = f.mr(b.pd, 4096, ALL_PERMS, 0xee);
    f.ram.put(tx.gpa, b"hello, efa");
    f.ram.put(tx.gpa + 100, &[7u8; 50]);

    b.post_recv(11, &[rx.sge(0, 1000)]);
    // Two SGEs, immediate data.
    let w = send_wqe(
        5,
        ah_a,
        b.qpn,
        0x1111,
        &[tx.sge(0, 10), tx.sge(100, 50)],
        Some(0xabcd),
    );
    a.post_send(&w);
    let s = a.wait(1);
    assert!(s[0].is_send() && s[0].status() == S::Ok && s[0].req_id() == 5);
    assert_eq!(s[0].sub, a.resp.send_sub_cq_idx);
    let r = b.wait(1);
    let e = r[0].e;
    assert_eq!(r[0].status(), S::Ok);
    assert_eq!(r[0].sub, b.resp.recv_sub_cq_idx);
    assert_eq!(r[0].req_id(), 11);
    assert_eq!(usize::from(e.base.length), GRH + 60, "the GRH area counts");
    assert_eq!(e.base.src_qp_num, a.qpn);
    assert_eq!(e.base.ah, ah_b, "the receiver's AH for the sender's GID");
    assert!(r[0].has_imm() && e.base.imm == 0xabcd);
    let got = f.ram.get(rx.gpa, GRH + 61);
    assert_eq!(&got[..GRH], &[0xee; GRH], "the GRH area is left alone");
    assert_eq!(&got[GRH..GRH + 10], b"hello, efa");
    assert_eq!(&got[GRH + 10..GRH + 60], &[7u8; 50]);
    assert_eq!(got[GRH + 60], 0xee, "nothing past the message");

    // Inline, in a receive of two descriptors (the GRH area in the first).
    b.post_recv(12, &[rx.sge(0, 40), rx.sge(2000, 100)]);
    a.post_send(&inline_wqe(6, ah_a, b.qpn, 0x1111, b"inline!", 64));
    a.wait(1);
    let r = b.wait(1);
    assert_eq!((r[0].req_id(), r[0].e.base.length), (12, 47));
    assert!(!r[0].has_imm());
    assert_eq!(f.ram.get(rx.gpa + 2000, 7), b"inline!");
}

#[test]
fn ud_drops_on_qkey_mismatch_and_without_a_receive() {
    let mut f = Fake::up(test_config());
    let mut a = f.ep(EpOpts::ud());
    let mut b = f.ep(EpOpts::ud());
    let ah = f.ah(a.pd, gid(&f));
    let rx = f.mr(b.pd, 4096, ALL_PERMS, 0);
    a.post_send(&inline_wqe(1, ah, b.qpn, 0x1111, b"x", 64));
    assert_eq!(a.wait(1)[0].status(), S::Ok, "UD completes when sent");
    // Sent is not arrived: a receive posted before b's data path took the
    // datagram would take it (as a receive posted early enough does on
    // EFA). So the receive goes once b has dropped it.
    let b_qpn = b.qpn;
    let drops = |f: &mut Fake, n| {
        let t = std::time::Instant::now();
        loop {
            let st = f.stats(GetStatsType::Basic, Some(b_qpn)).basic_stats();
            if st.rx_drops >= n || t.elapsed() > Duration::from_secs(10) {
                return st;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    assert_eq!(drops(&mut f, 1).rx_drops, 1, "without a receive");
    b.post_recv(1, &[rx.sge(0, 200)]);
    a.post_send(&inline_wqe(2, ah, b.qpn, 0x2222, b"y", 64));
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    let st = drops(&mut f, 2);
    assert_eq!((st.qkey_viol, st.rx_drops), (1, 2));
    b.quiet(Duration::from_millis(50));
    // The posted receive is still there for a good datagram.
    a.post_send(&inline_wqe(3, ah, b.qpn, 0x1111, b"z", 64));
    assert_eq!(b.wait(1)[0].req_id(), 1);
    // To a QP that does not exist: still sent.
    a.post_send(&inline_wqe(4, ah, 0x7ff, 0x1111, b"z", 64));
    assert_eq!(a.wait(2)[1].status(), S::Ok);
}

#[test]
fn srd_send_between_two_devices_with_the_source_gid() {
    let (mut f, mut g) = pair(test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    let tx = f.mr(a.pd, 8192, ALL_PERMS, 0x11);
    let rx = g.mr(b.pd, 16384, ALL_PERMS, 0);
    b.post_recv(3, &[rx.sge(0, 100), rx.sge(4096, 8000)]);
    a.post_send(&send_wqe(9, ah, b.qpn, 0x1111, &[tx.sge(0, 8000)], Some(1)));
    let s = a.wait(1);
    assert_eq!((s[0].status(), s[0].req_id()), (S::Ok, 9));
    let r = b.wait(1);
    let e = r[0].e;
    assert_eq!(
        (r[0].status(), e.base.length),
        (S::Ok, 8000),
        "no GRH area on SRD"
    );
    assert_eq!(e.base.ah, RxCdesc::AH_INVALID, "g has no AH for f");
    assert_eq!(e.src_addr(), gid(&f), "so the CQ shows the source GID");
    assert_eq!(g.ram.get(rx.gpa, 100), vec![0x11; 100]);
    assert_eq!(g.ram.get(rx.gpa + 4096, 7900), vec![0x11; 7900]);
    assert_eq!(g.ram.get(rx.gpa + 100, 1), vec![0], "between the two SGEs");
    // Larger than the MTU: refused locally.
    let big = f.mr(a.pd, 16384, ALL_PERMS, 0);
    a.post_send(&send_wqe(10, ah, b.qpn, 0x1111, &[big.sge(0, 9000)], None));
    assert_eq!(a.wait(1)[0].status(), S::LocalErrorBadLength);
}

#[test]
fn srd_retries_a_receiver_that_is_not_ready() {
    let (mut f, mut g) = pair(test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    a.post_send(&inline_wqe(1, ah, b.qpn, 0x1111, b"late", 64));
    a.quiet(Duration::from_millis(30));
    b.post_recv(8, &[rx.sge(0, 64)]);
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    assert_eq!(b.wait(1)[0].req_id(), 8);
    let waits = f.dev.counters().rnr_waits;
    assert!(waits > 0, "the send waited for its receive, uncounted");

    // No retries: the receiver-not-ready error.
    let mut c = f.ep(EpOpts {
        rnr_retry: 0,
        ..EpOpts::srd()
    });
    let ah_c = f.ah(c.pd, gid(&g));
    c.post_send(&inline_wqe(2, ah_c, b.qpn, 0x1111, b"x", 64));
    assert_eq!(c.wait(1)[0].status(), S::RemoteErrorRnr);
    assert_eq!(f.dev.counters().rnr_waits, waits, "no retries, no waits");
    // Three retries, then the error.
    let mut d = f.ep(EpOpts {
        rnr_retry: 3,
        ..EpOpts::srd()
    });
    let ah_d = f.ah(d.pd, gid(&g));
    d.post_send(&inline_wqe(3, ah_d, b.qpn, 0x1111, b"x", 64));
    assert_eq!(d.wait(1)[0].status(), S::RemoteErrorRnr);
    assert_eq!(f.dev.counters().rnr_waits, waits + 3, "a wait per retry");
    b.quiet(Duration::from_millis(10));
}

#[test]
fn srd_never_delivers_a_send_its_sender_was_told_was_not_received() {
    // Every request arrives twice, each copy 0-20 ms late, and the
    // requester's answers come 0-60 ms late while the first copy's
    // receiver-not-ready answer is on its way. A receive posted between the copies' arrivals must
    // not take the late copy of a send that then fails with RNR: the
    // sender would resend it, and the receiver get it twice. (Before
    // probes, the late copies were the requester's retransmissions.)
    // One UAR, CQ and QP per round and side.
    let roomy = || {
        let mut c = test_config();
        c.limits.max_uar = 32;
        c.limits.max_cq = 32;
        c.limits.max_qp = 32;
        c
    };
    let (mut f, mut g) = pair(roomy(), roomy());
    f.dev.port().set_faults(NetFaults {
        loss_ppm: 0,
        delay_us: 60_000,
        ..Default::default()
    });
    g.dev.port().set_faults(NetFaults {
        dup_ppm: 1_000_000,
        delay_us: 20_000,
        ..Default::default()
    });
    let (pd_a, pd_b) = (f.alloc_pd().unwrap(), g.alloc_pd().unwrap());
    let ah = f.ah(pd_a, gid(&g));
    let rx = g.mr(pd_b, 128, ALL_PERMS, 0);
    let mut refused = 0;
    for i in 0..24u16 {
        // Even rounds give up at the first refusal (unless no copy came
        // before the receive); odd ones retry for ever, and the message
        // must then arrive exactly once.
        let retry = i % 2 == 1;
        let mut a = f.ep_in(
            pd_a,
            EpOpts {
                rnr_retry: if retry { 7 } else { 0 },
                ..EpOpts::srd()
            },
        );
        let mut b = g.ep_in(pd_b, EpOpts::srd());
        a.post_send(&inline_wqe(i, ah, b.qpn, 0x1111, &i.to_le_bytes(), 64));
        std::thread::sleep(Duration::from_millis(8));
        // Two receives: a second delivery would take the second.
        b.post_recv(1, &[rx.sge(0, 64)]);
        b.post_recv(2, &[rx.sge(64, 64)]);
        let sent = a.wait_for(1, Duration::from_secs(10))[0].status();
        // Whatever is still in flight arrives within the delay.
        std::thread::sleep(Duration::from_millis(150));
        let got = b.poll();
        if retry {
            assert_eq!(sent, S::Ok, "round {i}");
            assert_eq!(got.len(), 1, "round {i}: delivered {} times", got.len());
        } else if sent == S::RemoteErrorRnr {
            refused += 1;
            assert!(
                got.is_empty(),
                "round {i}: the receiver got a send that failed with RNR"
            );
        } else {
            // Both copies came after the receive was posted.
            assert_eq!(sent, S::Ok, "round {i}");
            assert_eq!(got.len(), 1, "round {i}: delivered {} times", got.len());
        }
    }
    assert!(refused > 0, "some first copies were refused");
    // The race was run: copies arrived twice while answers were late.
    let sent = f.stats(GetStatsType::Basic, None).basic_stats().tx_pkts;
    let got = g.stats(GetStatsType::Basic, None).basic_stats().rx_pkts;
    assert!(got > sent, "{got} packets arrived of {sent}");
    let n = f.stats(GetStatsType::Network, None).network_stats();
    assert_eq!(n.retrans_pkts, 0, "nothing was lost: {n:?}");
}

#[test]
fn rdma_read_and_write_in_segments_and_write_with_immediate() {
    let (mut f, mut g) = pair(test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    const N: u64 = 300 << 10;
    let local = f.mr(a.pd, N, ALL_PERMS, 0);
    let remote = g.mr(b.pd, N, ALL_PERMS, 0);
    let pattern: Vec<u8> = (0..N).map(|i| (i * 7 % 251) as u8).collect();
    g.ram.put(remote.gpa, &pattern);

    let w = rdma_wqe(
        SendOpType::RdmaRead,
        1,
        ah,
        b.qpn,
        0x1111,
        remote.key,
        remote.iova,
        local.sge(0, N as u32),
        None,
    );
    a.post_send(&w);
    let c = a.wait(1);
    assert_eq!(c[0].status(), S::Ok);
    assert_eq!(c[0].op(), SendOpType::RdmaRead.raw());
    assert!(f.ram.get(local.gpa, N as usize) == pattern, "read data");

    // Write it back shifted by one byte, with an immediate.
    let back: Vec<u8> = pattern.iter().map(|b| b.wrapping_add(1)).collect();
    f.ram.put(local.gpa, &back);
    // A write with immediate consumes a receive (its buffer stays unused).
    b.post_recv(4, &[remote.sge(0, 0)]);
    let w = rdma_wqe(
        SendOpType::RdmaWrite,
        2,
        ah,
        b.qpn,
        0x1111,
        remote.key,
        remote.iova,
        local.sge(0, N as u32),
        Some(0x5555),
    );
    a.post_send(&w);
    let c = a.wait(1);
    assert_eq!(
        (c[0].status(), c[0].op()),
        (S::Ok, SendOpType::RdmaWrite.raw())
    );
    let r = b.wait(1);
    assert_eq!(r[0].op(), SendOpType::RdmaWrite.raw());
    assert_eq!(r[0].e.rdma_write_length(), N as u32, "32-bit length");
    assert!(r[0].has_imm() && r[0].e.base.imm == 0x5555 && r[0].req_id() == 4);
    assert!(g.ram.get(remote.gpa, N as usize) == back, "written data");

    let rd = f.stats(GetStatsType::RdmaRead, None).rdma_read_stats();
    assert_eq!((rd.read_wrs, rd.read_bytes, rd.read_wr_err), (1, N, 0));
    let wr = f.stats(GetStatsType::RdmaWrite, None).rdma_write_stats();
    assert_eq!((wr.write_wrs, wr.write_bytes), (1, N));
    let wr = g
        .stats(GetStatsType::RdmaWrite, Some(b.qpn))
        .rdma_write_stats();
    assert_eq!(wr.write_recv_bytes, N);
    let rd = g.stats(GetStatsType::RdmaRead, None).rdma_read_stats();
    assert_eq!(rd.read_resp_bytes, N);
}

#[test]
fn unsolicited_write_with_immediate_and_inline_writes_with_128_byte_wqes() {
    let (mut f, mut g) = pair(test_config(), test_config());
    let mut a = f.ep(EpOpts {
        wqe_size: 128,
        ..EpOpts::srd()
    });
    let mut b = g.ep(EpOpts {
        qp_flags: CreateQpCmd::UNSOLICITED_WRITE_RECV.mask(),
        ..EpOpts::srd()
    });
    let ah = f.ah(a.pd, gid(&g));
    let remote = g.mr(b.pd, 4096, ALL_PERMS, 0);
    let data = [0x42u8; 80];
    a.post_send(&inline_write_wqe(
        1,
        ah,
        b.qpn,
        0x1111,
        remote.key,
        remote.iova + 8,
        &data,
    ));
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    assert_eq!(g.ram.get(remote.gpa + 8, 80), data.to_vec());
    assert_eq!(g.ram.get(remote.gpa + 88, 1), vec![0]);

    let local = f.mr(a.pd, 4096, ALL_PERMS, 9);
    let w = rdma_wqe(
        SendOpType::RdmaWrite,
        2,
        ah,
        b.qpn,
        0x1111,
        remote.key,
        remote.iova,
        local.sge(0, 16),
        Some(77),
    );
    a.post_send(&w);
    a.wait(1);
    let r = b.wait(1);
    assert!(CdescCommon::UNSOLICITED.is_set(r[0].e.base.common.flags));
    assert_eq!((r[0].req_id(), r[0].e.base.imm), (0, 77));
    // 80 inline bytes of a send in a 128-byte WQE.
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    b.post_recv(5, &[rx.sge(0, 100)]);
    a.post_send(&inline_wqe(3, ah, b.qpn, 0x1111, &[3; 80], 128));
    a.wait(1);
    assert_eq!(b.wait(1)[0].e.base.length, 80);
    assert_eq!(g.ram.get(rx.gpa, 81), [vec![3; 80], vec![0]].concat());
}

#[test]
fn every_error_completion() {
    let (mut f, mut g) = pair(test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    let q = 0x1111;
    let local = f.mr(a.pd, 4096, ALL_PERMS, 1);
    let remote = g.mr(b.pd, 4096, ALL_PERMS, 0x77);
    let read_only = g.mr(b.pd, 4096, 0x4, 0x77); // remote read only
    let no_local_write = f.mr(a.pd, 4096, 0, 0);
    let other_pd = f.alloc_pd().unwrap();
    let foreign = f.mr(other_pd, 4096, ALL_PERMS, 0);
    let rd = |id, rkey, raddr, l: (u64, u32, u32)| {
        rdma_wqe(SendOpType::RdmaRead, id, ah, b.qpn, q, rkey, raddr, l, None)
    };
    let wr = |id, rkey, raddr, l: (u64, u32, u32)| {
        rdma_wqe(
            SendOpType::RdmaWrite,
            id,
            ah,
            b.qpn,
            q,
            rkey,
            raddr,
            l,
            None,
        )
    };
    let cases: Vec<(&str, Vec<u8>, S)> = vec![
        (
            "bad lkey",
            send_wqe(1, ah, b.qpn, q, &[(local.iova, 8, 0xabc)], None),
            S::LocalErrorInvalidLkey,
        ),
        (
            "lkey past the MR",
            send_wqe(2, ah, b.qpn, q, &[local.sge(4090, 8)], None),
            S::LocalErrorInvalidLkey,
        ),
        (
            "lkey of another PD",
            send_wqe(3, ah, b.qpn, q, &[foreign.sge(0, 8)], None),
            S::LocalErrorInvalidLkey,
        ),
        (
            "read into a buffer without local write",
            rd(4, remote.key, remote.iova, no_local_write.sge(0, 8)),
            S::LocalErrorInvalidLkey,
        ),
        (
            "bad AH",
            send_wqe(5, 0x3ff, b.qpn, q, &[local.sge(0, 8)], None),
            S::LocalErrorInvalidAh,
        ),
        (
            "no such QP",
            send_wqe(6, ah, 0x3ff, q, &[local.sge(0, 8)], None),
            S::RemoteErrorBadDestQpn,
        ),
        (
            "wrong Q_Key",
            send_wqe(7, ah, b.qpn, 0x9999, &[local.sge(0, 8)], None),
            S::RemoteErrorBadDestQpn,
        ),
        (
            "bad rkey",
            rd(8, 0x12345, remote.iova, local.sge(0, 8)),
            S::RemoteErrorBadAddress,
        ),
        (
            "read past the remote MR",
            rd(9, remote.key, remote.iova + 4090, local.sge(0, 8)),
            S::RemoteErrorBadAddress,
        ),
        (
            "write without remote write",
            wr(10, read_only.key, read_only.iova, local.sge(0, 8)),
            S::RemoteErrorBadAddress,
        ),
        (
            "three SGEs",
            send_wqe(11, ah, b.qpn, q, &[local.sge(0, 1); 3], None),
            S::LocalErrorBadLength,
        ),
    ];
    for (what, w, want) in cases {
        a.post_send(&w);
        let c = a.wait(1);
        assert_eq!(c[0].status(), want, "{what}");
    }
    assert_eq!(g.ram.get(read_only.gpa, 8), vec![0x77; 8], "untouched");
    assert_eq!(f.ram.get(no_local_write.gpa, 8), vec![0; 8], "untouched");

    // A receive buffer too short: both sides see it.
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0x55);
    b.post_recv(1, &[rx.sge(0, 4)]);
    a.post_send(&send_wqe(12, ah, b.qpn, q, &[local.sge(0, 8)], None));
    assert_eq!(a.wait(1)[0].status(), S::RemoteErrorBadLength);
    assert_eq!(b.wait(1)[0].status(), S::LocalErrorBadLength);
    assert_eq!(g.ram.get(rx.gpa, 8), vec![0x55; 8], "nothing written");
    // A receive buffer with a bad key.
    b.post_recv(2, &[(rx.iova, 64, 0xbad)]);
    a.post_send(&send_wqe(13, ah, b.qpn, q, &[local.sge(0, 8)], None));
    assert_eq!(a.wait(1)[0].status(), S::RemoteErrorAbort);
    assert_eq!(b.wait(1)[0].status(), S::LocalErrorInvalidLkey);

    // RDMA on UD, unknown and kernel-only operations.
    let mut u = f.ep(EpOpts::ud());
    let ah_u = f.ah(u.pd, gid(&g));
    u.post_send(&rdma_wqe(
        SendOpType::RdmaRead,
        1,
        ah_u,
        b.qpn,
        q,
        1,
        0,
        (0, 0, 0),
        None,
    ));
    assert_eq!(u.wait(1)[0].status(), S::LocalErrorUnsupportedOp);
    let mut w = send_wqe(2, ah, b.qpn, q, &[], None);
    TxMetaDesc_set_op(&mut w, SendOpType::FastReg.raw());
    a.post_send(&w);
    assert_eq!(a.wait(1)[0].status(), S::LocalErrorUnsupportedOp);
    TxMetaDesc_set_op(&mut w, 9);
    a.post_send(&w);
    assert_eq!(a.wait(1)[0].status(), S::LocalErrorUnsupportedOp);
    // A WQE without its META_DESC bit.
    let mut w = send_wqe(3, ah, b.qpn, q, &[], None);
    w[2] &= !0x80;
    a.post_send(&w);
    assert_eq!(a.wait(1)[0].status(), S::LocalErrorQpInternalError);

    // A destination that never answers.
    let mut lost = f.ep(EpOpts::srd());
    let ah_x = f.ah(lost.pd, [0x33; 16]);
    lost.post_send(&send_wqe(4, ah_x, 5, q, &[], None));
    let probes = f.dev.counters().probes;
    let c = lost.wait_for(1, Duration::from_secs(5));
    assert_eq!(c[0].status(), S::LocalErrorUnrespRemote);
    let n = f
        .stats(GetStatsType::Network, Some(lost.qpn))
        .network_stats();
    // Asked about, never sent again: nobody said it was missing.
    assert_eq!(
        f.dev.counters().probes - probes,
        u64::from(efa_emu::device::datapath::MAX_RETRIES)
    );
    assert_eq!(n.retrans_pkts, 0);
    assert_eq!(n.unresponsive_remote_events, 1);
}

#[allow(non_snake_case)]
fn TxMetaDesc_set_op(w: &mut [u8], op: u8) {
    w[2] = (w[2] & !0x0f) | op;
}

#[test]
fn srd_is_reliable_and_unordered_under_loss_and_delay() {
    let faults = NetFaults {
        loss_ppm: 200_000,
        delay_us: 3000,
        ..Default::default()
    };
    let (mut f, mut g) = pair(test_config(), test_config());
    f.dev.port().set_faults(faults);
    g.dev.port().set_faults(faults);
    let mut a = f.ep(EpOpts {
        sq_depth: 256,
        ..EpOpts::srd()
    });
    let mut b = g.ep(EpOpts {
        rq_depth: 256,
        ..EpOpts::srd()
    });
    let ah = f.ah(a.pd, gid(&g));
    let rx = g.mr(b.pd, 256 * 64, ALL_PERMS, 0);
    const N: u16 = 200;
    // More receives than messages: a message delivered twice would show.
    for i in 0..N + 20 {
        b.post_recv(i, &[rx.sge(u64::from(i) * 64, 64)]);
    }
    for i in 0..N {
        a.put_wqe(&inline_wqe(i, ah, b.qpn, 0x1111, &i.to_le_bytes(), 64));
        if i % 16 == 15 {
            a.ring_sq();
        }
    }
    a.ring_sq();
    let sent = a.wait_for(N.into(), Duration::from_secs(30));
    assert!(sent.iter().all(|c| c.status() == S::Ok));
    let got = b.wait_for(N.into(), Duration::from_secs(30));
    // Every message exactly once, each in the buffer of the receive that
    // completed with it.
    let mut seen = HashSet::new();
    let mut order = Vec::new();
    for c in &got {
        assert_eq!(c.status(), S::Ok);
        let off = u64::from(c.req_id()) * 64;
        let v = u16::from_le_bytes(g.ram.get(rx.gpa + off, 2).try_into().unwrap());
        assert!(seen.insert(v), "message {v} twice");
        order.push(v);
    }
    assert_eq!(seen.len(), usize::from(N));
    let sorted = {
        let mut s = order.clone();
        s.sort();
        s
    };
    assert_ne!(order, sorted, "delays reorder delivery");
    b.quiet(Duration::from_millis(300));
    let n = f.stats(GetStatsType::Network, None).network_stats();
    assert!(
        n.retrans_pkts > 0 && n.unresponsive_remote_events == 0,
        "{n:?}"
    );
    assert!(g.dev.port().dropped() > 0 && f.dev.port().dropped() > 0);
}

/// Deep queues between `f` and `g` on a link that loses nothing: 16
/// RDMA writes and 16 reads of 1 MiB in flight together on one QP (512
/// segments of 64 KiB, 32 MiB to move, longer to drain than any timeout),
/// and 256 small sends on another QP to the same peer at the same time.
/// `during` runs once everything is posted. Returns the requester's
/// network statistics.
fn deep_queues(f: &mut Fake, g: &mut Fake, during: impl FnOnce(&Fake, &Fake)) -> NetworkStats {
    const MIB: u32 = 1 << 20;
    const N: u16 = 16;
    const SENDS: u16 = 256;
    let mut a = f.ep(EpOpts {
        sq_depth: 64,
        cq_depth: 64,
        ..EpOpts::srd()
    });
    let b = g.ep(EpOpts::srd());
    let mut a2 = f.ep(EpOpts {
        sq_depth: 256,
        cq_depth: 512,
        ..EpOpts::srd()
    });
    let mut b2 = g.ep(EpOpts {
        rq_depth: 256,
        cq_depth: 512,
        ..EpOpts::srd()
    });
    let ah = f.ah(a.pd, gid(g));
    let ah2 = f.ah(a2.pd, gid(g));
    // Writes read from the buffer that reads write to: only the
    // completions are checked here.
    let local = f.mr(a.pd, u64::from(N) * u64::from(MIB), ALL_PERMS, 1);
    let remote = g.mr(b.pd, u64::from(N) * u64::from(MIB), ALL_PERMS, 2);
    let rx = g.mr(b2.pd, u64::from(SENDS) * 64, ALL_PERMS, 0);
    for i in 0..SENDS {
        b2.post_recv(i, &[rx.sge(u64::from(i) * 64, 64)]);
    }
    for (k, op) in [SendOpType::RdmaWrite, SendOpType::RdmaRead]
        .into_iter()
        .enumerate()
    {
        for i in 0..N {
            let off = u64::from(i) * u64::from(MIB);
            a.put_wqe(&rdma_wqe(
                op,
                k as u16 * N + i,
                ah,
                b.qpn,
                0x1111,
                remote.key,
                remote.iova + off,
                local.sge(off, MIB),
                None,
            ));
        }
    }
    a.ring_sq();
    for i in 0..SENDS {
        a2.put_wqe(&inline_wqe(i, ah2, b2.qpn, 0x1111, &i.to_le_bytes(), 64));
    }
    a2.ring_sq();
    during(f, g);
    let c = a.wait_for(2 * usize::from(N), Duration::from_secs(60));
    assert!(c.iter().all(|c| c.status() == S::Ok), "RDMA");
    let c = a2.wait_for(SENDS.into(), Duration::from_secs(60));
    assert!(c.iter().all(|c| c.status() == S::Ok), "sends");
    let c = b2.wait_for(SENDS.into(), Duration::from_secs(60));
    assert!(c.iter().all(|c| c.status() == S::Ok), "receives");
    assert_eq!(b2.poll().len(), 0, "each send once");
    f.stats(GetStatsType::Network, None).network_stats()
}

#[test]
fn srd_retransmits_nothing_on_a_loss_free_link_at_any_queue_depth() {
    // The requests at the back of the queues are late, not lost: none is
    // sent again, however long the queues take to drain, and however
    // long a thread is preempted on a busy host. Timing every request
    // from its send retransmitted 128 to 219 of 256 write and read
    // segments; retransmitting the oldest request after a timeout of
    // silence (before probes, 4cfd77e) 1 to 4 of the sends here, in each
    // of 12 runs on the loaded development machine.
    let (mut f, mut g) = pair(test_config(), test_config());
    let n = deep_queues(&mut f, &mut g, |_, _| {});
    assert_eq!((n.retrans_pkts, n.retrans_bytes), (0, 0), "{n:?}");
    assert_eq!(n.retrans_timeout_events, 0, "{n:?}");
}

#[test]
fn srd_retransmits_nothing_on_a_loss_free_link_between_processes() {
    // Two fabrics with the same directory stand for two efa-emu
    // processes: the Unix sockets between them lose nothing either.
    let dir = std::env::temp_dir().join(format!("efa-dp-deep-{}", std::process::id()));
    let (mut ca, mut cb) = (test_config(), test_config());
    ca.fabric_dir = Some(dir.clone());
    cb.fabric_dir = Some(dir.clone());
    cb.gid[15] = 0x43;
    let (mut f, mut g) = (Fake::up(ca), Fake::up(cb));
    let n = deep_queues(&mut f, &mut g, |_, _| {});
    // Unless the sockets lose packets, when a receive thread is not
    // scheduled for a while on a busy host: the transmit thread's queue
    // to the peer full (these are 768 packets to one GID at once, more
    // than its 512: the losses seen), or a socket queue full for 100 ms.
    // Those losses, and only those, retransmissions recover, each once.
    let lost = f.dev.fabric().transport_lost() + g.dev.fabric().transport_lost();
    assert!(n.retrans_pkts <= lost, "{n:?}, {lost} lost by the sockets");
    drop((f, g));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two devices' configurations, each with a keyed UDP fabric of its own
/// (as two processes): the second's GID ends in `gid_end`, their ports are
/// the pair `slot` of this process on `host` (a loopback address), the
/// key all `key` bytes.
fn udp_pair(host: &str, slot: u16, gid_end: u8, key: u8) -> [Config; 2] {
    use efa_emu::device::fabric::auth::FabricKey;
    use efa_emu::device::fabric::udp::PeerMap;
    use efa_emu::device::fabric::UdpConfig;
    let (ca, mut cb) = (test_config(), test_config());
    cb.gid[15] = gid_end;
    let port = 10_000 + (std::process::id() % 1000) as u16 * 20 + slot;
    let peers: PeerMap = [
        (ca.gid, format!("{host}:{port}").parse().unwrap()),
        (cb.gid, format!("{host}:{}", port - 1).parse().unwrap()),
    ]
    .into();
    let udp = UdpConfig {
        peers: std::sync::Arc::new(peers),
        key: Some(FabricKey::new([key; 32])),
    };
    [ca, cb].map(|mut c| {
        c.udp = Some(udp.clone());
        c
    })
}

#[test]
fn srd_retransmits_nothing_on_a_loss_free_link_over_udp() {
    // UDP on loopback, 32 KiB segments: 1024 write and read segments in
    // flight through the sockets' buffers.
    let [ca, cb] = udp_pair("127.0.0.1", 15, 0x44, 0x44);
    let (mut f, mut g) = (Fake::up(ca), Fake::up(cb));
    let full = udp_receive_buffer_errors();
    let n = deep_queues(&mut f, &mut g, |_, _| {});
    // A datagram the kernel drops for a full receive buffer (a receive
    // thread not scheduled for a while) is a loss on this link, which a
    // retransmission must recover; the machine's count of them bounds
    // the retransmissions (it is 0 on a quiet host).
    let full = udp_receive_buffer_errors() - full;
    assert!(n.retrans_pkts <= full, "{n:?}, {full} datagrams dropped");
}

/// The host's count of UDP datagrams dropped for a full receive buffer.
fn udp_receive_buffer_errors() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").expect("/proc/net/snmp");
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next().unwrap(), udp.next().unwrap());
    let at = names
        .split_whitespace()
        .position(|n| n == "RcvbufErrors")
        .expect("RcvbufErrors");
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

#[test]
fn srd_waits_out_a_stalled_peer_with_probes_not_retransmissions() {
    // The responder's thread stands still for five times the largest
    // timeout (100 ms) while the requests arrive, as on a host that does
    // not schedule it: the requester asks it (probes), gets no answer,
    // asks again later, and sends nothing twice (before probes, 10 to 12
    // packets, 320-390 KB, were sent again). Then the requester's own
    // thread stands still while the answers pile up in its port.
    let stall = Duration::from_millis(500);
    let (mut f, mut g) = pair(test_config(), test_config());
    let n = deep_queues(&mut f, &mut g, |_, g| {
        assert!(g.dev.stall(stall), "the responder stood still");
    });
    let probes = f.dev.counters().probes;
    assert_eq!(
        (n.retrans_pkts, n.unresponsive_remote_events),
        (0, 0),
        "{n:?}"
    );
    assert!(probes > 0, "the silence was noticed");
    let (mut f, mut g) = pair(test_config(), test_config());
    let n = deep_queues(&mut f, &mut g, |f, _| {
        std::thread::sleep(Duration::from_millis(5));
        assert!(f.dev.stall(stall), "the requester stood still");
    });
    assert_eq!(
        (n.retrans_pkts, n.unresponsive_remote_events),
        (0, 0),
        "{n:?}"
    );
    eprintln!("probes: {probes}, then {}", f.dev.counters().probes);
}

/// An SRD QP on each device, and 20 round trips of sends between them
/// (for the requester's round-trip estimate); a receive is posted for the
/// next send.
fn srd_after_round_trips(f: &mut Fake, g: &mut Fake) -> (Ep, Ep, u16) {
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(g));
    let rx = g.mr(b.pd, 64 * 64, ALL_PERMS, 0);
    for i in 0..20u16 {
        b.post_recv(i, &[rx.sge(u64::from(i) * 64, 64)]);
        a.post_send(&inline_wqe(i, ah, b.qpn, 0x1111, &i.to_le_bytes(), 64));
        assert_eq!(a.wait(1)[0].status(), S::Ok);
        assert_eq!(b.wait(1)[0].status(), S::Ok);
    }
    b.post_recv(20, &[rx.sge(20 * 64, 64)]);
    (a, b, ah)
}

/// Sends an inline SRD send of 8 bytes from `a` to `b` that `port` (b's)
/// drops, and ends the loss once it has: when the send was posted.
fn send_one_lost(
    a: &mut Ep,
    ah: u16,
    b: &Ep,
    port: &efa_emu::device::fabric::Port,
) -> std::time::Instant {
    port.set_faults(NetFaults {
        loss_ppm: 1_000_000,
        ..Default::default()
    });
    let t = std::time::Instant::now();
    a.post_send(&inline_wqe(20, ah, b.qpn, 0x1111, &[20; 8], 64));
    while port.dropped() == 0 {
        assert!(t.elapsed() < PATIENCE, "never sent");
        std::hint::spin_loop();
    }
    port.set_faults(NetFaults::default());
    t
}

#[test]
fn srd_recovers_a_lost_request_in_about_a_timeout() {
    let (mut f, mut g) = pair(test_config(), test_config());
    let (mut a, mut b, ah) = srd_after_round_trips(&mut f, &mut g);
    let port = g.dev.port();
    let probes = f.dev.counters().probes;
    let t = send_one_lost(&mut a, ah, &b, &port);
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    let took = t.elapsed();
    assert_eq!(b.wait(1)[0].status(), S::Ok);
    let n = f.stats(GetStatsType::Network, None).network_stats();
    assert!(f.dev.counters().probes > probes);
    eprintln!("a lost send recovered in {took:?}");
    if port.dropped() > 1 {
        // This thread came late to end the loss: a probe or the
        // retransmission was lost too, and waited for more timeouts.
        assert!(n.retrans_pkts >= 1, "{n:?}");
        return;
    }
    assert_eq!(
        (n.retrans_pkts, n.retrans_bytes, n.retrans_timeout_events),
        (1, 8, 1),
        "{n:?}"
    );
    // A timeout is at most 100 ms (before probes it was one too); the
    // counters above say what was sent, and the bound is loose for a
    // loaded host.
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn srd_sends_a_lost_request_again_once_however_many_probes_found_it_missing() {
    // The request is lost while the responder stands still: the
    // requester probes it again and again meanwhile, and the responder,
    // back, answers each of the queued probes that it never got it. The
    // first of those answers sends it again; the others answer probes
    // sent before that retransmission and say nothing of it. Taking each
    // as a loss sent the request once per probe (on a busy host, two
    // fabrics' sockets: 345 retransmissions for 126 packets lost).
    let (mut f, mut g) = pair(test_config(), test_config());
    let (mut a, mut b, ah) = srd_after_round_trips(&mut f, &mut g);
    let port = g.dev.port();
    let probes = f.dev.counters().probes;
    // Several timeouts (5 ms and doubling) of silence.
    assert!(
        g.dev.stall(Duration::from_millis(300)),
        "the responder stood still"
    );
    send_one_lost(&mut a, ah, &b, &port);
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    assert_eq!(b.wait(1)[0].status(), S::Ok);
    let n = f.stats(GetStatsType::Network, None).network_stats();
    // Those lost too, if this thread came late to end the loss, were
    // never answered.
    let probes = f.dev.counters().probes - probes - (port.dropped() - 1);
    eprintln!("{probes} probes reached the responder, {n:?}");
    assert!(probes > 1, "the request was probed more than once");
    assert_eq!((n.retrans_pkts, n.retrans_bytes), (1, 8), "{n:?}");
}

#[test]
fn srd_fails_everything_sent_to_a_dead_peer_together() {
    // A peer that answers nothing is declared dead once, after the
    // probes about its oldest request went unanswered, and every request
    // sent to it before the silence began fails then, over all QPs: one
    // timeout's worth of silence, not one per request (the requests
    // behind the oldest used to wait for it to fail, then start their
    // own probes: four sends on four QPs failed at 1.6, 3.5, 5.3 and
    // 6.8 s, and a 1 MiB write's 16 segments one after another).
    const MIB: u32 = 1 << 20;
    let mut c = test_config();
    (c.limits.max_pd, c.limits.max_uar, c.limits.max_ah) = (8, 8, 8);
    let (mut f, _g) = pair(c, test_config());
    let dead = [0x35; 16];
    let q = 0x1111;
    let mut eps: Vec<_> = (0..4).map(|_| f.ep(EpOpts::srd())).collect();
    let mut w = f.ep(EpOpts::srd());
    let local = f.mr(w.pd, MIB.into(), ALL_PERMS, 1);
    let t = std::time::Instant::now();
    for (i, e) in eps.iter_mut().enumerate() {
        let ah = f.ah(e.pd, dead);
        e.post_send(&send_wqe(i as u16, ah, 5, q, &[], None));
    }
    let ah = f.ah(w.pd, dead);
    w.post_send(&rdma_wqe(
        SendOpType::RdmaWrite,
        9,
        ah,
        5,
        q,
        0x77,
        0x1000,
        local.sge(0, MIB),
        None,
    ));
    let mut took = Vec::new();
    for e in eps.iter_mut().chain([&mut w]) {
        let c = e.wait_for(1, Duration::from_secs(30));
        assert_eq!(c[0].status(), S::LocalErrorUnrespRemote);
        took.push(t.elapsed());
    }
    eprintln!("failed after {took:?}");
    // About 1.3 s of probes; far under the 5 x 1.3 s of one after the
    // other, with room for a loaded host.
    assert!(*took.last().unwrap() < Duration::from_secs(3), "{took:?}");
    let n = f.stats(GetStatsType::Network, None).network_stats();
    assert_eq!(n.retrans_pkts, 0, "{n:?}");
    assert_eq!(n.unresponsive_remote_events, 4 + 16, "{n:?}");
}

/// Posts `wqe` on `a` of `f` with every packet to `f` lost until one was
/// (the answer), and returns the completion, the requester's network
/// statistics and the packets lost (more than one if this thread came
/// late to end the loss): the request was answered, so the reply to the
/// probe completes it.
fn with_its_answer_lost(f: &mut Fake, a: &mut Ep, wqe: &[u8]) -> (Cqe, NetworkStats, u64) {
    let port = f.dev.port();
    port.set_faults(NetFaults {
        loss_ppm: 1_000_000,
        ..Default::default()
    });
    let probes = f.dev.counters().probes;
    let dropped = port.dropped();
    let t = std::time::Instant::now();
    a.post_send(wqe);
    while port.dropped() == dropped {
        assert!(t.elapsed() < PATIENCE, "no answer");
        std::hint::spin_loop();
    }
    port.set_faults(NetFaults::default());
    let c = a.wait(1).remove(0);
    assert!(
        f.dev.counters().probes > probes,
        "asked about: {:?} after {} dropped",
        c.status(),
        port.dropped()
    );
    let n = f.stats(GetStatsType::Network, None).network_stats();
    (c, n, port.dropped() - dropped)
}

#[test]
fn srd_completes_with_the_error_a_probe_reply_gives_for_a_lost_answer() {
    let (mut f, mut g) = pair(test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    let local = f.mr(a.pd, 4096, ALL_PERMS, 1);
    let remote = g.mr(b.pd, 4096, ALL_PERMS, 2);
    // A write past the end of the MR: refused, and the refusal lost.
    let w = rdma_wqe(
        SendOpType::RdmaWrite,
        1,
        ah,
        b.qpn,
        0x1111,
        remote.key,
        remote.iova + 4090,
        local.sge(0, 64),
        None,
    );
    let (c, n, dropped) = with_its_answer_lost(&mut f, &mut a, &w);
    assert_eq!(c.status(), S::RemoteErrorBadAddress, "{n:?}");
    if dropped == 1 {
        // Answered, so not sent again.
        assert_eq!(n.retrans_pkts, 0, "{n:?}");
    }
    // A receiver not ready (no receive posted, no retries), the answer
    // lost: the reply's status, not success.
    let mut r = f.ep(EpOpts {
        rnr_retry: 0,
        ..EpOpts::srd()
    });
    let ah_r = f.ah(r.pd, gid(&g));
    let s = inline_wqe(2, ah_r, b.qpn, 0x1111, b"nobody", 64);
    let retrans = n.retrans_pkts;
    let (c, n, dropped) = with_its_answer_lost(&mut f, &mut r, &s);
    assert_eq!(c.status(), S::RemoteErrorRnr, "{n:?}");
    if dropped == 1 {
        assert_eq!(n.retrans_pkts, retrans, "{n:?}");
    }
}

#[test]
fn srd_waits_for_a_delayed_request_the_responder_holds() {
    // The request is held in the responder's port (an injected delay of
    // up to 500 ms) when the probe about it arrives: the responder says
    // it holds it, and nothing is sent again. A short delay (answered
    // before the first probe) proves nothing: then the run is repeated.
    let (mut f, mut g) = pair(test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    let rx = g.mr(b.pd, 64 * 16, ALL_PERMS, 0);
    let port = g.dev.port();
    let mut held = 0;
    for i in 0..8u16 {
        b.post_recv(i, &[rx.sge(u64::from(i) * 64, 64)]);
        port.set_faults(NetFaults {
            delay_us: 500_000,
            ..Default::default()
        });
        let probes = f.dev.counters().probes;
        a.post_send(&inline_wqe(i, ah, b.qpn, 0x1111, &[i as u8; 8], 64));
        let t = std::time::Instant::now();
        while !port.holds(|p| p.request_seq().is_some()) && t.elapsed() < PATIENCE {
            std::hint::spin_loop();
        }
        // Probes arrive at once, before the request.
        port.set_faults(NetFaults::default());
        while f.dev.counters().probes == probes && port.holds(|p| p.request_seq().is_some()) {
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_millis(10));
        let probed_while_held = port.holds(|p| p.request_seq().is_some());
        assert_eq!(a.wait(1)[0].status(), S::Ok);
        assert_eq!(b.wait(1)[0].req_id(), i);
        if probed_while_held {
            held += 1;
            if held == 2 {
                break;
            }
        }
    }
    assert!(held > 0, "the request was never held when probed");
    assert_eq!(b.poll().len(), 0, "each send once");
    let n = f.stats(GetStatsType::Network, None).network_stats();
    assert_eq!(
        (n.retrans_pkts, n.unresponsive_remote_events),
        (0, 0),
        "{n:?}"
    );
}

#[test]
fn srd_serves_a_read_once_however_often_it_arrives_and_again_when_its_answer_is_lost() {
    const LEN: u32 = 1 << 20;
    let (mut f, mut g) = pair(test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    let local = f.mr(a.pd, LEN.into(), ALL_PERMS, 0);
    let remote = g.mr(b.pd, LEN.into(), ALL_PERMS, 0);
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 13 + i / 4099) as u8).collect();
    g.ram.put(remote.gpa, &pattern);
    let read = |id| {
        rdma_wqe(
            SendOpType::RdmaRead,
            id,
            ah,
            b.qpn,
            0x1111,
            remote.key,
            remote.iova,
            local.sge(0, LEN),
            None,
        )
    };
    // Every request arrives twice: each segment is read out of memory
    // and answered once, the copies dropped before their data is read.
    g.dev.port().set_faults(NetFaults {
        dup_ppm: 1_000_000,
        ..Default::default()
    });
    a.post_send(&read(1));
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    assert!(f.ram.get(local.gpa, LEN as usize) == pattern);
    // Answers that may still be on their way.
    a.quiet(Duration::from_millis(50));
    let d = g.stats(GetStatsType::Basic, None).basic_stats();
    assert!(d.rx_pkts >= 2 * 16, "16 segments, each twice: {d:?}");
    assert_eq!(d.tx_bytes, u64::from(LEN), "served once: {d:?}");
    g.dev.port().set_faults(NetFaults::default());
    // An answer lost (with its data): the probe hears that the read was
    // answered, and the read is asked for again.
    f.ram.put(local.gpa, &vec![0; LEN as usize]);
    let port = f.dev.port();
    port.set_faults(NetFaults {
        loss_ppm: 1_000_000,
        ..Default::default()
    });
    let t = std::time::Instant::now();
    a.put_wqe(&rdma_wqe(
        SendOpType::RdmaRead,
        2,
        ah,
        b.qpn,
        0x1111,
        remote.key,
        remote.iova,
        local.sge(0, 64 << 10),
        None,
    ));
    a.ring_sq();
    while port.dropped() == 0 {
        assert!(t.elapsed() < PATIENCE, "no answer");
        std::hint::spin_loop();
    }
    port.set_faults(NetFaults::default());
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    assert!(f.ram.get(local.gpa, 64 << 10) == pattern[..64 << 10]);
    let n = f.stats(GetStatsType::Network, None).network_stats();
    assert_eq!(n.unresponsive_remote_events, 0, "{n:?}");
    // Asked for once more (unless this thread came late to end the loss,
    // and a reply to a probe or the second answer was lost too).
    if port.dropped() == 1 {
        assert_eq!(n.retrans_pkts, 1, "{n:?}");
    } else {
        assert!(n.retrans_pkts >= 1, "{n:?}");
    }
}

#[test]
fn ud_loses_datagrams_under_loss() {
    let (mut f, mut g) = pair(test_config(), test_config());
    g.dev.port().set_faults(NetFaults {
        loss_ppm: 500_000,
        delay_us: 0,
        ..Default::default()
    });
    let mut a = f.ep(EpOpts::ud());
    let mut b = g.ep(EpOpts::ud());
    let ah = f.ah(a.pd, gid(&g));
    let rx = g.mr(b.pd, 64 * 64, ALL_PERMS, 0);
    for i in 0..60 {
        b.post_recv(i, &[rx.sge(u64::from(i) * 64, 64)]);
    }
    for i in 0..60u16 {
        a.post_send(&inline_wqe(i, ah, b.qpn, 0x1111, b"d", 64));
    }
    assert!(a.wait(60).iter().all(|c| c.status() == S::Ok));
    std::thread::sleep(Duration::from_millis(100));
    let got = b.poll().len();
    assert!(got > 0 && got < 60, "{got} of 60 arrived");
}

/// A UD sender `a` and a receiver `b` whose CQ reports to an EQ on vector
/// 1, armed as the C driver arms its EQs when it creates them; `rx` is a
/// receive buffer of `b`'s, and `send(a, i)` sends `b` a message with
/// request id `i`.
fn event_pair() -> (
    Fake,
    u16,
    u64,
    support::dp::Ep,
    support::dp::Ep,
    support::dp::Buf,
    impl Fn(&mut support::dp::Ep, u16),
) {
    let mut f = Fake::up(test_config());
    let (eqn, ring) = f.create_eq(64, 1);
    f.w(efa_hw::regs::EQ_DB_OFF, eq_db(eqn, true));
    let a = f.ep(EpOpts::ud());
    let b = f.ep(EpOpts {
        eqn: Some(eqn),
        ..EpOpts::ud()
    });
    let ah = f.ah(a.pd, gid(&f));
    let rx = f.mr(b.pd, 4096, ALL_PERMS, 0);
    let bq = b.qpn;
    let send =
        move |a: &mut support::dp::Ep, i| a.post_send(&inline_wqe(i, ah, bq, 0x1111, b"e", 64));
    (f, eqn, ring, a, b, rx, send)
}

#[test]
fn completion_events_go_through_the_eq_and_its_vector() {
    let (f, eqn, ring, mut a, mut b, rx, send) = event_pair();
    // Armed from creation: the first completion raises an event.
    b.post_recv(1, &[rx.sge(0, 64)]);
    b.write_cq_db(true);
    send(&mut a, 1);
    b.wait(1);
    wait_irq(&f, 1, 1);
    let e = Eqe::decode_padded(&f.ram.get(ring, 16));
    assert_eq!(Eqe::PHASE.get(e.common), 1);
    assert_eq!(e.comp_event().cqn, b.cq);
    // Not re-armed (the program has not seen the event): no event.
    b.post_recv(2, &[rx.sge(0, 64)]);
    send(&mut a, 2);
    b.wait(1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(f.irq.count(1), 1);
    // The program gets the event (cmd_sn), re-arms and then polls at once:
    // the arm is overwritten before the model looks, cmd_sn still tells.
    b.cmd_sn = 1;
    b.write_cq_db(true);
    b.write_cq_db(false);
    std::thread::sleep(Duration::from_millis(20));
    b.post_recv(3, &[rx.sge(0, 64)]);
    send(&mut a, 3);
    b.wait(1);
    // The EQ was not re-armed by the driver yet: the vector waits for it.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(f.irq.count(1), 1);
    f.w(efa_hw::regs::EQ_DB_OFF, eq_db(eqn, true));
    assert_eq!(f.irq.count(1), 2, "raised at the arm");
    let e = Eqe::decode_padded(&f.ram.get(ring + 16, 16));
    assert_eq!((Eqe::PHASE.get(e.common), e.comp_event().cqn), (1, b.cq));
    // A plain arm with the ARM bit.
    f.w(efa_hw::regs::EQ_DB_OFF, eq_db(eqn, true));
    b.cmd_sn = 2;
    b.write_cq_db(true);
    std::thread::sleep(Duration::from_millis(20));
    b.post_recv(4, &[rx.sge(0, 64)]);
    send(&mut a, 4);
    b.wait(1);
    wait_irq(&f, 1, 3);
    // Re-armed right before the doorbell that leads to the completion, with
    // no pause for the model to look: the completion still raises it.
    f.w(efa_hw::regs::EQ_DB_OFF, eq_db(eqn, true));
    b.cmd_sn = 3;
    b.post_recv(5, &[rx.sge(0, 64)]);
    b.write_cq_db(true);
    b.write_cq_db(false);
    send(&mut a, 5);
    b.wait(1);
    wait_irq(&f, 1, 4);
    a.wait(5);
}

/// rdma-core arms a CQ (`ARM`, `cmd_sn`, its consumer count) and then
/// polls it once; a completion the model writes after its last look at the
/// doorbell but before that arm lands, and that the poll then misses, is
/// past the arm's consumer count. The arm must raise the event at once: no
/// later completion is coming to raise it (a pingpong with events hangs).
#[test]
fn an_arm_behind_a_completion_raises_the_event_at_once() {
    let (f, eqn, ring, mut a, mut b, rx, send) = event_pair();
    // Armed from creation: the first completion raises the event and
    // disarms the CQ; the program polls it (doorbell without ARM) and the
    // driver re-arms the EQ.
    b.post_recv(1, &[rx.sge(0, 64)]);
    send(&mut a, 1);
    assert_eq!(b.wait(1)[0].req_id(), 1);
    wait_irq(&f, 1, 1);
    f.w(efa_hw::regs::EQ_DB_OFF, eq_db(eqn, true));
    // A completion while the CQ is disarmed: no event.
    b.post_recv(2, &[rx.sge(0, 64)]);
    send(&mut a, 2);
    let t = std::time::Instant::now();
    while b.unpolled() < 1 {
        assert!(t.elapsed() < PATIENCE, "the second completion never came");
        std::thread::sleep(Duration::from_micros(100));
    }
    assert_eq!(f.irq.count(1), 1);
    // The program got the first event and arms with the consumer count it
    // has (1, not counting the second completion).
    b.cmd_sn = 1;
    b.write_cq_db(true);
    wait_irq(&f, 1, 2);
    let e = Eqe::decode_padded(&f.ram.get(ring + 16, 16));
    assert_eq!((Eqe::PHASE.get(e.common), e.comp_event().cqn), (1, b.cq));
    f.w(efa_hw::regs::EQ_DB_OFF, eq_db(eqn, true));
    assert_eq!(b.wait(1)[0].req_id(), 2);
    // Arming with nothing past the consumer count waits for the next
    // completion.
    b.cmd_sn = 2;
    b.write_cq_db(true);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(f.irq.count(1), 2, "no event before the next completion");
    b.post_recv(3, &[rx.sge(0, 64)]);
    send(&mut a, 3);
    assert_eq!(b.wait(1)[0].req_id(), 3);
    wait_irq(&f, 1, 3);
    a.wait(3);
}

/// Programs re-arm a CQ when its event comes, before they poll the
/// completion the event was for (libibverbs' pattern: get the event, ack
/// it, re-arm, poll). That completion is past the arm's consumer count but
/// was announced: the arm must raise nothing (perftest's ib_send_lat -e
/// then posts its next send expecting that completion, and fails on an
/// extra event with "Couldn't post send").
#[test]
fn an_arm_behind_an_announced_completion_raises_nothing() {
    let (f, eqn, _ring, mut a, mut b, rx, send) = event_pair();
    for i in 1..=3u16 {
        let events = u64::from(i);
        b.post_recv(i, &[rx.sge(0, 64)]);
        send(&mut a, i);
        wait_irq(&f, 1, events);
        f.w(efa_hw::regs::EQ_DB_OFF, eq_db(eqn, true));
        // The event came; the program re-arms before it polls.
        b.cmd_sn = i as u8;
        b.write_cq_db(true);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            f.irq.count(1),
            events,
            "an extra event at the arm after event {i}"
        );
        assert_eq!(b.wait(1)[0].req_id(), i);
        a.wait(1);
    }
}

fn eq_db(eqn: u16, arm: bool) -> u32 {
    efa_hw::regs::EQ_DB_EQN.prep(eqn.into()) | efa_hw::regs::EQ_DB_ARM.prep(arm.into())
}

fn wait_irq(f: &Fake, v: u16, n: u64) {
    let t = std::time::Instant::now();
    while f.irq.count(v) < n {
        assert!(
            t.elapsed() < PATIENCE,
            "vector {v}: {} of {n}",
            f.irq.count(v)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn sixty_four_bit_request_ids_and_sixteen_byte_completions() {
    let mut f = Fake::up(test_config());
    let mut a = f.ep(EpOpts {
        qp_flags: CreateQpCmd::SQ_64_BIT_REQ_ID.mask(),
        cq_64: true,
        ..EpOpts::srd()
    });
    let mut b = f.ep(EpOpts {
        cqe_size: 16,
        src_addr: false,
        ..EpOpts::srd()
    });
    let ah = f.ah(a.pd, gid(&f));
    let rx = f.mr(b.pd, 4096, ALL_PERMS, 0);
    b.post_recv(7, &[rx.sge(0, 64)]);
    let mut w = inline_wqe(0x4444, ah, b.qpn, 0x1111, b"id", 64);
    let mut m = TxMetaDesc::decode_padded(&w);
    m.set_req_id_64(0x1111_2222_3333_4444);
    w[..32].copy_from_slice(&m.to_bytes());
    a.post_send(&w);
    assert_eq!(a.wait(1)[0].tx().req_id_64(), 0x1111_2222_3333_4444);
    let r = b.wait(1);
    assert_eq!((r[0].req_id(), r[0].e.base.length), (7, 2));
}

#[test]
fn bad_doorbells_and_wqes_put_the_qp_in_error_and_flush() {
    let mut f = Fake::up(test_config());
    let a = f.ep(EpOpts::srd());
    let mut b = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&f));
    let rx = f.mr(b.pd, 4096, ALL_PERMS, 0);
    // A doorbell far past the ring.
    a.ring_sq_raw(1000);
    std::thread::sleep(Duration::from_millis(30));
    let q = f.query(a.qpn.into()).unwrap();
    assert_eq!(q.qp_state, QpState::Err.raw());
    assert!(!f.dev.is_fatal(), "a QP error, not a device error");
    // Back to work through Reset: the queues start over.
    f.set_state(a.qpn.into(), QpState::Reset).unwrap();
    f.bring_to_rts(a.qpn.into(), 0x1111, Some(7));
    let mut a = a.restart();
    b.post_recv(1, &[rx.sge(0, 64)]);
    a.post_send(&inline_wqe(1, ah, b.qpn, 0x1111, b"again", 64));
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    assert_eq!(b.wait(1)[0].status(), S::Ok);
    // A WQE with the wrong phase.
    let mut w = inline_wqe(2, ah, b.qpn, 0x1111, b"p", 64);
    a.put_wqe(&w);
    w[3] ^= 1;
    let at = a.resp.llq_descriptors_offset as usize + 64;
    f.dev.bar2().write(at, &w).unwrap();
    a.ring_sq();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(f.query(a.qpn.into()).unwrap().qp_state, QpState::Err.raw());
    // Posted receives of a QP in error are flushed.
    b.post_recv(5, &[rx.sge(0, 64)]);
    b.post_recv(6, &[rx.sge(0, 64)]);
    f.set_state(b.qpn.into(), QpState::Err).unwrap();
    let c = b.wait(2);
    assert!(c.iter().all(|c| c.status() == S::Flushed));
    // A receive descriptor chain without LAST.
    let mut c2 = f.ep(EpOpts::srd());
    c2.post_recv_raw(&[(rx.iova, 8, rx.key, true, false); 3]);
    a = f.ep(EpOpts::srd());
    let ah3 = f.ah(a.pd, gid(&f));
    a.post_send(&inline_wqe(1, ah3, c2.qpn, 0x1111, b"x", 64));
    assert_eq!(a.wait(1)[0].status(), S::RemoteErrorAbort);
    assert_eq!(f.query(c2.qpn.into()).unwrap().qp_state, QpState::Err.raw());
}

#[test]
fn get_stats_count_real_traffic() {
    let mut f = Fake::up(test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&f));
    let rx = f.mr(b.pd, 4096, ALL_PERMS, 0);
    for i in 0..5 {
        b.post_recv(i, &[rx.sge(0, 100)]);
        a.post_send(&inline_wqe(i, ah, b.qpn, 0x1111, &[1; 30], 64));
    }
    a.wait(5);
    b.wait(5);
    let m = f
        .stats(GetStatsType::Messages, Some(a.qpn))
        .messages_stats();
    assert_eq!((m.send_wrs, m.send_bytes), (5, 150));
    let m = f
        .stats(GetStatsType::Messages, Some(b.qpn))
        .messages_stats();
    assert_eq!((m.recv_wrs, m.recv_bytes), (5, 150));
    let d = f.stats(GetStatsType::Basic, None).basic_stats();
    assert_eq!((d.tx_pkts, d.rx_pkts), (10, 10), "5 sends, 5 answers");
    assert_eq!((d.tx_bytes, d.rx_bytes), (150, 150));
    assert_eq!(f.dev.stats().basic, d);
}

#[test]
fn srd_over_the_socket_fabric_between_processes() {
    // Two fabrics with the same directory stand for two efa-emu processes.
    let dir = std::env::temp_dir().join(format!("efa-dp-test-{}", std::process::id()));
    let mut ca = test_config();
    ca.fabric_dir = Some(dir.clone());
    let mut cb = test_config();
    cb.fabric_dir = Some(dir.clone());
    cb.gid[15] = 0x42;
    let mut f = Fake::up(ca);
    let mut g = Fake::up(cb);
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    let rx = g.mr(b.pd, 8192, ALL_PERMS, 0);
    let tx = f.mr(a.pd, 200 << 10, ALL_PERMS, 0x5a);
    b.post_recv(1, &[rx.sge(0, 8192)]);
    a.post_send(&send_wqe(1, ah, b.qpn, 0x1111, &[tx.sge(0, 8000)], None));
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    assert_eq!(b.wait(1)[0].e.base.length, 8000);
    let remote = g.mr(b.pd, 200 << 10, ALL_PERMS, 0);
    a.post_send(&rdma_wqe(
        SendOpType::RdmaWrite,
        2,
        ah,
        b.qpn,
        0x1111,
        remote.key,
        remote.iova,
        tx.sge(0, 200 << 10),
        None,
    ));
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    assert!(g.ram.get(remote.gpa, 200 << 10) == vec![0x5a; 200 << 10]);
    drop(f);
    drop(g);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dma_outside_guest_ram_fails_the_work_request_not_the_model() {
    let (mut f, mut g) = pair(test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    let local = f.mr(a.pd, 4096, ALL_PERMS, 1);
    let rx_ok = g.mr(b.pd, 4096, ALL_PERMS, 0);
    // Registered while in RAM, then the memory goes away: the last
    // allocations of both fakes are these buffers.
    let remote = g.mr(b.pd, 4096, ALL_PERMS, 0);
    let rx_gone = g.mr(b.pd, 4096, ALL_PERMS, 0);
    let gone = f.mr(a.pd, 4096, ALL_PERMS, 0);
    f.ram.truncate((gone.gpa - BASE) as usize);
    g.ram.truncate((remote.gpa - BASE) as usize);
    let w = |op, id, l: (u64, u32, u32)| {
        rdma_wqe(op, id, ah, b.qpn, 0x1111, remote.key, remote.iova, l, None)
    };
    a.post_send(&w(SendOpType::RdmaWrite, 1, local.sge(0, 64)));
    assert_eq!(a.wait(1)[0].status(), S::RemoteErrorBadAddress);
    a.post_send(&w(SendOpType::RdmaRead, 2, local.sge(0, 64)));
    assert_eq!(a.wait(1)[0].status(), S::RemoteErrorBadAddress);
    a.post_send(&send_wqe(3, ah, b.qpn, 0x1111, &[gone.sge(0, 64)], None));
    assert_eq!(a.wait(1)[0].status(), S::LocalErrorQpInternalError);
    assert!(!f.dev.is_fatal() && !g.dev.is_fatal());
    assert!(f.dev.counters().dma_errors > 0 && g.dev.counters().dma_errors > 0);
    // A receive buffer that is gone fails that receive only.
    b.post_recv(1, &[rx_gone.sge(0, 64)]);
    a.post_send(&send_wqe(4, ah, b.qpn, 0x1111, &[local.sge(0, 8)], None));
    assert_eq!(a.wait(1)[0].status(), S::RemoteErrorAbort);
    assert_eq!(b.wait(1)[0].status(), S::LocalErrorQpInternalError);
    // And everything else still works.
    b.post_recv(2, &[rx_ok.sge(0, 64)]);
    a.post_send(&send_wqe(5, ah, b.qpn, 0x1111, &[local.sge(0, 8)], None));
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    assert_eq!(b.wait(1)[0].status(), S::Ok);
}

#[test]
fn network_faults_through_the_control_window() {
    use efa_emu::device::control;
    use efa_emu::transport::PciFunction;
    let mut f = Fake::up(test_config());
    let win =
        |f: &Fake, reg: u64, v: u32| f.dev.bar_write(0, control::BASE + reg, &v.to_le_bytes());
    let mut a = f.ep(EpOpts::ud());
    let mut b = f.ep(EpOpts::ud());
    let ah = f.ah(a.pd, gid(&f));
    let rx = f.mr(b.pd, 4096, ALL_PERMS, 0);
    win(&f, control::NET_LOSS_PPM, 2_000_000);
    win(&f, control::NET_DELAY_US, 500);
    assert_eq!(
        f.mmio(control::BASE + control::NET_LOSS_PPM),
        1_000_000,
        "at most all"
    );
    assert_eq!(f.mmio(control::BASE + control::NET_DELAY_US), 500);
    b.post_recv(1, &[rx.sge(0, 64)]);
    a.post_send(&inline_wqe(1, ah, b.qpn, 0x1111, b"lost", 64));
    a.wait(1);
    b.quiet(Duration::from_millis(20));
    assert_eq!(f.mmio(control::BASE + control::NET_DROPPED), 1);
    win(&f, control::COMMAND, control::CMD_CLEAR_INJECT);
    assert_eq!(f.dev.port().faults(), NetFaults::default(), "disarmed");
    a.post_send(&inline_wqe(2, ah, b.qpn, 0x1111, b"fine", 64));
    assert_eq!(b.wait(1)[0].req_id(), 1);
    // Every datagram twice, and held back 1 ms.
    win(&f, control::NET_DUP_PPM, 1_000_000);
    win(&f, control::NET_REORDER_PPM, 3_000_000);
    assert_eq!(
        (
            f.mmio(control::BASE + control::NET_DUP_PPM),
            f.mmio(control::BASE + control::NET_REORDER_PPM)
        ),
        (1_000_000, 1_000_000)
    );
    for i in 2..4 {
        b.post_recv(i, &[rx.sge(0, 64)]);
    }
    a.post_send(&inline_wqe(3, ah, b.qpn, 0x1111, b"twice", 64));
    a.wait(1);
    let got = b.wait(2);
    assert_eq!(
        (got[0].req_id(), got[1].req_id()),
        (2, 3),
        "one datagram, twice"
    );
    win(&f, control::COMMAND, control::CMD_CLEAR_INJECT);
    assert_eq!(f.dev.port().faults(), NetFaults::default(), "disarmed");
}

/// An event counter of `f` in UAR `uar`, attached to `qp` for `events`;
/// returns where its value lives.
fn counter(f: &mut Fake, uar: u16, qp: u16, events: u32) -> u64 {
    let at = f.alloc(8, 8);
    let h = f
        .cmd::<CreateEventCounterResp>(
            AdminOpcode::CreateEventCounter,
            0,
            &CreateEventCounterCmd {
                uar,
                reserved: 0,
                paddr: at,
            },
        )
        .unwrap()
        .cntr_handle;
    let mut c = AttachDetachEventCounterCmd::ZERO;
    c.cntr_handle = h;
    c.attach_type = EventCounterAttachType::QpEvents.raw();
    c.set_qp_events(&EventCounterAttachQpEvents {
        qp_handle: qp.into(),
        events,
    });
    f.cmd::<AttachDetachEventCounterResp>(AdminOpcode::AttachEventCounter, 0, &c)
        .unwrap();
    at
}

#[test]
fn event_counters_count_completions_and_remote_rdma() {
    let (mut f, mut g) = pair(test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    use QueueAttr2 as E;
    let sends = counter(&mut f, a.uar, a.qpn, E::SEND_COMP.mask());
    let errors = counter(&mut f, a.uar, a.qpn, E::SEND_COMP_ERR.mask());
    let rdma = counter(
        &mut f,
        a.uar,
        a.qpn,
        E::READ_COMP.mask() | E::WRITE_COMP.mask(),
    );
    let recvs = counter(&mut g, b.uar, b.qpn, E::RECV_COMP.mask());
    let remote = counter(
        &mut g,
        b.uar,
        b.qpn,
        E::REMOTE_READ_COMP.mask() | E::REMOTE_WRITE_COMP.mask(),
    );
    const N: u64 = 150 << 10;
    let local = f.mr(a.pd, N, ALL_PERMS, 1);
    let mem = g.mr(b.pd, N, ALL_PERMS, 2);
    for i in 0..2 {
        b.post_recv(i, &[mem.sge(0, 64)]);
        a.post_send(&send_wqe(i, ah, b.qpn, 0x1111, &[local.sge(0, 8)], None));
    }
    a.post_send(&send_wqe(2, ah, b.qpn, 0x1111, &[(0, 8, 0xbad)], None));
    for (id, op) in [(3, SendOpType::RdmaRead), (4, SendOpType::RdmaWrite)] {
        let w = rdma_wqe(
            op,
            id,
            ah,
            b.qpn,
            0x1111,
            mem.key,
            mem.iova,
            local.sge(0, N as u32),
            None,
        );
        a.post_send(&w);
    }
    a.wait(5);
    b.wait(2);
    assert_eq!(f.ram.u64(sends), 2);
    assert_eq!(f.ram.u64(errors), 1);
    assert_eq!(f.ram.u64(rdma), 2, "one per WQE, not per segment");
    assert_eq!(g.ram.u64(recvs), 2);
    assert_eq!(g.ram.u64(remote), 2, "one per remote WQE, not per segment");
}

#[test]
fn sqd_holds_new_work_until_rts() {
    let mut f = Fake::up(test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&f));
    let rx = f.mr(b.pd, 4096, ALL_PERMS, 0);
    b.post_recv(1, &[rx.sge(0, 64)]);
    f.set_state(a.qpn.into(), QpState::Sqd).unwrap();
    a.post_send(&inline_wqe(1, ah, b.qpn, 0x1111, b"held", 64));
    a.quiet(Duration::from_millis(30));
    assert_eq!(f.query(a.qpn.into()).unwrap().sq_draining, 0);
    f.set_state(a.qpn.into(), QpState::Rts).unwrap();
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    assert_eq!(b.wait(1)[0].req_id(), 1);
}

#[test]
fn srd_rdma_and_ud_over_the_udp_fabric_under_loss_duplicates_and_reordering() {
    use efa_emu::device::fabric::auth::UDP_SEGMENT;
    // Two devices, each with a fabric of its own, as in two processes.
    let [ca, mut cb] = udp_pair("[::1]", 19, 0x42, 0x33).map(|mut c| {
        c.net_faults = NetFaults {
            loss_ppm: 100_000,
            reorder_ppm: 100_000,
            dup_ppm: 100_000,
            ..Default::default()
        };
        c
    });
    // The UD datagrams to b lose and duplicate nothing: what arrives is
    // compared one by one below.
    cb.net_faults = NetFaults {
        loss_ppm: 100_000,
        reorder_ppm: 100_000,
        ..Default::default()
    };
    let health = efa_emu::health::Health::new();
    cb.health = health.clone();
    let mut f = Fake::up(ca);
    let mut g = Fake::up(cb);
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    let rx = g.mr(b.pd, 64 * 4096, ALL_PERMS, 0);
    let tx = f.mr(a.pd, 1 << 20, ALL_PERMS, 0);
    let pattern: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4093) as u8).collect();
    f.ram.put(tx.gpa, &pattern);
    const N: u16 = 40;
    for i in 0..N {
        b.post_recv(i, &[rx.sge(u64::from(i) * 4096, 4096)]);
        a.post_send(&send_wqe(
            i,
            ah,
            b.qpn,
            0x1111,
            &[tx.sge(u64::from(i) * 4000, 4000)],
            Some(u32::from(i)),
        ));
    }
    assert!(a
        .wait_for(N.into(), Duration::from_secs(30))
        .iter()
        .all(|c| c.status() == S::Ok));
    let got = b.wait_for(N.into(), Duration::from_secs(30));
    let mut seen = HashSet::new();
    for c in &got {
        assert_eq!((c.status(), c.e.base.length), (S::Ok, 4000));
        // Unordered: the immediate says which message a receive got.
        let (slot, i) = (u64::from(c.req_id()), c.e.base.imm as usize);
        assert!(seen.insert(i), "message {i} twice");
        assert!(g.ram.get(rx.gpa + slot * 4096, 4000) == pattern[i * 4000..][..4000]);
    }
    // A 1 MiB write and read: segments of UDP_SEGMENT.
    let remote = g.mr(b.pd, 1 << 20, ALL_PERMS, 0);
    let w = |op, id, l| rdma_wqe(op, id, ah, b.qpn, 0x1111, remote.key, remote.iova, l, None);
    a.post_send(&w(SendOpType::RdmaWrite, 100, tx.sge(0, 1 << 20)));
    assert_eq!(a.wait_for(1, Duration::from_secs(30))[0].status(), S::Ok);
    assert!(g.ram.get(remote.gpa, 1 << 20) == pattern);
    let back = f.mr(a.pd, 1 << 20, ALL_PERMS, 0);
    a.post_send(&w(SendOpType::RdmaRead, 101, back.sge(0, 1 << 20)));
    assert_eq!(a.wait_for(1, Duration::from_secs(30))[0].status(), S::Ok);
    assert!(f.ram.get(back.gpa, 1 << 20) == pattern);
    let n = f.stats(GetStatsType::Network, None).network_stats();
    assert!(n.retrans_pkts > 0, "loss was recovered from: {n:?}");
    let d = g.stats(GetStatsType::Basic, None).basic_stats();
    assert!(
        d.rx_bytes < 2 * (3 << 20) && d.rx_pkts > (2 << 20) / UDP_SEGMENT as u64,
        "{d:?}"
    );
    // UD: what arrives is whole and once, and what does not the port
    // dropped. At 10% loss all 60 arrived in one run in about 550 (a
    // make test's); at 30% that is one in 10^9.
    let port = g.dev.port();
    port.set_faults(NetFaults {
        loss_ppm: 300_000,
        reorder_ppm: 100_000,
        ..Default::default()
    });
    let dropped = port.dropped();
    let mut ua = f.ep_in(a.pd, EpOpts::ud());
    let mut ub = g.ep(EpOpts::ud());
    let uah = ah;
    let urx = g.mr(ub.pd, 64 * 4096, ALL_PERMS, 0);
    for i in 0..60 {
        ub.post_recv(i, &[urx.sge(u64::from(i) * 4096, 4096)]);
    }
    for i in 0..60u16 {
        ua.post_send(&send_wqe(
            i,
            uah,
            ub.qpn,
            0x1111,
            &[tx.sge(u64::from(i) * 1000, 1000)],
            Some(u32::from(i)),
        ));
        assert_eq!(ua.wait(1)[0].status(), S::Ok);
    }
    let mut got = Vec::new();
    let t = std::time::Instant::now();
    let lost = || (port.dropped() - dropped) as usize;
    while got.len() + lost() < 60 && t.elapsed() < Duration::from_secs(10) {
        got.extend(ub.poll());
        std::thread::sleep(Duration::from_millis(1));
    }
    // Whatever was still on its way would show here.
    std::thread::sleep(Duration::from_millis(20));
    got.extend(ub.poll());
    assert_eq!(got.len() + lost(), 60, "{} arrived", got.len());
    assert!(
        got.len() > 15 && got.len() < 60,
        "{} of 60 arrived",
        got.len()
    );
    let mut seen = HashSet::new();
    for c in &got {
        let (slot, imm) = (u64::from(c.req_id()), c.e.base.imm);
        assert!(seen.insert(imm), "datagram {imm} twice");
        let at = urx.gpa + slot * 4096 + 40;
        assert!(g.ram.get(at, 1000) == pattern[imm as usize * 1000..][..1000]);
    }
    let stats = g.dev.fabric().udp_stats().unwrap();
    assert!(stats.accepted() > 0);
    assert_eq!(health.get(efa_emu::health::Class::FabricRejected), 0);
}

#[test]
fn a_buffer_deregistered_while_its_packet_is_in_flight_is_never_read() {
    // In one process a packet refers to the sender's buffer, which the
    // receiver copies from when it delivers: by then the guest may have
    // deregistered it. Nothing of it may arrive, and the WQE fails.
    let (mut f, mut g) = pair(test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    let q = 0x1111;
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    let remote = g.mr(b.pd, 4096, ALL_PERMS, 0);
    let live = f.mr(a.pd, 4096, ALL_PERMS, 0x77);
    b.post_recv(1, &[rx.sge(0, 4096)]);
    let port = g.dev.port();
    for (round, op) in [SendOpType::Send, SendOpType::RdmaWrite]
        .into_iter()
        .enumerate()
    {
        let tx = f.mr(a.pd, 4096, ALL_PERMS, 0xaa);
        let id = round as u16 + 1;
        let w = match op {
            SendOpType::Send => send_wqe(id, ah, b.qpn, q, &[tx.sge(0, 1000)], None),
            _ => rdma_wqe(
                op,
                id,
                ah,
                b.qpn,
                q,
                remote.key,
                remote.iova,
                tx.sge(0, 1000),
                None,
            ),
        };
        // Held in flight: what reaches the receiver is lost, and the
        // sender keeps the packet (its reference) to retransmit.
        let lost = port.dropped();
        port.set_faults(NetFaults {
            loss_ppm: 1_000_000,
            ..Default::default()
        });
        a.post_send(&w);
        let t = std::time::Instant::now();
        while port.dropped() == lost {
            assert!(t.elapsed() < PATIENCE, "the packet never left");
            std::thread::sleep(Duration::from_micros(100));
        }
        f.cmd::<DeregMrResp>(AdminOpcode::DeregMr, 0, &DeregMrCmd { l_key: tx.key })
            .unwrap();
        // Scribbled over, as memory given to someone else would be.
        f.ram.put(tx.gpa, &[0xee; 1000]);
        port.set_faults(NetFaults::default());
        // The retransmission arrives and is refused, not delivered.
        let c = a.wait(1);
        assert_eq!(
            (c[0].req_id(), c[0].status()),
            (id, S::LocalErrorInvalidLkey)
        );
        assert!(port.dropped() > lost);
        b.quiet(Duration::from_millis(20));
        assert_eq!(g.ram.get(rx.gpa, 4096), vec![0; 4096], "{op:?}");
        assert_eq!(g.ram.get(remote.gpa, 4096), vec![0; 4096], "{op:?}");
    }
    assert!(!f.dev.is_fatal() && !g.dev.is_fatal());
    // The receive was not taken: the next message lands in it.
    a.post_send(&send_wqe(9, ah, b.qpn, q, &[live.sge(0, 100)], None));
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    let r = b.wait(1);
    assert_eq!((r[0].req_id(), r[0].status()), (1, S::Ok));
    assert_eq!(g.ram.get(rx.gpa, 101), [&[0x77; 100][..], &[0]].concat());
}

#[test]
fn the_data_path_runs_on_the_cpus_it_is_given() {
    let last = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    let mut c = test_config();
    // A name no other test's device has: the tests of this file run in
    // one process.
    c.index = 4321;
    c.data_cpus = vec![last];
    let _f = Fake::up(c);
    let allowed = || {
        std::fs::read_dir("/proc/self/task").unwrap().find_map(|t| {
            let t = t.unwrap().path();
            let comm = std::fs::read_to_string(t.join("comm")).ok()?;
            (comm.trim() == "efa4321-data").then(|| {
                let status = std::fs::read_to_string(t.join("status")).unwrap();
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .expect("Cpus_allowed_list")
                    .trim()
                    .to_string()
            })
        })
    };
    // The thread pins itself as it starts.
    let t = std::time::Instant::now();
    while allowed().as_deref() != Some(&last.to_string()) {
        assert!(t.elapsed() < PATIENCE, "{:?}, not CPU {last}", allowed());
        std::thread::sleep(Duration::from_millis(5));
    }
}
