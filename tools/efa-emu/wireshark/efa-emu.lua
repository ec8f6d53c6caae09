-- Wireshark dissector for efa-emu's fabric (Documentation/efa-emu.md,
-- "Packet format"): the captures efa-emu writes (--capture FILE: pcap,
-- LINKTYPE_USER0) and, heuristically, the UDP fabric's datagrams in any
-- capture (tcpdump on a real host).
--
--   tshark -X lua_script:tools/efa-emu/wireshark/efa-emu.lua -r efa0.pcap
--   wireshark -X lua_script:tools/efa-emu/wireshark/efa-emu.lua efa0.pcap
--
-- or copy it into ~/.local/lib/wireshark/plugins/. Three layers:
--   efaemu  the capture record: direction, transport, the UDP peer
--   efau    the UDP envelope: version, sequence number, MAC (not checked:
--           the key is not here)
--   efaf    the fabric packet: addresses, kind and its fields, payload
-- A packet whose lengths do not add up is marked malformed (an expert
-- error), as is anything after its end.

local rec = Proto("efaemu", "efa-emu capture record")
local env = Proto("efau", "efa-emu UDP envelope")
local pkt = Proto("efaf", "efa-emu fabric packet")

local directions = { [0] = "out", [1] = "in" }
local vias = { [0] = "in-process", [1] = "unix socket", [2] = "udp" }
local kinds = { [1] = "UD", [2] = "SRD send", [3] = "SRD write", [4] = "SRD read", [5] = "SRD response",
	[6] = "SRD probe", [7] = "SRD probe reply", [8] = "SRD responses" }
local heard = { [0] = "missing", [1] = "queued", [2] = "answered" }
local forms = { [0] = "bytes", [1] = "descriptors" }

local r_dir = ProtoField.uint8("efaemu.direction", "Direction", base.DEC, directions)
local r_via = ProtoField.uint8("efaemu.via", "Transport", base.DEC, vias)
local r_port = ProtoField.uint16("efaemu.peer_port", "Peer UDP port", base.DEC)
local r_addr = ProtoField.ipv6("efaemu.peer_addr", "Peer address (IPv4 mapped)")
rec.fields = { r_dir, r_via, r_port, r_addr }

local e_magic = ProtoField.string("efau.magic", "Magic")
local e_version = ProtoField.uint8("efau.version", "Version", base.DEC)
local e_reserved = ProtoField.bytes("efau.reserved", "Reserved")
local e_seq = ProtoField.uint64("efau.seq", "Sequence number", base.DEC)
local e_mac = ProtoField.bytes("efau.mac", "MAC (BLAKE3, keyed)")
env.fields = { e_magic, e_version, e_reserved, e_seq, e_mac }

local f = {
	magic = ProtoField.string("efaf.magic", "Magic"),
	version = ProtoField.uint8("efaf.version", "Version", base.DEC),
	kind = ProtoField.uint8("efaf.kind", "Kind", base.DEC, kinds),
	src_gid = ProtoField.ipv6("efaf.src_gid", "Source GID"),
	dst_gid = ProtoField.ipv6("efaf.dst_gid", "Destination GID"),
	src_qpn = ProtoField.uint16("efaf.src_qpn", "Source QP", base.DEC),
	dst_qpn = ProtoField.uint16("efaf.dst_qpn", "Destination QP", base.DEC),
	seq = ProtoField.uint64("efaf.seq", "SRD sequence number", base.DEC),
	qkey = ProtoField.uint32("efaf.qkey", "Q_Key", base.HEX),
	rkey = ProtoField.uint32("efaf.rkey", "Remote key", base.HEX),
	addr = ProtoField.uint64("efaf.addr", "Remote address", base.HEX),
	has_imm = ProtoField.bool("efaf.has_imm", "Has immediate"),
	imm = ProtoField.uint32("efaf.imm", "Immediate data", base.HEX),
	total = ProtoField.uint32("efaf.total", "Write length", base.DEC),
	last = ProtoField.bool("efaf.last", "Last segment"),
	len = ProtoField.uint32("efaf.len", "Read length", base.DEC),
	status = ProtoField.uint8("efaf.status", "Completion status", base.DEC),
	step = ProtoField.uint32("efaf.step", "Sequence number step", base.DEC),
	count = ProtoField.uint16("efaf.count", "Requests answered", base.DEC),
	heard = ProtoField.uint8("efaf.heard", "Request", base.DEC, heard),
	form = ProtoField.uint8("efaf.form", "Payload form", base.DEC, forms),
	data_len = ProtoField.uint32("efaf.data_len", "Payload length", base.DEC),
	data = ProtoField.bytes("efaf.data", "Payload"),
	descs = ProtoField.uint8("efaf.descs", "Descriptors", base.DEC),
	d_region = ProtoField.uint32("efaf.desc.region", "Offered region", base.DEC),
	d_offset = ProtoField.uint64("efaf.desc.offset", "Offset in the memfd", base.HEX),
	d_len = ProtoField.uint32("efaf.desc.len", "Length", base.DEC),
	d_slot = ProtoField.uint16("efaf.desc.slot", "Pin slot", base.DEC),
	d_gen = ProtoField.uint32("efaf.desc.gen", "Pin generation", base.DEC),
}
pkt.fields = {
	f.magic, f.version, f.kind, f.src_gid, f.dst_gid, f.src_qpn, f.dst_qpn, f.seq,
	f.qkey, f.rkey, f.addr, f.has_imm, f.imm, f.total, f.last, f.len, f.status,
	f.step, f.count, f.heard, f.form, f.data_len, f.data, f.descs, f.d_region, f.d_offset, f.d_len,
	f.d_slot, f.d_gen,
}

