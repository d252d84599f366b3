/* safetensors reader/writer (dcp/safetensors.h): round trips of every dtype,
 * sub-box reads against naive slicing, the on-disk layout the reference
 * implementation requires, each corruption case, bad API input, and the
 * golden files in tests/data. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "kernels.h"
#include "safetensors.h"

static char tmpdir[256];

static void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/weft_st_XXXXXX");
  cr_assert(mkdtemp(tmpdir) != NULL);
}
static void path_in(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", tmpdir, name);
}
static void rm_tmpdir(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  cr_expect_eq(system(cmd), 0);
}

static uint64_t rs = 12345;
static float frand(void) {
  rs = rs * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* The whole file (weft_test_slurp), asserting it could be read. */
static unsigned char *slurp(const char *path, size_t *len) {
  unsigned char *b = (unsigned char *)weft_test_slurp(path, len);
  cr_assert(b != NULL, "cannot read %s", path);
  return b;
}

/* Writes 8-byte length + header + `data_len` bytes of data (a raw file for
 * the corruption cases). hlen_override >= 0 replaces the stated length. */
static void write_raw(const char *path, const char *header, size_t data_len,
                      int64_t hlen_override) {
  FILE *f = fopen(path, "wb");
  cr_assert(f != NULL);
  uint64_t n = hlen_override >= 0 ? (uint64_t)hlen_override : strlen(header);
  unsigned char lb[8];
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(n >> (8 * i));
  fwrite(lb, 1, 8, f);
  fwrite(header, 1, strlen(header), f);
  for (size_t i = 0; i < data_len; i++) fputc((int)(i & 0xff), f);
  fclose(f);
}

