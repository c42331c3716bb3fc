// Fast attention forward kernels, appended to kernels.cu by NVRTC (compute/nvrtc.rs) and
// launched by compute/attention.rs, which picks one per call (the naive `k_attn_fwd` of
// kernels.cu stays for dropout, for the backward and for what these do not cover).
//
// Design note: FlashAttention-2's forward. A block owns one (batch, query head, tile of query
// rows); key and value tiles stream through shared memory; the softmax is online (a running
// row max and sum, the output rescaled when the max grows), so the scores never reach global
// memory and no scratch is allocated: the output and the logsumexp are the only writes.
// Scores stay in natural units and are multiplied by log2(e) only after the row max is
// subtracted (exp2 of the difference): a mask of finfo.min (what transformers puts on
// padding) then stays finite, and a row masked everywhere with it comes out uniform, as in
// PyTorch and k_attn_fwd, where folding log2(e) into the scores would overflow it to -inf.
// - k_flash_mma_d64 / _d128 (bf16, f16; head dim 64 or 128): 4 warps, 64 query rows (16 per
//   warp) against 64-key tiles, both products on tensor cores with `mma.sync.m16n8k16` (f32
//   accumulate) from inline PTX, since NVRTC has no mma.h. The probabilities go from the
//   score accumulators straight into the A operand of the second product (the C layout of
//   two n8 tiles is the A layout of one k16 step); K's B operand is read by `ldmatrix` and
//   V's by `ldmatrix.trans` (four 8x8 fragments per instruction, where 32-bit loads of K took
//   four times the instructions). K and V tiles arrive by `cp.async`, double-buffered at head
//   dim 64 (the next tile's copy runs under this one's math); tiles wholly inside the keys
//   and below the causal diagonal skip the per-element mask tests, and a warp whose rows
//   all precede a tile's keys skips that tile's math.
// - k_flash_f32_d64 (f32, head dim 64, sm_80+): the same 4 warps x 16 rows on tensor cores
//   in 3xTF32, as PyTorch's memory-efficient kernel computes f32 (CUTLASS's
//   OpMultiplyAddFastF32, whatever allow_tf32 says): each operand is split into a TF32 big
//   and a TF32 small part and a b taken as small_a big_b + big_a small_b + big_a big_b on
//   `mma.sync.m16n8k8` TF32: within a few f32 ulps of the f32 product, and even at three
//   mmas per product over twice the peak of f32 FMA (TF32 is 7-8x it on A100 and H100).
//   K and V arrive in 32-key tiles, double-buffered by cp.async (a 64-key f32 stage is
//   32 KiB, and two would pass the 48 KiB of static shared memory); the summed index of
//   both products is permuted so that every operand is a 16-byte shared load and the
//   score accumulators are the A operand of P V as they stand.
// - k_attn_rows (every dtype, any strides, head dims up to 256): one block per query row,
//   8 warps splitting the keys and merging their partial softmax at the end: the fallback
//   for head dims or layouts the tiled kernels do not take. Decode steps (one query against
//   the KV cache) go to the tiles where they fit: a 64-row tile with one live row streams
//   the cache 2 to 10 times faster than this kernel (run r).
// Causal masking is top-left (query i sees keys 0..=i), as in k_attn_fwd; a row with every
// key masked gives zeros and a logsumexp of -inf, as k_attn_fwd does.

#define LOG2E_F 1.4426950408889634f

__device__ __forceinline__ float f_ninf() { return __int_as_float(0xff800000); }

// e^(x - mu), where mu is the row max (0 for a row with nothing visible yet, so that
// -inf - -inf never makes a NaN).
__device__ __forceinline__ float exp_from(float x, float mu) { return exp2f((x - mu) * LOG2E_F); }

__device__ __forceinline__ void lse_store(const T& lse, i64 b, i64 h, i64 i, float m, float l) {
    float v = l > 0.f ? m + logf(l) : f_ninf();
    stf(lse, lse.off + b * lse.st[0] + h * lse.st[1] + i * lse.st[2], v);
}

// ---------------------------------------------------------------------------------------
// bf16 / f16 on tensor cores.

#define FM_BM 64
#define FM_BN 64
#define FM_THREADS 128

