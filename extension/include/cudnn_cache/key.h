#pragma once

// Convolution keys: plain values that identify a cuDNN convolution problem.
//
// Note [Keys are values]
// ~~~~~~~~~~~~~~~~~~~~~~
// A key holds the *contents* of the cuDNN descriptors of a problem (never a descriptor pointer), so it can
// be hashed, compared, sorted, printed and written to disk, and it means the same thing in every process.
// Every key type is a standard-layout struct of std::int32_t fields with no padding, zero-initialised, with
// cuDNN enums stored as integers and unused array slots left at zero. That makes equality a memcmp and the
// hash a walk over the bytes (static_asserts below keep it so). There are two ways to get a key:
//   * from plain values (make_*_key), the fast path the ops take on every call, and
//   * from descriptors, decoded with the cuDNN getters (see descriptors.h): the seed's reverse lookup.
// Both must give the same key for every supported problem; tests/extension/test_key.cpp checks that
// exhaustively.
//
// Note [Canonical keys]
// ~~~~~~~~~~~~~~~~~~~~~
// Problems that cuDNN cannot tell apart must get one key, or the cache misses for no reason:
//   * Rank-3 tensors (N, C, L) of a 1-D convolution are carried as (N, C, 1, L), and its padding, stride and
//     dilation as (0, p), (1, s), (1, d), the way PyTorch hands 1-D convolutions to cuDNN.
//   * The stride of a size-1 dimension never addresses memory, so it is rewritten to the stride the
//     dimension would have in a packed tensor of the same layout: the extent of the dimension just inside
//     it. The layout is channels-last (NHWC/NDHWC) when the channel stride is smaller than the stride of some
//     spatial dimension of size > 1, and NCHW otherwise; so a tensor whose layout is ambiguous (C == 1, or
//     all spatial sizes 1) is keyed as NCHW, which describes the same bytes.
//   * Filters carry a format (cuDNN filter descriptors have no strides), which the caller chooses to match
//     the activations.

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <type_traits>
#include <vector>

#include "cudnn_cache/cudnn.h"

namespace cudnn_cache {

// cuDNN convolutions take 4-D and 5-D tensors: (N, C, H, W) and (N, C, D, H, W).
inline constexpr int kMaxTensorDims = 5;
inline constexpr int kMaxSpatialDims = kMaxTensorDims - 2;

// The three convolution computations, each with its own perf cache.
enum class Direction : std::int32_t { forward = 0, backward_data = 1, backward_filter = 2 };
inline constexpr int kDirectionCount = 3;

// "forward", "backward_data" or "backward_filter".
const char* to_string(Direction direction);
std::ostream& operator<<(std::ostream& out, Direction direction);

// Memory layout of activations and filters, with cuDNN's values.
enum class Layout : std::int32_t { nchw = CUDNN_TENSOR_NCHW, nhwc = CUDNN_TENSOR_NHWC };

// A read-only view of 64-bit integers (sizes, strides, padding...), cheap to make from any contiguous
// container. It does not own its data: pass it as an argument, do not store it.
class IntSpan {
 public:
  constexpr IntSpan() = default;
  constexpr IntSpan(const std::int64_t* data, std::size_t size) : data_(data), size_(size) {}
  // For literal arguments such as make_tensor_key(type, {8, 3, 32, 32}, Layout::nchw): the list lives until the
  // call returns, which is all a span needs.
#if defined(__GNUC__) && !defined(__clang__)  // a GCC warning; clang does not know it
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
#endif
  IntSpan(std::initializer_list<std::int64_t> values) : data_(values.begin()), size_(values.size()) {}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  IntSpan(const std::vector<std::int64_t>& values) : data_(values.data()), size_(values.size()) {}
  template <std::size_t N>
  constexpr IntSpan(const std::array<std::int64_t, N>& values) : data_(values.data()), size_(N) {}

  constexpr std::size_t size() const { return size_; }
  constexpr const std::int64_t* begin() const { return data_; }
  constexpr const std::int64_t* end() const { return data_ + size_; }
  constexpr std::int64_t operator[](std::size_t i) const { return data_[i]; }

