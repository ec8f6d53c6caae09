// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * rdma-core's newer efa provider paths (rdma-core 65's libefa), each moving
 * data between two EFA devices of one machine with payload checks:
 *
 *   64bit-req-id     efadv_create_qp_ex SRD QPs whose send queue carries
 *                    64-bit request ids (EFADV_WQ_CAPS_64_BIT_REQ_ID):
 *                    wr_ids with all 64 bits used come back unchanged
 *   query-qp-wqs     efadv_query_qp_wqs: both work queues' rings, entry
 *                    sizes, depths, doorbells, batch sizes
 *   query-cq         efadv_query_cq: a new CQ's ring is described (buffer,
 *                    entries, entry size) and zeroed, and the CQ carries
 *                    traffic both ways (which sub-CQ a queue uses is the
 *                    device's choice, so the ring is not compared)
 *   sl               a QP created with a service level moves data
 *   unsolicited-write-recv
 *                    RDMA write with immediate into a QP created with
 *                    EFADV_QP_FLAGS_UNSOLICITED_WRITE_RECV: a completion
 *                    without a posted receive, efadv_wc_is_unsolicited()
 *   inline-write     EFADV_QP_FLAGS_INLINE_WRITE: RDMA writes whose data is
 *                    in the WQE (ibv_wr_set_inline_data)
 *   comp-cntr        efadv_create_comp_cntr (counter values in memory the
 *                    test gives), ibv_qp_attach_comp_cntr on both sides:
 *                    sends, receives, RDMA writes counted
 *
 * Prints "interop-result: efadv NAME pass|fail|skip [reason]" per path.
 * Built at test time inside the unstable tree against its headers
 * (tests/interop/build-efadv); exits 1 when a path failed.
 *
 *   efadv-paths DEV0 DEV1
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/efadv.h>
#include <infiniband/verbs.h>

#define QKEY 0x11111111u
#define BUF_SIZE (64 * 1024)
#define SEND_OFF 0
#define RECV_OFF (16 * 1024)
#define RDMA_OFF (32 * 1024)
#define MSG 1024
#define DEPTH 32

static int failures;
static char why[512];

static int fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return -1;
}

static void report(const char *name, int rc)
{
	if (rc == 0) {
		printf("interop-result: efadv %s pass\n", name);
	} else if (rc > 0) {
		printf("interop-result: efadv %s skip %s\n", name, why);
	} else {
		printf("interop-result: efadv %s fail %s\n", name, why);
		failures++;
	}
	fflush(stdout);
}

struct dev {
	const char *name;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct efadv_device_attr attr;
	union ibv_gid gid;
	uint8_t *buf;
	struct ibv_mr *mr;
};

struct side {
	struct dev *dev;
	struct ibv_cq_ex *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	struct ibv_ah *ah; /* to the peer */
	uint32_t peer_qpn;
	uint32_t peer_rkey;
	uint64_t peer_addr;
};

static struct dev devs[2];

static int open_dev(struct dev *d, const char *name)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	int i, err;

	if (!list)
		return fail("ibv_get_device_list: %s", strerror(errno));
	for (i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			break;
	if (!list[i]) {
		ibv_free_device_list(list);
		return fail("no device %s", name);
	}
	d->name = name;
	d->ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!d->ctx)
		return fail("ibv_open_device(%s): %s", name, strerror(errno));
	err = efadv_query_device(d->ctx, &d->attr, sizeof(d->attr));
	if (err)
		return fail("efadv_query_device(%s): %s", name, strerror(err));
	if (ibv_query_gid(d->ctx, 1, 0, &d->gid))
		return fail("ibv_query_gid(%s): %s", name, strerror(errno));
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd)
		return fail("ibv_alloc_pd(%s): %s", name, strerror(errno));
	d->buf = aligned_alloc(4096, BUF_SIZE);
	if (!d->buf)
		return fail("out of memory");
	memset(d->buf, 0, BUF_SIZE);
	d->mr = ibv_reg_mr(d->pd, d->buf, BUF_SIZE,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ);
	if (!d->mr)
		return fail("ibv_reg_mr(%s): %s", name, strerror(errno));
	return 0;
}

