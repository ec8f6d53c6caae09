//! The EFA device model: register file, admin queue, AENQ, object tables.
//!
//! # Threads
//!
//! The transport calls [`PciFunction::bar_write`] on its own thread. Register
//! writes update [`State`] under one lock and return at once; a readless
//! read is answered in the call (the driver polls guest memory for it with
//! a 50 ms budget). The admin queue doorbell only records the producer
//! count and wakes the worker thread, which fetches the entries, executes
//! them and writes the completions later, in reverse order when several
//! arrive together (the driver matches them by command id). The worker
//! also posts the keep-alive events.
//!
//! Everything that touches device state holds the lock, so a device reset
//! never races a command half-way through: the command finishes (or the
//! reset waits for it), and nothing from before the reset is written
//! after it.
//!
//! # Device errors
//!
//! A DMA failure on the queues the device owns (AQ, ACQ, AENQ, readless
//! response) leaves it unable to talk to the driver: it logs the error,
//! sets `DEV_STS.FATAL_ERROR`, tries to post a fatal-error AENQ event and
//! stops processing until reset. A DMA failure on an address a command
//! carries (control buffer, page list) fails that command with
//! `MALFORMED_REQUEST`; ring addresses given at creation (CQ, EQ, RQ,
//! event counter) are checked there and refused with `ILLEGAL_PARAMETER`.

mod admin;
pub mod bar2;
pub mod config;
pub mod control;
pub mod datapath;
pub mod fabric;
pub mod hostile;
pub mod objects;
mod pbl;
pub mod profile;
mod storm;

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use efa_hw::admin::HostInfo;
use efa_hw::aenq::{AenqCommonDesc, AenqEntry, AenqGroup};
use efa_hw::regs::{self, Register};
use efa_hw::wire::Wire;

use crate::health::{Class, Health};
use crate::report;
use crate::shmem::SharedMem;
use crate::transport::{
    Bar, BarBacking, DmaError, GuestMemory, Interrupts, PciFunction, PciIdentity,
};

pub use config::{Config, InjectMode, InjectRule, Limits};
use objects::Objects;

/// The maps the data path and the fabric look up several times per packet
/// (see `foldhash` in Cargo.toml).
pub(crate) type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
pub use objects::Stats;

/// Size of BAR0: registers and the emulator's control window in the lower
/// half, the MSI-X table and PBA (owned by the transport) in the upper.
pub const BAR0_SIZE: u64 = 16 << 10;

/// PCI class of EFA functions: network controller, Ethernet.
pub const PCI_CLASS_ETHERNET: u32 = 0x02_00_00;

/// `CAPS.RESET_TIMEOUT` in 100 ms units. The reset handshake completes at
/// once here; the value bounds how long a driver waits on a dead device.
const RESET_TIMEOUT_UNITS: u32 = 5;
/// `CAPS.DMA_ADDR_WIDTH`.
const DMA_ADDR_WIDTH: u32 = 48;
/// Largest admin queue depth accepted (command ids have 12 bits).
const MAX_AQ_DEPTH: u32 = 4096;

/// Counters of what the model did, for logs, tests and the control window.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ModelCounters {
    /// Admin commands fetched.
    pub admin_cmds: u64,
    /// Admin completions with a status other than success.
    pub admin_errors: u64,
    /// Commands failed or dropped by injection.
    pub injected: u64,
    /// Keep-alive events posted.
    pub keep_alives: u64,
    /// AENQ events dropped because the queue was full.
    pub aenq_dropped: u64,
    /// DMA accesses that failed.
    pub dma_errors: u64,
    /// Readless reads answered.
    pub readless_reads: u64,
    /// Device resets (DEV_CTL and transport).
    pub resets: u64,
    /// Buffers written by late completions (`COMMAND` 7).
    pub late_writes: u64,
    /// Register reads of BAR0 outside the control window (trapped MMIO).
    pub reg_reads: u64,
    /// Register writes to BAR0 outside the control window (trapped MMIO;
    /// a 64-bit store is one). Doorbells and LLQ stores to the shared BARs
    /// never trap, so they are not here.
    pub reg_writes: u64,
    /// SRD probes sent: questions about requests whose answers were late
    /// (not retransmissions, which GET_STATS counts).
    pub probes: u64,
    /// SRD requests put off after a receiver-not-ready answer, each to be
    /// sent again a millisecond later (counted in neither of the above).
    pub rnr_waits: u64,
}

/// The guest's interrupts, with a count of the messages signalled for the
/// control window's `INTERRUPTS`: what a driver's verb cost in interrupts,
/// seen from the device, so that no guest-side accounting is needed.
pub(crate) struct CountedIrq {
    irq: Arc<dyn Interrupts>,
    signalled: AtomicU64,
}

