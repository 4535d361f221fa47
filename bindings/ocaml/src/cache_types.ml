(* The types of Kcache's interface, without an interface of their own: cache.ml includes
   them and cache.mli includes their signature, so that neither repeats them. *)

(** A function that takes a cache's options, then ['r]: {!Kcache.create} and
    {!Kcache.with_cache}. [max_entries] and [max_weight] bound the cache (0, the default:
    unbounded); [weight] gives each built value's weight (default 0); [destroy] runs exactly
    once per built value, when it has left the cache and no lease holds it (an exception from
    it is counted in [destroy_errors] and reported as [Error (Destroy_failed, _)] by the call
    that ran it, when that call reports anything). With [invalidated_by_clear], a build in
    flight across a [clear] fails with [Error (Cache_cleared, _)]. *)
type ('a, 'r) with_options =
  ?max_entries:int ->
  ?max_weight:int ->
  ?invalidated_by_clear:bool ->
  ?weight:('a -> int) ->
  ?destroy:('a -> unit) ->
  'r

(** The counters of [kc_cache_statistics], in the order the stubs store them. *)
type stats = {
  hits : int;  (** lookups answered from a ready entry *)
  misses : int;  (** lookups that found neither a ready entry nor a build to wait for *)
  builds : int;
      (** build functions that produced a value; a value a tiered lookup loaded from disk is not
          one, and is counted nowhere here: the C struct has no field for loads *)
  build_failures : int;  (** builds that raised *)
  waits : int;  (** lookups that waited for another thread's build *)
  discarded : int;  (** values built but destroyed instead of installed *)
  capacity_evictions : int;
  device_evictions : int;
  clears : int;
  destroys : int;  (** values released *)
  destroy_errors : int;  (** destroys that raised *)
  entries : int;  (** entries now *)
  weight : int;  (** their total weight now *)
  leases : int;  (** leases held now *)
}
