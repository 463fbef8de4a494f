// device_emu.cpp - linked into llm-server-emu: -ngl runs the GPU backend's kernels on the SIMT emulator
// (tests/simt.hpp), so every path of llm-server-cuda can be exercised on a machine without a GPU.
#include "../tests/simt_device.hpp"

namespace {
const bool registered = (simt_gpu::register_emulator_driver(), true);
}
