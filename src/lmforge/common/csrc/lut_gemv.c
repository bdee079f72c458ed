/* lmforge's native CPU kernels for packed quantized linear layers (batch-1 decode).
 *
 * Built at first use by lmforge.common.lut_kernel with the system C compiler
 * (cc -O3 -march=native -fopenmp -shared -fPIC) and loaded with ctypes.
 *
 * Weights stay in lmforge's packed layout (quant.pack_codes): row r holds `words` int32 words, code k
 * of a word at bit k*bits, per = 32/bits codes a word, the last word zero-padded. Nothing is repacked.
 *
 * Two layer kinds:
 *   codebook (GANQ):  W[r, j] = T[r, Q[r, j]]                 (T: (out, 16) float, the 2^bits-entry
 *                                                             codebook repeated to 16 entries)
 *   uniform (GPTQ/AWQ/RTN): W[r, j] = s[r, g(j)] * (Q[r, j] - z[r, g(j)])
 *
 * GEMV (AVX-512): the input row x is permuted once per call so that lane i of a 16-lane vector and
 * step k match code k of word i of a 16-word chunk: xp[c*16*per + k*16 + i] = x[(16c+i)*per + k]
 * (zero past in_features). A chunk of 16 words is one 512-bit load; step k shifts it right by
 * k*bits, and _mm512_permutexvar_ps(idx, lut) reads the low 4 bits of each 32-bit lane as a table
 * index, i.e. dequantizes 16 weights in one instruction (the table is repeated to 16 entries, so the
 * neighbouring code's bits above a 1..3-bit code are ignored). A uniform layer uses the shared table
 * (s mod 2^bits) - 2^(bits-1), multiplies each chunk's partial sums by its lanes' group scales, and
 * subtracts s * (z - 2^(bits-1)) * sum_{j in g} x_j per group:
 *   sum_j x_j s_g (q_j - z_g) = sum_g s_g [sum_{j in g} x_j (q_j - c)] - sum_g s_g (z_g - c) X_g.
 * Without AVX-512 the same sums run as plain C loops (compile-time #ifdef).
 *
 * Outliers (codebook): y[t, rows[n]] += x[t, cols[n]] * delta[n] with delta = value - T[r, Q[r, c]]
 * (computed by the caller), as lmforge.common.qlinear._outlier_correction. Bias is added per row.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__)
#include <immintrin.h>
#define LUT_AVX512 1
#else
#define LUT_AVX512 0
#endif

#define LUT_ABI 1
/* Software prefetch distance, in 64-byte chunks ahead of each row's read position: a 4-row block is
 * contiguous, so 128 chunks (8 KiB) reaches a few blocks ahead. Measured on the 2-core AVX-512 EPYC,
 * cold-cache 4096 x 4096 4-bit GEMV, 1 thread: no prefetch 1.31 ms (the hardware prefetcher alone
 * reached a quarter of the DRAM bandwidth), 32 chunks 0.52, 128 0.38, 512 0.42. */
#ifndef LUT_PF
#define LUT_PF 128
#endif
#ifndef LUT_PF_ROWS
#define LUT_PF_ROWS 16
#endif

typedef struct {
    int32_t kind;       /* 0: codebook, 1: uniform */
    int32_t out;
    int32_t in;
    int32_t bits;       /* 1..4 (uniform: any of them with group_size % per == 0) */
    int32_t words;      /* int32 words a row */
    int32_t words_pad;  /* words rounded up to 16 */
    int32_t group_size; /* uniform: columns a group, 0 for one group a row */
    int32_t n_groups;   /* uniform */
    int32_t scale_mode; /* uniform: 0 one group a row, 1 chunk inside one group, 2 groups inside a chunk, 3 gather */
    int32_t n_outliers;
    const int32_t *qweight;       /* (out, words) */
    const float *table;           /* codebook: (out, 16) */
    const float *scales;          /* uniform: (out, n_groups) */
    const float *zeros;           /* uniform: (out, n_groups) */
    const int32_t *group_of_word; /* uniform, mode 3: (words_pad,), clamped to n_groups - 1 */
    const float *bias;            /* (out,) or NULL */
    const int32_t *o_rows;        /* (n_outliers,) */
    const int32_t *o_cols;
    const float *o_delta;
} lut_layer;

