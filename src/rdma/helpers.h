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
struct ib_block_iter;
struct ib_device;
struct ib_udata;
struct ib_umem;
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
/* The largest block alloc_pages_exact() can give (PAGE_SIZE << MAX_PAGE_ORDER). */
size_t refa_max_pages_exact(void);

/* Streaming DMA mappings of kernel memory. */
dma_addr_t refa_dma_map_single(struct device *dev, void *addr, size_t size,
			       enum dma_data_direction dir);
void refa_dma_unmap_single(struct device *dev, dma_addr_t addr, size_t size,
			   enum dma_data_direction dir);
int refa_dma_mapping_error(struct device *dev, dma_addr_t addr);

/* Fields of a uverbs attribute bundle (members of a tagged struct group). */
struct ib_ucontext *refa_attrs_ucontext(struct uverbs_attr_bundle *attrs);
struct ib_udata *refa_attrs_driver_udata(struct uverbs_attr_bundle *attrs);
/* The context of a user call, from its driver udata. */
struct ib_ucontext *refa_udata_ucontext(struct ib_udata *udata);

/* A reference on the ib_device's memory (its struct device). */
void refa_ib_device_get(struct ib_device *dev);
void refa_ib_device_put(struct ib_device *dev);

/* User memory: pinning a range, its DMA blocks of a page size. */
struct ib_umem *refa_ib_umem_get_va(struct ib_device *dev, unsigned long addr,
				    size_t size, int access);
size_t refa_ib_umem_num_dma_blocks(struct ib_umem *umem, unsigned long pgsz);
bool refa_ib_umem_is_contiguous(struct ib_umem *umem);
dma_addr_t refa_ib_umem_start_dma_addr(struct ib_umem *umem);
void refa_umem_block_iter_start(struct ib_block_iter *biter,
				struct ib_umem *umem, unsigned long pgsz);
bool refa_umem_block_iter_next(struct ib_block_iter *biter);
dma_addr_t refa_block_iter_dma_address(struct ib_block_iter *biter);

/*
 * The efa uAPI's driver methods and attributes (efa-abi.h) for
 * ib_device.driver_def: the MR query method, and the buffer attributes of
 * completion counter creation. The MR query's handler looks up the MR and
 * copies the answer out; refa_rdma_mr_query(), defined in Rust
 * (src/rdma/mr.rs), answers.
 */
struct ib_mr;
struct uapi_definition;

struct refa_mr_ic_ids {
	u16 validity; /* EFA_QUERY_MR_VALIDITY_* */
	u16 recv_ic_id;
	u16 rdma_read_ic_id;
	u16 rdma_recv_ic_id;
};

extern const struct uapi_definition refa_efa_uapi_defs[];
int refa_rdma_mr_query(struct ib_mr *mr, struct refa_mr_ic_ids *ids);

#endif
