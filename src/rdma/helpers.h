/* SPDX-License-Identifier: GPL-2.0 */
/*
 * C shims for the RDMA abstractions: what Rust cannot call directly because
 * the kernel provides it as a static inline function or a macro. Keep each
 * one a thin forwarder; logic belongs in Rust.
 */
#ifndef REFA_HELPERS_H
#define REFA_HELPERS_H

#include <linux/types.h>

struct ib_device;

/* Layout cross-check: the C compiler's view of the core's structures. */
size_t refa_sizeof_ib_device(void);
size_t refa_offsetof_ib_device_ops(void);

#endif
