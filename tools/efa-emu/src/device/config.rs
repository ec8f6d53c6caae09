//! What the model reports and enforces: identity, limits, capabilities and
//! the fault-injection rules it starts with.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::fabric::auth::UDP_SEGMENT;
use super::fabric::{Fabric, NetFaults, UdpConfig, MAX_LINKS, MAX_SEGMENT};
use crate::health::Health;

use efa_hw::admin::{AdminOpcode, AdminStatus, DeviceAttr};
use efa_hw::io::TX_DESC_INLINE_MAX_SIZE_128;
use efa_hw::regs;

/// Limits reported in `DEVICE_ATTR`, `QUEUE_ATTR_1/2` and
/// `EVENT_QUEUE_ATTR`, and enforced by the admin commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most queue pairs.
    pub max_qp: u32,
    /// Most send WQEs per queue pair.
    pub max_sq_depth: u32,
    /// Most receive WQEs per queue pair.
    pub max_rq_depth: u32,
    /// Fewest send WQEs per queue pair (0: no minimum).
    pub min_sq_depth: u16,
    /// Most completion queues.
    pub max_cq: u32,
    /// Most entries per sub-CQ.
    pub max_cq_depth: u32,
    /// Sub-CQs per completion queue.
    pub sub_cqs_per_cq: u16,
    /// Most buffers per send WQE.
    pub max_sq_sges: u16,
    /// Most buffers per receive WQE.
    pub max_rq_sges: u16,
    /// Most buffers per RDMA WQE.
    pub max_rdma_sges: u16,
    /// Largest inline send with 64-byte WQEs.
    pub inline_buf_size: u32,
    /// Largest inline send (128-byte WQEs).
    pub inline_buf_size_ex: u16,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most pages registered, in one region and over all of them (the
    /// model keeps every page list, so this bounds its memory).
    pub max_mr_pages: u32,
    /// Most protection domains.
    pub max_pd: u32,
    /// Most address handles.
    pub max_ah: u32,
    /// Largest send queue ring (LLQ) in bytes.
    pub max_llq_size: u32,
    /// Most 64-byte units written to a send queue between doorbells (0:
    /// unlimited).
    pub max_tx_batch: u16,
    /// Most event queues.
    pub max_eq: u32,
    /// Most entries per event queue (the C driver creates its EQs this
    /// deep).
    pub max_eq_depth: u32,
    /// Most user access regions (doorbell pages in BAR2).
    pub max_uar: u32,
    /// Most event counters.
    pub max_event_counters: u32,
    /// Largest RDMA transfer in bytes.
    pub max_rdma_size: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_qp: 256,
            max_sq_depth: 4096,
            max_rq_depth: 8192,
            min_sq_depth: 0,
            max_cq: 512,
            max_cq_depth: 8192,
            sub_cqs_per_cq: 4,
            max_sq_sges: 2,
            max_rq_sges: 2,
            max_rdma_sges: 1,
            inline_buf_size: 32,
            inline_buf_size_ex: TX_DESC_INLINE_MAX_SIZE_128 as u16,
            max_mr: 65536,
            max_mr_pages: 1 << 22,
            max_pd: 256,
            max_ah: 1024,
            max_llq_size: 4096 * 128,
            max_tx_batch: 0,
            max_eq: 32,
            max_eq_depth: 1024,
            max_uar: 256,
            max_event_counters: 64,
            max_rdma_size: 1 << 30,
        }
    }
}

