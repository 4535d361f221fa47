//! `kcache`: see, check and trim a kcache disk cache (`docs/command.md` has the usage, the JSON
//! schemas and the exit codes).
//!
//! The command opens the directory exactly as the library does (`PersistenceConfig::from_env`, or
//! `--dir`), so what it reports is what every process using the cache sees. Its dependencies
//! are the common choices for what each does, so the command behaves as operators expect:
//! - clap (derive): arguments, `--help`, and usage errors with exit status 2, as other
//!   command-line tools give them;
//! - indicatif: the progress bar of `verify`, drawn on stderr only when it is a terminal;
//! - serde and serde_json: the `--json` output, written from typed structs so that its
//!   schema is the structs' fields and cannot drift by a typo;
//! - clap_complete and clap_mangen: the shell completions and the manual page, generated from
//!   clap's definition of the arguments.
//!
//! Exit status: 0 success (`evict` too when nothing matched); 1 the command ran and found a
//! problem (`verify`: corrupt entries;
//! `inspect`: the entry does not verify; `config`: the disk tier is off; `config get`: the
//! setting is not set); 2 a usage error, or the directory cannot be used.

/// `println!` for the command's output. `println!` panics when the reader has gone
/// (`kcache ls | head`); this ends the process quietly instead, as other tools do.
macro_rules! out {
    () => {
        $crate::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::write_line(format_args!($($arg)*))
    };
}

mod commands;
mod report;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

/// The end of `--help` and of the manual page: what applies besides the arguments.
const AFTER_LONG_HELP: &str = "\
Settings: every process that opens the cache directory applies its kcache.conf (kcache config \
set max-size 5G; max-files, lock-timeout, require-key), unless its environment \
(KCACHE_MAX_SIZE, KCACHE_MAX_FILES, KCACHE_LOCK_TIMEOUT, KCACHE_REQUIRE_KEY=1) or its code \
sets the value.

Sizes: bytes, decimals allowed, with an optional unit: k, M, G, T (1000, 1000^2, ...) or Ki, \
Mi, Gi, Ti (1024, 1024^2, ...); 1.5G is 1,500,000,000 bytes.

Exit status: 0 done, nothing wrong found; 1 done, a problem found (verify, inspect: corrupt \
entries; config: the disk tier is off; config get: the setting is not set); 2 bad arguments, or \
the directory cannot be used.";

