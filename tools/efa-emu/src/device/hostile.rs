//! Hostile mode: the device misbehaves on purpose, one malformation at a
//! time, so that tests can see what a driver does with a device that lies,
//! stalls or floods it. NOT part of the EFA interface.
//!
//! A malformation is chosen by name (or by a seed, `random`) with
//! `--hostile NAME[,seed=S][,after=K][,count=C]`, or at run time through
//! the control window (`HOSTILE`, `HOSTILE_SEED`). It strikes after `after`
//! occasions that could have carried it have passed normally, then on the
//! next `count` occasions (`count` 0: the malformation's own default). The
//! seed draws everything random about it (wrong ids, statuses, garbage,
//! which field), so a run can be replayed. Every strike is logged and
//! counted as `injected` in efa-emu's health counters, and in the control
//! window's `HOSTILE_HITS`.
//!
//! With hostile mode off (the default), none of this runs: each hook
//! returns at its first test of [`Hostile::armed`].

use std::fmt;
use std::time::{Duration, Instant};

use efa_hw::admin::{
    AcqEntry, AdminOpcode, AllocPdResp, AllocUarResp, CreateAhResp, CreateCqResp, CreateQpResp,
    RegMrResp,
};
use efa_hw::io::EQE_SIZE;
use efa_hw::wire::Wire;

use super::{Inner, State};
use crate::health::Class;
use crate::report;

/// One way of misbehaving. The numbers are the control window's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Malformation {
    /// An admin completion carries a command id nobody used; the command's
    /// own completion never comes.
    CqeWrongId = 1,
    /// An admin completion carries the id of the command completed before
    /// it (stale); the command's own completion never comes.
    CqeStaleId = 2,
    /// An admin completion is written twice.
    CqeDuplicate = 3,
    /// An admin completion is written with the wrong phase (the driver must
    /// not take it); its slot is reused by the next completion.
    CqeBadPhase = 4,
    /// An extra completion, for the command id answered just before (whose
    /// context is free by now), comes before the real one.
    CqeFreeSlot = 5,
    /// A command is not executed and completes with a status outside the
    /// specification (8 to 255).
    StatusUnknown = 6,
    /// ALLOC_PD, ALLOC_UAR, CREATE_CQ, CREATE_QP, CREATE_AH or REG_MR
    /// answers with the handle of another live object of the kind.
    RespHandleReuse = 7,
    /// CREATE_QP or CREATE_CQ answers with a doorbell offset outside BAR2.
    RespDbOutside = 8,
    /// CREATE_QP answers with an LLQ offset outside BAR2 (or straddling
    /// its end).
    RespLlqOutside = 9,
    /// CREATE_QP answers with an LLQ offset overlapping another QP's LLQ or
    /// a UAR's doorbell page.
    RespLlqOverlap = 10,
    /// CREATE_QP or CREATE_CQ answers with a doorbell in another UAR's
    /// page.
    RespDbForeign = 11,
    /// CREATE_CQ answers with a depth larger than asked.
    RespSizeLarger = 12,
    /// CREATE_QP answers with a sub-CQ index past the CQ's sub-CQs.
    RespSubCqRange = 13,
    /// Garbage EQEs (unknown types, CQ numbers nobody has) in a live event
    /// queue, each with its interrupt.
    EqeGarbage = 14,
    /// AENQ events of groups the specification does not define.
    AenqUnknownGroup = 15,
    /// A storm of AENQ events (warnings, notifications, keep-alives and
    /// unknown groups), as fast as the driver consumes them.
    AenqStorm = 16,
    /// A fatal error: `DEV_STS.FATAL_ERROR` and a FATAL_ERROR AENQ event;
    /// the device stops answering until reset.
    AenqFatal = 17,
    /// Interrupts with nothing behind them, on every vector, thousands.
    IrqSpurious = 18,
    /// Interrupts on every vector at a reset and for a while after it.
    IrqAfterReset = 19,
    /// Readless register reads go unanswered.
    ReadlessSilent = 20,
    /// Readless register reads are answered for another register.
    ReadlessWrongReg = 21,
    /// A reset never completes: `RESET_IN_PROGRESS` never rises, or never
    /// falls.
    ResetStuck = 22,
    /// BAR2 (doorbells and LLQ) is declared as I/O space, 4 KiB, with
    /// nothing behind it: its "address" is a port number, which a driver
    /// that maps BAR pages to userspace must not take for a physical
    /// address (it would map RAM). Armed only on the command line: the kind
    /// of a BAR is fixed when QEMU realizes the device.
    BarIo = 23,
    /// CREATE_QP or CREATE_CQ of a UAR that has doorbells already answers
    /// with a doorbell in another page, one no live UAR has: the UAR's
    /// doorbells would span two pages, the second one some later UAR's.
    RespDbSecondPage = 24,
}

