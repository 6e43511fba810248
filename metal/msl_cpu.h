// msl_cpu.h: the subset of the Metal Shading Language that tilews emits, as C++17 for g++/clang++.
//
// Used by tilews.metal.harness (read its docstring first): the harness compiles an MslKernel's
// full_source() with this header (its `#include <metal_stdlib>` resolves here) plus a generated
// driver, and runs every threadgroup of a grid with one lane per Metal thread.
//
// What it defines (docs/notes: metal-contract.md lists the subset):
// * types: half (_Float16), bfloat (2-byte struct; float -> bfloat rounds to nearest even), uchar,
//   ushort, uint, ulong, uint3, ulong2; the address spaces device/constant/thread as qualifiers
//   that vanish (constant = const);
// * `threadgroup T name[N];` (top-level declarations of the kernel body) becomes a function-local
//   static in the section msl_tg_mem: shared by the lanes of a threadgroup; threadgroups run one
//   after another and the section is filled with 0xFF bytes (NaN for every float type, -1 for
//   integers) before each one, so nothing leaks from one threadgroup to the next unnoticed;
// * threadgroup_barrier / simdgroup_barrier, simd_sum/max/min/shuffle_xor/broadcast and the
//   simdgroup_matrix operations as collectives with a rendezvous: a threadgroup barrier waits for
//   every live lane (lanes that returned drop out); a simdgroup collective waits for all lanes of
//   its simdgroup (32 consecutive lanes) at the same call (same operation, same source line) and
//   fails if one of them returned or went elsewhere; simdgroup_load/store/broadcast also require
//   the same arguments in every lane. A launch fails with a diagnostic naming lanes and lines.
// * simdgroup_matrix<T, 8, 8>: every lane holds the whole matrix and computes redundantly;
//   simdgroup_store has each lane write its own elements (element i by lane i % lanes), so no two
//   lanes write one address. The origin ulong2(col, row) is in memory coordinates: the 8x8 block at
//   rows row..row+7 and columns col..col+7 of the memory, read transposed if transpose is true.
//   A default-constructed matrix is all NaN (an uninitialized accumulator shows in the result).
//   multiply_accumulate computes in float and rounds once to the destination type.
// * math in namespace metal (exp exp2 log log2 sqrt rsqrt abs fabs max min fmax fmin floor ceil
//   pow select as_type) and relaxed atomics (atomic_int/uint/float fetch_add, atomic_int/uint load
//   and compare_exchange_weak), in device or threadgroup memory alike;
// * `threadgroup T*` (a pointer into threadgroup memory, in a cast or a parameter) is a plain
//   pointer: the harness drops the qualifier there (harness.translation_unit).
//
// Execution: by default lanes are fibers (ucontext) on the calling thread. The first simdgroup with
// a runnable lane runs as far as it can (its lanes in order, each until it blocks at a
// synchronization point) before the next starts, so a missing threadgroup barrier reads memory
// other simdgroups have not written yet (0xFF bytes: NaN). With MSL_CPU_THREADS defined (the
// sanitizer builds) each lane is an OS thread and the rendezvous is a mutex and condition variables,
// so ThreadSanitizer sees the lanes' real happens-before order. The launch entry is msl_cpu::launch;
// file_main is the main() of the sanitizer executables.
//
// Bounds (the harness's checked build, its default): every index of an on-chip array (threadgroup
// or thread) goes through msl_cpu_index, which fails the launch naming the array, the lane and the
// line when it is outside the array's elements (the arrays are flat: a multi-dim buffer's index past
// one dim but inside the array is not seen).
//
// Interrupts: msl_cpu::g_stop (set from another thread: the harness does on Ctrl-C) stops a launch
// at the next threadgroup, or at the next iteration of any loop of the kernel (the harness spells the
// kernel's `for (...)` as msl_cpu_for(...), which polls it); the launch then fails with
// "interrupted".
#ifndef TILEWS_MSL_CPU_H
#define TILEWS_MSL_CPU_H

#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <pthread.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

// ---- scalar and vector types ------------------------------------------------------------------

typedef _Float16 half;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

struct bfloat {
  uint16_t bits;
  bfloat() = default;
  bfloat(float f) : bits(round(f)) {}
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  bfloat& operator+=(float x) { return *this = bfloat(float(*this) + x); }
  bfloat& operator-=(float x) { return *this = bfloat(float(*this) - x); }
  bfloat& operator*=(float x) { return *this = bfloat(float(*this) * x); }
  bfloat& operator/=(float x) { return *this = bfloat(float(*this) / x); }

  static uint16_t round(float f) {  // to nearest, ties to even; NaN stays a (quiet) NaN
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
  }
};

struct uint3 {
  uint x, y, z;
};

struct ulong2 {
  ulong x, y;
  ulong2(ulong v = 0) : x(v), y(v) {}
  ulong2(ulong x_, ulong y_) : x(x_), y(y_) {}
};

