/*
 * ckpt_io.c -- the POSIX file and directory I/O under checkpoints, with
 * crash injection.
 *
 * Every byte and every metadata change of a checkpoint save goes through
 * these few functions, so a test can stop a save at any exact point (by
 * SIGKILL, in a forked child) and check that the directory still holds a
 * loadable checkpoint. The hook costs one branch when disabled. The
 * directory steps live here too (not in the save flow) because both the
 * save and the incremental save's bookkeeping need them, and the room
 * below both is the one place neither has to reach up for them.
 */
#include "ckpt_io.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dynemb.h"
#include "error.h"

void dynemb_ckpt_what(char *buf, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, DYNEMB_CKPT_WHAT_MAX, fmt, ap);
  va_end(ap);
}

long dynemb_ckpt_fault_budget = -1;

static void fault_die(void) {
  raise(SIGKILL);
  _exit(137); /* not reached */
}

void dynemb_ckpt_fault_point(void) {
  if (dynemb_ckpt_fault_budget < 0) return;
  if (dynemb_ckpt_fault_budget == 0) fault_die();
  dynemb_ckpt_fault_budget--;
}

static int write_raw(int fd, const unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

int dynemb_ckpt_write_all(int fd, const void *buf, size_t n) {
  if (dynemb_ckpt_fault_budget == 0) {
    (void)write_raw(fd, buf, n / 2); /* a torn write, then the "crash" */
    fault_die();
  }
  dynemb_ckpt_fault_point();
  return write_raw(fd, buf, n);
}

int dynemb_ckpt_read_all(int fd, void *buf, size_t n) {
  unsigned char *p = buf;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

int dynemb_ckpt_pread_all(int fd, void *buf, size_t n, uint64_t off) {
  unsigned char *p = buf;
  while (n) {
    ssize_t r = pread(fd, p, n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno;
    if (r == 0) return -1;
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

int dynemb_ckpt_fsync(int fd) {
  dynemb_ckpt_fault_point();
  while (fsync(fd) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

/* ---- directories ------------------------------------------------------------ */

int dynemb_ckpt_fsync_dir(int dfd) {
  int e = dynemb_ckpt_fsync(dfd);
  return e == EINVAL ? 0 : e; /* some file systems cannot sync directories */
}

/* Syncs the directory holding `path` (so a new entry in it is durable). */
static void fsync_parent(const char *path) {
  const char *slash = strrchr(path, '/');
  char *parent;
  if (!slash)
    parent = strdup(".");
  else if (slash == path)
    parent = strdup("/");
  else
    parent = strndup(path, (size_t)(slash - path));
  if (!parent) return;
  int fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)dynemb_ckpt_fsync_dir(fd);
    close(fd);
  }
  free(parent);
}

int dynemb_ckpt_mkdirs(const char *dir, const char *what) {
  char *p = strdup(dir);
  if (!p) return dynemb_error_set(DYNEMB_ENOMEM, "%s: out of memory", what);
  size_t len = strlen(p);
  for (size_t i = 1; i <= len; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    if (p[i - 1] == '/') continue;
    char saved = p[i];
    p[i] = '\0';
    if (mkdir(p, 0755) == 0) {
      fsync_parent(p);
    } else if (errno != EEXIST) {
      int e = errno;
      int rc = dynemb_error_set(DYNEMB_EIO, "%s: cannot create directory "
                                            "'%s': %s",
                                what, p, strerror(e));
      free(p);
      return rc;
    }
    p[i] = saved;
  }
  free(p);
  return DYNEMB_OK;
}

int dynemb_ckpt_open_dir(const char *dir, int create, int lock,
                         const char *what, int *dfd) {
  if (create) {
    int rc = dynemb_ckpt_mkdirs(dir, what);
    if (rc) return rc;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return dynemb_error_set(DYNEMB_EIO,
                            "%s: cannot open the checkpoint directory: %s%s",
                            what, strerror(e),
                            e == ENOENT ? " (no checkpoint was saved there)"
                                        : "");
  }
  /* Where flock is unsupported we go on unlocked rather than fail. */
  while (flock(fd, lock) != 0 && errno == EINTR) {
  }
  *dfd = fd;
  return DYNEMB_OK;
}

int dynemb_ckpt_write_atomic(int dfd, const char *tmp, const char *final,
                             const char *what, dynemb_ckpt_content_fn fn,
                             void *ctx) {
  int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return dynemb_error_set(DYNEMB_EIO, "%s: cannot create: %s", what,
                            strerror(errno));
  int rc = fn(fd, what, ctx);
  if (!rc) {
    int e = dynemb_ckpt_fsync(fd);
    if (e) rc = dynemb_error_set(DYNEMB_EIO, "%s: fsync failed: %s", what,
                                 strerror(e));
  }
  if (close(fd) != 0 && !rc)
    rc = dynemb_error_set(DYNEMB_EIO, "%s: close failed: %s", what,
                          strerror(errno));
  if (!rc) {
    dynemb_ckpt_fault_point();
    if (renameat(dfd, tmp, dfd, final) != 0)
      rc = dynemb_error_set(DYNEMB_EIO, "%s: cannot rename to '%s': %s", what,
                            final, strerror(errno));
  }
  if (rc) (void)unlinkat(dfd, tmp, 0);
  return rc;
}
