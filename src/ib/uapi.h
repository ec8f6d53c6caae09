/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the driver's C (uapi.c) and its Rust share: the uverbs tree the
 * device points to, and the Rust function that answers the MR query.
 */
#ifndef REFA_IB_UAPI_H
#define REFA_IB_UAPI_H

struct ib_mr;
struct uapi_definition;
struct uverbs_attr_bundle;

extern const struct uapi_definition refa_efa_uapi_defs[];
int refa_efa_query_mr(struct uverbs_attr_bundle *attrs, struct ib_mr *mr);

#endif
