/* examples/train/agree.c — how weft-train's ranks fail together. Every
 * rank runs the same program on its own part of the data, so an error is
 * either found alike everywhere (bad flags, a mesh that does not fit: rank
 * 0 prints it, train_fail_all), or found by some ranks only (a file one rank
 * cannot read: the ranks agree with weft_agree_status and the lowest failing
 * rank prints, train_agree_fail), or met in the middle of collective work (a
 * step, an all-reduce: the rank that sees it prints and stops,
 * train_fail_here). In every case each rank returns non-zero. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_internal.h"

void train_print_error(const char *what, const char *msg) {
  const char *nl = strchr(msg, '\n');
  const char *debug = getenv("WEFT_DEBUG");
  const bool trail = nl && debug && *debug && strcmp(debug, "0") != 0;
  int n = nl && !trail ? (int)(nl - msg) : (int)strlen(msg);
  fprintf(stderr, "weft-train: error: %s%s%.*s\n", what ? what : "", what ? ": " : "", n, msg);
  fflush(stderr);
}

int train_perr(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return -1;
}

bool train_agree_fail(bool failed, const char *msg) {
  int who = -1;
  weft_status st = weft_agree_status(MPI_COMM_WORLD, failed ? WEFT_ERR_INVALID : WEFT_OK,
                                     msg ? msg : "(unknown)", "weft-train", &who);
  if (st == WEFT_OK) return false;
  if (who < 0 || who == weft_world_rank()) {
    train_print_error(NULL, who < 0 ? weft_last_error() : msg ? msg : "(unknown)");
  }
  return true;
}

int train_fail_all(const char *fmt, ...) {
  if (weft_world_rank() == 0) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    train_print_error(NULL, buf);
  }
  return 2;
}

int train_fail_here(const char *what) {
  train_print_error(what, weft_last_error());
  return 3;
}
