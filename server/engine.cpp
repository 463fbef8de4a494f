// The one translation unit of llm-server that compiles the engine's implementation (llm.hpp is large):
// the other units include llm.hpp plainly and rebuild quickly.
#define LLM_IMPLEMENTATION
#include "../llm.hpp"
