// The rows of a varlen side (queries or keys) that no sequence's real tokens cover: the forward
// sets O = 0 and LSE = -inf there, the backward zero gradients (docs/semantics.md, "Varlen").
#pragma once

#include "kernels/common/host_device.hpp"
#include "kernels/common/seqlen.hpp"

namespace hopattn {

struct RowSpan {
  long long begin = 0;
  long long end = 0;  // exclusive; end == begin: empty
};

// Gap g of batch + 1: from the end of sequence g - 1's real tokens (the packed axis's start for
// g = 0) to the start of sequence g (the axis's end for g = batch). Rows past seqused fall in the
// gap after their sequence. With prefix sums that step back (invalid, but clamped like every read
// of them) a gap may hold rows that another sequence covers, whose gradients the kernels launched
// after the clear overwrite, and an uncovered row may lie in no gap; gaps never leave the axis.
HOPATTN_HOST_DEVICE RowSpan uncovered_rows(const SequenceLayout& side, int batch, int gap) {
  RowSpan span;
  if (gap > 0) {
    const Sequence previous = side.sequence(gap - 1);
    span.begin = previous.offset + previous.length;
  }
  span.end = gap < batch ? side.sequence(gap).offset : side.total_tokens;
  if (span.end < span.begin) span.end = span.begin;
  return span;
}

}  // namespace hopattn
