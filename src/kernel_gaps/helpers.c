// SPDX-License-Identifier: GPL-2.0
/*
 * Out of tree only: what the kernel gaps (src/kernel_gaps/) call that the
 * kernel provides as a static inline function or a macro, in
 * rust/helpers/'s convention. In tree the series' rust/kernel patches
 * (patches/rust/) add the same helpers to the files of rust/helpers/ named
 * here, and the gaps that call them are not in the tree. The gaps'
 * bindings are bindgen's of this file, with the kernel crate's types
 * (src/kernel_gaps/bindings.rs), and the initial UTS namespace and
 * LINUX_VERSION_CODE that come along.
 */

#include <linux/cpumask.h>
#include <linux/device.h>
#include <linux/dma-mapping.h>
#include <linux/interrupt.h>
#include <linux/irq.h>
#include <linux/utsname.h>
#include <linux/version.h>

#define __rust_helper

/* rust/helpers/dma.c */
__rust_helper void rust_helper_dma_set_seg_boundary(struct device *dev, unsigned long mask)
{
	dma_set_seg_boundary(dev, mask);
}

/* rust/helpers/cpumask.c */
__rust_helper const struct cpumask *rust_helper_cpumask_of(unsigned int cpu)
{
	return cpumask_of(cpu);
}

/* rust/helpers/irq.c */
__rust_helper int rust_helper_irq_set_affinity_and_hint(unsigned int irq,
							const struct cpumask *m)
{
	return irq_set_affinity_and_hint(irq, m);
}

__rust_helper int rust_helper_irq_update_affinity_hint(unsigned int irq,
						       const struct cpumask *m)
{
	return irq_update_affinity_hint(irq, m);
}

/*
 * Not in the tree: the series' IrqVectorHandler reads the node of the
 * vectors' device (dev_to_node(), a helper of rust/helpers/device.c), which
 * is private to the kernel crate; out of tree the node of the interrupt's
 * descriptor stands in for it, which the MSI core allocates there.
 */
__rust_helper int rust_helper_irq_data_get_node(struct irq_data *d)
{
	return irq_data_get_node(d);
}
