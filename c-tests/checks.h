/* The checks of every C and C++ test program: they stay on under NDEBUG, and a failed one says
 * where it is, what failed and kcache's last error message. CHECK aborts (a sanitizer or a
 * debugger then shows the stack), REQUIRE exits with status 1, EXPECT counts the failure and
 * goes on, so that one run reports every expectation that did not hold; check_finish turns that
 * count into the exit status. Plain C99 (or C++), so that the backend tests, which are not built
 * as POSIX programs, can use it too. */
#ifndef KCACHE_TEST_CHECKS_H
#define KCACHE_TEST_CHECKS_H

#include <stdio.h>
#include <stdlib.h>

#include "kcache.h"

#define KC_TEST_CHECK(cond, kind, on_failure)                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "%s:%d: %s(%s) failed; last kcache error: %s\n", __FILE__, __LINE__, \
              kind, #cond, kc_last_error_message());                                       \
      on_failure;                                                                          \
    }                                                                                      \
  } while (0)

#define CHECK(cond) KC_TEST_CHECK(cond, "CHECK", abort())
#define REQUIRE(cond) KC_TEST_CHECK(cond, "REQUIRE", exit(1))
#define EXPECT(cond) KC_TEST_CHECK(cond, "EXPECT", (*check_failures())++)

/* The count of failed EXPECTs. A function's static, so that a program without EXPECTs does not
 * carry an unused variable. */
static inline int *check_failures(void) {
  static int failures;
  return &failures;
}

/* In main: returns 2 after printing the usage line `usage` unless the program got `count`
 * arguments. */
#define REQUIRE_ARGS(argc, count, usage)           \
  do {                                             \
    if ((argc) != (count) + 1) {                   \
      fprintf(stderr, "usage: %s\n", usage);       \
      return 2;                                    \
    }                                              \
  } while (0)

/* The persistent tiers in `dir`, the other options left at their defaults; exits with status 1
 * when they cannot be opened. */
static inline kc_persistence *persistence_in(const char *dir) {
  kc_persistence_options opts = kc_persistence_options_default();
  kc_persistence *tiers = NULL;
  opts.dir = dir;
  REQUIRE(kc_persistence_open(&opts, &tiers) == KC_OK);
  return tiers;
}

/* The exit status of a program that uses EXPECT: 0 after printing "NAME: ok" when every
 * expectation held, else 1 after printing how many did not. */
static inline int check_finish(const char *name) {
  if (*check_failures() != 0) {
    fprintf(stderr, "%s: %d failed expectation(s)\n", name, *check_failures());
    return 1;
  }
  printf("%s: ok\n", name);
  return 0;
}

#endif
