/* kernels/cuda/emu/emu.cpp — the CUDA emulator (see cuda_emu.h): the fiber
 * scheduler that runs kernel launches on the CPU, the device-memory arena
 * (strict mode), the per-stream queues of deferred work, the runtime API
 * subset (memory registry, streams, events, devices, errors) and the
 * cuBLAS GEMMs.
 *
 * Scheduler. A launch runs its blocks one after another on the OS thread
 * that runs its stream's queue. A block's threads are fibers started
 * lazily in thread order; a thread runs until it returns or waits at a
 * barrier, then the next one runs. A fiber stack whose thread returned is
 * parked and reused for the next thread, so a kernel that never waits runs
 * every thread on one stack (the fast path); stacks are pooled per OS
 * thread across launches (mmap, a PROT_NONE guard page below each).
 * Context switches are a few instructions of assembly on x86-64
 * (callee-saved registers, MXCSR, x87 control word), ucontext elsewhere;
 * under AddressSanitizer every switch is announced with
 * __sanitizer_{start,finish}_switch_fiber.
 *
 * Barriers: the last thread to arrive releases the others and carries on;
 * a thread that returned counts as arrived. Warp operations (__syncwarp and
 * shuffles) complete when every lane of the mask has arrived with the same
 * operation; the last lane computes every lane's result (PTX shfl.sync's
 * formula) into the warp's exchange buffer. When a full pass over the block
 * finds no thread to run but some have not returned, the block deadlocked.
 *
 * Arena (strict mode). One mmap(PROT_NONE, MAP_NORESERVE) reservation of
 * 64 GiB (less if the system refuses) holds every cudaMalloc block,
 * page-aligned, first fit over a coalescing free list below a high-water
 * mark; a freed block's pages go back with MADV_DONTNEED. Blocks stay
 * PROT_NONE. While the queues run device work (a "window": one outermost
 * run of the queues), the first touch of a block by that work faults, the
 * SIGSEGV handler opens that block (mprotect RW) and the access is
 * retried; when the run ends the opened blocks close again. So the cost
 * is two mprotect calls and one fault per block touched per
 * synchronization, whatever else is allocated (opening all of device
 * memory per window costs time proportional to every populated page). If
 * SIGSEGV is not ours when a window starts (another library took it over
 * and refuses to give it back, e.g. an ASan that keeps the signal),
 * [base, high water) opens at once instead. A fault inside the arena
 * anywhere else is reported: host code touching device memory, or device
 * work touching arena pages outside every live allocation (a freed
 * block). A fault in a fiber stack's guard page is a stack overflow; any
 * other fault goes to the handler that was there before. Without strict
 * mode the arena is simply read-write.
 *
 * Queues (deferred mode). Every stream (the per-device legacy and
 * per-thread streams included) is a FIFO of operations numbered 1, 2, ...;
 * `done` is the last one that ran. An operation may carry dependencies
 * (stream, number): before it runs, each of those streams runs up to that
 * number (cudaStreamWaitEvent, and the legacy stream's implicit
 * synchronization with blocking streams, are such dependencies). A
 * dependency always names work queued earlier, so running never cycles.
 * An event remembers its last record (stream, number, generation); it has
 * completed once that record ran. Destroyed streams and events stay alive
 * until their queued work ran. All of it is guarded by one recursive mutex
 * (g_exec), held while work runs: one host thread runs device work at a
 * time.
 */
#include <cxxabi.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <strings.h>
#include <time.h>
#include <ucontext.h> /* REG_ERR: whether a fault was a write */
#include <unistd.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

/* after the system headers: it defines __noinline__ and friends */
#include "cuda_emu.h"
#include "weft_config.h"
#if WEFT_HAVE_BLAS
#include <cblas.h>
#endif
#include "kernels.h" /* weft_f16_to_f32 / weft_f32_to_f16 */

#if defined(__SANITIZE_ADDRESS__)
#define WEFT_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WEFT_EMU_ASAN 1
#endif
#endif
#ifndef WEFT_EMU_ASAN
#define WEFT_EMU_ASAN 0
#endif
#if WEFT_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__) && !defined(WEFT_EMU_UCONTEXT)
#define WEFT_EMU_ASM_SWITCH 1
#else
#define WEFT_EMU_ASM_SWITCH 0
#endif

namespace weft_emu {
__thread uint3 threadIdx WEFT_EMU_TLS_;
__thread uint3 blockIdx WEFT_EMU_TLS_;
__thread dim3 blockDim WEFT_EMU_TLS_;
__thread dim3 gridDim WEFT_EMU_TLS_;
}  // namespace weft_emu

namespace {

/* ------------------------------------------------------ context switch */

#if WEFT_EMU_ASM_SWITCH
struct Ctx {
  void *sp;
};
}  // namespace
extern "C" void weft_emu_swap_ctx_(void **save_sp, void *load_sp);
extern "C" void weft_emu_fiber_tramp_(void);
extern "C" __attribute__((used, visibility("hidden"))) void weft_emu_fiber_entry_(void *arg);
/* Saves callee-saved registers, MXCSR and the x87 control word on the
 * current stack, stores the stack pointer in *save_sp, switches to load_sp
 * and restores the same from there. The trampoline starts a new fiber:
 * its argument was left in r12. */
asm(R"(
  .pushsection .text
  .globl weft_emu_swap_ctx_
  .hidden weft_emu_swap_ctx_
  .type weft_emu_swap_ctx_, @function
weft_emu_swap_ctx_:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size weft_emu_swap_ctx_, .-weft_emu_swap_ctx_
  .globl weft_emu_fiber_tramp_
  .hidden weft_emu_fiber_tramp_
  .type weft_emu_fiber_tramp_, @function
weft_emu_fiber_tramp_:
  movq %r12, %rdi
  andq $-16, %rsp
  call weft_emu_fiber_entry_
  ud2
  .size weft_emu_fiber_tramp_, .-weft_emu_fiber_tramp_
  .popsection
)");
namespace {
void ctx_make(Ctx *c, char *stack, size_t size, void *arg) {
  uint64_t *sp = (uint64_t *)(((uintptr_t)stack + size) & ~(uintptr_t)15);
  uint32_t mxcsr;
  uint16_t fcw;
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(fcw));
  *--sp = 0;                                /* alignment pad */
  *--sp = (uint64_t)&weft_emu_fiber_tramp_; /* ret target */
  *--sp = 0;                                /* rbp */
  *--sp = 0;                                /* rbx */
  *--sp = (uint64_t)arg;                    /* r12 */
  *--sp = 0;                                /* r13 */
  *--sp = 0;                                /* r14 */
  *--sp = 0;                                /* r15 */
  *--sp = (uint64_t)mxcsr | ((uint64_t)fcw << 32);
  c->sp = sp;
}
inline void ctx_swap(Ctx *from, Ctx *to) { weft_emu_swap_ctx_(&from->sp, to->sp); }
#else
struct Ctx {
  ucontext_t uc;
};
}  // namespace
extern "C" void weft_emu_fiber_entry_(void *arg);
namespace {
void ctx_tramp(unsigned lo, unsigned hi) {
  weft_emu_fiber_entry_((void *)(((uintptr_t)hi << 32) | (uintptr_t)lo));
}
void ctx_make(Ctx *c, char *stack, size_t size, void *arg) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = nullptr;
  uintptr_t a = (uintptr_t)arg;
  makecontext(&c->uc, (void (*)())ctx_tramp, 2, (unsigned)(a & 0xffffffffu),
              (unsigned)((uint64_t)a >> 32));
}
inline void ctx_swap(Ctx *from, Ctx *to) { swapcontext(&from->uc, &to->uc); }
#endif

/* ------------------------------------------------------------ scheduler */

enum FiberState : uint8_t { F_NEW, F_READY, F_RUNNING, F_WAIT_BLOCK, F_WAIT_WARP, F_DONE };
enum WarpKind : uint8_t { W_SYNCWARP = 0, W_SHFL = 1 };

struct Stack {
  Ctx ctx;
  char *map;   /* the mapping: guard page, then the stack */
  char *base;  /* lowest usable byte */
  size_t size; /* usable bytes */
  size_t map_size;
};

struct Fiber {
  Stack *st;
  uint3 tid;
  FiberState state;
};

struct Warp {
  uint32_t exist, done, arrived;
  uint32_t mask[32];
  int b[32], c[32], width[32];
  uint8_t kind[32], mode[32], size[32];
  uint64_t val[32], res[32];
};

struct Launch {
  dim3 grid, block;
  size_t smem;
  void (*fn)(const void *);
  const void *ctx;
  const char *name;             /* the kernel as spelled at the launch */
  const std::type_info *kernel; /* the body's type (names the launching function) */
};

struct Sched {
  Ctx main_ctx;
  const void *main_bottom = nullptr;
  size_t main_size = 0;
  std::vector<Stack *> all, free_stacks;
  size_t stack_size = 0;
  std::vector<Fiber> fib;
  std::vector<Warp> warps;
  Launch *launch = nullptr; /* non-null while a launch runs */
  unsigned n = 0, ndone = 0, nwait_block = 0;
  unsigned cur = 0; /* the running thread (linear id) */
  bool in_fiber = false;
  char *dyn_smem = nullptr;
  char *altstack = nullptr; /* for the guard-page handler */

  ~Sched() {
    if (altstack) {
      stack_t ss{};
      ss.ss_flags = SS_DISABLE;
      sigaltstack(&ss, nullptr);
      free(altstack);
    }
    for (Stack *s : all) {
      munmap(s->map, s->map_size);
      delete s;
    }
  }
};

thread_local Sched *tls_sched_;
thread_local struct SchedHolder {
  ~SchedHolder() {
    delete tls_sched_;
    tls_sched_ = nullptr;
  }
} tls_holder_;

Sched &sched() {
  if (!tls_sched_) {
    (void)&tls_holder_; /* registers the thread-exit cleanup */
    tls_sched_ = new Sched();
  }
  return *tls_sched_;
}

/* The running kernel's name, demangled ("weft_emu_foo(...)::{lambda()#1}"
 * names the function that launched it). */
