// quants.cuh - ggml's weight blocks read on the device: one struct per type with its block geometry,
// `value(block, i)` (element i of a block, the CPU's dequantize_row value for value), and the block's
// integer dot product with an activation block through dp4a (the CPU's vec_dot with the same
// activation quants): `dot_q8_1(block, act)` for the 32-value types (q8_0's quants for the types
// without a min, q8_1's with s for Q4_1 / Q5_1), `dot_q8_K(block, act)` for the K-quants.
#pragma once
#include "common.cuh"
#include "params.h"

// q8_1: the activations' format for the integer products (d, s = d * sum(qs) as f16, 32 int8).
struct BlockQ8_1 {
    uint16_t d, s;
    int8_t qs[32];
};

// The float types: activation(x) is x as the CPU's dot product takes it against this type (ggml
// converts activations to the weight's own type: f16, bf16 rounding).
struct TypeF32 {
    static constexpr int block_size = 1, block_bytes = 4;
    __device__ static float value(const uint8_t* b, int) { return *reinterpret_cast<const float*>(b); }
    __device__ static float activation(float x) { return x; }
};
struct TypeF16 {
    static constexpr int block_size = 1, block_bytes = 2;
    __device__ static float value(const uint8_t* b, int) { return f16_bits_to_float(load_u16(b)); }
    __device__ static float activation(float x) { return f16_bits_to_float(float_to_f16_bits(x)); }
    __device__ static void quantize(const float* x, uint8_t* b) { *reinterpret_cast<uint16_t*>(b) = float_to_f16_bits(*x); }
};
struct TypeBF16 {
    static constexpr int block_size = 1, block_bytes = 2;
    __device__ static float value(const uint8_t* b, int) { return bf16_bits_to_float(load_u16(b)); }
    __device__ static float activation(float x) {  // round to nearest even, quiet NaNs (the CPU's fp32_to_bf16)
        const uint32_t bits = uint32_t(__float_as_int(x));
        const uint32_t rounded = (bits & 0x7fffffffu) > 0x7f800000u ? (bits | 0x400000u) : bits + 0x7fffu + (bits >> 16 & 1);
        return bf16_bits_to_float(uint16_t(rounded >> 16));
    }
};

// One warp rounds 32 values (lane l holds value l) to a q8_1 block as the CPU's run-time quantizer:
// d = amax / 127, q = round-half-even(x * 127 / amax), s = d * sum(q) clamped to f16.
__device__ __forceinline__ void quantize_warp_q8_1(float v, BlockQ8_1* out, int lane) {
    const float amax = warp_reduce(fabsf(v), MaxOp());
    const float d = amax / 127, inv = amax != 0.0f ? 127.f / amax : 0.0f;
    const int q = int(rintf(v * inv));
    const float sum = warp_sum(float(q));  // exact: |sum| <= 32 * 127
    out->qs[lane] = int8_t(q);
    if (lane == 0) {
        out->d = float_to_f16_bits(d);
        out->s = float_to_f16_bits(fminf(65504.0f, fmaxf(-65504.0f, sum * d)));
    }
}

// The 4-bit index of element i of a 32-value block's 16 quant bytes (low nibbles first, then high).
__device__ __forceinline__ int nibble32(const uint8_t* qs, int i) { return i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4; }
// The fifth bit of element i from a 32-bit qh mask.
__device__ __forceinline__ int bit5(const uint8_t* qh, int i) { return (qh[i / 8] >> (i % 8) & 1) << 4; }