int lut_abi(void) { return LUT_ABI; }

/* bit 0: AVX-512 GEMV compiled in; bit 1: OpenMP */
int lut_features(void) {
    int f = LUT_AVX512 ? 1 : 0;
#ifdef _OPENMP
    f |= 2;
#endif
    return f;
}

static inline int per_word(int bits) { return 32 / bits; }

/* Sum of x over each group of a uniform layer (xs: (n_groups,)). */
static void group_sums(const lut_layer *L, const float *x, float *xs) {
    if (L->group_size <= 0) {
        float s = 0.f;
        for (int j = 0; j < L->in; j++) s += x[j];
        xs[0] = s;
        return;
    }
    for (int g = 0; g < L->n_groups; g++) {
        int j0 = g * L->group_size, j1 = j0 + L->group_size;
        if (j1 > L->in) j1 = L->in;
        float s = 0.f;
        for (int j = j0; j < j1; j++) s += x[j];
        xs[g] = s;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Scalar reference loops (no AVX-512). */

static float row_dot_scalar(const lut_layer *L, int r, const float *x, const float *xs) {
    const int bits = L->bits, per = per_word(bits), mask = (1 << bits) - 1;
    const int32_t *q = L->qweight + (size_t)r * L->words;
    double acc = 0.0;
    if (L->kind == 0) {
        const float *t = L->table + (size_t)r * 16;
        float a = 0.f;
        for (int w = 0; w < L->words; w++) {
            uint32_t v = (uint32_t)q[w];
            int j0 = w * per;
            int n = L->in - j0 < per ? L->in - j0 : per;
            for (int k = 0; k < n; k++) a += x[j0 + k] * t[(v >> (k * bits)) & mask];
        }
        acc = a;
    } else {
        const float c = (float)(1 << (bits - 1));
        const float *s = L->scales + (size_t)r * L->n_groups, *z = L->zeros + (size_t)r * L->n_groups;
        float a = 0.f, cur = 0.f;
        int gcur = 0;
        for (int w = 0; w < L->words; w++) {
            uint32_t v = (uint32_t)q[w];
            int j0 = w * per;
            int g = L->group_size > 0 ? j0 / L->group_size : 0;
            if (g != gcur) { a += s[gcur] * cur; cur = 0.f; gcur = g; }
            int n = L->in - j0 < per ? L->in - j0 : per;
            for (int k = 0; k < n; k++) cur += x[j0 + k] * ((float)((v >> (k * bits)) & mask) - c);
        }
        a += s[gcur] * cur;
        for (int g = 0; g < L->n_groups; g++) a -= s[g] * (z[g] - c) * xs[g];
        acc = a;
    }
    return (float)acc;
}

/* ---------------------------------------------------------------------------------------------- */
/* AVX-512 */

#if LUT_AVX512

/* xp (words_pad * per floats): the permuted input of one token (see the header), one masked gather
 * of 16 floats per (chunk, step). */
static void permute_x(const lut_layer *L, const float *x, float *xp) {
    const int per = per_word(L->bits), nch = L->words_pad / 16;
    const __m512i lane = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(per));
    const __m512i n = _mm512_set1_epi32(L->in);
    for (int c = 0; c < nch; c++)
        for (int k = 0; k < per; k++) {
            __m512i idx = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * c * per + k));
            __mmask16 m = _mm512_cmplt_epi32_mask(idx, n);
            _mm512_store_ps(xp + (size_t)c * 16 * per + 16 * k,
                            _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, x, 4));
        }
}