std::string kernel_name(const std::type_info *ti) {
  if (!ti) return "?";
  int st = 0;
  char *d = abi::__cxa_demangle(ti->name(), nullptr, nullptr, &st);
  std::string s = (st == 0 && d) ? d : ti->name();
  free(d);
  return s;
}

extern int g_shuffle; /* block order, below ("modes") */
extern uint64_t g_shuffle_seed;

[[noreturn]] __attribute__((format(printf, 1, 2))) void fail(const char *fmt, ...) {
  Sched *s = tls_sched_;
  fflush(stdout);
  if (s && s->launch) {
    Launch *L = s->launch;
    fprintf(stderr,
            "weft CUDA emulator: in the kernel launch %s (%s), grid (%u,%u,%u), block "
            "(%u,%u,%u), %zu bytes of dynamic shared memory; block (%u,%u,%u)",
            L->name ? L->name : "?", kernel_name(L->kernel).c_str(), L->grid.x, L->grid.y,
            L->grid.z, L->block.x, L->block.y, L->block.z, L->smem, blockIdx.x, blockIdx.y,
            blockIdx.z);
    if (s->in_fiber) {
      uint3 t = s->fib[s->cur].tid;
      fprintf(stderr, ", thread (%u,%u,%u)", t.x, t.y, t.z);
    }
    if (g_shuffle == 1)
      fprintf(stderr, " (blocks in shuffled order: WEFT_EMU_SHUFFLE=%llu repeats it)",
              (unsigned long long)g_shuffle_seed);
    fprintf(stderr, ": ");
  } else {
    fprintf(stderr, "weft CUDA emulator: ");
  }
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
  fflush(stderr);
  abort();
}

size_t stack_bytes() {
  const char *e = getenv("WEFT_EMU_STACK_KB");
  long kb = WEFT_EMU_ASAN ? 256 : 64;
  if (e && *e) {
    char *end;
    long v = strtol(e, &end, 10);
    if (*end == '\0' && v >= 16 && v <= 65536) kb = v;
  }
  return (size_t)kb * 1024;
}

/* The SIGSEGV handler: a fault inside the device-memory arena is reported
 * by arena_fault (strict mode: host code touching device memory; it does
 * not return), a fault in a fiber stack's guard page is a stack overflow
 * (kernels compile with -fstack-clash-protection, so a big frame touches
 * the guard page instead of jumping over it). Other faults go to the
 * handler that was there before: it is reinstated and the fault repeats.
 * Under ASan the handler is installed the same way (ASan lets a program
 * override its own); should ASan keep the signal, its report kills the
 * process instead. */
struct sigaction g_old_segv;
std::mutex g_segv_mu;
bool arena_fault(const char *addr, void *uc); /* below, with the arena */

void segv_handler(int sig, siginfo_t *si, void *uc) {
  if (arena_fault((const char *)si->si_addr, uc)) return; /* opened: retry the access */
  Sched *s = tls_sched_;
  if (s) {
    for (Stack *st : s->all) {
      if ((char *)si->si_addr >= st->map && (char *)si->si_addr < st->base) {
        static const char m1[] = "weft CUDA emulator: fiber stack overflow in the kernel launch ";
        static const char m2[] = " (raise WEFT_EMU_STACK_KB, or use less stack per thread)\n";
        const char *name = s->launch && s->launch->name ? s->launch->name : "?";
        const char *type = s->launch && s->launch->kernel ? s->launch->kernel->name() : "?";
        ssize_t r = write(2, m1, sizeof m1 - 1);
        r = write(2, name, strlen(name));
        r = write(2, " (", 2);
        r = write(2, type, strlen(type));
        r = write(2, ")", 1);
        r = write(2, m2, sizeof m2 - 1);
        (void)r;
        abort();
      }
    }
  }
  /* not ours: reinstate the previous handler; the fault repeats there */
  sigaction(SIGSEGV, &g_old_segv, nullptr);
  (void)sig;
}

bool handler_is_ours() {
  struct sigaction cur {};
  return sigaction(SIGSEGV, nullptr, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
         cur.sa_sigaction == segv_handler;
}

/* Makes ours SIGSEGV's handler (chaining to whatever was there: a library
 * may have installed its own since); false if the system keeps another
 * (an ASan that does not share the signal). One sigaction call when it is
 * already ours. */
bool ensure_fault_handler() {
  if (handler_is_ours()) return true;
  std::lock_guard<std::mutex> g(g_segv_mu);
  struct sigaction sa {
  }, old{};
  sa.sa_sigaction = segv_handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGSEGV, &sa, &old) != 0) return false;
  if (!((old.sa_flags & SA_SIGINFO) && old.sa_sigaction == segv_handler)) g_old_segv = old;
  return handler_is_ours();
}

/* An alternate signal stack for this thread (a fiber stack overflow leaves
 * no stack to run the handler on). */
void install_altstack(Sched &s) {
  if (s.altstack) return;
  stack_t cur{};
  if (sigaltstack(nullptr, &cur) == 0 && (cur.ss_flags & SS_DISABLE)) {
    size_t sz = 64 * 1024;
    s.altstack = (char *)malloc(sz);
    if (s.altstack) {
      stack_t ss{};
      ss.ss_sp = s.altstack;
      ss.ss_size = sz;
      sigaltstack(&ss, nullptr);
    }
  }
}

Stack *stack_get(Sched &s) {
  if (!s.free_stacks.empty()) {
    Stack *st = s.free_stacks.back();
    s.free_stacks.pop_back();
    return st;
  }
  if (s.stack_size == 0) s.stack_size = stack_bytes();
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t size = (s.stack_size + page - 1) / page * page;
  Stack *st = new Stack();
  st->map_size = size + page;
  void *m = mmap(nullptr, st->map_size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (m == MAP_FAILED) fail("cannot map a %zu-byte fiber stack: %s", st->map_size, strerror(errno));
  st->map = (char *)m;
  if (mprotect(st->map, page, PROT_NONE) != 0)
    fail("mprotect of a guard page: %s", strerror(errno));
  st->base = st->map + page;
  st->size = size;
  ctx_make(&st->ctx, st->base, st->size, st);
  s.all.push_back(st);
  return st;
}

/* main -> fiber */
inline void switch_to_fiber(Sched &s, Stack *st) {
#if WEFT_EMU_ASAN
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, st->base, st->size);
#endif
  s.in_fiber = true;
  ctx_swap(&s.main_ctx, &st->ctx);
  s.in_fiber = false;
#if WEFT_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

/* fiber -> main; returns when the scheduler resumes this fiber */
inline void switch_to_main(Sched &s, Stack *st) {
#if WEFT_EMU_ASAN
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, s.main_bottom, s.main_size);
#endif
  ctx_swap(&st->ctx, &s.main_ctx);
#if WEFT_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, &s.main_bottom, &s.main_size);
#endif
}

Sched &fiber_sched(const char *what) {
  Sched *s = tls_sched_;
  if (!s || !s->in_fiber) fail("%s called outside a kernel", what);
  return *s;
}

void suspend(Sched &s) {
  Fiber &f = s.fib[s.cur];
  switch_to_main(s, f.st);
  /* resumed: the scheduler set cur and the geometry */
}

void release_block(Sched &s) {
  for (unsigned t = 0; t < s.n; t++)
    if (s.fib[t].state == F_WAIT_BLOCK) s.fib[t].state = F_READY;
  s.nwait_block = 0;
}

const char *shfl_name(int mode) {
  switch (mode) {
    case WEFT_EMU_SHFL_IDX_:
      return "__shfl_sync";
    case WEFT_EMU_SHFL_UP_:
      return "__shfl_up_sync";
    case WEFT_EMU_SHFL_DOWN_:
      return "__shfl_down_sync";
    case WEFT_EMU_BALLOT_:
      return "__ballot_sync";
    default:
      return "__shfl_xor_sync";
  }
}

const char *warp_op_name(const Warp &w, int lane) {
  return w.kind[lane] == W_SYNCWARP ? "__syncwarp" : shfl_name(w.mode[lane]);
}

/* Completes the warp operation of mask M if every lane it needs is there;
 * the caller (if it is one of them) keeps running, the others become
 * ready. */
bool warp_try_complete(Sched &s, unsigned wi, uint32_t M) {
  Warp &w = s.warps[wi];
  uint32_t need = M & w.exist & ~w.done;
  if ((w.arrived & need) != need || need == 0) return false;
  int first = __builtin_ctz(need);
  for (uint32_t m = need; m; m &= m - 1) {
    int l = __builtin_ctz(m);
    if (w.kind[l] != w.kind[first] || w.mask[l] != w.mask[first] ||
        (w.kind[l] == W_SHFL && (w.mode[l] != w.mode[first] || w.size[l] != w.size[first] ||
                                 w.width[l] != w.width[first])))
      fail(
          "warp %u: lanes meet at different warp operations: lane %d at %s (mask 0x%08x, "
          "%d-byte value, width %d), lane %d at %s (mask 0x%08x, %d-byte value, width %d)",
          wi, first, warp_op_name(w, first), w.mask[first], w.size[first], w.width[first], l,
          warp_op_name(w, l), w.mask[l], w.size[l], w.width[l]);
  }
  if (w.kind[first] == W_SHFL && w.mode[first] == WEFT_EMU_BALLOT_) {
    uint64_t bits = 0;
    for (uint32_t m = need; m; m &= m - 1) {
      int l = __builtin_ctz(m);
      if (w.val[l]) bits |= 1u << l;
    }
    for (uint32_t m = need; m; m &= m - 1) w.res[__builtin_ctz(m)] = bits;
  } else if (w.kind[first] == W_SHFL) {
    for (uint32_t m = need; m; m &= m - 1) {
      int l = __builtin_ctz(m);
      /* PTX ISA, shfl.sync */
      int bval = w.b[l] & 31, c = w.c[l];
      int segmask = (c >> 8) & 31, cval = c & 31;
      int maxLane = (l & segmask) | (cval & ~segmask);
      int minLane = l & segmask;
      int j;
      bool p;
      switch (w.mode[l]) {
        case WEFT_EMU_SHFL_UP_:
          j = l - bval;
          p = j >= maxLane;
          break;
        case WEFT_EMU_SHFL_DOWN_:
          j = l + bval;
          p = j <= maxLane;
          break;
        case WEFT_EMU_SHFL_BFLY_:
          j = l ^ bval;
          p = j <= maxLane;
          break;
        default:
          j = minLane | (bval & ~segmask);
          p = j <= maxLane;
          break;
      }
      if (!p) j = l;
      if (!((need >> j) & 1u))
        fail("warp %u: lane %d's %s reads lane %d, which is not in the mask 0x%08x", wi, l,
             shfl_name(w.mode[l]), j, M);
      w.res[l] = w.val[j];
    }
  }
  w.arrived &= ~need;
  unsigned base = wi * 32;
  for (uint32_t m = need; m; m &= m - 1) {
    unsigned t = base + (unsigned)__builtin_ctz(m);
    if (s.fib[t].state == F_WAIT_WARP) s.fib[t].state = F_READY;
  }
  return true;
}

