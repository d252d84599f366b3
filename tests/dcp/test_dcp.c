/* tests/dcp/test_dcp.c — the dcp suite: in-process tests (CRC32C, the
 * metadata parser's rules, the state dict container, the fuzz corpora,
 * the weft-ckpt tool) and multi-rank cases run in dcp_worker through
 * mpiexec (round trips with resharding onto 1, 2, 4, 2x2 and 2x2x2
 * meshes, models with FSDP + TP, resume, state-dict options, faults,
 * corruption, async save, safetensors read back by PyTorch).
 *
 * The *_on_device variants run the same worker cases, with the same
 * (bitwise) checks, in the worker's device mode (WEFT_TEST_DEVICE=cuda:
 * every mesh on WEFT_CUDA, DCP staging device shards through the host);
 * the cross-device tests save from meshes on one device and load onto
 * meshes of another shape on the other (CUDA -> CPU -> CUDA and back).
 * All of them skip, saying why, where this process sees no CUDA device. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "dcp.h"
#include "harness.h"
#include "safetensors.h"

#define W WORKER("dcp_worker")

static char *mktmp(const char *tag) {
  char *p = malloc(256);
  snprintf(p, 256, "/tmp/weft-dcp-%s-XXXXXX", tag);
  cr_assert_not_null(mkdtemp(p), "mkdtemp");
  return p;
}

static void rmrf(const char *p) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
  cr_assert_eq(system(cmd), 0);
}

static char *join(const char *a, const char *b) {
  size_t n = strlen(a) + strlen(b) + 2;
  char *p = malloc(n);
  cr_assert_not_null(p);
  snprintf(p, n, "%s/%s", a, b);
  return p;
}

/* Set by the *_on_device tests (each runs in its own process): run()
 * and fault() start the worker in its device mode. */
static bool on_device = false;

static int run(int n, const char *c, const char *const *args, int secs) {
  return on_device ? weft_test_mpiexec_on_device(n, W, c, secs, args)
                   : weft_test_mpiexec_args(n, W, c, secs, args);
}

/* Test(dcp, name) and Test(dcp, name_on_device) running body (the same
 * worker cases; the second in the device mode, skipped without a device). */
#define TEST_BOTH(name, secs, body)                \
  Test(dcp, name, .timeout = (secs)) { body(); }   \
  Test(dcp, name##_on_device, .timeout = (secs)) { \
    WEFT_TEST_REQUIRE_CUDA_DEVICE();               \
    on_device = true;                              \
    body();                                        \
  }

/* ------------------------------------------------------------ CRC32C */

