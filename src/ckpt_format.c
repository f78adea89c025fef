/*
 * ckpt_format.c -- encoder and decoder of one table's checkpoint file.
 *
 * A table file is a header (magic, format version, dims, optimizer, counts,
 * table name, header CRC32) followed by six sections (keys, values,
 * last_access, candidate keys, counts, last_access), each with a small
 * header and a CRC32 of its own; docs/checkpoint-format.md has the bytes.
 * Numbers are encoded little-endian one by one (never by copying structs),
 * so files move between hosts. Encoding and decoding stream through one
 * fixed block, so a 100 GB table never needs a second copy in memory.
 *
 * The reader must survive any byte sequence (it is fuzzed): every length is
 * checked against the real file size before anything is allocated, every
 * checksum is verified before data is trusted, and a checksum mismatch is
 * reported in preference to the structural error it probably caused.
 */
#include "ckpt_format.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "ckpt_io.h"
#include "error.h"
#include "optim.h"

static const unsigned char k_magic[8] = {0x89, 'D', 'Y', 'N',
                                         'T', 'A', 'B', '\n'};

#define SECTION_COUNT 6u
#define SECTION_HEAD 16u /* id u32, elem_bytes u32, count u64 */
#define SECTION_TAIL 4u  /* crc u32 */

enum elem_kind { ELEM_I64, ELEM_F32, ELEM_U32 };

typedef struct section_desc {
  uint32_t id;
  const char *label; /* for messages */
  enum elem_kind kind;
  int sorted; /* keys: strictly increasing */
} section_desc;

static const section_desc k_sections[SECTION_COUNT] = {
    {1, "keys", ELEM_I64, 1},
    {2, "values", ELEM_F32, 0},
    {3, "last_access", ELEM_U32, 0},
    {4, "candidate keys", ELEM_I64, 1},
    {5, "candidate counts", ELEM_U32, 0},
    {6, "candidate last_access", ELEM_U32, 0},
};

static size_t elem_bytes(enum elem_kind k) { return k == ELEM_I64 ? 8 : 4; }

static const char k_damaged[] =
    "the file is damaged: restore it from a backup or retrain";

/* ======================================================================== */
/* Writer                                                                   */
/* ======================================================================== */

typedef struct writer {
  int fd;
  unsigned char *buf;
  size_t len;
  uint32_t file_crc;
  uint64_t bytes;
  int err; /* first errno */
  /* values streamed from a row source (NULL: from the snapshot's array) */
  const dynemb_ckpt_rows *rows;
  float *rowbuf; /* one block of rows */
  size_t row_floats;
  int rows_rc; /* the source's error */
} writer;

static void w_flush(writer *w) {
  if (w->err || w->len == 0) return;
  w->file_crc = (uint32_t)crc32(w->file_crc, w->buf, (uInt)w->len);
  int e = dynemb_ckpt_write_all(w->fd, w->buf, w->len);
  if (e) w->err = e;
  w->bytes += w->len;
  w->len = 0;
}

/* Room for n (<= block) bytes at the end of the buffer. */
static unsigned char *w_reserve(writer *w, size_t n) {
  if (w->len + n > DYNEMB_CKPT_BLOCK) w_flush(w);
  unsigned char *p = w->buf + w->len;
  w->len += n;
  return p;
}

static void encode(unsigned char *out, const void *src, size_t first,
                   size_t k, enum elem_kind kind) {
  if (kind == ELEM_I64) {
    const int64_t *s = (const int64_t *)src + first;
    for (size_t i = 0; i < k; i++) dynemb_le_put64(out + 8 * i, (uint64_t)s[i]);
  } else if (kind == ELEM_F32) {
    const float *s = (const float *)src + first;
    for (size_t i = 0; i < k; i++) {
      uint32_t u;
      memcpy(&u, &s[i], 4);
      dynemb_le_put32(out + 4 * i, u);
    }
  } else {
    const uint32_t *s = (const uint32_t *)src + first;
    for (size_t i = 0; i < k; i++) dynemb_le_put32(out + 4 * i, s[i]);
  }
}