impl CountedIrq {
    /// Signals MSI-X `vector` (dropped by the transport if the guest has not
    /// set it up, and counted all the same: the device sent it).
    fn signal(&self, vector: u16) {
        self.signalled.fetch_add(1, Ordering::Relaxed);
        self.irq.signal(vector);
    }

    fn signalled(&self) -> u64 {
        self.signalled.load(Ordering::Relaxed)
    }
}

/// The register values the driver writes.
#[derive(Debug, Default, Clone)]
struct Regs {
    aq_base_lo: u32,
    aq_base_hi: u32,
    aq_caps: u32,
    acq_base_lo: u32,
    acq_base_hi: u32,
    acq_caps: u32,
    aq_prod_db: u32,
    aenq_caps: u32,
    aenq_base_lo: u32,
    aenq_base_hi: u32,
    aenq_cons_db: u32,
    intr_mask: u32,
    dev_ctl: u32,
    mmio_reg_read: u32,
    mmio_resp_lo: u32,
    mmio_resp_hi: u32,
    eq_db: u32,
}

fn addr(hi: u32, lo: u32) -> u64 {
    u64::from(hi) << 32 | u64::from(lo)
}

/// All mutable device state, under one lock.
pub(crate) struct State {
    regs: Regs,
    /// The readless response address is set (LO written since reset).
    resp_valid: bool,
    /// Device consumer counter of the AQ (16 bits, as the doorbell).
    aq_cc: u16,
    /// Completions written to the ACQ.
    acq_pc: u32,
    /// Events written to the AENQ.
    aenq_pc: u32,
    fatal: bool,
    reset_in_progress: bool,
    reset_finished: bool,
    aq_restart_finished: bool,
    objs: Objects,
    llq: bar2::LlqPool,
    aenq_groups: u32,
    host_info: Option<HostInfo>,
    inject: HashMap<u8, InjectRule>,
    /// Last value written to the control window's INJECT register.
    inject_reg: u32,
    stats: Stats,
    counters: ModelCounters,
    keep_alive_ms: u32,
    /// `CAPS.ADMIN_CMD_TO`, in 100 ms units.
    admin_timeout_units: u32,
    next_keep_alive: Option<Instant>,
    stop: bool,
    /// The control window asked the data-path thread to panic (a test of
    /// efa-emu's own failure reporting).
    panic_requested: bool,
    /// Hostile mode: the malformation armed, if any.
    hostile: hostile::Hostile,
    /// Command id of the last completion written (hostile mode's stale ids).
    last_cmd_id: Option<u16>,
    /// Control window: the seed of the next malformation armed.
    hostile_seed: u64,
    /// Commands held for a late completion (an injected `Late` fault);
    /// a reset forgets them, as hardware forgets what it was doing.
    late: Vec<admin::Held>,
    /// A reset requested with commands held, until it completes.
    settling: Option<admin::Settling>,
    /// The first buffer named by the last command held (0: none).
    late_addr: u64,
    /// Last value written to the control window's HOSTILE register.
    hostile_reg: u32,
    /// The interrupt storm (control window `STORM_MS`).
    storm: storm::Storm,
    /// What the data path knows of the peers it sends SRD requests to.
    peers: datapath::Peers,
    /// The packets a data-path pass sent, handed to the fabric together
    /// when the pass ends ([`fabric::Fabric::send_all`]).
    outbox: Vec<fabric::Packet>,
}

/// What the worker and the callbacks share.
pub(crate) struct Inner {
    cfg: Config,
    layout: bar2::Layout,
    mem: Arc<dyn GuestMemory>,
    irq: CountedIrq,
    bar2: Arc<SharedMem>,
    state: Mutex<State>,
    wake: Condvar,
    /// Where packets for this device arrive; the data-path thread sleeps
    /// on it.
    port: Arc<fabric::Port>,
    /// The network to other devices.
    fabric: Arc<fabric::Fabric>,
    /// How long the data-path thread is to stand still once it sees this
    /// ([`EfaDevice::stall`]).
    stall: Mutex<Option<Duration>>,
    /// Stalls the data-path thread has begun.
    stalls_begun: std::sync::atomic::AtomicU64,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn health(&self) -> &Health {
        &self.cfg.health
    }

    /// Reads `len` bytes; `len` must be bounded by the caller (an entry, a
    /// page list within `max_mr_pages`, a HOST_INFO buffer).
    fn dma_read(&self, st: &mut State, addr: u64, len: usize) -> Result<Vec<u8>, DmaError> {
        let mut buf = vec![0u8; len];
        self.mem.read(addr, &mut buf).inspect_err(|e| {
            st.counters.dma_errors += 1;
            report!(
                self.health(),
                Error,
                Some(Class::DmaFailed),
                "dma-read",
                "{}: DMA read failed: {e}",
                self.name()
            );
        })?;
        Ok(buf)
    }

