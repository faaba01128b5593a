// SPDX-License-Identifier: GPL-2.0
/*
 * The wire sensor in the kernel: a tc (clsact) program on the bridge's array-side port
 * that walks each storage TCP stream, matches commands to completions and adds up, per
 * connection and volume, the reads, their latency, the write bytes, the writes
 * completed and the time it had a command in flight (busy_move).  Userspace
 * (bridge/kernel.py) reads the sums once a tick and the flows' sync state when asked;
 * only logins and connects (they name the target and the initiator) come up as events:
 * their text, as far as each segment holds it, in parts of up to NAME_BYTES, with the
 * PDU's flags and its text's length.  The program never changes a packet: TC_ACT_OK
 * always.
 *
 * The law is the Python walker's, step for step (bridge/flow.py, belief.py,
 * protocols.py, pdu.py, tracker.py; their module headers say why), so that both give
 * the same counts on the same frames (tests/wire):
 *   - per direction of a connection (map flows) a state: SYNCED (next_seq is where the
 *     next header starts), PROVISIONAL (a resync took a header whose successor is
 *     beyond the segment it was in), LOST, UNMEASURABLE (TLS, or another protocol);
 *   - retransmissions skipped; a gap holds the walk when the next header is still
 *     ahead, else loses it;
 *   - in sync, each header decoded as the walk believes it (decode_*), its sequence
 *     number within SN_STEP_MAX of the last; a PDU goes to on_pdu() with the time of
 *     the segment that holds its last byte (held until then); a header that fails, or
 *     a run of UNMATCHED_RUN completions of nothing, is a desync: the segment is
 *     searched again after the last good header;
 *   - the search (resync): the first offset where a header is plausible (plausible_*:
 *     every reserved field, the iSCSI command window, the header digest's CRC32C) and
 *     its successor, in the segment, is plausible and coherent: confirmed; else the
 *     first plausible one whose successor is beyond: provisional -- a command put in
 *     flight at once, confirmed or retracted where its successor is (or taken over by
 *     a header found in a later segment before it);
 *   - iSCSI digests: userspace sets them from the login; after a login, and after a
 *     resync, the header digest is recognised by its CRC32C and the data digest by where
 *     the next header is (alt_seq).
 * Bounds: at most MAX_WALK headers and SEARCH_CHUNKS x 64 bytes searched per segment
 * (the Python walker has the same), maps of fixed size (kernel.py).
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
#define NVME_IC_HLEN 128
#define HDR_MAX 128		/* the longest header read: NVMe's ICReq/ICResp */
#define CRC_MAX (ISCSI_BHS + 64)	/* a BHS and the AHS a search takes (16 words) */
#define ASM_BYTES 256		/* a carried header and what follows it */
#define CARRY_BYTES 128		/* a cut header: less than HDR_MAX */
#define MAX_WALK 8192		/* headers walked in one segment (flow.py's MAX_WALK) */
#define BEHIND_MAX_BYTES (1 << 26)	/* flow.py's: further behind is no retransmission */
#define SEARCH_CHUNKS 2048	/* 64-byte chunks a search looks at: 128 KiB */
#define MAX_SEARCHES 16		/* searches in one segment (belief.py's) */
#define MAX_STEPS (MAX_WALK + MAX_SEARCHES * (SEARCH_CHUNKS + 1) + 1)
#define MAX_DATA_BYTES ((1u << 24) - 1)
#define RESYNC_MAX ((1u << 20) + 256)
#define SN_STEP_MAX (1u << 16)
#define MAX_CMD_WINDOW (1u << 20)
#define MAX_ESP_FLOWS 1024	/* IPsec security associations shown (tracker.py's) */
#define IPPROTO_ESP_ 50
#define IPPROTO_UDP_ 17
#define NAT_T_PORT 4500		/* ESP in UDP (RFC 3948) */
#define UNPARSED_BYTES (256u * 1024)
#define UNMATCHED_RUN 256
#define MIN_SEGMENT_LIMIT 512
#define NAME_BYTES 1024
#define BODY_MAX 4096 /* the most of one text passed up */
#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88A8

#define PROTO_ISCSI 1
#define PROTO_NVME 2
#define OP_READ 1
#define OP_WRITE 2

#define SYNCED 0
#define PROVISIONAL 1
#define LOST 2
#define UNMEASURABLE 3
#define WHY_TLS 1
#define WHY_UNPARSED 2

#define K_OTHER 0
#define K_CMD 1
#define K_DONE 2
#define K_DATA_OUT 3
#define K_LOGIN 4
#define K_CONNECT 5
#define K_IC 6

#define HELD_NONE 0
#define HELD 1
#define HELD_PROVISIONAL 2
#define PROV_NONE 0
#define PROV_CMD 1
#define PROV_DATA 2
#define PROV_UNMATCHED 3

#define FOUND_NONE 0
#define FOUND_PROVISIONAL 1
#define FOUND_CONFIRMED 2

/* Lengths of variable-size loads are masked (and the load's length is the mask + 1):
 * the verifier of every kernel proves them in bounds and non-zero, where older ones
 * cannot follow the compiler's compares.  The code checks the real ranges first, so
 * a mask never changes a value. */
#define LEN_MASKED(v, pow2) ((((__u64)(v) - 1) & ((pow2) - 1)) + 1)

#define EV_LOGIN 1
#define EV_CONNECT 2
#define EV_BODY 3 /* more of the last login's or connect's text */

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

/* What a header is (pdu.py's Pdu): its length on the wire and what it does. */
struct pdu {
	__u32 length;
	__u32 tag;
	__u64 volume;
	__u32 data_bytes;
	__u32 header_bytes;
	__u32 sn;
	__u32 segment;
	__u8 kind;
	__u8 op;
	__u8 pad[6];
};

/* One direction's walk (flow.py's Stream); bridge/kernel.py reads it (FLOW). */
struct flow {
	__u32 next_seq;
	__u32 expect_seq;
	__u32 carry_seq;
	__u32 alt_seq;
	__u32 sn;
	__u32 limit;
	__u32 unparsed;
	__u32 unmatched_run;	/* to the initiator: completions of nothing in a row */
	__u32 body_left;	/* a login's or connect's text still to pass up */
	__u32 desyncs;
	__u32 resyncs;
	__u32 retracted;
	__u64 lost_since_ns;	/* 0: none */
	__u64 out_ns;
	__u64 out_bytes;
	struct pdu held;
	__u32 prov_tag;
	__u32 prov_bytes;
	__u8 state;
	__u8 expect_valid;
	__u8 hd;
	__u8 dd;
	__u8 hd_known;
	__u8 dd_known;
	__u8 alt_valid;
	__u8 proven;
	__u8 tls_seen;
	__u8 reason;
	__u8 held_kind;
	__u8 prov_what;
	__u8 carry_len;
	__u8 await_login;	/* its login reached full feature: userspace's settings due */
	__u8 pad[2];
	__u8 carry[CARRY_BYTES];
};

/* What userspace read in a login's text (bridge/ksums.py), for one direction: the
 * negotiated digests and the receiver's MaxRecvDataSegmentLength. */
struct setting {
	__u8 hd;
	__u8 dd;
	__u8 has_digests;
	__u8 pad;
	__u32 limit;	/* 0: none declared */
};

struct tag_key {
	struct conn_key conn;
	__u32 tag;
};

struct inflight {
	__u64 start_ns;
	__u64 volume;
	__u32 held_bytes;	/* a provisional write's bytes, counted when it holds */
	__u8 op;
	__u8 prov;
	__u8 pad[2];
};

struct vol_key {
	struct conn_key conn;
	__u64 volume;
};

/* A volume's sums on one connection.  Its busy time (bridge/busy.py's law): the time it
 * has at least one command in flight, moved under the lock (a command and a completion of
 * one connection may meet on two CPUs); userspace reads it with BPF_F_LOCK. */
struct vol_stats {
	__u64 reads;
	__u64 read_ns;
	__u64 write_bytes;
	__u64 writes;	/* write commands completed */
	__u64 busy_ns;	/* its closed busy spans */
	__u64 since_ns;	/* the open span's start, while outstanding > 0 */
	__u64 retired;	/* the aged-out commands (map retired) already taken off */
	__u64 gen;	/* retired_gen when it last looked at the map retired */
	__u32 outstanding;	/* its commands in flight */
	struct bpf_spin_lock lock;
};

/* The commands of a (connection, volume) that userspace aged out of the map inflight
 * (bridge/ksums.py): they never completed.  Written by userspace only: how many in all,
 * and when it aged the last of them out (CLOCK_MONOTONIC ns). */
struct retired_val {
	__u64 count;
	__u64 at_ns;
};

/* indices of the global counters (bridge/kernel.py names them) */
enum {
	C_FRAMES, C_SEGMENTS, C_PDUS, C_COMMANDS, C_COMPLETIONS, C_UNMATCHED, C_REPLACED,
	C_RETRANSMITTED, C_GAPS, C_DESYNCS, C_RESYNCS, C_CARRIED, C_EVENTS_LOST,
	C_TRUNCATED_WALKS, C_RETRACTED, C_UNMEASURABLE, C_FLOWS_ADDED, C_FLOWS_REMOVED, C_MAX
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
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct setting);
} settings SEC(".maps");

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
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);	/* a value read is whole (RCU): no reuse */
	__uint(max_entries, 65536);
	__type(key, struct vol_key);
	__type(value, struct retired_val);
} retired SEC(".maps");

/* How many times userspace wrote to the map retired: a volume looks there only when it
 * moved (a volume's move looks at its key only after the generation it saw last). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} retired_gen SEC(".maps");

/* IPsec ESP on the port (bridge/kernel.py's esp_flows()): a security association by its
 * addresses and SPI -- storage the sensor cannot read (not measurable), shown as such. */
struct esp_key {
	__u8 src[16];	/* IPv4 as ::ffff:a.b.c.d */
	__u8 dst[16];
	__u32 spi;
};

struct esp_stats {
	__u64 first_ns;
	__u64 last_ns;
	__u64 frames;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_ESP_FLOWS);
	__type(key, struct esp_key);
	__type(value, struct esp_stats);
} esp SEC(".maps");

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

/* per-CPU scratch: what one packet's walk needs between its functions (the stack is
 * 512 bytes over the whole call chain) */