// Sum of the dp4a products of a 32-value block whose values (already offset as the type needs, in
// int8) come from `quad(j)`: four values packed per int, j = 0..7 covering values 4j..4j+3.
template <class Quad> __device__ __forceinline__ int dot32_dp4a(Quad quad, const BlockQ8_1* y) {
    int sum = 0;
    for (int j = 0; j < 8; j++) sum = __dp4a(quad(j), load_int_b2(reinterpret_cast<const uint8_t*>(y->qs) + 4 * j), sum);
    return sum;
}
// Values 4j..4j+3 of a 4-bit block as unsigned bytes 0..15 (low nibbles for j < 4, high for j >= 4).
__device__ __forceinline__ int nibbles4(const uint8_t* qs, int j) {
    return (load_int_b2(qs + 4 * (j % 4)) >> (4 * (j / 4))) & 0x0F0F0F0F;
}
// Their fifth bits (from qh) moved to bit 4 of each byte.
__device__ __forceinline__ int fifth_bits4(const uint8_t* qh, int j) {
    const uint32_t bits = uint32_t(load_int_b2(qh)) >> (4 * j);
    return int((bits & 1) << 4 | (bits & 2) << 11 | (bits & 4) << 18 | (bits & 8) << 25);
}

// Four unsigned bytes q in [0, 2 * offset) as the signed bytes q - offset, without borrows between
// bytes: q + 128 - offset stays below 256, and flipping the top bit subtracts 128. Keeps the offset in
// the integer sum (exact, as the CPU's q8_0 product) rather than through q8_1's f16 s.
__device__ __forceinline__ int minus_offset4(int q, int offset) { return int((uint32_t(q) + 0x01010101u * (128 - offset)) ^ 0x80808080u); }

// The value of largest magnitude among n (the first of equals), with its sign (ggml's max for Q4_0 / IQ4_NL).
__device__ __forceinline__ float signed_absmax(const float* x, int n) {
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) amax = fabsf(x[j]), mx = x[j];
    return mx;
}
// What the 32-value integer types share (CRTP): each gives its values 4j..4j+3 as four int8 packed in an
// int, quad(b, j) (offset applied, so they multiply q8_1 quants directly: dp4a here, the tensor cores'
// int8 tiles in mma.cuh) and, with has_min, its min m(b), which multiplies q8_1's s; d(b) is the scale.
template <class T> struct Quant32 {
    static constexpr int block_size = 32;
    __device__ static float d(const uint8_t* b) { return f16_bits_to_float(load_u16(b)); }  // every one starts with d as f16
    __device__ static float dot_q8_1(const uint8_t* b, const BlockQ8_1* y) {
        const float r = T::d(b) * f16_bits_to_float(y->d) * dot32_dp4a([&](int j) { return T::quad(b, j); }, y);
        if constexpr (T::has_min) return r + T::m(b) * f16_bits_to_float(y->s);
        else return r;
    }
};

// A block's 32 4-bit indices l[] packed as ggml stores them (element j low, j + 16 high).
__device__ __forceinline__ void pack_nibbles32(const uint8_t* l, uint8_t* qs) {
    for (int j = 0; j < 16; j++) qs[j] = uint8_t(l[j] | l[j + 16] << 4);
}