use Malformation as M;

/// Every malformation, in number order.
pub const ALL: [Malformation; 24] = [
    M::CqeWrongId,
    M::CqeStaleId,
    M::CqeDuplicate,
    M::CqeBadPhase,
    M::CqeFreeSlot,
    M::StatusUnknown,
    M::RespHandleReuse,
    M::RespDbOutside,
    M::RespLlqOutside,
    M::RespLlqOverlap,
    M::RespDbForeign,
    M::RespSizeLarger,
    M::RespSubCqRange,
    M::EqeGarbage,
    M::AenqUnknownGroup,
    M::AenqStorm,
    M::AenqFatal,
    M::IrqSpurious,
    M::IrqAfterReset,
    M::ReadlessSilent,
    M::ReadlessWrongReg,
    M::ResetStuck,
    M::BarIo,
    M::RespDbSecondPage,
];

impl Malformation {
    /// The name used on the command line and in logs.
    pub fn name(self) -> &'static str {
        match self {
            M::CqeWrongId => "cqe-wrong-id",
            M::CqeStaleId => "cqe-stale-id",
            M::CqeDuplicate => "cqe-duplicate",
            M::CqeBadPhase => "cqe-bad-phase",
            M::CqeFreeSlot => "cqe-free-slot",
            M::StatusUnknown => "status-unknown",
            M::RespHandleReuse => "resp-handle-reuse",
            M::RespDbOutside => "resp-db-outside",
            M::RespLlqOutside => "resp-llq-outside",
            M::RespLlqOverlap => "resp-llq-overlap",
            M::RespDbForeign => "resp-db-foreign",
            M::RespSizeLarger => "resp-size-larger",
            M::RespSubCqRange => "resp-sub-cq-range",
            M::EqeGarbage => "eqe-garbage",
            M::AenqUnknownGroup => "aenq-unknown-group",
            M::AenqStorm => "aenq-storm",
            M::AenqFatal => "aenq-fatal",
            M::IrqSpurious => "irq-spurious",
            M::IrqAfterReset => "irq-after-reset",
            M::ReadlessSilent => "readless-silent",
            M::ReadlessWrongReg => "readless-wrong-reg",
            M::ResetStuck => "reset-stuck",
            M::BarIo => "bar-io",
            M::RespDbSecondPage => "resp-db-second-page",
        }
    }

    /// The malformation called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        ALL.into_iter().find(|m| m.name() == name)
    }

    /// The malformation numbered `raw` (the control window's numbers).
    pub fn from_raw(raw: u8) -> Option<Self> {
        ALL.into_iter().find(|&m| m as u8 == raw)
    }

    /// How many times it strikes when no count is given.
    pub fn default_count(self) -> u32 {
        match self {
            M::EqeGarbage => 256,
            M::AenqUnknownGroup => 64,
            M::AenqStorm => 5000,
            M::IrqSpurious => 5000,
            // Every reset while armed, and every read while armed.
            M::IrqAfterReset | M::ReadlessSilent | M::ReadlessWrongReg => u32::MAX,
            _ => 1,
        }
    }

    /// Whether the worker thread drives it (events the device sends on its
    /// own) rather than an admin command or a register access.
    pub fn is_spontaneous(self) -> bool {
        matches!(
            self,
            M::EqeGarbage | M::AenqUnknownGroup | M::AenqStorm | M::AenqFatal | M::IrqSpurious
        )
    }
}

impl fmt::Display for Malformation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A malformation with its seed and schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostileSpec {
    /// What goes wrong.
    pub malformation: Malformation,
    /// Seed of everything random about it.
    pub seed: u64,
    /// Occasions that pass normally first.
    pub after: u32,
    /// Strikes (0: the malformation's default).
    pub count: u32,
}

impl HostileSpec {
    /// Parses `NAME[,seed=S][,after=K][,count=C]`; NAME `random` picks a
    /// malformation from the seed.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut parts = spec.split(',');
        let name = parts.next().unwrap_or("").trim();
        let (mut seed, mut after, mut count) = (0u64, 0u32, 0u32);
        for part in parts {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("'{part}' is not key=value"))?;
            let n = parse_u64(value).ok_or_else(|| format!("bad number '{value}'"))?;
            let small = || u32::try_from(n).map_err(|_| format!("{key}={value} is too large"));
            match key.trim() {
                "seed" => seed = n,
                "after" => after = small()?,
                "count" => count = small()?,
                _ => return Err(format!("unknown key '{key}' (seed, after, count)")),
            }
        }
        let malformation = if name == "random" {
            ALL[(splitmix(&mut seed.clone()) % ALL.len() as u64) as usize]
        } else {
            Malformation::from_name(name).ok_or_else(|| {
                let names: Vec<_> = ALL.iter().map(|m| m.name()).collect();
                format!(
                    "unknown malformation '{name}' (random, {})",
                    names.join(", ")
                )
            })?
        };
        Ok(Self {
            malformation,
            seed,
            after,
            count,
        })
    }
}