/* An SRD QP with its own CQ on DEV, created through efadv_create_qp_ex. */
static int make_side(struct side *s, struct dev *d, uint16_t efa_flags, uint8_t sl,
		     uint32_t max_inline)
{
	struct ibv_cq_init_attr_ex cq_attr = {
		.cqe = 4 * DEPTH,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM |
			    IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP,
	};
	struct efadv_cq_init_attr efa_cq = {
		.wc_flags = EFADV_WC_EX_WITH_IS_UNSOLICITED,
	};
	struct ibv_qp_init_attr_ex qp_attr = {
		.qp_type = IBV_QPT_DRIVER,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM,
		.cap = { .max_send_wr = DEPTH, .max_recv_wr = DEPTH,
			 .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = max_inline },
	};
	struct efadv_qp_init_attr efa_qp = {
		.driver_qp_type = EFADV_QP_DRIVER_TYPE_SRD,
		.flags = efa_flags,
		.sl = sl,
	};
	struct ibv_qp_attr a;

	memset(s, 0, sizeof(*s));
	s->dev = d;
	if (d->attr.device_caps & EFADV_DEVICE_ATTR_CAPS_RDMA_READ)
		qp_attr.send_ops_flags |= IBV_QP_EX_WITH_RDMA_READ;
	if (d->attr.device_caps & EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE)
		qp_attr.send_ops_flags |= IBV_QP_EX_WITH_RDMA_WRITE |
					  IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
	s->cq = efadv_create_cq(d->ctx, &cq_attr, &efa_cq, sizeof(efa_cq));
	if (!s->cq)
		return fail("efadv_create_cq(%s): %s", d->name, strerror(errno));
	qp_attr.pd = d->pd;
	qp_attr.send_cq = ibv_cq_ex_to_cq(s->cq);
	qp_attr.recv_cq = ibv_cq_ex_to_cq(s->cq);
	s->qp = efadv_create_qp_ex(d->ctx, &qp_attr, &efa_qp, sizeof(efa_qp));
	if (!s->qp)
		return fail("efadv_create_qp_ex(%s, flags %#x, sl %u, inline %u): %s", d->name,
			    efa_flags, sl, max_inline, strerror(errno));
	s->qpx = ibv_qp_to_qp_ex(s->qp);

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = 1;
	a.qkey = QKEY;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		return fail("modify_qp INIT(%s): %s", d->name, strerror(errno));
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE))
		return fail("modify_qp RTR(%s): %s", d->name, strerror(errno));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	a.rnr_retry = 7;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RNR_RETRY))
		return fail("modify_qp RTS(%s): %s", d->name, strerror(errno));
	return 0;
}

static int connect_sides(struct side *s, struct side *peer)
{
	struct ibv_ah_attr ah = {
		.is_global = 1,
		.port_num = 1,
		.grh = { .dgid = peer->dev->gid },
	};

	s->ah = ibv_create_ah(s->dev->pd, &ah);
	if (!s->ah)
		return fail("ibv_create_ah(%s): %s", s->dev->name, strerror(errno));
	s->peer_qpn = peer->qp->qp_num;
	s->peer_rkey = peer->dev->mr->rkey;
	s->peer_addr = (uintptr_t)peer->dev->buf;
	return 0;
}

static void free_side(struct side *s)
{
	if (s->ah)
		ibv_destroy_ah(s->ah);
	if (s->qp)
		ibv_destroy_qp(s->qp);
	if (s->cq)
		ibv_destroy_cq(ibv_cq_ex_to_cq(s->cq));
	memset(s, 0, sizeof(*s));
}

/* How a test's two SRD QPs are created; all zero: plain QPs. */
struct pair_cfg {
	uint16_t flags_a, flags_b;
	uint8_t sl;
	uint32_t max_inline;
};

