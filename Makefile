# llm.hpp build.
#
#   make              llm-server and llm-quantize (static, baseline x86-64; SIMD is picked at run time)
#   make test         also builds tests/run, tests/consumer and tests/consumer_portable (no SIMD),
#                     then runs them from the repo root
#                     (doctest options through TEST_ARGS, e.g. make test TEST_ARGS='-tc=*gguf*')
#   make cuda         llm-server-cuda: the server with the CUDA backend (nvcc builds the kernels' cubins for
#                     CUDA_ARCHS and PTX, CUDA 12.9's NVRTC the sm_70 one, fatbinary bundles them; zig's C++
#                     driver builds and links the host code against glibc 2.17; libcuda.so.1 is loaded at
#                     run time, so the binary runs without a GPU too, on the CPU). For one GPU:
#                     make cuda CUDA_ARCHS=90 CUDA_NVRTC_ARCHS= (a V100: CUDA_ARCHS= CUDA_NVRTC_ARCHS=70)
#   make llm-server-emu  the same server with the kernels on the SIMT emulator (tests/simt.hpp)
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
# The tool-call grammars' unit (and the helpers it logs with) is tested directly too.
TEST_OBJS  := $(TEST_SRCS:%.cpp=$(B)/%.o) $(B)/server/tools.o $(B)/server/util.o
CONS_OBJS  := $(B)/tests/consumer_a.o $(B)/tests/consumer_b.o

FUZZ_BINS  := $(patsubst fuzz/%.cpp,$(B)/fuzz/%,$(wildcard fuzz/fuzz_*.cpp))

