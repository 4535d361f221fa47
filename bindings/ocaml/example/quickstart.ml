(* Four threads ask for one kernel: one compiles it, the others wait and share it. *)
let compile source =
  Thread.delay 0.1;
  "binary of " ^ source

let () =
  Kcache.with_cache (fun cache ->
      let worker () =
        Kcache.with_lease cache ~device:0 "saxpy.cl" ~build:compile (fun binary ->
            assert (binary = "binary of saxpy.cl"))
      in
      List.iter Thread.join (List.init 4 (fun _ -> Thread.create worker ()));
      let s = Kcache.stats cache in
      Printf.printf "builds=%d misses=%d waits+hits=%d\n" s.builds s.misses (s.waits + s.hits))
