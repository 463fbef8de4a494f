// quants.cuh - ggml's weight blocks read on the device: one struct per type with its block geometry,
// `value(block, i)` (element i of a block, the CPU's dequantize_row value for value), and for the
// 32-value integer types `dot_q8_1(block, act)`, the block's dot product with a q8_1 activation block
// through dp4a (the CPU's vec_dot with the same activation quants: q8_0's for the types without a
// min, q8_1's with s for Q4_1 / Q5_1).
#pragma once
#include "common.cuh"

// q8_1: the activations' format for the integer products (d, s = d * sum(qs) as f16, 32 int8).
struct BlockQ8_1 {
    uint16_t d, s;
    int8_t qs[32];
};

struct TypeF32 {
    static constexpr int block_size = 1, block_bytes = 4;
    __device__ static float value(const uint8_t* b, int) { return *reinterpret_cast<const float*>(b); }
};
struct TypeF16 {
    static constexpr int block_size = 1, block_bytes = 2;
    __device__ static float value(const uint8_t* b, int) { return f16_bits_to_float(load_u16(b)); }
};
struct TypeBF16 {
    static constexpr int block_size = 1, block_bytes = 2;
    __device__ static float value(const uint8_t* b, int) { return bf16_bits_to_float(load_u16(b)); }
};

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

struct TypeQ4_0 {
    static constexpr int block_size = 32, block_bytes = 18;
    __device__ static float value(const uint8_t* b, int i) { return f16_bits_to_float(load_u16(b)) * (nibble32(b + 2, i) - 8); }
    __device__ static float dot_q8_1(const uint8_t* b, const BlockQ8_1* y) {
        const int sum = dot32_dp4a([&](int j) { return minus_offset4(nibbles4(b + 2, j), 8); }, y);
        return f16_bits_to_float(load_u16(b)) * f16_bits_to_float(y->d) * sum;
    }
};
struct TypeQ4_1 {
    static constexpr int block_size = 32, block_bytes = 20;
    __device__ static float value(const uint8_t* b, int i) {
        return f16_bits_to_float(load_u16(b)) * nibble32(b + 4, i) + f16_bits_to_float(load_u16(b + 2));
    }
    __device__ static float dot_q8_1(const uint8_t* b, const BlockQ8_1* y) {
        const int sum = dot32_dp4a([&](int j) { return nibbles4(b + 4, j); }, y);
        return f16_bits_to_float(load_u16(b)) * f16_bits_to_float(y->d) * sum + f16_bits_to_float(load_u16(b + 2)) * f16_bits_to_float(y->s);
    }
};
struct TypeQ5_0 {
    static constexpr int block_size = 32, block_bytes = 22;
    __device__ static float value(const uint8_t* b, int i) {
        return f16_bits_to_float(load_u16(b)) * ((nibble32(b + 6, i) | bit5(b + 2, i)) - 16);
    }
    __device__ static float dot_q8_1(const uint8_t* b, const BlockQ8_1* y) {
        const int sum = dot32_dp4a([&](int j) { return minus_offset4(nibbles4(b + 6, j) | fifth_bits4(b + 2, j), 16); }, y);
        return f16_bits_to_float(load_u16(b)) * f16_bits_to_float(y->d) * sum;
    }
};
struct TypeQ5_1 {
    static constexpr int block_size = 32, block_bytes = 24;
    __device__ static float value(const uint8_t* b, int i) {
        return f16_bits_to_float(load_u16(b)) * (nibble32(b + 8, i) | bit5(b + 4, i)) + f16_bits_to_float(load_u16(b + 2));
    }
    __device__ static float dot_q8_1(const uint8_t* b, const BlockQ8_1* y) {
        const int sum = dot32_dp4a([&](int j) { return nibbles4(b + 8, j) | fifth_bits4(b + 4, j); }, y);
        return f16_bits_to_float(load_u16(b)) * f16_bits_to_float(y->d) * sum + f16_bits_to_float(load_u16(b + 2)) * f16_bits_to_float(y->s);
    }
};
struct TypeQ8_0 {
    static constexpr int block_size = 32, block_bytes = 34;
    __device__ static float value(const uint8_t* b, int i) { return f16_bits_to_float(load_u16(b)) * int8_t(b[2 + i]); }
    __device__ static float dot_q8_1(const uint8_t* b, const BlockQ8_1* y) {
        const int sum = dot32_dp4a([&](int j) { return load_int_b2(b + 2 + 4 * j); }, y);
        return f16_bits_to_float(load_u16(b)) * f16_bits_to_float(y->d) * sum;
    }
};

// IQ4_NL's non-linear levels (ggml's kvalues_iq4nl).
__device__ __forceinline__ int iq4nl_level(int index) {
    constexpr int8_t levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    return levels[index];
}
struct TypeIQ4_NL {
    static constexpr int block_size = 32, block_bytes = 18;
    __device__ static float value(const uint8_t* b, int i) { return f16_bits_to_float(load_u16(b)) * iq4nl_level(nibble32(b + 2, i)); }
    __device__ static float dot_q8_1(const uint8_t* b, const BlockQ8_1* y) {
        auto quad = [&](int j) {
            const int idx = nibbles4(b + 2, j);
            int packed = 0;
            for (int k = 0; k < 4; k++) packed |= (iq4nl_level(idx >> (8 * k) & 0xF) & 0xFF) << (8 * k);
            return packed;
        };
        return f16_bits_to_float(load_u16(b)) * f16_bits_to_float(y->d) * dot32_dp4a(quad, y);
    }
};