impl Limits {
    /// Names accepted by [`Limits::set`].
    pub const NAMES: &'static [&'static str] = &[
        "max_qp",
        "max_sq_depth",
        "max_rq_depth",
        "min_sq_depth",
        "max_cq",
        "max_cq_depth",
        "sub_cqs_per_cq",
        "max_sq_sges",
        "max_rq_sges",
        "max_rdma_sges",
        "inline_buf_size",
        "inline_buf_size_ex",
        "max_mr",
        "max_mr_pages",
        "max_pd",
        "max_ah",
        "max_llq_size",
        "max_tx_batch",
        "max_eq",
        "max_eq_depth",
        "max_uar",
        "max_event_counters",
        "max_rdma_size",
    ];

    /// Sets the limit `name` (a field name) to `value`.
    pub fn set(&mut self, name: &str, value: u64) -> Result<(), String> {
        fn fit<T: TryFrom<u64>>(name: &str, v: u64) -> Result<T, String> {
            T::try_from(v).map_err(|_| format!("{v} does not fit {name}"))
        }
        match name {
            "max_qp" => self.max_qp = fit(name, value)?,
            "max_sq_depth" => self.max_sq_depth = fit(name, value)?,
            "max_rq_depth" => self.max_rq_depth = fit(name, value)?,
            "min_sq_depth" => self.min_sq_depth = fit(name, value)?,
            "max_cq" => self.max_cq = fit(name, value)?,
            "max_cq_depth" => self.max_cq_depth = fit(name, value)?,
            "sub_cqs_per_cq" => self.sub_cqs_per_cq = fit(name, value)?,
            "max_sq_sges" => self.max_sq_sges = fit(name, value)?,
            "max_rq_sges" => self.max_rq_sges = fit(name, value)?,
            "max_rdma_sges" => self.max_rdma_sges = fit(name, value)?,
            "inline_buf_size" => self.inline_buf_size = fit(name, value)?,
            "inline_buf_size_ex" => self.inline_buf_size_ex = fit(name, value)?,
            "max_mr" => self.max_mr = fit(name, value)?,
            "max_mr_pages" => self.max_mr_pages = fit(name, value)?,
            "max_pd" => self.max_pd = fit(name, value)?,
            "max_ah" => self.max_ah = fit(name, value)?,
            "max_llq_size" => self.max_llq_size = fit(name, value)?,
            "max_tx_batch" => self.max_tx_batch = fit(name, value)?,
            "max_eq" => self.max_eq = fit(name, value)?,
            "max_eq_depth" => self.max_eq_depth = fit(name, value)?,
            "max_uar" => self.max_uar = fit(name, value)?,
            "max_event_counters" => self.max_event_counters = fit(name, value)?,
            "max_rdma_size" => self.max_rdma_size = fit(name, value)?,
            _ => {
                return Err(format!(
                    "unknown limit '{name}' (one of {})",
                    Self::NAMES.join(", ")
                ))
            }
        }
        Ok(())
    }

    /// Parses and applies `name=value`.
    pub fn set_spec(&mut self, spec: &str) -> Result<(), String> {
        let (name, value) = spec
            .split_once('=')
            .ok_or_else(|| format!("'{spec}' is not name=value"))?;
        let value = parse_number(value).ok_or_else(|| format!("bad number '{value}'"))?;
        self.set(name.trim(), value)
    }
}

/// A mode of an injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectMode {
    /// The command is not executed and completes with the status.
    Fail(AdminStatus),
    /// The command is consumed and never completes.
    Timeout,
    /// The command is consumed and held, not executed: the control
    /// window's `COMMAND` 7 completes it late with the status, after
    /// writing into the memory it named, as a device acting on a command
    /// the driver gave up on would. A reset forgets it.
    Late(AdminStatus),
}

/// Makes `count` admin commands with `opcode` fail or time out, after
/// `skip` that run normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectRule {
    /// Admin opcode (any byte, defined or not).
    pub opcode: u8,
    /// How many of the next commands with that opcode run normally first
    /// (to fail a later step of a verb that issues the opcode repeatedly).
    pub skip: u32,
    /// How many commands with that opcode are affected.
    pub count: u32,
    /// What happens to them.
    pub mode: InjectMode,
}

/// Status of an injected failure when none is given.
pub const DEFAULT_INJECT_STATUS: AdminStatus = AdminStatus::UnknownError;

impl InjectRule {
    /// Parses `opcode=N,count=K,mode=fail|timeout|late[,status=S][,skip=J]`;
    /// opcode and status are numbers or names (`create_qp`,
    /// `illegal_parameter`).
    pub fn parse(spec: &str) -> Result<Self, String> {
        let (mut opcode, mut count, mut mode, mut status) = (None, None, None, None);
        let mut skip = 0;
        for part in spec.split(',') {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("'{part}' is not key=value"))?;
            match key.trim() {
                "opcode" => opcode = Some(parse_opcode(value)?),
                "count" => {
                    count = Some(
                        parse_number(value)
                            .and_then(|n| u32::try_from(n).ok())
                            .ok_or_else(|| format!("bad count '{value}'"))?,
                    )
                }
                "mode" => {
                    mode = Some(match value.trim() {
                        "fail" => 0,
                        "timeout" => 1,
                        "late" => 2,
                        _ => return Err(format!("mode is fail, timeout or late, not '{value}'")),
                    })
                }
                "status" => status = Some(parse_status(value)?),
                "skip" => {
                    skip = parse_number(value)
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| format!("bad skip '{value}'"))?
                }
                _ => return Err(format!("unknown key '{key}'")),
            }
        }
        let opcode = opcode.ok_or("opcode= is missing")?;
        let mode = match (mode.unwrap_or(0), status) {
            (1, Some(_)) => return Err("status= goes with mode=fail or mode=late".into()),
            (1, None) => InjectMode::Timeout,
            (2, s) => InjectMode::Late(s.unwrap_or(DEFAULT_INJECT_STATUS)),
            (_, s) => InjectMode::Fail(s.unwrap_or(DEFAULT_INJECT_STATUS)),
        };
        Ok(Self {
            opcode,
            skip,
            count: count.unwrap_or(1),
            mode,
        })
    }
}

