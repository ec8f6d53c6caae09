// SPDX-License-Identifier: GPL-2.0
/*
 * What the kernel gaps (src/kernel_gaps/) call that the kernel provides as
 * a static inline function or a macro, in rust/helpers/'s convention (in
 * tree: rust/helpers/dma.c, irq.c, cpumask.c and a new utsname.c). The gaps' bindings are
 * bindgen's of this file, with the kernel crate's types
 * (src/kernel_gaps/bindings.rs).
 */

#include <linux/cpumask.h>
#include <linux/device.h>
#include <linux/dma-mapping.h>
#include <linux/interrupt.h>
#include <linux/utsname.h>
#include <linux/version.h>

/* Defined by rust/helpers/helpers.c, which this file is part of in tree. */
#ifndef __rust_helper
#define __rust_helper
#endif

__rust_helper void rust_helper_dma_set_seg_boundary(struct device *dev, unsigned long mask)
{
	dma_set_seg_boundary(dev, mask);
}

__rust_helper int rust_helper_dev_to_node(struct device *dev)
{
	return dev_to_node(dev);
}

__rust_helper const struct cpumask *rust_helper_cpumask_of(unsigned int cpu)
{
	return cpumask_of(cpu);
}

__rust_helper int rust_helper_irq_set_affinity_and_hint(unsigned int irq,
							const struct cpumask *m)
{
	return irq_set_affinity_and_hint(irq, m);
}

__rust_helper struct new_utsname *rust_helper_init_utsname(void)
{
	return init_utsname();
}

__rust_helper int rust_helper_irq_update_affinity_hint(unsigned int irq,
						       const struct cpumask *m)
{
	return irq_update_affinity_hint(irq, m);
}
