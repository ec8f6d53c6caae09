//! Writes the seed corpus of the fuzz targets into DIR/<target>/: inputs
//! made the way the model's own tests drive it (the fake driver of
//! `tests/support`), so that the fuzzer starts from commands, WQEs,
//! packets and messages that get deep into the model. Generated, not
//! checked in: `tools/fuzz/emu` runs this before fuzzing.
//!
//!   gen-corpus DIR

#[path = "../fuzz_targets/common.rs"]
mod common;
#[path = "../../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

use std::fs;
use std::path::{Path, PathBuf};

use efa_emu::device::fabric::share::Desc;
use efa_emu::device::fabric::{Body, Packet};
#[allow(dead_code)]
#[path = "../fuzz_targets/bodies.rs"]
mod bodies;
use efa_hw::admin::*;
use efa_hw::io::SendOpType;
use efa_hw::wire::Wire;
use support::dp::{rdma_wqe, send_wqe};
use support::Fake;

fn put(dir: &Path, name: &str, bytes: &[u8]) {
    fs::write(dir.join(name), bytes).expect("write a seed");
}

/// The admin entries `scenario` sent, as the admin target's input.
fn recorded(scenario: impl FnOnce(&mut Fake)) -> Vec<u8> {
    let mut f = common::fake();
    let start = f.pc;
    scenario(&mut f);
    let mut out = Vec::new();
    for i in start..f.pc {
        let slot = u64::from(i % f.depth);
        let e = f.ram.get(f.aq + slot * f.esize as u64, f.esize);
        let (opcode, flags) = (e[2], e[3] & !1);
        // The payload after the common descriptor (4 bytes in 64-byte
        // entries, 16 in 128-byte ones), cut to what an input record holds.
        let off = if f.esize == AqEntryV2::SIZE {
            AqEntryV2::PAYLOAD_OFFSET
        } else {
            4
        };
        let mut rec = vec![opcode, flags];
        rec.extend_from_slice(&e[off..off + 62]);
        out.extend_from_slice(&rec);
    }
    out
}

fn admin(dir: &Path) {
    for id in 1..=12u8 {
        put(
            dir,
            &format!("get-feature-{id}"),
            &recorded(|f| {
                let _ = f.get_feature(id);
            }),
        );
    }
    put(dir, "aenq", &recorded(|f| f.enable_aenq()));
    put(
        dir,
        "ud-endpoint",
        &recorded(|f| {
            let _ = common::data_path(f, false);
        }),
    );
    put(
        dir,
        "srd-endpoint",
        &recorded(|f| {
            let _ = common::data_path(f, true);
        }),
    );
    put(
        dir,
        "eq",
        &recorded(|f| {
            let _ = f.create_eq(64, 1);
        }),
    );
    put(
        dir,
        "stats",
        &recorded(|f| {
            let dp = common::data_path(f, true);
            let _ = f.stats(GetStatsType::Basic, Some(dp.ep.qpn));
        }),
    );
    put(
        dir,
        "big-mr",
        &recorded(|f| {
            let pd = f.alloc_pd().unwrap();
            let _ = f.mr(pd, 1 << 20, RegMrCmd::LOCAL_WRITE_ENABLE.mask(), 0);
        }),
    );
}

fn record(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut r = vec![kind];
    r.extend_from_slice(body);
    r.resize(65, 0);
    r
}

fn datapath(dir: &Path) {
    for srd in [false, true] {
        let mut f = common::fake();
        let dp = common::data_path(&mut f, srd);
        let qkey = dp.ep.opts.qkey;
        let qpn = dp.ep.qpn;
        let b = &dp.buf;
        let mut recv = Vec::new();
        for (i, (addr, len, key)) in [b.sge(0, 4096), b.sge(4096, 4096)].into_iter().enumerate() {
            recv.extend_from_slice(&addr.to_le_bytes());
            recv.extend_from_slice(&len.to_le_bytes());
            let mut k = key & 0xff_ffff;
            k |= u32::from(i == 0) << 24 | u32::from(i == 1) << 25;
            recv.extend_from_slice(&k.to_le_bytes());
        }
        let t = if srd { 1 } else { 0 };
        let send = send_wqe(1, dp.ah, qpn, qkey, &[b.sge(0, 64)], Some(7));
        let mut input = vec![t];
        input.extend(record(1, &recv));
        input.extend(record(0, &send));
        put(
            dir,
            &format!("send-{}", if srd { "srd" } else { "ud" }),
            &input,
        );
        if srd {
            for (op, name) in [
                (SendOpType::RdmaRead, "read"),
                (SendOpType::RdmaWrite, "write"),
            ] {
                let w = rdma_wqe(
                    op,
                    2,
                    dp.ah,
                    qpn,
                    qkey,
                    b.key,
                    b.iova,
                    b.sge(4096, 512),
                    None,
                );
                let mut input = vec![t];
                input.extend(record(0, &w));
                put(dir, &format!("rdma-{name}"), &input);
            }
        }
    }
}

