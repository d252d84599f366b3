/* weft-bench-dcp: saving and loading a full training state with weft_dcp
 * against writing and reading the same bytes with plain sequential I/O, in
 * one run.
 *
 *     mpiexec -n 2 build/bench/weft-bench-dcp [--dir DIR] [--layers L] [--reps R]
 *                                             [--load-reps K]
 *
 * The state is the small config's (D=768, L=12, H=12, F=2048, V=8192):
 * parameters plus AdamW state with amsgrad (exp_avg, exp_avg_sq,
 * max_exp_avg_sq), so 4x the parameters in f32 (~1.56 GB), each tensor
 * sharded Shard(0) over the ranks as FSDP would (each rank writes its
 * half; no replicas).
 *
 * Per repetition, every rank times (the slowest rank counts; a barrier on
 * each side):
 *   plain write  its bytes to one file, 8 MiB pwrite()s, then fsync;
 *   dcp save     weft_dcp_save of the state dict (CRC32C per block, one data
 *                file per rank fsync'ed, metadata committed by rank 0);
 *   plain read   the plain file back with 8 MiB pread()s into the tensors;
 *   dcp load     weft_dcp_load in place (every block verified);
 *                plain read and dcp load alternate K times (--load-reps,
 *                default 4) per repetition: reads are cheap next to writes;
 *   async save   weft_dcp_async_save (the time it blocks the caller: plan +
 *                staging copy), then weft_dcp_async_wait.
 * ratio = plain time / dcp time (1 = as fast as plain I/O). The best time of
 * each over the repetitions is used; the first async save of a run also
 * allocates its staging buffers, so the async figure is the best of the
 * later ones (staging is reused between saves, as in training).
 * note: the page cache cannot be dropped here (no root): reads on both sides
 * come from the page cache after the writes; both sides fsync their data
 * equally (dcp also fsyncs its metadata and the directory). Other load on
 * this shared machine hits both sides alike within a repetition.
 * The last line is "min dcp throughput ratio: R" (save and load).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dcp.h"

#define PIECE ((size_t)8 << 20)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what) {
  fprintf(stderr, "[rank %d] %s: %s\n", weft_world_rank(), what, weft_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}
#define OK(x)                    \
  do {                           \
    if ((x) != WEFT_OK) die(#x); \
  } while (0)

static double tmax(double t) {
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

typedef struct piece {
  char *p;
  size_t n;
} piece;

static double plain_write(const char *path, const piece *ps, int np) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now();
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    perror(path);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  off_t off = 0;
  for (int i = 0; i < np; i++)
    for (size_t at = 0; at < ps[i].n;) {
      size_t n = ps[i].n - at < PIECE ? ps[i].n - at : PIECE;
      ssize_t w = pwrite(fd, ps[i].p + at, n, off);
      if (w <= 0) {
        perror("pwrite");
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      at += (size_t)w;
      off += w;
    }
  if (fsync(fd) != 0) perror("fsync");
  close(fd);
  return tmax(now() - t0);
}

static double plain_read(const char *path, const piece *ps, int np) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now();
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    perror(path);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  off_t off = 0;
  for (int i = 0; i < np; i++)
    for (size_t at = 0; at < ps[i].n;) {
      size_t n = ps[i].n - at < PIECE ? ps[i].n - at : PIECE;
      ssize_t r = pread(fd, ps[i].p + at, n, off);
      if (r <= 0) {
        perror("pread");
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      at += (size_t)r;
      off += r;
    }
  close(fd);
  return tmax(now() - t0);
}

int main(int argc, char **argv) {
  OK(weft_init(&argc, &argv));
  const int rank = weft_world_rank(), world = weft_world_size();
  char dir[512];
  snprintf(dir, sizeof dir, "/tmp/weft-bench-dcp-%d", (int)getppid());
  int layers = 12, reps = 2, load_reps = 4;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dir") && i + 1 < argc)
      snprintf(dir, sizeof dir, "%s", argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
      layers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--load-reps") && i + 1 < argc)
      load_reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else {
      if (rank == 0)
        fprintf(stderr,
                "usage: weft-bench-dcp [--dir DIR] [--layers L] [--reps R] [--load-reps K]\n");
      weft_finalize();
      return 2;
    }
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (reps < 1) reps = 1;
  if (load_reps < 1) load_reps = 1;

  /* the model, sharded Shard(0) over all ranks, and AdamW (amsgrad) state */
  const char *names[1] = {"dp"};
  weft_mesh *mesh;
  OK(weft_mesh_create(1, &world, names, &mesh));
  weft_llama_config cfg = WEFT_LLAMA_CONFIG_INIT;
  cfg.dim = 768;
  cfg.n_layers = layers;
  cfg.n_heads = 12;
  cfg.n_kv_heads = 12;
  cfg.ffn_dim = 2048;
  cfg.vocab = 8192;
  cfg.max_seq_len = 1024;
  weft_module *model;
  OK(weft_llama_create(&cfg, mesh, &model));
  int np = 0;
  OK(weft_module_parameters(model, NULL, 0, &np));
  weft_param **ps = malloc((size_t)np * sizeof *ps);
  OK(weft_module_parameters(model, ps, np, &np));
  weft_placement sh = weft_shard(0);
  for (int i = 0; i < np; i++) OK(weft_param_set_placements(ps[i], &sh, 1));
  OK(weft_module_materialize(model));
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  hp.amsgrad = true;
  weft_optimizer *opt;
  OK(weft_adamw_create(model, &hp, &opt));
  weft_state_dict *sd;
  OK(weft_state_dict_create(&sd));
  OK(weft_get_model_state_dict(model, NULL, sd));
  OK(weft_get_optimizer_state_dict(model, opt, NULL, sd));
  OK(weft_state_dict_set_int(sd, "train.step", 1000));
  /* non-trivial contents (cheap pattern, every byte written once) */
  int64_t nt = weft_state_dict_count(sd), npieces = 0;
  piece *pieces = calloc((size_t)nt, sizeof *pieces);
  size_t bytes = 0;
  for (int64_t i = 0; i < nt; i++) {
    weft_sd_entry e;
    OK(weft_state_dict_get(sd, i, &e));
    if (e.kind != WEFT_SD_DTENSOR) continue;
    weft_tensor *lt = weft_dtensor_local(e.dtensor);
    float *p = lt->data;
    int64_t n = weft_tensor_numel(lt);
    for (int64_t k = 0; k < n; k++)
      p[k] = (float)((k * 2654435761u + (uint64_t)i * 97u) % 65536) * 1e-4f - 3.0f;
    pieces[npieces].p = lt->data;
    pieces[npieces].n = weft_tensor_nbytes(lt);
    bytes += pieces[npieces].n;
    npieces++;
  }
  double total = (double)bytes;
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    printf("state: %d params + 3 AdamW (amsgrad) states, %" PRId64
           " tensors, %.3f GB in all, "
           "%.3f GB per rank on %d ranks (Shard(0)); dir %s\n",
           np, npieces, total / 1e9, (double)bytes / 1e9, world, dir);
  char ckpt[600], plain[600];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
  snprintf(plain, sizeof plain, "%s/plain-%d.bin", dir, rank);
  if (rank == 0) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  double bw = 1e30, bs = 1e30, br = 1e30, bl = 1e30, ba = 1e30, bwait = 1e30;
  for (int r = 0; r < reps; r++) {
    double tw = plain_write(plain, pieces, (int)npieces);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    OK(weft_dcp_save(sd, ckpt, NULL));
    double ts = tmax(now() - t0);
    /* Reads are cheap next to writes: several read/load pairs per
     * repetition, so the best of each is taken over reps * load_reps. */
    double tr = 1e30, tl = 1e30;
    for (int k = 0; k < load_reps; k++) {
      double t = plain_read(plain, pieces, (int)npieces);
      if (t < tr) tr = t;
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now();
      OK(weft_dcp_load(sd, ckpt, NULL, NULL));
      t = tmax(now() - t0);
      if (t < tl) tl = t;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    weft_dcp_async *h;
    t0 = now();
    OK(weft_dcp_async_save(sd, ckpt, NULL, &h));
    double ta = tmax(now() - t0);
    t0 = now();
    OK(weft_dcp_async_wait(h));
    double twait = tmax(now() - t0);
    if (rank == 0)
      printf(
          "rep %d: plain write %.3f s, dcp save %.3f s (ratio %.3f) | plain read %.3f s, dcp load "
          "%.3f s (ratio %.3f) | async save blocks %.3f s%s, then waits %.3f s\n",
          r, tw, ts, tw / ts, tr, tl, tr / tl, ta, r == 0 ? " (allocates staging)" : "", twait);
    if (tw < bw) bw = tw;
    if (ts < bs) bs = ts;
    if (tr < br) br = tr;
    if (tl < bl) bl = tl;
    if ((r > 0 || reps == 1) && ta < ba) ba = ta;
    if (twait < bwait) bwait = twait;
  }
  double save_ratio = bw / bs, load_ratio = br / bl;
  if (rank == 0) {
    printf(
        "best of %d: plain write %.3f s (%.2f GB/s), dcp save %.3f s (%.2f GB/s): save ratio "
        "%.3f\n",
        reps, bw, total / bw / 1e9, bs, total / bs / 1e9, save_ratio);
    printf(
        "best of %d: plain read %.3f s (%.2f GB/s), dcp load %.3f s (%.2f GB/s): load ratio %.3f\n",
        reps * load_reps, br, total / br / 1e9, bl, total / bl / 1e9, load_ratio);
    printf("async save blocks the caller %.3f s = %.1f%% of the synchronous save (%.3f s)\n", ba,
           100.0 * ba / bs, bs);
    printf("min dcp throughput ratio: %.3f\n", save_ratio < load_ratio ? save_ratio : load_ratio);
  }
  unlink(plain);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  weft_state_dict_destroy(sd);
  OK(weft_dcp_release_staging());
  weft_optimizer_destroy(opt);
  OK(weft_module_destroy(model));
  free(ps);
  free(pieces);
  OK(weft_mesh_destroy(mesh));
  weft_finalize();
  return 0;
}
