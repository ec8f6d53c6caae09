//! What a hostile guest or fabric peer can make the model do: nothing
//! larger than the device advertises is allocated, no value it controls
//! overflows an address, answers count only from the peer asked, warnings
//! are rate-limited, and every warning is counted in its class.
//!
//! The tests here run one at a time (they watch the process's allocations
//! and log lines).

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use efa_emu::device::fabric::{Body, Fabric, Heard, NetFaults, Packet, Port, MAX_SEGMENT};
use efa_emu::device::{control, InjectMode};
use efa_emu::health::{Class, Exit, Health, BURST};
use efa_emu::transport::PciFunction;
use efa_hw::admin::*;
use efa_hw::io::*;
use efa_hw::regs::*;
use efa_hw::wire::Wire;
use support::dp::*;
use support::*;

use CompStatus as S;

/// Counts the allocations of at least [`BIG`] bytes and the largest one.
struct Watch;

const BIG: usize = 60 << 10;
static BIG_ALLOCS: AtomicU64 = AtomicU64::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; the counters
// are atomics and allocate nothing.
unsafe impl GlobalAlloc for Watch {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: as the caller's contract for `alloc`.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: as the caller's contract for `alloc_zeroed`.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as the caller's contract for `dealloc`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note(n);
        // SAFETY: as the caller's contract for `realloc`.
        unsafe { System.realloc(p, l, n) }
    }
}

/// Allocations of at least [`MID`] bytes: half a UDP segment.
const MID: usize = 16 << 10;
static MID_ALLOCS: AtomicU64 = AtomicU64::new(0);

fn note(size: usize) {
    if size >= MID {
        MID_ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
    if size >= BIG {
        BIG_ALLOCS.fetch_add(1, Ordering::Relaxed);
        LARGEST.fetch_max(size, Ordering::Relaxed);
    }
}

#[global_allocator]
static WATCH: Watch = Watch;

/// One test at a time.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every log line of the process.
struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            self.0.lock().unwrap().push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

fn captured() -> &'static Capture {
    static LOG: OnceLock<&'static Capture> = OnceLock::new();
    LOG.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        log::set_logger(c).unwrap();
        log::set_max_level(log::LevelFilter::Info);
        c
    })
}

/// Log lines of device `index` containing `what`.
fn lines(index: u16, what: &str) -> usize {
    let me = format!("efa{index}:");
    captured()
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&me) && l.contains(what))
        .count()
}

fn gid(f: &Fake) -> [u8; 16] {
    f.dev.config().gid
}

fn health(f: &Fake) -> Arc<Health> {
    f.dev.config().health.clone()
}

/// A device on a fabric of its own, with a spy port that sees what it
/// sends to `spy_gid`.
fn with_spy(index: u16, spy_gid: [u8; 16]) -> (Fake, Arc<Port>) {
    let fabric = Fabric::local();
    let mut cfg = test_config();
    cfg.index = index;
    cfg.gid[15] = index as u8;
    cfg.fabric = Some(fabric.clone());
    let f = Fake::up(cfg);
    let spy = Port::new(spy_gid, NetFaults::default(), Health::new());
    fabric.attach(&spy).unwrap();
    (f, spy)
}

/// Packets arriving at `port` until `n` came or `patience` passed.
fn collect(port: &Port, n: usize, patience: Duration) -> Vec<Packet> {
    let t = Instant::now();
    let mut got = Vec::new();
    while got.len() < n && t.elapsed() < patience {
        got.extend(port.take_due(Instant::now(), usize::MAX).0);
        port.wait(Some(Duration::from_millis(5)));
    }
    got
}

const SPY: [u8; 16] = [0xaa; 16];

