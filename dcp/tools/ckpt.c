/* weft-ckpt — inspect, verify and convert weft checkpoints.
 *
 *   weft-ckpt inspect DIR                    tensors, dtypes, shapes, chunks, who wrote what
 *   weft-ckpt verify DIR                     every block checksum, file headers and sizes
 *   weft-ckpt verify --finite DIR            also: every tensor holding NaN or Inf (name, count)
 *   weft-ckpt to-safetensors DIR FILE [--dtype f32|bf16|f16|f64] [--model-only]
 *                                            one safetensors file of the whole tensors
 *   weft-ckpt from-safetensors FILE DIR      a one-rank checkpoint of a safetensors file
 *
 * Errors print one line "weft-ckpt: ..." and exit 1 (usage errors: 2).
 * inspect, verify and to-safetensors need no MPI; from-safetensors saves
 * through weft_dcp_save as a one-process (singleton) MPI job. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp.h"
#include "safetensors.h"

static int usage(void) {
  fprintf(
      stderr,
      "weft-ckpt: usage: weft-ckpt inspect DIR | verify [--finite] DIR | to-safetensors DIR FILE "
      "[--dtype f32|bf16|f16|f64] [--model-only] | from-safetensors FILE DIR\n");
  return 2;
}

/* A message without weft's "[rank N] function: " prefix, first line only. */
static void print_msg(const char *m) {
  if (m[0] == '[') {
    const char *e = strstr(m, "] ");
    if (e) m = e + 2;
  }
  const char *p = m;
  while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
         *p == '_')
    p++;
  if (p > m && p[0] == ':' && p[1] == ' ') m = p + 2;
  fprintf(stderr, "weft-ckpt: %.*s\n", (int)strcspn(m, "\n"), m);
}

/* The first line of the last error. */
static int fail(void) {
  print_msg(weft_last_error());
  return 1;
}

static void shape_str(int nd, const int64_t *s, char *buf, size_t cap) {
  size_t at = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < nd && at < cap; d++)
    at += (size_t)snprintf(buf + at, cap - at, "%s%" PRId64, d ? ", " : "", s[d]);
  if (at < cap) snprintf(buf + at, cap - at, "]");
}

static void box_str(int nd, const int64_t *o, const int64_t *s, char *buf, size_t cap) {
  size_t at = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < nd && at < cap; d++)
    at += (size_t)snprintf(buf + at, cap - at, "%s%" PRId64 ":%" PRId64, d ? ", " : "", o[d],
                           o[d] + s[d]);
  if (at < cap) snprintf(buf + at, cap - at, "]");
}

