/* SPDX-License-Identifier: GPL-2.0 */
/*
 * C shims for the RDMA abstractions: what Rust cannot call directly because
 * the kernel provides it as a static inline function or a macro. Keep each
 * one a thin forwarder; logic belongs in Rust.
 */
#ifndef REFA_HELPERS_H
#define REFA_HELPERS_H

#include <linux/dma-direction.h>
#include <linux/mm_types.h>
#include <linux/types.h>

struct device;
struct ib_device;
struct ib_udata;
struct ib_ucontext;
struct uverbs_attr_bundle;

/* Layout cross-check: the C compiler's view of the core's structures. */
size_t refa_sizeof_ib_device(void);
size_t refa_offsetof_ib_device_ops(void);

/* Host description for the device (SET_FEATURE HOST_INFO). */
const char *refa_init_utsname_release(void);
const char *refa_init_utsname_version(void);
u32 refa_linux_version_code(void);

/* User mappings: page protections of an I/O mapping, a kernel page. */
pgprot_t refa_pgprot_noncached(pgprot_t prot);
pgprot_t refa_pgprot_writecombine(pgprot_t prot);
struct page *refa_virt_to_page(const void *addr);
void *refa_alloc_pages_exact(size_t size, gfp_t gfp);

/* Streaming DMA mappings of kernel memory. */
dma_addr_t refa_dma_map_single(struct device *dev, void *addr, size_t size,
			       enum dma_data_direction dir);
void refa_dma_unmap_single(struct device *dev, dma_addr_t addr, size_t size,
			   enum dma_data_direction dir);
int refa_dma_mapping_error(struct device *dev, dma_addr_t addr);

/* Fields of a uverbs attribute bundle (members of a tagged struct group). */
struct ib_ucontext *refa_attrs_ucontext(struct uverbs_attr_bundle *attrs);
struct ib_udata *refa_attrs_driver_udata(struct uverbs_attr_bundle *attrs);

#endif
