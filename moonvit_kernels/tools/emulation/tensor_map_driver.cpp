// tensor_map_driver.cpp — cuTensorMapEncodeTiled with the driver's C signature, over the model of
// hopper.cuh (emu::hopper::encode_tiled). A launcher encodes its tensor maps through one function
// (cuda_backend/tensor_maps.encode) whose last step is the driver's entry point on a GPU and this one
// on the CPU, so the emulator checks the very arguments a GPU run passes. Enum values are cuda.h's
// (CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
// CUtensorMapFloatOOBfill); the requirements are the driver API reference's for this function.
#include <string>

#include "hopper.cuh"

namespace {
thread_local std::string g_last_error;

int invalid(const std::string& why) {
  g_last_error = why;
  return 1;  // CUDA_ERROR_INVALID_VALUE
}
}  // namespace

extern "C" int emu_cuTensorMapEncodeTiled(void* tensorMap, int dataType, unsigned rank, void* globalAddress,
                                          const unsigned long long* globalDim,
                                          const unsigned long long* globalStrides, const unsigned* boxDim,
                                          const unsigned* elementStrides, int interleave, int swizzle,
                                          int l2Promotion, int oobFill) {
  // element bytes of UINT8, UINT16, UINT32, INT32, UINT64, INT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16,
  // FLOAT32_FTZ, TFLOAT32, TFLOAT32_FTZ
  static const unsigned kElementBytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  g_last_error.clear();
  if (dataType < 0 || dataType > 12) return invalid("tensorDataType " + std::to_string(dataType) + " unknown");
  if (rank < 1 || rank > 5) return invalid("tensorRank must be 1..5 (the model takes 1..3)");
  if (interleave != 0) return invalid("interleaved layouts are not modelled (CU_TENSOR_MAP_INTERLEAVE_NONE only)");
  if (swizzle < 0 || swizzle > 3) return invalid("swizzle " + std::to_string(swizzle) + " is not NONE/32B/64B/128B");
  if (l2Promotion < 0 || l2Promotion > 3) return invalid("l2Promotion " + std::to_string(l2Promotion) + " unknown");
  if (oobFill < 0 || oobFill > 1) return invalid("oobFill " + std::to_string(oobFill) + " unknown");
  const unsigned esize = kElementBytes[dataType];
  for (unsigned i = 0; i < rank; ++i) {
    if (elementStrides[i] < 1 || elementStrides[i] > 8) return invalid("elementStrides must be 1..8");
    if (elementStrides[i] != 1) return invalid("elementStrides other than 1 are not modelled");
  }
  // globalStrides[i] is the byte distance of dimension i + 1 and must cover dimension i's extent
  for (unsigned i = 1; i < rank; ++i) {
    const unsigned long long below = i == 1 ? globalDim[0] * esize : globalDim[i - 1] * globalStrides[i - 2];
    if (globalStrides[i - 1] < below)
      return invalid("globalStrides[" + std::to_string(i - 1) + "] smaller than the extent of dimension " +
                     std::to_string(i - 1) + " (overlapping rows)");
  }
  static const int kSpan[] = {0, 32, 64, 128};
  std::string why;
  const int rc = emu::hopper::encode_tiled(tensorMap, esize, rank, globalAddress,
                                           reinterpret_cast<const uint64_t*>(globalDim),
                                           reinterpret_cast<const uint64_t*>(globalStrides), boxDim,
                                           kSpan[swizzle], oobFill, &why);
  return rc ? invalid(why) : 0;
}

extern "C" const char* emu_tensor_map_error() { return g_last_error.c_str(); }