// Shared-memory address of a generic pointer (what ldmatrix and cp.async take).
__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// 16 bytes global -> shared without passing through registers, to a 32-bit shared address:
// all of them, or `bytes` (0 or 16) and zeros for the rest (0 reads nothing). sm_80+ (the
// tiled kernels are launched on sm_80+ only).
__device__ __forceinline__ void cp_async16_full(u32 dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
#endif
}
__device__ __forceinline__ void cp_async16_zfill(u32 dst, const void* src, int bytes) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
#endif
}
// The same from a generic shared pointer.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
    cp_async16_zfill(smem_u32(dst), src, bytes);
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
// Four 8x8 b16 matrices: lanes 8i..8i+7 give the row addresses of matrix i, and each lane
// gets, of matrix i in register i, elements (lane / 4, 2 * (lane % 4)) and (lane / 4,
// 2 * (lane % 4) + 1) as stored, or with TRANS (2 * (lane % 4), lane / 4) and
// (2 * (lane % 4) + 1, lane / 4).
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, const u16* p) {
#if __CUDA_ARCH__ >= 800
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                     : "r"(smem_u32(p))
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                     : "r"(smem_u32(p))
                     : "memory");
#endif
}

template <bool BF>
__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    if (BF) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
#endif
}

// Two floats as one 32-bit pair of 16-bit values, `lo` in the low half (the lower index).
template <bool BF>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    if (BF) return f2bf2(lo, hi);
    return (u32)f2h(lo) | ((u32)f2h(hi) << 16);
}

// Scale, mask, and the new row max `mn` of a warp's score tiles in the m16n8 C layout
// (both tiled kernels): element x of tile nt is row ri[x >> 1], key k0 + nt * 8 + 2 * t4 +
// (x & 1). Tiles inside the keys and wholly below the diagonal of the warp's rows, without a
// mask (`edge` false), skip the per-element tests.
template <int NT>
__device__ __forceinline__ void scale_mask_max(float (&sc)[NT][4], float (&mn)[2], bool edge, float scale,
                                               const i64* ri, i64 k0, int t4, int causal, const T& mask,
                                               int has_mask, i64 b, i64 h, const AttnShape& s) {
    if (edge) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                i64 i = ri[x >> 1];
                i64 j = k0 + nt * 8 + t4 * 2 + (x & 1);
                float sv = sc[nt][x] * scale;
                if (j >= s.S || (causal && j > i)) {
                    sv = f_ninf();
                } else if (has_mask && i < s.TQ) {
                    sv += ldf(mask, off4(mask, b, h, i, j));
                }
                sc[nt][x] = sv;
                mn[x >> 1] = fmaxf(mn[x >> 1], sv);
            }
        }
    } else {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                float sv = sc[nt][x] * scale;
                sc[nt][x] = sv;
                mn[x >> 1] = fmaxf(mn[x >> 1], sv);
            }
        }
    }
}

// The probabilities e^(s - mu) of those score tiles, in place, and each row's sum into `l`.
template <int NT>
__device__ __forceinline__ void exp_tiles(float (&sc)[NT][4], const float* mu, float* l) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            float p = exp_from(sc[nt][x], mu[x >> 1]);
            sc[nt][x] = p;
            l[x >> 1] += p;
        }
    }
}

// Shared memory: STAGES x (K tile, V tile), each BN rows of D (+8 padding, so that a warp's
// fragment loads and ldmatrix rows hit distinct banks). With two stages the next tile's
// copy (cp.async) runs under this tile's math. The Q tile is staged through the same buffer
// first.
template <int D, int STAGES>
struct FmSmem {
    static constexpr int LD = D + 8;
    static constexpr int TILE = FM_BN * LD;
    static constexpr int ELEMS = STAGES * 2 * TILE;
};

