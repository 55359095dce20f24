// Lantern shim: the apache-tvm wheel lacks this header. NVTX ranges only matter
// for CUDA profiling, so in the wasm runtime they are no-ops.
#ifndef LANTERN_SHIM_TVM_SUPPORT_CUDA_NVTX_H_
#define LANTERN_SHIM_TVM_SUPPORT_CUDA_NVTX_H_

#include <string>

namespace tvm {
namespace support {

class NVTXScopedRange {
 public:
  explicit NVTXScopedRange(const char*) {}
  explicit NVTXScopedRange(const std::string&) {}
  NVTXScopedRange(const NVTXScopedRange&) = delete;
  NVTXScopedRange& operator=(const NVTXScopedRange&) = delete;
};

}  // namespace support
}  // namespace tvm

#define TVM_NVTX_FUNC_SCOPE()

#endif  // LANTERN_SHIM_TVM_SUPPORT_CUDA_NVTX_H_
