/* SPDX-License-Identifier: Apache-2.0 */
/* dlopens the plugin at argv[1], deletes its file and makes a FIFO at that path, then calls it
 * (a double free: the shim symbolizes the stack, plugin frame included, to match suppressions) and
 * forks (the prepare handler takes the symbolizer's lock). Prints the two frees' statuses and the
 * child's exit status: the same with and without the shim. */
#include <dlfcn.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  void *h = dlopen(argv[1], RTLD_NOW);
  if (!h) {
    printf("dlopen %s\n", dlerror());
    return 2;
  }
  int (*f)(int *, int *) = (int (*)(int *, int *))dlsym(h, "plugin_double_free");
  if (!f || unlink(argv[1]) != 0 || mkfifo(argv[1], 0600) != 0) {
    perror("module_fifo");
    return 3;
  }
  int first = -1, second = -1;
  printf("plugin %d\n", f(&first, &second));
  printf("free1 %d\nfree2 %d\n", first, second);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) _exit(7);
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return 4;
  printf("child %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  return 0;
}
