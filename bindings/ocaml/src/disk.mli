(** The disk tier: entries in a cache directory, written atomically and verified on every read
    (checksummed, or authenticated with an operator key). Share one across caches and
    processes; see docs/disk-tier.md for the directory's rules. Calls release the runtime
    lock while they do I/O. *)

type t

(* [with_options], the options of [create] and [with_disk], and the counters, [stats]. *)
include module type of Disk_types

val create : (unit -> t) with_options
(** Opens the tier with the options of {!with_options}. Raises [Kcache.Error] when the tier
    is refused ([Unavailable], [Untrusted], [Invalid_argument], [Io]): a program should then go
    on with memory only. Free it with {!free} (or use {!with_disk}). *)

val free : t -> unit
(** Writes what is pending and closes the tier; a second [free] does nothing, other calls
    after it raise [Invalid_argument]. *)

val with_disk : ((t -> 'a) -> 'a) with_options
(** [with_disk f] opens a tier, runs [f] on it and frees it, however [f] returns. *)

val put : t -> string -> string -> unit
(** [put d key payload] writes the entry for [key] (32 bytes, from {!Key.make}). *)

val get : t -> string -> string option
(** The verified payload for [key], or [None]: no entry, or one that failed verification
    (removed). *)

val remove : t -> string -> bool
(** Removes the entry for [key]; false if there was none. *)

val flush : t -> unit
(** Waits for every background write submitted so far (tiered lookups write in the
    background). *)

val stats : t -> stats
val reset_stats : t -> unit
