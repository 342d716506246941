/* amx.c — bf16 products on AMX tiles (see amx.h). */
#include "amx.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define KN_HAVE_AMX 1
#endif

static atomic_int amx_off;

void kn_amx_set(int on) {
  atomic_store(&amx_off, !on);
}

#ifdef KN_HAVE_AMX
/* Linux hands a process the tile data state (XFEATURE_XTILEDATA, 18) on
 * request: arch_prctl(ARCH_REQ_XCOMP_PERM). */
enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int amx_usable;

static void probe(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
  const int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
  if (!tile || !bf16) return;
  amx_usable = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int kn_amx_available(void) {
  const char *env = getenv("KILN_AMX");
  if (atomic_load(&amx_off) || (env && strcmp(env, "off") == 0)) return 0;
  pthread_once(&probe_once, probe);
  return amx_usable;
}

/* The 64-byte tile configuration (palette 1). */
typedef struct tile_config {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

#define AMX __attribute__((target("amx-tile,amx-bf16")))

/* The tile instructions as asm that tells the compiler which memory they
 * read and write (GCC 12's intrinsics do not: it drops the stores that
 * fill a configuration or a padded copy before the instruction reads it). */
#define TILE_LOAD(t, base, stride)                                                                 \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t : : "r"(base), "r"((long)(stride)) : "memory")
#define TILE_STORE(t, base, stride)                                                                \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)"                                             \
                   :                                                                               \
                   : "r"(base), "r"((long)(stride))                                                \
                   : "memory")
#define TILE_ZERO(t)     __asm__ volatile("tilezero %%tmm" #t ::)
#define TILE_DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

/* Tiles 0, 1: C's first 16 rows (two 16-column groups); 2, 3: its next r2
 * rows; 4, 5: A's 16 and r2 rows of kt pairs; 6, 7: B's kt pair rows of
 * 16 lanes, a column group each. */
AMX void kn_amx_configure(int kt, int r2) {
  tile_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  const uint8_t rows[8] = {16, 16,          (uint8_t)r2, (uint8_t)r2,
                           16, (uint8_t)r2, (uint8_t)kt, (uint8_t)kt};
  const uint16_t colsb[8] = {64, 64, 64, 64, (uint16_t)(4 * kt), (uint16_t)(4 * kt), 64, 64};
  memcpy(cfg.rows, rows, sizeof rows);
  memcpy(cfg.colsb, colsb, sizeof colsb);
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

AMX void kn_amx_release(void) {
  __asm__ volatile("tilerelease" ::: "memory");
}

/* A row block's C tiles (16 rows, or with nr2 2, 16 + r2; nc2 groups of
 * 16 columns) at c, over kp pairs, the last kp % kt (if any) through
 * zero-padded copies. */
AMX static inline __attribute__((always_inline)) void
block(const int nr2, const int nc2, int r2, int kp, int kt, const uint16_t *a, ptrdiff_t lda,
      const uint32_t *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate) {
  const size_t cs = (size_t)ldc * sizeof(float), as = (size_t)lda * sizeof(uint16_t),
               bs = (size_t)ldb * sizeof(uint32_t);
  if (accumulate) {
    TILE_LOAD(0, c, cs);
    if (nc2 == 2) TILE_LOAD(1, c + 16, cs);
    if (nr2 == 2) TILE_LOAD(2, c + 16 * ldc, cs);
    if (nr2 == 2 && nc2 == 2) TILE_LOAD(3, c + 16 * ldc + 16, cs);
  } else {
    TILE_ZERO(0);
    if (nc2 == 2) TILE_ZERO(1);
    if (nr2 == 2) TILE_ZERO(2);
    if (nr2 == 2 && nc2 == 2) TILE_ZERO(3);
  }
  int k0 = 0;
  for (; k0 + kt <= kp; k0 += kt) {
    TILE_LOAD(4, a + 2 * k0, as);
    if (nr2 == 2) TILE_LOAD(5, a + 16 * lda + 2 * k0, as);
    TILE_LOAD(6, b + (ptrdiff_t)k0 * ldb, bs);
    if (nc2 == 2) TILE_LOAD(7, b + (ptrdiff_t)k0 * ldb + 16, bs);
    TILE_DP(0, 4, 6);
    if (nc2 == 2) TILE_DP(1, 4, 7);
    if (nr2 == 2) TILE_DP(2, 5, 6);
    if (nr2 == 2 && nc2 == 2) TILE_DP(3, 5, 7);
  }
  if (k0 < kp) { /* the last kr pairs, the rest of the tiles zeros */
    const int kr = kp - k0;
    uint32_t ab[32][16], bb[16][32];
    memset(ab, 0, sizeof ab);
    memset(bb, 0, sizeof bb);
    for (int r = 0; r < (nr2 == 2 ? 16 + r2 : 16); r++)
      memcpy(ab[r], a + (ptrdiff_t)r * lda + 2 * k0, (size_t)kr * sizeof(uint32_t));
    for (int k = 0; k < kr; k++)
      memcpy(bb[k], b + (ptrdiff_t)(k0 + k) * ldb, (size_t)nc2 * 16 * sizeof(uint32_t));
    TILE_LOAD(4, ab[0], 64);
    if (nr2 == 2) TILE_LOAD(5, ab[16], 64);
    TILE_LOAD(6, bb, 128);
    if (nc2 == 2) TILE_LOAD(7, &bb[0][16], 128);
    TILE_DP(0, 4, 6);
    if (nc2 == 2) TILE_DP(1, 4, 7);
    if (nr2 == 2) TILE_DP(2, 5, 6);
    if (nr2 == 2 && nc2 == 2) TILE_DP(3, 5, 7);
  }
  TILE_STORE(0, c, cs);
  if (nc2 == 2) TILE_STORE(1, c + 16, cs);
  if (nr2 == 2) TILE_STORE(2, c + 16 * ldc, cs);
  if (nr2 == 2 && nc2 == 2) TILE_STORE(3, c + 16 * ldc + 16, cs);
}

AMX void kn_amx_gemm(int rows, int cols, int kp, int kt, int r2, const uint16_t *a, ptrdiff_t lda,
                     const uint32_t *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate) {
  for (int r0 = 0; r0 < rows;) {
    const uint16_t *ar = a + (ptrdiff_t)r0 * lda;
    float *cr = c + (ptrdiff_t)r0 * ldc;
    const int two = rows - r0 >= 16 + r2; /* else the last 16 rows (r2 16) */
    int c0 = 0;
    for (; c0 + 32 <= cols; c0 += 32) {
      if (two)
        block(2, 2, r2, kp, kt, ar, lda, b + c0, ldb, cr + c0, ldc, accumulate);
      else
        block(1, 2, r2, kp, kt, ar, lda, b + c0, ldb, cr + c0, ldc, accumulate);
    }
    if (c0 < cols) {
      if (two)
        block(2, 1, r2, kp, kt, ar, lda, b + c0, ldb, cr + c0, ldc, accumulate);
      else
        block(1, 1, r2, kp, kt, ar, lda, b + c0, ldb, cr + c0, ldc, accumulate);
    }
    r0 += two ? 16 + r2 : 16;
  }
}

AMX void kn_amx_conv_block(int nc2, const uint16_t *a, ptrdiff_t stride, const ptrdiff_t *at,
                           int nk, int kt, const uint32_t *b, ptrdiff_t ldb, float *c) {
  const size_t as = (size_t)stride * sizeof(uint16_t), bs = (size_t)ldb * sizeof(uint32_t),
               cs = 32 * sizeof(float);
  TILE_ZERO(0);
  TILE_ZERO(2);
  if (nc2 == 2) {
    TILE_ZERO(1);
    TILE_ZERO(3);
  }
  for (int q = 0; q < nk; q++) {
    const uint16_t *aq = a + at[q];
    const uint32_t *bq = b + (ptrdiff_t)q * kt * ldb;
    TILE_LOAD(4, aq, as);
    TILE_LOAD(5, aq + 16 * stride, as);
    TILE_LOAD(6, bq, bs);
    TILE_DP(0, 4, 6);
    TILE_DP(2, 5, 6);
    if (nc2 == 2) {
      TILE_LOAD(7, bq + 16, bs);
      TILE_DP(1, 4, 7);
      TILE_DP(3, 5, 7);
    }
  }
  TILE_STORE(0, c, cs);
  TILE_STORE(2, c + 16 * 32, cs);
  if (nc2 == 2) {
    TILE_STORE(1, c + 16, cs);
    TILE_STORE(3, c + 16 * 32 + 16, cs);
  }
}

#else
int kn_amx_available(void) {
  (void)amx_off;
  return 0;
}

void kn_amx_configure(int kt, int r2) {
  (void)kt, (void)r2;
}

void kn_amx_release(void) {}

void kn_amx_gemm(int rows, int cols, int kp, int kt, int r2, const uint16_t *a, ptrdiff_t lda,
                 const uint32_t *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate) {
  (void)rows, (void)cols, (void)kp, (void)kt, (void)r2, (void)a, (void)lda, (void)b, (void)ldb,
      (void)c, (void)ldc, (void)accumulate;
  abort(); /* callers ask kn_amx_available first */
}

void kn_amx_conv_block(int nc2, const uint16_t *a, ptrdiff_t stride, const ptrdiff_t *at, int nk,
                       int kt, const uint32_t *b, ptrdiff_t ldb, float *c) {
  (void)nc2, (void)a, (void)stride, (void)at, (void)nk, (void)kt, (void)b, (void)ldb, (void)c;
  abort(); /* callers ask kn_amx_available first */
}
#endif
