/* fork() from a process whose caches are busy: the child uses, flushes and frees every cache it
 * inherited, and exits, and the parent goes on. Each scenario first writes once (so the parent's
 * background writer runs), then forks while
 *   - writer:  the writer is in a remote write to a stopped redis-server (real, on 127.0.0.1);
 *   - scan:    the opening scan of a 20,000-entry directory runs (not under ASan: see
 *              FORK_SAFE_MALLOC);
 *   - locks:   another thread builds, holding its entry's lock;
 *   - flight:  another thread builds a memory-tier key, which the child then looks up (the
 *              builder is not in the child: the child builds the key itself).
 * Each child runs under a watchdog: one still running after WATCHDOG_S seconds is killed and
 * fails the scenario instead of hanging the suite.
 *
 *   usage: kc_test_fork WORK_DIR [SCENARIO...]
 */
#include <kcache.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "string_backend.h"

#ifndef WATCHDOG_S
#define WATCHDOG_S 60
#endif
#define SCAN_ENTRIES 20000
static const char *OPERATOR_KEY = "fork-test-operator-key";

static const char *work;

static void path_in(char *out, size_t cap, const char *name) {
  int n = snprintf(out, cap, "%s/%s", work, name);
  CHECK(n > 0 && (size_t)n < cap);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Whether the entry of `entry` is on `disk`. */
static int on_disk(kc_persistence *disk, const char *entry) {
  uint8_t key[KC_KEY_LEN];
  kc_buffer buffer;
  make_key(entry, key);
  kc_status status = kc_persistence_get(disk, key, &buffer);
  if (status == KC_OK) kc_buffer_free(&buffer);
  return status == KC_OK;
}

/* Looks `entry` up (a miss: it builds) and flushes. */
static void miss_and_flush(kc_cache *cache, kc_persistence *disk, const char *entry) {
  backend b = {0};
  kc_lease *lease = NULL;
  CHECK_STATUS(string_lookup(cache, disk, entry, entry, &b, &lease), KC_OK);
  kc_lease_release(lease);
  CHECK(b.builds == 1);
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  CHECK(on_disk(disk, entry));
}

/* The child: a miss of its own, flush, free, and its entry is on disk. Exits 0 when all held. */
static void child_uses_and_frees(kc_cache *cache, kc_persistence *disk, const kc_persistence_options *opts) {
  double started = now_ms();
  miss_and_flush(cache, disk, "child");
  kc_cache_free(cache);
  kc_persistence_free(disk);
  printf("   child: miss, flush and free in %.0f ms\n", now_ms() - started);
  fflush(stdout);
  /* A new handle, as another process would open it, finds the child's entry. */
  kc_persistence *again = NULL;
  CHECK_STATUS(kc_persistence_open(opts, &again), KC_OK);
  CHECK(on_disk(again, "child"));
  kc_persistence_free(again);
  _exit(0);
}

/* Waits for `pid`; fails when it did not exit with 0 within the watchdog (then kills it). */
static void wait_child(pid_t pid) {
  double deadline = now_ms() + WATCHDOG_S * 1e3;
  int status = 0;
  for (;;) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    CHECK(done >= 0);
    if (done == pid) break;
    if (now_ms() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      fprintf(stderr, "the child hung: killed after %d s\n", WATCHDOG_S);
      CHECK(0);
    }
    sleep_ms(10);
  }
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

/* Forks; the child uses and frees the caches, the parent waits for it. */
static void fork_child(kc_cache *cache, kc_persistence *disk, const kc_persistence_options *opts) {
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) child_uses_and_frees(cache, disk, opts);
  wait_child(pid);
}

/* A redis-server on a free port of 127.0.0.1, started for the test. */
typedef struct server {
  pid_t pid;
  int port;
} server;

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  CHECK(fd >= 0);
  CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
  CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