static void w_section(writer *w, const section_desc *d, const void *data,
                      uint64_t count) {
  size_t eb = elem_bytes(d->kind);
  unsigned char *p = w_reserve(w, SECTION_HEAD);
  dynemb_le_put32(p, d->id);
  dynemb_le_put32(p + 4, (uint32_t)eb);
  dynemb_le_put64(p + 8, count);
  uint32_t crc = (uint32_t)crc32(0L, p, SECTION_HEAD);
  size_t per_block = DYNEMB_CKPT_BLOCK / eb;
  /* values from a row source: whole rows per block (a row is at most
   * 65536 x 3 floats, less than a block) */
  const int streamed = data == NULL && count > 0 && w->rows;
  if (streamed) per_block -= per_block % w->row_floats;
  for (uint64_t done = 0; done < count && !w->err && !w->rows_rc;) {
    size_t k = (size_t)(count - done < per_block ? count - done : per_block);
    const void *src = data;
    size_t at = (size_t)done;
    if (streamed) {
      w->rows_rc = w->rows->fn(w->rows->ctx, at / w->row_floats,
                               k / w->row_floats, w->rowbuf);
      if (w->rows_rc) break;
      src = w->rowbuf;
      at = 0;
    }
    p = w_reserve(w, k * eb);
    encode(p, src, at, k, d->kind);
    crc = (uint32_t)crc32(crc, p, (uInt)(k * eb));
    done += k;
  }
  p = w_reserve(w, SECTION_TAIL);
  dynemb_le_put32(p, crc);
}

static int strictly_increasing(const int64_t *k, size_t n, size_t *bad) {
  for (size_t i = 1; i < n; i++) {
    if (k[i] <= k[i - 1]) {
      *bad = i;
      return 0;
    }
  }
  return 1;
}

int dynemb_ckpt_snapshot_check(const dynemb_snapshot *snap, const char *name,
                               const char *what, int need_values) {
  size_t len = name ? strlen(name) : 0;
  if (len == 0 || len > DYNEMB_CKPT_MAX_NAME)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "%s: table name must be 1 to %u bytes long (got "
                            "%zu bytes)",
                            what, DYNEMB_CKPT_MAX_NAME, len);
  if (!snap) return dynemb_error_set(DYNEMB_EINVAL, "%s: snapshot is NULL", what);
  int slots = dynemb_optim_slot_count(snap->optimizer_kind);
  if (slots < 0)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "%s: table '%s' has unknown optimizer kind %d",
                            what, name, snap->optimizer_kind);
  if (snap->dim < 1 || snap->dim > 65536 ||
      snap->row_floats != snap->dim * (1 + slots))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "%s: table '%s' has an invalid row layout (dim "
                            "%d, row_floats %d, optimizer %s needs dim * %d)",
                            what, name, snap->dim, snap->row_floats,
                            dynemb_optimizer_name(snap->optimizer_kind),
                            1 + slots);
  if (snap->rows &&
      (!snap->keys || (need_values && !snap->values) || !snap->last_access))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "%s: table '%s': snapshot has %zu rows but a "
                            "NULL row array",
                            what, name, snap->rows);
  if (snap->candidates &&
      (!snap->cand_keys || !snap->cand_counts || !snap->cand_last_access))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "%s: table '%s': snapshot has %zu candidates but "
                            "a NULL candidate array",
                            what, name, snap->candidates);
  size_t bad;
  if (!strictly_increasing(snap->keys, snap->rows, &bad))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "%s: table '%s': snapshot keys are not sorted "
                            "and unique (index %zu)",
                            what, name, bad);
  if (!strictly_increasing(snap->cand_keys, snap->candidates, &bad))
    return dynemb_error_set(DYNEMB_EINVAL,
                            "%s: table '%s': snapshot candidate keys are not "
                            "sorted and unique (index %zu)",
                            what, name, bad);
  return DYNEMB_OK;
}