#[test]
fn a_forged_read_request_allocates_nothing_before_its_checks() {
    let _one = serial();
    let (f, spy) = with_spy(40, SPY);
    let mut f = f;
    let ep = f.ep(EpOpts::srd());
    let read = |seq: u64, len: u32| Packet {
        src_gid: SPY,
        dst_gid: gid(&f),
        src_qpn: 9,
        dst_qpn: ep.qpn,
        body: Body::Read {
            seq,
            qkey: 0x1111,
            rkey: 0xbad,
            addr: 0x1000,
            len,
            last: true,
        },
    };
    let before = BIG_ALLOCS.load(Ordering::SeqCst);
    let largest = LARGEST.load(Ordering::SeqCst);
    // Longer than any segment: dropped as malformed.
    f.dev.port().deliver(read(1, u32::MAX));
    // Segments of the largest size with a key that names no MR: answered
    // with an error, without a buffer for the data.
    for seq in 2..66 {
        f.dev.port().deliver(read(seq, MAX_SEGMENT as u32));
    }
    // Answers without data, so some go together in runs.
    let mut answered = 0;
    let t = Instant::now();
    while answered < 64 && t.elapsed() < PATIENCE {
        for a in collect(&spy, 1, PATIENCE) {
            let (status, n) = match a.body {
                Body::Resp { status, data, .. } => {
                    assert_eq!(data.len(), 0, "{data:?}");
                    (status, 1)
                }
                Body::RespRun { status, count, .. } => (status, count),
                _ => panic!("not an answer: {a:?}"),
            };
            assert_eq!(status, S::RemoteErrorBadAddress.raw());
            answered += n;
        }
    }
    assert_eq!(answered, 64);
    assert_eq!(
        LARGEST.load(Ordering::SeqCst),
        largest,
        "no allocation the size of what the packet claims"
    );
    let big = BIG_ALLOCS.load(Ordering::SeqCst) - before;
    assert!(
        big < 8,
        "{big} allocations of 60 KiB or more for 65 refused reads"
    );
    assert_eq!(health(&f).get(Class::FabricRejected), 1);
}

