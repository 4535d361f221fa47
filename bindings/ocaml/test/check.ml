(* What the test programs share: each failure is printed and counted, and [finish] exits
   non-zero if any failed. *)

let failures = ref 0

let check name cond =
  if not cond then begin
    incr failures;
    Printf.printf "FAIL: %s\n%!" name
  end

let check_int name expected got =
  if expected <> got then begin
    incr failures;
    Printf.printf "FAIL: %s: expected %d, got %d\n%!" name expected got
  end

let finish what =
  if !failures > 0 then begin
    Printf.printf "%d failed checks\n" !failures;
    exit 1
  end;
  Printf.printf "%s: all checks passed\n" what

(* A fresh directory of the test's own, mode 0700. *)
let private_dir () =
  let dir =
    Filename.concat (Filename.get_temp_dir_name ())
      (Printf.sprintf "kcache-ocaml-%d-%d" (Unix.getpid ()) (Random.bits ()))
  in
  Unix.mkdir dir 0o700;
  dir
