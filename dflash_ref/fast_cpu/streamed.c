/* y = x · wᵀ in fp32 for the few rows of decoding, reading w from memory once (fast_cpu/streamed.py).

   x (M, K), w (N, K), y (M, N), all contiguous and row-major. The N rows of w are split evenly among
   the threads; each thread walks its rows in groups of OB = 8. A tile keeps (≤ 2 rows of x) × (8 rows
   of w) sums in 16-lane vector registers while it walks K:
       acc[m][b][lane] = Σ_j x[m, 16j + lane] · w[o + b, 16j + lane]          (K % 16 terms zero-padded)
   and y[m, o + b] = the sum of acc[m][b]'s 16 lanes, taken as a tree (sums16). The first tile of a group
   reads its 8 rows of w from memory (from L2, where the prefetch below brought them); the next rows of x
   read them again from the cache. Eight rows at a time keep eight streams of w in flight, which is what a
   single row (an AR step) needs to approach the memory's bandwidth. While a tile walks k it also asks for
   the same 64 bytes of the thread's next 8 rows of w (a prefetch into L2, every tile of the group), so the
   memory works on the next group while the core sums this one; without it, a group of 4 rows of x left
   the memory idle during its second tile (../../figures/bench/README.md, "Prefetching the next rows"). A
   prefetch changes no number.

   That is the code for a CPU with AVX-512 (32 vector registers of 16 lanes). Compiled for any other (AVX2:
   16 registers of 8 lanes; NEON: 32 of 4), a 2-row tile's 16 accumulators of 16 lanes would not fit in its
   registers, and spilling them made 2 … 8 rows 2–5 times slower (AVX2 code on an AVX-512 CPU); there a tile
   keeps 1 row of x × 8 rows of w in 8-lane vectors (acc[b][lane] = Σ_j x[m, 8j + lane] · w[o + b, 8j + lane],
   the 8 lanes summed as a tree), and the other rows of x are further tiles over the same 8 rows. (With SSE
   alone, 16 registers of 4 lanes, even that spills: slower, never wrong.) Either way a row's sums are the
   same for any number of rows M, and the same product as F.linear's up to the order of its fp32 sums. */
#include <omp.h>
#include <stddef.h>
#include <string.h>

#define OB 8

#if defined(__AVX512F__)
#define PAIRS 1                                        /* tiles of 2 rows of x, then 1 */
typedef float v16 __attribute__((vector_size(64)));   /* one AVX-512 register */

