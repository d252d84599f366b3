/* weft/status.h — status codes and error reporting shared by every weft library.
 *
 * Every public weft function that can fail returns a weft_status; 0 is
 * success. On failure a thread-local message says what went wrong and where,
 * prefixed with the world rank once weft_init has run:
 *
 *     weft_status st = weft_mesh_create(...);
 *     if (st != WEFT_OK) fprintf(stderr, "%s\n", weft_last_error());
 *
 * Codes are small integers; weft_status_str names them. The library never
 * exits and never aborts on bad input; weft_set_abort_handler is only for
 * broken internal invariants.
 */
#ifndef WEFT_STATUS_H
#define WEFT_STATUS_H

/* WEFT_API marks a function of weft's public interface. Every weft library
 * is built with hidden symbol visibility, so exactly the functions declared
 * with WEFT_API in the installed headers are exported from the shared
 * libraries; everything else is internal to its library. */
#if defined(__GNUC__) || defined(__clang__)
#define WEFT_API __attribute__((visibility("default")))
#else
#define WEFT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* X-macro: one table gives the enum and the strings. */
#define WEFT_STATUS_TABLE(X)                                               \
  X(WEFT_OK, 0, "ok")                                                      \
  X(WEFT_ERR_INVALID, 1, "invalid argument")                               \
  X(WEFT_ERR_OOM, 2, "out of memory")                                      \
  X(WEFT_ERR_MPI, 3, "MPI error")                                          \
  X(WEFT_ERR_TIMEOUT, 4, "timed out")                                      \
  X(WEFT_ERR_MISMATCH, 5, "ranks disagree (collective or shape mismatch)") \
  X(WEFT_ERR_BUSY, 6, "busy: object still in use")                         \
  X(WEFT_ERR_IO, 7, "I/O error")                                           \
  X(WEFT_ERR_CORRUPT, 8, "corrupt or inconsistent data")                   \
  X(WEFT_ERR_UNSUPPORTED, 9, "unsupported")                                \
  X(WEFT_ERR_NOT_FOUND, 10, "not found")                                   \
  X(WEFT_ERR_CUDA, 11, "CUDA error")                                       \
  X(WEFT_ERR_NCCL, 12, "NCCL error")                                       \
  X(WEFT_ERR_NO_DEVICE, 13, "no GPU device available")                     \
  X(WEFT_ERR_IN_PROGRESS, 14, "operation still in progress")               \
  X(WEFT_ERR_STATE, 15, "call not valid in the current state")             \
  X(WEFT_ERR_INTERNAL, 16, "internal error")

typedef enum weft_status {
#define WEFT_STATUS_ENUM_(name, value, text) name = value,
  WEFT_STATUS_TABLE(WEFT_STATUS_ENUM_)
#undef WEFT_STATUS_ENUM_
} weft_status;

/* The fixed description of a status code ("invalid argument"). Never NULL. */
WEFT_API const char *weft_status_str(weft_status st);

/* The message of the last failure on this thread, headed by the public
 * function the caller called (the outermost weft_* function the error
 * passed through), then where it was raised and the way out:
 *
 *     [rank 3] weft_mesh_create: product of shape (2x3=6) != group size 4
 *       at check_args
 *       in weft_mesh_create_from_comm
 *       in weft_mesh_create
 *
 * Empty string when none. Valid until the next weft call on this thread. */
WEFT_API const char *weft_last_error(void);

/* The status of the last failure on this thread (WEFT_OK if none). */
WEFT_API weft_status weft_last_status(void);

/* Clears the thread's error message and status. */
WEFT_API void weft_clear_error(void);

/* Records a failure: formats the message (printf-style) with the rank prefix
 * and the calling function, stores it thread-locally and returns `st`, so it
 * can be used as `return weft_error(WEFT_ERR_INVALID, "dim %d out of range",
 * d);`. Library-internal, but public so that every weft library and user
 * extensions report errors the same way. */
WEFT_API weft_status weft_error_at(weft_status st, const char *func, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define weft_error(st, ...) weft_error_at((st), __func__, __VA_ARGS__)

/* Adds a breadcrumb ("\n  in func") to the current message; returns st.
 * A public function (weft_<name>: not weft__<name>, not ending in '_')
 * also becomes the message's head, so a public function that propagates
 * an inner failure with WEFT_CHECK is the one the message names. */
WEFT_API weft_status weft_error_trace(weft_status st, const char *func);

/* Sets the rank printed in front of error messages (-1: none). weft_init
 * calls it; tests and tools may too. */
WEFT_API void weft_error_set_rank(int rank);

/* Propagation: evaluate `expr`; on failure add a breadcrumb and return it. */
#define WEFT_CHECK(expr)                                                              \
  do {                                                                                \
    weft_status weft_check_st_ = (expr);                                              \
    if (weft_check_st_ != WEFT_OK) return weft_error_trace(weft_check_st_, __func__); \
  } while (0)

/* Same, but store the status in `st` and jump to `label` (one cleanup path). */
#define WEFT_CHECK_GOTO(expr, st, label) \
  do {                                   \
    (st) = (expr);                       \
    if ((st) != WEFT_OK) {               \
      weft_error_trace((st), __func__);  \
      goto label;                        \
    }                                    \
  } while (0)

/* Broken-invariant handler: called by WEFT_ASSERT with a message, default
 * prints it and calls abort(). Only for bugs in weft, never for user input. */
typedef void (*weft_abort_fn)(const char *msg);
WEFT_API void weft_set_abort_handler(weft_abort_fn fn);
WEFT_API void weft_abort_(const char *file, int line, const char *cond);
#define WEFT_ASSERT(cond)                                \
  do {                                                   \
    if (!(cond)) weft_abort_(__FILE__, __LINE__, #cond); \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif /* WEFT_STATUS_H */
