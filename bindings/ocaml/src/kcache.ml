(* The library's one module: the cache with its tiers and keys (Cache), and the two drop-in
   modules built on it. Guarded_cache and Framework_cache use Cache, so it cannot live here. *)

include Cache
module Guarded_cache = Guarded_cache
module Framework_cache = Framework_cache