uint64_t warp_op(uint8_t kind, unsigned mask, uint64_t bits, int size, int mode, int b, int c,
                 int width) {
  Sched &s = fiber_sched(kind == W_SYNCWARP ? "__syncwarp" : shfl_name(mode));
  unsigned wi = s.cur / 32, lane = s.cur % 32;
  Warp &w = s.warps[wi];
  const char *name = kind == W_SYNCWARP ? "__syncwarp" : shfl_name(mode);
  if (!((mask >> lane) & 1u))
    fail("lane %u calls %s with mask 0x%08x, which leaves the calling lane out", lane, name, mask);
  if (kind == W_SHFL) {
    if (width < 1 || width > 32 || (width & (width - 1)))
      fail("%s with width %d (a power of two in 1..32)", name, width);
    if (mask & ~w.exist)
      fail("%s with mask 0x%08x in warp %u, which has only lanes 0x%08x (block of %u threads)",
           name, mask, wi, w.exist, s.n);
    if (mask & w.done)
      fail("%s with mask 0x%08x in warp %u, but lanes 0x%08x of it have returned", name, mask, wi,
           mask & w.done);
  }
  w.kind[lane] = kind;
  w.mask[lane] = mask;
  w.mode[lane] = (uint8_t)mode;
  w.size[lane] = (uint8_t)size;
  w.b[lane] = b;
  w.c[lane] = c;
  w.width[lane] = width;
  w.val[lane] = bits;
  w.arrived |= 1u << lane;
  Fiber &f = s.fib[s.cur];
  f.state = F_WAIT_WARP;
  if (!warp_try_complete(s, wi, mask)) suspend(s);
  f.state = F_RUNNING;
  return w.res[lane];
}

/* The running thread returned. */
void thread_exit(Sched &s) {
  Fiber &f = s.fib[s.cur];
  f.state = F_DONE;
  s.ndone++;
  unsigned wi = s.cur / 32, lane = s.cur % 32;
  Warp &w = s.warps[wi];
  w.done |= 1u << lane;
  for (uint32_t m = w.arrived; m; m &= m - 1) {
    int l = __builtin_ctz(m);
    if (w.kind[l] == W_SHFL && ((w.mask[l] >> lane) & 1u))
      fail("returned while lane %d of its warp waits for it in %s (mask 0x%08x)", l,
           shfl_name(w.mode[l]), w.mask[l]);
  }
  /* __syncwarp groups that only waited for this lane */
  for (bool again = true; again;) {
    again = false;
    for (uint32_t m = w.arrived; m; m &= m - 1) {
      int l = __builtin_ctz(m);
      if (w.kind[l] == W_SYNCWARP && warp_try_complete(s, wi, w.mask[l])) {
        again = true;
        break;
      }
    }
  }
  if (s.nwait_block > 0 && s.nwait_block + s.ndone == s.n) release_block(s);
}

[[noreturn]] void deadlock(Sched &s) {
  std::string msg = "deadlock: no thread can run, ";
  char buf[256];
  unsigned nblock = 0;
  for (unsigned t = 0; t < s.n; t++) nblock += s.fib[t].state == F_WAIT_BLOCK;
  snprintf(buf, sizeof buf, "%u of %u threads returned, %u wait in __syncthreads", s.ndone, s.n,
           nblock);
  msg += buf;
  for (unsigned wi = 0; wi < s.warps.size(); wi++) {
    Warp &w = s.warps[wi];
    uint32_t shown = 0;
    for (uint32_t m = w.arrived; m; m &= m - 1) {
      int l = __builtin_ctz(m);
      if (shown & (1u << l)) continue;
      uint32_t M = w.mask[l];
      uint32_t same = 0;
      for (uint32_t q = w.arrived; q; q &= q - 1) {
        int k = __builtin_ctz(q);
        if (w.mask[k] == M && w.kind[k] == w.kind[l] && w.mode[k] == w.mode[l]) same |= 1u << k;
      }
      shown |= same;
      uint32_t missing = M & w.exist & ~w.done & ~same;
      snprintf(buf, sizeof buf, "; warp %u: lanes 0x%08x wait in %s (mask 0x%08x) for lanes 0x%08x",
               wi, same, warp_op_name(w, l), M, missing);
      msg += buf;
      uint32_t at_block = 0;
      for (uint32_t q = missing; q; q &= q - 1) {
        int k = __builtin_ctz(q);
        if (s.fib[wi * 32 + k].state == F_WAIT_BLOCK) at_block |= 1u << k;
      }
      if (at_block) {
        snprintf(buf, sizeof buf, " (lanes 0x%08x of those wait in __syncthreads)", at_block);
        msg += buf;
      }
    }
  }
  fail("%s", msg.c_str());
}

void run_block(Sched &s) {
  Launch &L = *s.launch;
  const unsigned bx = L.block.x, bxy = L.block.x * L.block.y;
  for (unsigned t = 0; t < s.n; t++) {
    Fiber &f = s.fib[t];
    f.st = nullptr;
    f.state = F_NEW;
    f.tid = uint3{t % bx, (t / bx) % L.block.y, t / bxy};
  }
  for (unsigned wi = 0; wi < s.warps.size(); wi++) {
    Warp &w = s.warps[wi];
    unsigned lanes = s.n - wi * 32 < 32 ? s.n - wi * 32 : 32;
    w.exist = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    w.done = w.arrived = 0;
  }
  s.ndone = s.nwait_block = 0;
  if (s.dyn_smem) memset(s.dyn_smem, 0xff, L.smem);
  for (;;) {
    bool ran = false;
    for (unsigned t = 0; t < s.n; t++) {
      Fiber &f = s.fib[t];
      if (f.state != F_NEW && f.state != F_READY) continue;
      if (f.state == F_NEW) f.st = stack_get(s);
      f.state = F_RUNNING;
      s.cur = t;
      threadIdx = f.tid;
      switch_to_fiber(s, f.st);
      if (f.state == F_DONE) {
        s.free_stacks.push_back(f.st);
        f.st = nullptr;
      }
      ran = true;
    }
    if (s.ndone == s.n) return;
    if (!ran) deadlock(s);
  }
}

}  // namespace

extern "C" void weft_emu_fiber_entry_(void *arg) {
  Stack *st = (Stack *)arg;
  Sched &s = sched();
#if WEFT_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &s.main_bottom, &s.main_size);
#endif
  for (;;) {
    s.launch->fn(s.launch->ctx);
    thread_exit(s);
    switch_to_main(s, st); /* parked; resumed to run another thread */
  }
}

void weft_emu_syncthreads_(void) {
  Sched &s = fiber_sched("__syncthreads");
  Fiber &f = s.fib[s.cur];
  f.state = F_WAIT_BLOCK;
  s.nwait_block++;
  if (s.nwait_block + s.ndone == s.n)
    release_block(s);
  else
    suspend(s);
  f.state = F_RUNNING;
}

void weft_emu_syncwarp_(unsigned mask) { (void)warp_op(W_SYNCWARP, mask, 0, 0, 0, 0, 0, 32); }

uint64_t weft_emu_shfl_(unsigned mask, uint64_t bits, int size, int mode, int b, int c, int width) {
  return warp_op(W_SHFL, mask, bits, size, mode, b, c, width);
}

void *weft_emu_dyn_smem_(void) {
  Sched &s = fiber_sched("WEFT_DYN_SMEM");
  return s.dyn_smem;
}

/* ================================================================ runtime */

