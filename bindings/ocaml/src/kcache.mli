(** kcache's OCaml binding: a concurrency-safe cache of OCaml values over kcache's memory
    tier ({!create}, {!with_lease}), its disk tier ({!Disk}) and keys ({!Key}), and two
    modules made as drop-ins for a framework's own caches: {!Guarded_cache} (in memory) and
    {!Framework_cache} (on disk). *)

include module type of struct
  include Cache
end

module Guarded_cache = Guarded_cache
module Framework_cache = Framework_cache