local malformed = ProtoExpert.new("efaf.malformed", "Malformed efa-emu packet",
	expert.group.MALFORMED, expert.severity.ERROR)
pkt.experts = { malformed }

local ENVELOPE_HEADER, MAC_LEN, PSEUDO_HEADER = 16, 32, 20

-- The fabric packet in tvb; returns the bytes it took, or nil after
-- marking it malformed.
local function packet(tvb, pinfo, tree)
	local t = tree:add(pkt, tvb())
	local n = tvb:len()
	local at = 0
	local function bad(why)
		t:add_proto_expert_info(malformed, why)
		return nil
	end
	local function need(k)
		return at + k <= n
	end
	local function le(field, k)
		local v = tvb(at, k)
		t:add_le(field, v)
		at = at + k
		return v
	end
	if not need(42) then return bad("shorter than a packet header") end
	if tvb(0, 4):string() ~= "EFAF" then return bad("not EFAF") end
	t:add(f.magic, tvb(0, 4))
	at = 4
	local version = le(f.version, 1):uint()
	-- Version 1 had no probes (kinds 6 and 7); version 3 puts a form byte
	-- before each payload (0 bytes, 1 descriptors of offered memory);
	-- version 4 has runs of answers (kind 8).
	if version < 1 or version > 4 then return bad("version " .. version .. ", not 1 to 4") end
	local kind = le(f.kind, 1):uint()
	t:add(f.src_gid, tvb(at, 16)); at = at + 16
	t:add(f.dst_gid, tvb(at, 16)); at = at + 16
	local sq = le(f.src_qpn, 2):le_uint()
	local dq = le(f.dst_qpn, 2):le_uint()
	local function imm()
		if not need(5) then return false end
		local has = tvb(at, 1):uint()
		t:add(f.has_imm, tvb(at, 1)); at = at + 1
		if has > 1 then return false end
		local v = tvb(at, 4)
		if has == 1 then t:add_le(f.imm, v) end
		at = at + 4
		return true
	end
	local function flag(field)
		if not need(1) or tvb(at, 1):uint() > 1 then return false end
		t:add(field, tvb(at, 1)); at = at + 1
		return true
	end
	local function data()
		local form = 0
		if version >= 3 then
			if not need(1) then return false end
			form = le(f.form, 1):uint()
			if form > 1 then return false end
		end
		if not need(4) then return false end
		if form == 1 then
			local len = le(f.data_len, 4):le_uint()
			if len > 65536 or not need(1) then return false end
			local count = le(f.descs, 1):uint()
			if count == 0 or count > 64 or not need(count * 22) then return false end
			local sum = 0
			for _ = 1, count do
				local d = t:add(pkt, tvb(at, 22), "Descriptor")
				d:add_le(f.d_region, tvb(at, 4))
				d:add_le(f.d_offset, tvb(at + 4, 8))
				d:add_le(f.d_len, tvb(at + 12, 4))
				d:add_le(f.d_slot, tvb(at + 16, 2))
				d:add_le(f.d_gen, tvb(at + 18, 4))
				local dl = tvb(at + 12, 4):le_uint()
				if dl == 0 then return false end
				sum = sum + dl
				at = at + 22
			end
			return sum == len
		end
		local len = le(f.data_len, 4):le_uint()
		if len > 65536 or not need(len) then return false end
		if len > 0 then t:add(f.data, tvb(at, len)) end
		at = at + len
		return true
	end
	local ok
	if kind == 1 then
		ok = need(4) and le(f.qkey, 4) and imm() and data()
	elseif kind == 2 then
		ok = need(12) and le(f.seq, 8) and le(f.qkey, 4) and imm() and data()
	elseif kind == 3 then
		ok = need(24) and le(f.seq, 8) and le(f.qkey, 4) and le(f.rkey, 4) and le(f.addr, 8)
			and imm() and need(4) and le(f.total, 4) and flag(f.last) and data()
	elseif kind == 4 then
		ok = need(28) and le(f.seq, 8) and le(f.qkey, 4) and le(f.rkey, 4) and le(f.addr, 8)
			and le(f.len, 4) and flag(f.last)
	elseif kind == 5 then
		ok = need(9) and le(f.seq, 8) and le(f.status, 1) and data()
	elseif kind == 6 and version >= 2 then
		ok = need(8) and le(f.seq, 8)
	elseif kind == 7 and version >= 2 then
		ok = need(10) and le(f.seq, 8) and tvb(at, 1):uint() <= 2 and le(f.heard, 1)
			and le(f.status, 1)
	elseif kind == 8 and version >= 4 then
		-- A run answers at least one request, each once.
		ok = need(15) and le(f.seq, 8) and tvb(at, 4):le_uint() > 0 and le(f.step, 4)
			and tvb(at, 2):le_uint() > 0 and le(f.count, 2) and le(f.status, 1)
	else
		return bad("unknown kind " .. kind)
	end
	if not ok then return bad("its fields run past its end") end
	if at ~= n then return bad((n - at) .. " bytes after its end") end
	t:set_len(at)
	pinfo.cols.protocol = "EFA-EMU"
	pinfo.cols.info = string.format("%s QP %d -> QP %d", kinds[kind], sq, dq)
	return at
