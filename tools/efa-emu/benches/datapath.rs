//! efa-emu's data path without a guest (`make bench-emu`): SRD sends,
//! RDMA writes and reads, and doorbell-to-completion latency between two
//! devices, in one process (one fabric object) and in two (the child is
//! this program again, joined by the socket fabric, and then by the UDP
//! fabric on loopback, keyed), each figure beside
//! memcpy of the same size in the same run, with the payload copies and
//! the allocations per message counted here.
//!
//! The fake driver of `tests/support` drives the devices the way rdma-core
//! does (WQEs into the LLQ, doorbells in BAR2, completions polled by
//! phase), over guest RAM that is a memfd mapping like QEMU's. Buffers are
//! registered with 4 KiB pages in reverse order, as a guest's pages are
//! scattered. The driver allocates nothing while it measures, so the
//! counting allocator below sees the model's allocations only.
//!
//! memcpy is measured on page-aligned buffers, as many as the figure keeps
//! in flight: every buffer the model copies from or to here starts on a
//! page (guest pages are page-aligned), and memcpy's speed depends on the
//! alignment of source and destination (a misaligned copy splits cache
//! lines) and on the working set, so only the same alignment and the same
//! number of buffers make the comparison fair.
//!
//!   cargo bench -p efa-emu --features copy-count --bench datapath -- [options]
//!     --seconds S    measuring time per figure (default 1; a fifth of it
//!                    warms up first)
//!     --only one|two|udp one process, two over Unix sockets, or two over UDP
//!     --msgs N       measure N messages per figure instead of a time (a
//!                    fifth of them warm up first): a fixed amount of work,
//!                    for counting instructions per message under
//!                    `valgrind --tool=callgrind`, which a time does not give
//!     --figure TEXT[|TEXT...]  only the figures whose names end with one
//!                    of them ('batch 1|batch 64': one after the other, as
//!                    in a whole run, without those between)
//!     --no-pin       leave the threads that poll where the scheduler puts
//!                    them (pinned by default on two or more CPUs: see
//!                    `place`)
//!     --peer unix:DIR|udp:PORT  (internal) the second process's part

#![allow(clippy::print_stdout)]

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use efa_hw::io::*;
use support::dp::*;
use support::*;

/// Counts every allocation of the process.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call goes to the system allocator unchanged; the counter
// is an atomic and allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as the caller's contract for `alloc`.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as the caller's contract for `alloc_zeroed`.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as the caller's contract for `dealloc`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as the caller's contract for `realloc`.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const QKEY: u32 = 0x1111;
/// RDMA buffers: 16 of up to 1 MiB on each side.
const RDMA_BUF: u64 = 16 << 20;
/// Receive buffers the peer keeps posted, and their size.
const RECVS: u16 = 1024;
const RECV_SIZE: u32 = 64;

/// How the two processes meet.
#[derive(Debug, Clone)]
enum Net {
    /// Unix sockets in this directory.
    Unix(PathBuf),
    /// UDP on 127.0.0.1: device 0 at this port, device 1 at the next.
    Udp(u16),
}

impl Net {
    fn parse(s: &str) -> Self {
        match s.split_once(':') {
            Some(("unix", d)) => Net::Unix(d.into()),
            Some(("udp", p)) => Net::Udp(p.parse().expect("a port")),
            _ => panic!("--peer unix:DIR or udp:PORT, not {s:?}"),
        }
    }

    fn arg(&self) -> String {
        match self {
            Net::Unix(d) => format!("unix:{}", d.display()),
            Net::Udp(p) => format!("udp:{p}"),
        }
    }
}

/// Whether the threads that poll are pinned ([`place`]): decided once,
/// before any is (a pinned thread sees one CPU, and the second process
/// starts with the driver's one).
static PINNED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// The CPU of device `index`'s data path and of the thread that drives it
/// (the requester's, device 0, shares CPU 0 with the benchmark's driver;
/// the responder's, device 1, has CPU 1), if the threads are pinned: on
/// two cores the three threads that poll (the driver, two data paths) are
/// one more than the cores, and the scheduler put the two data paths on
/// one core in about half the runs, where they took turns and halved the
/// rates (64 B sends at batch 64 in one process 0.5-0.6 M/s against
/// 1.0-1.2), leaving the other core to the driver, which only polls.
fn place(index: u16) -> Option<usize> {
    PINNED
        .get()
        .expect("set in main")
        .then_some(usize::from(index % 2))
}