namespace {

thread_local cudaError_t tls_last_error_ = cudaSuccess;
thread_local int tls_device_ = 0;

inline cudaError_t rec(cudaError_t e) {
  if (e != cudaSuccess) tls_last_error_ = e;
  return e;
}

constexpr int kMaxDevices = 64;

int device_count() {
  const char *e = getenv("WEFT_EMU_DEVICES");
  if (!e || !*e) return 1;
  char *end;
  long v = strtol(e, &end, 10);
  if (*end != '\0' || v < 0 || v > kMaxDevices) {
    static bool warned = false;
    if (!warned) {
      warned = true;
      fprintf(stderr,
              "weft CUDA emulator: WEFT_EMU_DEVICES='%s' is not a count in 0..64; using 1\n", e);
    }
    return 1;
  }
  return (int)v;
}

/* A device, and the current one valid (a thread that set device 3 keeps
 * it even if the count drops: calls then fail with InvalidDevice). */
cudaError_t need_device() {
  int n = device_count();
  if (n == 0) return cudaErrorNoDevice;
  if (tls_device_ >= n) return cudaErrorInvalidDevice;
  return cudaSuccess;
}

constexpr size_t kTotalMem = (size_t)16 << 30;
/* cost-only runs model GPUs with up to 141 GiB (an H200) */
constexpr size_t kTotalMemCostOnly = (size_t)141 << 30;
constexpr size_t kMaxQueued = 65536;        /* a stream this full runs */
constexpr unsigned kPollsToCatchUp = 65536; /* cudaEventQuery NotReady answers */

enum AllocKind { A_DEVICE = 2, A_HOST = 1 };
struct Alloc {
  size_t size;
  AllocKind kind;
  int device;
};

std::mutex g_mu;                     /* guards the registry below */
std::map<uintptr_t, Alloc> g_allocs; /* start -> allocation */
size_t g_device_live = 0;
std::set<const void *> g_streams, g_events, g_handles; /* live handles */

/* The allocation holding p (any byte of it); false if none. */
bool lookup_locked(const void *p, uintptr_t *start, Alloc *a) {
  uintptr_t u = (uintptr_t)p;
  auto it = g_allocs.upper_bound(u);
  if (it == g_allocs.begin()) return false;
  --it;
  if (u >= it->first + it->second.size) return false;
  *start = it->first;
  *a = it->second;
  return true;
}

/* Where [p, p + n) lies: 2 = inside one device allocation, 1 = not device
 * memory at all, 0 = starts in device memory but runs past its end. */
int classify(const void *p, size_t n) {
  std::lock_guard<std::mutex> g(g_mu);
  uintptr_t start;
  Alloc a;
  if (!lookup_locked(p, &start, &a) || a.kind != A_DEVICE) return 1;
  return (uintptr_t)p + n <= start + a.size ? 2 : 0;
}

/* [p, p + n) inside one pinned host allocation (cudaMallocHost). */
bool is_pinned(const void *p, size_t n) {
  std::lock_guard<std::mutex> g(g_mu);
  uintptr_t start;
  Alloc a;
  return lookup_locked(p, &start, &a) && a.kind == A_HOST && (uintptr_t)p + n <= start + a.size;
}

bool stream_ok(cudaStream_t s) {
  if (s == 0 || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> g(g_mu);
  return g_streams.count((const void *)s) > 0;
}

bool event_ok(cudaEvent_t e) {
  if (!e) return false;
  std::lock_guard<std::mutex> g(g_mu);
  return g_events.count((const void *)e) > 0;
}

double now_ms() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ---------------------------------------------------------------- modes */

/* Guards the arena, the queues, events' and streams' queue state, and is
 * held while device work runs. Taken before g_mu, never after. */
std::recursive_mutex g_exec;
typedef std::lock_guard<std::recursive_mutex> ExecLock;
int g_strict = -1, g_defer = -1; /* -1: the environment not read yet */

bool env_on(const char *name) {
  const char *e = getenv(name);
  if (!e || !*e) return true;
  return !(strcmp(e, "0") == 0 || strcasecmp(e, "off") == 0 || strcasecmp(e, "no") == 0 ||
           strcasecmp(e, "false") == 0);
}
bool strict_on() {
  if (g_strict < 0) g_strict = env_on("WEFT_EMU_STRICT");
  return g_strict != 0;
}
bool defer_on() {
  if (g_defer < 0) g_defer = env_on("WEFT_EMU_DEFER");
  return g_defer != 0;
}

/* WEFT_EMU_COST_ONLY=1 (off by default): launches and GEMMs are checked
 * and queued as always but not run, and new allocations are zeros, not
 * NaN. The host path, every launch and its cost record (weft_kernel_cost,
 * backend.h) are a real run's, so weft-train --predict can model a model
 * at full size that the emulator would take hours to run; everything
 * computed on the device is meaningless (losses 0, norms 0: a run never
 * clips, where a real one may launch the scaling kernel). */
int g_cost_only = -1;
bool cost_only_on() {
  if (g_cost_only < 0) {
    const char *e = getenv("WEFT_EMU_COST_ONLY");
    g_cost_only = e && *e && env_on("WEFT_EMU_COST_ONLY") ? 1 : 0;
  }
  return g_cost_only != 0;
}

/* Block order (WEFT_EMU_SHUFFLE): a GPU runs a launch's blocks in no set
 * order, so results that depend on it (float atomics adding in block
 * order) differ from run to run there. Here each launch's blocks run in
 * an order drawn from a per-process seed: the seed is WEFT_EMU_SHUFFLE's
 * value when it is a number, else drawn from the clock and pid (so two
 * runs of a program differ as on a GPU); "0"/"off" runs them in z, y, x
 * order. The seed is printed with any failure. */
int g_shuffle = -1;      /* -1: the environment not read yet */
uint64_t g_shuffle_seed; /* this process's seed */
uint64_t g_launch_count; /* launches executed, for each one's order */

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
bool shuffle_on() {
  if (g_shuffle < 0) {
    const char *e = getenv("WEFT_EMU_SHUFFLE");
    char *end = nullptr;
    unsigned long long v = e && *e ? strtoull(e, &end, 10) : 0;
    if (e && *e && end && *end == '\0' && v > 0) {
      g_shuffle_seed = v;
      g_shuffle = 1;
    } else {
      g_shuffle = env_on("WEFT_EMU_SHUFFLE") ? 1 : 0;
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      g_shuffle_seed =
          mix64(((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 16)) |
          1u;
    }
  }
  return g_shuffle != 0;
}

uint64_t gcd64(uint64_t a, uint64_t b) {
  while (b) {
    uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/* ---------------------------------------------------------------- arena */

struct Block {
  size_t len; /* page-rounded */
  bool open;  /* read-write in the current window */
};
struct Arena {
  char *base = nullptr;
  size_t size = 0; /* reserved bytes */
  size_t hw = 0;   /* blocks lie in [base, base + hw) */
  size_t page = 4096;
  std::map<size_t, size_t> free_ranges; /* offset -> bytes, below hw, coalesced */
  std::map<size_t, Block> blocks;       /* live blocks by offset */
  /* The window: device work runs (strict: closed blocks open on first touch) */
  bool window = false;
  std::vector<size_t> opened; /* blocks opened in this window (capacity reserved:
                                 the fault handler never allocates) */
  size_t eager_len = 0;       /* without our handler: [base, base + eager_len) opened */
  int run_depth = 0;          /* nesting of run_stream */
};
Arena g_arena;
thread_local bool tls_device_work_ = false; /* this thread runs the window's work */

inline size_t page_round(size_t n) { return (n + g_arena.page - 1) / g_arena.page * g_arena.page; }

bool arena_init() {
  if (g_arena.base) return true;
  g_arena.page = (size_t)sysconf(_SC_PAGESIZE);
  int prot = strict_on() ? PROT_NONE : PROT_READ | PROT_WRITE;
  for (size_t gib : {160, 64, 32, 17}) {
    size_t sz = gib << 30;
    void *m = mmap(nullptr, sz, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m != MAP_FAILED) {
      g_arena.size = sz;
      g_arena.base = (char *)m;
      break;
    }
  }
  if (!g_arena.base) {
    fprintf(stderr, "weft CUDA emulator: cannot reserve the device-memory arena: %s\n",
            strerror(errno));
    return false;
  }
  ensure_fault_handler();
  return true;
}

void set_prot(char *p, size_t n, int prot) {
  if (n && mprotect(p, n, prot) != 0)
    fail("mprotect of %zu bytes of device memory at %p: %s", n, (void *)p, strerror(errno));
}

/* Device work starts: strict mode opens nothing yet (each block opens on
 * its first touch, in arena_fault), unless SIGSEGV is not ours, in which
 * case [base, base + hw) opens at once. */
void window_open() {
  if (g_arena.window) return;
  bool ours = ensure_fault_handler();
  g_arena.window = true;
  tls_device_work_ = true;
  if (!g_arena.base || !strict_on()) return;
  if (ours) {
    g_arena.opened.reserve(g_arena.blocks.size());
  } else if (g_arena.hw) {
    set_prot(g_arena.base, g_arena.hw, PROT_READ | PROT_WRITE);
    g_arena.eager_len = g_arena.hw;
  }
}

/* Device work ends: what opened closes. */
void window_close() {
  if (!g_arena.window) return;
  if (g_arena.eager_len) set_prot(g_arena.base, g_arena.eager_len, PROT_NONE);
  g_arena.eager_len = 0;
  for (size_t off : g_arena.opened) {
    auto it = g_arena.blocks.find(off);
    set_prot(g_arena.base + off, it->second.len, PROT_NONE);
    it->second.open = false;
  }
  g_arena.opened.clear();
  g_arena.window = false;
  tls_device_work_ = false;
}

/* A page-aligned block of n bytes (first fit), its first n bytes 0xFF. */
char *arena_alloc(size_t n) {
  if (!arena_init()) return nullptr;
  size_t len = page_round(n), off = SIZE_MAX;
  for (auto it = g_arena.free_ranges.begin(); it != g_arena.free_ranges.end(); ++it) {
    if (it->second < len) continue;
    off = it->first;
    size_t rest = it->second - len;
    g_arena.free_ranges.erase(it);
    if (rest) g_arena.free_ranges[off + len] = rest;
    break;
  }
  if (off == SIZE_MAX) {
    if (len > g_arena.size - g_arena.hw) return nullptr;
    off = g_arena.hw;
    g_arena.hw += len;
  }
  char *p = g_arena.base + off;
  g_arena.blocks[off] = Block{len, false};
  bool closed = strict_on(); /* (no window: allocations happen between runs) */
  if (closed) set_prot(p, len, PROT_READ | PROT_WRITE);
  /* cost-only: left as the system gives pages (zeros), and untouched, so
   * a model at full size costs no host memory for its device buffers */
  if (!cost_only_on()) memset(p, 0xff, n); /* NaN in every float / bf16 */
  if (closed) set_prot(p, len, PROT_NONE);
  return p;
}

void arena_free(char *p, size_t n) {
  size_t len = page_round(n), off = (size_t)(p - g_arena.base);
  g_arena.blocks.erase(off);
  madvise(p, len, MADV_DONTNEED); /* the pages go back; they read as 0 if reused */
  auto next = g_arena.free_ranges.lower_bound(off);
  if (next != g_arena.free_ranges.end() && off + len == next->first) {
    len += next->second;
    next = g_arena.free_ranges.erase(next);
  }
  if (next != g_arena.free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      g_arena.free_ranges.erase(prev);
    }
  }
  if (off + len == g_arena.hw)
    g_arena.hw = off;
  else
    g_arena.free_ranges[off] = len;
}

/* Async-signal-safe formatting for the fault report. */
struct SigBuf {
  char b[768];
  size_t n = 0;
  void str(const char *s) {
    while (*s && n < sizeof b - 1) b[n++] = *s++;
  }
  void hex(uintptr_t v) {
    char t[2 + 16];
    int k = 0;
    do {
      t[k++] = "0123456789abcdef"[v & 15];
      v >>= 4;
    } while (v);
    str("0x");
    while (k > 0 && n < sizeof b - 1) b[n++] = t[--k];
  }
  void dec(size_t v) {
    char t[24];
    int k = 0;
    do {
      t[k++] = (char)('0' + v % 10);
      v /= 10;
    } while (v);
    while (k > 0 && n < sizeof b - 1) b[n++] = t[--k];
  }
};

}  // namespace

namespace {
/* Called by the SIGSEGV handler for every fault; returns false for an
 * address outside the arena. Inside it: device work on this thread
 * touching a closed live block opens the block and returns true (the
 * access is retried); anything else is reported and aborts. The blocks only change under
 * g_exec, which the thread running device work holds; the registry is read
 * for a host access only if its lock is free. */
bool arena_fault(const char *addr, void *uc) {
  const char *base = g_arena.base;
  if (!base || addr < base || addr >= base + g_arena.size) return false;
  bool device_work = g_arena.window && tls_device_work_;
  if (device_work && !g_arena.eager_len) {
    size_t off = (size_t)(addr - base);
    auto it = g_arena.blocks.upper_bound(off);
    if (it != g_arena.blocks.begin()) {
      --it;
      if (off < it->first + it->second.len && !it->second.open &&
          g_arena.opened.size() < g_arena.opened.capacity() &&
          mprotect(g_arena.base + it->first, it->second.len, PROT_READ | PROT_WRITE) == 0) {
        it->second.open = true;
        g_arena.opened.push_back(it->first);
        return true;
      }
    }
  }
  SigBuf m;
  m.str("weft CUDA emulator: ");
  int write_access = -1;
#if defined(__x86_64__) && defined(REG_ERR)
  if (uc) write_access = (((ucontext_t *)uc)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
  (void)uc;
#endif
  Sched *s = tls_sched_;
  if (device_work) {
    m.str(s && s->launch ? "the kernel launch " : "device work (a copy, memset or GEMM)");
    if (s && s->launch) {
      m.str(s->launch->name ? s->launch->name : "?");
      m.str(" (");
      m.str(s->launch->kernel ? s->launch->kernel->name() : "?");
      m.str(")");
    }
    m.str(write_access == 1 ? " wrote" : write_access == 0 ? " read" : " read/wrote");
    m.str(" device memory at ");
    m.hex((uintptr_t)addr);
    m.str(", outside every live allocation (freed, or never allocated)\n");
  } else {
    bool have = false;
    uintptr_t start = 0;
    Alloc a{};
    if (g_mu.try_lock()) {
      have = lookup_locked(addr, &start, &a) && a.kind == A_DEVICE;
      g_mu.unlock();
    }
    m.str(write_access == 1   ? "host code wrote"
          : write_access == 0 ? "host code read"
                              : "host code read/wrote");
    m.str(" device memory at ");
    m.hex((uintptr_t)addr);
    if (have) {
      m.str(" (inside the ");
      m.dec(a.size);
      m.str("-byte allocation at ");
      m.hex(start);
      m.str(")");
    } else {
      m.str(" (outside every live allocation: freed, or never allocated)");
    }
    m.str(
        " outside a kernel launch or a copy: copy it to the host first (cudaMemcpy after "
        "synchronizing its stream; WEFT_EMU_STRICT=0 turns this check off)\n");
  }
  ssize_t r = write(2, m.b, m.n);
  (void)r;
  abort();
}
}  // namespace

/* ---------------------------------------------------------------- queues */

struct CUstream_st;
namespace weft_emu {
struct Dep {
  CUstream_st *s;
  uint64_t seq; /* run s up to this operation first */
};
/* One queued operation. */
struct Op {
  uint64_t seq = 0, gtime = 0; /* number in its stream; global enqueue order */
  std::vector<Dep> deps;
  bool touches_memory = true; /* needs the arena open */
  virtual void exec() = 0;
  virtual ~Op() {}
};
}  // namespace weft_emu

struct CUstream_st {
  unsigned flags;
  int device;
  bool legacy;   /* the legacy default stream of `device` */
  bool blocking; /* synchronizes with the legacy stream */
  bool live;     /* the handle is valid (a destroyed stream still drains) */
  std::deque<weft_emu::Op *> q;
  uint64_t enq = 0, done = 0; /* last operation queued / run */
};
struct CUevent_st {
  unsigned flags;
  bool live = true;
  int refs = 1;                  /* the handle and each queued record */
  uint64_t gen = 0;              /* records so far */
  uint64_t done_gen = 0;         /* the newest record that ran */
  CUstream_st *stream = nullptr; /* where the last record is queued */
  uint64_t seq = 0;
  double t_ms = 0;    /* host time at which record done_gen ran */
  unsigned polls = 0; /* NotReady answers for the last record */
};

namespace {

using weft_emu::Dep;
using weft_emu::Op;

/* Never destroyed (not even at exit, where a leak checker must still find
 * the streams reachable). */
std::vector<CUstream_st *> &g_stream_list = *new std::vector<CUstream_st *>(); /* live streams
                                              and destroyed ones with queued work */
std::vector<CUstream_st *> &g_stream_dead = *new std::vector<CUstream_st *>(); /* drained
                                              destroyed streams (deps, events may name them) */
CUstream_st *g_legacy[kMaxDevices], *g_per_thread[kMaxDevices];
uint64_t g_gtime = 0;
size_t g_pending = 0;

CUstream_st *new_stream(unsigned flags, int device, bool legacy, bool blocking) {
  CUstream_st *s = new CUstream_st{flags, device, legacy, blocking, true, {}, 0, 0};
  g_stream_list.push_back(s);
  return s;
}

/* The queue a stream handle names (the handle already checked). */
CUstream_st *resolve(cudaStream_t s) {
  int d = tls_device_;
  if (s == 0 || s == cudaStreamLegacy) {
    if (!g_legacy[d]) g_legacy[d] = new_stream(0, d, true, false);
    return g_legacy[d];
  }
  if (s == cudaStreamPerThread) {
    if (!g_per_thread[d]) g_per_thread[d] = new_stream(0, d, false, true);
    return g_per_thread[d];
  }
  return s;
}

void event_unref(CUevent_st *e) {
  if (--e->refs == 0) delete e;
}

/* Runs S's operations up to number upto (each one's dependencies first). */
void run_stream(CUstream_st *S, uint64_t upto) {
  if (S->done >= upto) return;
  g_arena.run_depth++;
  while (S->done < upto) {
    Op *op = S->q.front();
    for (const Dep &d : op->deps) run_stream(d.s, d.seq);
    if (op->touches_memory) window_open();
    op->exec();
    S->q.pop_front();
    S->done = op->seq;
    g_pending--;
    delete op;
  }
  if (--g_arena.run_depth == 0) window_close();
}

/* Runs everything: each time the stream whose oldest queued operation is
 * the newest (consumers before producers unless something orders them). */
void run_all() {
  while (g_pending > 0) {
    CUstream_st *pick = nullptr;
    for (CUstream_st *S : g_stream_list)
      if (!S->q.empty() && (!pick || S->q.front()->gtime > pick->q.front()->gtime)) pick = S;
    if (!pick) break;
    run_stream(pick, pick->enq);
  }
  for (size_t i = 0; i < g_stream_list.size();) {
    CUstream_st *S = g_stream_list[i];
    if (!S->live && S->q.empty()) {
      g_stream_dead.push_back(S);
      g_stream_list.erase(g_stream_list.begin() + (long)i);
    } else {
      i++;
    }
  }
}

/* Queues op on S (with the legacy stream's implicit dependencies) and
 * returns its number; runs it at once without deferral. */
uint64_t enqueue(CUstream_st *S, Op *op) {
  op->seq = ++S->enq;
  op->gtime = ++g_gtime;
  if (S->legacy) {
    for (CUstream_st *b : g_stream_list)
      if (b->blocking && b->device == S->device && b->done < b->enq)
        op->deps.push_back(Dep{b, b->enq});
  } else if (S->blocking) {
    CUstream_st *L = g_legacy[S->device];
    if (L && L->done < L->enq) op->deps.push_back(Dep{L, L->enq});
  }
  S->q.push_back(op);
  g_pending++;
  uint64_t seq = op->seq;
  if (!defer_on() || S->q.size() >= kMaxQueued) run_stream(S, seq);
  return seq;
}

struct CopyOp : Op {
  void *dst;
  const void *src;
  size_t n;
  std::unique_ptr<char[]> snap; /* pageable host source, staged at the call */
  void exec() override { memmove(dst, snap ? snap.get() : src, n); }
};

struct SetOp : Op {
  void *p;
  int value;
  size_t n;
  void exec() override { memset(p, value & 0xff, n); }
};

struct RecordOp : Op {
  CUevent_st *ev;
  uint64_t gen;
  RecordOp(CUevent_st *e, uint64_t g) : ev(e), gen(g) {
    touches_memory = false;
    e->refs++;
  }
  void exec() override {
    if (gen > ev->done_gen) {
      ev->done_gen = gen;
      ev->t_ms = now_ms();
    }
  }
  ~RecordOp() override { event_unref(ev); }
};

struct WaitOp : Op {
  WaitOp() { touches_memory = false; }
  void exec() override {} /* the dependency did the work */
};

}  // namespace

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidPitchValue:
      return "invalid pitch argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction:
      return "invalid device function";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorUnknown:
      return "unknown error";
  }
  return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidPitchValue:
      return "cudaErrorInvalidPitchValue";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDeviceFunction:
      return "cudaErrorInvalidDeviceFunction";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorUnknown:
      return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = tls_last_error_;
  tls_last_error_ = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return tls_last_error_; }

cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return rec(cudaErrorInvalidValue);
  *count = device_count();
  return *count == 0 ? rec(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  int n = device_count();
  if (n == 0) return rec(cudaErrorNoDevice);
  if (device < 0 || device >= n) return rec(cudaErrorInvalidDevice);
  tls_device_ = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  if (!device) return rec(cudaErrorInvalidValue);
  if (device_count() == 0) return rec(cudaErrorNoDevice);
  *device = tls_device_;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  if (!value) return rec(cudaErrorInvalidValue);
  int n = device_count();
  if (n == 0) return rec(cudaErrorNoDevice);
  if (device < 0 || device >= n) return rec(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      break;
    case cudaDevAttrMaxBlockDimX:
      *value = 1024;
      break;
    case cudaDevAttrMaxBlockDimY:
      *value = 1024;
      break;
    case cudaDevAttrMaxBlockDimZ:
      *value = 64;
      break;
    case cudaDevAttrMaxGridDimX:
      *value = 2147483647;
      break;
    case cudaDevAttrMaxGridDimY:
      *value = 65535;
      break;
    case cudaDevAttrMaxGridDimZ:
      *value = 65535;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = 48 * 1024;
      break;
    case cudaDevAttrWarpSize:
      *value = 32;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = 4;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = 227 * 1024;
      break;
    default:
      return rec(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  if (cudaError_t e = need_device()) return rec(e);
  ExecLock x(g_exec);
  run_all();
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  if (!free_bytes || !total) return rec(cudaErrorInvalidValue);
  if (cudaError_t e = need_device()) return rec(e);
  std::lock_guard<std::mutex> g(g_mu);
  const size_t cap = cost_only_on() ? kTotalMemCostOnly : kTotalMem;
  *total = cap;
  *free_bytes = cap - g_device_live;
  return cudaSuccess;
}

namespace {
cudaError_t alloc_common(void **out, size_t size, AllocKind kind) {
  if (!out) return rec(cudaErrorInvalidValue);
  *out = nullptr;
  if (cudaError_t e = need_device()) return rec(e);
  if (size == 0) return cudaSuccess;
  ExecLock x(g_exec);
  {
    std::lock_guard<std::mutex> g(g_mu);
    const size_t cap = cost_only_on() ? kTotalMemCostOnly : kTotalMem;
    if (kind == A_DEVICE && size > cap - g_device_live) return rec(cudaErrorMemoryAllocation);
  }
  void *p = nullptr;
  if (kind == A_DEVICE) {
    p = arena_alloc(size);
    if (!p) return rec(cudaErrorMemoryAllocation);
  } else if (posix_memalign(&p, 256, size) != 0 || !p) {
    return rec(cudaErrorMemoryAllocation);
  }
  std::lock_guard<std::mutex> g(g_mu);
  g_allocs[(uintptr_t)p] = Alloc{size, kind, tls_device_};
  if (kind == A_DEVICE) g_device_live += size;
  *out = p;
  return cudaSuccess;
}

/* As CUDA's cudaFree / cudaFreeHost: the device synchronizes first. */
cudaError_t free_common(void *p, AllocKind kind) {
  if (!p) return cudaSuccess;
  if (cudaError_t e = need_device()) return rec(e);
  ExecLock x(g_exec);
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || it->second.kind != kind) return rec(cudaErrorInvalidValue);
  }
  run_all();
  size_t size;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_allocs.find((uintptr_t)p);
    size = it->second.size;
    if (kind == A_DEVICE) g_device_live -= size;
    g_allocs.erase(it);
  }
  if (kind == A_DEVICE)
    arena_free((char *)p, size);
  else
    free(p);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMalloc(void **devPtr, size_t size) { return alloc_common(devPtr, size, A_DEVICE); }
cudaError_t cudaFree(void *devPtr) { return free_common(devPtr, A_DEVICE); }
cudaError_t cudaMallocHost(void **ptr, size_t size) { return alloc_common(ptr, size, A_HOST); }
cudaError_t cudaFreeHost(void *ptr) { return free_common(ptr, A_HOST); }

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr) {
  if (!attr) return rec(cudaErrorInvalidValue);
  if (cudaError_t e = need_device()) return rec(e);
  memset(attr, 0, sizeof *attr);
  std::lock_guard<std::mutex> g(g_mu);
  uintptr_t start;
  Alloc a;
  if (ptr && lookup_locked(ptr, &start, &a)) {
    attr->device = a.device;
    if (a.kind == A_DEVICE) {
      attr->type = cudaMemoryTypeDevice;
      attr->devicePointer = (void *)ptr;
    } else {
      attr->type = cudaMemoryTypeHost;
      attr->devicePointer = (void *)ptr;
      attr->hostPointer = (void *)ptr;
    }
  } else {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    attr->hostPointer = (void *)ptr;
  }
  return cudaSuccess;
}

namespace {
/* sync: cudaMemcpy (the legacy stream; runs through the copy unless it is
 * device to device). */
cudaError_t copy_common(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                        cudaStream_t stream, bool sync) {
  if (cudaError_t e = need_device()) return rec(e);
  if (!stream_ok(stream)) return rec(cudaErrorInvalidResourceHandle);
  if ((unsigned)kind > (unsigned)cudaMemcpyDefault) return rec(cudaErrorInvalidMemcpyDirection);
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return rec(cudaErrorInvalidValue);
  int d = classify(dst, n), s = classify(src, n);
  if (d == 0 || s == 0) return rec(cudaErrorInvalidValue); /* runs past a device allocation */
  bool ddev = d == 2, sdev = s == 2;
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToHost:
      ok = !ddev && !sdev;
      break;
    case cudaMemcpyHostToDevice:
      ok = ddev && !sdev;
      break;
    case cudaMemcpyDeviceToHost:
      ok = !ddev && sdev;
      break;
    case cudaMemcpyDeviceToDevice:
      ok = ddev && sdev;
      break;
    case cudaMemcpyDefault:
      ok = true;
      break;
  }
  if (!ok) return rec(cudaErrorInvalidValue);
  ExecLock x(g_exec);
  CopyOp *op = new CopyOp();
  op->dst = dst;
  op->src = src;
  op->n = n;
  op->touches_memory = ddev || sdev;
  if (!sdev && !sync && defer_on() && !is_pinned(src, n)) {
    op->snap.reset(new char[n]);
    memcpy(op->snap.get(), src, n);
  }
  CUstream_st *S = resolve(stream);
  uint64_t seq = enqueue(S, op);
  if (sync && !(ddev && sdev)) run_stream(S, seq);
  return cudaSuccess;
}

cudaError_t set_common(void *p, int value, size_t n, cudaStream_t stream) {
  if (cudaError_t e = need_device()) return rec(e);
  if (!stream_ok(stream)) return rec(cudaErrorInvalidResourceHandle);
  if (n == 0) return cudaSuccess;
  if (!p || classify(p, n) != 2) return rec(cudaErrorInvalidValue);
  ExecLock x(g_exec);
  SetOp *op = new SetOp();
  op->p = p;
  op->value = value;
  op->n = n;
  enqueue(resolve(stream), op);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  return copy_common(dst, src, count, kind, 0, true);
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return copy_common(dst, src, count, kind, stream, false);
}
cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  return set_common(devPtr, value, count, 0);
}
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
  return set_common(devPtr, value, count, stream);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  if (!pStream) return rec(cudaErrorInvalidValue);
  if (cudaError_t e = need_device()) return rec(e);
  if (flags & ~(unsigned)cudaStreamNonBlocking) return rec(cudaErrorInvalidValue);
  ExecLock x(g_exec);
  CUstream_st *s = new_stream(flags, tls_device_, false, !(flags & cudaStreamNonBlocking));
  std::lock_guard<std::mutex> g(g_mu);
  g_streams.insert(s);
  *pStream = s;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}
