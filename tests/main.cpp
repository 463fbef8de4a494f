// doctest's main, and the one translation unit of the test program that compiles the implementation.
// The tests/test_*.cpp files include llm.hpp plainly; internals.inc, below, tests its internal classes.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#define LLM_IMPLEMENTATION
#include "../llm.hpp"

#include "internals.inc"