Test(dcp, crc32c_matches_standard_vectors_and_software_on_random_buffers) {
  const char *v = "123456789";
  cr_expect_eq(weft_crc32c(0, v, 9), 0xE3069283u, "crc32c(\"123456789\") = %08x",
               weft_crc32c(0, v, 9));
  cr_expect_eq(weft_crc32c_sw(0, v, 9), 0xE3069283u);
  /* RFC 3720 B.4 */
  unsigned char b[32];
  memset(b, 0, 32);
  cr_expect_eq(weft_crc32c(0, b, 32), 0x8A9136AAu);
  memset(b, 0xff, 32);
  cr_expect_eq(weft_crc32c(0, b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
  cr_expect_eq(weft_crc32c(0, b, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++) b[i] = (unsigned char)(31 - i);
  cr_expect_eq(weft_crc32c(0, b, 32), 0x113FDB5Cu);
  cr_expect_eq(weft_crc32c(0, NULL, 0), 0u);
  unsigned long seed = weft_test_seed(12345);
  srand((unsigned)seed);
  size_t cap = 200000;
  unsigned char *buf = malloc(cap);
  for (size_t i = 0; i < cap; i++) buf[i] = (unsigned char)rand();
  for (int k = 0; k < 60; k++) {
    size_t off = (size_t)rand() % 13, n = k < 20 ? (size_t)k : (size_t)rand() % (cap - 16);
    uint32_t hw = weft_crc32c(0, buf + off, n), sw = weft_crc32c_sw(0, buf + off, n);
    cr_expect_eq(hw, sw, "len %zu off %zu: %08x vs %08x (seed %lu)", n, off, hw, sw, seed);
    size_t cut = n ? (size_t)rand() % n : 0;
    uint32_t ch = weft_crc32c(weft_crc32c(0, buf + off, cut), buf + off + cut, n - cut);
    cr_expect_eq(ch, hw, "chained at %zu of %zu (seed %lu)", cut, n, seed);
  }
  /* every implementation this CPU has, at lengths around the folding
   * path's edges (256-byte folds, 512 bytes at least) and chained from a
   * nonzero state */
  const char *impls[] = {"sw", "sse4.2", "vpclmulqdq"};
  int have = 0;
  for (int i = 0; i < 3; i++) {
    uint32_t v9;
    if (!weft_crc32c_impl(impls[i], 0, v, 9, &v9)) continue;
    have++;
    cr_expect_eq(v9, 0xE3069283u, "%s: crc32c(\"123456789\") = %08x", impls[i], v9);
    for (int k = 0; k < 80; k++) {
      static const size_t edge[] = {0,   1,   255, 256, 257,   511,  512,
                                    513, 767, 768, 769, 12288, 12289};
      size_t off = (size_t)rand() % 33;
      size_t n = k < 13   ? edge[k]
                 : k < 40 ? 512 + (size_t)rand() % 2048
                          : (size_t)rand() % (cap - 40);
      uint32_t st = (uint32_t)rand() * 2654435761u, got;
      cr_assert(weft_crc32c_impl(impls[i], st, buf + off, n, &got));
      uint32_t want = weft_crc32c_sw(st, buf + off, n);
      cr_expect_eq(got, want, "%s: len %zu off %zu from %08x: %08x, tables %08x (seed %lu)",
                   impls[i], n, off, st, got, want, seed);
    }
  }
  cr_expect_geq(have, 1);
  uint32_t unused;
  cr_expect_not(weft_crc32c_impl("crc64", 0, v, 9, &unused));
  free(buf);
}

/* ------------------------------------------------------------ metadata */

static const char *META =
    "{\"format\":\"weft-dcp\",\"version\":1,\"id\":\"0123456789abcdef\",\"world_size\":2,"
    "\"block_bytes\":64,\"files\":[{\"name\":\"r00000-0123456789abcdef.data\",\"rank\":0,\"bytes\":"
    "200},"
    "{\"name\":\"r00001-0123456789abcdef.data\",\"rank\":1,\"bytes\":200}],"
    "\"tensors\":{\"w\":{\"dtype\":\"f32\",\"shape\":[4,6],\"layout\":\"(S(0)) on mesh "
    "2\",\"chunks\":["
    "{\"offsets\":[0,0],\"sizes\":[2,6],\"file\":0,\"offset\":64,\"length\":48,\"crc32c\":[1]},"
    "{\"offsets\":[2,0],\"sizes\":[2,6],\"file\":1,\"offset\":64,\"length\":48,\"crc32c\":[2]}]},"
    "\"s\":{\"dtype\":\"f64\",\"shape\":[],\"chunks\":[{\"offsets\":[],\"sizes\":[],\"file\":0,"
    "\"offset\":128,\"length\":8,\"crc32c\":[3]}]},"
    "\"z\":{\"dtype\":\"bf16\",\"shape\":[0,3],\"chunks\":[]}},"
    "\"values\":{\"step\":{\"type\":\"int\",\"value\":\"5\"},\"cfg\":{\"type\":\"json\",\"value\":{"
    "\"a\":[1,2]}}}}";

/* META with the first occurrence of `from` replaced by `to`. */
static char *mutate(const char *from, const char *to) {
  const char *at = strstr(META, from);
  cr_assert_not_null(at, "'%s' not in the base metadata", from);
  size_t n = strlen(META) + strlen(to) + 1;
  char *s = malloc(n);
  size_t k = (size_t)(at - META);
  memcpy(s, META, k);
  strcpy(s + k, to);
  strcat(s, at + strlen(from));
  return s;
}

Test(dcp, metadata_parser_accepts_the_format_and_rejects_each_broken_rule) {
  cr_assert_eq(weft_dcp_metadata_check(META, strlen(META), "m"), WEFT_OK, "%s", weft_last_error());
  struct {
    const char *from, *to;
    weft_status code;
    const char *needle;
  } cases[] = {
      {"\"weft-dcp\"", "\"pytorch\"", WEFT_ERR_CORRUPT, "not weft checkpoint metadata"},
      {"\"version\":1", "\"version\":2", WEFT_ERR_UNSUPPORTED, "newer"},
      {"\"version\":1", "\"version\":0", WEFT_ERR_CORRUPT, "version"},
      {"0123456789abcdef\",\"world", "0123456789abcdeg\",\"world", WEFT_ERR_CORRUPT, "\"id\""},
      {"\"block_bytes\":64", "\"block_bytes\":60", WEFT_ERR_CORRUPT, "block_bytes"},
      {"\"shape\":[4,6]", "\"shape\":[4,7]", WEFT_ERR_CORRUPT, "hole"},
      {"\"shape\":[4,6]", "\"shape\":[3,6]", WEFT_ERR_CORRUPT, "outside"},
      {"\"offsets\":[2,0]", "\"offsets\":[1,0]", WEFT_ERR_CORRUPT, "overlaps"},
      {"\"length\":48", "\"length\":44", WEFT_ERR_CORRUPT, "length 44"},
      {"\"crc32c\":[1]", "\"crc32c\":[1,2]", WEFT_ERR_CORRUPT, "block checksums"},
      {"\"crc32c\":[1]", "\"crc32c\":[4294967296]", WEFT_ERR_CORRUPT, "32-bit"},
      {"\"offset\":64", "\"offset\":190", WEFT_ERR_CORRUPT, "outside the data"},
      {"\"offset\":64", "\"offset\":10", WEFT_ERR_CORRUPT, "outside the data"},
      {"\"file\":1", "\"file\":5", WEFT_ERR_CORRUPT, "\"file\""},
      {"\"file\":1,\"offset\":64", "\"file\":0,\"offset\":100", WEFT_ERR_CORRUPT,
       "overlap a chunk"},
      {"\"dtype\":\"f32\"", "\"dtype\":\"f33\"", WEFT_ERR_CORRUPT, "dtype"},
      {"\"value\":\"5\"", "\"value\":\"5x\"", WEFT_ERR_CORRUPT, "64-bit integer"},
      {"\"type\":\"int\"", "\"type\":\"float\"", WEFT_ERR_CORRUPT, "unknown type"},
      {"\"shape\":[0,3]", "\"shape\":[1,1,1,1,1,1,1,1,1]", WEFT_ERR_CORRUPT, "dims"},
      {"\"name\":\"r00001", "\"name\":\"../r00001", WEFT_ERR_CORRUPT, "plain file name"},
      {"\"rank\":1", "\"rank\":2", WEFT_ERR_CORRUPT, "rank"},
      {"\"offsets\":[0,0]", "\"offsets\":[-1,0]", WEFT_ERR_CORRUPT, "non-negative"},
      {"\"shape\":[],\"chunks\":[",
       "\"shape\":[],\"chunks\":[{\"offsets\":[],\"sizes\":[],\"file\":1,"
       "\"offset\":160,\"length\":8,\"crc32c\":[3]},",
       WEFT_ERR_CORRUPT, "overlaps"},
      {"\"z\":{", "\"w\":{", WEFT_ERR_CORRUPT, "listed twice"},
      {"\"shape\":[0,3]", "\"shape\":[4611686018427387904,3]", WEFT_ERR_CORRUPT, "shape"},
      {"\"shape\":[0,3]", "\"shape\":[4294967296,4294967296]", WEFT_ERR_CORRUPT, "too large"},
      {"{\"format\"", "[{\"format\"", WEFT_ERR_CORRUPT, "JSON"},
      {"\"tensors\":{", "\"tensors\":[", WEFT_ERR_CORRUPT, "JSON"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *s = mutate(cases[i].from, cases[i].to);
    weft_status st = weft_dcp_metadata_check(s, strlen(s), "m");
    cr_expect_eq(st, cases[i].code, "case %zu (%s -> %s): %s: %s", i, cases[i].from, cases[i].to,
                 weft_status_str(st), weft_last_error());
    cr_expect(strstr(weft_last_error(), cases[i].needle) != NULL,
              "case %zu: message lacks '%s': %s", i, cases[i].needle, weft_last_error());
    free(s);
  }
  /* trailing bytes, NUL bytes, truncation at every length */
  char *t = malloc(strlen(META) + 4);
  cr_assert_not_null(t);
  snprintf(t, strlen(META) + 4, "%s x", META);
  cr_expect_eq(weft_dcp_metadata_check(t, strlen(t), "m"), WEFT_ERR_CORRUPT);
  cr_expect(strstr(weft_last_error(), "trailing"));
  strcpy(t, META);
  t[10] = '\0';
  cr_expect_eq(weft_dcp_metadata_check(t, strlen(META), "m"), WEFT_ERR_CORRUPT);
  cr_expect(strstr(weft_last_error(), "NUL"));
  for (size_t n = 0; n < strlen(META); n++)
    cr_expect_neq(weft_dcp_metadata_check(META, n, "m"), WEFT_OK, "truncated to %zu accepted", n);
  free(t);
}

/* META with the checksum member the writer appends (FORMAT.md). */
static char *signed_meta(void) {
  size_t n = strlen(META);
  char *s = malloc(n + 64);
  cr_assert_not_null(s);
  memcpy(s, META, n - 1);
  snprintf(s + n - 1, 64, ",\"checksum\":\"crc32c:%08x\"}", weft_crc32c(0, META, n - 1));
  return s;
}

/* Issue 34: 69 of 200 random single-byte changes of a real metadata.json
 * passed weft-ckpt verify, digits of lr, betas and the layout among them.
 * With the checksum every change of every byte (three new values per byte)
 * is refused but those that only rename the "checksum" key (then no value
 * changed) or touch trailing whitespace. */
Test(dcp, metadata_checksum_refuses_every_single_byte_change_of_a_value) {
  char *s = signed_meta();
  const size_t n = strlen(s);
  cr_assert_eq(weft_dcp_metadata_check(s, n, "m"), WEFT_OK, "%s", weft_last_error());
  const char *key = strstr(s + strlen(META) - 1, "checksum");
  cr_assert_not_null(key);
  const size_t k0 = (size_t)(key - s), k1 = k0 + strlen("checksum");
  int accepted = 0, tried = 0;
  for (size_t i = 0; i < n; i++) {
    const unsigned char was = (unsigned char)s[i];
    const unsigned char to[3] = {was ^ 0x01, was ^ 0x20, (unsigned char)(was + 7)};
    for (int v = 0; v < 3; v++) {
      if (to[v] == was || to[v] == 0) continue;
      s[i] = (char)to[v];
      tried++;
      if (weft_dcp_metadata_check(s, n, "m") == WEFT_OK) {
        accepted++;
        cr_expect(i >= k0 && i < k1, "byte %zu ('%c' -> '%c') changed and accepted: %.40s", i, was,
                  to[v], s + (i > 20 ? i - 20 : 0));
      }
      s[i] = (char)was;
    }
  }
  cr_expect_gt(tried, 2 * (int)n);
  /* a stored sum that does not match, or is not the last member */
  char *t = strdup(s);
  char *d = strstr(t, "crc32c:") + 7;
  *d = *d == '0' ? '1' : '0';
  cr_expect_eq(weft_dcp_metadata_check(t, n, "m"), WEFT_ERR_CORRUPT);
  cr_expect(strstr(weft_last_error(), "checksum mismatch"), "%s", weft_last_error());
  free(t);
  t = mutate("\"format\"", "\"checksum\":\"crc32c:00000000\",\"format\"");
  cr_expect_eq(weft_dcp_metadata_check(t, strlen(t), "m"), WEFT_ERR_CORRUPT);
  cr_expect(strstr(weft_last_error(), "last member"), "%s", weft_last_error());
  free(t);
  free(s);
}

/* ------------------------------------------------------------ state dicts */

Test(dcp, state_dict_holds_tensors_and_exact_values_and_reports_misuse) {
  weft_state_dict *sd;
  cr_assert_eq(weft_state_dict_create(&sd), WEFT_OK);
  int64_t shape[2] = {3, 4};
  weft_tensor *t, *v;
  cr_assert_eq(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 2, shape, &t), WEFT_OK);
  cr_assert_eq(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 2, shape, &v), WEFT_OK);
  weft_tensor_set(t, (int64_t[]){1, 2}, 2.5);
  cr_expect_eq(weft_state_dict_add_tensor(sd, "t", t, WEFT_LOCAL_TAKE), WEFT_OK);
  cr_expect_eq(weft_state_dict_add_tensor(sd, "view", v, WEFT_LOCAL_VIEW), WEFT_OK);
  cr_expect_eq(weft_state_dict_add_tensor(sd, "copy", v, WEFT_LOCAL_COPY), WEFT_OK);
  cr_expect_eq(weft_state_dict_add_tensor(sd, "t", v, WEFT_LOCAL_VIEW), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "already has an entry 't'"), "%s", weft_last_error());
  cr_expect_eq(weft_state_dict_add_tensor(sd, "", v, WEFT_LOCAL_VIEW), WEFT_ERR_INVALID);
  cr_expect_eq(weft_state_dict_add_tensor(sd, NULL, v, WEFT_LOCAL_VIEW), WEFT_ERR_INVALID);
  cr_expect_eq(weft_state_dict_add_tensor(sd, "n", NULL, WEFT_LOCAL_VIEW), WEFT_ERR_INVALID);
  cr_expect_eq(weft_state_dict_add_tensor(NULL, "n", v, WEFT_LOCAL_VIEW), WEFT_ERR_INVALID);
  /* values, exact */
  int64_t big = INT64_MIN + 3;
  cr_expect_eq(weft_state_dict_set_int(sd, "i", big), WEFT_OK);
  cr_expect_eq(weft_state_dict_set_double(sd, "d", 1.0 / 3.0), WEFT_OK);
  cr_expect_eq(weft_state_dict_set_double(sd, "nan", NAN), WEFT_OK);
  cr_expect_eq(weft_state_dict_set_string(sd, "s", "a\"b\\c\n"), WEFT_OK);
  cr_expect_eq(weft_state_dict_set_json(sd, "j", " { \"x\" : [1, true, null] } "), WEFT_OK);
  cr_expect_eq(weft_state_dict_set_json(sd, "bad", "{\"x\": }"), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "not valid JSON"));
  cr_expect_eq(weft_state_dict_set_int(sd, "t", 1), WEFT_ERR_INVALID, "a value over a tensor");
  int64_t i = 0;
  double d = 0;
  const char *s = NULL;
  cr_expect_eq(weft_state_dict_get_int(sd, "i", &i), WEFT_OK);
  cr_expect_eq(i, big);
  cr_expect_eq(weft_state_dict_get_double(sd, "d", &d), WEFT_OK);
  cr_expect_eq(d, 1.0 / 3.0);
  cr_expect_eq(weft_state_dict_get_double(sd, "i", &d), WEFT_OK, "int read as double");
  cr_expect_eq(weft_state_dict_get_double(sd, "nan", &d), WEFT_OK);
  cr_expect(isnan(d));
  cr_expect_eq(weft_state_dict_get_string(sd, "s", &s), WEFT_OK);
  cr_expect_str_eq(s, "a\"b\\c\n");
  cr_expect_eq(weft_state_dict_get_json(sd, "s", &s), WEFT_OK);
  cr_expect_str_eq(s, "\"a\\\"b\\\\c\\n\"");
  cr_expect_eq(weft_state_dict_get_json(sd, "j", &s), WEFT_OK);
  cr_expect_str_eq(s, "{\"x\":[1,true,null]}");
  cr_expect_eq(weft_state_dict_get_int(sd, "s", &i), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "is a string, not an int"), "%s", weft_last_error());
  cr_expect_eq(weft_state_dict_get_int(sd, "nope", &i), WEFT_ERR_NOT_FOUND);
  cr_expect_eq(weft_state_dict_get_int(sd, "t", &i), WEFT_ERR_INVALID);
  cr_expect_eq(weft_state_dict_set_int(sd, "i", 7), WEFT_OK, "replace");
  cr_expect_eq(weft_state_dict_get_int(sd, "i", &i), WEFT_OK);
  cr_expect_eq(i, 7);
  /* order, find, remove, many entries (index growth) */
  weft_sd_entry e;
  cr_expect_eq(weft_state_dict_get(sd, 0, &e), WEFT_OK);
  cr_expect_str_eq(e.name, "t");
  cr_expect_eq(e.kind, WEFT_SD_TENSOR);
  cr_expect_eq(weft_tensor_get(e.tensor, (int64_t[]){1, 2}), 2.5);
  cr_expect_eq(weft_state_dict_find(sd, "copy", &e), WEFT_OK);
  cr_expect_neq(e.tensor, v, "COPY keeps its own tensor");
  cr_expect_eq(weft_state_dict_remove(sd, "view"), WEFT_OK);
  cr_expect_eq(weft_state_dict_find(sd, "view", NULL), WEFT_ERR_NOT_FOUND);
  cr_expect_eq(weft_state_dict_remove(sd, "view"), WEFT_ERR_NOT_FOUND);
  for (int k = 0; k < 1000; k++) {
    char n[32];
    snprintf(n, sizeof n, "k%d", k);
    cr_assert_eq(weft_state_dict_set_int(sd, n, k), WEFT_OK);
  }
  for (int k = 0; k < 1000; k += 97) {
    char n[32];
    snprintf(n, sizeof n, "k%d", k);
    cr_expect_eq(weft_state_dict_get_int(sd, n, &i), WEFT_OK);
    cr_expect_eq(i, k);
  }
  cr_expect_eq(weft_state_dict_count(sd), 1000 + 7);
  /* the model config */
  weft_llama_config c = WEFT_LLAMA_CONFIG_INIT, c2;
  c.dim = 64;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 100;
  c.vocab = 77;
  c.max_seq_len = 9;
  c.norm_eps = 1e-6f;
  c.init_std = 0.013f;
  cr_expect_eq(weft_state_dict_set_llama_config(sd, "cfg", &c), WEFT_OK);
  cr_expect_eq(weft_state_dict_get_llama_config(sd, "cfg", &c2), WEFT_OK);
  cr_expect(c.dim == c2.dim && c.n_layers == c2.n_layers && c.n_heads == c2.n_heads &&
                c.n_kv_heads == c2.n_kv_heads && c.ffn_dim == c2.ffn_dim && c.vocab == c2.vocab &&
                c.max_seq_len == c2.max_seq_len && c.norm_eps == c2.norm_eps &&
                c.rope_theta == c2.rope_theta && c.init_std == c2.init_std,
            "config round trip: eps %g/%g std %g/%g", (double)c.norm_eps, (double)c2.norm_eps,
            (double)c.init_std, (double)c2.init_std);
  cr_expect_eq(weft_state_dict_get_llama_config(sd, "j", &c2), WEFT_ERR_INVALID);
  weft_state_dict_destroy(sd);
  weft_state_dict_destroy(NULL);
  weft_tensor_destroy(v);
  weft_key_list kl = {0, NULL};
  weft_key_list_clear(&kl);
  weft_key_list_clear(NULL);
}