fn fabric(dir: &Path) {
    let f = common::fake();
    let gid = f.dev.config().gid;
    drop(f);
    let p = |src_qpn, dst_qpn, body| Packet {
        src_gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 9, 9, 9, 9, 9, 0, 1],
        dst_gid: gid,
        src_qpn,
        dst_qpn,
        body,
    };
    let data: efa_emu::device::fabric::Data = vec![0xab; 100].into();
    let packets = [
        (
            "ud",
            p(
                3,
                1,
                Body::Ud {
                    qkey: 0x1111,
                    imm: Some(5),
                    data: data.clone(),
                },
            ),
        ),
        (
            "send",
            p(
                3,
                2,
                Body::Send {
                    seq: 1,
                    qkey: 0x1111,
                    imm: None,
                    data: data.clone(),
                },
            ),
        ),
        (
            "write",
            p(
                3,
                2,
                Body::Write {
                    seq: 2,
                    qkey: 0x1111,
                    rkey: 1,
                    addr: 0x7000_0000_0000,
                    imm: Some(1),
                    total: 100,
                    last: true,
                    data: data.clone(),
                },
            ),
        ),
        (
            "read",
            p(
                3,
                2,
                Body::Read {
                    seq: 3,
                    qkey: 0x1111,
                    rkey: 1,
                    addr: 0x7000_0000_0000,
                    len: 64,
                    last: true,
                },
            ),
        ),
        (
            "resp",
            p(
                3,
                2,
                Body::Resp {
                    seq: 1,
                    status: 0,
                    data,
                },
            ),
        ),
        ("probe", p(3, 2, Body::Probe { seq: 1 })),
        (
            "heard",
            p(
                3,
                2,
                Body::Heard {
                    seq: 1,
                    what: efa_emu::device::fabric::Heard::Queued,
                    status: 0,
                },
            ),
        ),
        (
            "resp-run",
            p(
                3,
                2,
                Body::RespRun {
                    first: 1 << 8,
                    step: 1 << 8,
                    count: 16,
                    status: 0,
                },
            ),
        ),
    ];
    for (name, packet) in &packets {
        put(dir, name, &packet.encode());
    }
    // The send again, its payload as descriptors of offered memory (two,
    // the second one page in), as a process sends one to a peer that
    // accepted its memory.
    let descs = [
        Desc {
            region: 0,
            offset: 0x1000,
            len: 60,
            slot: 0,
            gen: 1,
        },
        Desc {
            region: 0,
            offset: 0x2000,
            len: 40,
            slot: 0,
            gen: 1,
        },
    ];
    let mut b = Vec::new();
    packets[1].1.encode_described(&mut b, &descs);
    put(dir, "send-descs", &b);
}

fn vfio_message(id: u16, command: u16, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&id.to_le_bytes());
    m.extend_from_slice(&command.to_le_bytes());
    m.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(body);
    m
}

fn region_access(
    command: u16,
    id: u16,
    region: u32,
    offset: u64,
    data: &[u8],
    count: u32,
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(&region.to_le_bytes());
    b.extend_from_slice(&count.to_le_bytes());
    b.extend_from_slice(data);
    vfio_message(id, command, &b)
}