template <int D, int STAGES, bool BF>
__device__ __forceinline__ void flash_mma(u16* sm, const T& q, const T& k, const T& v, const T& mask, int has_mask,
                                          const T& out, const T& lse, int has_lse, float scale, int causal,
                                          const AttnShape& s) {
    constexpr int LD = FmSmem<D, STAGES>::LD;
    constexpr int TILE = FmSmem<D, STAGES>::TILE;
    constexpr int CH = D / 8;  // 16-byte chunks per row
    constexpr int NT = FM_THREADS;
    static_assert(FM_BM * LD <= FmSmem<D, STAGES>::ELEMS, "the Q tile is staged in the K/V buffers");
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const i64 b = blockIdx.z, h = blockIdx.y;
    const i64 q0 = (i64)blockIdx.x * FM_BM;
    const i64 kh = h / (s.HQ / s.HKV);
    const u16* qp = (const u16*)q.p;
    const u16* kp = (const u16*)k.p;
    const u16* vp = (const u16*)v.p;

    for (int c = tid; c < FM_BM * CH; c += NT) {
        int r = c / CH, e = (c % CH) * 8;
        i64 i = q0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (i < s.TQ) val = *(const uint4*)(qp + off4(q, b, h, i, e));
        *(uint4*)(sm + r * LD + e) = val;
    }
    __syncthreads();
    // This warp's 16 query rows as A fragments: rows g and g + 8, columns 2 * t4 (+1, +8, +9).
    const int wr = warp * 16;
    u32 qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const u16* p0 = sm + (wr + g) * LD + kk * 16 + t4 * 2;
        const u16* p1 = p0 + 8 * LD;
        qf[kk][0] = *(const u32*)p0;
        qf[kk][1] = *(const u32*)p1;
        qf[kk][2] = *(const u32*)(p0 + 8);
        qf[kk][3] = *(const u32*)(p1 + 8);
    }
    __syncthreads();

    // Keys k0.. into stage st: rows past S are zero-filled (their scores are masked to -inf,
    // and zeros keep 0 * V finite); their source address is row 0's, never read.
    // This (batch, key head)'s rows; the host checks a unit inner stride. A thread copies
    // the 16-byte chunk e of rows r0, r0 + NT / CH, ...: the addresses are a base plus a row
    // times the row stride, not off4's four products per chunk (registers, at 4 blocks/SM).
    const u16* kb0 = kp + k.off + b * k.st[0] + kh * k.st[1];
    const u16* vb0 = vp + v.off + b * v.st[0] + kh * v.st[1];
    const i64 ks = k.st[2], vs = v.st[2];
    const int r0 = tid / CH, e0 = (tid % CH) * 8;
    auto load = [&](int st, i64 k0) {
        u16* kd = sm + st * 2 * TILE + r0 * LD + e0;
        u16* vd = kd + TILE;
#pragma unroll
        for (int r = 0; r < FM_BN; r += NT / CH) {
            i64 j = k0 + r0 + r;
            bool in = j < s.S;
            i64 jr = in ? j : 0;
            cp_async16(kd + r * LD, kb0 + jr * ks + e0, in ? 16 : 0);
            cp_async16(vd + r * LD, vb0 + jr * vs + e0, in ? 16 : 0);
        }
        cp_async_commit();
    };

    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    // Rows g and g + 8 of the warp: running max and this thread's part of the sum.
    float m[2] = {f_ninf(), f_ninf()}, l[2] = {0.f, 0.f};
    const i64 ri[2] = {q0 + wr + g, q0 + wr + g + 8};
    // ldmatrix row of this lane for the V operand: matrix lane / 8 is (keys +0 or +8) x
    // (dims of n-tile nt or nt + 1).
    const int vrow = ((lane >> 3) & 1) * 8 + (lane & 7), vcol = (lane >> 4) * 8;

    i64 kend = s.S;
    if (causal && q0 + FM_BM < kend) kend = q0 + FM_BM;
    const i64 ntiles = (kend + FM_BN - 1) / FM_BN;
    if (STAGES == 2 && ntiles > 0) load(0, 0);
    for (i64 t = 0; t < ntiles; ++t) {
        const i64 k0 = t * FM_BN;
        const int st = STAGES == 2 ? (int)(t & 1) : 0;
        if (STAGES == 1) {
            load(0, k0);
            cp_async_wait<0>();
        } else if (t + 1 < ntiles) {
            // The other stage was last read in the previous iteration, before its closing
            // barrier.
            load(st ^ 1, k0 + FM_BN);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const u16* Ks = sm + st * 2 * TILE;
        const u16* Vs = Ks + TILE;

        // A warp whose 16 rows all precede the tile's first key has nothing visible in it
        // (causal): it skips the math, not the barriers.
        if (causal && k0 > q0 + wr + 15) {
            __syncthreads();
            continue;
        }
        // S = Q K^T for the warp's 16 rows and the tile's 64 keys. B(k = dim, n = key) is
        // K[key][dim], so ldmatrix of K as stored gives the B fragments: matrix i of lane
        // group i is keys nt*8.. by dims kk*16 + 8i.., i.e. (b0, b1) of steps kk and kk + 1.
        float sc[FM_BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < FM_BN / 8; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
            const u16* kr = Ks + (nt * 8 + (lane & 7)) * LD + (lane >> 3) * 8;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk += 2) {
                u32 b0, b1, b2, b3;
                ldsm_x4<false>(b0, b1, b2, b3, kr + kk * 16);
                mma16816<BF>(sc[nt], qf[kk], b0, b1);
                mma16816<BF>(sc[nt], qf[kk + 1], b2, b3);
            }
        }
        float mn[2] = {m[0], m[1]};
        const bool edge = has_mask || k0 + FM_BN > s.S || (causal && k0 + FM_BN - 1 > q0 + wr);
        scale_mask_max<FM_BN / 8>(sc, mn, edge, scale, ri, k0, t4, causal, mask, has_mask, b, h, s);
        float mu[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            // The four threads of a quad hold the row's 64 columns between them.
            mn[r] = fmaxf(mn[r], __shfl_xor_sync(0xffffffffu, mn[r], 1));
            mn[r] = fmaxf(mn[r], __shfl_xor_sync(0xffffffffu, mn[r], 2));
            // A row with nothing visible yet keeps max -inf; subtract 0 then, not -inf.
            mu[r] = mn[r] == f_ninf() ? 0.f : mn[r];
            float alpha = exp_from(m[r], mu[r]);
            m[r] = mn[r];
            l[r] *= alpha;
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                o[nt][2 * r] *= alpha;
                o[nt][2 * r + 1] *= alpha;
            }
        }
        exp_tiles<FM_BN / 8>(sc, mu, l);
        // O += P V, 16 keys per step: the C fragments of score tiles 2kk and 2kk+1 are the A
        // fragment of the step. B(k = key, n = dim) = V[key][dim], read transposed by
        // ldmatrix: registers 0, 1 are the (keys +0, +8) halves for dims of n-tile nt,
        // registers 2, 3 those for n-tile nt + 1.
