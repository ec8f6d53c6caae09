/* SPDX-License-Identifier: GPL-2.0 */
/*
 * C shims for the RDMA abstractions (src/rdma/): what Rust cannot call
 * directly because the kernel provides it as a static inline function or a
 * macro. Each is a thin forwarder; logic belongs in Rust. The definitions
 * are the first section of src/helpers.c (in tree: rust/helpers/).
 */
#ifndef RUST_HELPER_RDMA_H
#define RUST_HELPER_RDMA_H

#include <linux/dma-direction.h>
#include <linux/mm_types.h>
#include <linux/types.h>
#include <rdma/ib_verbs.h>

struct device;
struct ib_block_iter;
struct pid;
struct rdma_cgroup;
struct ib_device;
struct ib_udata;
struct ib_umem;
struct ib_ucontext;
struct ib_uverbs_file;
struct uverbs_attr_bundle;

/*
 * kCFI: the core calls each operation through a pointer to its C prototype,
 * and a callee whose type id is not that prototype's oopses. Where the
 * prototype has an enum, a Rust function cannot have that id out of tree
 * (Documentation/rdma-abstractions.md, "kCFI"), so the operation in the
 * table is one of these C functions, of the exact prototype, which calls
 * the driver's Rust function through a pointer of the Rust function's own
 * type (the enums as u32). Each Rust device starts with the head below,
 * whose table holds the driver's functions.
 */
struct ib_comp_cntr;

struct rust_rdma_enum_ops {
	u32 (*get_link_layer)(struct ib_device *ibdev, u32 port_num);
	int (*modify_comp_cntr)(struct ib_comp_cntr *cc, u32 entry, u32 op,
				u64 value);
};

struct rust_rdma_device_head {
	struct ib_device ib;
	const struct rust_rdma_enum_ops *enum_ops;
};

enum rdma_link_layer rust_helper_rdma_get_link_layer(struct ib_device *ibdev,
						     u32 port_num);
int rust_helper_rdma_modify_comp_cntr(struct ib_comp_cntr *cc,
				      enum ib_comp_cntr_entry entry,
				      enum ib_comp_cntr_modify_op op, u64 value);

/* Layout cross-check: the C compiler's view of the core's structures. */
size_t rust_helper_rdma_sizeof_ib_device(void);
size_t rust_helper_rdma_offsetof_ib_device_ops(void);

/* User mappings: page protections of an I/O mapping, a kernel page. */
pgprot_t rust_helper_rdma_pgprot_noncached(pgprot_t prot);
pgprot_t rust_helper_rdma_pgprot_writecombine(pgprot_t prot);
struct page *rust_helper_rdma_virt_to_page(const void *addr);
void *rust_helper_rdma_alloc_pages_exact(size_t size, gfp_t gfp);
/* The largest block alloc_pages_exact() can give (PAGE_SIZE << MAX_PAGE_ORDER). */
size_t rust_helper_rdma_max_pages_exact(void);

/* Streaming DMA mappings of kernel memory. */
dma_addr_t rust_helper_rdma_dma_map_single(struct device *dev, void *addr,
					   size_t size,
					   enum dma_data_direction dir);
void rust_helper_rdma_dma_unmap_single(struct device *dev, dma_addr_t addr,
				       size_t size,
				       enum dma_data_direction dir);
int rust_helper_rdma_dma_mapping_error(struct device *dev, dma_addr_t addr);

/* A uverbs attribute bundle: from its driver udata, and its fields (members
 * of a tagged struct group). */
struct uverbs_attr_bundle *rust_helper_rdma_udata_to_attrs(struct ib_udata *udata);
struct ib_udata *rust_helper_rdma_attrs_driver_udata(struct uverbs_attr_bundle *attrs);
struct ib_ucontext *rust_helper_rdma_attrs_ucontext(struct uverbs_attr_bundle *attrs);
struct ib_uverbs_file *rust_helper_rdma_attrs_ufile(struct uverbs_attr_bundle *attrs);

/* Whether a bundle is the one the core makes to destroy what is left of a
 * file's context (close, device removal: __uverbs_cleanup_ufile()), rather
 * than that of a system call. */
bool rust_helper_rdma_attrs_is_cleanup(struct uverbs_attr_bundle *attrs);

/* The rdma cgroup: one HCA object of a device charged to the calling task's
 * cgroup (*cg: which), and uncharged from it. Without CONFIG_CGROUP_RDMA
 * nothing is charged and *cg is NULL. */
int rust_helper_rdma_cg_try_charge_object(struct ib_device *dev,
					  struct rdma_cgroup **cg);
void rust_helper_rdma_cg_uncharge_object(struct ib_device *dev,
					 struct rdma_cgroup *cg);

/* A mapping fork() does not copy (VM_DONTCOPY); the mm's lock is held for
 * writing. */
void rust_helper_rdma_vma_dontcopy(struct vm_area_struct *vma);

/* The calling thread's struct pid: a reference on it, and whether it is. */
struct pid *rust_helper_rdma_current_pid_get(void);
bool rust_helper_rdma_current_pid_is(struct pid *pid);
void rust_helper_rdma_pid_put(struct pid *pid);

/* A reference on the ib_device's memory (its struct device). */
void rust_helper_rdma_ib_device_get(struct ib_device *dev);
void rust_helper_rdma_ib_device_put(struct ib_device *dev);

/* User memory: pinning a range, its DMA blocks of a page size. */
struct ib_umem *rust_helper_rdma_ib_umem_get_va(struct ib_device *dev,
						unsigned long addr, size_t size,
						int access);
size_t rust_helper_rdma_ib_umem_num_dma_blocks(struct ib_umem *umem,
					       unsigned long pgsz);
bool rust_helper_rdma_ib_umem_is_contiguous(struct ib_umem *umem);
dma_addr_t rust_helper_rdma_ib_umem_start_dma_addr(struct ib_umem *umem);
void rust_helper_rdma_umem_block_iter_start(struct ib_block_iter *biter,
					    struct ib_umem *umem,
					    unsigned long pgsz);
bool rust_helper_rdma_umem_block_iter_next(struct ib_block_iter *biter);
dma_addr_t rust_helper_rdma_block_iter_dma_address(struct ib_block_iter *biter);

#endif
