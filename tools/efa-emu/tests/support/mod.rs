//! A fake EFA driver that talks to the model in-process: guest RAM is a
//! buffer it owns, interrupts are counters, and it brings the device up and
//! runs admin commands the way the Linux C driver does.

#![allow(dead_code)]

pub mod dp;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use efa_emu::device::config::Config;
use efa_emu::device::EfaDevice;
use efa_emu::shmem::SharedMem;
use efa_emu::transport::{DmaError, GuestMemory, HostRange, Interrupts, Lent, PciFunction};
use efa_hw::admin::*;
use efa_hw::aenq::{AenqCommonDesc, AenqEntry, DRIVER_ENABLED_GROUPS};
use efa_hw::regs::{self, *};
use efa_hw::wire::Wire;

/// Guest RAM: `[BASE, BASE + size)`, a memfd mapping as QEMU's guest RAM
/// is (the device reaches it by raw copies, with no lock of its own).
pub struct Ram {
    mem: SharedMem,
    /// The memfd, as the fabric offers it to another process.
    file: Arc<std::fs::File>,
    /// Bytes still reachable from `BASE` ([`Ram::truncate`] lowers it).
    size: AtomicUsize,
}

/// Where fake guest RAM starts.
pub const BASE: u64 = 0x4000_0000;
/// An address no DMA can reach.
pub const OUTSIDE: u64 = 0x1000;
/// Bytes of fake guest RAM.
pub const RAM_SIZE: usize = 48 << 20;