int dynemb_ckpt_table_write(int fd, const char *what, const char *name,
                            const dynemb_snapshot *snap,
                            const dynemb_ckpt_rows *source, uint64_t *bytes,
                            uint32_t *crc) {
  int rc = dynemb_ckpt_snapshot_check(snap, name, what, source == NULL);
  if (rc) return rc;
  writer w = {.fd = fd, .rows = source};
  w.buf = malloc(DYNEMB_CKPT_BLOCK);
  if (source) w.rowbuf = malloc(DYNEMB_CKPT_BLOCK);
  if (!w.buf || (source && !w.rowbuf)) {
    free(w.buf);
    free(w.rowbuf);
    return dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory for the write "
                                           "buffer", what);
  }
  w.row_floats = (size_t)snap->row_floats;
  uint32_t name_len = (uint32_t)strlen(name);
  uint32_t header_bytes = DYNEMB_CKPT_HEADER_FIXED + name_len + 4;
  /* The header (at most 64 KiB + 68) is written through the buffer too. */
  unsigned char *h = w_reserve(&w, DYNEMB_CKPT_HEADER_FIXED);
  memcpy(h, k_magic, 8);
  dynemb_le_put32(h + 8, DYNEMB_CKPT_FORMAT_VERSION);
  dynemb_le_put32(h + 12, header_bytes);
  dynemb_le_put32(h + 16, (uint32_t)snap->dim);
  dynemb_le_put32(h + 20, (uint32_t)snap->row_floats);
  dynemb_le_put32(h + 24, (uint32_t)snap->optimizer_kind);
  dynemb_le_put32(h + 28, 0); /* flags, reserved */
  dynemb_le_put64(h + 32, snap->apply_steps);
  dynemb_le_put64(h + 40, (uint64_t)snap->rows);
  dynemb_le_put64(h + 48, (uint64_t)snap->candidates);
  dynemb_le_put32(h + 56, SECTION_COUNT);
  dynemb_le_put32(h + 60, name_len);
  unsigned char *np = w_reserve(&w, name_len + 4u);
  memcpy(np, name, name_len);
  /* The header is contiguous at the start of the (fresh) buffer. */
  dynemb_le_put32(np + name_len,
                  (uint32_t)crc32(0L, w.buf, header_bytes - 4));

  uint64_t rows = snap->rows, cands = snap->candidates;
  w_section(&w, &k_sections[0], snap->keys, rows);
  w_section(&w, &k_sections[1], w.rows ? NULL : snap->values,
            rows * (uint64_t)snap->row_floats);
  w_section(&w, &k_sections[2], snap->last_access, rows);
  w_section(&w, &k_sections[3], snap->cand_keys, cands);
  w_section(&w, &k_sections[4], snap->cand_counts, cands);
  w_section(&w, &k_sections[5], snap->cand_last_access, cands);
  w_flush(&w);
  free(w.buf);
  free(w.rowbuf);
  if (w.rows_rc) return w.rows_rc; /* the message names the table */
  if (w.err)
    return dynemb_error_set(DYNEMB_EIO, "%s: write failed: %s", what,
                            strerror(w.err));
  *bytes = w.bytes;
  *crc = w.file_crc;
  return DYNEMB_OK;
}

/* ======================================================================== */
/* Reader                                                                   */
/* ======================================================================== */

void dynemb_ckpt_src_fd(dynemb_ckpt_src *src, int fd, uint64_t size) {
  memset(src, 0, sizeof *src);
  src->fd = fd;
  src->size = size;
}

void dynemb_ckpt_src_mem(dynemb_ckpt_src *src, const void *data, size_t size) {
  memset(src, 0, sizeof *src);
  src->fd = -1;
  src->mem = data;
  src->size = size;
}

/* Reads n bytes; a read past `size` is a truncation (ECORRUPT). */
static int src_read(dynemb_ckpt_src *s, void *buf, size_t n,
                    const char *what) {
  if (n > s->size - s->pos)
    return dynemb_error_set(DYNEMB_ECORRUPT,
                            "%s: file ends at byte %" PRIu64
                            " in the middle of its data; it is truncated: "
                            "restore it from a backup or retrain",
                            what, s->size);
  if (s->fd < 0) {
    memcpy(buf, s->mem + s->pos, n);
  } else {
    int e = dynemb_ckpt_read_all(s->fd, buf, n);
    if (e < 0)
      return dynemb_error_set(DYNEMB_ECORRUPT,
                              "%s: file ended early at byte %" PRIu64
                              " (it shrank while being read?)",
                              what, s->pos);
    if (e > 0)
      return dynemb_error_set(DYNEMB_EIO, "%s: read failed: %s", what,
                              strerror(e));
  }
  s->crc = (uint32_t)crc32(s->crc, buf, (uInt)n);
  s->pos += n;
  return DYNEMB_OK;
}

void dynemb_ckpt_header_free(dynemb_ckpt_header *h) {
  if (!h) return;
  free(h->name);
  memset(h, 0, sizeof *h);
}