// quantize(x, block): the KV cache's rounding of 32 values, one thread per block, operation for
// operation the CPU's quantize_row (llm.hpp section 5) so cache rows are bit-identical.
struct TypeQ4_0 : Quant32<TypeQ4_0> {
    static constexpr int block_bytes = 18;
    static constexpr bool has_min = false;
    __device__ static float value(const uint8_t* b, int i) { return f16_bits_to_float(load_u16(b)) * (nibble32(b + 2, i) - 8); }
    __device__ static void quantize(const float* x, uint8_t* b) {  // d = max / -8, q = x / d + 8.5 truncated
        const float d = signed_absmax(x, 32) / -8, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t l[32];
        for (int j = 0; j < 32; j++) {
            const int q = int(x[j] * id + 8.5f);
            l[j] = uint8_t(q < 15 ? q : 15);
        }
        *reinterpret_cast<uint16_t*>(b) = float_to_f16_bits(d);
        pack_nibbles32(l, b + 2);
    }
    __device__ static int quad(const uint8_t* b, int j) { return minus_offset4(nibbles4(b + 2, j), 8); }
};
struct TypeQ4_1 : Quant32<TypeQ4_1> {
    static constexpr int block_bytes = 20;
    static constexpr bool has_min = true;
    __device__ static float value(const uint8_t* b, int i) {
        return f16_bits_to_float(load_u16(b)) * nibble32(b + 4, i) + f16_bits_to_float(load_u16(b + 2));
    }
    __device__ static float m(const uint8_t* b) { return f16_bits_to_float(load_u16(b + 2)); }
    __device__ static int quad(const uint8_t* b, int j) { return nibbles4(b + 4, j); }
};
struct TypeQ5_0 : Quant32<TypeQ5_0> {
    static constexpr int block_bytes = 22;
    static constexpr bool has_min = false;
    __device__ static float value(const uint8_t* b, int i) {
        return f16_bits_to_float(load_u16(b)) * ((nibble32(b + 6, i) | bit5(b + 2, i)) - 16);
    }
    __device__ static int quad(const uint8_t* b, int j) { return minus_offset4(nibbles4(b + 6, j) | fifth_bits4(b + 2, j), 16); }
};
struct TypeQ5_1 : Quant32<TypeQ5_1> {
    static constexpr int block_bytes = 24;
    static constexpr bool has_min = true;
    __device__ static float value(const uint8_t* b, int i) {
        return f16_bits_to_float(load_u16(b)) * (nibble32(b + 8, i) | bit5(b + 4, i)) + f16_bits_to_float(load_u16(b + 2));
    }
    __device__ static float m(const uint8_t* b) { return f16_bits_to_float(load_u16(b + 2)); }
    __device__ static int quad(const uint8_t* b, int j) { return nibbles4(b + 8, j) | fifth_bits4(b + 4, j); }
};
struct TypeQ8_0 : Quant32<TypeQ8_0> {
    static constexpr int block_bytes = 34;
    static constexpr bool has_min = false;
    __device__ static float value(const uint8_t* b, int i) { return f16_bits_to_float(load_u16(b)) * int8_t(b[2 + i]); }
    __device__ static void quantize(const float* x, uint8_t* b) {  // the run-time rounding: id = 127 / amax, half to even
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        *reinterpret_cast<uint16_t*>(b) = float_to_f16_bits(amax / 127);
        for (int j = 0; j < 32; j++) b[2 + j] = uint8_t(int8_t(rintf(x[j] * id)));
    }
    __device__ static int quad(const uint8_t* b, int j) { return load_int_b2(b + 2 + 4 * j); }
};

// IQ4_NL's non-linear levels (ggml's kvalues_iq4nl).
__device__ __forceinline__ int iq4nl_level(int index) {
    constexpr int8_t levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    return levels[index];
}
// The IQ4_NL level nearest x (ties to the lower), ggml's best_index_int8.
__device__ __forceinline__ int iq4nl_nearest(float x) {
    if (x <= iq4nl_level(0)) return 0;
    if (x >= iq4nl_level(15)) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < iq4nl_level(mid)) hi = mid;
        else lo = mid;
    }
    return x - iq4nl_level(hi - 1) < iq4nl_level(hi) - x ? hi - 1 : hi;
}
struct TypeIQ4_NL : Quant32<TypeIQ4_NL> {
    static constexpr int block_bytes = 18;
    static constexpr bool has_min = false;
    __device__ static float value(const uint8_t* b, int i) { return f16_bits_to_float(load_u16(b)) * iq4nl_level(nibble32(b + 2, i)); }
    // ggml's quantize_row_iq4_nl_ref: levels from d = max / -127, then one least-squares refit of d
    // weighted by x^2; a block below GROUP_MAX_EPS is all zero.
    __device__ static void quantize(const float* x, uint8_t* b) {
        const float mx = signed_absmax(x, 32);
        uint8_t l[32] = {};
        float d = 0.0f;
        if (fabsf(mx) >= 1e-15f) {
            const float id = 1 / (mx / iq4nl_level(0));
            float sumqx = 0.0f, sumq2 = 0.0f;
            for (int j = 0; j < 32; j++) {
                l[j] = uint8_t(iq4nl_nearest(id * x[j]));
                const float q = float(iq4nl_level(l[j])), w = x[j] * x[j];
                sumqx += w * q * x[j];
                sumq2 += w * q * q;
            }
            d = sumqx / sumq2;
        }
        *reinterpret_cast<uint16_t*>(b) = float_to_f16_bits(d);
        pack_nibbles32(l, b + 2);
    }
    __device__ static int quad(const uint8_t* b, int j) {
        const int idx = nibbles4(b + 2, j);
        int packed = 0;
        for (int k = 0; k < 4; k++) packed |= (iq4nl_level(idx >> (8 * k) & 0xF) & 0xFF) << (8 * k);
        return packed;
    }
};