static inline __m512 uniform_table(int bits) {
    float t[16];
    const int m = (1 << bits) - 1, c = 1 << (bits - 1);
    for (int s = 0; s < 16; s++) t[s] = (float)((s & m) - c);
    return _mm512_loadu_ps(t);
}

/* How a uniform row's group scales map onto the 16 lanes of each chunk (fixed per layer). */
typedef struct {
    int G;              /* mode 2: groups a chunk */
    int cpg;            /* mode 1: chunks a group */
    __mmask16 m_full;   /* mode 2: the G lanes to load */
    __mmask16 m_last;   /* mode 2: those that exist in the last chunk */
    __m512i pat;        /* mode 2: lane -> group within the chunk */
} scale_map;

static inline scale_map make_scale_map(const lut_layer *L, int per) {
    scale_map sm;
    memset(&sm, 0, sizeof sm);
    sm.pat = _mm512_setzero_si512();
    const int nch = L->words_pad / 16;
    if (L->scale_mode == 1) sm.cpg = L->group_size / (16 * per);
    if (L->scale_mode == 2) {
        sm.G = 16 * per / L->group_size;
        int lanes = L->group_size / per, left = L->n_groups - (nch - 1) * sm.G;
        int32_t p[16];
        for (int i = 0; i < 16; i++) p[i] = i / lanes;
        sm.pat = _mm512_loadu_si512((const void *)p);
        sm.m_full = (__mmask16)((1u << sm.G) - 1u);
        sm.m_last = (__mmask16)((1u << (left < sm.G ? left : sm.G)) - 1u);
    }
    return sm;
}

/* The 16 lanes' group scales of chunk c of a uniform row (modes 1..3). */
static inline __attribute__((always_inline)) __m512 chunk_scales(const lut_layer *L, const float *srow, int c,
                                                                 int g1, int last, const scale_map *sm,
                                                                 const int MODE) {
    switch (MODE) {
    case 1: /* g1 = c / cpg, kept by the caller as a counter (no division in the loop) */
        return _mm512_set1_ps(srow[g1]);
    case 2:
        return _mm512_permutexvar_ps(sm->pat, _mm512_maskz_loadu_ps(last ? sm->m_last : sm->m_full, srow + c * sm->G));
    default: {
        __m512i gi = _mm512_loadu_si512((const void *)(L->group_of_word + 16 * c));
        return _mm512_i32gather_ps(gi, srow, 4);
    }
    }
}

/* acc - s_g (z_g - c) X_g summed over the groups of one uniform row, lane-wise (one reduction later). */
static inline __attribute__((always_inline)) __m512 sub_zero_term(const lut_layer *L, int r, const float *xs, float c,
                                                                  __m512 acc) {
    const float *s = L->scales + (size_t)r * L->n_groups, *z = L->zeros + (size_t)r * L->n_groups;
    const __m512 cv = _mm512_set1_ps(c);
    int g = 0;
    for (; g + 16 <= L->n_groups; g += 16) {
        __m512 sz = _mm512_mul_ps(_mm512_loadu_ps(s + g), _mm512_sub_ps(_mm512_loadu_ps(z + g), cv));
        acc = _mm512_fnmadd_ps(sz, _mm512_loadu_ps(xs + g), acc);
    }
    if (g < L->n_groups) {
        __mmask16 m = (__mmask16)((1u << (L->n_groups - g)) - 1u);
        __m512 sz = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + g), _mm512_sub_ps(_mm512_maskz_loadu_ps(m, z + g), cv));
        acc = _mm512_fnmadd_ps(sz, _mm512_maskz_loadu_ps(m, xs + g), acc);
    }
    return acc;
}

/* NR rows starting at r for one token; BITS and NR are compile-time constants after inlining. Two
 * accumulators a row (even and odd steps) halve the FMA dependency chains. */
