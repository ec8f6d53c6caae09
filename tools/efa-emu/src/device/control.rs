//! The emulator's control window: NOT part of the EFA interface.
//!
//! A page of 32-bit registers in BAR0 at [`BASE`], where the EFA register
//! map has nothing, so that tests running in the guest can steer the model
//! through `/sys/bus/pci/devices/*/resource0` while a driver is bound. A
//! real EFA device has nothing there; drivers must never touch it.
//! `Documentation/efa-emu.md` describes it for users and
//! `tools/efa-emu/guest/efa-emu-inject` drives it.
//!
//! The window is a test feature and is off unless efa-emu runs with
//! `--test-control` (`Config::test_control`): off, `MAGIC` reads
//! [`MAGIC_OFF_VALUE`] (so that a test can say why it cannot steer the
//! model), every other register reads 0 and writes are ignored.
//!
//! | offset | access | register |
//! |--------|--------|----------|
//! | 0x00 | RO | `MAGIC`: `"EEMU"` (0x554d4545) |
//! | 0x04 | RO | `WINDOW_VERSION`: 10 (9 had no register and interrupt counts, 8 had no reordering and duplication registers, 7 had no silent fatal error, 6 had no interrupt storm, 5 had no late completions, 4 no hostile mode, 3 no object counts and no panic command, 2 no `INJECT` skip, 1 no network registers) |
//! | 0x08 | RW | `INJECT`: arm a fault (format below); reads the last value |
//! | 0x0c | RO | `INJECTED`: commands failed or dropped by injection so far |
//! | 0x10 | RW | `ADMIN_TIMEOUT`: `CAPS.ADMIN_CMD_TO` in 100 ms units (0..=15) |
//! | 0x14 | RW | `KEEP_ALIVE_MS`: keep-alive period (0: none) |
//! | 0x18 | WO | `COMMAND`: 1 exit the model, 2 fatal error, 3 AENQ warning, 4 AENQ notification, 5 disarm all faults, 6 panic the data-path thread, 7 complete the held commands late, 8 fatal error without its AENQ event (only `DEV_STS` says so) |
//! | 0x1c | RO | `ADMIN_CMDS`: admin commands fetched |
//! | 0x20 | RO | `ADMIN_ERRORS`: error completions written |
//! | 0x24 | RO | `KEEP_ALIVES`: keep-alive events posted |
//! | 0x28 | RO | `INDEX`: the device's `--index` |
//! | 0x2c | RW | `NET_LOSS_PPM`: drop arriving packets with this probability (parts per million) |
//! | 0x30 | RW | `NET_DELAY_US`: hold arriving packets up to this many microseconds |
//! | 0x34 | RO | `NET_DROPPED`: arriving packets dropped by injected loss |
//! | 0x38 | RO | `LIVE_QPS`: queue pairs the device has |
//! | 0x3c | RO | `LIVE_CQS`: completion queues the device has |
//! | 0x40 | RO | `LIVE_PDS`: protection domains the device has |
//! | 0x44 | RO | `LIVE_UARS`: user access regions the device has |
//! | 0x48 | RO | `LLQ_PAGES`: pages of the BAR2 LLQ pool given to queue pairs |
//! | 0x4c | RW | `HOSTILE`: arm a malformation (hostile mode, format below); reads the last value |
//! | 0x50 | RW | `HOSTILE_SEED_LO`: low half of the seed the next `HOSTILE` write uses |
//! | 0x54 | RW | `HOSTILE_SEED_HI`: high half |
//! | 0x58 | RO | `HOSTILE_HITS`: times a malformation struck |
//! | 0x5c | RO | `LATE_HELD`: commands held for a late completion |
//! | 0x60 | RO | `LATE_ADDR_LO`: low half of the first buffer the last command held named |
//! | 0x64 | RO | `LATE_ADDR_HI`: high half |
//! | 0x68 | RO | `LATE_WRITES`: buffers late completions wrote |
//! | 0x6c | RW | `STORM_MS`: write N: an AENQ interrupt storm for N ms (at most 60000), 0: stop it; reads the ms left (at least 1 until it settled, then 0) |
//! | 0x70 | RO | `STORM_EVENTS`: AENQ events the last storm wrote |
//! | 0x74 | RO | `STORM_PASSES`: the driver's AENQ_CONS_DB writes during the last storm |
//! | 0x78 | RO | `STORM_MAX_PASS`: the most AENQ events the driver took between two AENQ_CONS_DB writes during the last storm |
//! | 0x7c | RW | `NET_REORDER_PPM`: hold arriving packets 1 ms more with this probability (ppm), so that later ones pass them |
//! | 0x80 | RW | `NET_DUP_PPM`: deliver arriving packets twice with this probability (ppm) |
//! | 0x84 | RO | `REG_READS`: the driver's register reads of BAR0 outside this window |
//! | 0x88 | RO | `REG_WRITES`: the driver's register writes to BAR0 outside this window (a 64-bit store is one) |
//! | 0x8c | RO | `INTERRUPTS`: MSI-X messages the device signalled |
//!
//! The object counts let a test see what a driver leaves on the device
//! (or keeps there on purpose) without a command of the EFA interface.
//!
//! `INJECT`: bits 7:0 opcode, 15:8 status for fail mode (0: the default,
//! `UNKNOWN_ERROR`), bit 16 timeout mode (the command never completes),
//! bits 19:17 skip (commands of the opcode that run normally first),
//! bits 31:20 count (0 disarms the opcode). Counters are 32 bits and wrap.
//!
//! Timeout mode with a status is late mode: the command is held, not
//! executed, until `COMMAND` 7, which writes [`LATE_MARKER`] at the start
//! of each buffer it named (the control buffer, the region's first page,
//! the ring or counter of the object it would create) and then completes
//! it with that status: a device acting on a command after the driver
//! gave up on it. A test that finds the marker in memory the driver had
//! freed has caught it freeing too early. A reset forgets held commands,
//! as hardware does.
//!
//! The interrupt storm (`super::storm`): keep-alive events with the
//! right phase, as fast as the driver takes them and regardless of the
//! consumer doorbell, with the interrupt raised after each of the driver's
//! passes; `STORM_MAX_PASS` says whether the driver's handler took more
//! than a ring's worth in one pass. A reset ends it.
//!
//! `HOSTILE`: bits 7:0 the malformation's number (`hostile::Malformation`;
//! 0 disarms), 15:8 `after`, 31:16 `count` (0: the malformation's default).
//! `COMMAND` 5 (disarm all faults) disarms it too.

