// ParamsArg: the attention options of a Python call (FlashInfer's keyword arguments, already
// translated by the Python layer) as flare::AttentionParams, with its optional tensors held.
#pragma once

#include <optional>
#include <string>

#include "flare/variant/attention_params.h"
#include "tensor_arg.h"

namespace flare::python {

struct ParamsArg {
  AttentionParams scalars;  // every field but the optional tensors
  std::optional<TensorArg> custom_mask;   // uint8 packed bits (MaskMode::kCustom)
  std::optional<TensorArg> mask_indptr;   // int32 [batch + 1], bytes
  std::optional<TensorArg> alibi_slopes;  // float32 [H_qo]

  AttentionParams resolved() const;
};

// "NONE" | "ROPE_LLAMA" | "ALIBI" (FlashInfer's pos_encoding_mode names).
PosEncoding parse_pos_encoding(const std::string& name);

}  // namespace flare::python