int dynemb_ckpt_table_read_header(dynemb_ckpt_src *src, const char *what,
                                  dynemb_ckpt_header *h) {
  memset(h, 0, sizeof *h);
  const uint32_t min_header = DYNEMB_CKPT_HEADER_FIXED + 1 + 4;
  unsigned char head[16];
  if (src->size < 16)
    return dynemb_error_set(DYNEMB_ECORRUPT,
                            "%s: file is only %" PRIu64
                            " bytes, too short for a dynemb table file; it "
                            "is truncated: restore it from a backup or "
                            "retrain",
                            what, src->size);
  int rc = src_read(src, head, 16, what);
  if (rc) return rc;
  if (memcmp(head, k_magic, 8) != 0)
    return dynemb_error_set(DYNEMB_ECORRUPT,
                            "%s: bad magic number, not a dynemb table file; "
                            "%s",
                            what, k_damaged);
  uint32_t header_bytes = dynemb_le_get32(head + 12);
  if (header_bytes < min_header ||
      header_bytes > DYNEMB_CKPT_HEADER_FIXED + DYNEMB_CKPT_MAX_NAME + 4 ||
      header_bytes > src->size)
    return dynemb_error_set(DYNEMB_ECORRUPT,
                            "%s: header length %" PRIu32
                            " is impossible (file is %" PRIu64 " bytes); %s",
                            what, header_bytes, src->size, k_damaged);
  unsigned char *buf = malloc(header_bytes);
  if (!buf)
    return dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", what);
  memcpy(buf, head, 16);
  rc = src_read(src, buf + 16, header_bytes - 16, what);
  if (rc) goto out;
  uint32_t stored = dynemb_le_get32(buf + header_bytes - 4);
  uint32_t computed = (uint32_t)crc32(0L, buf, header_bytes - 4);
  if (stored != computed) {
    rc = dynemb_error_set(DYNEMB_ECORRUPT,
                          "%s: header checksum mismatch (stored 0x%08" PRIx32
                          ", computed 0x%08" PRIx32 "); %s",
                          what, stored, computed, k_damaged);
    goto out;
  }
  /* The version is trusted only once the header checksum holds, so a
   * damaged version field reads as damage, not as a newer format. Every
   * format version keeps magic, version, header length and a trailing
   * header CRC32 where version 1 has them. */
  h->version = dynemb_le_get32(buf + 8);
  if (h->version != DYNEMB_CKPT_FORMAT_VERSION) {
    rc = dynemb_error_set(DYNEMB_EVERSION,
                          "%s: written in checkpoint format version %" PRIu32
                          ", but this dynemb reads only version %d; load it "
                          "with the dynemb release that wrote it",
                          what, h->version, DYNEMB_CKPT_FORMAT_VERSION);
    goto out;
  }
  h->header_bytes = header_bytes;
  uint32_t dim = dynemb_le_get32(buf + 16);
  uint32_t row_floats = dynemb_le_get32(buf + 20);
  uint32_t kind = dynemb_le_get32(buf + 24);
  uint32_t flags = dynemb_le_get32(buf + 28);
  uint32_t sections = dynemb_le_get32(buf + 56);
  uint32_t name_len = dynemb_le_get32(buf + 60);
  /* (kind is untrusted: the range check keeps the int cast defined) */
  int slots = kind <= 255 ? dynemb_optim_slot_count((int)kind) : -1;
  const char *problem = NULL;
  if (name_len == 0 || header_bytes != DYNEMB_CKPT_HEADER_FIXED + name_len + 4)
    problem = "name length disagrees with header length";
  else if (memchr(buf + DYNEMB_CKPT_HEADER_FIXED, 0, name_len))
    problem = "table name contains a NUL byte";
  else if (flags != 0)
    problem = "unknown flags are set";
  else if (sections != SECTION_COUNT)
    problem = "wrong section count";
  else if (slots < 0)
    problem = "unknown optimizer kind";
  else if (dim < 1 || dim > 65536)
    problem = "dim out of range 1..65536";
  else if (row_floats != dim * (uint32_t)(1 + slots))
    problem = "row_floats does not match dim and optimizer";
  if (problem) {
    rc = dynemb_error_set(DYNEMB_ECORRUPT,
                          "%s: invalid header (%s: dim %" PRIu32
                          ", row_floats %" PRIu32 ", optimizer %" PRIu32
                          ", sections %" PRIu32 "); the file was written "
                          "by a faulty program: restore it from a backup or "
                          "retrain",
                          what, problem, dim, row_floats, kind, sections);
    goto out;
  }
  h->dim = (int)dim;
  h->row_floats = (int)row_floats;
  h->optimizer_kind = (int)kind;
  h->apply_steps = dynemb_le_get64(buf + 32);
  h->rows = dynemb_le_get64(buf + 40);
  h->candidates = dynemb_le_get64(buf + 48);
  h->name = malloc((size_t)name_len + 1);
  if (!h->name) {
    rc = dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", what);
    goto out;
  }
  memcpy(h->name, buf + DYNEMB_CKPT_HEADER_FIXED, name_len);
  h->name[name_len] = '\0';
out:
  free(buf);
  if (rc) dynemb_ckpt_header_free(h);
  return rc;
}

