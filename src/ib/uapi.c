// SPDX-License-Identifier: GPL-2.0
/*
 * The driver's C: what can only be declared with C macros.
 */

#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>
#define UVERBS_MODULE_NAME refa
#include <rdma/uverbs_named_ioctl.h>
#include <rdma/efa-abi.h>

#include "uapi.h"

/*
 * The driver's uverbs methods and attributes: the efa uAPI (efa-abi.h),
 * for ib_device.driver_def (uapi.rs names the tree). The MR query
 * method's handler looks the MR up, typed by its attribute's declaration,
 * and refa_efa_query_mr() (objects.rs, through rdma::mr::mr_method!)
 * answers.
 */

static int UVERBS_HANDLER(EFA_IB_METHOD_MR_QUERY)(struct uverbs_attr_bundle *attrs)
{
	struct ib_mr *mr = uverbs_attr_get_obj(attrs, EFA_IB_ATTR_QUERY_MR_HANDLE);

	return refa_efa_query_mr(attrs, mr);
}

DECLARE_UVERBS_NAMED_METHOD(EFA_IB_METHOD_MR_QUERY,
			    UVERBS_ATTR_IDR(EFA_IB_ATTR_QUERY_MR_HANDLE,
					    UVERBS_OBJECT_MR,
					    UVERBS_ACCESS_READ,
					    UA_MANDATORY),
			    UVERBS_ATTR_PTR_OUT(EFA_IB_ATTR_QUERY_MR_RESP_IC_ID_VALIDITY,
						UVERBS_ATTR_TYPE(u16),
						UA_MANDATORY),
			    UVERBS_ATTR_PTR_OUT(EFA_IB_ATTR_QUERY_MR_RESP_RECV_IC_ID,
						UVERBS_ATTR_TYPE(u16),
						UA_MANDATORY),
			    UVERBS_ATTR_PTR_OUT(EFA_IB_ATTR_QUERY_MR_RESP_RDMA_READ_IC_ID,
						UVERBS_ATTR_TYPE(u16),
						UA_MANDATORY),
			    UVERBS_ATTR_PTR_OUT(EFA_IB_ATTR_QUERY_MR_RESP_RDMA_RECV_IC_ID,
						UVERBS_ATTR_TYPE(u16),
						UA_MANDATORY));

ADD_UVERBS_METHODS(refa_efa_mr,
		   UVERBS_OBJECT_MR,
		   &UVERBS_METHOD(EFA_IB_METHOD_MR_QUERY));

/* Where the device writes a completion counter's two values. */
ADD_UVERBS_ATTRIBUTES_SIMPLE(refa_efa_comp_cntr_create,
			     UVERBS_OBJECT_COMP_CNTR,
			     UVERBS_METHOD_COMP_CNTR_CREATE,
			     UVERBS_ATTR_PTR_IN(EFA_IB_ATTR_CREATE_COMP_CNTR_COMP_BUFFER,
						UVERBS_ATTR_STRUCT(struct ib_uverbs_buffer_desc,
								   length),
						UA_MANDATORY),
			     UVERBS_ATTR_PTR_IN(EFA_IB_ATTR_CREATE_COMP_CNTR_ERR_BUFFER,
						UVERBS_ATTR_STRUCT(struct ib_uverbs_buffer_desc,
								   length),
						UA_MANDATORY));

const struct uapi_definition refa_efa_uapi_defs[] = {
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_MR, &refa_efa_mr),
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_COMP_CNTR, &refa_efa_comp_cntr_create),
	{},
};