    /// Writes `bytes` at `addr` with the byte at `phase_at` last, so that a
    /// driver polling the phase never sees a new phase with old contents.
    fn publish(
        &self,
        st: &mut State,
        addr: u64,
        bytes: &[u8],
        phase_at: usize,
    ) -> Result<(), DmaError> {
        let len = bytes.len() as u64;
        let r = self.mem.check(addr, len, true).and_then(|()| {
            self.mem.write(addr, &bytes[..phase_at])?;
            self.mem
                .write(addr + phase_at as u64 + 1, &bytes[phase_at + 1..])?;
            fence(Ordering::SeqCst);
            self.mem
                .write(addr + phase_at as u64, &bytes[phase_at..=phase_at])
        });
        r.inspect_err(|e| {
            st.counters.dma_errors += 1;
            report!(
                self.health(),
                Error,
                Some(Class::DmaFailed),
                "dma-write",
                "{}: DMA write failed: {e}",
                self.name()
            );
        })
    }

    fn name(&self) -> String {
        format!("efa{}", self.cfg.index)
    }
}

/// The EFA PCI function.
pub struct EfaDevice {
    inner: Arc<Inner>,
    /// The admin worker and the data-path thread.
    worker: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for EfaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EfaDevice")
            .field("cfg", &self.inner.cfg)
            .field("layout", &self.inner.layout)
            .finish_non_exhaustive()
    }
}

impl EfaDevice {
    /// A device described by `cfg` that reaches the guest through `mem`
    /// and `irq`. Starts its worker thread.
    pub fn new(
        cfg: Config,
        mem: Arc<dyn GuestMemory>,
        irq: Arc<dyn Interrupts>,
    ) -> Result<Self, String> {
        cfg.validate()?;
        let layout = bar2::Layout::new(cfg.limits.max_uar, cfg.llq_pool_size);
        let bar2 = SharedMem::new(&format!("efa{}-bar2", cfg.index), layout.size as usize)
            .map_err(|e| format!("BAR2 memory: {e}"))?;
        let state = State::new(&cfg, &layout);
        let port = fabric::Port::new(cfg.gid, cfg.net_faults, cfg.health.clone());
        for (src, f) in &cfg.net_links {
            port.set_link_faults(*src, Some(*f))?;
        }
        let fabric = match &cfg.fabric {
            Some(f) => f.clone(),
            None => {
                let capture = match &cfg.capture {
                    Some(path) => {
                        Some(Arc::new(fabric::Capture::create(path).map_err(|e| {
                            format!("capture file {}: {e}", path.display())
                        })?))
                    }
                    None => None,
                };
                let (remote, what) = match (&cfg.udp, &cfg.fabric_dir) {
                    (Some(u), _) => (fabric::Remote::Udp(u.clone()), "UDP fabric".into()),
                    (None, Some(dir)) => (
                        fabric::Remote::Unix(dir.clone()),
                        format!("fabric in {}", dir.display()),
                    ),
                    (None, None) => (fabric::Remote::None, String::new()),
                };
                fabric::Fabric::new(remote, cfg.health.clone(), capture)
                    .map_err(|e| format!("{what}: {e}"))?
            }
        };
        fabric.attach(&port).map_err(|e| format!("fabric: {e}"))?;
        let inner = Arc::new(Inner {
            cfg,
            layout,
            mem,
            irq: CountedIrq {
                irq,
                signalled: AtomicU64::new(0),
            },
            bar2: Arc::new(bar2),
            state: Mutex::new(state),
            wake: Condvar::new(),
            port,
            fabric,
            stall: Mutex::new(None),
            stalls_begun: Default::default(),
        });
        inner.lock().hostile_from_config(&inner);
        let dev = Self {
            inner,
            worker: Mutex::new(Vec::new()),
        };
        dev.start_worker();
        Ok(dev)
    }

