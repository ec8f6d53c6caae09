// SPDX-License-Identifier: GPL-2.0
/*
 * The crate's C: what Rust cannot call directly because the kernel provides
 * it as a static inline function or a macro, and what can only be declared
 * with C macros. Three sections, each belonging to one part of the crate.
 */

#include <linux/cgroup_rdma.h>
#include <linux/cpumask.h>
#include <linux/dma-mapping.h>
#include <linux/interrupt.h>
#include <linux/mm.h>
#include <linux/pci.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/stddef.h>
#include <linux/utsname.h>
#include <linux/version.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/iter.h>
#include <rdma/uverbs_ioctl.h>
#define UVERBS_MODULE_NAME refa
#include <rdma/uverbs_named_ioctl.h>
#include <rdma/efa-abi.h>

#include "helpers.h"

/*
 * 1. The RDMA abstractions (src/rdma/, declared in src/rdma/helpers.h): in
 * tree, rust/helpers/rdma.c.
 */

static const struct rust_rdma_enum_ops *rust_rdma_enum_ops(struct ib_device *ibdev)
{
	return container_of(ibdev, struct rust_rdma_device_head, ib)->enum_ops;
}

enum rdma_link_layer rust_helper_rdma_get_link_layer(struct ib_device *ibdev,
						     u32 port_num)
{
	return rust_rdma_enum_ops(ibdev)->get_link_layer(ibdev, port_num);
}

int rust_helper_rdma_modify_comp_cntr(struct ib_comp_cntr *cc,
				      enum ib_comp_cntr_entry entry,
				      enum ib_comp_cntr_modify_op op, u64 value)
{
	return rust_rdma_enum_ops(cc->device)->modify_comp_cntr(cc, entry, op, value);
}

size_t rust_helper_rdma_sizeof_ib_device(void)
{
	return sizeof(struct ib_device);
}

size_t rust_helper_rdma_offsetof_ib_device_ops(void)
{
	return offsetof(struct ib_device, ops);
}

pgprot_t rust_helper_rdma_pgprot_noncached(pgprot_t prot)
{
	return pgprot_noncached(prot);
}

pgprot_t rust_helper_rdma_pgprot_writecombine(pgprot_t prot)
{
	return pgprot_writecombine(prot);
}

struct page *rust_helper_rdma_virt_to_page(const void *addr)
{
	return virt_to_page(addr);
}

void *rust_helper_rdma_alloc_pages_exact(size_t size, gfp_t gfp)
{
	return alloc_pages_exact(size, gfp);
}

size_t rust_helper_rdma_max_pages_exact(void)
{
	return PAGE_SIZE << MAX_PAGE_ORDER;
}

dma_addr_t rust_helper_rdma_dma_map_single(struct device *dev, void *addr, size_t size,
			       enum dma_data_direction dir)
{
	return dma_map_single(dev, addr, size, dir);
}

void rust_helper_rdma_dma_unmap_single(struct device *dev, dma_addr_t addr, size_t size,
			   enum dma_data_direction dir)
{
	dma_unmap_single(dev, addr, size, dir);
}

int rust_helper_rdma_dma_mapping_error(struct device *dev, dma_addr_t addr)
{
	return dma_mapping_error(dev, addr);
}

struct uverbs_attr_bundle *rust_helper_rdma_udata_to_attrs(struct ib_udata *udata)
{
	return rdma_udata_to_uverbs_attr_bundle(udata);
}

struct ib_ucontext *rust_helper_rdma_attrs_ucontext(struct uverbs_attr_bundle *attrs)
{
	return attrs->context;
}

struct ib_uverbs_file *rust_helper_rdma_attrs_ufile(struct uverbs_attr_bundle *attrs)
{
	return attrs->ufile;
}

struct ib_udata *rust_helper_rdma_attrs_driver_udata(struct uverbs_attr_bundle *attrs)
{
	return &attrs->driver_udata;
}

bool rust_helper_rdma_attrs_is_cleanup(struct uverbs_attr_bundle *attrs)
{
	/*
	 * __uverbs_cleanup_ufile() destroys with a bundle that names only the
	 * file (and the object's context): no method, no core request. Every
	 * bundle of a system call has one of the two: an ioctl() its method,
	 * a write() its command's request, which is never empty.
	 */
	return !attrs->method_elm && !attrs->ucore.inlen && !attrs->ucore.outlen;
}

int rust_helper_rdma_cg_try_charge_object(struct ib_device *dev, struct rdma_cgroup **cg)
{
#ifdef CONFIG_CGROUP_RDMA
	return rdmacg_try_charge(cg, &dev->cg_device, RDMACG_RESOURCE_HCA_OBJECT);
#else
	*cg = NULL;
	return 0;
#endif
}