typedef int pair_test(struct side *a, struct side *b, void *arg);

/*
 * Runs TEST on two fresh connected sides, a on device 0 and b on device 1,
 * and destroys them whatever TEST returned: a failed path leaves nothing
 * behind for the next one.
 */
static int on_pair(const struct pair_cfg *cfg, pair_test *test, void *arg)
{
	struct side a = {}, b = {};
	int rc = -1;

	if (!make_side(&a, &devs[0], cfg->flags_a, cfg->sl, cfg->max_inline) &&
	    !make_side(&b, &devs[1], cfg->flags_b, cfg->sl, cfg->max_inline) &&
	    !connect_sides(&a, &b) && !connect_sides(&b, &a))
		rc = test(&a, &b, arg);
	free_side(&a);
	free_side(&b);
	return rc;
}

static const struct pair_cfg plain_pair;

struct comp {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len;
	uint32_t imm;
	bool unsolicited;
};

/* Polls one completion, for at most 20 s (the guest runs under TCG). */
static int poll_one(struct side *s, struct comp *c)
{
	struct ibv_poll_cq_attr pa = {};
	struct efadv_cq *ecq = efadv_cq_from_ibv_cq_ex(s->cq);
	time_t end = time(NULL) + 20;
	int rc;

	for (;;) {
		rc = ibv_start_poll(s->cq, &pa);
		if (rc == 0)
			break;
		if (rc != ENOENT)
			return fail("ibv_start_poll(%s): %s", s->dev->name, strerror(rc));
		if (time(NULL) > end)
			return fail("no completion on %s within 20 s", s->dev->name);
		usleep(100);
	}
	c->wr_id = s->cq->wr_id;
	c->status = s->cq->status;
	c->opcode = ibv_wc_read_opcode(s->cq);
	c->byte_len = ibv_wc_read_byte_len(s->cq);
	c->imm = be32toh(ibv_wc_read_imm_data(s->cq));
	c->unsolicited = ecq && efadv_wc_is_unsolicited(ecq);
	ibv_end_poll(s->cq);
	if (c->status != IBV_WC_SUCCESS)
		return fail("completion on %s: status %s (%d), wr_id %#" PRIx64, s->dev->name,
			    ibv_wc_status_str(c->status), c->status, c->wr_id);
	return 0;
}

static void pattern(uint8_t *p, size_t len, unsigned int seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 8));
}

static int check_pattern(const uint8_t *p, size_t len, unsigned int seed, const char *what)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != (uint8_t)(seed * 131 + i * 7 + (i >> 8)))
			return fail("%s: byte %zu is %#x, expected %#x", what, i, p[i],
				    (uint8_t)(seed * 131 + i * 7 + (i >> 8)));
	return 0;
}

static int post_recv(struct side *s, unsigned int i, uint64_t wr_id)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)s->dev->buf + RECV_OFF + i * MSG,
		.length = MSG,
		.lkey = s->dev->mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	int err = ibv_post_recv(s->qp, &wr, &bad);

	return err ? fail("ibv_post_recv(%s): %s", s->dev->name, strerror(err)) : 0;
}

