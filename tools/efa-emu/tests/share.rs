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

use efa_emu::device::fabric::ring::{
    Popped, Pushed, Ring, HEAD, KICK, RING_SLOTS, SLOTS_AT, SLOT_BYTES,
};
use efa_emu::device::fabric::share::{Control, Desc, PinTable, RING_AT, TABLE_BYTES};
use efa_emu::device::fabric::{socket_path, Body, Data, Heard, Packet};
use efa_emu::health::Class;
use efa_emu::shmem::SharedMem;
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
    // Refused (and refused again each time it is offered again, after a
    // second and longer): the sender is told nothing and goes on sending
    // bytes, which arrived above.
    until("the offer of unsealed memory is refused", || {
        rejected(&g) >= 1
    });
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
    /// The ring of the pin table it was offered, and the entries taken:
    /// once it accepted, packets come there.
    ring: std::cell::RefCell<Option<(PinTable, u64)>>,
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
            ring: Default::default(),
        }
    }

    /// The next entry of its ring, if it has one.
    fn pop(&self) -> Option<Vec<u8>> {
        let mut ring = self.ring.borrow_mut();
        let (table, tail) = ring.as_mut()?;
        let mut buf = Vec::new();
        (table.ring().pop(tail, &mut buf) == Popped::Entry).then_some(buf)
    }

    /// The next packet or control message, from its ring or its socket
    /// (kicks, which only wake, skipped), and the descriptors it carried.
    fn recv_any(&self) -> (Vec<u8>, Vec<OwnedFd>) {
        let t = Instant::now();
        loop {
            if let Some(entry) = self.pop() {
                return (entry, Vec::new());
            }
            let mut fd = libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll(2) on one live pollfd of a socket we hold.
            if unsafe { libc::poll(&mut fd, 1, 1) } == 1 {
                let (bytes, fds) = self.recv();
                if bytes != KICK {
                    return (bytes, fds);
                }
            }
            assert!(t.elapsed() < PATIENCE, "nothing arrived");
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
        // lengths it says. Close-on-exec, as a fabric receives: a test
        // looks for pin tables that are not.
        let n = unsafe { libc::recvmsg(self.sock.as_raw_fd(), &mut m, libc::MSG_CMSG_CLOEXEC) };
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

    /// The next packet, from its ring or its socket, offers of the ring
    /// alone (which a port sends a peer it only answers) not taken.
    fn recv_packet(&self) -> Vec<u8> {
        loop {
            let (bytes, _) = self.recv_any();
            if !matches!(Control::decode(&bytes), Some(Control::Ring { .. })) {
                return bytes;
            }
        }
    }

    /// Serves one request of an SRD send: accepts offers, answers it;
    /// returns its descriptors, if it had any, and the pin table offered.
    fn serve(&self, pins: &mut Option<OwnedFd>) -> Option<Vec<Desc>> {
        loop {
            let (bytes, mut fds) = self.recv_any();
            let offer = match Control::decode(&bytes) {
                Some(Control::Offer { from, id, .. }) => {
                    assert_eq!(fds.len(), 2, "a memfd and a pin table");
                    Some((from, id))
                }
                Some(Control::Ring { from, id, .. }) => {
                    assert_eq!(fds.len(), 1, "a pin table alone");
                    Some((from, id))
                }
                _ => None,
            };
            if let Some((from, id)) = offer {
                *pins = fds.pop();
                let mut ring = self.ring.borrow_mut();
                if ring.is_none() {
                    let fd = pins.as_ref().unwrap().try_clone().unwrap();
                    *ring = Some((PinTable::open(fd).unwrap(), 0));
                }
                drop(ring);
                let ok = Control::Accept {
                    from: self.gid,
                    to: from,
                    id,
                };
                self.send(&from, &ok.encode());
                continue;
            }
            if self.answer_probe(&bytes) {
                continue;
            }
            return self.answer(&bytes);
        }
    }

    /// Reads the ring of the pin table `fd` from now on (it accepted by
    /// hand).
    fn take_ring(&self, fd: &OwnedFd) {
        *self.ring.borrow_mut() = Some((PinTable::open(fd.try_clone().unwrap()).unwrap(), 0));
    }

    /// Answers `bytes` if it is a probe, as a process that never heard of
    /// the request does: the requester sends it again.
    fn answer_probe(&self, bytes: &[u8]) -> bool {
        let Some(p) = Packet::decode(bytes) else {
            return false;
        };
        let Body::Probe { seq } = p.body else {
            return false;
        };
        let answer = Packet {
            src_gid: p.dst_gid,
            dst_gid: p.src_gid,
            src_qpn: p.dst_qpn,
            dst_qpn: p.src_qpn,
            body: Body::Heard {
                seq,
                what: Heard::Missing,
                status: 0,
            },
        };
        self.send(&p.src_gid, &answer.encode());
        true
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
    // The offer goes on its own thread: a few round trips, or more on a
    // loaded host.
    let t = Instant::now();
    for i in 0.. {
        a.post_send(&send_wqe(i, ah, 9, Q, &[tx.sge(0, 1000)], None));
        descs = peer.serve(&mut pins);
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
        if descs.is_some() || t.elapsed() > PATIENCE {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
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

// ---------------------------------------------------------------------
// A peer in a process of its own.
//
// The tests above run both fabrics in this process, so every sender has
// its pid. Those below re-execute this test binary for the one test, with
// `PEER` set: the child plays the peer (a device of its own, or an
// attacker by hand), reports on its stdout in lines `peer: ...`, and ends
// when its stdin closes.

/// Set in a child: the test plays its peer's part instead.
const PEER: &str = "EFA_SHARE_TEST_PEER";

fn is_peer() -> bool {
    std::env::var_os(PEER).is_some()
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

fn gid_hex(g: &[u8; 16]) -> String {
    g.iter().map(|b| format!("{b:02x}")).collect()
}

fn gid_var(name: &str) -> [u8; 16] {
    let s = var(name);
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    g
}

/// Says `what` to the parent.
fn tell(what: &str) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    writeln!(o, "peer: {what}").unwrap();
    o.flush().unwrap();
}

/// Until the parent closes our stdin.
fn until_told_to_end() {
    use std::io::Read;
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

/// The child process playing a test's peer; killed if the test ends
/// without [`Peer::end`] (declared after the fabrics, so that it is gone
/// before they are dropped: a receive thread stuck on its socket is let
/// go by its end).
struct Peer {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Peer {
    fn spawn(test: &str, env: &[(&str, String)]) -> Self {
        let mut c = std::process::Command::new(std::env::current_exe().unwrap());
        c.args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(PEER, "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("the peer process");
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        Self { child, out }
    }

    /// Waits for the child to say `what`.
    fn expect(&mut self, what: &str) {
        use std::io::BufRead;
        let want = format!("peer: {what}");
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "the peer ended before it said {what:?}");
            // The harness may have begun the line ("test ... ").
            if line.trim_end().ends_with(&want) {
                return;
            }
        }
    }

    /// The next thing the child says.
    fn next(&mut self) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "the peer ended");
            if let Some((_, what)) = line.trim_end().split_once("peer: ") {
                return what.to_string();
            }
        }
    }

    /// Closes its stdin and waits for it to exit, successfully.
    fn end(mut self) {
        drop(self.child.stdin.take());
        let st = self.child.wait().unwrap();
        assert!(st.success(), "the peer failed: {st}");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A memfd of `len` bytes (sparse) named `name`, sealed against resizing,
/// as an offer must be.
fn sealed_memfd(name: &str, len: u64) -> OwnedFd {
    let cname = std::ffi::CString::new(name).unwrap();
    // SAFETY: memfd_create with a NUL-terminated name and defined flags.
    let fd =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscalls on our descriptor.
    unsafe {
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as i64), 0, "ftruncate");
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
    }
    fd
}

/// Sends `msg` from `sock` to `to` with the descriptors `fds`, waiting for
/// room.
fn send_fds(sock: &UnixDatagram, to: &Path, msg: &[u8], fds: &[std::os::fd::RawFd]) {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, &b) in addr.sun_path.iter_mut().zip(to.as_os_str().as_bytes()) {
        *d = b as libc::c_char;
    }
    let mut control = [0u64; 8];
    let n = std::mem::size_of_val(fds) as u32;
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr().cast_mut().cast(),
        iov_len: msg.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid value.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_name = (&mut addr as *mut libc::sockaddr_un).cast();
    m.msg_namelen = std::mem::size_of::<libc::sockaddr_un>() as _;
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is arithmetic; the header and `n` bytes of
    // descriptors fit the 64-byte control buffer, into which CMSG_FIRSTHDR
    // and CMSG_DATA point; sendmsg reads the live buffers `m` names.
    unsafe {
        m.msg_controllen = libc::CMSG_SPACE(n) as _;
        let c = libc::CMSG_FIRSTHDR(&m);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(n) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), n as usize);
        let r = libc::sendmsg(sock.as_raw_fd(), &m, 0);
        assert!(r >= 0, "sendmsg: {}", std::io::Error::last_os_error());
    }
}

