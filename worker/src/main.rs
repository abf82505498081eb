//! `zerobench-worker`: one rank of a zerobench run. See `docs/worker.md`.

use std::process::ExitCode;

use clap::Parser;
use zerobench_worker::runtime::launch_env;
use zerobench_worker::{app, cli};

fn main() -> ExitCode {
    // A file-size limit (`ulimit -f`) kills a process writing past it with SIGXFSZ, leaving half a
    // log line and no record of why; ignored, the write fails with EFBIG and the rank ends as on a
    // full disk (exit 5, naming the log).
    // SAFETY: setting a signal's disposition to ignored, before any thread starts.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    // Before any thread starts: setting the environment races with threads reading it.
    if let Some((name, value)) = launch_env::singleton_store(&launch_env::process_env) {
        std::env::set_var(name, value);
    }
    // First, so that a crash anywhere (MPI's start among it) says where it happened.
    if let Err(e) = zerobench_worker::runtime::fatal::install() {
        zerobench_worker::say!("zerobench-worker: no crash report: {e}");
    }
    let args = cli::Args::parse();
    // Panics are caught and logged as failures (app::run); the default hook's backtrace could
    // itself fail or hang when the panic is an allocation failure, so print the message only.
    std::panic::set_hook(Box::new(|info| zerobench_worker::say!("zerobench-worker: {info}")));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
    let code = match app::run(&args) {
        Ok(()) => 0,
        Err(f) => {
            zerobench_worker::say!("zerobench-worker: {f}");
            f.exit_code()
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
