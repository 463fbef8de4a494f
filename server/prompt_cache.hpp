// Host-RAM copies of evicted slot states (--cache-ram): the KV blobs of token sequences, least
// recently used first out, found again by the longest shared prefix with a new prompt.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace srv {

class RamCache {
public:
    struct Entry {
        std::vector<int32_t> tokens;
        std::vector<uint8_t> blob;
        uint64_t last_used = 0;
    };

    // bytes: SIZE_MAX unbounded, 0 off.
    void set_limit(size_t bytes) { limit_ = bytes; }
    bool enabled() const { return limit_ > 0; }
    // Keeps tokens/blob unless an entry already holds them (or more of the same sequence); drops
    // entries that are prefixes of it, then the least recently used ones until within the limit.
    void save(std::vector<int32_t> tokens, std::vector<uint8_t> blob);
    // The entry sharing the longest prefix with prompt (more than min_len tokens), or nullptr.
    Entry* best(const std::vector<int32_t>& prompt, size_t min_len, size_t* len);

private:
    void remove(size_t i);

    size_t limit_ = 0;
    size_t bytes_ = 0;
    uint64_t clock_ = 0;
    std::vector<Entry> entries_;
};

}  // namespace srv