Test(safetensors, write_then_read_roundtrips_every_dtype, .init = make_tmpdir, .fini = rm_tmpdir) {
  float f32[12];
  double f64[2] = {M_PI, -1e300};
  uint16_t bf16[5], f16[4];
  int32_t i32[1] = {-123456};
  int64_t i64[3] = {INT64_MIN, 0, INT64_MAX};
  uint8_t u8[7] = {0, 1, 2, 3, 250, 254, 255};
  for (int i = 0; i < 12; i++) f32[i] = frand();
  for (int i = 0; i < 5; i++) bf16[i] = weft_f32_to_bf16(frand());
  for (int i = 0; i < 4; i++) f16[i] = weft_f32_to_f16(frand());
  const int64_t s_f32[2] = {3, 4}, s_f64[1] = {2}, s_bf16[1] = {5}, s_f16[2] = {2, 2},
                s_i64[1] = {3}, s_u8[1] = {7}, s_empty[2] = {0, 3};
  const weft_safetensors_entry e[] = {
      {"w.f32", WEFT_F32, 2, s_f32, f32},
      {"b.f64", WEFT_F64, 1, s_f64, f64},
      {"z\"quoted\\name", WEFT_BF16, 1, s_bf16, bf16},
      {"h", WEFT_F16, 2, s_f16, f16},
      {"scalar", WEFT_I32, 0, NULL, i32},
      {"i64", WEFT_I64, 1, s_i64, i64},
      {"bytes", WEFT_U8, 1, s_u8, u8},
      {"empty", WEFT_F32, 2, s_empty, NULL},
  };
  const int n = sizeof e / sizeof e[0];
  const void *data[] = {f32, f64, bf16, f16, i32, i64, u8, NULL};
  const size_t bytes[] = {48, 16, 10, 8, 4, 24, 7, 0};
  const char *meta[] = {"format", "pt", "note", "line\nbreak", NULL};
  char path[300];
  path_in(path, sizeof path, "rt.safetensors");
  cr_assert_eq(weft_safetensors_write(path, e, n, meta), WEFT_OK, "%s", weft_last_error());

  /* layout the reference implementation requires */
  size_t len;
  unsigned char *raw = slurp(path, &len);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | raw[i];
  cr_expect_eq(hlen % 8, 0, "header length %llu is not a multiple of 8", (unsigned long long)hlen);
  cr_expect_eq(raw[8], '{');
  size_t data_len = 0;
  for (int i = 0; i < n; i++) data_len += bytes[i];
  cr_expect_eq(len, 8 + hlen + data_len, "file %zu bytes, header %llu + data %zu", len,
               (unsigned long long)hlen, data_len);
  size_t close_brace = 8 + hlen - 1;
  while (raw[close_brace] == ' ') close_brace--;
  cr_expect_eq(raw[close_brace], '}', "header must be JSON padded with spaces only");
  /* data back to back, larger elements first: each tensor aligned */
  size_t off = 8 + hlen;
  for (size_t esz = 8; esz >= 1; esz /= 2)
    for (int i = 0; i < n; i++) {
      if (weft_dtype_size(e[i].dtype) != esz) continue;
      if (bytes[i]) cr_expect(memcmp(raw + off, data[i], bytes[i]) == 0, "bytes of %s", e[i].name);
      cr_expect_eq(off % esz, 0, "%s at file offset %zu is not %zu-byte aligned", e[i].name, off,
                   esz);
      off += bytes[i];
    }

  weft_safetensors *f;
  cr_assert_eq(weft_safetensors_open(path, &f), WEFT_OK, "%s", weft_last_error());
  cr_assert_eq(weft_safetensors_count(f), n);
  cr_expect_str_eq(weft_safetensors_metadata(f, "format"), "pt");
  cr_expect_str_eq(weft_safetensors_metadata(f, "note"), "line\nbreak");
  cr_expect_null(weft_safetensors_metadata(f, "absent"));
  /* name order */
  weft_safetensors_info prev, info;
  cr_assert_eq(weft_safetensors_get(f, 0, &prev), WEFT_OK);
  for (int64_t i = 1; i < n; i++) {
    cr_assert_eq(weft_safetensors_get(f, i, &info), WEFT_OK);
    cr_expect(strcmp(prev.name, info.name) < 0, "%s before %s", prev.name, info.name);
    prev = info;
  }
  cr_expect_eq(weft_safetensors_get(f, n, &info), WEFT_ERR_INVALID);
  for (int i = 0; i < n; i++) {
    cr_assert_eq(weft_safetensors_find(f, e[i].name, &info), WEFT_OK, "%s", weft_last_error());
    cr_expect_eq(info.dtype, e[i].dtype, "%s", e[i].name);
    cr_expect_eq(info.ndim, e[i].ndim, "%s", e[i].name);
    for (int d = 0; d < e[i].ndim; d++) cr_expect_eq(info.shape[d], e[i].shape[d]);
    cr_expect_eq(info.nbytes, bytes[i], "%s", e[i].name);
    if (bytes[i])
      cr_expect(memcmp(raw + info.offset, data[i], bytes[i]) == 0, "info.offset of %s", e[i].name);
    unsigned char back[64];
    memset(back, 0xAB, sizeof back);
    cr_assert_eq(weft_safetensors_read(f, e[i].name, e[i].dtype, back, 64), WEFT_OK, "%s",
                 weft_last_error());
    if (bytes[i]) cr_expect(memcmp(back, data[i], bytes[i]) == 0, "round trip of %s", e[i].name);
  }
  weft_safetensors_close(f);
  weft_safetensors_close(NULL);
  free(raw);

  /* writing over an existing file replaces it and leaves no temporary */
  cr_assert_eq(weft_safetensors_write(path, e, 1, NULL), WEFT_OK, "%s", weft_last_error());
  cr_assert_eq(weft_safetensors_open(path, &f), WEFT_OK);
  cr_expect_eq(weft_safetensors_count(f), 1);
  cr_expect_null(weft_safetensors_metadata(f, "format"));
  weft_safetensors_close(f);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "test $(ls '%s' | wc -l) -eq 1", tmpdir);
  cr_expect_eq(system(cmd), 0, "temporary file left behind in %s", tmpdir);
}