/// Offers `to` the memfd `fd` as region `id` in the name of `from`, with
/// a pin table, from `sock`.
fn offer(sock: &UnixDatagram, dir: &Path, from: [u8; 16], to: [u8; 16], id: u32, fd: &OwnedFd) {
    let len = std::fs::File::from(fd.try_clone().unwrap())
        .metadata()
        .unwrap()
        .len();
    let pins = PinTable::new().unwrap();
    let msg = Control::Offer { from, to, id, len }.encode();
    send_fds(
        sock,
        &socket_path(dir, &to),
        &msg,
        &[fd.as_raw_fd(), pins.fd().as_raw_fd()],
    );
}

/// Fills the queue of the socket at `path` with junk (until it would block).
fn fill_queue(path: &Path) {
    let s = UnixDatagram::unbound().unwrap();
    s.set_nonblocking(true).unwrap();
    while s.send_to(&[0], path).is_ok() {}
}

/// Lines of this process's mappings that name `what`.
fn mappings(what: &str) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains(what))
        .count()
}

/// Waits until `f` holds.
fn until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < PATIENCE, "{what}: not within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The peer's part as a device: guest RAM in a memfd named `$RAM`, at GID
/// `$GID` in `$DIR`, `$COUNT` SRD sends of 64 bytes (`[i + 1; 64]`) to QP
/// `$QPN` at `$TARGET`; then it waits to be told to end.
fn play_device() {
    device_sends();
    tell("sent");
    until_told_to_end();
}