#[derive(Parser)]
#[command(
    name = "kcache",
    version,
    about = "See, check and trim a kcache disk cache",
    after_long_help = AFTER_LONG_HELP
)]
struct Cli {
    /// The cache directory [default: as the library resolves it: KCACHE_DIR,
    /// $XDG_CACHE_HOME/kcache, $HOME/.cache/kcache]
    #[arg(long, global = true, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The operator key file [default: KCACHE_KEY_FILE]
    #[arg(long, global = true, value_name = "FILE")]
    key_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The resolved directory and how it was chosen, whether it is trusted, and why the disk
    /// tier is off when it is; `config get|set|unset` read and change the directory's settings
    #[command(args_conflicts_with_subcommands = true)]
    Config {
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        action: Option<ConfigAction>,
    },
    /// Entries and bytes, in total and per key generation; the cap; the oldest and newest
    /// entry; the counters of every process that used the directory, with hit rates
    Stats {
        #[arg(long)]
        json: bool,
    },
    /// Zeroes the counters of every process that used the directory
    ZeroStats {
        #[arg(long)]
        json: bool,
    },
    /// One row per entry: backend, device, name, size, build time, last use
    Ls {
        #[arg(long)]
        json: bool,
        /// Only the entries of this backend (`unknown`: those without a verified descriptor)
        #[arg(long, value_name = "B")]
        backend: Option<String>,
        /// Order of the rows [default: by key]
        #[arg(long, value_enum)]
        sort: Option<Sort>,
    },
    /// One entry's header, verified with this process's key
    Inspect {
        /// An entry file name, or (a unique prefix of) a key in hex
        entry: String,
        #[arg(long)]
        json: bool,
    },
    /// Re-checks every entry; exit status 1 when any is corrupt
    Verify {
        /// Remove the corrupt entries
        #[arg(long)]
        remove: bool,
        #[arg(long)]
        json: bool,
    },
    /// Removes stale key generations, temporaries, idle lock files and corrupt entries, and
    /// entries by age or to fit a size
    Gc {
        /// Also remove entries not used (read or written) for this long: 30m, 12h, 7d, 1w2d
        #[arg(long, value_name = "DURATION", value_parser = report::parse_duration)]
        older_than: Option<std::time::Duration>,
        /// Also remove least recently used entries until the directory holds at most SIZE
        /// (bytes, or with a unit: k, M, G, T decimal; Ki, Mi, Gi, Ti binary; 1.5G)
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        max_size: Option<u64>,
        /// Keep the entries of this operator key too (repeat for several)
        #[arg(long, value_name = "FILE")]
        retain_key: Vec<PathBuf>,
        /// List what would be removed, remove nothing
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        json: bool,
    },
    /// Removes every entry of this key (other key generations and other files stay)
    Clear {
        #[arg(long)]
        json: bool,
    },
    /// Removes the entries of one backend or device (entries that verify with this key only)
    #[command(group(clap::ArgGroup::new("selection").required(true).multiple(true)))]
    Evict {
        /// Entries written by this backend (opencl, vulkan, cuda, custom, …)
        #[arg(long, value_name = "B", group = "selection")]
        backend: Option<String>,
        /// Entries built for the device of this name, exactly as `ls` shows it
        #[arg(long, value_name = "NAME", group = "selection")]
        device: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Runs an unmodified OpenCL program with kcache's OpenCL layer: its builds come from the cache
    Run {
        /// Print on stderr, once the program exits, what the cache saved it
        #[arg(long)]
        stats: bool,
        /// The program and its arguments (after `--`)
        #[arg(required = true, trailing_var_arg = true, value_name = "PROGRAM")]
        command: Vec<std::ffi::OsString>,
    },
    /// The directory's figures in the Prometheus text format
    Metrics {
        /// Write them to this file (for node_exporter's textfile collector), through a
        /// temporary file renamed over it
        #[arg(long, value_name = "PATH")]
        textfile: Option<PathBuf>,
    },
    /// The command's completions for SHELL, on stdout (`cmake --install` installs bash's,
    /// zsh's and fish's)
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The command's manual page, in roff, on stdout (`cmake --install` installs it as
    /// kcache(1))
    Man,
}

/// What `config` does to the directory's settings file (`kcache.conf`), which every process
/// that opens the directory applies unless its environment or its code sets the value.
#[derive(Subcommand)]
enum ConfigAction {
    /// Prints the value the directory's settings give NAME; exit status 1 when they give none
    Get {
        #[arg(value_parser = setting_names())]
        name: String,
    },
    /// Sets NAME in the directory's settings (created, like the directory, when missing):
    /// `kcache config set max-size 5G`
    Set {
        #[arg(value_parser = setting_names())]
        name: String,
        #[arg(allow_hyphen_values = true)]
        value: String,
    },
    /// Removes NAME from the directory's settings: the default applies again
    Unset {
        #[arg(value_parser = setting_names())]
        name: String,
    },
}

/// The settings' names, for `--help`, completions and usage errors; ccache's spelling
/// (`max_size`, as in `ccache.conf`) is taken too.
fn setting_names() -> clap::builder::PossibleValuesParser {
    use clap::builder::PossibleValue;
    use kcache::disk::settings::Setting;
    clap::builder::PossibleValuesParser::new(Setting::ALL.map(|s| {
        let (ccache, help) = match s {
            Setting::MaxSize => (
                "max_size",
                "the size cap: 5G, 1.5Gi (k, M, G, T decimal; Ki, Mi, Gi, Ti binary)",
            ),
            Setting::MaxFiles => (
                "max_files",
                "the most entries the directory holds; 0: no limit",
            ),
            Setting::LockTimeout => (
                "lock_timeout",
                "seconds a miss waits for another process's build",
            ),
            Setting::RequireKey => (
                "require_key",
                "true: refuse the directory to processes without an operator key",
            ),
        };
        PossibleValue::new(s.name()).alias(ccache).help(help)
    }))
}

/// The orders of `ls`. Entries have one time of their own, the mtime (last written or read),
/// so `age` and `last-read` are its two directions.
#[derive(Clone, Copy, ValueEnum)]
enum Sort {
    /// Largest first
    Size,
    /// Least recently used first
    Age,
    /// Most recently used first
    LastRead,
}

fn parse_size(text: &str) -> Result<u64, String> {
    kcache::disk::parse_size(text).map_err(|e| e.to_string())
}

/// A failure that ends the command: its message for stderr and its exit status.
pub struct Failure {
    pub message: String,
    pub status: u8,
}

impl Failure {
    /// The directory or an argument cannot be used (exit status 2).
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            status: 2,
        }
    }
}