// ---- K-quants: 256-value super-blocks ------------------------------------------------------------------
// Each type gives element i's integer quant (offset applied) qint(b, i), the integer scale (and min)
// of its 16-value sub-block j = i / 16, and the super-block's d (and dmin): value() is
// d * scale * q - dmin * min, the CPU's dequantization, and dot_q8_K() the integer product with a q8_K
// activation block (the CPU's vec_dot with the same activation quants) through dp4a. scale_width is
// the values per distinct scale (16, or 32 for Q4_K / Q5_K): the span of one tensor-core product (mma.cuh).

// q8_K: the activations of the K-quants' integer products (ggml's block_q8_K: d as a float, 256 int8,
// the sums of each 16 quants).
struct BlockQ8_K {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
};
static_assert(sizeof(BlockQ8_1) == kQ8_1Bytes && sizeof(BlockQ8_K) == kQ8_KBytes, "activation blocks as ggml lays them out");

template <class T> __device__ __forceinline__ float kquant_value(const uint8_t* b, int i) {
    const int j = i / 16;
    float v = T::d(b) * T::scale16(b, j) * T::qint(b, i);
    if constexpr (T::has_min) v -= T::dmin(b) * T::min16(b, j);
    return v;
}
// Elements i..i+3 (i % 4 == 0) of a K-quant block as four int8 packed in an int (dp4a's and the
// tensor cores' operand).
template <class T> __device__ __forceinline__ int kquant_quad(const uint8_t* b, int i) {
    return int(uint32_t(T::qint(b, i) & 0xFF) | uint32_t(T::qint(b, i + 1) & 0xFF) << 8 | uint32_t(T::qint(b, i + 2) & 0xFF) << 16 |
               uint32_t(T::qint(b, i + 3) & 0xFF) << 24);
}
template <class T> __device__ __forceinline__ float kquant_dot_q8_K(const uint8_t* b, const BlockQ8_K* y) {
    int isum = 0;
    for (int j = 0; j < 16; j++) {
        int sub = 0;
        for (int q = 0; q < 4; q++) {
            const int i = 16 * j + 4 * q;
            sub = __dp4a(kquant_quad<T>(b, i), *reinterpret_cast<const int*>(y->qs + i), sub);
        }
        isum += T::scale16(b, j) * sub;
    }
    float r = T::d(b) * y->d * isum;
    if constexpr (T::has_min) {
        int mins = 0;
        for (int j = 0; j < 16; j++) mins += y->bsums[j] * T::min16(b, j);
        r -= T::dmin(b) * y->d * mins;
    }
    return r;
}
// The members every K-quant shares (CRTP): value() and dot_q8_K() from its integer parts.
template <class T> struct KQuant {
    static constexpr int block_size = 256;
    __device__ static float value(const uint8_t* b, int i) { return kquant_value<T>(b, i); }
    __device__ static float dot_q8_K(const uint8_t* b, const BlockQ8_K* y) { return kquant_dot_q8_K<T>(b, y); }
};

// Element i of a super-block that ggml dequantizes in 128-value halves of four 32-value groups: its
// half, group and position in the group.
struct KPos {
    int half, group, pos;
    __device__ explicit KPos(int i) : half(i / 128), group(i % 128 / 32), pos(i % 32) {}
};

