/* The plugin ABI: plain C, so a plugin built separately can be checked before any
 * C++ object crosses the boundary. A plugin exports one function,
 * `tessera_plugin_entry`, returning a static descriptor. The host refuses a plugin
 * whose abi_version differs from its own or whose struct_size is smaller than the
 * fields it needs; tables grow only by appending fields.
 *
 * create() returns a C++ object (tessera::Backend* or tessera::ModelLoader*): that
 * part of the contract holds because core and plugins are built by the same
 * toolchain against the same headers, which the ABI version stands for. */
#ifndef TESSERA_PLUGIN_ABI_H
#define TESSERA_PLUGIN_ABI_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TESSERA_PLUGIN_ABI_VERSION 2u  /* 2: Backend::weight_bytes */
#define TESSERA_PLUGIN_ENTRY_SYMBOL "tessera_plugin_entry"

typedef enum TesseraPluginKind { TESSERA_PLUGIN_BACKEND = 1, TESSERA_PLUGIN_LOADER = 2 } TesseraPluginKind;

/* One `key = value` option from plugins.toml ([backend.NAME.options]) or the CLI. */
typedef struct TesseraOption {
  const char* key;
  const char* value;
} TesseraOption;

typedef struct TesseraCreateArgs {
  uint32_t struct_size;   /* sizeof(TesseraCreateArgs) of the host */
  void* pool;             /* tessera::FastPool* for parallel kernels (backends) */
  const TesseraOption* options;
  size_t option_count;
} TesseraCreateArgs;

typedef struct TesseraPluginDescriptor {
  uint32_t abi_version;   /* TESSERA_PLUGIN_ABI_VERSION the plugin was built with */
  uint32_t struct_size;   /* sizeof(TesseraPluginDescriptor) in the plugin */
  const char* name;       /* unique, e.g. "cpu_scalar" */
  uint32_t kind;          /* TesseraPluginKind */
  const char* description;
  /* Score this plugin on this machine: 0 = unusable (write why into reason),
   * larger = better. Must run on any CPU of the platform: compile it without ISA
   * flags, and keep instructions the CPU may lack out of it. */
  int32_t (*probe)(char* reason, size_t reason_size);
  /* Create an instance; returns NULL and writes error on failure. */
  void* (*create)(const TesseraCreateArgs* args, char* error, size_t error_size);
  void (*destroy)(void* instance);
} TesseraPluginDescriptor;

typedef const TesseraPluginDescriptor* (*TesseraPluginEntryFn)(void);

/* The one scale probe scores are on (larger = preferred; a `rank` in plugins.toml
 * replaces the score). A plugin picks the step that describes it, +-a few to order
 * itself against a neighbour. docs/plugins.md lists the bundled plugins' steps. */
#define TESSERA_SCORE_FALLBACK 1    /* works, but slower than the portable CPU code (a CPU Vulkan device) */
#define TESSERA_SCORE_PORTABLE 10   /* portable code that runs anywhere (cpu_scalar) */
#define TESSERA_SCORE_GPU_SHARED 40 /* an integrated GPU (vulkan); a virtual GPU 20 */
#define TESSERA_SCORE_CPU_VECTOR 50 /* the CPU's wide vector units */
#define TESSERA_SCORE_CPU_MATRIX 60 /* the CPU's matrix (tile) units */
#define TESSERA_SCORE_GPU 100       /* a discrete GPU (vulkan) */

#ifdef __cplusplus
}
#endif

/* Defines the entry point of a plugin from a static descriptor. */
#define TESSERA_DEFINE_PLUGIN(descriptor)                                                     \
  extern "C" __attribute__((visibility("default"))) const TesseraPluginDescriptor*           \
  tessera_plugin_entry(void) {                                                               \
    return &(descriptor);                                                                    \
  }

#endif /* TESSERA_PLUGIN_ABI_H */