fn vfio(dir: &Path) {
    let mut version = Vec::new();
    version.extend_from_slice(&0u16.to_le_bytes());
    version.extend_from_slice(&2u16.to_le_bytes());
    version.extend_from_slice(b"{\"capabilities\":{\"max_msg_fds\":8}}\0");
    let hello = vfio_message(1, 1, &version);
    put(dir, "version", &hello);
    let mut s = hello.clone();
    s.extend(vfio_message(
        2,
        4,
        &[16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ));
    for region in [0u32, 2, 7] {
        let mut b = vec![0u8; 32];
        b[0..4].copy_from_slice(&32u32.to_le_bytes());
        b[8..12].copy_from_slice(&region.to_le_bytes());
        s.extend(vfio_message(3 + region as u16, 5, &b));
    }
    put(dir, "info", &s);
    // BAR0 register writes as a driver's bring-up makes them, then reads.
    let mut s = hello.clone();
    let regs = [
        (0x60u64, 0u32),
        (0x64, 0x1000),
        (0x54, 1),
        (0x54, 0),
        (0x5c, 0x58 << 16 | 1),
    ];
    for (i, (off, v)) in regs.into_iter().enumerate() {
        s.extend(region_access(
            10,
            10 + i as u16,
            0,
            off,
            &v.to_le_bytes(),
            4,
        ));
    }
    s.extend(region_access(9, 20, 0, 0x1000, &[], 4));
    s.extend(region_access(9, 21, 7, 0x4, &[], 4));
    put(dir, "registers", &s);
    // DMA_MAP without a descriptor, unmap all.
    let mut s = hello;
    let mut map = vec![0u8; 32];
    map[0..4].copy_from_slice(&32u32.to_le_bytes());
    map[24..32].copy_from_slice(&4096u64.to_le_bytes());
    s.extend(vfio_message(30, 2, &map));
    let mut unmap = vec![0u8; 24];
    unmap[0..4].copy_from_slice(&24u32.to_le_bytes());
    unmap[4..8].copy_from_slice(&2u32.to_le_bytes());
    s.extend(vfio_message(31, 3, &unmap));
    put(dir, "dma", &s);
}

/// Datagrams sealed as a UDP port sends them, for `bodies::udp`: one of
/// each kind of packet, a burst with numbers out of order and repeated,
/// one under another key.
fn udp(dir: &Path) {
    use efa_emu::device::fabric::auth::{seal, FabricKey};
    let key = FabricKey::new(bodies::UDP_KEY);
    let p = |body| Packet {
        src_gid: bodies::UDP_SRC,
        dst_gid: bodies::UDP_DST,
        src_qpn: 3,
        dst_qpn: 2,
        body,
    };
    let data: efa_emu::device::fabric::Data = vec![0x5a; 64].into();
    let one = |d: &mut Vec<u8>, k: &FabricKey, seq: u64, pkt: &Packet| {
        let mut s = Vec::new();
        seal(k, seq, pkt, &mut s);
        d.extend_from_slice(&(s.len() as u16).to_le_bytes());
        d.extend_from_slice(&s);
    };
    let send = p(Body::Send {
        seq: 1,
        qkey: 0x1111,
        imm: Some(7),
        data: data.clone(),
    });
    let mut d = Vec::new();
    one(&mut d, &key, 1000, &send);
    put(dir, "send", &d);
    let read = p(Body::Read {
        seq: 2,
        qkey: 0x1111,
        rkey: 1,
        addr: 0x7000_0000_0000,
        len: 64,
        last: true,
    });
    let mut d = Vec::new();
    for seq in [5, 3, 4, 3, 200, 1] {
        one(&mut d, &key, seq, &read);
    }
    put(dir, "window", &d);
    let mut d = Vec::new();
    one(&mut d, &FabricKey::new([1; 32]), 1, &send);
    one(
        &mut d,
        &key,
        9,
        &p(Body::Resp {
            seq: 1,
            status: 0,
            data,
        }),
    );
    put(dir, "keys", &d);
}

fn main() {
    let Some(dir) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: gen-corpus DIR");
        std::process::exit(2);
    };
    type Gen = fn(&Path);
    let gens: [(&str, Gen); 5] = [
        ("admin", admin),
        ("datapath", datapath),
        ("fabric", fabric),
        ("udp", udp),
        ("vfio", vfio),
    ];
    for (target, gen) in gens {
        let d = dir.join(target);
        fs::create_dir_all(&d).expect("corpus directory");
        gen(&d);
        let n = fs::read_dir(&d).map(|r| r.count()).unwrap_or(0);
        println!("gen-corpus: {target}: {n} seeds in {}", d.display());
    }
}
