// Vramroom's CUDA kernels, compiled at run time by NVRTC (compute/nvrtc.rs).
//
// Design note: one source, no CUDA headers (NVRTC ships none of cuda_fp16.h / cuda_bf16.h
// without the toolkit), so bf16 and f16 are converted by hand. Every kernel takes its
// tensors as `T` descriptors (pointer, offset, shape, strides, dtype) and dispatches on the
// dtype at run time: the switch is uniform across a warp, so it costs next to nothing in
// kernels that are bound by memory bandwidth, and one kernel serves every dtype. Arithmetic
// is done in f32 (f64 for statistics and for conversions that involve integers), as the cpu
// backend does, so results agree within the rounding of the storage dtype.
//
// Index errors (an embedding id out of range, say) cannot be returned from a kernel: the
// first one is written to a small device-side error word (`err`), the element is skipped,
// and the host reports it at its next synchronisation, naming the op, as CUDA reports a
// device-side assert, but without killing the context.

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

#define MAXD 8
struct T {
    void* p;
    i64 off;
    i64 shape[MAXD];
    i64 st[MAXD];
    int nd;
    int dt;
};

enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_I64 = 3, DT_I32 = 4, DT_U8 = 5, DT_BOOL = 6 };

#define LOOP(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)

__device__ __forceinline__ float f_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float f_nan() { return __int_as_float(0x7fc00000); }

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }
// Round to nearest even, NaN stays NaN. sm_80 and later convert in one instruction (two
// values in one for f2bf2); the integer sequence is for older parts.
__device__ __forceinline__ u16 f2bf(float f) {
#if __CUDA_ARCH__ >= 800
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
#else
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
#endif
}
// Two values packed: `lo` in the low half.
__device__ __forceinline__ u32 f2bf2(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (u32)f2bf(lo) | ((u32)f2bf(hi) << 16);
#endif
}
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

// Rust's `as` from a float to an integer: truncate, saturate, NaN -> 0.
__device__ __forceinline__ i64 d2i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return 9223372036854775807LL;
    if (v <= -9223372036854775808.0) return (-9223372036854775807LL - 1);
    return (i64)v;
}
__device__ __forceinline__ int d2i32(double v) {
    if (v != v) return 0;
    if (v >= 2147483647.0) return 2147483647;
    if (v <= -2147483648.0) return (-2147483647 - 1);
    return (int)v;
}
__device__ __forceinline__ unsigned char d2u8(double v) {
    if (v != v || v <= 0.0) return 0;
    if (v >= 255.0) return 255;
    return (unsigned char)v;
}

__device__ __forceinline__ float ldf(const T& t, i64 o) {
    switch (t.dt) {
        case DT_F32: return ((const float*)t.p)[o];
        case DT_F16: return h2f(((const u16*)t.p)[o]);
        case DT_BF16: return bf2f(((const u16*)t.p)[o]);
        case DT_I64: return (float)((const i64*)t.p)[o];
        case DT_I32: return (float)((const int*)t.p)[o];
        case DT_U8: return (float)((const unsigned char*)t.p)[o];
        default: return ((const unsigned char*)t.p)[o] != 0 ? 1.f : 0.f;
    }
}
__device__ __forceinline__ double ldd(const T& t, i64 o) {
    switch (t.dt) {
        case DT_F32: return (double)((const float*)t.p)[o];
        case DT_F16: return (double)h2f(((const u16*)t.p)[o]);
        case DT_BF16: return (double)bf2f(((const u16*)t.p)[o]);
        case DT_I64: return (double)((const i64*)t.p)[o];
        case DT_I32: return (double)((const int*)t.p)[o];
        case DT_U8: return (double)((const unsigned char*)t.p)[o];
        default: return ((const unsigned char*)t.p)[o] != 0 ? 1.0 : 0.0;
    }
}
__device__ __forceinline__ i64 ldi(const T& t, i64 o) {
    switch (t.dt) {
        case DT_I64: return ((const i64*)t.p)[o];
        case DT_I32: return (i64)((const int*)t.p)[o];
        case DT_U8: return (i64)((const unsigned char*)t.p)[o];
        case DT_BOOL: return ((const unsigned char*)t.p)[o] != 0 ? 1 : 0;
        default: return d2i64(ldd(t, o));
    }
}
__device__ __forceinline__ void std_(const T& t, i64 o, double v) {
    switch (t.dt) {
        case DT_F32: ((float*)t.p)[o] = (float)v; break;
        case DT_F16: ((u16*)t.p)[o] = f2h((float)v); break;
        case DT_BF16: ((u16*)t.p)[o] = f2bf((float)v); break;
        case DT_I64: ((i64*)t.p)[o] = d2i64(v); break;
        case DT_I32: ((int*)t.p)[o] = d2i32(v); break;
        case DT_U8: ((unsigned char*)t.p)[o] = d2u8(v); break;
        default: ((unsigned char*)t.p)[o] = (v != 0.0) ? 1 : 0; break;
    }
}
__device__ __forceinline__ void stf(const T& t, i64 o, float v) {
    switch (t.dt) {
        case DT_F32: ((float*)t.p)[o] = v; break;
        case DT_F16: ((u16*)t.p)[o] = f2h(v); break;
        case DT_BF16: ((u16*)t.p)[o] = f2bf(v); break;
        default: std_(t, o, (double)v); break;
    }
}
__device__ __forceinline__ void sti(const T& t, i64 o, i64 v) {
    switch (t.dt) {
        case DT_I64: ((i64*)t.p)[o] = v; break;
        case DT_I32: ((int*)t.p)[o] = (int)v; break;
        case DT_U8: ((unsigned char*)t.p)[o] = (unsigned char)v; break;
        case DT_BOOL: ((unsigned char*)t.p)[o] = v != 0 ? 1 : 0; break;
        default: std_(t, o, (double)v); break;
    }
}
__device__ __forceinline__ bool is_float_dt(int dt) { return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16; }

// Atomic float add into any float dtype. 16-bit types go through a CAS on their 32-bit word.
__device__ __forceinline__ void atomic_addf(const T& t, i64 o, float v) {
    if (t.dt == DT_F32) {
        atomicAdd(((float*)t.p) + o, v);
        return;
    }
    u16* h = ((u16*)t.p) + o;
    u32* w = (u32*)((size_t)h & ~(size_t)3);
    bool hi = ((size_t)h & 2) != 0;
    u32 old = *w, assumed;
    do {
        assumed = old;
        u16 cur = hi ? (u16)(assumed >> 16) : (u16)(assumed & 0xffffu);
        float f = (t.dt == DT_BF16 ? bf2f(cur) : h2f(cur)) + v;
        u16 nv = t.dt == DT_BF16 ? f2bf(f) : f2h(f);
        u32 neu = hi ? ((assumed & 0xffffu) | ((u32)nv << 16)) : ((assumed & 0xffff0000u) | nv);
        old = atomicCAS(w, assumed, neu);
    } while (assumed != old);
}