use efa_hw::admin::AdminStatus;
use efa_hw::aenq::AenqGroup;
use efa_hw::wire::Field;

use super::config::{InjectRule, DEFAULT_INJECT_STATUS};
use super::hostile::{HostileSpec, Malformation};
use super::{admin_timeout_units, InjectMode, Inner, State};
use crate::health::Class;
use crate::report;

/// Offset of the window in BAR0.
pub const BASE: u64 = 0x1000;
/// Size of the window.
pub const SIZE: u64 = 0x1000;

/// `MAGIC` register.
pub const MAGIC: u64 = 0x00;
/// `WINDOW_VERSION` register.
pub const WINDOW_VERSION: u64 = 0x04;
/// `INJECT` register.
pub const INJECT: u64 = 0x08;
/// `INJECTED` register.
pub const INJECTED: u64 = 0x0c;
/// `ADMIN_TIMEOUT` register.
pub const ADMIN_TIMEOUT: u64 = 0x10;
/// `KEEP_ALIVE_MS` register.
pub const KEEP_ALIVE_MS: u64 = 0x14;
/// `COMMAND` register.
pub const COMMAND: u64 = 0x18;
/// `ADMIN_CMDS` register.
pub const ADMIN_CMDS: u64 = 0x1c;
/// `ADMIN_ERRORS` register.
pub const ADMIN_ERRORS: u64 = 0x20;
/// `KEEP_ALIVES` register.
pub const KEEP_ALIVES: u64 = 0x24;
/// `INDEX` register.
pub const INDEX: u64 = 0x28;
/// Injected loss on arriving packets, parts per million.
pub const NET_LOSS_PPM: u64 = 0x2c;
/// Injected random delay of arriving packets, microseconds.
pub const NET_DELAY_US: u64 = 0x30;
/// Packets dropped by injected loss.
pub const NET_DROPPED: u64 = 0x34;
/// Queue pairs the device has.
pub const LIVE_QPS: u64 = 0x38;
/// Completion queues the device has.
pub const LIVE_CQS: u64 = 0x3c;
/// Protection domains the device has.
pub const LIVE_PDS: u64 = 0x40;
/// User access regions the device has.
pub const LIVE_UARS: u64 = 0x44;
/// Pages of the LLQ pool in use.
pub const LLQ_PAGES: u64 = 0x48;
/// Hostile mode: the malformation armed.
pub const HOSTILE: u64 = 0x4c;
/// Hostile mode: low half of the seed.
pub const HOSTILE_SEED_LO: u64 = 0x50;
/// Hostile mode: high half of the seed.
pub const HOSTILE_SEED_HI: u64 = 0x54;
/// Hostile mode: strikes so far.
pub const HOSTILE_HITS: u64 = 0x58;

