//! One module per subcommand: its arguments and how it runs.

pub mod hostfile;
pub mod hostlist;
pub mod ingest;
pub mod local;
pub mod plan;
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