/// [`play_device`]'s sends.
fn device_sends() {
    let mut cfg = test_config();
    cfg.gid = gid_var("GID");
    cfg.index = 9;
    let dir = std::path::PathBuf::from(var("DIR"));
    cfg.fabric = Some(efa_emu::device::fabric::Fabric::with_dir(&dir, cfg.health.clone()).unwrap());
    let mut f = Fake::with_ram(cfg, Ram::named(&var("RAM"), RAM_SIZE));
    f.bring_up();
    let mut a = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid_var("TARGET"));
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0);
    let qpn: u16 = var("QPN").parse().unwrap();
    for i in 0..var("COUNT").parse::<u16>().unwrap() {
        f.ram.put(tx.gpa, &[i as u8 + 1; 64]);
        a.post_send(&send_wqe(i, ah, qpn, Q, &[tx.sge(0, 64)], None));
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `count` receives of 64 bytes at `rx`, filled by [`play_device`].
fn receive_from_peer(b: &mut Ep, g: &Fake, rx: &Buf, count: u16) {
    let c = b.wait(count.into());
    for (i, c) in c.iter().enumerate() {
        assert_eq!(c.status(), CompStatus::Ok, "receive {i}");
    }
    for i in 0..count {
        let got = g.ram.get(rx.gpa + u64::from(i) * 64, 64);
        assert_eq!(got, vec![i as u8 + 1; 64], "message {i}");
    }
}

#[test]
fn a_receiver_lets_go_of_what_a_peer_process_offered_once_it_exits() {
    if is_peer() {
        return play_device();
    }
    let name = "share-exit";
    let (_f, mut g) = pair_over_sockets(name, test_config(), test_config());
    let mut b = g.ep(EpOpts::srd());
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    for i in 0..10u16 {
        b.post_recv(i, &[rx.sge(u64::from(i) * 64, 64)]);
    }
    let ram = format!("efa-peer-ram-exit-{}", std::process::id());
    let peer = Peer::spawn(
        "a_receiver_lets_go_of_what_a_peer_process_offered_once_it_exits",
        &[
            ("DIR", sockets_dir(name).display().to_string()),
            ("GID", gid_hex(&[0x40; 16])),
            ("TARGET", gid_hex(&g.dev.config().gid)),
            ("QPN", b.qpn.to_string()),
            ("COUNT", "10".into()),
            ("RAM", ram.clone()),
        ],
    );
    let mut peer = peer;
    peer.expect("sent");
    receive_from_peer(&mut b, &g, &rx, 10);
    assert_eq!(mappings(&ram), 1, "the peer's guest RAM is mapped here");
    peer.end();
    // Nothing arrives now: the port is idle, and finds the sender gone.
    until("the mapping of an exited peer's memory is dropped", || {
        mappings(&ram) == 0
    });
    assert_eq!(rejected(&g), 0);
}

#[test]
fn descriptors_a_peer_process_sends_arrive_close_on_exec() {
    if is_peer() {
        return play_device();
    }
    let name = "share-cloexec";
    let (_f, mut g) = pair_over_sockets(name, test_config(), test_config());
    let mut b = g.ep(EpOpts::srd());
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    for i in 0..10u16 {
        b.post_recv(i, &[rx.sge(u64::from(i) * 64, 64)]);
    }
    let ram = format!("efa-peer-ram-cloexec-{}", std::process::id());
    let mut peer = Peer::spawn(
        "descriptors_a_peer_process_sends_arrive_close_on_exec",
        &[
            ("DIR", sockets_dir(name).display().to_string()),
            ("GID", gid_hex(&[0x41; 16])),
            ("TARGET", gid_hex(&g.dev.config().gid)),
            ("QPN", b.qpn.to_string()),
            ("COUNT", "10".into()),
            ("RAM", ram.clone()),
        ],
    );
    peer.expect("sent");
    receive_from_peer(&mut b, &g, &rx, 10);
    assert_eq!(mappings(&ram), 1, "the peer's guest RAM is mapped here");
    // The peer's pin table is kept open here (its memfd is mapped and
    // closed at once); every pin table descriptor, ours too, must be
    // close-on-exec, or a child we start would keep it.
    let mut tables = 0;
    for e in std::fs::read_dir("/proc/self/fd").unwrap() {
        let e = e.unwrap();
        let Ok(link) = std::fs::read_link(e.path()) else {
            continue;
        };
        if !link.to_string_lossy().starts_with("/memfd:efa-emu-pins") {
            continue;
        }
        let fd: i32 = e.file_name().to_str().unwrap().parse().unwrap();
        // SAFETY: F_GETFD on a descriptor number; no pointers (one that
        // closed meanwhile answers EBADF, -1).
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 {
            continue;
        }
        assert_ne!(
            flags & libc::FD_CLOEXEC,
            0,
            "pin table fd {fd} is inherited by a child"
        );
        tables += 1;
    }
    assert!(tables >= 1, "the peer's pin table is held here");
    peer.end();
}

/// The peer's part as a receiver that never reads: a socket bound at GID
/// `$GID` in `$DIR`, its queue full, from which it offers `$TARGET` a
/// memfd named `$RAM`.
fn play_stuck_receiver() {
    let dir = std::path::PathBuf::from(var("DIR"));
    let me = gid_var("GID");
    let path = socket_path(&dir, &me);
    let _ = std::fs::remove_file(&path);
    let sock = UnixDatagram::bind(&path).unwrap();
    fill_queue(&path);
    let fd = sealed_memfd(&var("RAM"), 1 << 20);
    offer(&sock, &dir, me, gid_var("TARGET"), 0, &fd);
    tell("offered");
    until_told_to_end();
}

#[test]
fn an_acceptance_to_a_peer_whose_queue_is_full_does_not_stop_the_port() {
    if is_peer() {
        return play_stuck_receiver();
    }
    let name = "share-stuck";
    let (mut f, mut g) = pair_over_sockets(name, test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, g.dev.config().gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0);
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    let ram = format!("efa-stuck-ram-{}", std::process::id());
    let mut peer = Peer::spawn(
        "an_acceptance_to_a_peer_whose_queue_is_full_does_not_stop_the_port",
        &[
            ("DIR", sockets_dir(name).display().to_string()),
            ("GID", gid_hex(&[0x42; 16])),
            ("TARGET", gid_hex(&g.dev.config().gid)),
            ("RAM", ram.clone()),
        ],
    );
    peer.expect("offered");
    // g took the offer, and answered into the peer's full queue.
    until("the stuck peer's offer is mapped", || mappings(&ram) == 1);
    // g's receive thread goes on: packets from f still arrive.
    warm_up(&mut a, &mut b, ah, &tx, &rx, &f, &g);
    assert_eq!(rejected(&g), 0);
    drop(peer);
}

/// The peer's part as an attacker of our uid: offers and acceptances in
/// the names of `$F` (to `$G`) and of `$H` (to `$F`), from a socket bound
/// to no name and from one bound to another GID's name.
fn play_impostor() {
    let dir = std::path::PathBuf::from(var("DIR"));
    let (f, g, h) = (gid_var("F"), gid_var("G"), gid_var("H"));
    let unbound = UnixDatagram::unbound().unwrap();
    let path = socket_path(&dir, &[0x66; 16]);
    let _ = std::fs::remove_file(&path);
    let other = UnixDatagram::bind(&path).unwrap();
    let fd = sealed_memfd("efa-impostor", 1 << 20);
    for s in [&unbound, &other] {
        offer(s, &dir, f, g, 0, &fd);
        let ok = Control::Accept {
            from: h,
            to: f,
            id: 0,
        };
        s.send_to(&ok.encode(), socket_path(&dir, &f)).unwrap();
    }
    tell("forged");
    until_told_to_end();
}

impl HandPeer {
    /// Answers one packet of an SRD send, offers of memory left
    /// unanswered: whether it had descriptors.
    fn serve_refusing(&self) -> bool {
        loop {
            let (bytes, _fds) = self.recv();
            if let Some(Control::Offer { .. }) = Control::decode(&bytes) {
                continue;
            }
            // A probe about an earlier send answered late.
            if self.answer_probe(&bytes) {
                continue;
            }
            return self.answer(&bytes).is_some();
        }
    }

    /// Answers the SRD send `bytes`: its descriptors, if it had any.
    fn answer(&self, bytes: &[u8]) -> Option<Vec<Desc>> {
        let mut descs = None;
        let p = Packet::decode_with(bytes, &mut |d| {
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
        descs
    }
}

#[test]
fn offers_and_acceptances_count_only_from_the_socket_of_the_gid_they_name() {
    if is_peer() {
        return play_impostor();
    }
    let name = "share-impostor";
    let (mut f, mut g) = pair_over_sockets(name, test_config(), test_config());
    let dir = sockets_dir(name);
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, g.dev.config().gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0);
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    // g maps f's memory, and f sends it descriptors.
    warm_up(&mut a, &mut b, ah, &tx, &rx, &f, &g);
    // A peer that never accepts: f offers it memory, and sends it bytes.
    let hand = HandPeer::new(&dir, [0x77; 16]);
    let ah_h = f.ah(a.pd, hand.gid);
    a.post_send(&send_wqe(1, ah_h, 9, Q, &[tx.sge(0, 64)], None));
    assert!(
        !hand.serve_refusing(),
        "bytes to a peer that accepted nothing"
    );
    assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
    assert_eq!((rejected(&f), rejected(&g)), (0, 0));

    let (fg, gg) = (f.dev.config().gid, g.dev.config().gid);
    let mut peer = Peer::spawn(
        "offers_and_acceptances_count_only_from_the_socket_of_the_gid_they_name",
        &[
            ("DIR", dir.display().to_string()),
            ("F", gid_hex(&fg)),
            ("G", gid_hex(&gg)),
            ("H", gid_hex(&hand.gid)),
        ],
    );
    peer.expect("forged");
    // Each forgery is dropped and counted: an offer to g in f's name (it
    // would have dropped what f offered g), an acceptance to f in the
    // hand peer's name (f would have sent it descriptors), twice each.
    // (Asserted last: what a forgery taken would do is the test.)
    let t = Instant::now();
    while (rejected(&f), rejected(&g)) != (2, 2) && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(2));
    }
    // f still sends the hand peer bytes.
    a.post_send(&send_wqe(2, ah_h, 9, Q, &[tx.sge(0, 64)], None));
    assert!(
        !hand.serve_refusing(),
        "still bytes: the acceptances were forged"
    );
    assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
    // And g still has what f offered: f's descriptors are taken.
    warm_up(&mut a, &mut b, ah, &tx, &rx, &f, &g);
    assert_eq!((rejected(&f), rejected(&g)), (2, 2));
    peer.end();
}

