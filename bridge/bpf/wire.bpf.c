// SPDX-License-Identifier: GPL-2.0
/*
 * The wire sensor in the kernel: a tc (clsact) program on the bridge's array-side port
 * that walks each storage TCP stream, matches commands to completions and adds up, per
 * connection and volume, the reads, their latency, the write bytes and the writes
 * completed.  Userspace (bridge/kernel.py) reads the sums once a tick; only logins and
 * connects (they name the target and the initiator) come up as events: their text, as
 * far as each segment holds it, in parts of up to NAME_BYTES, with the PDU's flags and
 * its text's length (userspace reads it part by part: bridge/logins.py).  The program
 * never changes a packet: TC_ACT_OK always.
 *
 * Per direction of a connection (map flows), the sequence number where the next PDU
 * header starts (next_seq) and the end of what was seen (expect_seq):
 *   - a segment wholly before expect_seq is a retransmission: ignored;
 *   - one after it is a gap: unsynchronised until a segment starts with a header that
 *     decodes (and the header after it too, when it is in the segment);
 *   - otherwise, while next_seq is inside the segment, the header there is decoded
 *     (a header cut by the segment's end is carried to the next one) and next_seq moves
 *     by the PDU's length; a non-header where one must be unsynchronises.
 * Commands go into inflight keyed by (connection, tag); a completion takes its command
 * out and adds its latency to stats[(connection, volume)].
 *
 * iSCSI: SCSI Command (READ/WRITE CDB) -> SCSI Response, or the Data-In with the S
 * bit; the LUN from the command.  NVMe/TCP: CapsuleCmd read/write -> CapsuleResp, or
 * a C2HData with SUCCESS; the NSID from the command; H2CData counts write bytes.
 * iSCSI digests are a connection's setting: userspace sets them in the flow from the
 * login it reads; NVMe/TCP's plen includes them.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ISCSI_PORT 3260
#define NVME_PORT 4420
#define ISCSI_BHS 48
#define NVME_CMD_HLEN 72
#define NVME_SMALL_HLEN 24
#define HDR_MAX 72
#define CARRY_BYTES 128 /* a power of two over HDR_MAX: a masked length fits it */
#define MAX_PDUS_PER_SEGMENT 48
#define MAX_DATA_BYTES (16u << 20)
#define NAME_BYTES 1024
#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88A8

#define PROTO_ISCSI 1
#define PROTO_NVME 2
#define OP_READ 1
#define OP_WRITE 2

/* Lengths of variable-size loads are masked (and the load's length is the mask + 1):
 * the verifier of every kernel proves them in bounds and non-zero, where older ones
 * cannot follow the compiler's compares.  The code checks the real ranges first, so
 * a mask never changes a value. */
#define LEN_MASKED(v, pow2) ((((__u64)(v) - 1) & ((pow2) - 1)) + 1)

#define EV_LOGIN 1
#define EV_CONNECT 2
#define EV_BODY 3 /* more of the last login's or connect's text */
#define BODY_MAX 4096 /* the most of one text passed up */

/* the connection, from the initiator's side: addresses as 16 bytes (IPv4 mapped) */
struct conn_key {
	__u8 ini[16];
	__u8 tgt[16];
	__u16 ini_port;
	__u16 tgt_port;
};

struct flow_key {
	struct conn_key conn;
	__u32 to_target;
};

struct flow {
	__u32 next_seq;
	__u32 expect_seq;
	__u32 carry_seq;
	__u8 synced;
	__u8 header_digest;
	__u8 data_digest;
	__u8 carry_len;
	__u8 carry[CARRY_BYTES];
	__u32 body_left; /* a login's or connect's text still to pass up, in later segments */
};

struct tag_key {
	struct conn_key conn;
	__u32 tag;
};

struct inflight {
	__u64 start_ns;
	__u64 volume;
	__u8 op;
};

struct vol_key {
	struct conn_key conn;
	__u64 volume;
};

struct vol_stats {
	__u64 reads;
	__u64 read_ns;
	__u64 write_bytes;
	__u64 writes;	/* write commands completed */
};

/* indices of the global counters (bridge/kernel.py names them) */
enum {
	C_FRAMES, C_SEGMENTS, C_PDUS, C_COMMANDS, C_COMPLETIONS, C_UNMATCHED, C_REPLACED,
	C_RETRANSMITTED, C_GAPS, C_DESYNCS, C_RESYNCS, C_CARRIED, C_EVENTS_LOST,
	C_TRUNCATED_WALKS, C_MAX
};

