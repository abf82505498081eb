//! `zerobench`: the front door. Plans, renders, submits and tracks ZeRO sweeps (the launcher crate)
//! and turns their log folders into tables (the ingest crate). It never links libtorch, MPI or CUDA.
//!
//! Exit codes: 0 success; 1 the command ran but the result is incomplete (for example a log
//! line that could not be read, or a run that failed); 2 the command could not do its job.

mod cmd;
mod host_rate;
mod lock;
mod stdout;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "zerobench", version, about = "What each ZeRO configuration really costs.")]
struct Cli {
    /// More diagnostics on stderr (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The runs a spec expands to: GPUs, ZeRO model-state memory and communication per GPU.
    Plan(cmd::plan::Args),
    /// Render a spec into run folders: job.sbatch, hostfiles, run.json.
    Render(cmd::render::Args),
    /// Submit rendered runs (or a spec) to Slurm with sbatch.
    Submit(cmd::submit::Args),
    /// The state of every run of a rendered sweep.
    Status(cmd::status::Args),
    /// Run a spec's sweep on this host with mpirun, no Slurm.
    Local(cmd::local::Args),
    /// Expand or compress Slurm hostlist expressions.
    Hostlist(cmd::hostlist::Args),
    /// Check hostfiles and show where each rank runs.
    Hostfile(cmd::hostfile::Args),
    /// Read log folders and write the latency, memory, scaling, comm and runs tables and plots.
    Ingest(cmd::ingest::Args),
    /// Print the JSON Schema of the worker's log records.
    Schema(cmd::schema::Args),
    /// Fit a cost model (step time, peak memory) from log folders.
    Fit(cmd::fit::Args),
    /// Predict a configuration's step time, throughput and memory from a cost model.
    Predict(cmd::predict::Args),
}

/// What a command reports back to `main`.
pub enum Outcome {
    /// Everything asked for was done.
    Complete,
    /// The command finished, but part of the result is missing (exit code 1).
    Incomplete,
}

fn main() -> ExitCode {
    // A file-size limit (`ulimit -f`) kills a process writing past it with SIGXFSZ, with no
    // message and nothing cleaned up; ignored, such a write fails with EFBIG and is reported and
    // undone as any failed write is. Programs started from here inherit it.
    // SAFETY: setting a signal's disposition to ignored, before any thread starts.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let result = match cli.command {
        Command::Plan(a) => cmd::plan::run(a),
        Command::Render(a) => cmd::render::run(a),
        Command::Submit(a) => cmd::submit::run(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Local(a) => cmd::local::run(a),
        Command::Hostlist(a) => cmd::hostlist::run(a),
        Command::Hostfile(a) => cmd::hostfile::run(a),
        Command::Ingest(a) => cmd::ingest::run(a),
        Command::Schema(a) => cmd::schema::run(a),
        Command::Fit(a) => cmd::fit::run(a),
        Command::Predict(a) => cmd::predict::run(a),
    };
    match result {
        Ok(Outcome::Complete) => ExitCode::SUCCESS,
        Ok(Outcome::Incomplete) => ExitCode::from(1),
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            eprintln!("zerobench: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only for a terminal: a redirected stderr gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .init();
}

/// `zerobench ... | head` closes our stdout early; that is not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}