impl fmt::Display for HostileSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{},seed={},after={},count={}",
            self.malformation, self.seed, self.after, self.count
        )
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// SplitMix64: small, seedable, good enough to pick ids and bytes.
fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Period of the worker while a spontaneous malformation runs.
pub const TICK: Duration = Duration::from_millis(1);

/// The hostile state of a device (under the device lock).
#[derive(Debug, Default)]
pub struct Hostile {
    spec: Option<HostileSpec>,
    rng: u64,
    /// Occasions seen since arming.
    seen: u32,
    /// Strikes since arming.
    hits: u32,
    /// Strikes since start (the control window's `HOSTILE_HITS`).
    pub total_hits: u32,
    /// Interrupt bursts still due after a reset.
    pub irq_bursts: Vec<Instant>,
    /// The reset the device is in never finishes (`reset-stuck`).
    pub reset_stuck: bool,
}

impl Hostile {
    /// Arms `spec` (or disarms with `None`).
    pub fn arm(&mut self, spec: Option<HostileSpec>) {
        self.spec = spec;
        self.rng = spec.map_or(0, |s| s.seed);
        self.seen = 0;
        self.hits = 0;
        self.irq_bursts.clear();
        self.reset_stuck = false;
    }

    /// What is armed.
    pub fn spec(&self) -> Option<HostileSpec> {
        self.spec
    }

    /// Whether `m` is the armed malformation (strikes left or not).
    pub fn armed(&self, m: Malformation) -> bool {
        self.spec.is_some_and(|s| s.malformation == m)
    }

    fn count(&self) -> u32 {
        self.spec.map_or(0, |s| match s.count {
            0 => s.malformation.default_count(),
            n => n,
        })
    }

    /// Whether `m` is armed and has strikes left (without using one).
    pub fn active(&self, m: Malformation) -> bool {
        self.armed(m) && self.hits < self.count()
    }

    /// An occasion for `m`: whether it strikes this time.
    pub fn strikes(&mut self, m: Malformation) -> bool {
        if !self.active(m) {
            return false;
        }
        let after = self.spec.map_or(0, |s| s.after);
        if self.seen < after {
            self.seen += 1;
            return false;
        }
        self.hits += 1;
        self.total_hits = self.total_hits.wrapping_add(1);
        true
    }

    /// Strikes left of the armed malformation.
    pub fn left(&self) -> u32 {
        self.count().saturating_sub(self.hits)
    }

    /// Takes up to `n` strikes of a spontaneous malformation at once;
    /// returns how many.
    pub fn take(&mut self, m: Malformation, n: u32) -> u32 {
        if !self.active(m) {
            return 0;
        }
        let n = n.min(self.left());
        self.hits += n;
        self.total_hits = self.total_hits.wrapping_add(n);
        n
    }

    /// A random number from the seed's sequence.
    pub fn rand(&mut self) -> u64 {
        splitmix(&mut self.rng)
    }

    /// A random number below `n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.rand() % n.max(1)
    }

    /// Whether the worker has something to do soon.
    pub fn busy(&self) -> bool {
        !self.irq_bursts.is_empty()
            || self
                .spec
                .is_some_and(|s| s.malformation.is_spontaneous() && self.hits < self.count())
    }
}

/// An admin completion as the device writes it.
pub(super) struct Completion {
    pub cmd_id: u16,
    pub status: u8,
    pub entry: AcqEntry,
    /// Written with the phase of the previous lap, and the slot is not
    /// consumed.
    pub bad_phase: bool,
}

impl State {
    fn hostile_report(&self, inner: &Inner, what: std::fmt::Arguments<'_>) {
        report!(
            inner.health(),
            Warn,
            Some(Class::Injected),
            "hostile",
            "{}: hostile: {what}",
            inner.name()
        );
    }

    /// The malformation armed at start, if any.
    pub(super) fn hostile_from_config(&mut self, inner: &Inner) {
        if let Some(spec) = inner.cfg.hostile {
            self.hostile.arm(Some(spec));
            log::warn!("{}: hostile mode: {spec}", inner.name());
            if self.hostile.strikes(M::BarIo) {
                self.hostile_report(inner, format_args!("BAR2 declared as 4 KiB of I/O space"));
            }
        }
    }

