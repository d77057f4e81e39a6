/*
 * net — hearth's wire protocol and its TCP transport, in which every send and receive has a
 * deadline. Prefix: hn_. It knows messages and sockets, not roles (head or worker).
 *
 * Frame: a 16-byte header, then `length` payload bytes; all integers little-endian:
 *   u32 magic 0x48545248 ("HRTH") | u16 version (HN_PROTO_VERSION) | u16 type (enum hn_msg_type) |
 *   u32 length (<= hn_msg_max_payload(type)) | u32 seq (a reply carries its request's seq)
 * The header is checked before anything is allocated; a frame of another version is refused.
 * Payload: the message struct's fields in order; str = u32 n + n bytes of UTF-8 without NUL; blob =
 * u32 n + n bytes; T[] = u32 count, zero padding to min(sizeof T, 8) from the payload's start (so
 * arrays are read in place), the elements; kv[] = u32 count + that many {str key, str value}.
 * Decoding is strict (counts, limits, padding, leftovers) and encoding checks the same, so the
 * encoding is canonical. The bulk array of FORWARD, PARTIAL, RESULT, SLICE_CHUNK comes last.
 *
 * Decoded messages borrow their payload; one sender and one receiver thread per connection at a
 * time; little-endian hosts only. docs/protocol.md: each message's layout and limit, the session.
 */
#ifndef HEARTH_NET_H
#define HEARTH_NET_H

#include "base/base.h"

