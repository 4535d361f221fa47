(** The cache, as {!Kcache} has it: one build per key
    however many threads ask for it, leases that keep a value from being destroyed while it is
    in use, eviction by device, and counters.

    Every call that can wait or run a callback releases the OCaml runtime lock, so other
    threads (systhreads) run meanwhile; builds and destroys take it back. *)

module Status = Status

exception Error of Status.t * string
(** A failed call: the status and kcache's detail ([kc_last_error_message]). A build that
    raised is not reported this way: its own exception is raised again. *)

module Key = Key
module Disk = Disk

type 'a t
(** A cache of values of type ['a], keyed by strings (compared by content). *)

(* [with_options], the options of [create] and [with_cache], and the counters, [stats]. *)
include module type of Cache_types

val create : ('a, unit -> 'a t) with_options
(** A cache with the options of {!with_options}. Free it with {!free} (or use {!with_cache}):
    the GC does not, because freeing runs [destroy] callbacks, which a finalizer cannot.
    [destroy] runs outside every lock of the cache, so it may call into it (once {!free}
    has run, such calls raise [Invalid_argument]). *)

val free : 'a t -> unit
(** Frees the cache: destroys every value no lease holds now, the others when their lease
    ends. Later calls on the cache raise [Invalid_argument]; a second [free] does nothing.
    [free] never waits and never fails: while other threads or domains are inside a call on
    the cache, it takes effect when the last of those calls returns. *)

val with_cache : ('a, ('a t -> 'b) -> 'b) with_options
(** [with_cache f] creates a cache, runs [f] on it and frees it, however [f] returns. *)

val with_lease : 'a t -> ?device:int -> string -> build:(string -> 'a) -> ('a -> 'b) -> 'b
(** [with_lease t key ~build f] runs [f] on the value for [key], building it with
    [build key] on a miss. Threads asking for the same key share one build: they wait for it
    (with the runtime lock released) and get its value, or its exception, raised again with
    its backtrace in each of them. The value is not destroyed while [f] runs, whatever other
    threads remove, evict or clear; the lease ends when [f] returns or raises.

    Sharing a build never changes a caller's outcome: a caller fails with a device error only
    if its own [device] was evicted during its call (or with a clear error if a cache
    invalidated by clear was cleared during it), and builds again where the shared build
    failed for a reason that is not its own. [device] (>= 0) is recorded against the entry
    for every caller it is returned to, for {!evict_device}.
    [build] may use any cache, but asking this cache for [key] raises
    [Error (Reentrant, _)]. *)

val with_lease_weight :
  'a t -> ?device:int -> string -> build:(string -> 'a) -> ('a -> int -> 'b) -> 'b
(** {!with_lease}, with the value's weight passed to [f] too. *)

val with_lease_tiered :
  'a t ->
  ?device:int ->
  ?disk:Disk.t ->
  string ->
  disk_key:string ->
  build:(string -> 'a) ->
  load:(string -> 'a) ->
  serialize:('a -> string) ->
  ('a -> 'b) ->
  'b
(** {!with_lease} with the disk tier under the cache: on a miss in memory, [load] turns the
    disk entry for [disk_key] (32 bytes, {!Key.make}) into a value, else [build key] builds
    it and [serialize]'s bytes are written back to [disk] (in the background: {!Disk.flush}
    waits for them). One read or build per key across threads, and across processes sharing
    the directory. A [load] that raises makes kcache remove the entry and build; a
    [serialize] that raises skips the write-back. Without [disk], memory only. *)

val find_or_build : 'a t -> ?device:int -> string -> build:(string -> 'a) -> 'a
(** The value for [key], built on a miss; its lease ends on return, so [destroy] may run on
    it from then on. Use {!with_lease} when [destroy] frees what the value refers to. *)

val remove : 'a t -> string -> bool
(** Removes the entry for [key]; false if there was none. Its value is destroyed now, or
    when its last lease ends. *)

val evict_device : 'a t -> int -> unit
(** Removes every entry built for the device, and makes its builds in flight fail with
    [Error (Device_destroyed, _)]. *)

val clear : 'a t -> unit
(** Removes every entry. *)

val length : 'a t -> int
(** The number of entries now. *)

val stats : 'a t -> stats
val reset_stats : 'a t -> unit
(** Zeroes the event counters; [entries], [weight] and [leases] stay. *)

val hit_rate : stats -> float option
(** [hits / (hits + misses)]; [None] before the first lookup. *)

val version : unit -> string
(** The library's version, ["MAJOR.MINOR.PATCH"]. *)