struct scratch {
	__u8 hdr[HDR_MAX + 8];	/* a header, and its header digest */
	__u8 hdr2[HDR_MAX + 8];	/* its successor */
	__u8 asm_[ASM_BYTES];	/* a carried header and what follows it */
	__u8 win[HDR_MAX + 8];	/* a search's chunk */
	__u8 ipb[40];
	struct flow_key fk;
	struct flow_key ok;	/* the other direction's */
	struct flow fresh;
	struct tag_key tk;
	struct vol_key vk;
	__u8 zero[sizeof(struct vol_stats)];	/* a new vol_stats (no lock in a per-CPU map) */
	struct inflight n;
	struct pdu p;		/* the header being walked */
	struct pdu q;		/* a successor */
	struct pdu cand;	/* the search's confirmed header */
	struct pdu prov;	/* the search's first provisional header */
	__u64 now;
	__u32 to_target;
	__u32 proto;
	__u32 seq;		/* the sequence number of the payload's first byte (poff) */
	__u32 poff;		/* the payload in the skb: [poff, seg_end) */
	__u32 seg_end;
	__u32 carried;		/* bytes of asm_ before the payload (a carry), else 0 */
	__u32 base;		/* the sequence number of buf offset 0 */
	__u32 have;		/* the bytes of the header read into hdr */
	__u32 have2;		/* ... into hdr2 */
	__u8 tcpb[16];
	struct esp_key ek;
	struct esp_stats ev;
	__u32 scan_from;	/* where a search starts when the walk is off (a buf offset) */
	__u32 off;		/* where the walk is (a buf offset: asm_ then the payload) */
	__u32 cand_off;
	__u32 prov_off;
	__u32 search_start;	/* the search's start and the chunk it is at */
	__u32 search_chunk;
	__u32 acct_from;	/* where its bytes out of sync are counted from */
	__u32 walk_steps;	/* headers walked and searches begun in this segment */
	__u32 searches;
	__u32 mode;		/* MODE_* */
	__u8 cand_hd, cand_dd, prov_hd, prov_dd, found_prov, done, stop, pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

/* CRC32C (Castagnoli, reflected 0x82f63b78): iSCSI's header digest. */
static const __u32 crc32c_tab[256] = {
	0x00000000, 0xf26b8303, 0xe13b70f7, 0x1350f3f4, 0xc79a971f, 0x35f1141c, 0x26a1e7e8,
	0xd4ca64eb, 0x8ad958cf, 0x78b2dbcc, 0x6be22838, 0x9989ab3b, 0x4d43cfd0, 0xbf284cd3,
	0xac78bf27, 0x5e133c24, 0x105ec76f, 0xe235446c, 0xf165b798, 0x030e349b, 0xd7c45070,
	0x25afd373, 0x36ff2087, 0xc494a384, 0x9a879fa0, 0x68ec1ca3, 0x7bbcef57, 0x89d76c54,
	0x5d1d08bf, 0xaf768bbc, 0xbc267848, 0x4e4dfb4b, 0x20bd8ede, 0xd2d60ddd, 0xc186fe29,
	0x33ed7d2a, 0xe72719c1, 0x154c9ac2, 0x061c6936, 0xf477ea35, 0xaa64d611, 0x580f5512,
	0x4b5fa6e6, 0xb93425e5, 0x6dfe410e, 0x9f95c20d, 0x8cc531f9, 0x7eaeb2fa, 0x30e349b1,
	0xc288cab2, 0xd1d83946, 0x23b3ba45, 0xf779deae, 0x05125dad, 0x1642ae59, 0xe4292d5a,
	0xba3a117e, 0x4851927d, 0x5b016189, 0xa96ae28a, 0x7da08661, 0x8fcb0562, 0x9c9bf696,
	0x6ef07595, 0x417b1dbc, 0xb3109ebf, 0xa0406d4b, 0x522bee48, 0x86e18aa3, 0x748a09a0,
	0x67dafa54, 0x95b17957, 0xcba24573, 0x39c9c670, 0x2a993584, 0xd8f2b687, 0x0c38d26c,
	0xfe53516f, 0xed03a29b, 0x1f682198, 0x5125dad3, 0xa34e59d0, 0xb01eaa24, 0x42752927,
	0x96bf4dcc, 0x64d4cecf, 0x77843d3b, 0x85efbe38, 0xdbfc821c, 0x2997011f, 0x3ac7f2eb,
	0xc8ac71e8, 0x1c661503, 0xee0d9600, 0xfd5d65f4, 0x0f36e6f7, 0x61c69362, 0x93ad1061,
	0x80fde395, 0x72966096, 0xa65c047d, 0x5437877e, 0x4767748a, 0xb50cf789, 0xeb1fcbad,
	0x197448ae, 0x0a24bb5a, 0xf84f3859, 0x2c855cb2, 0xdeeedfb1, 0xcdbe2c45, 0x3fd5af46,
	0x7198540d, 0x83f3d70e, 0x90a324fa, 0x62c8a7f9, 0xb602c312, 0x44694011, 0x5739b3e5,
	0xa55230e6, 0xfb410cc2, 0x092a8fc1, 0x1a7a7c35, 0xe811ff36, 0x3cdb9bdd, 0xceb018de,
	0xdde0eb2a, 0x2f8b6829, 0x82f63b78, 0x709db87b, 0x63cd4b8f, 0x91a6c88c, 0x456cac67,
	0xb7072f64, 0xa457dc90, 0x563c5f93, 0x082f63b7, 0xfa44e0b4, 0xe9141340, 0x1b7f9043,
	0xcfb5f4a8, 0x3dde77ab, 0x2e8e845f, 0xdce5075c, 0x92a8fc17, 0x60c37f14, 0x73938ce0,
	0x81f80fe3, 0x55326b08, 0xa759e80b, 0xb4091bff, 0x466298fc, 0x1871a4d8, 0xea1a27db,
	0xf94ad42f, 0x0b21572c, 0xdfeb33c7, 0x2d80b0c4, 0x3ed04330, 0xccbbc033, 0xa24bb5a6,
	0x502036a5, 0x4370c551, 0xb11b4652, 0x65d122b9, 0x97baa1ba, 0x84ea524e, 0x7681d14d,
	0x2892ed69, 0xdaf96e6a, 0xc9a99d9e, 0x3bc21e9d, 0xef087a76, 0x1d63f975, 0x0e330a81,
	0xfc588982, 0xb21572c9, 0x407ef1ca, 0x532e023e, 0xa145813d, 0x758fe5d6, 0x87e466d5,
	0x94b49521, 0x66df1622, 0x38cc2a06, 0xcaa7a905, 0xd9f75af1, 0x2b9cd9f2, 0xff56bd19,
	0x0d3d3e1a, 0x1e6dcdee, 0xec064eed, 0xc38d26c4, 0x31e6a5c7, 0x22b65633, 0xd0ddd530,
	0x0417b1db, 0xf67c32d8, 0xe52cc12c, 0x1747422f, 0x49547e0b, 0xbb3ffd08, 0xa86f0efc,
	0x5a048dff, 0x8ecee914, 0x7ca56a17, 0x6ff599e3, 0x9d9e1ae0, 0xd3d3e1ab, 0x21b862a8,
	0x32e8915c, 0xc083125f, 0x144976b4, 0xe622f5b7, 0xf5720643, 0x07198540, 0x590ab964,
	0xab613a67, 0xb831c993, 0x4a5a4a90, 0x9e902e7b, 0x6cfbad78, 0x7fab5e8c, 0x8dc0dd8f,
	0xe330a81a, 0x115b2b19, 0x020bd8ed, 0xf0605bee, 0x24aa3f05, 0xd6c1bc06, 0xc5914ff2,
	0x37faccf1, 0x69e9f0d5, 0x9b8273d6, 0x88d28022, 0x7ab90321, 0xae7367ca, 0x5c18e4c9,
	0x4f48173d, 0xbd23943e, 0xf36e6f75, 0x0105ec76, 0x12551f82, 0xe03e9c81, 0x34f4f86a,
	0xc69f7b69, 0xd5cf889d, 0x27a40b9e, 0x79b737ba, 0x8bdcb4b9, 0x988c474d, 0x6ae7c44e,
	0xbe2da0a5, 0x4c4623a6, 0x5f16d052, 0xad7d5351,
};

static __always_inline void count(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &i);

	if (v)
		*v += 1;
}

static __always_inline void uncount(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &i);

	if (v)
		*v -= 1;
}

static __always_inline struct scratch *scr(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&scratch, &zero);
}

static __always_inline __u32 be24(const __u8 *p)
{
	return ((__u32)p[0] << 16) | ((__u32)p[1] << 8) | p[2];
}

/* Words of a header in the scratch (4-byte aligned: hdr and hdr2 start at multiples of
 * 8): one load each, not four, so that few registers are live and the stack is small. */
static __always_inline __u32 be32(const __u8 *p)
{
	return bpf_ntohl(*(const __u32 *)p);
}

static __always_inline __u64 be64(const __u8 *p)
{
	return ((__u64)be32(p) << 32) | be32(p + 4);
}

static __always_inline __u16 le16(const __u8 *p)
{
	return *(const __u16 *)p;
}

static __always_inline __u32 le32(const __u8 *p)
{
	return *(const __u32 *)p;
}

static __always_inline int is_scsi_read(__u8 c)
{
	return c == 0x08 || c == 0x28 || c == 0x88 || c == 0xA8;
}

static __always_inline int is_scsi_write(__u8 c)
{
	return c == 0x0A || c == 0x2A || c == 0x8A || c == 0xAA;
}

static __always_inline int sn_coherent(__u32 a, __u32 b)
{
	return !a || !b || (__u32)(b - a + SN_STEP_MAX) <= 2 * SN_STEP_MAX;
}

/* --------------------------------------------------------------- decoding (pdu.py) */

/* decode_iscsi(): the walk's belief of the 48 bytes at h. */
/* A login request or response: never digested (the digests a login negotiates start
 * after it), so its data segment says nothing of them (segment 0): pdu.py's _login(). */
static __always_inline int login_pdu(struct pdu *p, __u8 flags, __u8 ahs, __u32 dsl)
{
	p->header_bytes = ISCSI_BHS + 4 * (__u32)ahs;
	p->length = p->header_bytes + ((dsl + 3) & ~3u);
	p->segment = 0;
	p->kind = K_LOGIN;
	p->op = flags;
	p->sn = 0;
	return 1;
}