#pragma unroll
        for (int kk = 0; kk < FM_BN / 16; ++kk) {
            u32 a[4];
            a[0] = pack2<BF>(sc[2 * kk][0], sc[2 * kk][1]);
            a[1] = pack2<BF>(sc[2 * kk][2], sc[2 * kk][3]);
            a[2] = pack2<BF>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            a[3] = pack2<BF>(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
            for (int nt = 0; nt < D / 8; nt += 2) {
                u32 b0, b1, b2, b3;
                ldsm_x4<true>(b0, b1, b2, b3, Vs + (kk * 16 + vrow) * LD + nt * 8 + vcol);
                mma16816<BF>(o[nt], a, b0, b1);
                mma16816<BF>(o[nt + 1], a, b2, b3);
            }
        }
        __syncthreads();
    }

    u16* op = (u16*)out.p;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        i64 i = ri[r];
        if (i >= s.TQ) continue;
        float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            int e = nt * 8 + t4 * 2;
            *(u32*)(op + off4(out, b, h, i, e)) = pack2<BF>(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
        }
        if (has_lse && t4 == 0) lse_store(lse, b, h, i, m[r], l[r]);
    }
}

// Head dim 64: two stages (36 KiB), at most 128 registers so that 4 blocks (16 warps) share
// an SM: at 168 only 3 fit. 128 query rows in 8 warps per block ran no faster on GPT-2 bf16
// 32x1024 (1.23x slower at 176 registers, even at 128). Head dim 128: one stage (34 KiB; two
// would pass the 48 KiB of static shared memory).
extern "C" __global__ void __launch_bounds__(FM_THREADS, 4) k_flash_mma_d64(T q, T k, T v, T mask, int has_mask, T out,
                                                                      T lse, int has_lse, double scale, int causal,
                                                                      AttnShape s) {
    __shared__ __align__(16) u16 sm[FmSmem<64, 2>::ELEMS];
    if (q.dt == DT_BF16)
        flash_mma<64, 2, true>(sm, q, k, v, mask, has_mask, out, lse, has_lse, (float)scale, causal, s);
    else
        flash_mma<64, 2, false>(sm, q, k, v, mask, has_mask, out, lse, has_lse, (float)scale, causal, s);
}

extern "C" __global__ void __launch_bounds__(FM_THREADS) k_flash_mma_d128(T q, T k, T v, T mask, int has_mask, T out,
                                                                       T lse, int has_lse, double scale, int causal,
                                                                       AttnShape s) {
    __shared__ __align__(16) u16 sm[FmSmem<128, 1>::ELEMS];
    if (q.dt == DT_BF16)
        flash_mma<128, 1, true>(sm, q, k, v, mask, has_mask, out, lse, has_lse, (float)scale, causal, s);
    else
        flash_mma<128, 1, false>(sm, q, k, v, mask, has_mask, out, lse, has_lse, (float)scale, causal, s);
}

