#pragma once

// cereal serialization of every persisted type, versioned from 1. Included only where archives are made, so
// the core headers stay free of cereal.
//
// Loads check what they read (sizes, counts, enum ranges) so that no byte sequence, however corrupt, can
// make them allocate without bound or build an invalid value: they throw cereal::Exception, which the
// checkpoint code rethrows as Error naming the file.

// rapidjson 1.1.0 (Debian's, under cereal's JSON archive) reads out of bounds when its full-precision number
// parser, cereal's default, meets a zero significand with an exponent such as "0E190" (DiyFp::Normalize calls
// __builtin_clzll(0); the fuzzer found it through from_json). Its normal-precision parser has no such path, and
// is exact enough here: an export's numbers are integers, and floats printed from floats, which parse back to
// the same float. Every file that includes cereal's JSON archive includes it through this header.
#ifndef RAPIDJSON_PARSE_DEFAULT_FLAGS
#define RAPIDJSON_PARSE_DEFAULT_FLAGS kParseNanAndInfFlag
#endif
#include <cereal/archives/json.hpp>
#include <cereal/archives/portable_binary.hpp>
#include <cereal/cereal.hpp>
#include <cereal/types/array.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
// clang-format off: after cereal's JSON archive, which makes rapidjson's assertions throw before rapidjson is read
#include <rapidjson/error/en.h>  // from_json's syntax errors
// clang-format on

#include <algorithm>
#include <cmath>
#include <string>

#include "cudnn_cache/device.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/key.h"
#include "cudnn_cache/perf_cache.h"
#include "cudnn_cache/plan_store.h"

