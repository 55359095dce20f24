// Lantern shim: the apache-tvm wheel lacks this header. It provides the two
// IEEE conversion templates TVM's runtime instantiates (half <-> float),
// written for normal, subnormal, infinite and NaN inputs; results round to
// nearest even.
#ifndef LANTERN_SHIM_BUILTIN_FP16_H_
#define LANTERN_SHIM_BUILTIN_FP16_H_

#include <cstdint>
#include <cstring>

template <typename SRC_T, typename SRC_REP_T, int SRC_SIG_BITS, typename DST_T, typename DST_REP_T,
          int DST_SIG_BITS>
static inline DST_T __extendXfYf2__(SRC_T a) {
  static_assert(SRC_SIG_BITS == 10 && DST_SIG_BITS == 23, "only half -> float is provided");
  uint32_t h = static_cast<uint16_t>(a);
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    int shift = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++shift;
    }
    bits = sign | ((113u - shift) << 23) | ((mant & 0x3ffu) << 13);
  }
  DST_T out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

template <typename SRC_T, typename SRC_REP_T, int SRC_SIG_BITS, typename DST_T, typename DST_REP_T,
          int DST_SIG_BITS>
static inline DST_T __truncXfYf2__(SRC_T a) {
  static_assert(SRC_SIG_BITS == 23 && DST_SIG_BITS == 10, "only float -> half is provided");
  uint32_t f;
  std::memcpy(&f, &a, sizeof(f));
  uint32_t sign = (f >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((f >> 23) & 0xffu) - 127 + 15;
  uint32_t mant = f & 0x7fffffu;
  if (((f >> 23) & 0xffu) == 0xffu) return static_cast<DST_T>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  if (exp >= 0x1f) return static_cast<DST_T>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<DST_T>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<DST_T>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<DST_T>(half);
}

#endif  // LANTERN_SHIM_BUILTIN_FP16_H_
