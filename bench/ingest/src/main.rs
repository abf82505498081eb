//! Generates a realistic sweep of worker logs for the ingest benchmark: every record is a
//! `zerobench_schema::Record` serialised as the worker does (mostly `step` records, with their
//! collectives and memory figures), one `rank<N>.jsonl` per rank, one folder per run, in the
//! launcher's `<out>/<run-id>/logs/` layout. Steps per run are chosen so that the whole sweep
//! reaches the requested size.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use zerobench_ingest::synth::{Fate, SynthRun};
use zerobench_schema::{ModelPreset, RunConfig, ZeroStage};

#[derive(Parser)]
#[command(about = "Write a sweep of synthetic worker logs for the ingest benchmark.")]
struct Args {
    /// Folder to write the sweep into.
    #[arg(long)]
    out: PathBuf,
    /// Approximate total size in MB (1e6 bytes).
    #[arg(long, default_value_t = 1100)]
    target_mb: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let models = [ModelPreset::Gpt2, ModelPreset::Gpt2Medium, ModelPreset::Gpt2Xl, ModelPreset::T5Large];
    let gpus = [1u32, 2, 4, 8, 16];
    let mut plan = Vec::new();
    for (mi, model) in models.iter().enumerate() {
        for stage in ZeroStage::ALL {
            for (gi, &n) in gpus.iter().enumerate() {
                let mut cfg = RunConfig::new(*model, stage);
                cfg.micro_batch = 8;
                cfg.warmup = 2;
                let id = format!("{model}-z{stage}-mbs8-g{n}");
                let mut run =
                    SynthRun::new(&id, cfg, n, 40.0 * (mi as f64 + 1.0) * (1.0 + 0.08 * f64::from(stage.index())));
                run.nodes = n.div_ceil(8);
                run.seed = (mi * 100 + gi) as u64;
                // A few runs end badly, as in a real sweep.
                if *model == ModelPreset::Gpt2Xl && stage == ZeroStage::Z0 && n == 1 {
                    run.fate = Fate::Oom { rank: 0, step: 3 };
                }
                // (No killed run with a half-written line: polars and DuckDB stop at one.)
                if *model == ModelPreset::T5Large && stage == ZeroStage::Z3 && n == 16 {
                    run.fate = Fate::Failed { rank: 3, step: 0 };
                }
                plan.push(run);
            }
        }
    }
    // Size one step line of every run (they differ by collectives) to choose the number of steps.
    let mut bytes_per_step = 0u64;
    for r in &plan {
        let mut probe = r.clone();
        probe.config.steps = 3;
        probe.fate = Fate::Ok;
        let recs = probe.records(0);
        let step = recs.iter().find(|x| x.event() == "step").context("no step record")?;
        bytes_per_step += (serde_json::to_string(step)?.len() as u64 + 1) * u64::from(r.world_size);
    }
    let steps = (args.target_mb * 1_000_000 / bytes_per_step).max(4);
    let mut total = 0u64;
    for mut run in plan {
        run.config.steps = u32::try_from(steps).context("too many steps")?;
        if let Fate::Failed { step, .. } = &mut run.fate {
            *step = run.config.steps / 2;
        }
        let dir = args.out.join(&run.run_id).join("logs");
        total += run.write(&dir).with_context(|| format!("writing {}", dir.display()))?;
    }
    println!("{total}");
    Ok(())
}
