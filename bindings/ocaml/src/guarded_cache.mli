(** An in-memory cache of compiled kernels with the interface of a framework's own
    mutex-guarded table ([('k, 'v) t], [find_or_build], [evict_device], [clear], [length] and
    the two exceptions), so a framework moves to kcache by changing a module path. It is
    {!Kcache.create}'s cache underneath, so it keeps every guarantee of such a table and drops
    its two weaknesses:

    - {b one build per key}: domains or threads that miss the same key at once run one build
      and all get its value (or its exception). There is no losing build, so no value is ever
      built only to be destroyed, and a key is compiled once, not "at most a few times";
    - {b no quiescence obligation}: a value is handed out under a lease, and [clear],
      [evict_device] and capacity bounds only unlink it: it is destroyed when the last lease
      ends. {!with_value} holds the lease while your function runs, so a kernel launched from
      inside it is never released under it, whatever other domains clear or evict meanwhile.
      {!find_or_build} returns the value with its lease already ended, as the table it
      replaces did: code that launches a value obtained that way while another domain may
      clear the cache should move to {!with_value}.

    Safe on OCaml 5 domains and on systhreads. The compile ([build]) and every [destroy] run
    with no lock of the cache held, so both may call into this cache. A build that asks for
    the key it is building gets what the table gave it, not kcache's [Reentrant]: that inner
    lookup is a miss that builds, and its value is the one installed; the outer build's value
    then goes to [destroy] and the outer lookup returns the installed one. A nested lookup
    inside the same build finds the inner value. If the outer build raises afterwards, the
    inner value stays installed and the outer lookup raises. The inner build is not counted
    in {!stats} (the outer one is), nor is the destroy of the outer value. *)

type ('k, 'v) t
(** A cache of values ['v] keyed by ['k]. Keys are compared by their contents, as
    [Hashtbl] compares them, through their bytes under [Marshal] (without sharing): a key must
    be data that [Marshal] accepts (no functions), and two keys hit the same entry when their
    marshalled bytes are equal. For the keys frameworks use (strings, ints, tuples and records
    of them) that is structural equality; it differs only for floats ([0.0] and [-0.0] are
    two keys here). *)

exception Device_destroyed_during_build
(** Raised by {!find_or_build} when {!evict_device} ran for its [device_id] while the build
    was in flight (whether or not the device had entries): the value just built is destroyed
    instead of installed. Retry against a live device, or give up. *)

exception Cache_cleared_during_build
(** Raised by {!find_or_build} on a cache created with [~invalidated_by_clear:true] when
    {!clear} ran while the build was in flight: the value just built is destroyed instead of
    installed. A retry builds against the handles that exist after the clear. *)

val create : ?size:int -> ?invalidated_by_clear:bool -> destroy:('v -> unit) -> unit -> ('k, 'v) t
(** An empty cache. [destroy] runs exactly once on every value that leaves it (by {!clear},
    {!evict_device}, a value discarded by {!find_or_build}) once no lease holds it, on the
    thread that removed it or ended its last lease, outside every lock. It may raise: see
    {!clear}.

    [size] is accepted for the interface's sake and not needed: the cache grows as it
    fills. [invalidated_by_clear] (default [false]) says whether values borrow handles that a
    [clear] releases: [true] makes a build in flight across a [clear] fail with
    {!Cache_cleared_during_build}; [false] (a cache whose values own their handles) installs
    it. *)

val free : ('k, 'v) t -> unit
(** Beyond the interface it replaces (whose caches live as long as the program): frees the
    cache as {!Kcache.free} does, destroying its values as their leases end. *)

val find_or_build : ('k, 'v) t -> key:'k -> ?device_id:int -> (unit -> 'v) -> 'v
(** The value for [key], built by [build ()] on a miss with no lock held. With [device_id]
    (>= 0; a negative one raises [Invalid_argument]) the entry is recorded for
    {!evict_device}, and the call fails with {!Device_destroyed_during_build} if that device
    is evicted while it runs. Each call is judged on its own window, as if it built alone:
    one that waited for another domain's build never inherits that build's eviction or clear
    (it builds again), and one that starts after {!evict_device} or {!clear} returned never
    joins a build they doomed. An exception from [build] is raised in this caller and in every
    caller that waited for the same build. A failing [destroy] of a value this call discards
    is dropped: the exception says why no value came back. *)

val with_value : ('k, 'v) t -> key:'k -> ?device_id:int -> (unit -> 'v) -> ('v -> 'a) -> 'a
(** [with_value t ~key build f] is {!find_or_build} with [f] run on the value under its
    lease: the value is not destroyed until [f] returns or raises. *)

val evict_device : ('k, 'v) t -> int -> unit
(** Removes every entry recorded for the device and destroys each value no lease holds, then
    the others as their leases end. Also marks the device evicted, so that a build in flight
    for it fails with {!Device_destroyed_during_build}, even when the device had no entries.
    Every destroy is attempted; the first exception one raised is raised again afterwards. *)

val clear : ('k, 'v) t -> unit
(** Removes every entry and destroys its value, as {!evict_device} does, with the same rule
    for failing destroys. A build in flight fails with {!Cache_cleared_during_build} if the
    cache was created with [~invalidated_by_clear:true], and is installed otherwise. *)

val length : ('k, 'v) t -> int
(** The number of entries now. *)

val stats : ('k, 'v) t -> Cache.stats
(** kcache's counters of the cache: builds, waits, discarded values, destroys, … *)
