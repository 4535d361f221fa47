/* What the stub files share: the OCaml view of a cache, status reporting, key copies and the
 * way an OCaml build runs inside a kcache callback.
 *
 * Three rules of the OCaml runtime shape every stub:
 * - A call that can wait (a build of the same key elsewhere, disk I/O) or run a callback (a
 *   build, a load, a serialize, a destroy) runs with the runtime lock released; the callbacks
 *   take it back before touching any OCaml value. Holding it across such a call deadlocks: the
 *   thread waiting inside kcache would hold the lock that the building thread needs to run its
 *   OCaml build. The one exception is a lease's release, which never waits and runs its
 *   destroy on the releasing thread: it keeps the lock, and says so to the destroy callback
 *   (cache_stubs.c).
 * - While the lock is released the GC may move OCaml values, so kcache never sees a pointer
 *   into the OCaml heap: keys are copied out, and each cached value lives in a malloc'd box
 *   registered as a generational global root, unregistered exactly once, in destroy.
 * - OCaml exceptions cannot cross C: the OCaml side of a build (kcache.ml, run_build) catches
 *   them and returns a code, which kcache hands to the builder and every waiter.
 */
#ifndef ML_KCACHE_H
#define ML_KCACHE_H

#define CAML_NAME_SPACE
#include <caml/version.h>
/* OCaml 5 runs domains in parallel, each with a runtime lock of its own: the counters of
 * struct ml_cache and the "no call in progress" check of a free would race across domains.
 * Refused at build time rather than left unsafe (docs/bindings-ocaml.md, "OCaml 5"). */
#if OCAML_VERSION_MAJOR >= 5
#error "kcache's OCaml binding needs OCaml 4.13 to 4.14: on OCaml 5 its stubs are not safe across domains"
#endif
#include <caml/alloc.h>
#include <caml/callback.h>
#include <caml/custom.h>
#include <caml/fail.h>
#include <caml/memory.h>
#include <caml/mlvalues.h>
#include <caml/threads.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kcache.h"

/* One OCaml cache. `refs` counts the cache itself and every value not yet destroyed, since
 * destroys may run after kc_cache_free returns (for values still leased); `calls` counts
 * calls running with the runtime lock released, so that a free during one is refused rather
 * than racing it. Both change only with the runtime lock held, which OCaml 4 has one of for
 * the whole process. */
struct ml_cache {
  kc_cache *cache;
  value state; /* the OCaml state record, a generational global root */
  intnat refs;
  intnat calls;
};

/* Keys up to this length are copied onto the stack: a hit allocates nothing outside the
 * OCaml heap. */
#define ML_SMALL_KEY 256

/* Runs `call`, which may wait or run callbacks, with the runtime lock released, counted in
 * `*calls` meanwhile. */
#define ML_UNLOCKED_CALL(calls, status, call) \
  do {                                        \
    (calls)++;                                \
    caml_release_runtime_system();            \
    (status) = (call);                        \
    caml_acquire_runtime_system();            \
    (calls)--;                                \
  } while (0)

/* ML_UNLOCKED_CALL of a call whose failure raises (through ml_check) and whose success
 * returns nothing. */
#define ML_UNLOCKED_CHECKED(calls, call)      \
  do {                                        \
    kc_status status_;                        \
    ML_UNLOCKED_CALL(calls, status_, call);   \
    ml_check(status_);                        \
  } while (0)

/* The value registered under `name` by the OCaml side; raises Failure if there is none. */
const value *ml_named(const char *name);

/* Raises Kcache.Error for a failed call, or the internal Build_code exception that the OCaml
 * side turns back into the build's own exception. */
void ml_raise_status(kc_status status);

/* ml_raise_status unless `status` is KC_OK. */
void ml_check(kc_status status);

/* An OCaml record of `size` fields whose first `n` are the counters `fields` (the others
 * are false until the caller stores them). */
value ml_counters(const uint64_t *fields, size_t n, size_t size);

/* Copies an OCaml string out of the heap: into `small` (ML_SMALL_KEY bytes) when it fits,
 * else into malloc'd memory the caller frees when the result is not `small`. */
uint8_t *ml_key_copy(value vkey, uint8_t *small, size_t *len);

/* The cache of a Kcache.t's raw block; raises Invalid_argument once it was freed. */
struct ml_cache *ml_cache_of(value vcache);

/* Runs the OCaml function at `*fn` on `bytes` through run_build, with the runtime lock taken
 * back for the time of the call, and boxes and roots the value it returns. Returns the status
 * a kc_build_fn or kc_load_fn returns. */
int ml_run(struct ml_cache *mc, const value *fn, const uint8_t *bytes, size_t len,
           void **out_value, uint64_t *out_weight);

/* A new Kcache lease block holding `lease`. */
value ml_lease_alloc(kc_lease *lease);

#endif
