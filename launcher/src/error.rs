//! The error of the launcher's steps that touch files and programs (render, submit, status,
//! local). Parsing has its own errors, each naming where: [`crate::spec::SpecError`],
//! [`crate::hostfile::HostfileError`], [`crate::hostlist::HostlistError`],
//! [`crate::select::SelectError`].

use std::path::{Path, PathBuf};

use crate::quote::DirectiveError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Directive(#[from] DirectiveError),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}:{line}:{column}: {message}", path.display())]
    Json { path: PathBuf, line: usize, column: usize, message: String },
    /// A `run.json` written by a zerobench with another record format.
    #[error("{}: format {found}, but this zerobench reads format {expected}: render the spec again", path.display())]
    RecordFormat { path: PathBuf, found: u32, expected: u32 },
    /// A program could not be started or did not answer in time.
    #[error("{command}: {message}")]
    Command { command: String, message: String },
    /// A Slurm command ran and refused.
    #[error("{command} exited with {code}: {stderr}")]
    Slurm { command: String, code: i32, stderr: String },
    #[error("{0}")]
    Usage(String),
    /// `submit` got a signal: it stopped between two submissions, every job sent recorded.
    #[error(
        "interrupted by {signal} after {submitted} of {total} runs were submitted (each recorded in \
         its run folder's slurm.json); zerobench submit again sends the rest"
    )]
    Interrupted { signal: String, submitted: usize, total: usize },
    /// A run folder holds the results of a different run than the one about to be rendered there.
    #[error(
        "run {run}: {} holds the results of a different run ({what}); nothing was written. Use \
         another --out, or --overwrite to move the old folder aside",
        dir.display()
    )]
    RunChanged { run: String, dir: PathBuf, what: String },
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io { path: path.to_path_buf(), source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