// ---------------------------------------------------------------------------------------
// f32 on tensor cores, 3xTF32.

#define FF_D 64
#define FF_BM 64
#define FF_BN 32
#define FF_THREADS 128
// Shared rows of 64 floats padded by 4 (68 = 17 x 16 bytes, so rows stay 16-byte aligned
// for cp.async): row r starts at bank 4 * (17 r mod 8), so each quarter-warp phase of the
// 16-byte fragment loads below (eight lanes: two of K's rows by four column offsets 8t, or
// four of V's rows, 2t or 2t+1, by two column offsets 4g) lands on eight distinct 4-bank
// groups.
#define FF_LD 68
#define FF_TILE (FF_BN * FF_LD)

// x as big + small, two TF32 values (the tensor cores read the top 19 bits of a 32-bit
// register and ignore the other 13, which CUTLASS's split relies on too). big is x rounded
// to nearest (ties away) by integer add-and-mask, so |small| <= 2^-11 |x| and the
// small x small product that 3xTF32 drops is below 2^-22 of |a b|; small = x - big is exact
// and goes in unrounded, the hardware cutting it to 11 bits (error below 2^-21 |x|). Three
// instructions, where `cvt.rna.tf32.f32` is four (a compare, add, select and mask, for Inf
// and NaN) and the split nine with it. An Inf makes small NaN, as in CUTLASS's split (so
// PyTorch's kernel gives NaN there too).
__device__ __forceinline__ void tf32_split(float x, u32& big, u32& small) {
    big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
}