static __always_inline int decode_iscsi(const __u8 *h, int to_target, int hd, int dd,
					 __u32 limit, struct pdu *p)
{
	__u8 b0 = h[0], op = h[0] & 0x3F, flags = h[1], ahs = h[4];
	__u32 dsl = be24(h + 5), hdr, w20 = be32(h + 20);

	if (b0 & 0x80 || ahs > 64)
		return 0;
	hdr = ISCSI_BHS + 4 * (__u32)ahs + (hd ? 4 : 0);
	p->length = hdr + (dsl ? ((dsl + 3) & ~3u) + (dd ? 4 : 0) : 0);
	p->header_bytes = hdr;
	p->tag = be32(h + 16);
	p->data_bytes = dsl;
	p->segment = dsl;
	p->sn = be32(h + 28);
	p->volume = 0;
	p->kind = K_OTHER;
	p->op = 0;
	if (to_target) {
		if (op == 0x01) {
			if (flags & 0x18 || p->tag == 0xFFFFFFFF || dsl > limit)
				return 0;
			if (dsl && (!(flags & 0x20) || dsl > w20))
				return 0;
			p->kind = K_CMD;
			p->volume = be64(h + 8);
			p->data_bytes = w20;
			p->op = is_scsi_read(h[32]) ? OP_READ : is_scsi_write(h[32]) ? OP_WRITE : 0;
			return 1;
		}
		if (op == 0x05 || op == 0x00) {
			if (dsl > limit)
				return 0;
			p->kind = op == 0x05 ? K_DATA_OUT : K_OTHER;
			p->volume = be64(h + 8);
			return 1;
		}
		if (op == 0x03)
			return login_pdu(p, flags, ahs, dsl);
		if (!(op == 0x02 || op == 0x04 || op == 0x06 || op == 0x10 ||
		      (op >= 0x1C && op <= 0x1E)) || dsl > limit)
			return 0;
		if ((op == 0x02 || op == 0x06 || op == 0x10) && dsl)
			return 0;
		return 1;
	}
	if (op == 0x25) {
		if (flags & 0x38 || dsl > limit)
			return 0;
		if (flags & 0x01) {
			p->kind = K_DONE;
			p->op = h[3]; /* unused: the status */
		}
		return 1;
	}
	if (op == 0x21) {
		if (!(flags & 0x80) || flags & 0x61 || dsl > limit)
			return 0;
		p->kind = K_DONE;
		return 1;
	}
	if (op == 0x23)
		return login_pdu(p, flags, ahs, dsl);
	if (!((op >= 0x20 && op <= 0x26) || op == 0x31 || op == 0x32 || op == 0x3F ||
	      (op >= 0x3C && op <= 0x3E)) || dsl > limit)
		return 0;
	if ((op == 0x31 || op == 0x22 || op == 0x26) && dsl)
		return 0;
	return 1;
}

static __always_inline int login_flags_ok(__u8 flags)
{
	__u8 csg = (flags >> 2) & 3, nsg = flags & 3;

	if (flags & 0x30 || csg == 2)
		return 0;
	if (flags & 0x80)
		return !(flags & 0x40) && nsg != 2 && nsg > csg;
	return 1;
}

/* plausible_iscsi(): the resync's belief (the header digest aside: crc_matches()).
 * Fields are read where a rule needs them (W(x): the word at byte x), so that few are
 * live at once: the verifier's stack is small. */
#define W(x) be32(h + (x))
static __always_inline int plausible_iscsi(const __u8 *h, int to_target)
{
	__u8 op = h[0] & 0x3F, flags = h[1], ahs = h[4];
	__u32 dsl = be24(h + 5);
	int lun0 = !W(8) && !W(12), rsvd = !h[2] && !h[3];

	if (to_target) {
		if (op == 0x01) {
			if (h[2] || (flags & 7) > 4 || (!(flags & 0x80) && !(flags & 0x20)))
				return 0;
			if ((is_scsi_read(h[32]) && !(flags & 0x40)) ||
			    (is_scsi_write(h[32]) && !(flags & 0x20)))
				return 0;
			return ahs <= 16;
		}
		if (ahs)
			return 0;
		if (op == 0x05)
			return !(flags & 0x7F) && rsvd && !W(24) && !W(32) && !W(44) && dsl > 0;
		if (op == 0x00)
			return flags == 0x80 && rsvd && !W(32) && !W(36) && !W(40) && !W(44);
		if (op == 0x03)
			return h[0] == 0x43 && login_flags_ok(flags) && rsvd && !(W(20) & 0xFFFF) &&
			       !W(32) && !W(36) && !W(40) && !W(44);
		if (op == 0x04)
			return !(flags & 0x3F) && (flags & 0xC0) != 0xC0 && rsvd && !W(32) &&
			       !W(36) && !W(40) && !W(44);
		if (op == 0x02)
			return (flags & 0x80) && (flags & 0x7F) >= 1 && (flags & 0x7F) <= 14 &&
			       rsvd && !dsl && !W(40) && !W(44);
		if (op == 0x06)
			return (flags & 0x80) && (flags & 0x7F) <= 2 && rsvd && !dsl && lun0 &&
			       !(W(20) & 0xFFFF) && !W(32) && !W(36) && !W(40) && !W(44);
		if (op == 0x10)
			return (flags & 0xF0) == 0x80 && (flags & 0x0F) <= 3 && rsvd && !dsl &&
			       !W(24) && !W(32) && !W(36);
		return 0;
	}
	if (op != 0x23 && (__u32)(W(32) - W(28) + 1) > MAX_CMD_WINDOW)
		return 0;
	if (h[0] != op || (ahs && op != 0x21))
		return 0;
	if (op == 0x25) {
		if (flags & 0x01)
			return (flags & 0x80) && !h[2];
		return rsvd && dsl > 0;
	}
	if (op == 0x21)
		return h[2] <= 1 && lun0 && ahs <= 2;
	if (op == 0x31)
		return flags == 0x80 && rsvd && W(44) > 0;
	if (op == 0x20)
		return flags == 0x80 && rsvd && !W(36) && !W(40) && !W(44);
	if (op == 0x23)
		return login_flags_ok(flags) && rsvd && !W(20) && !(W(36) & 0xFFFF) && !W(40) &&
		       !W(44);
	if (op == 0x24)
		return !(flags & 0x3F) && (flags & 0xC0) != 0xC0 && rsvd && !W(36) && !W(40) &&
		       !W(44);
	if (op == 0x22)
		return flags == 0x80 && !h[3] && !dsl && lun0 && !W(20) && !W(36) && !W(40) &&
		       !W(44);
	if (op == 0x26)
		return flags == 0x80 && h[2] <= 3 && !h[3] && !dsl && lun0 && !W(20) && !W(36) &&
		       !W(44);
	if (op == 0x32)
		return flags == 0x80 && rsvd && W(16) == 0xFFFFFFFF;
	if (op == 0x3F)
		return flags == 0x80 && !h[3] && lun0 && W(16) == 0xFFFFFFFF && dsl >= 48;
	return 0;
}
#undef W

static __always_inline __u32 nvme_hlen(__u8 type)
{
	switch (type) {
	case 0x00: case 0x01: return NVME_IC_HLEN;
	case 0x04: return NVME_CMD_HLEN;
	case 0x02: case 0x03: case 0x05: case 0x06: case 0x07: case 0x09: return NVME_SMALL_HLEN;
	}
	return 0;
}

/* decode_nvme(): the walk's belief of the header at h (its hlen there). */
static __always_inline int decode_nvme(const __u8 *h, int to_target, __u32 limit,
				       struct pdu *p)
{
	__u8 type = h[0], flags = h[1], hlen = h[2], pdo = h[3];
	__u32 plen = le32(h + 4), hd = flags & 0x01 ? 4 : 0, dd = flags & 0x02 ? 4 : 0, datal;

	if (!hlen || nvme_hlen(type) != hlen)
		return 0;
	if (to_target != (type == 0x00 || type == 0x02 || type == 0x04 || type == 0x06))
		return 0;
	p->length = plen;
	p->header_bytes = pdo;
	p->kind = K_OTHER;
	p->op = 0;
	p->volume = 0;
	p->tag = 0;
	p->data_bytes = 0;
	p->segment = 0;
	p->sn = 0;
	if (type == 0x04) {
		__u8 opcode = h[8];
		__u32 data = 0;

		if (pdo) {
			if (pdo < hlen + hd || plen < pdo + dd)
				return 0;
			data = plen - pdo - dd;
		} else if (plen != hlen + hd) {
			return 0;
		}
		p->tag = le16(h + 10);
		p->volume = le32(h + 12);
		p->data_bytes = data;
		p->segment = data;
		p->kind = K_CMD;
		if (opcode == 0x02)
			p->op = OP_READ;
		else if (opcode == 0x01)
			p->op = OP_WRITE;
		else if (opcode == 0x7F && h[12] == 0x01)
			p->kind = K_CONNECT;
		return 1;
	}
	if (type == 0x05) {
		if (pdo || plen != hlen + hd)
			return 0;
		p->tag = le16(h + 20);
		p->kind = K_DONE;
		return 1;
	}
	if (type == 0x06 || type == 0x07) {
		datal = le32(h + 16);
		if (pdo < hlen + hd || plen != pdo + datal + dd || datal > MAX_DATA_BYTES)
			return 0;
		p->tag = le16(h + 8);
		p->data_bytes = datal;
		p->segment = datal;
		if (type == 0x06) {
			if (datal > limit)
				return 0;
			p->kind = K_DATA_OUT;
		} else if (flags & 0x08) {
			p->kind = K_DONE;
		}
		return 1;
	}
	if (type == 0x09) {
		if (pdo || plen != hlen + hd)
			return 0;
		p->tag = le16(h + 8);
		return 1;
	}
	if (type <= 0x01) {
		if (pdo || plen != hlen || flags)
			return 0;
		p->kind = K_IC;
		p->op = h[11];
		p->data_bytes = le32(h + 12);
		return 1;
	}
	/* TermReq: the header it rejects */
	if (pdo || plen < hlen + hd || plen > hlen + hd + 152)
		return 0;
	return 1;
}

/* plausible_nvme(): the resync's belief (decode_nvme() first). */
static __always_inline int plausible_nvme(const __u8 *h)
{
	__u8 type = h[0], flags = h[1], allowed = 0;

	switch (type) {
	case 0x04: allowed = 0x03; break;
	case 0x05: case 0x09: allowed = 0x01; break;
	case 0x06: allowed = 0x07; break;
	case 0x07: allowed = 0x0F; break;
	}
	if (flags & ~allowed)
		return 0;
	if (type == 0x04) {
		__u8 opcode = h[8], sf = h[9], sgl = h[47], st = sgl >> 4, sub = sgl & 0x0F;

		if (sf & 0x3C || (sf >> 6) == 3 || (sf & 3) == 3)
			return 0;
		if (!(st == 0 || st == 5) || !(sub == 0 || sub == 1 || sub == 0x0A))
			return opcode == 0x7F && !sf;
		return 1;
	}
	if (type == 0x07) {
		if ((flags & 0x08) && !(flags & 0x04))
			return 0;
		return !le16(h + 10) && !le32(h + 20) && le32(h + 16) > 0;
	}
	if (type == 0x06)
		return !le32(h + 20) && le32(h + 16) > 0;
	if (type == 0x09)
		return !le32(h + 20) && le32(h + 16) > 0;
	if (type <= 0x01) {
		if (le16(h + 8) || h[10] > 31 || (h[11] & ~3))
			return 0;
		if (type == 0x01 && le32(h + 12) < 4096)
			return 0;
		for (int i = 16; i < NVME_IC_HLEN; i += 4)
			if (le32(h + i))
				return 0;
		return 1;
	}
	return 1;
}

