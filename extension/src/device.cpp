#include "cudnn_cache/device.h"

#include <cuda_runtime_api.h>

#include <ostream>

#include "cudnn_cache/cudnn.h"
#include "cudnn_cache/error.h"

namespace cudnn_cache {

DeviceIdentity DeviceIdentity::of_device(int index) {
  cudaDeviceProp properties{};
  const cudaError_t status = cudaGetDeviceProperties(&properties, index);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later CUDA calls are not blamed for this one
    throw Error(detail::concat("cannot read the properties of CUDA device ", index, ": ", cudaGetErrorString(status),
                               "; tuning and cached execution need a GPU"));
  }
  return {properties.name, properties.major, properties.minor, properties.multiProcessorCount};
}

std::ostream& operator<<(std::ostream& out, const DeviceIdentity& device) {
  return out << device.name << " (sm_" << device.compute_capability_major << device.compute_capability_minor << ", "
             << device.multiprocessor_count << " SMs)";
}

CudnnVersion CudnnVersion::of_library() { return from_number(static_cast<std::uint32_t>(cudnnGetVersion())); }

CudnnVersion CudnnVersion::from_number(std::uint32_t number) {
  const auto n = static_cast<std::int32_t>(number);
  return {n / 10000, (n / 100) % 100, n % 100};
}

std::ostream& operator<<(std::ostream& out, const CudnnVersion& version) {
  return out << version.major << '.' << version.minor << '.' << version.patch;
}

std::uint32_t cuda_runtime_version() {
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) return 0;
  return static_cast<std::uint32_t>(version);
}

Origin Origin::of_device(int index) { return of(DeviceIdentity::of_device(index), CudnnVersion::of_library()); }

std::ostream& operator<<(std::ostream& out, const Origin& origin) {
  return out << origin.device << ", cuDNN " << origin.cudnn_major << '.' << origin.cudnn_minor;
}

}  // namespace cudnn_cache
