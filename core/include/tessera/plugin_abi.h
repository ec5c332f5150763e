/* The plugin ABI: plain C. Everything that passes between tessera and a plugin is a
 * struct or a function table declared here; no C++ object, std::string or container
 * crosses, and a plugin's C++ exceptions must not leave its functions (they return an
 * error code and write the message into the caller's buffer). A plugin built with
 * another compiler, standard library or std::string ABI works as long as it speaks
 * this C.
 *
 * A plugin exports one function, `tessera_plugin_entry`, returning a static
 * descriptor. Compatibility rule (docs/plugins.md):
 *   - abi_version names the generation of this C ABI. This host accepts
 *     TESSERA_PLUGIN_ABI_MIN_VERSION .. TESSERA_PLUGIN_ABI_VERSION; an older generation
 *     (1 and 2 passed C++ objects) or a newer one is refused with a reason before
 *     anything else of the plugin is read. A generation changes the meaning of
 *     something a plugin already reads; the host then keeps the older meaning for
 *     plugins built for it, or does not use that part of them (since ABI 4, a plugin
 *     of ABI 3 is never given KvWrite or Attention nodes, whose operands changed).
 *   - Within a generation every function table and every struct passed by pointer
 *     alone (descriptor, create arguments, graph, host table) only grows, by appending
 *     fields. Each starts with its own struct_size (the size the other side was built
 *     with). Structs passed in arrays or filled in by the callee (TesseraTensor,
 *     TesseraNode, TesseraOption, TesseraTask, TesseraKvInfo, TesseraRecurrentInfo,
 *     TesseraMetaValue, TesseraTensorInfo) have no size field: they are fixed for a
 *     generation, and changing one means a new abi_version. A reader uses a field only if the writer's struct_size covers it: the host
 *     never calls a function an older plugin's table lacks (it treats it as absent,
 *     i.e. NULL), and a plugin must do the same with the host's tables and arguments.
 *   - Fields marked "required" must be present and non-NULL; a plugin without them is
 *     refused with a reason naming the field. */
#ifndef TESSERA_PLUGIN_ABI_H
#define TESSERA_PLUGIN_ABI_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 7: MatMulId's expert range (i[0], i[1]): slots routed to an expert outside it get zero rows;
 * 6: Attention whose value heads differ in size from its key heads (dst [dv, n_head, n], V
 *    storage rows of n_kv * dv values, possibly a view of the first dv values of each K
 *    row: multi-head latent attention), the Concat and GroupLimit ops;
 * 5: Attention's sliding window (i[0]) and sinks (TesseraNode::src4), YaRN RoPE (f[2], f[3],
 *    i[6], i[7]), the GeGlu, NormalizeRows and SwiGluOai ops;
 * 4: KvWrite and Attention over the KV storage tensors of a layer, with slots and a
 *    sequence table as I32 inputs (one node per layer for every sequence of a step);
 * 3: the C ABI (1 and 2 passed C++ objects). */
#ifndef TESSERA_PLUGIN_ABI_VERSION /* a plugin may declare an older generation the host still accepts */
#define TESSERA_PLUGIN_ABI_VERSION 7u
#endif
#define TESSERA_PLUGIN_ABI_MIN_VERSION 3u
#define TESSERA_PLUGIN_ENTRY_SYMBOL "tessera_plugin_entry"

/* A field appended within a generation starts out 0 in C++ (a default member
 * initializer), so a plugin's descriptor written before the field compiles warning-free;
 * in C, positional initializers leave it 0 too. */
#ifdef __cplusplus
#define TESSERA_APPENDED_DEFAULT(value) = value
#else
#define TESSERA_APPENDED_DEFAULT(value)
#endif

