/* mesh/watchdog.h — private: the watchdog of device collectives the host
 * does not wait for.
 *
 * An NCCL call returns once it is queued: a blocking one only makes the
 * compute stream wait for it, an async one hands back an event. A
 * collective that a peer never joins therefore hangs the next host
 * synchronization (a loss read, a checkpoint copy) forever, with nothing
 * naming it. device_comm.c hands every NCCL call to this watchdog with an
 * event recorded after it on the communication stream; a thread (started
 * at the first call) polls the events, drops the completed ones and, for a
 * call still not done WEFT_TIMEOUT seconds after it was queued:
 *   - marks its dim broken: every later collective on the dim fails with
 *     "<call, with its sequence number> on mesh dim '<name>' did not
 *     complete within <t> s" (as the MPI path's timeouts do);
 *   - prints that line to stderr with the world rank, once;
 *   - drops the dim's other watched calls and aborts the dim's
 *     communicator (ops->abort), which ends the device work waiting on it,
 *     so the host is not blocked forever (PyTorch's NCCL watchdog).
 * The watch list is guarded by one mutex; ops->abort and ops->release run
 * with it held (weft__watch_forget therefore cannot race with an abort).
 * The generic part takes callbacks, so tests drive it with fake events. */
#ifndef WEFT_WATCHDOG_H
#define WEFT_WATCHDOG_H

#include <stdbool.h>
#include <stddef.h>

#include "mesh_internal.h"

typedef struct weft_watch_ops {
  /* 1: the call has completed; 0: not yet; -1: it failed (reported like a
   * timeout, with "failed") */
  int (*query)(void *ev);
  /* frees ev (called once per watched call) */
  void (*release)(void *ev);
  /* aborts g's communicator (called at most once per dim, for its first
   * timed-out call); may be NULL */
  void (*abort)(mesh_dim *g);
} weft_watch_ops;

/* Watches one queued call on g: ev is ops' completion handle (owned from
 * here on, released by the watchdog), desc names the call (the
 * fingerprint's "all_reduce(f32, count 16, sum, seq 12)"). Starts the
 * thread at the first call. On failure ev is released and an error set. */
weft_status weft__watch(mesh_dim *g, const weft_watch_ops *ops, void *ev, const char *desc);

/* Releases every call watched on g without looking at it (g's device
 * state is about to be freed). Blocks while a poll is running. */
void weft__watch_forget(mesh_dim *g);

/* One polling pass now, on the calling thread (tests; the thread runs the
 * same). Returns how many calls are still watched. */
int weft__watch_poll(void);

/* Stops the thread and releases what is still watched (weft_finalize). */
void weft__watch_shutdown(void);

#endif