/* The bytes a header needs, by protocol and first byte (NVMe: type): 8 when unknown. */
static __always_inline __u32 header_need(int proto, __u8 first)
{
	__u32 hlen;

	if (proto == PROTO_ISCSI)
		return ISCSI_BHS;
	hlen = nvme_hlen(first);
	return hlen ? hlen : 8;
}

/* The search's first filter, on bytes 0-5 of a candidate (protocols.py's regular
 * expressions, the same bytes). */
static __always_inline int candidate(const __u8 *w, int proto, int to_target)
{
	__u8 b0 = w[0], b1 = w[1], b2 = w[2], b3 = w[3], b4 = w[4], b5 = w[5];

	if (proto == PROTO_NVME) {
		__u32 hl = nvme_hlen(b0);

		if (!hl || b1 > 0x0F || b2 != hl)
			return 0;
		return to_target == (b0 == 0x00 || b0 == 0x02 || b0 == 0x04 || b0 == 0x06);
	}
	if (to_target) {
		switch (b0) {
		case 0x00: case 0x40:
			return b1 == 0x80 && !b2 && !b3 && !b4 && b5 < 16;
		case 0x01: case 0x41:
			return !(b1 & 0x18) && (b1 & 7) <= 4 && !b2 && b4 <= 16 && b5 < 16;
		case 0x02: case 0x42:
			return b1 >= 0x81 && b1 <= 0x8E && !b2 && !b3 && !b4 && !b5;
		case 0x43:
			return !(b1 & 0x30) && !b2 && !b3 && !b4 && b5 < 16;
		case 0x04: case 0x44:
			return (b1 == 0 || b1 == 0x40 || b1 == 0x80) && !b2 && !b3 && !b4 && b5 < 16;
		case 0x05:
			return (b1 == 0 || b1 == 0x80) && !b2 && !b3 && !b4 && b5 < 16;
		case 0x06: case 0x46:
			return b1 >= 0x80 && b1 <= 0x82 && !b2 && !b3 && !b4 && !b5;
		case 0x10:
			return b1 >= 0x80 && b1 <= 0x83 && !b2 && !b3 && !b4 && !b5;
		}
		return 0;
	}
	switch (b0) {
	case 0x20:
		return b1 == 0x80 && !b2 && !b3 && !b4 && b5 < 16;
	case 0x21:
		return (b1 & 0x80) && !(b1 & 0x61) && b2 <= 1 && b4 <= 2 && b5 < 16;
	case 0x22:
		return b1 == 0x80 && !b3 && !b4 && !b5;
	case 0x23:
		return !(b1 & 0x30) && !b2 && !b3 && !b4 && b5 < 16;
	case 0x24:
		return (b1 == 0 || b1 == 0x40 || b1 == 0x80) && !b2 && !b3 && !b4 && b5 < 16;
	case 0x25:
		return !(b1 & 0x38) && !b2 && !b4 && b5 < 16;
	case 0x26:
		return b1 == 0x80 && b2 <= 3 && !b3 && !b4 && !b5;
	case 0x31:
		return b1 == 0x80 && !b2 && !b3 && !b4 && !b5;
	case 0x32:
		return b1 == 0x80 && !b2 && !b3 && !b4 && b5 < 16;
	case 0x3F:
		return b1 == 0x80 && !b3 && !b4 && b5 < 16;
	}
	return 0;
}

/* CRC32C of the first len bytes of h (len at most CRC_MAX). */
static __always_inline __u32 crc32c(const __u8 *h, __u32 len)
{
	__u32 c = 0xFFFFFFFF;

	for (int i = 0; i < CRC_MAX; i++) {
		__u32 x;

		if (i >= len)
			break;
		/* the mask after the XOR, kept: 6.1's verifier knows nothing of an XOR of two
		 * registers, and refuses an index it does not bound */
		x = c ^ h[i];
		asm volatile("" : "+r"(x));
		c = crc32c_tab[x & 0xFF] ^ (c >> 8);
	}
	return c ^ 0xFFFFFFFF;
}

/* ------------------------------------------------ the buffer: a carry, then the payload */

/* Copy len bytes (at most HDR_MAX) of the buffer from buf offset x into dst (HDR_MAX + 8
 * bytes): from the assembled carry below sc->carried, else from the payload. 0 when they
 * are not all there. */
static __always_inline int buf_read(struct __sk_buff *skb, struct scratch *sc, __u32 x,
				    __u32 len, __u8 *dst)
{
	__u32 blen = sc->carried + (sc->seg_end - sc->poff);

	if (len < 1 || len > HDR_MAX || x >= blen || blen - x < len)
		return 0;
	if (x < sc->carried) {
		for (int i = 0; i < HDR_MAX; i++) {
			if (i >= len)
				break;
			dst[i] = sc->asm_[(x + i) & (ASM_BYTES - 1)];
		}
		return 1;
	}
	return bpf_skb_load_bytes(skb, sc->poff + (x - sc->carried), dst,
				  LEN_MASKED(len, HDR_MAX)) == 0;
}

static __always_inline __u32 buf_len(struct scratch *sc)
{
	return sc->carried + (sc->seg_end - sc->poff);
}

/* A login request or response (never digested: pdu.py's LOGIN_OPCODES). */
static __always_inline int is_login(const __u8 *h)
{
	return (h[0] & 0x3F) == 0x03 || (h[0] & 0x3F) == 0x23;
}

/* Whether the 4 bytes after the header in h (read: `have` bytes of it) are its CRC32C:
 * 1, 0, or -1 when they are not there, its AHS is over 16 words, or it is a login's
 * (never digested): not judged. */
static __always_inline int crc_matches(const __u8 *h, __u32 have)
{
	__u32 end = ISCSI_BHS + 4 * (__u32)h[4];

	if (h[4] > 16 || end + 4 > have || end > CRC_MAX || is_login(h))
		return -1;
	return crc32c(h, end) == le32(h + (end & 0x7F));
}

/* ------------------------------------------------------------------ the tracker's part */