/* Naive slice of a row-major (s0, s1, s2) array. */
static void naive_slice(const float *src, const int64_t *shape, const int64_t *st,
                        const int64_t *ln, float *dst) {
  int64_t o = 0;
  for (int64_t i = st[0]; i < st[0] + ln[0]; i++)
    for (int64_t j = st[1]; j < st[1] + ln[1]; j++)
      for (int64_t k = st[2]; k < st[2] + ln[2]; k++)
        dst[o++] = src[(i * shape[1] + j) * shape[2] + k];
}

Test(safetensors, read_slice_matches_naive_slicing, .init = make_tmpdir, .fini = rm_tmpdir) {
  const int64_t shape[3] = {5, 6, 7};
  float x[210];
  for (int i = 0; i < 210; i++) x[i] = frand();
  float pad[3] = {1, 2, 3};
  const int64_t ps[1] = {3};
  weft_safetensors_entry e[2] = {{"pad", WEFT_F32, 1, ps, pad}, {"x", WEFT_F32, 3, shape, x}};
  char path[300];
  path_in(path, sizeof path, "slice.safetensors");
  cr_assert_eq(weft_safetensors_write(path, e, 2, NULL), WEFT_OK, "%s", weft_last_error());
  weft_safetensors *f;
  cr_assert_eq(weft_safetensors_open(path, &f), WEFT_OK, "%s", weft_last_error());
  const int64_t boxes[][6] = {
      {0, 0, 0, 5, 6, 7}, {2, 0, 0, 2, 6, 7}, {0, 1, 0, 5, 3, 7}, {0, 0, 3, 5, 6, 4},
      {1, 2, 3, 3, 3, 3}, {4, 5, 6, 1, 1, 1}, {0, 0, 0, 5, 6, 1}, {3, 0, 0, 0, 6, 7},
  };
  for (size_t b = 0; b < sizeof boxes / sizeof boxes[0]; b++) {
    const int64_t *st = boxes[b], *ln = boxes[b] + 3;
    float want[210], got[210];
    double got64[210];
    naive_slice(x, shape, st, ln, want);
    int64_t cnt = ln[0] * ln[1] * ln[2];
    cr_assert_eq(weft_safetensors_read_slice(f, "x", 3, st, ln, WEFT_F32, got, 210), WEFT_OK, "%s",
                 weft_last_error());
    cr_expect(memcmp(got, want, (size_t)cnt * sizeof(float)) == 0, "box %zu differs", b);
    cr_assert_eq(weft_safetensors_read_slice(f, "x", 3, st, ln, WEFT_F64, got64, 210), WEFT_OK);
    for (int64_t i = 0; i < cnt; i++)
      cr_expect_eq(got64[i], (double)want[i], "box %zu as f64 [%lld]", b, (long long)i);
  }
  float rows[84];
  cr_assert_eq(weft_safetensors_read_rows(f, "x", 3, 2, WEFT_F32, rows, 84), WEFT_OK);
  cr_expect(memcmp(rows, x + 3 * 42, sizeof rows) == 0, "rows 3..5");
  /* bad boxes and destinations */
  const int64_t st0[3] = {0, 0, 0}, out[3] = {0, 0, 8}, neg[3] = {-1, 0, 0}, ok[3] = {1, 1, 1};
  float small[4];
  cr_expect_eq(weft_safetensors_read_slice(f, "x", 3, st0, out, WEFT_F32, rows, 84),
               WEFT_ERR_INVALID);
  cr_expect_eq(weft_safetensors_read_slice(f, "x", 3, neg, ok, WEFT_F32, rows, 84),
               WEFT_ERR_INVALID);
  cr_expect_eq(weft_safetensors_read_slice(f, "x", 2, st0, ok, WEFT_F32, rows, 84),
               WEFT_ERR_INVALID);
  cr_expect_eq(weft_safetensors_read(f, "x", WEFT_F32, small, 4), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "holds 4 elements") != NULL, "%s", weft_last_error());
  cr_expect_eq(weft_safetensors_read_rows(f, "x", 4, 2, WEFT_F32, rows, 84), WEFT_ERR_INVALID);
  cr_expect_eq(weft_safetensors_read(f, "nope", WEFT_F32, rows, 84), WEFT_ERR_NOT_FOUND);
  cr_expect(strstr(weft_last_error(), "nope") != NULL, "%s", weft_last_error());
  cr_expect_eq(weft_safetensors_read(f, "x", WEFT_I32, rows, 84), WEFT_ERR_UNSUPPORTED);
  weft_safetensors_close(f);
}

