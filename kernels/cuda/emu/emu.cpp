/* kernels/cuda/emu/emu.cpp — the CUDA emulator (see cuda_emu.h): the fiber
 * scheduler that runs kernel launches on the CPU, the runtime API subset
 * (memory registry, streams, events, devices, errors) and the cuBLAS GEMMs.
 *
 * Scheduler. A launch runs its blocks one after another on the calling OS
 * thread. A block's threads are fibers started lazily in thread order; a
 * thread runs until it returns or waits at a barrier, then the next one
 * runs. A fiber stack whose thread returned is parked and reused for the
 * next thread, so a kernel that never waits runs every thread on one stack
 * (the fast path); stacks are pooled per OS thread across launches (mmap,
 * a PROT_NONE guard page below each). Context switches are a few
 * instructions of assembly on x86-64 (callee-saved registers, MXCSR, x87
 * control word), ucontext elsewhere; under AddressSanitizer every switch
 * is announced with __sanitizer_{start,finish}_switch_fiber.
 *
 * Barriers: the last thread to arrive releases the others and carries on;
 * a thread that returned counts as arrived. Warp operations (__syncwarp and
 * shuffles) complete when every lane of the mask has arrived with the same
 * operation; the last lane computes every lane's result (PTX shfl.sync's
 * formula) into the warp's exchange buffer. When a full pass over the block
 * finds no thread to run but some have not returned, the block deadlocked.
 */
#include "cuda_emu.h"

#include <cxxabi.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

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
#include <ucontext.h>
#endif

namespace weft_emu {
__thread uint3 threadIdx WEFT_EMU_TLS_;
__thread uint3 blockIdx WEFT_EMU_TLS_;
__thread dim3 blockDim WEFT_EMU_TLS_;
__thread dim3 gridDim WEFT_EMU_TLS_;
} // namespace weft_emu

namespace {

/* ------------------------------------------------------ context switch */

#if WEFT_EMU_ASM_SWITCH
struct Ctx {
  void *sp;
};
} // namespace
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
  *--sp = 0;                                  /* alignment pad */
  *--sp = (uint64_t)&weft_emu_fiber_tramp_;  /* ret target */
  *--sp = 0;                                  /* rbp */
  *--sp = 0;                                  /* rbx */
  *--sp = (uint64_t)arg;                      /* r12 */
  *--sp = 0;                                  /* r13 */
  *--sp = 0;                                  /* r14 */
  *--sp = 0;                                  /* r15 */
  *--sp = (uint64_t)mxcsr | ((uint64_t)fcw << 32);
  c->sp = sp;
}
inline void ctx_swap(Ctx *from, Ctx *to) { weft_emu_swap_ctx_(&from->sp, to->sp); }
#else
struct Ctx {
  ucontext_t uc;
};
} // namespace
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
  const std::type_info *kernel;
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
  unsigned cur = 0;          /* the running thread (linear id) */
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
  ~SchedHolder() { delete tls_sched_; tls_sched_ = nullptr; }
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

