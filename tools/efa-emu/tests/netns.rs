//! Two "hosts": two processes (this test's binary again, as
//! `netns/peer.rs`: each an efa-emu device driven by the fake driver) in two network namespaces of their
//! own, joined by a veth pair, so that the UDP fabric crosses a network
//! and no packet leaves this machine. SRD sends, an RDMA write and read
//! and UD datagrams cross it under injected loss, duplication and
//! reordering, every payload byte compared at the other end; then an
//! attacker beside the sender replays, cuts, lengthens and forges
//! datagrams, which are dropped and counted, and traffic after it is
//! delivered as before.
//!
//! Both hosts capture their packets (`--capture`); Debian's tshark with
//! the dissector (`wireshark/efa-emu.lua`) decodes every packet of the
//! sender's capture without a malformed packet or an expert warning, and
//! calls malformed just the attacker's truncated, MAC-less and oversized
//! datagrams in the receiver's; and a capture of the other transports
//! (packets of every kind between two ports of one process and over a
//! Unix socket) is decoded whole too.
//!
//! Needs root (network namespaces, veth), iproute2's `ip` and tshark; without
//! them it says so and passes, unless `EFA_EMU_NETNS=required` (as
//! tools/cargo-check sets it under make test), when it fails.

#[path = "netns/peer.rs"]
mod peer;
mod support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::Duration;

struct Peer {
    child: Child,
    tx: ChildStdin,
    /// Its stdout's lines, from a thread, so that an answer is awaited
    /// with a timeout.
    rx: Receiver<String>,
}

/// The longest a command may take (the traffic under loss takes seconds).
const PATIENCE: Duration = Duration::from_secs(120);

fn lines(out: ChildStdout) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

impl Peer {
    /// The peer program in a network namespace of its own.
    fn start(args: &[String]) -> std::io::Result<Self> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args([TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(peer::ROLE, args.join(" "))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        // SAFETY: unshare(2) is async-signal-safe and touches nothing of
        // the parent's between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::unshare(libc::CLONE_NEWNET) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let mut child = cmd.spawn()?;
        let tx = child.stdin.take().expect("piped");
        let rx = lines(child.stdout.take().expect("piped"));
        let mut p = Self { child, tx, rx };
        // libtest's lines come first.
        while p.line() != "ready" {}
        Ok(p)
    }

    fn line(&mut self) -> String {
        match self.rx.recv_timeout(PATIENCE) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => panic!("no answer from the peer in {PATIENCE:?}"),
            Err(RecvTimeoutError::Disconnected) => {
                panic!("the peer ended (its stderr is above)")
            }
        }
    }

    /// Sends a command; its answer after `ok `, or the test fails.
    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.tx, "{cmd}").expect("to the peer");
        let a = self.line();
        match a.strip_prefix("ok") {
            Some(rest) => rest.trim().to_string(),
            None if a.starts_with("info ") => a,
            None => panic!("{cmd}: {a}"),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether this machine lets us make namespaces and veth pairs.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    for (tool, arg) in [("ip", "-V"), ("tshark", "-v")] {
        match Command::new(tool).arg(arg).output() {
            Ok(o) if o.status.success() => {}
            _ => return Some(format!("no {tool} (tools/env/packages has it)")),
        }
    }
    None
}

