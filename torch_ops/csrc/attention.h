#pragma once

// PyTorch's cuDNN attention through the cache's plans (Note [Intercepting PyTorch's cuDNN attention] in
// cuda/attention.cpp).

#include <torch/library.h>

#include "cudnn_cache/attention.h"

namespace cudnn_cache::torch_ops {

// Registers the kernels of aten::_cudnn_attention_forward and _backward in `library` (aten, CUDA).
void register_attention(torch::Library& library);

// The process's attention plan counters, for stats().
AttentionCounters& attention_counters();

}  // namespace cudnn_cache::torch_ops