static int cmd_inspect(const char *dir) {
  weft_dcp_checkpoint *ck;
  if (weft_dcp_open(dir, &ck) != WEFT_OK) return fail();
  weft_dcp_info info;
  weft_dcp_get_info(ck, &info);
  printf("checkpoint %s: format version %d, id %016" PRIx64
         ", saved by %d rank%s, checksum block %" PRId64 " bytes\n",
         dir, info.format_version, info.id, info.world_size, info.world_size == 1 ? "" : "s",
         info.block_bytes);
  uint64_t *bytes = calloc((size_t)info.world_size, sizeof *bytes);
  int64_t *chunks = calloc((size_t)info.world_size, sizeof *chunks);
  uint64_t total = 0;
  printf("tensors (%" PRId64 "):\n", info.num_tensors);
  for (int64_t i = 0; i < info.num_tensors; i++) {
    weft_dcp_tensor_info t;
    weft_dcp_tensor_get(ck, i, &t);
    char sh[160];
    shape_str(t.ndim, t.shape, sh, sizeof sh);
    printf("  %s  %s%s  saved as %s  %" PRId64 " chunk%s\n", t.name, weft_dtype_name(t.dtype), sh,
           t.layout[0] ? t.layout : "?", t.num_chunks, t.num_chunks == 1 ? "" : "s");
    for (int64_t c = 0; c < t.num_chunks; c++) {
      weft_dcp_chunk_info ci;
      weft_dcp_chunk_get(ck, i, c, &ci);
      char bx[256];
      box_str(t.ndim, ci.offsets, ci.sizes, bx, sizeof bx);
      printf("    %s  rank %d  %s @%" PRIu64 " +%" PRIu64 " bytes, %" PRId64 " block%s\n", bx,
             ci.rank, ci.file, ci.byte_offset, ci.length, ci.num_blocks,
             ci.num_blocks == 1 ? "" : "s");
      bytes[ci.rank] += ci.length;
      chunks[ci.rank]++;
      total += ci.length;
    }
  }
  printf("values (%" PRId64 "):\n", info.num_values);
  for (int64_t i = 0; i < info.num_values; i++) {
    const char *name, *json;
    weft_sd_value_type ty;
    weft_dcp_value_get(ck, i, &name, &ty, &json);
    const char *tn[] = {"int", "double", "string", "json"};
    printf("  %s  %s  %.200s%s\n", name, (unsigned)ty < 4 ? tn[ty] : "?", json,
           strlen(json) > 200 ? "..." : "");
  }
  printf("written per rank (%" PRIu64 " bytes of data in all):\n", total);
  for (int r = 0; r < info.world_size; r++)
    printf("  rank %d: %" PRId64 " chunk%s, %" PRIu64 " bytes (%.1f%%)\n", r, chunks[r],
           chunks[r] == 1 ? "" : "s", bytes[r],
           total ? 100.0 * (double)bytes[r] / (double)total : 0.0);
  free(bytes);
  free(chunks);
  weft_dcp_close(ck);
  return 0;
}

static void report(const char *msg, void *ctx) {
  (void)ctx;
  print_msg(msg);
}

/* Non-finite elements of n values of dtype dt at p (float dtypes only). */
static int64_t count_nonfinite(const void *p, int64_t n, weft_dtype dt) {
  int64_t k = 0;
  if (dt == WEFT_F32) {
    const float *x = p;
    for (int64_t i = 0; i < n; i++) k += !isfinite(x[i]);
  } else if (dt == WEFT_F64) {
    const double *x = p;
    for (int64_t i = 0; i < n; i++) k += !isfinite(x[i]);
  } else if (dt == WEFT_BF16) { /* exponent all ones: Inf or NaN */
    const uint16_t *x = p;
    for (int64_t i = 0; i < n; i++) k += (x[i] & 0x7F80u) == 0x7F80u;
  } else if (dt == WEFT_F16) {
    const uint16_t *x = p;
    for (int64_t i = 0; i < n; i++) k += (x[i] & 0x7C00u) == 0x7C00u;
  }
  return k;
}

/* --finite: every float tensor read chunk by chunk (checksums verified as
 * they are read); each one holding NaN or Inf is printed to stderr with
 * its count. Returns the number of such tensors, or -1 on a read error. */
static int64_t check_finite(weft_dcp_checkpoint *ck, const char *dir) {
  weft_dcp_info info;
  weft_dcp_get_info(ck, &info);
  int64_t tensors = 0;
  for (int64_t i = 0; i < info.num_tensors; i++) {
    weft_dcp_tensor_info t;
    weft_dcp_tensor_get(ck, i, &t);
    if (t.dtype != WEFT_F32 && t.dtype != WEFT_F64 && t.dtype != WEFT_BF16 && t.dtype != WEFT_F16)
      continue;
    int64_t count = 0, numel = 1;
    for (int d = 0; d < t.ndim; d++) numel *= t.shape[d];
    for (int64_t c = 0; c < t.num_chunks; c++) {
      weft_dcp_chunk_info ci;
      weft_dcp_chunk_get(ck, i, c, &ci);
      void *buf = malloc(ci.length ? ci.length : 1);
      if (!buf) {
        fprintf(stderr, "weft-ckpt: %s: out of memory for a chunk of %" PRIu64 " bytes of %s\n",
                dir, ci.length, t.name);
        return -1;
      }
      if (weft_dcp_read(ck, t.name, ci.offsets, ci.sizes, buf, ci.length) != WEFT_OK) {
        free(buf);
        fail();
        return -1;
      }
      count += count_nonfinite(buf, (int64_t)(ci.length / weft_dtype_size(t.dtype)), t.dtype);
      free(buf);
    }
    if (count) {
      fprintf(stderr,
              "weft-ckpt: %s: tensor %s holds %" PRId64
              " non-finite value%s (NaN or Inf) of %" PRId64 "\n",
              dir, t.name, count, count == 1 ? "" : "s", numel);
      tensors++;
    }
  }
  return tensors;
}

