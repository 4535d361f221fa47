(* The two drop-in modules against the interfaces of the modules they replace, written out
   here from those modules' documentation: a value missing or of another type fails the build
   of this test. Kcache's modules may add values (with_value, free, stats); they may not lack
   one. *)

module type SEED_FRAMEWORK = sig
  val debug_enabled : bool
  val debugf : ('a, out_channel, unit, unit, unit, unit) format6 -> 'a
  val warnf : ('a, out_channel, unit, unit, unit, unit) format6 -> 'a

  type stats = {
    mutable hits : int;
    mutable misses : int;
    mutable puts : int;
    mutable errors : int;
  }

  val stats : stats
  val get_stats : unit -> stats
  val reset_stats : unit -> unit
  val hit_rate : unit -> float
  val print_stats : unit -> unit
  val cache_dir_name : string
  val enabled : unit -> bool
  val get_cache_dir : unit -> string
  val untrusted_warned : bool Atomic.t
  val warn_untrusted : ('a, out_channel, unit, unit, unit, unit) format6 -> 'a
  val trusted_dir : unit -> string option
  val key_schema_version : string

  val compute_key_with_options :
    options:(string * string) list ->
    dev_name:string ->
    driver_version:string ->
    name:string ->
    source:string ->
    string

  val compute_key : dev_name:string -> driver_version:string -> name:string -> source:string -> string
  val get : key:string -> string option
  val write_atomically : dir:string -> filename:string -> string -> unit
  val put : key:string -> data:string -> unit
end

module type SEED_GUARDED = sig
  type ('k, 'v) t

  exception Device_destroyed_during_build
  exception Cache_cleared_during_build

  val create : ?size:int -> ?invalidated_by_clear:bool -> destroy:('v -> unit) -> unit -> ('k, 'v) t
  val find_or_build : ('k, 'v) t -> key:'k -> ?device_id:int -> (unit -> 'v) -> 'v
  val evict_device : ('k, 'v) t -> int -> unit
  val clear : ('k, 'v) t -> unit
  val length : ('k, 'v) t -> int
end

module _ : SEED_FRAMEWORK = Kcache.Framework_cache
module _ : SEED_GUARDED = Kcache.Guarded_cache

(* The exceptions are the modules' own, not copies: a handler written for the seed's catches
   kcache's. *)
let () =
  let module G : SEED_GUARDED = Kcache.Guarded_cache in
  Check.check "the seed's exception is kcache's"
    (try raise Kcache.Guarded_cache.Device_destroyed_during_build with
    | G.Device_destroyed_during_build -> true);
  Check.finish "the seed's signatures"
