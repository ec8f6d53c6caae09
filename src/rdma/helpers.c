// SPDX-License-Identifier: GPL-2.0
/*
 * What the RDMA abstractions (src/rdma/) call that the kernel provides as a
 * static inline function or a macro. In tree this file is
 * rust/helpers/rdma.c and follows its convention: each helper is named
 * rust_helper_<the C name>, and the bindings call it by the C name.
 */

#include <linux/dma-mapping.h>
#include <linux/mm.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <rdma/ib_umem.h>
#include <rdma/iter.h>
#include <rdma/uverbs_ioctl.h>

/* Defined by rust/helpers/helpers.c, which this file is part of in tree. */
#ifndef __rust_helper
#define __rust_helper
#endif

__rust_helper pgprot_t rust_helper_pgprot_noncached(pgprot_t prot)
{
	return pgprot_noncached(prot);
}

/* A function on x86, a macro elsewhere. */
__rust_helper pgprot_t rust_helper_pgprot_writecombine(pgprot_t prot)
{
	return pgprot_writecombine(prot);
}

__rust_helper struct page *rust_helper_virt_to_page(const void *addr)
{
	return virt_to_page(addr);
}

__rust_helper void *rust_helper_alloc_pages_exact(size_t size, gfp_t gfp)
{
	return alloc_pages_exact(size, gfp);
}

__rust_helper dma_addr_t rust_helper_dma_map_single(struct device *dev, void *addr, size_t size,
						    enum dma_data_direction dir)
{
	return dma_map_single(dev, addr, size, dir);
}

__rust_helper void rust_helper_dma_unmap_single(struct device *dev, dma_addr_t addr, size_t size,
						enum dma_data_direction dir)
{
	dma_unmap_single(dev, addr, size, dir);
}

__rust_helper int rust_helper_dma_mapping_error(struct device *dev, dma_addr_t addr)
{
	return dma_mapping_error(dev, addr);
}

__rust_helper struct uverbs_attr_bundle *
rust_helper_rdma_udata_to_uverbs_attr_bundle(struct ib_udata *udata)
{
	return rdma_udata_to_uverbs_attr_bundle(udata);
}

__rust_helper void rust_helper_vm_flags_set(struct vm_area_struct *vma, vm_flags_t flags)
{
	vm_flags_set(vma, flags);
}

__rust_helper struct pid *rust_helper_task_pid(struct task_struct *task)
{
	return task_pid(task);
}

__rust_helper struct pid *rust_helper_get_pid(struct pid *pid)
{
	return get_pid(pid);
}

__rust_helper struct ib_umem *rust_helper_ib_umem_get_va(struct ib_device *device,
							 unsigned long addr, size_t size,
							 int access)
{
	return ib_umem_get_va(device, addr, size, access);
}

__rust_helper size_t rust_helper_ib_umem_num_dma_blocks(struct ib_umem *umem, unsigned long pgsz)
{
	return ib_umem_num_dma_blocks(umem, pgsz);
}

__rust_helper bool rust_helper_ib_umem_is_contiguous(struct ib_umem *umem)
{
	return ib_umem_is_contiguous(umem);
}

__rust_helper dma_addr_t rust_helper_ib_umem_start_dma_addr(struct ib_umem *umem)
{
	return ib_umem_start_dma_addr(umem);
}

__rust_helper void rust_helper___rdma_umem_block_iter_start(struct ib_block_iter *biter,
							    struct ib_umem *umem,
							    unsigned long pgsz)
{
	__rdma_umem_block_iter_start(biter, umem, pgsz);
}

__rust_helper bool rust_helper___rdma_umem_block_iter_next(struct ib_block_iter *biter)
{
	return __rdma_umem_block_iter_next(biter);
}

__rust_helper dma_addr_t rust_helper_rdma_block_iter_dma_address(struct ib_block_iter *biter)
{
	return rdma_block_iter_dma_address(biter);
}
