// SPDX-License-Identifier: GPL-2.0
/*
 * Real kernel faults on request, for tools/vm/selftest: each parameter
 * makes the kernel do one thing the harness must catch. Loaded without
 * parameters it does nothing wrong, and its KUnit suite passes.
 *
 *   fail=1         the KUnit suite (it runs at each load) fails a case
 *   lockdep=1      takes two mutexes in both orders: a lockdep report
 *   spin_ms=N      spins N ms with preemption off: a soft lockup report
 *                  once N exceeds twice kernel.watchdog_thresh
 *   sleep_ms=N     sleeps N ms uninterruptibly in init: a hung task report
 *                  once N exceeds kernel.hung_task_timeout_secs
 *   hang_reboot=1  a reboot notifier that never returns: the guest hangs
 *                  after the command, in the reboot
 */
#include <kunit/test.h>
#include <linux/delay.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/reboot.h>
#include <linux/timekeeping.h>

static int fail;
module_param(fail, int, 0444);
static int lockdep;
module_param(lockdep, int, 0444);
static int spin_ms;
module_param(spin_ms, int, 0444);
static int sleep_ms;
module_param(sleep_ms, int, 0444);
static int hang_reboot;
module_param(hang_reboot, int, 0444);

static void fixture_passes(struct kunit *test)
{
	KUNIT_EXPECT_EQ(test, 1 + 1, 2);
}

static void fixture_fails_on_request(struct kunit *test)
{
	KUNIT_EXPECT_EQ_MSG(test, fail, 0, "failing on purpose: loaded with fail=%d", fail);
}

static struct kunit_case fixture_cases[] = {
	KUNIT_CASE(fixture_passes),
	KUNIT_CASE(fixture_fails_on_request),
	{}
};

static struct kunit_suite fixture_suite = {
	.name = "refa_selftest_fixture",
	.test_cases = fixture_cases,
};
kunit_test_suite(fixture_suite);

static DEFINE_MUTEX(lock_a);
static DEFINE_MUTEX(lock_b);

static int never_return(struct notifier_block *nb, unsigned long action, void *data)
{
	pr_info("refa_selftest_fixture: hanging the reboot on purpose\n");
	for (;;)
		msleep_interruptible(1000);
	return NOTIFY_DONE;
}

static struct notifier_block reboot_hang = { .notifier_call = never_return };

static int __init fixture_init(void)
{
	if (lockdep) {
		/* A -> B, then B -> A: lockdep sees the inversion at once. */
		mutex_lock(&lock_a);
		mutex_lock(&lock_b);
		mutex_unlock(&lock_b);
		mutex_unlock(&lock_a);
		mutex_lock(&lock_b);
		mutex_lock(&lock_a);
		mutex_unlock(&lock_a);
		mutex_unlock(&lock_b);
	}
	if (spin_ms > 0) {
		/*
		 * Spin on the clock the soft lockup detector reads, not with
		 * mdelay(): under TCG mdelay() counts loops calibrated at boot,
		 * and a guest that booted on a busy host spins for less than
		 * asked (a loaded make test saw mdelay(5000) end within 3 s,
		 * too soon for a report at a 2 s threshold).
		 */
		u64 end = ktime_get_mono_fast_ns() + (u64)spin_ms * NSEC_PER_MSEC;

		preempt_disable();
		while (ktime_get_mono_fast_ns() < end)
			cpu_relax();
		preempt_enable();
	}
	if (sleep_ms > 0)
		msleep(sleep_ms);
	if (hang_reboot)
		register_reboot_notifier(&reboot_hang);
	return 0;
}

static void __exit fixture_exit(void)
{
	if (hang_reboot)
		unregister_reboot_notifier(&reboot_hang);
}

module_init(fixture_init);
module_exit(fixture_exit);
MODULE_DESCRIPTION("Kernel faults on request for refa's VM harness self-tests");
MODULE_LICENSE("GPL");