static int accepts(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

static server start_redis(const char *dir) {
  server s = {0, free_port()};
  char port[16];
  snprintf(port, sizeof port, "%d", s.port);
  s.pid = fork();
  CHECK(s.pid >= 0);
  if (s.pid == 0) {
    /* The server ends with the test, even one that fails a check, and keeps its output (and
     * the test's pipes) to itself. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) {
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
    }
    execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", "--dir", dir, (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 500 && !accepts(s.port); i++) sleep_ms(10);
  CHECK(accepts(s.port));
  return s;
}

static void stop_redis(server *s) {
  kill(s->pid, SIGCONT);
  kill(s->pid, SIGKILL);
  waitpid(s->pid, NULL, 0);
}

/* The parent's writer is in a remote write that stalls (the server is stopped) at the fork. */
static void test_fork_while_the_writer_is_busy(void) {
  char dir[4096], redis_dir[4096], url[64];
  path_in(dir, sizeof dir, "writer");
  path_in(redis_dir, sizeof redis_dir, "writer-redis");
  CHECK(mkdir(redis_dir, 0700) == 0);
  server redis = start_redis(redis_dir);
  snprintf(url, sizeof url, "redis://127.0.0.1:%d/", redis.port);
  kc_persistence_options opts = options_in(dir);
  opts.key = (const uint8_t *)OPERATOR_KEY;
  opts.key_len = strlen(OPERATOR_KEY);
  opts.remote_url = url;
  opts.remote_timeout_ms = 2000;
  opts.remote_lease_wait_ms = 100;
  kc_persistence *disk = NULL;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  CHECK(disk_stats(disk).remote);
  kc_cache *cache = new_cache();
  miss_and_flush(cache, disk, "warm");

  /* A stopped server accepts connections and answers nothing. */
  CHECK(kill(redis.pid, SIGSTOP) == 0);
  backend b = {0};
  kc_lease *lease = NULL;
  CHECK_STATUS(string_lookup(cache, disk, "parent", "parent", &b, &lease), KC_OK);
  kc_lease_release(lease);
  for (int i = 0; i < 200 && !on_disk(disk, "parent"); i++) sleep_ms(5);
  CHECK(on_disk(disk, "parent"));
  CHECK_U64(disk_stats(disk).pending_writes, 1); /* in the remote write */
  fork_child(cache, disk, &opts);

  CHECK(kill(redis.pid, SIGCONT) == 0);
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  CHECK_U64(disk_stats(disk).pending_writes, 0);
  miss_and_flush(cache, disk, "parent-after");
  kc_cache_free(cache);
  kc_persistence_free(disk);
  stop_redis(&redis);
}

/* Whether malloc may be called in a child forked while another thread was inside it. glibc's may.
 * GCC 12's ASan runtime has no fork handler for its allocator (LLVM's takes its locks at fork
 * from LLVM 18): the child inherits the allocator's lock held by a thread it does not have, and
 * its own scan thread waits on it forever (a hung child's backtrace: its scan thread in
 * SizeClassAllocator64::GetFromAllocator). Only the scan scenario forks while another thread
 * allocates that hard, so only it is left out there. */
#ifdef __SANITIZE_ADDRESS__
#define FORK_SAFE_MALLOC 0
#else
#define FORK_SAFE_MALLOC 1
#endif

#if FORK_SAFE_MALLOC
/* The fork comes while the opening scan of a large directory runs. */
static void test_fork_during_the_opening_scan(void) {
  char dir[4096], path[4096];
  path_in(dir, sizeof dir, "scan");
  CHECK(mkdir(dir, 0700) == 0);
  for (int i = 0; i < SCAN_ENTRIES; i++) {
    CHECK(snprintf(path, sizeof path, "%s/%016x-%064x.kce", dir, 0, i) < (int)sizeof path);
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    close(fd);
  }
  kc_persistence_options opts = options_in(dir);
  kc_cache *cache = new_cache();
  /* A fast machine may finish the scan before the fork: try again on a new handle. */
  for (int attempt = 0; attempt < 20; attempt++) {
    kc_persistence *disk = NULL;
    CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
    if (disk_stats(disk).scan_complete) {
      kc_persistence_free(disk);
      continue;
    }
    fork_child(cache, disk, &opts);
    miss_and_flush(cache, disk, "parent-after");
    CHECK(disk_stats(disk).entries >= SCAN_ENTRIES);
    kc_cache_free(cache);
    kc_persistence_free(disk);
    return;
  }
  fprintf(stderr, "the scan always finished before the fork\n");
  CHECK(0);
}
#endif

/* Another thread builds an entry (holding its lock) at the fork. */
typedef struct builder {
  kc_cache *cache;
  kc_persistence *disk;
  gate gate; /* the build waits there, holding its entry's lock, until the child is done */
} builder;

static int gated_build(void *ctx, const uint8_t *key, size_t key_len, void **out, uint64_t *w) {
  builder *b = ctx;
  backend inner = {0};
  gate_arrive_and_wait(&b->gate);
  return build_fn(&inner, key, key_len, out, w);
}

static void *build_slowly(void *arg) {
  builder *b = arg;
  uint8_t l2[KC_KEY_LEN];
  kc_lease *lease = NULL;
  make_key("held", l2);
  kc_tiered_callbacks cb = {sizeof cb, gated_build, load_fn, serialize_fn, b};
  CHECK_STATUS(kc_tiered_find_or_build(b->cache, (const uint8_t *)"held", 4, KC_NO_DEVICE, b->disk,
                                       l2, &cb, &lease),
               KC_OK);
  kc_lease_release(lease);
  return NULL;
}

static void test_fork_while_another_thread_holds_a_lock(void) {
  char dir[4096];
  path_in(dir, sizeof dir, "locks");
  kc_persistence_options opts = options_in(dir);
  kc_persistence *disk = NULL;
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);
  kc_cache *cache = new_cache();
  miss_and_flush(cache, disk, "warm");
  builder b = {.cache = cache, .disk = disk};
  gate_init(&b.gate);
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, build_slowly, &b) == 0);
  gate_wait_started(&b.gate, 1);
  fork_child(cache, disk, &opts);
  gate_open(&b.gate);
  CHECK(pthread_join(thread, NULL) == 0);
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
  CHECK(on_disk(disk, "held"));
  miss_and_flush(cache, disk, "parent-after");
  kc_cache_free(cache);
  kc_persistence_free(disk);
}