#[test]
fn an_offer_not_answered_is_made_again_soon_but_not_at_once() {
    let name = "share-retry";
    let (mut f, _g) = pair_over_sockets(name, test_config(), test_config());
    let hand = HandPeer::new(&sockets_dir(name), [0x79; 16]);
    let mut a = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, hand.gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0x5a);
    a.post_send(&send_wqe(1, ah, 9, Q, &[tx.sge(0, 64)], None));
    // The offer (not answered: lost, say) and the packet, in either order.
    let (mut first, mut answered) = (None, false);
    while first.is_none() || !answered {
        let (bytes, _) = hand.recv();
        match Control::decode(&bytes) {
            Some(Control::Offer { id, .. }) => first = Some((id, Instant::now())),
            // Asked about the send, if it was answered late.
            _ if hand.answer_probe(&bytes) => {}
            _ => answered = hand.answer(&bytes).is_none(),
        }
    }
    assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
    let (id, at) = first.unwrap();
    // Nothing is sent now but the offer again, after a while.
    let (bytes, fds) = hand.recv();
    let Some(Control::Offer {
        from, id: again, ..
    }) = Control::decode(&bytes)
    else {
        panic!("not an offer: {bytes:?}");
    };
    assert_eq!(again, id, "the same memory");
    // An acceptance is lost whenever the offerer's queue is full, as it
    // is at the start of a busy transfer, and every packet goes as bytes
    // until the next offer is taken: that is soon, but not at once.
    let took = at.elapsed();
    assert!(took >= Duration::from_millis(10), "again after {took:?}");
    assert!(
        took < Duration::from_millis(500),
        "again only after {took:?}: the peer's traffic went as bytes meanwhile"
    );
    let ok = Control::Accept {
        from: hand.gid,
        to: from,
        id,
    };
    hand.take_ring(&fds[1]);
    hand.send(&from, &ok.encode());
    // Taken: descriptors go (by the ring in the pin table).
    let mut pins = None;
    let mut descs = None;
    let t = Instant::now();
    for i in 0.. {
        a.post_send(&send_wqe(2 + i, ah, 9, Q, &[tx.sge(0, 64)], None));
        descs = hand.serve(&mut pins);
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
        if descs.is_some() || t.elapsed() > PATIENCE {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        descs.is_some(),
        "descriptors once the offer made again was taken"
    );
}

#[test]
fn a_peer_whose_queue_is_full_does_not_hold_up_the_data_path() {
    let name = "share-full";
    let (mut f, _g) = pair_over_sockets(name, test_config(), test_config());
    let dir = sockets_dir(name);
    // A peer that takes nothing: an offer to it cannot be sent.
    let hand = HandPeer::new(&dir, [0x7a; 16]);
    fill_queue(&socket_path(&dir, &hand.gid));
    let mut a = f.ep(EpOpts::srd());
    let mut b = f.ep(EpOpts::srd());
    let mut c = f.ep_in(a.pd, EpOpts::srd());
    let ah_h = f.ah(a.pd, hand.gid);
    // Loopback: the device's own data path, no socket.
    let ah_f = f.ah(a.pd, f.dev.config().gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0);
    let rx = f.mr(b.pd, 4096, ALL_PERMS, 0);
    // Sends to the stuck peer, each referring to memory to offer it.
    for i in 0..16 {
        c.post_send(&send_wqe(i, ah_h, 9, Q, &[tx.sge(0, 64)], None));
    }
    let t = Instant::now();
    for i in 0..10u16 {
        b.post_recv(i, &[rx.sge(0, 64)]);
        a.post_send(&send_wqe(i, ah_f, b.qpn, Q, &[tx.sge(0, 64)], None));
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
        assert_eq!(b.wait(1)[0].status(), CompStatus::Ok);
    }
    // Ten round trips on one device take milliseconds; an offer sent on
    // the data path waited up to 100 ms for room, for each packet.
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "the data path was held {took:?}"
    );
    drop(hand);
}