__device__ __forceinline__ void mma1688(float* c, const u32* a, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// c += a b in 3xTF32 (CUTLASS's OpMultiplyAddFastF32, what PyTorch's memory-efficient
// kernel runs for f32): the two small cross terms first, then big x big, all in place into
// the one f32 accumulator as CUTLASS does: three roundings into c per eight products, still
// fewer than the eight of an f32 FMA chain, so a separate accumulator for the cross terms
// would buy nothing measurable.
__device__ __forceinline__ void mma3(float* c, const u32* ab, const u32* as, u32 bb0, u32 bb1, u32 bs0, u32 bs1) {
    mma1688(c, as, bb0, bb1);
    mma1688(c, ab, bs0, bs1);
    mma1688(c, ab, bb0, bb1);
}

// Head dim 64. Fragments (m16n8k8, g = lane / 4, t = lane % 4): A (g | g+8, t | t+4),
// B (k t | t+4, n g), C (g | g+8, 2t | 2t+1). A product's summed index may be permuted at
// will, the same way in A and B, and so may the columns of a product's output, and both
// are, so that every operand comes from 16-byte loads and the scores feed P V unshuffled:
// - Q K^T sums over dims. The lane owns dims 8t..8t+7 and 32+8t..32+8t+7 (flat f = 0..15,
//   dim 32 (f / 8) + 8t + f % 8), and step kk (0..7) takes f = 2kk as k = t and 2kk+1 as
//   k = t+4: Q's rows g and g+8 at those dims are its A operand for the whole kernel, and
//   four 16-byte loads of K's row g give its B operand for all eight steps.
// - P V sums over keys: in step ks (keys 8ks..8ks+7 of the tile) k = t is key 2t and
//   k = t+4 key 2t+1, so the A operand is (c0, c2, c1, c3) of score tile ks, and the B
//   operand is V's rows 2t and 2t+1. Output column n of n-tile nt is dim
//   32 (nt / 4) + 4n + nt % 4: B(n = g) of n-tiles 0..3 and 4..7 is one 16-byte load each
//   (dims 4g.. and 32+4g..), and the lane's C holds dims 8t..8t+7 and 32+8t..32+8t+7.
// The split of K and V into big and small is redone by each warp (shared memory has no room
// for split copies at two stages, and their loads would double); Q's is done once.
// 32-key tiles, double-buffered by cp.async (34 KiB), at most 168 registers, so that 3
// blocks (12 warps) share an SM, the occupancy of PyTorch's kernel.
extern "C" __global__ void __launch_bounds__(FF_THREADS, 3) k_flash_f32_d64(T q, T k, T v, T mask, int has_mask, T out,
                                                                         T lse, int has_lse, double scale, int causal,
                                                                         AttnShape s) {
    __shared__ __align__(16) float sm[2 * 2 * FF_TILE];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const i64 b = blockIdx.z, h = blockIdx.y;
    const i64 q0 = (i64)blockIdx.x * FF_BM;
    const i64 kh = h / (s.HQ / s.HKV);
    const float sc_f = (float)scale;
    const int wr = warp * 16;
    const i64 ri[2] = {q0 + wr + g, q0 + wr + g + 8};

    // Q's A operands, big and small, straight from global memory (each row is read once):
    // float4 c of row r holds flat dims 4c..4c+3, i.e. (a[r], a[r + 2]) of steps 2c, 2c+1.
    u32 qb[FF_D / 8][4], qs[FF_D / 8][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float* p = (const float*)q.p + off4(q, b, h, ri[r] < s.TQ ? ri[r] : 0, 8 * t4);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
            if (ri[r] < s.TQ) x = *(const float4*)(p + (c >> 1) * 32 + (c & 1) * 4);
            tf32_split(x.x, qb[2 * c][r], qs[2 * c][r]);
            tf32_split(x.y, qb[2 * c][r + 2], qs[2 * c][r + 2]);
            tf32_split(x.z, qb[2 * c + 1][r], qs[2 * c + 1][r]);
            tf32_split(x.w, qb[2 * c + 1][r + 2], qs[2 * c + 1][r + 2]);
        }
    }

    // Keys k0.. into stage st: thread copies 16-byte chunk e0 of rows r0, r0 + 8, ... The
    // shared addresses are 32-bit offsets from one base and the global ones a row pointer
    // stepped by the row stride (generic pointers and off4's products took three times the
    // instructions). A tile wholly inside the keys copies without tests; in the last one,
    // rows past S are zero-filled and read nothing (their source is the tensor's base).
    const int r0 = tid / 16, e0 = (tid % 16) * 4;
    const i64 kst = k.st[2], vst = v.st[2];
    const float* kg = (const float*)k.p + k.off + b * k.st[0] + kh * k.st[1] + r0 * kst + e0;
    const float* vg = (const float*)v.p + v.off + b * v.st[0] + kh * v.st[1] + r0 * vst + e0;
    const u32 sd0 = smem_u32(sm) + (u32)(r0 * FF_LD + e0) * 4u;
    auto load = [&](int st, i64 k0) {
        const u32 kd = sd0 + (u32)st * (2 * FF_TILE * 4), vd = kd + FF_TILE * 4;
        const float* kr = kg + k0 * kst;
        const float* vr = vg + k0 * vst;
        if (k0 + FF_BN <= s.S) {
#pragma unroll
            for (int r = 0; r < FF_BN; r += FF_THREADS / 16) {
                cp_async16_full(kd + r * FF_LD * 4, kr + r * kst);
                cp_async16_full(vd + r * FF_LD * 4, vr + r * vst);
            }
        } else {
#pragma unroll
            for (int r = 0; r < FF_BN; r += FF_THREADS / 16) {
                bool in = k0 + r0 + r < s.S;
                cp_async16_zfill(kd + r * FF_LD * 4, in ? kr + r * kst : (const float*)k.p, in ? 16 : 0);
                cp_async16_zfill(vd + r * FF_LD * 4, in ? vr + r * vst : (const float*)v.p, in ? 16 : 0);
            }
        }
        cp_async_commit();
    };

    float o[FF_D / 8][4];
#pragma unroll
    for (int nt = 0; nt < FF_D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    float m[2] = {f_ninf(), f_ninf()}, l[2] = {0.f, 0.f};

    i64 kend = s.S;
    if (causal && q0 + FF_BM < kend) kend = q0 + FF_BM;
    const int ntiles = (int)((kend + FF_BN - 1) / FF_BN);
    if (ntiles > 0) load(0, 0);
    for (int t = 0; t < ntiles; ++t) {
        const i64 k0 = (i64)t * FF_BN;
        const int st = t & 1;
        if (t + 1 < ntiles) {
            // The other stage was last read in the previous iteration, before its closing
            // barrier.
            load(st ^ 1, k0 + FF_BN);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const float* Ks = sm + st * 2 * FF_TILE;
        const float* Vs = Ks + FF_TILE;

        // A warp whose 16 rows all precede the tile's first key (causal), or all lie past TQ
        // (a decode step's tile has one live row), skips the math, not the barriers.
        if ((causal && k0 > q0 + wr + 15) || q0 + wr >= s.TQ) {
            __syncthreads();
            continue;
        }
        // S = Q K^T: float4 c of key row nt*8 + g is B of steps 2c and 2c+1 (flat dims
        // 4c..4c+3); the four score tiles are independent accumulator chains.
        float sc[FF_BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < FF_BN / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
#pragma unroll
            for (int nt = 0; nt < FF_BN / 8; ++nt) {
                float4 x = *(const float4*)(Ks + (nt * 8 + g) * FF_LD + (c >> 1) * 32 + 8 * t4 + (c & 1) * 4);
                u32 bb0, bs0, bb1, bs1;
                tf32_split(x.x, bb0, bs0);
                tf32_split(x.y, bb1, bs1);
                mma3(sc[nt], qb[2 * c], qs[2 * c], bb0, bb1, bs0, bs1);
                tf32_split(x.z, bb0, bs0);
                tf32_split(x.w, bb1, bs1);
                mma3(sc[nt], qb[2 * c + 1], qs[2 * c + 1], bb0, bb1, bs0, bs1);
            }
        }
        float mn[2] = {m[0], m[1]};
        const bool edge = has_mask || k0 + FF_BN > s.S || (causal && k0 + FF_BN - 1 > q0 + wr);
        scale_mask_max<FF_BN / 8>(sc, mn, edge, sc_f, ri, k0, t4, causal, mask, has_mask, b, h, s);
        float mu[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mn[r] = fmaxf(mn[r], __shfl_xor_sync(0xffffffffu, mn[r], 1));
            mn[r] = fmaxf(mn[r], __shfl_xor_sync(0xffffffffu, mn[r], 2));
            mu[r] = mn[r] == f_ninf() ? 0.f : mn[r];
            alpha[r] = exp_from(m[r], mu[r]);
            m[r] = mn[r];
            l[r] *= alpha[r];
        }
        // Once the row maxes settle, a tile often raises none of the warp's 16: alpha is
        // exactly 1 then, and the rescale (a uniform branch) is skipped.
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
            for (int nt = 0; nt < FF_D / 8; ++nt) {
#pragma unroll
                for (int x = 0; x < 4; ++x) o[nt][x] *= alpha[x >> 1];
            }
        }
        exp_tiles<FF_BN / 8>(sc, mu, l);
        // O += P V: step ks's A is (c0, c2, c1, c3) of score tile ks; B of n-tiles 4hv..4hv+3
        // is the float4 at dim 32hv + 4g of V's rows 2t (b0) and 2t+1 (b1).
#pragma unroll
        for (int kstep = 0; kstep < FF_BN / 8; ++kstep) {
            u32 pb[4], ps[4];
            tf32_split(sc[kstep][0], pb[0], ps[0]);
            tf32_split(sc[kstep][2], pb[1], ps[1]);
            tf32_split(sc[kstep][1], pb[2], ps[2]);
            tf32_split(sc[kstep][3], pb[3], ps[3]);
            const float* vr = Vs + (kstep * 8 + 2 * t4) * FF_LD + 4 * g;
#pragma unroll
            for (int hv = 0; hv < 2; ++hv) {
                float4 x0 = *(const float4*)(vr + 32 * hv);
                float4 x1 = *(const float4*)(vr + FF_LD + 32 * hv);
                const float v0[4] = {x0.x, x0.y, x0.z, x0.w}, v1[4] = {x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    u32 bb0, bs0, bb1, bs1;
                    tf32_split(v0[c], bb0, bs0);
                    tf32_split(v1[c], bb1, bs1);
                    mma3(o[4 * hv + c], pb, ps, bb0, bb1, bs0, bs1);
                }
            }
        }
        __syncthreads();
    }

    // o[nt][2r] is row ri[r] at dim d = 32 (nt / 4) + 8t + nt % 4, o[nt][2r+1] at d + 4.
    float* op = (float*)out.p;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        i64 i = ri[r];
        if (i >= s.TQ) continue;
        float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
        const i64 ob = off4(out, b, h, i, 0), oe = out.st[3];
#pragma unroll
        for (int nt = 0; nt < FF_D / 8; ++nt) {
            int d = (nt >> 2) * 32 + 8 * t4 + (nt & 3);
            op[ob + d * oe] = o[nt][2 * r] * inv;
            op[ob + (d + 4) * oe] = o[nt][2 * r + 1] * inv;
        }
        if (has_lse && t4 == 0) lse_store(lse, b, h, i, m[r], l[r]);
    }
}