/* N messages a -> b with the given send wr_ids; checks completions and payloads. */
static int send_msgs(struct side *a, struct side *b, unsigned int n, uint64_t id_base)
{
	struct comp c;
	bool seen[DEPTH] = {}, seen_recv[DEPTH] = {};
	unsigned int i;
	int err;

	memset(b->dev->buf + RECV_OFF, 0, n * MSG);
	for (i = 0; i < n; i++)
		if (post_recv(b, i, 0x5555000000000000ull | i))
			return -1;
	ibv_wr_start(a->qpx);
	for (i = 0; i < n; i++) {
		uint8_t *p = a->dev->buf + SEND_OFF + i * MSG;

		pattern(p, MSG, i + 1);
		a->qpx->wr_id = id_base + i;
		a->qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(a->qpx);
		ibv_wr_set_ud_addr(a->qpx, a->ah, a->peer_qpn, QKEY);
		ibv_wr_set_sge(a->qpx, a->dev->mr->lkey, (uintptr_t)p, MSG);
	}
	err = ibv_wr_complete(a->qpx);
	if (err)
		return fail("ibv_wr_complete(%s): %s", a->dev->name, strerror(err));
	for (i = 0; i < n; i++) {
		if (poll_one(a, &c))
			return -1;
		if (c.opcode != IBV_WC_SEND)
			return fail("send completion opcode %d", c.opcode);
		if (c.wr_id - id_base >= n || seen[c.wr_id - id_base])
			return fail("send completion wr_id %#" PRIx64 ", posted %#" PRIx64 "..+%u",
				    c.wr_id, id_base, n - 1);
		seen[c.wr_id - id_base] = true;
	}
	for (i = 0; i < n; i++) {
		if (poll_one(b, &c))
			return -1;
		if (c.opcode != IBV_WC_RECV || c.byte_len != MSG)
			return fail("receive completion opcode %d, %u bytes", c.opcode, c.byte_len);
		if ((c.wr_id & ~0xffull) != 0x5555000000000000ull || (c.wr_id & 0xff) >= n ||
		    seen_recv[c.wr_id & 0xff])
			return fail("receive completion wr_id %#" PRIx64 ", posted 0x5555000000000000..+%u",
				    c.wr_id, n - 1);
		seen_recv[c.wr_id & 0xff] = true;
	}
	for (i = 0; i < n; i++)
		if (check_pattern(b->dev->buf + RECV_OFF + i * MSG, MSG, i + 1, "received message"))
			return -1;
	return 0;
}

static int wq_ok(const struct efadv_wq_attr *w, const char *what, uint32_t depth)
{
	if (!w->buffer)
		return fail("%s: no ring buffer", what);
	if (!w->doorbell)
		return fail("%s: no doorbell", what);
	if (w->num_entries < depth)
		return fail("%s: %u entries, asked for %u", what, w->num_entries, depth);
	if (w->entry_size != 16 && w->entry_size != 64 && w->entry_size != 128)
		return fail("%s: entry size %u", what, w->entry_size);
	if (!w->max_batch)
		return fail("%s: max_batch 0", what);
	return 0;
}

static int t_64bit_req_id(struct side *a, struct side *b, void *arg)
{
	struct efadv_wq_attr sq = {}, rq = {};
	int err;

	err = efadv_query_qp_wqs(a->qp, &sq, &rq, sizeof(sq));
	if (err)
		return fail("efadv_query_qp_wqs: %s", strerror(err));
	if (!(sq.caps & EFADV_WQ_CAPS_64_BIT_REQ_ID))
		return fail("the send queue does not carry 64-bit request ids (no EFADV_WQ_CAPS_64_BIT_REQ_ID)"),
		       1;
	/* All 64 bits used; then ids differing only above bit 15/31/47. */
	if (send_msgs(a, b, 8, 0xfedcba9876543210ull & ~0xfull) ||
	    send_msgs(a, b, 4, 0x8000000000000000ull) || send_msgs(a, b, 4, 0x0001000000000000ull) ||
	    send_msgs(b, a, 4, 0xffffffffffff0000ull))
		return -1;
	return 0;
}

static int t_query_qp_wqs(struct side *a, struct side *b, void *arg)
{
	struct efadv_wq_attr sq = {}, rq = {};
	int err;

	err = efadv_query_qp_wqs(b->qp, &sq, &rq, sizeof(sq));
	if (err)
		return fail("efadv_query_qp_wqs: %s", strerror(err));
	if (wq_ok(&sq, "send queue", DEPTH) || wq_ok(&rq, "receive queue", DEPTH))
		return -1;
	if (rq.entry_size != 16)
		return fail("receive queue entries of %u bytes", rq.entry_size);
	/* The rings and doorbells are those the QP uses: traffic both ways. */
	if (send_msgs(a, b, DEPTH / 2, 1000) || send_msgs(b, a, DEPTH / 2, 2000))
		return -1;
	printf("interop: efadv_query_qp_wqs: sq %u x %u bytes, batch %u, caps %#x; rq %u x %u bytes\n",
	       sq.num_entries, sq.entry_size, sq.max_batch, sq.caps, rq.num_entries, rq.entry_size);
	return 0;
}

