(* A hit through Kcache.with_lease: 1,000 keys, best of 7 runs of [n] hits (default 10^6). *)
let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 1_000_000 in
  let keys = Array.init 1000 (fun i -> "key-" ^ string_of_int i) in
  Kcache.with_cache (fun c ->
      let build k = k in
      Array.iter (fun k -> ignore (Kcache.find_or_build c k ~build)) keys;
      let use v = ignore (Sys.opaque_identity v) in
      let best = ref infinity in
      for _ = 1 to 7 do
        let t0 = Unix.gettimeofday () in
        for i = 0 to n - 1 do
          Kcache.with_lease c keys.(i mod 1000) ~build use
        done;
        best := Float.min !best ((Unix.gettimeofday () -. t0) *. 1e9 /. float n)
      done;
      Printf.printf "with_lease hit: %.0f ns (best of 7 runs of %d hits, 1000 keys)\n" !best n)