#[test]
fn a_udp_port_allocates_nothing_for_a_datagram_it_drops() {
    use efa_emu::device::fabric::auth::{self, FabricKey, MAX_DATAGRAM, UDP_SEGMENT};
    use efa_emu::device::fabric::{Remote, UdpConfig};
    let _one = serial();
    let port = 10_000 + (std::process::id() % 1000) as u16 * 20 + 17;
    let to: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let (me, peer) = ([0xb0; 16], [0xb1; 16]);
    let key = FabricKey::new([0x21; 32]);
    let health = Health::new();
    let fabric = Fabric::new(
        Remote::Udp(UdpConfig {
            peers: Arc::new([(me, to), (peer, to)].into()),
            key: Some(key.clone()),
        }),
        health.clone(),
        None,
    )
    .unwrap();
    let p = Port::new(me, NetFaults::default(), Health::new());
    fabric.attach(&p).unwrap();
    let raw = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let big = |seq| {
        let mut d = Vec::new();
        let pkt = Packet {
            src_gid: peer,
            dst_gid: me,
            src_qpn: 1,
            dst_qpn: 2,
            body: Body::Send {
                seq,
                qkey: 1,
                imm: None,
                data: vec![0x77; UDP_SEGMENT].into(),
            },
        };
        auth::seal(&key, seq, &pkt, &mut d);
        d
    };
    let good = big(100);
    let mut forged = good.clone();
    forged[100] ^= 1;
    let oversized = vec![0u8; MAX_DATAGRAM + 1000];
    let wait = |n: u64| {
        let t = Instant::now();
        while health.get(Class::FabricRejected) < n {
            assert!(
                t.elapsed() < PATIENCE,
                "{} rejected",
                health.get(Class::FabricRejected)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    raw.send_to(&good, to).unwrap();
    let t = Instant::now();
    while p.take_due(Instant::now(), usize::MAX).0.is_empty() {
        assert!(t.elapsed() < PATIENCE, "the good datagram");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Sent here, counted there: only the port's receive thread allocates
    // meanwhile.
    let before = MID_ALLOCS.load(Ordering::SeqCst);
    for i in 0..20 {
        raw.send_to(&forged, to).unwrap();
        raw.send_to(&oversized, to).unwrap();
        raw.send_to(&good, to).unwrap();
        wait(3 * (i + 1));
    }
    assert_eq!(
        MID_ALLOCS.load(Ordering::SeqCst),
        before,
        "no allocation for 60 datagrams of 32 KiB and more dropped (forged, too long, replayed)"
    );
    // And one that passes is allocated for, so the count would have shown.
    raw.send_to(&big(101), to).unwrap();
    let t = Instant::now();
    while p.take_due(Instant::now(), usize::MAX).0.is_empty() {
        assert!(t.elapsed() < PATIENCE, "the second good datagram");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(MID_ALLOCS.load(Ordering::SeqCst) > before);
}

#[test]
fn answers_count_only_from_the_peer_the_request_went_to() {
    let _one = serial();
    let (mut f, spy) = with_spy(41, SPY);
    let mut a = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, SPY);
    a.post_send(&inline_wqe(7, ah, 5, 0x1111, b"to the spy", 64));
    let req = collect(&spy, 1, PATIENCE).remove(0);
    let Body::Send { seq, .. } = req.body else {
        panic!("not a send: {req:?}");
    };
    let (me, qpn) = (gid(&f), a.qpn);
    let answer = |src_gid: [u8; 16], src_qpn: u16| Packet {
        src_gid,
        dst_gid: me,
        src_qpn,
        dst_qpn: qpn,
        body: Body::Resp {
            seq,
            status: S::Ok.raw(),
            data: Vec::new().into(),
        },
    };
    f.dev.port().deliver(answer([0xbb; 16], 5));
    f.dev.port().deliver(answer(SPY, 6));
    a.quiet(Duration::from_millis(30));
    assert_eq!(health(&f).get(Class::FabricRejected), 2);
    f.dev.port().deliver(answer(SPY, 5));
    let c = a.wait(1);
    assert_eq!((c[0].req_id(), c[0].status()), (7, S::Ok));
    assert_eq!(health(&f).get(Class::FabricRejected), 2);
}

#[test]
fn a_run_of_answers_completes_the_requests_it_covers_and_no_other() {
    let _one = serial();
    let (mut f, spy) = with_spy(47, SPY);
    let mut a = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, SPY);
    for id in 0..4 {
        a.post_send(&inline_wqe(id, ah, 5, 0x1111, b"to the spy", 64));
    }
    let seqs: Vec<u64> = collect(&spy, 4, PATIENCE)
        .iter()
        .map(|p| p.request_seq().expect("a request"))
        .collect();
    assert_eq!(seqs.len(), 4, "{seqs:?}");
    let step = (seqs[1] - seqs[0]) as u32;
    assert!(
        seqs.windows(2).all(|w| w[1] - w[0] == u64::from(step)),
        "{seqs:?}"
    );
    let (me, qpn) = (gid(&f), a.qpn);
    let run = |src_gid: [u8; 16], first: u64, step: u32, count: u16| Packet {
        src_gid,
        dst_gid: me,
        src_qpn: 5,
        dst_qpn: qpn,
        body: Body::RespRun {
            first,
            step,
            count,
            status: S::Ok.raw(),
        },
    };
    // Not from the peer asked (each of its three answers refused, as
    // three answers of their own would be), answering nothing, numbers
    // past the last: nothing completes.
    f.dev.port().deliver(run([0xbb; 16], seqs[0], step, 3));
    f.dev.port().deliver(run(SPY, seqs[0], step, 0));
    f.dev.port().deliver(run(SPY, seqs[0], 0, 3));
    f.dev.port().deliver(run(SPY, u64::MAX - 1, step, 3));
    a.quiet(Duration::from_millis(30));
    assert_eq!(health(&f).get(Class::FabricRejected), 6);
    // The first three, in one packet; then the fourth on its own.
    f.dev.port().deliver(run(SPY, seqs[0], step, 3));
    let c = a.wait(3);
    let done: Vec<_> = c.iter().map(|c| (c.req_id(), c.status())).collect();
    assert_eq!(done, [(0, S::Ok), (1, S::Ok), (2, S::Ok)]);
    a.quiet(Duration::from_millis(30));
    f.dev.port().deliver(run(SPY, seqs[3], step, 1));
    let c = a.wait(1);
    assert_eq!((c[0].req_id(), c[0].status()), (3, S::Ok));
    assert_eq!(health(&f).get(Class::FabricRejected), 6);
}

#[test]
fn the_answers_to_a_burst_of_sends_leave_as_one_run() {
    let _one = serial();
    let (mut f, spy) = with_spy(48, SPY);
    let mut b = f.ep(EpOpts::srd());
    let rx = f.mr(b.pd, 16 * 64, ALL_PERMS, 0);
    for i in 0..16 {
        b.post_recv(i, &[rx.sge(u64::from(i) * 64, 64)]);
    }
    let (first, step) = (7 << 8, 1 << 8);
    let me = gid(&f);
    let sends = (0..16u8).map(|i| Packet {
        src_gid: SPY,
        dst_gid: me,
        src_qpn: 5,
        dst_qpn: b.qpn,
        body: Body::Send {
            seq: first + u64::from(step) * u64::from(i),
            qkey: 0x1111,
            imm: None,
            data: vec![i; 64].into(),
        },
    });
    // Together, as a pass of the sender's sends them.
    f.dev.port().deliver_all(sends);
    assert_eq!(b.wait(16).len(), 16);
    let got = collect(&spy, 1, PATIENCE);
    assert_eq!(
        got.iter().map(|p| &p.body).collect::<Vec<_>>(),
        [&Body::RespRun {
            first,
            step,
            count: 16,
            status: S::Ok.raw()
        }],
        "one packet answers all sixteen"
    );
    let d = f.stats(GetStatsType::Basic, None).basic_stats();
    assert_eq!(
        (d.rx_pkts, d.tx_pkts),
        (16, 16),
        "counted as sixteen answers"
    );
}

#[test]
fn probe_replies_count_only_from_the_peer_the_request_went_to() {
    let _one = serial();
    let (mut f, spy) = with_spy(45, SPY);
    let mut a = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, SPY);
    a.post_send(&inline_wqe(7, ah, 5, 0x1111, b"to the spy", 64));
    let req = collect(&spy, 1, PATIENCE).remove(0);
    let seq = req.request_seq().expect("a request");
    let (me, qpn) = (gid(&f), a.qpn);
    let heard = |src_gid: [u8; 16], src_qpn: u16| Packet {
        src_gid,
        dst_gid: me,
        src_qpn,
        dst_qpn: qpn,
        body: Body::Heard {
            seq,
            what: Heard::Answered,
            status: S::Ok.raw(),
        },
    };
    f.dev.port().deliver(heard([0xbb; 16], 5));
    f.dev.port().deliver(heard(SPY, 6));
    // A status only goes with "answered".
    for what in [Heard::Missing, Heard::Queued] {
        f.dev.port().deliver(Packet {
            body: Body::Heard {
                seq,
                what,
                status: S::Ok.raw() + 1,
            },
            ..heard(SPY, 5)
        });
    }
    a.quiet(Duration::from_millis(30));
    assert_eq!(health(&f).get(Class::FabricRejected), 4);
    f.dev.port().deliver(heard(SPY, 5));
    let c = a.wait(1);
    assert_eq!((c[0].req_id(), c[0].status()), (7, S::Ok));
    assert_eq!(health(&f).get(Class::FabricRejected), 4);
}

/// Sends one request from a new QP of `f` to the spy, then runs `peer`
/// on every packet the spy gets (and once every millisecond with none)
/// until the request completes. Returns its completion and how long it
/// took.
fn against_spy(
    f: &mut Fake,
    spy: &Arc<Port>,
    mut peer: impl FnMut(&Fake, u16, Option<Packet>),
) -> (Cqe, Duration) {
    let mut a = f.ep(EpOpts::srd());
    let ah = f.ah(a.pd, SPY);
    let t = Instant::now();
    a.post_send(&inline_wqe(7, ah, 5, 0x1111, b"to the spy", 64));
    let qpn = a.qpn;
    loop {
        let c = a.poll();
        if let Some(c) = c.into_iter().next() {
            return (c, t.elapsed());
        }
        assert!(t.elapsed() < Duration::from_secs(8), "never completed");
        let got = spy.take_due(Instant::now(), usize::MAX).0;
        if got.is_empty() {
            peer(f, qpn, None);
            std::thread::sleep(Duration::from_millis(1));
        }
        for p in got {
            peer(f, qpn, Some(p));
        }
    }
}

#[test]
fn a_peer_that_holds_a_request_for_ever_does_not_keep_it_in_flight_for_ever() {
    // Every probe is answered "queued" (before, each such reply started
    // the request's probes over: it never completed).
    let _one = serial();
    let (mut f, spy) = with_spy(46, SPY);
    let me = gid(&f);
    let (c, took) = against_spy(&mut f, &spy, |f, qpn, p| {
        if let Some(Packet {
            body: Body::Probe { seq },
            ..
        }) = p
        {
            f.dev.port().deliver(Packet {
                src_gid: SPY,
                dst_gid: me,
                src_qpn: 5,
                dst_qpn: qpn,
                body: Body::Heard {
                    seq,
                    what: Heard::Queued,
                    status: 0,
                },
            });
        }
    });
    assert_eq!(c.status(), S::LocalErrorUnrespRemote, "after {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_peer_streaming_other_packets_does_not_put_off_a_probe_for_ever() {
    // The spy answers nothing of the request, but sends this port other
    // packets all the time, held in it by a delay (before, any packet
    // from the peer's GID in the port put the probe off: the request
    // never completed).
    let _one = serial();
    let (mut f, spy) = with_spy(47, SPY);
    f.dev.port().set_faults(NetFaults {
        delay_us: 50_000,
        ..Default::default()
    });
    let me = gid(&f);
    let (c, took) = against_spy(&mut f, &spy, |f, qpn, _| {
        f.dev.port().deliver(Packet {
            src_gid: SPY,
            dst_gid: me,
            src_qpn: 5,
            dst_qpn: qpn,
            body: Body::Resp {
                seq: 0xdead_0000,
                status: S::Ok.raw(),
                data: Vec::new().into(),
            },
        });
    });
    assert_eq!(c.status(), S::LocalErrorUnrespRemote, "after {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn guest_addresses_at_the_end_of_the_address_space_do_not_overflow() {
    let _one = serial();
    let (mut f, mut g) = pair(test_config(), test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));

    // A region whose last byte is the last byte of the address space.
    let page = f.alloc(4096, 4096);
    f.ram.put(page, &[0x33; 4096]);
    let mut c = RegMrCmd {
        pd: a.pd,
        mr_length: 4096,
        flags: RegMrCmd::PHYS_PAGE_SIZE_SHIFT.prep(12),
        permissions: ALL_PERMS,
        iova: u64::MAX - 4095,
        ..RegMrCmd::ZERO
    };
    c.set_inline_pbl_array(&[page, 0, 0, 0]);
    let top: RegMrResp = f.cmd(AdminOpcode::RegMr, 0, &c).unwrap();
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    for (id, at) in [(1, u64::MAX - 4095), (2, u64::MAX - 63)] {
        b.post_recv(id, &[rx.sge(0, 64)]);
        a.post_send(&send_wqe(
            id,
            ah,
            b.qpn,
            0x1111,
            &[(at, 64, top.l_key)],
            None,
        ));
        assert_eq!(a.wait(1)[0].status(), S::Ok, "64 bytes at {at:#x}");
        assert_eq!(b.wait(1)[0].status(), S::Ok);
        assert_eq!(g.ram.get(rx.gpa, 64), vec![0x33; 64]);
    }
    a.post_send(&send_wqe(
        3,
        ah,
        b.qpn,
        0x1111,
        &[(u64::MAX - 63, 65, top.l_key)],
        None,
    ));
    assert_eq!(
        a.wait(1)[0].status(),
        S::LocalErrorInvalidLkey,
        "one byte past"
    );

    // An RDMA write whose remote address runs past the end: refused by
    // the responder, segment by segment.
    let local = f.mr(a.pd, 128 << 10, ALL_PERMS, 1);
    a.post_send(&rdma_wqe(
        SendOpType::RdmaWrite,
        2,
        ah,
        b.qpn,
        0x1111,
        rx.key,
        u64::MAX - 100,
        local.sge(0, 128 << 10),
        None,
    ));
    assert_eq!(a.wait(1)[0].status(), S::RemoteErrorBadAddress);

    // Queues moved to the end of the address space after they ran: the
    // device fails, it does not crash.
    f.enable_aenq();
    let win = |f: &Fake, v: u32| {
        f.dev
            .bar_write(0, control::BASE + control::COMMAND, &v.to_le_bytes())
    };
    win(&f, control::CMD_AENQ_WARNING);
    assert_eq!(f.aenq_events().len(), 1);
    f.w(AENQ_BASE_HI_OFF, u32::MAX);
    f.w(AENQ_BASE_LO_OFF, 0xffff_ffc0);
    win(&f, control::CMD_AENQ_WARNING);
    assert!(f.dev.is_fatal(), "an AENQ past the end is a device error");

    g.alloc_pd().unwrap();
    g.w(AQ_BASE_HI_OFF, u32::MAX);
    g.w(AQ_BASE_LO_OFF, 0xffff_ffc0);
    g.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]);
    g.ring();
    let t = Instant::now();
    while !g.dev.is_fatal() {
        assert!(
            t.elapsed() < PATIENCE,
            "an AQ past the end is a device error"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_flood_of_bad_commands_and_doorbells_logs_a_few_lines_and_counts_all() {
    let _one = serial();
    captured();
    let mut cfg = test_config();
    cfg.index = 43;
    let mut f = Fake::up(cfg);
    const N: usize = 300;
    for _ in 0..N {
        // ALLOC_PD takes no control buffer.
        let r = f.raw(
            AdminOpcode::AllocPd.raw(),
            AqCommonDesc::CTRL_DATA.mask(),
            &[],
        );
        assert_eq!(r.err(), Some(AdminStatus::MalformedRequest));
        f.w(EQ_DB_OFF, 99 | EQ_DB_ARM.mask());
    }
    let h = health(&f);
    assert_eq!(h.get(Class::GuestBug), 2 * N as u64);
    let logged = lines(43, "guest bug");
    assert!(
        (2..=2 * BURST as usize + 2).contains(&logged),
        "{logged} lines logged for {} guest bugs",
        2 * N
    );
    assert!(h.counts().suppressed >= (2 * N - logged) as u64);
    h.flush_suppressed();
    assert!(
        captured()
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("similar messages suppressed")),
        "the suppressed lines are reported"
    );
}

#[test]
fn warnings_are_counted_by_class() {
    let _one = serial();
    let mut cfg = test_config();
    cfg.index = 44;
    let (mut f, mut g) = pair(cfg, test_config());
    let mut a = f.ep(EpOpts::srd());
    let mut b = g.ep(EpOpts::srd());
    let ah = f.ah(a.pd, gid(&g));
    let tx = f.mr(a.pd, 4096, ALL_PERMS, 1);
    let rx = g.mr(b.pd, 4096, ALL_PERMS, 0);
    b.post_recv(1, &[rx.sge(0, 64)]);
    a.post_send(&send_wqe(1, ah, b.qpn, 0x1111, &[tx.sge(0, 64)], None));
    assert_eq!(a.wait(1)[0].status(), S::Ok);
    b.wait(1);
    let h = health(&f);
    assert_eq!(
        h.counts(),
        Default::default(),
        "an ordinary run counts nothing"
    );

    // guest_bug: a malformed entry.
    let r = f.raw(
        AdminOpcode::DeallocPd.raw(),
        AqCommonDesc::CTRL_DATA.mask(),
        &[],
    );
    assert_eq!(r.err(), Some(AdminStatus::MalformedRequest));
    // admin_error: a PD still in use.
    let c = DeallocPdCmd {
        pd: a.pd,
        reserved: 0,
    };
    assert_eq!(
        f.cmd::<DeallocPdResp>(AdminOpcode::DeallocPd, 0, &c).err(),
        Some(AdminStatus::ResourceBusy)
    );
    // injected: through the control window.
    let v = control::inject_value(
        AdminOpcode::AllocPd.raw(),
        0,
        1,
        InjectMode::Fail(AdminStatus::ResourceBusy),
    );
    f.dev
        .bar_write(0, control::BASE + control::INJECT, &v.to_le_bytes());
    assert!(f.alloc_pd().is_err());
    // dma_failed: a send from memory that went away.
    let gone = f.mr(a.pd, 4096, ALL_PERMS, 0);
    f.ram.truncate((gone.gpa - BASE) as usize);
    a.post_send(&send_wqe(2, ah, b.qpn, 0x1111, &[gone.sge(0, 8)], None));
    assert_eq!(a.wait(1)[0].status(), S::LocalErrorQpInternalError);
    // fabric_rejected: a packet for another device.
    let mut p = Packet {
        src_gid: gid(&g),
        dst_gid: [9; 16],
        src_qpn: 1,
        dst_qpn: a.qpn,
        body: Body::Ud {
            qkey: 0,
            imm: None,
            data: vec![].into(),
        },
    };
    f.dev.port().deliver(p.clone());
    // ... and one longer than the MTU.
    p.dst_gid = gid(&f);
    p.body = Body::Ud {
        qkey: 0,
        imm: None,
        data: vec![0; 9000].into(),
    };
    f.dev.port().deliver(p);
    // qp_error: a doorbell far past the ring.
    a.ring_sq_raw(1000);
    let t = Instant::now();
    while h.get(Class::QpError) == 0 || h.get(Class::FabricRejected) < 2 {
        assert!(t.elapsed() < PATIENCE, "{:?}", h.counts());
        std::thread::sleep(Duration::from_millis(1));
    }
    let n = h.counts();
    let by_class: Vec<u64> = Class::ALL.iter().map(|&c| n.get(c)).collect();
    assert_eq!(by_class, [1, 1, 1, 1, 1, 2], "{n:?}");
    assert_eq!(
        n.summary(Exit::Clean),
        "efa-emu: summary: exit=clean guest_bug=1 dma_failed=1 qp_error=1 admin_error=1 \
         injected=1 fabric_rejected=2 suppressed=0"
    );
    assert_eq!(
        health(&g).counts(),
        Default::default(),
        "the peer saw nothing wrong"
    );
}

#[test]
fn inline_data_is_bounded_by_what_the_device_advertises() {
    let _one = serial();
    let mut cfg = test_config();
    cfg.limits.inline_buf_size = 8;
    cfg.limits.inline_buf_size_ex = 40;
    let mut f = Fake::up(cfg);
    for (size, ok, too_long) in [(64, 8, 9), (128, 40, 41)] {
        let o = EpOpts {
            wqe_size: size,
            ..EpOpts::ud()
        };
        let mut a = f.ep(o);
        let ah = f.ah(a.pd, gid(&f));
        let data = [5u8; 64];
        a.post_send(&inline_wqe(
            1,
            ah,
            a.qpn,
            0x1111,
            &data[..ok],
            size as usize,
        ));
        assert_eq!(a.wait(1)[0].status(), S::Ok, "{ok} bytes in {size}");
        a.post_send(&inline_wqe(
            2,
            ah,
            a.qpn,
            0x1111,
            &data[..too_long],
            size as usize,
        ));
        assert_eq!(
            a.wait(1)[0].status(),
            S::LocalErrorBadLength,
            "{too_long} bytes in {size}"
        );
    }
}

#[test]
fn receive_rings_are_bounded_by_what_the_device_advertises() {
    let _one = serial();
    let mut f = Fake::up(test_config());
    let pd = f.alloc_pd().unwrap();
    let uar = f.alloc_uar().unwrap();
    let cq = f.create_cq(uar).unwrap().cq_idx;
    let l = f.dev.config().limits.clone();
    let most = (l.max_rq_depth * u32::from(l.max_rq_sges)).next_power_of_two() * 16;
    for (ring, ok) in [(most, true), (most * 2, false)] {
        let mut c = f.qp_cmd(pd, uar, cq, 16, 16);
        c.rq_base_addr = f.alloc(ring.into(), 4096);
        c.qp_alloc_size.recv_queue_ring_size = ring;
        let r = f.cmd::<CreateQpResp>(AdminOpcode::CreateQp, 0, &c);
        assert_eq!(r.is_ok(), ok, "a receive ring of {ring} bytes: {r:?}");
    }
}

#[test]
fn the_control_window_is_off_unless_asked_for() {
    let _one = serial();
    let mut cfg = test_config();
    cfg.test_control = false;
    let mut f = Fake::up(cfg);
    let read = |f: &Fake, reg: u64| f.mmio(control::BASE + reg);
    let write =
        |f: &Fake, reg: u64, v: u32| f.dev.bar_write(0, control::BASE + reg, &v.to_le_bytes());
    assert_eq!(read(&f, control::MAGIC), control::MAGIC_OFF_VALUE);
    assert_eq!(read(&f, control::WINDOW_VERSION), 0);
    let v = control::inject_value(
        AdminOpcode::AllocPd.raw(),
        0,
        1,
        InjectMode::Fail(AdminStatus::ResourceBusy),
    );
    write(&f, control::INJECT, v);
    assert!(f.alloc_pd().is_ok(), "no fault was armed");
    for cmd in [control::CMD_EXIT, control::CMD_FATAL, control::CMD_PANIC] {
        write(&f, control::COMMAND, cmd);
    }
    assert_eq!(f.exits.load(Ordering::SeqCst), 0);
    assert!(!f.dev.is_fatal());
    assert!(f.alloc_pd().is_ok(), "the model goes on");
    assert_eq!(health(&f).counts(), Default::default());
}