/* Column slices of a wide matrix exercise the merged-window reads; rows
 * longer than the staging buffer exercise the chunked conversion. */
Test(safetensors, large_column_and_row_slices_read_correctly, .init = make_tmpdir,
     .fini = rm_tmpdir) {
  const int64_t R = 300, C = 2000, W = 700000;
  float *a = malloc((size_t)(R * C) * sizeof(float)), *w = malloc((size_t)(2 * W) * sizeof(float));
  for (int64_t i = 0; i < R * C; i++) a[i] = (float)i;
  for (int64_t i = 0; i < 2 * W; i++) w[i] = frand();
  const int64_t sa[2] = {R, C}, sw[2] = {2, W};
  weft_safetensors_entry e[2] = {{"a", WEFT_F32, 2, sa, a}, {"w", WEFT_F32, 2, sw, w}};
  char path[300];
  path_in(path, sizeof path, "big.safetensors");
  cr_assert_eq(weft_safetensors_write(path, e, 2, NULL), WEFT_OK, "%s", weft_last_error());
  weft_safetensors *f;
  cr_assert_eq(weft_safetensors_open(path, &f), WEFT_OK);
  const int64_t cols[][2] = {{500, 500}, {0, 1}, {1999, 1}, {0, 1000}, {3, 1997}};
  float *got = malloc((size_t)(R * C) * sizeof(float));
  for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
    const int64_t st[2] = {7, cols[c][0]}, ln[2] = {R - 9, cols[c][1]};
    cr_assert_eq(weft_safetensors_read_slice(f, "a", 2, st, ln, WEFT_F32, got, R * C), WEFT_OK,
                 "%s", weft_last_error());
    int64_t bad = 0;
    for (int64_t i = 0; i < ln[0]; i++)
      for (int64_t j = 0; j < ln[1]; j++)
        bad += got[i * ln[1] + j] != a[(st[0] + i) * C + st[1] + j];
    cr_expect_eq(bad, 0, "column slice %zu: %lld wrong elements", c, (long long)bad);
  }
  double *wd = malloc((size_t)W * sizeof(double));
  cr_assert_eq(weft_safetensors_read_rows(f, "w", 1, 1, WEFT_F64, wd, W), WEFT_OK, "%s",
               weft_last_error());
  int64_t bad = 0;
  for (int64_t j = 0; j < W; j++) bad += wd[j] != (double)w[W + j];
  cr_expect_eq(bad, 0, "long row as f64: %lld wrong", (long long)bad);
  weft_safetensors_close(f);
  free(a);
  free(w);
  free(got);
  free(wd);
}