/// Pins the calling thread as [`place`] says for device `index`.
fn pin_to_device(index: u16) {
    if let Some(cpu) = place(index) {
        efa_emu::device::datapath::run_on(&[cpu]).expect("sched_setaffinity");
    }
}

fn config(index: u16, net: Option<&Net>) -> efa_emu::device::config::Config {
    let mut c = test_config();
    c.index = index;
    c.data_cpus = place(index).into_iter().collect();
    c.gid[15] = 7 + index as u8;
    match net {
        Some(Net::Unix(d)) => c.fabric_dir = Some(d.clone()),
        Some(Net::Udp(port)) => {
            let mut peers = efa_emu::device::fabric::udp::PeerMap::new();
            for i in 0..2u16 {
                let mut g = c.gid;
                g[15] = 7 + i as u8;
                peers.insert(g, ([127, 0, 0, 1], port + i).into());
            }
            c.udp = Some(efa_emu::device::fabric::UdpConfig {
                peers: std::sync::Arc::new(peers),
                key: Some(efa_emu::device::fabric::auth::FabricKey::new([7; 32])),
            });
        }
        None => {}
    }
    // The benchmark's driver rings doorbells within microseconds, as a
    // guest under KVM does: the data-path thread spins after work. On two
    // cores its three threads (driver and two devices) take turns, and a
    // spin of 200 us of its own time outlasts the others' turns: 50 us left
    // 64 KiB writes at 22-43% of memcpy and 64 B sends at batch 64 at
    // 0.59-0.64 M/s, against 51-59% and 1.15 M/s (two alternating runs).
    c.spin = Duration::from_micros(200);
    c
}

fn requester_opts() -> EpOpts {
    EpOpts {
        sq_depth: 256,
        cq_depth: 4096,
        ..EpOpts::srd()
    }
}

fn responder_opts() -> EpOpts {
    EpOpts {
        rq_depth: u32::from(RECVS),
        cq_depth: 4096,
        ..EpOpts::srd()
    }
}

/// The responding device's endpoint: keeps `RECVS` receives posted in
/// `rx` and offers `buf` for RDMA.
struct Responder {
    /// The device (kept alive).
    _f: Fake,
    ep: Ep,
    rx: Buf,
    buf: Buf,
}

impl Responder {
    fn new(f: Fake) -> Self {
        let mut f = f;
        let ep = f.ep(responder_opts());
        let rx = f.mr_scattered(ep.pd, u64::from(RECVS) * u64::from(RECV_SIZE), ALL_PERMS, 0);
        let buf = f.mr_scattered(ep.pd, RDMA_BUF, ALL_PERMS, 0x5a);
        let mut r = Self { _f: f, ep, rx, buf };
        for id in 0..RECVS {
            r.post(id);
        }
        r
    }

    fn post(&mut self, id: u16) {
        let sge = self.rx.sge(u64::from(id) * u64::from(RECV_SIZE), RECV_SIZE);
        self.ep.post_recv(id, &[sge]);
    }

    /// Reposts the receives that completed; how many did.
    fn service(&mut self) -> usize {
        // Room for all a poll can hand over (no more receives complete
        // than are posted): a completion left out would be a receive
        // never posted again, and the queue would drain.
        let mut done = [0u16; RECVS as usize];
        let mut n = 0;
        self.ep.poll_each(|c| {
            done[n] = c.req_id();
            n += 1;
        });
        for &id in &done[..n] {
            self.post(id);
        }
        n
    }
}

/// The peer: in this process, or the child's address and a channel to it.
enum Peer {
    Local(Box<Responder>),
    Remote {
        child: Child,
        /// Closed to end the child.
        to: Option<ChildStdin>,
        from: BufReader<ChildStdout>,
    },
}