static __always_inline int has_volume(struct scratch *sc, __u64 volume)
{
	return sc->proto == PROTO_ISCSI || (volume != 0 && volume != 0xFFFFFFFF);
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

/* The volume's commands in flight on this connection go up (a command) or down (one
 * left: completed, retracted, replaced); from 0 to 1 a busy span opens at sc->now, from 1
 * to 0 it closes.  sc->vk is s's key (vol_of).  What userspace aged out since the last
 * move is taken off first: a span those commands alone held open closed when the last
 * of them aged (never before it opened, never after now). */
static __always_inline void busy_move(struct scratch *sc, struct vol_stats *s, int up)
{
	struct retired_val *r = NULL;
	__u64 count = 0, at = 0, now = sc->now, n, gen = 0;
	__u32 zero = 0;
	__u64 *g = bpf_map_lookup_elem(&retired_gen, &zero);

	if (g)
		gen = *g;
	if (gen != s->gen) /* userspace wrote to retired since this one looked: look */
		r = bpf_map_lookup_elem(&retired, &sc->vk);
	if (r) {
		count = r->count;
		at = r->at_ns;
	}
	bpf_spin_lock(&s->lock);
	if (gen > s->gen)
		s->gen = gen;
	if (count > s->retired) {
		n = count - s->retired;
		s->retired = count;
		if (n < s->outstanding) {
			s->outstanding -= n;
		} else if (s->outstanding) {
			s->outstanding = 0;
			if (at > now)
				at = now;
			if (at > s->since_ns)
				s->busy_ns += at - s->since_ns;
		}
	}
	if (up) {
		if (s->outstanding == 0)
			s->since_ns = now;
		s->outstanding++;
	} else if (s->outstanding) {
		s->outstanding--;
		if (s->outstanding == 0 && now > s->since_ns)
			s->busy_ns += now - s->since_ns;
	}
	bpf_spin_unlock(&s->lock);
}

/* A command of this connection left the map inflight (its tag_key deleted by the caller,
 * who alone did: userspace ageing it out at the same time counts it there). */
static __always_inline void busy_left(struct scratch *sc, __u64 volume)
{
	struct vol_stats *s;

	if (!has_volume(sc, volume))
		return;
	s = vol_of(sc, volume);
	if (s)
		busy_move(sc, s, 0);
}

/* The other direction's flow of this connection (or NULL). */
static __always_inline struct flow *other_flow(struct scratch *sc)
{
	__builtin_memcpy(&sc->ok.conn, &sc->fk.conn, sizeof(sc->ok.conn));
	sc->ok.to_target = !sc->fk.to_target;
	return bpf_map_lookup_elem(&flows, &sc->ok);
}

/* A command goes in flight (tracker.py's _command); provisional: its write bytes held. */
static __always_inline void command(struct scratch *sc, struct pdu *p, int provisional)
{
	struct vol_stats *s;

	__builtin_memcpy(&sc->tk.conn, &sc->fk.conn, sizeof(sc->tk.conn));
	sc->tk.tag = p->tag;
	sc->n.start_ns = sc->now;
	sc->n.volume = p->volume;
	sc->n.op = p->op;
	sc->n.prov = provisional;
	sc->n.held_bytes = 0;
	count(C_COMMANDS);
	if (p->op == OP_WRITE && has_volume(sc, p->volume) && p->data_bytes) {
		if (provisional) {
			sc->n.held_bytes = p->data_bytes;
		} else {
			s = vol_of(sc, p->volume);
			if (s)
				__sync_fetch_and_add(&s->write_bytes, p->data_bytes);
		}
	}
	/* in the map before it counts as in flight: a walk of the map that finds none of a
	 * volume's commands while it counts some in flight (ksums.py) is never early */
	if (bpf_map_update_elem(&inflight, &sc->tk, &sc->n, BPF_NOEXIST)) {
		struct inflight *old = bpf_map_lookup_elem(&inflight, &sc->tk);
		__u64 volume = old ? old->volume : 0;

		count(C_REPLACED);
		bpf_map_update_elem(&inflight, &sc->tk, &sc->n, BPF_ANY);
		if (old) /* the command it replaces left */
			busy_left(sc, volume);
	}
	if (has_volume(sc, p->volume)) {
		s = vol_of(sc, p->volume);
		if (s)
			busy_move(sc, s, 1);
	}
}

/* The command with tag completes (it was looked up: f), and leaves. */
static __always_inline void completed(struct scratch *sc, struct inflight *f)
{
	struct vol_stats *s;
	__u64 volume = f->volume, took = sc->now - f->start_ns;
	__u32 held = f->held_bytes;
	__u8 op = f->op;
	int gone;

	count(C_COMPLETIONS);
	gone = !bpf_map_delete_elem(&inflight, &sc->tk); /* else userspace aged it out */
	if (!has_volume(sc, volume))
		return;
	s = vol_of(sc, volume);
	if (!s)
		return;
	if (gone)
		busy_move(sc, s, 0);
	if (held)
		__sync_fetch_and_add(&s->write_bytes, held);
	if (op == OP_READ) {
		__sync_fetch_and_add(&s->reads, 1);
		__sync_fetch_and_add(&s->read_ns, took);
	} else if (op == OP_WRITE) {
		__sync_fetch_and_add(&s->writes, 1);
	}
}

/* NVMe write data for the command with tag: its bytes to its volume. */
static __always_inline void write_data(struct scratch *sc, __u32 tag, __u32 nbytes)
{
	struct inflight *f;
	struct vol_stats *s;

	if (sc->proto != PROTO_NVME)
		return;
	__builtin_memcpy(&sc->tk.conn, &sc->fk.conn, sizeof(sc->tk.conn));
	sc->tk.tag = tag;
	f = bpf_map_lookup_elem(&inflight, &sc->tk);
	if (f && f->op == OP_WRITE && has_volume(sc, f->volume)) {
		__u64 volume = f->volume;

		s = vol_of(sc, volume);
		if (s)
			__sync_fetch_and_add(&s->write_bytes, nbytes);
	}
}

/* A login's final answer moves the connection to full feature: its digests, unknown to
 * the program until userspace reads the text, are found by the walk (CRC32C, alt_seq). */
static __always_inline void full_feature(struct scratch *sc, struct flow *fl)
{
	struct flow *o = other_flow(sc);

	fl->hd_known = fl->dd_known = 0;
	fl->hd = fl->dd = 0;
	fl->alt_valid = 0;
	fl->await_login = 1;
	if (o) {
		o->hd_known = o->dd_known = 0;
		o->hd = o->dd = 0;
		o->alt_valid = 0;
		o->await_login = 1;
	}
}

/* The tracker's sink (tracker.py's _pdu), sc->p: 0 when it shows the walk is off (a
 * run of UNMATCHED_RUN completions of nothing while the commands' direction is in sync). */
__noinline int on_pdu(struct __sk_buff *skb, struct flow *fl)
{
	struct scratch *sc = scr();
	struct inflight *f;
	struct pdu *p;
	struct flow *o;

	if (!skb || !fl || !sc)
		return 1;
	p = &sc->p;
	if (p->kind == K_DONE && !sc->to_target) {
		__builtin_memcpy(&sc->tk.conn, &sc->fk.conn, sizeof(sc->tk.conn));
		sc->tk.tag = p->tag;
		f = bpf_map_lookup_elem(&inflight, &sc->tk);
		if (!f) {
			count(C_UNMATCHED);
			fl->unmatched_run++;
			if (fl->unmatched_run >= UNMATCHED_RUN) {
				o = other_flow(sc);
				if (o && o->state == SYNCED) {
					fl->unmatched_run = 0;
					return 0;
				}
			}
			return 1;
		}
		fl->unmatched_run = 0;
		completed(sc, f);
	} else if ((p->kind == K_CMD || p->kind == K_CONNECT) && sc->to_target) {
		command(sc, p, 0);
	} else if (p->kind == K_DATA_OUT && sc->to_target) {
		write_data(sc, p->tag, p->data_bytes);
	} else if (p->kind == K_LOGIN && !sc->to_target && (p->op & 0x80) && (p->op & 3) == 3) {
		full_feature(sc, fl);
	} else if (p->kind == K_IC && !sc->to_target && p->data_bytes >= MIN_SEGMENT_LIMIT) {
		o = other_flow(sc);
		if (o)
			o->limit = p->data_bytes; /* the controller's MAXH2CDATA */
	}
	return 1;
}

/* A header a resync took before its successor was there (tracker.py's _Side). */
__noinline int on_provisional(struct __sk_buff *skb, struct flow *fl)
{
	struct scratch *sc = scr();
	struct inflight *f;
	struct pdu *p;

	if (!skb || !fl || !sc)
		return 0;
	p = &sc->p;
	fl->prov_what = PROV_NONE;
	if ((p->kind == K_CMD || p->kind == K_CONNECT) && sc->to_target) {
		command(sc, p, 1);
		fl->prov_what = PROV_CMD;
		fl->prov_tag = p->tag;
	} else if (p->kind == K_DONE && !sc->to_target) {
		__builtin_memcpy(&sc->tk.conn, &sc->fk.conn, sizeof(sc->tk.conn));
		sc->tk.tag = p->tag;
		f = bpf_map_lookup_elem(&inflight, &sc->tk);
		if (f)
			completed(sc, f);
		else
			fl->prov_what = PROV_UNMATCHED;
	} else if (p->kind == K_DATA_OUT && sc->to_target && sc->proto == PROTO_NVME) {
		fl->prov_what = PROV_DATA;
		fl->prov_tag = p->tag;
		fl->prov_bytes = p->data_bytes;
	} else {
		on_pdu(skb, fl);
	}
	return 0;
}

/* The provisional header's successor is there: what it did holds. */
static __always_inline void confirm(struct scratch *sc, struct flow *fl)
{
	struct inflight *f;
	struct vol_stats *s;
	__u8 what = fl->prov_what;

	fl->prov_what = PROV_NONE;
	if (what == PROV_UNMATCHED) {
		count(C_UNMATCHED);
	} else if (what == PROV_DATA) {
		write_data(sc, fl->prov_tag, fl->prov_bytes);
	} else if (what == PROV_CMD) {
		__builtin_memcpy(&sc->tk.conn, &sc->fk.conn, sizeof(sc->tk.conn));
		sc->tk.tag = fl->prov_tag;
		f = bpf_map_lookup_elem(&inflight, &sc->tk);
		if (f && f->prov) {
			__u32 held = f->held_bytes;
			__u64 volume = f->volume;

			f->prov = 0;
			f->held_bytes = 0;
			if (held && has_volume(sc, volume)) {
				s = vol_of(sc, volume);
				if (s)
					__sync_fetch_and_add(&s->write_bytes, held);
			}
		}
	}
}

/* ---------------------------------------------------------------- events (logins) */

/* An event with up to `want` (at most NAME_BYTES) bytes of the skb from `from`;
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

/* The text of the login or connect whose header (sc->p) is at buf offset at: what this
 * segment holds of it now, the rest from the next ones (fl->body_left). */
__noinline int login_text(struct __sk_buff *skb, struct flow *fl, __u32 at)
{
	struct scratch *sc = scr();
	struct pdu *p;
	__u32 from, body;

	if (!skb || !fl || !sc)
		return 0;
	p = &sc->p;
	if (p->kind != K_LOGIN && p->kind != K_CONNECT)
		return 0;
	from = at + p->header_bytes;
	if (from < sc->carried)
		return 0; /* the text began in a carried header: not read (a header is cut) */
	from = sc->poff + (from - sc->carried);
	body = p->data_bytes < BODY_MAX ? p->data_bytes : BODY_MAX;
	fl->body_left = emit_text(skb, &sc->fk.conn, p->kind == K_LOGIN ? EV_LOGIN : EV_CONNECT,
				  sc->to_target, from, sc->seg_end, body, p->op, p->data_bytes);
	return 0;
}

/* The text a login's or connect's header left to this segment (fl->body_left bytes). */
__noinline int body_text(struct __sk_buff *skb, struct flow *fl)
{
	struct scratch *sc = scr();

	if (!skb || !fl || !sc)
		return 0;
	fl->body_left = emit_text(skb, &sc->fk.conn, EV_BODY, sc->to_target, sc->poff,
				  sc->seg_end, fl->body_left, 0, 0);
	return 0;
}

/* ------------------------------------------------- the walk's state (flow.py, belief.py) */

static __always_inline void lose(struct scratch *sc, struct flow *fl)
{
	if (fl->state == SYNCED)
		fl->lost_since_ns = sc->now;
	fl->state = LOST;
	fl->carry_len = 0;
	fl->held_kind = HELD_NONE;
	fl->alt_valid = 0;
	fl->body_left = 0;
}

static __always_inline void synced(struct scratch *sc, struct flow *fl)
{
	if (fl->state != SYNCED && fl->lost_since_ns)
		fl->out_ns += sc->now - fl->lost_since_ns;
	fl->lost_since_ns = 0;
	fl->state = SYNCED;
}

/* The provisional header's successor is not there: what it did is undone. */
static __always_inline void retract(struct scratch *sc, struct flow *fl)
{
	struct inflight *f;
	__u8 what = fl->prov_what;

	fl->retracted++;
	count(C_RETRACTED);
	if (fl->held_kind == HELD_PROVISIONAL) { /* never handed on: nothing to undo */
		fl->held_kind = HELD_NONE;
		fl->body_left = 0;
		return;
	}
	fl->prov_what = PROV_NONE;
	if (what != PROV_CMD)
		return;
	__builtin_memcpy(&sc->tk.conn, &sc->fk.conn, sizeof(sc->tk.conn));
	sc->tk.tag = fl->prov_tag;
	f = bpf_map_lookup_elem(&inflight, &sc->tk);
	if (f && f->prov) { /* not completed: it was never a command */
		__u64 volume = f->volume;

		if (!bpf_map_delete_elem(&inflight, &sc->tk))
			busy_left(sc, volume);
		uncount(C_COMMANDS);
	}
}

static __always_inline void set_unmeasurable(struct scratch *sc, struct flow *fl, __u8 why)
{
	if (fl->state == SYNCED)
		fl->lost_since_ns = sc->now;
	fl->state = UNMEASURABLE;
	fl->reason = why;
	fl->carry_len = 0;
	fl->held_kind = HELD_NONE;
	fl->body_left = 0;
}

/* Nothing here is iSCSI or NVMe/TCP (protocols.Sniffer): the connection is not measured. */
static __always_inline void unmeasurable(struct scratch *sc, struct flow *fl, __u8 why)
{
	struct flow *o = other_flow(sc);

	fl->out_bytes += fl->unparsed;
	set_unmeasurable(sc, fl, why);
	if (!o || o->state != UNMEASURABLE)
		count(C_UNMEASURABLE);
	if (o)
		set_unmeasurable(sc, o, why);
}

/* A stream never proven: is it storage traffic at all?  1: it is UNMEASURABLE now. */
static __always_inline int unparsed(struct __sk_buff *skb, struct scratch *sc, struct flow *fl)
{
	__u32 blen = buf_len(sc), len;
	__u8 *h = sc->hdr2;

	if (buf_read(skb, sc, 0, 5, h) && h[0] >= 20 && h[0] <= 23 && h[1] == 3 && h[2] >= 1 &&
	    h[2] <= 4 && (((__u32)h[3] << 8) | h[4]) <= (1u << 14) + 2048) {
		fl->tls_seen = 1;
		if (h[0] == 22 && !fl->out_bytes) { /* its handshake */
			unmeasurable(sc, fl, WHY_TLS);
			return 1;
		}
	}
	len = fl->unparsed + blen;
	fl->unparsed = len < fl->unparsed ? 0xFFFFFFFF : len;
	if (fl->unparsed < UNPARSED_BYTES)
		return 0;
	unmeasurable(sc, fl, fl->tls_seen ? WHY_TLS : WHY_UNPARSED);
	return 1;
}

/* While the data digest is unproven: where the header after p would be with the other
 * setting. */
static __always_inline void note_alt(struct scratch *sc, struct flow *fl, __u32 off,
				     struct pdu *p)
{
	if (fl->dd_known || !p->segment)
		return;
	fl->alt_seq = sc->base + off + p->length + (fl->dd ? -4 : 4);
	fl->alt_valid = 1;
}

/* A header cut by the buffer's end (at buf offset x): its bytes kept for the next one. */
static __always_inline void keep(struct __sk_buff *skb, struct scratch *sc, struct flow *fl,
				 __u32 x)
{
	__u32 blen = buf_len(sc), n = blen > x ? blen - x : 0;

	fl->carry_len = 0;
	fl->carry_seq = sc->base + x;
	fl->next_seq = fl->carry_seq;
	if (n < 1 || n >= CARRY_BYTES)
		return;
	if (x < sc->carried) { /* still cut: the carry and all of this payload */
		for (int i = 0; i < CARRY_BYTES; i++) {
			if (i >= n)
				break;
			fl->carry[i] = sc->asm_[(x + i) & (ASM_BYTES - 1)];
		}
	} else if (bpf_skb_load_bytes(skb, sc->poff + (x - sc->carried), fl->carry,
				      LEN_MASKED(n, CARRY_BYTES))) {
		return;
	}
	fl->carry_len = n;
}

/* The header at buf offset x read into hdr (h: `have` bytes of it) and its length
 * needed: 0 when it is not all in the buffer. */
static __always_inline __u32 read_header(struct __sk_buff *skb, struct scratch *sc, __u32 x,
					 __u8 *h, __u32 *have)
{
	__u32 blen = buf_len(sc), need, n;

	if (x >= blen || blen - x < 8)
		return 0;
	n = blen - x < HDR_MAX ? blen - x : HDR_MAX;
	if (!buf_read(skb, sc, x, n, h))
		return 0;
	need = header_need(sc->proto, h[0]);
	if (n < need)
		return 0;
	*have = n;
	return need;
}

#define CHECK_DECODE 0	/* decode_*() only */
#define CHECK_PLAUSIBLE 1	/* and plausible_*() */
#define CHECK_DIGEST 2	/* and with a header digest its CRC32C */

/* The iSCSI header read into hdr (which 0, decoded into p) or hdr2 (which 1, into q):
 * 0 when it does not decode, 1 when it decodes but the check (mode) fails, 2 when it
 * passes.  NVMe's: nvme_check().  Global functions: each verified once, small frames. */
__noinline int iscsi_check(struct flow *fl, int which, int hd, int dd, int mode)
{
	struct scratch *sc = scr();

	if (!fl || !sc)
		return 0;
	if (!decode_iscsi(which ? sc->hdr2 : sc->hdr, sc->to_target, hd, dd, fl->limit,
			  which ? &sc->q : &sc->p))
		return 0;
	if (mode == CHECK_DECODE)
		return 2;
	if (mode == CHECK_DIGEST && hd && !is_login(which ? sc->hdr2 : sc->hdr) &&
	    crc_matches(which ? sc->hdr2 : sc->hdr, which ? sc->have2 : sc->have) != 1)
		return 1;
	return plausible_iscsi(which ? sc->hdr2 : sc->hdr, sc->to_target) ? 2 : 1;
}

__noinline int nvme_check(struct flow *fl, int which, int mode)
{
	struct scratch *sc = scr();

	if (!fl || !sc)
		return 0;
	if (!decode_nvme(which ? sc->hdr2 : sc->hdr, sc->to_target, fl->limit,
			 which ? &sc->q : &sc->p))
		return 0;
	if (mode == CHECK_DECODE)
		return 2;
	return plausible_nvme(which ? sc->hdr2 : sc->hdr) ? 2 : 1;
}

static __always_inline int hdr_check(struct scratch *sc, struct flow *fl, int which, int hd,
				     int dd, int mode)
{
	if (sc->proto == PROTO_ISCSI)
		return iscsi_check(fl, which, hd, dd, mode);
	return nvme_check(fl, which, mode);
}

/* ---------------------------------------------------------- the search (protocols.py) */

/* The candidate at buf offset x (the search's loop body): FOUND_CONFIRMED (sc->cand),
 * FOUND_PROVISIONAL (sc->prov, the search's first), or FOUND_NONE. */
static __always_inline int try_at(struct __sk_buff *skb, struct scratch *sc, struct flow *fl,
				  __u32 x)
{
	__u32 need, blen;
	int hd = 0, dd0 = 0, nch = 1, res = FOUND_NONE, crc, r;
	__u64 nxt;

	blen = buf_len(sc);
	need = read_header(skb, sc, x, sc->hdr, &sc->have);
	if (!need)
		return FOUND_NONE;
	if (sc->proto == PROTO_ISCSI) {
		crc = crc_matches(sc->hdr, sc->have);
		if (fl->hd_known) {
			hd = fl->hd;
			if (crc >= 0 && crc != hd)
				return FOUND_NONE;
		} else {
			hd = crc == 1;
		}
		if (fl->dd_known)
			dd0 = fl->dd;
		else
			nch = 2;
	}
	for (int c = 0; c < 2; c++) {
		int dd = c ? 1 : dd0;

		if (c >= nch)
			break;
		r = hdr_check(sc, fl, 0, hd, dd, CHECK_PLAUSIBLE);
		if (!r || sc->p.length > RESYNC_MAX)
			continue;
		if (r == 1)
			break;
		nxt = (__u64)x + sc->p.length;
		if (nxt + 8 <= blen) {
			need = read_header(skb, sc, (__u32)nxt, sc->hdr2, &sc->have2);
			if (need && nxt + need <= blen) {
				if (hdr_check(sc, fl, 1, hd, dd, CHECK_DIGEST) != 2)
					continue;
				if (!sn_coherent(sc->p.sn, sc->q.sn))
					continue;
				sc->cand = sc->p;
				sc->cand_hd = hd;
				sc->cand_dd = dd;
				return FOUND_CONFIRMED;
			}
		}
		if (res == FOUND_NONE && !sc->found_prov) {
			sc->prov = sc->p;
			sc->prov_hd = hd;
			sc->prov_dd = dd;
			sc->prov_off = x;
			sc->found_prov = 1;
			res = FOUND_PROVISIONAL;
		}
	}
	return res;
}

/* The search at buf offset pos + j, whose first bytes are in the chunk (sc->win): the
 * regular expression's filter (candidate()), then try_at().  A global function. */
__noinline int search_at(struct __sk_buff *skb, struct flow *fl, __u32 pos, __u32 j)
{
	struct scratch *sc = scr();

	if (!skb || !fl || !sc)
		return FOUND_NONE;
	j &= 63;
	asm volatile("" : "+r"(j)); /* the mask kept: the verifier sees the bound */
	if (!candidate(&sc->win[j & 63], sc->proto, sc->to_target))
		return FOUND_NONE;
	return try_at(skb, sc, fl, pos + j);
}

/* A provisional header (sc->prov at sc->prov_off): handed on (or held to its last
 * byte); the walk waits for its successor (belief.py's _take). */
static __always_inline void take(struct __sk_buff *skb, struct scratch *sc, struct flow *fl)
{
	__u32 off = sc->prov_off, blen = buf_len(sc);
	__u64 nxt;

	if (fl->state == PROVISIONAL) /* the newer header takes over */
		retract(sc, fl);
	fl->hd = sc->prov_hd;
	fl->dd = sc->prov_dd;
	if (sc->prov_hd)
		fl->hd_known = 1; /* its CRC32C matched */
	fl->resyncs++;
	count(C_RESYNCS);
	count(C_PDUS);
	fl->state = PROVISIONAL;
	sc->p = sc->prov;
	nxt = (__u64)off + sc->p.length;
	login_text(skb, fl, off);
	if (nxt <= blen) {
		on_provisional(skb, fl);
	} else {
		fl->held = sc->p;
		fl->held_kind = HELD_PROVISIONAL;
	}
	fl->sn = sc->p.kind != K_LOGIN ? sc->p.sn : 0;
	note_alt(sc, fl, off, &sc->p);
	if (nxt < blen)
		keep(skb, sc, fl, (__u32)nxt);
	else
		fl->next_seq = sc->base + (__u32)nxt;
}

/* ------------------------------------------------------- one segment's steps, in a loop
 *
 * A segment's walk and searches run in one bpf_loop() (5.17) whose body, step_cb(), is
 * verified once: each step either walks one header (MODE_WALK) or searches 64 bytes
 * (MODE_SEARCH), so that no search runs inside the walk's call chain and the stack
 * stays within 6.1's 512 bytes.  The Python walker has the same bounds: MAX_WALK
 * headers walked and MAX_SEARCHES searches of SEARCH_CHUNKS x 64 bytes a segment. */
#define MODE_DONE 0
#define MODE_WALK 1
#define MODE_SEARCH 2

struct loop_ctx {
	struct __sk_buff *skb;
	struct flow *fl;
};

/* The segment ran into a bound: the walk is LOST (counted). */
static __always_inline void truncated(struct scratch *sc, struct flow *fl)
{
	count(C_TRUNCATED_WALKS);
	lose(sc, fl);
	sc->mode = MODE_DONE;
}

/* A search from buf offset start (not inside a carry); acct_from: where the bytes out of
 * sync are counted from when it ends. */
static __always_inline void search_begin(struct scratch *sc, struct flow *fl, __u32 start,
					 __u32 acct_from)
{
	if (++sc->searches > MAX_SEARCHES) {
		truncated(sc, fl);
		return;
	}
	sc->search_start = start < sc->carried ? sc->carried : start;
	sc->search_chunk = 0;
	sc->found_prov = 0;
	sc->acct_from = acct_from;
	sc->mode = MODE_SEARCH;
}

/* The walk is off at off (flow.py's _off): a desync (once a header was proven), LOST,
 * and a search from start; or, never proven and now found not measurable, done. */
static __always_inline void walk_stray(struct __sk_buff *skb, struct scratch *sc,
				       struct flow *fl, __u32 start, __u32 off, int desync)
{
	if (desync && fl->proven) {
		fl->desyncs++;
		count(C_DESYNCS);
	}
	lose(sc, fl);
	if (!fl->proven && unparsed(skb, sc, fl)) {
		sc->mode = MODE_DONE;
		return;
	}
	search_begin(sc, fl, start, off);
}

/* The search ended (belief.py's _resync): confirmed at sc->cand_off (SYNCED, the walk
 * goes on from there), else its first provisional header taken, and done. */
static __always_inline void search_end(struct __sk_buff *skb, struct scratch *sc,
				       struct flow *fl, int confirmed)
{
	__u32 upto = confirmed ? sc->cand_off : buf_len(sc);

	if (upto > sc->acct_from)
		fl->out_bytes += upto - sc->acct_from;
	if (!confirmed) {
		if (sc->found_prov)
			take(skb, sc, fl);
		sc->mode = MODE_DONE;
		return;
	}
	fl->hd = sc->cand_hd;
	fl->dd = sc->cand_dd;
	fl->hd_known = 1;
	if (sc->cand.segment)
		fl->dd_known = 1;
	fl->sn = 0;
	fl->proven = 1;
	fl->resyncs++;
	count(C_RESYNCS);
	if (fl->state == PROVISIONAL)
		retract(sc, fl);
	synced(sc, fl);
	sc->off = sc->scan_from = sc->cand_off;
	sc->mode = MODE_WALK;
}

/* 64 offsets of the search (protocols.search()): the chunk sc->search_chunk. */
static __always_inline void search_step(struct __sk_buff *skb, struct scratch *sc,
					struct flow *fl)
{
	__u32 blen = buf_len(sc), k, pos = sc->search_start + sc->search_chunk * 64;

	if (sc->search_chunk >= SEARCH_CHUNKS || pos >= blen || pos < sc->carried) {
		search_end(skb, sc, fl, 0);
		return;
	}
	sc->search_chunk++;
	k = blen - pos < 70 ? blen - pos : 70;
	if (k < 6 || bpf_skb_load_bytes(skb, sc->poff + (pos - sc->carried), sc->win,
					LEN_MASKED(k, HDR_MAX)))
		return;
	for (int j = 0; j < 64; j++) {
		if (j + 6 > k)
			break;
		if (search_at(skb, fl, pos, j) == FOUND_CONFIRMED) {
			sc->cand_off = pos + j;
			search_end(skb, sc, fl, 1);
			return;
		}
	}
}

/* The header at sc->off must prove itself (belief.py's _prove): it follows a
 * provisional header, or one whose data digest is unproven. 1: it does (sc->p, maybe
 * at the other data digest's place, sc->off). */
__noinline int prove(struct __sk_buff *skb, struct flow *fl, int ok)
{
	struct scratch *sc = scr();
	__u32 need, blen;
	int good = 0, alt_valid;
	__s32 alt = -1;

	if (!skb || !fl || !sc)
		return 0;
	blen = buf_len(sc);
	alt_valid = fl->alt_valid;
	if (alt_valid)
		alt = (__s32)(fl->alt_seq - sc->base);
	if (ok && hdr_check(sc, fl, 0, fl->hd, fl->dd, CHECK_DIGEST) == 2 &&
	    sn_coherent(fl->sn, sc->p.sn))
		good = 1;
	if (!good && alt_valid && alt >= 0) {
		need = read_header(skb, sc, (__u32)alt, sc->hdr2, &sc->have2);
		if (need && (__u32)alt + need <= blen &&
		    hdr_check(sc, fl, 1, fl->hd, !fl->dd, CHECK_DIGEST) == 2 &&
		    sn_coherent(fl->sn, sc->q.sn)) {
			fl->dd = !fl->dd;
			sc->p = sc->q;
			sc->off = (__u32)alt;
			good = 1;
		}
	}
	if (good && alt_valid)
		fl->dd_known = 1; /* a header where a data digest setting said */
	fl->alt_valid = 0;
	if (!good) {
		if (fl->state == PROVISIONAL) {
			retract(sc, fl);
			lose(sc, fl);
		}
		return 0;
	}
	if (fl->state == PROVISIONAL) {
		synced(sc, fl);
		confirm(sc, fl);
	}
	return 1;
}

/* One header of the walk (flow.py's _walk, one turn of its loop). */
static __always_inline void walk_step(struct __sk_buff *skb, struct scratch *sc,
				      struct flow *fl)
{
	__u32 off = sc->off, blen = buf_len(sc), need;
	int ok, was;
	__u64 end;

	if (off >= blen) {
		fl->next_seq = sc->base + off;
		sc->mode = MODE_DONE;
		return;
	}
	if (++sc->walk_steps > MAX_WALK) { /* the kernel's bound, the Python walker's too */
		truncated(sc, fl);
		return;
	}
	need = read_header(skb, sc, off, sc->hdr, &sc->have);
	if (!need) { /* a header cut by the segment's end */
		keep(skb, sc, fl, off);
		sc->mode = MODE_DONE;
		return;
	}
	if (sc->proto == PROTO_ISCSI && !fl->hd_known) {
		int crc = crc_matches(sc->hdr, sc->have);

		if (crc >= 0) {
			fl->hd_known = 1;
			fl->hd = crc;
		}
	}
	ok = hdr_check(sc, fl, 0, fl->hd, fl->dd, CHECK_DECODE) == 2;
	if (fl->state != SYNCED || fl->alt_valid) {
		was = fl->state;
		ok = prove(skb, fl, ok);
		if (!ok && was == PROVISIONAL) { /* retracted: all the bytes again */
			walk_stray(skb, sc, fl, 0, off, 0);
			return;
		}
		off = sc->off;
	} else if (ok && sc->p.sn && fl->sn && !sn_coherent(fl->sn, sc->p.sn) &&
		   sc->p.kind != K_LOGIN) {
		ok = 0; /* its sequence number is not the walk's */
	}
	if (!ok) { /* not a header where one must be */
		walk_stray(skb, sc, fl, sc->scan_from, off, 1);
		return;
	}
	end = (__u64)off + sc->p.length;
	count(C_PDUS);
	fl->proven = 1;
	login_text(skb, fl, off);
	if (end > blen) { /* its last byte comes later: so does its time */
		fl->held = sc->p;
		fl->held_kind = HELD;
	} else if (!on_pdu(skb, fl)) { /* the tracker says the walk is off here */
		walk_stray(skb, sc, fl, off + 1, off, 1);
		return;
	}
	if (sc->p.sn && sc->p.kind != K_LOGIN)
		fl->sn = sc->p.sn;
	note_alt(sc, fl, off, &sc->p);
	sc->scan_from = off + 1;
	sc->off = end > 0x7FFFFFFF ? 0x7FFFFFFF : (__u32)end;
}

/* One step of the segment: a header walked, or 64 bytes searched.  1: done. */
static long step_cb(__u32 i, void *arg)
{
	struct loop_ctx *l = arg;
	struct scratch *sc = scr();
	struct flow *fl = l->fl;

	if (!sc || !fl)
		return 1;
	if (sc->mode == MODE_WALK)
		walk_step(l->skb, sc, fl);
	else if (sc->mode == MODE_SEARCH)
		search_step(l->skb, sc, fl);
	return sc->mode == MODE_DONE;
}

#define HANDED_ON 1

/* The held PDU's last byte is in this segment (before buf offset end): it goes to the
 * tracker (provisional: to its hooks) with this segment's time.  HANDED_ON; else the
 * tracker said the walk was off (a search from end is set up, or done). */
static __always_inline int release(struct __sk_buff *skb, struct scratch *sc,
				   struct flow *fl, __u32 end)
{
	__u8 kind = fl->held_kind;

	sc->p = fl->held;
	fl->held_kind = HELD_NONE;
	if (kind == HELD_PROVISIONAL) {
		on_provisional(skb, fl);
		return HANDED_ON;
	}
	if (on_pdu(skb, fl))
		return HANDED_ON;
	walk_stray(skb, sc, fl, end, end, 1);
	return 0;
}

/* A segment of a stream whose place is unknown (flow.py's _lost): a search from its
 * start, unless the stream, never proven, is found not measurable. */
static __always_inline void lost(struct __sk_buff *skb, struct scratch *sc, struct flow *fl)
{
	if (!fl->proven && fl->state == LOST && unparsed(skb, sc, fl)) {
		sc->mode = MODE_DONE;
		return;
	}
	search_begin(sc, fl, 0, 0);
}

/* The payload's bytes lost before seq (flow.py's _gap): the walk holds when its next
 * header is still ahead and nothing was carried. */
static __always_inline void gap(struct scratch *sc, struct flow *fl, __u32 seq, __u32 lost_bytes)
{
	if (fl->state == LOST) {
		fl->out_bytes += lost_bytes;
		return;
	}
	if (!fl->carry_len && (__s32)(fl->next_seq - seq) >= 0) { /* the lost bytes were data */
		if (fl->next_seq == seq) /* the held PDU's last byte too: no time to give it */
			fl->held_kind = HELD_NONE;
		fl->body_left = 0; /* a text with a hole is not read on */
		return;
	}
	if (fl->state == PROVISIONAL)
		retract(sc, fl);
	fl->out_bytes += lost_bytes;
	lose(sc, fl);
}

/* A fresh flow: started by a SYN (SYNCED at seq + 1), or first seen in mid-session
 * (LOST; UNMEASURABLE when the connection's other direction is). */
static __always_inline struct flow *new_flow(struct scratch *sc, __u32 seq, int syn)
{
	struct flow *o;

	__builtin_memset(&sc->fresh, 0, sizeof(sc->fresh));
	sc->fresh.limit = MAX_DATA_BYTES;
	sc->fresh.hd_known = sc->fresh.dd_known = sc->proto == PROTO_NVME || syn;
	if (syn) {
		sc->fresh.next_seq = sc->fresh.expect_seq = seq + 1;
		sc->fresh.expect_valid = 1;
		sc->fresh.state = SYNCED;
	} else {
		sc->fresh.state = LOST;
		sc->fresh.lost_since_ns = sc->now;
		o = other_flow(sc);
		if (o && o->state == UNMEASURABLE) {
			sc->fresh.state = UNMEASURABLE;
			sc->fresh.reason = o->reason;
		}
	}
	/* counted, as each removal is: what the map holds beside them is what its LRU
	 * dropped to make room (bridge/ksums.py's walk_flows) */
	if (!bpf_map_update_elem(&flows, &sc->fk, &sc->fresh, BPF_NOEXIST))
		count(C_FLOWS_ADDED);
	else /* a SYN on a flow the map holds (the port reused): it starts anew */
		bpf_map_update_elem(&flows, &sc->fk, &sc->fresh, BPF_ANY);
	return bpf_map_lookup_elem(&flows, &sc->fk);
}

/* A packet that is not TCP: IPsec ESP (IP protocol 50, or in UDP on NAT_T_PORT with a
 * non-zero SPI) counted per security association (map esp): tracker.py's esp(). */
static __always_inline void encrypted(struct __sk_buff *skb, struct scratch *sc, __u8 proto,
				      __u32 off, __u32 ip_end, __u64 now)
{
	struct esp_stats *v;
	__u32 len = ip_end > off ? ip_end - off : 0;

	if (proto == IPPROTO_UDP_) {
		if (len < 16 || bpf_skb_load_bytes(skb, off, sc->tcpb, 12))
			return;
		if (((sc->tcpb[0] << 8) | sc->tcpb[1]) != NAT_T_PORT &&
		    ((sc->tcpb[2] << 8) | sc->tcpb[3]) != NAT_T_PORT)
			return;
		sc->ek.spi = be32(sc->tcpb + 8);
		if (!sc->ek.spi)
			return; /* IKE's non-ESP marker */
		len -= 8;
	} else if (proto == IPPROTO_ESP_) {
		if (len < 8 || bpf_skb_load_bytes(skb, off, sc->tcpb, 4))
			return;
		sc->ek.spi = be32(sc->tcpb);
	} else {
		return;
	}
	__builtin_memcpy(sc->ek.src, sc->fk.conn.ini, 16);
	__builtin_memcpy(sc->ek.dst, sc->fk.conn.tgt, 16);
	v = bpf_map_lookup_elem(&esp, &sc->ek);
	if (!v) {
		__builtin_memset(&sc->ev, 0, sizeof(sc->ev));
		sc->ev.first_ns = now;
		if (bpf_map_update_elem(&esp, &sc->ek, &sc->ev, BPF_NOEXIST) == 0)
			count(C_UNMEASURABLE);
		v = bpf_map_lookup_elem(&esp, &sc->ek);
		if (!v)
			return;
	}
	v->last_ns = now;
	__sync_fetch_and_add(&v->frames, 1);
	__sync_fetch_and_add(&v->bytes, len);
}

SEC("tc")
int wire_sensor(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *data_end = (void *)(long)skb->data_end;
	struct flow *fl;
	struct scratch *sc;
	__u32 l3 = ETH_HLEN, poff, plen, seq, seg_end, ip_end, blen;
	__u16 proto_eth, sport, dport;
	__u8 doff, tcp_flags;
	int proto, to_target, fin;
	__u64 now = bpf_ktime_get_ns();
	__u8 *tcpb;

	count(C_FRAMES);
	sc = scr();
	if (!sc)
		return TC_ACT_OK;
	__builtin_memset(&sc->fk, 0, sizeof(sc->fk));
	if (data + ETH_HLEN > data_end)
		return TC_ACT_OK;
	proto_eth = bpf_ntohs(((struct ethhdr *)data)->h_proto);
	if (proto_eth == ETH_P_8021Q_ || proto_eth == ETH_P_8021AD_) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN, sc->hdr, 4))
			return TC_ACT_OK;
		proto_eth = ((__u16)sc->hdr[2] << 8) | sc->hdr[3];
		l3 += 4;
	}
	if (proto_eth == ETH_P_IP) {
		__u32 ihl;

		if (bpf_skb_load_bytes(skb, l3, sc->ipb, 20))
			return TC_ACT_OK;
		if (((__u16)sc->ipb[6] << 8 | sc->ipb[7]) & 0x3FFF)
			return TC_ACT_OK; /* a fragment */
		ihl = (sc->ipb[0] & 0xF) * 4;
		if (ihl < 20)
			return TC_ACT_OK;
		ip_end = l3 + (((__u32)sc->ipb[2] << 8) | sc->ipb[3]);
		sc->fk.conn.ini[10] = sc->fk.conn.ini[11] = 0xFF;
		sc->fk.conn.tgt[10] = sc->fk.conn.tgt[11] = 0xFF;
		__builtin_memcpy(&sc->fk.conn.ini[12], &sc->ipb[12], 4); /* src, for now */
		__builtin_memcpy(&sc->fk.conn.tgt[12], &sc->ipb[16], 4); /* dst, for now */
		l3 += ihl;
		if (sc->ipb[9] != 6) { /* not TCP: IPsec ESP is shown, the rest left alone */
			encrypted(skb, sc, sc->ipb[9], l3, ip_end, now);
			return TC_ACT_OK;
		}
	} else if (proto_eth == ETH_P_IPV6) {
		if (bpf_skb_load_bytes(skb, l3, sc->ipb, 40))
			return TC_ACT_OK;
		ip_end = l3 + 40 + (((__u32)sc->ipb[4] << 8) | sc->ipb[5]);
		__builtin_memcpy(sc->fk.conn.ini, &sc->ipb[8], 16);
		__builtin_memcpy(sc->fk.conn.tgt, &sc->ipb[24], 16);
		l3 += 40;
		if (sc->ipb[6] != 6) { /* extension headers are not followed */
			encrypted(skb, sc, sc->ipb[6], l3, ip_end, now);
			return TC_ACT_OK;
		}
	} else {
		return TC_ACT_OK;
	}
	tcpb = sc->tcpb;
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
		to_target = 0;
		proto = sport == ISCSI_PORT ? PROTO_ISCSI : PROTO_NVME;
		__builtin_memcpy(sc->hdr, sc->fk.conn.ini, 16); /* src was the target */
		__builtin_memcpy(sc->fk.conn.ini, sc->fk.conn.tgt, 16);
		__builtin_memcpy(sc->fk.conn.tgt, sc->hdr, 16);
		sc->fk.conn.ini_port = dport;
		sc->fk.conn.tgt_port = sport;
	} else {
		return TC_ACT_OK;
	}
	sc->fk.to_target = to_target;
	sc->to_target = to_target;
	sc->proto = proto;
	sc->now = now;
	seq = be32(tcpb + 4);
	doff = (tcpb[12] >> 4) * 4;
	tcp_flags = tcpb[13];
	poff = l3 + doff;
	if (ip_end > skb->len)
		ip_end = skb->len;
	plen = ip_end > poff ? ip_end - poff : 0;
	fin = tcp_flags & 0x05;
	fl = bpf_map_lookup_elem(&flows, &sc->fk);
	if (tcp_flags & 0x02) { /* SYN: the stream starts at seq + 1 */
		if (to_target) { /* the initiator's: a new connection, both ways */
			struct flow *o = other_flow(sc);

			if (o && !bpf_map_delete_elem(&flows, &sc->ok))
				count(C_FLOWS_REMOVED);
		}
		if (fl && !to_target) { /* the target's answer: its stream starts anew */
			fl->next_seq = fl->expect_seq = seq + 1;
			fl->expect_valid = 1;
			fl->carry_len = 0;
			fl->held_kind = HELD_NONE;
			fl->hd = fl->dd = 0;
			fl->hd_known = fl->dd_known = 1;
			fl->alt_valid = 0;
			fl->sn = 0;
			if (fl->state != UNMEASURABLE)
				synced(sc, fl);
			return TC_ACT_OK;
		}
		new_flow(sc, seq, 1);
		return TC_ACT_OK;
	}
	if (!plen) {
		if (fin)
			goto done;
		return TC_ACT_OK;
	}
	if (!fl && fin && !other_flow(sc))
		return TC_ACT_OK; /* the end of a connection never seen */
	if (!fl) {
		fl = new_flow(sc, seq, 0);
		if (!fl)
			return TC_ACT_OK;
	}
	count(C_SEGMENTS);
	seg_end = poff + plen;
	if (fl->await_login) { /* what userspace read in the login, once it has */
		struct setting *st = bpf_map_lookup_elem(&settings, &sc->fk);

		if (st) {
			if (st->has_digests) {
				fl->hd = st->hd;
				fl->dd = st->dd;
				fl->hd_known = fl->dd_known = 1;
				fl->alt_valid = 0;
			}
			if (st->limit >= MIN_SEGMENT_LIMIT)
				fl->limit = st->limit;
			fl->await_login = 0;
			bpf_map_delete_elem(&settings, &sc->fk);
		}
	}
	if (fl->state == UNMEASURABLE) {
		fl->out_bytes += plen;
		goto done;
	}
	if (fl->expect_valid) {
		__s32 d = (__s32)(seq - fl->expect_seq);

		if (d < -BEHIND_MAX_BYTES) { /* no retransmission: the stream is elsewhere */
			count(C_GAPS);
			if (fl->state == PROVISIONAL)
				retract(sc, fl);
			if (fl->state != LOST)
				lose(sc, fl);
		} else if (d < 0) { /* a retransmission, or an overlap */
			if ((__u32)-d >= plen) {
				count(C_RETRANSMITTED);
				goto done;
			}
			poff += (__u32)-d;
			seq = fl->expect_seq;
		} else if (d > 0) { /* the capture lost bytes */
			count(C_GAPS);
			gap(sc, fl, seq, (__u32)d);
		}
	} else if (!fl->lost_since_ns) {
		fl->lost_since_ns = now;
	}
	fl->expect_seq = seq + (seg_end - poff);
	fl->expect_valid = 1;
	sc->seq = seq;
	sc->poff = poff;
	sc->seg_end = seg_end;
	sc->carried = 0;
	sc->base = seq;
	if (fl->body_left) /* the text a login's or connect's header left to this one */
		body_text(skb, fl);
	if (fl->carry_len) { /* a cut header: the carry, then this payload */
		__u32 c = fl->carry_len, take;

		if (c >= CARRY_BYTES)
			c = CARRY_BYTES - 1;
		for (int i = 0; i < CARRY_BYTES; i++) {
			if (i >= c)
				break;
			sc->asm_[i] = fl->carry[i];
		}
		take = seg_end - poff;
		if (take > ASM_BYTES - CARRY_BYTES)
			take = ASM_BYTES - CARRY_BYTES;
		if (take >= 1 &&
		    bpf_skb_load_bytes(skb, poff, sc->asm_ + (c & (CARRY_BYTES - 1)),
				       LEN_MASKED(take, CARRY_BYTES)))
			goto done;
		sc->carried = c;
		sc->base = fl->carry_seq;
		fl->carry_len = 0;
		count(C_CARRIED);
	}
	blen = buf_len(sc);
	sc->mode = MODE_DONE;
	sc->walk_steps = sc->searches = 0;
	if (fl->state == LOST) {
		lost(skb, sc, fl);
	} else {
		__s32 off = (__s32)(fl->next_seq - sc->base);

		if (fl->held_kind && off > 0 && (__u32)off <= blen &&
		    release(skb, sc, fl, (__u32)off) != HANDED_ON)
			goto steps; /* the tracker said the walk was off: searched, or done */
		if (fl->state == PROVISIONAL && off >= 0 && (__u32)off >= blen) {
			lost(skb, sc, fl); /* a header found here takes over */
		} else if (off >= 0) {
			if (fl->state == PROVISIONAL)
				fl->out_bytes += (__u32)off;
			sc->off = (__u32)off;
			sc->scan_from = 0;
			sc->mode = MODE_WALK;
		}
	}
steps:
	if (sc->mode != MODE_DONE) {
		struct loop_ctx l = {};

		l.skb = skb;
		l.fl = fl;
		bpf_loop(MAX_STEPS, step_cb, &l, 0);
	}
done:
	if (fin) { /* FIN or RST: the connection ends, both ways */
		if (!bpf_map_delete_elem(&flows, &sc->fk))
			count(C_FLOWS_REMOVED);
		if (other_flow(sc) && !bpf_map_delete_elem(&flows, &sc->ok))
			count(C_FLOWS_REMOVED);
	}
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
