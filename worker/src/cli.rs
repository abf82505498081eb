//! The worker's flags. They map one to one onto [`RunConfig`] (see `RunConfig::to_worker_args`),
//! plus where the run is put (`--log-dir`, `--run-id`) and how the process runs (`--threads`).
//!
//! The optimizer's and the engine's flags are their structs' own (`OptimConfig` and `EngineConfig`
//! derive `clap::Args` in the schema), so a new knob and its default are declared once. The
//! run's top-level fields stay declared here: their flags differ from the struct (`--seq-len`'s
//! default depends on `--model`; `--delayed-update` is a switch with its own count), and the test
//! below holds every one of them to `RunConfig` and its defaults.

use std::path::PathBuf;

use clap::Parser;
use zerobench_schema::config::{EngineConfig, OptimConfig};
use zerobench_schema::{DeviceRequest, ModelPreset, Offload, Precision, RunConfig, ZeroStage};

use crate::runtime::cpus::LaunchCpu;
use crate::runtime::launch_env::Rendezvous;

/// The longest wait a flag takes, in seconds: a year is beyond any run, and far below where a
/// deadline of now plus the wait overflows a clock.
const YEAR_S: u64 = 365 * 24 * 3600;

/// One rank of a zerobench run: trains a model with a ZeRO stage and logs what it costs.
#[derive(Debug, Parser)]
#[command(name = "zerobench-worker", version)]
// The flags that say which step `--torch-profile` records.
#[command(group(clap::ArgGroup::new("recorded_step").args(["profile_step", "cuda_graph"]).multiple(true)))]
pub struct Args {
    /// Model preset.
    #[arg(long, value_parser = parse::<ModelPreset>)]
    pub model: ModelPreset,
    /// ZeRO stage: 0, 1, 2 or 3.
    #[arg(long, value_parser = parse::<ZeroStage>)]
    pub stage: ZeroStage,
    /// What to keep in host memory: none, optimizer, optimizer+params.
    #[arg(long, default_value = "none", value_parser = parse::<Offload>)]
    pub offload: Offload,
    /// With --offload: the share of each rank's optimizer partition kept and updated on the host,
    /// above 0 and at most 1 (whole units, the model's last); the device updates the rest at the
    /// same time [default: 1, all on the host].
    #[arg(long)]
    pub offload_ratio: Option<f64>,
    /// With --offload: the host's update of step t runs during step t + 1's forward and backward,
    /// which uses the parameters one update behind (DeepSpeed's delayed parameter update).
    #[arg(long)]
    pub delayed_update: bool,
    /// With --delayed-update: the steps run exactly (each waits for its update) before the delay
    /// starts.
    #[arg(long, default_value_t = 10, requires = "delayed_update")]
    pub delayed_update_after: u32,
    /// bf16, fp16 (dynamic loss scaling) or fp32.
    #[arg(long, default_value = "bf16", value_parser = parse::<Precision>)]
    pub precision: Precision,
    /// Sequences per rank per micro-step.
    #[arg(long, default_value_t = 1)]
    pub micro_batch: u32,
    /// Tokens per sequence; T5: input tokens; MLP: vectors per sample [default: the preset's:
    /// GPT-2 its positions up to 1024 (tiny 256), Llama 1024, T5 512, MLP 1].
    #[arg(long)]
    pub seq_len: Option<u32>,
    /// T5: target (decoder) tokens per sequence [default: a quarter of --seq-len, at least 1].
    #[arg(long)]
    pub target_len: Option<u32>,
    /// Micro-steps per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: u32,
    /// Optimizer steps, warmup included.
    #[arg(long, default_value_t = 10)]
    pub steps: u32,
    /// Leading steps flagged as warmup (left out of summaries).
    #[arg(long, default_value_t = 2)]
    pub warmup: u32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Train on this text file (byte-level tokens) instead of seeded synthetic tokens.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Evaluate every N steps and after the last: the mean loss over one global batch of held-out
    /// samples (the end of --data: its last tenth, or one sample if more; training then leaves it alone; else seeded samples
    /// training never draws), logged as an `eval` record.
    #[arg(long)]
    pub eval_every: Option<u32>,
    /// auto (CUDA when a GPU is visible), cpu or cuda.
    #[arg(long, default_value = "auto", value_parser = parse::<DeviceRequest>)]
    pub device: DeviceRequest,
    /// Folder for `rank<N>.jsonl`.
    #[arg(long)]
    pub log_dir: PathBuf,
    /// Identifies the run in every log [default: generated on rank 0 and shared].
    #[arg(long)]
    pub run_id: Option<String>,
    /// Replace logs an earlier run left in --log-dir.
    #[arg(long)]
    pub overwrite: bool,
    /// libtorch intra-op threads, at least 1 and at most 4 per core of this host [default: the
    /// cores the launcher bound this rank to, else this host's cores divided among its ranks].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
    /// The CPU this rank's launching threads (this one and libtorch's autograd thread) share from
    /// the first backward pass on, on a GPU: `none`, free on every CPU the rank may run on;
    /// `auto`, the last CPU of the rank's share of them; or a CPU number. One CPU shortens
    /// launch-bound steps on virtual machines, and makes runs of one configuration differ more
    /// [default: none].
    #[arg(long, default_value = "none")]
    pub launch_cpu: LaunchCpu,
    /// Write a Chrome/Perfetto trace of the first measured steps to `<log-dir>/trace-rank<N>.json`.
    #[arg(long)]
    pub trace: bool,
    /// Log a per-module breakdown (parameters, FLOPs, forward and backward time) of this step.
    #[arg(long)]
    pub profile_step: Option<u32>,
    /// Record a step with libtorch's profiler (every operator on the host, every CUDA kernel and
    /// copy) into `<log-dir>/torch-profile-rank<N>.json`, a Chrome trace: the --profile-step step,
    /// or with --cuda-graph the first measured step (replayed). The profiler slows the step it
    /// records.
    #[arg(long, requires = "recorded_step")]
    pub torch_profile: bool,
    /// One GPU: replay each micro-step's forward and backward from CUDA graphs captured at the
    /// last warmup step (any stage, bf16 or fp32, no offload). Phases are timed per graph, so
    /// --trace and --profile-step, which time each segment, are not available with it.
    #[arg(long, conflicts_with_all = ["trace", "profile_step"])]
    pub cuda_graph: bool,
    /// How the ranks find each other: `mpi` (mpirun, srun --mpi=pmix), `env` (RANK, WORLD_SIZE,
    /// MASTER_ADDR, MASTER_PORT, as torchrun and DeepSpeed set them; rank 0 hosts a TCP store),
    /// or `auto`: MPI if an MPI launcher started this process, else env if WORLD_SIZE or
    /// MASTER_ADDR is set, else one process.
    #[arg(long, value_enum, default_value_t = Rendezvous::Auto, env = "ZEROBENCH_RENDEZVOUS")]
    pub rendezvous: Rendezvous,
    /// `env` rendezvous: seconds a rank waits for the others to arrive before it fails (at most
    /// a year: libtorch's store adds the wait to the clock, where far larger ones overflow).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=YEAR_S), env = "ZEROBENCH_RENDEZVOUS_TIMEOUT_S")]
    pub rendezvous_timeout_s: u64,
    /// Stop the rank (exit code 4) when no step completes for this long, or ten times the longest
    /// step if that is more (300 s before the first step); 0 disables; at most a year.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=YEAR_S))]
    pub stall_timeout_s: u64,
    #[command(flatten)]
    pub optim: OptimConfig,
    #[command(flatten)]
    pub engine: EngineConfig,
}

