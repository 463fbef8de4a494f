// Header-only consumer check, part B: a plain user of the header (no LLM_IMPLEMENTATION).
#include "../llm.hpp"

std::string consumer_b_type_name(llm::Type t) { return llm::type_info(t).name; }

bool consumer_b_rejects_garbage() {
    static const uint8_t junk[16] = {'N', 'O', 'T', 'G', 'G', 'U', 'F'};
    try {
        llm::gguf_parse_memory(junk, sizeof junk);
    } catch (const llm::Error&) {
        return true;
    }
    return false;
}