    /// Arms `spec` (the control window), or disarms.
    pub(super) fn hostile_arm(&mut self, inner: &Inner, spec: Option<HostileSpec>) {
        self.hostile.arm(spec);
        match spec {
            Some(spec) => log::warn!("{}: hostile mode: {spec}", inner.name()),
            None => log::info!("{}: hostile mode off", inner.name()),
        }
        inner.wake.notify_all();
    }

    /// A command about to run: `Some(status)` if it is not to run and is to
    /// complete with an out-of-spec status instead.
    pub(super) fn hostile_status(&mut self, inner: &Inner, opcode: u8) -> Option<u8> {
        if !self.hostile.strikes(M::StatusUnknown) {
            return None;
        }
        let status = 8 + self.hostile.below(248) as u8;
        self.hostile_report(
            inner,
            format_args!("opcode {opcode} not executed, completes with status {status}"),
        );
        Some(status)
    }

    /// What the completion of a command that ran becomes.
    pub(super) fn hostile_completions(&mut self, inner: &Inner, c: Completion) -> Vec<Completion> {
        let last = self.last_cmd_id.replace(c.cmd_id);
        let Some(spec) = self.hostile.spec() else {
            return vec![c];
        };
        let id = c.cmd_id;
        match spec.malformation {
            M::CqeWrongId if self.hostile.strikes(M::CqeWrongId) => {
                let wrong = (id ^ (1 + self.hostile.below(0xffe) as u16)) & 0xfff;
                self.hostile_report(
                    inner,
                    format_args!("completion of #{id:#05x} as #{wrong:#05x}"),
                );
                vec![Completion { cmd_id: wrong, ..c }]
            }
            M::CqeStaleId
                if last.is_some_and(|l| l != id) && self.hostile.strikes(M::CqeStaleId) =>
            {
                let stale = last.unwrap_or(id);
                self.hostile_report(
                    inner,
                    format_args!("completion of #{id:#05x} as the earlier #{stale:#05x}"),
                );
                vec![Completion { cmd_id: stale, ..c }]
            }
            M::CqeDuplicate if self.hostile.strikes(M::CqeDuplicate) => {
                self.hostile_report(
                    inner,
                    format_args!("completion of #{id:#05x} written twice"),
                );
                let again = Completion {
                    cmd_id: c.cmd_id,
                    status: c.status,
                    entry: c.entry,
                    bad_phase: false,
                };
                vec![c, again]
            }
            M::CqeBadPhase if self.hostile.strikes(M::CqeBadPhase) => {
                self.hostile_report(
                    inner,
                    format_args!("completion of #{id:#05x} with the wrong phase"),
                );
                vec![Completion {
                    bad_phase: true,
                    ..c
                }]
            }
            M::CqeFreeSlot
                if last.is_some_and(|l| l != id) && self.hostile.strikes(M::CqeFreeSlot) =>
            {
                let free = last.unwrap_or(id);
                self.hostile_report(
                    inner,
                    format_args!("an extra completion #{free:#05x} before #{id:#05x}"),
                );
                let mut entry = AcqEntry::ZERO;
                for b in entry.response_specific_data.iter_mut() {
                    *b = self.hostile.rand() as u8;
                }
                let extra = Completion {
                    cmd_id: free,
                    status: 0,
                    entry,
                    bad_phase: false,
                };
                vec![extra, c]
            }
            _ => vec![c],
        }
    }

