/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Headers of the RDMA core, turned into Rust bindings for the abstractions
 * at build time (see Kbuild). Only declarations from these files are kept;
 * the types they depend on come along.
 */
#include <linux/cgroup_rdma.h>
#include <rdma/ib_verbs.h>
#include <rdma/ib_umem.h>
#include <rdma/iter.h>
#include <rdma/uverbs_ioctl.h>

#include "cfi.h"