Test(dcp, reader_rejects_missing_and_unusable_directories) {
  weft_dcp_checkpoint *ck = (weft_dcp_checkpoint *)1;
  cr_expect_eq(weft_dcp_open("/nonexistent/weft/ckpt", &ck), WEFT_ERR_NOT_FOUND);
  cr_expect(strstr(weft_last_error(), "does not exist"));
  cr_expect_null(ck);
  char *d = mktmp("reader");
  cr_expect_eq(weft_dcp_open(d, &ck), WEFT_ERR_NOT_FOUND);
  cr_expect(strstr(weft_last_error(), "incomplete"), "%s", weft_last_error());
  char *tmp = join(d, "metadata.json.tmp");
  FILE *f = fopen(tmp, "w");
  fputs("{}", f);
  fclose(f);
  cr_expect_eq(weft_dcp_open(d, &ck), WEFT_ERR_NOT_FOUND);
  cr_expect(strstr(weft_last_error(), "interrupted"), "%s", weft_last_error());
  char *m = join(d, "metadata.json");
  f = fopen(m, "w");
  fputs(META, f);
  fclose(f);
  cr_assert_eq(weft_dcp_open(d, &ck), WEFT_OK, "%s", weft_last_error());
  weft_dcp_info info;
  cr_expect_eq(weft_dcp_get_info(ck, &info), WEFT_OK);
  cr_expect_eq(info.world_size, 2);
  cr_expect_eq(info.num_tensors, 3);
  cr_expect_eq(info.num_values, 2);
  weft_dcp_tensor_info ti;
  cr_expect_eq(weft_dcp_tensor_find(ck, "w", &ti), WEFT_OK);
  cr_expect_eq(ti.num_chunks, 2);
  float buf[24];
  /* no data files: the read fails naming the file and tensor */
  cr_expect_eq(weft_dcp_read(ck, "w", (int64_t[]){0, 0}, (int64_t[]){4, 6}, buf, sizeof buf),
               WEFT_ERR_NOT_FOUND);
  cr_expect(strstr(weft_last_error(), "tensor 'w'") && strstr(weft_last_error(), "is missing"),
            "%s", weft_last_error());
  cr_expect_eq(weft_dcp_read(ck, "w", (int64_t[]){0, 0}, (int64_t[]){5, 6}, buf, sizeof buf),
               WEFT_ERR_INVALID);
  cr_expect_eq(weft_dcp_read(ck, "w", (int64_t[]){0, 0}, (int64_t[]){4, 6}, buf, 8),
               WEFT_ERR_INVALID);
  cr_expect_eq(weft_dcp_read(ck, "zz", NULL, NULL, buf, 8), WEFT_ERR_NOT_FOUND);
  int64_t bad = 0;
  cr_expect_neq(weft_dcp_verify(ck, &bad, NULL, NULL), WEFT_OK);
  cr_expect_eq(bad, 2, "two missing files: %" PRId64, bad);
  weft_dcp_close(ck);
  weft_dcp_close(NULL);
  rmrf(d);
  free(d);
  free(tmp);
  free(m);
}