static size_t nonzero_bytes(const struct efadv_cq_attr *ca)
{
	size_t n = 0;

	for (size_t i = 0; i < (size_t)ca->num_entries * ca->entry_size; i++)
		n += ca->buffer[i] != 0;
	return n;
}

static int t_query_cq(struct side *a, struct side *b, void *arg)
{
	struct efadv_cq_attr ca = {};
	size_t nonzero;
	int err;

	err = efadv_query_cq(ibv_cq_ex_to_cq(b->cq), &ca, sizeof(ca));
	if (err)
		return fail("efadv_query_cq: %s", strerror(err));
	if (!ca.buffer || ca.num_entries < 4 * DEPTH || !ca.entry_size)
		return fail("efadv_query_cq: buffer %p, %u entries of %u bytes", ca.buffer,
			    ca.num_entries, ca.entry_size);
	nonzero = nonzero_bytes(&ca);
	if (nonzero)
		return fail("a new CQ's ring has %zu non-zero bytes", nonzero);
	/*
	 * The ring is one sub-CQ per queue of the device's choice
	 * (send_sub_cq_idx, recv_sub_cq_idx); efadv_query_cq describes the
	 * first num_entries entries, which neither queue need use (efa.ko and
	 * refa alike). So: the CQ described is the one that works, and the
	 * ring stays readable through traffic.
	 */
	if (send_msgs(a, b, 4, 0) || send_msgs(b, a, 4, 0))
		return -1;
	printf("interop: efadv_query_cq: %u entries of %u bytes, doorbell %p, %zu bytes set after traffic\n",
	       ca.num_entries, ca.entry_size, (void *)ca.doorbell, nonzero_bytes(&ca));
	return 0;
}

static int t_sl(struct side *a, struct side *b, void *arg)
{
	return send_msgs(a, b, 8, 0x100) || send_msgs(b, a, 8, 0x200) ? -1 : 0;
}

static int rdma_write(struct side *a, uint64_t wr_id, unsigned int off, uint32_t len, bool imm,
		      uint32_t imm_data, const void *inline_data)
{
	struct comp c;
	int err;

	ibv_wr_start(a->qpx);
	a->qpx->wr_id = wr_id;
	a->qpx->wr_flags = IBV_SEND_SIGNALED | (inline_data ? IBV_SEND_INLINE : 0);
	if (imm)
		ibv_wr_rdma_write_imm(a->qpx, a->peer_rkey, a->peer_addr + RDMA_OFF + off,
				      htobe32(imm_data));
	else
		ibv_wr_rdma_write(a->qpx, a->peer_rkey, a->peer_addr + RDMA_OFF + off);
	ibv_wr_set_ud_addr(a->qpx, a->ah, a->peer_qpn, QKEY);
	if (inline_data)
		ibv_wr_set_inline_data(a->qpx, (void *)inline_data, len);
	else
		ibv_wr_set_sge(a->qpx, a->dev->mr->lkey, (uintptr_t)a->dev->buf + SEND_OFF + off, len);
	err = ibv_wr_complete(a->qpx);
	if (err)
		return fail("ibv_wr_complete(rdma write%s%s): %s", imm ? " with imm" : "",
			    inline_data ? ", inline" : "", strerror(err));
	if (poll_one(a, &c))
		return -1;
	if (c.opcode != IBV_WC_RDMA_WRITE || c.wr_id != wr_id)
		return fail("RDMA write completion: opcode %d wr_id %#" PRIx64, c.opcode, c.wr_id);
	return 0;
}

