/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The EFA uAPI, turned into Rust bindings for the driver at build time (see
 * Kbuild). Only declarations from efa-abi.h are kept.
 */
#include <rdma/efa-abi.h>
