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

use zerobench_schema::collective::CollectiveKind;
use zerobench_schema::log::{
    CommStats, DeviceInfo, End, ErrorClass, ErrorRecord, Machine, MemorySample, ModelInfo, Record, RunStatus, Setup,
    SlurmInfo, Start, Step, Versions, SCHEMA_VERSION,
};
use zerobench_schema::memory::{
    gather_slot_bytes, model_state_for, padded_params, ModelStateBytes, ParamPath, GATHER_SLOTS_BUFFER,
};
use zerobench_schema::splitmix::SplitMix64;
use zerobench_schema::{ModelSpec, RunConfig, ZeroStage};

/// The build commit every synthetic run names (`start.versions.commit`).
const SYNTHETIC_COMMIT: &str = "5e1f0c0ffee0ddba11cafe0000000000deadbeef";

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
        self.records_with(&self.shape(), rank)
    }

    fn records_with(&self, shape: &Shape, rank: u32) -> Vec<Record> {
        let mut out = vec![Record::Start(self.start(shape, rank)), Record::Setup(self.setup(shape, rank))];
        let mut energy = 0.0;
        let last = match self.fate {
            Fate::Ok => self.config.steps,
            Fate::Oom { step, .. } | Fate::Failed { step, .. } => step,
            Fate::Killed { after } => after,
        };
        for step in 0..last.min(self.config.steps) {
            out.push(Record::Step(self.step(shape, rank, step, &mut energy)));
        }
        // The failing rank reports why; then every rank ends, unless the job was killed.
        let failure = match self.fate {
            Fate::Oom { rank: r, step } if r == rank => Some((
                step,
                ErrorClass::Oom,
                "CUDA out of memory. Tried to allocate 2.00 GiB",
                Some(2 << 30),
                Some(MemorySample {
                    allocated_bytes: Some(78 << 30),
                    peak_allocated_bytes: Some(79 << 30),
                    reserved_bytes: Some(79 << 30),
                    peak_reserved_bytes: Some(79 << 30),
                    alloc_retries: Some(3),
                    ooms: Some(1),
                    nvml_used_bytes: Some(80 << 30),
                    rss_bytes: 3 << 30,
                }),
            )),
            Fate::Failed { rank: r, step } if r == rank => {
                Some((step, ErrorClass::Comm, "NCCL error: remote process exited", None, None))
            }
            _ => None,
        };
        if let Some((step, class, message, requested_bytes, memory)) = failure {
            out.push(Record::Error(ErrorRecord {
                v: SCHEMA_VERSION,
                ts: 0.0,
                rank,
                class,
                message: message.into(),
                step: Some(step),
                requested_bytes,
                memory,
            }));
        }
        let end = match self.fate {
            Fate::Ok => Some((RunStatus::Ok, 0)),
            Fate::Oom { rank: r, .. } if r == rank => Some((RunStatus::Oom, 3)),
            Fate::Oom { .. } | Fate::Failed { .. } => Some((RunStatus::Failed, 1)),
            Fate::Killed { .. } => None,
        };
        if let Some((status, exit_code)) = end {
            out.push(Record::End(End {
                v: SCHEMA_VERSION,
                ts: 0.0,
                rank,
                status,
                steps_completed: last,
                exit_code,
                summary: None,
            }));
        }
        out
    }

    /// Writes `rank<N>.jsonl` for every rank in `ranks` into `dir`.
    pub fn write_ranks(&self, dir: &Path, ranks: impl IntoIterator<Item = u32>) -> io::Result<u64> {
        fs::create_dir_all(dir)?;
        let shape = self.shape();
        let mut bytes = 0;
        for rank in ranks {
            let path = dir.join(format!("rank{rank}.jsonl"));
            let mut w = BufWriter::with_capacity(1 << 20, File::create(&path)?);
            for rec in self.records_with(&shape, rank) {
                let line = serde_json::to_string(&rec).map_err(io::Error::other)?;
                w.write_all(line.as_bytes())?;
                w.write_all(b"\n")?;
                bytes += line.len() as u64 + 1;
            }
            if let Fate::Killed { after } = self.fate {
                // The writer was killed in the middle of the next line.
                let partial = format!(
                    r#"{{"event":"step","v":{SCHEMA_VERSION},"ts":{after}.5,"rank":{rank},"step":{after},"warm"#
                );
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

    /// What every record derives from the model and the configuration.
    fn shape(&self) -> Shape {
        let cfg = &self.config;
        let spec = cfg.model.spec();
        let world = u64::from(self.world_size);
        let model_state = model_state_for(&spec, cfg.stage, cfg.precision, world);
        Shape {
            units: spec.units().len() as u64,
            param_bytes: spec.param_count() * cfg.precision.param_bytes(),
            padded_params: padded_params(&spec, world),
            model_state,
            activation_bytes: u64::from(cfg.micro_batch) * u64::from(cfg.seq_len) * spec.d_model() * spec.layers() * 34,
            spec,
        }
    }

    fn start(&self, shape: &Shape, rank: u32) -> Start {
        let spec = &shape.spec;
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
            machine: Some(Machine { cpu_model: "Synthetic CPU".into(), cpus: 32, memory_bytes: Some(256 << 30) }),
            pid: 1000 + rank,
            config: self.config.clone(),
            model: ModelInfo {
                family: spec.family().into(),
                params: spec.param_count(),
                units: shape.units as u32,
                largest_unit_params: spec.largest_unit_params(),
                train_flops_per_token: Some(self.config.train_flops_per_token()),
            },
            device: DeviceInfo {
                kind: "cuda".into(),
                name: self.gpu.clone(),
                index: Some(rank % per_node),
                total_memory_bytes: Some(80 << 30),
                cuda_visible_devices: None,
                threads: 4,
                launch_cpu: None,
            },
            comm_backend: if self.world_size > 1 { "nccl".into() } else { "none".into() },
            versions: Versions {
                zerobench: "0.1.0".into(),
                commit: Some(SYNTHETIC_COMMIT.into()),
                libtorch: "2.11.0".into(),
                ..Versions::default()
            },
            slurm: Some(SlurmInfo { job_id: "4242".into(), ..SlurmInfo::default() }),
        }
    }

    /// A staging bucket, and where the engine shards the parameters, its gather slots (what
    /// tells a sharded run's log apart).
    fn buffers(&self) -> BTreeMap<String, u64> {
        let cfg = &self.config;
        let world = u64::from(self.world_size);
        let mut b = BTreeMap::from([("grad_buckets".to_string(), 32u64 << 20)]);
        if ParamPath::of(cfg.stage, world, cfg.offload) == ParamPath::Sharded {
            let slots = gather_slot_bytes(&cfg.model.spec(), cfg.precision, &cfg.engine, world);
            b.insert(GATHER_SLOTS_BUFFER.to_string(), slots);
        }
        b
    }

    fn setup(&self, shape: &Shape, rank: u32) -> Setup {
        let ms = shape.model_state;
        let state = ms.total();
        Setup {
            v: SCHEMA_VERSION,
            ts: 1_767_225_601.0,
            rank,
            model_state: ms,
            model_state_expected: ms,
            padded_params: shape.padded_params,
            buffers_bytes: self.buffers(),
            host_state_bytes: 0,
            host_state_expected_bytes: None,
            host_state_setup_ms: None,
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

    fn step(&self, shape: &Shape, rank: u32, step: u32, energy: &mut f64) -> Step {
        let cfg = &self.config;
        let mut rng = SplitMix64(self.seed ^ (u64::from(rank) << 32) ^ u64::from(step).wrapping_mul(0x9E37_79B9));
        let warm = if step < cfg.warmup { 1.8 } else { 1.0 };
        let step_ms = self.step_ms * warm * (1.0 + self.jitter * (2.0 * rng.unit() - 1.0));
        let n = self.world_size;
        let (b, units) = (shape.param_bytes, shape.units);
        let mut comm = BTreeMap::new();
        if n > 1 {
            // The volumes of the ZeRO paper: stage 0 all-reduces the gradients; 1 and 2
            // reduce-scatter them and all-gather the updated parameters; 3 all-gathers the
            // parameters twice (forward and backward) and reduce-scatters the gradients.
            use CollectiveKind::{AllGather, AllReduce, ReduceScatter};
            let kinds: &[(CollectiveKind, u64)] = match cfg.stage {
                ZeroStage::Z0 => &[(AllReduce, 1)],
                ZeroStage::Z1 | ZeroStage::Z2 => &[(ReduceScatter, 1), (AllGather, 1)],
                ZeroStage::Z3 => &[(AllGather, 2), (ReduceScatter, 1)],
            };
            for (kind, times) in kinds {
                let bytes = b * times;
                let factor = kind.bus_factor(n as usize).expect("a collective over several ranks");
                let ms = bytes as f64 / 150e9 * factor * 1e3 * (1.0 + 0.1 * rng.unit());
                comm.insert(
                    kind.name().to_string(),
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
        let (state, act) = (shape.model_state.total(), shape.activation_bytes);
        let power = 550.0 + 100.0 * rng.unit();
        *energy += power * step_ms / 1e3;
        Step {
            v: SCHEMA_VERSION,
            ts: 1_767_225_602.0 + f64::from(step) * self.step_ms / 1e3,
            rank,
            step,
            warmup: step < cfg.warmup,
            loss: Some(10.0 / (1.0 + f64::from(step) * 0.1)),
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
            other_ms: (step_ms * 0.05 - comm_ms * 0.3).max(0.0),
            overhead_ms: 0.0,
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

/// What every record of a synthetic run derives from its model and configuration, computed once
/// per run rather than per line.
struct Shape {
    spec: ModelSpec,
    units: u64,
    /// Ψ × bytes per parameter on the device.
    param_bytes: u64,
    padded_params: u64,
    model_state: ModelStateBytes,
    /// Activations of one micro-batch: 34 bytes per token, layer and unit of model width.
    activation_bytes: u64,
}

#[cfg(test)]
mod tests {
    use zerobench_schema::ModelPreset;

    use super::*;

    /// `write` answers the bytes it wrote, the half line of a killed run included.
    #[test]
    fn the_bytes_written_are_counted() {
        let d = tempfile::tempdir().unwrap();
        let cfg = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z1);
        for (i, fate) in [Fate::Ok, Fate::Killed { after: 2 }].into_iter().enumerate() {
            let dir = d.path().join(i.to_string());
            let bytes = SynthRun { fate, ..SynthRun::new("r", cfg.clone(), 2, 10.0) }.write(&dir).unwrap();
            let on_disk: u64 =
                (0..2).map(|r| std::fs::metadata(dir.join(format!("rank{r}.jsonl"))).unwrap().len()).sum();
            assert_eq!(bytes, on_disk);
        }
    }

    /// The start record carries the FLOPs per token the worker writes: for T5, at the target
    /// length of the configuration (a quarter of the input when it names none).
    #[test]
    fn start_record_counts_flops_as_the_worker_does() {
        let mut cfg = RunConfig::new(ModelPreset::T5Small, ZeroStage::Z2);
        for target_len in [None, Some(40)] {
            cfg.target_len = target_len;
            let Record::Start(start) = &SynthRun::new("t5", cfg.clone(), 2, 10.0).records(0)[0] else {
                panic!("the first record is not start")
            };
            assert_eq!(start.model.train_flops_per_token, Some(cfg.train_flops_per_token()));
        }
    }

    /// The figures the module doc states, which ingest's tests read back: warm-up steps 1.8×
    /// slower, steady ones within the jitter, one timestamp per step time, collectives at a bus
    /// bandwidth of 150 GB/s less up to 10 %, the memory margins above model state, and an OOM
    /// reported by the failing rank alone while the others end failed.
    #[test]
    fn synthetic_figures_follow_their_stated_shape() {
        const MIB: u64 = 1 << 20;
        let mut cfg = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z3);
        (cfg.steps, cfg.warmup) = (6, 2);
        let run = SynthRun { fate: Fate::Oom { rank: 1, step: 4 }, ..SynthRun::new("r", cfg.clone(), 2, 100.0) };
        for rank in 0..2 {
            let (mut steps, mut errors) = (0, 0);
            for rec in run.records(rank) {
                match rec {
                    Record::Start(s) => {
                        assert_eq!(s.comm_backend, "nccl");
                        assert!(!s.versions.zerobench.is_empty() && !s.versions.libtorch.is_empty());
                        assert!(s.slurm.as_ref().is_some_and(|j| !j.job_id.is_empty()));
                    }
                    Record::Setup(s) => {
                        let state = s.model_state.total();
                        assert_eq!(s.memory.reserved_bytes, Some(state + 64 * MIB));
                        assert_eq!(s.memory.peak_reserved_bytes, s.memory.reserved_bytes);
                        assert!(s.buffers_bytes.values().all(|b| *b > 0));
                        let sharded = run.config.stage == ZeroStage::Z3 && run.world_size > 1;
                        assert_eq!(s.buffers_bytes.contains_key(GATHER_SLOTS_BUFFER), sharded);
                        assert_eq!(s.memory.nvml_used_bytes, Some(state + 600 * MIB));
                        assert_eq!(s.memory.rss_bytes, 2 << 30);
                    }
                    Record::Step(s) => {
                        steps += 1;
                        assert_eq!(s.ts, 1_767_225_602.0 + f64::from(s.step) * 0.1);
                        assert_eq!(s.warmup, s.step < 2);
                        // The five phases are the step (exposed communication is small here).
                        let phases = s.forward_ms + s.backward_ms + s.optimizer_ms + s.exposed_comm_ms + s.other_ms;
                        assert!((phases - s.step_ms).abs() < 1e-9 * s.step_ms, "{phases} of {}", s.step_ms);
                        let median = if s.step < 2 { 180.0 } else { 100.0 };
                        assert!((s.step_ms / median - 1.0).abs() <= 0.05, "step {}: {} ms", s.step, s.step_ms);
                        assert_eq!(s.comm.len(), 2);
                        for c in s.comm.values() {
                            let bus = c.bus_gbps.unwrap();
                            assert!(bus > 150.0 / 1.1 && bus <= 150.0, "{bus} GB/s");
                            // The largest call moves one unit's share.
                            assert!(c.max_bytes >= c.bytes / c.calls && c.max_bytes <= c.bytes, "{c:?}");
                        }
                        let peak = s.memory.peak_allocated_bytes.unwrap();
                        assert_eq!(s.memory.reserved_bytes, Some(peak + 256 * MIB));
                        assert_eq!(s.memory.peak_reserved_bytes, s.memory.reserved_bytes);
                        assert!(s.memory.rss_bytes >= 2 << 30);
                    }
                    Record::Error(e) => {
                        errors += 1;
                        assert_eq!((e.rank, e.class, e.step), (1, ErrorClass::Oom, Some(4)));
                        // At the device's limit: more allocated than the 2 GiB it asked for is free.
                        let m = e.memory.unwrap();
                        let allocated = m.allocated_bytes.unwrap();
                        assert!(allocated > 70 << 30 && e.requested_bytes == Some(2 << 30), "{allocated}");
                        assert!(
                            m.reserved_bytes >= m.peak_allocated_bytes && m.peak_allocated_bytes >= Some(allocated)
                        );
                        assert!(m.peak_reserved_bytes >= m.reserved_bytes);
                    }
                    Record::End(e) => {
                        let want = if rank == 1 { (RunStatus::Oom, 3) } else { (RunStatus::Failed, 1) };
                        assert_eq!((e.status, e.exit_code, e.steps_completed), (want.0, want.1, 4));
                    }
                    Record::Profile(_) | Record::Eval(_) => panic!("not written by synth"),
                }
            }
            assert_eq!((steps, errors), (4, u32::from(rank == 1)));
        }
        // Two nodes of two ranks: each rank's place on its node, and a process of its own.
        let two_nodes = SynthRun { nodes: 2, ..SynthRun::new("n", cfg.clone(), 4, 100.0) };
        let starts: Vec<Start> = (0..4)
            .map(|rank| match &two_nodes.records(rank)[0] {
                Record::Start(s) => s.clone(),
                _ => panic!("no start"),
            })
            .collect();
        for (rank, s) in (0u32..).zip(&starts) {
            assert_eq!(
                (s.local_rank, s.device.index, s.node_rank, s.local_size),
                (rank % 2, Some(rank % 2), rank / 2, 2)
            );
        }
        assert_eq!(starts.iter().map(|s| s.pid).collect::<std::collections::BTreeSet<_>>().len(), 4);
        // A failed rank: its error alone, every rank's end failed.
        let failed = SynthRun { fate: Fate::Failed { rank: 0, step: 3 }, ..run.clone() };
        for rank in 0..2 {
            let records = failed.records(rank);
            let errors =
                records.iter().filter(|r| matches!(r, Record::Error(e) if e.class == ErrorClass::Comm)).count();
            assert_eq!(errors, usize::from(rank == 0), "rank {rank}");
            assert!(matches!(records.last(), Some(Record::End(e)) if e.status == RunStatus::Failed));
        }
        let Record::Start(alone) = &SynthRun::new("one", cfg, 1, 100.0).records(0)[0] else { panic!("no start") };
        assert_eq!(alone.comm_backend, "none");
    }
}
