/*
 * ckpt_io.c -- the POSIX file I/O under checkpoints, with crash injection.
 *
 * Every byte and every metadata change of a checkpoint save goes through
 * these few functions, so a test can stop a save at any exact point (by
 * SIGKILL, in a forked child) and check that the directory still holds a
 * loadable checkpoint. The hook costs one branch when disabled.
 */
#include "ckpt.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

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

int dynemb_ckpt_fsync(int fd) {
  dynemb_ckpt_fault_point();
  while (fsync(fd) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}