static inline v16 load16(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline v16 load_tail(const float *p, int n) { v16 v = {0}; memcpy(&v, p, (size_t)n * sizeof(float)); return v; }

/* clang's and GCC's names for picking 16 of the 32 lanes of two vectors (GCC < 12 has only its own) */
#if defined(__clang__)
#define PICK(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
typedef int v16i __attribute__((vector_size(64)));
#define PICK(a, b, ...) __builtin_shuffle(a, b, (v16i){__VA_ARGS__})
#endif

/* Halving steps of the 16 lanes of two vectors at once: after step s, each vector holds 2^(4-s) partial
   sums of each of its 2^s accumulators, the accumulators in order. */
static inline v16 halve1(v16 a, v16 b) {   /* a, b (one accumulator each) → 8 lanes of a, then 8 of b */
    return PICK(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
         + PICK(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
}
static inline v16 halve2(v16 a, v16 b) {   /* 2 accumulators × 8 lanes each → 4 accumulators × 4 lanes */
    return PICK(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
         + PICK(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
}
static inline v16 halve3(v16 a, v16 b) {   /* 4 × 4 lanes → 8 × 2 lanes */
    return PICK(a, b, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29)
         + PICK(a, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
}
static inline v16 halve4(v16 a, v16 b) {   /* 8 × 2 lanes → 16 × 1 lane: one sum per accumulator */
    return PICK(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
         + PICK(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

/* The lane sums of 16 accumulators (a zero one where fewer), lane i = Σ lanes of acc[i]. */
static inline v16 sums16(const v16 *acc) {
    v16 l1[8], l2[4], l3[2];
    for (int i = 0; i < 8; i++) l1[i] = halve1(acc[2 * i], acc[2 * i + 1]);
    for (int i = 0; i < 4; i++) l2[i] = halve2(l1[2 * i], l1[2 * i + 1]);
    for (int i = 0; i < 2; i++) l3[i] = halve3(l2[2 * i], l2[2 * i + 1]);
    return halve4(l3[0], l3[1]);
}

#define TILE(MB)                                                                                             \
static void tile_##MB(const float *x, const float *w, float *y, int N, int K, int m0, int o, int nb,       \
                      const float *next, int next_nb) {                                                      \
    v16 acc[16];                                                                                             \
    const float *rows[OB], *ahead[OB];                                                                       \
    for (int b = 0; b < OB; b++) rows[b] = w + (size_t)(o + (b < nb ? b : 0)) * K;                            \
    for (int b = 0; b < OB; b++) ahead[b] = next + (size_t)(b < next_nb ? b : 0) * K;                         \
    for (int i = 0; i < 16; i++) acc[i] = (v16){0};                                                          \
    int k = 0;                                                                                               \
    for (; k + 16 <= K; k += 16) {                                                                           \
        v16 wv[OB];                                                                                          \
        for (int b = 0; b < OB; b++) wv[b] = load16(rows[b] + k);                                            \
        for (int b = 0; b < OB; b++) __builtin_prefetch(ahead[b] + k, 0, 2);                                 \
        for (int m = 0; m < MB; m++) {                                                                       \
            v16 xv = load16(x + (size_t)(m0 + m) * K + k);                                                   \
            for (int b = 0; b < OB; b++) acc[m * OB + b] += xv * wv[b];                                      \
        }                                                                                                    \
    }                                                                                                        \
    if (k < K) {                                                                                             \
        v16 wv[OB];                                                                                          \
        for (int b = 0; b < OB; b++) wv[b] = load_tail(rows[b] + k, K - k);                                  \
        for (int m = 0; m < MB; m++) {                                                                       \
            v16 xv = load_tail(x + (size_t)(m0 + m) * K + k, K - k);                                         \
            for (int b = 0; b < OB; b++) acc[m * OB + b] += xv * wv[b];                                      \
        }                                                                                                    \
    }                                                                                                        \
    v16 s = sums16(acc);                                                                                     \
    for (int m = 0; m < MB; m++) for (int b = 0; b < nb; b++) y[(size_t)(m0 + m) * N + o + b] = s[m * OB + b]; \
}
TILE(1) TILE(2)

#else
#define PAIRS 0                                        /* tiles of 1 row of x */
typedef float v8 __attribute__((vector_size(32)));     /* one AVX2 register, two NEON ones */

static inline v8 load8(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline v8 load_tail8(const float *p, int n) { v8 v = {0}; memcpy(&v, p, (size_t)n * sizeof(float)); return v; }
static inline float sum8(v8 a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

static void tile_1(const float *x, const float *w, float *y, int N, int K, int m, int o, int nb,
                   const float *next, int next_nb) {
    v8 acc[OB];
    const float *rows[OB], *ahead[OB], *xm = x + (size_t)m * K;
    for (int b = 0; b < OB; b++) rows[b] = w + (size_t)(o + (b < nb ? b : 0)) * K;
    for (int b = 0; b < OB; b++) ahead[b] = next + (size_t)(b < next_nb ? b : 0) * K;
    for (int b = 0; b < OB; b++) acc[b] = (v8){0};
    int k = 0;
    for (; k + 16 <= K; k += 16) {                     /* 64 bytes of each row: one prefetch per row */
        const v8 x0 = load8(xm + k), x1 = load8(xm + k + 8);
        for (int b = 0; b < OB; b++) __builtin_prefetch(ahead[b] + k, 0, 2);
        for (int b = 0; b < OB; b++) acc[b] += x0 * load8(rows[b] + k);
        for (int b = 0; b < OB; b++) acc[b] += x1 * load8(rows[b] + k + 8);
    }
    for (; k < K; k += 8) {                            /* the last K % 16 terms, zero-padded */
        const int n = K - k < 8 ? K - k : 8;
        const v8 xv = load_tail8(xm + k, n);
        for (int b = 0; b < OB; b++) acc[b] += xv * load_tail8(rows[b] + k, n);
    }
    for (int b = 0; b < nb; b++) y[(size_t)m * N + o + b] = sum8(acc[b]);
}
#endif

void streamed_product(const float *x, const float *w, float *y, int M, int N, int K, int threads) {
    #pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        const int groups = (N + OB - 1) / OB, per = (groups + T - 1) / T;
        const int g0 = t * per, g1 = g0 + per < groups ? g0 + per : groups;
        for (int g = g0; g < g1; g++) {
            const int o = g * OB, nb = o + OB <= N ? OB : N - o;
            /* the thread's next group of rows of w, to prefetch; after its last group, this group's own
               first row again (a prefetch of what the cache holds, never past the end of w) */
            const int next_nb = g + 1 < g1 ? (o + 2 * OB <= N ? OB : N - o - OB) : 0;
            const float *next = w + (size_t)(o + (next_nb ? OB : 0)) * K;
            int m0 = 0;
#if PAIRS
            for (; m0 + 2 <= M; m0 += 2) tile_2(x, w, y, N, K, m0, o, nb, next, next_nb);
#endif
            for (; m0 < M; m0++) tile_1(x, w, y, N, K, m0, o, nb, next, next_nb);
        }
    }
}