static int cmd_verify(const char *dir, bool finite) {
  weft_dcp_checkpoint *ck;
  if (weft_dcp_open(dir, &ck) != WEFT_OK) return fail();
  int64_t bad = 0;
  weft_status st = weft_dcp_verify(ck, &bad, report, NULL);
  int64_t nonfinite = st == WEFT_OK && finite ? check_finite(ck, dir) : 0;
  weft_dcp_info info;
  weft_dcp_get_info(ck, &info);
  int64_t nchunks = 0, nblocks = 0;
  uint64_t nbytes = 0;
  for (int64_t i = 0; i < info.num_tensors; i++) {
    weft_dcp_tensor_info t;
    weft_dcp_tensor_get(ck, i, &t);
    for (int64_t c = 0; c < t.num_chunks; c++) {
      weft_dcp_chunk_info ci;
      weft_dcp_chunk_get(ck, i, c, &ci);
      nchunks++;
      nblocks += ci.num_blocks;
      nbytes += ci.length;
    }
  }
  weft_dcp_close(ck);
  if (st != WEFT_OK) {
    fprintf(stderr, "weft-ckpt: %s: %" PRId64 " problem%s found\n", dir, bad, bad == 1 ? "" : "s");
    return 1;
  }
  if (nonfinite < 0) return 1;
  if (nonfinite > 0) {
    fprintf(stderr, "weft-ckpt: %s: %" PRId64 " tensor%s with non-finite values\n", dir, nonfinite,
            nonfinite == 1 ? "" : "s");
    return 1;
  }
  printf("%s: %" PRId64 " tensors, %" PRId64 " chunks, %" PRId64 " blocks, %" PRIu64
         " bytes: OK%s\n",
         dir, info.num_tensors, nchunks, nblocks, nbytes, finite ? ", all finite" : "");
  return 0;
}

static int cmd_to_st(const char *dir, const char *file, int argc, char **argv) {
  weft_dtype want = WEFT_DTYPE_COUNT; /* keep */
  int model_only = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--model-only")) {
      model_only = 1;
    } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
      if (weft_dtype_parse(argv[++i], &want) != WEFT_OK || !weft_dtype_is_float(want)) {
        fprintf(stderr, "weft-ckpt: --dtype %s: not one of f32, bf16, f16, f64\n", argv[i]);
        return 2;
      }
    } else {
      fprintf(stderr, "weft-ckpt: to-safetensors: unknown option '%s'\n", argv[i]);
      return 2;
    }
  }
  weft_dcp_checkpoint *ck;
  if (weft_dcp_open(dir, &ck) != WEFT_OK) return fail();
  weft_dcp_info info;
  weft_dcp_get_info(ck, &info);
  weft_safetensors_entry *e = calloc((size_t)info.num_tensors + 1, sizeof *e);
  weft_tensor **keep = calloc((size_t)info.num_tensors + 1, sizeof *keep);
  int64_t n = 0;
  int rc = 0;
  for (int64_t i = 0; i < info.num_tensors && !rc; i++) {
    weft_dcp_tensor_info t;
    weft_dcp_tensor_get(ck, i, &t);
    if (model_only && (!strncmp(t.name, "state.", 6) || !strncmp(t.name, "param_groups.", 13)))
      continue;
    weft_tensor *x = NULL;
    int64_t zero[WEFT_MAX_DIMS] = {0};
    if (weft_tensor_create(t.dtype, WEFT_CPU, t.ndim, t.shape, &x) != WEFT_OK ||
        weft_dcp_read(ck, t.name, zero, t.shape, x->data, weft_tensor_nbytes(x)) != WEFT_OK) {
      rc = fail();
      weft_tensor_destroy(x);
      break;
    }
    if (want != WEFT_DTYPE_COUNT && weft_dtype_is_float(t.dtype) && t.dtype != want) {
      weft_tensor *y = NULL;
      if (weft_cast(x, want, &y) != WEFT_OK) {
        rc = fail();
        weft_tensor_destroy(x);
        break;
      }
      weft_tensor_destroy(x);
      x = y;
    }
    keep[n] = x;
    e[n].name = t.name;
    e[n].dtype = x->dtype;
    e[n].ndim = x->ndim;
    e[n].shape = x->shape;
    e[n].data = x->data;
    n++;
  }
  if (!rc) {
    /* values go to __metadata__ as their JSON text */
    const char **meta = calloc((size_t)(2 * info.num_values + 3), sizeof *meta);
    int k = 0;
    meta[k++] = "format";
    meta[k++] = "pt";
    for (int64_t i = 0; i < info.num_values; i++) {
      const char *name, *json;
      weft_dcp_value_get(ck, i, &name, NULL, &json);
      if (!strcmp(name, "format")) continue;
      meta[k++] = name;
      meta[k++] = json;
    }
    meta[k] = NULL;
    if (weft_safetensors_write(file, e, n, meta) != WEFT_OK)
      rc = fail();
    else
      printf("wrote %" PRId64 " tensors to %s\n", n, file);
    free(meta);
  }
  for (int64_t i = 0; i < n; i++) weft_tensor_destroy(keep[i]);
  free(keep);
  free(e);
  weft_dcp_close(ck);
  return rc;
}

