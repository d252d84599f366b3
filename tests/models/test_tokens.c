/* tests/models/test_tokens.c — llm.c token files (models/data/tokens.h):
 * a file written here with seeded random tokens over the whole uint16
 * range reads back exactly (whole, at random ranges, across the reader's
 * 8 KiB chunks, up to the last token), and every bad input is a clear
 * error naming the file: missing, short header, bad magic, bad version, a
 * token count < 1, truncated, trailing bytes, a read past the end, and a
 * file cut short after open. Local: no MPI. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "tokens.h"

/* A temporary path of this process: /tmp/weft-tokens-<pid>-<tag>.bin */
static void tmp_path(char *buf, size_t cap, const char *tag) {
  snprintf(buf, cap, "/tmp/weft-tokens-%ld-%s.bin", (long)getpid(), tag);
}

/* Writes an llm.c header (magic, version, count as given) and then `held`
 * tokens from toks (little-endian uint16), plus `extra` trailing bytes. */
static void write_file(const char *path, int32_t magic, int32_t version, int32_t count,
                       const uint16_t *toks, int64_t held, int extra) {
  FILE *f = fopen(path, "wb");
  cr_assert(f != NULL, "cannot create %s", path);
  uint8_t h[1024] = {0};
  int32_t v[3] = {magic, version, count};
  for (int i = 0; i < 3; i++)
    for (int b = 0; b < 4; b++) h[4 * i + b] = (uint8_t)((uint32_t)v[i] >> (8 * b));
  cr_assert_eq(fwrite(h, 1, sizeof h, f), sizeof h);
  for (int64_t i = 0; i < held; i++) {
    uint8_t t[2] = {(uint8_t)(toks[i] & 0xff), (uint8_t)(toks[i] >> 8)};
    cr_assert_eq(fwrite(t, 1, 2, f), 2u);
  }
  for (int i = 0; i < extra; i++) fputc(0x5a, f);
  cr_assert_eq(fclose(f), 0);
}

/* n seeded random tokens over the whole uint16 range (values >= 32768
 * catch a signed read). */
static uint16_t *random_tokens(int64_t n, uint64_t seed) {
  uint16_t *t = malloc(sizeof *t * (size_t)n);
  cr_assert(t != NULL);
  uint64_t s = weft_test_rng_state(seed);
  for (int64_t i = 0; i < n; i++) t[i] = (uint16_t)weft_test_rng_int(&s, 0, 65535);
  return t;
}

/* A good file of n seeded random tokens at a path tagged `tag`, opened:
 * *toks (the tokens written, caller frees), path (cap 128), the handle. */
static weft_token_file *open_random(const char *tag, int64_t n, unsigned long seed, uint16_t **toks,
                                    char *path) {
  *toks = random_tokens(n, seed);
  tmp_path(path, 128, tag);
  write_file(path, 20240520, 1, (int32_t)n, *toks, n, 0);
  weft_token_file *f = NULL;
  cr_assert_eq(weft_token_file_open(path, &f), WEFT_OK, "%s", weft_last_error());
  return f;
}

/* open fails with `want` and a message holding the path and `needle`; *out
 * stays NULL. */
static void expect_open_error(const char *path, weft_status want, const char *needle) {
  weft_token_file *f = (weft_token_file *)(uintptr_t)1;
  weft_status st = weft_token_file_open(path, &f);
  const char *msg = weft_last_error();
  cr_expect_eq(st, want, "%s: status %d, want %d (%s)", path, st, want, msg);
  cr_expect_null(f, "%s: *out not NULL after a failed open", path);
  cr_expect(strstr(msg, path) != NULL, "message does not name the file: %s", msg);
  cr_expect(strstr(msg, needle) != NULL, "message lacks '%s': %s", needle, msg);
}

Test(models_tokens, round_trip_of_random_tokens_whole_ranges_and_the_end, .timeout = 30) {
  unsigned long seed = weft_test_seed(20240520);
  const int64_t N = 10007; /* > 8 KiB of tokens: reads cross the reader's chunks */
  uint16_t *want = NULL;
  char path[128];
  weft_token_file *f = open_random("good", N, seed, &want, path);
  cr_expect_eq(weft_token_file_count(f), N);
  cr_expect_str_eq(weft_token_file_path(f), path);
  int32_t *got = malloc(sizeof *got * (size_t)N);
  cr_assert(got != NULL);
  /* the whole file */
  cr_assert_eq(weft_token_file_read(f, 0, N, got), WEFT_OK, "%s", weft_last_error());
  int64_t bad = 0, big = 0;
  for (int64_t i = 0; i < N; i++) {
    bad += got[i] != (int32_t)want[i];
    big += want[i] >= 32768;
  }
  cr_expect_eq(bad, 0, "seed %lu: %lld of %lld tokens differ", seed, (long long)bad, (long long)N);
  cr_expect(big > 0, "seed %lu: no token >= 32768 to check unsigned reads", seed);
  /* random ranges, ending anywhere up to the last token */
  uint64_t s = weft_test_rng_state(seed + 1);
  for (int k = 0; k < 200; k++) {
    int64_t first = weft_test_rng_int(&s, 0, N - 1);
    int64_t n = weft_test_rng_int(&s, 0, N - first);
    memset(got, 0xff, sizeof *got * (size_t)N);
    cr_assert_eq(weft_token_file_read(f, first, n, got), WEFT_OK, "[%lld, +%lld): %s",
                 (long long)first, (long long)n, weft_last_error());
    for (int64_t i = 0; i < n; i++)
      if (got[i] != (int32_t)want[first + i])
        cr_assert_fail("seed %lu: token %lld read as %d, written %d", seed, (long long)(first + i),
                       got[i], want[first + i]);
    if (n < N) cr_expect_eq(got[n], -1, "read of %lld tokens wrote past them", (long long)n);
  }
  /* the end: the last tokens, and empty reads at the end */
  cr_expect_eq(weft_token_file_read(f, N - 3, 3, got), WEFT_OK);
  cr_expect(got[0] == want[N - 3] && got[1] == want[N - 2] && got[2] == want[N - 1]);
  cr_expect_eq(weft_token_file_read(f, N, 0, got), WEFT_OK, "%s", weft_last_error());
  cr_expect_eq(weft_token_file_read(f, N, 0, NULL), WEFT_OK, "%s", weft_last_error());
  weft_token_file_close(f);
  free(got);
  free(want);
  unlink(path);
}