static inline __attribute__((always_inline)) void rows_avx512(const lut_layer *L, int r, const float *xp,
                                                              const float *xs, float *y, const int BITS,
                                                              const int NR, const int MODE, __m512 ulut,
                                                              const scale_map *sm) {
    /* MODE: 0 codebook; uniform 1 + scale_mode (1 one group a row, 2 chunk in a group, 3 groups in a chunk,
     * 4 gather) */
    const int UNIFORM = MODE > 0;
    const int per = 32 / BITS, W = L->words, nch = L->words_pad / 16;
    const __mmask16 tail = (W % 16) ? (__mmask16)((1u << (W % 16)) - 1u) : (__mmask16)0xFFFF;
    const int32_t *q[4];
    __m512 lut[4], acc[4], p0[4], p1[4];
    for (int i = 0; i < NR; i++) {
        q[i] = L->qweight + (size_t)(r + i) * W;
        lut[i] = UNIFORM ? ulut : _mm512_loadu_ps(L->table + (size_t)(r + i) * 16);
        acc[i] = _mm512_setzero_ps();
        p0[i] = _mm512_setzero_ps();
        p1[i] = _mm512_setzero_ps();
    }
    const int chunk_scaled = MODE >= 2;
    int g1 = 0, g1cnt = 0;
    if (UNIFORM) {
        /* prefetch the scales and zeros of the rows LUT_PF_ROWS ahead (the codes are prefetched below) */
        const int ra = r + LUT_PF_ROWS;
        if (ra + NR <= L->out) {
            const char *s0 = (const char *)(L->scales + (size_t)ra * L->n_groups);
            const char *z0 = (const char *)(L->zeros + (size_t)ra * L->n_groups);
            const size_t nb = (size_t)NR * L->n_groups * sizeof(float);
            for (size_t b = 0; b < nb; b += 64) {
                _mm_prefetch(s0 + b, _MM_HINT_T0);
                _mm_prefetch(z0 + b, _MM_HINT_T0);
            }
        }
    }
    for (int c = 0; c < nch; c++) {
        const __mmask16 m = c == nch - 1 ? tail : (__mmask16)0xFFFF;
        __m512i v[4];
        for (int i = 0; i < NR; i++) {
            v[i] = _mm512_maskz_loadu_epi32(m, q[i] + 16 * c);
            /* (a prefetch past the end of the weight never faults) */
            _mm_prefetch((const char *)(q[i] + 16 * (c + LUT_PF)), _MM_HINT_T0);
        }
        const float *xc = xp + (size_t)c * 16 * per;
        for (int k = 0; k < per; k++) {
            const __m512 xk = _mm512_load_ps(xc + 16 * k);
            for (int i = 0; i < NR; i++) {
                __m512 w = _mm512_permutexvar_ps(v[i], lut[i]);
                if (k & 1)
                    p1[i] = _mm512_fmadd_ps(w, xk, p1[i]);
                else
                    p0[i] = _mm512_fmadd_ps(w, xk, p0[i]);
                v[i] = _mm512_srli_epi32(v[i], BITS);
            }
        }
        if (chunk_scaled) {
            for (int i = 0; i < NR; i++) {
                const float *srow = L->scales + (size_t)(r + i) * L->n_groups;
                acc[i] = _mm512_fmadd_ps(_mm512_add_ps(p0[i], p1[i]),
                                         chunk_scales(L, srow, c, g1, c == nch - 1, sm, MODE - 1), acc[i]);
                p0[i] = _mm512_setzero_ps();
                p1[i] = _mm512_setzero_ps();
            }
            if (MODE == 2 && ++g1cnt == sm->cpg) {
                g1cnt = 0;
                g1++;
            }
        }
    }
    for (int i = 0; i < NR; i++) {
        float s;
        if (MODE == 0) {
            s = _mm512_reduce_add_ps(_mm512_add_ps(p0[i], p1[i]));
        } else if (MODE == 1) {
            const float sc = L->scales[r + i], c0 = (float)(1 << (BITS - 1));
            s = sc * (_mm512_reduce_add_ps(_mm512_add_ps(p0[i], p1[i])) - (L->zeros[r + i] - c0) * xs[0]);
        } else {
            s = _mm512_reduce_add_ps(sub_zero_term(L, r + i, xs, (float)(1 << (BITS - 1)), acc[i]));
        }
        if (L->bias) s += L->bias[r + i];
        y[r + i] = s;
    }
}