static int cmd_from_st(const char *file, const char *dir) {
  weft_safetensors *f;
  if (weft_safetensors_open(file, &f) != WEFT_OK) return fail();
  int argc = 0;
  if (weft_init(&argc, NULL) != WEFT_OK) {
    weft_safetensors_close(f);
    return fail();
  }
  int rc = 0;
  weft_state_dict *sd = NULL;
  if (weft_state_dict_create(&sd) != WEFT_OK) rc = fail();
  for (int64_t i = 0; !rc && i < weft_safetensors_count(f); i++) {
    weft_safetensors_info info;
    weft_tensor *x = NULL;
    if (weft_safetensors_get(f, i, &info) != WEFT_OK ||
        weft_tensor_create(info.dtype, WEFT_CPU, info.ndim, info.shape, &x) != WEFT_OK ||
        weft_safetensors_read_tensor(f, info.name, x) != WEFT_OK ||
        weft_state_dict_add_tensor(sd, info.name, x, WEFT_LOCAL_TAKE) != WEFT_OK) {
      weft_tensor_destroy(x);
      rc = fail();
    }
  }
  if (!rc && weft_dcp_save(sd, dir, NULL) != WEFT_OK) rc = fail();
  if (!rc) printf("wrote %" PRId64 " tensors to checkpoint %s\n", weft_state_dict_count(sd), dir);
  weft_state_dict_destroy(sd);
  weft_safetensors_close(f);
  weft_finalize();
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  const char *cmd = argv[1];
  if (!strcmp(cmd, "inspect") && argc == 3) return cmd_inspect(argv[2]);
  if (!strcmp(cmd, "verify") && argc == 3 && strcmp(argv[2], "--finite") != 0)
    return cmd_verify(argv[2], false);
  if (!strcmp(cmd, "verify") && argc == 4 && !strcmp(argv[2], "--finite"))
    return cmd_verify(argv[3], true);
  if (!strcmp(cmd, "verify") && argc == 4 && !strcmp(argv[3], "--finite"))
    return cmd_verify(argv[2], true);
  if (!strcmp(cmd, "to-safetensors") && argc >= 4)
    return cmd_to_st(argv[2], argv[3], argc - 4, argv + 4);
  if (!strcmp(cmd, "from-safetensors") && argc == 4) return cmd_from_st(argv[2], argv[3]);
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
    usage();
    return 0;
  }
  return usage();
}
