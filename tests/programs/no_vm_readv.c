// SPDX-License-Identifier: Apache-2.0
// Runs a program under a seccomp filter that refuses process_vm_readv with EPERM (as a sandbox
// that filters it does), to see that the Python frame reader, whose every read of interpreter
// memory goes through that call, turns itself off with a note instead of reading unchecked.
//   no_vm_readv PROGRAM [ARGS...]
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 2) return 64;
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {sizeof f / sizeof f[0], f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    perror("no_vm_readv: seccomp");
    return 70;
  }
  execvp(argv[1], argv + 1);
  perror("no_vm_readv: exec");
  return 127;
}