#define HN_MAGIC          0x48545248u /* "HRTH" as a little-endian u32 */
#define HN_PROTO_VERSION  4   /* 2: FORWARD carries each token's sequence (issue 27); 3: the handshake and
                                 encrypted frames (issue 29, docs/security.md); 4: the lossy all-reduce
                                 over UDP (issue 28, LOAD_PLAN's lossy_* parameters, docs/lossy.md) */
#define HN_HEADER_SIZE    16

/* field limits (bytes or entries) */
#define HN_MAX_NAME       128
#define HN_MAX_MESSAGE    1024
#define HN_MAX_KV         64
#define HN_MAX_KEY        64
#define HN_MAX_VALUE      256
#define HN_MAX_SLICE_NAME 256
#define HN_MAX_DIMS       4
#define HN_MAX_CHUNK      (16u << 20)
#define HN_AUTH_TAG_SIZE  32

/* ---- message types (wire values: append only) ---------------------------------------------------- */
enum hn_msg_type {
    HN_MSG_HELLO       = 1,
    HN_MSG_HELLO_ACK   = 2,
    HN_MSG_ERROR       = 3,
    HN_MSG_PROFILE_REQ = 4,
    HN_MSG_PROFILE     = 5,
    HN_MSG_LOAD_PLAN   = 6,
    HN_MSG_SLICE_HAVE  = 7,
    HN_MSG_SLICE_BEGIN = 8,
    HN_MSG_SLICE_CHUNK = 9,
    HN_MSG_SLICE_END   = 10,
    HN_MSG_READY       = 11,
    HN_MSG_FORWARD     = 12,
    HN_MSG_PARTIAL     = 13,
    HN_MSG_RESULT      = 14,
    HN_MSG_RESET       = 15,
    HN_MSG_BYE         = 16,
    HN_MSG_PROBE       = 17, /* link measurement: either side sends data, the other answers PROBE */
    HN_MSG_LINK_PROBE  = 18, /* head -> worker: measure your link to another worker (answer: PROFILE) */
    HN_MSG_KV_COPY     = 19,
    HN_MSG_LOSS_PROBE  = 20, /* head -> worker: send a burst of probe datagrams, count the echoes (answer: PROFILE) */
    HN_MSG_COUNT       = 21,
};

/* capability bits in HELLO / HELLO_ACK (append only) */
enum {
    HN_CAP_F32_ACT     = 1u << 0, /* hidden states as f32 (always set in version 1) */
    HN_CAP_SLICE_CACHE = 1u << 1, /* keeps weight slices in an on-disk cache (SLICE_HAVE) */
    HN_CAP_LOSSY_UDP   = 1u << 2, /* can send partial sums over UDP (HALO; LOAD_PLAN's lossy_port) */
    HN_CAP_ENCRYPT     = 1u << 3, /* the session is encrypted with the cluster key (set by whoever has a key) */
    HN_CAP_LOSSY_PROTECT = 1u << 4, /* leaves out the FFN groups the head protects (LOAD_PLAN's lossy_protect) */
};

/* PROFILE_REQ flags */
enum {
    HN_PROFILE_BENCH = 1u << 0, /* run the matvec benchmark (bench_ms budget) */
    HN_PROFILE_STATS = 1u << 1, /* report (and restart) the session's run-time counters */
    HN_PROFILE_DEVICE = 1u << 2,/* report the device profile (src/plan: speeds per weight type, memory, disk);
                                   with BENCH: measured again, not from the device's cache */
};
#define HN_MAX_PROBE (8u << 20) /* PROBE data and reply size limit (bytes) */

/* what a FORWARD / PARTIAL covers (wire values: append only) */
enum hn_stage { HN_STAGE_BLOCK = 0, HN_STAGE_ATTN = 1, HN_STAGE_FFN = 2, HN_STAGE_COUNT = 3 };

/* kinds of units a LOAD_PLAN assigns (wire values: append only; 0 is invalid) */
enum hn_unit_kind {
    HN_UNIT_LAYER      = 1, /* the whole layer [begin, end) = [0, 1) (pipeline) */
    HN_UNIT_ATTN_HEADS = 2, /* query heads [begin, end) of the layer, with their KV heads */
    HN_UNIT_FFN_ROWS   = 3, /* FFN neurons [begin, end): gate/up rows, down columns */
    HN_UNIT_COUNT      = 4,
};

const char *hn_msg_name(int type);        /* "FORWARD"; "?" for an unknown type */
uint32_t    hn_msg_max_payload(int type); /* the hard limit; 0 for an unknown type */

/* ---- header -------------------------------------------------------------------------------------- */
typedef struct hn_header {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t len;
    uint32_t seq;
} hn_header;

void hn_header_encode(uint8_t out[HN_HEADER_SIZE], int type, uint32_t len, uint32_t seq);
/* Parses and checks magic, version, type and length limit. HR_EPROTO with a message on failure. */
int  hn_header_decode(const uint8_t in[HN_HEADER_SIZE], hn_header *h, hr_err *err);

/* ---- payload writer: grows as needed; an allocation failure is sticky and reported at the end ---- */
typedef struct hn_buf {
    uint8_t *data;
    size_t   len, cap;
    bool     oom;
} hn_buf;

void hn_buf_init(hn_buf *b);
void hn_buf_free(hn_buf *b);
void hn_buf_reset(hn_buf *b); /* len = 0, keeps the memory */
void hn_buf_put_u8(hn_buf *b, uint8_t v);
void hn_buf_put_u16(hn_buf *b, uint16_t v);
void hn_buf_put_u32(hn_buf *b, uint32_t v);
void hn_buf_put_u64(hn_buf *b, uint64_t v);
void hn_buf_put_i32(hn_buf *b, int32_t v);
void hn_buf_put_f32(hn_buf *b, float v);
void hn_buf_put_raw(hn_buf *b, const void *p, size_t n);       /* n bytes, no length */
void hn_buf_put_blob(hn_buf *b, const void *p, uint32_t n);    /* u32 n + bytes */
void hn_buf_put_str(hn_buf *b, const char *s, uint32_t n);     /* u32 n + bytes */
/* u32 count + zero padding to `elem_size` alignment; the caller appends (or sends) the elements */
void hn_buf_put_array_head(hn_buf *b, uint32_t count, size_t elem_size);
void hn_buf_put_f32s(hn_buf *b, const float *v, uint32_t n);
void hn_buf_put_i32s(hn_buf *b, const int32_t *v, uint32_t n);
void hn_buf_put_u64s(hn_buf *b, const uint64_t *v, uint32_t n);

/* ---- payload reader: every read checks what remains; the first failure stops the whole decode ---- */
typedef struct hn_str { const char *s; uint32_t n; } hn_str; /* not NUL-terminated */

typedef struct hn_rd {
    const uint8_t *p;
    size_t         len, pos;
    int            type;      /* for messages: "FORWARD.pos: ..." */
    bool           failed;
    char           why[200];  /* first failure, "field: reason" */
} hn_rd;

/* `p` must be 8-byte aligned (arrays are returned in place). */
void     hn_rd_init(hn_rd *r, int type, const void *p, size_t len);
uint8_t  hn_rd_u8(hn_rd *r, const char *field);
uint16_t hn_rd_u16(hn_rd *r, const char *field);
uint32_t hn_rd_u32(hn_rd *r, const char *field);
uint64_t hn_rd_u64(hn_rd *r, const char *field);
int32_t  hn_rd_i32(hn_rd *r, const char *field);
float    hn_rd_f32(hn_rd *r, const char *field);
bool     hn_rd_raw(hn_rd *r, void *out, size_t n, const char *field);            /* copies n bytes */
hn_str   hn_rd_str(hn_rd *r, uint32_t max_len, const char *field);               /* rejects NUL */
const uint8_t *hn_rd_blob(hn_rd *r, uint32_t *n, uint32_t max_len, const char *field);
/* u32 count, padding, elements in place; NULL (and count 0) on failure or when count is 0 */
const void *hn_rd_array(hn_rd *r, uint32_t *count, size_t elem_size, const char *field);
/* marks the reader failed with "field: reason" (for checks between fields); returns false */
bool     hn_rd_reject(hn_rd *r, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* HR_OK when everything read fine and nothing is left over; else HR_EFORMAT "TYPE.field: reason" */
int      hn_rd_finish(hn_rd *r, hr_err *err);

hn_str hn_cstr(const char *s);                             /* borrows s; NULL gives an empty string */
size_t hn_str_copy(char *dst, size_t cap, hn_str s);        /* NUL-terminated, truncated; returns s.n */
bool   hn_str_eq(hn_str s, const char *cstr);

/* ---- messages -------------------------------------------------------------------------------------- */
typedef struct hn_kv { hn_str key, value; } hn_kv;

/* A unit of a LOAD_PLAN. Its wire layout is this struct on a little-endian host (4 x u32). */
typedef struct hn_unit {
    uint32_t layer;
    uint32_t kind;    /* enum hn_unit_kind */
    uint32_t begin;   /* [begin, end): heads or neurons */
    uint32_t end;
} hn_unit;

typedef struct hn_hello {
    uint32_t version_min, version_max;
    uint64_t caps;
    uint8_t  auth_tag[HN_AUTH_TAG_SIZE];
    hn_str   device;
} hn_hello;

typedef struct hn_hello_ack {
    uint32_t version;
    uint64_t caps;
    uint8_t  auth_tag[HN_AUTH_TAG_SIZE];
    hn_str   device;
} hn_hello_ack;

typedef struct hn_error    { int32_t code; hn_str message; } hn_error;
typedef struct hn_profile_req {
    uint32_t flags;
    union {                  /* one u32 on the wire */
        uint32_t bench_ms;   /* HN_PROFILE_BENCH alone: the matvec benchmark's time */
        uint32_t types;      /* HN_PROFILE_DEVICE: the weight types to measure, bit (1 << hq type id); 0: the
                                profiler's standard set (a worker from before ignores it and measures that) */
    };
} hn_profile_req;
typedef struct hn_profile  { uint32_t n_kv; hn_kv kv[HN_MAX_KV]; } hn_profile;
/* A PROFILE's value for key (the last one, as a number or as NUL-terminated text); absent: `absent` / false */
double hn_profile_num(const hn_profile *p, const char *key, double absent);
bool   hn_profile_get(const hn_profile *p, const char *key, char *out, size_t cap);

typedef struct hn_load_plan {
    uint64_t       model_hash;
    uint32_t       device_index, n_devices;
    hn_str         arch;
    uint32_t       n_params;
    hn_kv          params[HN_MAX_KV];
    uint32_t       n_units;
    const hn_unit *units;
} hn_load_plan;

typedef struct hn_slice_have { uint64_t model_hash; uint32_t n_hashes; const uint64_t *hashes; } hn_slice_have;

typedef struct hn_slice_begin {
    uint64_t hash, size;
    uint32_t dtype, n_dims;
    uint64_t ne[HN_MAX_DIMS];
    hn_str   name;
} hn_slice_begin;

typedef struct hn_slice_chunk { uint64_t hash, offset; uint32_t n; const uint8_t *data; } hn_slice_chunk;
typedef struct hn_slice_end   { uint64_t hash, size; } hn_slice_end;
typedef struct hn_ready       { uint64_t model_hash, weight_bytes; uint32_t n_slices; } hn_ready;

typedef struct hn_forward {
    uint32_t       layer_begin, layer_end, stage;
    uint32_t       n_tokens, n_embd;
    const int32_t *pos;    /* n_tokens */
    const int32_t *seq;    /* n_tokens each token's sequence (hm_batch.seq), or NULL: all sequence 0 */
    const float   *data;   /* n_tokens x n_embd, row per token */
} hn_forward;

typedef struct hn_partial {
    uint32_t     layer, stage, n_tokens, n_embd;
    uint32_t     offset;       /* first element of `data` within n_tokens x n_embd (ring chunks) */
    uint32_t     n;            /* elements in data */
    uint64_t     compute_ns;   /* time the sender spent computing it */
    const float *data;
} hn_partial;

typedef struct hn_result {
    uint32_t     layer_end, n_tokens, n_embd;
    uint64_t     compute_ns;
    const float *data;         /* n_tokens x n_embd */
} hn_result;

typedef struct hn_reset { uint32_t pos_begin; } hn_reset;
/* A worker answers PROBE with PROBE: reply_bytes (<= HN_MAX_PROBE) bytes of data, reply_bytes 0. */
typedef struct hn_probe { uint32_t reply_bytes; uint32_t n; const uint8_t *data; } hn_probe;
/* The worker at addr (<= HN_MAX_NAME) is measured by the receiver: n_pings (1..HN_MAX_PINGS) round
   trips, one PROBE of probe_bytes (<= HN_MAX_PROBE); the answer is PROFILE "rtt_ms", "gbps". */
#define HN_MAX_PINGS 64
typedef struct hn_link_probe { hn_str addr; uint32_t n_pings, probe_bytes; } hn_link_probe;
/* The planner measures the datagram loss of its link (docs/planner.md, "Loss"): the worker sends `count`
   probe datagrams (kind HN_DGRAM_PROBE, session, seq 0..count-1, `elems` elements; sealed when the
   session is) to its own head's address at UDP port `port`, one every interval_us, and counts the ones
   the head echoes back until wait_ms after its last send, or after the latest echo while they still come
   (at most HN_MAX_LOSS_WAIT_MS after the last send: a late echo is not lost); answer PROFILE "sent",
   "echoed", "dropped". Bounded by the decoder: count <= HN_MAX_LOSS_PROBE, count x interval_us <=
   HN_MAX_LOSS_PROBE_US, wait_ms <= HN_MAX_LOSS_WAIT_MS, elems <= HN_DGRAM_MAX_ELEMS_SEALED. drop_ppm /
   drop_seed: the test hook (HEARTH_LOSSY_DROP), the worker drops that share of its probes before sending. */
#define HN_MAX_LOSS_PROBE    4096
#define HN_MAX_LOSS_PROBE_US 2000000u
#define HN_MAX_LOSS_WAIT_MS  1000
typedef struct hn_loss_probe {
    uint64_t session, drop_seed;
    uint32_t port, count, interval_us, elems, wait_ms, drop_ppm;
} hn_loss_probe;
/* positions [0, n) of sequence src's KV cache copied into sequence dst (hm_kv_seq_copy), no reply */
typedef struct hn_kv_copy { uint32_t src, dst, n; } hn_kv_copy;
typedef struct hn_bye   { int32_t code; hn_str reason; } hn_bye;

typedef struct hn_msg {
    int      type;   /* enum hn_msg_type */
    uint32_t seq;
    union {
        hn_hello       hello;
        hn_hello_ack   hello_ack;
        hn_error       error;
        hn_profile_req profile_req;
        hn_profile     profile;
        hn_load_plan   load_plan;
        hn_slice_have  slice_have;
        hn_slice_begin slice_begin;
        hn_slice_chunk slice_chunk;
        hn_slice_end   slice_end;
        hn_ready       ready;
        hn_forward     forward;
        hn_partial     partial;
        hn_result      result;
        hn_reset       reset;
        hn_kv_copy     kv_copy;
        hn_bye         bye;
        hn_probe       probe;
        hn_link_probe  link_probe;
        hn_loss_probe  loss_probe;
    } u;
} hn_msg;

typedef struct hn_iov { const void *p; size_t n; } hn_iov;

/* Encodes m's payload. Everything but the bulk array replaces the contents of `head`; the bulk array
   (f32 data, chunk bytes) is returned in `tail` ({NULL, 0} if none), to be sent after it. Checks the
   message the way the decoder would (string and count limits, n_tokens x n_embd, payload limit):
   HR_EINVAL with a message naming type and field, so whatever encodes also decodes. */
int hn_msg_encode(const hn_msg *m, hn_buf *head, hn_iov *tail, hr_err *err);
/* Same, with the tail appended: the whole payload in `out` (replaced). */
int hn_msg_encode_full(const hn_msg *m, hn_buf *out, hr_err *err);
/* Decodes a payload of `type` (8-byte aligned; borrowed by *out). HR_EFORMAT "FORWARD.pos: ..." or
   HR_EPROTO for an unknown type; a failed decode leaves only type and seq set in *out. */
int hn_msg_decode(int type, uint32_t seq, const void *payload, size_t len, hn_msg *out, hr_err *err);

/* ---- TCP transport ------------------------------------------------------------------------------- */
/* Deadlines are absolute hr_time_ns() values. HN_NO_DEADLINE waits forever: keep it for waits on a
   person (an idle worker waiting for a head); TCP keepalive still notices a vanished peer there. */
#define HN_NO_DEADLINE INT64_MAX
static inline int64_t hn_deadline_ms(int64_t ms) { return hr_time_ns() + ms * 1000000; }

/* Splits "HOST:PORT", "[V6ADDR]:PORT" or ":PORT" (empty host = any address). A bare IPv6 address
   without brackets is refused (its colons are ambiguous). */
int hn_parse_addr(const char *s, char *host, size_t host_cap, uint16_t *port, hr_err *err);

typedef struct hn_listener hn_listener;
typedef struct hn_conn     hn_conn;

typedef struct hn_conn_stats {
    uint64_t bytes_sent, bytes_received;   /* headers included */
    uint64_t frames_sent, frames_received;
    uint64_t rekeys_sent, rekeys_received; /* traffic-key ratchet steps (encrypted sessions) */
} hn_conn_stats;

/* addr's host is a loopback address (127.0.0.0/8, ::1, or a name that resolves to loopback only);
   an empty host (any address) is not */
bool         hn_addr_is_loopback(const char *addr);
/* Binds and listens on addr (host names resolved with getaddrinfo; port 0 = ephemeral). */
hn_listener *hn_listen(const char *addr, hr_err *err);
uint16_t     hn_listener_port(const hn_listener *l); /* the bound port (useful after port 0) */
void         hn_listener_close(hn_listener *l);      /* NULL is fine */
int          hn_listener_fd(const hn_listener *l);   /* to poll for a waiting connection */
/* Waits for one connection until the deadline: NULL with HR_ETIMEDOUT, or HR_ENET. */
hn_conn     *hn_accept(hn_listener *l, int64_t deadline, hr_err *err);

/* Connects to addr, trying each resolved address in turn, until the deadline (name resolution itself
   is not bounded by it). */
hn_conn    *hn_connect(const char *addr, int64_t deadline, hr_err *err);
void        hn_conn_close(hn_conn *c);                 /* NULL is fine */
/* Shuts the socket down without freeing it: a thread blocked in a receive on it returns HR_ENET. */
void        hn_conn_shutdown(hn_conn *c);
const char *hn_conn_peer(const hn_conn *c);            /* "127.0.0.1:7070", "[::1]:7070" */
int         hn_conn_fd(const hn_conn *c);
void        hn_conn_get_stats(const hn_conn *c, hn_conn_stats *out);
/* Tests: every byte this process sends on any connection is also appended to the file named by the
   environment variable HEARTH_NET_CAPTURE (read once), as the wire carries it. */

/* A received frame. Zero-initialise it; pass it again to reuse its payload buffer (64-byte aligned,
   grown only when needed); release with hn_frame_free. */
typedef struct hn_frame {
    int      type;
    uint32_t seq;
    uint32_t len;
    uint8_t *payload;   /* owned; NULL until a non-empty frame arrives */
    size_t   cap;
} hn_frame;
void hn_frame_free(hn_frame *f);

/* Sends one frame: header + the concatenation of parts (at most 8), with one sendmsg per try and no
   copy of the parts. The total must be within the type's limit. Errors: HR_ETIMEDOUT (peer not
   reading), HR_ENET. After a send error the connection's send side is unusable (partial frame). */
int hn_send_frame(hn_conn *c, int type, uint32_t seq, const hn_iov *parts, int n_parts,
                  int64_t deadline, hr_err *err);
/* Receives one whole frame. The header is checked before the payload is allocated. Errors:
   HR_ETIMEDOUT (nothing, or not all of it, by the deadline), HR_ENET ("peer closed the
   connection", reset), HR_EPROTO (bad header). A timeout before the first byte leaves the connection
   usable; any other error leaves its receive side unusable. */
int hn_recv_frame(hn_conn *c, hn_frame *f, int64_t deadline, hr_err *err);

/* Encode + send (bulk array straight from the caller's memory) / receive + decode (m borrows f). */
int hn_msg_send(hn_conn *c, const hn_msg *m, int64_t deadline, hr_err *err);
int hn_msg_recv(hn_conn *c, hn_frame *f, hn_msg *m, int64_t deadline, hr_err *err);

/* ---- cluster key (key.c): 32 random bytes every device of one cluster shares ---------------------
   Stored as one line of base64 in a file of mode 0600. Loading warns when others may read the file. */
#define HN_KEY_SIZE    32
#define HN_KEY_ID_SIZE 8
typedef struct hn_key { uint8_t k[HN_KEY_SIZE]; } hn_key;

/* $XDG_CONFIG_HOME/hearth/cluster.key, else $HOME/.config/hearth/cluster.key (HR_ENOTFOUND: neither) */
int  hn_key_default_path(char *out, size_t cap, hr_err *err);
/* A fresh random key written to path (created with O_EXCL, mode 0600; the directory must exist):
   HR_EEXIST if path exists — a key is never overwritten. *out (may be NULL) receives it. */
int  hn_key_generate(const char *path, hn_key *out, hr_err *err);
/* HR_ENOTFOUND (no file), HR_EFORMAT (not a key file), HR_EIO */
int  hn_key_load(const char *path, hn_key *out, hr_err *err);
/* A public name of the key (a keyed BLAKE2b hash of a label): the same for everyone holding the key,
   useless for finding the key. For logs and discovery announcements — a hint, never proof. */
void hn_key_id(const hn_key *k, uint8_t id[HN_KEY_ID_SIZE]);
void hn_key_id_hex(const hn_key *k, char out[2 * HN_KEY_ID_SIZE + 1]);
void hn_key_wipe(hn_key *k); /* zeroes it in a way the compiler keeps */

/* ---- discovery (discover.c): workers found on the LAN by UDP multicast (docs/discovery.md) ---------
   A worker started with --announce sends an ANNOUNCE to the group now and then and in answer to a
   QUERY (unicast back to whoever asked); a head sends QUERYs for a short window and collects the
   answers. An announcement is a hint, never proof: trust comes from the connection's handshake.
   Packet (little-endian, HN_DISCOVER_MAX_PACKET bytes at most):
     u32 magic "HRDS" | u16 version (HN_DISCOVER_VERSION) | u16 kind (enum hn_disc_kind)
   a QUERY ends there; an ANNOUNCE goes on:
     u16 proto_version | u16 port | u8 key_id[HN_KEY_ID_SIZE] | u64 instance | u32 n_threads |
     u64 mem_budget | str host (numeric address or empty) | str name
   Decoding is strict (every field, limit and character checked, nothing left over) and the encoder
   checks the same, so whatever encodes decodes. */
#define HN_DISCOVER_GROUP      "239.255.72.82:7072" /* organisation-local scope (RFC 2365), TTL 1 */
#define HN_DISCOVER_VERSION    1
#define HN_DISCOVER_MAX_PACKET 512
#define HN_DISCOVER_MAX_HOST   45   /* INET6_ADDRSTRLEN - 1 */
#define HN_DISCOVER_MAX_THREADS 65536
#define HN_DISCOVER_MAX_FOUND  64

enum hn_disc_kind { HN_DISC_QUERY = 1, HN_DISC_ANNOUNCE = 2 };

typedef struct hn_announce {
    uint16_t proto_version;            /* the HN_PROTO_VERSION the worker speaks */
    uint16_t port;                     /* its cluster port (1..65535) */
    uint8_t  key_id[HN_KEY_ID_SIZE];   /* hn_key_id of its cluster key */
    uint64_t instance;                 /* random per worker process: one worker heard on two interfaces is one */
    uint32_t n_threads;                /* threads it computes with */
    uint64_t mem_budget;               /* bytes its residency manager may use; 0 = unknown */
    char     host[HN_DISCOVER_MAX_HOST + 1]; /* the numeric address it listens on; "" = any (use the sender's) */
    char     name[HN_MAX_NAME + 1];    /* 1..HN_MAX_NAME bytes, no control characters */
} hn_announce;

/* kind HN_DISC_QUERY (a may be NULL) or HN_DISC_ANNOUNCE: the packet in out (replaced). HR_EINVAL
   naming the field when a would not decode. */
int hn_discover_encode(int kind, const hn_announce *a, hn_buf *out, hr_err *err);
/* Decodes a packet (p 8-byte aligned). *kind and, for an ANNOUNCE, *a are set on success. Errors:
   HR_ERANGE (longer than HN_DISCOVER_MAX_PACKET), HR_EUNSUPPORTED (another version), HR_EFORMAT. */
int hn_discover_decode(const void *p, size_t n, int *kind, hn_announce *a, hr_err *err);

/* what was received and not used; every packet lands in exactly one counter or is used */
typedef struct hn_discover_stats {
    uint32_t received;       /* packets read */
    uint32_t malformed;      /* not a valid packet, or an address that cannot be right */
    uint32_t oversize;       /* longer than HN_DISCOVER_MAX_PACKET */
    uint32_t other_version;  /* a hearth discovery packet of another version */
    uint32_t foreign_key;    /* announcements of another cluster key (querier) */
    uint32_t duplicates;     /* an instance heard before (querier) */
    uint32_t ignored;        /* valid but not for us: queries at a querier, announcements at a worker */
    uint32_t rate_limited;   /* queries not answered: more than the announcer answers per second */
    uint32_t sent;           /* packets sent */
} hn_discover_stats;

/* Where discovery happens: the group and, optionally, one interface (else every interface that is up
   and can multicast, and loopback). */
typedef struct hn_discover_where {
    const char *group;       /* "ADDR:PORT" of an IPv4 multicast group; NULL = HN_DISCOVER_GROUP */
    const char *iface;       /* interface name ("eth0", "lo"); NULL = all */
} hn_discover_where;

typedef struct hn_announcer hn_announcer;
/* Starts a thread that announces *a (its instance made random when 0) to the group every period_ms
   (<= 0: 5000) and answers queries; stop it with hn_announcer_stop. A worker bound to a loopback
   address should announce on "lo" alone (a LAN peer could not reach it). */
hn_announcer *hn_announcer_start(const hn_discover_where *w, const hn_announce *a, int period_ms, hr_err *err);
/* Stops and joins the thread, closes its socket; st (may be NULL) gets what it counted. NULL is fine. */
void hn_announcer_stop(hn_announcer *an, hn_discover_stats *st);

typedef struct hn_found {
    hn_announce a;
    char        addr[HN_DISCOVER_MAX_HOST + 9]; /* what --workers takes: "10.0.0.5:7070", "[fe80::1]:7070" */
    bool        same_key;   /* a.key_id is the key id the querier gave */
    bool        loopback;   /* addr is a loopback address (no other device could use it) */
} hn_found;

typedef struct hn_discovery {
    int               n;
    hn_found          w[HN_DISCOVER_MAX_FOUND]; /* sorted by addr */
    hn_discover_stats st;
} hn_discovery;

/* Sends QUERYs to the group (three, spread over the window) on every interface of w, and collects
   the answers for window_ms. key_id (may be NULL) marks the workers that share it (same_key); the
   others are kept too and counted in st.foreign_key. Only socket errors are errors: no answer is
   out->n == 0. */
int hn_discover(const hn_discover_where *w, const uint8_t *key_id, int window_ms, hn_discovery *out, hr_err *err);
/* ---- the handshake and encrypted links (noise.c; docs/security.md) -------------------------------
   With a cluster key, a connection starts with Noise_NNpsk0_25519_ChaChaPoly_BLAKE2b (the key is the
   PSK; fresh X25519 ephemerals each side give forward secrecy; both sides prove they hold the key),
   carried in two frames of type HN_FRAME_HANDSHAKE. After it every frame is header (in clear,
   authenticated as associated data) | payload encrypted with ChaCha20-Poly1305 | 16-byte tag, with a
   per-direction key and the frame counter as nonce, so hn_send_frame / hn_recv_frame (and all above
   them) work unchanged. Any authentication failure is HR_EAUTH and leaves that direction unusable.
   A frame sent with HN_FRAME_REKEY set in its type is the last under its key: both sides then ratchet
   that direction's key one way (Noise's REKEY), after HN_REKEY_MESSAGES frames or HN_REKEY_MS. */
#define HN_FRAME_HANDSHAKE  0x7f00u  /* header type of the handshake's two frames (not a message) */
#define HN_FRAME_REKEY      0x8000u  /* flag in an encrypted frame's type: the key ratchets after it */
#define HN_AEAD_TAG_SIZE    16
#define HN_NOISE_KEY_SIZE   32
#define HN_NOISE_HASH_SIZE  64
#define HN_NOISE_MSG_MAX    256      /* a handshake message: ephemeral key + encrypted payload */
#define HN_NOISE_MSG_SIZE   48       /* hearth's (empty payloads): 32-byte ephemeral key + tag */
#define HN_REKEY_MESSAGES   (1ull << 60) /* WireGuard's REKEY_AFTER_MESSAGES */
#define HN_REKEY_MS         120000       /* WireGuard's REKEY_AFTER_TIME */

/* The handshake's state, exposed for tests and the fuzz harness; the transport keeps its own. */
typedef struct hn_noise {
    uint8_t  ck[HN_NOISE_HASH_SIZE], h[HN_NOISE_HASH_SIZE], k[HN_NOISE_KEY_SIZE];
    bool     has_k;
    uint64_t n;
    uint8_t  e[32], e_pub[32], re[32], psk[HN_NOISE_KEY_SIZE];
    bool     initiator;
    int      step;    /* messages done: 0, 1, 2 (complete); -1 failed */
} hn_noise;

/* e_priv: the ephemeral private key (tests' known answers), NULL = fresh random. */
int  hn_noise_init(hn_noise *s, bool initiator, const uint8_t psk[HN_NOISE_KEY_SIZE], const void *prologue,
                   size_t prologue_len, const uint8_t *e_priv, hr_err *err);
/* The next handshake message with `payload` (encrypted): *out_len <= HN_NOISE_MSG_MAX. */
int  hn_noise_write(hn_noise *s, const void *payload, size_t n, uint8_t *out, size_t cap, size_t *out_len, hr_err *err);
/* Reads the peer's next message; its payload into out (cap bytes). HR_EAUTH: not from a holder of the
   same key (or altered); HR_EPROTO: malformed or out of turn. A failed state stays failed. */
int  hn_noise_read(hn_noise *s, const uint8_t *msg, size_t n, uint8_t *out, size_t cap, size_t *out_len, hr_err *err);
/* After step 2: the stream keys (this side's send, receive) and the datagram keys, derived apart; wipes s. */
void hn_noise_split(hn_noise *s, uint8_t send[HN_NOISE_KEY_SIZE], uint8_t recv[HN_NOISE_KEY_SIZE],
                    uint8_t dgram_send[HN_NOISE_KEY_SIZE], uint8_t dgram_recv[HN_NOISE_KEY_SIZE]);
void hn_noise_wipe(hn_noise *s);
/* Noise's REKEY: k = first 32 bytes of ENCRYPT(k, 2^64 - 1, "", 32 zero bytes) */
void hn_noise_rekey(uint8_t k[HN_NOISE_KEY_SIZE]);
/* ChaCha20-Poly1305 (IETF) with Noise's nonce (4 zero bytes, u64 n little-endian): out = ct | tag
   (n + 16 bytes; may be m itself); open returns HR_EAUTH when the tag does not match */
void hn_aead_seal(const uint8_t k[HN_NOISE_KEY_SIZE], uint64_t nonce, const void *ad, size_t ad_len, const void *m,
                  size_t n, uint8_t *out);
int  hn_aead_open(const uint8_t k[HN_NOISE_KEY_SIZE], uint64_t nonce, const void *ad, size_t ad_len, const uint8_t *c,
                  size_t n, uint8_t *out);

/* Initiator (head, ring peer, prober): runs the handshake on a fresh connection. key NULL: nothing
   (a plaintext session). A peer without a key answers ERROR: HR_EAUTH naming that. */
int  hn_conn_handshake(hn_conn *c, const hn_key *key, int64_t deadline, hr_err *err);
/* hn_connect, then hn_conn_handshake (closes the connection on failure) */
hn_conn *hn_connect_secure(const char *addr, const hn_key *key, int64_t deadline, hr_err *err);
/* Responder (worker): receives a connection's first message into f / m, each frame within
   frame_ms of its start. With a key the connection must begin with the handshake (a plaintext
   HELLO gets ERROR "this worker needs the cluster key" and HR_EAUTH); without one a handshake gets
   ERROR "this worker has no cluster key" and HR_EAUTH. A wrong key, a replayed or altered handshake
   message: HR_EAUTH, the peer told only that the handshake failed. */
int  hn_msg_recv_first(hn_conn *c, const hn_key *key, hn_frame *f, hn_msg *m, int frame_ms, hr_err *err);
bool hn_conn_secure(const hn_conn *c); /* the handshake is done: frames are encrypted */
/* Tests: ratchet after `messages` frames or `ms` milliseconds (0: the defaults above). Before use. */
void hn_conn_set_rekey(hn_conn *c, uint64_t messages, int64_t ms);

/* ---- datagrams (the lossy transport): keys from the session, sealed one by one -------------------
   Each direction has its own key, derived in the handshake apart from the stream keys. The sender
   numbers its datagrams 0, 1, 2, ... (never reusing a number under one key; HN_REKEY_MESSAGES at most)
   and sends the number in clear with each; the receiver opens with that number as nonce, then checks
   it against a window of the last HN_REPLAY_WINDOW numbers seen (hn_replay_*): a replayed or too old
   datagram is dropped. Keys last as long as the connection they came from. */
typedef struct hn_dgram_key { uint8_t k[HN_NOISE_KEY_SIZE]; } hn_dgram_key;
/* this side's send and receive keys; HR_EINVAL on a plaintext connection */
int  hn_conn_dgram_keys(const hn_conn *c, hn_dgram_key *send, hn_dgram_key *recv, hr_err *err);
/* out = ciphertext | tag: n + HN_AEAD_TAG_SIZE bytes. ad (may be NULL) is authenticated, not sent. */
void hn_dgram_seal(const hn_dgram_key *k, uint64_t counter, const void *ad, size_t ad_len, const void *m, size_t n,
                   uint8_t *out);
/* n: ciphertext with tag; out gets n - 16 bytes. HR_EAUTH (altered, wrong key or number), HR_EFORMAT (short). */
int  hn_dgram_open(const hn_dgram_key *k, uint64_t counter, const void *ad, size_t ad_len, const uint8_t *c, size_t n,
                   uint8_t *out);
#define HN_REPLAY_WINDOW 1024
typedef struct hn_replay { uint64_t top; bool any; uint64_t bits[HN_REPLAY_WINDOW / 64]; } hn_replay;
void hn_replay_init(hn_replay *w);
/* would counter be new? (check before the work of opening; hn_replay_accept after it opened) */
bool hn_replay_check(const hn_replay *w, uint64_t counter);
/* records counter as seen; false if it was already seen or is older than the window */
bool hn_replay_accept(hn_replay *w, uint64_t counter);

/* ---- datagrams (dgram.c, udp.c): the lossy all-reduce over UDP (issue 28, docs/lossy.md) -------------------
   One datagram holds a range of one device's partial output of one all-reduce (PARTIAL, worker to
   head), a range of its sum (RESULT, head to worker), or asks for the sum again (NACK, worker to head;
   one element, 0):
     u32 magic 0x47445248 ("HRDG") | u16 version (HN_DGRAM_VERSION) | u16 kind (enum hn_dgram_kind) |
     u64 session | u32 seq (the all-reduce) | u16 device (the sender) | u16 flags (HN_DGRAM_REPEAT or 0) |
     u32 total (elements of the whole partial) | u32 offset | u32 n (elements here) | n x f32
   little-endian, HN_DGRAM_HEADER bytes of header, at most HN_DGRAM_MAX_BYTES in all (under a 1500-byte
   MTU with IP and UDP headers). Decoding is strict: exact length, 1 <= n <= HN_DGRAM_MAX_ELEMS,
   offset + n <= total, no unknown flag; whatever fails is dropped by the caller and counted, never
   trusted. A burst's last datagram goes twice, the copy flagged HN_DGRAM_REPEAT: a receiver that has
   the last one knows the burst is over, so any hole is a loss (docs/lossy.md).
   Sealed (issue 29: the connection beside is encrypted, hn_dgram_crypt on): version HN_DGRAM_VERSION_SEALED,
   then after the header a u64 counter in clear (this direction's datagram number: the AEAD's nonce),
   then the elements encrypted and a 16-byte tag; header and counter are associated data. The receiver
   opens before it trusts any field, drops what fails (HR_EAUTH: altered, wrong key, not sealed) and
   what reuses a counter (HR_EEXIST: a replay or a network duplicate). Sealed datagrams hold
   HN_DGRAM_MAX_ELEMS_SEALED elements, so that they stay within HN_DGRAM_MAX_BYTES too.
   hn_dgram_encode / hn_dgram_decode are the only places that turn a datagram into bytes and back. */
#define HN_DGRAM_MAGIC         0x47445248u
#define HN_DGRAM_VERSION       1
#define HN_DGRAM_VERSION_SEALED 2
enum hn_dgram_kind { HN_DGRAM_PARTIAL = 1, HN_DGRAM_RESULT = 2, HN_DGRAM_NACK = 3,
                     HN_DGRAM_PROBE = 4 /* the planner's loss probe (LOSS_PROBE), never part of an all-reduce */ };
#define HN_DGRAM_REPEAT        1u /* flags: a second copy (of a burst's last datagram) */
#define HN_DGRAM_HEADER        36
#define HN_DGRAM_MAX_BYTES     1400
#define HN_DGRAM_SEAL_OVERHEAD (8 + HN_AEAD_TAG_SIZE) /* counter, tag */
#define HN_DGRAM_MAX_ELEMS     ((HN_DGRAM_MAX_BYTES - HN_DGRAM_HEADER) / 4)
#define HN_DGRAM_MAX_ELEMS_SEALED ((HN_DGRAM_MAX_BYTES - HN_DGRAM_HEADER - HN_DGRAM_SEAL_OVERHEAD) / 4)
#define HN_DGRAM_MAX_TOTAL     (1u << 26) /* elements of one partial */

typedef struct hn_dgram {
    int         kind;   /* enum hn_dgram_kind */
    uint16_t    flags;  /* HN_DGRAM_REPEAT or 0 */
    uint64_t    session;
    uint32_t    seq;
    uint16_t    device;
    uint32_t    total, offset, n;
    const void *data;   /* n little-endian f32: encode reads floats; decode points into the datagram
                           (not aligned: copy out with memcpy) */
} hn_dgram;

/* The sealing state of one link's datagrams: this side's keys, the next counter to send, the counters
   seen. `on` false (a plaintext connection): datagrams go in clear, as without a key. */
typedef struct hn_dgram_crypt {
    bool         on;
    hn_dgram_key send, recv;
    uint64_t     next;                      /* the next counter sent under `send` */
    hn_replay    seen;                      /* counters received under `recv` */
    uint8_t      plain[HN_DGRAM_MAX_BYTES]; /* decode's opened elements (out->data points here) */
} hn_dgram_crypt;
/* Seals the datagrams beside c if c is encrypted (keys from the handshake), else leaves them plain:
   0, or the error of hn_conn_dgram_keys. */
int    hn_dgram_crypt_init(hn_dgram_crypt *x, const hn_conn *c, hr_err *err);
void   hn_dgram_crypt_wipe(hn_dgram_crypt *x);
/* Elements one datagram holds: HN_DGRAM_MAX_ELEMS, or HN_DGRAM_MAX_ELEMS_SEALED when x seals. */
uint32_t hn_dgram_max_elems(const hn_dgram_crypt *x);

/* Encodes d into out (cap >= HN_DGRAM_MAX_BYTES is always enough), sealed when x (may be NULL) is on
   (taking its next counter): the datagram's size, or 0 when d breaks a limit (nothing written that a
   decoder would take). */
size_t hn_dgram_encode(const hn_dgram *d, hn_dgram_crypt *x, uint8_t *out, size_t cap);
/* Decodes one datagram of len bytes, opening it first when x (may be NULL) is on: 0, or HR_EFORMAT,
   HR_EAUTH (did not open, or not sealed) or HR_EEXIST (counter seen) with why (may be NULL) saying
   what is wrong. out->data borrows p, or x->plain when sealed (until the next decode with x). */
int    hn_dgram_decode(const uint8_t *p, size_t len, hn_dgram_crypt *x, hn_dgram *out, char *why, size_t why_cap);

/* A UDP socket beside a TCP connection: bound to the connection's local address (any port), so that
   datagrams take the same path as the connection; non-blocking. */
typedef struct hn_udp hn_udp;
hn_udp  *hn_udp_open(const hn_conn *beside, hr_err *err);
void     hn_udp_close(hn_udp *u);                    /* NULL is fine */
uint16_t hn_udp_port(const hn_udp *u);
int      hn_udp_fd(const hn_udp *u);
/* Sends from now on to the connection's peer address at `port` (connect(2): the kernel also drops
   datagrams from anyone else). */
int      hn_udp_connect(hn_udp *u, const hn_conn *c, uint16_t port, hr_err *err);
/* Only datagrams from the connection's peer address (any port) are returned by hn_udp_recv. */
void     hn_udp_expect_peer(hn_udp *u, const hn_conn *c);
/* An unconnected socket replies from now on to where the last datagram hn_udp_recv returned came from
   (call it once that datagram proved genuine). */
void     hn_udp_reply_to_last(hn_udp *u);
/* One datagram, never blocking, to the connected or reply address: 0, or HR_ENET when the kernel took
   none (buffer full, no route, no address yet; the caller counts it as lost). */
int      hn_udp_send(hn_udp *u, const void *p, size_t n);
/* One waiting datagram into buf: its size, 0 when none is waiting, -1 for one from an unexpected
   address or a receive error, -2 for one longer than cap (both read and dropped: count them). */
long     hn_udp_recv(hn_udp *u, void *buf, size_t cap);

#endif
