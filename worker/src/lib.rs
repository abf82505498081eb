//! The rank program of zerobench: trains a model with ZeRO stage 0-3 on libtorch and logs what
//! every step costs. The binary `zerobench-worker` is [`app::run`] behind [`cli::Args`].
//!
//! | module | job |
//! |---|---|
//! | [`app`] | one rank's run from flags to exit code |
//! | [`cli`] | the flags, mapped onto `RunConfig` |
//! | [`runtime`] | rank identity, device choice, native helpers |
//! | [`comm`] | collectives: the interface the engine uses, over MPI (CPU) and NCCL (GPU) |
//! | [`model`] | models as units and segments: GPT-2, T5, Llama/Mistral, MLP |
//! | [`zero`] | the ZeRO engine: flat buffers, stages 0-3, offload, hpZ, AdamW, loss scaling |
//! | [`data`] | synthetic and text data, split by global sample index |
//! | [`train`] | the step loop |
//! | [`metrics`] | phase timings and memory |
//! | [`logfile`] | the rank's JSON-lines log |
//! | [`failure`] | failure classes and exit codes |

/// A line to standard error, best-effort and in one write. `eprintln!` panics where stderr
/// cannot be written (a Slurm output file on a full disk, a closed pipe), and the panic hook's own
/// message panicked again: a run whose log ended `ok` exited with SIGABRT (134). The log is the
/// record; a message lost on the way to stderr is not a failure. One write per line keeps the
/// lines of ranks sharing one output whole (written piece by piece they interleaved).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!("{}\n", format_args!($($arg)*));
        let _ = std::io::stderr().write_all(line.as_bytes());
    }};
}

pub mod agree;
pub mod app;
pub mod cli;
pub mod comm;
pub mod data;
pub mod failure;
pub mod logfile;
pub mod metrics;
pub mod model;
pub mod runtime;
pub mod train;
pub mod zero;