    /// What the response of command `opcode`, which succeeded, becomes.
    pub(super) fn hostile_response(
        &mut self,
        inner: &Inner,
        opcode: u8,
        entry: AcqEntry,
    ) -> AcqEntry {
        let Some(spec) = self.hostile.spec() else {
            return entry;
        };
        let Some(op) = AdminOpcode::from_raw(opcode) else {
            return entry;
        };
        let bar_size = inner.layout.size;
        let m = spec.malformation;
        match (m, op) {
            (M::RespHandleReuse, _) => self.handle_reuse(inner, op, entry),
            (M::RespDbOutside, AdminOpcode::CreateQp) => {
                if !self.hostile.strikes(m) {
                    return entry;
                }
                let mut r: CreateQpResp = entry.resp();
                let bad = self.outside(bar_size);
                if self.hostile.rand() & 1 == 0 {
                    r.sq_db_offset = bad;
                } else {
                    r.rq_db_offset = bad;
                }
                self.hostile_report(
                    inner,
                    format_args!("CREATE_QP doorbell at {bad:#x}, outside BAR2"),
                );
                AcqEntry::from_resp(&r)
            }
            (M::RespDbOutside, AdminOpcode::CreateCq) => {
                if !self.hostile.strikes(m) {
                    return entry;
                }
                let mut r: CreateCqResp = entry.resp();
                r.db_offset = self.outside(bar_size);
                self.hostile_report(
                    inner,
                    format_args!("CREATE_CQ doorbell at {:#x}, outside BAR2", r.db_offset),
                );
                AcqEntry::from_resp(&r)
            }
            (M::RespLlqOutside, AdminOpcode::CreateQp) => {
                if !self.hostile.strikes(m) {
                    return entry;
                }
                let mut r: CreateQpResp = entry.resp();
                r.llq_descriptors_offset = if self.hostile.rand() & 1 == 0 {
                    // Straddles the end.
                    (bar_size - 64) as u32
                } else {
                    self.outside(bar_size)
                };
                self.hostile_report(
                    inner,
                    format_args!(
                        "CREATE_QP LLQ at {:#x}, outside BAR2",
                        r.llq_descriptors_offset
                    ),
                );
                AcqEntry::from_resp(&r)
            }
            (M::RespLlqOverlap, AdminOpcode::CreateQp) => {
                let mut r: CreateQpResp = entry.resp();
                // Pages of live objects: other QPs' LLQs, live UARs'
                // doorbells (UAR 0's page if there is none).
                let mut others: Vec<(u64, &str)> = self
                    .objs
                    .qps
                    .iter()
                    .filter(|(h, _)| *h != r.qp_handle)
                    .map(|(_, q)| (q.llq_offset, "another QP's LLQ"))
                    .collect();
                others.extend(
                    self.objs
                        .uars
                        .iter()
                        .filter_map(|(h, _)| self.objs.uars.index_of(h))
                        .map(|i| (inner.layout.doorbell(i, 0), "a live UAR's doorbell page")),
                );
                if !self.hostile.strikes(m) {
                    return entry;
                }
                let (at, what) = match others.len() {
                    0 => (inner.layout.doorbell(0, 0), "UAR 0's doorbell page"),
                    n => others[self.hostile.below(n as u64) as usize],
                };
                r.llq_descriptors_offset = at as u32;
                self.hostile_report(inner, format_args!("CREATE_QP LLQ at {at:#x}, on {what}"));
                AcqEntry::from_resp(&r)
            }
            (M::RespDbForeign, AdminOpcode::CreateQp | AdminOpcode::CreateCq) => {
                // The UAR of the new object.
                let uar = if op == AdminOpcode::CreateQp {
                    let r: CreateQpResp = entry.resp();
                    self.objs.qps.get(r.qp_handle).map(|q| q.uar)
                } else {
                    let r: CreateCqResp = entry.resp();
                    self.objs.cqs.get(r.cq_idx.into()).map(|c| c.uar)
                };
                let mine = uar.and_then(|u| self.objs.uars.index_of(u));
                let others: Vec<usize> = self
                    .objs
                    .uars
                    .iter()
                    .filter_map(|(h, _)| self.objs.uars.index_of(h))
                    .filter(|&i| Some(i) != mine)
                    .collect();
                if others.is_empty() || !self.hostile.strikes(m) {
                    return entry;
                }
                let i = others[self.hostile.below(others.len() as u64) as usize];
                let at = (inner.layout.doorbell(i, 0) + 4 * self.hostile.below(16)) as u32;
                self.hostile_report(
                    inner,
                    format_args!("{op:?} doorbell at {at:#x}, in the page of UAR index {i}"),
                );
                if op == AdminOpcode::CreateQp {
                    let mut r: CreateQpResp = entry.resp();
                    r.sq_db_offset = at;
                    AcqEntry::from_resp(&r)
                } else {
                    let mut r: CreateCqResp = entry.resp();
                    r.db_offset = at;
                    AcqEntry::from_resp(&r)
                }
            }
            (M::RespDbSecondPage, AdminOpcode::CreateQp | AdminOpcode::CreateCq) => {
                // The UAR of the new object, and how many doorbells it has
                // (the new object's included).
                let (uar, own) = if op == AdminOpcode::CreateQp {
                    let r: CreateQpResp = entry.resp();
                    (self.objs.qps.get(r.qp_handle).map(|q| q.uar), 2)
                } else {
                    let r: CreateCqResp = entry.resp();
                    (self.objs.cqs.get(r.cq_idx.into()).map(|c| c.uar), 1)
                };
                let Some(uar) = uar else {
                    return entry;
                };
                let taken = self
                    .objs
                    .uars
                    .get(uar)
                    .map_or(0, |u| u.used.iter().filter(|&&b| b).count());
                // A doorbell page of no live UAR.
                let live: Vec<usize> = self
                    .objs
                    .uars
                    .iter()
                    .filter_map(|(h, _)| self.objs.uars.index_of(h))
                    .collect();
                let free = (0..inner.layout.db_pages as usize).find(|i| !live.contains(i));
                let Some(free) = free else {
                    return entry;
                };
                if taken <= own || !self.hostile.strikes(m) {
                    return entry;
                }
                let at = (inner.layout.doorbell(free, 0) + 4 * self.hostile.below(16)) as u32;
                self.hostile_report(
                    inner,
                    format_args!(
                        "{op:?} doorbell of UAR {uar} at {at:#x}, in the page of unused UAR index {free}"
                    ),
                );
                if op == AdminOpcode::CreateQp {
                    let mut r: CreateQpResp = entry.resp();
                    r.sq_db_offset = at;
                    AcqEntry::from_resp(&r)
                } else {
                    let mut r: CreateCqResp = entry.resp();
                    r.db_offset = at;
                    AcqEntry::from_resp(&r)
                }
            }
            (M::RespSizeLarger, AdminOpcode::CreateCq) => {
                if !self.hostile.strikes(m) {
                    return entry;
                }
                let mut r: CreateCqResp = entry.resp();
                let asked = r.sub_cq_actual_depth;
                r.sub_cq_actual_depth = match self.hostile.below(3) {
                    0 => asked.saturating_mul(2),
                    1 => asked.saturating_add(1),
                    _ => u16::MAX,
                };
                self.hostile_report(
                    inner,
                    format_args!("CREATE_CQ depth {} for {asked}", r.sub_cq_actual_depth),
                );
                AcqEntry::from_resp(&r)
            }
            (M::RespSubCqRange, AdminOpcode::CreateQp) => {
                if !self.hostile.strikes(m) {
                    return entry;
                }
                let mut r: CreateQpResp = entry.resp();
                let subs = inner.cfg.limits.sub_cqs_per_cq;
                let bad = subs + self.hostile.below(u64::from(u16::MAX - subs)) as u16;
                if self.hostile.rand() & 1 == 0 {
                    r.send_sub_cq_idx = bad;
                } else {
                    r.recv_sub_cq_idx = bad;
                }
                self.hostile_report(
                    inner,
                    format_args!("CREATE_QP sub-CQ index {bad} of {subs}"),
                );
                AcqEntry::from_resp(&r)
            }
            _ => entry,
        }
    }