/* ------------------------------------------------------------ fuzz corpora */

static void replay(const char *sub, bool metadata) {
  char *dir = join(DCP_TEST_SRC_DIR "/fuzz", sub);
  DIR *dp = opendir(dir);
  cr_assert_not_null(dp, "corpus %s", dir);
  struct dirent *de;
  int n = 0, ok = 0;
  char *tmpd = mktmp("corpus");
  while ((de = readdir(dp))) {
    if (de->d_name[0] == '.') continue;
    char *p = join(dir, de->d_name);
    size_t len = 0;
    char *b = weft_test_slurp(p, &len);
    cr_assert_not_null(b, "cannot read %s", p);
    weft_status st;
    if (metadata) {
      st = weft_dcp_metadata_check(b, (size_t)len, de->d_name);
    } else {
      char *q = join(tmpd, "x.safetensors");
      FILE *g = fopen(q, "wb");
      fwrite(b, 1, (size_t)len, g);
      fclose(g);
      weft_safetensors *sf = NULL;
      st = weft_safetensors_open(q, &sf);
      weft_safetensors_close(sf);
      free(q);
    }
    if (strncmp(de->d_name, "ok_", 3) == 0) {
      cr_expect_eq(st, WEFT_OK, "%s: %s", de->d_name, weft_last_error());
      ok++;
    } else if (strncmp(de->d_name, "bad_", 4) == 0) {
      cr_expect_neq(st, WEFT_OK, "%s accepted", de->d_name);
    }
    n++;
    free(b);
    free(p);
  }
  closedir(dp);
  rmrf(tmpd);
  free(tmpd);
  cr_expect(n >= 5 && ok >= 1, "corpus %s: %d files, %d ok_", sub, n, ok);
  free(dir);
}

