//! Payload copies per byte between two devices of one process
//! (`efa_emu::copycount`): one for an SRD send, an RDMA write and an RDMA
//! read, straight from the sender's guest memory into the receiver's;
//! two for a UD send, gathered as it leaves (it completes then).
//!
//! Between two fabrics joined by Unix sockets, as two efa-emu processes
//! are, the same once each offered its guest memory to the other: the
//! packets carry descriptors, and the receiver copies from the sender's
//! memfd.
//!
//! The count is the process's, so this file holds one test, and it runs
//! only where the count is kept: `--features copy-count` (tools/cargo-check
//! runs it so).

mod support;

use efa_hw::io::*;
use support::dp::*;
use support::*;

/// Payload bytes copied while `f` runs.
fn copies(f: impl FnOnce()) -> u64 {
    let before = efa_emu::copycount::total().expect("built with --features copy-count");
    f();
    efa_emu::copycount::total().unwrap() - before
}

#[test]
#[cfg_attr(
    not(feature = "copy-count"),
    ignore = "copies are counted only with --features copy-count"
)]
fn one_copy_per_byte_between_two_devices_of_one_process_and_of_two() {
    let (f, g) = pair(test_config(), test_config());
    one_copy_per_byte(f, g, false);
    let (f, g) = pair_over_sockets("copies", test_config(), test_config());
    one_copy_per_byte(f, g, true);
}

fn one_copy_per_byte(mut f: Fake, mut g: Fake, sockets: bool) {
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, g.dev.config().gid);
    const Q: u32 = 0x1111;
    const SEND: u32 = 8000;
    const RDMA: u32 = 200 << 10;
    // Scattered pages on both sides, as a guest's are.
    let tx = f.mr_scattered(a.pd, 256 << 10, ALL_PERMS, 0);
    let rx = g.mr_scattered(b.pd, 256 << 10, ALL_PERMS, 0);
    let mut rng = Rng(0x1234_5678);
    let pattern: Vec<u8> = (0..RDMA).map(|_| rng.next() as u8).collect();
    // Page `i` of an `mr_scattered` buffer lies `i` pages below its first.
    let put = |fake: &Fake, buf: &Buf, data: &[u8]| {
        for (i, chunk) in data.chunks(4096).enumerate() {
            fake.ram.put(buf.gpa - i as u64 * 4096, chunk);
        }
    };
    let get = |fake: &Fake, buf: &Buf, len: usize| {
        let mut v = Vec::new();
        for i in 0..len.div_ceil(4096) {
            let n = (len - i * 4096).min(4096);
            v.extend(fake.ram.get(buf.gpa - i as u64 * 4096, n));
        }
        v
    };

    if sockets {
        // The first packets go as bytes while the offers are answered;
        // afterwards everything goes as descriptors (both ways: a read's
        // answer refers to the responder's memory).
        for i in 0..20u16 {
            b.post_recv(100 + i, &[rx.sge(0, 64)]);
            a.post_send(&send_wqe(100 + i, ah, b.qpn, Q, &[tx.sge(0, 64)], None));
            assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
            assert_eq!(b.wait(1)[0].status(), CompStatus::Ok);
            a.post_send(&rdma_wqe(
                SendOpType::RdmaRead,
                200 + i,
                ah,
                b.qpn,
                Q,
                rx.key,
                rx.iova,
                tx.sge(0, 64),
                None,
            ));
            assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    // An SRD send of two SGEs.
    put(&f, &tx, &pattern);
    b.post_recv(1, &[rx.sge(0, SEND)]);
    let n = copies(|| {
        a.post_send(&send_wqe(
            1,
            ah,
            b.qpn,
            Q,
            &[tx.sge(0, 5000), tx.sge(5000, SEND - 5000)],
            None,
        ));
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
        assert_eq!(b.wait(1)[0].status(), CompStatus::Ok);
    });
    assert_eq!(get(&g, &rx, SEND as usize), pattern[..SEND as usize]);
    assert_eq!(
        n,
        u64::from(SEND),
        "SRD send: copies of {SEND} bytes (sockets: {sockets})"
    );

    // An RDMA write of several segments.
    let n = copies(|| {
        a.post_send(&rdma_wqe(
            SendOpType::RdmaWrite,
            2,
            ah,
            b.qpn,
            Q,
            rx.key,
            rx.iova,
            tx.sge(0, RDMA),
            None,
        ));
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
    });
    assert!(get(&g, &rx, RDMA as usize) == pattern);
    assert_eq!(
        n,
        u64::from(RDMA),
        "RDMA write: copies of {RDMA} bytes (sockets: {sockets})"
    );

    // An RDMA read of several segments, back into a cleared buffer.
    put(&f, &tx, &vec![0; RDMA as usize]);
    let n = copies(|| {
        a.post_send(&rdma_wqe(
            SendOpType::RdmaRead,
            3,
            ah,
            b.qpn,
            Q,
            rx.key,
            rx.iova,
            tx.sge(0, RDMA),
            None,
        ));
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
    });
    assert!(get(&f, &tx, RDMA as usize) == pattern);
    assert_eq!(
        n,
        u64::from(RDMA),
        "RDMA read: copies of {RDMA} bytes (sockets: {sockets})"
    );

    // A UD send completes as it leaves: gathered then, scattered later.
    let mut u = f.ep(EpOpts::ud());
    let mut v = g.ep(EpOpts::ud());
    let ah_u = f.ah(u.pd, g.dev.config().gid);
    let utx = f.mr(u.pd, 4096, ALL_PERMS, 0x42);
    let urx = g.mr(v.pd, 4096, ALL_PERMS, 0);
    v.post_recv(1, &[urx.sge(0, 4096)]);
    let n = copies(|| {
        u.post_send(&send_wqe(1, ah_u, v.qpn, Q, &[utx.sge(0, 1000)], None));
        u.wait(1);
        assert_eq!(v.wait(1)[0].status(), CompStatus::Ok);
    });
    assert_eq!(
        g.ram.get(urx.gpa + RX_UD_GRH_SIZE as u64, 1000),
        vec![0x42; 1000]
    );
    // Over sockets UD payloads are bytes: gathered, the kernel's two copies,
    // the decode and the scatter.
    let want = if sockets { 6000 } else { 2000 };
    assert_eq!(
        n, want,
        "UD send: copies of 1000 bytes (sockets: {sockets})"
    );
}