/// Commands held for a late completion.
pub const LATE_HELD: u64 = 0x5c;
/// Low half of the first buffer the last command held named.
pub const LATE_ADDR_LO: u64 = 0x60;
/// High half.
pub const LATE_ADDR_HI: u64 = 0x64;
/// Buffers late completions wrote.
pub const LATE_WRITES: u64 = 0x68;
/// Interrupt storm: its length in ms (write), the ms left (read).
pub const STORM_MS: u64 = 0x6c;
/// Events the last storm wrote.
pub const STORM_EVENTS: u64 = 0x70;
/// The driver's consumer doorbell writes during the last storm.
pub const STORM_PASSES: u64 = 0x74;
/// The most events the driver took in one pass during the last storm.
pub const STORM_MAX_PASS: u64 = 0x78;
/// Probability (ppm) that an arriving packet is held back to be passed.
pub const NET_REORDER_PPM: u64 = 0x7c;
/// Probability (ppm) that an arriving packet arrives twice.
pub const NET_DUP_PPM: u64 = 0x80;
/// `REG_READS` (RO).
pub const REG_READS: u64 = 0x84;
/// `REG_WRITES` (RO).
pub const REG_WRITES: u64 = 0x88;
/// `INTERRUPTS` (RO).
pub const INTERRUPTS: u64 = 0x8c;

/// What a late completion writes at the start of each buffer its command
/// named.
pub const LATE_MARKER: [u8; 8] = *b"LATE-EMU";

/// `HOSTILE`: the malformation's number (0: off).
pub const HOSTILE_ID: Field<u32> = Field::new(0xff);
/// `HOSTILE`: occasions that pass normally first.
pub const HOSTILE_AFTER: Field<u32> = Field::new(0xff00);
/// `HOSTILE`: strikes (0: the malformation's default).
pub const HOSTILE_COUNT: Field<u32> = Field::new(0xffff_0000);

/// The value of `MAGIC`.
pub const MAGIC_VALUE: u32 = u32::from_le_bytes(*b"EEMU");
/// The value of `MAGIC` while the window is off (`"EEMD"`, disabled).
pub const MAGIC_OFF_VALUE: u32 = u32::from_le_bytes(*b"EEMD");
/// The value of `WINDOW_VERSION`.
pub const VERSION_VALUE: u32 = 10;