// ---- K-quants: 256-value super-blocks ------------------------------------------------------------------
// Element i of a super-block that ggml dequantizes in 128-value halves of four 32-value groups: its
// half, group and position in the group.
struct KPos {
    int half, group, pos;
    __device__ explicit KPos(int i) : half(i / 128), group(i % 128 / 32), pos(i % 32) {}
};

struct TypeQ2_K {  // scales[16] (scale | min << 4), qs[64], d, dmin
    static constexpr int block_size = 256, block_bytes = 84;
    __device__ static float value(const uint8_t* b, int i) {
        const KPos p(i);
        const int sc = b[p.half * 8 + p.group * 2 + p.pos / 16];
        const int q = b[16 + p.half * 32 + p.pos] >> (2 * p.group) & 3;
        return f16_bits_to_float(load_u16(b + 80)) * (sc & 0xF) * q - f16_bits_to_float(load_u16(b + 82)) * (sc >> 4);
    }
};
struct TypeQ3_K {  // hmask[32], qs[64], scales[12] (16 six-bit scales + 32), d
    static constexpr int block_size = 256, block_bytes = 110;
    __device__ static float value(const uint8_t* b, int i) {
        const KPos p(i);
        const uint8_t* scales = b + 96;
        const int s = p.half * 8 + p.group * 2 + p.pos / 16;
        const int low = s < 8 ? scales[s] & 0xF : scales[s - 8] >> 4;
        const int high = scales[8 + s % 4] >> (2 * (s / 4)) & 3;
        const int q = b[32 + p.half * 32 + p.pos] >> (2 * p.group) & 3;
        const bool top = b[p.pos] >> (p.half * 4 + p.group) & 1;
        return f16_bits_to_float(load_u16(b + 108)) * ((low | high << 4) - 32) * (q - (top ? 0 : 4));
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
struct TypeQ4_K {  // d, dmin, scales[12], qs[128]: 64-value groups, low nibbles then high
    static constexpr int block_size = 256, block_bytes = 144;
    __device__ static float value(const uint8_t* b, int i) {
        const int group = i / 64, sub = i / 32, pos = i % 32;
        int scale, min;
        scale_min_k4(b + 4, sub, &scale, &min);
        const int q = b[16 + group * 32 + pos] >> (4 * (sub % 2)) & 0xF;
        return f16_bits_to_float(load_u16(b)) * scale * q - f16_bits_to_float(load_u16(b + 2)) * min;
    }
};
struct TypeQ5_K {  // d, dmin, scales[12], qh[32], qs[128]
    static constexpr int block_size = 256, block_bytes = 176;
    __device__ static float value(const uint8_t* b, int i) {
        const int group = i / 64, sub = i / 32, pos = i % 32;
        int scale, min;
        scale_min_k4(b + 4, sub, &scale, &min);
        const int q = (b[48 + group * 32 + pos] >> (4 * (sub % 2)) & 0xF) | (b[16 + pos] >> sub & 1) << 4;
        return f16_bits_to_float(load_u16(b)) * scale * q - f16_bits_to_float(load_u16(b + 2)) * min;
    }
};
struct TypeQ6_K {  // ql[128], qh[64], scales[16] (int8), d
    static constexpr int block_size = 256, block_bytes = 210;
    __device__ static float value(const uint8_t* b, int i) {
        const KPos p(i);  // group = which quarter of the half
        const int low = b[p.half * 64 + p.pos + (p.group % 2) * 32] >> (4 * (p.group / 2)) & 0xF;
        const int high = b[128 + p.half * 32 + p.pos] >> (2 * p.group) & 3;
        const int scale = int8_t(b[192 + p.half * 8 + p.pos / 16 + 2 * p.group]);
        return f16_bits_to_float(load_u16(b + 208)) * scale * ((low | high << 4) - 32);
    }
};

// Element i of a row of type T.
template <class T> __device__ __forceinline__ float row_value(const uint8_t* row, int i) {
    return T::value(row + (i / T::block_size) * T::block_bytes, i % T::block_size);
}

// X(name, Type) for every weight type, and for those with a dp4a product: one kernel per type without
// repeating the lists.
#define LLM_FOR_EACH_WEIGHT_TYPE(X) \
    X(f32, TypeF32) X(f16, TypeF16) X(bf16, TypeBF16) X(q4_0, TypeQ4_0) X(q4_1, TypeQ4_1) X(q5_0, TypeQ5_0) \
    X(q5_1, TypeQ5_1) X(q8_0, TypeQ8_0) X(iq4_nl, TypeIQ4_NL) X(q2_K, TypeQ2_K) X(q3_K, TypeQ3_K) X(q4_K, TypeQ4_K) \
    X(q5_K, TypeQ5_K) X(q6_K, TypeQ6_K)
#define LLM_FOR_EACH_DP4A_TYPE(X) \
    X(q4_0, TypeQ4_0) X(q4_1, TypeQ4_1) X(q5_0, TypeQ5_0) X(q5_1, TypeQ5_1) X(q8_0, TypeQ8_0) X(iq4_nl, TypeIQ4_NL)
