# llm.hpp build.
#
#   make              llm-server and llm-quantize (static, baseline x86-64; SIMD is picked at run time)
#   make test         also builds tests/run, tests/consumer and tests/consumer_portable (no SIMD),
#                     then runs them from the repo root
#                     (doctest options through TEST_ARGS, e.g. make test TEST_ARGS='-tc=*gguf*')
#   make fuzz         libFuzzer targets fuzz/fuzz_*.cpp -> build/fuzz/ (clang); run them with scripts/fuzz
#   make clean
#
# Objects and dependency files live in build/; header dependencies (llm.hpp, http.hpp, anything they
# include) are tracked by the compiler (-MMD), so rebuilding is incremental.

CXX      ?= g++
CXXFLAGS ?= -O2
CXXFLAGS += -std=c++17 -Wall -Wextra -pthread
CPPFLAGS += -MMD -MP
# No -march: the binaries must run on any x86-64; wider code paths use target attributes and are
# chosen after checking the CPU.

FUZZ_CXX      ?= clang++
FUZZ_CXXFLAGS ?= -O1 -g -std=c++17 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined

B := build

# Programs: llm-server is linked from the units in server/ (server/engine.cpp alone compiles llm.hpp's
# implementation, so editing another unit rebuilds only that unit); llm-quantize from quantize.cpp.
SERVER_OBJS := $(patsubst %.cpp,$(B)/%.o,$(wildcard server/*.cpp))
BINS := llm-server llm-quantize

# tests/main.cpp holds doctest's main and the LLM_IMPLEMENTATION translation unit (the heavy one),
# compiled once; each tests/test_*.cpp is its own object. consumer_*.cpp form a separate program.
TEST_SRCS  := tests/main.cpp $(filter-out tests/main.cpp tests/consumer_%.cpp,$(wildcard tests/*.cpp))
TEST_OBJS  := $(TEST_SRCS:%.cpp=$(B)/%.o)
CONS_OBJS  := $(B)/tests/consumer_a.o $(B)/tests/consumer_b.o

FUZZ_BINS  := $(patsubst fuzz/%.cpp,$(B)/fuzz/%,$(wildcard fuzz/fuzz_*.cpp))

.PHONY: all test fuzz clean
.SECONDARY:  # keep build/*.o, which pattern rules would otherwise delete as intermediates
.DEFAULT_GOAL := all

all: $(BINS)

llm-server: $(SERVER_OBJS)
	$(CXX) $(CXXFLAGS) -static $(LDFLAGS) -o $@ $^ $(LDLIBS)

llm-quantize: $(B)/quantize.o
	$(CXX) $(CXXFLAGS) -static $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(B)/%.o: %.cpp
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c -o $@ $<

tests/run: $(TEST_OBJS)
	$(CXX) $(CXXFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

tests/consumer: $(CONS_OBJS)
	$(CXX) $(CXXFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The same program built without the x86 SIMD kernels: the engine other architectures get.
tests/consumer_portable: tests/consumer_a.cpp tests/consumer_b.cpp llm.hpp
	$(CXX) $(CPPFLAGS) -DLLM_NO_SIMD $(CXXFLAGS) $(LDFLAGS) -o $@ tests/consumer_a.cpp tests/consumer_b.cpp $(LDLIBS)

# The tests start ./llm-server, so the programs are built first; everything runs from the repo root.
test: $(BINS) tests/consumer tests/consumer_portable tests/run
	./tests/consumer
	./tests/consumer_portable
	./tests/run $(TEST_ARGS)

fuzz: $(FUZZ_BINS)

$(B)/fuzz/%: fuzz/%.cpp
	@mkdir -p $(@D)
	$(FUZZ_CXX) $(CPPFLAGS) $(FUZZ_CXXFLAGS) -o $@ $<

clean:
	rm -rf $(B) llm-server llm-quantize tests/run tests/consumer tests/consumer_portable

-include $(shell find $(B) -name '*.d' 2>/dev/null)