struct event {
	struct conn_key conn;
	__u32 kind;
	__u32 to_target;
	__u32 len;
	__u32 flags; /* EV_LOGIN: the PDU's flags byte (C, 0x40: its text goes on) */
	__u32 total; /* EV_LOGIN, EV_CONNECT: the PDU's text bytes, all of them */
	__u8 data[NAME_BYTES];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct flow);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 20);
	__type(key, struct tag_key);
	__type(value, struct inflight);
} inflight SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct vol_key);
	__type(value, struct vol_stats);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

/* What a header is: its length on the wire (0: not a header), and what it does. */
struct pdu {
	__u32 length;
	__u32 tag;
	__u64 volume;
	__u32 data_bytes;
	__u32 header_bytes;
	__u8 kind; /* 1 command, 2 done, 3 write data, 4 login, 5 connect, 0 other */
	__u8 op;
};

/* per-CPU scratch: the keys and values a packet needs (the stack is 512 bytes) */
struct scratch {
	__u8 hdr[HDR_MAX];
	__u8 ipb[40];
	struct flow_key fk;
	struct flow fresh;
	struct tag_key tk;
	struct vol_key vk;
	struct vol_stats zero;
	struct inflight n;
	struct pdu p;
	struct pdu q;
	__u64 now;
	__u32 body_left; /* set by on_pdu for its caller's flow */
	__u32 to_target;
	__u32 seq;
	__u32 poff;
	__u32 seg_end;
	__u32 proto;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

static __always_inline void count(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &i);

	if (v)
		*v += 1;
}

static __always_inline __u32 be24(const __u8 *p)
{
	return ((__u32)p[0] << 16) | ((__u32)p[1] << 8) | p[2];
}

static __always_inline __u32 be32(const __u8 *p)
{
	return ((__u32)p[0] << 24) | ((__u32)p[1] << 16) | ((__u32)p[2] << 8) | p[3];
}

static __always_inline __u64 be64(const __u8 *p)
{
	return ((__u64)be32(p) << 32) | be32(p + 4);
}

static __always_inline __u16 le16(const __u8 *p)
{
	return p[0] | ((__u16)p[1] << 8);
}

static __always_inline __u32 le32(const __u8 *p)
{
	return p[0] | ((__u32)p[1] << 8) | ((__u32)p[2] << 16) | ((__u32)p[3] << 24);
}

static __always_inline int is_scsi_read(__u8 c)
{
	return c == 0x08 || c == 0x28 || c == 0x88 || c == 0xA8;
}

static __always_inline int is_scsi_write(__u8 c)
{
	return c == 0x0A || c == 0x2A || c == 0x8A || c == 0xAA;
}

#define K_CMD 1
#define K_DONE 2
#define K_DATA_OUT 3
#define K_LOGIN 4
#define K_CONNECT 5

static __always_inline int iscsi_op_ok(__u8 op, int to_target)
{
	if (to_target)
		return op <= 0x06 || op == 0x10;
	return (op >= 0x20 && op <= 0x26) || op == 0x31 || op == 0x32 || op == 0x3F;
}

static __always_inline int decode_iscsi(const __u8 *h, int to_target, int hd, int dd,
					 struct pdu *p)
{
	__u8 op = h[0] & 0x3F, flags = h[1], ahs = h[4];
	__u32 dsl = be24(h + 5), hdr, data;

	if (h[0] & 0x80 || dsl > MAX_DATA_BYTES || ahs > 64 || !iscsi_op_ok(op, to_target))
		return 0;
	hdr = ISCSI_BHS + 4 * ahs + (hd ? 4 : 0);
	data = dsl ? ((dsl + 3) & ~3u) + (dd ? 4 : 0) : 0;
	p->length = hdr + data;
	p->header_bytes = hdr;
	p->tag = be32(h + 16);
	p->data_bytes = dsl;
	p->kind = 0;
	p->op = 0;
	p->volume = 0;
	if (op == 0x01) {
		if (flags & 0x18 || p->tag == 0xFFFFFFFF)
			return 0;
		p->kind = K_CMD;
		p->volume = be64(h + 8);
		p->data_bytes = be32(h + 20);
		p->op = is_scsi_read(h[32]) ? OP_READ : is_scsi_write(h[32]) ? OP_WRITE : 0;
	} else if (op == 0x25) {
		if (flags & 0x38)
			return 0;
		if (flags & 0x01)
			p->kind = K_DONE;
	} else if (op == 0x21) {
		if (!(flags & 0x80) || flags & 0x61)
			return 0;
		p->kind = K_DONE;
	} else if (op == 0x03 || op == 0x23) {
		p->kind = K_LOGIN;
		p->op = flags; /* C: the text goes on in the next login PDU */
	}
	return 1;
}

