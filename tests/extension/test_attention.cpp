// Attention keys (attention.h): what a file may hold, and how a key reads in messages. Building, restoring and
// running plans needs a GPU: tests/python/test_attention_gpu.py.

#include <catch2/catch.hpp>
#include <sstream>

#include "cache_fixtures.h"
#include "cudnn_cache/attention.h"

using namespace cudnn_cache;
using Catch::Matchers::Contains;
using cudnn_cache::testing::attention_key;

TEST_CASE("attention keys of both directions are valid, and a bad field is named", "[attention]") {
  CHECK(check_key(attention_key(AttentionDirection::forward)) == "");
  CHECK(check_key(attention_key(AttentionDirection::backward)) == "");

  AttentionKey key = attention_key(AttentionDirection::forward);
  key.direction = 2;
  CHECK_THAT(check_key(key), Contains("attention direction 2"));
  key = attention_key(AttentionDirection::forward);
  key.data_type = CUDNN_DATA_FLOAT;
  CHECK_THAT(check_key(key), Contains("fp16 or bf16 only"));
  key = attention_key(AttentionDirection::forward);
  key.set_dropout_probability(1.5f);
  CHECK_THAT(check_key(key), Contains("dropout probability 1.5"));
  key = attention_key(AttentionDirection::forward);
  key.k.strides[1] = -1;
  CHECK_THAT(check_key(key), Contains("negative stride"));
  key = attention_key(AttentionDirection::forward);
  key.d_q = key.q;
  CHECK_THAT(check_key(key), Contains("forward key with gradient operands"));
  key = attention_key(AttentionDirection::backward);
  key.d_v = {};
  CHECK_THAT(check_key(key), Contains("backward key without gradients"));
  key = attention_key(AttentionDirection::backward);
  key.stats = 0;
  CHECK_THAT(check_key(key), Contains("flags out of range"));
}

TEST_CASE("an attention key's dropout is its float, and no dropout is all-zero bits", "[attention]") {
  AttentionKey key = attention_key(AttentionDirection::forward);
  key.set_dropout_probability(0.1f);
  CHECK(key.dropout_probability() == 0.1f);
  CHECK(key.dropout_bits != 0);
  key.set_dropout_probability(-0.0f);  // the bits of -0.0 are not zero; no dropout must be one key
  CHECK(key.dropout_bits == 0);
  CHECK(key == attention_key(AttentionDirection::forward));
}

TEST_CASE("attention keys order and hash by their contents", "[attention]") {
  const AttentionKey a = attention_key(AttentionDirection::forward, 2, 128);
  const AttentionKey b = attention_key(AttentionDirection::forward, 2, 129);
  CHECK(a != b);
  CHECK((a < b) != (b < a));
  CHECK(hash_value(a) == hash_value(attention_key(AttentionDirection::forward, 2, 128)));
  CHECK(hash_value(a) != hash_value(b));
}

TEST_CASE("an attention key prints its direction, type, operands and options", "[attention]") {
  AttentionKey key = attention_key(AttentionDirection::backward, 4, 50);
  key.is_causal = 1;
  key.set_dropout_probability(0.25f);
  std::ostringstream text;
  text << key;
  CHECK_THAT(text.str(), Contains("attention backward fp16 q[4,8,50,64]/[25600,64,512,1]") && Contains("causal") &&
                             Contains("dropout 0.25") && Contains(" dq[4,8,50,64]"));
}
