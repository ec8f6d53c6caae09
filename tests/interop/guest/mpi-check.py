#!/usr/bin/env python3
"""Two MPI ranks exchange data and check every byte (run by guest/mpi
under mpirun): point-to-point of 0 B to 4 MiB both ways (eager and
rendezvous paths of the MTL), tag matching with wildcards and out of
order tags, non-blocking exchanges, Bcast, Allreduce, Gather and Alltoall.
Prints "mpi-check: N checks passed" on rank 0; exits 1 on a mismatch."""
import sys
from array import array

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 2, f"needs two ranks, has {size}"
peer = 1 - rank
checks = 0


def pattern(n, seed):
    # Period 251 (prime): data landing at a wrong offset of any power-of-two
    # or page-sized step shows.
    period = bytes((seed * 131 + i * 7) & 0xFF for i in range(251))
    return bytearray((period * (n // 251 + 1))[:n])


def expect(what, got, want):
    global checks
    if got != want:
        first = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), None)
        print(f"mpi-check: rank {rank}: {what}: mismatch (lengths {len(got)}/{len(want)}, "
              f"first differing byte {first})", flush=True)
        comm.Abort(1)
    checks += 1


# --quick: up to 256 KiB (the guest runs under TCG: Python is slow there).
quick = "--quick" in sys.argv
sizes = [0, 1, 7, 64, 1000, 4096, 8192, 8193, 65536, 262144] + ([] if quick else [1 << 20, 4 << 20])
for n in sizes:
    for direction in (0, 1):
        seed = n % 251 + direction
        if rank == direction:
            comm.Send([pattern(n, seed), MPI.BYTE], dest=peer, tag=n % 1000)
        else:
            buf = bytearray(n)
            st = MPI.Status()
            comm.Recv([buf, MPI.BYTE], source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
            expect(f"Send/Recv {n} B", buf, pattern(n, seed))
            if st.Get_source() != peer or st.Get_tag() != n % 1000 or st.Get_count(MPI.BYTE) != n:
                print(f"mpi-check: status of {n} B: source {st.Get_source()} tag {st.Get_tag()} "
                      f"count {st.Get_count(MPI.BYTE)}", flush=True)
                comm.Abort(1)

# Tags out of order: the receiver matches them in the opposite order.
tags = list(range(1, 9))
if rank == 0:
    reqs = [comm.Isend([pattern(3000 + t, t), MPI.BYTE], dest=1, tag=t) for t in tags]
    MPI.Request.Waitall(reqs)
else:
    for t in reversed(tags):
        buf = bytearray(3000 + t)
        comm.Recv([buf, MPI.BYTE], source=0, tag=t)
        expect(f"tag {t}", buf, pattern(3000 + t, t))

# Simultaneous non-blocking exchange of large messages.
n = (256 << 10) if quick else (2 << 20)
out, inn = pattern(n, 60 + rank), bytearray(n)
MPI.Request.Waitall([comm.Isend([out, MPI.BYTE], dest=peer, tag=77),
                     comm.Irecv([inn, MPI.BYTE], source=peer, tag=77)])
expect(f"Isend/Irecv {n} B", inn, pattern(n, 60 + peer))

# Collectives.
b = pattern(100000, 9) if rank == 0 else bytearray(100000)
comm.Bcast([b, MPI.BYTE], root=0)
expect("Bcast 100000 B", b, pattern(100000, 9))
vals = array("q", [rank * 1000 + i for i in range(50000)])
res = array("q", [0] * 50000)
comm.Allreduce([vals, MPI.INT64_T], [res, MPI.INT64_T], op=MPI.SUM)
expect("Allreduce", res, array("q", [1000 + 2 * i for i in range(50000)]))
g = comm.gather(("rank", rank, list(range(rank * 10))), root=0)
if rank == 0:
    expect("gather", g, [("rank", 0, []), ("rank", 1, list(range(10)))])
a = comm.alltoall([bytes([rank, d]) * 5000 for d in range(2)])
expect("alltoall", a, [bytes([s, rank]) * 5000 for s in range(2)])

comm.Barrier()
total = comm.reduce(checks, op=MPI.SUM, root=0)
if rank == 0:
    print(f"mpi-check: {total} checks passed", flush=True)
