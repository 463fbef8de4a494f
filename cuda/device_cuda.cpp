// device_cuda.cpp - the GPU backend's Device on a real GPU through CUDA's driver API, loaded at run time
// with dlopen("libcuda.so.1"): the binary links no CUDA library, and on a host without the driver (or
// without a GPU) the probe says so in one line and everything runs on the CPU.
//
// The kernels come from the fatbin nvcc built from cuda/kernels.cu (device code per architecture, PTX
// for newer ones), embedded below with .incbin and loaded with cuModuleLoadData; launches look the
// kernels up by their extern "C" names. Linking this file into a program registers the CUDA driver.
#include "backend.hpp"

#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

// The fatbin's bytes (LLM_CUDA_FATBIN: its path at build time).
#ifndef LLM_CUDA_FATBIN
#error "define LLM_CUDA_FATBIN as the path of the kernels' fatbin"
#endif
#define LLM_STR2(x) #x
#define LLM_STR(x) LLM_STR2(x)
asm(".section .rodata\n"
    ".balign 64\n"
    ".global llm_cuda_fatbin\n"
    "llm_cuda_fatbin:\n"
    ".incbin \"" LLM_STR(LLM_CUDA_FATBIN) "\"\n"
    ".byte 0\n"
    ".previous\n");
extern "C" const unsigned char llm_cuda_fatbin[];

namespace {

// The few driver API entry points we use, with their C types spelled out (no cuda.h needed).
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;

struct DriverApi {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGetCount)(int*);
    CUresult (*cuDeviceGet)(CUdevice*, int);
    CUresult (*cuDeviceGetName)(char*, int, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuCtxSynchronize)();
    CUresult (*cuModuleLoadData)(CUmodule*, const void*);
    CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
    CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
    CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
    CUresult (*cuMemGetInfo)(size_t*, size_t*);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**, void**);
    CUresult (*cuGetErrorString)(CUresult, const char**);
};

// Loads libcuda.so.1 and its symbols once; nullptr (and why) when the host has no usable driver.
const DriverApi* driver_api(std::string& why_not) {
    static DriverApi api;
    static std::string failure;
    static bool loaded = [] {
        void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            failure = "no CUDA driver (libcuda.so.1 not found)";
            return false;
        }
        bool ok = true;
        auto sym = [&](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
            if (!fn) failure = std::string("CUDA driver lacks ") + name, ok = false;
        };
        sym(api.cuInit, "cuInit");
        sym(api.cuDeviceGetCount, "cuDeviceGetCount");
        sym(api.cuDeviceGet, "cuDeviceGet");
        sym(api.cuDeviceGetName, "cuDeviceGetName");
        sym(api.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
        sym(api.cuCtxSetCurrent, "cuCtxSetCurrent");
        sym(api.cuCtxSynchronize, "cuCtxSynchronize");
        sym(api.cuModuleLoadData, "cuModuleLoadData");
        sym(api.cuModuleGetFunction, "cuModuleGetFunction");
        sym(api.cuMemAlloc, "cuMemAlloc_v2");
        sym(api.cuMemFree, "cuMemFree_v2");
        sym(api.cuMemcpyHtoD, "cuMemcpyHtoD_v2");
        sym(api.cuMemcpyDtoH, "cuMemcpyDtoH_v2");
        sym(api.cuMemGetInfo, "cuMemGetInfo_v2");
        sym(api.cuLaunchKernel, "cuLaunchKernel");
        sym(api.cuGetErrorString, "cuGetErrorString");
        if (!ok) return false;
        int count = 0;
        if (api.cuInit(0) != 0 || api.cuDeviceGetCount(&count) != 0 || count == 0) {
            failure = "no CUDA device";
            return false;
        }
        return true;
    }();
    if (!loaded) why_not = failure;
    return loaded ? &api : nullptr;
}

class CudaDevice : public llm_gpu::Device {
public:
    explicit CudaDevice(const DriverApi& api, int ordinal) : api_(api) {
        check(api_.cuDeviceGet(&device_, ordinal), "cuDeviceGet");
        char name[256] = {};
        check(api_.cuDeviceGetName(name, sizeof name, device_), "cuDeviceGetName");
        name_ = name;
        check(api_.cuDevicePrimaryCtxRetain(&ctx_, device_), "cuDevicePrimaryCtxRetain");
        check(api_.cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
        check(api_.cuModuleLoadData(&module_, llm_cuda_fatbin), "cuModuleLoadData (no kernels for this GPU's architecture?)");
    }
    std::string name() const override { return name_; }
    void* alloc(size_t bytes) override {
        CUdeviceptr p = 0;
        const CUresult r = api_.cuMemAlloc(&p, bytes);
        if (r != 0) {
            size_t free_bytes = 0, total = 0;
            api_.cuMemGetInfo(&free_bytes, &total);
            throw llm::Error("CUDA: cannot allocate " + std::to_string(bytes >> 20) + " MiB on " + name_ + " (" +
                             std::to_string(free_bytes >> 20) + " MiB free): " + error_string(r));
        }
        return reinterpret_cast<void*>(p);
    }
    void release(void* p) override { api_.cuMemFree(reinterpret_cast<CUdeviceptr>(p)); }
    void upload(void* dst, const void* src, size_t bytes) override {
        check(api_.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, bytes), "cuMemcpyHtoD");
    }
    void download(void* dst, const void* src, size_t bytes) override {
        check(api_.cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes), "cuMemcpyDtoH");
    }
    void launch(const char* kernel, llm_gpu::Grid grid, llm_gpu::Grid block, void** args) override {
        CUfunction& fn = functions_[kernel];
        if (!fn) check(api_.cuModuleGetFunction(&fn, module_, kernel), (std::string("cuModuleGetFunction ") + kernel).c_str());
        check(api_.cuLaunchKernel(fn, grid.x, grid.y, grid.z, block.x, block.y, block.z, 0, nullptr, args, nullptr),
              (std::string("kernel ") + kernel).c_str());
    }

private:
    const DriverApi& api_;
    CUdevice device_ = 0;
    CUcontext ctx_ = nullptr;
    CUmodule module_ = nullptr;
    std::string name_;
    std::map<std::string, CUfunction> functions_;

    std::string error_string(CUresult r) const {
        const char* s = nullptr;
        api_.cuGetErrorString(r, &s);
        return s ? s : "CUDA error " + std::to_string(r);
    }
    void check(CUresult r, const char* what) const {
        if (r != 0) throw llm::Error(std::string("CUDA: ") + what + ": " + error_string(r));
    }
};

// The device contexts run on: the first visible GPU (CUDA_VISIBLE_DEVICES applies), created on first use.
CudaDevice& first_device() {
    static std::string why;
    static CudaDevice device(*driver_api(why), 0);
    return device;
}

const bool registered = [] {
    llm::OffloadDriver d;
    d.name = "CUDA";
    d.probe = [](std::string& why_not) { return driver_api(why_not) != nullptr; };
    d.create = [](const llm::Model& m, const llm::ContextParams& cp, int n_cells) -> std::unique_ptr<llm::OffloadBackend> {
        CudaDevice& dev = first_device();
        fprintf(stderr, "llm: CUDA: %s: offloading %d of %d layers%s\n", dev.name().c_str(),
                m.hp.n_layer - std::min(m.hp.n_layer, m.placement.first_device_layer), m.hp.n_layer,
                m.placement.output_on_device ? " and the output" : "");
        return std::make_unique<llm_gpu::Forward>(dev, m, cp, n_cells);
    };
    llm::set_offload_driver(d);
    return true;
}();

} // namespace