fn parse<T: std::str::FromStr<Err = String>>(s: &str) -> Result<T, String> {
    s.parse()
}

impl Args {
    /// The step `--torch-profile` records, if asked: `--profile-step`'s, or with `--cuda-graph`
    /// (which refuses `--profile-step`) the first measured one, a replay.
    pub fn torch_profile_step(&self) -> Option<u32> {
        self.torch_profile.then(|| self.profile_step.unwrap_or(self.warmup))
    }

    pub fn config(&self) -> RunConfig {
        RunConfig {
            model: self.model,
            stage: self.stage,
            offload: self.offload,
            offload_ratio: self.offload_ratio,
            delayed_update_after: self.delayed_update.then_some(self.delayed_update_after),
            precision: self.precision,
            micro_batch: self.micro_batch,
            seq_len: self.seq_len.unwrap_or_else(|| self.model.spec().default_seq_len()),
            target_len: self.target_len,
            grad_accum: self.grad_accum,
            steps: self.steps,
            warmup: self.warmup,
            seed: self.seed,
            data: self.data.clone(),
            eval_every: self.eval_every,
            device: self.device,
            cuda_graph: self.cuda_graph,
            optim: self.optim,
            engine: self.engine,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use zerobench_schema::config::CopyEngines;
    use zerobench_schema::fields::field_names;

    fn parse_config(cfg: &RunConfig) -> RunConfig {
        let mut argv = vec!["zerobench-worker".to_string()];
        argv.extend(cfg.to_worker_args());
        argv.extend(["--log-dir".into(), "/tmp/x".into()]);
        Args::try_parse_from(argv).unwrap().config()
    }

    /// Every field of a run is set away from its default, rendered by the launcher's
    /// `to_worker_args` and parsed back; a field this test does not change fails it, so a new
    /// field cannot skip the flags. Without flags, the worker's defaults are `RunConfig::new`'s.
    #[test]
    fn every_field_round_trips_and_the_defaults_agree() {
        let (model, stage) = (ModelPreset::T5Small, ZeroStage::Z3);
        let base = RunConfig::new(model, stage);
        let c = RunConfig {
            offload: Offload::Optimizer,
            offload_ratio: Some(0.375),
            delayed_update_after: Some(3),
            precision: Precision::Fp16,
            micro_batch: 4,
            seq_len: 96,
            target_len: Some(20),
            grad_accum: 2,
            steps: 7,
            warmup: 1,
            seed: 9,
            data: Some("/data/with space.txt".into()),
            eval_every: Some(3),
            device: DeviceRequest::Cpu,
            // Not a valid run with the rest (this test only parses flags).
            cuda_graph: true,
            optim: OptimConfig { lr: 1.5e-4, beta1: 0.8, beta2: 0.99, eps: 1e-6, weight_decay: 0.0 },
            engine: EngineConfig {
                bucket_mb: 12.5,
                prefetch: 2,
                loss_scale_power: 8,
                hpz: Some(2),
                comm_ctas: Some(8),
                copy_engines: Some(CopyEngines::All),
            },
            ..base.clone()
        };
        let (changed, unchanged) = (serde_json::to_value(&c).unwrap(), serde_json::to_value(&base).unwrap());
        let mut leaves = 0;
        for &name in field_names::<RunConfig>() {
            let inner = match name {
                "model" | "stage" => continue,
                "optim" => field_names::<OptimConfig>(),
                "engine" => field_names::<EngineConfig>(),
                _ => &[],
            };
            if inner.is_empty() {
                assert_ne!(changed[name], unchanged[name], "the test leaves `{name}` at its default");
                leaves += 1;
            }
            for &field in inner {
                assert_ne!(
                    changed[name][field], unchanged[name][field],
                    "the test leaves `{name}.{field}` at its default"
                );
                leaves += 1;
            }
        }
        assert!(leaves >= 24, "only {leaves} fields walked");
        assert_eq!(parse_config(&c), c);

        let bare = Args::try_parse_from(["w", "--model", "t5-small", "--stage", "3", "--log-dir", "d"]).unwrap();
        assert_eq!(bare.config(), base);
    }

    /// The flags the launcher adds for ranks it starts with the environment convention.
    #[test]
    fn launcher_env_rendezvous_parses() {
        let mut argv = vec!["zerobench-worker", "--model", "tiny", "--stage", "0", "--log-dir", "d"];
        argv.extend(zerobench_schema::launch::ENV_RENDEZVOUS_ARGS);
        assert_eq!(Args::try_parse_from(argv).unwrap().rendezvous, Rendezvous::Env);
    }

    #[test]
    fn bad_values_name_the_flag() {
        Args::command().debug_assert();
        let err = Args::try_parse_from(["w", "--model", "gpt5", "--stage", "1", "--log-dir", "d"]).unwrap_err();
        assert!(err.to_string().contains("--model"), "{err}");
        let err = Args::try_parse_from(["w", "--model", "tiny", "--stage", "4", "--log-dir", "d"]).unwrap_err();
        assert!(err.to_string().contains("--stage"), "{err}");
    }

    /// `--torch-profile` records `--profile-step`'s step, or with `--cuda-graph` the first measured
    /// step; alone it is refused, naming both, and `--cuda-graph` still refuses `--profile-step`.
    #[test]
    fn torch_profile_records_the_profiled_or_the_first_replayed_step() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["w", "--model", "tiny", "--stage", "0", "--warmup", "3", "--log-dir", "d"];
            argv.extend(extra);
            Args::try_parse_from(argv)
        };
        assert_eq!(parse(&["--profile-step", "5", "--torch-profile"]).unwrap().torch_profile_step(), Some(5));
        assert_eq!(parse(&["--cuda-graph", "--torch-profile"]).unwrap().torch_profile_step(), Some(3));
        assert_eq!(parse(&["--profile-step", "5"]).unwrap().torch_profile_step(), None);
        let alone = parse(&["--torch-profile"]).unwrap_err().to_string();
        assert!(alone.contains("--profile-step") && alone.contains("--cuda-graph"), "{alone}");
        let both = parse(&["--cuda-graph", "--profile-step", "5"]).unwrap_err().to_string();
        assert!(both.contains("--profile-step") && both.contains("--cuda-graph"), "{both}");
    }
}