fn stat(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

fn across_namespaces(v6: bool) {
    let dir = std::env::temp_dir().join(format!(
        "efa-netns-{}-{}",
        std::process::id(),
        if v6 { 6 } else { 4 }
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (addr_a, addr_b, net_a, net_b) = if v6 {
        (
            "[fd99::1]:4792",
            "[fd99::2]:4792",
            "fd99::1/64",
            "fd99::2/64",
        )
    } else {
        (
            "10.99.0.1:4792",
            "10.99.0.2:4792",
            "10.99.0.1/24",
            "10.99.0.2/24",
        )
    };
    let (gid_a, gid_b) = (
        "fe800000000000000201020304050a01",
        "fe800000000000000201020304050b02",
    );
    let ipv6 = |g: &str| {
        let b: Vec<u8> = (0..16)
            .map(|i| u8::from_str_radix(&g[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap())
    };
    let peers = dir.join("peers");
    std::fs::write(
        &peers,
        format!(
            "# GID ADDRESS\n{} {addr_a}\n{} {addr_b}\n",
            ipv6(gid_a),
            ipv6(gid_b)
        ),
    )
    .unwrap();
    let key = dir.join("key");
    std::fs::write(&key, format!("{}\n", "5e".repeat(32))).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let args = |gid: &str, cap: &str, faults: [u32; 3]| -> Vec<String> {
        let mut a = vec![
            gid.to_string(),
            peers.display().to_string(),
            key.display().to_string(),
            dir.join(cap).display().to_string(),
        ];
        a.extend(faults.map(|f| f.to_string()));
        a
    };
    // Loss both ways; duplicates and reordering of what reaches the
    // requester (answers: UD datagrams to b must arrive at most once).
    let mut a = Peer::start(&args(gid_a, "a.pcap", [100_000, 100_000, 100_000]))
        .expect("the first peer in a namespace of its own");
    let mut b =
        Peer::start(&args(gid_b, "b.pcap", [100_000, 0, 100_000])).expect("the second peer");
    // Each side knows the other's MAC from the start (a permanent
    // neighbour entry). Resolved at the start, it took about a second
    // (the kernel's wait before it asks again), in which the first SRD
    // request went unanswered, and beside a compiler longer than the
    // 1.3 s after which a peer is dead: before, a request was probed 11
    // times in each of 8 runs, and 1 run in 6 failed with
    // LocalErrorUnrespRemote; after, 4 probes at most.
    let (mac_a, mac_b) = ("02:00:00:00:99:0a", "02:00:00:00:99:0b");
    let veth = Command::new("ip")
        .args(["link", "add", "efa-a", "address", mac_a, "netns"])
        .arg(a.child.id().to_string())
        .args([
            "type", "veth", "peer", "name", "efa-b", "address", mac_b, "netns",
        ])
        .arg(b.child.id().to_string())
        .status()
        .unwrap();
    assert!(veth.success(), "ip link add ... type veth");
    // The IP address of "ADDRESS:PORT" (IPv6 in brackets).
    let host = |a: &str| {
        a.rsplit_once(':')
            .unwrap()
            .0
            .trim_matches(['[', ']'])
            .to_string()
    };
    for (p, dev, net, other, mac) in [
        (&mut a, "efa-a", net_a, host(addr_b), mac_b),
        (&mut b, "efa-b", net_b, host(addr_a), mac_a),
    ] {
        p.ask("ip link set lo up");
        let nodad = if v6 { " nodad" } else { "" };
        p.ask(&format!("ip addr add {net} dev {dev}{nodad}"));
        p.ask(&format!("ip link set {dev} up"));
        p.ask(&format!(
            "ip neigh replace {other} lladdr {mac} dev {dev} nud permanent"
        ));
    }
    let _ = a.ask("info");
    let info = b.ask("info");
    let w: Vec<&str> = info.split_whitespace().collect();
    let (srd_qpn, ud_qpn, rkey, iova) = (w[1], w[2], w[3], w[4]);
    const N: u32 = 200;
    const M: u32 = 100;
    b.ask(&format!("post {N} {M}"));
    let retrans: u64 = a
        .ask(&format!(
            "send {gid_b} {srd_qpn} {ud_qpn} {rkey} {iova} {N} {M}"
        ))
        .parse()
        .unwrap();
    let ud: u32 = b.ask(&format!("check {N} {M}")).parse().unwrap();
    assert!(retrans > 0, "loss was recovered from by retransmission");
    assert!(
        ud > M / 2 && ud < M,
        "{ud} of {M} UD datagrams under 10% loss"
    );
    let before = b.ask("stats");
    assert_eq!(stat(&before, "fabric_rejected"), 0, "{before}");
    assert!(stat(&before, "accepted") > u64::from(N + M), "{before}");

    let sent: u64 = a.ask(&format!("attack {addr_b}")).parse().unwrap();
    assert_eq!(sent, 9);
    let after = b.ask("stats");
    let count = |n| stat(&after, n);
    assert_eq!(
        (
            count("replay"),
            count("truncated"),
            count("bad_mac"),
            count("oversized")
        ),
        (5, 1, 2, 1),
        "{after}"
    );
    assert_eq!(count("fabric_rejected"), 9, "{after}");
    assert_eq!(
        count("accepted"),
        stat(&before, "accepted"),
        "nothing of the attacker's was delivered: {after}"
    );
    // And the fabric carries on: SRD to fresh receives, every byte checked.
    b.ask("post 20 0");
    a.ask(&format!(
        "send {gid_b} {srd_qpn} {ud_qpn} {rkey} {iova} 20 0"
    ));
    b.ask("check 20 0");
    drop(a);
    drop(b);
    // The requester's capture (what it sent, what it was answered), all
    // of it decoded; the responder's has the attacker's datagrams, which
    // the dissector must call malformed.
    let (frames, kinds, bad, _) = tshark(&dir.join("a.pcap"));
    assert!(frames > N + M, "{frames} frames");
    assert_eq!(
        kinds.len(),
        frames as usize,
        "every frame decoded: {kinds:?}"
    );
    assert_eq!(bad, 0, "no malformed packet, no expert warning");
    let count = |k: &str| kinds.iter().filter(|&x| x == k).count() as u32;
    assert!(
        count("2") >= N + 20 && count("1") == M,
        "sends and UD: {kinds:?}"
    );
    assert!(count("3") >= 32 && count("4") >= 32 && count("5") > 0);
    let (_, _, bad, _) = tshark(&dir.join("b.pcap"));
    // The forged one is well formed (the dissector has no key to check
    // its MAC); the replays are copies of good ones.
    assert_eq!(bad, 3, "the truncated, MAC-less and oversized datagrams");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs tshark with the dissector over `pcap`: the number of frames, the
/// packet kind of each frame decoded, how many frames have expert
/// information (malformed or otherwise), and how many descriptors of
/// offered memory it decoded. Wireshark runs no Lua as root
/// (it counts root as elevated privileges), so as root tshark runs as
/// nobody, over copies it can read.
fn tshark(pcap: &Path) -> (u32, Vec<String>, u32, u32) {
    use std::os::unix::process::CommandExt as _;
    let lua = Path::new(env!("CARGO_MANIFEST_DIR")).join("wireshark/efa-emu.lua");
    let dir = pcap.parent().expect("the test's directory");
    let copy = |from: &Path, name: &str| {
        let to = dir.join(name);
        std::fs::copy(from, &to).expect("a copy for tshark");
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o644)).unwrap();
        to
    };
    let name = pcap.file_name().unwrap().to_string_lossy();
    let (pcap, lua) = (
        copy(pcap, &format!("tshark-{name}")),
        copy(&lua, "efa-emu.lua"),
    );
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |fields: &[&str], filter: Option<&str>| -> Vec<String> {
        let mut c = Command::new("tshark");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            c.uid(65534).gid(65534).env("HOME", dir);
        }
        c.arg("-n").arg("-r").arg(&pcap);
        c.arg("-X").arg(format!("lua_script:{}", lua.display()));
        if let Some(f) = filter {
            c.args(["-Y", f]);
        }
        c.args(["-T", "fields"]);
        for f in fields {
            c.args(["-e", f]);
        }
        let o = c.output().expect("tshark (Debian's, in the tree)");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "tshark: {err}");
        assert!(!err.contains("Lua"), "the dissector failed: {err}");
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(String::from)
            .collect()
    };
    let frames = run(&["frame.number"], None).len() as u32;
    let kinds = run(&["efaf.kind"], Some("efaf.kind"));
    let bad = run(&["frame.number"], Some("_ws.expert || _ws.malformed")).len() as u32;
    let descs = run(&["efaf.desc.len"], Some("efaf.form == 1"))
        .iter()
        .map(|l| l.split(',').count() as u32)
        .sum();
    (frames, kinds, bad, descs)
}

const TEST: &str = "srd_and_ud_between_two_network_namespaces_over_authenticated_udp";

/// A capture of the other transports: packets of every kind handed
/// between two ports of one fabric and over Unix sockets to another
/// fabric, the payloads of four as descriptors of offered memory
/// (packet version 3's second form), and packets of versions 1 and 2,
/// all decoded.
fn unix_and_local_capture(dir: &Path) {
    use efa_emu::device::fabric::capture::{Direction, Via};
    use efa_emu::device::fabric::share::Desc;
    use efa_emu::device::fabric::{Body, Capture, Fabric, Heard, NetFaults, Packet, Port, Remote};
    use efa_emu::health::Health;
    let pcap = dir.join("unix.pcap");
    let cap = std::sync::Arc::new(Capture::create(&pcap).unwrap());
    let sockets = dir.join("sockets");
    let one = Fabric::new(
        Remote::Unix(sockets.clone()),
        Health::new(),
        Some(cap.clone()),
    )
    .unwrap();
    let two = Fabric::with_dir(&sockets, Health::new()).unwrap();
    let gid = |n| [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, n];
    let ports: Vec<_> = [(&one, 1), (&one, 2), (&two, 3)]
        .into_iter()
        .map(|(f, n)| {
            let p = Port::new(gid(n), NetFaults::default(), Health::new());
            f.attach(&p).unwrap();
            p
        })
        .collect();
    let data: efa_emu::device::fabric::Data = vec![0x5a; 300].into();
    let bodies = [
        Body::Ud {
            qkey: 1,
            imm: Some(2),
            data: data.clone(),
        },
        Body::Send {
            seq: 1,
            qkey: 1,
            imm: None,
            data: data.clone(),
        },
        Body::Write {
            seq: 2,
            qkey: 1,
            rkey: 9,
            addr: 0x7000_0000_0000,
            imm: Some(3),
            total: 300,
            last: true,
            data: data.clone(),
        },
        Body::Read {
            seq: 3,
            qkey: 1,
            rkey: 9,
            addr: 0x7000_0000_0000,
            len: 300,
            last: true,
        },
        Body::Resp {
            seq: 3,
            status: 0,
            data,
        },
        Body::Probe { seq: 4 },
        Body::Heard {
            seq: 4,
            what: Heard::Answered,
            status: 0,
        },
        Body::RespRun {
            first: 5 << 8,
            step: 1 << 8,
            count: 64,
            status: 0,
        },
    ];
    for to in [2, 3] {
        for body in &bodies {
            assert!(one.send(Packet {
                src_gid: gid(1),
                dst_gid: gid(to),
                src_qpn: 3,
                dst_qpn: 4,
                body: body.clone(),
            }));
        }
    }
    let t = std::time::Instant::now();
    while ports[2]
        .take_due(std::time::Instant::now(), usize::MAX)
        .0
        .is_empty()
    {
        assert!(t.elapsed() < PATIENCE, "nothing over the Unix socket");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The kinds with a payload, as descriptors: what a process sends a
    // peer that accepted its memory (recorded by hand: the fabrics here
    // have no guest memory to offer).
    let desc = |offset, len| Desc {
        region: 1,
        offset,
        len,
        slot: 2,
        gen: 3,
    };
    let descs = [desc(0x1000, 100), desc(0x3000, 200)];
    let packet = |body: &Body| Packet {
        src_gid: gid(1),
        dst_gid: gid(3),
        src_qpn: 3,
        dst_qpn: 4,
        body: body.clone(),
    };
    for p in bodies.iter().map(packet).filter(|p| p.data().is_some()) {
        let mut b = Vec::new();
        p.encode_described(&mut b, &descs);
        cap.record(Direction::Out, Via::Unix, None, &b);
    }
    // Versions 1 and 2: no form byte (a UD's data at 51), and a probe
    // (version 2 only).
    let ud = packet(&bodies[0]).encode();
    for version in [1, 2] {
        let mut old = [&ud[..51], &ud[52..]].concat();
        old[4] = version;
        cap.record(Direction::Out, Via::Unix, None, &old);
    }
    let mut probe = packet(&bodies[5]).encode();
    probe[4] = 2;
    cap.record(Direction::Out, Via::Unix, None, &probe);
    drop((ports, one, two, cap));
    let (frames, kinds, bad, described) = tshark(&pcap);
    assert_eq!(frames, 23, "8 in-process, 8 over the socket, 4 + 3 by hand");
    assert_eq!(kinds.len(), 23, "every frame decoded");
    assert_eq!(bad, 0);
    assert_eq!(described, 8, "two descriptors in each of four packets");
    for (k, n) in [
        (1, 5),
        (2, 3),
        (3, 3),
        (4, 2),
        (5, 3),
        (6, 3),
        (7, 2),
        (8, 2),
    ] {
        let got = kinds.iter().filter(|x| **x == k.to_string()).count();
        assert_eq!(got, n, "kind {k}: {kinds:?}");
    }
}

#[test]
fn srd_and_ud_between_two_network_namespaces_over_authenticated_udp() {
    if let Ok(role) = std::env::var(peer::ROLE) {
        peer::main(&role);
    }
    if let Some(why) = unavailable() {
        assert_ne!(
            std::env::var("EFA_EMU_NETNS").as_deref(),
            Ok("required"),
            "network namespaces are required here, and unavailable: {why}"
        );
        eprintln!("skipped: {why}");
        return;
    }
    across_namespaces(false);
    across_namespaces(true);
    let dir = std::env::temp_dir().join(format!("efa-netns-{}-unix", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    unix_and_local_capture(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}