#[test]
fn a_peer_whose_queue_is_full_does_not_hold_up_packets_to_other_peers() {
    let name = "share-hol";
    let (mut f, mut g) = pair_over_sockets(name, test_config(), test_config());
    let dir = sockets_dir(name);
    // A peer that takes nothing: every packet to it waits for room.
    let stuck = HandPeer::new(&dir, [0x7b; 16]);
    fill_queue(&socket_path(&dir, &stuck.gid));
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let mut c = f.ep_in(a.pd, EpOpts::srd());
    let ah_s = f.ah(a.pd, stuck.gid);
    let ah_g = f.ah(a.pd, g.dev.config().gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0);
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    for i in 0..16 {
        c.post_send(&send_wqe(i, ah_s, 9, Q, &[tx.sge(0, 64)], None));
    }
    // Round trips to g over the same sockets while they wait: each took
    // a few hundred microseconds here, and waited behind every packet
    // to the stuck peer (100 ms each) on one transmit thread.
    let t = Instant::now();
    for i in 0..10u16 {
        g.ram.put(rx.gpa, &[0; 64]);
        f.ram.put(tx.gpa, &[i as u8 + 1; 64]);
        b.post_recv(i, &[rx.sge(0, 64)]);
        a.post_send(&send_wqe(i, ah_g, b.qpn, Q, &[tx.sge(0, 64)], None));
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
        assert_eq!(b.wait(1)[0].status(), CompStatus::Ok);
        assert_eq!(g.ram.get(rx.gpa, 64), vec![i as u8 + 1; 64]);
    }
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(500),
        "ten round trips to g took {took:?} beside a stuck peer"
    );
    // What waits for the stuck peer is lost, one each 100 ms it reads
    // nothing, and counted.
    until("packets to the stuck peer are let go", || {
        f.dev.fabric().transport_lost() >= 3
    });
    drop(stuck);
}

/// A TCP socket whose close waits (`SO_LINGER`, 30 s) for data that cannot
/// leave: its peer, in `listener`'s queue, never reads. A stand-in for a
/// FUSE file whose daemon does not answer FLUSH.
fn lingering_socket(listener: &std::net::TcpListener) -> std::net::TcpStream {
    use std::io::Write;
    let c = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    c.set_nonblocking(true).unwrap();
    let chunk = vec![0u8; 1 << 16];
    while (&c).write(&chunk).is_ok() {}
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 30,
    };
    // SAFETY: setsockopt on our socket with a live linger and its size.
    let r = unsafe {
        libc::setsockopt(
            c.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_LINGER");
    c
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn descriptors_whose_close_waits_do_not_stop_the_receiver() {
    let name = "share-closer";
    let (mut f, mut g) = pair_over_sockets(name, test_config(), test_config());
    let to = socket_path(&sockets_dir(name), &g.dev.config().gid);
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, g.dev.config().gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0);
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    let sock = UnixDatagram::unbound().unwrap();
    let packet = Packet {
        src_gid: [0x99; 16],
        dst_gid: g.dev.config().gid,
        src_qpn: 1,
        dst_qpn: 0x3ff,
        body: Body::Send {
            seq: 1,
            qkey: Q,
            imm: None,
            data: Data::default(),
        },
    }
    .encode();
    // The attacker, of our uid, sends an "offer" of a descriptor whose last
    // close waits 30 s. That it is g's close that is the last: g's port
    // is held (its lock, while a packet delayed there is looked at) while
    // a packet goes before the offer, so that g's receive thread waits to
    // deliver it until our copy is closed.
    let port = g.dev.port();
    port.set_faults(efa_emu::device::fabric::NetFaults {
        delay_us: 10_000_000,
        ..Default::default()
    });
    sock.send_to(&packet, &to).unwrap();
    until("a packet is held at g's port", || port.holds(|_| true));
    let r0 = rejected(&g);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let slow = std::cell::Cell::new(Some(lingering_socket(&listener)));
    let junk = Control::Offer {
        from: f.dev.config().gid,
        to: g.dev.config().gid,
        id: 1,
        len: 4096,
    }
    .encode();
    port.holds(|_| {
        if let Some(s) = slow.take() {
            sock.send_to(&packet, &to).unwrap();
            send_fds(&sock, &to, &junk, &[s.as_raw_fd(), s.as_raw_fd()]);
        }
        false
    });
    port.set_faults(Default::default());
    until("the descriptors are refused", || rejected(&g) > r0);
    // g's receive thread goes on at once.
    let t = Instant::now();
    warm_up(&mut a, &mut b, ah, &tx, &rx, &f, &g);
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the receiver was held {took:?}"
    );
    // While that close waits, more descriptors are refused unopened, not
    // piled up: the process holds a bounded number.
    let before = open_fds();
    let file = std::fs::File::open("/proc/self/exe").unwrap();
    let r1 = rejected(&g);
    for _ in 0..200 {
        send_fds(&sock, &to, &junk, &[file.as_raw_fd()]);
    }
    until("all 200 are refused", || rejected(&g) >= r1 + 200);
    let held = open_fds().saturating_sub(before);
    assert!(held <= 64 + 8, "{held} descriptors held");
    drop(listener);
}