/// What the requester needs to know of the responder.
#[derive(Clone, Copy)]
struct Target {
    gid: [u8; 16],
    qpn: u16,
    rkey: u32,
    iova: u64,
}

impl Peer {
    fn service(&mut self) {
        if let Peer::Local(r) = self {
            r.service();
        }
    }

    /// The child's payload copies and allocations so far (0 in one
    /// process: this process's counters hold them).
    fn counts(&mut self) -> (u64, u64) {
        match self {
            Peer::Local(_) => (0, 0),
            Peer::Remote { to, from, .. } => {
                let to = to.as_mut().expect("the child's stdin is open");
                writeln!(to, "counts").expect("to the child");
                let mut line = String::new();
                from.read_line(&mut line).expect("from the child");
                let v: Vec<u64> = line
                    .split_whitespace()
                    .skip(1)
                    .map(|w| w.parse().expect("a count"))
                    .collect();
                (v[0], v[1])
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Peer::Remote { child, to, .. } = self {
            // It ends when its stdin closes.
            drop(to.take());
            let _ = child.wait();
        }
    }
}

/// The second process: a device with a responder on the socket fabric in
/// `dir`; prints its address, then keeps its receives posted until its
/// stdin closes, answering `counts` with its payload copies and
/// allocations.
fn peer_main(net: &Net) {
    pin_to_device(1);
    let f = Fake::up(config(1, Some(net)));
    let gid = f.dev.config().gid;
    let mut r = Responder::new(f);
    println!(
        "ready {} {} {} {}",
        hex(&gid),
        r.ep.qpn,
        r.buf.key,
        r.buf.iova
    );
    std::io::stdout().flush().expect("stdout");
    std::thread::spawn(|| {
        let stdin = std::io::stdin();
        let mut line = String::new();
        while stdin.lock().read_line(&mut line).is_ok_and(|n| n > 0) {
            let copied = efa_emu::copycount::total().unwrap_or(0);
            let allocs = ALLOCS.load(Ordering::Relaxed);
            println!("counts {copied} {allocs}");
            std::io::stdout().flush().expect("stdout");
            line.clear();
        }
        std::process::exit(0);
    });
    loop {
        if r.service() == 0 {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> [u8; 16] {
    let mut g = [0u8; 16];
    for (i, v) in g.iter_mut().enumerate() {
        *v = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex GID");
    }
    g
}

/// The requesting side: a device, its endpoint, a buffer for RDMA and
/// messages, an AH for the target.
struct Requester {
    f: Fake,
    ep: Ep,
    buf: Buf,
    ah: u16,
}

/// One figure's result.
struct Run {
    /// Messages completed and payload bytes moved while measuring.
    msgs: u64,
    bytes: u64,
    secs: f64,
    /// Latencies (latency figure only), sorted.
    lat: Vec<Duration>,
    copied: Option<u64>,
    allocs: u64,
    retrans: u64,
    /// Probes sent for late answers (not retransmissions).
    probes: u64,
    /// Requests put off by receiver-not-ready answers: the responder's
    /// receives ran out, and the figure measured its waits.
    rnr: u64,
}

/// How long a figure measures: a time, or a number of messages.
#[derive(Clone, Copy)]
enum Until {
    Time(Duration),
    Msgs(u64),
}

impl Until {
    /// Whether a figure that started at `start` and completed `done`
    /// messages goes on.
    fn more(&self, start: Instant, done: u64) -> bool {
        match *self {
            Until::Time(d) => start.elapsed() < d,
            Until::Msgs(n) => done < n,
        }
    }

    /// A fifth of it, to warm up.
    fn warm(&self) -> Self {
        match *self {
            Until::Time(d) => Until::Time(d / 5),
            Until::Msgs(n) => Until::Msgs(n / 5),
        }
    }

    /// Whether a figure that began at `start` and last made progress at
    /// `progress` stalled: [`PATIENCE`] past its time, or (a number of
    /// messages, which may take long) [`PATIENCE`] without progress.
    fn stalled(&self, start: Instant, progress: Instant) -> bool {
        match *self {
            Until::Time(d) => start.elapsed() >= d + PATIENCE,
            Until::Msgs(_) => progress.elapsed() >= PATIENCE,
        }
    }
}

#[derive(Clone, Copy)]
enum Figure {
    Send { batch: u16 },
    Rdma { op: SendOpType, size: u32 },
    Latency,
}

const DEPTH: u16 = 16;
const SEND_SIZE: u32 = 64;
const LAT_SIZE: u32 = 8;

impl Figure {
    fn name(&self) -> String {
        match *self {
            Figure::Send { batch } => format!("SRD send {SEND_SIZE} B, batch {batch}"),
            Figure::Rdma { op, size } => format!(
                "RDMA {} {}, {DEPTH} in flight",
                if op == SendOpType::RdmaWrite {
                    "write"
                } else {
                    "read"
                },
                size_name(size.into())
            ),
            Figure::Latency => format!("doorbell to completion, {LAT_SIZE} B SRD send"),
        }
    }
}

fn size_name(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

impl Requester {
    /// The requester's retransmissions, probes and receiver-not-ready
    /// waits so far.
    fn resends(&self) -> (u64, u64, u64) {
        let retrans = self.f.dev.stats().network.retrans_pkts;
        let c = self.f.dev.counters();
        (retrans, c.probes, c.rnr_waits)
    }

    /// Runs `fig` for `until` (after a fifth of it unmeasured).
    fn run(&mut self, peer: &mut Peer, t: Target, fig: Figure, until: Until) -> Run {
        self.measure(peer, t, fig, until.warm(), false);
        self.measure(peer, t, fig, until, true)
    }

    fn measure(
        &mut self,
        peer: &mut Peer,
        t: Target,
        fig: Figure,
        until: Until,
        keep: bool,
    ) -> Run {
        let mut lat = Vec::with_capacity(if keep { 1 << 20 } else { 0 });
        let (peer_copied0, peer_allocs0) = peer.counts();
        let (retrans0, probes0, rnr0) = self.resends();
        let copied0 = efa_emu::copycount::total();
        let allocs0 = ALLOCS.load(Ordering::Relaxed);
        let start = Instant::now();
        let (msgs, size) = match fig {
            Figure::Send { batch } => (self.sends(peer, t, batch, until), SEND_SIZE),
            Figure::Rdma { op, size } => (self.rdma(t, op, size, until), size),
            Figure::Latency => (self.latency(peer, t, until, &mut lat), LAT_SIZE),
        };
        let secs = start.elapsed().as_secs_f64();
        let allocs1 = ALLOCS.load(Ordering::Relaxed);
        let copied1 = efa_emu::copycount::total();
        let (retrans1, probes1, rnr1) = self.resends();
        let (peer_copied1, peer_allocs1) = peer.counts();
        lat.sort();
        Run {
            msgs,
            bytes: msgs * u64::from(size),
            secs,
            lat,
            copied: copied0
                .zip(copied1)
                .map(|(a, b)| b - a + peer_copied1 - peer_copied0),
            allocs: allocs1 - allocs0 + peer_allocs1 - peer_allocs0,
            retrans: retrans1 - retrans0,
            probes: probes1 - probes0,
            rnr: rnr1 - rnr0,
        }
    }

    /// Waits for `n` send completions, serving the peer meanwhile.
    fn reap(&mut self, peer: &mut Peer, n: usize) {
        let mut got = 0;
        let t = Instant::now();
        while got < n {
            let k = self.ep.poll_each(|c| {
                assert_eq!(c.status(), CompStatus::Ok, "{c:?}");
            });
            got += k;
            peer.service();
            if k == 0 {
                assert!(t.elapsed() < PATIENCE, "{got} of {n} completions");
                std::thread::yield_now();
            }
        }
    }

    fn sends(&mut self, peer: &mut Peer, t: Target, batch: u16, until: Until) -> u64 {
        let wqes: Vec<Vec<u8>> = (0..batch)
            .map(|i| {
                let sge = self.buf.sge(u64::from(i) * 4096, SEND_SIZE);
                send_wqe(i, self.ah, t.qpn, QKEY, &[sge], None)
            })
            .collect();
        let start = Instant::now();
        let mut n = 0u64;
        while until.more(start, n) {
            for w in &wqes {
                self.ep.put_wqe(w);
            }
            self.ep.ring_sq();
            self.reap(peer, batch.into());
            n += u64::from(batch);
        }
        n
    }

    fn rdma(&mut self, t: Target, op: SendOpType, size: u32, until: Until) -> u64 {
        let wqes: Vec<Vec<u8>> = (0..DEPTH)
            .map(|i| {
                let off = u64::from(i) * u64::from(size);
                rdma_wqe(
                    op,
                    i,
                    self.ah,
                    t.qpn,
                    QKEY,
                    t.rkey,
                    t.iova + off,
                    self.buf.sge(off, size),
                    None,
                )
            })
            .collect();
        for w in &wqes {
            self.ep.put_wqe(w);
        }
        self.ep.ring_sq();
        let start = Instant::now();
        let mut n = 0u64;
        let mut outstanding = usize::from(DEPTH);
        let mut posted = u64::from(DEPTH);
        let mut free = [0u16; DEPTH as usize];
        let patience = Instant::now();
        let mut progress = patience;
        while outstanding > 0 {
            let mut k = 0;
            self.ep.poll_each(|c| {
                assert_eq!(c.status(), CompStatus::Ok, "{c:?}");
                free[k] = c.req_id();
                k += 1;
            });
            n += k as u64;
            outstanding -= k;
            if k > 0 {
                progress = Instant::now();
            }
            if until.more(start, posted) {
                for &slot in &free[..k] {
                    self.ep.put_wqe(&wqes[usize::from(slot)]);
                }
                if k > 0 {
                    self.ep.ring_sq();
                    outstanding += k;
                    posted += k as u64;
                }
            }
            if k == 0 {
                assert!(!until.stalled(patience, progress), "RDMA stalled");
                std::thread::yield_now();
            }
        }
        n
    }

    fn latency(
        &mut self,
        peer: &mut Peer,
        t: Target,
        until: Until,
        lat: &mut Vec<Duration>,
    ) -> u64 {
        let wqe = send_wqe(0, self.ah, t.qpn, QKEY, &[self.buf.sge(0, LAT_SIZE)], None);
        let start = Instant::now();
        let mut n = 0u64;
        while until.more(start, n) {
            let t0 = Instant::now();
            self.ep.put_wqe(&wqe);
            self.ep.ring_sq();
            loop {
                let k = self.ep.poll_each(|c| {
                    assert_eq!(c.status(), CompStatus::Ok, "{c:?}");
                });
                if k > 0 {
                    break;
                }
                // As the other figures wait: the requester's data path
                // may share this core (it does when pinned), and a host
                // kernel that preempts only at its tick (8 ms on one
                // development machine) left it that long without one.
                std::thread::yield_now();
            }
            let d = t0.elapsed();
            if lat.len() < lat.capacity() {
                lat.push(d);
            }
            peer.service();
            n += 1;
        }
        n
    }
}

/// Page-aligned memory of `len` bytes.
struct Pages {
    ptr: *mut u8,
    layout: Layout,
}

impl Pages {
    fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len.max(1), 4096).expect("layout");
        // SAFETY: a non-zero size; the pointer is checked before use.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null(), "out of memory");
        // SAFETY: `ptr` points at `len` bytes just allocated; writing them
        // makes the pages real before they are timed.
        unsafe { std::ptr::write_bytes(ptr, 0x3c, len) };
        Self { ptr, layout }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// memcpy of `size` bytes cycling over `n` page-aligned buffer pairs:
/// copies per second.
fn memcpy_rate(size: usize, n: usize, secs: f64) -> f64 {
    let stride = size.div_ceil(4096) * 4096;
    let src = Pages::new(stride * n);
    let dst = Pages::new(stride * n);
    let dur = Duration::from_secs_f64(secs / 4.0);
    // Rounds between looks at the clock: at least 64 KiB of copying, so
    // that reading the clock costs next to nothing.
    let rounds = (65536 / (size * n)).max(1);
    let start = Instant::now();
    let mut copies = 0u64;
    while start.elapsed() < dur {
        for _ in 0..rounds {
            for i in 0..n {
                // SAFETY: both buffers hold `n` strides of at least `size`
                // bytes and are distinct allocations.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.ptr.add(i * stride),
                        std::hint::black_box(dst.ptr.add(i * stride)),
                        size,
                    )
                };
            }
        }
        copies += (rounds * n) as u64;
    }
    copies as f64 / start.elapsed().as_secs_f64()
}

fn rate(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.0} ")
    }
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

/// Prints one row: the figure, its value, memcpy's, the ratio and the
/// counts.
fn row(fig: Figure, mode: &str, r: &Run, secs: f64) {
    let per = |x: u64| x as f64 / r.msgs.max(1) as f64;
    let copies = r.copied.map_or("n/a".to_string(), |c| {
        format!("{:.2}", c as f64 / r.bytes.max(1) as f64)
    });
    let (value, memcpy, ratio) = match fig {
        Figure::Send { batch } => {
            let v = r.msgs as f64 / r.secs;
            let m = memcpy_rate(SEND_SIZE as usize, batch.into(), secs);
            (
                format!("{}msg/s", rate(v)),
                format!("{}msg/s", rate(m)),
                format!("1/{:.0}", m / v),
            )
        }
        Figure::Rdma { size, .. } => {
            let v = r.bytes as f64 / r.secs;
            let m = memcpy_rate(size as usize, DEPTH.into(), secs) * f64::from(size);
            (
                format!("{}B/s", rate(v)),
                format!("{}B/s", rate(m)),
                format!("{:.0}%", 100.0 * v / m),
            )
        }
        Figure::Latency => {
            let p = |q: f64| r.lat[((r.lat.len() - 1) as f64 * q) as usize];
            let m = memcpy_rate(LAT_SIZE as usize, 1, secs);
            (
                format!("p50 {} / p99 {} us", us(p(0.5)), us(p(0.99))),
                format!("{:.1} ns", 1e9 / m),
                String::new(),
            )
        }
    };
    println!(
        "{:<40} {:<4} {:>26} {:>14} {:>7} {:>9} {:>10} {:>8} {:>7} {:>5}",
        fig.name(),
        mode,
        value,
        memcpy,
        ratio,
        copies,
        format!("{:.1}", per(r.allocs)),
        r.retrans,
        r.probes,
        r.rnr
    );
}

/// What a run measures: each figure for a time or a number of messages,
/// memcpy for `secs`, the figures whose names end with `figure`.
struct Opts {
    until: Until,
    secs: f64,
    figure: Option<String>,
}

fn figures(o: &Opts) -> Vec<Figure> {
    let mut v: Vec<Figure> = [1, 16, 64]
        .into_iter()
        .map(|batch| Figure::Send { batch })
        .collect();
    for size in [64 << 10, 1 << 20] {
        for op in [SendOpType::RdmaWrite, SendOpType::RdmaRead] {
            v.push(Figure::Rdma { op, size });
        }
    }
    v.push(Figure::Latency);
    v.retain(|f| {
        o.figure
            .as_ref()
            .is_none_or(|t| t.split('|').any(|t| f.name().ends_with(t)))
    });
    v
}

fn requester(f: Fake, target_gid: [u8; 16]) -> Requester {
    let mut f = f;
    let ep = f.ep(requester_opts());
    let buf = f.mr_scattered(ep.pd, RDMA_BUF, ALL_PERMS, 0xa5);
    let ah = f.ah(ep.pd, target_gid);
    Requester { f, ep, buf, ah }
}

fn one_process(o: &Opts) {
    let (a, b) = pair(config(0, None), config(1, None));
    let gid = b.dev.config().gid;
    let r = Responder::new(b);
    let t = Target {
        gid,
        qpn: r.ep.qpn,
        rkey: r.buf.key,
        iova: r.buf.iova,
    };
    let mut req = requester(a, t.gid);
    let mut peer = Peer::Local(Box::new(r));
    for fig in figures(o) {
        let run = req.run(&mut peer, t, fig, o.until);
        row(fig, "1p", &run, o.secs);
    }
}

fn two_processes(o: &Opts, udp: bool) {
    let dir = std::env::temp_dir().join(format!("efa-emu-bench-{}", std::process::id()));
    let (net, label) = if udp {
        (
            Net::Udp(20_000 + (std::process::id() % 5000) as u16 * 2),
            "2u",
        )
    } else {
        (Net::Unix(dir.clone()), "2p")
    };
    let mut child = Command::new(std::env::current_exe().expect("this program"))
        .args((!PINNED.get().expect("set in main")).then_some("--no-pin"))
        .arg("--peer")
        .arg(net.arg())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the second process");
    let to = child.stdin.take().expect("stdin");
    let mut from = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    from.read_line(&mut line).expect("the child's address");
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(w.first(), Some(&"ready"), "child said {line:?}");
    let t = Target {
        gid: unhex(w[1]),
        qpn: w[2].parse().expect("QP number"),
        rkey: w[3].parse().expect("rkey"),
        iova: w[4].parse().expect("address"),
    };
    let mut req = requester(Fake::up(config(0, Some(&net))), t.gid);
    let mut peer = Peer::Remote {
        child,
        to: Some(to),
        from,
    };
    for fig in figures(o) {
        let run = req.run(&mut peer, t, fig, o.until);
        row(fig, label, &run, o.secs);
    }
    drop(peer);
    drop(req);
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut secs = 1.0f64;
    let mut only: Option<String> = None;
    let mut msgs: Option<u64> = None;
    let mut figure: Option<String> = None;
    let mut pinned = true;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--no-pin" => pinned = false,
            "--peer" => {
                // As the first process decided.
                PINNED.set(pinned).expect("once");
                peer_main(&Net::parse(&args.next().expect("--peer NET")));
                return;
            }
            "--seconds" => {
                secs = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--seconds S")
            }
            "--only" => only = args.next(),
            "--msgs" => msgs = Some(args.next().and_then(|s| s.parse().ok()).expect("--msgs N")),
            "--figure" => figure = Some(args.next().expect("--figure TEXT")),
            // What cargo bench passes.
            "--bench" => {}
            other => panic!("unknown argument {other:?}"),
        }
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    PINNED.set(pinned && cpus >= 2).expect("once");
    // The driver, and memcpy beside it, on the requester's core.
    pin_to_device(0);
    let placement = match place(0) {
        Some(_) => "threads that poll pinned: driver and requester on CPU 0, responder on CPU 1",
        None => "threads placed by the scheduler",
    };
    let copies = if efa_emu::copycount::total().is_some() {
        "counted"
    } else {
        "not counted (build with --features copy-count)"
    };
    let o = Opts {
        until: msgs.map_or(Until::Time(Duration::from_secs_f64(secs)), Until::Msgs),
        secs,
        figure,
    };
    let per = msgs.map_or(format!("{secs} s"), |n| format!("{n} messages"));
    println!(
        "efa-emu data path: {per} per figure; memcpy of the same size over as many \
         page-aligned buffers, same run; copies per payload byte {copies}; allocations \
         per message; retransmissions, probes (questions about late answers) and \
         receiver-not-ready waits by the requester; {placement}"
    );
    println!(
        "{:<40} {:<4} {:>26} {:>14} {:>7} {:>9} {:>10} {:>8} {:>7} {:>5}",
        "figure",
        "",
        "value",
        "memcpy",
        "ratio",
        "copies/B",
        "allocs/msg",
        "retrans",
        "probes",
        "rnr"
    );
    let run = |what: &str| only.as_deref().is_none_or(|o| o == what);
    if run("one") {
        one_process(&o);
    }
    if run("two") {
        two_processes(&o, false);
    }
    if run("udp") {
        two_processes(&o, true);
    }
}
