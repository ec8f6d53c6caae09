// SPDX-License-Identifier: GPL-2.0
/* C shims for the RDMA abstractions; see helpers.h. */

#include <linux/stddef.h>
#include <rdma/ib_verbs.h>

#include "helpers.h"

size_t refa_sizeof_ib_device(void)
{
	return sizeof(struct ib_device);
}

size_t refa_offsetof_ib_device_ops(void)
{
	return offsetof(struct ib_device, ops);
}