/* True when a table or struct whose writer declared `size` bytes holds `field`. */
#define TESSERA_HAS_FIELD(ptr, type, field) \
  ((ptr) != NULL && (size_t)(ptr)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

typedef enum TesseraPluginKind { TESSERA_PLUGIN_BACKEND = 1, TESSERA_PLUGIN_LOADER = 2 } TesseraPluginKind;

/* ---- Data types and ops (the values of tessera::DType and tessera::Op) ---- */

typedef enum TesseraDType {
  TESSERA_DTYPE_F32 = 0, TESSERA_DTYPE_F16 = 1, TESSERA_DTYPE_Q4_0 = 2, TESSERA_DTYPE_Q4_1 = 3,
  TESSERA_DTYPE_Q5_0 = 6, TESSERA_DTYPE_Q5_1 = 7, TESSERA_DTYPE_Q8_0 = 8, TESSERA_DTYPE_Q8_1 = 9,
  TESSERA_DTYPE_Q2_K = 10, TESSERA_DTYPE_Q3_K = 11, TESSERA_DTYPE_Q4_K = 12, TESSERA_DTYPE_Q5_K = 13,
  TESSERA_DTYPE_Q6_K = 14, TESSERA_DTYPE_Q8_K = 15, TESSERA_DTYPE_IQ4_NL = 20, TESSERA_DTYPE_IQ4_XS = 23,
  TESSERA_DTYPE_I32 = 26, TESSERA_DTYPE_BF16 = 30, TESSERA_DTYPE_MXFP4 = 39
} TesseraDType;

/* Op numbers; graph.h documents each op's operands and parameters. */
typedef enum TesseraOp {
  TESSERA_OP_GET_ROWS = 0, TESSERA_OP_RMS_NORM, TESSERA_OP_MAT_MUL, TESSERA_OP_ROPE,
  TESSERA_OP_KV_WRITE, TESSERA_OP_ATTENTION, TESSERA_OP_SOFTMAX, TESSERA_OP_SILU,
  TESSERA_OP_SWIGLU, TESSERA_OP_ADD, TESSERA_OP_MUL, TESSERA_OP_ARGMAX, TESSERA_OP_TOP_K,
  TESSERA_OP_GATHER_COLS, TESSERA_OP_MAT_MUL_ID, TESSERA_OP_MOE_COMBINE, TESSERA_OP_SIGMOID,
  TESSERA_OP_SOFTPLUS, TESSERA_OP_CONT, TESSERA_OP_SSM_CONV, TESSERA_OP_GATED_DELTA_NET,
  TESSERA_OP_GEGLU /* since ABI 5 */, TESSERA_OP_NORMALIZE_ROWS /* since ABI 5 */,
  TESSERA_OP_SWIGLU_OAI /* since ABI 5 */, TESSERA_OP_CONCAT /* since ABI 6 */,
  TESSERA_OP_GROUP_LIMIT /* since ABI 6 */,
  TESSERA_OP_COUNT
} TesseraOp;

/* ---- Host services a plugin may call ---- */

/* The paged KV cache and recurrent state a node works on (TesseraNode::kv). The host
 * owns it; a plugin reads `info` and calls `api`. Rows are F16, info.n_kv_heads *
 * info.head_dim elements. Functions return NULL / -1 for a sequence or position the
 * cache does not have. Since ABI 4 KvWrite and Attention reach the K/V planes as
 * storage tensors in the graph (graph.h) and no longer call row / rows, which stay
 * for ABI 3; the recurrent state is still reached here. */
typedef struct TesseraKv TesseraKv;
typedef struct TesseraKvApi {
  uint32_t struct_size;
  /* Row of K (which = 0) or V (which = 1) at a reserved position. */
  uint16_t* (*row)(const TesseraKv* kv, int32_t layer, int32_t seq, int32_t which, int64_t pos);
  /* Rows of positions [first, first + count), one pointer per position into out;
   * returns 0, or -1 (out untouched) when a position is not reserved. */
  int32_t (*rows)(const TesseraKv* kv, int32_t layer, int32_t seq, int32_t which, int64_t first,
                  int64_t count, const uint16_t** out);
  float* (*conv_state)(const TesseraKv* kv, int32_t layer, int32_t seq);
  float* (*recurrent_state)(const TesseraKv* kv, int32_t layer, int32_t seq);
  int32_t (*has_sequence)(const TesseraKv* kv, int32_t seq);
  int64_t (*length)(const TesseraKv* kv, int32_t seq);   /* positions written before this step */
  int64_t (*reserved)(const TesseraKv* kv, int32_t seq); /* positions addressable */
} TesseraKvApi;
typedef struct TesseraKvInfo {
  int32_t n_layers, n_kv_heads, head_dim, page_tokens, n_pages;
} TesseraKvInfo;
typedef struct TesseraRecurrentInfo {
  int32_t n_layers;    /* recurrent layers (0: none) */
  int64_t conv_elems;  /* floats of conv state per layer and sequence */
  int64_t state_elems; /* floats of recurrent state per layer and sequence */
} TesseraRecurrentInfo;
struct TesseraKv {
  const TesseraKvApi* api;
  TesseraKvInfo info;
  TesseraRecurrentInfo recurrent;
};

/* The host's worker pool: dispatch() runs tasks[0] on the calling thread and each
 * other task on a worker of its own (count <= executors) and returns when all are done. A task
 * must not throw or longjmp out of fn. Returns 0, or -1 with the reason in error
 * (count too large, a dispatch already running). */
typedef struct TesseraTask {
  void (*fn)(void* ctx, int index);
  void* ctx;
} TesseraTask;
typedef struct TesseraPool TesseraPool;
typedef struct TesseraPoolApi {
  uint32_t struct_size;
  int32_t (*dispatch)(TesseraPool* pool, const TesseraTask* tasks, size_t count, char* error,
                      size_t error_size);
  /* What worker `executor` (1..executors-1) reads into its cache while idle, until
   * set again; cancel_idle_prefetch clears every hint and returns once no worker reads
   * one (call it before freeing hinted memory). From the dispatching thread only. */
  void (*set_idle_prefetch)(TesseraPool* pool, int32_t executor, const void* p, size_t bytes);
  void (*cancel_idle_prefetch)(TesseraPool* pool);
} TesseraPoolApi;
struct TesseraPool {
  const TesseraPoolApi* api;
  int32_t executors; /* caller + workers */
};

typedef struct TesseraHostApi {
  uint32_t struct_size;
  /* Name a memory-mapped model file, so that a SIGBUS inside it (the file shrank while
   * mapped) ends tessera with a message naming the file. */
  void (*register_mapped_file)(const void* base, size_t size, const char* path);
  void (*unregister_mapped_file)(const void* base);
} TesseraHostApi;

/* One `key = value` option from plugins.toml ([backend.NAME.options]) or the CLI. */
typedef struct TesseraOption {
  const char* key;
  const char* value;
} TesseraOption;

typedef struct TesseraCreateArgs {
  uint32_t struct_size; /* sizeof(TesseraCreateArgs) of the host */
  TesseraPool* pool;    /* for parallel kernels (backends); NULL: run on the caller */
  const TesseraOption* options;
  size_t option_count;
  const TesseraHostApi* host;
} TesseraCreateArgs;

/* ---- Graphs, as a backend sees them ---- */

typedef struct TesseraTensor {
  uint32_t type;  /* TesseraDType */
  uint32_t unused;
  int64_t ne[4];  /* elements per dimension, ggml order: ne[0] contiguous */
  size_t nb[4];   /* bytes between consecutive elements / rows / ... */
  void* data;
  void* buffer;   /* the owner's handle (a backend's repacked copy), else NULL */
  const char* name; /* NUL-terminated, never NULL */
} TesseraTensor;

typedef struct TesseraNode {
  uint32_t op; /* TesseraOp */
  int32_t dst; /* tensor index, -1 for none */
  int32_t src[4];
  int32_t i[8];
  float f[4];
  TesseraKv* kv; /* SsmConv, GatedDeltaNet (ABI 3: also KvWrite, Attention) */
#if TESSERA_PLUGIN_ABI_VERSION >= 5 /* a plugin declaring ABI 3 or 4 indexes the nodes without them */
  int32_t src4;     /* since ABI 5: a fifth source (Attention's sinks), -1 for none */
  int32_t reserved; /* since ABI 5: 0 */
#endif
} TesseraNode;

/* A graph for the duration of one call. `generation` changes whenever tensors or nodes
 * are added or the graph is reset, so a plugin may cache what it derives from the
 * graph under (id, generation); tensor data pointers may change between calls of the
 * same generation only through allocation, which also changes it. */
typedef struct TesseraGraph {
  uint32_t struct_size;
  uint64_t id; /* the host graph's identity while it lives */
  uint64_t generation;
  TesseraTensor* tensors;
  size_t tensor_count;
  const TesseraNode* nodes;
  size_t node_count;
} TesseraGraph;

/* ---- Backends ---- */

typedef struct TesseraBackendApi {
  uint32_t struct_size;
  /* required: 1 when the backend computes on host memory (mapped weights and graph
   * scratch are used in place), 0 for a device backend. */
  int32_t (*uses_host_memory)(void* self);
  /* required: 1 when the backend runs node `node` natively; 0 with the reason. Asked
   * only about nodes the core's op schema accepts; the answer must depend only on what
   * the scheduler's signature covers (it is cached). */
  int32_t (*supports)(void* self, const TesseraGraph* graph, size_t node, char* reason, size_t reason_size);
  /* required: run nodes [first, first + count) in order; 0, or -1 with the error.
   * The host has validated every node first: each passed the core's op schema and this
   * backend's supports(), sequences exist and KV positions are reserved. What the
   * schema cannot know in advance stays the backend's to check: ids read from tensors
   * that earlier nodes of the run compute (GetRows, MatMulId, GatherCols). flags: 0. */
  int32_t (*execute)(void* self, TesseraGraph* graph, size_t first, size_t count, uint32_t flags,
                     char* error, size_t error_size);
  /* optional: called once per weight at load; may repack it into the backend's own
   * memory and rewrite the tensor (type, strides, data, buffer). 0, or -1 with the error. */
  int32_t (*prepare_weight)(void* self, TesseraTensor* weight, char* error, size_t error_size);
  /* optional: the host bytes a product reading `weight` streams (its repacked copy, or
   * the tensor's own bytes); 0 and *bytes = 0 for device memory. */
  int32_t (*weight_bytes)(void* self, const TesseraTensor* weight, const void** data, size_t* bytes);
  /* since ABI 4, optional: bytes copied between host memory and the backend's own since
   * it was created (what `tessera bench` reports per token); 0, or -1. */
  int32_t (*transfers)(void* self, uint64_t* upload_bytes, uint64_t* download_bytes);
  /* since ABI 4, optional (all five or none): memory the backend owns, such as the KV
   * pages of the backend that runs attention. buffer_alloc returns the backend's handle
   * for `bytes` of `usage` (TesseraBufferUsage), with its host address in *host_ptr, or
   * NULL there for device memory; NULL with the error. A tensor in such a buffer carries
   * the handle in TesseraTensor::buffer (and data NULL for device memory). set / get copy
   * bytes [offset, offset + bytes) from / to host memory, copy moves bytes inside the
   * buffer (ranges do not overlap); 0, or -1 with the error. */
  void* (*buffer_alloc)(void* self, uint32_t usage, size_t bytes, void** host_ptr, char* error, size_t error_size);
  void (*buffer_free)(void* self, void* buffer);
  int32_t (*buffer_set)(void* self, void* buffer, size_t offset, const void* src, size_t bytes, char* error,
                        size_t error_size);
  int32_t (*buffer_get)(void* self, void* buffer, size_t offset, void* dst, size_t bytes, char* error,
                        size_t error_size);
  int32_t (*buffer_copy)(void* self, void* buffer, size_t dst_offset, size_t src_offset, size_t bytes, char* error,
                         size_t error_size);
  /* since ABI 7, optional: the most consecutive nodes of one execute() the backend
   * computes as one, reading a later node's sources after an earlier node's output is
   * written (1 to 64). The host then never places a node's output over what a node up
   * to that many - 1 before it read. Absent: 1 (node by node). */
  int32_t (*fusion_window)(void* self) TESSERA_APPENDED_DEFAULT(0);
} TesseraBackendApi;

/* What a buffer holds (tessera::BufferUsage). */
typedef enum TesseraBufferUsage {
  TESSERA_BUFFER_WEIGHTS = 0, TESSERA_BUFFER_KV = 1, TESSERA_BUFFER_EXPERT_CACHE = 2, TESSERA_BUFFER_SCRATCH = 3
} TesseraBufferUsage;

/* ---- Model loaders ---- */

/* GGUF's metadata value types. */
typedef enum TesseraMetaType {
  TESSERA_META_U8 = 0, TESSERA_META_I8 = 1, TESSERA_META_U16 = 2, TESSERA_META_I16 = 3,
  TESSERA_META_U32 = 4, TESSERA_META_I32 = 5, TESSERA_META_F32 = 6, TESSERA_META_BOOL = 7,
  TESSERA_META_STRING = 8, TESSERA_META_ARRAY = 9, TESSERA_META_U64 = 10, TESSERA_META_I64 = 11,
  TESSERA_META_F64 = 12
} TesseraMetaType;

/* One metadata value. Integers (and bool) are in i (signed types) or u (unsigned),
 * floats in f, strings in str/str_len (not NUL-terminated, may hold any byte), arrays
 * give elem_type and count (their elements are read by path). Pointers stay valid
 * while the model is open. */
typedef struct TesseraMetaValue {
  uint32_t type; /* TesseraMetaType */
  uint32_t elem_type;
  int64_t i;
  uint64_t u;
  double f;
  const char* str;
  size_t str_len;
  uint64_t count;
} TesseraMetaValue;

typedef struct TesseraTensorInfo {
  const char* name; /* NUL-terminated */
  uint32_t type;    /* TesseraDType */
  uint32_t n_dims;  /* 1..8 */
  int64_t ne[8];
  uint64_t offset;      /* in the file's data section */
  uint64_t file_offset; /* of the first byte, from the start of the file */
  size_t nbytes;
  const void* data; /* into the mapping, valid while the model is open */
} TesseraTensorInfo;

/* A model's two views: the file's own metadata and tensors under its names (what
 * `tessera info` shows), and the model under tessera's names (model_description.h),
 * available after describe() succeeded. */
typedef enum TesseraModelView { TESSERA_VIEW_FILE = 0, TESSERA_VIEW_DESCRIPTION = 1 } TesseraModelView;

typedef struct TesseraModel TesseraModel; /* the plugin's */

typedef struct TesseraLoaderApi {
  uint32_t struct_size;
  /* required: cheap check of the first bytes / folder layout. */
  int32_t (*recognizes)(void* self, const char* path);
  /* required: open and validate; NULL with a one-line error. */
  TesseraModel* (*open)(void* self, const char* path, char* error, size_t error_size);
  void (*close)(TesseraModel* model); /* required */
  /* required: "gguf v3", "safetensors"; the path; the file's (or folder's) size. */
  const char* (*format)(const TesseraModel* model);
  const char* (*path)(const TesseraModel* model);
  uint64_t (*file_size)(const TesseraModel* model);
  /* required: metadata entries of a view, in the order the host should list them. */
  size_t (*meta_count)(const TesseraModel* model, uint32_t view);
  /* required: entry `index`'s key (NUL-terminated) and value; with depth > 0 the value
   * of element path[0] of that array, then element path[1] of that, ... 0, or -1 for
   * an index or path out of range. */
  int32_t (*meta_get)(const TesseraModel* model, uint32_t view, size_t index, const uint64_t* path,
                      size_t depth, const char** key, TesseraMetaValue* value);
  size_t (*tensor_count)(const TesseraModel* model, uint32_t view); /* required */
  int32_t (*tensor_get)(const TesseraModel* model, uint32_t view, size_t index,
                        TesseraTensorInfo* info); /* required; 0 or -1 */
  /* required: translate the file into tessera's names (fills TESSERA_VIEW_DESCRIPTION);
   * 0, or -1 with the error. architecture and name are the description's; origin
   * gives, for tessera name `index`, the file's own name (0 or -1 past the end). */
  int32_t (*describe)(TesseraModel* model, char* error, size_t error_size);
  const char* (*architecture)(const TesseraModel* model);
  const char* (*display_name)(const TesseraModel* model);
  size_t (*origin_count)(const TesseraModel* model);
  int32_t (*origin_get)(const TesseraModel* model, size_t index, const char** tessera_name,
                        const char** file_name);
} TesseraLoaderApi;

/* ---- The descriptor ---- */

typedef struct TesseraPluginDescriptor {
  uint32_t abi_version; /* TESSERA_PLUGIN_ABI_VERSION the plugin was built with */
  uint32_t struct_size; /* sizeof(TesseraPluginDescriptor) in the plugin */
  const char* name;     /* unique, e.g. "cpu_scalar" */
  uint32_t kind;        /* TesseraPluginKind */
  const char* description;
  /* Score this plugin on this machine: 0 = unusable (write why into reason),
   * larger = better. Must run on any CPU of the platform: compile it without ISA
   * flags, and keep instructions the CPU may lack out of it. Runs in a child process
   * during discovery. */
  int32_t (*probe)(char* reason, size_t reason_size);
  /* Create an instance (the `self` of the tables below); NULL with the error. */
  void* (*create)(const TesseraCreateArgs* args, char* error, size_t error_size);
  void (*destroy)(void* instance);
  const TesseraBackendApi* backend; /* required for TESSERA_PLUGIN_BACKEND */
  const TesseraLoaderApi* loader;   /* required for TESSERA_PLUGIN_LOADER */
  /* Since ABI 7, appended (read only when struct_size covers it): TesseraPluginFlags. */
  uint32_t flags TESSERA_APPENDED_DEFAULT(0);
} TesseraPluginDescriptor;

typedef enum TesseraPluginFlags {
  /* The reference backend: every op in plain, portable code. The engine places on it
   * what the chosen backends decline, and the conformance suite measures the others
   * against it. */
  TESSERA_PLUGIN_REFERENCE = 1u << 0
} TesseraPluginFlags;

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
#ifdef __cplusplus
#define TESSERA_DEFINE_PLUGIN(descriptor)                                                     \
  extern "C" __attribute__((visibility("default"))) const TesseraPluginDescriptor*           \
  tessera_plugin_entry(void) {                                                               \
    return &(descriptor);                                                                    \
  }
#else
#define TESSERA_DEFINE_PLUGIN(descriptor)                                                     \
  __attribute__((visibility("default"))) const TesseraPluginDescriptor* tessera_plugin_entry(void) { \
    return &(descriptor);                                                                    \
  }
#endif

#endif /* TESSERA_PLUGIN_ABI_H */
