/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The EFA uAPI the driver speaks: in tree, this line joins
 * rust/uapi/uapi_helper.h. Out of tree, bindgen reads it for the driver
 * (see Kbuild), keeping declarations from efa-abi.h only.
 */
#include <uapi/rdma/efa-abi.h>