// ---- namespace metal: flags, math, bit casts, atomics -------------------------------------------

namespace metal {

enum class mem_flags : int { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

enum memory_order { memory_order_relaxed };

template <class T>
using msl_float = std::enable_if_t<std::is_same<T, float>::value || std::is_same<T, half>::value ||
                                       std::is_same<T, bfloat>::value,
                                   T>;

#define MSL_CPU_UNARY(NAME, EXPR) \
  template <class T>              \
  inline msl_float<T> NAME(T x) { \
    float v = float(x);           \
    return T(EXPR);               \
  }
MSL_CPU_UNARY(exp, std::exp(v))
MSL_CPU_UNARY(exp2, std::exp2(v))
MSL_CPU_UNARY(log, std::log(v))
MSL_CPU_UNARY(log2, std::log2(v))
MSL_CPU_UNARY(sqrt, std::sqrt(v))
MSL_CPU_UNARY(rsqrt, 1.0f / std::sqrt(v))
MSL_CPU_UNARY(fabs, std::fabs(v))
MSL_CPU_UNARY(floor, std::floor(v))
MSL_CPU_UNARY(ceil, std::ceil(v))
#undef MSL_CPU_UNARY

template <class T>  // (libstdc++ 12 does not count _Float16 as arithmetic)
inline std::enable_if_t<std::is_arithmetic<T>::value || std::is_same<T, half>::value ||
                            std::is_same<T, bfloat>::value,
                        T>
abs(T x) {
  return x < T(0) ? T(-x) : x;
}
template <class T>
inline msl_float<T> pow(T x, T y) { return T(std::pow(float(x), float(y))); }
template <class T>
inline msl_float<T> fmax(T x, T y) { return T(std::fmax(float(x), float(y))); }
template <class T>
inline msl_float<T> fmin(T x, T y) { return T(std::fmin(float(x), float(y))); }
template <class T>
inline T max(T x, T y) {
  if constexpr (std::is_integral<T>::value) return x < y ? y : x;
  else return T(std::fmax(float(x), float(y)));
}
template <class T>
inline T min(T x, T y) {
  if constexpr (std::is_integral<T>::value) return y < x ? y : x;
  else return T(std::fmin(float(x), float(y)));
}
template <class T>
inline T select(T a, T b, bool c) { return c ? b : a; }

template <class To, class From>
inline To as_type(From x) {
  static_assert(sizeof(To) == sizeof(From), "as_type: the two types must have the same size");
  To t;
  std::memcpy(&t, &x, sizeof(To));
  return t;
}

struct atomic_int { int value; };
struct atomic_uint { uint value; };
struct atomic_float { float value; };

inline int atomic_fetch_add_explicit(atomic_int* a, int v, memory_order) {
  return __atomic_fetch_add(&a->value, v, __ATOMIC_RELAXED);
}
inline uint atomic_fetch_add_explicit(atomic_uint* a, uint v, memory_order) {
  return __atomic_fetch_add(&a->value, v, __ATOMIC_RELAXED);
}
template <class A>
inline auto atomic_load_explicit(A* a, memory_order) -> decltype(a->value) {
  return __atomic_load_n(&a->value, __ATOMIC_RELAXED);
}
template <class A, class T>
inline bool atomic_compare_exchange_weak_explicit(A* a, T* expected, T desired, memory_order,
                                                  memory_order) {
  return __atomic_compare_exchange_n(&a->value, expected, desired, true, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED);
}
inline float atomic_fetch_add_explicit(atomic_float* a, float v, memory_order) {
  float old;
  __atomic_load(&a->value, &old, __ATOMIC_RELAXED);
  float sum = old + v;
  while (!__atomic_compare_exchange(&a->value, &old, &sum, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    sum = old + v;
  return old;
}

}  // namespace metal

// ---- the lane scheduler ---------------------------------------------------------------------------

namespace msl_cpu {

constexpr uint kMaxLanes = 1024;
constexpr uint kSimd = 32;
constexpr size_t kErrorCap = 4096;

enum Op : uint8_t {
  OP_NONE, OP_THREADGROUP_BARRIER, OP_SIMDGROUP_BARRIER, OP_SIMD_SUM, OP_SIMD_MAX, OP_SIMD_MIN,
  OP_SIMD_SHUFFLE_XOR, OP_SIMD_BROADCAST, OP_SIMDGROUP_LOAD, OP_SIMDGROUP_STORE, OP_SIMDGROUP_MMA
};
static const char* const kOpNames[] = {
  "?", "threadgroup_barrier", "simdgroup_barrier", "simd_sum", "simd_max", "simd_min",
  "simd_shuffle_xor", "simd_broadcast", "simdgroup_load", "simdgroup_store",
  "simdgroup_multiply_accumulate"};

enum State : uint8_t { RUNNING, AT_BARRIER, AT_SIMD, DONE };

struct Lane {
  uint tid;
  State state;
  Op op;             // where the lane waits (AT_BARRIER / AT_SIMD)
  uint line;         // source line of that call
  uint64_t args[4];  // arguments that must agree across the simdgroup (load/store/broadcast)
  uint simd_gen;     // simdgroup collectives passed: selects the exchange slot (double-buffered)
#ifdef MSL_CPU_THREADS
  pthread_t thread;
  bool started;
#else
  ucontext_t context;
#endif
};

typedef void (*LaneFn)(void* ctx, uint3 group, uint tid);

struct Group {
  LaneFn fn;
  void* ctx;
  uint3 position;
  uint n;     // lanes in the threadgroup
  uint live;  // lanes that have not returned
  bool failed;
  char error[kErrorCap];
  Lane lanes[kMaxLanes];
  uint64_t slots[2][kMaxLanes];  // values exchanged by simd_* collectives
#ifdef MSL_CPU_THREADS
  pthread_mutex_t mutex;
  pthread_cond_t wake[kMaxLanes / kSimd];  // one per simdgroup
#else
  ucontext_t scheduler;
#endif
};

static Group g_group;
static thread_local Lane* t_lane;

struct Abort {};  // thrown in a lane when the launch has failed or was interrupted

static std::atomic<bool> g_stop{false};  // a request to stop the launch (see "Interrupts" above)

// ---- diagnostics

static void appendf(char* out, size_t cap, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void appendf(char* out, size_t cap, const char* fmt, ...) {
  size_t used = std::strlen(out);
  if (used + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(out + used, cap - used, fmt, ap);
  va_end(ap);
}

static bool same_wait(const Lane& a, const Lane& b) {
  if (a.state != b.state) return false;
  if (a.state == AT_BARRIER || a.state == AT_SIMD) return a.op == b.op && a.line == b.line;
  return true;
}

// "lanes 0-15, 17 wait at simd_sum (line 12); lanes 16, 18-31 returned"
static void describe(const Group& G, uint lo, uint hi, char* out, size_t cap) {
  static bool seen[kMaxLanes];
  for (uint i = lo; i < hi; ++i) seen[i] = false;
  const char* sep = "";
  for (uint i = lo; i < hi; ++i) {
    if (seen[i]) continue;
    appendf(out, cap, "%slanes ", sep);
    sep = "; ";
    const char* comma = "";
    for (uint j = i; j < hi;) {
      if (seen[j] || !same_wait(G.lanes[i], G.lanes[j])) { ++j; continue; }
      uint k = j;
      while (k + 1 < hi && !seen[k + 1] && same_wait(G.lanes[i], G.lanes[k + 1])) ++k;
      for (uint m = j; m <= k; ++m) seen[m] = true;
      if (k == j) appendf(out, cap, "%s%u", comma, j);
      else appendf(out, cap, "%s%u-%u", comma, j, k);
      comma = ", ";
      j = k + 1;
    }
    const Lane& L = G.lanes[i];
    if (L.state == DONE) appendf(out, cap, " returned");
    else if (L.state == RUNNING) appendf(out, cap, " running");
    else appendf(out, cap, " wait at %s (line %u)", kOpNames[L.op], L.line);
  }
}

static void wake_all(Group& G);

static int fail(Group& G, const char* what, uint lo, uint hi) {
  if (!G.failed) {
    G.failed = true;
    G.error[0] = 0;
    appendf(G.error, kErrorCap, "threadgroup (%u, %u, %u): %s: ", G.position.x, G.position.y,
            G.position.z, what);
    describe(G, lo, hi, G.error, kErrorCap);
  }
  wake_all(G);
  return -1;
}

static const char kInterrupted[] = "interrupted";

// Marks the launch failed because a stop was requested (the caller holds the group's mutex, if any).
static void stop_group(Group& G) {
  if (!G.failed) {
    G.failed = true;
    std::snprintf(G.error, kErrorCap, "%s", kInterrupted);
  }
  wake_all(G);
}

static void release(Group& G, uint lo, uint hi);

// Completes the rendezvous of the simdgroup of lanes [lo, hi) if it can, or diagnoses it if it never
// can. Returns 1 if its lanes were released, 0 if not (yet), -1 on failure.
static int settle_simdgroup(Group& G, uint lo, uint hi) {
  uint waiting = 0, running = 0, first = hi;
  for (uint i = lo; i < hi; ++i) {
    if (G.lanes[i].state == AT_SIMD) {
      ++waiting;
      if (first == hi) first = i;
    } else if (G.lanes[i].state == RUNNING) {
      ++running;
    }
  }
  if (waiting == 0) return 0;
  char what[160];
  // Lanes that returned, or wait at a threadgroup barrier (which needs the waiting lanes too),
  // never arrive.
  if (waiting < hi - lo && running == 0) {
    std::snprintf(what, sizeof what, "simdgroup %u: a simdgroup operation not reached by all of its "
                  "lanes (divergent control flow)", lo / kSimd);
    return fail(G, what, lo, hi);
  }
  if (waiting < hi - lo) return 0;
  for (uint i = lo; i < hi; ++i) {
    if (!same_wait(G.lanes[i], G.lanes[first])) {
      std::snprintf(what, sizeof what, "simdgroup %u: divergent simdgroup operations", lo / kSimd);
      return fail(G, what, lo, hi);
    }
  }
  for (uint i = lo; i < hi; ++i) {
    if (std::memcmp(G.lanes[i].args, G.lanes[first].args, sizeof G.lanes[i].args) != 0) {
      std::snprintf(what, sizeof what, "simdgroup %u: %s at line %u gets different arguments in "
                    "lanes %u and %u (they must be uniform across the simdgroup)",
                    lo / kSimd, kOpNames[G.lanes[first].op], G.lanes[first].line, first, i);
      return fail(G, what, lo, hi);
    }
  }
  release(G, lo, hi);
  return 1;
}

static inline uint simdgroup_end(const Group& G, uint lo) { return lo + kSimd < G.n ? lo + kSimd : G.n; }

// Completes every rendezvous that can complete and diagnoses the ones that never can.
// Returns 1 if some lane was released, 0 if none (and some lane still runs), -1 on failure.
static int progress(Group& G) {
  if (G.failed) return -1;
  bool released = false;
  for (uint lo = 0; lo < G.n; lo += kSimd) {
    int settled = settle_simdgroup(G, lo, simdgroup_end(G, lo));
    if (settled < 0) return -1;
    released = released || settled > 0;
  }
  uint at_barrier = 0, running = 0, first = G.n;
  for (uint i = 0; i < G.n; ++i) {
    State s = G.lanes[i].state;
    if (s == AT_BARRIER) {
      ++at_barrier;
      if (first == G.n) first = i;
    } else if (s == RUNNING) {
      ++running;
    }
  }
  if (G.live > 0 && at_barrier == G.live) {
    for (uint i = 0; i < G.n; ++i)
      if (G.lanes[i].state == AT_BARRIER && !same_wait(G.lanes[i], G.lanes[first]))
        return fail(G, "threadgroup barrier not reached by all live lanes (divergent control flow)",
                    0, G.n);
    release(G, 0, G.n);
    return 1;
  }
  if (released) return 1;
  if (running == 0 && G.live > 0)
    return fail(G, "lanes wait at synchronization points that can never complete (a threadgroup "
                "barrier not reached by all live lanes, or divergent simdgroup operations)", 0, G.n);
  return 0;
}

static void record_wait(Lane& L, Op op, uint line, const uint64_t* args) {
  L.state = op == OP_THREADGROUP_BARRIER ? AT_BARRIER : AT_SIMD;
  L.op = op;
  L.line = line;
  for (int i = 0; i < 4; ++i) L.args[i] = args ? args[i] : 0;
}

#ifdef MSL_CPU_THREADS

static void wake_all(Group& G) {
  for (uint s = 0; s < (G.n + kSimd - 1) / kSimd; ++s) pthread_cond_broadcast(&G.wake[s]);
}

static void release(Group& G, uint lo, uint hi) {
  for (uint i = lo; i < hi; ++i)
    if (G.lanes[i].state != DONE) G.lanes[i].state = RUNNING;
  for (uint s = lo / kSimd; s < (hi + kSimd - 1) / kSimd; ++s) pthread_cond_broadcast(&G.wake[s]);
}

// Blocks the calling lane at a synchronization point until its rendezvous completes.
static void arrive(Op op, uint line, const uint64_t* args) {
  Group& G = g_group;
  Lane& L = *t_lane;
  pthread_mutex_lock(&G.mutex);
  if (!G.failed) {
    record_wait(L, op, line, args);
    progress(G);
    while (L.state != RUNNING && !G.failed) pthread_cond_wait(&G.wake[L.tid / kSimd], &G.mutex);
  }
  bool failed = G.failed;
  pthread_mutex_unlock(&G.mutex);
  if (failed) throw Abort();
}

// Ends the lane (and with it the launch) once a stop was requested.
[[noreturn]] static void interrupted() {
  Group& G = g_group;
  pthread_mutex_lock(&G.mutex);
  stop_group(G);
  pthread_mutex_unlock(&G.mutex);
  throw Abort();
}

static void* lane_thread(void* p) {
  Group& G = g_group;
  Lane& L = *static_cast<Lane*>(p);
  t_lane = &L;
  try {
    G.fn(G.ctx, G.position, L.tid);
  } catch (Abort&) {
  }
  pthread_mutex_lock(&G.mutex);
  L.state = DONE;
  --G.live;
  progress(G);
  pthread_mutex_unlock(&G.mutex);
  return nullptr;
}

static void run_group(Group& G) {
  pthread_mutex_init(&G.mutex, nullptr);
  for (uint s = 0; s < (G.n + kSimd - 1) / kSimd; ++s) pthread_cond_init(&G.wake[s], nullptr);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 4u << 20);
  for (uint i = 0; i < G.n; ++i) {
    Lane& L = G.lanes[i];
    int rc = pthread_create(&L.thread, &attr, lane_thread, &L);
    L.started = rc == 0;
    if (rc != 0) {
      pthread_mutex_lock(&G.mutex);
      if (!G.failed) {
        G.failed = true;
        std::snprintf(G.error, kErrorCap, "could not start the thread of lane %u (pthread_create: %s)",
                      i, std::strerror(rc));
      }
      wake_all(G);
      pthread_mutex_unlock(&G.mutex);
      break;
    }
  }
  pthread_attr_destroy(&attr);
  for (uint i = 0; i < G.n; ++i)
    if (G.lanes[i].started) pthread_join(G.lanes[i].thread, nullptr);
  for (uint s = 0; s < (G.n + kSimd - 1) / kSimd; ++s) pthread_cond_destroy(&G.wake[s]);
  pthread_mutex_destroy(&G.mutex);
}

static void release_stacks() {}

#else  // fibers

constexpr size_t kStackBytes = 512u << 10;  // per lane, plus a guard page below it
static char* g_stacks;
static uint g_stack_count;
static size_t g_page;

static void wake_all(Group&) {}

static void release(Group& G, uint lo, uint hi) {
  for (uint i = lo; i < hi; ++i)
    if (G.lanes[i].state != DONE) G.lanes[i].state = RUNNING;
}

static void arrive(Op op, uint line, const uint64_t* args) {
  Lane& L = *t_lane;
  record_wait(L, op, line, args);
  swapcontext(&L.context, &g_group.scheduler);  // the scheduler resumes us once released
}

[[noreturn]] static void interrupted() {
  stop_group(g_group);
  throw Abort();  // caught by lane_fiber, on this lane's own stack
}

static void lane_fiber(int tid) {
  Group& G = g_group;
  try {
    G.fn(G.ctx, G.position, uint(tid));
  } catch (Abort&) {
  }
  G.lanes[tid].state = DONE;
  --G.live;
}  // returns to the scheduler through uc_link

static bool reserve_stacks(uint n, char* error) {
  if (n <= g_stack_count) return true;
  g_page = size_t(sysconf(_SC_PAGESIZE));
  size_t each = kStackBytes + g_page;
  void* p = mmap(nullptr, each * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    std::snprintf(error, kErrorCap, "could not map %u lane stacks of %zu bytes", n, kStackBytes);
    return false;
  }
  for (uint i = 0; i < n; ++i) mprotect(static_cast<char*>(p) + i * each, g_page, PROT_NONE);
  if (g_stacks) munmap(g_stacks, (kStackBytes + g_page) * g_stack_count);
  g_stacks = static_cast<char*>(p);
  g_stack_count = n;
  return true;
}

// A launch's stacks are unmapped when it ends: every compiled kernel loaded into one process has
// its own, and their guard pages split the mapping, so stacks kept across launches would exhaust
// the process's map count (vm.max_map_count) after a few hundred kernels.
static void release_stacks() {
  if (g_stacks) munmap(g_stacks, (kStackBytes + g_page) * g_stack_count);
  g_stacks = nullptr;
  g_stack_count = 0;
}

static void run_group(Group& G) {
  if (!reserve_stacks(G.n, G.error)) {
    G.failed = true;
    return;
  }
  size_t each = kStackBytes + g_page;
  for (uint i = 0; i < G.n; ++i) {
    Lane& L = G.lanes[i];
    getcontext(&L.context);
    L.context.uc_stack.ss_sp = g_stacks + i * each + g_page;
    L.context.uc_stack.ss_size = kStackBytes;
    L.context.uc_link = &G.scheduler;
    makecontext(&L.context, reinterpret_cast<void (*)()>(lane_fiber), 1, int(i));
  }
  // The first simdgroup with a runnable lane runs as far as it can (its lanes in order, each until
  // it blocks; again while its own collectives complete) before the next one starts: a legal Metal
  // schedule that makes a missing threadgroup barrier read unwritten (0xFF-filled) memory.
  for (;;) {
    uint lo = 0;
    while (lo < G.n) {
      uint hi = simdgroup_end(G, lo);
      bool runnable = false;
      for (uint i = lo; i < hi && !runnable; ++i) runnable = G.lanes[i].state == RUNNING;
      if (runnable) break;
      lo = hi;
    }
    if (lo == G.n) {  // every lane blocked or returned
      if (G.live == 0 || progress(G) < 0) return;
      continue;
    }
    uint hi = simdgroup_end(G, lo);
    for (uint i = lo; i < hi; ++i) {
      if (G.lanes[i].state != RUNNING) continue;
      t_lane = &G.lanes[i];
      swapcontext(&G.scheduler, &G.lanes[i].context);
      if (G.failed) return;  // interrupted
    }
    if (settle_simdgroup(G, lo, hi) < 0) return;
  }
}

#endif

extern "C" char __start_msl_tg_mem[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_msl_tg_mem[] __attribute__((weak, visibility("hidden")));

// Threadgroup memory starts as 0xFF bytes in every threadgroup (byte loop: no sanitizer redzones
// between the arrays may be touched through an instrumented memset).
__attribute__((no_sanitize("address"))) __attribute__((no_sanitize("thread"))) __attribute__((noinline))
static void poison_threadgroup_memory() {
  for (volatile char* p = __start_msl_tg_mem; p < __stop_msl_tg_mem; ++p) *p = char(0xff);
}

// Runs every threadgroup of the grid, one after another. Returns 0, or 1 with the diagnostic in error.
static int launch(LaneFn fn, void* ctx, uint threads, uint3 grid, char* error, size_t cap) {
  Group& G = g_group;
  if (threads == 0 || threads > kMaxLanes) {
    std::snprintf(error, cap, "%u threads per threadgroup: must be 1..%u", threads, kMaxLanes);
    return 1;
  }
  for (uint z = 0; z < grid.z; ++z)
    for (uint y = 0; y < grid.y; ++y)
      for (uint x = 0; x < grid.x; ++x) {
        if (g_stop.load(std::memory_order_relaxed)) {
          std::snprintf(error, cap, "%s", kInterrupted);
          release_stacks();
          return 1;
        }
        G.fn = fn;
        G.ctx = ctx;
        G.position = uint3{x, y, z};
        G.n = G.live = threads;
        G.failed = false;
        G.error[0] = 0;
        for (uint i = 0; i < threads; ++i) {
          Lane& L = G.lanes[i];
          L.tid = i;
          L.state = RUNNING;
          L.op = OP_NONE;
          L.line = 0;
          L.simd_gen = 0;
        }
        poison_threadgroup_memory();
        run_group(G);
        if (G.failed) {
          std::snprintf(error, cap, "%s", G.error);
          release_stacks();
          return 1;
        }
      }
  release_stacks();
  return 0;
}

static inline void poll_stop() {
  if (__builtin_expect(g_stop.load(std::memory_order_relaxed), false)) interrupted();
}

// ---- bounds of on-chip arrays (the harness's checked build spells each index of a threadgroup or
// thread array `name[i]` as name[msl_cpu_index(i, extent, "name", __LINE__)])

// Fails the launch ("threadgroup (0, 0, 0), lane 3: index 12 is outside on-chip array s[8] (line
// 27)") and ends the lane.
[[noreturn]] static void out_of_bounds(long long index, long long extent, const char* name, uint line) {
  Group& G = g_group;
#ifdef MSL_CPU_THREADS
  pthread_mutex_lock(&G.mutex);
#endif
  if (!G.failed) {
    G.failed = true;
    std::snprintf(G.error, kErrorCap, "threadgroup (%u, %u, %u), lane %u: index %lld is outside "
                  "on-chip array %s[%lld] (line %u)", G.position.x, G.position.y, G.position.z,
                  t_lane->tid, index, name, extent, line);
  }
  wake_all(G);
#ifdef MSL_CPU_THREADS
  pthread_mutex_unlock(&G.mutex);
#endif
  throw Abort();
}

// ---- collectives' plumbing

struct Simdgroup {
  uint lo, size, lane;  // first lane, lanes in it, the caller's index in it
};

static inline Simdgroup my_simdgroup() {
  uint tid = t_lane->tid;
  uint lo = tid / kSimd * kSimd;
  uint hi = lo + kSimd < g_group.n ? lo + kSimd : g_group.n;
  return Simdgroup{lo, hi - lo, tid - lo};
}

// Deposits x, waits for the simdgroup at op, and returns the slot row to read the others' values.
template <class T>
static const uint64_t* exchange(T x, Op op, uint line, const uint64_t* args) {
  static_assert(sizeof(T) <= 8, "simd collectives take scalars of at most 8 bytes");
  Lane& L = *t_lane;
  uint64_t* row = g_group.slots[L.simd_gen++ & 1u];
  row[L.tid] = 0;
  std::memcpy(&row[L.tid], &x, sizeof(T));
  arrive(op, line, args);
  return row;
}

template <class T>
static inline T slot_value(const uint64_t* row, uint lane) {
  T v;
  std::memcpy(&v, &row[lane], sizeof(T));
  return v;
}

template <class T>
using accumulator = std::conditional_t<std::is_integral<T>::value, T, float>;

}  // namespace msl_cpu

// ---- barriers, simd reductions and simdgroup matrices -----------------------------------------

namespace metal {

inline void threadgroup_barrier(mem_flags, uint line = __builtin_LINE()) {
  msl_cpu::arrive(msl_cpu::OP_THREADGROUP_BARRIER, line, nullptr);
}
inline void simdgroup_barrier(mem_flags, uint line = __builtin_LINE()) {
  msl_cpu::arrive(msl_cpu::OP_SIMDGROUP_BARRIER, line, nullptr);
}

template <class T>
inline T simd_sum(T x, uint line = __builtin_LINE()) {
  const uint64_t* row = msl_cpu::exchange(x, msl_cpu::OP_SIMD_SUM, line, nullptr);
  msl_cpu::Simdgroup s = msl_cpu::my_simdgroup();
  msl_cpu::accumulator<T> acc = 0;
  for (uint i = 0; i < s.size; ++i) acc += msl_cpu::accumulator<T>(msl_cpu::slot_value<T>(row, s.lo + i));
  return T(acc);
}

// the simdgroup's lanes' values of x folded left to right with pick(a, b) (max or min)
template <class T, class Pick>
inline T simd_fold(T x, msl_cpu::Op op, uint line, Pick pick) {
  const uint64_t* row = msl_cpu::exchange(x, op, line, nullptr);
  msl_cpu::Simdgroup s = msl_cpu::my_simdgroup();
  T acc = msl_cpu::slot_value<T>(row, s.lo);
  for (uint i = 1; i < s.size; ++i) acc = pick(acc, msl_cpu::slot_value<T>(row, s.lo + i));
  return acc;
}

template <class T>
inline T simd_max(T x, uint line = __builtin_LINE()) {
  return simd_fold(x, msl_cpu::OP_SIMD_MAX, line, [](T a, T b) { return max(a, b); });
}

template <class T>
inline T simd_min(T x, uint line = __builtin_LINE()) {
  return simd_fold(x, msl_cpu::OP_SIMD_MIN, line, [](T a, T b) { return min(a, b); });
}

template <class T>
inline T simd_shuffle_xor(T x, ushort mask, uint line = __builtin_LINE()) {
  const uint64_t* row = msl_cpu::exchange(x, msl_cpu::OP_SIMD_SHUFFLE_XOR, line, nullptr);
  msl_cpu::Simdgroup s = msl_cpu::my_simdgroup();
  uint source = s.lane ^ uint(mask);
  return source < s.size ? msl_cpu::slot_value<T>(row, s.lo + source) : x;
}

template <class T>
inline T simd_broadcast(T x, ushort lane, uint line = __builtin_LINE()) {
  const uint64_t args[4] = {lane, 0, 0, 0};
  const uint64_t* row = msl_cpu::exchange(x, msl_cpu::OP_SIMD_BROADCAST, line, args);
  msl_cpu::Simdgroup s = msl_cpu::my_simdgroup();
  return uint(lane) < s.size ? msl_cpu::slot_value<T>(row, s.lo + lane) : x;
}

template <class T, int Rows, int Cols>
struct simdgroup_matrix {
  static_assert(Rows == 8 && Cols == 8, "simdgroup_matrix: only 8x8 exists");
  static_assert(std::is_same<T, float>::value || std::is_same<T, half>::value ||
                    std::is_same<T, bfloat>::value,
                "simdgroup_matrix: the element type must be float, half or bfloat");
  T e[64];  // row-major; every lane holds the whole matrix
  simdgroup_matrix() {
    const T nan = T(NAN);
    for (int i = 0; i < 64; ++i) e[i] = nan;
  }
};

typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int Rows, int Cols>
inline simdgroup_matrix<T, Rows, Cols> make_filled_simdgroup_matrix(const T value) {
  simdgroup_matrix<T, Rows, Cols> m;
  for (int i = 0; i < 64; ++i) m.e[i] = value;
  return m;
}

// Offset of matrix element (r, c) in memory: origin (col, row) in memory coordinates.
inline ulong simdgroup_offset(int r, int c, ulong elements_per_row, ulong2 origin, bool transpose) {
  return transpose ? (origin.y + c) * elements_per_row + origin.x + r
                   : (origin.y + r) * elements_per_row + origin.x + c;
}

template <class T>
inline void simdgroup_load(simdgroup_matrix<T, 8, 8>& m, const T* src, ulong elements_per_row = 8,
                           ulong2 origin = ulong2(0), bool transpose = false,
                           uint line = __builtin_LINE()) {
  const uint64_t args[4] = {uint64_t(src), elements_per_row, origin.x, origin.y * 2 + transpose};
  msl_cpu::arrive(msl_cpu::OP_SIMDGROUP_LOAD, line, args);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c)
      m.e[r * 8 + c] = src[simdgroup_offset(r, c, elements_per_row, origin, transpose)];
}

template <class T>
inline void simdgroup_store(const simdgroup_matrix<T, 8, 8>& m, T* dst, ulong elements_per_row = 8,
                            ulong2 origin = ulong2(0), bool transpose = false,
                            uint line = __builtin_LINE()) {
  const uint64_t args[4] = {uint64_t(dst), elements_per_row, origin.x, origin.y * 2 + transpose};
  msl_cpu::arrive(msl_cpu::OP_SIMDGROUP_STORE, line, args);
  msl_cpu::Simdgroup s = msl_cpu::my_simdgroup();
  for (uint i = s.lane; i < 64; i += s.size)
    dst[simdgroup_offset(int(i / 8), int(i % 8), elements_per_row, origin, transpose)] = m.e[i];
}

// d = a * b + c, in float, rounded once to d's type. a and b share a type; c and d are each float
// or that type.
template <class TD, class TA, class TB, class TC>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                          const simdgroup_matrix<TB, 8, 8>& b,
                                          const simdgroup_matrix<TC, 8, 8>& c,
                                          uint line = __builtin_LINE()) {
  static_assert(std::is_same<TA, TB>::value, "simdgroup_multiply_accumulate: a and b need one type");
  static_assert(std::is_same<TC, float>::value || std::is_same<TC, TA>::value,
                "simdgroup_multiply_accumulate: c must be float or the type of a and b");
  static_assert(std::is_same<TD, float>::value || std::is_same<TD, TA>::value,
                "simdgroup_multiply_accumulate: d must be float or the type of a and b");
  msl_cpu::arrive(msl_cpu::OP_SIMDGROUP_MMA, line, nullptr);
  float fa[64], fb[64], out[64];
  for (int i = 0; i < 64; ++i) {
    fa[i] = float(a.e[i]);
    fb[i] = float(b.e[i]);
  }
  for (int r = 0; r < 8; ++r)
    for (int col = 0; col < 8; ++col) {
      float acc = float(c.e[r * 8 + col]);
      for (int k = 0; k < 8; ++k) acc += fa[r * 8 + k] * fb[k * 8 + col];
      out[r * 8 + col] = acc;
    }
  for (int i = 0; i < 64; ++i) d.e[i] = TD(out[i]);
}

}  // namespace metal

// ---- the standalone driver of the sanitizer builds --------------------------------------------

namespace msl_cpu {

typedef int (*LaunchFn)(void** buffers, uint gx, uint gy, uint gz, char* error, size_t cap);

// argv: <folder> gx gy gz. Reads <folder>/arg<i>.bin into exactly-sized heap buffers (so a sanitizer
// sees accesses past their ends), launches, writes the written ones back. Exit 3: a harness
// diagnostic, printed after "msl_cpu error: ".
static int file_main(int argc, char** argv, int count, const bool* written, LaunchFn launch_fn) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s <folder> gx gy gz\n", argv[0]);
    return 2;
  }
  void* buffers[64] = {};
  size_t sizes[64] = {};
  char path[4096];
  for (int i = 0; i < count; ++i) {
    std::snprintf(path, sizeof path, "%s/arg%d.bin", argv[1], i);
    FILE* f = std::fopen(path, "rb");
    if (!f) { std::perror(path); return 2; }
    std::fseek(f, 0, SEEK_END);
    sizes[i] = size_t(std::ftell(f));
    std::fseek(f, 0, SEEK_SET);
    buffers[i] = sizes[i] ? std::malloc(sizes[i]) : nullptr;
    if (sizes[i] && std::fread(buffers[i], 1, sizes[i], f) != sizes[i]) { std::perror(path); return 2; }
    std::fclose(f);
  }
  char error[kErrorCap] = {};
  int rc = launch_fn(buffers, uint(std::atoi(argv[2])), uint(std::atoi(argv[3])), uint(std::atoi(argv[4])),
                     error, sizeof error);
  if (rc != 0) {
    std::fprintf(stderr, "msl_cpu error: %s\n", error);
    return 3;
  }
  for (int i = 0; i < count; ++i) {
    if (!written[i]) continue;
    std::snprintf(path, sizeof path, "%s/arg%d.bin", argv[1], i);
    FILE* f = std::fopen(path, "wb");
    if (!f || std::fwrite(buffers[i], 1, sizes[i], f) != sizes[i]) { std::perror(path); return 2; }
    std::fclose(f);
  }
  for (int i = 0; i < count; ++i) std::free(buffers[i]);
  return 0;
}

}  // namespace msl_cpu

// ---- MSL qualifiers (last: the standard headers above must not see them) ------------------------

#define device
#define constant const
#define thread
#define threadgroup static __attribute__((section("msl_tg_mem"), aligned(16)))

// A loop of the kernel text (the harness writes `for (...)` so): each iteration first checks for a
// stop request.
#define msl_cpu_for(...) for (__VA_ARGS__) if (::msl_cpu::poll_stop(), false) {} else

// An index of an on-chip array in the harness's checked build: the index, or the launch fails.
template <class I>
inline I msl_cpu_index(I index, long long extent, const char* name, uint line) {
  long long at = static_cast<long long>(index);
  if (__builtin_expect(at < 0 || at >= extent, false)) ::msl_cpu::out_of_bounds(at, extent, name, line);
  return index;
}

#endif  // TILEWS_MSL_CPU_H