static __always_inline int nvme_hlen_ok(__u8 type, __u8 hlen)
{
	switch (type) {
	case 0x00: case 0x01: return hlen == 128;
	case 0x04: return hlen == 72;
	case 0x02: case 0x03: case 0x05: case 0x06: case 0x07: case 0x09: return hlen == 24;
	}
	return 0;
}

/* h holds at least 8 bytes; need_more is set when the type's header is longer */
static __always_inline int decode_nvme(const __u8 *h, __u32 have, int to_target, struct pdu *p)
{
	__u8 type = h[0], flags = h[1], hlen = h[2], pdo = h[3];
	__u32 plen = le32(h + 4);

	if (!nvme_hlen_ok(type, hlen))
		return 0;
	if (to_target != (type == 0x00 || type == 0x02 || type == 0x04 || type == 0x06))
		return 0;
	if (plen < hlen || plen > MAX_DATA_BYTES + 2 * hlen || (pdo && pdo < hlen))
		return 0;
	p->length = plen;
	p->header_bytes = pdo;
	p->kind = 0;
	p->op = 0;
	p->volume = 0;
	p->tag = 0;
	p->data_bytes = 0;
	if (type == 0x04) {
		__u8 opcode = h[8];

		if (have < NVME_CMD_HLEN)
			return 0;
		p->tag = le16(h + 10);
		p->volume = le32(h + 12);
		p->kind = K_CMD;
		if (pdo)
			p->data_bytes = plen - pdo - ((flags & 0x02) ? 4 : 0);
		if (opcode == 0x02)
			p->op = OP_READ;
		else if (opcode == 0x01)
			p->op = OP_WRITE;
		else if (opcode == 0x7F && h[12] == 0x01)
			p->kind = K_CONNECT;
	} else if (type == 0x05) {
		p->tag = le16(h + 20);
		p->kind = K_DONE;
	} else if (type == 0x06 || type == 0x07) {
		p->tag = le16(h + 8);
		p->data_bytes = le32(h + 16);
		if (type == 0x06)
			p->kind = K_DATA_OUT;
		else if (flags & 0x08)
			p->kind = K_DONE;
	}
	return 1;
}

/* The bytes of a header the decoder reads, by protocol and first byte (NVMe: type). */
static __always_inline __u32 header_need(int proto, __u8 first)
{
	if (proto == PROTO_ISCSI)
		return ISCSI_BHS;
	if (first == 0x04)
		return NVME_CMD_HLEN;
	if (first == 0x05 || first == 0x06 || first == 0x07)
		return NVME_SMALL_HLEN;
	return 8; /* the common header tells the length */
}

/* The volume's sums on this connection, made when missing. */
static __always_inline struct vol_stats *vol_of(struct scratch *sc, __u64 volume)
{
	struct vol_stats *s;

	__builtin_memcpy(&sc->vk.conn, &sc->fk.conn, sizeof(sc->vk.conn));
	sc->vk.volume = volume;
	s = bpf_map_lookup_elem(&stats, &sc->vk);
	if (s)
		return s;
	__builtin_memset(&sc->zero, 0, sizeof(sc->zero));
	bpf_map_update_elem(&stats, &sc->vk, &sc->zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&stats, &sc->vk);
}

/* An event with up to `want` (at most NAME_BYTES) bytes of the segment from `from`;
 * the bytes it passed up, or -1 when the ring had no room (counted). */
static __always_inline int emit(struct __sk_buff *skb, struct conn_key *c, __u32 kind,
				__u32 to_target, __u32 from, __u32 seg_end, __u32 want,
				__u32 flags, __u32 total)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	__u32 got = 0;
	__u64 n;

	if (!e) {
		count(C_EVENTS_LOST);
		return -1;
	}
	__builtin_memcpy(&e->conn, c, sizeof(*c));
	e->kind = kind;
	e->to_target = to_target;
	e->flags = flags;
	e->total = total;
	n = from < seg_end ? seg_end - from : 0;
	if (n > want)
		n = want;
	if (n > NAME_BYTES)
		n = NAME_BYTES;
	if (n >= 1) {
		n = LEN_MASKED(n, NAME_BYTES);
		if (bpf_skb_load_bytes(skb, from, e->data, n) == 0)
			got = n;
	}
	e->len = got;
	bpf_ringbuf_submit(e, 0);
	return got;
}

