//! Synthetic worker logs, written with the schema's own types so that they are valid by
//! construction: the fixtures of ingest's tests and the input of its benchmark.
//!
//! Figures follow the shape of real runs (forward ≈ 30 % of a step, backward ≈ 55 %, optimizer
//! ≈ 10 %; collectives of each ZeRO stage with the paper's volumes; model-state memory from the
//! ZeRO formulas plus activations; a GPU's power and energy counter), with a seeded jitter so
//! that step times differ between steps and ranks. Nothing here measures anything.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::Path;

use zerobench_schema::log::{
    CommStats, DeviceInfo, End, ErrorClass, ErrorRecord, MemorySample, ModelInfo, Record, RunStatus, Setup, SlurmInfo,
    Start, Step, Versions, SCHEMA_VERSION,
};
use zerobench_schema::memory::{model_state_for, padded_params};
use zerobench_schema::splitmix::SplitMix64;
use zerobench_schema::{RunConfig, ZeroStage};

/// How a synthetic run ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Every rank finishes and writes `end` with status ok.
    Ok,
    /// `rank` runs out of memory in `step`: it writes an `oom` error and `end`; the others are
    /// stopped by the failed collective and write `end` failed.
    Oom { rank: u32, step: u32 },
    /// `rank` fails (a communication error) in `step`; every rank ends failed.
    Failed { rank: u32, step: u32 },
    /// The job is killed after `step` steps: no `end`, and a half-written last line.
    Killed { after: u32 },
}

/// One synthetic run.
#[derive(Debug, Clone)]
pub struct SynthRun {
    pub run_id: String,
    pub config: RunConfig,
    pub world_size: u32,
    pub nodes: u32,
    /// GPU name in the start record (device kind `cuda`).
    pub gpu: String,
    /// Median step time before jitter.
    pub step_ms: f64,
    /// Relative jitter of step times (0.05 = ±5 %).
    pub jitter: f64,
    pub fate: Fate,
    pub seed: u64,
}

impl SynthRun {
    pub fn new(run_id: &str, config: RunConfig, world_size: u32, step_ms: f64) -> Self {
        SynthRun {
            run_id: run_id.to_string(),
            config,
            world_size,
            nodes: 1,
            gpu: "NVIDIA H100 80GB HBM3".into(),
            step_ms,
            jitter: 0.05,
            fate: Fate::Ok,
            seed: 1,
        }
    }

    /// Every record rank `rank` writes, in order.
    pub fn records(&self, rank: u32) -> Vec<Record> {
        let mut out = vec![Record::Start(self.start(rank)), Record::Setup(self.setup(rank))];
        let mut energy = 0.0;
        let last = match self.fate {
            Fate::Ok => self.config.steps,
            Fate::Oom { step, .. } | Fate::Failed { step, .. } => step,
            Fate::Killed { after } => after,
        };
        for step in 0..last.min(self.config.steps) {
            let s = self.step(rank, step, &mut energy);
            out.push(Record::Step(s));
        }
        let end = |status: RunStatus, exit_code: i32| {
            Record::End(End {
                v: SCHEMA_VERSION,
                ts: 0.0,
                rank,
                status,
                steps_completed: last,
                exit_code,
                summary: None,
            })
        };
        match &self.fate {
            Fate::Ok => out.push(end(RunStatus::Ok, 0)),
            Fate::Oom { rank: r, step } => {
                if *r == rank {
                    out.push(Record::Error(ErrorRecord {
                        v: SCHEMA_VERSION,
                        ts: 0.0,
                        rank,
                        class: ErrorClass::Oom,
                        message: "CUDA out of memory. Tried to allocate 2.00 GiB".into(),
                        step: Some(*step),
                        requested_bytes: Some(2 << 30),
                        memory: Some(MemorySample {
                            allocated_bytes: Some(78 << 30),
                            peak_allocated_bytes: Some(79 << 30),
                            reserved_bytes: Some(79 << 30),
                            peak_reserved_bytes: Some(79 << 30),
                            alloc_retries: Some(3),
                            ooms: Some(1),
                            nvml_used_bytes: Some(80 << 30),
                            rss_bytes: 3 << 30,
                        }),
                    }));
                    out.push(end(RunStatus::Oom, 3));
                } else {
                    out.push(end(RunStatus::Failed, 1));
                }
            }
            Fate::Failed { rank: r, step } => {
                if *r == rank {
                    out.push(Record::Error(ErrorRecord {
                        v: SCHEMA_VERSION,
                        ts: 0.0,
                        rank,
                        class: ErrorClass::Comm,
                        message: "NCCL error: remote process exited".into(),
                        step: Some(*step),
                        requested_bytes: None,
                        memory: None,
                    }));
                }
                out.push(end(RunStatus::Failed, 1));
            }
            Fate::Killed { .. } => {}
        }
        out
    }