/* As CUDA: returns at once; queued work still runs (when synchronized). */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (cudaError_t e = need_device()) return rec(e);
  ExecLock x(g_exec);
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (!stream || !g_streams.erase(stream)) return rec(cudaErrorInvalidResourceHandle);
  }
  stream->live = false;
  if (stream->q.empty()) {
    for (size_t i = 0; i < g_stream_list.size(); i++)
      if (g_stream_list[i] == stream) {
        g_stream_list.erase(g_stream_list.begin() + (long)i);
        break;
      }
    g_stream_dead.push_back(stream);
  }
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (cudaError_t e = need_device()) return rec(e);
  if (!stream_ok(stream)) return rec(cudaErrorInvalidResourceHandle);
  ExecLock x(g_exec);
  CUstream_st *S = resolve(stream);
  run_stream(S, S->enq);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (cudaError_t e = need_device()) return rec(e);
  ExecLock x(g_exec);
  if (!stream_ok(stream) || !event_ok(event)) return rec(cudaErrorInvalidResourceHandle);
  if (flags > 1) return rec(cudaErrorInvalidValue);
  if (event->done_gen == event->gen) return cudaSuccess; /* nothing to wait for */
  WaitOp *op = new WaitOp();
  op->deps.push_back(Dep{event->stream, event->seq});
  enqueue(resolve(stream), op);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  if (!event) return rec(cudaErrorInvalidValue);
  if (cudaError_t e = need_device()) return rec(e);
  if ((flags & ~7u) || ((flags & 4u) && !(flags & cudaEventDisableTiming)))
    return rec(cudaErrorInvalidValue);
  CUevent_st *ev = new CUevent_st();
  ev->flags = flags;
  std::lock_guard<std::mutex> g(g_mu);
  g_events.insert(ev);
  *event = ev;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (cudaError_t e = need_device()) return rec(e);
  ExecLock x(g_exec);
  if (!event_ok(event) || !stream_ok(stream)) return rec(cudaErrorInvalidResourceHandle);
  CUstream_st *S = resolve(stream);
  event->gen++;
  event->stream = S;
  event->polls = 0;
  event->seq = S->enq + 1; /* what enqueue numbers it (it may run at once) */
  enqueue(S, new RecordOp(event, event->gen));
  return cudaSuccess;
}
/* NotReady (not recorded as the last error) while the last record has not
 * run; runs nothing, except that a long poll lets the device catch up. */
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (cudaError_t e = need_device()) return rec(e);
  ExecLock x(g_exec);
  if (!event_ok(event)) return rec(cudaErrorInvalidResourceHandle);
  if (event->done_gen == event->gen) return cudaSuccess;
  if (++event->polls < kPollsToCatchUp) return cudaErrorNotReady;
  run_stream(event->stream, event->seq);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (cudaError_t e = need_device()) return rec(e);
  ExecLock x(g_exec);
  if (!event_ok(event)) return rec(cudaErrorInvalidResourceHandle);
  if (event->done_gen != event->gen) run_stream(event->stream, event->seq);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return rec(cudaErrorInvalidValue);
  if (cudaError_t e = need_device()) return rec(e);
  ExecLock x(g_exec);
  if (!event_ok(start) || !event_ok(end)) return rec(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming)
    return rec(cudaErrorInvalidResourceHandle);
  if (!start->gen || !end->gen) return rec(cudaErrorInvalidResourceHandle);
  if (start->done_gen != start->gen || end->done_gen != end->gen) return cudaErrorNotReady;
  *ms = (float)(end->t_ms - start->t_ms);
  return cudaSuccess;
}
/* As CUDA: a queued record still runs; the event goes away after it. */
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (cudaError_t e = need_device()) return rec(e);
  ExecLock x(g_exec);
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (!event || !g_events.erase(event)) return rec(cudaErrorInvalidResourceHandle);
  }
  event->live = false;
  event_unref(event);
  return cudaSuccess;
}