Test(safetensors, float_conversions_round_as_weft_does, .init = make_tmpdir, .fini = rm_tmpdir) {
  double d[6] = {1.0 / 3.0, -2.5, 1e-3, 65504.0, 1e-8, -0.0};
  uint16_t b[6];
  for (int i = 0; i < 6; i++) b[i] = weft_f32_to_bf16((float)d[i]);
  const int64_t s[1] = {6};
  weft_safetensors_entry e[2] = {{"d", WEFT_F64, 1, s, d}, {"b", WEFT_BF16, 1, s, b}};
  char path[300];
  path_in(path, sizeof path, "conv.safetensors");
  cr_assert_eq(weft_safetensors_write(path, e, 2, NULL), WEFT_OK);
  weft_safetensors *f;
  cr_assert_eq(weft_safetensors_open(path, &f), WEFT_OK);
  float f32[6];
  uint16_t h16[6], bb[6];
  cr_assert_eq(weft_safetensors_read(f, "d", WEFT_F32, f32, 6), WEFT_OK);
  cr_assert_eq(weft_safetensors_read(f, "d", WEFT_F16, h16, 6), WEFT_OK);
  cr_assert_eq(weft_safetensors_read(f, "d", WEFT_BF16, bb, 6), WEFT_OK);
  for (int i = 0; i < 6; i++) {
    cr_expect_eq(f32[i], (float)d[i], "f64->f32 [%d]", i);
    cr_expect_eq(h16[i], weft_f32_to_f16((float)d[i]), "f64->f16 [%d]", i);
    cr_expect_eq(bb[i], b[i], "f64->bf16 [%d]", i);
  }
  cr_assert_eq(weft_safetensors_read(f, "b", WEFT_F32, f32, 6), WEFT_OK);
  for (int i = 0; i < 6; i++) cr_expect_eq(f32[i], weft_bf16_to_f32(b[i]), "bf16->f32 [%d]", i);
  /* into a weft_tensor */
  weft_tensor *t;
  const int64_t ts[1] = {6};
  cr_assert_eq(weft_tensor_create(WEFT_F64, WEFT_CPU, 1, ts, &t), WEFT_OK);
  cr_assert_eq(weft_safetensors_read_tensor(f, "d", t), WEFT_OK, "%s", weft_last_error());
  cr_expect(memcmp(t->data, d, sizeof d) == 0);
  weft_tensor_destroy(t);
  const int64_t ts2[2] = {2, 3};
  cr_assert_eq(weft_tensor_create(WEFT_F64, WEFT_CPU, 2, ts2, &t), WEFT_OK);
  cr_expect_eq(weft_safetensors_read_tensor(f, "d", t), WEFT_ERR_INVALID);
  weft_tensor_destroy(t);
  weft_safetensors_close(f);
}

/* Each malformed file gives WEFT_ERR_CORRUPT with a message naming the
 * file and (where there is one) the tensor. */