    /// Writes `rank<N>.jsonl` for every rank in `ranks` into `dir`.
    pub fn write_ranks(&self, dir: &Path, ranks: impl IntoIterator<Item = u32>) -> io::Result<u64> {
        fs::create_dir_all(dir)?;
        let mut bytes = 0;
        for rank in ranks {
            let path = dir.join(format!("rank{rank}.jsonl"));
            let mut w = BufWriter::with_capacity(1 << 20, File::create(&path)?);
            for rec in self.records(rank) {
                let line = serde_json::to_string(&rec).map_err(io::Error::other)?;
                w.write_all(line.as_bytes())?;
                w.write_all(b"\n")?;
                bytes += line.len() as u64 + 1;
            }
            if let Fate::Killed { after } = self.fate {
                // The writer was killed in the middle of the next line.
                let partial = format!(r#"{{"event":"step","v":1,"ts":{after}.5,"rank":{rank},"step":{after},"warm"#);
                w.write_all(partial.as_bytes())?;
                bytes += partial.len() as u64;
            }
            w.flush()?;
        }
        Ok(bytes)
    }

    /// Writes every rank's log into `dir`.
    pub fn write(&self, dir: &Path) -> io::Result<u64> {
        self.write_ranks(dir, 0..self.world_size)
    }

    fn start(&self, rank: u32) -> Start {
        let spec = self.config.model.spec();
        let per_node = self.world_size.div_ceil(self.nodes.max(1));
        Start {
            v: SCHEMA_VERSION,
            ts: 1_767_225_600.0,
            run_id: self.run_id.clone(),
            rank,
            world_size: self.world_size,
            local_rank: rank % per_node,
            local_size: per_node,
            node_rank: rank / per_node,
            nodes: self.nodes,
            rank_source: "env:RANK".into(),
            host: format!("node{}", rank / per_node),
            pid: 1000 + rank,
            config: self.config.clone(),
            model: ModelInfo {
                family: spec.family().into(),
                params: spec.param_count(),
                units: spec.units().len() as u32,
                largest_unit_params: spec.largest_unit_params(),
                train_flops_per_token: Some(spec.train_flops_per_token(self.config.seq_len)),
            },
            device: DeviceInfo {
                kind: "cuda".into(),
                name: self.gpu.clone(),
                index: Some(rank % per_node),
                total_memory_bytes: Some(80 << 30),
                cuda_visible_devices: None,
                threads: 4,
            },
            comm_backend: if self.world_size > 1 { "nccl".into() } else { "none".into() },
            versions: Versions { zerobench: "0.1.0".into(), libtorch: "2.11.0".into(), ..Versions::default() },
            slurm: Some(SlurmInfo { job_id: "4242".into(), ..SlurmInfo::default() }),
        }
    }

    fn state(&self) -> (u64, u64) {
        let spec = self.config.model.spec();
        let world = u64::from(self.world_size);
        let state = model_state_for(&spec, self.config.stage, self.config.precision, world).total();
        let act =
            u64::from(self.config.micro_batch) * u64::from(self.config.seq_len) * spec.d_model() * spec.layers() * 34;
        (state, act)
    }

    fn setup(&self, rank: u32) -> Setup {
        let spec = self.config.model.spec();
        let world = u64::from(self.world_size);
        let ms = model_state_for(&spec, self.config.stage, self.config.precision, world);
        let (state, _) = self.state();
        Setup {
            v: SCHEMA_VERSION,
            ts: 1_767_225_601.0,
            rank,
            model_state: ms,
            model_state_expected: ms,
            padded_params: padded_params(&spec, world),
            buffers_bytes: BTreeMap::from([("grad_bucket".to_string(), 32u64 << 20)]),
            host_state_bytes: 0,
            host_state_expected_bytes: None,
            optimizer: Some("cuda-fused".into()),
            memory: MemorySample {
                allocated_bytes: Some(state),
                peak_allocated_bytes: Some(state),
                reserved_bytes: Some(state + (64 << 20)),
                peak_reserved_bytes: Some(state + (64 << 20)),
                alloc_retries: Some(0),
                ooms: Some(0),
                nvml_used_bytes: Some(state + (600 << 20)),
                rss_bytes: 2 << 30,
            },
            setup_ms: 1234.5,
        }
    }

    fn step(&self, rank: u32, step: u32, energy: &mut f64) -> Step {
        let cfg = &self.config;
        let mut rng = SplitMix64(self.seed ^ (u64::from(rank) << 32) ^ u64::from(step).wrapping_mul(0x9E37_79B9));
        let warm = if step < cfg.warmup { 1.8 } else { 1.0 };
        let step_ms = self.step_ms * warm * (1.0 + self.jitter * (2.0 * rng.unit() - 1.0));
        let n = self.world_size;
        let psi = cfg.model.spec().param_count();
        let b = psi * cfg.precision.param_bytes();
        let units = cfg.model.spec().units().len() as u64;
        let mut comm = BTreeMap::new();
        if n > 1 {
            // The volumes of the ZeRO paper: stage 0 all-reduces the gradients; 1 and 2
            // reduce-scatter them and all-gather the updated parameters; 3 all-gathers the
            // parameters twice (forward and backward) and reduce-scatters the gradients.
            let kinds: &[(&str, u64)] = match cfg.stage {
                ZeroStage::Z0 => &[("all_reduce", 1)],
                ZeroStage::Z1 | ZeroStage::Z2 => &[("reduce_scatter", 1), ("all_gather", 1)],
                ZeroStage::Z3 => &[("all_gather", 2), ("reduce_scatter", 1)],
            };
            for (name, times) in kinds {
                let bytes = b * times;
                let factor = if *name == "all_reduce" { 2.0 } else { 1.0 } * f64::from(n - 1) / f64::from(n);
                let ms = bytes as f64 / 150e9 * factor * 1e3 * (1.0 + 0.1 * rng.unit());
                comm.insert(
                    name.to_string(),
                    CommStats {
                        calls: units * times,
                        bytes,
                        ms,
                        max_bytes: bytes / units,
                        bus_gbps: Some(bytes as f64 / ms / 1e6 * factor),
                    },
                );
            }
        }
        let comm_ms: f64 = comm.values().map(|c| c.ms).sum();
        let (state, act) = self.state();
        let power = 550.0 + 100.0 * rng.unit();
        *energy += power * step_ms / 1e3;
        Step {
            v: SCHEMA_VERSION,
            ts: 1_767_225_602.0 + f64::from(step) * self.step_ms / 1e3,
            rank,
            step,
            warmup: step < cfg.warmup,
            loss: 10.0 / (1.0 + f64::from(step) * 0.1),
            skipped: false,
            loss_scale: None,
            tokens: cfg.tokens_per_step(n),
            samples: cfg.global_batch(n),
            step_ms,
            forward_ms: step_ms * 0.3,
            backward_ms: step_ms * 0.55,
            optimizer_ms: step_ms * 0.1,
            comm_ms,
            exposed_comm_ms: comm_ms * 0.3,
            comm,
            memory: MemorySample {
                allocated_bytes: Some(state),
                peak_allocated_bytes: Some(state + act),
                reserved_bytes: Some(state + act + (256 << 20)),
                peak_reserved_bytes: Some(state + act + (256 << 20)),
                alloc_retries: Some(0),
                ooms: Some(0),
                nvml_used_bytes: Some(state + act + (900 << 20)),
                rss_bytes: (2 << 30) + u64::from(step) * 4096,
            },
            power_w: Some(power),
            energy_j: Some(*energy),
            gpu_util_pct: Some(95),
        }
    }
}

