#include "worker/models/token_index.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "worker/kernels/varlen_attention.h"

namespace trainyard {

Unpadding UnpaddingNamed(const std::string& name) {
  if (name == "auto") return Unpadding::kAuto;
  if (name == "always") return Unpadding::kAlways;
  if (name == "never") return Unpadding::kNever;
  throw std::invalid_argument("unknown unpadding '" + name + "' (auto, always, never)");
}

TokenPacking TokenPacking::To(const torch::Device& device, bool non_blocking) const {
  TokenPacking out = *this;
  if (defined()) {
    out.index = index.to(device, non_blocking);
    out.starts = starts.to(device, non_blocking);
  }
  return out;
}

namespace {

// The filler sequences' count for a granule: the filler is under one granule, cut into
// sequences of at most `seq` tokens.
int64_t FillerSequences(int64_t granule, int64_t seq) { return granule > 1 ? (granule - 1 + seq - 1) / seq : 0; }

}  // namespace

TokenPacking PackTokens(const torch::Tensor& attention_mask, int64_t granule, bool pinned) {
  if (!attention_mask.defined() || attention_mask.dim() != 2 || !attention_mask.is_cpu())
    throw std::invalid_argument("PackTokens: the attention mask must be a 2-D CPU tensor");
  if (granule < 1) throw std::invalid_argument("PackTokens: the granule must be at least 1");
  const int64_t batch = attention_mask.size(0), seq = attention_mask.size(1);
  if (batch < 1 || seq < 1) throw std::invalid_argument("PackTokens: the attention mask is empty");
  const torch::Tensor real = attention_mask.ne(0).contiguous();
  const bool* keep = real.data_ptr<bool>();
  const int64_t filler_sequences = FillerSequences(granule, seq);
  std::vector<int64_t> index;
  std::vector<int32_t> starts{0};
  index.reserve(static_cast<size_t>(batch * seq));
  for (int64_t position = 0; position < batch * seq; ++position) {
    if (keep[position]) index.push_back(position);
    if ((position + 1) % seq == 0) starts.push_back(static_cast<int32_t>(index.size()));
  }
  const auto real_tokens = static_cast<int64_t>(index.size());
  const int64_t packed = std::min(batch * seq, (real_tokens + granule - 1) / granule * granule);
  for (int64_t position = 0; position < batch * seq && static_cast<int64_t>(index.size()) < packed; ++position)
    if (!keep[position]) index.push_back(position);
  for (int64_t i = 0; i < filler_sequences; ++i)
    starts.push_back(static_cast<int32_t>(std::min(packed, int64_t(starts.back()) + seq)));
  auto options = torch::TensorOptions().pinned_memory(pinned);
  TokenPacking out;
  out.index = torch::empty({packed}, options.dtype(torch::kLong));
  std::copy(index.begin(), index.end(), out.index.data_ptr<int64_t>());
  out.starts = torch::empty({static_cast<int64_t>(starts.size())}, options.dtype(torch::kInt));
  std::copy(starts.begin(), starts.end(), out.starts.data_ptr<int32_t>());
  out.batch = batch;
  out.seq = seq;
  return out;
}

int64_t GraphTokenGranule(int64_t batch, int64_t seq) {
  const int64_t sixteenth = (batch * seq + 15) / 16;
  return std::max<int64_t>(8, (sixteenth + 7) / 8 * 8);
}

TokenIndex::TokenIndex(const torch::Tensor& attention_mask)
    : index_(attention_mask.reshape({-1}).nonzero().squeeze(1)),
      batch_(attention_mask.size(0)),
      seq_(attention_mask.size(1)) {
  torch::Tensor lengths = attention_mask.ne(0).sum(1).to(torch::kInt);
  starts_ = torch::cat({torch::zeros({1}, lengths.options()), lengths.cumsum(0, torch::kInt)});
  FindFirstRows();
}

TokenIndex::TokenIndex(const TokenPacking& packing)
    : index_(packing.index), starts_(packing.starts), batch_(packing.batch), seq_(packing.seq) {
  if (!packing.defined() || index_.dim() != 1 || starts_.dim() != 1 || starts_.size(0) < batch_ + 1)
    throw std::invalid_argument("TokenIndex: not a TokenPacking of PackTokens()");
  FindFirstRows();
}

void TokenIndex::FindFirstRows() {
  const int64_t last = std::max<int64_t>(0, tokens() - 1);
  first_ = starts_.narrow(0, 0, batch_).to(torch::kLong).clamp_max(last);
}

bool TokenIndex::Worth(const torch::Tensor& attention_mask) {
  if (attention_mask.is_cuda() || attention_mask.numel() == 0) return false;
  const double real = attention_mask.ne(0).sum().item<double>();
  return real < kWorthShare * double(attention_mask.numel());
}

bool TokenIndex::Wanted(Unpadding policy, const torch::Tensor& attention_mask, const torch::Tensor& keep_mask) {
  if (!keep_mask.defined() || policy == Unpadding::kNever) return false;
  return policy == Unpadding::kAlways || Worth(attention_mask);
}

torch::Tensor TokenIndex::Pack(const torch::Tensor& padded) const {
  std::vector<int64_t> flat = padded.sizes().vec();
  flat.erase(flat.begin());
  flat[0] = batch_ * seq_;
  return padded.reshape(flat).index_select(0, index_);
}

torch::Tensor TokenIndex::Unpack(const torch::Tensor& packed) const {
  std::vector<int64_t> flat = packed.sizes().vec();
  flat[0] = batch_ * seq_;
  std::vector<int64_t> padded = flat;
  padded[0] = seq_;
  padded.insert(padded.begin(), batch_);
  return torch::zeros(flat, packed.options()).index_copy(0, index_, packed).view(padded);
}

torch::Tensor TokenIndex::FirstRows(const torch::Tensor& packed) const {
  if (tokens() == 0) {
    std::vector<int64_t> shape = packed.sizes().vec();
    shape[0] = 1;
    shape.insert(shape.begin(), batch_);
    return torch::zeros(shape, packed.options());
  }
  return packed.index_select(0, first_).unsqueeze(1);
}

bool TokenIndex::AttendApplies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return VarlenAttentionApplies(q, k, v);
}

torch::Tensor TokenIndex::Attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double dropout,
                                 bool first_only) const {
  if (!first_only) return VarlenAttention(q, k, v, starts_, starts_, seq_, seq_, dropout);
  // One query per row (starts 0..B), none for the K filler sequences (B, K times).
  const int64_t filler_sequences = starts_.size(0) - batch_ - 1;
  const torch::Tensor query_starts = torch::cat(
      {torch::arange(batch_ + 1, starts_.options()), torch::full({filler_sequences}, batch_, starts_.options())});
  return VarlenAttention(q.index_select(0, first_), k, v, query_starts, starts_, 1, seq_, dropout);
}

std::optional<TokenIndex> TokensToRun(const TokenPacking* packing, Unpadding policy,
                                      const torch::Tensor& attention_mask, const torch::Tensor& keep_mask) {
  if (packing && packing->defined()) return TokenIndex(*packing);
  if (TokenIndex::Wanted(policy, attention_mask, keep_mask)) return TokenIndex(attention_mask);
  return std::nullopt;
}

}  // namespace trainyard