/* A login's or connect's text from `from`, as far as this segment holds it (at most
 * `want` bytes), in events of up to NAME_BYTES: the first of `kind`, the others EV_BODY.
 * The bytes of it left for the next segments; 0 also when a part was lost, so userspace
 * has a text cut short, never one with a hole. */
static __always_inline __u32 emit_text(struct __sk_buff *skb, struct conn_key *c,
				       __u32 kind, __u32 to_target, __u32 from, __u32 seg_end,
				       __u32 want, __u32 flags, __u32 total)
{
	__u32 here = from < seg_end ? seg_end - from : 0, sent = 0;
	int got;

	if (here > want)
		here = want;
#pragma unroll
	for (int i = 0; i < BODY_MAX / NAME_BYTES; i++) {
		__u32 part = here - sent;

		if (i && !part)
			break;
		if (part > NAME_BYTES)
			part = NAME_BYTES;
		got = emit(skb, c, i ? EV_BODY : kind, to_target, from + sent, seg_end, part,
			   flags, total);
		if (got < 0 || (__u32)got < part)
			return 0;
		sent += part;
	}
	return want > sent ? want - sent : 0;
}

/* The text a login's or connect's header left to this segment (fl->body_left bytes),
 * from the segment's payload (sc->poff .. sc->seg_end).  A function of its own: inlined,
 * its unrolled parts would grow wire_sensor's stack, and 6.1's verifier rounds each
 * frame of the deepest call chain to 32 bytes and wants their sum within 512. */
static __noinline void body_text(struct __sk_buff *skb, struct scratch *sc, struct flow *fl)
{
	fl->body_left = emit_text(skb, &sc->fk.conn, EV_BODY, sc->to_target, sc->poff,
				  sc->seg_end, fl->body_left, 0, 0);
}

static __noinline void on_pdu(struct __sk_buff *skb, struct scratch *sc, __u32 at,
			      __u32 seg_end)
{
	int to_target = sc->to_target;
	__u64 now = sc->now;
	struct pdu *p = &sc->p;
	struct vol_stats *s;
	struct inflight *f;
	struct conn_key *c = &sc->fk.conn;

	count(C_PDUS);
	__builtin_memcpy(&sc->tk.conn, c, sizeof(*c));
	sc->tk.tag = p->tag;
	if ((p->kind == K_CMD || p->kind == K_CONNECT) && to_target) {
		sc->n.start_ns = now;
		sc->n.volume = p->volume;
		sc->n.op = p->op;
		count(C_COMMANDS);
		if (bpf_map_update_elem(&inflight, &sc->tk, &sc->n, BPF_NOEXIST)) {
			count(C_REPLACED);
			bpf_map_update_elem(&inflight, &sc->tk, &sc->n, BPF_ANY);
		}
		if (p->op == OP_WRITE && p->data_bytes) {
			s = vol_of(sc, p->volume);
			if (s)
				__sync_fetch_and_add(&s->write_bytes, p->data_bytes);
		}
	} else if (p->kind == K_DONE && !to_target) {
		f = bpf_map_lookup_elem(&inflight, &sc->tk);
		if (!f) {
			count(C_UNMATCHED);
			return;
		}
		count(C_COMPLETIONS);
		if (f->op == OP_READ) {
			__u64 took = now - f->start_ns;

			s = vol_of(sc, f->volume);
			if (s) {
				__sync_fetch_and_add(&s->reads, 1);
				__sync_fetch_and_add(&s->read_ns, took);
			}
		} else if (f->op == OP_WRITE) {
			s = vol_of(sc, f->volume);
			if (s)
				__sync_fetch_and_add(&s->writes, 1);
		}
		bpf_map_delete_elem(&inflight, &sc->tk);
	} else if (p->kind == K_DATA_OUT && to_target) {
		f = bpf_map_lookup_elem(&inflight, &sc->tk);
		if (f && f->op == OP_WRITE) {
			__u64 volume = f->volume;

			s = vol_of(sc, volume);
			if (s)
				__sync_fetch_and_add(&s->write_bytes, p->data_bytes);
		}
	}
	sc->body_left = 0;
	if (p->kind == K_LOGIN || p->kind == K_CONNECT) {
		/* the text after the header, as far as this segment holds it; the rest (the
		 * header alone in its segment, as open-iscsi sends it) from the next ones */
		__u32 body = p->data_bytes < BODY_MAX ? p->data_bytes : BODY_MAX;

		sc->body_left = emit_text(skb, c, p->kind == K_LOGIN ? EV_LOGIN : EV_CONNECT,
					  to_target, at + p->header_bytes, seg_end, body, p->op,
					  p->data_bytes);
	}
}