Test(models_tokens, reads_past_the_end_or_negative_are_invalid_and_name_the_file, .timeout = 30) {
  const int64_t N = 64;
  uint16_t *t = NULL;
  char path[128];
  weft_token_file *f = open_random("end", N, weft_test_seed(7), &t, path);
  int32_t out[80];
  const int64_t cases[][2] = {{N - 1, 2}, {0, N + 1}, {N, 1}, {N + 1, 0}, {-1, 1}, {0, -1}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    weft_status st = weft_token_file_read(f, cases[k][0], cases[k][1], out);
    const char *msg = weft_last_error();
    cr_expect_eq(st, WEFT_ERR_INVALID, "read(%lld, %lld): status %d (%s)", (long long)cases[k][0],
                 (long long)cases[k][1], st, msg);
    cr_expect(strstr(msg, path) != NULL, "read(%lld, %lld): message does not name the file: %s",
              (long long)cases[k][0], (long long)cases[k][1], msg);
  }
  cr_expect_eq(weft_token_file_read(f, N - 1, 2, out), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "past the end") != NULL, "%s", weft_last_error());
  cr_expect_eq(weft_token_file_read(NULL, 0, 1, out), WEFT_ERR_INVALID);
  cr_expect_eq(weft_token_file_read(f, 0, 1, NULL), WEFT_ERR_INVALID);
  weft_token_file_close(f);
  free(t);
  unlink(path);
}

Test(models_tokens, bad_files_are_clear_errors_naming_the_file, .timeout = 30) {
  const int64_t N = 100;
  uint16_t *t = random_tokens(N, weft_test_seed(11));
  char path[128];
  tmp_path(path, sizeof path, "missing");
  unlink(path);
  expect_open_error(path, WEFT_ERR_IO, "cannot open data file");

  tmp_path(path, sizeof path, "short");
  FILE *f = fopen(path, "wb");
  cr_assert(f != NULL);
  int32_t h[3] = {20240520, 1, 0};
  fwrite(h, sizeof h, 1, f);
  fclose(f);
  expect_open_error(path, WEFT_ERR_CORRUPT, "shorter than the 1024-byte llm.c header");
  unlink(path);

  struct {
    const char *tag;
    int32_t magic, version, count;
    int64_t held;
    int extra;
    const char *needle;
  } cases[] = {
      {"magic", 12345, 1, (int32_t)N, N, 0, "bad magic 12345"},
      {"version", 20240520, 2, (int32_t)N, N, 0, "version 2 (want 1"},
      {"zero", 20240520, 1, 0, 0, 0, "header says 0 tokens"},
      {"negative", 20240520, 1, -5, 0, 0, "header says -5 tokens"},
      {"truncated", 20240520, 1, (int32_t)N, N - 3, 0, "truncated"},
      {"odd", 20240520, 1, (int32_t)N, N - 1, 1, "truncated"},
      {"trailing", 20240520, 1, (int32_t)N, N, 4, "4 bytes after the 100 tokens"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    tmp_path(path, sizeof path, cases[k].tag);
    write_file(path, cases[k].magic, cases[k].version, cases[k].count, t, cases[k].held,
               cases[k].extra);
    expect_open_error(path, WEFT_ERR_CORRUPT, cases[k].needle);
    unlink(path);
  }
  weft_token_file *g = NULL;
  cr_expect_eq(weft_token_file_open(NULL, &g), WEFT_ERR_INVALID);
  cr_expect_eq(weft_token_file_open("", &g), WEFT_ERR_INVALID);
  cr_expect_eq(weft_token_file_open("x", NULL), WEFT_ERR_INVALID);
  cr_expect_eq(weft_token_file_count(NULL), 0);
  cr_expect_str_eq(weft_token_file_path(NULL), "");
  weft_token_file_close(NULL); /* a no-op */
  free(t);
}

Test(models_tokens, a_file_cut_short_after_open_is_an_io_error_on_read, .timeout = 30) {
  /* 5000 tokens, cut to 1000 after open */
  char path[128];
  uint16_t *t = NULL;
  weft_token_file *f = open_random("cut", 5000, weft_test_seed(13), &t, path);
  cr_assert_eq(truncate(path, 1024 + 2 * 1000), 0);
  int32_t *out = malloc(sizeof *out * 5000);
  cr_assert(out != NULL);
  cr_expect_eq(weft_token_file_read(f, 0, 1000, out), WEFT_OK, "%s", weft_last_error());
  for (int64_t i = 0; i < 1000; i++) cr_assert_eq(out[i], (int32_t)t[i]);
  weft_status st = weft_token_file_read(f, 900, 200, out);
  cr_expect_eq(st, WEFT_ERR_IO, "status %d (%s)", st, weft_last_error());
  cr_expect(strstr(weft_last_error(), path) != NULL, "%s", weft_last_error());
  weft_token_file_close(f);
  free(out);
  free(t);
  unlink(path);
}
