/* LD_PRELOAD helper for crash diagnosis on the GPU machine (no gdb there is assumed): on SIGSEGV
 * or SIGBUS prints the native backtrace (backtrace_symbols_fd: library(+offset)) and the
 * mapped libraries, then re-raises. Offsets inside _C*.so resolve with addr2line on a copy of that
 * file. Build: gcc -shared -fPIC -O0 -g dev/segv_trace.c -o /tmp/segv_trace.so */
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_fault(int sig, siginfo_t* info, void* ctx) {
  (void)ctx;
  void* frames[64];
  const char head[] = "\n== segv_trace: native backtrace ==\n";
  write(2, head, sizeof(head) - 1);
  char addr[64];
  int n = 0;
  unsigned long a = (unsigned long)info->si_addr;
  const char hex[] = "0123456789abcdef";
  char tmp[32];
  int t = 0;
  do { tmp[t++] = hex[a & 15]; a >>= 4; } while (a && t < 32);
  memcpy(addr, "fault address 0x", 16); n = 16;
  while (t) addr[n++] = tmp[--t];
  addr[n++] = '\n';
  write(2, addr, n);
  int depth = backtrace(frames, 64);
  backtrace_symbols_fd(frames, depth, 2);
  int maps = open("/proc/self/maps", O_RDONLY);
  if (maps >= 0) {
    char buf[4096];
    ssize_t r;
    const char mh[] = "== maps (r-xp) ==\n";
    write(2, mh, sizeof(mh) - 1);
    while ((r = read(maps, buf, sizeof buf)) > 0) write(2, buf, r);
    close(maps);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
}