/* The header at off (within the payload, which ends at end): 1 and p filled when one
 * decodes there, 0 when what is there is no header, -1 when the segment ends inside it. */
static __always_inline int header_at(struct __sk_buff *skb, __u8 *h, __u32 off, __u32 end,
				     int proto, int to_target, struct flow *fl, struct pdu *p)
{
	__u32 need;

	if (off + 8 > end)
		return -1;
	if (bpf_skb_load_bytes(skb, off, h, 8))
		return 0;
	need = header_need(proto, h[0]);
	if (off + need > end)
		return -1;
	if (need == ISCSI_BHS) {
		if (bpf_skb_load_bytes(skb, off, h, ISCSI_BHS))
			return 0;
		return decode_iscsi(h, to_target, fl->header_digest, fl->data_digest, p);
	}
	if (need == NVME_CMD_HLEN) {
		if (bpf_skb_load_bytes(skb, off, h, NVME_CMD_HLEN))
			return 0;
	} else if (need == NVME_SMALL_HLEN) {
		if (bpf_skb_load_bytes(skb, off, h, NVME_SMALL_HLEN))
			return 0;
	}
	return decode_nvme(h, need, to_target, p);
}

/* One step of the walk: the header at next_seq, if it is in this segment.  1: go on.
 * A global function: the verifier checks it once, not once per step of the loop. */
__noinline int walk_one(struct __sk_buff *skb, struct flow *fl)
{
	__u32 seq, poff, seg_end, at, zero = 0;
	struct scratch *sc;
	__s32 off_s;
	int ok;

	/* the scratch looked up again: a map value, which the map helpers take as a key
	 * on every kernel (an argument is plain memory to the verifier) */
	sc = bpf_map_lookup_elem(&scratch, &zero);
	if (!skb || !sc || !fl)
		return 0;
	seq = sc->seq;
	poff = sc->poff;
	seg_end = sc->seg_end;
	off_s = (__s32)(fl->next_seq - seq);
	if (off_s < 0 || (__u32)off_s >= seg_end - poff)
		return 0; /* the next header is in a later segment */
	at = poff + (__u32)off_s;
	ok = header_at(skb, sc->hdr, at, seg_end, sc->proto, sc->to_target, fl, &sc->p);
	if (ok < 0) {
		/* cut by the segment's end: keep what is here for the next one */
		__u64 n = seg_end - at;

		fl->carry_seq = fl->next_seq;
		fl->carry_len = 0;
		fl->synced = 0;
		if (n < 1 || n > HDR_MAX)
			return 0;
		n = LEN_MASKED(n, CARRY_BYTES);
		if (bpf_skb_load_bytes(skb, at, fl->carry, n) == 0) {
			fl->carry_len = n;
			fl->synced = 1;
		}
		return 0;
	}
	if (ok == 0) {
		count(C_DESYNCS);
		fl->synced = 0;
		return 0;
	}
	on_pdu(skb, sc, at, seg_end);
	if (sc->body_left)
		fl->body_left = sc->body_left;
	fl->next_seq += sc->p.length;
	return 1;
}

