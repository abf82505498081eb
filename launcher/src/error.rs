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
    /// The reason is part of the message, not a separate cause: a chain of causes prints it once.
    #[error("{}: {cause}", path.display())]
    Io { path: PathBuf, cause: std::io::Error },
    /// Slurm took a job whose record could not be written (a full disk).
    #[error(
        "Slurm took job {job} for run {run}, but {}: {cause}; the job will run: cancel it (scancel {job}) or \
         keep it, and remove {} before submitting the run again",
        record.display(),
        marker.display()
    )]
    Unrecorded { run: String, job: String, record: PathBuf, cause: std::io::Error, marker: PathBuf },
    /// A run folder marked as being submitted, with no record of a job: one may be in Slurm.
    #[error(
        "{}: a submission of run {run} {} without a slurm.json (zerobench was stopped during sbatch, or the \
         record could not be written): look for it in squeue (the job is named after the run), cancel or keep \
         it, then remove this file to submit the run again",
        marker.display(),
        job.as_ref().map_or_else(|| "may have reached Slurm".to_string(), |j| format!("reached Slurm as job {j}"))
    )]
    Unsettled { marker: PathBuf, run: String, job: Option<String> },
    /// A run folder whose rendering stopped before its `run.json` (a full disk).
    #[error("{}: a run folder without its run.json (its rendering did not finish): render the spec into it again", dir.display())]
    Unfinished { dir: PathBuf },
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
        Error::Io { path: path.to_path_buf(), cause: source }
    }
}

impl From<zerobench_files::Error> for Error {
    fn from(e: zerobench_files::Error) -> Self {
        Error::Io { path: e.path, cause: e.cause }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