struct TypeQ2_K : KQuant<TypeQ2_K> {  // scales[16] (scale | min << 4), qs[64], d, dmin
    static constexpr int scale_width = 16, block_bytes = 84;
    static constexpr bool has_min = true;
    __device__ static float d(const uint8_t* b) { return f16_bits_to_float(load_u16(b + 80)); }
    __device__ static float dmin(const uint8_t* b) { return f16_bits_to_float(load_u16(b + 82)); }
    __device__ static int scale16(const uint8_t* b, int j) { return b[j] & 0xF; }
    __device__ static int min16(const uint8_t* b, int j) { return b[j] >> 4; }
    __device__ static int qint(const uint8_t* b, int i) {
        const KPos p(i);
        return b[16 + p.half * 32 + p.pos] >> (2 * p.group) & 3;
    }
};
struct TypeQ3_K : KQuant<TypeQ3_K> {  // hmask[32], qs[64], scales[12] (16 six-bit scales + 32), d
    static constexpr int scale_width = 16, block_bytes = 110;
    static constexpr bool has_min = false;
    __device__ static float d(const uint8_t* b) { return f16_bits_to_float(load_u16(b + 108)); }
    __device__ static float dmin(const uint8_t*) { return 0.0f; }
    __device__ static int scale16(const uint8_t* b, int j) {
        const uint8_t* scales = b + 96;
        const int low = j < 8 ? scales[j] & 0xF : scales[j - 8] >> 4;
        const int high = scales[8 + j % 4] >> (2 * (j / 4)) & 3;
        return (low | high << 4) - 32;
    }
    __device__ static int min16(const uint8_t*, int) { return 0; }
    __device__ static int qint(const uint8_t* b, int i) {
        const KPos p(i);
        const int q = b[32 + p.half * 32 + p.pos] >> (2 * p.group) & 3;
        const bool top = b[p.pos] >> (p.half * 4 + p.group) & 1;
        return q - (top ? 0 : 4);
    }
};
// Q4_K / Q5_K's 6-bit scale and min of 32-value sub-block j (ggml's get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(const uint8_t* q, int j, int* scale, int* min) {
    if (j < 4) {
        *scale = q[j] & 63;
        *min = q[j + 4] & 63;
    } else {
        *scale = (q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4;
        *min = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}
// What Q4_K and Q5_K share: d, dmin, scales[12] first, one scale and min per 32 values.
template <class T> struct KQuant45 : KQuant<T> {
    static constexpr bool has_min = true;
    static constexpr int scale_width = 32;  // values per scale (and min)
    __device__ static float d(const uint8_t* b) { return f16_bits_to_float(load_u16(b)); }
    __device__ static float dmin(const uint8_t* b) { return f16_bits_to_float(load_u16(b + 2)); }
    __device__ static int scale16(const uint8_t* b, int j) {
        int scale, min;
        scale_min_k4(b + 4, j / 2, &scale, &min);
        return scale;
    }
    __device__ static int min16(const uint8_t* b, int j) {
        int scale, min;
        scale_min_k4(b + 4, j / 2, &scale, &min);
        return min;
    }
};
struct TypeQ4_K : KQuant45<TypeQ4_K> {  // d, dmin, scales[12], qs[128]: 64-value groups, low nibbles then high
    static constexpr int block_bytes = 144;
    __device__ static int qint(const uint8_t* b, int i) { return b[16 + i / 64 * 32 + i % 32] >> (4 * (i / 32 % 2)) & 0xF; }
};
struct TypeQ5_K : KQuant45<TypeQ5_K> {  // d, dmin, scales[12], qh[32], qs[128]
    static constexpr int block_bytes = 176;
    __device__ static int qint(const uint8_t* b, int i) {
        return (b[48 + i / 64 * 32 + i % 32] >> (4 * (i / 32 % 2)) & 0xF) | (b[16 + i % 32] >> (i / 32) & 1) << 4;
    }
};
struct TypeQ6_K : KQuant<TypeQ6_K> {  // ql[128], qh[64], scales[16] (int8), d
    static constexpr int scale_width = 16, block_bytes = 210;
    static constexpr bool has_min = false;
    __device__ static float d(const uint8_t* b) { return f16_bits_to_float(load_u16(b + 208)); }
    __device__ static float dmin(const uint8_t*) { return 0.0f; }
    __device__ static int scale16(const uint8_t* b, int j) { return int8_t(b[192 + j]); }
    __device__ static int min16(const uint8_t*, int) { return 0; }
    __device__ static int qint(const uint8_t* b, int i) {
        const KPos p(i);  // group = which quarter of the half
        const int low = b[p.half * 64 + p.pos + (p.group % 2) * 32] >> (4 * (p.group / 2)) & 0xF;
        const int high = b[128 + p.half * 32 + p.pos] >> (2 * p.group) & 3;
        return (low | high << 4) - 32;
    }
};

// One warp rounds a 256-value block (lane l holds values 8l .. 8l + 7) to q8_K as the CPU does: the
// first value of largest magnitude m sets iscale = -127 / m, q = min(127, round-half-even(x * iscale)),
// d = 1 / iscale; an all-zero block is all zero.
__device__ __forceinline__ void quantize_warp_q8_K(const float* v, BlockQ8_K* out, int lane) {
    float amax = 0.0f, mx = 0.0f;
    int first = 256;  // index of mx
    for (int i = 0; i < 8; i++)
        if (fabsf(v[i]) > amax) amax = fabsf(v[i]), mx = v[i], first = 8 * lane + i;
    for (int offset = 16; offset > 0; offset >>= 1) {  // the largest magnitude, the lowest index of equals
        const float other_amax = __shfl_xor_sync(kFullMask, amax, offset), other_mx = __shfl_xor_sync(kFullMask, mx, offset);
        const int other_first = __shfl_xor_sync(kFullMask, first, offset);
        if (other_amax > amax || (other_amax == amax && other_first < first)) amax = other_amax, mx = other_mx, first = other_first;
    }
    const float iscale = amax != 0.0f ? -127.f / mx : 0.0f;
    int sum = 0;
    for (int i = 0; i < 8; i++) {
        const int q = int(rintf(iscale * v[i]));
        out->qs[8 * lane + i] = int8_t(q < 127 ? q : 127);
        sum += q < 127 ? q : 127;
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);  // lanes 2j and 2j + 1 hold sub-block j
    if (lane % 2 == 0) out->bsums[lane / 2] = int16_t(sum);
    if (lane == 0) out->d = amax != 0.0f ? 1 / iscale : 0.0f;
}

// Element i of a row of type T.
template <class T> __device__ __forceinline__ float row_value(const uint8_t* row, int i) {
    return T::value(row + (i / T::block_size) * T::block_bytes, i % T::block_size);
}

// X(name, Type) for every weight type, for the float types (multiplied by f32 activations), the
// 32-value types with a dp4a product against q8_1 and the K-quants with one against q8_K: one kernel
// per type without repeating the lists.
#define LLM_FOR_EACH_WEIGHT_TYPE(X) \
    X(f32, TypeF32) X(f16, TypeF16) X(bf16, TypeBF16) X(q4_0, TypeQ4_0) X(q4_1, TypeQ4_1) X(q5_0, TypeQ5_0) \
    X(q5_1, TypeQ5_1) X(q8_0, TypeQ8_0) X(iq4_nl, TypeIQ4_NL) X(q2_K, TypeQ2_K) X(q3_K, TypeQ3_K) X(q4_K, TypeQ4_K) \
    X(q5_K, TypeQ5_K) X(q6_K, TypeQ6_K)
#define LLM_FOR_EACH_FLOAT_TYPE(X) X(f32, TypeF32) X(f16, TypeF16) X(bf16, TypeBF16)
#define LLM_FOR_EACH_DP4A_TYPE(X) \
    X(q4_0, TypeQ4_0) X(q4_1, TypeQ4_1) X(q5_0, TypeQ5_0) X(q5_1, TypeQ5_1) X(q8_0, TypeQ8_0) X(iq4_nl, TypeIQ4_NL)
#define LLM_FOR_EACH_Q8_K_TYPE(X) X(q2_K, TypeQ2_K) X(q3_K, TypeQ3_K) X(q4_K, TypeQ4_K) X(q5_K, TypeQ5_K) X(q6_K, TypeQ6_K)
