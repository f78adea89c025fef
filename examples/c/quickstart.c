/* dynemb from C: a table, a training lookup, one gradient step, a checkpoint.
 *   cc quickstart.c $(pkg-config --cflags --libs dynemb) && ./a.out [DIR] */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <dynemb.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  char tmp[] = "/tmp/dynemb-quickstart-XXXXXX";
  const char *dir = argc > 1 ? argv[1] : mkdtemp(tmp);
  dynemb_table_config cfg;
  dynemb_table_config_init(&cfg); /* SGD, every key admitted at once */
  cfg.name = "user"; cfg.dim = 4;
  cfg.init = (dynemb_initializer){DYNEMB_INIT_NORMAL, 0.0f, 0.1f, 42};
  int64_t keys[3] = {7, 1234567890123, 7}; /* any int64 ids; repeats add up */
  float before[3 * 4], after[3 * 4], grads[3 * 4];
  for (int i = 0; i < 3 * 4; i++) grads[i] = 1.0f;
  dynemb_table *t = NULL;
  int failed = !dir || dynemb_table_create(&cfg, &t) ||
               dynemb_lookup(t, keys, 3, DYNEMB_LOOKUP_TRAIN, 1, NULL, before, NULL) ||
               dynemb_apply(t, keys, 3, grads, 0.1f, NULL, NULL) || /* row -= 0.1 * sum */
               dynemb_lookup(t, keys, 3, DYNEMB_LOOKUP_EVAL, 1, NULL, after, NULL) ||
               dynemb_checkpoint_save(dir, &t, 1);
  if (failed) fprintf(stderr, "dynemb: %s\n", dynemb_last_error());
  else printf("key 7: %.4f -> %.4f (moved %+.4f); %llu rows saved in %s\n", before[0],
              after[0], after[0] - before[0], (unsigned long long)dynemb_table_size(t), dir);
  dynemb_table_release(t);
  dynemb_table_drop(cfg.name);
  return failed;
}