impl Ram {
    /// `size` zeroed bytes at `BASE` in a memfd that is not sealed (a
    /// memfd created without `MFD_ALLOW_SEALING`): one another process's
    /// fabric must refuse to map.
    pub fn unsealed(size: usize) -> Self {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        // SAFETY: memfd_create with a literal name and a defined flag.
        let fd = unsafe { libc::memfd_create(c"fake-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate of our descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) }, 0);
        let file = Arc::new(std::fs::File::from(fd.try_clone().expect("dup")));
        Self {
            mem: SharedMem::map(fd, size).expect("mapping"),
            file,
            size: AtomicUsize::new(size),
        }
    }

    /// `size` zeroed bytes at `BASE`.
    pub fn new(size: usize) -> Self {
        Self::named("fake-guest-ram", size)
    }

    /// [`Ram::new`] in a memfd named `name` (as `/proc/<pid>/maps` shows
    /// it, in this process and in a peer that maps it).
    pub fn named(name: &str, size: usize) -> Self {
        let mem = SharedMem::new(name, size).expect("guest RAM memfd");
        let file = Arc::new(std::fs::File::from(
            mem.fd().try_clone_to_owned().expect("dup of the memfd"),
        ));
        Self {
            mem,
            file,
            size: AtomicUsize::new(size),
        }
    }

    fn range(&self, addr: u64, len: usize) -> Result<usize, DmaError> {
        let err = DmaError { addr, len };
        let size = self.size.load(Ordering::Acquire) as u64;
        let start = addr.checked_sub(BASE).ok_or(err)?;
        let end = start.checked_add(len as u64).ok_or(err)?;
        if end > size {
            return Err(err);
        }
        Ok(start as usize)
    }

    pub fn get(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        self.read(addr, &mut b).unwrap();
        b
    }

    pub fn put(&self, addr: u64, data: &[u8]) {
        self.write(addr, data).unwrap();
    }

    /// Guest RAM ends at `BASE + len` from now on (memory taken away under
    /// the device's feet).
    pub fn truncate(&self, len: usize) {
        self.size.fetch_min(len, Ordering::AcqRel);
    }

    pub fn u64(&self, addr: u64) -> u64 {
        let mut b = [0u8; 8];
        self.read(addr, &mut b).unwrap();
        u64::from_le_bytes(b)
    }
}

impl GuestMemory for Ram {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let at = self.range(addr, buf.len())?;
        self.mem.read(at, buf).map_err(|_| DmaError {
            addr,
            len: buf.len(),
        })
    }

    fn read_uninit(
        &self,
        addr: u64,
        buf: &mut [std::mem::MaybeUninit<u8>],
    ) -> Result<(), DmaError> {
        let at = self.range(addr, buf.len())?;
        self.mem.read_uninit(at, buf).map_err(|_| DmaError {
            addr,
            len: buf.len(),
        })
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        let at = self.range(addr, data.len())?;
        self.mem.write(at, data).map_err(|_| DmaError {
            addr,
            len: data.len(),
        })
    }

    fn check(&self, addr: u64, len: u64, _write: bool) -> Result<(), DmaError> {
        let len = usize::try_from(len).map_err(|_| DmaError { addr, len: 0 })?;
        self.range(addr, len).map(|_| ())
    }

    fn lend(
        &self,
        addr: u64,
        len: usize,
        _write: bool,
        f: &mut dyn FnMut(*mut u8, usize, usize),
    ) -> Result<bool, DmaError> {
        let at = self.range(addr, len)?;
        let p = self.mem.ptr(at, len).map_err(|_| DmaError { addr, len })?;
        f(p, 0, len);
        Ok(true)
    }

    /// What `lend` lends, without a lock: the mapping lives as long as
    /// `self`.
    fn lend_all(&self, f: &mut dyn FnMut(&Lent<'_>)) -> bool {
        let size = self.size.load(Ordering::Acquire);
        let Ok(host) = self.mem.ptr(0, size) else {
            return false;
        };
        let ranges = [HostRange {
            iova: BASE,
            len: size as u64,
            host,
            writable: true,
        }];
        // SAFETY: `ptr` checked that `size` bytes from offset 0 are inside
        // the mapping, which lives as long as `self`, borrowed for the
        // call; it is mapped read-write.
        let lent = unsafe { Lent::new(if size > 0 { &ranges } else { &[] }) };
        f(&lent);
        true
    }

    fn backing(&self, addr: u64, len: usize) -> Option<efa_emu::transport::Backing> {
        let at = self.range(addr, len).ok()?;
        Some(efa_emu::transport::Backing {
            file: self.file.clone(),
            offset: at as u64,
        })
    }
}

/// MSI-X: counts per vector.
#[derive(Default)]
pub struct Irqs {
    counts: Mutex<HashMap<u16, u64>>,
}

impl Irqs {
    pub fn count(&self, v: u16) -> u64 {
        *self.counts.lock().unwrap().get(&v).unwrap_or(&0)
    }
}

impl Interrupts for Irqs {
    fn signal(&self, vector: u16) {
        *self.counts.lock().unwrap().entry(vector).or_default() += 1;
    }
}

/// How long to wait for the device before calling it dead.
pub const PATIENCE: Duration = Duration::from_secs(10);

pub struct Fake {
    /// Shared, so that a control socket (`efa_emu::control_socket`) can
    /// serve it too.
    pub dev: Arc<EfaDevice>,
    pub ram: Arc<Ram>,
    pub irq: Arc<Irqs>,
    pub exits: Arc<AtomicU32>,
    next: u64,
    pub resp: u64,
    seq: u16,
    pub aq: u64,
    pub acq: u64,
    pub aenq: u64,
    pub esize: usize,
    pub depth: u16,
    pub aenq_depth: u16,
    pub pc: u16,
    acq_cc: u32,
    aenq_cc: u32,
    done: HashMap<u16, AcqEntry>,
}

/// A configuration for tests: small limits, no keep-alives unless asked.
pub fn test_config() -> Config {
    let mut c = Config::new(7, [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 1, 2, 3, 4, 5, 0, 7]);
    c.keep_alive_ms = 0;
    // The tests steer the model through its control window.
    c.test_control = true;
    c.msix_vectors = 4;
    c.limits.max_pd = 4;
    c.limits.max_uar = 4;
    c.limits.max_cq = 8;
    c.limits.max_qp = 8;
    c.limits.max_ah = 4;
    c.limits.max_mr = 8;
    c.limits.max_event_counters = 4;
    c.llq_pool_size = 64 * 4096;
    c.limits.max_llq_size = 32 * 4096;
    c
}

/// The socket directory of [`pair_over_sockets`] named `name`.
pub fn sockets_dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("efa-emu-{name}-{}", std::process::id()))
}

