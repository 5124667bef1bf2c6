#pragma once

// The one place this project includes cuDNN.
//
// Note [Legacy cuDNN API]
// ~~~~~~~~~~~~~~~~~~~~~~~
// cuDNN 9 marks the legacy convolution API (cudnnFilterDescriptor_t, cudnnConvolution*Algo_t,
// cudnnFind*AlgorithmEx, ...) CUDNN_DEPRECATED. The perf caches of this project are keyed by exactly those
// descriptors, because they are cheap to build, fully readable through the cuDNN getters, and what the
// legacy search reports on. cuDNN only emits the deprecation attribute when CUDNN_WARN_DEPRECATED is
// defined, so we make sure it is not, here and nowhere else: every other file includes this header rather
// than <cudnn.h>. The graph-API backend does not change this: it keys its engine configs by the same values.
#ifdef CUDNN_WARN_DEPRECATED
#undef CUDNN_WARN_DEPRECATED
#endif
#include <cudnn.h>
