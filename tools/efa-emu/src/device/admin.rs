//! The admin queue: fetching entries, executing every command, writing
//! completions.
//!
//! Statuses follow the meaning the C driver gives them: an unknown or
//! unimplemented opcode or feature is `UNSUPPORTED_OPCODE` (EOPNOTSUPP), a
//! badly formed entry (phase, checksum, reserved bits, flags the opcode
//! does not take, an unreadable control buffer or page list) is
//! `MALFORMED_REQUEST`, a bad value (handle, owner, size, limit the
//! request breaks) is `ILLEGAL_PARAMETER`, exhaustion is
//! `RESOURCE_ALLOCATION_FAILURE` (ENOMEM), and destroying an object still
//! in use is `RESOURCE_BUSY`. A duplicate address handle for one (PD, GID)
//! is also `RESOURCE_BUSY`: the C driver caches address handles precisely
//! so that it never asks twice.
//!
//! For efa-emu's health counters ([`crate::health`]) a malformed entry and
//! a QP state change the state machine forbids (the RDMA core checks
//! transitions before a driver sees them) are `guest_bug`; any other
//! failure is `admin_error`, an injected one `injected`.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use efa_hw::admin::*;
use efa_hw::aenq::DRIVER_ENABLED_GROUPS;
use efa_hw::io::EQE_SIZE;
use efa_hw::regs;
use efa_hw::wire::Wire;

use super::control::LATE_MARKER;
use super::datapath::{CqData, QpData};
use super::hostile::Completion;
use super::objects::{Ah, Cq, Eq, EventCounter, Mr, Pd, Qp, Stats, Uar};
use super::pbl::{self, PblError};
use super::{addr, bar2, InjectMode, Inner, State, MAX_AQ_DEPTH};
use crate::health::Class;
use crate::report;

/// A failed command: its status, for the log why, and how efa-emu's
/// health counters count it.
#[derive(Debug)]
pub(super) struct Fail {
    status: AdminStatus,
    why: String,
    class: Class,
}

fn fail<T>(status: AdminStatus, why: impl Into<String>) -> Result<T, Fail> {
    Err(Fail {
        status,
        why: why.into(),
        class: Class::AdminError,
    })
}

fn illegal<T>(why: impl Into<String>) -> Result<T, Fail> {
    fail(AdminStatus::IllegalParameter, why)
}

fn malformed<T>(why: impl Into<String>) -> Result<T, Fail> {
    Err(Fail {
        status: AdminStatus::MalformedRequest,
        why: why.into(),
        class: Class::GuestBug,
    })
}

/// Something the protocol forbids in the object's state (a driver bug):
/// `ILLEGAL_PARAMETER`, counted as `guest_bug`.
fn forbidden<T>(why: impl Into<String>) -> Result<T, Fail> {
    Err(Fail {
        status: AdminStatus::IllegalParameter,
        why: why.into(),
        class: Class::GuestBug,
    })
}

fn no_room<T>(what: &str) -> Result<T, Fail> {
    fail(
        AdminStatus::ResourceAllocationFailure,
        format!("no room for another {what}"),
    )
}

/// AENQ groups the device reports: all the 7.3 driver asks for.
pub const SUPPORTED_AENQ_GROUPS: u32 = DRIVER_ENABLED_GROUPS;

/// Page sizes usable in REG_MR: 4 KiB to 2 GiB.
pub const PAGE_SIZE_CAP: u64 = 0xffff_f000;

/// QP events an event counter can count.
pub const SUPPORTED_COUNTER_EVENTS: u32 = 0x3ff;

/// Largest HOST_INFO control buffer read.
const MAX_HOST_INFO: u32 = 4096;

/// A command held by a `Late` injection, answered only when the control
/// window asks (`COMMAND` 7), after the driver gave up on it.
#[derive(Debug, Clone)]
pub(super) struct Held {
    cmd_id: u16,
    status: AdminStatus,
    /// The buffers it named: (address, bytes).
    named: Vec<(u64, usize)>,
    /// Its control buffer as the device read it (address, contents): the
    /// driver's own memory, which nobody may change or free while the
    /// command is in flight (what a reset with it held checks).
    given: Option<(u64, Vec<u8>)>,
}

/// Largest control buffer a held command keeps a copy of.
const MAX_GIVEN: usize = 64 << 10;

/// How long a reset takes when commands are held: the device finishes
/// what it was doing (as hardware drains DMA in flight) before the reset
/// completes, well inside `CAPS.RESET_TIMEOUT`, and a driver that freed
/// what it gave them before the reset has had the time to.
pub(super) const SETTLE: Duration = Duration::from_millis(200);

/// A reset requested while commands were held, until it completes.
#[derive(Debug)]
pub(super) struct Settling {
    held: Vec<Held>,
    until: Instant,
}

/// One command being executed: its header flags and payload, and what the
/// verbose log shows of it.
struct Cmd<'a> {
    flags: u8,
    payload: &'a [u8],
    verbose: bool,
    shown: String,
    answer: String,
}

/// A `Debug` rendering for the log: without the (still empty) completion
/// header and with all-zero arrays shortened.
fn compact(what: &dyn Debug) -> String {
    let s = format!("{what:?}");
    let s = match (s.find("acq_common_desc: AcqCommonDesc {"), s.find("}, ")) {
        (Some(a), Some(b)) if b > a => format!("{}{}", &s[..a], &s[b + 3..]),
        _ => s,
    };
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let tail = &rest[open..];
        let close = tail.find(']').unwrap_or(tail.len() - 1);
        let inner = &tail[1..close];
        let n = inner.split(", ").count();
        if n > 4 && inner.split(", ").all(|x| x == "0") {
            out.push_str(&format!("[0; {n}]"));
        } else {
            out.push_str(&tail[..=close]);
        }
        rest = &tail[close + 1..];
    }
    out.push_str(rest);
    out
}

impl Cmd<'_> {
    fn decode<T: Wire + Debug>(&mut self) -> T {
        let c = T::decode_padded(self.payload);
        if self.verbose {
            self.shown = compact(&c);
        }
        c
    }

    fn show(&mut self, what: &dyn Debug) {
        if self.verbose {
            self.answer = compact(what);
        }
    }

    fn reply<T: Wire + Debug>(&mut self, resp: T) -> AcqEntry {
        if self.verbose && self.answer.is_empty() {
            self.answer = compact(&resp);
        }
        AcqEntry::from_resp(&resp)
    }
}

fn opcode_name(opcode: u8) -> String {
    AdminOpcode::from_raw(opcode).map_or_else(|| format!("OPCODE_{opcode}"), |o| format!("{o:?}"))
}