Test(dcp, fuzz_corpus_metadata_replays_through_the_parser) { replay("corpus_metadata", true); }
Test(dcp, fuzz_corpus_safetensors_replays_through_the_header_parser) {
  replay("corpus_safetensors", false);
}

/* ------------------------------------------------------------ multi-rank */

static void t_roundtrip(void) {
  char *d = mktmp("rt");
  char *p1 = join(d, "plain"), *p2 = join(d, "plain64"), *md = join(d, "model"),
       *ref = join(d, "ref.safetensors");
  const char *sargs[] = {p1, p2, md, ref, NULL};
  cr_assert_eq(run(4, "save_all", sargs, 120), 0, "save on 2x2");
  const char *meshes[] = {"1", "2", "4", "2x2", "2x2x2"};
  const int ranks[] = {1, 2, 4, 4, 8};
  for (int i = 0; i < 5; i++) {
    const char *largs[] = {p1, p2, md, ref, meshes[i], NULL};
    cr_expect_eq(run(ranks[i], "load_all", largs, 200), 0, "load on %s", meshes[i]);
  }
  rmrf(d);
  free(d);
  free(p1);
  free(p2);
  free(md);
  free(ref);
}
TEST_BOTH(roundtrip_save_2x2_reshard_load_on_1_2_4_2x2_2x2x2, 400, t_roundtrip)

