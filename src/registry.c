/*
 * registry.c -- the process-wide name -> table registry and table
 * reference counting.
 *
 * TensorFlow kernels, the CLI and tests find tables by name, so tables live
 * in one registry guarded by a mutex. The registry holds one reference to
 * each registered table; dropping a name releases it, and the table is
 * destroyed when its last reference is released, so a kernel that still
 * holds a table keeps a usable object after a drop.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "table.h"

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static dynemb_table **reg; /* sorted by name */
static size_t reg_n, reg_cap;

/* Position of `name` in reg, or where it would go (*found = 0). */
static size_t reg_search(const char *name, int *found) {
  size_t lo = 0, hi = reg_n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(dynemb_table_name(reg[mid]), name);
    if (c == 0) {
      *found = 1;
      return mid;
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *found = 0;
  return lo;
}

/* "'a', 'b', 'c'" (at most ~400 characters), for ENOTFOUND messages.
 * Called with reg_mu held. */
static void list_names(char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  if (reg_n == 0) {
    snprintf(buf, cap, "none");
    return;
  }
  for (size_t i = 0; i < reg_n; i++) {
    int w = snprintf(buf + used, cap - used, "%s'%s'", i ? ", " : "",
                     dynemb_table_name(reg[i]));
    if (w < 0 || (size_t)w >= cap - used) { /* full: end with ", ..." */
      size_t at = used < cap - 6 ? used : cap - 6;
      memcpy(buf + at, ", ...", 6);
      return;
    }
    used += (size_t)w;
  }
}

static int not_found(const char *name) {
  char names[400];
  list_names(names, sizeof names);
  return dynemb_error_set(DYNEMB_ENOTFOUND,
                          "no table named '%s'; existing tables: %s. Create "
                          "it first or check the name",
                          name ? name : "(null)", names);
}

int dynemb_table_create(const dynemb_table_config *cfg, dynemb_table **out) {
  dynemb_error_clear();
  if (!out)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "dynemb_table_create: out pointer is NULL");
  *out = NULL;
  dynemb_table *t;
  int rc = dynemb_table_new(cfg, &t);
  if (rc) return rc;
  pthread_mutex_lock(&reg_mu);
  int found;
  size_t at = reg_search(dynemb_table_name(t), &found);
  if (found) {
    pthread_mutex_unlock(&reg_mu);
    rc = dynemb_error_set(DYNEMB_EEXIST,
                          "table '%s' already exists; drop it first "
                          "(dynemb_table_drop) or pick another name",
                          dynemb_table_name(t));
    dynemb_table_destroy(t);
    return rc;
  }
  if (reg_n == reg_cap) {
    size_t nc = reg_cap ? reg_cap * 2 : 16;
    dynemb_table **p = realloc(reg, nc * sizeof *p);
    if (!p) {
      pthread_mutex_unlock(&reg_mu);
      rc = dynemb_error_set(DYNEMB_ENOMEM,
                            "table '%s': out of memory registering it",
                            dynemb_table_name(t));
      dynemb_table_destroy(t);
      return rc;
    }
    reg = p;
    reg_cap = nc;
  }
  memmove(reg + at + 1, reg + at, (reg_n - at) * sizeof *reg);
  reg[at] = t;
  reg_n++;
  dynemb_table_link_of(t)->registered = 1;
  dynemb_table_link_of(t)->refs = 2; /* the registry's and the caller's (no other thread sees t yet) */
  pthread_mutex_unlock(&reg_mu);
  *out = t;
  return DYNEMB_OK;
}

/* Index of table `name` in reg (under reg_mu), or ENOTFOUND with the
 * message listing the tables that exist. */
static int find_locked(const char *name, size_t *at) {
  int found = 0;
  *at = name ? reg_search(name, &found) : 0;
  return found ? DYNEMB_OK : not_found(name);
}

int dynemb_table_find(const char *name, dynemb_table **out) {
  dynemb_error_clear();
  if (!out)
    return dynemb_error_set(DYNEMB_EINVAL,
                            "dynemb_table_find: out pointer is NULL");
  *out = NULL;
  pthread_mutex_lock(&reg_mu);
  size_t at = 0;
  int rc = find_locked(name, &at);
  if (rc) {
    pthread_mutex_unlock(&reg_mu);
    return rc;
  }
  dynemb_table *t = reg[at];
  __atomic_fetch_add(&dynemb_table_link_of(t)->refs, 1, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&reg_mu);
  *out = t;
  return DYNEMB_OK;
}

void dynemb_table_retain(dynemb_table *t) {
  if (t) __atomic_fetch_add(&dynemb_table_link_of(t)->refs, 1, __ATOMIC_RELAXED);
}

void dynemb_table_release(dynemb_table *t) {
  if (!t) return;
  if (__atomic_sub_fetch(&dynemb_table_link_of(t)->refs, 1, __ATOMIC_ACQ_REL) == 0)
    dynemb_table_destroy(t);
}

int dynemb_table_drop(const char *name) {
  dynemb_error_clear();
  pthread_mutex_lock(&reg_mu);
  size_t at = 0;
  int rc = find_locked(name, &at);
  if (rc) {
    pthread_mutex_unlock(&reg_mu);
    return rc;
  }
  dynemb_table *t = reg[at];
  memmove(reg + at, reg + at + 1, (reg_n - at - 1) * sizeof *reg);
  reg_n--;
  dynemb_table_link_of(t)->registered = 0;
  pthread_mutex_unlock(&reg_mu);
  dynemb_table_release(t);
  return DYNEMB_OK;
}

void dynemb_registry_clear(void) {
  pthread_mutex_lock(&reg_mu);
  dynemb_table **old = reg;
  size_t n = reg_n;
  for (size_t i = 0; i < n; i++) dynemb_table_link_of(old[i])->registered = 0;
  reg = NULL;
  reg_n = reg_cap = 0;
  pthread_mutex_unlock(&reg_mu);
  for (size_t i = 0; i < n; i++) dynemb_table_release(old[i]);
  free(old);
}

size_t dynemb_registry_names(char ***names) {
  if (!names) return 0;
  *names = NULL;
  pthread_mutex_lock(&reg_mu);
  size_t n = reg_n;
  char **out = n ? malloc(n * sizeof *out) : NULL;
  size_t k = 0;
  if (out)
    for (; k < n; k++)
      if (!(out[k] = strdup(dynemb_table_name(reg[k])))) break;
  pthread_mutex_unlock(&reg_mu);
  if (n && (!out || k < n)) { /* out of memory: report no names */
    dynemb_free_names(out, k);
    return 0;
  }
  *names = out;
  return n;
}

void dynemb_free_names(char **names, size_t n) {
  if (!names) return;
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
}
