/* examples/train/data.c — where weft-train's tokens come from and how a
 * batch is cut from them. Three sources: the embedded synthetic language
 * (generated in memory, the default), an llm.c token file (--data, read
 * through models/data/tokens.h) and a text file (--text, one byte a token).
 * Each is split into a training and a held-out range; a batch row is a
 * window of T + 1 tokens (inputs and next-token targets), and each dp rank
 * reads only the rows of its part of the batch. Everything here is local:
 * the caller agrees on failures. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train_internal.h"

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* The embedded synthetic language over tokens [0, V) (V >= 16), a fixed
 * stream (independent of --seed):
 *   - 32 words, word w = 2..5 tokens drawn from [3, V);
 *   - a sentence is 4..9 words where each word is followed by one of 2
 *     successors fixed per word (a sparse Markov chain), then token 0;
 *   - one sentence in four is a counting run instead: token 1, then
 *     a, a+1, ..., a+7 (wrapping within [3, V)), then token 0.
 * Within a word and a run the next token is determined by the context; at
 * word boundaries it is one of two. A model that learns this reaches a
 * held-out accuracy well above the 1/V of chance (and loss far below
 * ln V). */
#define SYN_WORDS 32
typedef struct synth_lang {
  uint16_t words[SYN_WORDS][5];
  int wlen[SYN_WORDS], succ[SYN_WORDS][2];
} synth_lang;

static const uint64_t SYN_SEED = 20240520;

static void synth_words(int64_t V, synth_lang *L) {
  const uint64_t S = SYN_SEED;
  for (int w = 0; w < SYN_WORDS; w++) {
    L->wlen[w] = 2 + (int)(mix64(S * 31 + (uint64_t)w) % 4);
    for (int k = 0; k < L->wlen[w]; k++)
      L->words[w][k] = (uint16_t)(3 + mix64(S * 17 + (uint64_t)(w * 8 + k)) % (uint64_t)(V - 3));
    L->succ[w][0] = (int)(mix64(S * 7 + (uint64_t)w) % SYN_WORDS);
    L->succ[w][1] = (int)(mix64(S * 11 + (uint64_t)w) % SYN_WORDS);
  }
}

static uint16_t *synth_generate(int64_t V, int64_t n) {
  uint16_t *out = malloc(sizeof(uint16_t) * (size_t)n);
  if (!out) return NULL;
  synth_lang L;
  synth_words(V, &L);
  int64_t i = 0;
  uint64_t r = SYN_SEED;
  while (i < n) {
    r = mix64(r);
    if (r % 4 == 0) {
      out[i++] = 1;
      int64_t a = (int64_t)((r >> 8) % (uint64_t)(V - 3));
      for (int k = 0; k < 8 && i < n; k++) out[i++] = (uint16_t)(3 + (a + k) % (V - 3));
    } else {
      int nw = 4 + (int)((r >> 8) % 6);
      int w = (int)((r >> 16) % SYN_WORDS);
      for (int j = 0; j < nw && i < n; j++) {
        for (int k = 0; k < L.wlen[w] && i < n; k++) out[i++] = L.words[w][k];
        r = mix64(r);
        w = L.succ[w][r & 1];
      }
    }
    if (i < n) out[i++] = 0;
  }
  return out;
}

/* Splits one source into train (the first 90%) and held-out (the rest). */
static void split_tail(train_data *d) {
  int64_t n = d->train.hi, cut = n - n / 10;
  d->val = d->train;
  d->train.hi = cut;
  d->val.lo = cut;
}

static int open_bin(const char *path, weft_token_file **f, token_src *s, char *err, size_t cap) {
  if (weft_token_file_open(path, f) != WEFT_OK)
    return train_perr(err, cap, "%s", weft_last_error());
  *s = (token_src){.bin = *f,
                   .text_fd = -1,
                   .lo = 0,
                   .hi = weft_token_file_count(*f),
                   .name = weft_token_file_path(*f)};
  return 0;
}

