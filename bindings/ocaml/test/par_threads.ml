(* Par on OCaml 4: each worker a systhread, taking turns under the one runtime lock. *)

let kind = "threads"

type 'a t = Thread.t * 'a option ref

let spawn f =
  let result = ref None in
  (Thread.create (fun () -> result := Some (f ())) (), result)

let join (thread, result) =
  Thread.join thread;
  match !result with Some r -> r | None -> failwith "Par.join: the worker raised"
