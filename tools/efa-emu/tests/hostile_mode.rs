//! The model as the adversary: hostile mode (`--hostile`, the control
//! window's `HOSTILE`) makes the device misbehave on purpose, one
//! malformation at a time; each test arms one and sees the device do
//! exactly that, once, and then behave again.

mod support;

use std::time::{Duration, Instant};

use efa_emu::device::control;
use efa_emu::device::hostile::{HostileSpec, Malformation};
use efa_emu::health::Class;
use efa_emu::transport::PciFunction;
use efa_hw::admin::*;
use efa_hw::aenq::AenqGroup;
use efa_hw::regs::*;
use support::*;

const SHORT: Duration = Duration::from_millis(300);

fn arm(f: &Fake, m: Malformation, seed: u64, after: u32) {
    let w = |reg: u64, v: u32| f.dev.bar_write(0, control::BASE + reg, &v.to_le_bytes());
    w(control::HOSTILE_SEED_LO, seed as u32);
    w(control::HOSTILE_SEED_HI, (seed >> 32) as u32);
    w(
        control::HOSTILE,
        control::HOSTILE_ID.prep(m as u32) | control::HOSTILE_AFTER.prep(after),
    );
}

fn hits(f: &Fake) -> u32 {
    f.mmio(control::BASE + control::HOSTILE_HITS)
}

fn injected(f: &Fake) -> u64 {
    f.dev.config().health.get(Class::Injected)
}

#[test]
fn off_by_default_and_normal_commands_see_nothing() {
    let mut f = Fake::up(test_config());
    for _ in 0..3 {
        let pd = f.alloc_pd().unwrap();
        f.cmd::<DeallocPdResp>(AdminOpcode::DeallocPd, 0, &DeallocPdCmd { pd, reserved: 0 })
            .unwrap();
    }
    assert_eq!(hits(&f), 0);
    assert_eq!(injected(&f), 0);
}

#[test]
fn a_completion_with_a_wrong_id_leaves_its_command_unanswered_once() {
    let mut f = Fake::up(test_config());
    arm(&f, Malformation::CqeWrongId, 7, 1);
    assert!(f.alloc_pd().is_ok(), "after=1: the first passes");
    let id = f.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]);
    f.ring();
    // The fake driver files the completion under the wrong id.
    assert!(f.wait_for(id, SHORT).is_none());
    assert!(f.alloc_pd().is_ok(), "one strike only");
    assert_eq!(hits(&f), 1);
    assert_eq!(injected(&f), 1);
}

#[test]
fn a_completion_with_the_wrong_phase_is_not_seen_and_its_slot_is_reused() {
    let mut f = Fake::up(test_config());
    arm(&f, Malformation::CqeBadPhase, 1, 0);
    let id = f.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]);
    f.ring();
    assert!(f.wait_for(id, SHORT).is_none());
    assert!(f.alloc_uar().is_ok(), "the next completion takes the slot");
}

#[test]
fn a_status_outside_the_specification() {
    let mut f = Fake::up(test_config());
    arm(&f, Malformation::StatusUnknown, 3, 0);
    let id = f.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]);
    f.ring();
    let e = f.wait_for(id, PATIENCE).expect("a completion");
    assert!(
        e.acq_common_descriptor.status >= 8,
        "{}",
        e.acq_common_descriptor.status
    );
    assert_eq!(f.dev.object_counts()[0], 0, "the command did not run");
}

#[test]
fn responses_out_of_range() {
    let mut f = Fake::up(test_config());
    let bar2 = f.dev.bar2_layout().size;
    let uar = f.alloc_uar().unwrap();
    arm(&f, Malformation::RespDbOutside, 5, 0);
    let cq = f.create_cq(uar).unwrap();
    assert!(u64::from(cq.db_offset) >= bar2, "{:#x}", cq.db_offset);
    arm(&f, Malformation::RespSizeLarger, 5, 0);
    let cq = f.create_cq(uar).unwrap();
    assert_ne!(cq.sub_cq_actual_depth, f.cq_cmd(uar, 64).sub_cq_depth);
    assert_eq!(hits(&f), 2);
}

#[test]
fn a_handle_of_another_live_object() {
    let mut f = Fake::up(test_config());
    let first = f.alloc_pd().unwrap();
    arm(&f, Malformation::RespHandleReuse, 9, 0);
    assert_eq!(f.alloc_pd().unwrap(), first);
    assert_eq!(hits(&f), 1);
}

#[test]
fn readless_reads_unanswered_or_answered_for_another_register() {
    let mut f = Fake::up(test_config());
    arm(&f, Malformation::ReadlessSilent, 1, 1);
    assert!(f.r(VERSION_OFF).is_some(), "after=1");
    assert!(f.r(VERSION_OFF).is_none());
    assert!(f.r(CAPS_OFF).is_none(), "every read while armed");
    arm(&f, Malformation::ReadlessWrongReg, 1, 0);
    assert!(f.r(VERSION_OFF).is_none(), "answered for another offset");
    f.dev.bar_write(
        0,
        control::BASE + control::COMMAND,
        &control::CMD_CLEAR_INJECT.to_le_bytes(),
    );
    assert!(f.r(VERSION_OFF).is_some(), "disarmed");
}