/// A NUL-terminated string from the guest, for the log: control
/// characters escaped, so that it cannot start lines of its own.
fn nul_str(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let mut out = String::new();
    for c in String::from_utf8_lossy(&bytes[..end]).chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// Where a new QP's SRD sequence numbers start: the time in nanoseconds,
/// so that a responder never takes a new QP's requests for duplicates of
/// an earlier QP's with the same number.
fn seq_base() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Header flags each opcode may carry besides the phase.
fn allowed_flags(opcode: u8) -> u8 {
    let ctrl = AqCommonDesc::CTRL_DATA.mask();
    match AdminOpcode::from_raw(opcode) {
        Some(AdminOpcode::RegMr) => ctrl | AqCommonDesc::CTRL_DATA_INDIRECT.mask(),
        Some(AdminOpcode::GetFeature | AdminOpcode::SetFeature | AdminOpcode::GetStats) => ctrl,
        _ => 0,
    }
}

/// Whether the QP state machine allows `cur` to `new` with attribute bits
/// `mask` (ModifyQpCmd bits without QP_STATE/CUR_QP_STATE). The rules are
/// those of the IB spec for UD and of the C driver's table for SRD; RNR
/// retry exists only for SRD.
fn transition_ok(qp_type: QpType, cur: QpState, new: QpState, mask: u32) -> bool {
    use QpState::*;
    let qkey = ModifyQpCmd::QKEY.mask();
    let psn = ModifyQpCmd::SQ_PSN.mask();
    let rnr = if qp_type == QpType::Srd {
        ModifyQpCmd::RNR_RETRY.mask()
    } else {
        0
    };
    let drained = ModifyQpCmd::SQ_DRAINED_ASYNC_NOTIFY.mask();
    let (required, optional) = match (cur, new) {
        (_, Reset) => (0, 0),
        (Reset, Err) => return false,
        (_, Err) => (0, 0),
        (Reset, Init) => (qkey, 0),
        (Init, Init) | (Init, Rtr) => (0, qkey),
        (Rtr, Rts) => (psn, qkey | rnr),
        (Rts, Rts) | (Sqd, Rts) | (Sqd, Sqd) | (Sqe, Rts) => (0, qkey),
        (Rts, Sqd) => (0, drained),
        _ => return false,
    };
    mask & required == required && mask & !(required | optional) == 0
}

impl State {
    /// Executes every command the doorbell announced and completes them.
    pub(super) fn process_admin(&mut self, inner: &Inner) {
        if self.fatal || self.reset_in_progress {
            return;
        }
        let db = self.regs.aq_prod_db as u16;
        let pending = db.wrapping_sub(self.aq_cc);
        if pending == 0 {
            return;
        }
        let r = &self.regs;
        let depth = regs::AQ_CAPS_AQ_DEPTH.get(r.aq_caps);
        let esize = regs::AQ_CAPS_AQ_ENTRY_SIZE.get(r.aq_caps);
        let aq_base = addr(r.aq_base_hi, r.aq_base_lo);
        let acq_depth = regs::ACQ_CAPS_ACQ_DEPTH.get(r.acq_caps);
        let acq_esize = regs::ACQ_CAPS_ACQ_ENTRY_SIZE.get(r.acq_caps);
        let acq_base = addr(r.acq_base_hi, r.acq_base_lo);
        let ring_ok = |d: u32| d.is_power_of_two() && d <= MAX_AQ_DEPTH;
        if !ring_ok(depth)
            || !ring_ok(acq_depth)
            || !(esize as usize == AqEntry::SIZE || esize as usize == AqEntryV2::SIZE)
            || acq_esize as usize != AcqEntry::SIZE
            || aq_base == 0
            || acq_base == 0
        {
            self.enter_fatal(
                inner,
                Some(Class::GuestBug),
                &format!(
                    "admin doorbell with the queues not set up (AQ {aq_base:#x} x{depth}/{esize} B, \
                     ACQ {acq_base:#x} x{acq_depth}/{acq_esize} B)"
                ),
            );
            return;
        }
        if u32::from(pending) > depth {
            self.enter_fatal(
                inner,
                Some(Class::GuestBug),
                &format!(
                    "admin doorbell {db} is {pending} entries ahead, past the {depth}-entry ring"
                ),
            );
            return;
        }
        let mut done = Vec::with_capacity(pending.into());
        for _ in 0..pending {
            let cc = u32::from(self.aq_cc);
            let phase = u8::from((cc / depth) % 2 == 0);
            // The base is the driver's: past the end of the address space
            // the read fails as DMA outside memory does.
            let at = aq_base.wrapping_add(u64::from(cc % depth) * u64::from(esize));
            let bytes = match inner.dma_read(self, at, esize as usize) {
                Ok(b) => b,
                Err(e) => return self.enter_fatal(inner, None, &format!("AQ read: {e}")),
            };
            self.aq_cc = self.aq_cc.wrapping_add(1);
            if let Some(c) = self.run_entry(inner, &bytes, phase) {
                done.push(c);
            }
        }
        if inner.cfg.reorder {
            done.reverse();
        }
        self.write_completions(inner, done);
    }

    /// Writes completions `(command id, status, entry)` to the ACQ and
    /// raises the admin interrupt, unless masked.
    fn write_completions(&mut self, inner: &Inner, done: Vec<(u16, u8, AcqEntry)>) {
        let r = &self.regs;
        let acq_depth = regs::ACQ_CAPS_ACQ_DEPTH.get(r.acq_caps);
        let acq_base = addr(r.acq_base_hi, r.acq_base_lo);
        let vector = regs::ACQ_CAPS_ACQ_MSIX_VECTOR.get(r.acq_caps) as u16;
        if acq_depth == 0 || acq_base == 0 {
            return;
        }
        let wrote = !done.is_empty();
        for (cmd_id, status, entry) in done {
            let c = Completion {
                cmd_id,
                status,
                entry,
                bad_phase: false,
            };
            // Hostile mode may rewrite, repeat or add completions.
            for c in self.hostile_completions(inner, c) {
                let slot = self.acq_pc % acq_depth;
                let phase = u8::from((self.acq_pc / acq_depth) % 2 == 0) ^ u8::from(c.bad_phase);
                let mut e = c.entry;
                let d = &mut e.acq_common_descriptor;
                d.command = c.cmd_id;
                d.status = c.status;
                d.flags = AcqCommonDesc::PHASE.prep(phase);
                d.reserved = 0;
                e.seal();
                let at = acq_base.wrapping_add(u64::from(slot) * AcqEntry::SIZE as u64);
                // The phase is in `flags`, byte 3.
                if let Err(err) = inner.publish(self, at, &e.to_bytes(), 3) {
                    return self.enter_fatal(inner, None, &format!("ACQ write: {err}"));
                }
                if !c.bad_phase {
                    self.acq_pc = self.acq_pc.wrapping_add(1);
                }
            }
        }
        if wrote && !regs::INTR_MASK_EN.is_set(self.regs.intr_mask) {
            inner.irq.signal(vector);
        }
    }

    fn take_injection(&mut self, opcode: u8) -> Option<InjectMode> {
        let rule = self.inject.get_mut(&opcode)?;
        if rule.skip > 0 {
            rule.skip -= 1;
            return None;
        }
        let mode = rule.mode;
        rule.count -= 1;
        if rule.count == 0 {
            self.inject.remove(&opcode);
        }
        self.counters.injected += 1;
        Some(mode)
    }

    /// Checks and executes one entry; `None` if it is not to complete.
    fn run_entry(&mut self, inner: &Inner, bytes: &[u8], phase: u8) -> Option<(u16, u8, AcqEntry)> {
        self.counters.admin_cmds += 1;
        let (desc, payload, checksum_ok) = if bytes.len() == AqEntryV2::SIZE {
            let e = AqEntryV2::decode_padded(bytes);
            (
                e.aq_common_descriptor.common,
                &bytes[AqEntryV2::PAYLOAD_OFFSET..],
                e.checksum_ok(),
            )
        } else {
            let e = AqEntry::decode_padded(bytes);
            (
                e.aq_common_descriptor,
                &bytes[AqEntry::PAYLOAD_OFFSET..],
                true,
            )
        };
        let cmd_id = AqCommonDesc::COMMAND_ID.get(desc.command_id);
        let opcode = desc.opcode;
        let mut cx = Cmd {
            flags: desc.flags,
            payload,
            verbose: inner.cfg.verbose,
            shown: String::new(),
            answer: String::new(),
        };
        let extra_flags = desc.flags & !(AqCommonDesc::PHASE.mask() | allowed_flags(opcode));
        let result = if AqCommonDesc::PHASE.get(desc.flags) != phase {
            Some(malformed(format!(
                "entry phase {} where {phase} is due (doorbell before the entry?)",
                desc.flags & 1
            )))
        } else if !checksum_ok {
            Some(malformed("bad entry checksum"))
        } else if desc.command_id & !AqCommonDesc::COMMAND_ID.mask() != 0 || extra_flags != 0 {
            Some(malformed(format!(
                "reserved bits set (command id {:#x}, flags {:#x})",
                desc.command_id, desc.flags
            )))
        } else if let Some(status) = self.hostile_status(inner, opcode) {
            return Some((cmd_id, status, AcqEntry::ZERO));
        } else {
            match self.take_injection(opcode) {
                Some(InjectMode::Timeout) => None,
                Some(InjectMode::Late(status)) => {
                    self.hold(inner, cmd_id, opcode, status, &cx);
                    return None;
                }
                Some(InjectMode::Fail(s)) => Some(Err(Fail {
                    status: s,
                    why: "injected fault".into(),
                    class: Class::Injected,
                })),
                None => Some(self.execute(inner, opcode, &mut cx)),
            }
        };
        let name = inner.name();
        let op = opcode_name(opcode);
        let Some(result) = result else {
            report!(
                inner.health(),
                Warn,
                Some(Class::Injected),
                "admin-injected",
                "{name}: {op} #{cmd_id:#05x}: dropped (injected timeout)"
            );
            return None;
        };
        let (status, entry) = match result {
            Ok(e) => {
                if inner.cfg.verbose {
                    log::info!("{name}: {op} #{cmd_id:#05x} {} -> {}", cx.shown, cx.answer);
                }
                (
                    AdminStatus::Success,
                    self.hostile_response(inner, opcode, e),
                )
            }
            Err(Fail { status, why, class }) => {
                self.counters.admin_errors += 1;
                let (kind, what) = match class {
                    Class::GuestBug => ("admin-guest-bug", "guest bug: "),
                    Class::Injected => ("admin-injected", ""),
                    _ => ("admin-error", ""),
                };
                report!(
                    inner.health(),
                    Warn,
                    Some(class),
                    kind,
                    "{name}: {op} #{cmd_id:#05x} {} -> {status:?}: {what}{why}",
                    cx.shown
                );
                (status, AcqEntry::ZERO)
            }
        };
        Some((cmd_id, status.raw(), entry))
    }

    /// Holds command `cmd_id` for a late completion (an injected `Late`
    /// fault), noting the memory it names.
    fn hold(&mut self, inner: &Inner, cmd_id: u16, opcode: u8, status: AdminStatus, cx: &Cmd<'_>) {
        let named = self.named_memory(inner, opcode, cx);
        if let Some(&(first, _)) = named.first() {
            self.late_addr = first;
        }
        report!(
            inner.health(),
            Warn,
            Some(Class::Injected),
            "admin-injected",
            "{}: {} #{cmd_id:#05x}: held for a late completion ({status:?}), naming {named:x?}",
            inner.name(),
            opcode_name(opcode)
        );
        let given = AqCommonDesc::CTRL_DATA
            .is_set(cx.flags)
            .then(|| named.first().copied())
            .flatten()
            .and_then(|(at, len)| {
                let mut bytes = vec![0; len.min(MAX_GIVEN)];
                inner.mem.read(at, &mut bytes).ok().map(|()| (at, bytes))
            });
        self.late.push(Held {
            cmd_id,
            status,
            named,
            given,
        });
    }

    /// A reset was requested: the held commands are forgotten once it
    /// completes, [`SETTLE`] from now, not at once (see [`Self::settle`]).
    pub(super) fn reset_with_held(&mut self, inner: &Inner) {
        let held = std::mem::take(&mut self.late);
        if held.is_empty() {
            return;
        }
        report!(
            inner.health(),
            Info,
            None,
            "reset-held",
            "{}: reset with {} command(s) held: it completes in {} ms",
            inner.name(),
            held.len(),
            SETTLE.as_millis()
        );
        self.settling = Some(Settling {
            held,
            until: Instant::now() + SETTLE,
        });
    }

    /// Completes a reset requested with commands held once its time has
    /// come, before any register read can tell the driver so: the control
    /// buffer each held command was given must be as the device read it.
    /// A driver that let a command go before the reset completed (and
    /// freed or reused what it gave the device) is caught here.
    pub(super) fn settle(&mut self, inner: &Inner) {
        if self
            .settling
            .as_ref()
            .is_none_or(|s| Instant::now() < s.until)
        {
            return;
        }
        let Some(settling) = self.settling.take() else {
            return;
        };
        for h in settling.held {
            let Some((at, given)) = h.given else {
                continue;
            };
            let mut now = vec![0; given.len()];
            match inner.mem.read(at, &mut now) {
                Ok(()) if now == given => report!(
                    inner.health(),
                    Info,
                    None,
                    "reset-held-kept",
                    "{}: #{:#05x} held through the reset: its control buffer at {at:#x} \
                     ({} bytes) was left as given",
                    inner.name(),
                    h.cmd_id,
                    given.len()
                ),
                Ok(()) => {
                    let first = now
                        .iter()
                        .zip(&given)
                        .position(|(a, b)| a != b)
                        .unwrap_or(0);
                    report!(
                        inner.health(),
                        Error,
                        Some(Class::GuestBug),
                        "reset-held-changed",
                        "{}: guest bug: #{:#05x} held through the reset: its control buffer \
                         at {at:#x} changed at byte {first} before the reset completed (freed or \
                         reused while the device may still read it)",
                        inner.name(),
                        h.cmd_id
                    )
                }
                Err(e) => report!(
                    inner.health(),
                    Error,
                    Some(Class::DmaFailed),
                    "dma-read",
                    "{}: #{:#05x} held through the reset: reading its control buffer at \
                     {at:#x} failed: {e}",
                    inner.name(),
                    h.cmd_id
                ),
            }
        }
    }

    /// The buffers (address, bytes) command `opcode` hands the device, the
    /// control buffer first: what a device acting on it late would read or
    /// write. A region's first page stands for the region.
    fn named_memory(&mut self, inner: &Inner, opcode: u8, cx: &Cmd<'_>) -> Vec<(u64, usize)> {
        let ctrl = AqCommonDesc::CTRL_DATA.is_set(cx.flags);
        let mut named = Vec::new();
        match AdminOpcode::from_raw(opcode) {
            Some(AdminOpcode::RegMr) => {
                let cmd = RegMrCmd::decode_padded(cx.payload);
                if ctrl {
                    let b = cmd.ctrl_buff();
                    named.push((b.address.get(), b.length as usize));
                }
                let shift = RegMrCmd::PHYS_PAGE_SIZE_SHIFT.get(cmd.flags);
                let (iova, length) = (cmd.iova, cmd.mr_length);
                let last = length.checked_sub(1).and_then(|n| iova.checked_add(n));
                let page = 1u64.checked_shl(shift.into()).filter(|_| shift < 64);
                if let (Some(last), Some(page)) = (last, page) {
                    let pages = (last >> shift) - (iova >> shift) + 1;
                    if pages <= u64::from(inner.cfg.limits.max_mr_pages) {
                        let listed = pbl::page_list(inner, self, cx.flags, &cmd, pages as usize);
                        if let Some(&first) = listed.ok().as_ref().and_then(|p| p.first()) {
                            let offset = iova & (page - 1);
                            let len = (page - offset).min(length);
                            named.push((first.wrapping_add(offset), len as usize));
                        }
                    }
                }
            }
            Some(AdminOpcode::SetFeature) if ctrl => {
                let b = SetFeatureCmd::decode_padded(cx.payload).control_buffer;
                named.push((b.address.get(), b.length as usize));
            }
            Some(AdminOpcode::CreateEventCounter) => {
                let cmd = CreateEventCounterCmd::decode_padded(cx.payload);
                named.push((cmd.paddr, 8));
            }
            Some(AdminOpcode::CreateCq) => {
                let cmd = CreateCqCmd::decode_padded(cx.payload);
                named.push((cmd.cq_ba.get(), 8));
            }
            Some(AdminOpcode::CreateQp) => {
                let cmd = CreateQpCmd::decode_padded(cx.payload);
                if cmd.rq_base_addr != 0 {
                    named.push((
                        cmd.rq_base_addr,
                        cmd.qp_alloc_size.recv_queue_ring_size as usize,
                    ));
                }
            }
            Some(AdminOpcode::CreateEq) => {
                let cmd = CreateEqCmd::decode_padded(cx.payload);
                named.push((cmd.ba.get(), 8));
            }
            _ => {}
        }
        named.retain(|&(addr, len)| addr != 0 && len != 0);
        named
    }

    /// Completes every held command, late: writes [`LATE_MARKER`] at the
    /// start of each buffer it named (as a device acting on it late
    /// would), then its completion, with the status it was held with.
    pub(super) fn complete_late(&mut self, inner: &Inner) {
        let held = std::mem::take(&mut self.late);
        let mut done = Vec::with_capacity(held.len());
        for h in held {
            for &(at, len) in &h.named {
                let marker = &LATE_MARKER[..len.min(LATE_MARKER.len())];
                match inner.mem.write(at, marker) {
                    Ok(()) => self.counters.late_writes += 1,
                    Err(e) => {
                        self.counters.dma_errors += 1;
                        report!(
                            inner.health(),
                            Error,
                            Some(Class::DmaFailed),
                            "dma-write",
                            "{}: late write at {at:#x} failed: {e}",
                            inner.name()
                        );
                    }
                }
            }
            report!(
                inner.health(),
                Info,
                None,
                "admin-late",
                "{}: #{:#05x} completed late ({:?}) after writing {} buffer(s)",
                inner.name(),
                h.cmd_id,
                h.status,
                h.named.len()
            );
            done.push((h.cmd_id, h.status.raw(), AcqEntry::ZERO));
        }
        self.write_completions(inner, done);
    }

    fn execute(&mut self, inner: &Inner, opcode: u8, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        use AdminOpcode as Op;
        let Some(op) = AdminOpcode::from_raw(opcode) else {
            return fail(
                AdminStatus::UnsupportedOpcode,
                format!("unknown opcode {opcode}"),
            );
        };
        match op {
            Op::CreateQp => self.create_qp(inner, cx),
            Op::ModifyQp => self.modify_qp(inner, cx),
            Op::QueryQp => self.query_qp(cx),
            Op::DestroyQp => self.destroy_qp(inner, cx),
            Op::CreateAh => self.create_ah(cx),
            Op::DestroyAh => self.destroy_ah(cx),
            Op::RegMr => self.reg_mr(inner, cx),
            Op::DeregMr => self.dereg_mr(cx),
            Op::CreateCq => self.create_cq(inner, cx),
            Op::DestroyCq => self.destroy_cq(inner, cx),
            Op::GetFeature => self.get_feature(inner, cx),
            Op::SetFeature => self.set_feature(inner, cx),
            Op::GetStats => self.get_stats(inner, cx),
            Op::AllocPd => self.alloc_pd(cx),
            Op::DeallocPd => self.dealloc_pd(cx),
            Op::AllocUar => self.alloc_uar(inner, cx),
            Op::DeallocUar => self.dealloc_uar(inner, cx),
            Op::CreateEq => self.create_eq(inner, cx),
            Op::DestroyEq => self.destroy_eq(cx),
            Op::CreateEventCounter => self.create_event_counter(inner, cx),
            Op::DestroyEventCounter => self.destroy_event_counter(cx),
            Op::AttachEventCounter => self.attach_event_counter(cx, true),
            Op::DetachEventCounter => self.attach_event_counter(cx, false),
            Op::ModifyEventCounter => self.modify_event_counter(inner, cx),
            Op::AllocMr | Op::Service => fail(
                AdminStatus::UnsupportedOpcode,
                format!("{op:?} is not implemented"),
            ),
        }
    }

    fn has_cap(inner: &Inner, cap: efa_hw::wire::Field<u32>) -> bool {
        cap.is_set(inner.cfg.device_caps)
    }

    // ---- features ----

    fn device_attr(&self, inner: &Inner) -> DeviceAttr {
        let c = &inner.cfg;
        let supported = [
            (FeatureId::DeviceAttr, true),
            (FeatureId::AenqConfig, true),
            (FeatureId::NetworkAttr, true),
            (FeatureId::QueueAttr1, true),
            (FeatureId::HwHints, true),
            (FeatureId::HostInfo, true),
            (FeatureId::EventQueueAttr, c.event_queue_attr),
            (FeatureId::QueueAttr2, c.queue_attr_2),
        ]
        .iter()
        .filter(|(_, has)| *has)
        .fold(0, |m, (f, _)| m | f.bit());
        DeviceAttr {
            supported_features: supported,
            page_size_cap: PAGE_SIZE_CAP,
            fw_version: 0x0001_0000,
            admin_api_version: c.version(),
            device_version: 1,
            db_bar: regs::MEM_BAR.into(),
            phys_addr_width: super::DMA_ADDR_WIDTH as u8,
            virt_addr_width: 48,
            device_caps: c.device_caps,
            max_rdma_size: c.limits.max_rdma_size,
            // node_guid is the interface id of the GID, in the same byte
            // order (the driver copies the field to a __be64 as it is).
            guid: u64::from_le_bytes(c.gid[8..].try_into().expect("8 bytes")),
            max_link_speed_gbps: c.link_speed_gbps,
            reserved0: 0,
            reserved1: 0,
        }
    }

    fn max_eqs(inner: &Inner) -> u32 {
        if !inner.cfg.event_queue_attr {
            return 0;
        }
        inner
            .cfg
            .limits
            .max_eq
            .min(u32::from(inner.cfg.msix_vectors) - 1)
    }

    fn get_feature(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: GetFeatureCmd = cx.decode();
        let l = &inner.cfg.limits;
        let id = cmd.feature_common.feature_id;
        let mut resp = GetFeatureResp::ZERO;
        match FeatureId::from_raw(id) {
            Some(FeatureId::DeviceAttr) => {
                let a = self.device_attr(inner);
                cx.show(&a);
                resp.set_device_attr(&a);
            }
            Some(FeatureId::AenqConfig) => {
                let a = AenqConfig {
                    supported_groups: SUPPORTED_AENQ_GROUPS,
                    enabled_groups: self.aenq_groups,
                };
                cx.show(&a);
                resp.set_aenq(&a);
            }
            Some(FeatureId::NetworkAttr) => {
                let a = NetworkAttr {
                    addr: inner.cfg.gid,
                    mtu: inner.cfg.mtu,
                };
                cx.show(&a);
                resp.set_network_attr(&a);
            }
            Some(FeatureId::QueueAttr1) => {
                let a = QueueAttr1 {
                    max_qp: l.max_qp,
                    max_sq_depth: l.max_sq_depth,
                    inline_buf_size: l.inline_buf_size,
                    max_rq_depth: l.max_rq_depth,
                    max_cq: l.max_cq,
                    max_cq_depth: l.max_cq_depth,
                    sub_cqs_per_cq: l.sub_cqs_per_cq,
                    min_sq_depth: l.min_sq_depth,
                    max_wr_send_sges: l.max_sq_sges,
                    max_wr_recv_sges: l.max_rq_sges,
                    max_mr: l.max_mr,
                    max_mr_pages: l.max_mr_pages,
                    max_pd: l.max_pd,
                    max_ah: l.max_ah,
                    max_llq_size: l.max_llq_size,
                    max_wr_rdma_sges: l.max_rdma_sges,
                    max_tx_batch: l.max_tx_batch,
                };
                cx.show(&a);
                resp.set_queue_attr_1(&a);
            }
            // A feature the device does not list, as a device of an older
            // generation answers.
            Some(f @ (FeatureId::QueueAttr2 | FeatureId::EventQueueAttr))
                if self.device_attr(inner).supported_features & f.bit() == 0 =>
            {
                return fail(
                    AdminStatus::UnsupportedOpcode,
                    format!("feature {id} is not supported by this device"),
                )
            }
            Some(FeatureId::QueueAttr2) => {
                let counters = Self::has_cap(inner, DeviceAttr::EVENT_COUNTERS);
                let a = QueueAttr2 {
                    inline_buf_size_ex: l.inline_buf_size_ex,
                    reserved: [0; 6],
                    supported_event_counter_qp_events: if counters {
                        SUPPORTED_COUNTER_EVENTS
                    } else {
                        0
                    },
                    max_event_counters: if counters { l.max_event_counters } else { 0 },
                    event_counter_max_val: u64::MAX,
                };
                cx.show(&a);
                resp.set_queue_attr_2(&a);
            }
            Some(FeatureId::EventQueueAttr) => {
                let a = EventQueueAttr {
                    max_eq: Self::max_eqs(inner),
                    max_eq_depth: l.max_eq_depth,
                    event_bitmask: CreateEqCmd::COMPLETION_EVENTS.mask(),
                };
                cx.show(&a);
                resp.set_event_queue_attr(&a);
            }
            Some(FeatureId::HwHints) => {
                // Watchdog: five keep-alive periods. The rest: the driver's
                // defaults (the 7.3 driver reads the admin timeout as
                // microseconds, so a value here would only confuse it).
                let watchdog = self.keep_alive_ms.saturating_mul(5).min(u16::MAX.into());
                let a = HwHints {
                    mmio_read_timeout: 0,
                    driver_watchdog_timeout: watchdog as u16,
                    admin_completion_timeout: 0,
                    poll_interval: 0,
                };
                cx.show(&a);
                resp.set_hw_hints(&a);
            }
            Some(FeatureId::HostInfo) | None => {
                return fail(
                    AdminStatus::UnsupportedOpcode,
                    format!("feature {id} cannot be read"),
                )
            }
        }
        Ok(cx.reply(resp))
    }

    fn set_feature(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: SetFeatureCmd = cx.decode();
        let id = cmd.feature_common.feature_id;
        match FeatureId::from_raw(id) {
            Some(FeatureId::AenqConfig) => {
                let groups = cmd.aenq().enabled_groups;
                if groups & !SUPPORTED_AENQ_GROUPS != 0 {
                    return illegal(format!(
                        "AENQ groups {groups:#x} beyond the supported {SUPPORTED_AENQ_GROUPS:#x}"
                    ));
                }
                self.aenq_groups = groups;
            }
            Some(FeatureId::HostInfo) => {
                let buf = cmd.control_buffer;
                if !AqCommonDesc::CTRL_DATA.is_set(cx.flags) {
                    return malformed("HOST_INFO without a control buffer");
                }
                if buf.length == 0 || buf.length > MAX_HOST_INFO {
                    return malformed(format!("HOST_INFO buffer of {} bytes", buf.length));
                }
                let bytes = inner
                    .dma_read(self, buf.address.get(), buf.length as usize)
                    .or_else(|e| malformed(format!("HOST_INFO buffer: {e}")))?;
                let h = HostInfo::decode_padded(&bytes);
                report!(
                    inner.health(),
                    Info,
                    None,
                    "host-info",
                    "{}: host: {} ({}), kernel {:#x} type {}, driver {}.{}.{}, PCI {:02x}:{:02x}.{}, \
                     spec {}.{}, flags {:#x}",
                    inner.name(),
                    nul_str(&h.os_dist_str),
                    nul_str(&h.kernel_ver_str),
                    h.kernel_ver,
                    h.os_type,
                    HostInfo::DRIVER_MAJOR.get(h.driver_ver),
                    HostInfo::DRIVER_MINOR.get(h.driver_ver),
                    HostInfo::DRIVER_SUB_MINOR.get(h.driver_ver),
                    HostInfo::BUS.get(h.bdf),
                    HostInfo::DEVICE.get(h.bdf),
                    HostInfo::FUNCTION.get(h.bdf),
                    HostInfo::SPEC_MAJOR.get(h.spec_ver),
                    HostInfo::SPEC_MINOR.get(h.spec_ver),
                    h.flags,
                );
                self.host_info = Some(h);
            }
            _ => {
                return fail(
                    AdminStatus::UnsupportedOpcode,
                    format!("feature {id} cannot be set"),
                )
            }
        }
        Ok(cx.reply(SetFeatureResp::ZERO))
    }

    fn get_stats(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: GetStatsCmd = cx.decode();
        let stats: Stats = match GetStatsScope::from_raw(cmd.scope) {
            Some(GetStatsScope::All) => self.stats,
            Some(GetStatsScope::Queue) => match self.objs.qps.get(cmd.scope_modifier.into()) {
                Some(qp) => qp.stats,
                None => return illegal(format!("no QP {} for queue stats", cmd.scope_modifier)),
            },
            None => return illegal(format!("stats scope {}", cmd.scope)),
        };
        let mut resp = GetStatsResp::ZERO;
        match GetStatsType::from_raw(cmd.type_) {
            Some(GetStatsType::Basic) => resp.set_basic_stats(&stats.basic),
            Some(GetStatsType::Messages) => resp.set_messages_stats(&stats.messages),
            Some(GetStatsType::RdmaRead) => resp.set_rdma_read_stats(&stats.rdma_read),
            Some(GetStatsType::RdmaWrite) if Self::has_cap(inner, DeviceAttr::RDMA_WRITE) => {
                resp.set_rdma_write_stats(&stats.rdma_write)
            }
            Some(GetStatsType::Network) => resp.set_network_stats(&stats.network),
            _ => return illegal(format!("stats type {}", cmd.type_)),
        }
        cx.show(&stats);
        Ok(cx.reply(resp))
    }

    // ---- PD, UAR ----

    fn alloc_pd(&mut self, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let Ok(pd) = self.objs.pds.insert(Pd) else {
            return no_room("PD");
        };
        Ok(cx.reply(AllocPdResp {
            pd: pd as u16,
            ..AllocPdResp::ZERO
        }))
    }

    fn dealloc_pd(&mut self, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: DeallocPdCmd = cx.decode();
        let pd = u32::from(cmd.pd);
        if self.objs.pds.get(pd).is_none() {
            return illegal(format!("no PD {pd}"));
        }
        let o = &self.objs;
        if o.qps.iter().any(|(_, q)| q.pd == pd)
            || o.ahs.iter().any(|(_, a)| a.pd == pd)
            || o.mrs.iter().any(|(_, m)| m.pd == pd)
        {
            return fail(AdminStatus::ResourceBusy, format!("PD {pd} is in use"));
        }
        self.objs.pds.remove(pd);
        Ok(cx.reply(DeallocPdResp::ZERO))
    }

    fn alloc_uar(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let Ok(uar) = self.objs.uars.insert(Uar::default()) else {
            return no_room("UAR");
        };
        if let Some(i) = self.objs.uars.index_of(uar) {
            bar2::scrub(&inner.bar2, inner.layout.doorbell(i, 0), bar2::PAGE);
        }
        Ok(cx.reply(AllocUarResp {
            uar: uar as u16,
            ..AllocUarResp::ZERO
        }))
    }

    fn dealloc_uar(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: DeallocUarCmd = cx.decode();
        let uar = u32::from(cmd.uar);
        let Some(index) = self.objs.uars.index_of(uar) else {
            return illegal(format!("no UAR {uar}"));
        };
        let o = &self.objs;
        if o.qps.iter().any(|(_, q)| q.uar == uar)
            || o.cqs.iter().any(|(_, c)| c.uar == uar)
            || o.counters.iter().any(|(_, c)| c.uar == uar)
        {
            return fail(AdminStatus::ResourceBusy, format!("UAR {uar} is in use"));
        }
        self.objs.uars.remove(uar);
        bar2::scrub(&inner.bar2, inner.layout.doorbell(index, 0), bar2::PAGE);
        Ok(cx.reply(DeallocUarResp::ZERO))
    }

    /// Takes a doorbell slot of `uar`; returns (slot, BAR2 offset).
    fn take_doorbell(&mut self, inner: &Inner, uar: u32) -> Option<(usize, u32)> {
        let index = self.objs.uars.index_of(uar)?;
        let slot = self.objs.uars.get_mut(uar)?.take_slot()?;
        let off = inner.layout.doorbell(index, slot);
        bar2::scrub(&inner.bar2, off, 4);
        Some((slot, off as u32))
    }

    fn put_doorbell(&mut self, inner: &Inner, uar: u32, slot: usize, offset: u32) {
        if let Some(u) = self.objs.uars.get_mut(uar) {
            u.put_slot(slot);
            bar2::scrub(&inner.bar2, offset.into(), 4);
        }
    }

    // ---- EQ ----

    fn create_eq(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: CreateEqCmd = cx.decode();
        let l = &inner.cfg.limits;
        let depth = u32::from(cmd.depth);
        if !depth.is_power_of_two() || depth > l.max_eq_depth {
            return illegal(format!("EQ depth {depth}"));
        }
        if cmd.caps & !CreateEqCmd::ENTRY_SIZE_WORDS.mask() != 0 {
            return malformed(format!("EQ caps {:#x}", cmd.caps));
        }
        let words = CreateEqCmd::ENTRY_SIZE_WORDS.get(cmd.caps);
        if usize::from(words) * 4 != EQE_SIZE {
            return illegal(format!("EQ entries of {words} words"));
        }
        let vec = u16::from(cmd.msix_vec);
        if vec < regs::COMP_EQS_VEC_BASE || vec >= inner.cfg.msix_vectors {
            return illegal(format!("EQ MSI-X vector {vec}"));
        }
        if cmd.event_bitmask & !CreateEqCmd::COMPLETION_EVENTS.mask() != 0 {
            return illegal(format!("EQ events {:#x}", cmd.event_bitmask));
        }
        let ring = cmd.ba.get();
        let len = u64::from(depth) * EQE_SIZE as u64;
        if ring % EQE_SIZE as u64 != 0 || inner.mem.check(ring, len, true).is_err() {
            return illegal(format!("EQ ring {ring:#x}+{len:#x} is not in guest memory"));
        }
        if self.objs.eqs.len() as u32 >= Self::max_eqs(inner) {
            return no_room("EQ");
        }
        let eq = Eq {
            ring,
            depth: depth as u16,
            msix_vec: vec,
            event_bitmask: cmd.event_bitmask,
            armed: false,
            produced: 0,
            pending: false,
        };
        let Ok(eqn) = self.objs.eqs.insert(eq) else {
            return no_room("EQ");
        };
        Ok(cx.reply(CreateEqResp {
            eqn: eqn as u16,
            ..CreateEqResp::ZERO
        }))
    }

    fn destroy_eq(&mut self, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: DestroyEqCmd = cx.decode();
        let eqn = u32::from(cmd.eqn);
        if self.objs.eqs.get(eqn).is_none() {
            return illegal(format!("no EQ {eqn}"));
        }
        if self.objs.cqs.iter().any(|(_, c)| c.eqn == Some(eqn)) {
            return fail(AdminStatus::ResourceBusy, format!("EQ {eqn} has CQs"));
        }
        self.objs.eqs.remove(eqn);
        Ok(cx.reply(DestroyEqResp::ZERO))
    }

    // ---- CQ ----

    fn create_cq(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: CreateCqCmd = cx.decode();
        let l = &inner.cfg.limits;
        let uar = u32::from(cmd.uar);
        if self.objs.uars.get(uar).is_none() {
            return illegal(format!("no UAR {uar}"));
        }
        let caps1_known = CreateCqCmd::INTERRUPT_MODE_ENABLED.mask() | CreateCqCmd::VIRT.mask();
        let caps2_known = CreateCqCmd::CQ_ENTRY_SIZE_WORDS.mask()
            | CreateCqCmd::SET_SRC_ADDR.mask()
            | CreateCqCmd::SQ_COMP_64_BIT_REQ_ID.mask();
        if cmd.cq_caps_1 & !caps1_known != 0 || cmd.cq_caps_2 & !caps2_known != 0 {
            return malformed(format!("CQ caps {:#x}/{:#x}", cmd.cq_caps_1, cmd.cq_caps_2));
        }
        if CreateCqCmd::VIRT.is_set(cmd.cq_caps_1) {
            return illegal("CQ rings in virtual memory are not supported");
        }
        let entry_size = u16::from(CreateCqCmd::CQ_ENTRY_SIZE_WORDS.get(cmd.cq_caps_2)) * 4;
        if !matches!(entry_size, 16 | 32) {
            return illegal(format!("CQ entries of {entry_size} bytes"));
        }
        let set_src_addr = CreateCqCmd::SET_SRC_ADDR.is_set(cmd.cq_caps_2);
        if set_src_addr && entry_size != 32 {
            return illegal("source addresses need 32-byte CQ entries");
        }
        let sq_comp_64 = CreateCqCmd::SQ_COMP_64_BIT_REQ_ID.is_set(cmd.cq_caps_2);
        if sq_comp_64 && !Self::has_cap(inner, DeviceAttr::SQ_64_BIT_REQ_ID) {
            return illegal("64-bit request ids are not supported");
        }
        if cmd.num_sub_cqs != l.sub_cqs_per_cq {
            return illegal(format!(
                "{} sub-CQs, the device has {}",
                cmd.num_sub_cqs, l.sub_cqs_per_cq
            ));
        }
        let depth = u32::from(cmd.sub_cq_depth);
        if !depth.is_power_of_two() || depth > l.max_cq_depth {
            return illegal(format!("sub-CQ depth {depth}"));
        }
        let eqn = if CreateCqCmd::INTERRUPT_MODE_ENABLED.is_set(cmd.cq_caps_1) {
            let eqn = u32::from(cmd.eqn);
            if self.objs.eqs.get(eqn).is_none() {
                return illegal(format!("no EQ {eqn}"));
            }
            Some(eqn)
        } else {
            None
        };
        let ring = cmd.cq_ba.get();
        let len = u64::from(depth) * u64::from(entry_size) * u64::from(cmd.num_sub_cqs);
        if ring % u64::from(entry_size) != 0 || inner.mem.check(ring, len, true).is_err() {
            return illegal(format!("CQ ring {ring:#x}+{len:#x} is not in guest memory"));
        }
        if self.objs.cqs.len() >= l.max_cq as usize {
            return no_room("CQ");
        }
        if eqn.is_some() && !inner.cfg.cq_doorbells {
            return illegal("interrupt mode on a device without CQ doorbells");
        }
        let doorbell = if inner.cfg.cq_doorbells {
            let Some(db) = self.take_doorbell(inner, uar) else {
                return no_room("doorbell in the UAR");
            };
            Some(db)
        } else {
            None
        };
        let cq = Cq {
            uar,
            ring,
            depth: depth as u16,
            entry_size,
            sub_cqs: cmd.num_sub_cqs,
            eqn,
            set_src_addr,
            sq_comp_64,
            doorbell,
            dp: CqData::new(cmd.num_sub_cqs, eqn.is_some()),
        };
        let Ok(cq_idx) = self.objs.cqs.insert(cq) else {
            if let Some((db_slot, db_offset)) = doorbell {
                self.put_doorbell(inner, uar, db_slot, db_offset);
            }
            return no_room("CQ");
        };
        Ok(cx.reply(CreateCqResp {
            cq_idx: cq_idx as u16,
            sub_cq_actual_depth: depth as u16,
            db_offset: doorbell.map_or(0, |(_, offset)| offset),
            flags: if doorbell.is_some() {
                CreateCqResp::DB_VALID.mask()
            } else {
                0
            },
            ..CreateCqResp::ZERO
        }))
    }

    fn destroy_cq(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: DestroyCqCmd = cx.decode();
        let idx = u32::from(cmd.cq_idx);
        if self.objs.cqs.get(idx).is_none() {
            return illegal(format!("no CQ {idx}"));
        }
        if self
            .objs
            .qps
            .iter()
            .any(|(_, q)| q.send_cq == idx || q.recv_cq == idx)
        {
            return fail(AdminStatus::ResourceBusy, format!("CQ {idx} has QPs"));
        }
        let cq = self.objs.cqs.remove(idx).expect("checked above");
        if let Some((db_slot, db_offset)) = cq.doorbell {
            self.put_doorbell(inner, cq.uar, db_slot, db_offset);
        }
        Ok(cx.reply(DestroyCqResp::ZERO))
    }

    // ---- QP ----

    fn create_qp(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: CreateQpCmd = cx.decode();
        let l = &inner.cfg.limits;
        let (pd, uar) = (u32::from(cmd.pd), u32::from(cmd.uar));
        let (flags, sq_cq, rq_cq, rq_base) = (
            cmd.flags,
            cmd.send_cq_idx,
            cmd.recv_cq_idx,
            cmd.rq_base_addr,
        );
        let sizes = cmd.qp_alloc_size;
        if self.objs.pds.get(pd).is_none() {
            return illegal(format!("no PD {pd}"));
        }
        if self.objs.uars.get(uar).is_none() {
            return illegal(format!("no UAR {uar}"));
        }
        let Some(qp_type) = QpType::from_raw(cmd.qp_type) else {
            return illegal(format!("QP type {}", cmd.qp_type));
        };
        let known = CreateQpCmd::SQ_VIRT.mask()
            | CreateQpCmd::RQ_VIRT.mask()
            | CreateQpCmd::UNSOLICITED_WRITE_RECV.mask()
            | CreateQpCmd::SQ_64_BIT_REQ_ID.mask();
        if flags & !known != 0 {
            return malformed(format!("QP flags {flags:#x}"));
        }
        if CreateQpCmd::SQ_VIRT.is_set(flags) || CreateQpCmd::RQ_VIRT.is_set(flags) {
            return illegal("QP rings in virtual memory are not supported");
        }
        if CreateQpCmd::UNSOLICITED_WRITE_RECV.is_set(flags)
            && !Self::has_cap(inner, DeviceAttr::UNSOLICITED_WRITE_RECV)
        {
            return illegal("unsolicited write receive is not supported");
        }
        let sq_64 = CreateQpCmd::SQ_64_BIT_REQ_ID.is_set(flags);
        if sq_64 && !Self::has_cap(inner, DeviceAttr::SQ_64_BIT_REQ_ID) {
            return illegal("64-bit request ids are not supported");
        }
        let cq_of = |h: u32, what: &str| -> Result<(u16, bool), Fail> {
            match self.objs.cqs.get(h) {
                None => illegal(format!("no {what} CQ {h}")),
                Some(c) if c.uar != uar => illegal(format!(
                    "{what} CQ {h} belongs to UAR {}, the QP to UAR {uar}",
                    c.uar
                )),
                Some(c) => Ok((c.sub_cqs, c.sq_comp_64)),
            }
        };
        let (send_subs, send_64) = cq_of(sq_cq, "send")?;
        let (recv_subs, _) = cq_of(rq_cq, "receive")?;
        if sq_64 && !send_64 {
            return illegal("64-bit send request ids need a send CQ with 64-bit ids");
        }
        let (sq_depth, sq_ring) = (sizes.send_queue_depth, sizes.send_queue_ring_size);
        if sq_depth != 0 || sq_ring != 0 {
            if sq_depth < u32::from(l.min_sq_depth).max(1) || sq_depth > l.max_sq_depth {
                return illegal(format!("send queue depth {sq_depth}"));
            }
            let wqe = sq_ring.checked_div(sq_depth).unwrap_or(0);
            if sq_ring % sq_depth != 0 || !matches!(wqe, 64 | 128) {
                return illegal(format!(
                    "send ring of {sq_ring} bytes for {sq_depth} WQEs (64 or 128 bytes each)"
                ));
            }
            if sq_ring > l.max_llq_size {
                return illegal(format!(
                    "send ring of {sq_ring} bytes exceeds the LLQ limit"
                ));
            }
        }
        let (rq_depth, rq_ring) = (sizes.recv_queue_depth, sizes.recv_queue_ring_size);
        if rq_depth != 0 || rq_ring != 0 {
            if rq_depth == 0 || rq_depth > l.max_rq_depth {
                return illegal(format!("receive queue depth {rq_depth}"));
            }
            let descs = rq_ring / 16;
            // rdma-core sizes the ring for depth x SGEs descriptors, rounded
            // up to a power of two: nothing larger is ever needed.
            let max_descs =
                (u64::from(l.max_rq_depth) * u64::from(l.max_rq_sges.max(1))).next_power_of_two();
            if rq_ring % 16 != 0
                || !descs.is_power_of_two()
                || descs < rq_depth
                || u64::from(descs) > max_descs
            {
                return illegal(format!(
                    "receive ring of {rq_ring} bytes for {rq_depth} WQEs"
                ));
            }
            if rq_base % 16 != 0 || inner.mem.check(rq_base, rq_ring.into(), false).is_err() {
                return illegal(format!(
                    "receive ring {rq_base:#x}+{rq_ring:#x} is not in guest memory"
                ));
            }
        }
        if self.objs.qps.len() >= l.max_qp as usize {
            return no_room("QP");
        }
        // Always a page, even without a send queue: the kernel maps the LLQ
        // of every QP.
        let llq_pages = u64::from(sq_ring).div_ceil(bar2::PAGE).max(1);
        let Some(llq_offset) = self.llq.alloc(llq_pages) else {
            return no_room("LLQ in BAR2");
        };
        bar2::scrub(&inner.bar2, llq_offset, llq_pages * bar2::PAGE);
        let Some(sq_db) = self.take_doorbell(inner, uar) else {
            self.llq.free(llq_offset, llq_pages);
            return no_room("doorbell in the UAR");
        };
        let Some(rq_db) = self.take_doorbell(inner, uar) else {
            self.put_doorbell(inner, uar, sq_db.0, sq_db.1);
            self.llq.free(llq_offset, llq_pages);
            return no_room("doorbell in the UAR");
        };
        let qp = Qp {
            pd,
            uar,
            qp_type,
            state: QpState::Reset,
            qkey: 0,
            sq_psn: 0,
            rnr_retry: 0,
            sq_drained_async_notify: false,
            sl: cmd.sl,
            flags,
            send_cq: sq_cq,
            recv_cq: rq_cq,
            send_sub_cq: 0,
            recv_sub_cq: 0,
            sq_depth,
            sq_ring_size: sq_ring,
            rq_depth,
            rq_ring_size: rq_ring,
            rq_base,
            llq_offset,
            llq_pages,
            db_slots: [sq_db.0, rq_db.0],
            db_offsets: [sq_db.1, rq_db.1],
            counters: Vec::new(),
            stats: Stats::default(),
            dp: QpData::new(seq_base()),
        };
        let handle = match self.objs.qps.insert(qp) {
            Ok(h) => h,
            Err(_) => {
                self.put_doorbell(inner, uar, sq_db.0, sq_db.1);
                self.put_doorbell(inner, uar, rq_db.0, rq_db.1);
                self.llq.free(llq_offset, llq_pages);
                return no_room("QP");
            }
        };
        // Spread QPs over the sub-CQs, sends and receives on different ones.
        let index = self.objs.qps.index_of(handle).unwrap_or(0) as u16;
        let send_sub = index % send_subs;
        let recv_sub = (index + 1) % recv_subs;
        if let Some(q) = self.objs.qps.get_mut(handle) {
            q.send_sub_cq = send_sub;
            q.recv_sub_cq = recv_sub;
        }
        // The data path sleeps without QPs: it has doorbells to watch now.
        inner.port.kick();
        Ok(cx.reply(CreateQpResp {
            qp_handle: handle,
            qp_num: handle as u16,
            send_sub_cq_idx: send_sub,
            recv_sub_cq_idx: recv_sub,
            sq_db_offset: sq_db.1,
            rq_db_offset: rq_db.1,
            llq_descriptors_offset: llq_offset as u32,
            ..CreateQpResp::ZERO
        }))
    }

    fn modify_qp(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: ModifyQpCmd = cx.decode();
        let Some(qp) = self.objs.qps.get_mut(cmd.qp_handle) else {
            return illegal(format!("no QP {:#x}", cmd.qp_handle));
        };
        let state_bits = ModifyQpCmd::QP_STATE.mask() | ModifyQpCmd::CUR_QP_STATE.mask();
        let attr_bits = ModifyQpCmd::QKEY.mask()
            | ModifyQpCmd::SQ_PSN.mask()
            | ModifyQpCmd::SQ_DRAINED_ASYNC_NOTIFY.mask()
            | ModifyQpCmd::RNR_RETRY.mask();
        let mask = cmd.modify_mask;
        if mask & !(state_bits | attr_bits) != 0 {
            return illegal(format!("modify mask {mask:#x}"));
        }
        let new = if ModifyQpCmd::QP_STATE.is_set(mask) {
            match QpState::from_raw(cmd.qp_state) {
                Some(s) => s,
                None => return illegal(format!("QP state {}", cmd.qp_state)),
            }
        } else {
            qp.state
        };
        if ModifyQpCmd::CUR_QP_STATE.is_set(mask)
            && cmd.cur_qp_state != qp.state.raw()
            && !matches!(new, QpState::Reset | QpState::Err)
        {
            return forbidden(format!(
                "the QP is {:?}, not in state {}",
                qp.state, cmd.cur_qp_state
            ));
        }
        if !transition_ok(qp.qp_type, qp.state, new, mask & attr_bits) {
            return forbidden(format!(
                "{:?} QP: {:?} -> {new:?} with mask {mask:#x}",
                qp.qp_type, qp.state
            ));
        }
        if ModifyQpCmd::RNR_RETRY.is_set(mask) && cmd.rnr_retry > 7 {
            return illegal(format!("RNR retry {}", cmd.rnr_retry));
        }
        if ModifyQpCmd::QKEY.is_set(mask) {
            qp.qkey = cmd.qkey;
        }
        if ModifyQpCmd::SQ_PSN.is_set(mask) {
            qp.sq_psn = cmd.sq_psn;
        }
        if ModifyQpCmd::RNR_RETRY.is_set(mask) {
            qp.rnr_retry = cmd.rnr_retry;
        }
        if ModifyQpCmd::SQ_DRAINED_ASYNC_NOTIFY.is_set(mask) {
            qp.sq_drained_async_notify = cmd.sq_drained_async_notify != 0;
        }
        if new == QpState::Reset && qp.state != QpState::Reset {
            // Back to empty queues: the provider starts its producer
            // counters (and the SQ phase) over, so the device does too, and
            // the doorbells must not still show the old counts.
            qp.dp = QpData::new(seq_base());
            for off in qp.db_offsets {
                bar2::scrub(&inner.bar2, off.into(), 4);
            }
        }
        qp.state = new;
        Ok(cx.reply(ModifyQpResp::ZERO))
    }

    fn query_qp(&mut self, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: QueryQpCmd = cx.decode();
        let Some(qp) = self.objs.qps.get(cmd.qp_handle) else {
            return illegal(format!("no QP {:#x}", cmd.qp_handle));
        };
        let resp = QueryQpResp {
            qp_state: qp.state.raw(),
            qkey: qp.qkey,
            sq_psn: qp.sq_psn,
            sq_draining: u8::from(qp.state == QpState::Sqd && qp.dp.in_flight() > 0),
            rnr_retry: qp.rnr_retry,
            ..QueryQpResp::ZERO
        };
        Ok(cx.reply(resp))
    }

    fn destroy_qp(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: DestroyQpCmd = cx.decode();
        let Some(qp) = self.objs.qps.remove(cmd.qp_handle) else {
            return illegal(format!("no QP {:#x}", cmd.qp_handle));
        };
        bar2::scrub(&inner.bar2, qp.llq_offset, qp.llq_pages * bar2::PAGE);
        self.llq.free(qp.llq_offset, qp.llq_pages);
        for i in 0..2 {
            self.put_doorbell(inner, qp.uar, qp.db_slots[i], qp.db_offsets[i]);
        }
        Ok(cx.reply(DestroyQpResp::ZERO))
    }

    // ---- AH ----

    fn create_ah(&mut self, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: CreateAhCmd = cx.decode();
        let pd = u32::from(cmd.pd);
        if self.objs.pds.get(pd).is_none() {
            return illegal(format!("no PD {pd}"));
        }
        let gid = cmd.dest_addr;
        if let Some((ah, _)) = self
            .objs
            .ahs
            .iter()
            .find(|(_, a)| a.pd == pd && a.gid == gid)
        {
            return fail(
                AdminStatus::ResourceBusy,
                format!("PD {pd} has AH {ah} for that address already"),
            );
        }
        let Ok(ah) = self.objs.ahs.insert(Ah { pd, gid }) else {
            return no_room("AH");
        };
        Ok(cx.reply(CreateAhResp {
            ah: ah as u16,
            ..CreateAhResp::ZERO
        }))
    }

    fn destroy_ah(&mut self, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: DestroyAhCmd = cx.decode();
        let (ah, pd) = (u32::from(cmd.ah), u32::from(cmd.pd));
        match self.objs.ahs.get(ah) {
            None => return illegal(format!("no AH {ah}")),
            Some(a) if a.pd != pd => {
                return illegal(format!("AH {ah} belongs to PD {}, not {pd}", a.pd))
            }
            Some(_) => {}
        }
        self.objs.ahs.remove(ah);
        Ok(cx.reply(DestroyAhResp::ZERO))
    }

    // ---- MR ----

    fn reg_mr(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: RegMrCmd = cx.decode();
        let l = &inner.cfg.limits;
        let (pd, length, iova, page_num, flags, perms) = (
            u32::from(cmd.pd),
            cmd.mr_length,
            cmd.iova,
            cmd.page_num,
            cmd.flags,
            cmd.permissions,
        );
        if self.objs.pds.get(pd).is_none() {
            return illegal(format!("no PD {pd}"));
        }
        let known = RegMrCmd::PHYS_PAGE_SIZE_SHIFT.mask() | RegMrCmd::MEM_ADDR_PHY_MODE_EN.mask();
        if flags & !known != 0 {
            return malformed(format!("REG_MR flags {flags:#x}"));
        }
        if RegMrCmd::MEM_ADDR_PHY_MODE_EN.is_set(flags) {
            return illegal("physical mode registration is not supported");
        }
        let shift = RegMrCmd::PHYS_PAGE_SIZE_SHIFT.get(flags);
        if PAGE_SIZE_CAP & (1u64 << shift) == 0 {
            return illegal(format!("page size 2^{shift} is not in page_size_cap"));
        }
        let mut perms_ok = RegMrCmd::LOCAL_WRITE_ENABLE.mask();
        if Self::has_cap(inner, DeviceAttr::RDMA_READ) {
            perms_ok |= RegMrCmd::REMOTE_READ_ENABLE.mask();
        }
        if Self::has_cap(inner, DeviceAttr::RDMA_WRITE) {
            perms_ok |= RegMrCmd::REMOTE_WRITE_ENABLE.mask();
        }
        if perms & !perms_ok != 0 {
            return illegal(format!("permissions {perms:#x}, supported {perms_ok:#x}"));
        }
        let Some(last) = length.checked_sub(1).and_then(|n| iova.checked_add(n)) else {
            return illegal(format!("region of {length} bytes at {iova:#x}"));
        };
        // `page_num` is redundant and the 7.3 C driver leaves it 0: the
        // span of the region decides. A non-zero count must agree.
        let pages_needed = (last >> shift) - (iova >> shift) + 1;
        if page_num != 0 && u64::from(page_num) != pages_needed {
            return illegal(format!(
                "{page_num} pages listed, the region spans {pages_needed} of 2^{shift} bytes"
            ));
        }
        if self.objs.mr_pages + pages_needed > u64::from(l.max_mr_pages) {
            return no_room(&format!("{pages_needed} MR pages"));
        }
        let page_num = pages_needed as usize;
        if self.objs.mrs.len() >= l.max_mr as usize {
            return no_room("MR");
        }
        let pages = match pbl::page_list(inner, self, cx.flags, &cmd, page_num) {
            Ok(p) => p,
            Err(PblError::Malformed(why)) => return malformed(format!("page list: {why}")),
            Err(PblError::Dma(why)) => return malformed(format!("page list DMA: {why}")),
        };
        let page_size = 1u64 << shift;
        let writable = perms
            & (RegMrCmd::LOCAL_WRITE_ENABLE.mask() | RegMrCmd::REMOTE_WRITE_ENABLE.mask())
            != 0;
        for (i, &p) in pages.iter().enumerate() {
            if p % page_size != 0 {
                return illegal(format!("page {i} at {p:#x} is not aligned to 2^{shift}"));
            }
            if inner.mem.check(p, page_size, writable).is_err() {
                return illegal(format!("page {i} at {p:#x} is not in guest memory"));
            }
        }
        let mr = Mr {
            pd,
            iova,
            length,
            page_shift: shift,
            permissions: perms,
            region: super::fabric::Region::new(iova, shift, pages),
        };
        let Ok(key) = self.objs.mrs.insert(mr) else {
            return no_room("MR");
        };
        self.objs.mr_pages += page_num as u64;
        // The model has one interconnect, numbered by the device's index,
        // which serves every path to the region.
        let ic_id = inner.cfg.index as u8;
        Ok(cx.reply(RegMrResp {
            l_key: key,
            r_key: key,
            validity: RegMrResp::RECV_IC_ID.prep(1)
                | RegMrResp::RDMA_READ_IC_ID.prep(1)
                | RegMrResp::RDMA_RECV_IC_ID.prep(1),
            recv_ic_id: ic_id,
            rdma_read_ic_id: ic_id,
            rdma_recv_ic_id: ic_id,
            ..RegMrResp::ZERO
        }))
    }

    fn dereg_mr(&mut self, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: DeregMrCmd = cx.decode();
        let Some(mr) = self.objs.mrs.remove(cmd.l_key) else {
            return illegal(format!("no MR with key {:#x}", cmd.l_key));
        };
        self.objs.mr_pages -= mr.region.pages().len() as u64;
        Ok(cx.reply(DeregMrResp::ZERO))
    }

    // ---- event counters ----

    fn create_event_counter(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: CreateEventCounterCmd = cx.decode();
        if !Self::has_cap(inner, DeviceAttr::EVENT_COUNTERS) {
            return fail(AdminStatus::UnsupportedOpcode, "no event counters");
        }
        let (uar, at) = (u32::from(cmd.uar), cmd.paddr);
        if self.objs.uars.get(uar).is_none() {
            return illegal(format!("no UAR {uar}"));
        }
        if at % 8 != 0 || inner.mem.check(at, 8, true).is_err() {
            return illegal(format!("counter at {at:#x} is not in guest memory"));
        }
        if self.objs.counters.len() >= inner.cfg.limits.max_event_counters as usize {
            return no_room("event counter");
        }
        let c = EventCounter {
            uar,
            addr: at,
            value: 0,
        };
        let Ok(handle) = self.objs.counters.insert(c) else {
            return no_room("event counter");
        };
        if let Err(e) = inner.mem.write(at, &0u64.to_le_bytes()) {
            self.objs.counters.remove(handle);
            return malformed(format!("counter write: {e}"));
        }
        Ok(cx.reply(CreateEventCounterResp {
            cntr_handle: handle,
            ..CreateEventCounterResp::ZERO
        }))
    }

    fn destroy_event_counter(&mut self, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: DestroyEventCounterCmd = cx.decode();
        let h = cmd.cntr_handle;
        if self.objs.counters.remove(h).is_none() {
            return illegal(format!("no event counter {h:#x}"));
        }
        for (_, qp) in self.objs.qps.iter_mut() {
            qp.counters.retain(|&(c, _)| c != h);
        }
        Ok(cx.reply(DestroyEventCounterResp::ZERO))
    }

    fn attach_event_counter(&mut self, cx: &mut Cmd<'_>, attach: bool) -> Result<AcqEntry, Fail> {
        let cmd: AttachDetachEventCounterCmd = cx.decode();
        let h = cmd.cntr_handle;
        let Some(counter_uar) = self.objs.counters.get(h).map(|c| c.uar) else {
            return illegal(format!("no event counter {h:#x}"));
        };
        if EventCounterAttachType::from_raw(cmd.attach_type)
            != Some(EventCounterAttachType::QpEvents)
        {
            return illegal(format!("attach type {}", cmd.attach_type));
        }
        let ev = cmd.qp_events();
        let Some(qp) = self.objs.qps.get_mut(ev.qp_handle) else {
            return illegal(format!("no QP {:#x}", ev.qp_handle));
        };
        if qp.uar != counter_uar {
            return illegal(format!(
                "counter {h:#x} belongs to UAR {counter_uar}, the QP to UAR {}",
                qp.uar
            ));
        }
        if ev.events == 0 || ev.events & !SUPPORTED_COUNTER_EVENTS != 0 {
            return illegal(format!("events {:#x}", ev.events));
        }
        let entry = qp.counters.iter_mut().find(|(c, _)| *c == h);
        match (attach, entry) {
            (true, Some((_, events))) => *events |= ev.events,
            (true, None) => qp.counters.push((h, ev.events)),
            (false, Some((_, events))) if *events & ev.events == ev.events => {
                *events &= !ev.events;
                qp.counters.retain(|&(_, e)| e != 0);
            }
            (false, _) => {
                return illegal(format!(
                    "counter {h:#x} does not count events {:#x} of the QP",
                    ev.events
                ))
            }
        }
        Ok(cx.reply(AttachDetachEventCounterResp::ZERO))
    }

    fn modify_event_counter(&mut self, inner: &Inner, cx: &mut Cmd<'_>) -> Result<AcqEntry, Fail> {
        let cmd: ModifyEventCounterCmd = cx.decode();
        let (h, value) = (cmd.cntr_handle, cmd.value);
        let Some(c) = self.objs.counters.get_mut(h) else {
            return illegal(format!("no event counter {h:#x}"));
        };
        c.value = match EventCounterModifyOp::from_raw(cmd.operation) {
            Some(EventCounterModifyOp::Set) => value,
            Some(EventCounterModifyOp::Add) => c.value.wrapping_add(value),
            None => return illegal(format!("counter operation {}", cmd.operation)),
        };
        let (at, v) = (c.addr, c.value);
        if let Err(e) = inner.mem.write(at, &v.to_le_bytes()) {
            return malformed(format!("counter write: {e}"));
        }
        Ok(cx.reply(ModifyEventCounterResp::ZERO))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_strings_cannot_start_log_lines() {
        assert_eq!(
            nul_str(b"Debian\nefa-emu: summary: exit=clean\r\x1b[2J\0junk"),
            "Debian\\nefa-emu: summary: exit=clean\\r\\u{1b}[2J"
        );
        assert_eq!(nul_str("ünïcode\t".as_bytes()), "ünïcode\\t");
    }

    #[test]
    fn log_lines_are_compact() {
        let r = CreateAhResp {
            ah: 7,
            ..CreateAhResp::ZERO
        };
        assert_eq!(compact(&r), "CreateAhResp { ah: 7, reserved: 0 }");
        let c = GetFeatureCmd::ZERO;
        assert!(compact(&c).ends_with("raw: [0; 44] }"), "{}", compact(&c));
        assert_eq!(compact(&[1u8, 0, 0, 0, 0, 0]), "[1, 0, 0, 0, 0, 0]");
    }

    #[test]
    fn qp_state_machine() {
        use QpState::*;
        let q = ModifyQpCmd::QKEY.mask();
        let p = ModifyQpCmd::SQ_PSN.mask();
        let r = ModifyQpCmd::RNR_RETRY.mask();
        for t in [QpType::Ud, QpType::Srd] {
            assert!(transition_ok(t, Reset, Init, q));
            assert!(!transition_ok(t, Reset, Init, 0), "qkey required");
            assert!(transition_ok(t, Init, Rtr, 0));
            assert!(transition_ok(t, Rtr, Rts, p));
            assert!(!transition_ok(t, Rtr, Rts, 0), "psn required");
            assert!(!transition_ok(t, Reset, Rts, p));
            assert!(!transition_ok(t, Reset, Err, 0));
            assert!(transition_ok(t, Rts, Err, 0));
            assert!(transition_ok(t, Err, Reset, 0));
            assert!(!transition_ok(t, Err, Rts, 0));
            assert!(!transition_ok(t, Rtr, Rtr, 0));
            assert!(!transition_ok(t, Init, Rtr, p), "psn not allowed here");
        }
        assert!(transition_ok(QpType::Srd, Rtr, Rts, p | r));
        assert!(!transition_ok(QpType::Ud, Rtr, Rts, p | r), "no RNR on UD");
    }
}