extern "C" int weft_emu_set_strict(int on) {
  ExecLock x(g_exec);
  int prev = strict_on() ? 1 : 0;
  on = on ? 1 : 0;
  if (on != prev) {
    if (g_arena.base) {
      if (g_arena.run_depth) fail("weft_emu_set_strict called while device work runs");
      set_prot(g_arena.base, g_arena.size, on ? PROT_NONE : PROT_READ | PROT_WRITE);
    }
    g_strict = on;
  }
  return prev;
}

extern "C" unsigned long long weft_emu_set_shuffle(unsigned long long seed) {
  ExecLock x(g_exec);
  const unsigned long long prev = shuffle_on() ? g_shuffle_seed : 0;
  g_shuffle = seed ? 1 : 0;
  if (seed) g_shuffle_seed = seed;
  return prev;
}

extern "C" int weft_emu_set_defer(int on) {
  ExecLock x(g_exec);
  int prev = defer_on() ? 1 : 0;
  if (!on) run_all();
  g_defer = on ? 1 : 0;
  return prev;
}

/* =============================================================== launches */

namespace {

void execute_launch(Launch &L) {
  Sched &s = sched();
  if (s.launch) fail("a launch ran inside a launch (the emulator's queues are broken)");
  install_altstack(s);
  s.n = L.block.x * L.block.y * L.block.z;
  s.fib.resize(s.n);
  s.warps.resize((s.n + 31) / 32);
  void *dyn = nullptr;
  if (posix_memalign(&dyn, 16, L.smem ? L.smem : 16) != 0)
    fail("cannot allocate %zu bytes of dynamic shared memory", L.smem);
  s.dyn_smem = (char *)dyn;
  s.launch = &L;
  weft_emu::gridDim = L.grid;
  weft_emu::blockDim = L.block;
  /* block i of the launch's order is block (a i + b) mod n of z, y, x
   * order: a bijection when gcd(a, n) = 1 (a = 1, b = 0 without shuffling) */
  const uint64_t gx = L.grid.x, gxy = gx * L.grid.y, n = gxy * L.grid.z;
  uint64_t a = 1, b = 0;
  if (shuffle_on() && n > 1) {
    const uint64_t r = mix64(g_shuffle_seed ^ mix64(++g_launch_count));
    a = 1 + r % (n - 1);
    while (gcd64(a, n) != 1) a = a % (n - 1) + 1;
    b = (r >> 32) % n;
  }
  for (uint64_t i = 0; i < n; i++) {
    const uint64_t j = (uint64_t)(((unsigned __int128)a * i + b) % n);
    weft_emu::blockIdx = uint3{(unsigned)(j % gx), (unsigned)(j % gxy / gx), (unsigned)(j / gxy)};
    run_block(s);
  }
  s.launch = nullptr;
  s.dyn_smem = nullptr;
  free(dyn);
}

struct LaunchOp : Op {
  Launch L;
  void (*destroy)(void *);
  void exec() override {
    if (!cost_only_on()) execute_launch(L);
  }
  ~LaunchOp() override { destroy(const_cast<void *>(L.ctx)); }
};

}  // namespace

