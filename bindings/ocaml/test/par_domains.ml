(* Par on OCaml 5: each worker a domain of its own, running in parallel with the others. *)

let kind = "domains"

type 'a t = 'a Domain.t

let spawn f = Domain.spawn f
let join = Domain.join