impl From<kcache::Error> for Failure {
    fn from(e: kcache::Error) -> Failure {
        Failure::usage(e.to_string())
    }
}

/// Writes one line of output; a closed reader ends the process with status 0, any other write
/// error with status 2.
fn write_line(line: std::fmt::Arguments) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_fmt(line)
        .and_then(|()| stdout.write_all(b"\n"))
    {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("kcache: cannot write the output: {e}");
        std::process::exit(2);
    }
}

/// What `completions` and `man` write: generated from the same definition as the parsing, so
/// they cannot drift from it.
fn generated(write: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> Result<u8, Failure> {
    let mut text = Vec::new();
    write(&mut text).map_err(|e| Failure::usage(format!("cannot generate it: {e}")))?;
    out!("{}", String::from_utf8_lossy(&text).trim_end());
    Ok(0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let target = commands::Target {
        dir: cli.dir,
        key_file: cli.key_file,
    };
    let outcome = match cli.command {
        Command::Config { json, action } => match action {
            None => commands::config(&target, json),
            Some(ConfigAction::Get { name }) => commands::settings::get(&target, &name),
            Some(ConfigAction::Set { name, value }) => {
                commands::settings::set(&target, &name, &value)
            }
            Some(ConfigAction::Unset { name }) => commands::settings::unset(&target, &name),
        },
        Command::Stats { json } => commands::stats(&target, json),
        Command::ZeroStats { json } => commands::zero_stats(&target, json),
        Command::Ls {
            json,
            backend,
            sort,
        } => commands::ls(&target, json, backend.as_deref(), sort),
        Command::Inspect { entry, json } => commands::inspect(&target, &entry, json),
        Command::Verify { remove, json } => commands::verify(&target, remove, json),
        Command::Gc {
            older_than,
            max_size,
            retain_key,
            dry_run,
            json,
        } => commands::gc(
            &target,
            &commands::GcArgs {
                older_than,
                max_size,
                retain_key,
                dry_run,
            },
            json,
        ),
        Command::Clear { json } => commands::clear(&target, json),
        Command::Run { stats, command } => run::run(&target, stats, &command),
        Command::Metrics { textfile } => commands::metrics::metrics(&target, textfile.as_deref()),
        Command::Completions { shell } => generated(|out| {
            clap_complete::generate(shell, &mut Cli::command(), "kcache", out);
            Ok(())
        }),
        Command::Man => generated(|out| clap_mangen::Man::new(Cli::command()).render(out)),
        Command::Evict {
            backend,
            device,
            json,
        } => commands::evict::evict(
            &target,
            &commands::evict::Selection { backend, device },
            json,
        ),
    };
    match outcome {
        Ok(status) => ExitCode::from(status),
        Err(failure) => {
            eprintln!("kcache: error: {}", failure.message);
            ExitCode::from(failure.status)
        }
    }
}