// ---------------------------------------------------------------------------------------
// One query row per block: decode, and the general fallback.

#define AR_WARPS 8
#define AR_UNROLL 4
#define AR_NC (ATTN_MAXD / 32)

extern "C" __global__ void __launch_bounds__(AR_WARPS * 32) k_attn_rows(T q, T k, T v, T mask, int has_mask, T out,
                                                                       T lse, int has_lse, double scale, int causal,
                                                                       AttnShape s) {
    __shared__ float qs[ATTN_MAXD];
    __shared__ float wm[AR_WARPS], wl[AR_WARPS];
    __shared__ float wacc[AR_WARPS][ATTN_MAXD];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const i64 i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const i64 kh = h / (s.HQ / s.HKV);
    const int D = (int)s.D, DV = (int)s.DV;
    for (int e = tid; e < D; e += AR_WARPS * 32) qs[e] = ldf(q, off4(q, b, h, i, e)) * (float)scale;
    __syncthreads();
    // Lane owns dims lane + 32c: a warp reads a key row in consecutive elements.
    float qr[AR_NC], acc[AR_NC];
#pragma unroll
    for (int c = 0; c < AR_NC; ++c) {
        int e = lane + 32 * c;
        qr[c] = e < D ? qs[e] : 0.f;
        acc[c] = 0.f;
    }
    float m = f_ninf(), l = 0.f;
    i64 jend = s.S;
    if (causal && i + 1 < jend) jend = i + 1;
    for (i64 j0 = (i64)warp * AR_UNROLL; j0 < jend; j0 += AR_WARPS * AR_UNROLL) {
        // The value rows are loaded with the key rows, so that their latency overlaps the
        // score's reduction rather than following it.
        float sc[AR_UNROLL], vv[AR_UNROLL][AR_NC];
#pragma unroll
        for (int u = 0; u < AR_UNROLL; ++u) {
            i64 j = j0 + u;
            float p = 0.f;
#pragma unroll
            for (int c = 0; c < AR_NC; ++c) {
                int e = lane + 32 * c;
                vv[u][c] = j < jend && e < DV ? ldf(v, off4(v, b, kh, j, e)) : 0.f;
                if (j < jend && e < D) p = fmaf(qr[c], ldf(k, off4(k, b, kh, j, e)), p);
            }
            sc[u] = p;
        }
#pragma unroll
        for (int w = 16; w > 0; w >>= 1)
#pragma unroll
            for (int u = 0; u < AR_UNROLL; ++u) sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], w);
        float mn = m;