static void t_resume(void) {
  char *d = mktmp("resume");
  const char *a[] = {d, NULL};
  cr_expect_eq(run(4, "resume", a, 180), 0);
  rmrf(d);
  free(d);
}
TEST_BOTH(resume_k_steps_save_load_equals_straight_run_bitwise, 200, t_resume)

static void t_sd_opts(void) {
  char *d = mktmp("sdopts");
  const char *a[] = {d, NULL};
  cr_expect_eq(run(4, "sd_opts", a, 180), 0);
  rmrf(d);
  free(d);
}
TEST_BOTH(state_dict_options_full_offload_broadcast_strict, 200, t_sd_opts)

/* Runs fault_save with WEFT_DCP_FAULT=spec into dir (passed in the
 * environment: the harness's env variant takes no arguments). */
static void fault(const char *spec, const char *dir) {
  char env[64], denv[512];
  snprintf(env, sizeof env, "WEFT_DCP_FAULT=%s", spec);
  snprintf(denv, sizeof denv, "DCP_TEST_ARG=%s", dir);
  const char *envs[] = {env, denv, on_device ? "WEFT_TEST_DEVICE=cuda" : NULL, NULL};
  int rc = weft_test_mpiexec_env(2, W, "fault_save", 60, envs);
  cr_expect_neq(rc, 0, "a save with WEFT_DCP_FAULT=%s succeeded", spec);
}

static void t_rank_killed(void) {
  char *d = mktmp("fault");
  char *a = join(d, "A"), *b = join(d, "B"), *c = join(d, "C"), *e = join(d, "D");
  const char *pa[] = {a, b, NULL};
  cr_assert_eq(run(2, "fault_prep", pa, 60), 0);
  fault("1:write", c);  /* rank 1 dies after writing part of its data */
  fault("1:synced", e); /* rank 1 dies after its data is durable, before the exchange */
  fault("0:commit", b); /* rank 0 dies before renaming the new metadata over B's */
  char *btmp = join(b, "metadata.json.tmp");
  cr_expect_eq(access(btmp, F_OK), 0, "the dead commit left no metadata.json.tmp");
  free(btmp);
  const char *pc[] = {a, b, c, e, NULL};
  cr_expect_eq(run(2, "fault_check", pc, 60), 0);
  rmrf(d);
  free(a);
  free(b);
  free(c);
  free(e);
}
TEST_BOTH(rank_killed_mid_save_leaves_previous_checkpoint_and_rejects_the_new_one, 300,
          t_rank_killed)

static void t_corrupt(void) {
  char *d = mktmp("corrupt");
  const char *a[] = {d, NULL};
  cr_expect_eq(run(2, "corrupt", a, 180), 0);
  rmrf(d);
  free(d);
}
TEST_BOTH(corrupt_files_and_metadata_are_clear_errors_on_every_rank, 200, t_corrupt)

static void t_failed_save(void) {
  char *d = mktmp("failedsave");
  const char *a[] = {d, NULL};
  cr_expect_eq(run(2, "failed_save", a, 120), 0);
  rmrf(d);
  free(d);
}
TEST_BOTH(failed_save_removes_its_files_and_keeps_the_previous_checkpoint, 150, t_failed_save)

static void t_async_save(void) {
  char *d = mktmp("async");
  const char *a[] = {d, NULL};
  cr_expect_eq(run(2, "async", a, 180), 0);
  rmrf(d);
  free(d);
}
TEST_BOTH(async_save_stages_then_writes_in_the_background, 200, t_async_save)

