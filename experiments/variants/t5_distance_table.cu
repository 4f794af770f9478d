struct Variant : flare::VariantBase {
  const float* row_table;  // table + qo_head * columns
  int q_pos;
  int last;        // columns - 1: every distance past it takes the last entry
  float far_bias;  // row_table[last] in log2 units
  __device__ void init(const flare::VariantParams& p, const flare::RowContext& row) {
    const int columns = Tensors::table_extent(p, 1);
    last = columns - 1;
    row_table = Tensors::table(p) + static_cast<long long>(row.qo_head) * columns;
    q_pos = row.q_pos;
    far_bias = __ldg(row_table + last) * flare::kLog2e;
  }
  static constexpr bool kLogitsAffineOnSomeKeys = true;
  static constexpr bool kLogitsAffineSlopeIsZero = true;
  __device__ bool logits_affine_on(const flare::VariantParams& p, int, int kv_last, float& base,
                                   float& slope) const {
    base = far_bias;
    slope = 0.0f;
    return q_pos - kv_last >= last;
  }
  __device__ float logits_transform(const flare::VariantParams& p, float s, int kv_pos) const {
    const int n = min(max(q_pos - kv_pos, 0), last);
    return fmaf(__ldg(row_table + n), flare::kLog2e, s);
  }
};
