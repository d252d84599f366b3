/* Status strings and the thread-local error message. */
#include "status.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WEFT_ERRMSG_CAP 2048

/* The message is kept in parts and rendered into errmsg after each change:
 *   "[rank R] <head>: <body>\n  at <origin>\n  in f1\n  in f2 ..."
 * origin: the function that raised the error (weft_error_at); head: the
 * outermost public function (weft_name, see is_public_name) the error has
 * passed through on its way out, i.e. the function the user called, or the
 * origin while there is none; the trail lists every function that added a
 * breadcrumb (weft_error_trace), innermost first. "at <origin>" is shown
 * only once the head differs from it. */
static _Thread_local char errmsg[WEFT_ERRMSG_CAP];
static _Thread_local char err_body[WEFT_ERRMSG_CAP];
static _Thread_local char err_trail[WEFT_ERRMSG_CAP];
static _Thread_local char err_head[96], err_origin[96];
static _Thread_local weft_status errstatus = WEFT_OK;
static int error_rank = -1;
static weft_abort_fn abort_handler = NULL;

/* weft's public functions are weft_<name>; internal ones are weft__<name>
 * (mesh), <name>_ with a trailing underscore, or have no weft_ prefix. */
static bool is_public_name(const char *f) {
  size_t n = strlen(f);
  return n > 5 && strncmp(f, "weft_", 5) == 0 && f[5] != '_' && f[n - 1] != '_';
}

static void render(void) {
  size_t len = 0, cap = sizeof errmsg;
  int w = error_rank >= 0
              ? snprintf(errmsg, cap, "[rank %d] %s: %s", error_rank, err_head, err_body)
              : snprintf(errmsg, cap, "%s: %s", err_head, err_body);
  len = w < 0 ? 0 : (size_t)w < cap ? (size_t)w : cap - 1;
  if (strcmp(err_head, err_origin) != 0 && len + 1 < cap) {
    w = snprintf(errmsg + len, cap - len, "\n  at %s", err_origin);
    len = w < 0 ? len : len + (size_t)w < cap ? len + (size_t)w : cap - 1;
  }
  if (len + 1 < cap) snprintf(errmsg + len, cap - len, "%s", err_trail);
}

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
  errmsg[0] = err_body[0] = err_trail[0] = err_head[0] = err_origin[0] = '\0';
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
  memcpy(err_body, body, sizeof body);
  snprintf(err_head, sizeof err_head, "%s", func ? func : "weft");
  memcpy(err_origin, err_head, sizeof err_head);
  err_trail[0] = '\0';
  errstatus = st;
  render();
  return st;
}

weft_status weft_error_trace(weft_status st, const char *func) {
  if (!func) func = "?";
  if (errstatus == WEFT_OK) {
    /* A status came back without a message (e.g. a code path that only
     * returned a code): make sure the caller still learns something. */
    weft_error_at(st, func, "%s", weft_status_str(st));
    return st;
  }
  /* Breadcrumbs are best effort: stop adding them when the buffer is full. */
  size_t len = strlen(err_trail);
  if (len + strlen(func) + 8 < sizeof err_trail)
    snprintf(err_trail + len, sizeof err_trail - len, "\n  in %s", func);
  if (is_public_name(func)) snprintf(err_head, sizeof err_head, "%s", func);
  render();
  return st;
}

void weft_error_set_head_(const char *func) {
  if (errstatus == WEFT_OK || !func) return;
  snprintf(err_head, sizeof err_head, "%s", func);
  render();
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