/* Across devices (4 ranks): plain DTensors saved on a 2x2 mesh and loaded
 * on a 4-rank mesh of the other device, re-saved there and loaded back on
 * 2x2 (other placements); the model (FSDP 2 x TP 2, model and optimizer
 * state) saved synchronously and asynchronously (the next step overwrites
 * it at once), loaded into FSDP over 4 on the other device, re-saved and
 * loaded back into a fresh 2x2 model: every full tensor bitwise equal to
 * the reference after each hop. The worker sets each mesh's device from
 * its arguments; skipped where this process sees no CUDA device. */
static void xdev(const char *save_dev, const char *load_dev) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  char *d = mktmp("xdev");
  const char *a[] = {d, save_dev, load_dev, NULL};
  cr_expect_eq(run(4, "xdev", a, 110), 0, "save on %s, load on %s", save_dev, load_dev);
  rmrf(d);
  free(d);
}

Test(dcp, reshard_save_on_device_2x2_load_on_cpu_4_and_back_bitwise_incl_async, .timeout = 120) {
  xdev("cuda", "cpu");
}

Test(dcp, reshard_save_on_cpu_2x2_load_on_device_4_and_back_bitwise_incl_async, .timeout = 120) {
  xdev("cpu", "cuda");
}

/* Aliases (a tied parameter's other names) are not entries; each alias
 * names one entry. */
Test(dcp, state_dict_alias_is_no_entry_and_names_one_entry) {
  weft_state_dict *sd = NULL;
  cr_assert_eq(weft_state_dict_create(&sd), WEFT_OK);
  cr_expect_eq(weft_state_dict_add_alias(sd, "lm_head.weight", "transformer.wte.weight"), WEFT_OK);
  cr_expect_eq(weft_state_dict_add_alias(sd, "lm_head.weight", "transformer.wte.weight"), WEFT_OK,
               "the same alias twice: %s", weft_last_error());
  cr_expect_eq(weft_state_dict_add_alias(sd, "lm_head.weight", "other.weight"), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "'lm_head.weight'") &&
                strstr(weft_last_error(), "'transformer.wte.weight'"),
            "%s", weft_last_error());
  cr_expect_eq(weft_state_dict_add_alias(sd, "x", "x"), WEFT_ERR_INVALID);
  cr_expect_eq(weft_state_dict_add_alias(sd, "", "x"), WEFT_ERR_INVALID);
  cr_expect_eq(weft_state_dict_add_alias(NULL, "a", "b"), WEFT_ERR_INVALID);
  cr_expect_eq(weft_state_dict_count(sd), 0);
  cr_expect_eq(weft_state_dict_find(sd, "lm_head.weight", NULL), WEFT_ERR_NOT_FOUND);
  weft_state_dict_destroy(sd);
}

#if defined(DCP_TEST_HAVE_FSDP) && defined(DCP_TEST_HAVE_GPT2)
/* GPT-2 (models/gpt2): the tied lm_head.weight is saved once; a 2-rank
 * FSDP checkpoint and safetensors export load on 1 rank bitwise; files
 * and state dicts holding only the alias load into the tied weight, both
 * names with different values are refused naming both. */
static void t_gpt2_tied(void) {
  char *d = mktmp("gpt2");
  char *ck = join(d, "ck"), *st = join(d, "model.safetensors"), *ref = join(d, "ref.safetensors");
  const char *sa[] = {ck, st, ref, NULL};
  cr_assert_eq(run(2, "gpt2_save", sa, 90), 0, "save on 2 ranks (FSDP)");
  const char *la[] = {ck, st, ref, d, NULL};
  cr_expect_eq(run(1, "gpt2_load", la, 90), 0, "load on 1 rank");
  rmrf(d);
  free(d);
  free(ck);
  free(st);
  free(ref);
}
TEST_BOTH(gpt2_tied_weight_saved_once_fsdp2_to_1_rank_bitwise_alias_accepted, 200, t_gpt2_tied)

/* nanoGPT's two AdamW groups: saved with their hyper-parameters and
 * members, restored over other values, the resumed run bitwise equal to
 * the straight one; optimizers with other groups refused naming the group. */
static void t_gpt2_groups(void) {
  char *d = mktmp("gpt2groups");
  const char *a[] = {d, NULL};
  cr_expect_eq(run(2, "gpt2_groups", a, 180), 0);
  rmrf(d);
  free(d);
}
TEST_BOTH(gpt2_adamw_groups_restore_and_resume_bitwise_mismatched_groups_refused, 200,
          t_gpt2_groups)
#endif

/* ------------------------------------------------------------ PyTorch */