static int t_unsolicited(struct side *a, struct side *b, void *arg)
{
	struct comp c;

	for (unsigned int i = 0; i < 8; i++) {
		uint32_t len = 64 << (i % 6);

		pattern(a->dev->buf + SEND_OFF + i * MSG, len, 40 + i);
		memset(b->dev->buf + RDMA_OFF + i * MSG, 0, MSG);
		/* No receive posted on b. */
		if (rdma_write(a, 0xabcd000000000000ull + i, i * MSG, len, true, 0xc0de0000 + i, NULL) ||
		    poll_one(b, &c))
			return -1;
		if (c.opcode != IBV_WC_RECV_RDMA_WITH_IMM || c.imm != 0xc0de0000 + i ||
		    !c.unsolicited)
			return fail("write with immediate %u: opcode %d, imm %#x, unsolicited %d", i,
				    c.opcode, c.imm, c.unsolicited);
		if (check_pattern(b->dev->buf + RDMA_OFF + i * MSG, len, 40 + i, "written data"))
			return -1;
	}
	/* A solicited receive on the same QP still works. */
	return send_msgs(a, b, 4, 0x700);
}

static int t_inline_write(struct side *a, struct side *b, void *arg)
{
	const uint32_t max_inline = *(const uint32_t *)arg;
	uint8_t data[256];

	for (unsigned int i = 0; i < 8; i++) {
		uint32_t len = i == 7 ? max_inline : 1 + (i * 37) % max_inline;

		pattern(data, len, 90 + i);
		memset(b->dev->buf + RDMA_OFF + i * MSG, 0, MSG);
		if (rdma_write(a, 0x1234567800000000ull + i, i * MSG, len, false, 0, data))
			return -1;
		/* The data has landed when the write completed (SRD: acknowledged). */
		if (check_pattern(b->dev->buf + RDMA_OFF + i * MSG, len, 90 + i, "inline-written data"))
			return -1;
		if (b->dev->buf[RDMA_OFF + i * MSG + len] != 0)
			return fail("inline write of %u bytes wrote past its end", len);
	}
	/* A plain (SGE) write on the inline-write QP, and messages. */
	pattern(a->dev->buf + SEND_OFF, MSG, 77);
	if (rdma_write(a, 42, 0, MSG, false, 0, NULL) ||
	    check_pattern(b->dev->buf + RDMA_OFF, MSG, 77, "written data") || send_msgs(a, b, 4, 0))
		return -1;
	printf("interop: inline RDMA writes of 1..%u bytes\n", max_inline);
	return 0;
}

struct cntrs {
	struct ibv_comp_cntr_caps caps;
	struct ibv_comp_cntr *a, *b;
	uint64_t *mem; /* a's values: completions at mem[0], errors at mem[8] */
	bool rdma_write;
};

