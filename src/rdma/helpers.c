// SPDX-License-Identifier: GPL-2.0
/* C shims for the RDMA abstractions; see helpers.h. */

#include <linux/dma-mapping.h>
#include <linux/mm.h>
#include <linux/stddef.h>
#include <linux/utsname.h>
#include <linux/version.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/iter.h>
#include <rdma/uverbs_ioctl.h>

#include "helpers.h"

size_t refa_sizeof_ib_device(void)
{
	return sizeof(struct ib_device);
}

size_t refa_offsetof_ib_device_ops(void)
{
	return offsetof(struct ib_device, ops);
}

const char *refa_init_utsname_release(void)
{
	return init_utsname()->release;
}

const char *refa_init_utsname_version(void)
{
	return init_utsname()->version;
}

u32 refa_linux_version_code(void)
{
	return LINUX_VERSION_CODE;
}

pgprot_t refa_pgprot_noncached(pgprot_t prot)
{
	return pgprot_noncached(prot);
}

pgprot_t refa_pgprot_writecombine(pgprot_t prot)
{
	return pgprot_writecombine(prot);
}

struct page *refa_virt_to_page(const void *addr)
{
	return virt_to_page(addr);
}

void *refa_alloc_pages_exact(size_t size, gfp_t gfp)
{
	return alloc_pages_exact(size, gfp);
}

dma_addr_t refa_dma_map_single(struct device *dev, void *addr, size_t size,
			       enum dma_data_direction dir)
{
	return dma_map_single(dev, addr, size, dir);
}

void refa_dma_unmap_single(struct device *dev, dma_addr_t addr, size_t size,
			   enum dma_data_direction dir)
{
	dma_unmap_single(dev, addr, size, dir);
}

int refa_dma_mapping_error(struct device *dev, dma_addr_t addr)
{
	return dma_mapping_error(dev, addr);
}

struct ib_ucontext *refa_attrs_ucontext(struct uverbs_attr_bundle *attrs)
{
	return attrs->context;
}

struct ib_udata *refa_attrs_driver_udata(struct uverbs_attr_bundle *attrs)
{
	return &attrs->driver_udata;
}

struct ib_ucontext *refa_udata_ucontext(struct ib_udata *udata)
{
	return rdma_udata_to_uverbs_attr_bundle(udata)->context;
}

void refa_ib_device_get(struct ib_device *dev)
{
	get_device(&dev->dev);
}

void refa_ib_device_put(struct ib_device *dev)
{
	put_device(&dev->dev);
}

struct ib_umem *refa_ib_umem_get_va(struct ib_device *dev, unsigned long addr,
				    size_t size, int access)
{
	return ib_umem_get_va(dev, addr, size, access);
}

size_t refa_ib_umem_num_dma_blocks(struct ib_umem *umem, unsigned long pgsz)
{
	return ib_umem_num_dma_blocks(umem, pgsz);
}

bool refa_ib_umem_is_contiguous(struct ib_umem *umem)
{
	return ib_umem_is_contiguous(umem);
}

dma_addr_t refa_ib_umem_start_dma_addr(struct ib_umem *umem)
{
	return ib_umem_start_dma_addr(umem);
}

void refa_umem_block_iter_start(struct ib_block_iter *biter,
				struct ib_umem *umem, unsigned long pgsz)
{
	__rdma_umem_block_iter_start(biter, umem, pgsz);
}

bool refa_umem_block_iter_next(struct ib_block_iter *biter)
{
	return __rdma_umem_block_iter_next(biter);
}

dma_addr_t refa_block_iter_dma_address(struct ib_block_iter *biter)
{
	return rdma_block_iter_dma_address(biter);
}
