// SPDX-License-Identifier: GPL-2.0
/*
 * The operations whose prototypes have an enum, out of tree: see
 * include/rust/compat/rdma.h.
 */

#include <rust/compat/rdma.h>

static const struct rust_rdma_enum_ops *rust_rdma_enum_ops(struct ib_device *ibdev)
{
	return container_of(ibdev, struct rust_rdma_device_head, ib)->enum_ops;
}

enum rdma_link_layer rust_rdma_get_link_layer(struct ib_device *ibdev, u32 port_num)
{
	return rust_rdma_enum_ops(ibdev)->get_link_layer(ibdev, port_num);
}

int rust_rdma_modify_comp_cntr(struct ib_comp_cntr *cc, enum ib_comp_cntr_entry entry,
			       enum ib_comp_cntr_modify_op op, u64 value)
{
	return rust_rdma_enum_ops(cc->device)->modify_comp_cntr(cc, entry, op, value);
}
