/*
 * fuzz_ckpt.c -- libFuzzer target for the checkpoint readers.
 *
 * Checkpoint files come from disks and networks and may be damaged in any
 * way, so the table-file reader and the MANIFEST parser must never crash,
 * overflow, over-allocate or loop on any input. Each input goes to both:
 *  - the table reader, in full mode (into a snapshot) and verify-only mode,
 *    which must agree; a file it accepts must be one the writer would
 *    write (sorted keys, consistent layout), and writing that snapshot
 *    again must give back exactly the input bytes (the format is
 *    canonical), and the header-only reader must accept it too;
 *  - the MANIFEST parser; a MANIFEST it accepts must format and re-parse
 *    to the same entries.
 * Seeds: tests/fuzz/seeds (see gen_seeds.c). Built and run by `make test`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt.h"
#include "dynemb.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_table(const uint8_t *data, size_t size) {
  dynemb_ckpt_src src;
  dynemb_ckpt_header h;
  dynemb_snapshot snap;
  dynemb_ckpt_src_mem(&src, data, size);
  int rc = dynemb_ckpt_table_read(&src, "fuzz", &h, &snap);
  dynemb_ckpt_src_mem(&src, data, size);
  int rc_verify = dynemb_ckpt_table_read(&src, "fuzz", NULL, NULL);
  if (rc != rc_verify) abort();
  dynemb_ckpt_header hh;
  dynemb_ckpt_src_mem(&src, data, size);
  int rc_head = dynemb_ckpt_table_read_header(&src, "fuzz", &hh);
  if (!rc_head) dynemb_ckpt_header_free(&hh);
  if (rc) return;
  if (rc_head) abort();
  if (dynemb_ckpt_snapshot_check(&snap, h.name, "fuzz", 1) != DYNEMB_OK) abort();
  int fd = memfd_create("fuzz_ckpt", MFD_CLOEXEC);
  if (fd >= 0) {
    uint64_t bytes;
    uint32_t crc;
    if (dynemb_ckpt_table_write(fd, "fuzz", h.name, &snap, NULL, &bytes, &crc) !=
            DYNEMB_OK ||
        bytes != size)
      abort();
    unsigned char *back = malloc(size);
    if (pread(fd, back, size, 0) != (ssize_t)size ||
        memcmp(back, data, size) != 0)
      abort();
    free(back);
    close(fd);
  }
  dynemb_snapshot_free(&snap);
  dynemb_ckpt_header_free(&h);
}

static void fuzz_manifest(const uint8_t *data, size_t size) {
  dynemb_manifest m, m2;
  if (dynemb_manifest_parse((const char *)data, size, "fuzz", &m)) return;
  char *text;
  size_t len;
  if (dynemb_manifest_format(&m, &text, &len)) abort();
  if (dynemb_manifest_parse(text, len, "fuzz", &m2)) abort();
  if (m.n != m2.n || m.generation != m2.generation) abort();
  if (!m.parent != !m2.parent) abort();
  if (m.parent && (strcmp(m.parent, m2.parent) || m.parent_crc != m2.parent_crc ||
                   strcmp(m.removed.file, m2.removed.file) ||
                   m.removed.bytes != m2.removed.bytes ||
                   m.removed.crc != m2.removed.crc))
    abort();
  for (size_t i = 0; i < m.n; i++) {
    const dynemb_manifest_entry *a = &m.entries[i], *b = &m2.entries[i];
    if (strcmp(a->name, b->name) || strcmp(a->file, b->file) ||
        a->bytes != b->bytes || a->crc != b->crc)
      abort();
    if (!dynemb_manifest_find(&m, a->name)) abort();
  }
  free(text);
  dynemb_manifest_free(&m);
  dynemb_manifest_free(&m2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_table(data, size);
  fuzz_manifest(data, size);
  return 0;
}
