/* Device-buffer collectives of mesh/ (mesh/device_comm.c) without a GPU:
 * the backend choice (a pure function of all-gathered facts), buffer
 * routing, and, in MPI workers (device_comm_worker.c), the NCCL id
 * exchange and every collective through MPI with host staging on a fake
 * "device" (host memory the test's hooks call device memory). The NCCL
 * path itself needs a GPU; here it is only compiled and linked (CUDA
 * builds with NCCL). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "device_comm.h"
#include "harness.h"
#include "mesh.h"
#include "weft_config.h"

#define DC_WORKER WORKER("device_comm_worker")

/* ------------------------------------------------------------ choice */

static weft_comm_facts fact(uint64_t host, const char *name, int device, int wr) {
  weft_comm_facts f;
  memset(&f, 0, sizeof f);
  f.host_hash = host;
  snprintf(f.host, sizeof f.host, "%s", name);
  f.device = device;
  f.world_rank = wr;
  f.have_nccl = 1;
  return f;
}

Test(device_comm, distinct_devices_choose_nccl) {
  /* two nodes, GPUs 0 and 1 on each: the same ordinal on other nodes is fine */
  weft_comm_facts f[4] = {fact(11, "a", 0, 10), fact(11, "a", 1, 11), fact(22, "b", 0, 12),
                          fact(22, "b", 1, 13)};
  char r[256];
  cr_assert_eq(weft__comm_backend_choose(4, f, r, sizeof r), WEFT_COMM_NCCL, "%s", r);
  cr_assert(strstr(r, "distinct GPUs") != NULL, "%s", r);
  cr_assert_eq(weft__comm_backend_choose(1, f, r, sizeof r), WEFT_COMM_NCCL, "%s", r);
  cr_assert_eq(weft__comm_backend_choose(2, f, NULL, 0), WEFT_COMM_NCCL);
}

Test(device_comm, shared_gpu_falls_back_naming_the_ranks) {
  weft_comm_facts f[4] = {fact(11, "a", 0, 10), fact(11, "a", 1, 11), fact(22, "nodeb", 0, 12),
                          fact(22, "nodeb", 0, 13)};
  char r[256];
  cr_assert_eq(weft__comm_backend_choose(4, f, r, sizeof r), WEFT_COMM_MPI_STAGED);
  cr_assert(strstr(r, "world ranks 12 and 13 share GPU 0 on node nodeb") != NULL, "%s", r);
  /* several ranks on one GPU of one node (oversubscribed test machine) */
  weft_comm_facts g[3] = {fact(5, "x", 0, 0), fact(5, "x", 0, 1), fact(5, "x", 0, 2)};
  cr_assert_eq(weft__comm_backend_choose(3, g, r, sizeof r), WEFT_COMM_MPI_STAGED);
  cr_assert(strstr(r, "world ranks 0 and 1 share GPU 0 on node x") != NULL, "%s", r);
}

Test(device_comm, build_without_nccl_falls_back) {
  weft_comm_facts f[2] = {fact(11, "a", 0, 0), fact(11, "a", 1, 1)};
  f[0].have_nccl = f[1].have_nccl = 0;
  char r[256];
  cr_assert_eq(weft__comm_backend_choose(2, f, r, sizeof r), WEFT_COMM_MPI_STAGED);
  cr_assert(strstr(r, "this build has no NCCL") != NULL, "%s", r);
  f[0].have_nccl = 1; /* only one rank lacks it: still identical choice, names it */
  cr_assert_eq(weft__comm_backend_choose(2, f, r, sizeof r), WEFT_COMM_MPI_STAGED);
  cr_assert(strstr(r, "world rank 1 cannot use NCCL") != NULL, "%s", r);
}

Test(device_comm, env_override_falls_back) {
  weft_comm_facts f[3] = {fact(11, "a", 0, 0), fact(11, "a", 1, 1), fact(11, "a", 2, 2)};
  f[0].env_disabled = f[1].env_disabled = f[2].env_disabled = 1;
  char r[256];
  cr_assert_eq(weft__comm_backend_choose(3, f, r, sizeof r), WEFT_COMM_MPI_STAGED);
  cr_assert(strstr(r, "WEFT_NCCL=0 is set") != NULL, "%s", r);
  f[0].env_disabled = f[1].env_disabled = 0; /* set on one rank only */
  cr_assert_eq(weft__comm_backend_choose(3, f, r, sizeof r), WEFT_COMM_MPI_STAGED);
  cr_assert(strstr(r, "WEFT_NCCL=0 is set on world rank 2") != NULL, "%s", r);
}

Test(device_comm, rank_without_device_falls_back) {
  weft_comm_facts f[2] = {fact(11, "a", 0, 0), fact(11, "a", -1, 1)};
  char r[256];
  cr_assert_eq(weft__comm_backend_choose(2, f, r, sizeof r), WEFT_COMM_MPI_STAGED);
  cr_assert(strstr(r, "world rank 1 has no CUDA device") != NULL, "%s", r);
}

/* ------------------------------------------------------------ routing */

static char fake_block[256];
static bool in_fake(const void *p) {
  return (const char *)p >= fake_block && (const char *)p < fake_block + sizeof fake_block;
}