    /// An offset past the end of BAR2 that still fits 32 bits.
    fn outside(&mut self, bar_size: u64) -> u32 {
        let room = u64::from(u32::MAX) - bar_size;
        (bar_size + (self.hostile.below(room / 8) & !3)) as u32
    }

    fn handle_reuse(&mut self, inner: &Inner, op: AdminOpcode, entry: AcqEntry) -> AcqEntry {
        fn other(all: Vec<u32>, new: u32, h: &mut Hostile) -> Option<u32> {
            let all: Vec<u32> = all.into_iter().filter(|&x| x != new).collect();
            (!all.is_empty()).then(|| all[h.below(all.len() as u64) as usize])
        }
        let o = &self.objs;
        let m = M::RespHandleReuse;
        match op {
            AdminOpcode::AllocPd => {
                let mut r: AllocPdResp = entry.resp();
                let Some(x) = other(
                    o.pds.iter().map(|(h, _)| h).collect(),
                    r.pd.into(),
                    &mut self.hostile,
                ) else {
                    return entry;
                };
                if !self.hostile.strikes(m) {
                    return entry;
                }
                self.hostile_report(inner, format_args!("ALLOC_PD answers PD {x} for {}", r.pd));
                r.pd = x as u16;
                AcqEntry::from_resp(&r)
            }
            AdminOpcode::AllocUar => {
                let mut r: AllocUarResp = entry.resp();
                let Some(x) = other(
                    o.uars.iter().map(|(h, _)| h).collect(),
                    r.uar.into(),
                    &mut self.hostile,
                ) else {
                    return entry;
                };
                if !self.hostile.strikes(m) {
                    return entry;
                }
                self.hostile_report(
                    inner,
                    format_args!("ALLOC_UAR answers UAR {x} for {}", r.uar),
                );
                r.uar = x as u16;
                AcqEntry::from_resp(&r)
            }
            AdminOpcode::CreateCq => {
                let mut r: CreateCqResp = entry.resp();
                let Some(x) = other(
                    o.cqs.iter().map(|(h, _)| h).collect(),
                    r.cq_idx.into(),
                    &mut self.hostile,
                ) else {
                    return entry;
                };
                if !self.hostile.strikes(m) {
                    return entry;
                }
                self.hostile_report(
                    inner,
                    format_args!("CREATE_CQ answers CQ {x} for {}", r.cq_idx),
                );
                r.cq_idx = x as u16;
                AcqEntry::from_resp(&r)
            }
            AdminOpcode::CreateQp => {
                let mut r: CreateQpResp = entry.resp();
                let Some(x) = other(
                    o.qps.iter().map(|(h, _)| h).collect(),
                    r.qp_handle,
                    &mut self.hostile,
                ) else {
                    return entry;
                };
                if !self.hostile.strikes(m) {
                    return entry;
                }
                self.hostile_report(
                    inner,
                    format_args!("CREATE_QP answers QP {x:#x} for {:#x}", r.qp_handle),
                );
                r.qp_handle = x;
                r.qp_num = x as u16;
                AcqEntry::from_resp(&r)
            }
            AdminOpcode::CreateAh => {
                let mut r: CreateAhResp = entry.resp();
                let Some(x) = other(
                    o.ahs.iter().map(|(h, _)| h).collect(),
                    r.ah.into(),
                    &mut self.hostile,
                ) else {
                    return entry;
                };
                if !self.hostile.strikes(m) {
                    return entry;
                }
                self.hostile_report(inner, format_args!("CREATE_AH answers AH {x} for {}", r.ah));
                r.ah = x as u16;
                AcqEntry::from_resp(&r)
            }
            AdminOpcode::RegMr => {
                let mut r: RegMrResp = entry.resp();
                let Some(x) = other(
                    o.mrs.iter().map(|(h, _)| h).collect(),
                    r.l_key,
                    &mut self.hostile,
                ) else {
                    return entry;
                };
                if !self.hostile.strikes(m) {
                    return entry;
                }
                self.hostile_report(
                    inner,
                    format_args!("REG_MR answers key {x:#x} for {:#x}", r.l_key),
                );
                r.l_key = x;
                r.r_key = x;
                AcqEntry::from_resp(&r)
            }
            _ => entry,
        }
    }