#[test]
fn an_offer_that_meets_a_full_queue_is_made_again_soon() {
    let name = "share-busy";
    let (mut f, _g) = pair_over_sockets(name, test_config(), test_config());
    let dir = sockets_dir(name);
    let hand = HandPeer::new(&dir, [0x7c; 16]);
    fill_queue(&socket_path(&dir, &hand.gid));
    let mut a = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, hand.gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0);
    // The send's memory is offered at once, into the full queue.
    a.post_send(&send_wqe(1, ah, 9, Q, &[tx.sge(0, 64)], None));
    std::thread::sleep(Duration::from_millis(100));
    // Room again: the offer comes well before the second that an offer
    // not answered waits (its packets went as bytes meanwhile).
    let t = Instant::now();
    loop {
        let (bytes, _fds) = hand.recv();
        if matches!(Control::decode(&bytes), Some(Control::Offer { .. })) {
            break;
        }
    }
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(500),
        "the offer came {took:?} after the queue had room"
    );
}

/// The peer's part as a process that offers more than any guest has: from
/// a socket bound at `$HOARD` in `$DIR`, eight offers to `$TARGET` of a
/// sparse 255 GiB memfd (`$RAM-big`), seventy of a small one
/// (`$RAM-small`); then it is a device ([`play_device`]) that sends.
fn play_hoarder() {
    let dir = std::path::PathBuf::from(var("DIR"));
    let me = gid_var("HOARD");
    let to = gid_var("TARGET");
    let path = socket_path(&dir, &me);
    let _ = std::fs::remove_file(&path);
    let sock = UnixDatagram::bind(&path).unwrap();
    let big = sealed_memfd(&format!("{}-big", var("RAM")), 255 << 30);
    for id in 0..8 {
        offer(&sock, &dir, me, to, id, &big);
    }
    let small = sealed_memfd(&format!("{}-small", var("RAM")), 64 << 10);
    for id in 100..170 {
        offer(&sock, &dir, me, to, id, &small);
    }
    tell("offered");
    play_device();
}

#[test]
fn a_receiver_maps_no_more_of_one_process_than_a_guest_can_have() {
    if is_peer() {
        return play_hoarder();
    }
    let name = "share-hoard";
    let (mut f, mut g) = pair_over_sockets(name, test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, g.dev.config().gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0);
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    let rx_peer = g.mr(b.pd, 4096, ALL_PERMS, 0);
    for i in 0..10u16 {
        b.post_recv(100 + i, &[rx_peer.sge(u64::from(i) * 64, 64)]);
    }
    let ram = format!("efa-hoard-{}", std::process::id());
    let mut peer = Peer::spawn(
        "a_receiver_maps_no_more_of_one_process_than_a_guest_can_have",
        &[
            ("DIR", sockets_dir(name).display().to_string()),
            ("HOARD", gid_hex(&[0x43; 16])),
            ("GID", gid_hex(&[0x44; 16])),
            ("TARGET", gid_hex(&g.dev.config().gid)),
            ("QPN", b.qpn.to_string()),
            ("COUNT", "10".into()),
            ("RAM", ram.clone()),
        ],
    );
    peer.expect("offered");
    // 1 TiB of one process: four of the large ones; 64 regions of it: 60
    // of the small ones. The rest is refused, each counted.
    until("the offers past the limits are refused", || {
        rejected(&g) >= 4 + 10
    });
    assert_eq!(mappings(&format!("{ram}-big")), 4);
    assert_eq!(mappings(&format!("{ram}-small")), 60);
    // That process's device is refused too, and sends bytes, which arrive.
    peer.expect("sent");
    receive_from_peer(&mut b, &g, &rx_peer, 10);
    // (`ram` names its device's guest RAM, and begins the names above.)
    assert_eq!(mappings(&ram), 4 + 60, "its guest RAM is not mapped");
    until("its device's offer is refused", || rejected(&g) > 4 + 10);
    // Another process is not held to that one's share.
    warm_up(&mut a, &mut b, ah, &tx, &rx, &f, &g);
    peer.end();
    until("what the exited process offered is let go", || {
        mappings(&ram) == 0
    });
}

/// The peer's part as a receiver by hand: a socket bound at `$GID` in
/// `$DIR` that accepts offers and answers sends, telling of each whether
/// it came as bytes or descriptors, until one comes as descriptors; then
/// it waits to be told to end.
fn play_accepter() {
    let peer = HandPeer::new(&std::path::PathBuf::from(var("DIR")), gid_var("GID"));
    tell("bound");
    let mut pins = None;
    while peer.serve(&mut pins).is_none() {
        tell("bytes");
    }
    tell("described");
    until_told_to_end();
}