end

-- The UDP envelope around a packet.
local function envelope(tvb, pinfo, tree)
	local n = tvb:len()
	local t = tree:add(env, tvb())
	if n < ENVELOPE_HEADER + 42 + MAC_LEN then
		t:add_proto_expert_info(malformed, "shorter than an envelope around a packet")
		return
	end
	t:add(e_magic, tvb(0, 4))
	t:add(e_version, tvb(4, 1))
	if tvb(4, 1):uint() ~= 1 then
		t:add_proto_expert_info(malformed, "envelope version " .. tvb(4, 1):uint() .. ", not 1")
		return
	end
	t:add(e_reserved, tvb(5, 3))
	t:add_le(e_seq, tvb(8, 8))
	t:add(e_mac, tvb(n - MAC_LEN, MAC_LEN))
	packet(tvb(ENVELOPE_HEADER, n - ENVELOPE_HEADER - MAC_LEN):tvb(), pinfo, tree)
end

local function payload(tvb, pinfo, tree)
	if tvb:len() >= 4 and tvb(0, 4):string() == "EFAU" then
		envelope(tvb, pinfo, tree)
	else
		packet(tvb, pinfo, tree)
	end
end

function rec.dissector(tvb, pinfo, tree)
	if tvb:len() < PSEUDO_HEADER then return 0 end
	local t = tree:add(rec, tvb(0, PSEUDO_HEADER))
	t:add(r_dir, tvb(0, 1))
	t:add(r_via, tvb(1, 1))
	if tvb(1, 1):uint() == 2 then
		t:add(r_port, tvb(2, 2))
		t:add(r_addr, tvb(4, 16))
	end
	payload(tvb(PSEUDO_HEADER):tvb(), pinfo, tree)
	return tvb:len()
end

local encaps = wtap_encaps or wtap
DissectorTable.get("wtap_encap"):add(encaps.USER0, rec)

-- The UDP fabric in other captures: datagrams that start with the
-- envelope's magic and version.
local function heuristic(tvb, pinfo, tree)
	if tvb:len() < ENVELOPE_HEADER + 42 + MAC_LEN or tvb(0, 4):string() ~= "EFAU"
		or tvb(4, 1):uint() ~= 1 then
		return false
	end
	envelope(tvb, pinfo, tree)
	return true
end
env:register_heuristic("udp", heuristic)