static inline __attribute__((always_inline)) void block_avx512(const lut_layer *L, int r0, int r1, const float *xp,
                                                               const float *xs, float *y, int B, size_t xp_stride,
                                                               const int BITS, const int MODE) {
    const __m512 ulut = uniform_table(BITS);
    const scale_map sm = make_scale_map(L, 32 / BITS);
    int r = r0;
    for (; r + 4 <= r1; r += 4)
        for (int t = 0; t < B; t++)
            rows_avx512(L, r, xp + t * xp_stride, xs + (size_t)t * L->n_groups, y + (size_t)t * L->out, BITS, 4,
                        MODE, ulut, &sm);
    for (; r < r1; r++)
        for (int t = 0; t < B; t++)
            rows_avx512(L, r, xp + t * xp_stride, xs + (size_t)t * L->n_groups, y + (size_t)t * L->out, BITS, 1,
                        MODE, ulut, &sm);
}

static void block_dispatch(const lut_layer *L, int r0, int r1, const float *xp, const float *xs, float *y, int B,
                           size_t xp_stride) {
#define LUT_CASE(b)                                                                                                  \
    case b:                                                                                                          \
        switch (L->kind == 0 ? 0 : 1 + L->scale_mode) {                                                              \
        case 0: block_avx512(L, r0, r1, xp, xs, y, B, xp_stride, b, 0); break;                                       \
        case 1: block_avx512(L, r0, r1, xp, xs, y, B, xp_stride, b, 1); break;                                       \
        case 2: block_avx512(L, r0, r1, xp, xs, y, B, xp_stride, b, 2); break;                                       \
        case 3: block_avx512(L, r0, r1, xp, xs, y, B, xp_stride, b, 3); break;                                       \
        default: block_avx512(L, r0, r1, xp, xs, y, B, xp_stride, b, 4); break;                                      \
        }                                                                                                            \
        break;
    switch (L->bits) {
        LUT_CASE(1)
        LUT_CASE(2)
        LUT_CASE(3)
        LUT_CASE(4)
    default:
        break;
    }
#undef LUT_CASE
}

#endif /* LUT_AVX512 */

/* ---------------------------------------------------------------------------------------------- */
/* Entry points */

static void add_outliers(const lut_layer *L, const float *x, float *y, int B) {
    for (int t = 0; t < B; t++)
        for (int n = 0; n < L->n_outliers; n++)
            y[(size_t)t * L->out + L->o_rows[n]] += x[(size_t)t * L->in + L->o_cols[n]] * L->o_delta[n];
}

/* Per-thread scratch (the permuted input and group sums), reused across calls up to 1 MiB. */
static __thread float *scratch_buf = NULL;
static __thread size_t scratch_len = 0;
#define SCRATCH_KEEP ((size_t)1 << 18) /* floats */

static float *scratch(size_t n, int *owned) {
    *owned = 0;
    if (n <= scratch_len) return scratch_buf;
    size_t bytes = ((n * sizeof(float) + 63) / 64) * 64;
    float *p = (float *)aligned_alloc(64, bytes);
    if (!p) return NULL;
    if (n > SCRATCH_KEEP) { *owned = 1; return p; }
    free(scratch_buf);
    scratch_buf = p;
    scratch_len = bytes / sizeof(float);
    return p;
}