// 16-byte vector access for contiguous fast paths: 4 f32 or 8 bf16 per load and store,
// the way PyTorch's vectorized elementwise kernels move memory.
__device__ __forceinline__ bool aligned16(const void* p) { return (((size_t)p) & 15) == 0; }
__device__ __forceinline__ void unpack_bf16x8(uint4 u, float* f) {
    u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        f[2 * k] = bf2f((u16)(w[k] & 0xffffu));
        f[2 * k + 1] = bf2f((u16)(w[k] >> 16));
    }
}
__device__ __forceinline__ uint4 pack_bf16x8(const float* f) {
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = f2bf2(f[2 * k], f[2 * k + 1]);
    return make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ void unpack_f32x4(uint4 u, float* f) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ uint4 pack_f32x4(const float* f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
}

// Typed element access for kernels that dispatch on the dtype once, at the top, instead of
// once per element (ldf/stf): the hot loops then compile to plain loads and stores.
struct F32 {
    typedef float S;
    static __device__ __forceinline__ float ld(const void* p, i64 o) { return ((const float*)p)[o]; }
    static __device__ __forceinline__ void st(void* p, i64 o, float v) { ((float*)p)[o] = v; }
};
struct BF16 {
    typedef u16 S;
    static __device__ __forceinline__ float ld(const void* p, i64 o) { return bf2f(((const u16*)p)[o]); }
    static __device__ __forceinline__ void st(void* p, i64 o, float v) { ((u16*)p)[o] = f2bf(v); }
};
struct F16 {
    typedef u16 S;
    static __device__ __forceinline__ float ld(const void* p, i64 o) { return h2f(((const u16*)p)[o]); }
    static __device__ __forceinline__ void st(void* p, i64 o, float v) { ((u16*)p)[o] = f2h(v); }
};

// Element offset of logical (row-major) index i.
__device__ __forceinline__ i64 toff(const T& t, i64 i) {
    if (t.nd <= 1) return t.off + (t.nd == 1 ? i * t.st[0] : 0);
    i64 o = t.off;
#pragma unroll 1
    for (int d = t.nd - 1; d > 0; --d) {
        i64 s = t.shape[d];
        i64 q = i / s;
        o += (i - q * s) * t.st[d];
        i = q;
    }
    return o + i * t.st[0];
}
// Offsets of logical index i in two or three views of one shape (the host coalesced them
// together): the index is decomposed once, not once per view. `small` says every index fits
// in 32 bits, where division is several times cheaper than 64-bit division.
__device__ __forceinline__ void toff3(const T& a, const T& b, const T& c, i64 i, bool small, i64& oa, i64& ob,
                                      i64& oc) {
    oa = a.off;
    ob = b.off;
    oc = c.off;
    if (small) {
        u32 u = (u32)i;
#pragma unroll 1
        for (int d = a.nd - 1; d > 0; --d) {
            u32 s = (u32)a.shape[d];
            u32 q = u / s;
            i64 r = (i64)(u - q * s);
            oa += r * a.st[d];
            ob += r * b.st[d];
            oc += r * c.st[d];
            u = q;
        }
        if (a.nd > 0) {
            oa += (i64)u * a.st[0];
            ob += (i64)u * b.st[0];
            oc += (i64)u * c.st[0];
        }
        return;
    }
#pragma unroll 1
    for (int d = a.nd - 1; d > 0; --d) {
        i64 s = a.shape[d];
        i64 q = i / s;
        i64 r = i - q * s;
        oa += r * a.st[d];
        ob += r * b.st[d];
        oc += r * c.st[d];
        i = q;
    }
    if (a.nd > 0) {
        oa += i * a.st[0];
        ob += i * b.st[0];
        oc += i * c.st[0];
    }
}

// Offset of (batch b, channel c, flat inner index j) in an [N, C, ...] tensor.
__device__ __forceinline__ i64 off_bcj(const T& t, i64 b, i64 c, i64 j) {
    i64 o = t.off + b * t.st[0] + c * t.st[1];
#pragma unroll 1
    for (int d = t.nd - 1; d >= 2; --d) {
        i64 s = t.shape[d];
        i64 q = j / s;
        o += (j - q * s) * t.st[d];
        j = q;
    }
    return o;
}

// Whether t's inner dims (2 on) are laid out densely, so that flat inner index j is offset j
// from (b, c): then `off_bcj_fast` needs no division. Uniform over a launch.
__device__ __forceinline__ bool inner_dense(const T& t) {
    i64 s = 1;
    for (int d = t.nd - 1; d >= 2; --d) {
        if (t.shape[d] != 1 && t.st[d] != s) return false;
        s *= t.shape[d];
    }
    return true;
}
__device__ __forceinline__ i64 off_bcj_fast(const T& t, bool dense, i64 b, i64 c, i64 j) {
    return dense ? t.off + b * t.st[0] + c * t.st[1] + j : off_bcj(t, b, c, j);
}

// A thread's walk over one channel's flat indices k = b * hw + j, k advancing by a fixed
// stride: (batch b, inner index j) follow by additions from one division at the start. A
// 64-bit division is a long software sequence on the GPU, and the per-channel loops below
// made several per element. Loop: `for (BJ p = bj_start(threadIdx.x, blockDim.x, HW);
// p.k < cnt; bj_next(p))`.
struct BJ {
    i64 k, b, j, sk, sb, sj, hw;
};
__device__ __forceinline__ BJ bj_start(i64 k, i64 stride, i64 hw) {
    BJ p;
    if (hw <= 0) hw = 1;  // an empty tensor: the caller's loop never runs
    p.k = k;
    p.b = k / hw;
    p.j = k - p.b * hw;
    p.sk = stride;
    p.sb = stride / hw;
    p.sj = stride - p.sb * hw;
    p.hw = hw;
    return p;
}
__device__ __forceinline__ void bj_next(BJ& p) {
    p.k += p.sk;
    p.b += p.sb;
    p.j += p.sj;
    if (p.j >= p.hw) {
        p.j -= p.hw;
        p.b += 1;
    }
}

__device__ __forceinline__ void report(int* err, int code, i64 index) {
    if (atomicCAS(err, 0, code) == 0) {
        ((i64*)err)[1] = index;
    }
}

// splitmix64, the cpu backend's generator: the k-th draw of seed s is mix(s + (k+1)*gamma),
// so element k can be drawn independently and the stream equals the cpu's exactly.
__device__ __forceinline__ double uniform_k(u64 seed, u64 k) {
    u64 z = seed + (k + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z = z ^ (z >> 31);
    return (double)(z >> 11) / 9007199254740992.0;
}

// ---------------------------------------------------------------------------------------
// Block reductions (blockDim.x a multiple of 32, at most 1024).

__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_sumf(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
// Sum over the block, returned to every thread. `sh` holds 32 doubles.
__device__ double block_sum(double v, double* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    double r = threadIdx.x < nw ? sh[threadIdx.x] : 0.0;
    if (w == 0) {
        r = warp_sum(r);
        if (lane == 0) sh[0] = r;
    }
    __syncthreads();
    return sh[0];
}
__device__ float block_sumf(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sumf(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    float r = threadIdx.x < nw ? sh[threadIdx.x] : 0.f;
    if (w == 0) {
        r = warp_sumf(r);
        if (lane == 0) sh[0] = r;
    }
    __syncthreads();
    return sh[0];
}
__device__ __forceinline__ float pick(int op, float a, float b) {
    // op 2 = max, 3 = min; NaN wins, as in PyTorch.
    if (a != a) return a;
    if (b != b) return b;
    return op == 2 ? (b > a ? b : a) : (b < a ? b : a);
}
__device__ float block_pick(int op, float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = pick(op, v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    float r = threadIdx.x < nw ? sh[threadIdx.x] : (op == 2 ? -f_inf() : f_inf());
    if (w == 0) {
        for (int o = 16; o > 0; o >>= 1) r = pick(op, r, __shfl_down_sync(0xffffffffu, r, o));
        if (lane == 0) sh[0] = r;
    }
    __syncthreads();
    return sh[0];
}

// ---------------------------------------------------------------------------------------
// Creation and copies.

extern "C" __global__ void k_fill(T out, double v, i64 n) {
    LOOP(i, n) { std_(out, toff(out, i), v); }
}

extern "C" __global__ void k_arange(T out, double start, double step, i64 n) {
    LOOP(i, n) { std_(out, toff(out, i), start + (double)i * step); }
}

extern "C" __global__ void k_tril_fill(T out, double below, double above, i64 s, i64 n) {
    LOOP(i, n) { std_(out, toff(out, i), i % s <= i / s ? below : above); }
}

extern "C" __global__ void k_uniform(T out, double lo, double hi, u64 seed, i64 n) {
    LOOP(i, n) { std_(out, toff(out, i), lo + (hi - lo) * uniform_k(seed, (u64)i)); }
}

extern "C" __global__ void k_normal(T out, double mean, double sd, u64 seed, i64 n) {
    LOOP(i, n) {
        double u1 = uniform_k(seed, 2 * (u64)i);
        if (u1 < 1e-300) u1 = 1e-300;
        double u2 = uniform_k(seed, 2 * (u64)i + 1);
        double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        std_(out, toff(out, i), mean + sd * z);
    }
}

// A view whose innermost dim can be walked in runs of R elements with 16-byte accesses:
// unit stride, its length and every other stride and the offset multiples of R, the base
// 16-byte aligned. A run then never leaves its row and the index math (a division per dim)
// is paid once per R elements instead of once per element.
__device__ __forceinline__ bool runs16(const T& t, int R) {
    if (t.nd < 1 || t.st[t.nd - 1] != 1 || t.shape[t.nd - 1] % R != 0 || t.off % R != 0 || !aligned16(t.p))
        return false;
    for (int d = 0; d < t.nd - 1; ++d)
        if (t.st[d] % R != 0) return false;
    return true;
}

// Same dtype: the bits move, no conversion, one load and one store per element.
template <typename W>
__device__ __forceinline__ void copy_bits(const T& src, const T& dst, i64 n, int flags) {
    const W* sp = (const W*)src.p;
    W* dp = (W*)dst.p;
    const int R = 16 / sizeof(W);
    if ((flags & 2) && runs16(src, R) && runs16(dst, R)) {
        LOOP(v, n / R) {
            i64 a, b, unused;
            toff3(src, dst, dst, v * R, flags & 1, a, b, unused);
            *(uint4*)(dp + b) = *(const uint4*)(sp + a);
        }
        return;
    }
    if (flags & 2) {
        LOOP(i, n) {
            i64 a, b, unused;
            toff3(src, dst, dst, i, flags & 1, a, b, unused);
            dp[b] = sp[a];
        }
        return;
    }
    LOOP(i, n) { dp[toff(dst, i)] = sp[toff(src, i)]; }
}

extern "C" __global__ void k_copy(T src, T dst, i64 n, int flags) {
    if (src.dt == dst.dt) {
        switch (src.dt) {
            case DT_F32: case DT_I32: copy_bits<u32>(src, dst, n, flags); return;
            case DT_F16: case DT_BF16: copy_bits<u16>(src, dst, n, flags); return;
            case DT_I64: copy_bits<u64>(src, dst, n, flags); return;
            default: copy_bits<unsigned char>(src, dst, n, flags); return;
        }
    }
    bool ff = is_float_dt(src.dt) && is_float_dt(dst.dt);
    bool ii = !is_float_dt(src.dt) && !is_float_dt(dst.dt);
    LOOP(i, n) {
        i64 a, b, unused;
        if (flags & 2) {
            toff3(src, dst, dst, i, flags & 1, a, b, unused);
        } else {
            a = toff(src, i);
            b = toff(dst, i);
        }
        if (ff) stf(dst, b, ldf(src, a));
        else if (ii) sti(dst, b, ldi(src, a));
        else std_(dst, b, ldd(src, a));
    }
}

// ---------------------------------------------------------------------------------------
// Elementwise math. Op codes follow vramroom-tensor's UnaryOp / BinaryOp order.

__device__ __forceinline__ float gelu_f(float x, int tanh_approx) {
    if (tanh_approx) {
        float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        return 0.5f * x * (1.f + tanhf(u));
    }
    return 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
}
__device__ __forceinline__ float gelu_grad(float x, int tanh_approx) {
    if (tanh_approx) {
        float x3 = x * x * x;
        float u = 0.7978845608028654f * (x + 0.044715f * x3);
        float t = tanhf(u);
        float du = 0.7978845608028654f * (1.f + 3.f * 0.044715f * x * x);
        return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du;
    }
    float cdf = 0.5f * (1.f + erff(x * 0.7071067811865476f));
    float pdf = expf(-0.5f * x * x) * 0.3989422804014327f;
    return cdf + x * pdf;
}

// x ** e as PyTorch's pow kernels compute it: exponents 2, 3, 0.5, -0.5, -1 and -2 by
// multiplication, square root and reciprocal, others by powf (which took three times the
// memory-bound time of a multiply on GPT-2's cube; the cpu backend's pow_scalar matches).
__device__ __forceinline__ float pow_scalar_f(float v, double e) {
    if (e == 2.0) return v * v;
    if (e == 3.0) return v * v * v;
    if (e == 0.5) return sqrtf(v);
    if (e == -0.5) return 1.f / sqrtf(v);
    if (e == -1.0) return 1.f / v;
    if (e == -2.0) return 1.f / (v * v);
    return powf(v, (float)e);
}

__device__ __forceinline__ float unary_f(int op, float v, double s) {
    switch (op) {
        case 0: return -v;
        case 1: return expf(v);
        case 2: return logf(v);
        case 3: return sqrtf(v);
        case 4: return 1.f / sqrtf(v);
        case 5: return tanhf(v);
        case 6: return 1.f / (1.f + expf(-v));
        case 7: return v > 0.f ? v : 0.f;
        case 8: return gelu_f(v, 0);
        case 9: return gelu_f(v, 1);
        case 10: return fabsf(v);
        case 11: return v * v;
        case 12: return v + (float)s;
        case 13: return v * (float)s;
        case 15: return cosf(v);
        case 16: return sinf(v);
        case 17: return v / (1.f + expf(-v));
        default: return pow_scalar_f(v, s);
    }
}

// The contiguous f32/bf16 path with the op known at compile time: straight-line code per
// 16-byte vector (a runtime switch per element made bf16 ReLU twice PyTorch's time).
template <int OP>
__device__ __forceinline__ bool unary_contig(double s, const T& x, const T& out, i64 n) {
    const int op = OP;
    if (x.dt == DT_F32) {
        const float* xp = ((const float*)x.p) + x.off;
        float* op_ = ((float*)out.p) + out.off;
        i64 nv = (aligned16(xp) && aligned16(op_)) ? n / 4 : 0;
        LOOP(v, nv) {
            float f[4];
            unpack_f32x4(((const uint4*)xp)[v], f);
#pragma unroll
            for (int k = 0; k < 4; ++k) f[k] = unary_f(op, f[k], s);
            ((uint4*)op_)[v] = pack_f32x4(f);
        }
        LOOP(j, n - nv * 4) { op_[nv * 4 + j] = unary_f(op, xp[nv * 4 + j], s); }
        return true;
    }
    if (x.dt == DT_BF16) {
        const u16* xp = ((const u16*)x.p) + x.off;
        u16* op_ = ((u16*)out.p) + out.off;
        i64 nv = (aligned16(xp) && aligned16(op_)) ? n / 8 : 0;
        LOOP(v, nv) {
            float f[8];
            unpack_bf16x8(((const uint4*)xp)[v], f);
#pragma unroll
            for (int k = 0; k < 8; ++k) f[k] = unary_f(op, f[k], s);
            ((uint4*)op_)[v] = pack_bf16x8(f);
        }
        LOOP(j, n - nv * 8) { op_[nv * 8 + j] = f2bf(unary_f(op, bf2f(xp[nv * 8 + j]), s)); }
        return true;
    }
    return false;
}

#define UNARY_CASE(k) \
    case k: done = unary_contig<k>(s, x, out, n); break;

extern "C" __global__ void k_unary(int op, double s, T x, T out, i64 n, int flags) {
    if (x.nd == 1 && out.nd == 1 && x.st[0] == 1 && out.st[0] == 1 && x.dt == out.dt) {
        bool done = false;
        switch (op) {
            UNARY_CASE(0) UNARY_CASE(1) UNARY_CASE(2) UNARY_CASE(3) UNARY_CASE(4) UNARY_CASE(5)
            UNARY_CASE(6) UNARY_CASE(7) UNARY_CASE(8) UNARY_CASE(9) UNARY_CASE(10) UNARY_CASE(11)
            UNARY_CASE(12) UNARY_CASE(13) UNARY_CASE(15) UNARY_CASE(16) UNARY_CASE(17)
            default: done = unary_contig<14>(s, x, out, n); break;
        }
        if (done) return;
    }
    if (flags & 2) {
        LOOP(i, n) {
            i64 ox, oo, unused;
            toff3(x, out, out, i, flags & 1, ox, oo, unused);
            stf(out, oo, unary_f(op, ldf(x, ox), s));
        }
        return;
    }
    LOOP(i, n) { stf(out, toff(out, i), unary_f(op, ldf(x, toff(x, i)), s)); }
}

__device__ __forceinline__ float binary_f(int op, float a, float b, double alpha) {
    switch (op) {
        case 0: return alpha == 1.0 ? a + b : a + (float)alpha * b;
        case 1: return a - b;
        case 2: return a * b;
        case 3: return a / b;
        case 4: return (a != a || b != b) ? f_nan() : (a > b ? a : b);
        case 5: return b > 0.f ? a : 0.f;
        case 6: return a * gelu_grad(b, 0);
        case 7: return a * gelu_grad(b, 1);
        case 8: return a * (1.f - b * b);
        case 10: {
            // SiLU backward, b the saved input: g * s * (1 + x * (1 - s)), s = sigmoid(x).
            float sg = 1.f / (1.f + expf(-b));
            return a * sg * (1.f + b * (1.f - sg));
        }
        default: return a * b * (1.f - b);
    }
}

template <int OP>
__device__ __forceinline__ bool binary_contig(double alpha, const T& a, const T& b, const T& out, i64 n) {
    const int op = OP;
    if (a.dt == DT_F32) {
        const float* ap = ((const float*)a.p) + a.off;
        const float* bp = ((const float*)b.p) + b.off;
        float* op_ = ((float*)out.p) + out.off;
        i64 nv = (aligned16(ap) && aligned16(bp) && aligned16(op_)) ? n / 4 : 0;
        LOOP(v, nv) {
            float fa[4], fb[4];
            unpack_f32x4(((const uint4*)ap)[v], fa);
            unpack_f32x4(((const uint4*)bp)[v], fb);
#pragma unroll
            for (int k = 0; k < 4; ++k) fa[k] = binary_f(op, fa[k], fb[k], alpha);
            ((uint4*)op_)[v] = pack_f32x4(fa);
        }
        LOOP(j, n - nv * 4) { op_[nv * 4 + j] = binary_f(op, ap[nv * 4 + j], bp[nv * 4 + j], alpha); }
        return true;
    }
    if (a.dt == DT_BF16) {
        const u16* ap = ((const u16*)a.p) + a.off;
        const u16* bp = ((const u16*)b.p) + b.off;
        u16* op_ = ((u16*)out.p) + out.off;
        i64 nv = (aligned16(ap) && aligned16(bp) && aligned16(op_)) ? n / 8 : 0;
        LOOP(v, nv) {
            float fa[8], fb[8];
            unpack_bf16x8(((const uint4*)ap)[v], fa);
            unpack_bf16x8(((const uint4*)bp)[v], fb);
#pragma unroll
            for (int k = 0; k < 8; ++k) fa[k] = binary_f(op, fa[k], fb[k], alpha);
            ((uint4*)op_)[v] = pack_bf16x8(fa);
        }
        LOOP(j, n - nv * 8) {
            op_[nv * 8 + j] = f2bf(binary_f(op, bf2f(ap[nv * 8 + j]), bf2f(bp[nv * 8 + j]), alpha));
        }
        return true;
    }
    return false;
}

#define BINARY_CASE(k) \
    case k: done = binary_contig<k>(alpha, a, b, out, n); break;

extern "C" __global__ void k_binary(int op, double alpha, T a, T b, T out, i64 n, int flags) {
    if (a.nd == 1 && b.nd == 1 && out.nd == 1 && a.st[0] == 1 && b.st[0] == 1 && out.st[0] == 1 &&
        a.dt == out.dt && b.dt == out.dt) {
        bool done = false;
        switch (op) {
            BINARY_CASE(0) BINARY_CASE(1) BINARY_CASE(2) BINARY_CASE(3) BINARY_CASE(4)
            BINARY_CASE(5) BINARY_CASE(6) BINARY_CASE(7) BINARY_CASE(8) BINARY_CASE(10)
            default: done = binary_contig<9>(alpha, a, b, out, n); break;
        }
        if (done) return;
    }
    if (flags & 2) {
        LOOP(i, n) {
            i64 oa, ob, oo;
            toff3(a, b, out, i, flags & 1, oa, ob, oo);
            stf(out, oo, binary_f(op, ldf(a, oa), ldf(b, ob), alpha));
        }
        return;
    }
    LOOP(i, n) {
        float va = ldf(a, toff(a, i));
        float vb = ldf(b, toff(b, i));
        stf(out, toff(out, i), binary_f(op, va, vb, alpha));
    }
}

// ---------------------------------------------------------------------------------------
// Contiguous elementwise: k_unary_vec and k_binary_vec, for views that are 1-d (coalesced),
// unit-stride, 16-byte aligned and of one float dtype (the host checks: ops.rs `vec_path`).
// They take bare pointers, not descriptors, load EW_UNROLL 16-byte vectors of each input
// before computing any, and cover the tensor with one pass of the grid; f16 gets a vector
// path here, which k_unary's and k_binary's contiguous paths lack (those stay for unaligned
// contiguous views). Measured on bf16 GPT-2 32x1024 (H200): unary ops as fast as k_unary's
// contiguous path (97 us for 100 M elements, PyTorch 94 to 102), binary ops 4% faster (4.29
// against 4.45 ms per forward). The arithmetic is unary_f / binary_f, so results equal
// k_unary's and k_binary's bit for bit.

#define EW_BLOCK 256
#define EW_UNROLL 4

template <typename F>
union EwV {
    uint4 u;
    typename F::S e[16 / sizeof(typename F::S)];
};

template <int OP, typename F>
__device__ __forceinline__ void unary_vec_t(double s, const void* xp, void* op_, i64 n) {
    constexpr int P = 16 / sizeof(typename F::S);
    const i64 nv = n / P;
    const i64 base = (i64)blockIdx.x * (EW_BLOCK * EW_UNROLL) + threadIdx.x;
    EwV<F> buf[EW_UNROLL];
#pragma unroll
    for (int u = 0; u < EW_UNROLL; ++u) {
        i64 v = base + u * EW_BLOCK;
        if (v < nv) buf[u].u = ((const uint4*)xp)[v];
    }
#pragma unroll
    for (int u = 0; u < EW_UNROLL; ++u) {
        i64 v = base + u * EW_BLOCK;
        if (v < nv) {
#pragma unroll
            for (int e = 0; e < P; ++e) F::st(buf[u].e, e, unary_f(OP, F::ld(buf[u].e, e), s));
            ((uint4*)op_)[v] = buf[u].u;
        }
    }
    // The last n % P elements, by block 0.
    if (blockIdx.x == 0 && threadIdx.x < n - nv * P) {
        i64 j = nv * P + threadIdx.x;
        F::st(op_, j, unary_f(OP, F::ld(xp, j), s));
    }
}

#define UNARY_VEC(k) \
    case k: unary_vec_t<k, F>(s, x, out, n); break;

template <typename F>
__device__ __forceinline__ void unary_vec_ops(int op, double s, const void* x, void* out, i64 n) {
    switch (op) {
        UNARY_VEC(0) UNARY_VEC(1) UNARY_VEC(2) UNARY_VEC(3) UNARY_VEC(4) UNARY_VEC(5)
        UNARY_VEC(6) UNARY_VEC(7) UNARY_VEC(8) UNARY_VEC(9) UNARY_VEC(10) UNARY_VEC(11)
        UNARY_VEC(12) UNARY_VEC(13) UNARY_VEC(15) UNARY_VEC(16) UNARY_VEC(17)
        default: unary_vec_t<14, F>(s, x, out, n); break;
    }
}

extern "C" __global__ void __launch_bounds__(EW_BLOCK) k_unary_vec(int op, double s, const void* x, void* out, i64 n, int dt) {
    if (dt == DT_F32) unary_vec_ops<F32>(op, s, x, out, n);
    else if (dt == DT_BF16) unary_vec_ops<BF16>(op, s, x, out, n);
    else unary_vec_ops<F16>(op, s, x, out, n);
}

template <int OP, typename F>
__device__ __forceinline__ void binary_vec_t(double alpha, const void* ap, const void* bp, void* op_, i64 n) {
    constexpr int P = 16 / sizeof(typename F::S);
    const i64 nv = n / P;
    const i64 base = (i64)blockIdx.x * (EW_BLOCK * EW_UNROLL) + threadIdx.x;
    EwV<F> ba[EW_UNROLL], bb[EW_UNROLL];
#pragma unroll
    for (int u = 0; u < EW_UNROLL; ++u) {
        i64 v = base + u * EW_BLOCK;
        if (v < nv) {
            ba[u].u = ((const uint4*)ap)[v];
            bb[u].u = ((const uint4*)bp)[v];
        }
    }
#pragma unroll
    for (int u = 0; u < EW_UNROLL; ++u) {
        i64 v = base + u * EW_BLOCK;
        if (v < nv) {
#pragma unroll
            for (int e = 0; e < P; ++e)
                F::st(ba[u].e, e, binary_f(OP, F::ld(ba[u].e, e), F::ld(bb[u].e, e), alpha));
            ((uint4*)op_)[v] = ba[u].u;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < n - nv * P) {
        i64 j = nv * P + threadIdx.x;
        F::st(op_, j, binary_f(OP, F::ld(ap, j), F::ld(bp, j), alpha));
    }
}

#define BINARY_VEC(k) \
    case k: binary_vec_t<k, F>(alpha, a, b, out, n); break;

template <typename F>
__device__ __forceinline__ void binary_vec_ops(int op, double alpha, const void* a, const void* b, void* out, i64 n) {
    switch (op) {
        BINARY_VEC(0) BINARY_VEC(1) BINARY_VEC(2) BINARY_VEC(3) BINARY_VEC(4)
        BINARY_VEC(5) BINARY_VEC(6) BINARY_VEC(7) BINARY_VEC(8) BINARY_VEC(10)
        default: binary_vec_t<9, F>(alpha, a, b, out, n); break;
    }
}

extern "C" __global__ void __launch_bounds__(EW_BLOCK) k_binary_vec(int op, double alpha, const void* a, const void* b, void* out, i64 n, int dt) {
    if (dt == DT_F32) binary_vec_ops<F32>(op, alpha, a, b, out, n);
    else if (dt == DT_BF16) binary_vec_ops<BF16>(op, alpha, a, b, out, n);
    else binary_vec_ops<F16>(op, alpha, a, b, out, n);
}

template <typename W>
__device__ __forceinline__ void masked_fill_bits(const T& x, const T& m, W fill, const T& out, i64 n, int flags) {
    const W* xp = (const W*)x.p;
    const unsigned char* mp = (const unsigned char*)m.p;
    W* op_ = (W*)out.p;
    const int R = 16 / sizeof(W);
    if (runs16(x, R) && runs16(out, R)) {
        i64 ms = m.nd > 0 ? m.st[m.nd - 1] : 0;
        LOOP(v, n / R) {
            i64 ox, om, oo;
            toff3(x, m, out, v * R, flags & 1, ox, om, oo);
            union {
                uint4 u;
                W w[16 / sizeof(W)];
            } buf;
            buf.u = *(const uint4*)(xp + ox);
#pragma unroll
            for (int k = 0; k < R; ++k) buf.w[k] = mp[om + k * ms] ? fill : buf.w[k];
            *(uint4*)(op_ + oo) = buf.u;
        }
        return;
    }
    LOOP(i, n) {
        i64 ox, om, oo;
        toff3(x, m, out, i, flags & 1, ox, om, oo);
        op_[oo] = mp[om] ? fill : xp[ox];
    }
}

extern "C" __global__ void k_masked_fill(T x, T m, double v, T out, i64 n, int flags) {
    // The attention mask's case: x and out of one float dtype, a byte mask.
    if ((flags & 2) && x.dt == out.dt && (m.dt == DT_BOOL || m.dt == DT_U8)) {
        if (x.dt == DT_F32) {
            masked_fill_bits<float>(x, m, (float)v, out, n, flags);
            return;
        }
        if (x.dt == DT_BF16) {
            masked_fill_bits<u16>(x, m, f2bf((float)v), out, n, flags);
            return;
        }
    }
    if (flags & 2) {
        LOOP(i, n) {
            i64 ox, om, oo;
            toff3(x, m, out, i, flags & 1, ox, om, oo);
            stf(out, oo, ldf(m, om) != 0.f ? (float)v : ldf(x, ox));
        }
        return;
    }
    LOOP(i, n) {
        float mv = ldf(m, toff(m, i));
        stf(out, toff(out, i), mv != 0.f ? (float)v : ldf(x, toff(x, i)));
    }
}

// ---------------------------------------------------------------------------------------
// Reductions. `xk` walks the kept dims (its shape is the output's, its offset x's), `xr` the
// reduced dims (offset 0). Ops: 0 sum, 1 mean, 2 max, 3 min.

extern "C" __global__ void k_reduce_block(int op, T xk, T xr, T out, i64 nout, i64 nred) {
    __shared__ double shd[32];
    __shared__ float shf[32];
    for (i64 o = blockIdx.x; o < nout; o += gridDim.x) {
        i64 base = toff(xk, o);
        if (op <= 1) {
            double acc = 0.0;
            for (i64 r = threadIdx.x; r < nred; r += blockDim.x) acc += (double)ldf(xk, base + toff(xr, r));
            acc = block_sum(acc, shd);
            if (threadIdx.x == 0) stf(out, toff(out, o), (float)(op == 1 ? acc / (double)nred : acc));
        } else {
            float acc = op == 2 ? -f_inf() : f_inf();
            for (i64 r = threadIdx.x; r < nred; r += blockDim.x) acc = pick(op, acc, ldf(xk, base + toff(xr, r)));
            acc = block_pick(op, acc, shf);
            if (threadIdx.x == 0) stf(out, toff(out, o), acc);
        }
        __syncthreads();
    }
}

extern "C" __global__ void k_reduce_thread(int op, T xk, T xr, T out, i64 nout, i64 nred) {
    LOOP(o, nout) {
        i64 base = toff(xk, o);
        if (op <= 1) {
            double acc = 0.0;
            for (i64 r = 0; r < nred; ++r) acc += (double)ldf(xk, base + toff(xr, r));
            stf(out, toff(out, o), (float)(op == 1 ? acc / (double)nred : acc));
        } else {
            float acc = op == 2 ? -f_inf() : f_inf();
            for (i64 r = 0; r < nred; ++r) acc = pick(op, acc, ldf(xk, base + toff(xr, r)));
            stf(out, toff(out, o), acc);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Convolution helpers (the convolution itself is cuDNN's).

// out (contiguous NCHW) += bias[c].
extern "C" __global__ void k_bias_nchw(T out, T bias, i64 C, i64 HW, i64 n) {
    LOOP(i, n) {
        i64 c = (i / HW) % C;
        i64 o = out.off + i;
        stf(out, o, ldf(out, o) + ldf(bias, toff(bias, c)));
    }
}

// ---------------------------------------------------------------------------------------
// Pooling. x is any 4-d view; outputs and indices are contiguous.

template <typename Ld, typename St>
__device__ __forceinline__ void maxpool2d_t(Ld ld, St st, const T& x, const T& idx, i64 C, i64 H, i64 W, i64 OH,
                                            i64 OW, int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw,
                                            i64 n) {
    bool small = n < 0x7fffffffLL;
    LOOP(i, n) {
        i64 ox, oy, c, b;
        if (small) {
            u32 u = (u32)i, ow_ = (u32)OW, oh_ = (u32)OH, c_ = (u32)C;
            u32 t = u / ow_;
            ox = u - t * ow_;
            u32 t2 = t / oh_;
            oy = t - t2 * oh_;
            u32 t3 = t2 / c_;
            c = t2 - t3 * c_;
            b = t3;
        } else {
            ox = i % OW;
            i64 t = i / OW;
            oy = t % OH;
            t /= OH;
            c = t % C;
            b = t / C;
        }
        i64 base = x.off + b * x.st[0] + c * x.st[1];
        float best = -f_inf();
        i64 bi = -1;
        for (int a = 0; a < kh; ++a) {
            i64 iy = oy * sh + (i64)a * dh - ph;
            if (iy < 0 || iy >= H) continue;
            for (int e = 0; e < kw; ++e) {
                i64 ix = ox * sw + (i64)e * dw - pw;
                if (ix < 0 || ix >= W) continue;
                float v = ld(base + iy * x.st[2] + ix * x.st[3]);
                if (v > best || v != v || bi < 0) {
                    best = v;
                    bi = iy * W + ix;
                }
                if (best != best) break;
            }
        }
        st(i, best);
        sti(idx, idx.off + i, bi);
    }
}

extern "C" __global__ void k_maxpool2d(T x, T out, T idx, i64 C, i64 H, i64 W, i64 OH, i64 OW, int kh, int kw,
                                       int sh, int sw, int ph, int pw, int dh, int dw, i64 n) {
    const void* xp = x.p;
    void* op_ = out.p;
    i64 oo = out.off;
    if (x.dt == DT_F32 && out.dt == DT_F32) {
        maxpool2d_t([&](i64 o) { return F32::ld(xp, o); }, [&](i64 i, float v) { F32::st(op_, oo + i, v); }, x,
                    idx, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, n);
    } else if (x.dt == DT_BF16 && out.dt == DT_BF16) {
        maxpool2d_t([&](i64 o) { return BF16::ld(xp, o); }, [&](i64 i, float v) { BF16::st(op_, oo + i, v); }, x,
                    idx, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, n);
    } else {
        maxpool2d_t([&](i64 o) { return ldf(x, o); }, [&](i64 i, float v) { stf(out, oo + i, v); }, x, idx, C, H,
                    W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, n);
    }
}

// gx arrives zero-filled; windows may overlap, hence the atomics.
extern "C" __global__ void k_maxpool2d_bwd(T gy, T idx, T gx, i64 HW, i64 OHW, i64 n, int* err) {
    LOOP(i, n) {
        i64 pl = i / OHW;
        i64 k = ldi(idx, toff(idx, i));
        if (k < 0 || k >= HW) {
            report(err, 1, k);
            continue;
        }
        atomic_addf(gx, gx.off + pl * HW + k, ldf(gy, toff(gy, i)));
    }
}

extern "C" __global__ void k_adaptive_avg(T x, T out, i64 C, i64 H, i64 W, i64 OH, i64 OW, i64 n) {
    LOOP(i, n) {
        i64 ox = i % OW, t = i / OW;
        i64 oy = t % OH;
        t /= OH;
        i64 c = t % C, b = t / C;
        i64 y0 = oy * H / OH, y1 = ((oy + 1) * H + OH - 1) / OH;
        i64 x0 = ox * W / OW, x1 = ((ox + 1) * W + OW - 1) / OW;
        double s = 0.0;
        i64 base = x.off + b * x.st[0] + c * x.st[1];
        for (i64 iy = y0; iy < y1; ++iy)
            for (i64 ix = x0; ix < x1; ++ix) s += (double)ldf(x, base + iy * x.st[2] + ix * x.st[3]);
        stf(out, out.off + i, (float)(s / (double)((y1 - y0) * (x1 - x0))));
    }
}

// Gathers into each input cell the share of every output window that covers it.
extern "C" __global__ void k_adaptive_avg_bwd(T gy, T gx, i64 C, i64 H, i64 W, i64 OH, i64 OW, i64 n) {
    LOOP(i, n) {
        i64 ix = i % W, t = i / W;
        i64 iy = t % H;
        t /= H;
        i64 c = t % C, b = t / C;
        float s = 0.f;
        for (i64 oy = 0; oy < OH; ++oy) {
            i64 y0 = oy * H / OH, y1 = ((oy + 1) * H + OH - 1) / OH;
            if (iy < y0 || iy >= y1) continue;
            for (i64 ox = 0; ox < OW; ++ox) {
                i64 x0 = ox * W / OW, x1 = ((ox + 1) * W + OW - 1) / OW;
                if (ix < x0 || ix >= x1) continue;
                float g = ldf(gy, gy.off + b * gy.st[0] + c * gy.st[1] + oy * gy.st[2] + ox * gy.st[3]);
                s += g / (float)((y1 - y0) * (x1 - x0));
            }
        }
        stf(gx, gx.off + i, s);
    }
}

// ---------------------------------------------------------------------------------------
// Batch norm over [N, C, ...]: one block per channel for anything that needs statistics,
// or, for few channels of many elements, several (the split kernels after k_bn_bwd).

__device__ __forceinline__ float opt_ld(const T& t, i64 c, float dflt) {
    return t.p ? ldf(t, toff(t, c)) : dflt;
}

// Channel c's batch statistics: the saved (mean, inverse std), and the running (mean,
// unbiased variance) moved by `momentum`, as PyTorch updates them.
__device__ void bn_store_stats(i64 c, i64 cnt, double mean, double var, double inv, double momentum, T smean,
                               T sinv, T rm, T rv) {
    std_(smean, toff(smean, c), mean);
    std_(sinv, toff(sinv, c), inv);
    if (rm.p) {
        i64 o = toff(rm, c);
        std_(rm, o, (1.0 - momentum) * ldd(rm, o) + momentum * mean);
    }
    if (rv.p) {
        i64 o = toff(rv, c);
        double unbias = cnt > 1 ? (double)cnt / (double)(cnt - 1) : 1.0;
        std_(rv, o, (1.0 - momentum) * ldd(rv, o) + momentum * var * unbias);
    }
}

// Mean and sum of squared deviations of channel c's flat elements [lo, hi), two passes,
// block-wide: every thread gets both.
__device__ void bn_mean_m2(const T& x, i64 c, i64 lo, i64 hi, i64 HW, double* sh, double& mean, double& m2) {
    const bool xd = inner_dense(x);
    const double n = (double)max(hi - lo, (i64)0);
    double s = 0.0;
    for (BJ p = bj_start(lo + threadIdx.x, blockDim.x, HW); p.k < hi; bj_next(p))
        s += (double)ldf(x, off_bcj_fast(x, xd, p.b, c, p.j));
    s = block_sum(s, sh);
    mean = n > 0.0 ? s / n : 0.0;
    double q = 0.0;
    for (BJ p = bj_start(lo + threadIdx.x, blockDim.x, HW); p.k < hi; bj_next(p)) {
        double d = (double)ldf(x, off_bcj_fast(x, xd, p.b, c, p.j)) - mean;
        q += d * d;
    }
    m2 = block_sum(q, sh);
}

// out = (x - mean) * sc + shf over channel c's flat elements [lo, hi) (out contiguous).
__device__ void bn_affine(const T& x, const T& out, i64 c, i64 lo, i64 hi, i64 C, i64 HW, double mean, double sc,
                          double shf) {
    const bool xd = inner_dense(x);
    for (BJ p = bj_start(lo + threadIdx.x, blockDim.x, HW); p.k < hi; bj_next(p)) {
        double v = (double)ldf(x, off_bcj_fast(x, xd, p.b, c, p.j));
        stf(out, out.off + (p.b * C + c) * HW + p.j, (float)((v - mean) * sc + shf));
    }
}

extern "C" __global__ void k_bn_train(T x, T w, T b, T rm, T rv, double momentum, double eps, T out, T smean,
                                      T sinv, i64 N, i64 C, i64 HW) {
    __shared__ double sh[32];
    i64 c = blockIdx.x;
    if (c >= C) return;
    i64 cnt = N * HW;
    double mean, m2;
    bn_mean_m2(x, c, 0, cnt, HW, sh, mean, m2);
    double var = m2 / (double)cnt;
    double inv = 1.0 / sqrt(var + eps);
    bn_affine(x, out, c, 0, cnt, C, HW, mean, inv * (double)opt_ld(w, c, 1.f), (double)opt_ld(b, c, 0.f));
    if (threadIdx.x == 0) bn_store_stats(c, cnt, mean, var, inv, momentum, smean, sinv, rm, rv);
}

// Eval batch norm's affine map, then ReLU when `relu` (the same `v > 0 ? v : 0` as the relu
// kernel, so a fused BN+ReLU equals the two ops, NaN included).
__device__ __forceinline__ float bn_act(float v, float sc, float shf, int relu) {
    float y = v * sc + shf;
    return relu ? (y > 0.f ? y : 0.f) : y;
}

// One (n, c) plane of contiguous x and out, by `nt` threads from `tid`: the widest vector
// the plane's length and alignment allow (16, 8, 4 bytes or one element).
template <typename F>
__device__ __forceinline__ void bn_plane(const typename F::S* xp, typename F::S* op_, i64 HW, float sc, float shf,
                                         int relu, int tid, int nt) {
    const int per16 = 16 / sizeof(typename F::S);
    if (HW % per16 == 0 && aligned16(xp) && aligned16(op_)) {
        for (i64 v = tid; v < HW / per16; v += nt) {
            float f[8];
            uint4 u = ((const uint4*)xp)[v];
            if (per16 == 8) unpack_bf16x8(u, f);
            else unpack_f32x4(u, f);
#pragma unroll
            for (int k = 0; k < per16; ++k) f[k] = bn_act(f[k], sc, shf, relu);
            ((uint4*)op_)[v] = per16 == 8 ? pack_bf16x8(f) : pack_f32x4(f);
        }
        return;
    }
    if (per16 == 8 && HW % 2 == 0 && (((size_t)xp | (size_t)op_) & 3) == 0) {
        // bf16 pairs (14x14 and 7x7 planes of ResNet's late stages are not multiples of 8).
        for (i64 v = tid; v < HW / 2; v += nt) {
            u32 u = ((const u32*)xp)[v];
            ((u32*)op_)[v] = f2bf2(bn_act(bf2f((u16)(u & 0xffffu)), sc, shf, relu), bn_act(bf2f((u16)(u >> 16)), sc, shf, relu));
        }
        return;
    }
    for (i64 j = tid; j < HW; j += nt) F::st(op_, j, bn_act(F::ld(xp, j), sc, shf, relu));
}

// Calls f(plane, tid, nt) for every plane: with `warps`, a warp per plane, 8 planes per
// block (a small plane in a block of its own leaves most of its threads idle); else a block
// per plane, or gridDim.y blocks per plane.
template <typename Fn>
__device__ __forceinline__ void for_planes(i64 planes, int warps, Fn f) {
    i64 pl = warps ? (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5) : (i64)blockIdx.x;
    i64 step = warps ? (i64)gridDim.x * (blockDim.x >> 5) : (i64)gridDim.x;
    // Block mode may split a plane over gridDim.y blocks.
    int tid = warps ? (threadIdx.x & 31) : (int)(blockIdx.y * blockDim.x + threadIdx.x);
    int nt = warps ? 32 : (int)(gridDim.y * blockDim.x);
    for (; pl < planes; pl += step) f(pl, tid, nt);
}

// x and out contiguous, per (n, c) plane, so the channel's scale and shift are computed
// once per plane instead of once per element (this is ResNet inference's hot path). With
// `relu`, the ReLU that follows most of ResNet's batch norms is applied on the way out.
extern "C" __global__ void k_bn_eval_planes(T x, T w, T b, T rm, T rv, double eps, T out, i64 C, i64 HW,
                                            i64 planes, int warps, int relu) {
    int kind = (x.dt == DT_F32 && out.dt == DT_F32) ? 1 : (x.dt == DT_BF16 && out.dt == DT_BF16) ? 2 : 0;
    for_planes(planes, warps, [&](i64 pl, int tid, int nt) {
        i64 c = pl % C;
        float sc = opt_ld(w, c, 1.f) / sqrtf(ldf(rv, toff(rv, c)) + (float)eps);
        float shf = opt_ld(b, c, 0.f) - ldf(rm, toff(rm, c)) * sc;
        i64 base = pl * HW;
        if (kind == 1) {
            bn_plane<F32>(((const float*)x.p) + x.off + base, ((float*)out.p) + out.off + base, HW, sc, shf, relu,
                          tid, nt);
        } else if (kind == 2) {
            bn_plane<BF16>(((const u16*)x.p) + x.off + base, ((u16*)out.p) + out.off + base, HW, sc, shf, relu,
                           tid, nt);
        } else {
            for (i64 j = tid; j < HW; j += nt)
                stf(out, out.off + base + j, bn_act(ldf(x, x.off + base + j), sc, shf, relu));
        }
    });
}

extern "C" __global__ void k_bn_eval(T x, T w, T b, T rm, T rv, double eps, T out, i64 C, i64 HW, i64 n) {
    LOOP(i, n) {
        i64 j = i % HW, t = i / HW;
        i64 c = t % C, bb = t / C;
        float sc = opt_ld(w, c, 1.f) / sqrtf(ldf(rv, toff(rv, c)) + (float)eps);
        float shf = opt_ld(b, c, 0.f) - ldf(rm, toff(rm, c)) * sc;
        stf(out, out.off + i, ldf(x, off_bcj(x, bb, c, j)) * sc + shf);
    }
}

// (sum g, sum g * xhat) over channel c's flat elements [lo, hi), block-wide.
__device__ void bn_grad_sums(const T& gy, const T& x, i64 c, i64 lo, i64 hi, i64 HW, double mean, double inv,
                             double* sh, double& sg, double& sgx) {
    const bool gd = inner_dense(gy), xd = inner_dense(x);
    double a = 0.0, b = 0.0;
    for (BJ p = bj_start(lo + threadIdx.x, blockDim.x, HW); p.k < hi; bj_next(p)) {
        double g = (double)ldf(gy, off_bcj_fast(gy, gd, p.b, c, p.j));
        double v = (double)ldf(x, off_bcj_fast(x, xd, p.b, c, p.j));
        a += g;
        b += g * (v - mean) * inv;
    }
    sg = block_sum(a, sh);
    sgx = block_sum(b, sh);
}

// gx over channel c's flat elements [lo, hi) (gx contiguous), with wc = w * inv. Train:
// wc * (g - mean(g) - xhat * mean(g * xhat)), given those two means; eval: wc * g.
__device__ void bn_grad_input(const T& gy, const T& x, const T& gx, i64 c, i64 lo, i64 hi, i64 C, i64 HW, double mean,
                              double inv, double wc, double mg, double mgx, int train) {
    const bool gd = inner_dense(gy), xd = inner_dense(x);
    for (BJ p = bj_start(lo + threadIdx.x, blockDim.x, HW); p.k < hi; bj_next(p)) {
        double g = (double)ldf(gy, off_bcj_fast(gy, gd, p.b, c, p.j));
        double r;
        if (train) {
            double xh = ((double)ldf(x, off_bcj_fast(x, xd, p.b, c, p.j)) - mean) * inv;
            r = wc * (g - mg - xh * mgx);
        } else {
            r = wc * g;
        }
        stf(gx, gx.off + (p.b * C + c) * HW + p.j, (float)r);
    }
}

// train: (mean, inv) are the saved batch statistics; eval: (running mean, running var).
extern "C" __global__ void k_bn_bwd(T gy, T x, T w, T mean_t, T inv_t, int train, double eps, T gx, T gw, T gb,
                                    i64 N, i64 C, i64 HW) {
    __shared__ double sh[32];
    i64 c = blockIdx.x;
    if (c >= C) return;
    i64 cnt = N * HW;
    double mean = ldd(mean_t, toff(mean_t, c));
    double inv = ldd(inv_t, toff(inv_t, c));
    if (!train) inv = 1.0 / sqrt(inv + eps);
    double sg, sgx;
    bn_grad_sums(gy, x, c, 0, cnt, HW, mean, inv, sh, sg, sgx);
    if (threadIdx.x == 0) {
        if (gw.p) std_(gw, toff(gw, c), sgx);
        if (gb.p) std_(gb, toff(gb, c), sg);
    }
    if (!gx.p) return;
    double wc = (double)opt_ld(w, c, 1.f) * inv;
    bn_grad_input(gy, x, gx, c, 0, cnt, C, HW, mean, inv, wc, sg / (double)cnt, sgx / (double)cnt, train);
}

// Training batch norm with each channel split over gridDim.y slices, for few channels of
// many elements: a block per channel left most SMs idle (ResNet-50's 64-channel layers at
// bs32 are 64 blocks on 132 SMs, each reading 0.1 to 0.4 M elements per pass), which was
// over half the training step. Three launches each way: per slice a partial result into
// `ws`, per channel their combination in slice order (so every block of a channel sees the
// same numbers), then the elementwise pass. `ws` lies in the output's own storage (gx's in
// the backward), which nothing reads until the last launch overwrites it, so the split
// takes no memory beyond the outputs PyTorch's kernels write too.

// This block's channel c (blockIdx.x) and slice [lo, hi) (blockIdx.y) of the channel's cnt
// elements; false past the last channel.
__device__ __forceinline__ bool bn_slice(i64 C, i64 cnt, i64& c, i64& lo, i64& hi) {
    c = blockIdx.x;
    i64 per = (cnt + gridDim.y - 1) / gridDim.y;
    lo = (i64)blockIdx.y * per;
    hi = min(cnt, lo + per);
    return c < C;
}

// Per slice: (count, mean, sum of squared deviations), as three doubles at ws[3 * (c * S + s)].
extern "C" __global__ void k_bn_part_stats(T x, double* ws, i64 N, i64 C, i64 HW) {
    __shared__ double sh[32];
    i64 c, lo, hi;
    if (!bn_slice(C, N * HW, c, lo, hi)) return;
    double mean, m2;
    bn_mean_m2(x, c, lo, hi, HW, sh, mean, m2);
    if (threadIdx.x == 0) {
        double* o = ws + 3 * (c * gridDim.y + blockIdx.y);
        o[0] = (double)max(hi - lo, (i64)0);
        o[1] = mean;
        o[2] = m2;
    }
}

// Per channel: the slices combined in order (Chan et al.'s pairwise update), then the saved
// statistics and the running ones, as k_bn_train writes them.
extern "C" __global__ void k_bn_fin_stats(const double* ws, T rm, T rv, double momentum, double eps, T smean,
                                          T sinv, i64 C, i64 S, i64 cnt) {
    LOOP(c, C) {
        double n = 0.0, mean = 0.0, m2 = 0.0;
        for (i64 s = 0; s < S; ++s) {
            const double* o = ws + 3 * (c * S + s);
            double nb = o[0];
            if (nb <= 0.0) continue;
            double nn = n + nb, d = o[1] - mean;
            mean += d * (nb / nn);
            m2 += o[2] + d * d * (n * nb / nn);
            n = nn;
        }
        double var = m2 / (double)cnt;
        double inv = 1.0 / sqrt(var + eps);
        bn_store_stats(c, cnt, mean, var, inv, momentum, smean, sinv, rm, rv);
    }
}

// out = (x - mean) * inv * w + b over this block's slice, from the saved statistics.
extern "C" __global__ void k_bn_apply(T x, T w, T b, T smean, T sinv, T out, i64 N, i64 C, i64 HW) {
    i64 c, lo, hi;
    if (!bn_slice(C, N * HW, c, lo, hi)) return;
    double sc = ldd(sinv, toff(sinv, c)) * (double)opt_ld(w, c, 1.f);
    bn_affine(x, out, c, lo, hi, C, HW, ldd(smean, toff(smean, c)), sc, (double)opt_ld(b, c, 0.f));
}

// Backward, per slice: (sum g, sum g * xhat) at ws[2 * (c * S + s)].
extern "C" __global__ void k_bn_bwd_part(T gy, T x, T mean_t, T inv_t, double* ws, i64 N, i64 C, i64 HW) {
    __shared__ double sh[32];
    i64 c, lo, hi;
    if (!bn_slice(C, N * HW, c, lo, hi)) return;
    double sg, sgx;
    bn_grad_sums(gy, x, c, lo, hi, HW, ldd(mean_t, toff(mean_t, c)), ldd(inv_t, toff(inv_t, c)), sh, sg, sgx);
    if (threadIdx.x == 0) {
        double* o = ws + 2 * (c * gridDim.y + blockIdx.y);
        o[0] = sg;
        o[1] = sgx;
    }
}

// Backward, per channel: the slices' sums in order, written as the weight and bias grads.
extern "C" __global__ void k_bn_bwd_fin(const double* ws, T gw, T gb, i64 C, i64 S) {
    LOOP(c, C) {
        double sg = 0.0, sgx = 0.0;
        for (i64 s = 0; s < S; ++s) {
            sg += ws[2 * (c * S + s)];
            sgx += ws[2 * (c * S + s) + 1];
        }
        std_(gw, toff(gw, c), sgx);
        std_(gb, toff(gb, c), sg);
    }
}

// Backward (training), per slice: gx from the sums the previous launch left in gw and gb.
extern "C" __global__ void k_bn_bwd_apply(T gy, T x, T w, T mean_t, T inv_t, T gw, T gb, T gx, i64 N, i64 C,
                                          i64 HW) {
    i64 c, lo, hi;
    if (!bn_slice(C, N * HW, c, lo, hi)) return;
    const double cnt = (double)(N * HW);
    double inv = ldd(inv_t, toff(inv_t, c));
    bn_grad_input(gy, x, gx, c, lo, hi, C, HW, ldd(mean_t, toff(mean_t, c)), inv, (double)opt_ld(w, c, 1.f) * inv,
                  ldd(gb, toff(gb, c)) / cnt, ldd(gw, toff(gw, c)) / cnt, 1);
}

// ---------------------------------------------------------------------------------------
// Layer norm over rows of length D (x in logical order; outputs contiguous).

extern "C" __global__ void k_ln(T x, T w, T b, double eps, T out, T mean_t, T rstd_t, i64 rows, i64 D) {
    __shared__ double sh[32];
    // Up to 8 values per thread stay in registers: one read of x.
    bool cached = D <= 8 * (i64)blockDim.x;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        float v[8];
        double s = 0.0;
        if (cached) {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                i64 i = threadIdx.x + (i64)k * blockDim.x;
                v[k] = i < D ? ldf(x, toff(x, r * D + i)) : 0.f;
                s += (double)v[k];
            }
        } else {
            for (i64 i = threadIdx.x; i < D; i += blockDim.x) s += (double)ldf(x, toff(x, r * D + i));
        }
        double m = block_sum(s, sh) / (double)D;
        double q = 0.0;
        if (cached) {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                i64 i = threadIdx.x + (i64)k * blockDim.x;
                if (i < D) {
                    double d = (double)v[k] - m;
                    q += d * d;
                }
            }
        } else {
            for (i64 i = threadIdx.x; i < D; i += blockDim.x) {
                double d = (double)ldf(x, toff(x, r * D + i)) - m;
                q += d * d;
            }
        }
        double var = block_sum(q, sh) / (double)D;
        double is = 1.0 / sqrt(var + eps);
        float mf = (float)m, isf = (float)is;
        if (cached) {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                i64 i = threadIdx.x + (i64)k * blockDim.x;
                if (i < D) {
                    float o = (v[k] - mf) * isf;
                    if (w.p) o *= ldf(w, toff(w, i));
                    if (b.p) o += ldf(b, toff(b, i));
                    stf(out, out.off + r * D + i, o);
                }
            }
        } else {
            for (i64 i = threadIdx.x; i < D; i += blockDim.x) {
                float o = (float)(((double)ldf(x, toff(x, r * D + i)) - m) * is);
                if (w.p) o *= ldf(w, toff(w, i));
                if (b.p) o += ldf(b, toff(b, i));
                stf(out, out.off + r * D + i, o);
            }
        }
        if (threadIdx.x == 0) {
            std_(mean_t, toff(mean_t, r), m);
            std_(rstd_t, toff(rstd_t, r), is);
        }
        __syncthreads();
    }
}

// Rows of at most 1024 with x and out contiguous: one warp per row, the row in registers
// (K values per lane), statistics in f32 over the held values (two passes, so no
// cancellation) and reduced with shuffles only: no shared memory, no block barrier. A
// block per row spent most of its time in those barriers for GPT-2's rows of 768.
template <typename F, int K>
__device__ __forceinline__ void ln_warp_t(const T& x, const T& w, const T& b, float eps, const T& out,
                                          const T& mean_t, const T& rstd_t, i64 r, i64 D, int lane) {
    i64 xo = x.off + r * D, oo = out.off + r * D;
    float v[K];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        i64 j = lane + 32 * k;
        v[k] = j < D ? F::ld(x.p, xo + j) : 0.f;
        s += v[k];
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float m = s / (float)D;
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        float d = (lane + 32 * k < D) ? v[k] - m : 0.f;
        q += d * d;
    }
    for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
    float is = 1.f / sqrtf(q / (float)D + eps);
#pragma unroll
    for (int k = 0; k < K; ++k) {
        i64 j = lane + 32 * k;
        if (j < D) {
            float o = (v[k] - m) * is;
            if (w.p) o *= ldf(w, w.off + j * w.st[0]);
            if (b.p) o += ldf(b, b.off + j * b.st[0]);
            F::st(out.p, oo + j, o);
        }
    }
    if (lane == 0) {
        stf(mean_t, toff(mean_t, r), m);
        stf(rstd_t, toff(rstd_t, r), is);
    }
}

// The vector path of layer norm (rows whose length and start allow 16-byte loads and
// stores): a lane holds VK vectors of 16 / sizeof(S) elements. x and out point at element 0.
// GEN: the weight and bias through ldf (any dtype and stride) and the statistics through
// toff, for k_ln_warp; otherwise w and b are absent or contiguous in x's dtype and aligned,
// read as vectors too, and mean and rstd contiguous (k_ln_vec; the host checks: ops.rs
// ln_vec_args). With the generic loads, a dtype switch and a stride multiply per element,
// and k_ln_warp's other paths setting its register count, bf16 GPT-2's layer norms took
// 167 us against PyTorch's 69; k_ln_vec takes 40.
template <typename F, int VK, bool GEN>
__device__ __forceinline__ void ln_vec_t(const typename F::S* x, const T& w, const T& b, float eps,
                                         typename F::S* out, const T& mean_t, const T& rstd_t, i64 r, i64 D,
                                         int lane) {
    typedef typename F::S S;
    const int P = 16 / sizeof(S);
    union V {
        uint4 u;
        S e[16 / sizeof(S)];
    };
    const i64 nv = D / P;
    const uint4* xr = (const uint4*)(x + r * D);
    uint4* orow = (uint4*)(out + r * D);
    float v[VK * P];
    float s = 0.f;
    V buf[VK];
#pragma unroll
    for (int k = 0; k < VK; ++k) {
        i64 vi = lane + 32 * k;
        buf[k].u = vi < nv ? xr[vi] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < VK; ++k) {
        i64 vi = lane + 32 * k;
#pragma unroll
        for (int e = 0; e < P; ++e) {
            v[k * P + e] = vi < nv ? F::ld(buf[k].e, e) : 0.f;
            s += v[k * P + e];
        }
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float m = s / (float)D;
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < VK; ++k) {
#pragma unroll
        for (int e = 0; e < P; ++e) {
            float d = (lane + 32 * k < nv) ? v[k * P + e] - m : 0.f;
            q += d * d;
        }
    }
    for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
    float is = 1.f / sqrtf(q / (float)D + eps);
#pragma unroll
    for (int k = 0; k < VK; ++k) {
        i64 vi = lane + 32 * k;
        if (vi < nv) {
            V wb, bb, ob;
            if (!GEN && w.p) wb.u = ((const uint4*)(((const S*)w.p) + w.off))[vi];
            if (!GEN && b.p) bb.u = ((const uint4*)(((const S*)b.p) + b.off))[vi];
#pragma unroll
            for (int e = 0; e < P; ++e) {
                i64 j = vi * P + e;
                float o = (v[k * P + e] - m) * is;
                if (w.p) o *= GEN ? ldf(w, w.off + j * w.st[0]) : F::ld(wb.e, e);
                if (b.p) o += GEN ? ldf(b, b.off + j * b.st[0]) : F::ld(bb.e, e);
                F::st(ob.e, e, o);
            }
            orow[vi] = ob.u;
        }
    }
    if (lane == 0) {
        stf(mean_t, GEN ? toff(mean_t, r) : mean_t.off + r, m);
        stf(rstd_t, GEN ? toff(rstd_t, r) : rstd_t.off + r, is);
    }
}

template <typename F, bool GEN>
__device__ __forceinline__ void ln_vec_d(const typename F::S* x, const T& w, const T& b, float eps,
                                         typename F::S* out, const T& mean_t, const T& rstd_t, i64 r, i64 D,
                                         int lane) {
    const i64 nv = D / (16 / sizeof(typename F::S));
    if (nv <= 32) ln_vec_t<F, 1, GEN>(x, w, b, eps, out, mean_t, rstd_t, r, D, lane);
    else if (nv <= 64) ln_vec_t<F, 2, GEN>(x, w, b, eps, out, mean_t, rstd_t, r, D, lane);
    else if (nv <= 128) ln_vec_t<F, 4, GEN>(x, w, b, eps, out, mean_t, rstd_t, r, D, lane);
    else ln_vec_t<F, 8, GEN>(x, w, b, eps, out, mean_t, rstd_t, r, D, lane);
}

template <typename F>
__device__ __forceinline__ void ln_warp_k(const T& x, const T& w, const T& b, float eps, const T& out,
                                          const T& mean_t, const T& rstd_t, i64 r, i64 D, int lane) {
    const int P = 16 / sizeof(typename F::S);
    if (D % P == 0 && x.off % P == 0 && out.off % P == 0 && aligned16(x.p) && aligned16(out.p)) {
        typedef typename F::S S;
        ln_vec_d<F, true>(((const S*)x.p) + x.off, w, b, eps, ((S*)out.p) + out.off, mean_t, rstd_t, r, D, lane);
        return;
    }
    if (D <= 128) ln_warp_t<F, 4>(x, w, b, eps, out, mean_t, rstd_t, r, D, lane);
    else if (D <= 256) ln_warp_t<F, 8>(x, w, b, eps, out, mean_t, rstd_t, r, D, lane);
    else if (D <= 512) ln_warp_t<F, 16>(x, w, b, eps, out, mean_t, rstd_t, r, D, lane);
    else ln_warp_t<F, 32>(x, w, b, eps, out, mean_t, rstd_t, r, D, lane);
}

// x.dt == out.dt, a float dtype, D <= 1024, w and b 1-d (the host checks).
extern "C" __global__ void k_ln_warp(T x, T w, T b, double eps, T out, T mean_t, T rstd_t, i64 rows, i64 D) {
    int lane = threadIdx.x & 31;
    i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    if (x.dt == DT_F32) ln_warp_k<F32>(x, w, b, (float)eps, out, mean_t, rstd_t, r, D, lane);
    else if (x.dt == DT_BF16) ln_warp_k<BF16>(x, w, b, (float)eps, out, mean_t, rstd_t, r, D, lane);
    else ln_warp_k<F16>(x, w, b, (float)eps, out, mean_t, rstd_t, r, D, lane);
}

// A warp per row on the vector path without generic loads (see ln_vec_t); x and out are
// element 0 of contiguous, aligned rows.
extern "C" __global__ void __launch_bounds__(256) k_ln_vec(const void* x, T w, T b, double eps, void* out, T mean_t, T rstd_t, i64 rows, i64 D, int dt) {
    int lane = threadIdx.x & 31;
    i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    if (dt == DT_F32)
        ln_vec_d<F32, false>((const float*)x, w, b, (float)eps, (float*)out, mean_t, rstd_t, r, D, lane);
    else if (dt == DT_BF16)
        ln_vec_d<BF16, false>((const u16*)x, w, b, (float)eps, (u16*)out, mean_t, rstd_t, r, D, lane);
    else
        ln_vec_d<F16, false>((const u16*)x, w, b, (float)eps, (u16*)out, mean_t, rstd_t, r, D, lane);
}

extern "C" __global__ void k_ln_bwd_gx(T gy, T x, T w, T mean_t, T rstd_t, T gx, i64 rows, i64 D) {
    __shared__ double sh[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        double m = ldd(mean_t, toff(mean_t, r)), is = ldd(rstd_t, toff(rstd_t, r));
        double s1 = 0.0, s2 = 0.0;
        for (i64 i = threadIdx.x; i < D; i += blockDim.x) {
            double xh = ((double)ldf(x, toff(x, r * D + i)) - m) * is;
            double gh = (double)ldf(gy, toff(gy, r * D + i)) * (double)opt_ld(w, i, 1.f);
            s1 += gh;
            s2 += gh * xh;
        }
        s1 = block_sum(s1, sh);
        s2 = block_sum(s2, sh);
        for (i64 i = threadIdx.x; i < D; i += blockDim.x) {
            double xh = ((double)ldf(x, toff(x, r * D + i)) - m) * is;
            double gh = (double)ldf(gy, toff(gy, r * D + i)) * (double)opt_ld(w, i, 1.f);
            stf(gx, gx.off + r * D + i, (float)(is * (gh - s1 / (double)D - xh * s2 / (double)D)));
        }
        __syncthreads();
    }
}

// Column sums over rows: blockDim (32, 8); a block owns 32 columns.
extern "C" __global__ void k_ln_bwd_gwb(T gy, T x, T mean_t, T rstd_t, T gw, T gb, i64 rows, i64 D) {
    __shared__ double sw[8][33];
    __shared__ double sb[8][33];
    i64 col = (i64)blockIdx.x * 32 + threadIdx.x;
    double aw = 0.0, ab = 0.0;
    if (col < D) {
        for (i64 r = threadIdx.y; r < rows; r += blockDim.y) {
            double g = (double)ldf(gy, toff(gy, r * D + col));
            double xh = ((double)ldf(x, toff(x, r * D + col)) - ldd(mean_t, toff(mean_t, r))) *
                        ldd(rstd_t, toff(rstd_t, r));
            aw += g * xh;
            ab += g;
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && col < D) {
        for (int k = 1; k < (int)blockDim.y; ++k) {
            aw += sw[k][threadIdx.x];
            ab += sb[k][threadIdx.x];
        }
        if (gw.p) std_(gw, toff(gw, col), aw);
        if (gb.p) std_(gb, toff(gb, col), ab);
    }
}

// ---------------------------------------------------------------------------------------
// Softmax over one dim of an [outer, dim, inner] tensor (x, y, outputs contiguous in the
// logical sense; strides come from the descriptors).

// Rows of at most 1024: one warp per row, the row held in registers (read once, written
// once, one exp per element). K values per lane, K a power of two fixed at compile time, so
// the row lives in registers, not in local memory.
template <typename F, int K>
__device__ __forceinline__ void softmax_warp_t(const T& x, const T& out, int lg, i64 r, i64 D, int lane) {
    const void* xp = x.p;
    void* op_ = out.p;
    i64 xo = x.off + r * D, oo = out.off + r * D;
    float v[K];
    float mx = -f_inf();
#pragma unroll
    for (int k = 0; k < K; ++k) {
        i64 j = lane + 32 * k;
        v[k] = j < D ? F::ld(xp, xo + j) : -f_inf();
        mx = pick(2, mx, v[k]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = pick(2, mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        float z = v[k] - mx;
        float e = (lane + 32 * k < D) ? expf(z) : 0.f;
        sum += e;
        v[k] = lg ? z : e;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    float ls = logf(sum), inv = 1.f / sum;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        i64 j = lane + 32 * k;
        if (j < D) F::st(op_, oo + j, lg ? v[k] - ls : v[k] * inv);
    }
}

template <typename F>
__device__ __forceinline__ void softmax_warp_k(const T& x, const T& out, int lg, i64 r, i64 D, int lane) {
    if (D <= 32) softmax_warp_t<F, 1>(x, out, lg, r, D, lane);
    else if (D <= 64) softmax_warp_t<F, 2>(x, out, lg, r, D, lane);
    else if (D <= 128) softmax_warp_t<F, 4>(x, out, lg, r, D, lane);
    else if (D <= 256) softmax_warp_t<F, 8>(x, out, lg, r, D, lane);
    else if (D <= 512) softmax_warp_t<F, 16>(x, out, lg, r, D, lane);
    else softmax_warp_t<F, 32>(x, out, lg, r, D, lane);
}

extern "C" __global__ void k_softmax_warp(T x, T out, int lg, i64 rows, i64 D) {
    int lane = threadIdx.x & 31;
    i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    if (x.dt == DT_F32 && out.dt == DT_F32) softmax_warp_k<F32>(x, out, lg, r, D, lane);
    else if (x.dt == DT_BF16 && out.dt == DT_BF16) softmax_warp_k<BF16>(x, out, lg, r, D, lane);
    else if (x.dt == DT_F16 && out.dt == DT_F16) softmax_warp_k<F16>(x, out, lg, r, D, lane);
    else {
        // Mixed dtypes (rare): the generic loads, one row at a time.
        float mx = -f_inf();
        for (i64 j = lane; j < D; j += 32) mx = pick(2, mx, ldf(x, x.off + r * D + j));
        for (int o = 16; o > 0; o >>= 1) mx = pick(2, mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.f;
        for (i64 j = lane; j < D; j += 32) sum += expf(ldf(x, x.off + r * D + j) - mx);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        float ls = logf(sum), inv = 1.f / sum;
        for (i64 j = lane; j < D; j += 32) {
            float z = ldf(x, x.off + r * D + j) - mx;
            stf(out, out.off + r * D + j, lg ? z - ls : expf(z) * inv);
        }
    }
}

extern "C" __global__ void k_softmax_rows(T x, T out, int lg, i64 rows, i64 D) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        float mx = -f_inf();
        for (i64 i = threadIdx.x; i < D; i += blockDim.x) mx = pick(2, mx, ldf(x, toff(x, r * D + i)));
        mx = block_pick(2, mx, shf);
        double s = 0.0;
        for (i64 i = threadIdx.x; i < D; i += blockDim.x) s += (double)expf(ldf(x, toff(x, r * D + i)) - mx);
        s = block_sum(s, shd);
        float ls = (float)log(s), inv = (float)(1.0 / s);
        for (i64 i = threadIdx.x; i < D; i += blockDim.x) {
            float z = ldf(x, toff(x, r * D + i)) - mx;
            stf(out, toff(out, r * D + i), lg ? z - ls : expf(z) * inv);
        }
        __syncthreads();
    }
}

extern "C" __global__ void k_softmax_cols(T x, T out, int lg, i64 outer, i64 D, i64 inner) {
    LOOP(t, outer * inner) {
        i64 o = t / inner, in = t % inner;
        float mx = -f_inf();
        for (i64 k = 0; k < D; ++k) mx = pick(2, mx, ldf(x, toff(x, (o * D + k) * inner + in)));
        double s = 0.0;
        for (i64 k = 0; k < D; ++k) s += (double)expf(ldf(x, toff(x, (o * D + k) * inner + in)) - mx);
        float ls = (float)log(s), inv = (float)(1.0 / s);
        for (i64 k = 0; k < D; ++k) {
            i64 li = (o * D + k) * inner + in;
            float z = ldf(x, toff(x, li)) - mx;
            stf(out, toff(out, li), lg ? z - ls : expf(z) * inv);
        }
    }
}

extern "C" __global__ void k_softmax_bwd_rows(T gy, T y, T gx, int lg, i64 rows, i64 D) {
    __shared__ double shd[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        double s = 0.0;
        for (i64 i = threadIdx.x; i < D; i += blockDim.x) {
            double g = (double)ldf(gy, toff(gy, r * D + i));
            s += lg ? g : g * (double)ldf(y, toff(y, r * D + i));
        }
        s = block_sum(s, shd);
        for (i64 i = threadIdx.x; i < D; i += blockDim.x) {
            double g = (double)ldf(gy, toff(gy, r * D + i));
            double yv = (double)ldf(y, toff(y, r * D + i));
            stf(gx, toff(gx, r * D + i), (float)(lg ? g - exp(yv) * s : yv * (g - s)));
        }
        __syncthreads();
    }
}

extern "C" __global__ void k_softmax_bwd_cols(T gy, T y, T gx, int lg, i64 outer, i64 D, i64 inner) {
    LOOP(t, outer * inner) {
        i64 o = t / inner, in = t % inner;
        double s = 0.0;
        for (i64 k = 0; k < D; ++k) {
            i64 li = (o * D + k) * inner + in;
            double g = (double)ldf(gy, toff(gy, li));
            s += lg ? g : g * (double)ldf(y, toff(y, li));
        }
        for (i64 k = 0; k < D; ++k) {
            i64 li = (o * D + k) * inner + in;
            double g = (double)ldf(gy, toff(gy, li));
            double yv = (double)ldf(y, toff(y, li));
            stf(gx, toff(gx, li), (float)(lg ? g - exp(yv) * s : yv * (g - s)));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Embedding, dropout, NLL loss.

// `vec` > 0: rows of w and out are contiguous, of one dtype, 16-byte aligned, and D a
// multiple of `vec` elements (the host checks); a thread then moves 16 bytes, with one
// division per vector instead of one per element (the general loop took six times
// PyTorch's gather on GPT-2's token embedding).
extern "C" __global__ void k_embedding(T w, T idx, T out, i64 V, i64 D, i64 n, int* err, int vec) {
    if (vec > 0) {
        const i64 dv = D / vec, nv = n / vec;
        const int es = 16 / vec;
        LOOP(i, nv) {
            i64 r = i / dv, k = i % dv;
            i64 row = ldi(idx, toff(idx, r));
            uint4* dst = (uint4*)((char*)out.p + (out.off + r * D) * es) + k;
            if (row < 0 || row >= V) {
                report(err, 2, row);
                *dst = make_uint4(0, 0, 0, 0);
                continue;
            }
            *dst = ((const uint4*)((const char*)w.p + (w.off + row * w.st[0]) * es))[k];
        }
        return;
    }
    LOOP(i, n) {
        i64 r = i / D, k = i % D;
        i64 row = ldi(idx, toff(idx, r));
        if (row < 0 || row >= V) {
            report(err, 2, row);
            stf(out, out.off + i, 0.f);
            continue;
        }
        stf(out, out.off + i, ldf(w, w.off + row * w.st[0] + k * w.st[1]));
    }
}

extern "C" __global__ void k_embedding_bwd(T gy, T idx, T gw, i64 V, i64 D, i64 pad, int has_pad, i64 n,
                                           int* err) {
    LOOP(i, n) {
        i64 r = i / D, k = i % D;
        i64 row = ldi(idx, toff(idx, r));
        if (has_pad && row == pad) continue;
        if (row < 0 || row >= V) {
            report(err, 3, row);
            continue;
        }
        atomic_addf(gw, gw.off + row * D + k, ldf(gy, toff(gy, i)));
    }
}

extern "C" __global__ void k_dropout(T x, double p, u64 seed, T out, T mask, i64 n) {
    double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    LOOP(i, n) {
        bool keep = uniform_k(seed, (u64)i) >= p;
        float v = ldf(x, toff(x, i));
        stf(out, toff(out, i), keep ? (float)((double)v * scale) : 0.f);
        std_(mask, toff(mask, i), keep ? 1.0 : 0.0);
    }
}

extern "C" __global__ void k_nll(T logp, T target, int mean, i64 ignore, T out, T tw, i64 N, i64 C, int* err) {
    __shared__ double sh[32];
    double s = 0.0, cnt = 0.0;
    for (i64 i = threadIdx.x; i < N; i += blockDim.x) {
        i64 t = ldi(target, toff(target, i));
        if (t == ignore) continue;
        if (t < 0 || t >= C) {
            report(err, 4, t);
            continue;
        }
        s -= (double)ldf(logp, logp.off + i * logp.st[0] + t * logp.st[1]);
        cnt += 1.0;
    }
    s = block_sum(s, sh);
    cnt = block_sum(cnt, sh);
    if (threadIdx.x == 0) {
        std_(out, toff(out, 0), mean ? s / cnt : s);
        std_(tw, toff(tw, 0), cnt);
    }
}

extern "C" __global__ void k_nll_bwd(T gy, T target, T tw, int mean, i64 ignore, T gx, i64 N, i64 C, int* err) {
    LOOP(i, N) {
        double g = ldd(gy, toff(gy, 0));
        double w = ldd(tw, toff(tw, 0));
        double scale = mean ? g / w : g;
        i64 t = ldi(target, toff(target, i));
        if (t == ignore) continue;
        if (t < 0 || t >= C) {
            report(err, 5, t);
            continue;
        }
        std_(gx, gx.off + i * C + t, -scale);
    }
}

// ---------------------------------------------------------------------------------------
// Argmax along one dim: `xk` walks the kept dims, `xr` the reduced one (as the reductions
// above); the first maximum wins, NaN counts as the maximum (PyTorch's rule).

extern "C" __global__ void k_argmax(T xk, T xr, T out, i64 nout, i64 nred) {
    LOOP(o, nout) {
        i64 base = toff(xk, o);
        float best = ldf(xk, base + toff(xr, 0));
        i64 at = 0;
        for (i64 r = 1; r < nred; ++r) {
            float v = ldf(xk, base + toff(xr, r));
            if (best != best) break;
            if (v > best || v != v) {
                best = v;
                at = r;
            }
        }
        sti(out, toff(out, o), at);
    }
}

// ---------------------------------------------------------------------------------------
// Fused scaled-dot-product attention (what PyTorch's flash / memory-efficient / cuDNN
// kernels compute), written for correctness: one thread per query row (forward and the
// query gradient) or per key row (key and value gradients), the row's accumulators in
// registers / local memory (head dims up to 256), scores recomputed on the fly, weights
// recomputed from the saved log-sum-exp in the backward. q [B,HQ,TQ,D], k [B,HKV,S,D],
// v [B,HKV,S,DV], any strides; query head h reads key head h / (HQ / HKV). `mask` is an
// additive float mask expanded to [B,HQ,TQ,S]. Dropout keeps a weight when a splitmix64
// hash of (seed, flat index) is at least p, the host function `keep` of the cpu backend.

#define ATTN_MAXD 256

__device__ __forceinline__ i64 off4(const T& t, i64 a, i64 b, i64 c, i64 d) {
    return t.off + a * t.st[0] + b * t.st[1] + c * t.st[2] + d * t.st[3];
}

__device__ __forceinline__ double attn_drop(u64 seed, u64 idx, double p) {
    if (p <= 0.0) return 1.0;
    u64 z = seed ^ (idx * 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    double u = (double)(z >> 11) / 9007199254740992.0;
    return u >= p ? 1.0 / (1.0 - p) : 0.0;
}

struct AttnShape {
    i64 B, HQ, HKV, TQ, S, D, DV;
};

// The scaled, masked score of query (b, h, i) against key j; -inf when causally hidden.
__device__ __forceinline__ double attn_score(const T& q, const T& k, const T& mask, int has_mask, double scale,
                                             int causal, const AttnShape& s, i64 b, i64 h, i64 i, i64 j) {
    if (causal && j > i) return -1.0 / 0.0;
    i64 kh = h / (s.HQ / s.HKV);
    double acc = 0.0;
    for (i64 e = 0; e < s.D; ++e) acc += (double)ldf(q, off4(q, b, h, i, e)) * (double)ldf(k, off4(k, b, kh, j, e));
    acc *= scale;
    if (has_mask) acc += (double)ldf(mask, off4(mask, b, h, i, j));
    return acc;
}

extern "C" __global__ void k_attn_fwd(T q, T k, T v, T mask, int has_mask, T out, T lse, int has_lse, double scale,
                                      int causal, double pdrop, u64 seed, AttnShape s) {
    LOOP(r, s.B * s.HQ * s.TQ) {
        i64 i = r % s.TQ;
        i64 h = (r / s.TQ) % s.HQ;
        i64 b = r / (s.TQ * s.HQ);
        i64 kh = h / (s.HQ / s.HKV);
        double m = -1.0 / 0.0;
        for (i64 j = 0; j < s.S; ++j) m = fmax(m, attn_score(q, k, mask, has_mask, scale, causal, s, b, h, i, j));
        double l = 0.0;
        if (m != -1.0 / 0.0)
            for (i64 j = 0; j < s.S; ++j) l += exp(attn_score(q, k, mask, has_mask, scale, causal, s, b, h, i, j) - m);
        double lsev = m == -1.0 / 0.0 ? m : m + log(l);
        float acc[ATTN_MAXD];
        for (i64 e = 0; e < s.DV; ++e) acc[e] = 0.f;
        if (m != -1.0 / 0.0) {
            for (i64 j = 0; j < s.S; ++j) {
                // Divided by l rather than through lsev: with a finfo.min mask a fully masked
                // row's scores are ~-3.4e38, where m + log(l) rounds back to m.
                double w = exp(attn_score(q, k, mask, has_mask, scale, causal, s, b, h, i, j) - m) / l;
                w *= attn_drop(seed, (u64)(r * s.S + j), pdrop);
                if (w == 0.0) continue;
                for (i64 e = 0; e < s.DV; ++e) acc[e] += (float)w * ldf(v, off4(v, b, kh, j, e));
            }
        }
        for (i64 e = 0; e < s.DV; ++e) stf(out, off4(out, b, h, i, e), acc[e]);
        if (has_lse) stf(lse, lse.off + b * lse.st[0] + h * lse.st[1] + i * lse.st[2], (float)lsev);
    }
}

// dS(i, j) * scale for query (b, h, i) and key j, with its dropout-scaled weight in `pz`.
// delta(i) = gout(i) . out(i): read from `delta` when the host computed it, else here.
__device__ __forceinline__ double attn_delta(const T& delta, const T& gout, const T& out, const AttnShape& s, i64 b,
                                             i64 h, i64 i) {
    if (delta.p != 0) return (double)ldf(delta, delta.off + b * delta.st[0] + h * delta.st[1] + i * delta.st[2]);
    double acc = 0.0;
    for (i64 e = 0; e < s.DV; ++e) acc += (double)ldf(gout, off4(gout, b, h, i, e)) * (double)ldf(out, off4(out, b, h, i, e));
    return acc;
}

__device__ __forceinline__ double attn_ds(const T& q, const T& k, const T& v, const T& mask, int has_mask,
                                          const T& lse, const T& gout, double dl, double scale, int causal,
                                          double pdrop, u64 seed, const AttnShape& s, i64 b, i64 h, i64 i, i64 j,
                                          double& pz) {
    pz = 0.0;
    if (causal && j > i) return 0.0;
    double l = (double)ldf(lse, lse.off + b * lse.st[0] + h * lse.st[1] + i * lse.st[2]);
    if (l == -1.0 / 0.0) return 0.0;
    double p = exp(attn_score(q, k, mask, has_mask, scale, causal, s, b, h, i, j) - l);
    u64 r = (u64)((b * s.HQ + h) * s.TQ + i);
    double z = attn_drop(seed, r * (u64)s.S + (u64)j, pdrop);
    i64 kh = h / (s.HQ / s.HKV);
    double dp = 0.0;
    for (i64 e = 0; e < s.DV; ++e) dp += (double)ldf(gout, off4(gout, b, h, i, e)) * (double)ldf(v, off4(v, b, kh, j, e));
    dp *= z;
    pz = p * z;
    return p * (dp - dl) * scale;
}

extern "C" __global__ void k_attn_bwd_q(T q, T k, T v, T mask, int has_mask, T lse, T gout, T delta, T out,
                                        T gq, double scale, int causal, double pdrop, u64 seed, AttnShape s) {
    LOOP(r, s.B * s.HQ * s.TQ) {
        i64 i = r % s.TQ;
        i64 h = (r / s.TQ) % s.HQ;
        i64 b = r / (s.TQ * s.HQ);
        i64 kh = h / (s.HQ / s.HKV);
        float acc[ATTN_MAXD];
        for (i64 e = 0; e < s.D; ++e) acc[e] = 0.f;
        double dl = attn_delta(delta, gout, out, s, b, h, i);
        for (i64 j = 0; j < s.S; ++j) {
            double pz;
            double ds = attn_ds(q, k, v, mask, has_mask, lse, gout, dl, scale, causal, pdrop, seed, s, b, h, i, j, pz);
            if (ds == 0.0) continue;
            for (i64 e = 0; e < s.D; ++e) acc[e] += (float)ds * ldf(k, off4(k, b, kh, j, e));
        }
        for (i64 e = 0; e < s.D; ++e) stf(gq, off4(gq, b, h, i, e), acc[e]);
    }
}

extern "C" __global__ void k_attn_bwd_kv(T q, T k, T v, T mask, int has_mask, T lse, T gout, T delta, T out, T gk,
                                         T gv, double scale, int causal, double pdrop, u64 seed, AttnShape s) {
    LOOP(r, s.B * s.HKV * s.S) {
        i64 j = r % s.S;
        i64 kh = (r / s.S) % s.HKV;
        i64 b = r / (s.S * s.HKV);
        i64 group = s.HQ / s.HKV;
        float ak[ATTN_MAXD], av[ATTN_MAXD];
        for (i64 e = 0; e < s.D; ++e) ak[e] = 0.f;
        for (i64 e = 0; e < s.DV; ++e) av[e] = 0.f;
        for (i64 h = kh * group; h < (kh + 1) * group; ++h) {
            for (i64 i = 0; i < s.TQ; ++i) {
                double pz;
                double dl = attn_delta(delta, gout, out, s, b, h, i);
                double ds = attn_ds(q, k, v, mask, has_mask, lse, gout, dl, scale, causal, pdrop, seed, s, b, h, i, j, pz);
                if (ds != 0.0)
                    for (i64 e = 0; e < s.D; ++e) ak[e] += (float)ds * ldf(q, off4(q, b, h, i, e));
                if (pz != 0.0)
                    for (i64 e = 0; e < s.DV; ++e) av[e] += (float)pz * ldf(gout, off4(gout, b, h, i, e));
            }
        }
        for (i64 e = 0; e < s.D; ++e) stf(gk, off4(gk, b, kh, j, e), ak[e]);
        for (i64 e = 0; e < s.DV; ++e) stf(gv, off4(gv, b, kh, j, e), av[e]);
    }
}