void rust_helper_rdma_cg_uncharge_object(struct ib_device *dev, struct rdma_cgroup *cg)
{
#ifdef CONFIG_CGROUP_RDMA
	rdmacg_uncharge(cg, &dev->cg_device, RDMACG_RESOURCE_HCA_OBJECT);
#endif
}

void rust_helper_rdma_vma_dontcopy(struct vm_area_struct *vma)
{
	vm_flags_set(vma, VM_DONTCOPY);
}

struct pid *rust_helper_rdma_current_pid_get(void)
{
	return get_pid(task_pid(current));
}

bool rust_helper_rdma_current_pid_is(struct pid *pid)
{
	return task_pid(current) == pid;
}

void rust_helper_rdma_pid_put(struct pid *pid)
{
	put_pid(pid);
}

void rust_helper_rdma_ib_device_get(struct ib_device *dev)
{
	get_device(&dev->dev);
}

void rust_helper_rdma_ib_device_put(struct ib_device *dev)
{
	put_device(&dev->dev);
}

struct ib_umem *rust_helper_rdma_ib_umem_get_va(struct ib_device *dev, unsigned long addr,
				    size_t size, int access)
{
	return ib_umem_get_va(dev, addr, size, access);
}

size_t rust_helper_rdma_ib_umem_num_dma_blocks(struct ib_umem *umem, unsigned long pgsz)
{
	return ib_umem_num_dma_blocks(umem, pgsz);
}

bool rust_helper_rdma_ib_umem_is_contiguous(struct ib_umem *umem)
{
	return ib_umem_is_contiguous(umem);
}

dma_addr_t rust_helper_rdma_ib_umem_start_dma_addr(struct ib_umem *umem)
{
	return ib_umem_start_dma_addr(umem);
}

void rust_helper_rdma_umem_block_iter_start(struct ib_block_iter *biter,
				struct ib_umem *umem, unsigned long pgsz)
{
	__rdma_umem_block_iter_start(biter, umem, pgsz);
}

bool rust_helper_rdma_umem_block_iter_next(struct ib_block_iter *biter)
{
	return __rdma_umem_block_iter_next(biter);
}

dma_addr_t rust_helper_rdma_block_iter_dma_address(struct ib_block_iter *biter)
{
	return rdma_block_iter_dma_address(biter);
}

/*
 * 2. Kernel gaps (src/kernel_gaps/, declared there).
 */

/* uts::kernel_version() */
const char *refa_init_utsname_release(void);
const char *refa_init_utsname_release(void)
{
	return init_utsname()->release;
}

const char *refa_init_utsname_version(void);
const char *refa_init_utsname_version(void)
{
	return init_utsname()->version;
}

u32 refa_linux_version_code(void);
u32 refa_linux_version_code(void)
{
	return LINUX_VERSION_CODE;
}

/*
 * kernel_gaps::pci::dma_set_no_seg_boundary(): dma_set_seg_boundary() is a
 * static inline function.
 */
void refa_dma_set_seg_boundary(struct pci_dev *pdev, unsigned long mask);
void refa_dma_set_seg_boundary(struct pci_dev *pdev, unsigned long mask)
{
	dma_set_seg_boundary(&pdev->dev, mask);
}

/*
 * kernel_gaps::pci::Irq::spread_affinity(): irq_set_affinity_and_hint(),
 * irq_update_affinity_hint(), cpumask_of() and dev_to_node() are static
 * inline functions and macros. The hint points to cpumask_of()'s static
 * mask, which outlives it.
 */
unsigned int refa_irq_spread_affinity(unsigned int irq, struct pci_dev *pdev, unsigned int index);
unsigned int refa_irq_spread_affinity(unsigned int irq, struct pci_dev *pdev, unsigned int index)
{
	unsigned int cpu = cpumask_local_spread(index, dev_to_node(&pdev->dev));

	/* A failure only leaves the interrupt where it was, as in efa.ko. */
	irq_set_affinity_and_hint(irq, cpumask_of(cpu));
	return cpu;
}

void refa_irq_clear_affinity_hint(unsigned int irq);
void refa_irq_clear_affinity_hint(unsigned int irq)
{
	irq_update_affinity_hint(irq, NULL);
}

/*
 * 3. The driver's uverbs methods and attributes: the efa uAPI (efa-abi.h),
 * for ib_device.driver_def (src/ib/uapi.rs names the tree). The MR query
 * method's handler looks the MR up, typed by its attribute's declaration,
 * and refa_efa_query_mr() (src/ib/objects.rs, through rdma::mr::mr_method!)
 * answers.
 */

extern const struct uapi_definition refa_efa_uapi_defs[];
int refa_efa_query_mr(struct uverbs_attr_bundle *attrs, struct ib_mr *mr);

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