    fn start_worker(&self) {
        let mut w = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        if !w.is_empty() {
            return;
        }
        self.inner.lock().stop = false;
        let i = self.inner.cfg.index;
        type Body = fn(&Inner);
        let threads: [(String, Body); 2] = [
            (format!("efa{i}-worker"), worker),
            (format!("efa{i}-data"), datapath::run),
        ];
        for (name, body) in threads {
            let inner = self.inner.clone();
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || body(&inner))
            {
                Ok(h) => w.push(h),
                Err(e) => log::error!("cannot start a device thread: {e}"),
            }
        }
    }

    fn stop_worker(&self) {
        let handles = std::mem::take(&mut *self.worker.lock().unwrap_or_else(|e| e.into_inner()));
        if handles.is_empty() {
            return;
        }
        self.inner.lock().stop = true;
        self.inner.wake.notify_all();
        self.inner.port.kick();
        for h in handles {
            // The binary's panic hook ends the process at the panic; a
            // library user learns of it here.
            let name = h.thread().name().unwrap_or("device").to_owned();
            if h.join().is_err() {
                log::error!("{}: thread {name} panicked", self.inner.name());
            }
        }
    }

    /// The port this device receives packets on (its faults can be set).
    pub fn port(&self) -> Arc<fabric::Port> {
        self.inner.port.clone()
    }

    /// Stops the data-path thread for `d`, as a host that does not
    /// schedule it would: it handles no packet, doorbell or timer
    /// meanwhile, and packets wait in its port. Returns once the thread
    /// stands still (for `d` from then), or `false` if it did not begin
    /// to within 5 s (then it never does). For tests of what its peers
    /// make of the silence.
    #[must_use = "a stall that never began tests nothing"]
    pub fn stall(&self, d: Duration) -> bool {
        let begun = self.inner.stalls_begun.load(Ordering::SeqCst);
        *self.inner.stall.lock().unwrap_or_else(|e| e.into_inner()) = Some(d);
        self.inner.port.kick();
        let t = Instant::now();
        while self.inner.stalls_begun.load(Ordering::SeqCst) == begun {
            if t.elapsed() > Duration::from_secs(5) {
                let mut s = self.inner.stall.lock().unwrap_or_else(|e| e.into_inner());
                // Taken back, unless the thread took it meanwhile.
                if s.take().is_some() {
                    return false;
                }
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        true
    }

    /// The fabric this device's port is attached to.
    pub fn fabric(&self) -> Arc<fabric::Fabric> {
        self.inner.fabric.clone()
    }

    /// Traffic statistics of the whole device (as GET_STATS reports them).
    pub fn stats(&self) -> Stats {
        self.inner.lock().stats
    }

    /// The memory behind BAR2 (doorbells and LLQ), as the guest sees it.
    pub fn bar2(&self) -> Arc<SharedMem> {
        self.inner.bar2.clone()
    }

    /// Where things are in BAR2.
    pub fn bar2_layout(&self) -> bar2::Layout {
        self.inner.layout
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// What the model did so far.
    pub fn counters(&self) -> ModelCounters {
        self.inner.lock().counters
    }

    /// The host information the driver sent last (SET_FEATURE HOST_INFO).
    pub fn host_info(&self) -> Option<HostInfo> {
        self.inner.lock().host_info
    }

    /// Whether the device is in the fatal state.
    pub fn is_fatal(&self) -> bool {
        self.inner.lock().fatal
    }

    /// Live objects by kind: PDs, UARs, CQs, QPs, AHs, MRs, EQs, event
    /// counters; and LLQ pages in use.
    pub fn object_counts(&self) -> [usize; 9] {
        let st = self.inner.lock();
        let o = &st.objs;
        [
            o.pds.len(),
            o.uars.len(),
            o.cqs.len(),
            o.qps.len(),
            o.ahs.len(),
            o.mrs.len(),
            o.eqs.len(),
            o.counters.len(),
            st.llq.used_pages(),
        ]
    }
}

impl Drop for EfaDevice {
    fn drop(&mut self) {
        self.stop_worker();
        self.inner.fabric.detach(&self.inner.cfg.gid);
    }
}

fn worker(inner: &Inner) {
    let mut st = inner.lock();
    loop {
        if st.stop {
            return;
        }
        st.process_admin(inner);
        let now = Instant::now();
        st.keep_alive(inner, now);
        st.hostile_tick(inner, now);
        let next = match (st.next_keep_alive, st.hostile.busy()) {
            (at, true) => Some(at.map_or(now + hostile::TICK, |at| at.min(now + hostile::TICK))),
            (at, false) => at,
        };
        st = match next {
            Some(at) => {
                let wait = at.saturating_duration_since(Instant::now());
                inner
                    .wake
                    .wait_timeout(st, wait.max(Duration::from_millis(1)))
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => inner.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

fn admin_timeout_units(ms: u32) -> u32 {
    ms.div_ceil(regs::CAPS_TIMEOUT_UNIT_MS)
        .min(regs::CAPS_ADMIN_CMD_TO.max())
}

impl State {
    fn new(cfg: &Config, layout: &bar2::Layout) -> Self {
        let mut inject = HashMap::new();
        for r in cfg.inject.iter().filter(|r| r.count > 0) {
            inject.insert(r.opcode, *r);
        }
        Self {
            regs: Regs::default(),
            resp_valid: false,
            aq_cc: 0,
            acq_pc: 0,
            aenq_pc: 0,
            fatal: false,
            reset_in_progress: false,
            reset_finished: false,
            aq_restart_finished: false,
            objs: Objects::new(&cfg.limits),
            llq: bar2::LlqPool::new(layout),
            aenq_groups: 0,
            host_info: None,
            inject,
            inject_reg: 0,
            stats: Stats::default(),
            counters: ModelCounters::default(),
            keep_alive_ms: cfg.keep_alive_ms,
            admin_timeout_units: admin_timeout_units(cfg.admin_timeout_ms),
            next_keep_alive: None,
            stop: false,
            panic_requested: false,
            hostile: hostile::Hostile::default(),
            last_cmd_id: None,
            hostile_seed: 0,
            hostile_reg: 0,
            late: Vec::new(),
            settling: None,
            late_addr: 0,
            storm: storm::Storm::default(),
            peers: datapath::Peers::default(),
            outbox: Vec::new(),
        }
    }

    /// Everything a device reset clears: queues, objects, BAR2 contents,
    /// the readless address, the fatal state. What the emulator's control
    /// window set (injections, timeouts, keep-alive period) stays.
    fn reset_device(&mut self, inner: &Inner) {
        self.counters.resets += 1;
        self.regs = Regs::default();
        self.resp_valid = false;
        self.aq_cc = 0;
        self.acq_pc = 0;
        self.aenq_pc = 0;
        self.fatal = false;
        self.aq_restart_finished = false;
        self.last_cmd_id = None;
        self.late.clear();
        self.storm.reset();
        self.scrub_bar2(inner);
        self.objs.clear();
        self.llq.clear();
        self.aenq_groups = 0;
        self.host_info = None;
        self.stats = Stats::default();
        self.peers = datapath::Peers::default();
        self.next_keep_alive = None;
        inner.port.clear();
    }

    /// Zeroes the doorbell pages of live UARs and the live LLQs.
    fn scrub_bar2(&mut self, inner: &Inner) {
        for (h, _) in self.objs.uars.iter() {
            if let Some(i) = self.objs.uars.index_of(h) {
                bar2::scrub(&inner.bar2, inner.layout.doorbell(i, 0), bar2::PAGE);
            }
        }
        for (_, qp) in self.objs.qps.iter() {
            bar2::scrub(&inner.bar2, qp.llq_offset, qp.llq_pages * bar2::PAGE);
        }
    }

    fn dev_sts(&self) -> u32 {
        let settling = self.settling.is_some();
        regs::DEV_STS_READY.prep(1)
            | regs::DEV_STS_RESET_IN_PROGRESS.prep((self.reset_in_progress || settling).into())
            | regs::DEV_STS_RESET_FINISHED.prep((self.reset_finished && !settling).into())
            | regs::DEV_STS_AQ_RESTART_FINISHED.prep(self.aq_restart_finished.into())
            | regs::DEV_STS_FATAL_ERROR.prep(self.fatal.into())
    }

    fn caps(&self) -> u32 {
        regs::CAPS_CONTIGUOUS_QUEUE_REQUIRED.prep(1)
            | regs::CAPS_RESET_TIMEOUT.prep(RESET_TIMEOUT_UNITS)
            | regs::CAPS_DMA_ADDR_WIDTH.prep(DMA_ADDR_WIDTH)
            | regs::CAPS_ADMIN_CMD_TO.prep(self.admin_timeout_units)
    }

    /// The value a read of register `offset` returns (readless or plain).
    fn reg_value(&self, inner: &Inner, offset: u64) -> u32 {
        let r = &self.regs;
        let Some(reg) = Register::from_offset(offset) else {
            return 0;
        };
        match reg {
            Register::Version => inner.cfg.version(),
            Register::ControllerVersion => regs::controller_version(0, 1, 0),
            Register::Caps => self.caps(),
            Register::AqBaseLo => r.aq_base_lo,
            Register::AqBaseHi => r.aq_base_hi,
            Register::AqCaps => r.aq_caps,
            Register::AcqBaseLo => r.acq_base_lo,
            Register::AcqBaseHi => r.acq_base_hi,
            Register::AcqCaps => r.acq_caps,
            Register::AqProdDb => r.aq_prod_db,
            Register::AenqCaps => r.aenq_caps,
            Register::AenqBaseLo => r.aenq_base_lo,
            Register::AenqBaseHi => r.aenq_base_hi,
            Register::AenqConsDb => r.aenq_cons_db,
            Register::IntrMask => r.intr_mask,
            Register::DevCtl => r.dev_ctl,
            Register::DevSts => self.dev_sts(),
            Register::MmioRegRead => r.mmio_reg_read,
            Register::MmioRespLo => r.mmio_resp_lo,
            Register::MmioRespHi => r.mmio_resp_hi,
            Register::EqDb => r.eq_db,
        }
    }

    fn reg_write(&mut self, inner: &Inner, offset: u64, v: u32) {
        let Some(reg) = Register::from_offset(offset) else {
            log::debug!(
                "{}: write {v:#x} to unused register {offset:#x}",
                inner.name()
            );
            return;
        };
        let r = &mut self.regs;
        match reg {
            Register::AqBaseLo => r.aq_base_lo = v,
            Register::AqBaseHi => r.aq_base_hi = v,
            Register::AqCaps => r.aq_caps = v,
            Register::AcqBaseLo => r.acq_base_lo = v,
            Register::AcqBaseHi => r.acq_base_hi = v,
            Register::AcqCaps => r.acq_caps = v,
            Register::AqProdDb => {
                r.aq_prod_db = v;
                inner.wake.notify_all();
            }
            Register::AenqCaps => r.aenq_caps = v,
            Register::AenqBaseLo => r.aenq_base_lo = v,
            Register::AenqBaseHi => r.aenq_base_hi = v,
            Register::AenqConsDb => {
                let old = std::mem::replace(&mut r.aenq_cons_db, v);
                self.storm.doorbell(old, v);
            }
            Register::IntrMask => r.intr_mask = v,
            Register::DevCtl => self.dev_ctl(inner, v),
            Register::MmioRegRead => {
                r.mmio_reg_read = v;
                self.readless(inner, v);
            }
            Register::MmioRespLo => {
                r.mmio_resp_lo = v;
                self.resp_valid = true;
            }
            Register::MmioRespHi => r.mmio_resp_hi = v,
            Register::EqDb => {
                r.eq_db = v;
                self.arm_eq(inner, regs::EQ_DB_EQN.get(v), regs::EQ_DB_ARM.is_set(v));
            }
            Register::Version | Register::ControllerVersion | Register::Caps | Register::DevSts => {
                log::debug!("{}: write {v:#x} to read-only {reg:?}", inner.name())
            }
        }
    }

    fn dev_ctl(&mut self, inner: &Inner, v: u32) {
        self.regs.dev_ctl = v;
        let reset = regs::DEV_CTL_DEV_RESET.is_set(v);
        // Hostile mode (`reset-stuck`) may leave a reset in progress for
        // ever; a new reset request starts over.
        if reset && (!self.reset_in_progress || self.hostile.reset_stuck) {
            if !self.hostile_reset(inner) {
                return;
            }
            let stuck = self.hostile.reset_stuck;
            let raw = regs::DEV_CTL_RESET_REASON.get(v);
            match regs::ResetReason::try_from(raw) {
                Ok(reason) => report!(
                    inner.health(),
                    Info,
                    None,
                    "reset",
                    "{}: device reset ({reason:?})",
                    inner.name()
                ),
                Err(_) => report!(
                    inner.health(),
                    Info,
                    None,
                    "reset",
                    "{}: device reset (reason {raw})",
                    inner.name()
                ),
            }
            self.reset_with_held(inner);
            self.reset_device(inner);
            // reset_device cleared the registers; keep what was just written.
            self.regs.dev_ctl = v;
            self.reset_in_progress = true;
            self.reset_finished = false;
            self.hostile.reset_stuck = stuck;
        } else if !reset && self.reset_in_progress && !self.hostile.reset_stuck {
            self.reset_in_progress = false;
            self.reset_finished = true;
        }
        if regs::DEV_CTL_AQ_RESTART.is_set(v) {
            // Start the admin queues over, empty; objects stay.
            report!(
                inner.health(),
                Info,
                None,
                "aq-restart",
                "{}: admin queue restart",
                inner.name()
            );
            self.aq_cc = 0;
            self.regs.aq_prod_db = 0;
            self.acq_pc = 0;
            self.aq_restart_finished = true;
        }
    }

    fn readless(&mut self, inner: &Inner, v: u32) {
        self.settle(inner);
        let req_id = regs::MMIO_REG_READ_REQ_ID.get(v) as u16;
        let reg_off = regs::MMIO_REG_READ_REG_OFF.get(v) as u16;
        if !self.resp_valid {
            report!(
                inner.health(),
                Warn,
                Some(Class::GuestBug),
                "readless-no-address",
                "{}: guest bug: readless read of {reg_off:#x} with no response address",
                inner.name()
            );
            return;
        }
        let Some(answer_off) = self.hostile_readless(inner, reg_off) else {
            return;
        };
        let resp = regs::MmioReadLessResp {
            req_id,
            reg_off: answer_off,
            reg_val: self.reg_value(inner, answer_off.into()),
        };
        self.counters.readless_reads += 1;
        // The driver polls req_id, so it goes last: whatever the driver
        // reads once it matches is already the answer.
        let at = addr(self.regs.mmio_resp_hi, self.regs.mmio_resp_lo);
        let bytes = resp.to_bytes();
        let ok = inner
            .mem
            .check(at, bytes.len() as u64, true)
            .and_then(|()| inner.mem.write(at + 2, &bytes[2..]))
            .and_then(|()| {
                fence(Ordering::SeqCst);
                inner.mem.write(at, &bytes[..2])
            });
        if let Err(e) = ok {
            self.counters.dma_errors += 1;
            self.enter_fatal(
                inner,
                Some(Class::DmaFailed),
                &format!("readless response: {e}"),
            );
        }
    }

    /// The device can no longer talk to the driver. `cause` is the class
    /// of what led here, unless it was counted already (a DMA failure
    /// [`Inner::dma_read`] or [`Inner::publish`] reported).
    fn enter_fatal(&mut self, inner: &Inner, cause: Option<Class>, why: &str) {
        if self.enter_fatal_silently(inner, cause, why) {
            if let Err(e) = self.post_aenq(inner, AenqGroup::FatalError, 0, true) {
                log::error!("{}: cannot report the fatal error: {e}", inner.name());
            }
        }
    }

    /// The fatal state without its AENQ event: only `DEV_STS.FATAL_ERROR`
    /// tells, which a driver sees if it reads the register (a device whose
    /// AENQ is wedged, or that fails before it can post). Returns whether
    /// the device was not fatal before.
    fn enter_fatal_silently(&mut self, inner: &Inner, cause: Option<Class>, why: &str) -> bool {
        if self.fatal {
            return false;
        }
        report!(
            inner.health(),
            Error,
            cause,
            "fatal",
            "{}: device error: {why}; fatal until reset",
            inner.name()
        );
        self.fatal = true;
        true
    }

    fn aenq_ready(&self) -> Option<(u64, u32, u16)> {
        let r = &self.regs;
        let depth = regs::AENQ_CAPS_AENQ_DEPTH.get(r.aenq_caps);
        let size = regs::AENQ_CAPS_AENQ_ENTRY_SIZE.get(r.aenq_caps);
        let base = addr(r.aenq_base_hi, r.aenq_base_lo);
        let vector = regs::AENQ_CAPS_AENQ_MSIX_VECTOR.get(r.aenq_caps) as u16;
        (depth.is_power_of_two() && size as usize == AenqEntry::SIZE && base != 0)
            .then_some((base, depth, vector))
    }

    /// Posts an event of `group` if the driver enabled the group and the
    /// AENQ is set up. `force` posts in the fatal state too.
    fn post_aenq(
        &mut self,
        inner: &Inner,
        group: AenqGroup,
        syndrome: u16,
        force: bool,
    ) -> Result<bool, DmaError> {
        if (self.fatal && !force) || self.aenq_groups & group.bit() == 0 {
            return Ok(false);
        }
        self.post_aenq_raw(inner, group.raw(), syndrome)
    }

    /// Posts an event of group number `group`, enabled or not, defined or
    /// not (hostile mode sends undefined ones), if the AENQ is set up.
    fn post_aenq_raw(
        &mut self,
        inner: &Inner,
        group: u16,
        syndrome: u16,
    ) -> Result<bool, DmaError> {
        let Some((_, depth, vector)) = self.aenq_ready() else {
            return Ok(false);
        };
        if self.aenq_pc.wrapping_sub(self.regs.aenq_cons_db) >= depth {
            self.counters.aenq_dropped += 1;
            report!(
                inner.health(),
                Warn,
                None,
                "aenq-full",
                "{}: AENQ full, group {group} event dropped",
                inner.name()
            );
            return Ok(false);
        }
        self.write_aenq(inner, group, syndrome)?;
        inner.irq.signal(vector);
        Ok(true)
    }

    /// Writes an event of group number `group` at the producer position,
    /// room or not (the caller checks, or is the storm, which does not
    /// care); raises no interrupt.
    fn write_aenq(&mut self, inner: &Inner, group: u16, syndrome: u16) -> Result<(), DmaError> {
        let Some((base, depth, _)) = self.aenq_ready() else {
            return Ok(());
        };
        let slot = self.aenq_pc % depth;
        let phase = u8::from((self.aenq_pc / depth) % 2 == 0);
        let mut e = AenqEntry::ZERO;
        e.aenq_common_desc.group = group;
        e.aenq_common_desc.syndrome = syndrome;
        e.aenq_common_desc.flags = AenqCommonDesc::PHASE.prep(phase);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        e.aenq_common_desc.set_timestamp(now);
        // The base is the driver's: an address past the end of the address
        // space is a failed DMA, not an overflow.
        let at = base
            .checked_add(u64::from(slot) * AenqEntry::SIZE as u64)
            .ok_or(DmaError {
                addr: base,
                len: AenqEntry::SIZE,
            })?;
        // The phase lives in `flags`, byte 4.
        inner.publish(self, at, &e.to_bytes(), 4)?;
        self.aenq_pc = self.aenq_pc.wrapping_add(1);
        Ok(())
    }

    fn keep_alive(&mut self, inner: &Inner, now: Instant) {
        if self.keep_alive_ms == 0 {
            self.next_keep_alive = None;
            return;
        }
        let period = Duration::from_millis(self.keep_alive_ms.into());
        match self.next_keep_alive {
            None => self.next_keep_alive = Some(now + period),
            Some(at) if now >= at => {
                self.next_keep_alive = Some(now + period);
                if self.reset_in_progress {
                    return;
                }
                match self.post_aenq(inner, AenqGroup::KeepAlive, 0, false) {
                    Ok(true) => self.counters.keep_alives += 1,
                    Ok(false) => {}
                    Err(e) => self.enter_fatal(inner, None, &format!("AENQ write: {e}")),
                }
            }
            Some(_) => {}
        }
    }
}

impl PciFunction for EfaDevice {
    fn identity(&self) -> PciIdentity {
        PciIdentity {
            vendor: regs::PCI_VENDOR_ID_AMAZON,
            device: self.inner.cfg.device_id,
            subsystem_vendor: regs::PCI_VENDOR_ID_AMAZON,
            subsystem: self.inner.cfg.device_id,
            revision: 0,
            class: PCI_CLASS_ETHERNET,
        }
    }

    fn bars(&self) -> Vec<Bar> {
        vec![
            Bar {
                index: regs::REG_BAR,
                size: BAR0_SIZE,
                is_64bit: false,
                prefetchable: false,
                io_space: false,
                backing: BarBacking::Trapped,
            },
            // Hostile mode `bar-io`: BAR2 as I/O space, with nothing
            // behind it.
            if self
                .inner
                .cfg
                .hostile
                .is_some_and(|h| h.malformation == hostile::Malformation::BarIo)
            {
                Bar {
                    index: regs::MEM_BAR,
                    size: bar2::PAGE,
                    is_64bit: false,
                    prefetchable: false,
                    io_space: true,
                    backing: BarBacking::Trapped,
                }
            } else {
                Bar {
                    index: regs::MEM_BAR,
                    size: self.inner.layout.size,
                    is_64bit: true,
                    prefetchable: true,
                    io_space: false,
                    backing: BarBacking::Shared(self.inner.bar2.clone()),
                }
            },
        ]
    }

    fn msix_vectors(&self) -> u16 {
        self.inner.cfg.msix_vectors
    }

    fn bar_read(&self, bar: u8, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if bar != regs::REG_BAR || data.len() != 4 || offset % 4 != 0 {
            log::debug!("ignored read of BAR{bar} {offset:#x}/{}", data.len());
            return;
        }
        let mut st = self.inner.lock();
        let v = if control::owns(offset) {
            if self.inner.cfg.test_control {
                control::read(&st, &self.inner, offset - control::BASE)
            } else {
                control::read_off(offset - control::BASE)
            }
        } else {
            st.counters.reg_reads += 1;
            st.settle(&self.inner);
            st.reg_value(&self.inner, offset)
        };
        data.copy_from_slice(&v.to_le_bytes());
    }

    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]) {
        if bar != regs::REG_BAR || offset % 4 != 0 || !matches!(data.len(), 4 | 8) {
            log::debug!("ignored write to BAR{bar} {offset:#x}/{}", data.len());
            return;
        }
        let mut exit = false;
        let storm;
        {
            let mut st = self.inner.lock();
            if !control::owns(offset) {
                st.counters.reg_writes += 1;
            }
            for (i, word) in data.chunks_exact(4).enumerate() {
                let off = offset + 4 * i as u64;
                let v = u32::from_le_bytes(word.try_into().expect("4-byte chunk"));
                if control::owns(off) {
                    if self.inner.cfg.test_control {
                        exit |= control::write(&mut st, &self.inner, off - control::BASE, v);
                    } else {
                        log::debug!(
                            "{}: write {v:#x} to the control window, which is off",
                            self.inner.name()
                        );
                    }
                } else {
                    st.reg_write(&self.inner, off, v);
                }
            }
            storm = st.storm.take_spawn();
        }
        if storm {
            storm::spawn(&self.inner);
        }
        if exit {
            log::warn!(
                "{}: exit requested through the control window",
                self.inner.name()
            );
            match &self.inner.cfg.on_exit {
                Some(hook) => hook(),
                None => log::warn!("{}: no exit hook; ignored", self.inner.name()),
            }
        }
    }

    fn reset(&self) {
        {
            let mut st = self.inner.lock();
            st.reset_device(&self.inner);
            // A function reset ends a device reset in progress too.
            st.settling = None;
            st.reset_in_progress = false;
            st.reset_finished = false;
        }
        self.start_worker();
    }

    fn shutdown(&self) {
        self.stop_worker();
        // The guest's memory went with the session: a reset forgets the
        // queues it held, so that nothing (a request through the control
        // socket between sessions: a fatal error, an event, a late
        // completion) reaches for it.
        self.inner.lock().reset_device(&self.inner);
    }
}