static int sh(const char *cmd) {
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static void t_st_export(void) {
  if (sh("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    cr_skip_test("/usr/bin/python3 cannot import torch: PyTorch cross-check skipped");
    return;
  }
  char *d = mktmp("st");
  const char *a[] = {d, NULL};
  cr_assert_eq(run(2, "st_export", a, 120), 0, "export");
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/check_safetensors.py' '%s'", DCP_TEST_SRC_DIR, d);
  cr_assert_eq(sh(cmd), 0, "%s", cmd);
  char *py = join(d, "py.safetensors"), *pyref = join(d, "py_ref.bin");
  const char *b[] = {py, pyref, NULL};
  cr_expect_eq(run(2, "st_import_py", b, 120), 0, "import of the PyTorch-written file");
  rmrf(d);
  free(d);
  free(py);
  free(pyref);
}
TEST_BOTH(safetensors_export_reads_back_in_pytorch_and_imports_sharded, 300, t_st_export)

/* ------------------------------------------------------------ weft-ckpt */

#ifdef WEFT_CKPT_PATH
/* Runs the tool; returns its exit code and its output (malloc'ed). */
static int tool(const char *args, char **out) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s %s 2>&1", WEFT_CKPT_PATH, args);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t cap = 1 << 16, n = 0;
  char *b = malloc(cap);
  size_t r;
  while ((r = fread(b + n, 1, cap - n - 1, p)) > 0) {
    n += r;
    if (n + 1 == cap) b = realloc(b, cap *= 2);
  }
  b[n] = 0;
  int rc = pclose(p);
  *out = b;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static int lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

static void t_weft_ckpt(void) {
  char *d = mktmp("tool");
  char *ck = join(d, "ck"), *st = join(d, "x.safetensors"), *ck2 = join(d, "ck2"),
       *bad = join(d, "bad");
  const char *a[] = {ck, NULL};
  cr_assert_eq(run(2, "tool_prep", a, 60), 0);
  char args[1024], *out = NULL;
  snprintf(args, sizeof args, "inspect '%s'", ck);
  cr_expect_eq(tool(args, &out), 0, "%s", out);
  cr_expect(strstr(out, "layers.0.attention.wq.weight") && strstr(out, "f32[12, 8]") &&
                strstr(out, "rank 1") && strstr(out, "train.step") && strstr(out, "2 ranks"),
            "inspect output:\n%s", out);
  free(out);
  snprintf(args, sizeof args, "verify '%s'", ck);
  cr_expect_eq(tool(args, &out), 0, "%s", out);
  cr_expect(strstr(out, "OK"), "%s", out);
  free(out);
  snprintf(args, sizeof args, "to-safetensors '%s' '%s'", ck, st);
  cr_expect_eq(tool(args, &out), 0, "%s", out);
  free(out);
  snprintf(args, sizeof args, "from-safetensors '%s' '%s'", st, ck2);
  cr_expect_eq(tool(args, &out), 0, "%s", out);
  free(out);
  /* the three agree tensor by tensor */
  weft_dcp_checkpoint *c1 = NULL, *c2 = NULL;
  weft_safetensors *sf = NULL;
  cr_assert_eq(weft_dcp_open(ck, &c1), WEFT_OK, "%s", weft_last_error());
  cr_assert_eq(weft_dcp_open(ck2, &c2), WEFT_OK, "%s", weft_last_error());
  cr_assert_eq(weft_safetensors_open(st, &sf), WEFT_OK, "%s", weft_last_error());
  weft_dcp_info info;
  weft_dcp_get_info(c1, &info);
  cr_expect_eq(weft_safetensors_count(sf), info.num_tensors);
  for (int64_t i = 0; i < info.num_tensors; i++) {
    weft_dcp_tensor_info ti, t2;
    cr_assert_eq(weft_dcp_tensor_get(c1, i, &ti), WEFT_OK);
    cr_assert_eq(weft_dcp_tensor_find(c2, ti.name, &t2), WEFT_OK, "%s", ti.name);
    size_t nb = weft_dtype_size(ti.dtype);
    int64_t zero[8] = {0};
    for (int k = 0; k < ti.ndim; k++) nb *= (size_t)ti.shape[k];
    char *x = malloc(nb + 1), *y = malloc(nb + 1), *z = malloc(nb + 1);
    cr_expect_eq(weft_dcp_read(c1, ti.name, zero, ti.shape, x, nb), WEFT_OK, "%s",
                 weft_last_error());
    cr_expect_eq(weft_dcp_read(c2, ti.name, zero, ti.shape, y, nb), WEFT_OK, "%s",
                 weft_last_error());
    cr_expect_eq(
        weft_safetensors_read(sf, ti.name, ti.dtype, z, (int64_t)(nb / weft_dtype_size(ti.dtype))),
        WEFT_OK, "%s", weft_last_error());
    cr_expect(memcmp(x, y, nb) == 0 && memcmp(x, z, nb) == 0, "tensor %s differs", ti.name);
    free(x);
    free(y);
    free(z);
  }
  weft_safetensors_close(sf);
  weft_dcp_close(c1);
  weft_dcp_close(c2);
  /* bad input: one line, non-zero exit */
  snprintf(args, sizeof args, "cp -r '%s' '%s'", ck, bad);
  cr_assert_eq(sh(args), 0);
  snprintf(args, sizeof args,
           "sh -c 'f=$(ls %s/*.data | head -1); printf x | dd of=$f bs=1 seek=200 "
           "conv=notrunc 2>/dev/null'",
           bad);
  cr_assert_eq(sh(args), 0);
  snprintf(args, sizeof args, "verify '%s'", bad);
  cr_expect_eq(tool(args, &out), 1, "%s", out);
  cr_expect(strstr(out, "checksum mismatch"), "%s", out);
  free(out);
  const char *bads[] = {"",
                        "frobnicate x",
                        "inspect",
                        "inspect /nonexistent/ckpt",
                        "verify /nonexistent",
                        "to-safetensors /nonexistent /tmp/x.st",
                        "from-safetensors /nonexistent/x.st /tmp/y"};
  for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
    int rc = tool(bads[i], &out);
    cr_expect_neq(rc, 0, "'weft-ckpt %s' exited 0", bads[i]);
    cr_expect(strstr(out, "weft-ckpt") != NULL, "'%s': %s", bads[i], out);
    if (i >= 3) cr_expect_eq(lines(out), 1, "'%s' should print one line:\n%s", bads[i], out);
    free(out);
  }
  rmrf(d);
  free(d);
  free(ck);
  free(st);
  free(ck2);
  free(bad);
}
TEST_BOTH(weft_ckpt_inspects_verifies_and_converts, 200, t_weft_ckpt)
#endif
