// SPDX-License-Identifier: GPL-2.0
/*
 * The C half of the kCFI fixture for tools/vm/selftest: at load it calls
 * Rust functions (cfi_callee.rs) through function pointers, as the RDMA
 * core calls a driver's operations.
 *
 *   (no parameter)  a pointer of the callee's own type: the call must go
 *                   through, which proves the module's Rust was built with
 *                   kCFI type ids at all
 *   mistyped=1      then a pointer to a function returning an enum, while
 *                   the callee returns an integer (the mistake refa made
 *                   with get_link_layer): under kCFI the call must fail
 *                   ("CFI failure at ..."), and the harness must fail the
 *                   run on it
 */
#include <linux/module.h>
#include <linux/types.h>

static int mistyped;
module_param(mistyped, int, 0444);

enum refa_cfi_fixture_answer {
	REFA_CFI_FIXTURE_NO,
	REFA_CFI_FIXTURE_YES,
};

u32 refa_cfi_fixture_matched(u32 x);
/* Defined in Rust as returning u32: deliberately not this prototype. */
enum refa_cfi_fixture_answer refa_cfi_fixture_mistyped(u32 x);

/* volatile: the compiler must not turn the calls into direct ones. */
static u32 (*volatile matched_op)(u32) = refa_cfi_fixture_matched;
static enum refa_cfi_fixture_answer (*volatile mistyped_op)(u32) = refa_cfi_fixture_mistyped;

static int __init cfi_fixture_init(void)
{
	pr_info("refa_cfi_fixture: the matched call returned %u\n", matched_op(1));
	if (mistyped)
		pr_info("refa_cfi_fixture: the mistyped call returned %d (kCFI let it through)\n",
			mistyped_op(1));
	return 0;
}

static void __exit cfi_fixture_exit(void)
{
}

module_init(cfi_fixture_init);
module_exit(cfi_fixture_exit);
MODULE_DESCRIPTION("A mistyped indirect call into Rust, for refa's VM harness self-tests");
MODULE_LICENSE("GPL");
