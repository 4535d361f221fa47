(* Kcache.Framework_cache against the behaviours of the disk cache it replaces, one test each:
   keys (per field, the entry's name, options, the schema), get and put through kcache's disk
   tier, the messages, the switch read on every call, the trusted directory's refusals and its
   fallback, exact counters under parallel workers (Par), and write_atomically with writers
   racing a reader. *)

open Check
module F = Kcache.Framework_cache

(* The environment of one test: the cache directory under [home]; nothing else names one. *)
let use_home home =
  Unix.putenv "KCACHE_DIR" "";
  Unix.putenv "XDG_CACHE_HOME" "";
  Unix.putenv "HOME" home;
  Unix.putenv "SAREK_DISK_CACHE" "";
  Unix.putenv "KCACHE_DISABLE" ""

let key ?(options = []) ?(dev = "gpu") ?(driver = "1.0") ?(name = "k") source =
  F.compute_key_with_options ~options ~dev_name:dev ~driver_version:driver ~name ~source

let test_keys () =
  let k = key "src" in
  check "a key is stable" (k = key "src");
  check "the schema version prefixes the key"
    (String.length k > String.length F.key_schema_version
    && String.sub k 0 (String.length F.key_schema_version) = F.key_schema_version);
  check "compute_key is the key without options"
    (F.compute_key ~dev_name:"gpu" ~driver_version:"1.0" ~name:"k" ~source:"src" = k);
  check "the entry's name is keyed" (key ~name:"k2" "src" <> k);
  check "the source is keyed" (key "src2" <> k);
  check "the driver is keyed" (key ~driver:"1.1" "src" <> k);
  check "the device is keyed" (key ~dev:"gpu2" "src" <> k);
  check "bytes cannot move between device and driver"
    (key ~dev:"a:b" ~driver:"c" "s" <> key ~dev:"a" ~driver:"b:c" "s");
  check "bytes cannot move between name and source" (key ~name:"ab" "c" <> key ~name:"a" "bc");
  check "options are keyed" (key ~options:[ ("-D", "X=1") ] "src" <> k);
  check "an option's value is keyed"
    (key ~options:[ ("-D", "X=1") ] "src" <> key ~options:[ ("-D", "X=2") ] "src");
  check "options in their order"
    (key ~options:[ ("-D", "X"); ("-U", "X") ] "src" <> key ~options:[ ("-U", "X"); ("-D", "X") ] "src");
  check "an option given twice"
    (key ~options:[ ("-D", "X"); ("-D", "X") ] "src" <> key ~options:[ ("-D", "X") ] "src")

(* Two kernels from one source keyed apart, each read back as written; counters exact. *)
let test_get_put () =
  use_home (private_dir ());
  F.reset_stats ();
  let a = key ~name:"saxpy" "one source" and b = key ~name:"daxpy" "one source" in
  check "a miss first" (F.get ~key:a = None);
  F.put ~key:a ~data:"binary of saxpy";
  F.put ~key:b ~data:"binary of daxpy";
  check "the first kernel" (F.get ~key:a = Some "binary of saxpy");
  check "the second kernel, from the same source" (F.get ~key:b = Some "binary of daxpy");
  F.put ~key:a ~data:"saxpy again";
  check "a put replaces" (F.get ~key:a = Some "saxpy again");
  let empty = key "empty" in
  F.put ~key:empty ~data:"";
  check "an empty entry" (F.get ~key:empty = Some "");
  let s = F.get_stats () in
  check_int "hits" 4 s.hits;
  check_int "misses" 1 s.misses;
  check_int "puts" 4 s.puts;
  check_int "errors" 0 s.errors;
  check "the shared record agrees" (F.stats.hits = 4 && F.stats.puts = 4);
  check "hit rate" (F.hit_rate () = 0.8);
  F.print_stats ();
  F.reset_stats ();
  check "reset" (F.get_stats () = { F.hits = 0; misses = 0; puts = 0; errors = 0 });
  check "no lookup, rate 0" (F.hit_rate () = 0.0)

(* The switch, read on every call: off, get misses without counting and put writes nothing. *)
let test_switch () =
  use_home (private_dir ());
  F.reset_stats ();
  let k = key "switched" in
  List.iter
    (fun (var, off) ->
      Unix.putenv var off;
      check (var ^ " switches the cache off") (not (F.enabled ()));
      F.put ~key:k ~data:"written while off";
      check "get misses while off" (F.get ~key:k = None);
      Unix.putenv var "";
      check "on again" (F.enabled ());
      check "nothing was written while off" (F.get ~key:k = None))
    [ ("SAREK_DISK_CACHE", "0"); ("KCACHE_DISABLE", "1") ];
  Unix.putenv "SAREK_DISK_CACHE" "1";
  check "SAREK_DISK_CACHE=1 is on" (F.enabled ());
  let s = F.get_stats () in
  check_int "only the lookups made while on are counted" 2 s.misses;
  check_int "nothing put" 0 s.puts

(* What [f ()] writes on standard error. *)
let stderr_of f =
  let file = Filename.concat (private_dir ()) "stderr" in
  let fd = Unix.openfile file [ Unix.O_WRONLY; Unix.O_CREAT ] 0o600 in
  flush stderr;
  let saved = Unix.dup Unix.stderr in
  Unix.dup2 fd Unix.stderr;
  Unix.close fd;
  Fun.protect
    ~finally:(fun () ->
      flush stderr;
      Unix.dup2 saved Unix.stderr;
      Unix.close saved)
    f;
  let ic = open_in_bin file in
  Fun.protect ~finally:(fun () -> close_in ic) (fun () -> really_input_string ic (in_channel_length ic))

(* The messages: a warning always, a debug line only when debug is on, the untrusted
   directory's warning once per process. *)
let test_messages () =
  check "warnf" (stderr_of (fun () -> F.warnf "x %d" 1) = "kcache: x 1\n");
  check "debugf writes only when debug is on"
    (stderr_of (fun () -> F.debugf "y %s" "z")
    = if F.debug_enabled then "kcache: debug: y z\n" else "");
  check "KCACHE_LOG=debug turns debug on"
    (F.debug_enabled
    = (Option.map String.lowercase_ascii (Sys.getenv_opt "KCACHE_LOG") = Some "debug"));
  Atomic.set F.untrusted_warned false;
  let written =
    stderr_of (fun () ->
        F.warn_untrusted "refused %s" "a";
        F.warn_untrusted "refused %s" "b")
  in
  check "warn_untrusted writes its first warning only" (written = "kcache: refused a\n");
  check "and says so" (Atomic.get F.untrusted_warned)

(* The directory's rule and refusals: the tier's own, checked here as a user would meet them. *)
let test_trusted_dir () =
  let home = private_dir () in
  use_home home;
  let dir = Filename.concat (Filename.concat home ".cache") F.cache_dir_name in
  check "HOME/.cache/kcache" (F.trusted_dir () = Some dir);
  check_int "created 0700" 0o700 (Unix.stat dir).st_perm;
  let xdg = private_dir () in
  Unix.putenv "XDG_CACHE_HOME" xdg;
  check "XDG_CACHE_HOME first" (F.get_cache_dir () = Filename.concat xdg F.cache_dir_name);
  Unix.putenv "XDG_CACHE_HOME" "relative/dir";
  check "a relative XDG_CACHE_HOME is ignored" (F.get_cache_dir () = dir);
  Unix.putenv "HOME" "";
  Unix.putenv "XDG_CACHE_HOME" "";
  (* The seed's last resort, the shared temporary directory (here one of the test's own):
     get_cache_dir names it, trusted_dir refuses it without making it. *)
  let temp = Filename.get_temp_dir_name () in
  let shared = private_dir () in
  Filename.set_temp_dir_name shared;
  let fallback = Filename.concat shared F.cache_dir_name in
  check "no HOME, no XDG_CACHE_HOME: refused" (F.trusted_dir () = None);
  check "the fallback is not made to be refused" (not (Sys.file_exists fallback));
  check "and a get misses" (F.get ~key:(key "x") = None);
  check "get_cache_dir falls back to the temporary directory" (F.get_cache_dir () = fallback);
  check "and makes it" (Sys.is_directory fallback);
  check "still refused once made" (F.trusted_dir () = None);
  Filename.set_temp_dir_name temp;
  use_home home;
  Unix.chmod dir 0o770;
  check "group-writable: refused" (F.trusted_dir () = None);
  F.put ~key:(key "g") ~data:"d";
  Unix.chmod dir 0o700;
  check "nothing was written there" (F.get ~key:(key "g") = None);
  Unix.chmod dir 0o702;
  check "writable by others: refused" (F.trusted_dir () = None);
  Unix.chmod dir 0o700;
  if Unix.geteuid () = 0 then begin
    Unix.chown dir 65534 65534;
    check "owned by another user: refused" (F.trusted_dir () = None);
    Unix.chown dir 0 0;
    check "owned again: trusted" (F.trusted_dir () = Some dir)
  end
  else print_endline "not root: the other-owner refusal is not checked"

(* Workers putting and getting at once: every entry read back whole, the counters exact. *)
let test_parallel () =
  use_home (private_dir ());
  F.reset_stats ();
  let workers = 4 and per = 50 in
  let data w i = Printf.sprintf "kernel %d of worker %d " i w ^ String.make (i * 100) 'x' in
  let ws =
    List.init workers (fun w ->
        Par.spawn (fun () ->
            let bad = ref 0 in
            for i = 0 to per - 1 do
              let k = key ~name:(Printf.sprintf "%d.%d" w i) "parallel" in
              F.put ~key:k ~data:(data w i);
              if F.get ~key:k <> Some (data w i) then incr bad
            done;
            !bad))
  in
  check_int "every entry read back as written" 0 (List.fold_left (fun a w -> a + Par.join w) 0 ws);
  let s = F.get_stats () in
  check_int "puts counted exactly" (workers * per) s.puts;
  check_int "hits counted exactly" (workers * per) s.hits;
  Printf.printf "%s: %d workers x %d puts and gets\n" Par.kind workers per

(* Writers racing a reader on one file: the reader sees one whole version each time, and no
   temporary file is left. *)
let test_write_atomically () =
  let dir = private_dir () in
  let versions = List.init 4 (fun w -> String.make (65536 + w) (Char.chr (97 + w))) in
  F.write_atomically ~dir ~filename:"entry" (List.hd versions);
  let stop = Atomic.make false in
  let reader =
    Par.spawn (fun () ->
        let torn = ref 0 and reads = ref 0 in
        while not (Atomic.get stop) do
          let ic = open_in_bin (Filename.concat dir "entry") in
          let got = really_input_string ic (in_channel_length ic) in
          close_in ic;
          incr reads;
          if not (List.mem got versions) then incr torn
        done;
        (!torn, !reads))
  in
  let writers =
    List.mapi
      (fun w v ->
        Par.spawn (fun () ->
            for _ = 1 to 25 do
              F.write_atomically ~dir ~filename:"entry" v
            done;
            ignore w))
      versions
  in
  List.iter Par.join writers;
  Atomic.set stop true;
  let torn, reads = Par.join reader in
  check_int "no torn read" 0 torn;
  check "the reader read" (reads > 0);
  check "only the entry is left" (Sys.readdir dir = [| "entry" |]);
  check "a write into a missing directory raises"
    (match F.write_atomically ~dir:(Filename.concat dir "missing") ~filename:"f" "x" with
    | () -> false
    | exception Sys_error _ -> true)

let () =
  test_messages ();
  test_keys ();
  test_get_put ();
  test_switch ();
  test_trusted_dir ();
  test_parallel ();
  test_write_atomically ();
  finish ("Framework_cache on " ^ Par.kind)