#[test]
fn descriptors_never_go_to_a_new_process_at_the_gid_of_a_peer_that_exited() {
    if is_peer() {
        return play_accepter();
    }
    let name = "share-successor";
    let (mut f, _g) = pair_over_sockets(name, test_config(), test_config());
    let dir = sockets_dir(name);
    let gid = [0x5e; 16];
    let mut peer = Peer::spawn(
        "descriptors_never_go_to_a_new_process_at_the_gid_of_a_peer_that_exited",
        &[("DIR", dir.display().to_string()), ("GID", gid_hex(&gid))],
    );
    peer.expect("bound");
    let mut a = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0x5a);
    // Sends until the peer has accepted the offer and been sent
    // descriptors, on which it exits.
    let t = Instant::now();
    for i in 0.. {
        a.post_send(&send_wqe(i, ah, 9, Q, &[tx.sge(0, 64)], None));
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
        if peer.next() == "described" {
            break;
        }
        assert!(
            t.elapsed() < PATIENCE,
            "the peer was never sent descriptors"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    peer.end();
    // A new process at its GID (this one) at once, well before the sender
    // looks for exited peers (each second): it has mapped nothing of f's,
    // and must be sent bytes until it accepts f's memory offered afresh.
    let next = HandPeer::new(&dir, gid);
    let mut pins = None;
    for i in 0..3 {
        a.post_send(&send_wqe(100 + i, ah, 9, Q, &[tx.sge(0, 64)], None));
        let descs = next.serve(&mut pins);
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
        assert!(
            descs.is_none() || pins.is_some(),
            "send {i}: descriptors of memory offered to the process before"
        );
    }
}

/// The ring of the pin table `pins` sent along with an offer, mapped as
/// the receiver maps it.
fn ring_of(pins: &OwnedFd) -> SharedMem {
    SharedMem::map(pins.try_clone().unwrap(), TABLE_BYTES).unwrap()
}

#[test]
fn a_peer_that_accepted_is_sent_packets_on_its_ring_and_woken_only_when_it_sleeps() {
    let name = "share-ring";
    let (mut f, _g) = pair_over_sockets(name, test_config(), test_config());
    let hand = HandPeer::new(&sockets_dir(name), [0x7e; 16]);
    let mut a = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, hand.gid);
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 0x5a);
    let mut pins = None;
    let t = Instant::now();
    for i in 0.. {
        a.post_send(&send_wqe(i, ah, 9, Q, &[tx.sge(0, 64)], None));
        let descs = hand.serve(&mut pins);
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
        if descs.is_some() {
            break;
        }
        assert!(t.elapsed() < PATIENCE, "never sent descriptors");
        std::thread::sleep(Duration::from_millis(2));
    }
    let shm = ring_of(pins.as_ref().unwrap());
    let ring = Ring::new(&shm, RING_AT);
    let mut tail = hand.ring.borrow().as_ref().unwrap().1;
    let mut buf = Vec::new();
    let no_datagram = |what: &str| {
        hand.sock.set_nonblocking(true).unwrap();
        let r = hand.sock.recv(&mut [0u8; 256]);
        hand.sock.set_nonblocking(false).unwrap();
        assert!(r.is_err(), "{what}: a datagram came as well");
    };
    // The first is answered late, so that the requester probes; its
    // probes come on the ring too, after it, and the next consumer pass
    // takes them (a test that answers slowly under load sees the same).
    for (i, armed, late) in [(100, false, true), (101, true, false), (102, false, false)] {
        if armed {
            // As a consumer about to sleep, after what is there.
            while ring.pop(&mut tail, &mut buf) == Popped::Entry {
                assert!(hand.answer_probe(&buf), "before send {i}: only probes");
            }
            assert!(!ring.arm(tail), "nothing published yet");
        }
        a.post_send(&send_wqe(i, ah, 9, Q, &[tx.sge(0, 64)], None));
        let t = Instant::now();
        loop {
            while ring.pop(&mut tail, &mut buf) != Popped::Entry {
                assert!(t.elapsed() < PATIENCE, "send {i} never came on the ring");
                std::thread::sleep(Duration::from_micros(100));
            }
            // Probes of the one answered late.
            if !hand.answer_probe(&buf) {
                break;
            }
        }
        if armed {
            let (kick, _) = hand.recv();
            assert_eq!(kick, KICK, "an armed ring is kicked");
            ring.disarm();
        }
        no_datagram(&format!("send {i}"));
        if late {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            hand.answer(&buf).is_some(),
            "send {i}: descriptors on the ring"
        );
        assert_eq!(a.wait(1)[0].status(), CompStatus::Ok);
    }
    assert!(
        f.dev.counters().probes > 0,
        "the late answer was probed for"
    );
}

#[test]
fn a_peer_that_writes_nonsense_into_its_ring_loses_only_its_own_packets() {
    let name = "share-ring-hostile";
    let (_f, mut g) = pair_over_sockets(name, test_config(), test_config());
    let dir = sockets_dir(name);
    let gid = g.dev.config().gid;
    let hand = HandPeer::new(&dir, [0x7f; 16]);
    let mut b = g.ep(EpOpts::srd());
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    // The hand offers g memory with a pin table (and a ring) of its own.
    let ram = sealed_memfd("hostile-ring-ram", 1 << 20);
    let pins = PinTable::new().unwrap();
    let msg = Control::Offer {
        from: hand.gid,
        to: gid,
        id: 0,
        len: 1 << 20,
    }
    .encode();
    send_fds(
        &hand.sock,
        &socket_path(&dir, &gid),
        &msg,
        &[ram.as_raw_fd(), pins.fd().as_raw_fd()],
    );
    let (bytes, _) = hand.recv();
    assert!(matches!(
        Control::decode(&bytes),
        Some(Control::Accept { .. })
    ));
    let shm = ring_of(&pins.fd().try_clone_to_owned().unwrap());
    let ring = pins.ring();
    let mut head = 0;
    let publish = |head: &mut u64, bytes: &[u8]| {
        let Pushed::Sent { kick } = ring.push(head, bytes, || {}) else {
            panic!("no room")
        };
        if kick {
            hand.send(&gid, &KICK);
        }
    };
    let qpn = b.qpn;
    let send = |src: [u8; 16], seq: u64| {
        Packet {
            src_gid: src,
            dst_gid: gid,
            src_qpn: 9,
            dst_qpn: qpn,
            body: Body::Send {
                seq,
                qkey: Q,
                imm: None,
                data: vec![0xab; 64].into(),
            },
        }
        .encode()
    };
    publish(&mut head, b"nonsense");
    until("an entry that is no packet is refused", || {
        rejected(&g) == 1
    });
    publish(&mut head, &send([0x11; 16], 1));
    until("a packet in another GID's name is refused", || {
        rejected(&g) == 2
    });
    // More entries than a ring holds.
    shm.store_u64(RING_AT + HEAD, head + 10_000).unwrap();
    hand.send(&gid, &KICK);
    until("impossible counts are refused", || rejected(&g) == 3);
    head += 10_000;
    // An entry longer than a slot.
    publish(&mut head, b"soon too long");
    let slot = RING_AT + SLOTS_AT + ((head - 1) % RING_SLOTS as u64) as usize * SLOT_BYTES;
    shm.store_u32(slot, u32::MAX).unwrap();
    hand.send(&gid, &KICK);
    until("an impossible length is refused", || rejected(&g) == 4);
    // And the ring still works: a packet of its own is delivered.
    b.post_recv(1, &[rx.sge(0, 64)]);
    publish(&mut head, &send(hand.gid, 2));
    let c = b.wait(1);
    assert_eq!((c[0].req_id(), c[0].status()), (1, CompStatus::Ok));
    assert_eq!(g.ram.get(rx.gpa, 64), vec![0xab; 64]);
    let answer = hand.recv_packet();
    assert!(matches!(
        Packet::decode(&answer).map(|p| p.body),
        Some(Body::Resp {
            seq: 2,
            status: 0,
            ..
        })
    ));
    assert_eq!(rejected(&g), 4);
}

