/* fork() from a PoCL process that holds a binary back (nobody waits for it, so it waits for a
 * flush): the forked child flushes and ends without hanging and without writing the parent's
 * entry; the parent's own flush writes it. The child runs under a watchdog: one still running
 * after WATCHDOG_S seconds is killed and fails the test instead of hanging the suite.
 *
 *   usage: fork_held_back CACHE_DIR
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../checks.h"
#include "setup.h"

#define WATCHDOG_S 60

static const char *SOURCE = "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }\n";

/* Entry files in `dir`. */
static int entries_in(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int count = 0;
  if (d == NULL) return -1;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    count += e->d_name[0] != '.' && n > 4 && strcmp(e->d_name + n - 4, ".kce") == 0;
  }
  closedir(d);
  return count;
}

/* The child's exit status, or -1 when the watchdog killed it. */
static int wait_child(pid_t pid) {
  int status = 0;
  for (int waited_ms = 0; waited_ms < WATCHDOG_S * 1000; waited_ms += 10) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    if (done < 0) return 129;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

int main(int argc, char **argv) {
  REQUIRE_ARGS(argc, 1, "fork_held_back CACHE_DIR");
  const char *dir = argv[1];
  opencl_setup cl;
  if (opencl_setup_open(&cl, dir)) return 1;
  kc_opencl_lease *lease;
  if (kc_opencl_cache_find_or_build(cl.cache, cl.context, cl.device, &SOURCE, NULL, 1, "", &lease) !=
      KC_OK) {
    fprintf(stderr, "build: %s\n", kc_last_error_message());
    return 1;
  }
  kc_opencl_lease_release(lease);
  if (entries_in(dir) != 0) {
    fprintf(stderr, "the binary was not held back\n");
    return 1;
  }

  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    /* The child flushes: nothing of its own to write, and the parent's entry is not its own. */
    int ok = kc_opencl_cache_flush(cl.cache) == KC_OK && entries_in(dir) == 0;
    _exit(ok ? 0 : 3);
  }
  int child = wait_child(pid);
  int after_child = entries_in(dir);
  printf("child: %d (-1: hung), entries after the child: %d\n", child, after_child);
  if (kc_opencl_cache_flush(cl.cache) != KC_OK) return 1;
  int after_flush = entries_in(dir);
  printf("entries after the parent's flush: %d\n", after_flush);
  opencl_setup_close(&cl);
  return child == 0 && after_child == 0 && after_flush == 1 ? 0 : 1;
}