namespace cudnn_cache {

inline constexpr std::size_t kMaxDeviceNameLength = 256;

// The file layout drawn in checkpoint.cpp counts a key as 47 int32 words.
static_assert(sizeof(ConvolutionKey) == 47 * sizeof(std::int32_t));

namespace detail {

template <typename... Args>
[[noreturn]] void throw_invalid(const Args&... args) {
  throw cereal::Exception(concat(args...));
}

}  // namespace detail

template <class Archive>
void serialize(Archive& archive, TensorKey& key, std::uint32_t const /*version*/) {
  archive(CEREAL_NVP_("data_type", key.data_type), CEREAL_NVP_("nb_dims", key.nb_dims),
          CEREAL_NVP_("dims", key.dims), CEREAL_NVP_("strides", key.strides));
}

template <class Archive>
void serialize(Archive& archive, FilterKey& key, std::uint32_t const /*version*/) {
  archive(CEREAL_NVP_("data_type", key.data_type), CEREAL_NVP_("format", key.format),
          CEREAL_NVP_("nb_dims", key.nb_dims), CEREAL_NVP_("dims", key.dims));
}

template <class Archive>
void serialize(Archive& archive, ConvolutionDescriptorKey& key, std::uint32_t const /*version*/) {
  archive(CEREAL_NVP_("nb_spatial_dims", key.nb_spatial_dims), CEREAL_NVP_("padding", key.padding),
          CEREAL_NVP_("stride", key.stride), CEREAL_NVP_("dilation", key.dilation), CEREAL_NVP_("mode", key.mode),
          CEREAL_NVP_("compute_type", key.compute_type), CEREAL_NVP_("groups", key.groups),
          CEREAL_NVP_("math_type", key.math_type));
}

// Whether Archive is the cache file's (binary) archive rather than a text one (JSON export).
template <class Archive>
inline constexpr bool is_binary_archive =
    cereal::traits::is_same_archive<Archive, cereal::PortableBinaryOutputArchive>::value ||
    cereal::traits::is_same_archive<Archive, cereal::PortableBinaryInputArchive>::value;

// In binary archives a key is its std::int32_t words in declaration order, as one block: every field is an
// int32 (Note [Keys are values]), and reading 10k keys field by field through cereal took twice as long.
// Text archives get the fields by name.
template <class Archive>
void serialize(Archive& archive, ConvolutionKey& key, std::uint32_t const /*version*/) {
  if constexpr (is_binary_archive<Archive>) {
    archive(cereal::binary_data(reinterpret_cast<std::int32_t*>(&key), sizeof key));
  } else {
    archive(CEREAL_NVP_("direction", key.direction), CEREAL_NVP_("input", key.input),
            CEREAL_NVP_("weight", key.weight), CEREAL_NVP_("output", key.output),
            CEREAL_NVP_("convolution", key.convolution));
  }
}

template <class Archive>
void serialize(Archive& archive, AttentionOperand& operand, std::uint32_t const /*version*/) {
  archive(CEREAL_NVP_("dims", operand.dims), CEREAL_NVP_("strides", operand.strides));
}

// As a ConvolutionKey: one block of words in binary archives, every field 64 bits wide; fields by name in text.
template <class Archive>
void serialize(Archive& archive, AttentionKey& key, std::uint32_t const /*version*/) {
  if constexpr (is_binary_archive<Archive>) {
    archive(cereal::binary_data(reinterpret_cast<std::int64_t*>(&key), sizeof key));
  } else {
    archive(CEREAL_NVP_("direction", key.direction), CEREAL_NVP_("data_type", key.data_type),
            CEREAL_NVP_("is_causal", key.is_causal), CEREAL_NVP_("stats", key.stats),
            CEREAL_NVP_("dropout_bits", key.dropout_bits), CEREAL_NVP_("q", key.q), CEREAL_NVP_("k", key.k),
            CEREAL_NVP_("v", key.v), CEREAL_NVP_("o", key.o), CEREAL_NVP_("bias", key.bias),
            CEREAL_NVP_("d_o", key.d_o), CEREAL_NVP_("d_q", key.d_q), CEREAL_NVP_("d_k", key.d_k),
            CEREAL_NVP_("d_v", key.d_v));
  }
}

// CUDA names devices in printable ASCII. Anything else (a NUL, a control character, a stray byte) cannot be a
// real name and would not survive the JSON export: cereal's JSON reader ends a string at its first NUL (the
// fuzzer found such a file). So names are checked on save and on load.
inline bool is_printable_ascii(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

template <class Archive>
void save(Archive& archive, const DeviceIdentity& device, std::uint32_t const /*version*/) {
  if (device.name.size() > kMaxDeviceNameLength) {  // CUDA's own names fit in 255 bytes
    throw Error(detail::concat("cannot save a device name of ", device.name.size(), " bytes (at most ",
                               kMaxDeviceNameLength, "): '", device.name.substr(0, 40), "...'"));
  }
  if (!is_printable_ascii(device.name)) {
    throw Error("cannot save a device name that is not printable ASCII: CUDA's names are");
  }
  archive(CEREAL_NVP_("name", device.name),
          CEREAL_NVP_("compute_capability_major", device.compute_capability_major),
          CEREAL_NVP_("compute_capability_minor", device.compute_capability_minor),
          CEREAL_NVP_("multiprocessor_count", device.multiprocessor_count));
}

template <class Archive>
void load(Archive& archive, DeviceIdentity& device, std::uint32_t const /*version*/) {
  if constexpr (std::is_same_v<Archive, cereal::PortableBinaryInputArchive>) {
    cereal::size_type length = 0;  // read by hand: cereal's string load would allocate whatever length it reads
    archive(cereal::make_size_tag(length));
    if (length > kMaxDeviceNameLength) detail::throw_invalid("device name of ", length, " bytes");
    device.name.resize(length);
    archive(cereal::binary_data(device.name.data(), length));
  } else {
    archive(CEREAL_NVP_("name", device.name));
    if (device.name.size() > kMaxDeviceNameLength) detail::throw_invalid("device name of ", device.name.size(), " bytes");
  }
  if (!is_printable_ascii(device.name)) detail::throw_invalid("device name that is not printable ASCII");
  archive(CEREAL_NVP_("compute_capability_major", device.compute_capability_major),
          CEREAL_NVP_("compute_capability_minor", device.compute_capability_minor),
          CEREAL_NVP_("multiprocessor_count", device.multiprocessor_count));
}

template <class Archive>
void serialize(Archive& archive, Origin& origin, std::uint32_t const /*version*/) {
  archive(CEREAL_NVP_("device", origin.device), CEREAL_NVP_("cudnn_major", origin.cudnn_major),
          CEREAL_NVP_("cudnn_minor", origin.cudnn_minor));
}

// cudnnStatus_t has no fixed underlying type, so it can only hold the values of the smallest bit-field that
// holds its enumerators: they run from 0 to 5004 in cuDNN 9 (category * 1000 + code), so [0, 2^13). Casting
// anything else to it is undefined behaviour (the fuzzer found a file that did), so a loaded status outside
// that range is corrupt; inside it, a status this cuDNN does not name is kept as a failure like any other.
inline constexpr std::int32_t kStatusLimit = 1 << 13;
static_assert(CUDNN_STATUS_EXECUTION_FAILED_CURAND < kStatusLimit, "a cuDNN status beyond the checked range");

// Enums are stored as std::int32_t whatever their underlying type, so files do not depend on the compiler.
template <class Archive, typename Traits>
void save(Archive& archive, const Candidate<Traits>& candidate, std::uint32_t const /*version*/) {
  archive(CEREAL_NVP_("algorithm", static_cast<std::int32_t>(candidate.algorithm)),
          CEREAL_NVP_("status", static_cast<std::int32_t>(candidate.status)),
          CEREAL_NVP_("time_ms", candidate.time_ms), CEREAL_NVP_("workspace_bytes", candidate.workspace_bytes),
          CEREAL_NVP_("determinism", static_cast<std::int32_t>(candidate.determinism)),
          CEREAL_NVP_("math_type", static_cast<std::int32_t>(candidate.math_type)));
}

template <class Archive, typename Traits>
void load(Archive& archive, Candidate<Traits>& candidate, std::uint32_t const /*version*/) {
  std::int32_t algorithm = 0, status = 0, determinism = 0, math_type = 0;
  archive(CEREAL_NVP_("algorithm", algorithm), CEREAL_NVP_("status", status),
          CEREAL_NVP_("time_ms", candidate.time_ms), CEREAL_NVP_("workspace_bytes", candidate.workspace_bytes),
          CEREAL_NVP_("determinism", determinism), CEREAL_NVP_("math_type", math_type));
  if (algorithm < 0 || algorithm >= Traits::algorithm_count) {
    detail::throw_invalid(to_string(Traits::direction), " algorithm ", algorithm, " does not exist");
  }
  if (status < 0 || status >= kStatusLimit) detail::throw_invalid("cuDNN status ", status);
  if (!std::isfinite(candidate.time_ms) || candidate.time_ms < 0) detail::throw_invalid("time ", candidate.time_ms);
  if (determinism != CUDNN_NON_DETERMINISTIC && determinism != CUDNN_DETERMINISTIC) {
    detail::throw_invalid("determinism ", determinism);
  }
  if (math_type < CUDNN_DEFAULT_MATH || math_type > CUDNN_FMA_MATH) detail::throw_invalid("math type ", math_type);
  candidate.algorithm = static_cast<typename Traits::Algorithm>(algorithm);
  candidate.status = static_cast<cudnnStatus_t>(status);
  candidate.determinism = static_cast<cudnnDeterminism_t>(determinism);
  candidate.math_type = static_cast<cudnnMathType_t>(math_type);
}

// Knobs follow their count; text archives get them as a list of [type, value] pairs.
template <class Archive>
void save(Archive& archive, const EngineCandidate& candidate, std::uint32_t const /*version*/) {
  archive(CEREAL_NVP_("engine_id", candidate.engine_id), CEREAL_NVP_("time_ms", candidate.time_ms),
          CEREAL_NVP_("workspace_bytes", candidate.workspace_bytes),
          CEREAL_NVP_("behavior_notes", candidate.behavior_notes), CEREAL_NVP_("knob_count", candidate.knob_count));
  if constexpr (is_binary_archive<Archive>) {
    for (const Knob* knob = candidate.knobs_begin(); knob != candidate.knobs_end(); ++knob) {
      archive(CEREAL_NVP_("type", knob->type), CEREAL_NVP_("value", knob->value));
    }
  } else {
    std::vector<std::array<std::int64_t, 2>> knobs;
    for (const Knob* knob = candidate.knobs_begin(); knob != candidate.knobs_end(); ++knob) {
      knobs.push_back({knob->type, knob->value});
    }
    archive(CEREAL_NVP_("knobs", knobs));
  }
  archive(CEREAL_NVP_("heuristic_index", candidate.heuristic_index));  // version 2
  archive(CEREAL_NVP_("numerical_notes", candidate.numerical_notes));  // version 3
}

// Heuristics' lists are a few dozen configs long; a position past this one is corrupt.
inline constexpr std::int32_t kMaxHeuristicIndex = 1 << 12;

// A loaded config must be one a search could have stored: a real engine, a time, sorted distinct knobs, and a
// position in heuristics' list or none, and numerical notes or none recorded. Version 1 (file formats 2 and 3)
// has no position; versions 1 and 2 (format 4) have no numerical notes.
template <class Archive>
void load(Archive& archive, EngineCandidate& candidate, std::uint32_t const version) {
  archive(CEREAL_NVP_("engine_id", candidate.engine_id), CEREAL_NVP_("time_ms", candidate.time_ms),
          CEREAL_NVP_("workspace_bytes", candidate.workspace_bytes),
          CEREAL_NVP_("behavior_notes", candidate.behavior_notes), CEREAL_NVP_("knob_count", candidate.knob_count));
  if (candidate.engine_id < 0) detail::throw_invalid("engine id ", candidate.engine_id);
  if (!std::isfinite(candidate.time_ms) || candidate.time_ms < 0) detail::throw_invalid("time ", candidate.time_ms);
  if (candidate.behavior_notes < 0) detail::throw_invalid("behavior notes ", candidate.behavior_notes);
  if (candidate.knob_count < 0 || candidate.knob_count > static_cast<std::int32_t>(kMaxKnobs)) {
    detail::throw_invalid(candidate.knob_count, " knobs");
  }
  std::vector<std::array<std::int64_t, 2>> knobs;
  if constexpr (!is_binary_archive<Archive>) {
    archive(CEREAL_NVP_("knobs", knobs));
    if (knobs.size() != static_cast<std::size_t>(candidate.knob_count)) {
      detail::throw_invalid(knobs.size(), " knobs where knob_count is ", candidate.knob_count);
    }
  }
  for (std::int32_t i = 0; i < candidate.knob_count; ++i) {
    Knob& knob = candidate.knobs[i];
    if constexpr (is_binary_archive<Archive>) {
      archive(CEREAL_NVP_("type", knob.type), CEREAL_NVP_("value", knob.value));
    } else {
      knob = {knobs[i][0], knobs[i][1]};
    }
    if (knob.type <= 0 || (i > 0 && candidate.knobs[i - 1].type >= knob.type)) {
      detail::throw_invalid("knob types are not positive, sorted and distinct");
    }
  }
  candidate.heuristic_index = EngineCandidate::kNotListed;
  if (version >= 2) {
    archive(CEREAL_NVP_("heuristic_index", candidate.heuristic_index));
    if (candidate.heuristic_index < EngineCandidate::kNotListed || candidate.heuristic_index > kMaxHeuristicIndex) {
      detail::throw_invalid("heuristic position ", candidate.heuristic_index);
    }
  }
  candidate.numerical_notes = EngineCandidate::kNotesUnknown;
  if (version >= 3) {
    archive(CEREAL_NVP_("numerical_notes", candidate.numerical_notes));
    if (candidate.numerical_notes < EngineCandidate::kNotesUnknown) {
      detail::throw_invalid("numerical notes ", candidate.numerical_notes);
    }
  }
}

// A count, then the candidates; text archives get a list named "candidates" (a versioned class's JSON node
// is an object, which cannot also be the list).
template <class Archive, typename Traits>
void save(Archive& archive, const Ranking<Traits>& ranking, std::uint32_t const /*version*/) {
  if constexpr (is_binary_archive<Archive>) {
    archive(cereal::make_size_tag(static_cast<cereal::size_type>(ranking.size())));
    for (const auto& candidate : ranking) archive(candidate);
  } else {
    archive(CEREAL_NVP_("candidates", std::vector<typename Traits::Candidate>(ranking.begin(), ranking.end())));
  }
}

// A loaded ranking must be exactly what Ranking::of would make of its candidates: ranked, without duplicates.
template <class Archive, typename Traits>
void load(Archive& archive, Ranking<Traits>& ranking, std::uint32_t const /*version*/) {
  constexpr std::size_t capacity = Ranking<Traits>::capacity;
  std::vector<typename Traits::Candidate> candidates;
  if constexpr (is_binary_archive<Archive>) {
    cereal::size_type tagged = 0;
    archive(cereal::make_size_tag(tagged));
    if (tagged < 1 || tagged > capacity) detail::throw_invalid("ranking of ", tagged, " candidates");
    candidates.resize(tagged);
    for (auto& candidate : candidates) archive(candidate);
  } else {
    archive(CEREAL_NVP_("candidates", candidates));
    if (candidates.empty() || candidates.size() > capacity) {
      detail::throw_invalid("ranking of ", candidates.size(), " candidates");
    }
  }
  std::optional<Ranking<Traits>> ranked = Ranking<Traits>::of_ranked(std::move(candidates));
  if (!ranked) detail::throw_invalid("ranking is not in rank order or repeats a candidate");
  ranking = std::move(*ranked);
}

// The plan's bytes follow their count; in JSON they are base64 text.
template <class Archive>
void save(Archive& archive, const StoredPlan& plan, std::uint32_t const /*version*/) {
  archive(CEREAL_NVP_("config", plan.config), CEREAL_NVP_("cudnn_version", plan.cudnn_version));
  if constexpr (is_binary_archive<Archive>) {
    archive(cereal::make_size_tag(static_cast<cereal::size_type>(plan.bytes.size())),
            cereal::binary_data(plan.bytes.data(), plan.bytes.size()));
  } else {
    archive(cereal::make_nvp("size", static_cast<std::uint64_t>(plan.bytes.size())));
    archive.saveBinaryValue(plan.bytes.data(), plan.bytes.size(), "bytes");
  }
}

template <class Archive>
void load(Archive& archive, StoredPlan& plan, std::uint32_t const /*version*/) {
  archive(CEREAL_NVP_("config", plan.config), CEREAL_NVP_("cudnn_version", plan.cudnn_version));
  std::uint64_t size = 0;
  if constexpr (is_binary_archive<Archive>) {
    cereal::size_type tagged = 0;
    archive(cereal::make_size_tag(tagged));
    size = tagged;
  } else {
    archive(cereal::make_nvp("size", size));
  }
  if (size == 0 || size > kMaxStoredPlanBytes) detail::throw_invalid("stored plan of ", size, " bytes");
  plan.bytes.resize(size);
  if constexpr (is_binary_archive<Archive>) {
    archive(cereal::binary_data(plan.bytes.data(), plan.bytes.size()));
  } else {
    archive.loadBinaryValue(plan.bytes.data(), plan.bytes.size(), "bytes");
  }
}

}  // namespace cudnn_cache

CEREAL_CLASS_VERSION(cudnn_cache::StoredPlan, 1)
CEREAL_CLASS_VERSION(cudnn_cache::TensorKey, 1)
CEREAL_CLASS_VERSION(cudnn_cache::FilterKey, 1)
CEREAL_CLASS_VERSION(cudnn_cache::ConvolutionDescriptorKey, 1)
CEREAL_CLASS_VERSION(cudnn_cache::ConvolutionKey, 1)
CEREAL_CLASS_VERSION(cudnn_cache::AttentionOperand, 1)
CEREAL_CLASS_VERSION(cudnn_cache::AttentionKey, 1)
CEREAL_CLASS_VERSION(cudnn_cache::DeviceIdentity, 1)
CEREAL_CLASS_VERSION(cudnn_cache::Origin, 1)
CEREAL_CLASS_VERSION(cudnn_cache::Candidate<cudnn_cache::ForwardTraits>, 1)
CEREAL_CLASS_VERSION(cudnn_cache::Candidate<cudnn_cache::BackwardDataTraits>, 1)
CEREAL_CLASS_VERSION(cudnn_cache::Candidate<cudnn_cache::BackwardFilterTraits>, 1)
CEREAL_CLASS_VERSION(cudnn_cache::Ranking<cudnn_cache::ForwardTraits>, 1)
CEREAL_CLASS_VERSION(cudnn_cache::Ranking<cudnn_cache::BackwardDataTraits>, 1)
CEREAL_CLASS_VERSION(cudnn_cache::Ranking<cudnn_cache::BackwardFilterTraits>, 1)
CEREAL_CLASS_VERSION(cudnn_cache::EngineCandidate, 3)
CEREAL_CLASS_VERSION(cudnn_cache::Ranking<cudnn_cache::GraphForwardTraits>, 1)
CEREAL_CLASS_VERSION(cudnn_cache::Ranking<cudnn_cache::GraphBackwardDataTraits>, 1)
CEREAL_CLASS_VERSION(cudnn_cache::Ranking<cudnn_cache::GraphBackwardFilterTraits>, 1)