    /// A readless read of `reg_off`: `None` if it goes unanswered, else the
    /// register the answer names.
    pub(super) fn hostile_readless(&mut self, inner: &Inner, reg_off: u16) -> Option<u16> {
        if self.hostile.strikes(M::ReadlessSilent) {
            self.hostile_report(
                inner,
                format_args!("readless read of {reg_off:#x} unanswered"),
            );
            return None;
        }
        if self.hostile.strikes(M::ReadlessWrongReg) {
            let other = (reg_off ^ (4 << self.hostile.below(4))) & 0x7c;
            self.hostile_report(
                inner,
                format_args!("readless read of {reg_off:#x} answered for {other:#x}"),
            );
            return Some(other);
        }
        Some(reg_off)
    }

    /// A reset was asked for: whether it is to happen (`reset-stuck` may
    /// ignore it, or let it happen and never finish).
    pub(super) fn hostile_reset(&mut self, inner: &Inner) -> bool {
        if self.hostile.strikes(M::IrqAfterReset) {
            self.hostile_report(
                inner,
                format_args!("interrupts on every vector at and after the reset"),
            );
            self.signal_all(inner);
            let now = Instant::now();
            self.hostile.irq_bursts = [5, 20, 100, 500, 1500]
                .into_iter()
                .map(|ms| now + Duration::from_millis(ms))
                .collect();
            inner.wake.notify_all();
        }
        self.hostile.reset_stuck = false;
        if !self.hostile.strikes(M::ResetStuck) {
            return true;
        }
        if self.hostile.rand() & 1 == 0 {
            self.hostile_report(
                inner,
                format_args!("reset ignored: RESET_IN_PROGRESS never rises"),
            );
            false
        } else {
            self.hostile_report(
                inner,
                format_args!("reset never finishes: RESET_IN_PROGRESS stays up"),
            );
            self.hostile.reset_stuck = true;
            true
        }
    }

    fn signal_all(&self, inner: &Inner) {
        for v in 0..inner.cfg.msix_vectors {
            inner.irq.signal(v);
        }
    }