/// A number in decimal or `0x` hex, as the options and the control socket
/// (`crate::control_socket`) take them.
pub fn parse_number(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The opcode named `s`: a number, or the opcode name in snake case.
pub fn parse_opcode(s: &str) -> Result<u8, String> {
    if let Some(n) = parse_number(s) {
        return u8::try_from(n).map_err(|_| format!("opcode {n} does not fit a byte"));
    }
    let want = s.trim().replace(['_', '-'], "").to_ascii_lowercase();
    AdminOpcode::ALL
        .iter()
        .find(|op| format!("{op:?}").to_ascii_lowercase() == want)
        .map(|op| op.raw())
        .ok_or_else(|| format!("unknown opcode '{s}'"))
}

/// The status named `s`: a number, or the status name in snake case.
pub fn parse_status(s: &str) -> Result<AdminStatus, String> {
    if let Some(n) = parse_number(s) {
        return u8::try_from(n)
            .ok()
            .and_then(AdminStatus::from_raw)
            .ok_or_else(|| format!("unknown status {n}"));
    }
    let want = s.trim().replace(['_', '-'], "").to_ascii_lowercase();
    AdminStatus::ALL
        .iter()
        .find(|st| format!("{st:?}").to_ascii_lowercase() == want)
        .copied()
        .ok_or_else(|| format!("unknown status '{s}'"))
}

/// Called when the guest asks the model to exit through the control
/// window; the binary exits the process, tests record the call.
pub type ExitHook = Arc<dyn Fn() + Send + Sync>;

/// Everything that makes one device instance.
#[derive(Clone)]
pub struct Config {
    /// PCI device id (one of `regs::PCI_DEVICE_IDS`).
    pub device_id: u16,
    /// Index of the device on this host (logs, default GID).
    pub index: u16,
    /// The device's address (GID).
    pub gid: [u8; 16],
    /// Largest packet payload in bytes.
    pub mtu: u32,
    /// Link speed in Gbit/s.
    pub link_speed_gbps: u16,
    /// Minor version of the device specification reported in `VERSION`
    /// (major 0): 1, 2 (completion checksums) or 3 (128-byte AQ entries).
    pub api_minor: u8,
    /// MSI-X vectors (vector 0 admin and AENQ, the rest for event queues).
    pub msix_vectors: u16,
    /// `DEVICE_ATTR.device_caps`.
    pub device_caps: u32,
    /// The device has event queues (`EVENT_QUEUE_ATTR` is a supported
    /// feature): completion notifications.
    pub event_queue_attr: bool,
    /// The device answers `QUEUE_ATTR_2` (the larger inline size of
    /// 128-byte WQEs, event counters).
    pub queue_attr_2: bool,
    /// CREATE_CQ gives each CQ a doorbell (`DB_VALID`), which userspace
    /// writes to arm it for an event; without, CQs are polled only.
    pub cq_doorbells: bool,
    /// Limits.
    pub limits: Limits,
    /// Size of the LLQ pool in BAR2, in bytes (a multiple of 4 KiB).
    pub llq_pool_size: u64,
    /// Keep-alive AENQ period in milliseconds (0: none).
    pub keep_alive_ms: u32,
    /// Admin command timeout reported in `CAPS`, in milliseconds (rounded
    /// up to the register's 100 ms unit, at most 1500; 0: the driver's
    /// default of 30 s).
    pub admin_timeout_ms: u32,
    /// Complete the commands of one doorbell in reverse order, to show the
    /// driver that completions can come out of order.
    pub reorder: bool,
    /// Log every admin command and its answer.
    pub verbose: bool,
    /// Faults armed at start.
    pub inject: Vec<InjectRule>,
    /// Hostile mode: a malformation armed at start (see `hostile`).
    pub hostile: Option<super::hostile::HostileSpec>,
    /// What the control window's EXIT command calls.
    pub on_exit: Option<ExitHook>,
    /// The fabric to join (devices sharing one reach each other directly);
    /// `None`: a fabric of this device's own, with sockets in
    /// `fabric_dir` if set.
    pub fabric: Option<Arc<Fabric>>,
    /// Directory of the socket fabric between processes (`None`: this
    /// process only).
    pub fabric_dir: Option<PathBuf>,
    /// The UDP fabric between processes (instead of `fabric_dir`'s Unix
    /// sockets).
    pub udp: Option<UdpConfig>,
    /// Write the fabric's packets to this pcap file (created; it must not
    /// exist).
    pub capture: Option<PathBuf>,
    /// Loss, delay, reordering and duplication injected on packets
    /// arriving at this device.
    pub net_faults: NetFaults,
    /// The same for the packets from one GID (a link), instead of
    /// `net_faults`.
    pub net_links: Vec<([u8; 16], NetFaults)>,
    /// How long the data-path thread keeps polling the doorbells after work
    /// before it naps, in time it runs (zero: it naps at once). A spin shortens
    /// doorbell-to-completion from tens of microseconds to a few, but only
    /// on a host with a core to spare: a TCG guest on two cores needs the
    /// CPU the spin takes (see `datapath::Spin`).
    pub spin: Duration,
    /// The CPUs the data-path thread runs on (empty: wherever the
    /// scheduler puts it). Where threads that poll share fewer cores than
    /// there are of them (vCPUs, the devices' data paths), the scheduler
    /// may put two that hand each other work on one core, each then
    /// waiting for the other's turn, and leave another core to one that
    /// only polls; pinning them apart keeps their rates from doubling or
    /// halving from one run to the next.
    pub data_cpus: Vec<usize>,
    /// The emulator's control window (a test feature, see `control`) is
    /// on. Off, the window shows only `MAGIC` = `MAGIC_OFF_VALUE` and
    /// ignores writes.
    pub test_control: bool,
    /// Where the model counts what went wrong and rate-limits its
    /// warnings (shared by the devices and sockets of one process).
    pub health: Arc<Health>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("device_id", &format_args!("{:#06x}", self.device_id))
            .field("index", &self.index)
            .field("gid", &std::net::Ipv6Addr::from(self.gid))
            .field("mtu", &self.mtu)
            .field("api_minor", &self.api_minor)
            .field("msix_vectors", &self.msix_vectors)
            .field("device_caps", &format_args!("{:#x}", self.device_caps))
            .field("event_queue_attr", &self.event_queue_attr)
            .field("queue_attr_2", &self.queue_attr_2)
            .field("cq_doorbells", &self.cq_doorbells)
            .field("limits", &self.limits)
            .field("keep_alive_ms", &self.keep_alive_ms)
            .field("admin_timeout_ms", &self.admin_timeout_ms)
            .field("inject", &self.inject)
            .field("hostile", &self.hostile)
            .field("fabric_dir", &self.fabric_dir)
            .field("udp", &self.udp)
            .field("capture", &self.capture)
            .field("net_faults", &self.net_faults)
            .field("net_links", &self.net_links.len())
            .field("spin", &self.spin)
            .field("data_cpus", &self.data_cpus)
            .field("test_control", &self.test_control)
            .finish_non_exhaustive()
    }
}

