/* kc_set_log_callback: with KCACHE_LOG=debug the callback receives why a tiered lookup missed the
 * disk (absent, then a corrupt entry), and NULL sends the messages back to stderr. */
#include <dirent.h>
#include <unistd.h>

#include "disk/string_backend.h"

#define MAX_MESSAGES 16

/* What the callback received; it may be called on any thread. */
typedef struct log_sink {
  pthread_mutex_t lock;
  int count;
  int levels[MAX_MESSAGES];
  char messages[MAX_MESSAGES][512];
} log_sink;

static void collect(void *ctx, int level, const char *message) {
  log_sink *sink = (log_sink *)ctx;
  pthread_mutex_lock(&sink->lock);
  if (sink->count < MAX_MESSAGES) {
    sink->levels[sink->count] = level;
    snprintf(sink->messages[sink->count], sizeof sink->messages[0], "%s", message);
  }
  sink->count++;
  pthread_mutex_unlock(&sink->lock);
}

static int count_of(log_sink *sink) {
  int count;
  pthread_mutex_lock(&sink->lock);
  count = sink->count;
  pthread_mutex_unlock(&sink->lock);
  return count;
}

/* One lookup in a new memory tier, so that it goes to the disk. */
static void lookup(kc_persistence *disk, const char *entry) {
  kc_cache *cache = new_cache();
  backend b;
  kc_lease *lease = NULL;
  memset(&b, 0, sizeof b);
  CHECK_STATUS(string_lookup(cache, disk, "value", entry, &b, &lease), KC_OK);
  CHECK(strcmp((const char *)kc_lease_value(lease), "value") == 0);
  kc_lease_release(lease);
  kc_cache_free(cache);
  CHECK_STATUS(kc_persistence_flush(disk), KC_OK);
}

/* The path of the one entry file in `dir`. */
static void only_entry(const char *dir, char *path, size_t cap) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int found = 0;
  CHECK(d != NULL);
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n > 4 && strcmp(e->d_name + n - 4, ".kce") == 0) {
      CHECK(snprintf(path, cap, "%s/%s", dir, e->d_name) < (int)cap);
      found++;
    }
  }
  closedir(d);
  CHECK(found == 1);
}

static void flip_last_byte(const char *path) {
  FILE *f = fopen(path, "r+b");
  int c;
  CHECK(f != NULL);
  CHECK(fseek(f, -1, SEEK_END) == 0);
  c = fgetc(f);
  CHECK(c != EOF);
  CHECK(fseek(f, -1, SEEK_END) == 0);
  CHECK(fputc(c ^ 0xff, f) != EOF);
  CHECK(fclose(f) == 0);
}

int main(void) {
  char dir[] = "/tmp/kcache-log-XXXXXX";
  char entry[4096];
  char captured[4096];
  const char *name;
  kc_persistence_options opts;
  kc_persistence *disk = NULL;
  log_sink sink;
  FILE *err;
  int saved;
  size_t n;

  /* Read once, at the first message. */
  CHECK(setenv("KCACHE_LOG", "debug", 1) == 0);
  memset(&sink, 0, sizeof sink);
  pthread_mutex_init(&sink.lock, NULL);
  CHECK(mkdtemp(dir) != NULL);
  kc_set_log_callback(collect, &sink);
  opts = options_in(dir);
  CHECK_STATUS(kc_persistence_open(&opts, &disk), KC_OK);

  /* Absent: built and written. */
  lookup(disk, "logged");
  CHECK(count_of(&sink) == 1);
  only_entry(dir, entry, sizeof entry);
  name = strrchr(entry, '/') + 1;
  CHECK(sink.levels[0] == KC_LOG_DEBUG);
  CHECK(strncmp(sink.messages[0], "disk miss: ", 11) == 0);
  CHECK(strstr(sink.messages[0], name) != NULL);
  CHECK(strstr(sink.messages[0], ": absent") != NULL);

  /* A corrupt entry: the reason names the check that failed. */
  flip_last_byte(entry);
  lookup(disk, "logged");
  CHECK(count_of(&sink) == 2);
  CHECK(sink.levels[1] == KC_LOG_DEBUG);
  CHECK(strncmp(sink.messages[1], "disk miss: integrity check failed: ", 35) == 0);
  CHECK(strstr(sink.messages[1], name) != NULL);
  CHECK(strstr(sink.messages[1], ": tag mismatch") != NULL);

  /* NULL: back to stderr, captured here in a temporary file. */
  kc_set_log_callback(NULL, NULL);
  err = tmpfile();
  CHECK(err != NULL);
  fflush(stderr);
  saved = dup(STDERR_FILENO);
  CHECK(saved >= 0 && dup2(fileno(err), STDERR_FILENO) >= 0);
  lookup(disk, "unlogged");
  fflush(stderr);
  CHECK(dup2(saved, STDERR_FILENO) >= 0 && close(saved) == 0);
  rewind(err);
  n = fread(captured, 1, sizeof captured - 1, err);
  captured[n] = '\0';
  fclose(err);
  CHECK(count_of(&sink) == 2);
  CHECK(strncmp(captured, "kcache: debug: disk miss: ", 26) == 0);
  CHECK(strstr(captured, ": absent\n") != NULL);

  kc_persistence_free(disk);
  remove_flat_dir(dir, NULL);
  pthread_mutex_destroy(&sink.lock);
  printf("test_log: ok\n");
  return 0;
}
