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
#include <caml/alloc.h>
#include <caml/callback.h>
#include <caml/custom.h>
#include <caml/fail.h>
#include <caml/memory.h>
#include <caml/mlvalues.h>
#include <caml/threads.h>

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kcache.h"

/* OCaml 4 has one runtime lock for the process; OCaml 5 one per domain, and domains run at
 * once. So nothing the stubs share between calls relies on the runtime lock: a handle's use
 * word and reference counts are atomics, a lease is taken out of its block by one exchange,
 * and the OCaml callbacks are looked up once, when the module is initialised (ml_kc_init). */

/* A handle's use word: ML_FREED once `free` was called, ML_DONE once the free was carried
 * out, and above them the count of calls running on it. A call enters (counted) unless the
 * handle is freed; a free marks it, and whoever sees no call left afterwards carries the free
 * out, once (the free itself, or the last call to leave). So a free never races a call on
 * another domain, and never waits for one: it takes effect when they return. */
#define ML_FREED ((intptr_t)1)
#define ML_DONE ((intptr_t)2)
#define ML_CALL ((intptr_t)4)

/* 1 when the caller is the one to carry out the free of a handle marked freed: no call left
 * (a refused call's passing count is none: it re-checks as it goes), and ML_DONE not taken. */
static inline int ml_claim(atomic_intptr_t *use) {
  intptr_t u = atomic_load(use);
  if ((u & ML_DONE) || u >= ML_CALL) return 0;
  return !(atomic_fetch_or(use, ML_DONE) & ML_DONE);
}

/* Leaves a call: 1 when the handle was freed meanwhile and the caller must carry it out. */
static inline int ml_leave(atomic_intptr_t *use) {
  return (atomic_fetch_sub(use, ML_CALL) & ML_FREED) && ml_claim(use);
}

/* Enters a call: 1 when counted; 0 when the handle was freed (nothing counted); -1 the same,
 * and the caller must carry the free out. */
static inline int ml_enter(atomic_intptr_t *use) {
  if (!(atomic_fetch_add(use, ML_CALL) & ML_FREED)) return 1;
  return ml_leave(use) ? -1 : 0;
}

/* Marks the handle freed: 1 when the caller carries the free out now (no call running), 0
 * when the last running call will, or when it was freed already. */
static inline int ml_retire(atomic_intptr_t *use) {
  return !(atomic_fetch_or(use, ML_FREED) & ML_FREED) && ml_claim(use);
}

/* One OCaml cache, shared by every domain that has its Kcache.t.
 * - `live` counts the kc_cache and every value not yet destroyed (destroys may run after
 *   kc_cache_free returns, for values still leased): the state is rooted while it is > 0.
 * - `refs` counts the custom block that points here, and `live` while it is > 0: the struct
 *   is freed when both are gone, so a domain holding the block never reads freed memory,
 *   even racing a free. */
struct ml_cache {
  kc_cache *cache;
  value state; /* the OCaml state record, a generational global root while live > 0 */
  atomic_intptr_t use;
  atomic_intptr_t live;
  atomic_intptr_t refs;
};

/* Where this thread is with respect to the runtime lock, for the callbacks kcache runs on it.
 * A thread OCaml did not start (or one outside every stub) is ML_OUTSIDE: a callback arriving
 * there is refused rather than run, since it could not take a runtime lock it has no right to
 * (docs/bindings-ocaml.md, "Domains"). */
enum ml_mode { ML_OUTSIDE = 0, ML_RELEASED, ML_HELD };
extern _Thread_local enum ml_mode ml_mode;

/* The code a callback returns when it is refused for arriving on a thread OCaml does not run;
 * Kcache turns a build's into an error saying so. */
#define ML_FOREIGN_THREAD (-2)

/* Keys up to this length are copied onto the stack: a hit allocates nothing outside the
 * OCaml heap. */
#define ML_SMALL_KEY 256

/* Runs `stmt`, which may wait or run callbacks, with the runtime lock released. The caller
 * has entered the handle (ml_enter), so a free is carried out after it leaves, or carries
 * the free out. */
#define ML_UNLOCKED(stmt)                   \
  do {                                      \
    enum ml_mode saved_ = ml_mode;          \
    ml_mode = ML_RELEASED;                  \
    caml_release_runtime_system();          \
    stmt;                                   \
    caml_acquire_runtime_system();          \
    ml_mode = saved_;                       \
  } while (0)

/* ML_UNLOCKED of a call whose status goes to `status`. */
#define ML_UNLOCKED_CALL(status, call) ML_UNLOCKED((status) = (call))

/* ML_UNLOCKED_CALL of a call on an entered handle: `leave` (the handle's leave), then a
 * failure raises (ml_check); success returns nothing. */
#define ML_UNLOCKED_CHECKED(leave, call)    \
  do {                                      \
    kc_status status_;                      \
    ML_UNLOCKED_CALL(status_, call);        \
    leave;                                  \
    ml_check(status_);                      \
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

/* The cache of a Kcache.t's raw block, entered (the caller leaves it with ml_cache_leave);
 * raises Invalid_argument once it was freed. */
struct ml_cache *ml_cache_enter(value vcache);

/* Leaves a call on the cache, carrying its free out if it was freed meanwhile and this was
 * the last call. Runtime lock held. */
void ml_cache_leave(struct ml_cache *mc);

/* ml_cache_enter, or NULL (nothing entered) once the cache was freed. */
struct ml_cache *ml_cache_try_enter(value vcache);

/* Runs the OCaml function at `*fn` on `bytes` through run_build, with the runtime lock taken
 * back for the time of the call, and boxes and roots the value it returns. Returns the status
 * a kc_build_fn or kc_load_fn returns. */
int ml_run(struct ml_cache *mc, const value *fn, const uint8_t *bytes, size_t len,
           void **out_value, uint64_t *out_weight);

/* A new Kcache lease block holding `lease`. */
value ml_lease_alloc(kc_lease *lease);

#endif