/// The device id the model presents by default: the third EFA generation,
/// whose feature set (RDMA read and write) the model reports.
pub const DEFAULT_DEVICE_ID: u16 = regs::PCI_DEV_ID_EFA2_VF;

/// Capabilities reported by default: everything the 7.3 driver knows.
pub const DEFAULT_DEVICE_CAPS: u32 = DeviceAttr::RDMA_READ.mask()
    | DeviceAttr::RNR_RETRY.mask()
    | DeviceAttr::DATA_POLLING_128.mask()
    | DeviceAttr::RDMA_WRITE.mask()
    | DeviceAttr::UNSOLICITED_WRITE_RECV.mask()
    | DeviceAttr::EVENT_COUNTERS.mask()
    | DeviceAttr::SQ_64_BIT_REQ_ID.mask();

/// A GID for device `index` served on `socket`: `fe80::` with an interface
/// id of 0x02 (locally administered), five bytes of a hash of the socket
/// path and the index. Two servers on one host cannot share a socket path,
/// so their GIDs differ; devices of one run differ by index as well.
pub fn default_gid(index: u16, socket: &Path) -> [u8; 16] {
    // FNV-1a: stable across runs and Rust versions, unlike DefaultHasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in socket.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let h = h.to_be_bytes();
    let i = index.to_be_bytes();
    [
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, h[0], h[1], h[2], h[3], h[4], i[0], i[1],
    ]
}