#pragma unroll
        for (int u = 0; u < AR_UNROLL; ++u) {
            i64 j = j0 + u;
            if (j >= jend)
                sc[u] = f_ninf();
            else if (has_mask)
                sc[u] += ldf(mask, off4(mask, b, h, i, j));
            mn = fmaxf(mn, sc[u]);
        }
        float mu = mn == f_ninf() ? 0.f : mn;
        float alpha = exp_from(m, mu);
        m = mn;
        l *= alpha;
#pragma unroll
        for (int c = 0; c < AR_NC; ++c) acc[c] *= alpha;
#pragma unroll
        for (int u = 0; u < AR_UNROLL; ++u) {
            float p = exp_from(sc[u], mu);
            l += p;
            // Skipped at weight 0, as k_attn_fwd does, so that a masked cache slot holding
            // NaN cannot leak in; p is the same in every lane (the score was all-reduced).
            if (p != 0.f) {
#pragma unroll
                for (int c = 0; c < AR_NC; ++c) acc[c] = fmaf(p, vv[u][c], acc[c]);
            }
        }
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int c = 0; c < AR_NC; ++c) {
        int e = lane + 32 * c;
        if (e < DV) wacc[warp][e] = acc[c];
    }
    __syncthreads();
    float M = f_ninf();
    for (int w = 0; w < AR_WARPS; ++w) M = fmaxf(M, wm[w]);
    const float mu = M == f_ninf() ? 0.f : M;
    float L = 0.f;
    for (int w = 0; w < AR_WARPS; ++w) L += wl[w] * exp_from(wm[w], mu);
    const float inv = L > 0.f ? 1.f / L : 0.f;
    for (int e = tid; e < DV; e += AR_WARPS * 32) {
        float acc_e = 0.f;
        for (int w = 0; w < AR_WARPS; ++w) acc_e += wacc[w][e] * exp_from(wm[w], mu);
        stf(out, off4(out, b, h, i, e), acc_e * inv);
    }
    if (has_lse && tid == 0) lse_store(lse, b, h, i, M, L);
}
