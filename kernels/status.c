/* Status strings and the thread-local error message. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WEFT_ERRMSG_CAP 2048

static _Thread_local char errmsg[WEFT_ERRMSG_CAP];
static _Thread_local weft_status errstatus = WEFT_OK;
static int error_rank = -1;
static weft_abort_fn abort_handler = NULL;

const char *weft_status_str(weft_status st) {
  switch (st) {
#define WEFT_STATUS_CASE_(name, value, text) \
  case name:                                 \
    return text;
    WEFT_STATUS_TABLE(WEFT_STATUS_CASE_)
#undef WEFT_STATUS_CASE_
  }
  return "unknown status";
}

const char *weft_last_error(void) { return errmsg; }
weft_status weft_last_status(void) { return errstatus; }

void weft_clear_error(void) {
  errmsg[0] = '\0';
  errstatus = WEFT_OK;
}

void weft_error_set_rank(int rank) { error_rank = rank; }

weft_status weft_error_at(weft_status st, const char *func, const char *fmt, ...) {
  /* Format into a scratch buffer first: an argument may be weft_last_error()
   * itself (wrapping an inner error), which must not be overwritten while
   * it is read. */
  char body[WEFT_ERRMSG_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  int len;
  if (error_rank >= 0)
    len = snprintf(errmsg, sizeof errmsg, "[rank %d] %s: ", error_rank, func);
  else
    len = snprintf(errmsg, sizeof errmsg, "%s: ", func);
  if (len < 0) len = 0;
  if ((size_t)len >= sizeof errmsg) len = (int)sizeof errmsg - 1;
  size_t room = sizeof errmsg - (size_t)len - 1;
  size_t blen = strlen(body);
  if (blen > room) blen = room;
  memcpy(errmsg + len, body, blen);
  errmsg[(size_t)len + blen] = '\0';
  errstatus = st;
  return st;
}

weft_status weft_error_trace(weft_status st, const char *func) {
  if (errstatus == WEFT_OK) {
    /* A status came back without a message (e.g. a code path that only
     * returned a code): make sure the caller still learns something. */
    weft_error_at(st, func, "%s", weft_status_str(st));
    return st;
  }
  size_t len = strlen(errmsg);
  /* Breadcrumbs are best effort: stop adding them when the buffer is full. */
  if (len + strlen(func) + 8 < WEFT_ERRMSG_CAP)
    snprintf(errmsg + len, WEFT_ERRMSG_CAP - len, "\n  in %s", func);
  return st;
}

void weft_set_abort_handler(weft_abort_fn fn) { abort_handler = fn; }

void weft_abort_(const char *file, int line, const char *cond) {
  char msg[512];
  snprintf(msg, sizeof msg, "weft internal invariant broken at %s:%d: %s", file, line, cond);
  if (abort_handler) {
    abort_handler(msg);
  }
  fprintf(stderr, "%s\n", msg);
  abort();
}
