//! Guest memory shared between fabrics joined by Unix sockets, as between
//! two efa-emu processes (`efa_emu::device::fabric::share`): what a
//! receiver refuses, and DEREG_MR against a peer copying.
//!
//! Two fabrics of one test process are two peers as far as the sockets
//! go: each offers its guest memory to the other over them, with
//! `SCM_RIGHTS`, and maps what it is offered again. The test process also
//! plays a peer itself, by hand, to hold a pin as long as it likes.

mod support;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant};

use efa_emu::device::fabric::share::{Control, Desc, PinTable};
use efa_emu::device::fabric::{socket_path, Body, Data, Packet};
use efa_emu::health::Class;
use efa_hw::admin::*;
use efa_hw::io::*;
use support::dp::*;
use support::*;

const Q: u32 = 0x1111;

fn rejected(f: &Fake) -> u64 {
    f.dev.config().health.get(Class::FabricRejected)
}

/// SRD sends of `len` bytes from `a` to `b` until the offers were
/// answered (a few round trips), each checked.
fn warm_up(a: &mut Ep, b: &mut Ep, ah: u16, tx: &Buf, rx: &Buf, f: &Fake, g: &Fake) {
    for i in 0..10u16 {
        f.ram.put(tx.gpa, &[i as u8 + 1; 64]);
        b.post_recv(500 + i, &[rx.sge(0, 64)]);
        a.post_send(&send_wqe(500 + i, ah, b.qpn, Q, &[tx.sge(0, 64)], None));
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
        assert_eq!(b.wait(1)[0].status(), CompStatus::Ok);
        assert_eq!(g.ram.get(rx.gpa, 64), vec![i as u8 + 1; 64]);
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn memory_that_is_not_sealed_is_refused_and_the_bytes_go() {
    let (mut f, mut g) = pair_over_sockets_with(
        "share-unsealed",
        test_config(),
        test_config(),
        Ram::unsealed(RAM_SIZE),
    );
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, g.dev.config().gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0);
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    assert_eq!(rejected(&g), 0);
    warm_up(&mut a, &mut b, ah, &tx, &rx, &f, &g);
    // Offered once, refused once: the sender is told nothing and goes on
    // sending bytes, which arrived above.
    assert_eq!(rejected(&g), 1, "the offer of unsealed memory is refused");
    assert_eq!(rejected(&f), 0, "the other way the memory is sealed");
}

#[test]
fn a_descriptor_outside_the_offer_is_dropped_and_counted() {
    let (mut f, mut g) = pair_over_sockets("share-range", test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, g.dev.config().gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0);
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    warm_up(&mut a, &mut b, ah, &tx, &rx, &f, &g);
    assert_eq!(rejected(&g), 0);
    // A send in f's name (this process is f's: the same pid) with a
    // descriptor past the end of f's guest RAM, the region it offered.
    let (src_qpn, dst_qpn) = (a.qpn, b.qpn);
    let forged = |offset: u64| {
        let p = Packet {
            src_gid: f.dev.config().gid,
            dst_gid: g.dev.config().gid,
            src_qpn,
            dst_qpn,
            body: Body::Send {
                seq: 0x7777_0000,
                qkey: Q,
                imm: None,
                data: Data::default(),
            },
        };
        let mut bytes = Vec::new();
        let d = Desc {
            region: 0,
            offset,
            len: 64,
            slot: 0,
            gen: 1,
        };
        p.encode_described(&mut bytes, &[d]);
        bytes
    };
    b.post_recv(1, &[rx.sge(0, 64)]);
    let sock = UnixDatagram::unbound().unwrap();
    let to = socket_path(&sockets_dir("share-range"), &g.dev.config().gid);
    sock.send_to(&forged(RAM_SIZE as u64 - 32), &to).unwrap();
    let t = Instant::now();
    while rejected(&g) == 0 {
        assert!(t.elapsed() < PATIENCE, "the packet was not refused");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(rejected(&g), 1);
    b.quiet(Duration::from_millis(100));
    assert_eq!(b.unpolled(), 0, "nothing delivered");
}

/// A peer played by hand: a socket at `gid` in `dir` that receives with
/// descriptors.
struct HandPeer {
    sock: UnixDatagram,
    gid: [u8; 16],
    dir: std::path::PathBuf,
}

impl HandPeer {
    fn new(dir: &Path, gid: [u8; 16]) -> Self {
        let path = socket_path(dir, &gid);
        let _ = std::fs::remove_file(&path);
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(PATIENCE)).unwrap();
        Self {
            sock,
            gid,
            dir: dir.to_path_buf(),
        }
    }

    /// One datagram and the descriptors it carried.
    fn recv(&self) -> (Vec<u8>, Vec<OwnedFd>) {
        let mut buf = vec![0u8; 70000];
        let mut control = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain data; zeroed is a valid value.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_control = control.as_mut_ptr().cast();
        m.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: `m` points at a live iovec and control buffer of the
        // lengths it says.
        let n = unsafe { libc::recvmsg(self.sock.as_raw_fd(), &mut m, 0) };
        assert!(n >= 0, "recvmsg: {}", std::io::Error::last_os_error());
        let mut fds = Vec::new();
        // SAFETY: the CMSG macros walk what the kernel filled in; every
        // descriptor it installed is owned from here on.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&m);
            while !c.is_null() {
                if (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c);
                    let k = ((*c).cmsg_len as usize - (data as usize - c as usize)) / 4;
                    for i in 0..k {
                        let fd = std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                c = libc::CMSG_NXTHDR(&m, c);
            }
        }
        buf.truncate(n as usize);
        (buf, fds)
    }

    fn send(&self, to: &[u8; 16], bytes: &[u8]) {
        self.sock
            .send_to(bytes, socket_path(&self.dir, to))
            .unwrap();
    }

    /// Serves one request of an SRD send: accepts offers, answers it;
    /// returns its descriptors, if it had any, and the pin table offered.
    fn serve(&self, pins: &mut Option<OwnedFd>) -> Option<Vec<Desc>> {
        loop {
            let (bytes, mut fds) = self.recv();
            if let Some(Control::Offer { from, id, .. }) = Control::decode(&bytes) {
                assert_eq!(fds.len(), 2, "a memfd and a pin table");
                *pins = fds.pop();
                let ok = Control::Accept {
                    from: self.gid,
                    to: from,
                    id,
                };
                self.send(&from, &ok.encode());
                continue;
            }
            let mut descs = None;
            let p = Packet::decode_with(&bytes, &mut |d, _| {
                descs = Some(d.to_vec());
                Some(Data::default())
            })
            .expect("a packet");
            let Body::Send { seq, .. } = p.body else {
                panic!("{p:?}")
            };
            let answer = Packet {
                src_gid: p.dst_gid,
                dst_gid: p.src_gid,
                src_qpn: p.dst_qpn,
                dst_qpn: p.src_qpn,
                body: Body::Resp {
                    seq,
                    status: 0,
                    data: Data::default(),
                },
            };
            self.send(&p.src_gid, &answer.encode());
            return descs;
        }
    }
}

#[test]
fn dereg_mr_waits_for_a_peer_copying_and_a_receive_after_it_is_refused() {
    let (mut f, mut g) = pair_over_sockets("share-dereg", test_config(), test_config());
    let dir = sockets_dir("share-dereg");
    let peer = HandPeer::new(&dir, [0x77; 16]);
    let mut a = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, peer.gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0x5a);
    let mut pins = None;
    let mut descs = None;
    for i in 0..10 {
        a.post_send(&send_wqe(i, ah, 9, Q, &[tx.sge(0, 1000)], None));
        descs = peer.serve(&mut pins);
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
        if descs.is_some() {
            break;
        }
    }
    let descs = descs.expect("descriptors once the offer was accepted");
    let table = PinTable::open(pins.expect("a pin table")).unwrap();
    let d = descs[0];
    assert_eq!(descs.iter().map(|d| d.len).sum::<u32>(), 1000);
    // The peer copies (holds a pin) while DEREG_MR comes.
    let pin = table.pin(d.slot.into(), d.gen).expect("pinned");
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let f = &mut f;
        s.spawn(move || {
            let r = f.cmd::<DeregMrResp>(AdminOpcode::DeregMr, 0, &DeregMrCmd { l_key: tx.key });
            done_tx.send(r.is_ok()).unwrap();
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            done.try_recv().is_err(),
            "DEREG_MR waits for the peer's copy"
        );
        drop(pin);
        assert!(done.recv_timeout(PATIENCE).unwrap(), "and then completes");
    });
    assert!(
        table.pin(d.slot.into(), d.gen).is_none(),
        "no pin after DEREG_MR"
    );

    // A packet on its way when DEREG_MR comes: its receiver, a device,
    // finds the MR deregistered and answers INVALID_LKEY.
    let mut b = g.ep(EpOpts::srd());
    let ah_g = f.ah(a.pd, g.dev.config().gid);
    let tx2 = f.mr(a.pd, 4096, ALL_PERMS, 0);
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    warm_up(&mut a, &mut b, ah_g, &tx2, &rx, &f, &g);
    let port = g.dev.port();
    port.set_faults(efa_emu::device::fabric::NetFaults {
        delay_us: 500_000,
        ..Default::default()
    });
    b.post_recv(1, &[rx.sge(0, 64)]);
    g.ram.put(rx.gpa, &[0; 64]);
    f.ram.put(tx2.gpa, &[0xab; 64]);
    a.post_send(&send_wqe(77, ah_g, b.qpn, Q, &[tx2.sge(0, 64)], None));
    let t = Instant::now();
    while !port.holds(|p| matches!(&p.body, Body::Send { data, .. } if data.is_remote())) {
        assert!(t.elapsed() < PATIENCE, "the descriptors never arrived");
        std::thread::sleep(Duration::from_micros(200));
    }
    f.cmd::<DeregMrResp>(AdminOpcode::DeregMr, 0, &DeregMrCmd { l_key: tx2.key })
        .unwrap();
    let c = a.wait(1);
    assert_eq!(
        (c[0].req_id(), c[0].status()),
        (77, CompStatus::LocalErrorInvalidLkey)
    );
    assert_eq!(b.unpolled(), 0, "nothing delivered");
    assert_eq!(g.ram.get(rx.gpa, 64), vec![0; 64]);
}
