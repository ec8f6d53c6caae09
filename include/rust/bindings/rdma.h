/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The headers of the RDMA core the Rust abstractions (src/rdma/) are bound
 * to: in tree, these lines join rust/bindings/bindings_helper.h. Out of
 * tree, bindgen reads them through rust/compat/rdma.h (see Kbuild), keeping
 * declarations from these files only, with the types they need.
 */
#include <linux/cgroup_rdma.h>
#include <rdma/ib_verbs.h>
#include <rdma/ib_umem.h>
#include <rdma/iter.h>
#include <rdma/uverbs_ioctl.h>