/* Total file size the header describes, or 0 on overflow. */
static uint64_t expected_size(const dynemb_ckpt_header *h) {
  uint64_t total = h->header_bytes, part;
  uint64_t per_row = 8 + 4 + 4 * (uint64_t)h->row_floats;
  if (__builtin_add_overflow(total,
                             (uint64_t)SECTION_COUNT *
                                 (SECTION_HEAD + SECTION_TAIL),
                             &total))
    return 0;
  if (__builtin_mul_overflow(h->rows, per_row, &part) ||
      __builtin_add_overflow(total, part, &total))
    return 0;
  if (__builtin_mul_overflow(h->candidates, (uint64_t)16, &part) ||
      __builtin_add_overflow(total, part, &total))
    return 0;
  return total;
}

static void decode(void *dst, size_t first, const unsigned char *in, size_t k,
                   enum elem_kind kind) {
  if (kind == ELEM_I64) {
    int64_t *d = (int64_t *)dst + first;
    for (size_t i = 0; i < k; i++) d[i] = (int64_t)dynemb_le_get64(in + 8 * i);
  } else if (kind == ELEM_F32) {
    float *d = (float *)dst + first;
    for (size_t i = 0; i < k; i++) {
      uint32_t u = dynemb_le_get32(in + 4 * i);
      memcpy(&d[i], &u, 4);
    }
  } else {
    uint32_t *d = (uint32_t *)dst + first;
    for (size_t i = 0; i < k; i++) d[i] = dynemb_le_get32(in + 4 * i);
  }
}

/* Reads section `d` holding `count` elements (as the header says) into
 * `dst` (NULL: decode into `scratch` block by block, verify only). */
static int read_section(dynemb_ckpt_src *src, const char *what,
                        const section_desc *d, uint64_t count, void *dst,
                        unsigned char *raw, void *scratch, size_t block) {
  size_t eb = elem_bytes(d->kind);
  unsigned char head[SECTION_HEAD];
  int rc = src_read(src, head, SECTION_HEAD, what);
  if (rc) return rc;
  uint32_t crc = (uint32_t)crc32(0L, head, SECTION_HEAD);
  int head_ok = dynemb_le_get32(head) == d->id &&
                dynemb_le_get32(head + 4) == eb &&
                dynemb_le_get64(head + 8) == count;
  int64_t prev = 0;
  uint64_t bad_order = UINT64_MAX;
  size_t per_block = block / eb;
  for (uint64_t done = 0; done < count;) {
    size_t k = (size_t)(count - done < per_block ? count - done : per_block);
    rc = src_read(src, raw, k * eb, what);
    if (rc) return rc;
    crc = (uint32_t)crc32(crc, raw, (uInt)(k * eb));
    void *out = dst ? dst : scratch;
    size_t first = dst ? (size_t)done : 0;
    decode(out, first, raw, k, d->kind);
    if (d->sorted && bad_order == UINT64_MAX) {
      const int64_t *keys = (const int64_t *)out + first;
      for (size_t i = 0; i < k; i++) {
        if ((done > 0 || i > 0) && keys[i] <= prev) {
          bad_order = done + i;
          break;
        }
        prev = keys[i];
      }
    }
    done += k;
  }
  unsigned char tail[SECTION_TAIL];
  rc = src_read(src, tail, SECTION_TAIL, what);
  if (rc) return rc;
  uint32_t stored = dynemb_le_get32(tail);
  if (stored != crc)
    return dynemb_error_set(DYNEMB_ECORRUPT,
                            "%s: %s section checksum mismatch (stored "
                            "0x%08" PRIx32 ", computed 0x%08" PRIx32 "); %s",
                            what, d->label, stored, crc, k_damaged);
  if (!head_ok)
    return dynemb_error_set(
        DYNEMB_ECORRUPT,
        "%s: %s section header is wrong (id %" PRIu32 ", element bytes %" PRIu32
        ", count %" PRIu64 "; expected id %" PRIu32 ", %zu, %" PRIu64
        "); the file was written by a faulty program: restore it from a "
        "backup or retrain",
        what, d->label, dynemb_le_get32(head), dynemb_le_get32(head + 4),
        dynemb_le_get64(head + 8), d->id, eb, count);
  if (bad_order != UINT64_MAX)
    return dynemb_error_set(DYNEMB_ECORRUPT,
                            "%s: %s are not strictly increasing at index "
                            "%" PRIu64 "; the file was written by a faulty "
                            "program: restore it from a backup or retrain",
                            what, d->label, bad_order);
  return DYNEMB_OK;
}

