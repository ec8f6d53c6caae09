/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the RDMA abstractions need only out of tree, where bindgen reads
 * this file (see Kbuild): the core's headers, and the kCFI shims.
 *
 * kCFI out of tree: the core calls each operation through a pointer to its
 * C prototype, and a callee whose type id is not that prototype's oopses.
 * Where the prototype has an enum, a Rust function gets that id only from
 * bindgen's CFI encodings (rust/bindgen_parameters), which need a language
 * feature a module may not enable (Documentation/rdma-abstractions.md,
 * "kCFI"). So the operation in the table is one of these C functions, of
 * the exact prototype, which calls the driver's Rust function through a
 * pointer of the Rust function's own type (the enums as u32). Each Rust
 * device starts with the head below, whose table holds the driver's
 * functions. In tree the encodings apply and none of this exists.
 */
#ifndef RUST_COMPAT_RDMA_H
#define RUST_COMPAT_RDMA_H

#include "../bindings/rdma.h"

struct rust_rdma_enum_ops {
	u32 (*get_link_layer)(struct ib_device *ibdev, u32 port_num);
	int (*modify_comp_cntr)(struct ib_comp_cntr *cc, u32 entry, u32 op,
				u64 value);
};

struct rust_rdma_device_head {
	struct ib_device ib;
	const struct rust_rdma_enum_ops *enum_ops;
};

enum rdma_link_layer rust_rdma_get_link_layer(struct ib_device *ibdev,
					      u32 port_num);
int rust_rdma_modify_comp_cntr(struct ib_comp_cntr *cc,
			       enum ib_comp_cntr_entry entry,
			       enum ib_comp_cntr_modify_op op, u64 value);

#endif