[[noreturn]] __attribute__((format(printf, 1, 2))) void fail(const char *fmt, ...) {
  Sched *s = tls_sched_;
  fflush(stdout);
  if (s && s->launch) {
    Launch *L = s->launch;
    fprintf(stderr,
            "weft CUDA emulator: in the kernel launch %s, grid (%u,%u,%u), block (%u,%u,%u), "
            "%zu bytes of dynamic shared memory; block (%u,%u,%u)",
            kernel_name(L->kernel).c_str(), L->grid.x, L->grid.y, L->grid.z, L->block.x,
            L->block.y, L->block.z, L->smem, blockIdx.x, blockIdx.y, blockIdx.z);
    if (s->in_fiber) {
      uint3 t = s->fib[s->cur].tid;
      fprintf(stderr, ", thread (%u,%u,%u)", t.x, t.y, t.z);
    }
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

/* Fiber stack overflow: a fault in a guard page aborts with a message
 * (kernels compile with -fstack-clash-protection, so a big frame touches
 * the guard page instead of jumping over it). Other faults go to the
 * handler that was there before. Not under ASan, which reports them. */
#if !WEFT_EMU_ASAN
struct sigaction g_old_segv;
std::once_flag g_segv_once;

void segv_handler(int sig, siginfo_t *si, void *uc) {
  Sched *s = tls_sched_;
  if (s) {
    for (Stack *st : s->all) {
      if ((char *)si->si_addr >= st->map && (char *)si->si_addr < st->base) {
        static const char m1[] = "weft CUDA emulator: fiber stack overflow in the kernel launch ";
        static const char m2[] = " (raise WEFT_EMU_STACK_KB, or use less stack per thread)\n";
        const char *name = s->launch && s->launch->kernel ? s->launch->kernel->name() : "?";
        ssize_t r = write(2, m1, sizeof m1 - 1);
        r = write(2, name, strlen(name));
        r = write(2, m2, sizeof m2 - 1);
        (void)r;
        abort();
      }
    }
  }
  /* not ours: reinstate the previous handler; the fault repeats there */
  sigaction(SIGSEGV, &g_old_segv, nullptr);
  (void)sig;
  (void)uc;
}
#endif

void install_overflow_handler(Sched &s) {
#if !WEFT_EMU_ASAN
  if (!s.altstack) {
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
  std::call_once(g_segv_once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
  });
#else
  (void)s;
#endif
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
  if (mprotect(st->map, page, PROT_NONE) != 0) fail("mprotect of a guard page: %s", strerror(errno));
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
    case WEFT_EMU_SHFL_IDX_: return "__shfl_sync";
    case WEFT_EMU_SHFL_UP_: return "__shfl_up_sync";
    case WEFT_EMU_SHFL_DOWN_: return "__shfl_down_sync";
    default: return "__shfl_xor_sync";
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
      fail("warp %u: lanes meet at different warp operations: lane %d at %s (mask 0x%08x, "
           "%d-byte value, width %d), lane %d at %s (mask 0x%08x, %d-byte value, width %d)",
           wi, first, warp_op_name(w, first), w.mask[first], w.size[first], w.width[first], l,
           warp_op_name(w, l), w.mask[l], w.size[l], w.width[l]);
  }
  if (w.kind[first] == W_SHFL) {
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
        case WEFT_EMU_SHFL_UP_: j = l - bval; p = j >= maxLane; break;
        case WEFT_EMU_SHFL_DOWN_: j = l + bval; p = j <= maxLane; break;
        case WEFT_EMU_SHFL_BFLY_: j = l ^ bval; p = j <= maxLane; break;
        default: j = minLane | (bval & ~segmask); p = j <= maxLane; break;
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

} // namespace

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

uint64_t weft_emu_shfl_(unsigned mask, uint64_t bits, int size, int mode, int b, int c,
                        int width) {
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

int device_count() {
  const char *e = getenv("WEFT_EMU_DEVICES");
  if (!e || !*e) return 1;
  char *end;
  long v = strtol(e, &end, 10);
  if (*end != '\0' || v < 0 || v > 64) {
    static bool warned = false;
    if (!warned) {
      warned = true;
      fprintf(stderr, "weft CUDA emulator: WEFT_EMU_DEVICES='%s' is not a count in 0..64; using 1\n",
              e);
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

enum AllocKind { A_DEVICE = 2, A_HOST = 1 };
struct Alloc {
  size_t size;
  AllocKind kind;
  int device;
};

std::mutex g_mu;                       /* guards everything below */
std::map<uintptr_t, Alloc> g_allocs;   /* start -> allocation */
size_t g_device_live = 0;
std::set<const void *> g_streams, g_events, g_handles;

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

} // namespace

struct CUstream_st {
  unsigned flags;
  int device;
};
struct CUevent_st {
  unsigned flags;
  bool recorded;
  double t_ms;
};

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidPitchValue: return "cudaErrorInvalidPitchValue";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorUnknown: return "cudaErrorUnknown";
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
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: *value = 1024; break;
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY: *value = 65535; break;
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = 4; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; break;
    default: return rec(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return rec(need_device()); }

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  if (!free_bytes || !total) return rec(cudaErrorInvalidValue);
  if (cudaError_t e = need_device()) return rec(e);
  std::lock_guard<std::mutex> g(g_mu);
  *total = kTotalMem;
  *free_bytes = kTotalMem - g_device_live;
  return cudaSuccess;
}

namespace {
cudaError_t alloc_common(void **out, size_t size, AllocKind kind) {
  if (!out) return rec(cudaErrorInvalidValue);
  *out = nullptr;
  if (cudaError_t e = need_device()) return rec(e);
  if (size == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (kind == A_DEVICE && size > kTotalMem - g_device_live) return rec(cudaErrorMemoryAllocation);
  }
  void *p = nullptr;
  if (posix_memalign(&p, 256, size) != 0 || !p) return rec(cudaErrorMemoryAllocation);
  if (kind == A_DEVICE) memset(p, 0xff, size); /* NaN in every float / bf16 */
  std::lock_guard<std::mutex> g(g_mu);
  g_allocs[(uintptr_t)p] = Alloc{size, kind, tls_device_};
  if (kind == A_DEVICE) g_device_live += size;
  *out = p;
  return cudaSuccess;
}

cudaError_t free_common(void *p, AllocKind kind) {
  if (!p) return cudaSuccess;
  if (cudaError_t e = need_device()) return rec(e);
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || it->second.kind != kind) return rec(cudaErrorInvalidValue);
    if (kind == A_DEVICE) g_device_live -= it->second.size;
    g_allocs.erase(it);
  }
  free(p);
  return cudaSuccess;
}
} // namespace

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
cudaError_t copy_common(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                        cudaStream_t stream) {
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
    case cudaMemcpyHostToHost: ok = !ddev && !sdev; break;
    case cudaMemcpyHostToDevice: ok = ddev && !sdev; break;
    case cudaMemcpyDeviceToHost: ok = !ddev && sdev; break;
    case cudaMemcpyDeviceToDevice: ok = ddev && sdev; break;
    case cudaMemcpyDefault: ok = true; break;
  }
  if (!ok) return rec(cudaErrorInvalidValue);
  memmove(dst, src, n);
  return cudaSuccess;
}

cudaError_t set_common(void *p, int value, size_t n, cudaStream_t stream) {
  if (cudaError_t e = need_device()) return rec(e);
  if (!stream_ok(stream)) return rec(cudaErrorInvalidResourceHandle);
  if (n == 0) return cudaSuccess;
  if (!p || classify(p, n) != 2) return rec(cudaErrorInvalidValue);
  memset(p, value & 0xff, n);
  return cudaSuccess;
}
} // namespace

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  return copy_common(dst, src, count, kind, 0);
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return copy_common(dst, src, count, kind, stream);
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
  CUstream_st *s = new CUstream_st{flags, tls_device_};
  std::lock_guard<std::mutex> g(g_mu);
  g_streams.insert(s);
  *pStream = s;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (cudaError_t e = need_device()) return rec(e);
  std::lock_guard<std::mutex> g(g_mu);
  if (!stream || !g_streams.erase(stream)) return rec(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (cudaError_t e = need_device()) return rec(e);
  return stream_ok(stream) ? cudaSuccess : rec(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (cudaError_t e = need_device()) return rec(e);
  if (!stream_ok(stream) || !event_ok(event)) return rec(cudaErrorInvalidResourceHandle);
  if (flags > 1) return rec(cudaErrorInvalidValue);
  return cudaSuccess; /* work is synchronous: the event has completed */
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  if (!event) return rec(cudaErrorInvalidValue);
  if (cudaError_t e = need_device()) return rec(e);
  if ((flags & ~7u) || ((flags & 4u) && !(flags & cudaEventDisableTiming)))
    return rec(cudaErrorInvalidValue);
  CUevent_st *ev = new CUevent_st{flags, false, 0.0};
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
  if (!event_ok(event) || !stream_ok(stream)) return rec(cudaErrorInvalidResourceHandle);
  event->recorded = true;
  event->t_ms = now_ms();
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (cudaError_t e = need_device()) return rec(e);
  return event_ok(event) ? cudaSuccess : rec(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (cudaError_t e = need_device()) return rec(e);
  return event_ok(event) ? cudaSuccess : rec(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return rec(cudaErrorInvalidValue);
  if (cudaError_t e = need_device()) return rec(e);
  if (!event_ok(start) || !event_ok(end)) return rec(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming) return rec(cudaErrorInvalidResourceHandle);
  if (!start->recorded || !end->recorded) return rec(cudaErrorInvalidResourceHandle);
  *ms = (float)(end->t_ms - start->t_ms);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (cudaError_t e = need_device()) return rec(e);
  std::lock_guard<std::mutex> g(g_mu);
  if (!event || !g_events.erase(event)) return rec(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

/* =============================================================== launches */

void weft_emu_run_(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   void (*fn)(const void *), const void *ctx, const std::type_info &kernel) {
  Sched &s = sched();
  if (s.launch)
    fail("kernel %s launched from device code (dynamic parallelism is not emulated)",
         kernel_name(&kernel).c_str());
  if (cudaError_t e = need_device()) {
    rec(e);
    return;
  }
  if (!stream_ok(stream)) {
    rec(cudaErrorInvalidResourceHandle);
    return;
  }
  uint64_t threads = (uint64_t)block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
      grid.z > 65535 || block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 ||
      block.y > 1024 || block.z > 64 || threads > 1024 || smem > 227 * 1024) {
    rec(cudaErrorInvalidConfiguration);
    return;
  }
  Launch L{grid, block, smem, fn, ctx, &kernel};
  install_overflow_handler(s);
  s.n = (unsigned)threads;
  s.fib.resize(s.n);
  s.warps.resize((s.n + 31) / 32);
  void *dyn = nullptr;
  if (posix_memalign(&dyn, 16, smem ? smem : 16) != 0) {
    rec(cudaErrorMemoryAllocation);
    return;
  }
  s.dyn_smem = (char *)dyn;
  s.launch = &L;
  weft_emu::gridDim = grid;
  weft_emu::blockDim = block;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        weft_emu::blockIdx = uint3{x, y, z};
        run_block(s);
      }
  s.launch = nullptr;
  s.dyn_smem = nullptr;
  free(dyn);
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
    case R_TF32: return round_tf32(x);
    case R_BF16: return __bfloat162float(__float2bfloat16(x));
    case R_F16: return weft_f16_to_f32(weft_f32_to_f16(x));
    default: return x;
  }
}

inline size_t type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

inline float load(const void *p, cudaDataType t, int64_t i) {
  switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
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
    case CUDA_R_32F: ((float *)p)[i] = v; return;
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
bool check_operand(const char *func, const char *name, const void *p, cudaDataType t,
                   int64_t rows, int64_t cols, int64_t ld, long long stride, int batch) {
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

cublasStatus_t gemm_run(const GemmArgs &g) {
  const int m = g.m, n = g.n, k = g.k;
  if (m == 0 || n == 0 || g.batch == 0) return CUBLAS_STATUS_SUCCESS;
  const bool ab = g.alpha != 0.0f && k > 0; /* A and B are read */
  const bool an = g.ta == CUBLAS_OP_N, bn = g.tb == CUBLAS_OP_N;
  if (ab && (!check_operand(g.func, "A", g.A, g.At, an ? m : k, an ? k : m, g.lda, g.sA, g.batch) ||
             !check_operand(g.func, "B", g.B, g.Bt, bn ? k : n, bn ? n : k, g.ldb, g.sB, g.batch)))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  if (!check_operand(g.func, "C", g.C, g.Ct, m, n, g.ldc, g.sC, g.batch))
    return CUBLAS_STATUS_EXECUTION_FAILED;
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
          Ad[(size_t)i * k + l] =
              round_op(load(A, g.At, an ? (int64_t)i + (int64_t)l * g.lda
                                        : (int64_t)l + (int64_t)i * g.lda),
                       g.round);
      for (int l = 0; l < k; l++)
        for (int j = 0; j < n; j++)
          Bd[(size_t)l * n + j] =
              round_op(load(B, g.Bt, bn ? (int64_t)l + (int64_t)j * g.ldb
                                        : (int64_t)j + (int64_t)l * g.ldb),
                       g.round);
    }
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
  if (!((algo >= -1 && algo <= 23) || (algo >= 99 && algo <= 115))) return CUBLAS_STATUS_INVALID_VALUE;
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
    case CUBLAS_COMPUTE_32F_FAST_TF32: if (!f32) return CUBLAS_STATUS_NOT_SUPPORTED; r = R_TF32; break;
    case CUBLAS_COMPUTE_32F_FAST_16BF: if (!f32) return CUBLAS_STATUS_NOT_SUPPORTED; r = R_BF16; break;
    case CUBLAS_COMPUTE_32F_FAST_16F: if (!f32) return CUBLAS_STATUS_NOT_SUPPORTED; r = R_F16; break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  GemmArgs g{func, h,  ta, tb, m,  n,  k,  *(const float *)alpha, *(const float *)beta, A, At, lda,
             sA,   B,  Bt, ldb, sB, C, Ct, ldc, sC, batch, r};
  return gemm_run(g);
}

} // namespace

const char *cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
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
  handle->pmode = mode; /* either way alpha / beta are read through the pointer */
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
  GemmArgs g{"cublasSgemmStridedBatched", handle, transa, transb, m, n, k, *alpha, *beta,
             A, CUDA_R_32F, lda, strideA, B, CUDA_R_32F, ldb, strideB, C, CUDA_R_32F, ldc,
             strideC, batchCount, r};
  return gemm_run(g);
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float *alpha,
                              const float *A, int lda, const float *B, int ldb, const float *beta,
                              float *C, int ldc) {
  if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (cublasStatus_t st = gemm_validate(transa, transb, m, n, k, lda, ldb, ldc, 1)) return st;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  Round r = (handle->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH ? R_TF32 : R_NONE;
  GemmArgs g{"cublasSgemm", handle, transa, transb, m, n, k, *alpha, *beta,
             A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb, 0, C, CUDA_R_32F, ldc, 0, 1, r};
  return gemm_run(g);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  return gemm_ex("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B,
                 Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType Atype, int lda, long long int strideA,
    const void *B, cudaDataType Btype, int ldb, long long int strideB, const void *beta, void *C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return gemm_ex("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype,
                 lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
                 computeType, algo);
}