#[test]
fn a_reset_that_never_finishes_then_one_that_does() {
    let mut f = Fake::up(test_config());
    // Seeds pick one of the two ways: try both.
    for seed in 0..4 {
        f.restart();
        arm(&f, Malformation::ResetStuck, seed, 0);
        f.w(DEV_CTL_OFF, DEV_CTL_DEV_RESET.prep(1));
        f.set_resp_addr(f.resp);
        let rising = f.reg(DEV_STS_OFF);
        f.w(DEV_CTL_OFF, 0);
        std::thread::sleep(Duration::from_millis(20));
        let falling = f.reg(DEV_STS_OFF);
        // Either it never started, or it never ends.
        assert!(
            !DEV_STS_RESET_IN_PROGRESS.is_set(rising) || DEV_STS_RESET_IN_PROGRESS.is_set(falling),
            "seed {seed}: {rising:#x} then {falling:#x}"
        );
    }
    // One strike per arming: the next reset works.
    f.restart();
    assert!(f.alloc_pd().is_ok());
}

#[test]
fn events_the_specification_does_not_define_and_storms() {
    let mut f = Fake::up(test_config());
    f.enable_aenq();
    let _ = f.aenq_events();
    f.dev.bar_write(
        0,
        control::BASE + control::HOSTILE,
        &(control::HOSTILE_ID.prep(Malformation::AenqUnknownGroup as u32)
            | control::HOSTILE_COUNT.prep(5))
        .to_le_bytes(),
    );
    let mut seen = Vec::new();
    let t = Instant::now();
    while seen.len() < 5 && t.elapsed() < PATIENCE {
        seen.extend(f.aenq_events());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(seen.len(), 5);
    assert!(seen
        .iter()
        .all(|e| AenqGroup::from_raw(e.aenq_common_desc.group).is_none()));
    assert_eq!(hits(&f), 5);
}

#[test]
fn interrupts_after_a_reset_on_every_vector() {
    let mut f = Fake::up(test_config());
    let before: Vec<u64> = (0..4).map(|v| f.irq.count(v)).collect();
    arm(&f, Malformation::IrqAfterReset, 1, 0);
    f.restart();
    std::thread::sleep(Duration::from_millis(600));
    for v in 0..4u16 {
        assert!(f.irq.count(v) >= before[usize::from(v)] + 2, "vector {v}");
    }
}

#[test]
fn armed_from_the_command_line_and_replayable() {
    let mut cfg = test_config();
    cfg.hostile = Some(HostileSpec::parse("cqe-wrong-id,seed=3").unwrap());
    let mut f = Fake::new(cfg);
    // The first command of the bring-up is the one struck; a fake driver
    // sees its completion go missing, as a real one would.
    f.set_resp_addr(f.resp);
    f.reset_device(ResetReason::Normal);
    assert_eq!(hits(&f), 0, "resets and reads are no occasion");
}

#[test]
fn bar2_declared_as_io_space_from_the_command_line() {
    let normal = Fake::new(test_config());
    let bar2 = normal
        .dev
        .bars()
        .into_iter()
        .find(|b| b.index == MEM_BAR)
        .unwrap();
    assert!(!bar2.io_space && bar2.is_64bit && bar2.size > 4096);
    let mut cfg = test_config();
    cfg.hostile = Some(HostileSpec::parse("bar-io").unwrap());
    let f = Fake::new(cfg);
    let bar2 = f
        .dev
        .bars()
        .into_iter()
        .find(|b| b.index == MEM_BAR)
        .unwrap();
    assert!(bar2.io_space && !bar2.is_64bit && !bar2.prefetchable);
    assert_eq!(bar2.size, 4096);
    assert!(matches!(
        bar2.backing,
        efa_emu::transport::BarBacking::Trapped
    ));
    assert_eq!(
        (hits(&f), injected(&f)),
        (1, 1),
        "one strike, when realized"
    );
    // BAR0 stays memory.
    let bar0 = f
        .dev
        .bars()
        .into_iter()
        .find(|b| b.index == REG_BAR)
        .unwrap();
    assert!(!bar0.io_space);
}

#[test]
fn a_second_doorbell_page_for_a_uar() {
    let mut f = Fake::up(test_config());
    let uar = f.alloc_uar().unwrap();
    arm(&f, Malformation::RespDbSecondPage, 3, 0);
    // The UAR's first doorbell is no occasion: it has no page yet.
    let first = f.create_cq(uar).unwrap();
    assert_eq!(hits(&f), 0);
    let second = f.create_cq(uar).unwrap();
    assert_eq!(hits(&f), 1);
    let page = |off: u32| u64::from(off) / 4096;
    assert_ne!(page(second.db_offset), page(first.db_offset));
    let layout = f.dev.bar2_layout();
    assert!(
        u64::from(second.db_offset) < layout.llq_offset,
        "a doorbell page"
    );
    // Once: the next one is on the UAR's page again.
    let third = f.create_cq(uar).unwrap();
    assert_eq!(page(third.db_offset), page(first.db_offset));
}