void weft_emu_check_launch_ptr_(const char *name, int index, const void *p) {
  /* no device: the launch itself is rejected; strict memory off: allowed;
   * freed device memory: the kernel's touch reports it, naming the access */
  if (!p || need_device() != cudaSuccess || !strict_on()) return;
  if (g_arena.base && (const char *)p >= g_arena.base &&
      (const char *)p < g_arena.base + g_arena.size)
    return;
  uintptr_t start;
  Alloc a;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (lookup_locked(p, &start, &a)) return; /* device or pinned host memory */
  }
  fail(
      "kernel %s: argument %d (%p) is neither device memory nor pinned host memory (a host "
      "pointer, or freed): a GPU faults on it; copy the data to the device first",
      name, index + 1, p);
}

void weft_emu_run_(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   void (*fn)(const void *), void *ctx, void (*destroy)(void *), const char *name,
                   const std::type_info &kernel) {
  Sched &s = sched();
  if (s.launch)
    fail("kernel %s (%s) launched from device code (dynamic parallelism is not emulated)", name,
         kernel_name(&kernel).c_str());
  cudaError_t err = need_device();
  if (!err && !stream_ok(stream)) err = cudaErrorInvalidResourceHandle;
  uint64_t threads = (uint64_t)block.x * block.y * block.z;
  if (!err &&
      (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
       grid.z > 65535 || block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 ||
       block.y > 1024 || block.z > 64 || threads > 1024 || smem > 227 * 1024))
    err = cudaErrorInvalidConfiguration;
  if (err) {
    destroy(ctx);
    rec(err);
    return;
  }
  ExecLock x(g_exec);
  LaunchOp *op = new LaunchOp();
  op->L = Launch{grid, block, smem, fn, ctx, name, &kernel};
  op->destroy = destroy;
  enqueue(resolve(stream), op);
}

/* ================================================================ cuBLAS */

struct cublasContext {
  cudaStream_t stream;
  cublasMath_t math;
  cublasPointerMode_t pmode;
};

namespace {

bool handle_ok(cublasHandle_t h) {
  if (!h) return false;
  std::lock_guard<std::mutex> g(g_mu);
  return g_handles.count((const void *)h) > 0;
}

enum Round { R_NONE, R_TF32, R_BF16, R_F16 };

inline float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* fp32 -> TF32 (1 + 8 + 10 bits) round to nearest even, kept in a float. */
inline float round_tf32(float x) {
  uint32_t u = f_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) /* inf stays, NaN stays NaN (quiet) */
    return (u & 0x007fffffu) ? bits_f(u | 0x00400000u) : x;
  u += 0xfffu + ((u >> 13) & 1u);
  return bits_f(u & 0xffffe000u);
}

inline double round_op(float x, Round r) {
  switch (r) {
    case R_TF32:
      return round_tf32(x);
    case R_BF16:
      return __bfloat162float(__float2bfloat16(x));
    case R_F16:
      return weft_f16_to_f32(weft_f32_to_f16(x));
    default:
      return x;
  }
}

inline size_t type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

inline float load(const void *p, cudaDataType t, int64_t i) {
  switch (t) {
    case CUDA_R_32F:
      return ((const float *)p)[i];
    case CUDA_R_16BF: {
      __nv_bfloat16 h;
      memcpy(&h, (const char *)p + 2 * i, 2);
      return __bfloat162float(h);
    }
    default: {
      uint16_t h;
      memcpy(&h, (const char *)p + 2 * i, 2);
      return weft_f16_to_f32(h);
    }
  }
}

inline void store(void *p, cudaDataType t, int64_t i, float v) {
  switch (t) {
    case CUDA_R_32F:
      ((float *)p)[i] = v;
      return;
    case CUDA_R_16BF: {
      __nv_bfloat16 h = __float2bfloat16(v);
      memcpy((char *)p + 2 * i, &h, 2);
      return;
    }
    default: {
      uint16_t h = weft_f32_to_f16(v);
      memcpy((char *)p + 2 * i, &h, 2);
      return;
    }
  }
}

/* Every batch's [p, p + extent) inside device memory; else a message. */
bool check_operand(const char *func, const char *name, const void *p, cudaDataType t, int64_t rows,
                   int64_t cols, int64_t ld, long long stride, int batch) {
  size_t es = type_size(t);
  size_t bytes = (size_t)((cols - 1) * ld + rows) * es;
  for (int b = 0; b < batch; b++) {
    const char *q = (const char *)p + (int64_t)b * stride * (int64_t)es;
    if (classify(q, bytes) != 2) {
      fprintf(stderr,
              "weft CUDA emulator: %s: %s (%p, batch %d: %lld x %lld, leading dim %lld, %zu "
              "bytes) is not inside one device allocation\n",
              func, name, (const void *)q, b, (long long)rows, (long long)cols, (long long)ld,
              bytes);
      return false;
    }
  }
  return true;
}

struct GemmArgs {
  const char *func;
  cublasHandle_t h;
  cublasOperation_t ta, tb;
  int m, n, k;
  float alpha, beta;
  const void *A;
  cudaDataType At;
  int lda;
  long long sA;
  const void *B;
  cudaDataType Bt;
  int ldb;
  long long sB;
  void *C;
  cudaDataType Ct;
  int ldc;
  long long sC;
  int batch;
  Round round;
};

bool op_ok(cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T || o == CUBLAS_OP_C; }