Test(device_comm, route_detects_device_and_mixing) {
  weft_device_hooks h = {.is_device = in_fake};
  weft__device_hooks_set(&h);
  char host[64];
  bool dev = true;
  cr_assert_eq(weft__device_route("f", "send", host, 8, "recv", host, 8, &dev), WEFT_OK);
  cr_assert_not(dev);
  cr_assert_eq(weft__device_route("f", "send", fake_block, 8, "recv", fake_block + 8, 8, &dev),
               WEFT_OK);
  cr_assert(dev);
  cr_assert_eq(weft__device_route("f", "send", host, 8, "recv", fake_block, 8, &dev),
               WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "send is host memory but recv is device memory") != NULL,
            "%s", weft_last_error());
  cr_assert_eq(weft__device_route("f", "send", fake_block, 8, "recv", host, 8, &dev),
               WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "send is device memory but recv is host memory") != NULL,
            "%s", weft_last_error());
  /* an empty buffer does not vote */
  cr_assert_eq(weft__device_route("f", "send", host, 0, "recv", fake_block, 8, &dev), WEFT_OK);
  cr_assert(dev);
  cr_assert_eq(weft__device_route("f", "buf", fake_block, 4, "none", NULL, 0, &dev), WEFT_OK);
  cr_assert(dev);
  cr_assert_eq(weft__device_route("f", "send", NULL, 0, "recv", NULL, 0, &dev), WEFT_OK);
  cr_assert_not(dev);
  weft__device_hooks_set(NULL); /* back to the backend's: NCCL as built */
  cr_assert_eq(weft__device_hooks()->nccl, WEFT_HAVE_NCCL != 0);
  cr_assert_eq(weft__device_hooks()->is_device(fake_block), false);
}

/* ------------------------------------------------------------ workers */

static int dc(int n, const char *cs, const char *shape) {
  const char *extra[] = {shape, NULL};
  return weft_test_mpiexec_args(n, DC_WORKER, cs, 50, extra);
}

/* Every rank of each dim gets coordinate 0's blob (1-D 2 and 4 ranks;
 * 2x2: per dim and on the flattened dim). */
Test(device_comm, id_exchange_on_2_ranks, .timeout = 60) {
  cr_assert_eq(dc(2, "id_exchange", "2"), 0);
}
Test(device_comm, id_exchange_on_4_ranks, .timeout = 60) {
  cr_assert_eq(dc(4, "id_exchange", "4"), 0);
}
Test(device_comm, id_exchange_on_2x2, .timeout = 60) {
  cr_assert_eq(dc(4, "id_exchange", "2x2"), 0);
}

/* Every collective (in place too, every op) x f32/bf16 x blocking, async
 * wait, async test on fake device buffers, bitwise equal to the host call,
 * accounted alike. */
Test(device_comm, staged_collectives_on_2_ranks, .timeout = 90) {
  cr_assert_eq(dc(2, "staged", "2"), 0);
}
Test(device_comm, staged_collectives_on_4_ranks, .timeout = 90) {
  cr_assert_eq(dc(4, "staged", "4"), 0);
}
Test(device_comm, staged_collectives_on_2x2, .timeout = 90) {
  cr_assert_eq(dc(4, "staged", "2x2"), 0);
}
/* WEFT_DEBUG fingerprints pass on the staged path (same sequence numbers) */
Test(device_comm, staged_collectives_debug_on_2x2, .timeout = 90) {
  const char *env[] = {"WEFT_DEBUG=1", "DC_SHAPE=2x2", NULL};
  cr_assert_eq(weft_test_mpiexec_env(4, DC_WORKER, "staged", 80, env), 0);
}

/* Host and device buffers in one call fail on every rank, naming which. */
Test(device_comm, mixed_buffers_fail_on_every_rank, .timeout = 60) {
  cr_assert_eq(dc(2, "mixed", "2"), 0);
  cr_assert_eq(dc(4, "mixed", "2x2"), 0);
}

/* Each communication stream (comm, fsdp_all_gather, fsdp_reduce_scatter)
 * carries staged collectives ordered by events against the compute stream;
 * on the emulator's deferred streams leaving the ordering out is caught
 * (on a GPU that half is not run: the two ranks share it, so the staged
 * path is the one taken). */
Test(device_comm, staged_streams_ordered_and_missing_dependency_caught, .timeout = 60) {
  if (weft_device_count(WEFT_CUDA) == 0)
    cr_skip_test("needs a WEFT_CUDA device: the emulated build (-Dcuda=emulated) or a GPU");
  cr_assert_eq(dc(2, "streams", "2"), 0);
}

/* Shared GPU: one "NCCL not used" line per dim, on its coordinate 0. */
Test(device_comm, fallback_logs_once_per_dim_on_2x2, .timeout = 60) {
  cr_assert_eq(dc(4, "log_once", "2x2"), 0);
}

/* WEFT_NCCL=0 forces the fallback even with distinct GPUs. */
Test(device_comm, env_nccl_0_forces_fallback, .timeout = 60) {
  const char *env[] = {"WEFT_NCCL=0", NULL};
  cr_assert_eq(weft_test_mpiexec_env(2, DC_WORKER, "env_off", 50, env), 0);
}