/* Every token of a bin file below V, checked once when the run opens it
 * (issue 34: an out-of-vocab token was found only when a step sampled its
 * window, and one in --val-data at the first validation, after which the
 * final save was skipped). Rank `part` of `parts` reads its share, in
 * pieces of 2^20 tokens; the shares are in rank order, so the lowest
 * failing rank (whose message the caller's agreement prints) holds the
 * file's first bad token. */
static int scan_bin(const token_src *s, int64_t V, int part, int parts, char *err, size_t cap) {
  if (V >= 65536) return 0; /* uint16 tokens are all < 65536 */
  enum { PIECE = 1 << 20 };
  const int64_t n_all = s->hi - s->lo;
  const int64_t lo = s->lo + n_all * part / parts, hi = s->lo + n_all * (part + 1) / parts;
  int32_t *buf = malloc(sizeof(int32_t) * PIECE);
  if (!buf) return train_perr(err, cap, "out of memory to scan '%s'", s->name);
  int rc = 0;
  for (int64_t at = lo; !rc && at < hi; at += PIECE) {
    const int64_t n = hi - at < PIECE ? hi - at : PIECE;
    if (weft_token_file_read(s->bin, at, n, buf) != WEFT_OK) {
      rc = train_perr(err, cap, "%s", weft_last_error());
      break;
    }
    for (int64_t i = 0; i < n; i++)
      if (buf[i] >= V) {
        rc = train_perr(err, cap,
                        "'%s': token %d at %lld is >= the model's vocab %lld (use --vocab; the "
                        "whole file is checked before step 1)",
                        s->name, buf[i], (long long)(at + i), (long long)V);
        break;
      }
  }
  free(buf);
  return rc;
}