 private:
  const std::int64_t* data_ = nullptr;
  std::size_t size_ = 0;
};

// The contents of a cudnnTensorDescriptor_t.
struct TensorKey {
  std::int32_t data_type = 0;  // cudnnDataType_t
  std::int32_t nb_dims = 0;
  std::array<std::int32_t, kMaxTensorDims> dims{};
  std::array<std::int32_t, kMaxTensorDims> strides{};
};

// The contents of a cudnnFilterDescriptor_t: dims are always (K, C/groups, [D,] R, S), whatever the format.
struct FilterKey {
  std::int32_t data_type = 0;  // cudnnDataType_t
  std::int32_t format = 0;     // cudnnTensorFormat_t
  std::int32_t nb_dims = 0;
  std::array<std::int32_t, kMaxTensorDims> dims{};
};

// The contents of a cudnnConvolutionDescriptor_t.
struct ConvolutionDescriptorKey {
  std::int32_t nb_spatial_dims = 0;
  std::array<std::int32_t, kMaxSpatialDims> padding{};
  std::array<std::int32_t, kMaxSpatialDims> stride{};
  std::array<std::int32_t, kMaxSpatialDims> dilation{};
  std::int32_t mode = 0;          // cudnnConvolutionMode_t
  std::int32_t compute_type = 0;  // cudnnDataType_t
  std::int32_t groups = 0;
  std::int32_t math_type = 0;  // cudnnMathType_t
};

// A whole convolution problem for one direction: the key of the perf caches.
struct ConvolutionKey {
  std::int32_t direction = 0;  // Direction
  TensorKey input;             // x
  FilterKey weight;            // w
  TensorKey output;            // y
  ConvolutionDescriptorKey convolution;
};

// The plain keys that share ==, < and hash_value below; attention.h adds AttentionKey.
template <typename T>
struct IsKey : std::false_type {};
template <>
struct IsKey<TensorKey> : std::true_type {};
template <>
struct IsKey<FilterKey> : std::true_type {};
template <>
struct IsKey<ConvolutionDescriptorKey> : std::true_type {};
template <>
struct IsKey<ConvolutionKey> : std::true_type {};

template <typename Key>
using EnableIfKey = std::enable_if_t<IsKey<Key>::value, int>;

// See Note [Keys are values]: these make memcmp equality and byte-wise hashing correct.
#define CUDNN_CACHE_ASSERT_PLAIN_KEY(Key)                                                          \
  static_assert(std::is_standard_layout_v<Key> && std::is_trivially_copyable_v<Key>, #Key);       \
  static_assert(std::has_unique_object_representations_v<Key>, #Key " must have no padding");     \
  static_assert(sizeof(Key) % sizeof(std::int32_t) == 0, #Key)
CUDNN_CACHE_ASSERT_PLAIN_KEY(TensorKey);
CUDNN_CACHE_ASSERT_PLAIN_KEY(FilterKey);
CUDNN_CACHE_ASSERT_PLAIN_KEY(ConvolutionDescriptorKey);
CUDNN_CACHE_ASSERT_PLAIN_KEY(ConvolutionKey);
#undef CUDNN_CACHE_ASSERT_PLAIN_KEY

template <typename Key, EnableIfKey<Key> = 0>
bool operator==(const Key& a, const Key& b) noexcept {
  return std::memcmp(&a, &b, sizeof(Key)) == 0;
}

template <typename Key, EnableIfKey<Key> = 0>
bool operator!=(const Key& a, const Key& b) noexcept {
  return !(a == b);
}

// Lexicographic over the fields in declaration order (arrays element by element).
template <typename Key, EnableIfKey<Key> = 0>
bool operator<(const Key& a, const Key& b) noexcept {
  std::array<std::int32_t, sizeof(Key) / sizeof(std::int32_t)> wa, wb;
  std::memcpy(wa.data(), &a, sizeof(Key));
  std::memcpy(wb.data(), &b, sizeof(Key));
  return wa < wb;
}

// A 64-bit hash of the key's bytes. Keys are a few hundred bytes and are hashed on every op call, so the bytes
// are taken 16 at a time into two independent multiply/xor-shift lanes, which the CPU runs in parallel.
template <typename Key, EnableIfKey<Key> = 0>
std::uint64_t hash_value(const Key& key) noexcept {
  constexpr std::uint64_t kMultiplier = 0xff51afd7ed558ccdull;
  auto mix = [](std::uint64_t state, std::uint64_t word) {
    state = (state ^ word) * kMultiplier;
    return state ^ (state >> 32);
  };
  const auto* bytes = reinterpret_cast<const unsigned char*>(&key);
  std::uint64_t lane0 = 0x9e3779b97f4a7c15ull, lane1 = 0xc2b2ae3d27d4eb4full;
  std::size_t offset = 0;
  for (; offset + 16 <= sizeof(Key); offset += 16) {
    std::uint64_t words[2];
    std::memcpy(words, bytes + offset, sizeof words);
    lane0 = mix(lane0, words[0]);
    lane1 = mix(lane1, words[1]);
  }
  for (; offset < sizeof(Key); offset += sizeof(std::uint32_t)) {  // sizeof(Key) is a multiple of 4
    std::uint32_t word;
    std::memcpy(&word, bytes + offset, sizeof word);
    lane0 = mix(lane0, word);
  }
  return mix(lane0, lane1);
}

// Hash functor for unordered containers of keys.
struct KeyHash {
  template <typename Key, EnableIfKey<Key> = 0>
  std::size_t operator()(const Key& key) const noexcept {
    return static_cast<std::size_t>(hash_value(key));
  }
};

std::ostream& operator<<(std::ostream& out, const TensorKey& key);
std::ostream& operator<<(std::ostream& out, const FilterKey& key);
std::ostream& operator<<(std::ostream& out, const ConvolutionDescriptorKey& key);
std::ostream& operator<<(std::ostream& out, const ConvolutionKey& key);

// The key as one line of text, for messages.
template <typename Key, EnableIfKey<Key> = 0>
std::string to_string(const Key& key);

// "float", "half", "bfloat16", "double", or the number for any other type.
std::string data_type_name(std::int32_t data_type);

// "default", "tensor-op", "tensor-op-allow-conversion" or "fma"; null for a value that is no cudnnMathType_t.
const char* math_type_name(std::int32_t math_type);

// "convolution" or "cross-correlation"; null for a value that is no cudnnConvolutionMode_t.
const char* convolution_mode_name(std::int32_t mode);

// The layout a tensor key's strides describe: "NCHW"/"NCDHW", "NHWC"/"NDHWC", or "strided".
std::string layout_name(const TensorKey& key);

// The layout name of a filter key's format for its rank, e.g. "NDHWC".
std::string layout_name(const FilterKey& key);

// True for the element types this project keys: float, half, bfloat16 and double.
bool is_supported_data_type(std::int32_t data_type);

// The compute type PyTorch gives a convolution of this element type: double for double, float otherwise.
cudnnDataType_t default_compute_type(cudnnDataType_t data_type);

// Key of a tensor with the given sizes and element strides (rank 3, 4 or 5); see Note [Canonical keys].
// Throws Error naming the tensor (`name`) and the offending value for an unsupported type, rank or size.
TensorKey make_tensor_key(cudnnDataType_t data_type, IntSpan sizes, IntSpan strides, const char* name = "tensor");

// Key of a packed (dense) tensor in the given layout.
TensorKey make_tensor_key(cudnnDataType_t data_type, IntSpan sizes, Layout layout, const char* name = "tensor");

// Key of a filter with sizes (K, C/groups, [D,] [H,] W) in the given format.
FilterKey make_filter_key(cudnnDataType_t data_type, IntSpan sizes, Layout format);

// Key of a convolution descriptor with one padding/stride/dilation value per spatial dimension (1 to 3).
ConvolutionDescriptorKey make_convolution_descriptor_key(IntSpan padding, IntSpan stride, IntSpan dilation,
                                                         std::int64_t groups, cudnnConvolutionMode_t mode,
                                                         cudnnDataType_t compute_type,
                                                         cudnnMathType_t math_type);

// Assembles a problem key and checks that its parts fit together: one rank, one element type, channel
// counts that agree with the groups, and an output size that the convolution really produces.
ConvolutionKey make_convolution_key(Direction direction, const TensorKey& input, const FilterKey& weight,
                                    const TensorKey& output, const ConvolutionDescriptorKey& convolution);

// Note [Nearest key]
// ~~~~~~~~~~~~~~~~~~
// Under the nearest miss policy (Note [Running a cached convolution]) a key the cache does not hold runs the choice
// stored for the nearest key of its family: the same problem at another batch or spatial size. Everything else is
// equal: direction, element, compute and math types, channels, filter (sizes and format), padding, stride, dilation,
// groups and mode, and tensors packed in the same layout (a strided tensor has no family: its strides are part of
// what was tuned). cuDNN's convolution engines are implicit GEMMs whose one extent that varies within a family is the
// output's pixel count N*P*Q (M forward, the same over the input backward data, the reduction K backward filter), and
// their tiles, split-K and kernel choices follow it. So the distance of two keys is |ln(pixels_a / pixels_b)|; on a
// tie the key with the same batch size is nearer, then the smaller key (operator<), so every process chooses alike.
// `python3 -m benchmarks dynamic` measures what a borrowed choice costs against tuning each shape, for keys of 0.29x
// to 1.6x the tuned key's pixels; other distances are not measured.

// Whether b is a at another batch or spatial size (Note [Nearest key]); a key is of its own family.
bool same_family(const ConvolutionKey& a, const ConvolutionKey& b);

// The distance of two keys of one family: |ln| of the ratio of their outputs' N * spatial volume.
double family_distance(const ConvolutionKey& a, const ConvolutionKey& b);

// Whether `candidate` is nearer to `key` than `other`, both of key's family, by Note [Nearest key].
bool nearer(const ConvolutionKey& key, const ConvolutionKey& candidate, const ConvolutionKey& other);

// Checks the invariants every key made by this project holds (ranks, positive sizes, known enums, zeroed
// unused slots). Returns an empty string when valid, otherwise what is wrong. Used on keys read from files.
std::string check_key(const ConvolutionKey& key);

}  // namespace cudnn_cache

namespace std {
template <>
struct hash<cudnn_cache::ConvolutionKey> : cudnn_cache::KeyHash {};
}  // namespace std