# ---- GPU builds ---------------------------------------------------------------------------------
# Device code for every target GPU generation and PTX for the newest (later GPUs JIT it). CUDA 13's nvcc
# builds sm_75 and up; sm_70 (V100) comes from CUDA 12.9's NVRTC (PyPI, scripts/nvrtc-cubin) compiling
# the same source. Each architecture is its own cubin (built in parallel); fatbinary bundles them.
NVCC       ?= nvcc
FATBINARY  ?= $(dir $(shell command -v $(NVCC) 2>/dev/null))fatbinary
CUDA_ARCHS ?= 75 80 86 89 90
CUDA_NVRTC_ARCHS ?= 70
NVCCFLAGS  ?= -O3 -std=c++17
ZIGCXX     ?= python3 -m ziglang c++ -target x86_64-linux-gnu.2.17 -Wno-unknown-warning-option
CUDA_KERNEL_SRCS := $(wildcard cuda/*.cuh cuda/*.h) cuda/kernels.cu
CUDA_IMAGES := $(CUDA_ARCHS:%=$(B)/cuda/sm_%.cubin) $(CUDA_NVRTC_ARCHS:%=$(B)/cuda/nvrtc_sm_%.cubin) \
               $(if $(CUDA_ARCHS),$(B)/cuda/compute_$(lastword $(CUDA_ARCHS)).ptx)
CUDA_OBJS  := $(patsubst %.cpp,$(B)/zig/%.o,$(wildcard server/*.cpp)) $(B)/zig/cuda/device_cuda.o
EMU_OBJS   := $(patsubst %.cpp,$(B)/emu/%.o,$(wildcard server/*.cpp)) $(B)/emu/cuda/device_emu.o

$(B)/cuda/sm_%.cubin: $(CUDA_KERNEL_SRCS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -arch=sm_$* -cubin -o $@ cuda/kernels.cu
$(B)/cuda/compute_%.ptx: $(CUDA_KERNEL_SRCS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -arch=compute_$* -ptx -o $@ cuda/kernels.cu
$(B)/cuda/nvrtc_sm_%.cubin: $(CUDA_KERNEL_SRCS) scripts/nvrtc-cubin
	@mkdir -p $(@D)
	python3 scripts/nvrtc-cubin cuda/kernels.cu $@ sm_$* -w
# The arch list is part of the fatbin's recipe: changing CUDA_ARCHS rebuilds it.
$(B)/cuda/kernels.fatbin: $(CUDA_IMAGES) $(B)/cuda/archs.$(subst $(eval) ,_,$(strip $(CUDA_ARCHS) n $(CUDA_NVRTC_ARCHS)))
	$(FATBINARY) --64 --create=$@ $(foreach f,$(CUDA_IMAGES),--image3=$(if $(filter %.ptx,$f),kind=ptx,kind=elf),sm=$(lastword $(subst _, ,$(basename $(notdir $f)))),file=$f)
$(B)/cuda/archs.%:
	@mkdir -p $(@D)
	@rm -f $(B)/cuda/archs.* && touch $@

# zig compiles against its own glibc 2.17 headers; of the system's headers it sees only nlohmann/json.
$(B)/zig/include/nlohmann:
	@mkdir -p $(@D)
	ln -sfn /usr/include/nlohmann $@

$(B)/zig/cuda/device_cuda.o: $(B)/cuda/kernels.fatbin
$(B)/zig/%.o: %.cpp | $(B)/zig/include/nlohmann
	@mkdir -p $(@D)
	$(ZIGCXX) $(CPPFLAGS) -isystem $(B)/zig/include -DLLM_OFFLOAD -DLLM_CUDA_FATBIN=$(B)/cuda/kernels.fatbin $(CXXFLAGS) -c -o $@ $<

llm-server-cuda: $(CUDA_OBJS)
	$(ZIGCXX) $(CXXFLAGS) $(LDFLAGS) -o $@ $^ -ldl

cuda: llm-server-cuda

$(B)/emu/%.o: %.cpp
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -DLLM_OFFLOAD $(CXXFLAGS) -c -o $@ $<

llm-server-emu: $(EMU_OBJS)
	$(CXX) $(CXXFLAGS) -static $(LDFLAGS) -o $@ $^ $(LDLIBS)

.PHONY: all test fuzz clean cuda
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

# The web page (GET /) is a file in the repository, compiled in as bytes (scripts/embed).
$(B)/webui_html.hpp: server/webui.html scripts/embed
	@mkdir -p $(@D)
	sh scripts/embed webui_html $< > $@.tmp && mv $@.tmp $@
# Every build of the api unit includes it: the CPU server, llm-server-cuda (zig) and llm-server-emu.
WEBUI_USERS := $(B)/server/api.o $(B)/zig/server/api.o $(B)/emu/server/api.o
$(WEBUI_USERS): $(B)/webui_html.hpp
$(WEBUI_USERS): CPPFLAGS += -I$(B)

tests/run: $(TEST_OBJS)
	$(CXX) $(CXXFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

tests/consumer: $(CONS_OBJS)
	$(CXX) $(CXXFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The same program built without the x86 SIMD kernels: the engine other architectures get.
tests/consumer_portable: tests/consumer_a.cpp tests/consumer_b.cpp llm.hpp
	$(CXX) $(CPPFLAGS) -DLLM_NO_SIMD $(CXXFLAGS) $(LDFLAGS) -o $@ tests/consumer_a.cpp tests/consumer_b.cpp $(LDLIBS)

# The tests start ./llm-server (and ./llm-server-emu), so the programs are built first; everything runs
# from the repo root.
test: $(BINS) llm-server-emu tests/consumer tests/consumer_portable tests/run
	./tests/consumer
	./tests/consumer_portable
	./tests/run $(TEST_ARGS)

fuzz: $(FUZZ_BINS)

$(B)/fuzz/%: fuzz/%.cpp
	@mkdir -p $(@D)
	$(FUZZ_CXX) $(CPPFLAGS) $(FUZZ_CXXFLAGS) -o $@ $<

clean:
	rm -rf $(B) llm-server llm-quantize llm-server-cuda llm-server-emu tests/run tests/consumer tests/consumer_portable

-include $(shell find $(B) -name '*.d' 2>/dev/null)
