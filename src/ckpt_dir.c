/*
 * ckpt_dir.c -- a checkpoint directory opened for reading.
 *
 * A reader holds the directory's shared flock from open to close, so a
 * concurrent save (which takes it exclusively) never deletes a file the
 * reader is about to open. Every table file is checked against the
 * MANIFEST (size, CRC32 of the whole file, the table name in its header)
 * on top of the format's own checksums: a file that was swapped or
 * truncated is caught even when it is a valid file in itself.
 */
#include "ckpt_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

int dynemb_ckpt_dir_open(const char *dir, dynemb_ckpt_dir *d) {
  memset(d, 0, sizeof *d);
  d->dfd = -1;
  if (!dir || !*dir)
    return dynemb_error_set(DYNEMB_EINVAL, "checkpoint: directory path is "
                                           "NULL or empty");
  dynemb_ckpt_what(d->what, "checkpoint '%s'", dir);
  int rc = dynemb_ckpt_open_dir(dir, 0, LOCK_SH, d->what, &d->dfd);
  if (rc) return rc;
  int exists;
  rc = dynemb_manifest_read(d->dfd, d->what, &d->m, &exists);
  if (!rc && !exists)
    rc = dynemb_error_set(DYNEMB_EIO,
                          "%s: cannot open MANIFEST: %s (the directory holds "
                          "no dynemb checkpoint, or its save never "
                          "finished)",
                          d->what, strerror(ENOENT));
  if (rc) {
    close(d->dfd);
    d->dfd = -1;
  }
  return rc;
}

void dynemb_ckpt_dir_close(dynemb_ckpt_dir *d) {
  if (d->dfd >= 0) close(d->dfd);
  dynemb_manifest_free(&d->m);
  d->dfd = -1;
}

const dynemb_manifest_entry *dynemb_ckpt_dir_find(dynemb_ckpt_dir *d,
                                                  const char *name) {
  const dynemb_manifest_entry *e = dynemb_manifest_find(&d->m, name);
  if (e) return e;
  char list[640];
  size_t len = 0;
  list[0] = '\0';
  for (size_t i = 0; i < d->m.n; i++) {
    int w = snprintf(list + len, sizeof list - len, "%s'%s'", i ? ", " : "",
                     d->m.entries[i].name);
    if (w < 0 || (size_t)w >= sizeof list - len) {
      snprintf(list + (len < sizeof list - 8 ? len : sizeof list - 8), 8,
               ", ...");
      break;
    }
    len += (size_t)w;
  }
  dynemb_error_set(DYNEMB_ENOTFOUND,
                   "%s has no table '%s'; it holds %s%s%s", d->what, name,
                   d->m.n ? "these tables: " : "no tables", list,
                   d->m.n ? " (pass one of them as the name in the "
                            "checkpoint)"
                          : "");
  return NULL;
}

int dynemb_ckpt_dir_read_table(dynemb_ckpt_dir *d,
                               const dynemb_manifest_entry *e,
                               int header_only, dynemb_ckpt_header *h,
                               dynemb_snapshot *snap, uint64_t *file_bytes) {
  char what[DYNEMB_CKPT_WHAT_MAX];
  dynemb_ckpt_what(what, "%s: file '%s' of table '%s'", d->what,
           e->file, e->name);
  int fd = openat(d->dfd, e->file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT)
      return dynemb_error_set(DYNEMB_ECORRUPT,
                              "%s: the file is missing; restore the "
                              "checkpoint directory from a backup or retrain",
                              what);
    return dynemb_error_set(DYNEMB_EIO, "%s: cannot open: %s", what,
                            strerror(err));
  }
  struct stat st;
  int rc = DYNEMB_OK;
  dynemb_ckpt_src src;
  if (fstat(fd, &st) != 0) {
    rc = dynemb_error_set(DYNEMB_EIO, "%s: cannot stat: %s", what,
                          strerror(errno));
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = dynemb_error_set(DYNEMB_ECORRUPT, "%s: not a regular file", what);
    goto out;
  }
  if (file_bytes) *file_bytes = (uint64_t)st.st_size;
  dynemb_ckpt_src_fd(&src, fd, (uint64_t)st.st_size);
  if (header_only) {
    rc = dynemb_ckpt_table_read_header(&src, what, h);
  } else {
    if ((uint64_t)st.st_size != e->bytes) {
      rc = dynemb_error_set(DYNEMB_ECORRUPT,
                            "%s: file is %" PRIu64
                            " bytes but MANIFEST says %" PRIu64
                            "; it is truncated or damaged: restore it from a "
                            "backup or retrain",
                            what, (uint64_t)st.st_size, e->bytes);
      goto out;
    }
    rc = dynemb_ckpt_table_read(&src, what, h, snap);
    if (!rc && src.crc != e->crc) {
      rc = dynemb_error_set(DYNEMB_ECORRUPT,
                            "%s: file checksum mismatch with MANIFEST "
                            "(stored 0x%08" PRIx32 ", computed 0x%08" PRIx32
                            "); the file was replaced or damaged: restore it "
                            "from a backup or retrain",
                            what, e->crc, src.crc);
      dynemb_ckpt_header_free(h);
      if (snap) dynemb_snapshot_free(snap);
    }
  }
  if (!rc && strcmp(h->name, e->name) != 0) {
    rc = dynemb_error_set(DYNEMB_ECORRUPT,
                          "%s: the file holds table '%s', not the table the "
                          "MANIFEST names; restore the checkpoint directory "
                          "from a backup",
                          what, h->name);
    dynemb_ckpt_header_free(h);
    if (snap) dynemb_snapshot_free(snap);
  }
out:
  close(fd);
  return rc;
}

int dynemb_ckpt_dir_read(dynemb_ckpt_dir *d, const char *name,
                         dynemb_snapshot *snap) {
  const dynemb_manifest_entry *e = dynemb_ckpt_dir_find(d, name);
  dynemb_ckpt_header h;
  int rc = e ? dynemb_ckpt_dir_read_table(d, e, 0, &h, snap, NULL)
             : DYNEMB_ENOTFOUND;
  if (!rc) dynemb_ckpt_header_free(&h);
  return rc;
}