/// SRD request `request` (its first attempt), a send of 64 bytes from
/// `from` to `qpn` at `to`, in wire form.
fn send_packet(from: [u8; 16], to: [u8; 16], qpn: u16, request: u64) -> Vec<u8> {
    // Below the request, the attempt (efa-emu.md's Packet format).
    let seq = request << 8;
    Packet {
        src_gid: from,
        dst_gid: to,
        src_qpn: 9,
        dst_qpn: qpn,
        body: Body::Send {
            seq,
            qkey: Q,
            imm: None,
            data: vec![0xcd; 64].into(),
        },
    }
    .encode()
}

#[test]
fn a_peer_sent_only_acknowledgements_is_offered_the_ring_alone_and_then_sent_them_on_it() {
    let name = "share-ring-alone";
    let (_f, mut g) = pair_over_sockets(name, test_config(), test_config());
    let gid = g.dev.config().gid;
    let hand = HandPeer::new(&sockets_dir(name), [0x7d; 16]);
    let mut b = g.ep(EpOpts::srd());
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    b.post_recv(1, &[rx.sge(0, 64)]);
    b.post_recv(2, &[rx.sge(64, 64)]);
    // Bytes by the socket: g describes nothing to the hand, and answers.
    hand.send(&gid, &send_packet(hand.gid, gid, b.qpn, 1));
    assert_eq!(b.wait(1)[0].status(), CompStatus::Ok);
    let (mut answered, mut ring) = (false, None);
    while !answered || ring.is_none() {
        let (bytes, mut fds) = hand.recv_any();
        match Control::decode(&bytes) {
            Some(Control::Ring { from, to, id }) => {
                assert_eq!((from, to), (gid, hand.gid));
                assert_eq!(fds.len(), 1, "the pin table alone");
                ring = Some((fds.pop().unwrap(), id));
            }
            Some(c) => panic!("{c:?}: nothing but the ring is offered"),
            None => {
                let body = Packet::decode(&bytes).map(|p| p.body);
                assert!(
                    matches!(body, Some(Body::Resp { seq: 0x100, .. })),
                    "{body:?}"
                );
                answered = true;
            }
        }
    }
    let (pins, id) = ring.unwrap();
    hand.take_ring(&pins);
    let ok = Control::Accept {
        from: hand.gid,
        to: gid,
        id,
    };
    // Before the next packet, by the same socket: g has taken the
    // acceptance when it answers that.
    hand.send(&gid, &ok.encode());
    hand.send(&gid, &send_packet(hand.gid, gid, b.qpn, 2));
    assert_eq!(b.wait(1)[0].status(), CompStatus::Ok);
    assert_eq!(g.ram.get(rx.gpa + 64, 64), vec![0xcd; 64]);
    let t = Instant::now();
    let answer = loop {
        if let Some(entry) = hand.pop() {
            break entry;
        }
        hand.sock.set_nonblocking(true).unwrap();
        let r = hand.sock.recv(&mut [0u8; 256]);
        hand.sock.set_nonblocking(false).unwrap();
        if let Ok(n) = r {
            assert!(
                n == KICK.len(),
                "the answer came by the socket, not the ring"
            );
        }
        assert!(t.elapsed() < PATIENCE, "the answer never came on the ring");
        std::thread::sleep(Duration::from_micros(100));
    };
    assert!(matches!(
        Packet::decode(&answer).map(|p| p.body),
        Some(Body::Resp {
            seq: 0x200,
            status: 0,
            ..
        })
    ));
    assert_eq!(rejected(&g), 0);
}

#[test]
fn an_offer_of_the_ring_alone_counts_only_with_one_pin_table_for_the_port_it_reached() {
    let name = "share-ring-offer";
    let (_f, mut g) = pair_over_sockets(name, test_config(), test_config());
    let dir = sockets_dir(name);
    let gid = g.dev.config().gid;
    let hand = HandPeer::new(&dir, [0x7c; 16]);
    let to_g = socket_path(&dir, &gid);
    let pins = PinTable::new().unwrap();
    let ring = |to: [u8; 16]| {
        Control::Ring {
            from: hand.gid,
            to,
            id: 7,
        }
        .encode()
    };
    let table = pins.fd().as_raw_fd();
    let ram = sealed_memfd("ring-offer-ram", 1 << 16);
    send_fds(&hand.sock, &to_g, &ring(gid), &[table, ram.as_raw_fd()]);
    until("a ring offered with two descriptors is refused", || {
        rejected(&g) == 1
    });
    send_fds(&hand.sock, &to_g, &ring([0x11; 16]), &[table]);
    until("a ring offered for another GID is refused", || {
        rejected(&g) == 2
    });
    send_fds(&hand.sock, &to_g, &ring(gid), &[ram.as_raw_fd()]);
    until("a ring in what is no pin table is refused", || {
        rejected(&g) == 3
    });
    send_fds(&hand.sock, &to_g, &ring(gid), &[table]);
    let (bytes, fds) = hand.recv();
    assert_eq!(
        Control::decode(&bytes),
        Some(Control::Accept {
            from: gid,
            to: hand.gid,
            id: 7
        })
    );
    assert!(fds.is_empty());
    // Its ring is read: a packet on it is delivered.
    let mut b = g.ep(EpOpts::srd());
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    b.post_recv(1, &[rx.sge(0, 64)]);
    let mut head = 0;
    let Pushed::Sent { kick } =
        pins.ring()
            .push(&mut head, &send_packet(hand.gid, gid, b.qpn, 1), || {})
    else {
        panic!("no room")
    };
    if kick {
        hand.send(&gid, &KICK);
    }
    let c = b.wait(1);
    assert_eq!((c[0].req_id(), c[0].status()), (1, CompStatus::Ok));
    assert_eq!(g.ram.get(rx.gpa, 64), vec![0xcd; 64]);
    assert_eq!(rejected(&g), 3);
}