/* The pair attaches the counters and moves data; the counters outlive its QPs. */
static int t_comp_cntr_traffic(struct side *a, struct side *b, void *arg)
{
	struct cntrs *k = arg;
	uint32_t writes = k->rdma_write ? IBV_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE : 0;
	uint32_t remote_writes = k->rdma_write ? IBV_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE : 0;
	uint32_t ops_a = IBV_QP_ATTACH_COMP_CNTR_OP_SEND | writes;
	uint32_t ops_b = IBV_QP_ATTACH_COMP_CNTR_OP_RECV | remote_writes;
	struct ibv_qp_attach_comp_cntr_attr at = { .op_mask = ops_a };
	uint64_t want_a = 6 + (writes ? 3 : 0), want_b = 6 + (remote_writes ? 3 : 0);
	uint64_t va = 0, ea = 0, vb = 0, eb = 0;
	time_t end;
	int err;

	err = ibv_qp_attach_comp_cntr(a->qp, k->a, &at);
	if (!err) {
		at.op_mask = ops_b;
		err = ibv_qp_attach_comp_cntr(b->qp, k->b, &at);
	}
	if (err)
		return fail("ibv_qp_attach_comp_cntr (ops %#x/%#x of %#x): %s", ops_a, ops_b,
			    k->caps.supported_qp_attach_ops, strerror(err));
	if (send_msgs(a, b, 6, 0x10))
		return -1;
	pattern(a->dev->buf + SEND_OFF, MSG, 5);
	for (unsigned int i = 0; writes && i < 3; i++)
		if (rdma_write(a, 0x20 + i, 0, MSG, false, 0, NULL))
			return -1;
	if (writes && check_pattern(b->dev->buf + RDMA_OFF, MSG, 5, "written data"))
		return -1;
	/*
	 * Counters are written by the device after the completion: wait as
	 * long as for a completion (poll_one), the guest runs under TCG.
	 */
	end = time(NULL) + 20;
	for (;;) {
		err = ibv_read_comp_cntr(k->a, &va);
		if (!err)
			err = ibv_read_comp_cntr(k->b, &vb);
		if (err)
			return fail("ibv_read_comp_cntr: %s", strerror(err));
		if ((va >= want_a && vb >= want_b) || time(NULL) > end)
			break;
		usleep(1000);
	}
	err = ibv_read_err_comp_cntr(k->a, &ea);
	if (!err)
		err = ibv_read_err_comp_cntr(k->b, &eb);
	if (err)
		return fail("ibv_read_err_comp_cntr: %s", strerror(err));
	if (va != want_a || vb != want_b || ea || eb)
		return fail("counters: sender %" PRIu64 " (want %" PRIu64 ") err %" PRIu64
			    ", receiver %" PRIu64 " (want %" PRIu64 ") err %" PRIu64,
			    va, want_a, ea, vb, want_b, eb);
	if (k->mem[0] != va || k->mem[8] != ea)
		return fail("the sender's counters read %" PRIu64 "/%" PRIu64 ", its memory holds %" PRIu64
			    "/%" PRIu64, va, ea, k->mem[0], k->mem[8]);
	printf("interop: completion counters: sender %" PRIu64 ", receiver %" PRIu64
	       " (attach ops %#x / %#x of %#x)\n",
	       va, vb, ops_a, ops_b, k->caps.supported_qp_attach_ops);
	return 0;
}

static int t_comp_cntr(void)
{
	struct cntrs k = {
		.rdma_write = devs[0].attr.device_caps & EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE,
	};
	struct ibv_comp_cntr_init_attr ia = { .type = IBV_COMP_CNTR_TYPE_WRS };
	struct efadv_comp_cntr_init_attr ext = { .flags = 0 };
	/* What a device with RDMA write must count (libfabric's efa provider relies on it). */
	uint32_t need = IBV_QP_ATTACH_COMP_CNTR_OP_SEND | IBV_QP_ATTACH_COMP_CNTR_OP_RECV |
			(k.rdma_write ? IBV_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE |
						IBV_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE :
					0);
	int rc = -1, err;

	if (!(devs[0].attr.device_caps & EFADV_DEVICE_ATTR_CAPS_COMP_CNTR))
		return fail("the device offers no completion counters"), 1;
	k.mem = aligned_alloc(4096, 4096);
	if (!k.mem)
		return fail("out of memory");
	memset(k.mem, 0xff, 4096);
	err = ibv_query_comp_cntr_caps(devs[0].ctx, &k.caps);
	if (err) {
		fail("ibv_query_comp_cntr_caps: %s", strerror(err));
		goto out;
	}
	if ((k.caps.supported_qp_attach_ops & need) != need) {
		fail("supported_qp_attach_ops %#x lacks %#x", k.caps.supported_qp_attach_ops,
		     need & ~k.caps.supported_qp_attach_ops);
		goto out;
	}
	/* a's counter in memory the test gives, b's where libefa wants. */
	ext.flags = EFADV_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM |
		    EFADV_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM;
	ext.comp_cntr_ext_mem.ptr = (uint8_t *)&k.mem[0];
	ext.comp_cntr_ext_mem.type = EFADV_MEMORY_LOCATION_VA;
	ext.err_cntr_ext_mem.ptr = (uint8_t *)&k.mem[8];
	ext.err_cntr_ext_mem.type = EFADV_MEMORY_LOCATION_VA;
	k.a = efadv_create_comp_cntr(devs[0].ctx, &ia, &ext, sizeof(ext));
	if (!k.a) {
		fail("efadv_create_comp_cntr (external memory): %s", strerror(errno));
		goto out;
	}
	ext.flags = 0;
	k.b = efadv_create_comp_cntr(devs[1].ctx, &ia, &ext, sizeof(ext));
	if (!k.b) {
		fail("efadv_create_comp_cntr: %s", strerror(errno));
		goto out;
	}
	if (k.mem[0] != 0 || k.mem[8] != 0) {
		fail("a new counter's values in memory are %#" PRIx64 " / %#" PRIx64, k.mem[0], k.mem[8]);
		goto out;
	}
	rc = on_pair(&plain_pair, t_comp_cntr_traffic, &k);
out:
	if (k.a)
		ibv_destroy_comp_cntr(k.a);
	if (k.b)
		ibv_destroy_comp_cntr(k.b);
	free(k.mem);
	return rc;
}