/* y (B, out) = x (B, in) @ W^T (+ bias); returns 0, or -1 for an unsupported layer / allocation failure. */
int lut_gemv(const lut_layer *L, const float *x, float *y, int B, int nthreads) {
    if (L->bits < 1 || L->bits > 4 || B < 0) return -1;
    if (B == 0) return 0;
    const int ng = L->kind == 1 ? L->n_groups : 0;
#if LUT_AVX512
    const size_t stride = (size_t)L->words_pad * per_word(L->bits); /* a multiple of 16 floats */
#else
    const size_t stride = 0;
#endif
    const size_t xs_len = ((size_t)ng * B + 15) / 16 * 16;
    int owned = 0;
    float *buf = scratch(stride * B + xs_len + 16, &owned);
    if (!buf) return -1;
    float *xp = buf, *xs = ng ? buf + stride * B : NULL;
    for (int t = 0; t < B && ng; t++) group_sums(L, x + (size_t)t * L->in, xs + (size_t)t * ng);
    (void)nthreads;
#if LUT_AVX512
    for (int t = 0; t < B; t++) permute_x(L, x + (size_t)t * L->in, xp + t * stride);
    const int nblk = (L->out + 3) / 4;
    if (nthreads <= 1) {
        block_dispatch(L, 0, L->out, xp, xs, y, B, stride);
    } else {
    /* One contiguous range of 4-row blocks a thread (the per-layer setup runs once a thread). */
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        int tid = 0, nt = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        int b0 = (int)((long)nblk * tid / nt), b1 = (int)((long)nblk * (tid + 1) / nt);
        int r0 = 4 * b0, r1 = 4 * b1 < L->out ? 4 * b1 : L->out;
        if (r0 < r1) block_dispatch(L, r0, r1, xp, xs, y, B, stride);
    }
    }
#else
    (void)xp;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int r = 0; r < L->out; r++)
        for (int t = 0; t < B; t++) {
            float s = row_dot_scalar(L, r, x + (size_t)t * L->in, ng ? xs + (size_t)t * ng : NULL);
            if (L->bias) s += L->bias[r];
            y[(size_t)t * L->out + r] = s;
        }
#endif
    if (L->n_outliers) add_outliers(L, x, y, B);
    if (owned) free(buf);
    return 0;
}

#if LUT_AVX512
/* Natural-order dequantization: 16 consecutive columns j0 = 16m .. 16m+15 a step. Their words and
 * shifts repeat every Lc = lcm(16, per) / 16 steps (1 for 2- and 4-bit, 2 for 1-bit, 5 for 3-bit), so
 * per residue a permutation picks each lane's word out of a 16-word load and a variable shift moves
 * its code to the low bits; the table permute then reads the low 4 bits. */
typedef struct {
    int Lc, WL; /* steps and words a cycle */
    __m512i off[5], sh[5];
    const int32_t *colgrp; /* uniform groups that are not whole 16-column blocks: group of each column */
} dq_plan;

static void dequant_row_avx512(const lut_layer *L, const dq_plan *P, int r, float *dst) {
    const int W = L->words, nb = (L->in + 15) / 16;
    const int32_t *q = L->qweight + (size_t)r * W;
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 lut;
    const float *s = NULL, *z = NULL;
    if (L->kind == 0) {
        lut = _mm512_loadu_ps(L->table + (size_t)r * 16);
    } else {
        lut = _mm512_cvtepi32_ps(_mm512_and_si512(iota, _mm512_set1_epi32((1 << L->bits) - 1)));
        s = L->scales + (size_t)r * L->n_groups;
        z = L->zeros + (size_t)r * L->n_groups;
    }
    int cyc = 0, rr = 0;
    for (int m = 0; m < nb; m++) {
        const int base = cyc * P->WL, left = W - base;
        const __mmask16 lm = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        __m512i v = _mm512_maskz_loadu_epi32(lm, q + base);
        v = _mm512_srlv_epi32(_mm512_permutexvar_epi32(P->off[rr], v), P->sh[rr]);
        __m512 f = _mm512_permutexvar_ps(v, lut);
        const int j0 = 16 * m;
        if (L->kind == 1) {
            __m512 sv, zv;
            if (L->group_size <= 0) {
                sv = _mm512_set1_ps(s[0]);
                zv = _mm512_set1_ps(z[0]);
            } else if (L->group_size % 16 == 0) {
                sv = _mm512_set1_ps(s[j0 / L->group_size]);
                zv = _mm512_set1_ps(z[j0 / L->group_size]);
            } else {
                __m512i gi = _mm512_loadu_si512((const void *)(P->colgrp + j0));
                sv = _mm512_i32gather_ps(gi, s, 4);
                zv = _mm512_i32gather_ps(gi, z, 4);
            }
            f = _mm512_mul_ps(sv, _mm512_sub_ps(f, zv)); /* s * (q - z), as lmforge's dequantize */
        }
        const int n = L->in - j0;
        _mm512_mask_storeu_ps(dst + j0, n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u), f);
        if (++rr == P->Lc) { rr = 0; cyc++; }
    }
}
#endif