impl Config {
    /// The default device with index `index` and GID `gid`.
    pub fn new(index: u16, gid: [u8; 16]) -> Self {
        Self {
            device_id: DEFAULT_DEVICE_ID,
            index,
            gid,
            mtu: 8928,
            link_speed_gbps: 100,
            api_minor: 3,
            msix_vectors: 33,
            device_caps: DEFAULT_DEVICE_CAPS,
            event_queue_attr: true,
            queue_attr_2: true,
            cq_doorbells: true,
            limits: Limits::default(),
            llq_pool_size: 63 << 20,
            keep_alive_ms: 1000,
            admin_timeout_ms: 0,
            reorder: true,
            verbose: false,
            inject: Vec::new(),
            hostile: None,
            on_exit: None,
            fabric: None,
            fabric_dir: None,
            udp: None,
            capture: None,
            net_faults: NetFaults::default(),
            net_links: Vec::new(),
            spin: Duration::ZERO,
            data_cpus: Vec::new(),
            test_control: false,
            health: Health::new(),
        }
    }

    /// Checks that the configuration can be served and that every handle
    /// the limits allow fits its field with room for a generation.
    pub fn validate(&self) -> Result<(), String> {
        let l = &self.limits;
        if !regs::PCI_DEVICE_IDS.contains(&self.device_id) {
            return Err(format!(
                "device id {:#06x} is not an EFA id",
                self.device_id
            ));
        }
        if !(1..=3).contains(&self.api_minor) {
            return Err("the admin API version is 1, 2 or 3".into());
        }
        if !(1..=256).contains(&self.msix_vectors) {
            return Err("MSI-X vectors must be 1..=256 (the table fits BAR0)".into());
        }
        if self.event_queue_attr && !self.cq_doorbells && l.max_eq > 0 {
            // A CQ without a doorbell cannot be armed, so it never gets an
            // event: no device has the one without the other.
            return Err("event queues need CQ doorbells (or --limit max_eq=0)".into());
        }
        if !self.queue_attr_2 && DeviceAttr::EVENT_COUNTERS.is_set(self.device_caps) {
            return Err("event counters are described by QUEUE_ATTR_2".into());
        }
        if self.admin_timeout_ms > 1500 {
            return Err("the CAPS admin timeout is at most 1500 ms".into());
        }
        let in_range = |name: &str, v: u32, lo: u32, hi: u32| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} must be {lo}..={hi}, not {v}"))
            }
        };
        // Handles keep at least one generation bit (see objects::Table).
        in_range("max_qp", l.max_qp, 2, 1 << 14)?;
        in_range("max_cq", l.max_cq, 1, 1 << 14)?;
        in_range("max_pd", l.max_pd, 1, 1 << 14)?;
        in_range("max_ah", l.max_ah, 1, 1 << 14)?;
        in_range("max_uar", l.max_uar, 1, 1 << 14)?;
        in_range("max_eq", l.max_eq, 0, 1 << 14)?;
        in_range("max_mr", l.max_mr, 1, 1 << 22)?;
        in_range("max_event_counters", l.max_event_counters, 0, 1 << 20)?;
        in_range("max_mr_pages", l.max_mr_pages, 1, 1 << 26)?;
        in_range("max_sq_depth", l.max_sq_depth, 1, 1 << 16)?;
        in_range("max_rq_depth", l.max_rq_depth, 1, 1 << 16)?;
        in_range("max_cq_depth", l.max_cq_depth, 1, 1 << 16)?;
        in_range("sub_cqs_per_cq", u32::from(l.sub_cqs_per_cq), 1, 64)?;
        if !l.max_eq_depth.is_power_of_two() || l.max_eq_depth > 1 << 16 {
            return Err("max_eq_depth must be a power of two up to 65536".into());
        }
        if l.max_llq_size < 4096 || u64::from(l.max_llq_size) > self.llq_pool_size {
            return Err("max_llq_size must be at least 4 KiB and fit the LLQ pool".into());
        }
        if self.llq_pool_size % 4096 != 0 || self.llq_pool_size == 0 {
            return Err("the LLQ pool is a non-zero multiple of 4 KiB".into());
        }
        if u32::from(l.inline_buf_size_ex) < l.inline_buf_size {
            return Err("inline_buf_size_ex is below inline_buf_size".into());
        }
        if self.link_speed_gbps == 0 || self.mtu == 0 {
            return Err("link speed and MTU must not be 0".into());
        }
        if self.mtu as usize > MAX_SEGMENT {
            return Err(format!("the MTU is at most {MAX_SEGMENT} bytes"));
        }
        if let Some(c) = self
            .data_cpus
            .iter()
            .find(|&&c| c >= libc::CPU_SETSIZE as usize)
        {
            return Err(format!(
                "CPU {c} is past the {} a CPU set holds",
                libc::CPU_SETSIZE
            ));
        }
        self.net_faults.validate()?;
        for (_, f) in &self.net_links {
            f.validate()?;
        }
        if self.net_links.len() > MAX_LINKS {
            return Err(format!(
                "at most {MAX_LINKS} links have faults of their own"
            ));
        }
        if self.udp.is_some() && self.mtu as usize > UDP_SEGMENT {
            return Err(format!("over UDP the MTU is at most {UDP_SEGMENT} bytes"));
        }
        Ok(())
    }

    /// The `VERSION` register.
    pub fn version(&self) -> u32 {
        regs::api_version(0, u32::from(self.api_minor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inject_specs() {
        assert_eq!(
            InjectRule::parse("opcode=9,count=2,mode=fail,status=5"),
            Ok(InjectRule {
                opcode: 9,
                skip: 0,
                count: 2,
                mode: InjectMode::Fail(AdminStatus::IllegalParameter)
            })
        );
        assert_eq!(
            InjectRule::parse("opcode=create_qp,mode=timeout"),
            Ok(InjectRule {
                opcode: 1,
                skip: 0,
                count: 1,
                mode: InjectMode::Timeout
            })
        );
        assert_eq!(
            InjectRule::parse("opcode=create_event_counter,skip=1").map(|r| (r.skip, r.count)),
            Ok((1, 1))
        );
        assert_eq!(
            InjectRule::parse("opcode=0x10,count=3,mode=fail,status=resource_busy").map(|r| r.mode),
            Ok(InjectMode::Fail(AdminStatus::ResourceBusy))
        );
        assert_eq!(
            InjectRule::parse("opcode=200,count=1").map(|r| r.mode),
            Ok(InjectMode::Fail(DEFAULT_INJECT_STATUS))
        );
        assert_eq!(
            InjectRule::parse("opcode=reg_mr,mode=late,status=resource_busy").map(|r| r.mode),
            Ok(InjectMode::Late(AdminStatus::ResourceBusy))
        );
        for bad in [
            "count=1",
            "opcode=300",
            "opcode=nope",
            "opcode=1,mode=sometimes",
            "opcode=1,mode=timeout,status=1",
            "opcode=1,status=99",
            "opcode=1,colour=red",
            "opcode=1,skip=-1",
            "opcode",
        ] {
            assert!(InjectRule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_by_name() {
        let mut l = Limits::default();
        for name in Limits::NAMES {
            l.set(name, 7).unwrap();
        }
        assert_eq!(l.max_rdma_size, 7);
        l.set_spec("max_qp=0x20").unwrap();
        assert_eq!(l.max_qp, 32);
        assert!(l.set("max_qp", 1 << 40).is_err());
        assert!(l.set("sub_cqs_per_cq", 70_000).is_err());
        assert!(l.set_spec("nonsense=1").is_err());
        assert!(l.set_spec("max_qp").is_err());
    }

    #[test]
    fn default_gids_differ_by_index_and_socket() {
        let a = default_gid(0, Path::new("/run/a/efa0.sock"));
        let b = default_gid(1, Path::new("/run/a/efa1.sock"));
        let c = default_gid(0, Path::new("/run/b/efa0.sock"));
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(&a[..8], &[0xfe, 0x80, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[14..], &[0, 1]);
        assert_eq!(a, default_gid(0, Path::new("/run/a/efa0.sock")));
    }

    #[test]
    fn defaults_are_valid_and_bad_limits_are_refused() {
        let c = Config::new(0, [0; 16]);
        c.validate().unwrap();
        assert_eq!(c.version(), 3);
        let mut bad = c.clone();
        bad.limits.max_qp = 1 << 15;
        assert!(bad.validate().is_err());
        let mut bad = c.clone();
        bad.limits.max_eq_depth = 1000;
        assert!(bad.validate().is_err());
        let mut bad = c.clone();
        bad.api_minor = 4;
        assert!(bad.validate().is_err());
        let mut bad = c;
        bad.device_id = 0x1234;
        assert!(bad.validate().is_err());
    }
}
