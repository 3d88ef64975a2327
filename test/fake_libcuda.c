/* A fake libcuda for test/test_cuda.py: the driver functions tinychad's CUDA device calls, with the real
   driver's C signatures, so the device's ctypes calls cross a real C ABI (64-bit device pointers, size_t
   sizes, outputs through pointers, the kernel-parameter array). "Device memory" is host memory from malloc
   (its addresses are above 4 GiB on x86-64 Linux, so a pointer cut to 32 bits shows); a module must be an ELF
   image; a launch is recorded (fake_launch() reads it back) and runs only where the module is a host shared
   object of test/cuda_host.py's launchers, not a cubin. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
#define CONTEXT ((void*)0xC0FFEE)
#define STREAM ((void*)0x5)
static size_t used, capacity = 1 << 24;
static unsigned dims[6];
static uint64_t args[16];
static int nargs, launches, syncs;
static char function_name[256];

void fake_set(size_t bytes, int kernel_args) { capacity = bytes; nargs = kernel_args; }
int fake_launch(unsigned* out_dims, uint64_t* out_args, char* out_name) {
  memcpy(out_dims, dims, sizeof dims);
  memcpy(out_args, args, sizeof args);
  strcpy(out_name, function_name);
  return launches;
}
int fake_syncs(void) { return syncs; }

CUresult cuInit(unsigned flags) { return flags == 0 ? 0 : 1; }
CUresult cuDriverGetVersion(int* version) { *version = 13000; return 0; }
CUresult cuDeviceGetCount(int* count) { *count = 1; return 0; }
CUresult cuDeviceGet(int* device, int ordinal) { if (ordinal != 0) return 101; *device = 0; return 0; }
CUresult cuDeviceGetName(char* name, int length, int device) { strncpy(name, "Fake C GPU", length); return device ? 101 : 0; }
CUresult cuDeviceGetAttribute(int* value, int attribute, int device) {
  switch (attribute) {
    case 5: *value = 2147483647; break;
    case 6: case 7: *value = 65535; break;
    case 16: *value = 132; break;
    case 36: *value = 2619000; break;
    case 37: *value = 5120; break;
    case 75: *value = 9; break;
    case 76: *value = 0; break;
    default: return 1;
  }
  return device ? 101 : 0;
}
CUresult cuDevicePrimaryCtxRetain(void** context, int device) { *context = CONTEXT; return 0; }
CUresult cuCtxSetCurrent(void* context) { return context == CONTEXT ? 0 : 201; }
CUresult cuStreamCreate(void** stream, unsigned flags) { *stream = STREAM; return flags ? 1 : 0; }
CUresult cuStreamSynchronize(void* stream) { syncs++; return stream == STREAM ? 0 : 400; }

/* a block's size sits in the 16 bytes before it, so a free gives its bytes back */
CUresult cuMemAlloc_v2(uint64_t* pointer, size_t bytes) {
  if (bytes == 0) return 1;
  if (used + bytes > capacity) return 2;
  size_t* block = malloc(bytes + 16);
  block[0] = bytes;
  used += bytes;
  *pointer = (uint64_t)(block + 2);
  return 0;
}
CUresult cuMemFree_v2(uint64_t pointer) {
  size_t* block = (size_t*)pointer - 2;
  used -= block[0];
  free(block);
  return 0;
}
CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) { *free_bytes = capacity - used; *total = capacity; return 0; }
CUresult cuMemcpyHtoDAsync_v2(uint64_t device, const void* host, size_t bytes, void* stream) {
  memcpy((void*)device, host, bytes);
  return stream == STREAM ? 0 : 400;
}
CUresult cuMemcpyDtoHAsync_v2(void* host, uint64_t device, size_t bytes, void* stream) {
  memcpy(host, (const void*)device, bytes);
  return stream == STREAM ? 0 : 400;
}
/* a host shared object (ELF machine 62, x86-64; a cubin's is 190): written to a file and loaded. The driver isn't
   told an image's size; gcc's objects end with their section headers, so it is e_shoff + e_shnum * e_shentsize. */
static void* load_host(const unsigned char* image) {
  uint64_t offset;
  uint16_t entry, count;
  memcpy(&offset, image + 0x28, 8);
  memcpy(&entry, image + 0x3A, 2);
  memcpy(&count, image + 0x3C, 2);
  char path[] = "/tmp/fake_cuda_moduleXXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  size_t size = offset + (size_t)entry * count;
  int written = write(fd, image, size) == (ssize_t)size;
  close(fd);
  void* handle = written ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
  unlink(path);
  return handle;
}
CUresult cuModuleLoadData(void** module, const void* image) {
  const unsigned char* bytes = image;
  if (memcmp(image, "\x7f" "ELF", 4) != 0) return 200;
  if (bytes[18] != 62) { *module = (void*)0x10; return 0; }
  *module = load_host(bytes);
  return *module ? 0 : 200;
}
CUresult cuModuleGetFunction(void** function, void* module, const char* name) {
  if (strlen(name) >= sizeof function_name) return 400;
  strcpy(function_name, name);
  if (module == (void*)0x10) { *function = (void*)0xF0; return 0; }
  char symbol[300] = "tc_launch_";
  *function = dlsym(module, strcat(symbol, name));
  return *function ? 0 : 500;
}
CUresult cuLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void* stream, void** params, void** extra) {
  if (function == NULL || stream != STREAM || extra != NULL || shared != 0) return 1;
  unsigned d[6] = {gx, gy, gz, bx, by, bz};
  memcpy(dims, d, sizeof d);
  for (int i = 0; i < nargs; i++) args[i] = *(uint64_t*)params[i];
  launches++;
  if (function != (void*)0xF0) ((void (*)(const unsigned*, void**))function)(d, params);
  return 0;
}
CUresult cuGetErrorName(CUresult code, const char** name) {
  *name = code == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : code == 200 ? "CUDA_ERROR_INVALID_IMAGE" : NULL;
  return *name ? 0 : 1;
}
CUresult cuGetErrorString(CUresult code, const char** text) {
  *text = code == 2 ? "out of memory" : code == 200 ? "device kernel image is invalid" : NULL;
  return *text ? 0 : 1;
}