    /// The worker's turn: spontaneous malformations and interrupt bursts.
    pub(super) fn hostile_tick(&mut self, inner: &Inner, now: Instant) {
        let due = self
            .hostile
            .irq_bursts
            .iter()
            .filter(|&&t| t <= now)
            .count();
        if due > 0 {
            self.hostile.irq_bursts.retain(|&t| t > now);
            self.signal_all(inner);
        }
        let Some(spec) = self.hostile.spec() else {
            return;
        };
        if !spec.malformation.is_spontaneous() || !self.hostile.active(spec.malformation) {
            return;
        }
        if self.hostile.seen < spec.after {
            // `after` counts ticks for spontaneous malformations.
            self.hostile.seen += 1;
            return;
        }
        match spec.malformation {
            M::EqeGarbage => {
                let eqs: Vec<u32> = self.objs.eqs.iter().map(|(h, _)| h).collect();
                if eqs.is_empty() {
                    return;
                }
                for _ in 0..self.hostile.take(M::EqeGarbage, 4) {
                    let eqn = eqs[self.hostile.below(eqs.len() as u64) as usize];
                    self.garbage_eqe(inner, eqn);
                }
            }
            M::AenqUnknownGroup => {
                if self.hostile.active(M::AenqUnknownGroup) {
                    let group = match self.hostile.below(3) {
                        0 => 0,
                        1 => 5 + self.hostile.below(27) as u16,
                        _ => self.hostile.rand() as u16 | 0x20,
                    };
                    let syndrome = self.hostile.rand() as u16;
                    if let Ok(true) = self.post_aenq_raw(inner, group, syndrome) {
                        self.hostile.take(M::AenqUnknownGroup, 1);
                    }
                }
            }
            M::AenqStorm => {
                for _ in 0..16 {
                    if !self.hostile.active(M::AenqStorm) {
                        break;
                    }
                    let group = [2, 3, 4, 0, 9][self.hostile.below(5) as usize];
                    let syndrome = self.hostile.rand() as u16;
                    match self.post_aenq_raw(inner, group, syndrome) {
                        Ok(true) => {
                            self.hostile.take(M::AenqStorm, 1);
                        }
                        _ => break,
                    }
                }
            }
            M::AenqFatal => {
                if self.hostile.take(M::AenqFatal, 1) == 1 {
                    self.enter_fatal(inner, Some(Class::Injected), "hostile: aenq-fatal");
                }
            }
            M::IrqSpurious => {
                for _ in 0..self.hostile.take(M::IrqSpurious, 20) {
                    let v = self.hostile.below(inner.cfg.msix_vectors.into()) as u16;
                    inner.irq.signal(v);
                }
            }
            _ => {}
        }
    }

    fn garbage_eqe(&mut self, inner: &Inner, eqn: u32) {
        let mut bytes = [0u8; EQE_SIZE];
        for b in bytes.iter_mut() {
            *b = self.hostile.rand() as u8;
        }
        let Some(eq) = self.objs.eqs.get_mut(eqn) else {
            return;
        };
        let depth = u32::from(eq.depth);
        let n = eq.produced;
        let phase = u8::from((n / depth) % 2 == 0);
        bytes[0] = (bytes[0] & !1) | phase;
        let at = eq.ring + u64::from(n % depth) * EQE_SIZE as u64;
        eq.produced = n.wrapping_add(1);
        let vector = eq.msix_vec;
        if inner.publish(self, at, &bytes, 0).is_ok() {
            inner.irq.signal(vector);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_round_trip() {
        for (i, m) in ALL.into_iter().enumerate() {
            assert_eq!(m as usize, i + 1);
            assert_eq!(Malformation::from_name(m.name()), Some(m));
            assert_eq!(Malformation::from_raw(m as u8), Some(m));
        }
        assert_eq!(Malformation::from_raw(0), None);
        assert_eq!(Malformation::from_raw(ALL.len() as u8 + 1), None);
    }

    #[test]
    fn specs_parse() {
        let s = HostileSpec::parse("cqe-wrong-id,seed=0x10,after=2,count=3").unwrap();
        assert_eq!(s.malformation, M::CqeWrongId);
        assert_eq!((s.seed, s.after, s.count), (16, 2, 3));
        assert_eq!(HostileSpec::parse(&s.to_string()), Ok(s));
        let r = HostileSpec::parse("random,seed=7").unwrap();
        assert_eq!(HostileSpec::parse("random,seed=7"), Ok(r));
        for bad in [
            "",
            "nope",
            "cqe-wrong-id,seed",
            "cqe-wrong-id,x=1",
            "aenq-storm,count=1e9",
        ] {
            assert!(HostileSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn strikes_after_and_count() {
        let mut h = Hostile::default();
        assert!(!h.strikes(M::CqeWrongId));
        h.arm(Some(
            HostileSpec::parse("cqe-wrong-id,after=2,count=2").unwrap(),
        ));
        let got: Vec<_> = (0..6).map(|_| h.strikes(M::CqeWrongId)).collect();
        assert_eq!(got, [false, false, true, true, false, false]);
        assert!(!h.strikes(M::CqeDuplicate));
        assert_eq!(h.total_hits, 2);
        h.arm(Some(HostileSpec::parse("aenq-storm").unwrap()));
        assert!(h.busy());
        assert_eq!(h.take(M::AenqStorm, 4000), 4000);
        assert_eq!(h.take(M::AenqStorm, 4000), 1000);
        assert!(!h.busy());
    }

    #[test]
    fn seeds_replay() {
        let mut a = Hostile::default();
        let mut b = Hostile::default();
        let spec = HostileSpec::parse("eqe-garbage,seed=42").unwrap();
        a.arm(Some(spec));
        b.arm(Some(spec));
        let x: Vec<_> = (0..8).map(|_| a.rand()).collect();
        let y: Vec<_> = (0..8).map(|_| b.rand()).collect();
        assert_eq!(x, y);
    }
}