/// Two devices on two fabrics joined by the Unix sockets of a fresh
/// directory named after `name`: what two efa-emu processes are to each
/// other (each fabric has its own sockets and offers its guest memory to
/// the other), with the devices' health to see what they rejected.
pub fn pair_over_sockets(name: &str, a: Config, b: Config) -> (Fake, Fake) {
    pair_over_sockets_with(name, a, b, Ram::new(RAM_SIZE))
}

/// [`pair_over_sockets`], the first device's guest RAM `ram`.
pub fn pair_over_sockets_with(name: &str, mut a: Config, mut b: Config, ram: Ram) -> (Fake, Fake) {
    let dir = sockets_dir(name);
    let _ = std::fs::remove_dir_all(&dir);
    for c in [&mut a, &mut b] {
        c.fabric = Some(
            efa_emu::device::fabric::Fabric::with_dir(&dir, c.health.clone()).expect("fabric"),
        );
    }
    b.gid[15] = a.gid[15].wrapping_add(1);
    b.index = a.index + 1;
    let mut fa = Fake::with_ram(a, ram);
    fa.bring_up();
    (fa, Fake::up(b))
}

/// Two devices on one fabric, with different GIDs.
pub fn pair(mut a: Config, mut b: Config) -> (Fake, Fake) {
    let f = efa_emu::device::fabric::Fabric::local();
    a.fabric = Some(f.clone());
    b.fabric = Some(f);
    b.gid[15] = a.gid[15].wrapping_add(1);
    b.index = a.index + 1;
    (Fake::up(a), Fake::up(b))
}

impl Fake {
    /// A fresh device, as a transport has it when a client connects.
    pub fn new(cfg: Config) -> Self {
        Self::with_ram(cfg, Ram::new(RAM_SIZE))
    }

    /// [`Fake::new`] over `ram` (of [`RAM_SIZE`] bytes).
    pub fn with_ram(mut cfg: Config, ram: Ram) -> Self {
        let ram = Arc::new(ram);
        let irq = Arc::new(Irqs::default());
        let exits = Arc::new(AtomicU32::new(0));
        let e = exits.clone();
        cfg.on_exit = Some(Arc::new(move || {
            e.fetch_add(1, Ordering::SeqCst);
        }));
        let dev = EfaDevice::new(cfg, ram.clone(), irq.clone()).expect("valid config");
        dev.reset();
        let mut f = Self {
            dev: Arc::new(dev),
            ram,
            irq,
            exits,
            next: BASE + 0x1000,
            resp: 0,
            seq: 0,
            aq: 0,
            acq: 0,
            aenq: 0,
            esize: 64,
            depth: DRIVER_AQ_DEPTH,
            aenq_depth: DRIVER_AENQ_DEPTH,
            pc: 0,
            acq_cc: 0,
            aenq_cc: 0,
            done: HashMap::new(),
        };
        f.resp = f.alloc(8, 8);
        f
    }

    /// A device brought up as the C driver's probe does.
    pub fn up(cfg: Config) -> Self {
        let mut f = Self::new(cfg);
        f.bring_up();
        f
    }

    /// Resets the device and brings it up again with guest memory laid
    /// out as after [`Fake::up`]: the same addresses every time (the fuzz
    /// targets reuse one device, and their seeds name those addresses).
    pub fn restart(&mut self) {
        self.next = self.resp + 8;
        self.bring_up();
    }

    /// `len` zeroed bytes of guest RAM aligned to `align`.
    pub fn alloc(&mut self, len: u64, align: u64) -> u64 {
        let at = self.next.div_ceil(align) * align;
        self.next = at + len;
        self.ram.put(at, &vec![0; len as usize]);
        at
    }

    pub fn w(&self, off: u16, v: u32) {
        self.dev.bar_write(0, off.into(), &v.to_le_bytes());
    }

    /// Writes register `reg` of efa-emu's control window, as a guest test
    /// does.
    pub fn win(&self, reg: u64, v: u32) {
        let at = efa_emu::device::control::BASE + reg;
        self.dev.bar_write(0, at, &v.to_le_bytes());
    }

    /// A plain (trapped) read.
    pub fn mmio(&self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.dev.bar_read(0, off, &mut b);
        u32::from_le_bytes(b)
    }