/* The arguments cuBLAS validates (status INVALID_VALUE). */
cublasStatus_t gemm_validate(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                             int lda, int ldb, int ldc, int batch) {
  if (!op_ok(ta) || !op_ok(tb) || m < 0 || n < 0 || k < 0 || batch < 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
  if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

/* The call-time checks of the operands (the registry only: no memory is
 * read). */
cublasStatus_t gemm_check(const GemmArgs &g, bool ab) {
  const int m = g.m, n = g.n, k = g.k;
  const bool an = g.ta == CUBLAS_OP_N, bn = g.tb == CUBLAS_OP_N;
  if (ab && (!check_operand(g.func, "A", g.A, g.At, an ? m : k, an ? k : m, g.lda, g.sA, g.batch) ||
             !check_operand(g.func, "B", g.B, g.Bt, bn ? k : n, bn ? n : k, g.ldb, g.sB, g.batch)))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  if (!check_operand(g.func, "C", g.C, g.Ct, m, n, g.ldc, g.sC, g.batch))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

/* Products of at least this many multiply-adds go to dgemm (see below). */
#define EMU_DGEMM_MIN (double)(1 << 22)

/* The GEMM itself, when its stream runs it. */
void gemm_compute(const GemmArgs &g) {
  const int m = g.m, n = g.n, k = g.k;
  const bool ab = g.alpha != 0.0f && k > 0; /* A and B are read */
  const bool an = g.ta == CUBLAS_OP_N, bn = g.tb == CUBLAS_OP_N;
  std::vector<double> Ad(ab ? (size_t)m * k : 0), Bd(ab ? (size_t)k * n : 0), acc((size_t)n);
  const size_t es_a = type_size(g.At), es_b = type_size(g.Bt), es_c = type_size(g.Ct);
  for (int b = 0; b < g.batch; b++) {
    const char *A = (const char *)g.A + (int64_t)b * g.sA * (int64_t)es_a;
    const char *B = (const char *)g.B + (int64_t)b * g.sB * (int64_t)es_b;
    char *C = (char *)g.C + (int64_t)b * g.sC * (int64_t)es_c;
    if (ab) {
      /* op(A) row-major m x k, op(B) row-major k x n, operands rounded */
      for (int i = 0; i < m; i++)
        for (int l = 0; l < k; l++)
          Ad[(size_t)i * k + l] = round_op(
              load(A, g.At, an ? (int64_t)i + (int64_t)l * g.lda : (int64_t)l + (int64_t)i * g.lda),
              g.round);
      for (int l = 0; l < k; l++)
        for (int j = 0; j < n; j++)
          Bd[(size_t)l * n + j] = round_op(
              load(B, g.Bt, bn ? (int64_t)l + (int64_t)j * g.ldb : (int64_t)j + (int64_t)l * g.ldb),
              g.round);
    }
#if WEFT_HAVE_BLAS
    /* note: large products (a model at full size, weft-train --predict)
     * take OpenBLAS's dgemm, 20-40x the loop below: the same operands and
     * double accumulation, in another order, so the f32 results can differ
     * from the loop's only where a double sum lands within 1e-16 of an f32
     * rounding boundary. Tests' shapes stay under the threshold. */
    if (ab && (double)m * n * k >= EMU_DGEMM_MIN) {
      std::vector<double> all((size_t)m * n);
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, Ad.data(), k, Bd.data(),
                  n, 0.0, all.data(), n);
      for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
          int64_t ci = (int64_t)i + (int64_t)j * g.ldc;
          double v = (double)g.alpha * all[(size_t)i * n + j];
          if (g.beta != 0.0f) v += (double)g.beta * (double)load(C, g.Ct, ci);
          store(C, g.Ct, ci, (float)v);
        }
      continue;
    }
#endif
    for (int i = 0; i < m; i++) {
      for (int j = 0; j < n; j++) acc[j] = 0.0;
      if (ab) {
        const double *arow = &Ad[(size_t)i * k];
        for (int l = 0; l < k; l++) {
          const double a = arow[l];
          const double *brow = &Bd[(size_t)l * n];
          for (int j = 0; j < n; j++) acc[j] += a * brow[j];
        }
      }
      for (int j = 0; j < n; j++) {
        int64_t ci = (int64_t)i + (int64_t)j * g.ldc;
        double v = (double)g.alpha * acc[j];
        if (g.beta != 0.0f) v += (double)g.beta * (double)load(C, g.Ct, ci);
        store(C, g.Ct, ci, (float)v);
      }
    }
  }
}

struct GemmOp : weft_emu::Op {
  GemmArgs g;
  const float *dalpha = nullptr, *dbeta = nullptr; /* CUBLAS_POINTER_MODE_DEVICE */
  void exec() override {
    if (dalpha) g.alpha = *dalpha;
    if (dbeta) g.beta = *dbeta;
    if (!cost_only_on()) gemm_compute(g);
  }
};

/* Checks the operands and queues the GEMM on the handle's stream. alpha and
 * beta are read now (host pointer mode) or when it runs (device mode). */
cublasStatus_t gemm_submit(GemmArgs g, const float *alpha, const float *beta) {
  cublasHandle_t h = g.h;
  bool dev = h->pmode == CUBLAS_POINTER_MODE_DEVICE;
  if (dev && (classify(alpha, 4) != 2 || classify(beta, 4) != 2)) {
    fprintf(stderr,
            "weft CUDA emulator: %s: device pointer mode, but alpha (%p) or beta (%p) is "
            "not device memory\n",
            g.func, (const void *)alpha, (const void *)beta);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!dev) g.alpha = *alpha, g.beta = *beta;
  if (g.m == 0 || g.n == 0 || g.batch == 0) return CUBLAS_STATUS_SUCCESS;
  if (cublasStatus_t st = gemm_check(g, g.k > 0 && (dev || g.alpha != 0.0f))) return st;
  ExecLock x(g_exec);
  if (!stream_ok(h->stream)) {
    fprintf(stderr, "weft CUDA emulator: %s: the handle's stream was destroyed\n", g.func);
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  GemmOp *op = new GemmOp();
  op->g = g;
  if (dev) op->dalpha = alpha, op->dbeta = beta;
  enqueue(resolve(h->stream), op);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t gemm_ex(const char *func, cublasHandle_t h, cublasOperation_t ta,
                       cublasOperation_t tb, int m, int n, int k, const void *alpha, const void *A,
                       cudaDataType At, int lda, long long sA, const void *B, cudaDataType Bt,
                       int ldb, long long sB, const void *beta, void *C, cudaDataType Ct, int ldc,
                       long long sC, int batch, cublasComputeType_t ct, cublasGemmAlgo_t algo) {
  if (!handle_ok(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (cublasStatus_t st = gemm_validate(ta, tb, m, n, k, lda, ldb, ldc, batch)) return st;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  if (!((algo >= -1 && algo <= 23) || (algo >= 99 && algo <= 115)))
    return CUBLAS_STATUS_INVALID_VALUE;
  Round r = R_NONE;
  bool f32 = At == CUDA_R_32F && Bt == CUDA_R_32F && Ct == CUDA_R_32F;
  bool half = (At == CUDA_R_16BF || At == CUDA_R_16F) && Bt == At && (Ct == At || Ct == CUDA_R_32F);
  switch (ct) {
    case CUBLAS_COMPUTE_32F:
      if (!f32 && !half) return CUBLAS_STATUS_NOT_SUPPORTED;
      if (f32 && (h->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH) r = R_TF32;
      break;
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      if (!f32 && !half) return CUBLAS_STATUS_NOT_SUPPORTED;
      break;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      if (!f32) return CUBLAS_STATUS_NOT_SUPPORTED;
      r = R_TF32;
      break;
    case CUBLAS_COMPUTE_32F_FAST_16BF:
      if (!f32) return CUBLAS_STATUS_NOT_SUPPORTED;
      r = R_BF16;
      break;
    case CUBLAS_COMPUTE_32F_FAST_16F:
      if (!f32) return CUBLAS_STATUS_NOT_SUPPORTED;
      r = R_F16;
      break;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  GemmArgs g{func, h, ta, tb,  m,  n, k,  0.0f, 0.0f, A,     At, lda,
             sA,   B, Bt, ldb, sB, C, Ct, ldc,  sC,   batch, r};
  return gemm_submit(g, (const float *)alpha, (const float *)beta);
}

}  // namespace

const char *cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "error detected trying to check the license";
  }
  return "unknown error";
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = nullptr;
  if (need_device() != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
  cublasContext *c = new cublasContext{0, CUBLAS_DEFAULT_MATH, CUBLAS_POINTER_MODE_HOST};
  std::lock_guard<std::mutex> g(g_mu);
  g_handles.insert(c);
  *handle = c;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  std::lock_guard<std::mutex> g(g_mu);
  if (!handle || !g_handles.erase(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!stream_ok(streamId)) return CUBLAS_STATUS_INVALID_VALUE;
  handle->stream = streamId;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId) {
  if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!streamId) return CUBLAS_STATUS_INVALID_VALUE;
  *streamId = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t bytes) {
  if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0 && (!workspace || classify(workspace, bytes) != 2))
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS; /* the emulator needs none */
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
    return CUBLAS_STATUS_INVALID_VALUE;
  handle->pmode = mode; /* device mode: alpha / beta are read when the GEMM runs */
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  unsigned base = (unsigned)mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (base > CUBLAS_TF32_TENSOR_OP_MATH) return CUBLAS_STATUS_INVALID_VALUE;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode) {
  if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda,
                                         long long int strideA, const float *B, int ldb,
                                         long long int strideB, const float *beta, float *C,
                                         int ldc, long long int strideC, int batchCount) {
  if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (cublasStatus_t st = gemm_validate(transa, transb, m, n, k, lda, ldb, ldc, batchCount))
    return st;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  Round r = (handle->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH ? R_TF32 : R_NONE;
  GemmArgs g{"cublasSgemmStridedBatched",
             handle,
             transa,
             transb,
             m,
             n,
             k,
             0.0f,
             0.0f,
             A,
             CUDA_R_32F,
             lda,
             strideA,
             B,
             CUDA_R_32F,
             ldb,
             strideB,
             C,
             CUDA_R_32F,
             ldc,
             strideC,
             batchCount,
             r};
  return gemm_submit(g, alpha, beta);
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float *alpha,
                              const float *A, int lda, const float *B, int ldb, const float *beta,
                              float *C, int ldc) {
  if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (cublasStatus_t st = gemm_validate(transa, transb, m, n, k, lda, ldb, ldc, 1)) return st;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  Round r = (handle->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH ? R_TF32 : R_NONE;
  GemmArgs g{"cublasSgemm",
             handle,
             transa,
             transb,
             m,
             n,
             k,
             0.0f,
             0.0f,
             A,
             CUDA_R_32F,
             lda,
             0,
             B,
             CUDA_R_32F,
             ldb,
             0,
             C,
             CUDA_R_32F,
             ldc,
             0,
             1,
             r};
  return gemm_submit(g, alpha, beta);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  return gemm_ex("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype,
                 ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return gemm_ex("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype,
                 lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
                 computeType, algo);
}