static int open_text(const char *path, train_data *d, char *err, size_t cap) {
  d->text_fd = open(path, O_RDONLY | O_CLOEXEC);
  if (d->text_fd < 0)
    return train_perr(err, cap, "cannot open text file '%s': %s", path, strerror(errno));
  struct stat st;
  if (fstat(d->text_fd, &st) != 0)
    return train_perr(err, cap, "cannot read text file '%s': %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode))
    return train_perr(err, cap, "text file '%s' is not a regular file (%s)", path,
                      S_ISDIR(st.st_mode) ? "a directory" : "a device, pipe or socket");
  d->train = (token_src){.text_fd = d->text_fd, .lo = 0, .hi = (int64_t)st.st_size, .name = path};
  split_tail(d);
  return 0;
}

static int open_synth(int64_t V, train_data *d, char *err, size_t cap) {
  if (V < 16)
    return train_perr(err, cap, "the embedded data needs --vocab >= 16 (model has %lld)",
                      (long long)V);
  int64_t n = (1 << 17) + (1 << 14);
  d->synth = synth_generate(V, n);
  if (!d->synth)
    return train_perr(err, cap, "out of memory for the embedded data (%lld tokens)", (long long)n);
  d->train =
      (token_src){.mem = d->synth, .text_fd = -1, .lo = 0, .hi = 1 << 17, .name = "embedded data"};
  d->val = d->train;
  d->val.lo = 1 << 17;
  d->val.hi = n;
  return 0;
}

int train_data_open(const train_opts *o, int64_t V, int64_t T, int rank, int world, train_data *d,
                    char *err, size_t cap) {
  memset(d, 0, sizeof *d);
  d->text_fd = -1;
  int bad = 0;
  if (o->data) {
    bad = open_bin(o->data, &d->bin[0], &d->train, err, cap);
    if (!bad) bad = scan_bin(&d->train, V, rank, world, err, cap);
    if (!bad && o->val_data) {
      bad = open_bin(o->val_data, &d->bin[1], &d->val, err, cap);
      if (!bad) bad = scan_bin(&d->val, V, rank, world, err, cap);
    } else if (!bad) {
      split_tail(d);
    }
  } else if (o->text) {
    if (V < 256)
      bad = train_perr(err, cap, "--text: byte-level tokens need --vocab >= 256 (model has %lld)",
                       (long long)V);
    else
      bad = open_text(o->text, d, err, cap);
  } else {
    bad = open_synth(V, d, err, cap);
  }
  if (!bad && (d->train.hi - d->train.lo < T + 1 || d->val.hi - d->val.lo < T + 1))
    bad = train_perr(err, cap,
                     "data: the train and held-out splits need at least seq-len + 1 = %lld tokens "
                     "each (have %lld and %lld)",
                     (long long)(T + 1), (long long)(d->train.hi - d->train.lo),
                     (long long)(d->val.hi - d->val.lo));
  return bad;
}

void train_data_close(train_data *d) {
  weft_token_file_close(d->bin[0]);
  weft_token_file_close(d->bin[1]);
  d->bin[0] = d->bin[1] = NULL;
  if (d->text_fd >= 0) close(d->text_fd);
  d->text_fd = -1;
  free(d->synth);
  d->synth = NULL;
}

/* Reads bytes [at, at + n) of a text file as tokens. */
static int read_text(const token_src *s, int64_t at, int64_t n, int32_t *out, char *err,
                     size_t cap) {
  uint8_t buf[8192];
  for (int64_t done = 0; done < n;) {
    int64_t k = n - done < (int64_t)sizeof buf ? n - done : (int64_t)sizeof buf;
    ssize_t got = pread(s->text_fd, buf, (size_t)k, (off_t)(at + done));
    if (got != (ssize_t)k)
      return train_perr(err, cap, "reading '%s' failed at token %lld: %s", s->name,
                        (long long)(at + done),
                        got < 0 ? strerror(errno) : "the file is shorter than when it was opened");
    for (int64_t i = 0; i < k; i++) out[done + i] = (int32_t)buf[i];
    done += k;
  }
  return 0;
}

/* Reads tokens [pos, pos + n) of the split into out; every token < V. */
static int src_read(const token_src *s, int64_t pos, int64_t n, int32_t *out, int64_t V, char *err,
                    size_t cap) {
  int64_t at = s->lo + pos;
  if (s->mem) {
    for (int64_t i = 0; i < n; i++) out[i] = s->mem[at + i];
  } else if (s->bin) {
    if (weft_token_file_read(s->bin, at, n, out) != WEFT_OK)
      return train_perr(err, cap, "%s", weft_last_error());
  } else if (read_text(s, at, n, out, err, cap)) {
    return -1;
  }
  for (int64_t i = 0; i < n; i++)
    if (out[i] >= V)
      return train_perr(err, cap,
                        "'%s': token %d at %lld is >= the model's vocab %lld (use --vocab)",
                        s->name, out[i], (long long)(at + i), (long long)V);
  return 0;
}

/* Row g of training step s is the window at (base_s + g (T + 1)) mod span,
 * with base_s pseudo-random per step; validation batch j takes evenly
 * spaced windows of the held-out split. */
int train_data_batch(const token_src *s, bool train, uint64_t seed, int64_t step, int64_t B,
                     int64_t T, int64_t row0, int64_t rows, int32_t *tok, int32_t *tgt,
                     int32_t *scratch, int64_t V, char *err, size_t cap) {
  int64_t span = s->hi - s->lo - (T + 1);
  for (int64_t r = 0; r < rows; r++) {
    int64_t g = row0 + r, pos;
    if (train) {
      /* consecutive windows from a random start per step: the rows of one
       * step (and so the dp ranks' parts) are disjoint whenever the split
       * holds B * (T + 1) tokens */
      int64_t base = (int64_t)(mix64(seed * 0x100000001b3ULL ^ mix64((uint64_t)step * 1000003ULL)) %
                               (uint64_t)(span + 1));
      pos = (base + g * (T + 1)) % (span + 1);
    } else {
      pos = ((step * B + g) * (T + 1)) % (span + 1);
    }
    if (src_read(s, pos, T + 1, scratch, V, err, cap)) return -1;
    memcpy(tok + r * T, scratch, sizeof(int32_t) * (size_t)T);
    memcpy(tgt + r * T, scratch + 1, sizeof(int32_t) * (size_t)T);
  }
  return 0;
}