    pub fn set_resp_addr(&self, addr: u64) {
        self.w(MMIO_RESP_HI_OFF, (addr >> 32) as u32);
        self.w(MMIO_RESP_LO_OFF, addr as u32);
    }

    /// A readless read; `None` when the device did not answer.
    pub fn r(&mut self, off: u16) -> Option<u32> {
        self.seq = self.seq.wrapping_add(1);
        // Trash the id, as the C driver does, to see the device's answer.
        self.ram
            .put(self.resp, &(self.seq.wrapping_add(0x9a)).to_le_bytes());
        self.w(MMIO_REG_READ_OFF, mmio_reg_read(self.seq, off));
        // Readless reads are answered before the write returns.
        let resp = MmioReadLessResp::decode(&self.ram.get(self.resp, 8)).unwrap();
        (resp.req_id == self.seq && resp.reg_off == off).then_some(resp.reg_val)
    }

    pub fn reg(&mut self, off: u16) -> u32 {
        self.r(off).expect("readless read answered")
    }

    pub fn wait_reset_state(&mut self, on: bool) {
        let t = Instant::now();
        while DEV_STS_RESET_IN_PROGRESS.is_set(self.reg(DEV_STS_OFF)) != on {
            assert!(t.elapsed() < PATIENCE, "reset state stuck");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// DEV_CTL reset handshake (efa_com_dev_reset).
    pub fn reset_device(&mut self, reason: ResetReason) {
        let sts = self.reg(DEV_STS_OFF);
        assert!(DEV_STS_READY.is_set(sts), "ready before reset");
        let caps = self.reg(CAPS_OFF);
        assert!(CAPS_RESET_TIMEOUT.get(caps) > 0);
        self.w(
            DEV_CTL_OFF,
            DEV_CTL_DEV_RESET.prep(1) | DEV_CTL_RESET_REASON.prep(reason.raw()),
        );
        self.set_resp_addr(self.resp);
        self.wait_reset_state(true);
        self.w(DEV_CTL_OFF, 0);
        self.wait_reset_state(false);
        self.pc = 0;
        self.acq_cc = 0;
        self.aenq_cc = 0;
        self.done.clear();
    }

    /// What efa_probe does up to interrupt mode, then SET AENQ_CONFIG.
    pub fn bring_up(&mut self) {
        self.set_resp_addr(self.resp);
        self.reset_device(ResetReason::Normal);
        let version = self.reg(VERSION_OFF);
        assert!(version >= MIN_API_VERSION);
        let ctrl = self.reg(CONTROLLER_VERSION_OFF);
        assert!(
            CONTROLLER_VERSION_MAJOR_VERSION.get(ctrl)
                | CONTROLLER_VERSION_MINOR_VERSION.get(ctrl)
                | CONTROLLER_VERSION_SUBMINOR_VERSION.get(ctrl)
                >= 1
        );
        let width = CAPS_DMA_ADDR_WIDTH.get(self.reg(CAPS_OFF));
        assert!((MIN_DMA_ADDR_WIDTH..=MAX_DMA_ADDR_WIDTH).contains(&width));
        assert!(DEV_STS_READY.is_set(self.reg(DEV_STS_OFF)));
        self.w(INTR_MASK_OFF, INTR_MASK_EN.prep(1));
        self.esize = if version >= ADMIN_V2_MIN_API_VERSION {
            AqEntryV2::SIZE
        } else {
            AqEntry::SIZE
        };
        let d = u64::from(self.depth);
        self.aq = self.alloc(d * self.esize as u64, 4096);
        self.acq = self.alloc(d * 64, 4096);
        self.aenq = self.alloc(u64::from(self.aenq_depth) * 64, 4096);
        self.w(AQ_BASE_LO_OFF, self.aq as u32);
        self.w(AQ_BASE_HI_OFF, (self.aq >> 32) as u32);
        self.w(
            AQ_CAPS_OFF,
            AQ_CAPS_AQ_DEPTH.prep(d as u32) | AQ_CAPS_AQ_ENTRY_SIZE.prep(self.esize as u32),
        );
        self.w(ACQ_BASE_LO_OFF, self.acq as u32);
        self.w(ACQ_BASE_HI_OFF, (self.acq >> 32) as u32);
        self.w(
            ACQ_CAPS_OFF,
            ACQ_CAPS_ACQ_DEPTH.prep(d as u32) | ACQ_CAPS_ACQ_ENTRY_SIZE.prep(64),
        );
        self.w(AENQ_BASE_LO_OFF, self.aenq as u32);
        self.w(AENQ_BASE_HI_OFF, (self.aenq >> 32) as u32);
        self.w(
            AENQ_CAPS_OFF,
            AENQ_CAPS_AENQ_DEPTH.prep(self.aenq_depth.into()) | AENQ_CAPS_AENQ_ENTRY_SIZE.prep(64),
        );
        self.w(AENQ_CONS_DB_OFF, 0);
        self.w(INTR_MASK_OFF, 0);
    }

    /// The C driver's command id: completion context in the low bits,
    /// producer-counter bits above.
    pub fn next_cmd_id(&self) -> u16 {
        let mask = self.depth - 1;
        let ctx = self.pc & mask;
        (ctx | self.pc << self.depth.trailing_zeros()) & AqCommonDesc::COMMAND_ID.mask()
    }

    /// Writes one entry (not rung); returns its command id.
    pub fn put_entry(&mut self, opcode: u8, flags: u8, payload: &[u8]) -> u16 {
        let phase = u8::from((self.pc / self.depth) % 2 == 0);
        let id = self.next_cmd_id();
        let desc = AqCommonDesc {
            command_id: id,
            opcode,
            flags: flags | AqCommonDesc::PHASE.prep(phase),
        };
        let slot = u64::from(self.pc % self.depth);
        let bytes: Vec<u8> = if self.esize == AqEntryV2::SIZE {
            let mut e = AqEntryV2::ZERO;
            e.aq_common_descriptor.common = desc;
            e.request_payload[..payload.len()].copy_from_slice(payload);
            e.seal();
            e.to_bytes().to_vec()
        } else {
            let mut e = AqEntry::ZERO;
            e.aq_common_descriptor = desc;
            e.request_payload[..payload.len()].copy_from_slice(payload);
            e.to_bytes().to_vec()
        };
        self.ram.put(self.aq + slot * self.esize as u64, &bytes);
        self.pc = self.pc.wrapping_add(1);
        id
    }

    pub fn ring(&self) {
        self.w(AQ_PROD_DB_OFF, self.pc.into());
    }

    /// Consumes every new completion.
    pub fn poll_acq(&mut self) {
        let d = u32::from(self.depth);
        loop {
            let slot = self.acq_cc % d;
            let phase = u8::from((self.acq_cc / d) % 2 == 0);
            let at = self.acq + u64::from(slot) * 64;
            let e = AcqEntry::decode(&self.ram.get(at, 64)).unwrap();
            if AcqCommonDesc::PHASE.get(e.acq_common_descriptor.flags) != phase {
                return;
            }
            assert!(e.checksum_ok(), "completion checksum");
            let id = AcqCommonDesc::COMMAND_ID.get(e.acq_common_descriptor.command);
            assert!(
                self.done.insert(id, e).is_none(),
                "two completions for {id:#x}"
            );
            self.acq_cc += 1;
        }
    }

    /// The completion of `id`, waiting up to `patience`.
    pub fn wait_for(&mut self, id: u16, patience: Duration) -> Option<AcqEntry> {
        let t = Instant::now();
        loop {
            self.poll_acq();
            if let Some(e) = self.done.remove(&id) {
                return Some(e);
            }
            if t.elapsed() > patience {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    pub fn complete(&mut self, id: u16) -> AcqEntry {
        self.wait_for(id, PATIENCE)
            .unwrap_or_else(|| panic!("no completion for command {id:#x}"))
    }

    /// Order in which completions of `ids` arrived (by ACQ position).
    pub fn completion_order(&mut self, ids: &[u16]) -> Vec<u16> {
        let first = self.acq_cc;
        for &id in ids {
            let e = self.complete(id);
            self.done.insert(id, e);
        }
        let d = u32::from(self.depth);
        (first..self.acq_cc)
            .map(|i| {
                let at = self.acq + u64::from(i % d) * 64;
                let e = AcqEntry::decode(&self.ram.get(at, 64)).unwrap();
                AcqCommonDesc::COMMAND_ID.get(e.acq_common_descriptor.command)
            })
            .collect()
    }

    /// Runs one command; the response or the error status.
    pub fn raw(&mut self, opcode: u8, flags: u8, payload: &[u8]) -> Result<AcqEntry, AdminStatus> {
        let id = self.put_entry(opcode, flags, payload);
        self.ring();
        let e = self.complete(id);
        match AdminStatus::from_raw(e.acq_common_descriptor.status) {
            Some(AdminStatus::Success) => Ok(e),
            Some(s) => Err(s),
            None => panic!("unknown status {}", e.acq_common_descriptor.status),
        }
    }

    pub fn cmd<R: Wire>(
        &mut self,
        op: AdminOpcode,
        flags: u8,
        cmd: &impl Wire,
    ) -> Result<R, AdminStatus> {
        let mut p = vec![0u8; cmd_size(cmd)];
        cmd.encode(&mut p).unwrap();
        self.raw(op.raw(), flags, &p).map(|e| e.resp())
    }

    pub fn get_feature(&mut self, id: u8) -> Result<GetFeatureResp, AdminStatus> {
        let mut c = GetFeatureCmd::ZERO;
        c.feature_common.feature_id = id;
        self.cmd(AdminOpcode::GetFeature, 0, &c)
    }

    pub fn set_aenq_groups(&mut self, groups: u32) -> Result<(), AdminStatus> {
        let mut c = SetFeatureCmd::ZERO;
        c.feature_common.feature_id = FeatureId::AenqConfig.raw();
        c.set_aenq(&AenqConfig {
            supported_groups: 0,
            enabled_groups: groups,
        });
        self.cmd::<SetFeatureResp>(AdminOpcode::SetFeature, 0, &c)
            .map(|_| ())
    }

    pub fn enable_aenq(&mut self) {
        self.set_aenq_groups(DRIVER_ENABLED_GROUPS).unwrap();
    }

    /// New AENQ events; acknowledges them with the consumer doorbell.
    pub fn aenq_events(&mut self) -> Vec<AenqEntry> {
        let d = u32::from(self.aenq_depth);
        let mut out = Vec::new();
        loop {
            let slot = self.aenq_cc % d;
            let phase = u8::from((self.aenq_cc / d) % 2 == 0);
            let e = AenqEntry::decode(&self.ram.get(self.aenq + u64::from(slot) * 64, 64)).unwrap();
            if AenqCommonDesc::PHASE.get(e.aenq_common_desc.flags) != phase {
                break;
            }
            out.push(e);
            self.aenq_cc += 1;
        }
        if !out.is_empty() {
            self.w(AENQ_CONS_DB_OFF, self.aenq_cc);
        }
        out
    }

    // ---- object helpers ----

    pub fn alloc_pd(&mut self) -> Result<u16, AdminStatus> {
        self.raw(AdminOpcode::AllocPd.raw(), 0, &[])
            .map(|e| e.resp::<AllocPdResp>().pd)
    }

    pub fn alloc_uar(&mut self) -> Result<u16, AdminStatus> {
        self.raw(AdminOpcode::AllocUar.raw(), 0, &[])
            .map(|e| e.resp::<AllocUarResp>().uar)
    }

    pub fn cq_cmd(&mut self, uar: u16, depth: u16) -> CreateCqCmd {
        let subs = self.dev.config().limits.sub_cqs_per_cq;
        let ring = self.alloc(u64::from(depth) * 32 * u64::from(subs), 4096);
        let mut c = CreateCqCmd::ZERO;
        c.cq_caps_2 = CreateCqCmd::CQ_ENTRY_SIZE_WORDS.prep(8);
        c.sub_cq_depth = depth;
        c.num_sub_cqs = subs;
        c.uar = uar;
        c.cq_ba = MemAddr::new(ring);
        c
    }

    pub fn create_cq(&mut self, uar: u16) -> Result<CreateCqResp, AdminStatus> {
        let c = self.cq_cmd(uar, 64);
        self.cmd(AdminOpcode::CreateCq, 0, &c)
    }

    /// A CREATE_QP as rdma-core and the C driver build it: `sq_wqes`
    /// 64-byte WQEs, `rq_wqes` one-descriptor receives.
    pub fn qp_cmd(
        &mut self,
        pd: u16,
        uar: u16,
        cq: u16,
        sq_wqes: u32,
        rq_wqes: u32,
    ) -> CreateQpCmd {
        let rq_ring = rq_wqes * 16;
        let rq_base = if rq_ring > 0 {
            self.alloc(u64::from(rq_ring).max(4096), 4096)
        } else {
            0
        };
        CreateQpCmd {
            pd,
            qp_type: QpType::Srd.raw(),
            flags: 0,
            sq_base_addr: 0,
            rq_base_addr: rq_base,
            send_cq_idx: cq.into(),
            recv_cq_idx: cq.into(),
            sq_l_key: 0,
            rq_l_key: 0,
            qp_alloc_size: QpAllocSize {
                send_queue_ring_size: sq_wqes * 64,
                send_queue_depth: sq_wqes,
                recv_queue_ring_size: rq_ring,
                recv_queue_depth: rq_wqes,
            },
            uar,
            sl: 0,
            reserved: 0,
            reserved2: 0,
        }
    }

    pub fn create_qp(&mut self, pd: u16, uar: u16, cq: u16) -> Result<CreateQpResp, AdminStatus> {
        let c = self.qp_cmd(pd, uar, cq, 16, 16);
        self.cmd(AdminOpcode::CreateQp, 0, &c)
    }

    pub fn modify(
        &mut self,
        qp: u32,
        mask: u32,
        state: QpState,
        cur: QpState,
    ) -> Result<(), AdminStatus> {
        let c = ModifyQpCmd {
            modify_mask: mask,
            qp_handle: qp,
            qp_state: state.raw(),
            cur_qp_state: cur.raw(),
            qkey: 0x1234,
            sq_psn: 77,
            sq_drained_async_notify: 0,
            rnr_retry: 5,
            reserved2: 0,
        };
        self.cmd::<ModifyQpResp>(AdminOpcode::ModifyQp, 0, &c)
            .map(|_| ())
    }

    pub fn query(&mut self, qp: u32) -> Result<QueryQpResp, AdminStatus> {
        self.cmd(AdminOpcode::QueryQp, 0, &QueryQpCmd { qp_handle: qp })
    }
}

fn cmd_size<T: Wire>(_: &T) -> usize {
    T::SIZE
}

/// A deterministic pseudo-random stream (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// `DEV_STS` by a plain read (works when readless reads do not).
pub fn dev_sts(f: &Fake) -> u32 {
    f.mmio(regs::DEV_STS_OFF.into())
}

/// Builds an indirect page list as the C driver does: `pages` addresses in
/// 4 KiB list pages, listed by a chain of chunks. Returns the first chunk.
pub fn indirect_pbl(f: &mut Fake, pages: &[u64]) -> (CtrlBuffInfo, Vec<u64>) {
    const PTRS: usize = efa_hw::admin::pbl::PTRS_PER_CHUNK;
    let bytes: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
    let list_pages: Vec<u64> = bytes
        .chunks(4096)
        .map(|chunk| {
            let at = f.alloc(4096, 4096);
            f.ram.put(at, chunk);
            at
        })
        .collect();
    let n_chunks = list_pages.len().div_ceil(PTRS);
    let chunks: Vec<u64> = (0..n_chunks).map(|_| f.alloc(4096, 4096)).collect();
    let len = |i: usize| {
        let in_chunk = (list_pages.len() - i * PTRS).min(PTRS);
        (in_chunk * 8 + 12) as u32
    };
    for (i, &at) in chunks.iter().enumerate() {
        let ptrs = &list_pages[i * PTRS..(i * PTRS + PTRS).min(list_pages.len())];
        let b: Vec<u8> = ptrs.iter().flat_map(|p| p.to_le_bytes()).collect();
        f.ram.put(at, &b);
        if i + 1 < n_chunks {
            let link = CtrlBuffInfo {
                length: len(i + 1),
                address: MemAddr::new(chunks[i + 1]),
            };
            f.ram.put(at + (PTRS * 8) as u64, &link.to_bytes());
        }
    }
    (
        CtrlBuffInfo {
            length: len(0),
            address: MemAddr::new(chunks[0]),
        },
        chunks,
    )
}