/* The float32 weight rows r0..r1 into w ((r1 - r0), in): T[r, Q] or s * (Q - z), the same float32
 * operations as lmforge's dequantize (outliers are not written; the caller adds them). */
int lut_dequant(const lut_layer *L, int r0, int r1, float *w, int nthreads) {
    if (L->bits < 1 || L->bits > 4 || r0 < 0 || r1 > L->out || r0 > r1) return -1;
    const int bits = L->bits, per = per_word(bits);
    const uint32_t mask = (1u << bits) - 1u;
    (void)nthreads;
    (void)mask;
#if LUT_AVX512
    dq_plan P;
    P.Lc = per == 10 ? 5 : per == 32 ? 2 : 1;
    P.WL = 16 * P.Lc / per;
    for (int rr = 0; rr < P.Lc; rr++) {
        int32_t o[16], h[16];
        for (int i = 0; i < 16; i++) {
            int j = 16 * rr + i;
            o[i] = j / per;
            h[i] = (j % per) * bits;
        }
        P.off[rr] = _mm512_loadu_si512((const void *)o);
        P.sh[rr] = _mm512_loadu_si512((const void *)h);
    }
    int32_t *colgrp = NULL;
    if (L->kind == 1 && L->group_size > 0 && L->group_size % 16) {
        int npad = (L->in + 15) / 16 * 16;
        colgrp = (int32_t *)malloc(sizeof(int32_t) * (size_t)npad);
        if (!colgrp) return -1;
        for (int j = 0; j < npad; j++) {
            int g = j / L->group_size;
            colgrp[j] = g < L->n_groups ? g : L->n_groups - 1;
        }
    }
    P.colgrp = colgrp;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int r = r0; r < r1; r++) dequant_row_avx512(L, &P, r, w + (size_t)(r - r0) * L->in);
    free(colgrp);
#else
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int r = r0; r < r1; r++) {
        const int32_t *q = L->qweight + (size_t)r * L->words;
        float *dst = w + (size_t)(r - r0) * L->in;
        if (L->kind == 0) {
            const float *t = L->table + (size_t)r * 16;
            for (int wd = 0; wd < L->words; wd++) {
                uint32_t v = (uint32_t)q[wd];
                int j0 = wd * per, n = L->in - j0 < per ? L->in - j0 : per;
                for (int k = 0; k < n; k++) dst[j0 + k] = t[(v >> (k * bits)) & mask];
            }
        } else {
            const float *s = L->scales + (size_t)r * L->n_groups, *z = L->zeros + (size_t)r * L->n_groups;
            for (int wd = 0; wd < L->words; wd++) {
                uint32_t v = (uint32_t)q[wd];
                int j0 = wd * per, n = L->in - j0 < per ? L->in - j0 : per;
                for (int k = 0; k < n; k++) {
                    int g = L->group_size > 0 ? (j0 + k) / L->group_size : 0;
                    dst[j0 + k] = s[g] * ((float)((v >> (k * bits)) & mask) - z[g]);
                }
            }
        }
    }
#endif
    return 0;
}
