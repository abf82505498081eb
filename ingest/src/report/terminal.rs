//! The summary printed on the terminal: one line per run with the figures people compare first
//! (written as aligned text by `zerobench_table::write_text`).

use crate::run::RunRow;
use zerobench_table::Table;

/// The summary table of the runs.
pub fn summary_table(runs: &[RunRow]) -> Table {
    let header = [
        "run",
        "model",
        "zero",
        "offload",
        "mbs",
        "gpus",
        "status",
        "step ms p50",
        "p90",
        "tok/s/gpu",
        "samples/s",
        "MFU",
        "peak GiB",
        "exposed comm",
    ];
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map(f).unwrap_or_else(|| "-".into());
    let rows = runs
        .iter()
        .map(|r| {
            let peak = r.peak_allocated_bytes.or(r.peak_nvml_used_bytes).or(r.peak_rss_bytes);
            vec![
                r.run_id.clone(),
                if r.variant.is_empty() { r.model.clone() } else { format!("{} [{}]", r.model, r.variant) },
                r.stage.map_or("-".into(), |s| s.to_string()),
                r.offload.map_or("?".into(), |o| o.to_string()),
                r.micro_batch.map_or("-".into(), |m| m.to_string()),
                r.gpus.map_or("-".into(), |g| g.to_string()),
                r.status.to_string(),
                opt(r.step_ms_median, &|v| format!("{v:.2}")),
                opt(r.step_ms_p90, &|v| format!("{v:.2}")),
                opt(r.tokens_per_s_per_gpu, &|v| format!("{v:.0}")),
                opt(r.samples_per_s, &|v| format!("{v:.1}")),
                opt(r.mfu, &|v| format!("{:.1}%", v * 100.0)),
                opt(peak.map(|b| b as f64 / (1u64 << 30) as f64), &|v| format!("{v:.2}")),
                opt(r.exposed_comm_frac, &|v| format!("{:.1}%", v * 100.0)),
            ]
        })
        .collect();
    Table { name: "summary", header: header.iter().map(|s| s.to_string()).collect(), rows }
}