/// `INJECT`: opcode.
pub const INJECT_OPCODE: Field<u32> = Field::new(0xff);
/// `INJECT`: status of failed commands (0: `UNKNOWN_ERROR`).
pub const INJECT_STATUS: Field<u32> = Field::new(0xff00);
/// `INJECT`: the commands time out instead of failing.
pub const INJECT_TIMEOUT: Field<u32> = Field::new(0x1_0000);
/// `INJECT`: how many commands of the opcode run normally first.
pub const INJECT_SKIP: Field<u32> = Field::new(0xe_0000);
/// `INJECT`: how many commands (0 disarms).
pub const INJECT_COUNT: Field<u32> = Field::new(0xfff0_0000);

/// `COMMAND`: the model process exits at once, as if killed.
pub const CMD_EXIT: u32 = 1;
/// `COMMAND`: the device enters the fatal state.
pub const CMD_FATAL: u32 = 2;
/// `COMMAND`: post a warning AENQ event.
pub const CMD_AENQ_WARNING: u32 = 3;
/// `COMMAND`: post a notification AENQ event.
pub const CMD_AENQ_NOTIFICATION: u32 = 4;
/// `COMMAND`: disarm every injected fault.
pub const CMD_CLEAR_INJECT: u32 = 5;
/// `COMMAND`: the data-path thread panics (tests that a panic in efa-emu
/// ends the process with status 70 and says so).
pub const CMD_PANIC: u32 = 6;
/// `COMMAND`: complete every held command late (late mode, above).
pub const CMD_COMPLETE_LATE: u32 = 7;
/// `COMMAND`: the device enters the fatal state without posting the
/// event: only `DEV_STS` says so.
pub const CMD_FATAL_SILENT: u32 = 8;

/// The `INJECT` value for `count` commands of `opcode` in `mode`, after
/// `skip` (at most 7) that run normally.
pub fn inject_value(opcode: u8, skip: u32, count: u32, mode: InjectMode) -> u32 {
    let (status, timeout) = match mode {
        InjectMode::Fail(s) => (u32::from(s.raw()), 0),
        InjectMode::Timeout => (0, 1),
        InjectMode::Late(s) => (u32::from(s.raw()), 1),
    };
    INJECT_OPCODE.prep(opcode.into())
        | INJECT_STATUS.prep(status)
        | INJECT_TIMEOUT.prep(timeout)
        | INJECT_SKIP.prep(skip)
        | INJECT_COUNT.prep(count)
}

/// Whether BAR0 `offset` is in the window.
pub fn owns(offset: u64) -> bool {
    (BASE..BASE + SIZE).contains(&offset)
}

/// A read of the window while it is off.
pub(super) fn read_off(reg: u64) -> u32 {
    match reg {
        MAGIC => MAGIC_OFF_VALUE,
        _ => 0,
    }
}

pub(super) fn read(st: &State, inner: &Inner, reg: u64) -> u32 {
    let c = &st.counters;
    match reg {
        MAGIC => MAGIC_VALUE,
        WINDOW_VERSION => VERSION_VALUE,
        INJECT => st.inject_reg,
        INJECTED => c.injected as u32,
        ADMIN_TIMEOUT => st.admin_timeout_units,
        KEEP_ALIVE_MS => st.keep_alive_ms,
        ADMIN_CMDS => c.admin_cmds as u32,
        ADMIN_ERRORS => c.admin_errors as u32,
        KEEP_ALIVES => c.keep_alives as u32,
        INDEX => inner.cfg.index.into(),
        NET_LOSS_PPM => inner.port.faults().loss_ppm,
        NET_DELAY_US => inner.port.faults().delay_us,
        NET_DROPPED => inner.port.dropped() as u32,
        NET_REORDER_PPM => inner.port.faults().reorder_ppm,
        NET_DUP_PPM => inner.port.faults().dup_ppm,
        LIVE_QPS => st.objs.qps.len() as u32,
        LIVE_CQS => st.objs.cqs.len() as u32,
        LIVE_PDS => st.objs.pds.len() as u32,
        LIVE_UARS => st.objs.uars.len() as u32,
        LLQ_PAGES => st.llq.used_pages() as u32,
        HOSTILE => st.hostile_reg,
        HOSTILE_SEED_LO => st.hostile_seed as u32,
        HOSTILE_SEED_HI => (st.hostile_seed >> 32) as u32,
        HOSTILE_HITS => st.hostile.total_hits,
        LATE_HELD => st.late.len() as u32,
        LATE_ADDR_LO => st.late_addr as u32,
        LATE_ADDR_HI => (st.late_addr >> 32) as u32,
        LATE_WRITES => c.late_writes as u32,
        STORM_MS => st.storm.remaining_ms(),
        STORM_EVENTS => st.storm.events,
        STORM_PASSES => st.storm.passes,
        STORM_MAX_PASS => st.storm.max_pass,
        REG_READS => c.reg_reads as u32,
        REG_WRITES => c.reg_writes as u32,
        INTERRUPTS => inner.irq.signalled() as u32,
        _ => 0,
    }
}

