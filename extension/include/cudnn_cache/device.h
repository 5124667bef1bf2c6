#pragma once

// Where measurements come from: the GPU model and the cuDNN release. See Note [Selection, merge and fallback
// policy] for why a ranking is only used where it was measured.

#include <cstdint>
#include <iosfwd>
#include <string>
#include <tuple>

namespace cudnn_cache {

// What makes two GPUs interchangeable for tuning: the same product, architecture and size.
struct DeviceIdentity {
  std::string name;  // e.g. "NVIDIA H200"
  std::int32_t compute_capability_major = 0;
  std::int32_t compute_capability_minor = 0;
  std::int32_t multiprocessor_count = 0;

  // The identity of CUDA device `index`. Throws Error if there is no such device (or no GPU at all).
  static DeviceIdentity of_device(int index);

  auto tie() const { return std::tie(name, compute_capability_major, compute_capability_minor, multiprocessor_count); }
};

inline bool operator==(const DeviceIdentity& a, const DeviceIdentity& b) { return a.tie() == b.tie(); }
inline bool operator!=(const DeviceIdentity& a, const DeviceIdentity& b) { return !(a == b); }
inline bool operator<(const DeviceIdentity& a, const DeviceIdentity& b) { return a.tie() < b.tie(); }

// "NVIDIA H200 (sm_90, 132 SMs)".
std::ostream& operator<<(std::ostream& out, const DeviceIdentity& device);

// A cuDNN release, as CUDNN_VERSION encodes it: major * 10000 + minor * 100 + patch.
struct CudnnVersion {
  std::int32_t major = 0;
  std::int32_t minor = 0;
  std::int32_t patch = 0;

  // The cuDNN library this process runs (cudnnGetVersion; needs no GPU).
  static CudnnVersion of_library();
  static CudnnVersion from_number(std::uint32_t number);
  std::uint32_t number() const { return static_cast<std::uint32_t>(major * 10000 + minor * 100 + patch); }
};

// "9.19.0".
std::ostream& operator<<(std::ostream& out, const CudnnVersion& version);

// The version of the CUDA runtime this process runs (cudaRuntimeGetVersion; needs no GPU), e.g. 13000.
std::uint32_t cuda_runtime_version();

// The device and cuDNN major.minor a ranking was measured on. Patch releases of cuDNN keep their engines,
// so the patch level is not part of it.
struct Origin {
  DeviceIdentity device;
  std::int32_t cudnn_major = 0;
  std::int32_t cudnn_minor = 0;

  // The origin of measurements taken now on CUDA device `index`.
  static Origin of_device(int index);
  static Origin of(const DeviceIdentity& device, const CudnnVersion& version) {
    return {device, version.major, version.minor};
  }
  // True when rankings of this origin were measured with the given cuDNN's major.minor.
  bool same_cudnn(const CudnnVersion& version) const {
    return cudnn_major == version.major && cudnn_minor == version.minor;
  }

  auto tie() const { return std::tie(device, cudnn_major, cudnn_minor); }
};

inline bool operator==(const Origin& a, const Origin& b) { return a.tie() == b.tie(); }
inline bool operator!=(const Origin& a, const Origin& b) { return !(a == b); }
inline bool operator<(const Origin& a, const Origin& b) { return a.tie() < b.tie(); }

// "NVIDIA H200 (sm_90, 132 SMs), cuDNN 9.19".
std::ostream& operator<<(std::ostream& out, const Origin& origin);

}  // namespace cudnn_cache