/* Another thread builds "held" in a memory tier at the fork; the child looks it up. */
static void *build_in_memory(void *arg) {
  builder *b = arg;
  kc_lease *lease = NULL;
  CHECK_STATUS(kc_cache_find_or_build(b->cache, (const uint8_t *)"held", 4, KC_NO_DEVICE,
                                      gated_build, b, &lease),
               KC_OK);
  kc_lease_release(lease);
  return NULL;
}

static void test_fork_while_another_thread_builds_the_key(void) {
  builder b = {.cache = new_cache()};
  gate_init(&b.gate);
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, build_in_memory, &b) == 0);
  gate_wait_started(&b.gate, 1);
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    backend own = {0};
    kc_lease *lease = NULL;
    CHECK_STATUS(kc_cache_find_or_build(b.cache, (const uint8_t *)"held", 4, KC_NO_DEVICE,
                                        build_fn, &own, &lease),
                 KC_OK);
    CHECK(own.builds == 1);
    CHECK(strcmp(kc_lease_value(lease), "held") == 0);
    kc_lease_release(lease);
    kc_cache_free(b.cache);
    _exit(0);
  }
  wait_child(pid);
  gate_open(&b.gate);
  CHECK(pthread_join(thread, NULL) == 0);
  kc_cache_free(b.cache);
}

static const scenario SCENARIOS[] = {
    {"writer", test_fork_while_the_writer_is_busy},
#if FORK_SAFE_MALLOC
    {"scan", test_fork_during_the_opening_scan},
#endif
    {"locks", test_fork_while_another_thread_holds_a_lock},
    {"flight", test_fork_while_another_thread_builds_the_key},
};

int main(int argc, char **argv) {
  CHECK(argc >= 2);
  work = argv[1];
  if (!FORK_SAFE_MALLOC) printf("scan: left out, this malloc is not fork-safe (FORK_SAFE_MALLOC)\n");
  return RUN_SCENARIOS(SCENARIOS, argc - 1, argv + 1);
}