/// Handles a write; returns whether the model should exit.
pub(super) fn write(st: &mut State, inner: &Inner, reg: u64, v: u32) -> bool {
    let name = inner.name();
    let health = inner.health();
    match reg {
        INJECT => {
            st.inject_reg = v;
            let opcode = INJECT_OPCODE.get(v) as u8;
            let count = INJECT_COUNT.get(v);
            let skip = INJECT_SKIP.get(v);
            let late = AdminStatus::from_raw(INJECT_STATUS.get(v) as u8);
            let mode = if INJECT_TIMEOUT.is_set(v) {
                match (INJECT_STATUS.get(v), late) {
                    (0, _) => InjectMode::Timeout,
                    (_, Some(status)) => InjectMode::Late(status),
                    (_, None) => InjectMode::Late(DEFAULT_INJECT_STATUS),
                }
            } else {
                let raw = INJECT_STATUS.get(v) as u8;
                match raw {
                    0 => InjectMode::Fail(DEFAULT_INJECT_STATUS),
                    _ => InjectMode::Fail(AdminStatus::from_raw(raw).unwrap_or_else(|| {
                        report!(
                            health,
                            Warn,
                            None,
                            "control",
                            "{name}: unknown injected status {raw}, using the default"
                        );
                        DEFAULT_INJECT_STATUS
                    })),
                }
            };
            if count == 0 {
                st.inject.remove(&opcode);
                report!(
                    health,
                    Info,
                    None,
                    "control",
                    "{name}: fault injection for opcode {opcode} disarmed"
                );
            } else {
                let rule = InjectRule {
                    opcode,
                    skip,
                    count,
                    mode,
                };
                st.inject.insert(opcode, rule);
                report!(
                    health,
                    Info,
                    None,
                    "control",
                    "{name}: after {skip}, the next {count} commands of opcode {opcode}: {mode:?}"
                );
            }
        }
        HOSTILE => {
            st.hostile_reg = v;
            let id = HOSTILE_ID.get(v) as u8;
            if id == 0 {
                st.hostile_arm(inner, None);
            } else if let Some(malformation) = Malformation::from_raw(id) {
                let spec = HostileSpec {
                    malformation,
                    seed: st.hostile_seed,
                    after: HOSTILE_AFTER.get(v),
                    count: HOSTILE_COUNT.get(v),
                };
                st.hostile_arm(inner, Some(spec));
            } else {
                report!(
                    health,
                    Warn,
                    None,
                    "control",
                    "{name}: unknown malformation {id}; hostile mode off"
                );
                st.hostile_arm(inner, None);
            }
        }
        STORM_MS => {
            st.storm.request(v);
            report!(
                health,
                Info,
                None,
                "control",
                "{name}: AENQ interrupt storm for {v} ms (0: stop)"
            );
        }
        HOSTILE_SEED_LO => st.hostile_seed = st.hostile_seed & !0xffff_ffff | u64::from(v),
        HOSTILE_SEED_HI => {
            st.hostile_seed = st.hostile_seed & 0xffff_ffff | u64::from(v) << 32;
        }
        ADMIN_TIMEOUT => {
            st.admin_timeout_units = admin_timeout_units(v.saturating_mul(100));
            report!(
                health,
                Info,
                None,
                "control",
                "{name}: CAPS admin timeout now {} x 100 ms",
                st.admin_timeout_units
            );
        }
        KEEP_ALIVE_MS => {
            st.keep_alive_ms = v;
            st.next_keep_alive = None;
            inner.wake.notify_all();
            report!(
                health,
                Info,
                None,
                "control",
                "{name}: keep-alive period now {v} ms"
            );
        }
        COMMAND => match v {
            CMD_EXIT => return true,
            CMD_FATAL => st.enter_fatal(
                inner,
                Some(Class::Injected),
                "requested through the control window",
            ),
            CMD_AENQ_WARNING | CMD_AENQ_NOTIFICATION => {
                let group = if v == CMD_AENQ_WARNING {
                    AenqGroup::Warning
                } else {
                    AenqGroup::Notification
                };
                if let Err(e) = st.post_aenq(inner, group, 0, false) {
                    st.enter_fatal(inner, None, &format!("AENQ write: {e}"));
                }
            }
            CMD_CLEAR_INJECT => {
                st.inject.clear();
                st.hostile_reg = 0;
                st.hostile_arm(inner, None);
                inner.port.set_faults(Default::default());
                report!(
                    health,
                    Info,
                    None,
                    "control",
                    "{name}: every fault injection disarmed"
                );
            }
            CMD_PANIC => {
                report!(
                    health,
                    Warn,
                    None,
                    "control",
                    "{name}: the data-path thread is to panic, as requested"
                );
                st.panic_requested = true;
                inner.port.kick();
            }
            CMD_COMPLETE_LATE => st.complete_late(inner),
            CMD_FATAL_SILENT => {
                st.enter_fatal_silently(
                    inner,
                    Some(Class::Injected),
                    "requested through the control window, without its event",
                );
            }
            _ => report!(
                health,
                Warn,
                None,
                "control",
                "{name}: unknown control command {v}"
            ),
        },
        NET_LOSS_PPM | NET_DELAY_US | NET_REORDER_PPM | NET_DUP_PPM => {
            let mut f = inner.port.faults();
            match reg {
                NET_LOSS_PPM => f.loss_ppm = v.min(1_000_000),
                NET_DELAY_US => f.delay_us = v,
                NET_REORDER_PPM => f.reorder_ppm = v.min(1_000_000),
                _ => f.dup_ppm = v.min(1_000_000),
            }
            inner.port.set_faults(f);
            report!(
                health,
                Info,
                None,
                "control",
                "{name}: arriving packets: {} ppm lost, up to {} us delay, {} ppm reordered, \
                 {} ppm duplicated",
                f.loss_ppm,
                f.delay_us,
                f.reorder_ppm,
                f.dup_ppm
            );
        }
        _ => log::debug!("{name}: write {v:#x} to read-only control register {reg:#x}"),
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inject_values() {
        assert_eq!(MAGIC_VALUE.to_le_bytes(), *b"EEMU");
        assert_eq!(
            inject_value(9, 0, 2, InjectMode::Fail(AdminStatus::ResourceBusy)),
            0x0020_0709
        );
        assert_eq!(inject_value(1, 0, 4095, InjectMode::Timeout), 0xfff1_0001);
        assert_eq!(inject_value(25, 7, 1, InjectMode::Timeout), 0x001f_0019);
        assert_eq!(
            inject_value(7, 0, 1, InjectMode::Late(AdminStatus::UnknownError)),
            0x0011_0607
        );
        assert!(owns(0x1000) && owns(0x1ffc) && !owns(0xffc) && !owns(0x2000));
    }
}
