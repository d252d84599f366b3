/* mesh/watchdog.c — the watchdog of device collectives (watchdog.h). */
#include "watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct watched {
  mesh_dim *g;
  const weft_watch_ops *ops;
  void *ev;
  double t0;
  char desc[112];
} watched;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static watched *list;
static int nlist, caplist;
static pthread_t thread;
static bool running, stopping;

/* Removes entry i (order is not kept). Mutex held. */
static void drop(int i) {
  list[i].ops->release(list[i].ev);
  list[i] = list[--nlist];
}

/* The call at i has timed out (or failed): the dim is broken, its other
 * calls dropped, its communicator aborted. Mutex held. */
static void give_up(int i, bool failed, double waited) {
  mesh_dim *g = list[i].g;
  const weft_watch_ops *ops = list[i].ops;
  char what[192];
  if (failed)
    snprintf(what, sizeof what,
             "%.100s failed on the device (NCCL; the watchdog aborted the "
             "dim's communicator)",
             list[i].desc);
  else
    snprintf(what, sizeof what,
             "%.100s did not complete within %.3g s (NCCL; the watchdog aborted "
             "the dim's communicator)",
             list[i].desc, waited);
  fprintf(stderr, "weft: [rank %d] mesh dim '%s': %s\n", weft__rt.world_rank, g->name, what);
  fflush(stderr);
  memcpy(g->broken_msg, what, sizeof g->broken_msg);
  g->broken_msg[sizeof g->broken_msg - 1] = 0;
  __atomic_store_n(&g->broken, true, __ATOMIC_RELEASE);
  for (int j = nlist - 1; j >= 0; j--)
    if (list[j].g == g) drop(j);
  if (ops->abort) ops->abort(g);
}

/* One pass. Mutex held. */
static int poll_locked(void) {
  double now = weft__now(), limit = weft__rt.settings.timeout_s;
  for (int i = nlist - 1; i >= 0; i--) {
    if (i >= nlist) continue; /* give_up dropped entries after i */
    int q = list[i].ops->query(list[i].ev);
    if (q > 0)
      drop(i);
    else if (q < 0 || now - list[i].t0 > limit)
      give_up(i, q < 0, now - list[i].t0);
  }
  return nlist;
}

int weft__watch_poll(void) {
  pthread_mutex_lock(&mu);
  int n = poll_locked();
  pthread_mutex_unlock(&mu);
  return n;
}

/* Polls every 1/20 of the timeout, at most every 50 ms and at least every
 * 1 ms, while anything is watched; sleeps until woken otherwise. */
static void *watch_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  while (!stopping) {
    if (nlist == 0) {
      pthread_cond_wait(&wake, &mu);
      continue;
    }
    double step = weft__rt.settings.timeout_s / 20;
    step = step > 0.05 ? 0.05 : step < 0.001 ? 0.001 : step;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)(step * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    int rc = pthread_cond_timedwait(&wake, &mu, &ts);
    if (rc != 0 && rc != ETIMEDOUT) continue;
    if (!stopping) poll_locked();
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

weft_status weft__watch(mesh_dim *g, const weft_watch_ops *ops, void *ev, const char *desc) {
  pthread_mutex_lock(&mu);
  weft_status st = WEFT_OK;
  if (nlist == caplist) {
    int cap = caplist ? 2 * caplist : 64;
    watched *l = realloc(list, (size_t)cap * sizeof *l);
    if (!l)
      st = weft_error(WEFT_ERR_OOM, "watchdog: no memory to watch %d calls", cap);
    else
      list = l, caplist = cap;
  }
  if (st == WEFT_OK && !running) {
    stopping = false;
    if (pthread_create(&thread, NULL, watch_main, NULL) != 0)
      st = weft_error(WEFT_ERR_INTERNAL, "watchdog: cannot start its thread");
    else
      running = true;
  }
  if (st != WEFT_OK) {
    pthread_mutex_unlock(&mu);
    ops->release(ev);
    return st;
  }
  watched *w = &list[nlist++];
  w->g = g;
  w->ops = ops;
  w->ev = ev;
  w->t0 = weft__now();
  snprintf(w->desc, sizeof w->desc, "%s", desc);
  pthread_cond_signal(&wake);
  pthread_mutex_unlock(&mu);
  return WEFT_OK;
}

void weft__watch_forget(mesh_dim *g) {
  pthread_mutex_lock(&mu);
  for (int i = nlist - 1; i >= 0; i--)
    if (list[i].g == g) drop(i);
  pthread_mutex_unlock(&mu);
}

void weft__watch_shutdown(void) {
  pthread_mutex_lock(&mu);
  bool was = running;
  stopping = true;
  pthread_cond_signal(&wake);
  pthread_mutex_unlock(&mu);
  if (was) pthread_join(thread, NULL);
  pthread_mutex_lock(&mu);
  while (nlist > 0) drop(nlist - 1);
  free(list);
  list = NULL;
  caplist = 0;
  running = false;
  stopping = false;
  pthread_mutex_unlock(&mu);
}
