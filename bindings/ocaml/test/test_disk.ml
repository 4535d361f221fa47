(* Tests of the key builder, the disk tier and the tiered lookup, including a second process
   that loads what the first one wrote. *)

open Check

let rec remove_tree path =
  if Sys.is_directory path then begin
    Array.iter (fun f -> remove_tree (Filename.concat path f)) (Sys.readdir path);
    Unix.rmdir path
  end
  else Sys.remove path

let test_keys () =
  let k = Kcache.Key.make ~backend:"opencl" ~source:"kernel" ~options:[ ("-O2", ""); ("-DN", "4") ] () in
  check_int "a key is 32 bytes" 32 (String.length k);
  check "the same inputs, the same key"
    (k = Kcache.Key.make ~backend:"opencl" ~source:"kernel" ~options:[ ("-DN", "4"); ("-O2", "") ] ());
  check "another source, another key"
    (k <> Kcache.Key.make ~backend:"opencl" ~source:"kernel2" ~options:[ ("-O2", ""); ("-DN", "4") ] ());
  check "unset differs from empty" (Kcache.Key.make () <> Kcache.Key.make ~entry:"" ());
  check "ordered options keep their order"
    (Kcache.Key.make ~ordered_options:[ "-DX=1"; "-UX" ] ()
    <> Kcache.Key.make ~ordered_options:[ "-UX"; "-DX=1" ] ());
  check "a duplicate option name"
    (match Kcache.Key.make ~options:[ ("-O2", ""); ("-O2", "") ] () with
    | _ -> false
    | exception Kcache.Error (Kcache.Status.Invalid_argument, _) -> true);
  check_int "hex" 64 (String.length (Kcache.Key.to_hex k))

let test_disk dir =
  Kcache.Disk.with_disk ~dir ~ignore_env:true (fun d ->
      let key = Kcache.Key.make ~source:"disk test" () in
      check "absent" (Kcache.Disk.get d key = None);
      Kcache.Disk.put d key "payload\000bytes";
      check "read back" (Kcache.Disk.get d key = Some "payload\000bytes");
      let s = Kcache.Disk.stats d in
      check_int "puts" 1 s.puts;
      check_int "hits" 1 s.hits;
      check_int "misses" 1 s.misses;
      check "removed" (Kcache.Disk.remove d key);
      check "removed twice" (not (Kcache.Disk.remove d key));
      check "a short key"
        (match Kcache.Disk.get d "short" with _ -> false | exception Invalid_argument _ -> true));
  check "a relative directory is refused"
    (match Kcache.Disk.create ~dir:"relative" ~ignore_env:true () with
    | d ->
        Kcache.Disk.free d;
        false
    | exception Kcache.Error (Kcache.Status.Invalid_argument, _) -> true)

let tiered_key = Kcache.Key.make ~backend:"ocaml-test" ~source:"tiered" ()

(* A lookup that counts what it ran. *)
let tiered c d ~builds ~loads =
  Kcache.with_lease_tiered c ~disk:d "tiered" ~disk_key:tiered_key
    ~build:(fun k ->
      incr builds;
      "built from " ^ k)
    ~load:(fun bytes ->
      incr loads;
      bytes)
    ~serialize:Fun.id Fun.id

let test_tiered dir =
  Kcache.Disk.with_disk ~dir ~ignore_env:true (fun d ->
      let builds = ref 0 and loads = ref 0 in
      Kcache.with_cache (fun c ->
          check "built" (tiered c d ~builds ~loads = "built from tiered");
          check "then from memory" (tiered c d ~builds ~loads = "built from tiered");
          check_int "one build" 1 !builds;
          check_int "no load" 0 !loads;
          check_int "the cache counts the build" 1 (Kcache.stats c).builds);
      Kcache.Disk.flush d;
      Kcache.with_cache (fun c ->
          check "a fresh cache loads from disk" (tiered c d ~builds ~loads = "built from tiered");
          check_int "still one build" 1 !builds;
          check_int "one load" 1 !loads;
          check_int "the cache counts no build: a load is not one" 0 (Kcache.stats c).builds));
  (* Another process finds the entry (see [child] below). *)
  let cmd = Filename.quote_command Sys.executable_name [ "load-from"; dir ] in
  check_int "a second process loads what this one wrote" 0 (Sys.command cmd);
  (* A load that raises: the entry is removed and the value built. *)
  Kcache.Disk.with_disk ~dir ~ignore_env:true (fun d ->
      Kcache.with_cache (fun c ->
          let builds = ref 0 in
          let v =
            Kcache.with_lease_tiered c ~disk:d "tiered" ~disk_key:tiered_key
              ~build:(fun _ ->
                incr builds;
                "rebuilt")
              ~load:(fun _ -> failwith "refused") ~serialize:Fun.id Fun.id
          in
          check "built after a refused load" (v = "rebuilt");
          check_int "one build" 1 !builds;
          check_int "load_failures" 1 (Kcache.Disk.stats d).load_failures))

(* The second process: loads the entry, and fails if it had to build. *)
let child dir =
  Kcache.Disk.with_disk ~dir ~ignore_env:true (fun d ->
      Kcache.with_cache (fun c ->
          let builds = ref 0 and loads = ref 0 in
          let v = tiered c d ~builds ~loads in
          exit (if v = "built from tiered" && !builds = 0 && !loads = 1 then 0 else 1)))

let () =
  match Sys.argv with
  | [| _; "load-from"; dir |] -> child dir
  | _ ->
      Random.self_init ();
      let dir = private_dir () in
      Fun.protect
        ~finally:(fun () -> remove_tree dir)
        (fun () ->
          test_keys ();
          test_disk dir;
          test_tiered dir);
      finish "OCaml disk and key tests"