/* The paths a device must offer before its test runs: else a skip with the reason. */
static int offers(uint32_t caps, const char *what)
{
	return (devs[0].attr.device_caps & caps) == caps ? 0 : (fail("the device offers no %s", what), 1);
}

int main(int argc, char **argv)
{
	uint32_t inline_max;

	if (argc != 3) {
		fprintf(stderr, "usage: efadv-paths DEV0 DEV1\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (open_dev(&devs[0], argv[1]) || open_dev(&devs[1], argv[2])) {
		report("open", -1);
		return 1;
	}
	printf("interop: %s: device_caps %#x, inline_buf_size %u, max_rdma_size %u\n", argv[1],
	       devs[0].attr.device_caps, devs[0].attr.inline_buf_size, devs[0].attr.max_rdma_size);
	/* Inline writes up to the device's limit, at most t_inline_write's buffer. */
	inline_max = devs[0].attr.inline_buf_size < 256 ? devs[0].attr.inline_buf_size : 256;
	report("64bit-req-id", on_pair(&plain_pair, t_64bit_req_id, NULL));
	report("query-qp-wqs", on_pair(&plain_pair, t_query_qp_wqs, NULL));
	report("query-cq", on_pair(&plain_pair, t_query_cq, NULL));
	report("sl", on_pair(&(struct pair_cfg){ .sl = 8 }, t_sl, NULL));
	if (offers(EFADV_DEVICE_ATTR_CAPS_UNSOLICITED_WRITE_RECV | EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE,
		   "unsolicited write receive"))
		report("unsolicited-write-recv", 1);
	else
		report("unsolicited-write-recv",
		       on_pair(&(struct pair_cfg){ .flags_b = EFADV_QP_FLAGS_UNSOLICITED_WRITE_RECV },
			       t_unsolicited, NULL));
	if (offers(EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE, "RDMA write")) {
		report("inline-write", 1);
	} else if (inline_max < 8) {
		report("inline-write", fail("inline_buf_size %u", devs[0].attr.inline_buf_size));
	} else {
		struct pair_cfg cfg = { .flags_a = EFADV_QP_FLAGS_INLINE_WRITE,
					.flags_b = EFADV_QP_FLAGS_INLINE_WRITE,
					.max_inline = inline_max };

		report("inline-write", on_pair(&cfg, t_inline_write, &inline_max));
	}
	report("comp-cntr", t_comp_cntr());
	for (int i = 0; i < 2; i++) {
		ibv_dereg_mr(devs[i].mr);
		ibv_dealloc_pd(devs[i].pd);
		ibv_close_device(devs[i].ctx);
	}
	return failures ? 1 : 0;
}
