// kernels.cu - the translation unit nvcc compiles: every kernel of cuda/*.cuh, as extern "C" entry
// points the host looks up by name in the embedded fatbin.
#include "kernels.cuh"