SEC("tc")
int wire_sensor(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *data_end = (void *)(long)skb->data_end;
	struct flow *fl;
	struct scratch *sc;
	__u32 zero = 0, l3 = ETH_HLEN, poff, plen, seq, seg_end, ip_end;
	__u16 proto_eth, sport, dport;
	__u8 doff, tcp_flags;
	int proto, to_target;
	__u64 now = bpf_ktime_get_ns();
	__u8 tcpb[14];

	count(C_FRAMES);
	sc = bpf_map_lookup_elem(&scratch, &zero);
	if (!sc)
		return TC_ACT_OK;
	__builtin_memset(&sc->fk, 0, sizeof(sc->fk));
	if (data + ETH_HLEN > data_end)
		return TC_ACT_OK;
	proto_eth = bpf_ntohs(((struct ethhdr *)data)->h_proto);
	if (proto_eth == ETH_P_8021Q_ || proto_eth == ETH_P_8021AD_) {
		__u8 vl[4];

		if (bpf_skb_load_bytes(skb, ETH_HLEN, vl, 4))
			return TC_ACT_OK;
		proto_eth = ((__u16)vl[2] << 8) | vl[3];
		l3 += 4;
	}
	if (proto_eth == ETH_P_IP) {
		__u32 ihl;

		if (bpf_skb_load_bytes(skb, l3, sc->ipb, 20))
			return TC_ACT_OK;
		if (sc->ipb[9] != 6 || (((__u16)sc->ipb[6] << 8 | sc->ipb[7]) & 0x3FFF))
			return TC_ACT_OK; /* not TCP, or a fragment */
		ihl = (sc->ipb[0] & 0xF) * 4;
		if (ihl < 20)
			return TC_ACT_OK;
		ip_end = l3 + (((__u32)sc->ipb[2] << 8) | sc->ipb[3]);
		sc->fk.conn.ini[10] = sc->fk.conn.ini[11] = 0xFF;
		sc->fk.conn.tgt[10] = sc->fk.conn.tgt[11] = 0xFF;
		__builtin_memcpy(&sc->fk.conn.ini[12], &sc->ipb[12], 4); /* src, for now */
		__builtin_memcpy(&sc->fk.conn.tgt[12], &sc->ipb[16], 4); /* dst, for now */
		l3 += ihl;
	} else if (proto_eth == ETH_P_IPV6) {
		if (bpf_skb_load_bytes(skb, l3, sc->ipb, 40))
			return TC_ACT_OK;
		if (sc->ipb[6] != 6)
			return TC_ACT_OK; /* extension headers are not followed */
		ip_end = l3 + 40 + (((__u32)sc->ipb[4] << 8) | sc->ipb[5]);
		__builtin_memcpy(sc->fk.conn.ini, &sc->ipb[8], 16);
		__builtin_memcpy(sc->fk.conn.tgt, &sc->ipb[24], 16);
		l3 += 40;
	} else {
		return TC_ACT_OK;
	}
	if (bpf_skb_load_bytes(skb, l3, tcpb, 14))
		return TC_ACT_OK;
	sport = ((__u16)tcpb[0] << 8) | tcpb[1];
	dport = ((__u16)tcpb[2] << 8) | tcpb[3];
	if (dport == ISCSI_PORT || dport == NVME_PORT) {
		to_target = 1;
		proto = dport == ISCSI_PORT ? PROTO_ISCSI : PROTO_NVME;
		sc->fk.conn.ini_port = sport;
		sc->fk.conn.tgt_port = dport;
	} else if (sport == ISCSI_PORT || sport == NVME_PORT) {
		__u8 tmp[16];

		to_target = 0;
		proto = sport == ISCSI_PORT ? PROTO_ISCSI : PROTO_NVME;
		__builtin_memcpy(tmp, sc->fk.conn.ini, 16); /* src was the target */
		__builtin_memcpy(sc->fk.conn.ini, sc->fk.conn.tgt, 16);
		__builtin_memcpy(sc->fk.conn.tgt, tmp, 16);
		sc->fk.conn.ini_port = dport;
		sc->fk.conn.tgt_port = sport;
	} else {
		return TC_ACT_OK;
	}
	sc->fk.to_target = to_target;
	sc->to_target = to_target;
	sc->now = now;
	seq = be32(tcpb + 4);
	doff = (tcpb[12] >> 4) * 4;
	tcp_flags = tcpb[13];
	poff = l3 + doff;
	if (ip_end > skb->len)
		ip_end = skb->len;
	plen = ip_end > poff ? ip_end - poff : 0;
	fl = bpf_map_lookup_elem(&flows, &sc->fk);
	__builtin_memset(&sc->fresh, 0, sizeof(sc->fresh));
	if (tcp_flags & 0x02) { /* SYN: the stream starts at seq + 1 */
		sc->fresh.next_seq = sc->fresh.expect_seq = seq + 1;
		sc->fresh.synced = 1;
		bpf_map_update_elem(&flows, &sc->fk, &sc->fresh, BPF_ANY);
		return TC_ACT_OK;
	}
	if (tcp_flags & 0x05) { /* FIN or RST: the direction ends */
		if (fl)
			bpf_map_delete_elem(&flows, &sc->fk);
		if (!plen)
			return TC_ACT_OK;
		fl = 0;
	}
	if (!plen)
		return TC_ACT_OK;
	count(C_SEGMENTS);
	if (!fl) {
		sc->fresh.next_seq = sc->fresh.expect_seq = seq;
		bpf_map_update_elem(&flows, &sc->fk, &sc->fresh, BPF_ANY);
		fl = bpf_map_lookup_elem(&flows, &sc->fk);
		if (!fl)
			return TC_ACT_OK;
	}
	seg_end = poff + plen;
	{
		__s32 ahead = (__s32)(seq - fl->expect_seq);
		__s32 behind = (__s32)(seq + plen - fl->expect_seq);

		if (fl->synced && behind <= 0) {
			count(C_RETRANSMITTED);
			return TC_ACT_OK;
		}
		if (fl->synced && ahead > 0) { /* bytes the port never showed us */
			count(C_GAPS);
			fl->synced = 0;
			fl->carry_len = 0;
			fl->body_left = 0;
		}
		if (fl->synced && ahead < 0) { /* partly old: only its new bytes */
			poff += (__u32)(-ahead);
			seq = fl->expect_seq;
		}
		fl->expect_seq = seq + (seg_end - poff);
	}
	if (!fl->synced) {
		/* resync: a header at the segment's start, and the next one when it is here */
		int ok = header_at(skb, sc->hdr, poff, seg_end, proto, to_target, fl, &sc->p);

		if (ok != 1 || sc->p.length > (1u << 20) + 256)
			return TC_ACT_OK;
		if (poff + sc->p.length + 8 <= seg_end) {
			if (header_at(skb, sc->hdr, poff + sc->p.length, seg_end, proto, to_target, fl,
				      &sc->q) == 0)
				return TC_ACT_OK;
		}
		count(C_RESYNCS);
		fl->synced = 1;
		fl->next_seq = seq;
		fl->carry_len = 0;
	}
	if (fl->carry_len) {
		/* a header cut by the last segment's end: this segment holds the rest */
		__u64 have = fl->carry_len, want, take;
		int ok;

		if (have >= HDR_MAX || fl->carry_seq + have != seq) {
			fl->synced = 0;
			fl->carry_len = 0;
			return TC_ACT_OK;
		}
		want = header_need(proto, fl->carry[0]);
		if (want < 8)
			want = 8;
		take = want > have ? want - have : 0;
		if (take > seg_end - poff) { /* a header over three segments: give up on it */
			fl->synced = 0;
			fl->carry_len = 0;
			return TC_ACT_OK;
		}
		__builtin_memcpy(sc->hdr, fl->carry, HDR_MAX);
		if (take) {
			if (have >= HDR_MAX || have + take > HDR_MAX)
				return TC_ACT_OK;
			/* hdr sits at the scratch's start, which has room for any masked load */
			if (bpf_skb_load_bytes(skb, poff, sc->hdr + (have & (CARRY_BYTES - 1)),
					       LEN_MASKED(take, CARRY_BYTES)))
				return TC_ACT_OK;
		}
		count(C_CARRIED);
		fl->carry_len = 0;
		if (proto == PROTO_ISCSI)
			ok = decode_iscsi(sc->hdr, to_target, fl->header_digest, fl->data_digest, &sc->p);
		else
			ok = decode_nvme(sc->hdr, want, to_target, &sc->p);
		if (!ok) {
			count(C_DESYNCS);
			fl->synced = 0;
			return TC_ACT_OK;
		}
		on_pdu(skb, sc, poff - (want - take), seg_end);
		fl->body_left = sc->body_left;
		fl->next_seq = fl->carry_seq + sc->p.length;
	}
	sc->seq = seq;
	sc->poff = poff;
	sc->seg_end = seg_end;
	sc->proto = proto;
	if (fl->body_left) /* the text a login's or connect's header left to this one */
		body_text(skb, sc, fl);
#pragma clang loop unroll(disable)
	for (int i = 0; i < MAX_PDUS_PER_SEGMENT; i++) {
		if (!walk_one(skb, fl))
			return TC_ACT_OK;
	}
	count(C_TRUNCATED_WALKS);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