static void *alloc_array(uint64_t count, size_t eb, int *fail) {
  if (count == 0) return NULL;
  if (count > SIZE_MAX / eb) {
    *fail = 1;
    return NULL;
  }
  void *p = malloc((size_t)count * eb);
  if (!p) *fail = 1;
  return p;
}

int dynemb_ckpt_table_read(dynemb_ckpt_src *src, const char *what,
                           dynemb_ckpt_header *hout, dynemb_snapshot *snap) {
  dynemb_ckpt_header h;
  if (snap) memset(snap, 0, sizeof *snap);
  int rc = dynemb_ckpt_table_read_header(src, what, &h);
  if (rc) return rc;
  uint64_t want = expected_size(&h);
  if (want != src->size) {
    rc = dynemb_error_set(DYNEMB_ECORRUPT,
                          "%s: file is %" PRIu64
                          " bytes but its header describes %" PRIu64
                          " rows and %" PRIu64
                          " candidates (%" PRIu64 " bytes); it is truncated "
                          "or damaged: restore it from a backup or retrain",
                          what, src->size, h.rows, h.candidates, want);
    goto fail;
  }
  /* From here every count is bounded by the real file size. */
  uint64_t counts[SECTION_COUNT] = {
      h.rows, h.rows * (uint64_t)h.row_floats, h.rows,
      h.candidates, h.candidates, h.candidates};
  void *dst[SECTION_COUNT] = {0};
  /* One block, or less for a small file (at least one 8-byte element). */
  size_t block = src->size < DYNEMB_CKPT_BLOCK ? (size_t)src->size + 8
                                               : DYNEMB_CKPT_BLOCK;
  unsigned char *raw = malloc(block);
  void *scratch = snap ? NULL : malloc(block);
  int fail = !raw || (!snap && !scratch);
  if (snap) {
    for (unsigned i = 0; i < SECTION_COUNT; i++)
      dst[i] = alloc_array(counts[i], elem_bytes(k_sections[i].kind), &fail);
    snap->keys = dst[0];
    snap->values = dst[1];
    snap->last_access = dst[2];
    snap->cand_keys = dst[3];
    snap->cand_counts = dst[4];
    snap->cand_last_access = dst[5];
  }
  if (fail) {
    rc = dynemb_error_set(DYNEMB_ENOMEM,
                          "%s: out of memory reading %" PRIu64
                          " rows of %d floats",
                          what, h.rows, h.row_floats);
  } else {
    for (unsigned i = 0; i < SECTION_COUNT && !rc; i++)
      rc = read_section(src, what, &k_sections[i], counts[i], dst[i], raw,
                        scratch, block);
  }
  free(raw);
  free(scratch);
  if (rc) goto fail;
  if (snap) {
    snap->dim = h.dim;
    snap->row_floats = h.row_floats;
    snap->optimizer_kind = h.optimizer_kind;
    snap->apply_steps = h.apply_steps;
    snap->rows = (size_t)h.rows;
    snap->candidates = (size_t)h.candidates;
  }
  if (hout)
    *hout = h;
  else
    dynemb_ckpt_header_free(&h);
  return DYNEMB_OK;
fail:
  if (snap) dynemb_snapshot_free(snap);
  dynemb_ckpt_header_free(&h);
  return rc;
}
