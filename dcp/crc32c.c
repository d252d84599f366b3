/* dcp/crc32c.c — CRC32C (Castagnoli), reflected polynomial 0x82F63B78
 * (RFC 3720, appendix B.4), with zlib-style pre/post inversion, so
 * crc32c("123456789") = 0xE3069283.
 *
 * Two implementations that give the same values:
 * - slicing-by-8 tables (8 x 256 entries; table k advances a byte by k
 *   further zero bytes), portable;
 * - the SSE4.2 crc32 instruction, three streams interleaved over lanes of
 *   LANE bytes (the instruction has latency 3, throughput 1) and combined
 *   with the linearity of CRCs over GF(2): for raw (uninverted) states,
 *     crc(s, A || B) = shift_|B|(crc(s, A)) ^ crc(0, B),
 *   where shift_n multiplies by x^(8n) mod P. shift_LANE is a fixed linear
 *   map on 32 bits, tabulated as 4 x 256 entries (one per input byte).
 *   (Method as in Mark Adler's crc32c.c and zlib's crc32_combine;
 *   independently written here.)
 */
#include <stdint.h>
#include <string.h>

#include "dcp_internal.h"

#define POLY 0x82F63B78u
#define LANE 4096

static uint32_t tab[8][256];
static uint32_t shift_tab[4][256];
static int hw_ok = -1; /* -1 unknown, 0 no, 1 yes */

/* a * b mod P for reflected polynomials (bit 31 is x^0). */
static uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
  }
  return p;
}

/* x^(8n) mod P. */
static uint32_t xpow8n(uint64_t n) {
  uint32_t r = 1u << 31;  /* x^0 */
  uint32_t sq = 1u << 30; /* x^1 */
  for (uint64_t e = 8 * n; e; e >>= 1) {
    if (e & 1) r = multmodp(sq, r);
    sq = multmodp(sq, sq);
  }
  return r;
}

static void init_tables(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
    tab[0][i] = c;
  }
  for (int k = 1; k < 8; k++)
    for (int i = 0; i < 256; i++) tab[k][i] = (tab[k - 1][i] >> 8) ^ tab[0][tab[k - 1][i] & 0xff];
  uint32_t op = xpow8n(LANE);
  for (int j = 0; j < 4; j++)
    for (uint32_t b = 0; b < 256; b++) shift_tab[j][b] = multmodp(op, b << (8 * j));
}

static void ensure_init(void) {
  /* Idempotent: racing threads compute the same tables; hw_ok is written
   * last, so a thread that sees it set sees finished tables. */
  if (__atomic_load_n(&hw_ok, __ATOMIC_ACQUIRE) >= 0) return;
  init_tables();
  int ok = 0;
#if defined(__x86_64__)
  __builtin_cpu_init();
  ok = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
  __atomic_store_n(&hw_ok, ok, __ATOMIC_RELEASE);
}

/* raw state update, slicing-by-8 */
static uint32_t sw_raw(uint32_t c, const unsigned char *p, size_t n) {
  while (n && ((uintptr_t)p & 7)) {
    c = (c >> 8) ^ tab[0][(c ^ *p++) & 0xff];
    n--;
  }
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    w ^= c;
    c = tab[7][w & 0xff] ^ tab[6][(w >> 8) & 0xff] ^ tab[5][(w >> 16) & 0xff] ^
        tab[4][(w >> 24) & 0xff] ^ tab[3][(w >> 32) & 0xff] ^ tab[2][(w >> 40) & 0xff] ^
        tab[1][(w >> 48) & 0xff] ^ tab[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ tab[0][(c ^ *p++) & 0xff];
  return c;
}

uint32_t weft_crc32c_sw(uint32_t crc, const void *data, size_t len) {
  ensure_init();
  if (!data) return crc;
  return ~sw_raw(~crc, data, len);
}

#if defined(__x86_64__)
#include <nmmintrin.h>

static inline uint32_t shift_lane(uint32_t c) {
  return shift_tab[0][c & 0xff] ^ shift_tab[1][(c >> 8) & 0xff] ^ shift_tab[2][(c >> 16) & 0xff] ^
         shift_tab[3][c >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t hw_raw(uint32_t c, const unsigned char *p,
                                                         size_t n) {
  uint64_t x0 = c;
  while (n && ((uintptr_t)p & 7)) {
    x0 = _mm_crc32_u8((uint32_t)x0, *p++);
    n--;
  }
  while (n >= 3 * LANE) {
    uint64_t x1 = 0, x2 = 0;
    for (size_t i = 0; i < LANE; i += 8) {
      uint64_t a, b, d;
      memcpy(&a, p + i, 8);
      memcpy(&b, p + LANE + i, 8);
      memcpy(&d, p + 2 * LANE + i, 8);
      x0 = _mm_crc32_u64(x0, a);
      x1 = _mm_crc32_u64(x1, b);
      x2 = _mm_crc32_u64(x2, d);
    }
    x0 = shift_lane(shift_lane((uint32_t)x0) ^ (uint32_t)x1) ^ (uint32_t)x2;
    p += 3 * LANE;
    n -= 3 * LANE;
  }
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    x0 = _mm_crc32_u64(x0, v);
    p += 8;
    n -= 8;
  }
  while (n--) x0 = _mm_crc32_u8((uint32_t)x0, *p++);
  return (uint32_t)x0;
}
#endif

uint32_t weft_crc32c(uint32_t crc, const void *data, size_t len) {
  ensure_init();
  if (!data) return crc;
#if defined(__x86_64__)
  if (hw_ok == 1) return ~hw_raw(~crc, data, len);
#endif
  return ~sw_raw(~crc, data, len);
}