Test(safetensors, corrupt_files_are_rejected_with_file_and_tensor_named, .init = make_tmpdir,
     .fini = rm_tmpdir) {
  struct {
    const char *what, *header, *tensor, *msg;
    size_t data;
    int64_t hlen;
  } cases[] = {
      {"header length past the end", "{}", NULL, "runs past the end", 0, 1000},
      {"bad JSON", "{\"a\": {\"dtype\": \"F32\", ", NULL, "not valid JSON", 0, -1},
      {"not an object", "[1, 2]", NULL, "not a JSON object", 0, -1},
      {"trailing garbage", "{}  x", NULL, "trailing", 0, -1},
      {"unknown dtype", "{\"t\":{\"dtype\":\"Q8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "'t'",
       "unknown or unsupported dtype", 1, -1},
      {"offsets out of range",
       "{\"big\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", "'big'",
       "run past the data", 8, -1},
      {"offsets reversed", "{\"r\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,2]}}", "'r'",
       "end before", 8, -1},
      {"overlap",
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
       "'b'", "overlaps", 12, -1},
      {"shape times dtype != length",
       "{\"s\":{\"dtype\":\"F64\",\"shape\":[2,3],\"data_offsets\":[0,40]}}", "'s'",
       "give 48 bytes", 48, -1},
      {"negative shape", "{\"n\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", "'n'",
       "shape[0]", 0, -1},
      {"fractional offset", "{\"o\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.5]}}",
       "'o'", "data_offsets", 4, -1},
      {"missing dtype", "{\"m\":{\"shape\":[1],\"data_offsets\":[0,4]}}", "'m'", "dtype", 4, -1},
      {"duplicate name",
       "{\"d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
       "\"d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
       "'d'", "twice", 2, -1},
      {"metadata value not a string", "{\"__metadata__\":{\"k\":3}}", NULL, "not a string", 0, -1},
      {"shape product overflows",
       "{\"v\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}",
       "'v'", "more than", 4, -1},
  };
  char path[300];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    path_in(path, sizeof path, "bad.safetensors");
    write_raw(path, cases[i].header, cases[i].data, cases[i].hlen);
    weft_safetensors *f = (weft_safetensors *)0x1;
    weft_status st = weft_safetensors_open(path, &f);
    const char *msg = weft_last_error();
    cr_expect_eq(st, WEFT_ERR_CORRUPT, "%s: status %d (%s)", cases[i].what, st, msg);
    cr_expect_null(f, "%s: *out must be NULL on failure", cases[i].what);
    cr_expect(strstr(msg, path) != NULL, "%s: message does not name the file: %s", cases[i].what,
              msg);
    if (cases[i].tensor)
      cr_expect(strstr(msg, cases[i].tensor) != NULL, "%s: message does not name the tensor: %s",
                cases[i].what, msg);
    cr_expect(strstr(msg, cases[i].msg) != NULL, "%s: message lacks \"%s\": %s", cases[i].what,
              cases[i].msg, msg);
  }
  /* shorter than 8 bytes */
  FILE *fp = fopen(path, "wb");
  fputs("abc", fp);
  fclose(fp);
  weft_safetensors *f;
  cr_expect_eq(weft_safetensors_open(path, &f), WEFT_ERR_CORRUPT);
  cr_expect(strstr(weft_last_error(), "shorter than") != NULL, "%s", weft_last_error());
  /* missing file */
  path_in(path, sizeof path, "absent.safetensors");
  cr_expect_eq(weft_safetensors_open(path, &f), WEFT_ERR_IO);
  cr_expect(strstr(weft_last_error(), "absent.safetensors") != NULL, "%s", weft_last_error());
  /* gaps between tensors are accepted; empty tensors may share offsets */
  path_in(path, sizeof path, "gap.safetensors");
  write_raw(path,
            "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]},"
            "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[5,5]}}   ",
            8, -1);
  cr_assert_eq(weft_safetensors_open(path, &f), WEFT_OK, "%s", weft_last_error());
  uint8_t two[2];
  cr_assert_eq(weft_safetensors_read(f, "a", WEFT_U8, two, 2), WEFT_OK);
  cr_expect(two[0] == 4 && two[1] == 5, "gap read %d %d", two[0], two[1]);
  weft_safetensors_close(f);
}

Test(safetensors, writer_rejects_bad_entries, .init = make_tmpdir, .fini = rm_tmpdir) {
  char path[300];
  path_in(path, sizeof path, "w.safetensors");
  float x[2] = {1, 2};
  const int64_t s[1] = {2}, neg[1] = {-2};
  weft_safetensors_entry dup[2] = {{"a", WEFT_F32, 1, s, x}, {"a", WEFT_F32, 1, s, x}};
  cr_expect_eq(weft_safetensors_write(path, dup, 2, NULL), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "'a' given twice") != NULL, "%s", weft_last_error());
  weft_safetensors_entry bad[] = {
      {"", WEFT_F32, 1, s, x},    {"__metadata__", WEFT_F32, 1, s, x}, {NULL, WEFT_F32, 1, s, x},
      {"n", WEFT_F32, 1, neg, x}, {"d", (weft_dtype)99, 1, s, x},      {"p", WEFT_F32, 1, s, NULL},
      {"k", WEFT_F32, 9, s, x},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_expect_eq(weft_safetensors_write(path, &bad[i], 1, NULL), WEFT_ERR_INVALID, "entry %zu", i);
  const char *meta[] = {"k", NULL};
  cr_expect_eq(weft_safetensors_write(path, dup, 1, meta), WEFT_ERR_INVALID);
  cr_expect_neq(access(path, F_OK), 0, "a failed write must not leave the file");
  char cmd[400];
  snprintf(cmd, sizeof cmd, "test -z \"$(ls '%s')\"", tmpdir);
  cr_expect_eq(system(cmd), 0, "a failed write left files in %s", tmpdir);
  path_in(path, sizeof path, "no/such/dir/x.safetensors");
  cr_expect_eq(weft_safetensors_write(path, dup, 1, NULL), WEFT_ERR_IO);
}

