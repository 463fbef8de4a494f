// Header-only consumer check, part A: this translation unit holds the implementation; consumer_b.cpp
// includes the header plainly. Linking both into one program fails if the header defines anything
// non-inline outside the implementation section, or the implementation misses something declared.
#define LLM_IMPLEMENTATION
#include "../llm.hpp"
#include "../llm.hpp"  // the include guard must make a second inclusion harmless

#include <cstdio>
#include <cstring>

std::string consumer_b_type_name(llm::Type t);  // consumer_b.cpp
bool consumer_b_rejects_garbage();                // consumer_b.cpp

int main() {
    if (consumer_b_type_name(llm::Type::Q4_K) != llm::type_info(llm::Type::Q4_K).name) {
        std::puts("consumer: type names differ between translation units");
        return 1;
    }
    if (!consumer_b_rejects_garbage()) {
        std::puts("consumer: a bad GGUF image did not throw llm::Error");
        return 1;
    }
    std::puts("consumer ok");
    return 0;
}
