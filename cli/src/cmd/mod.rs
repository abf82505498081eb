//! One module per subcommand: its arguments and how it runs.

pub mod fit;
pub mod hostfile;
pub mod hostlist;
pub mod ingest;
pub mod local;
pub mod plan;
pub mod predict;
pub mod render;
pub mod schema;
pub mod status;
pub mod submit;

use zerobench_launcher::plan::Fit;
use zerobench_launcher::Plan;

/// Takes the runs that do not fit the declared GPU memory out of `plan` unless `include` says to
/// keep them (the commands that render: `render`, `local`, `submit`); returns each left out with
/// why, for the command's table and a warning.
fn leave_out_unfit(plan: &mut Plan, include: bool) -> Vec<(String, String)> {
    if include {
        return Vec::new();
    }
    plan.take_unfit()
        .into_iter()
        .map(|r| {
            let why = match r.fit {
                Fit::TooBig { need_bytes, have_bytes } => format!(
                    "not rendered: needs {} per GPU, more than cluster.gpu_memory {}; --include-unfit renders it",
                    zerobench_launcher::values::human_bytes(need_bytes),
                    zerobench_launcher::values::human_bytes(have_bytes)
                ),
                _ => "not rendered".to_string(),
            };
            tracing::warn!(run = %r.id, "{why}");
            (r.id, why)
        })
        .collect()
}

/// How the rendering commands (`render`, `local`, `submit`) treat what is already in `--out`
/// and what does not fit: one declaration of the flags, flattened into each command.
#[derive(clap::Args)]
pub struct RenderFlags {
    /// A run folder holding the results of a different configuration under the same run id is
    /// moved to `.replaced/` in the output folder (never deleted) and the run rendered anew;
    /// without it such a folder is refused and nothing is written.
    #[arg(long)]
    pub overwrite: bool,
    /// Render (and run) also the runs whose model states and engine buffers do not fit
    /// cluster.gpu_memory (`plan` marks them); without it they are left out and listed.
    #[arg(long)]
    pub include_unfit: bool,
}

impl RenderFlags {
    pub fn on_change(&self) -> zerobench_launcher::render::OnChange {
        if self.overwrite {
            zerobench_launcher::render::OnChange::MoveAside
        } else {
            zerobench_launcher::render::OnChange::Refuse
        }
    }
}

/// How the commands that run or submit runs (`local`, `submit`) treat runs that ran before.
#[derive(clap::Args)]
pub struct RerunFlags {
    /// Run again the runs that ended failed, out of memory, cancelled or timed out (finished,
    /// pending and running ones are always left alone); what their earlier attempt left moves to
    /// the run folder's `.attempts/`.
    #[arg(long)]
    pub retry_failed: bool,
}

/// Writes `bytes` to `path`: a new file only (a name in use is an error), unless `replace`. Either
/// way the file is written beside its name and then put in place ([`zerobench_files`]): a reader
/// never sees half of it, a write that fails (a full disk) leaves no file, and a link planted at
/// the name or at the temporary one is never written through.
pub fn write_new(path: &std::path::Path, bytes: &[u8], replace: bool) -> anyhow::Result<()> {
    if replace {
        return Ok(zerobench_files::replace(path, bytes)?);
    }
    zerobench_files::create_new(path, bytes).map_err(|e| {
        if e.cause.kind() == std::io::ErrorKind::AlreadyExists && e.path == path {
            anyhow::anyhow!("cannot create {} (it must not exist yet)", path.display())
        } else {
            e.into()
        }
    })
}

/// A command-line number that must be finite and above 0, `what` naming what it is in the error.
pub fn positive(s: &str, what: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("expected {what} above 0, got {s:?}")),
    }
}