/* The golden files: names and shapes as docs/DESIGN.md, and the f64 gradients'
 * total norm equals expected.json's grad_norm_before_clip (an independent
 * check that F64 data is read right). */
Test(safetensors, reads_golden_files) {
  const char *cfgs[2] = {"tiny_mha", "tiny_gqa"};
  const int64_t kv[2] = {4, 2};
  for (int c = 0; c < 2; c++) {
    char path[512];
    snprintf(path, sizeof path, "%s/golden/%s/init.safetensors", WEFT_TEST_DATA_DIR, cfgs[c]);
    weft_safetensors *f;
    cr_assert_eq(weft_safetensors_open(path, &f), WEFT_OK, "%s", weft_last_error());
    cr_expect_eq(weft_safetensors_count(f), 3 + 9 * 2);
    weft_safetensors_info info;
    cr_assert_eq(weft_safetensors_find(f, "tok_embeddings.weight", &info), WEFT_OK);
    cr_expect(info.dtype == WEFT_F32 && info.ndim == 2 && info.shape[0] == 96 &&
              info.shape[1] == 64);
    cr_assert_eq(weft_safetensors_find(f, "layers.1.attention.wk.weight", &info), WEFT_OK);
    cr_expect(info.shape[0] == kv[c] * 16 && info.shape[1] == 64, "%s wk [%lld, %lld]", cfgs[c],
              (long long)info.shape[0], (long long)info.shape[1]);
    cr_assert_eq(weft_safetensors_find(f, "layers.0.feed_forward.w2.weight", &info), WEFT_OK);
    cr_expect(info.shape[0] == 64 && info.shape[1] == 172);
    /* a rank's rows equal the same rows of the whole tensor */
    float all[96 * 64], rows[10 * 64];
    cr_assert_eq(weft_safetensors_read(f, "tok_embeddings.weight", WEFT_F32, all, 96 * 64),
                 WEFT_OK);
    cr_assert_eq(
        weft_safetensors_read_rows(f, "tok_embeddings.weight", 40, 10, WEFT_F32, rows, 640),
        WEFT_OK);
    cr_expect(memcmp(rows, all + 40 * 64, sizeof rows) == 0);
    /* norm weights are not all ones (golden/README.md) */
    float nw[64];
    cr_assert_eq(weft_safetensors_read(f, "norm.weight", WEFT_F32, nw, 64), WEFT_OK);
    int ones = 0;
    for (int i = 0; i < 64; i++) ones += nw[i] == 1.0f;
    cr_expect(ones < 64);
    weft_safetensors_close(f);

    snprintf(path, sizeof path, "%s/golden/%s/grads.safetensors", WEFT_TEST_DATA_DIR, cfgs[c]);
    cr_assert_eq(weft_safetensors_open(path, &f), WEFT_OK, "%s", weft_last_error());
    double ss = 0;
    for (int64_t i = 0; i < weft_safetensors_count(f); i++) {
      cr_assert_eq(weft_safetensors_get(f, i, &info), WEFT_OK);
      cr_expect_eq(info.dtype, WEFT_F64, "%s", info.name);
      double *g = malloc((size_t)info.numel * sizeof *g);
      cr_assert_eq(weft_safetensors_read(f, info.name, WEFT_F64, g, info.numel), WEFT_OK);
      for (int64_t j = 0; j < info.numel; j++) ss += g[j] * g[j];
      free(g);
    }
    weft_safetensors_close(f);
    snprintf(path, sizeof path, "%s/golden/%s/expected.json", WEFT_TEST_DATA_DIR, cfgs[c]);
    size_t len;
    unsigned char *j = slurp(path, &len);
    const char *p = strstr((const char *)j, "\"grad_norm_before_clip\":");
    cr_assert(p != NULL);
    double want = strtod(p + strlen("\"grad_norm_before_clip\":"), NULL);
    cr_expect(fabs(sqrt(ss) - want) <= 1e-12 * want,
              "%s: norm of golden grads %.17g, expected.json %.17g", cfgs[c], sqrt(ss), want);
    free(j);
  }
}
