# SPDX-License-Identifier: GPL-2.0
"""Every kind of verbs object created and destroyed on each EFA device
through rdma-core's efa provider (pyverbs), twice (objects come and go,
handles get reused): contexts (ALLOC_UAR), PDs, CQs (with and without a
completion channel), MRs of several sizes, UD and SRD QPs taken to RTS
and queried, address handles. Reads the port counters (GET_STATS). No
traffic: the port counters must not move (not be 0: the data path may
have run before in the same boot). tests/vm/test_emu_control_path.py
runs it under efa.ko (efa-emu's control path) before and after the
device is rebound and recovers; it is fit for any driver.
"""

import os

import pyverbs.enums as e
import pyverbs.providers.efa.efa_enums as efa_enums
import pyverbs.providers.efa.efadv as efa
import pytest
from pyverbs.addr import AH, AHAttr, GlobalRoute
from pyverbs.cq import CQ, CompChannel
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr, QPInitAttrEx

from vmtest import QKEY


def to_rts(qp, psn):
    attr = QPAttr(port_num=1)
    attr.qkey = QKEY
    attr.pkey_index = 0
    attr.sq_psn = psn
    qp.to_rts(attr)


def port_counters(device):
    """The port's traffic counters, which come from GET_STATS. (Both
    drivers have them: a missing directory is a failure, not a reason to
    skip the check.)"""
    counters = f"/sys/class/infiniband/{device}/ports/1/hw_counters"
    assert os.path.isdir(counters), f"{device} has no port counters ({counters})"
    values = {}
    for c in ("tx_bytes", "rx_pkts", "send_wrs", "rdma_read_wrs", "rdma_write_wrs", "retrans_pkts"):
        with open(f"{counters}/{c}") as f:
            values[c] = int(f.read())
    return values


def every_object(device, peers):
    """Creates and destroys one of every object on `device`, with an
    address handle for each GID of `peers`."""
    traffic = port_counters(device)
    ctx = efa.EfaContext(name=device)
    attr = ctx.query_device()
    dv = ctx.query_efa_device()
    port = ctx.query_port(1)
    gid = ctx.query_gid(1, 0)
    print(f"{device}: max_qp {attr.max_qp} max_cq {attr.max_cq} max_mr {attr.max_mr} "
          f"max_sq_wr {dv.max_sq_wr} inline {dv.inline_buf_size} caps {dv.device_caps:#x} "
          f"port state {port.state} gid {gid}")
    assert port.state == e.IBV_PORT_ACTIVE, "port not active"

    pd = PD(ctx)
    cq = CQ(ctx, 64)
    chan = CompChannel(ctx)
    ev_cq = CQ(ctx, 128, None, chan, 0)
    ev_cq.req_notify()

    access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
    # Inline page lists (<= 4 pages) and page-list buffers.
    mrs = [MR(pd, size, access) for size in (4096, 3 * 4096, 1 << 20, 8 << 20)]
    for mr in mrs:
        assert mr.lkey < 1 << 24, f"lkey {mr.lkey:#x}"

    cap = QPCap(max_send_wr=64, max_recv_wr=64, max_send_sge=1, max_recv_sge=1)
    ud = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap))
    to_rts(ud, 7)
    qattr, _ = ud.query(e.IBV_QP_STATE | e.IBV_QP_QKEY | e.IBV_QP_SQ_PSN)
    assert qattr.qp_state == e.IBV_QPS_RTS, qattr.qp_state
    assert qattr.qkey == QKEY and qattr.sq_psn == 7, (qattr.qkey, qattr.sq_psn)

    init = QPInitAttrEx(cap=cap, qp_type=e.IBV_QPT_DRIVER, scq=ev_cq, rcq=cq, pd=pd,
                        comp_mask=e.IBV_QP_INIT_ATTR_PD)
    efa_attr = efa.EfaQPInitAttr()
    efa_attr.driver_qp_type = efa_enums.EFADV_QP_DRIVER_TYPE_SRD
    srd = efa.SRDQPEx(ctx, init, efa_attr)
    to_rts(srd, 9)
    assert srd.qp_num != ud.qp_num

    # One AH per peer, and the same GID twice (the driver's AH cache).
    ahs = []
    for g in peers + [peers[0]]:
        gr = GlobalRoute(dgid=g, sgid_index=0)
        ahs.append(AH(pd, attr=AHAttr(gr=gr, is_global=1, port_num=1)))

    for obj in ahs + [srd, ud] + mrs + [ev_cq, cq, chan, pd, ctx]:
        obj.close()
    # No traffic: the port counters (GET_STATS) did not move.
    assert port_counters(device) == traffic, "port counters moved without traffic"


@pytest.mark.parametrize("round_", [1, 2], ids=["round-1", "round-2"])
def test_every_object_created_and_destroyed(device, peers, round_):
    every_object(device, peers)
