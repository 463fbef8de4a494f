// Host-RAM copies of evicted slot states (see prompt_cache.hpp).
#include "prompt_cache.hpp"

#include "util.hpp"

namespace srv {

void RamCache::save(std::vector<int32_t> tokens, std::vector<uint8_t> blob) {
    if (!enabled() || blob.size() > limit_) return;
    for (auto& e : entries_) {
        if (common_prefix(e.tokens, tokens) == tokens.size()) { e.last_used = ++clock_; return; }
    }
    for (size_t i = entries_.size(); i-- > 0;) {
        if (common_prefix(entries_[i].tokens, tokens) == entries_[i].tokens.size()) remove(i);
    }
    bytes_ += blob.size();
    entries_.push_back({std::move(tokens), std::move(blob), ++clock_});
    while (bytes_ > limit_) {
        size_t lru = 0;
        for (size_t i = 1; i < entries_.size(); i++) if (entries_[i].last_used < entries_[lru].last_used) lru = i;
        remove(lru);
    }
}

RamCache::Entry* RamCache::best(const std::vector<int32_t>& prompt, size_t min_len, size_t* len) {
    Entry* r = nullptr;
    for (auto& e : entries_) {
        size_t n = common_prefix(e.tokens, prompt);
        if (n > min_len) { min_len = n; r = &e; }
    }
    if (r) { r->last_used = ++clock_; *len = min_len; }
    return r;
}

void RamCache::remove(size_t i) {
    bytes_ -= entries_[i].blob.size();
    entries_.erase(entries_.begin() + i);
}

}  // namespace srv
