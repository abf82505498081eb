//! The sweep matrix expanded into runs: each with a stable id, its worker configuration, the
//! ranks it needs and the ZeRO model-state memory per GPU.
//!
//! Run id grammar (stable: the same spec gives the same ids, and adding values to an axis never
//! renames existing runs):
//!
//! ```text
//! id        = model "_z" stage "_" offload [ ratio ] "_mb" micro_batch "_" nodes "x" ranks_per_node [ "_" precision ]
//!             { "_" knob }
//! offload   = "offnone" | "offopt" | "offparams"      (none, optimizer, optimizer+params)
//! ratio     = "_r" digits [ "p" digits ]               (offload_ratio, "." written "p"; only when given)
//! precision = "fp16" | "fp32"                         (bf16, the default, is left out)
//! knob      = "ga" n | "hpz" n | "pf" n | "bk" digits [ "p" digits ]
//!             (grad_accum, hpz, prefetch, bucket_mb, in this order; only for the axes a block gives)
//! ```
//!
//! e.g. `gpt2-xl_z3_offopt_mb4_2x4`. Ids contain only `[a-z0-9_-]`, so they are safe as folder
//! names, Slurm job names and shell words.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use zerobench_schema::memory::{engine_buffer_bytes, host_params, model_state_split, padded_params, ModelStateBytes};
use zerobench_schema::traffic::step_traffic;
use zerobench_schema::{ConfigError, ModelPreset, Offload, Precision, RunConfig, ZeroStage};

use crate::select::{HostSlots, Resources};
use crate::spec::{axis_or, sweep_axis_of, Knob, Spec, SpecError, SweepBlock, MAX_RUNS};

/// Whether a run's model states and the engine's buffers fit the declared GPU memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "fit", rename_all = "snake_case")]
pub enum Fit {
    /// No GPU memory declared, or a CPU run.
    Unknown,
    Fits {
        need_bytes: u64,
        have_bytes: u64,
    },
    TooBig {
        need_bytes: u64,
        have_bytes: u64,
    },
}

/// The collectives of one optimizer step on one rank (`zerobench_schema::traffic`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedComm {
    /// Bytes per collective, by the key a step's `comm` map uses (the full array's size).
    pub bytes: BTreeMap<String, u64>,
    /// What the rank sends over its links in a ring: each array times its bus factor. Over the
    /// bus bandwidth the collectives reach, the step's communication time without overlap.
    pub wire_bytes: u64,
}

/// One run of the sweep.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    pub id: String,
    pub config: RunConfig,
    pub nodes: u32,
    pub ranks_per_node: u32,
    /// GPUs requested per node (0 on CPU nodes).
    pub gpus_per_node: u32,
    pub model_params: u64,
    /// Model states per rank on the device, as the ZeRO formulas give them (with zerobench's
    /// padding and the offload setting; `zerobench_schema::memory::model_state_split`).
    pub model_state: ModelStateBytes,
    /// Their total on the GPU, and what offload keeps in host memory.
    pub device_state_bytes: u64,
    /// The engine's persistent GPU buffers (gradient buckets, gather slots;
    /// `zerobench_schema::memory::engine_buffer_bytes`).
    pub buffer_bytes: u64,
    pub host_state_bytes: u64,
    /// GPU offload runs: the offload ratio that balances the host's update against the GPU's
    /// work and fits the GPU (see `propose_offload_ratio`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposed_offload_ratio: Option<f64>,
    /// Empty in a `run.json` rendered before zerobench planned communication.
    #[serde(default)]
    pub comm: PlannedComm,
    pub fit: Fit,
    /// Things to know that do not stop the run from being rendered.
    pub warnings: Vec<String>,
    /// The hosts and slots it runs on, when the cluster names a hostfile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Resources>,
}

impl Run {
    /// Nodes × ranks per node; a planned run's product fits a u32 (checked when it was planned).
    pub fn world_size(&self) -> u32 {
        self.nodes.saturating_mul(self.ranks_per_node)
    }

    /// Seconds a step's collectives take if none overlaps computation and each reaches the given
    /// bus bandwidth (GB/s, nccl-tests' busbw): `inter_node` for collectives over all ranks of a
    /// run on more than one node, `intra_node` for the rest (one node, or hpZ's groups, which are
    /// nodes).
    pub fn comm_seconds(&self, intra_node: f64, inter_node: f64) -> f64 {
        let (world, hpz) = (self.world_size(), self.config.engine.hpz);
        step_traffic(&self.config, world)
            .wire(world, hpz)
            .map(|(key, bytes)| {
                let gbps = if self.nodes > 1 && !key.group { inter_node } else { intra_node };
                bytes / (gbps * 1e9)
            })
            .sum()
    }

    pub fn gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
}

/// A spec with its runs.
#[derive(Debug)]
pub struct Plan {
    pub spec: Spec,
    pub runs: Vec<Run>,
}

/// The id of a run (see the module docs for the grammar).
pub fn run_id(c: &RunConfig, nodes: u32, ranks_per_node: u32) -> String {
    let off = match c.offload {
        Offload::None => "offnone",
        Offload::Optimizer => "offopt",
        Offload::OptimizerParams => "offparams",
    };
    let ratio = c.offload_ratio.map_or_else(String::new, |r| format!("_r{}", r.to_string().replace('.', "p")));
    let mut id = format!("{}_z{}_{}{ratio}_mb{}_{}x{}", c.model, c.stage, off, c.micro_batch, nodes, ranks_per_node);
    if c.precision != Precision::Bf16 {
        id.push('_');
        id.push_str(c.precision.as_str());
    }
    id
}

impl Plan {
    /// Takes out the runs whose model states and engine buffers do not fit the declared GPU
    /// memory (`Fit::TooBig`), for the commands that render only what can run; `plan` shows them
    /// and why.
    pub fn take_unfit(&mut self) -> Vec<Run> {
        let (unfit, fit): (Vec<Run>, Vec<Run>) =
            std::mem::take(&mut self.runs).into_iter().partition(|r| matches!(r.fit, Fit::TooBig { .. }));
        self.runs = fit;
        unfit
    }

    /// Expands every sweep block, validating each run as the worker would.
    pub fn build(spec: Spec) -> Result<Plan, SpecError> {
        let mut runs: Vec<Run> = Vec::new();
        // Run id → the block that produced it, to refuse a run that two blocks produce.
        let mut blocks: HashMap<String, usize> = HashMap::new();
        for (b, block) in spec.sweep.iter().enumerate() {
            expand_block(&spec, b, block, &mut runs, &mut blocks)?;
        }
        Ok(Plan { spec, runs })
    }
}

fn expand_block(
    spec: &Spec,
    b: usize,
    block: &SweepBlock,
    runs: &mut Vec<Run>,
    blocks: &mut HashMap<String, usize>,
) -> Result<(), SpecError> {
    let models = block.models.0.clone();
    let stages = axis_or(block.stages.as_ref(), &zerobench_schema::ZeroStage::ALL);
    let offloads = axis_or(block.offload.as_ref(), &[Offload::None]);
    let ratios: Vec<Option<f64>> = axis_or(block.offload_ratio.as_ref(), &[]).into_iter().map(Some).collect();
    // Runs without offload take no ratio (one run, not one per ratio).
    let ratios_for = |o: Offload| if o == Offload::None || ratios.is_empty() { vec![None] } else { ratios.clone() };
    let precisions = axis_or(block.precision.as_ref(), &[Precision::Bf16]);
    let micro = axis_or(block.micro_batches.as_ref(), &[1]);
    // The engine settings the block varies: every combination of one value per axis.
    let knob_sets = block.knob_axes().into_iter().fold(vec![Vec::new()], |sets: Vec<Vec<Knob>>, axis| {
        sets.iter().flat_map(|set| axis.iter().map(move |k| [set.clone(), vec![k.clone()]].concat())).collect()
    });
    let nodes = spec.nodes_axis(block);
    // sbatch refuses a --nodelist that names more nodes than --nodes asks for.
    if let Some(expr) = &spec.cluster.nodelist {
        let named = crate::hostlist::expand(expr).map(|h| h.len()).unwrap_or(0);
        if let Some(&fewer) = nodes.iter().find(|&&n| (n as usize) < named) {
            return Err(spec.error_at(
                "cluster.nodelist",
                format!(
                    "names {named} nodes, but runs of this sweep use {fewer}; sbatch refuses a --nodelist of more nodes than the job asks for: give nodes of at least {named}, or a smaller nodelist"
                ),
            ));
        }
    }
    let ranks = spec.ranks_axis(block);
    let count = [
        models.len(),
        stages.len(),
        offloads.len(),
        ratios.len().max(1),
        precisions.len(),
        micro.len(),
        nodes.len(),
        ranks.len(),
        knob_sets.len(),
    ]
    .iter()
    .fold(1usize, |acc, &n| acc.saturating_mul(n));
    if count.saturating_add(runs.len()) > MAX_RUNS {
        return Err(
            spec.error_at(&spec.sweep_key(b, "models"), format!("the sweep expands to more than {MAX_RUNS} runs"))
        );
    }
    // The worker block and the knobs set no swept field, so they are applied once per model,
    // offload and knob combination (a serde round trip), not once per run.
    let mut settled: HashMap<(ModelPreset, Offload, usize), RunConfig> = HashMap::new();
    for &model in &models {
        for &offload in &offloads {
            for (i, knobs) in knob_sets.iter().enumerate() {
                let base = RunConfig { offload, ..RunConfig::new(model, ZeroStage::Z0) };
                settled.insert((model, offload, i), apply_settings(spec, b, &base, knobs)?);
            }
        }
    }
    for &model in &models {
        for &stage in &stages {
            for (offload, ratio) in offloads.iter().flat_map(|&o| ratios_for(o).into_iter().map(move |r| (o, r))) {
                for &precision in &precisions {
                    for &mb in &micro {
                        for &n in &nodes {
                            for &r in &ranks {
                                for (i, knobs) in knob_sets.iter().enumerate() {
                                    let mut c = settled[&(model, offload, i)].clone();
                                    c.stage = stage;
                                    c.offload_ratio = ratio;
                                    c.precision = precision;
                                    c.micro_batch = mb;
                                    let run = make_run(spec, b, c, knobs, n, r)?;
                                    if let Some(prev) = blocks.insert(run.id.clone(), b) {
                                        return Err(spec.error_at(
                                            &format!("sweep[{b}]"),
                                            format!("run {} is also produced by sweep block {prev}", run.id),
                                        ));
                                    }
                                    runs.push(run);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// The spec's fixed worker settings, then sweep block `b`'s `knobs`, over a run's configuration:
/// `target_len` for the encoder-decoder runs only, `delayed_update_after` for the offloaded runs
/// only.
fn apply_settings(spec: &Spec, b: usize, c: &RunConfig, knobs: &[Knob]) -> Result<RunConfig, SpecError> {
    let encoder_decoder = c.model.spec().is_encoder_decoder();
    let offloaded = c.offload != Offload::None;
    let skip = |key: &str| match key {
        "target_len" => !encoder_decoder,
        "delayed_update_after" => !offloaded,
        _ => false,
    };
    spec.worker.apply(c, skip, knobs).map_err(|e| {
        let key = if knobs.iter().any(|k| k.field == e.key) {
            spec.sweep_key(b, &e.key)
        } else {
            format!("worker.{}", e.key)
        };
        spec.error_at(&key, e.message)
    })
}

/// The spec key a worker flag comes from, for placing `RunConfig::validate`'s errors: the sweep
/// axis that set it (`knobs`), else the worker key.
fn key_of_flag(spec: &Spec, b: usize, e: &ConfigError, knobs: &[Knob]) -> String {
    let field = e.field.replace('-', "_");
    if knobs.iter().any(|k| k.field == field) {
        return spec.sweep_key(b, &field);
    }
    match field.as_str() {
        "delayed_update" => "worker.delayed_update_after".to_string(),
        "world_size" => spec.sweep_key(b, "nodes"),
        f => match sweep_axis_of(f) {
            Some(axis) => spec.sweep_key(b, axis),
            None => format!("worker.{f}"),
        },
    }
}

/// The longest run id: a folder name with room for what is put beside it (`-<job>.out`, the
/// `.attempts` names) under the usual 255-byte limit of a file name.
pub const MAX_RUN_ID: usize = 200;

fn make_run(
    spec: &Spec,
    b: usize,
    config: RunConfig,
    knobs: &[Knob],
    nodes: u32,
    ranks_per_node: u32,
) -> Result<Run, SpecError> {
    let mut id = run_id(&config, nodes, ranks_per_node);
    for k in knobs {
        id.push('_');
        id.push_str(k.id_part());
    }
    // The id names the run's folder, its Slurm job and its output file: a name past what a file
    // system takes (a `bucket_mb: [1e-300]` spelled out in full) failed at render with "File name
    // too long" and no place in the spec.
    if id.len() > MAX_RUN_ID {
        let block = if spec.sweep.len() > 1 { spec.sweep_key(b, "") } else { "sweep".to_string() };
        let why = format!("run {}…: its id is {} characters, more than {MAX_RUN_ID}", &id[..40], id.len());
        return Err(spec.error_at(block.trim_end_matches('.'), why));
    }
    // Both are the spec's to choose: a product past u32 wrapped (4294967295 × 4294967295 ranks
    // planned as 1), so it is refused at the block's nodes.
    let Some(world) = nodes.checked_mul(ranks_per_node) else {
        let why =
            format!("run {id}: {nodes} nodes × {ranks_per_node} ranks per node is more ranks than a run can have");
        return Err(spec.error_at(&spec.sweep_key(b, "nodes"), why));
    };
    let mut warnings = Vec::new();
    let fail = |e: &ConfigError| spec.error_at(&key_of_flag(spec, b, e, knobs), format!("run {id}: {e}"));
    config.validate(Some(world)).map_err(|e| fail(&e))?;
    if config.engine.copy_engines.is_some() && nodes > 1 {
        let why =
            format!("run {id}: copy engines move data between the GPUs of one host; this run spans {nodes} nodes");
        return Err(spec.error_at("worker.copy_engines", why));
    }
    let model = config.model.spec();
    let split_at = |share: f64| {
        model_state_split(
            config.stage,
            config.precision,
            config.offload,
            config.grad_accum,
            padded_params(&model, u64::from(world)),
            host_params(&model, u64::from(world), share),
            u64::from(world),
        )
    };
    let split = split_at(config.host_share());
    let host_state_bytes = split.host_bytes;
    let device_state_bytes = split.device.total();
    let buffer_bytes =
        engine_buffer_bytes(&model, config.stage, config.precision, config.offload, &config.engine, u64::from(world));
    let need = device_state_bytes + buffer_bytes;
    let gpu_memory = spec.cluster.gpu_memory.map(|m| m.0);
    let proposed_offload_ratio = (config.offload != Offload::None && spec.cluster.gpus_per_node > 0)
        .then(|| {
            propose_offload_ratio(
                &config,
                world,
                ranks_per_node,
                |share| split_at(share).device.total() + buffer_bytes,
                gpu_memory,
            )
        })
        .flatten();
    let traffic = step_traffic(&config, world);
    let comm = PlannedComm {
        bytes: traffic.bytes.iter().map(|(k, b)| (k.name().to_string(), *b)).collect(),
        wire_bytes: traffic.wire_bytes(world, config.engine.hpz),
    };
    let gpus_per_node = if spec.cluster.gpus_per_node > 0 { ranks_per_node } else { 0 };
    let fit = match (spec.cluster.gpu_memory, gpus_per_node) {
        (Some(have), g) if g > 0 => {
            if need <= have.0 {
                Fit::Fits { need_bytes: need, have_bytes: have.0 }
            } else {
                Fit::TooBig { need_bytes: need, have_bytes: have.0 }
            }
        }
        _ => Fit::Unknown,
    };
    if let Fit::TooBig { need_bytes, have_bytes } = fit {
        warnings.push(format!(
            "model states and engine buffers need {} per GPU, more than cluster.gpu_memory {}",
            crate::values::human_bytes(need_bytes),
            crate::values::human_bytes(have_bytes)
        ));
    }
    // Every rank of a node holds its own offloaded states in that node's memory.
    let host_need = host_state_bytes * u64::from(ranks_per_node);
    let cpus = u64::from(ranks_per_node) * u64::from(spec.cluster.cpus_per_task);
    let asked = match (spec.cluster.mem, spec.cluster.mem_per_cpu) {
        (Some(m), _) => Some((m.0, "cluster.mem".to_string())),
        (None, Some(m)) => Some((m.0.saturating_mul(cpus), format!("cluster.mem_per_cpu × {cpus} CPUs"))),
        (None, None) => None,
    };
    if let Some((have, what)) = asked.filter(|(have, _)| host_need > *have) {
        warnings.push(format!(
            "offloaded states need {} of host memory per node ({} ranks), more than {what} {}",
            crate::values::human_bytes(host_need),
            ranks_per_node,
            crate::values::human_bytes(have)
        ));
    }
    let hosts = spec.resources.as_ref().map(|res| Resources {
        hosts: res.hosts[..nodes as usize]
            .iter()
            .map(|h| HostSlots { host: h.host.clone(), slots: h.slots[..ranks_per_node as usize].to_vec() })
            .collect(),
    });
    Ok(Run {
        id,
        model_params: model.param_count(),
        config,
        nodes,
        ranks_per_node,
        gpus_per_node,
        model_state: split.device,
        device_state_bytes,
        buffer_bytes,
        host_state_bytes,
        proposed_offload_ratio,
        comm,
        fit,
        warnings,
        hosts,
    })
}

/// Host AdamW over pinned memory, in bytes of state per second: 158 GB/s effective at
/// [`ADAMW_BYTES_PER_PARAM`] (PyTorch's fused CPU AdamW, fp32, 124M parameters, 32 threads of the
/// 2×H200 host; the project's GPU-host measurements of 2026-11-21). zerobench's Rust AdamW is of
/// the same order on that host.
pub const HOST_ADAMW_BYTES_PER_S: f64 = 158e9;
/// Pinned host-device copies, each way: 54 GB/s (the same host, 16 MiB to 1 GiB).
pub const PINNED_COPY_BYTES_PER_S: f64 = 54e9;
/// The GPU's fused AdamW: 3.48 TB/s effective at [`ADAMW_BYTES_PER_PARAM`] (one H200, same day).
pub const GPU_ADAMW_BYTES_PER_S: f64 = 3.48e12;
/// What one AdamW update reads and writes per parameter in bf16: fp32 master, m and v read and
/// written (24) and the gradient and parameter copy (2 + 2).
pub const ADAMW_BYTES_PER_PARAM: f64 = 28.0;
/// Training FLOP/s zerobench reaches on one GPU: stage 0, gpt2-xl, micro-batch 4, sequence 1024,
/// bf16 on one H200 ran 45.8k tokens/s at 1.03e10 FLOP per token (2026-11-23).
pub const GPU_TRAIN_FLOP_PER_S: f64 = 4.7e14;

/// Twin-Flow's ratio for an offloaded run: the host's share R of each rank's optimizer
/// partition (Ψ/N elements) at which the host's work, R × (AdamW + copying the gradient down and
/// the parameters up), takes as long as the GPU's window beside it plus AdamW on the other 1 − R;
/// the ranks of a node update at once on its cores and memory, so the host's AdamW takes as long
/// as `ranks_per_node` partitions' (the copies run on each GPU's own link);
/// then the smallest share of whole units ([`host_params`]) at least that large whose device
/// memory (`device_need` of the share) fits `gpu_memory` when declared. `None` when even
/// everything on the host does not fit. An estimate from the rates above: measure around it.
///
/// The window: with the delayed update the host's update of step t runs beside step t + 1's
/// forward and backward, the whole compute. In exact steps the host's units (the last ones, whose
/// gradients land first) are updated from the backward on, and the next forward waits for them;
/// measured on gpt2-xl (one H100, a 16-core host), exact steps stay near the bound up to about
/// the share whose update takes as long as the backward ([`BACKWARD_SHARE`](zerobench_schema::models::BACKWARD_SHARE) of the compute) and
/// the GPU's update, and grow past it, where delayed steps still hold.
fn propose_offload_ratio(
    config: &RunConfig,
    world: u32,
    ranks_per_node: u32,
    device_need: impl Fn(f64) -> u64,
    gpu_memory: Option<u64>,
) -> Option<f64> {
    let model = config.model.spec();
    let partition = padded_params(&model, u64::from(world)) as f64 / f64::from(world);
    let copies = 2.0 * config.precision.param_bytes() as f64;
    let adamw = f64::from(ranks_per_node) * ADAMW_BYTES_PER_PARAM / HOST_ADAMW_BYTES_PER_S;
    let host = partition * (adamw + copies / PINNED_COPY_BYTES_PER_S);
    let gpu_update = partition * ADAMW_BYTES_PER_PARAM / GPU_ADAMW_BYTES_PER_S;
    let tokens = config.tokens_per_step(world) as f64 / f64::from(world);
    let compute = tokens * config.train_flops_per_token() / GPU_TRAIN_FLOP_PER_S;
    let window = if config.delayed_update_after.is_some() {
        compute
    } else {
        zerobench_schema::models::BACKWARD_SHARE * compute
    };
    let balance = ((window + gpu_update) / (host + gpu_update)).min(1.0);
    offload_ratio_at(config, world, balance, |r| gpu_memory.is_none_or(|have| device_need(r) <= have))
}

/// Twin-Flow's proposal rule, whatever sets the balance (the rates above, or a cost model in
/// `zerobench plan --gpu`): the smallest ratio of whole units ([`offload_ratio_choices`]) whose
/// share of the parameters is at least `balance` and that `fits`; `None` when none does.
pub fn offload_ratio_at(config: &RunConfig, world: u32, balance: f64, fits: impl Fn(f64) -> bool) -> Option<f64> {
    offload_ratio_choices(config, world)
        .into_iter()
        .filter(|&(share, _)| share >= balance)
        .map(|(_, ratio)| ratio)
        .find(|&r| fits(r))
}

/// The offload ratios whole units can give, smallest first: the last unit on the host, the last
/// two, ..., all of them; each the shortest decimal ratio that selects exactly those units (1 for
/// all), with the share of the parameters those units hold, as (share, ratio). What Twin-Flow's
/// proposal chooses from, here and with a cost model (`zerobench plan --gpu`).
pub fn offload_ratio_choices(config: &RunConfig, world: u32) -> Vec<(f64, f64)> {
    let model = config.model.spec();
    let units: Vec<u64> =
        model.units().iter().map(|u| zerobench_schema::memory::padded_unit(u.params, u64::from(world))).collect();
    let total = units.iter().sum::<u64>() as f64;
    let share = |k: usize| units[units.len() - k..].iter().sum::<u64>() as f64 / total;
    (1..=units.len())
        .map(|k| (share(k), if k == units.len() { 1.0 } else { shortest_between(share(k - 1), share(k)) }))
        .collect()
}

/// The decimal with the fewest digits above `lo` and at most `hi` (`hi` itself if none of up to
/// six digits is).
fn shortest_between(lo: f64, hi: f64) -> f64 {
    (1..=6)
        .map(|d| {
            let scale = 10f64.powi(d);
            ((lo * scale).floor() + 1.0) / scale
        })
        .find(|&v| v <= hi)
        .unwrap_or(hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use zerobench_schema::config::{CopyEngines, EngineConfig, OptimConfig};
    use zerobench_schema::models::ModelPreset;
    use zerobench_schema::ZeroStage;

    use crate::spec::Worker;

    fn plan(text: &str) -> Result<Plan, SpecError> {
        Plan::build(Spec::parse(text, Path::new("s.yaml"))?)
    }

    #[test]
    fn ids_follow_the_grammar() {
        let p = plan(
            "cluster: {gpus_per_node: 4, gpu_memory: 80GB}\nsweep:\n  models: gpt2-xl\n  stages: 3\n  offload: [none, optimizer]\n  micro_batches: 4\n  nodes: [1, 2]\n  precision: [bf16, fp32]\n",
        )
        .unwrap();
        let ids: Vec<&str> = p.runs.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "gpt2-xl_z3_offnone_mb4_1x4",
                "gpt2-xl_z3_offnone_mb4_2x4",
                "gpt2-xl_z3_offnone_mb4_1x4_fp32",
                "gpt2-xl_z3_offnone_mb4_2x4_fp32",
                "gpt2-xl_z3_offopt_mb4_1x4",
                "gpt2-xl_z3_offopt_mb4_2x4",
                "gpt2-xl_z3_offopt_mb4_1x4_fp32",
                "gpt2-xl_z3_offopt_mb4_2x4_fp32",
            ]
        );
        assert!(p
            .runs
            .iter()
            .all(|r| r.id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')));
    }

    #[test]
    fn memory_matches_the_formulas_and_flags_what_does_not_fit() {
        let p = plan("cluster: {gpus_per_node: 4, gpu_memory: 16GiB}\nsweep:\n  models: gpt2-xl\n").unwrap();
        let psi = zerobench_schema::memory::padded_params(&zerobench_schema::ModelPreset::Gpt2Xl.spec(), 4);
        let totals: Vec<u64> = p.runs.iter().map(|r| r.model_state.total()).collect();
        assert_eq!(totals, [16 * psi, 4 * psi + 12 * psi / 4, 2 * psi + 14 * psi / 4, 16 * psi / 4]);
        // 16Ψ ≈ 25 GB does not fit 16 GiB; stage 3's 4Ψ ≈ 6 GB does.
        assert!(matches!(p.runs[0].fit, Fit::TooBig { .. }));
        assert!(p.runs[0].warnings[0].contains("more than cluster.gpu_memory"));
        assert!(matches!(p.runs[3].fit, Fit::Fits { .. }));
        assert_eq!(p.runs[0].gpus(), 4);
        // The rendering commands leave the unfit runs out (and say which).
        let mut p = p;
        let unfit: Vec<String> = p.take_unfit().into_iter().map(|r| r.id).collect();
        assert!(unfit.contains(&"gpt2-xl_z0_offnone_mb1_1x4".to_string()), "{unfit:?}");
        assert!(p.runs.iter().all(|r| !matches!(r.fit, Fit::TooBig { .. })) && !p.runs.is_empty());
    }

    /// sbatch refuses `--nodes=1 --nodelist=n[01-02,04]`: such a sweep is refused at plan time,
    /// naming the key.
    #[test]
    fn a_nodelist_larger_than_a_run_is_refused() {
        let e = plan("cluster:\n  nodelist: n[01-02,04]\nsweep:\n  models: tiny\n  nodes: [1, 3]\n").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("cluster.nodelist") && text.contains("names 3 nodes, but runs of this sweep use 1"),
            "{text}"
        );
        plan("cluster:\n  nodelist: n[01-02,04]\nsweep:\n  models: tiny\n  nodes: 3\n").unwrap();
    }

    #[test]
    fn each_run_carries_its_step_collectives() {
        let p = plan("worker: {grad_accum: 2}\nsweep:\n  models: gpt2\n  ranks_per_node: 4\n").unwrap();
        let psi = 2 * zerobench_schema::memory::padded_params(&ModelPreset::Gpt2.spec(), 4);
        let names: Vec<Vec<&str>> = p.runs.iter().map(|r| r.comm.bytes.keys().map(String::as_str).collect()).collect();
        assert_eq!(
            names,
            [
                vec!["all_reduce"],
                vec!["all_gather", "reduce_scatter"],
                vec!["all_gather", "reduce_scatter"],
                vec!["all_gather", "reduce_scatter"]
            ]
        );
        assert_eq!(p.runs[2].comm.bytes["reduce_scatter"], 2 * psi);
        // Stage 0 sends 2(n-1)/n of the gradients; stages 1 and 2 (accumulating in stage 1) the same
        // once per step; stage 2 reduce-scatters each micro-step.
        assert_eq!(p.runs[0].comm.wire_bytes, psi * 3 / 2);
        assert_eq!(p.runs[1].comm.wire_bytes, psi * 3 / 2);
        assert_eq!(p.runs[2].comm.wire_bytes, psi * 3 / 4 * 3);
        assert!(p.runs[3].comm.wire_bytes > p.runs[2].comm.wire_bytes);
        // At 100 GB/s, stage 0's all-reduce takes its wire bytes over 10^11 bytes/s.
        let t = p.runs[0].comm_seconds(100.0, 1.0);
        assert!((t - (psi * 3 / 2) as f64 / 1e11).abs() < 1e-12, "{t}");
    }

    #[test]
    fn runs_over_nodes_use_the_inter_node_bandwidth_but_hpz_groups_do_not() {
        let p = plan(
            "cluster: {gpus_per_node: 4}\nworker: {hpz: 4}\nsweep:\n  models: gpt2\n  stages: 3\n  nodes: [1, 2]\n",
        )
        .unwrap();
        let (one, two) = (&p.runs[0], &p.runs[1]);
        assert_eq!(one.comm_seconds(100.0, 10.0), one.comm_seconds(100.0, 100.0));
        let fast = two.comm_seconds(100.0, 100.0);
        let slow = two.comm_seconds(100.0, 10.0);
        let group = two.comm.bytes["all_gather_group"] as f64 * 0.75 / 1e11;
        // Only the world's collectives slow down tenfold.
        assert!(((slow - group) - 10.0 * (fast - group)).abs() < 1e-9, "{fast} {slow} {group}");
    }

    /// `offload_ratio` multiplies the offloaded runs only, names them in the id, splits their
    /// states by whole units, and a bad value is an error at its key.
    #[test]
    fn offload_ratio_is_an_axis_of_the_offloaded_runs() {
        let p =
            plan("sweep:\n  models: gpt2-xl\n  stages: 2\n  offload: [none, optimizer]\n  offload_ratio: [1, 0.5]\n")
                .unwrap();
        let ids: Vec<&str> = p.runs.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(
            ids,
            ["gpt2-xl_z2_offnone_mb1_1x1", "gpt2-xl_z2_offopt_r1_mb1_1x1", "gpt2-xl_z2_offopt_r0p5_mb1_1x1"]
        );
        let spec = ModelPreset::Gpt2Xl.spec();
        let psi = zerobench_schema::memory::padded_params(&spec, 1);
        let host = zerobench_schema::memory::host_params(&spec, 1, 0.5);
        assert!(host >= psi / 2 && host < psi, "{host} of {psi}");
        // bf16, one rank: all on the host, 16 bytes an element there; at 0.5 the device keeps
        // 12 (optimizer) + 2 (gradient) bytes of each element the host does not.
        assert_eq!(p.runs[1].host_state_bytes, 16 * psi);
        assert_eq!(p.runs[2].host_state_bytes, 16 * host);
        assert_eq!(p.runs[2].device_state_bytes, p.runs[1].device_state_bytes + 14 * (psi - host));
        assert_eq!(p.runs[2].config.offload_ratio, Some(0.5));
        for bad in ["0", "1.5", "-1", ".nan"] {
            let e =
                plan(&format!("sweep:\n  models: tiny\n  stages: 2\n  offload: optimizer\n  offload_ratio: [{bad}]\n"))
                    .unwrap_err()
                    .to_string();
            assert!(e.contains("sweep.offload_ratio") && e.contains("--offload-ratio"), "{bad}: {e}");
        }
    }

    /// `worker.delayed_update_after` applies to the offloaded runs; its refusals point at it.
    #[test]
    fn the_delayed_update_applies_to_offloaded_runs() {
        let p = plan(
            "worker: {delayed_update_after: 4}\nsweep:\n  models: tiny\n  stages: 2\n  offload: [none, optimizer]\n",
        )
        .unwrap();
        let delayed: Vec<Option<u32>> = p.runs.iter().map(|r| r.config.delayed_update_after).collect();
        assert_eq!(delayed, [None, Some(4)]);
        assert!(p.runs[1].config.to_worker_args().windows(2).any(|w| w == ["--delayed-update-after", "4"]));
        let e = plan("worker: {delayed_update_after: 4}\nsweep:\n  models: tiny\n  stages: 2\n  offload: optimizer\n  precision: fp16\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("worker.delayed_update_after") && e.contains("--delayed-update"), "{e}");
    }

    /// For GPU runs with offload the plan proposes the ratio that balances the host's update
    /// against the GPU's work, rounded up to whole units, raised until the GPU share fits.
    #[test]
    fn the_proposed_offload_ratio_balances_and_fits() {
        let spec_text = |mem: &str| {
            format!("cluster: {{gpus_per_node: 1{mem}}}\nsweep:\n  models: gpt2-xl\n  stages: 2\n  offload: [none, optimizer]\n  micro_batches: 4\n")
        };
        let p = plan(&spec_text("")).unwrap();
        assert_eq!(p.runs[0].proposed_offload_ratio, None, "no offload, no ratio");
        let free = p.runs[1].proposed_offload_ratio.expect("a GPU offload run gets a proposal");
        // bf16: 2-byte parameters copied each way; 4096 tokens of 1.03e10 FLOP.
        let model = ModelPreset::Gpt2Xl.spec();
        let psi = zerobench_schema::memory::padded_params(&model, 1) as f64;
        let balance = balance_by_hand(&p.runs[1].config, 1, 1.0, 2.0, 4096.0);
        assert!(balance > 0.1 && balance < 1.0, "{balance}");
        // The run it proposes holds at least the balance on the host, rounded up to whole units:
        // by less than one block (1/49 of gpt2-xl). The ratio is the shortest decimal that takes
        // those units, so it may itself lie below the balance.
        let host = zerobench_schema::memory::host_params(&model, 1, free) as f64 / psi;
        assert!(host >= balance && host < balance + 1.0 / 40.0, "{free} takes {host} against {balance}");
        assert!(free <= host && free > host - 1.0 / 40.0, "{free} against {host}");
        // A small GPU raises it until the GPU share fits; a tiny one gets no proposal.
        let tight = plan(&spec_text(", gpu_memory: 8GiB")).unwrap();
        let raised = tight.runs[1].proposed_offload_ratio.expect("fits with more on the host");
        assert!(raised > free, "{raised} vs {free}");
        let none = plan(&spec_text(", gpu_memory: 1GiB")).unwrap();
        assert_eq!(none.runs[1].proposed_offload_ratio, None);
        // CPU clusters get none.
        assert_eq!(
            plan("sweep:\n  models: tiny\n  stages: 2\n  offload: optimizer\n").unwrap().runs[0].proposed_offload_ratio,
            None
        );
    }

    #[test]
    fn offload_moves_states_to_the_host_impossible_offload_is_an_error() {
        let p = plan("sweep:\n  models: tiny\n  stages: [1, 3]\n  offload: optimizer\n").unwrap();
        assert!(p.runs[0].warnings.is_empty(), "{:?}", p.runs[0].warnings);
        let psi = zerobench_schema::memory::padded_params(&zerobench_schema::ModelPreset::Tiny.spec(), 1);
        // Stage 1 with optimizer offload: bf16 parameters and gradients on the device; fp32
        // master, Adam moments, the gradient shard and the bf16 copy on the host.
        assert_eq!(p.runs[0].device_state_bytes, 4 * psi);
        assert_eq!(p.runs[0].host_state_bytes, 16 * psi);
        assert_eq!(p.runs[1].device_state_bytes, 2 * psi);
        let e = plan("sweep:\n  models: tiny\n  stages: [0, 1]\n  offload: optimizer\n").unwrap_err().to_string();
        assert!(e.starts_with("s.yaml:4:3: sweep.offload: run tiny_z0_offopt_mb1_1x1: invalid --offload: optimizer offload needs ZeRO stage"), "{e}");
        let e = plan("sweep:\n  models: tiny\n  stages: 2\n  offload: optimizer+params\n").unwrap_err().to_string();
        assert!(e.contains("needs ZeRO stage 3"), "{e}");
        // Rules after the offload check still apply to offloaded runs.
        let e = plan("worker: {lr: -1}\nsweep:\n  models: tiny\n  stages: 1\n  offload: optimizer\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s.yaml:1:10: worker.lr:"), "{e}");
    }

    #[test]
    fn shortest_between_takes_the_fewest_digits_inside_the_interval() {
        assert_eq!(shortest_between(0.123, 0.2), 0.2);
        assert_eq!(shortest_between(0.2449, 0.2456), 0.245);
        assert_eq!(shortest_between(0.0, 0.031), 0.01);
        // None of up to six digits lies inside: the upper end itself.
        assert_eq!(shortest_between(0.12345671, 0.12345672), 0.12345672);
    }

    /// The share of a rank's partition whose host update takes as long as the GPU's window, by hand
    /// (the rates of `propose_offload_ratio`'s doc, written out): per parameter the host spends
    /// 28 B / 158 GB/s on AdamW for each of the node's `ranks` and copies `param_bytes` each way at
    /// 54 GB/s, the GPU 28 B / 3.48 TB/s on its AdamW; the rank computes `tokens` at 4.7e14 FLOP/s,
    /// of which the window is all with the delayed update and the backward's two thirds in exact
    /// steps.
    fn balance_by_hand(config: &RunConfig, world: u32, ranks: f64, param_bytes: f64, tokens: f64) -> f64 {
        let part =
            zerobench_schema::memory::padded_params(&config.model.spec(), u64::from(world)) as f64 / f64::from(world);
        let (h, g) = (part * (ranks * 28.0 / 158e9 + 2.0 * param_bytes / 54e9), part * 28.0 / 3.48e12);
        let c = tokens * config.train_flops_per_token() / 4.7e14;
        let window = if config.delayed_update_after.is_some() { c } else { c * 2.0 / 3.0 };
        (window + g) / (h + g)
    }

    /// Exact steps wait for the host's units in the next forward, so their proposal balances the
    /// host against the backward only and puts less on the host than the delayed update's, which
    /// balances it against the whole compute. On gpt2-xl (one GPU, bf16) they are the ratios
    /// measured near the bound: about 0.18 exact, 0.24 delayed.
    #[test]
    fn exact_steps_get_a_smaller_ratio_than_the_delayed_update() {
        let spec = |worker: &str| {
            format!("{worker}cluster: {{gpus_per_node: 1}}\nsweep:\n  models: gpt2-xl\n  stages: 2\n  offload: optimizer\n  micro_batches: 4\n")
        };
        let exact = plan(&spec("")).unwrap();
        let delayed = plan(&spec("worker: {delayed_update_after: 4}\n")).unwrap();
        let model = ModelPreset::Gpt2Xl.spec();
        let psi = zerobench_schema::memory::padded_params(&model, 1) as f64;
        let mut shares = Vec::new();
        for p in [&exact, &delayed] {
            let r = &p.runs[0];
            let ratio = r.proposed_offload_ratio.expect("a proposal");
            let balance = balance_by_hand(&r.config, 1, 1.0, 2.0, 4096.0);
            let host = zerobench_schema::memory::host_params(&model, 1, ratio) as f64 / psi;
            assert!(host >= balance && host < balance + 1.0 / 40.0, "{ratio} takes {host} against {balance}");
            shares.push(ratio);
        }
        assert!(shares[0] > 0.15 && shares[0] < 0.2 && shares[1] > 0.22 && shares[1] < 0.27, "{shares:?}");
    }

    /// The proposal on two GPUs in fp32 (world and precision enter the rates): the units it puts
    /// on the host hold at least the balance, one unit fewer would not, and it is the shortest
    /// decimal that selects them.
    #[test]
    fn the_proposed_offload_ratio_is_the_smallest_share_of_units_past_the_balance() {
        let p = plan("cluster: {gpus_per_node: 2}\nsweep:\n  models: gpt2-xl\n  stages: 2\n  offload: optimizer\n  micro_batches: 4\n  ranks_per_node: 2\n  precision: fp32\n").unwrap();
        let r = &p.runs[0];
        let ratio = r.proposed_offload_ratio.expect("a proposal");
        let model = ModelPreset::Gpt2Xl.spec();
        let psi = zerobench_schema::memory::padded_params(&model, 2) as f64;
        // fp32: 4-byte parameters copied each way; 4 × 1024 tokens per rank.
        // Both ranks of the node update on its cores: the host's AdamW counts twice.
        let balance = balance_by_hand(&r.config, 2, 2.0, 4.0, 4.0 * 1024.0);
        let units: Vec<f64> =
            model.units().iter().map(|u| zerobench_schema::memory::padded_unit(u.params, 2) as f64 / psi).collect();
        let host = zerobench_schema::memory::host_params(&model, 2, ratio) as f64 / psi;
        // The earliest unit it takes is the one whose share, added last, crossed the balance.
        let mut taken = 0.0;
        let first = units.iter().rev().find(|&&u| {
            taken += u;
            taken >= host - 1e-12
        });
        let first = *first.expect("the host share is a sum of units");
        assert!(host >= balance && host - first < balance, "{ratio}: host {host}, balance {balance}");
        // Two decimals always fit between two sums of units that differ by a block (1/49).
        assert!(((ratio * 100.0).round() - ratio * 100.0).abs() < 1e-9, "{ratio}");
    }

    /// On a cluster without GPUs, `gpu_memory` says nothing about a run's fit.
    #[test]
    fn gpu_memory_without_gpus_leaves_the_fit_unknown() {
        let p = plan("cluster: {gpu_memory: 1GiB}\nsweep:\n  models: gpt2-xl\n  stages: 0\n").unwrap();
        assert_eq!(p.runs[0].fit, Fit::Unknown);
        let p =
            plan("cluster: {gpus_per_node: 1, gpu_memory: 1GiB}\nsweep:\n  models: gpt2-xl\n  stages: 0\n").unwrap();
        assert!(matches!(p.runs[0].fit, Fit::TooBig { .. }), "{:?}", p.runs[0].fit);
    }

    #[test]
    fn offloaded_states_beyond_cluster_mem_are_flagged() {
        let yaml = |mem: &str| {
            format!("cluster: {{gpus_per_node: 2, mem: {mem}}}\nsweep:\n  models: t5-11b\n  stages: 3\n  offload: optimizer\n  ranks_per_node: 2\n")
        };
        let p = plan(&yaml("64GiB")).unwrap();
        let r = &p.runs[0];
        let need = r.host_state_bytes * 2;
        assert!(need > 64 << 30, "{need}");
        assert!(
            r.warnings.iter().any(|w| w.contains("more than cluster.mem 64.00 GiB") && w.contains("(2 ranks)")),
            "{:?}",
            r.warnings
        );
        // The need is every rank's states on the node: the warning says how much.
        let said = crate::values::human_bytes(need);
        assert!(r.warnings.iter().any(|w| w.contains(&format!("need {said} of host memory"))), "{:?}", r.warnings);
        // Exactly enough is enough.
        let p = plan(&yaml(&format!("{need}B"))).unwrap();
        assert!(p.runs[0].warnings.iter().all(|w| !w.contains("cluster.mem")), "{:?}", p.runs[0].warnings);
        let p = plan(&yaml(&format!("{}B", need - 1))).unwrap();
        assert!(p.runs[0].warnings.iter().any(|w| w.contains("cluster.mem")), "{:?}", p.runs[0].warnings);
        let p = plan(&yaml("512GiB")).unwrap();
        assert!(p.runs[0].warnings.iter().all(|w| !w.contains("cluster.mem")), "{:?}", p.runs[0].warnings);
        // Per CPU: 2 ranks × 8 CPUs × 4 GiB = 64 GiB, too little; × 32 GiB = 512 GiB is enough.
        let per_cpu = |m: &str| {
            format!("cluster: {{gpus_per_node: 2, cpus_per_task: 8, mem_per_cpu: {m}}}\nsweep:\n  models: t5-11b\n  stages: 3\n  offload: optimizer\n  ranks_per_node: 2\n")
        };
        let p = plan(&per_cpu("4GiB")).unwrap();
        assert!(
            p.runs[0].warnings.iter().any(|w| w.contains("more than cluster.mem_per_cpu × 16 CPUs 64.00 GiB")),
            "{:?}",
            p.runs[0].warnings
        );
        assert!(plan(&per_cpu("32GiB")).unwrap().runs[0].warnings.iter().all(|w| !w.contains("mem_per_cpu")));
        let e = plan("cluster: {mem: 1GiB, mem_per_cpu: 1GiB}\nsweep: {models: tiny}\n").unwrap_err().to_string();
        assert!(e.contains("cluster.mem_per_cpu: Slurm takes --mem or --mem-per-cpu, not both"), "{e}");
    }

    #[test]
    fn target_len_reaches_t5_runs_only() {
        let p = plan("worker: {seq_len: 64, target_len: 16}\nsweep:\n  models: [tiny-t5, tiny]\n").unwrap();
        let by_model = |m: ModelPreset| p.runs.iter().find(|r| r.config.model == m).expect("run");
        assert_eq!(by_model(ModelPreset::TinyT5).config.target_len, Some(16));
        assert!(by_model(ModelPreset::TinyT5).config.to_worker_args().join(" ").contains("--target-len 16"));
        assert_eq!(by_model(ModelPreset::Tiny).config.target_len, None);
        let e = plan("worker: {target_len: 0}\nsweep:\n  models: tiny-t5\n").unwrap_err().to_string();
        assert!(e.contains("worker.target_len"), "{e}");
    }

    #[test]
    fn copy_engines_reach_single_host_runs_only() {
        let p = plan(
            "cluster: {gpus_per_node: 2}\nworker: {copy_engines: all-gather}\nsweep:\n  models: tiny\n  stages: 3\n",
        )
        .unwrap();
        assert!(p.runs[0].config.to_worker_args().join(" ").ends_with("--copy-engines all-gather"));
        let e =
            plan("cluster: {gpus_per_node: 2}\nworker: {copy_engines: all}\nsweep:\n  models: tiny\n  nodes: [1, 2]\n")
                .unwrap_err()
                .to_string();
        assert!(e.starts_with("s.yaml:2:10: worker.copy_engines: run tiny_z0_offnone_mb1_2x2: copy engines"), "{e}");
        let e = plan("worker: {copy_engines: some}\nsweep:\n  models: tiny\n").unwrap_err().to_string();
        assert!(e.contains("copy_engines") && e.contains("all-gather"), "{e}");
    }

    #[test]
    fn worker_rules_are_placed_at_their_keys() {
        let e = plan("worker:\n  steps: 5\n  warmup: 5\nsweep:\n  models: tiny\n").unwrap_err().to_string();
        assert!(e.starts_with("s.yaml:3:3: worker.warmup: run tiny_z0_offnone_mb1_1x1"), "{e}");
        let e = plan("sweep:\n  - models: tiny\n    stages: 1\n  - models: [gpt2, tiny]\n    stages: 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sweep[1]: run tiny_z1_offnone_mb1_1x1 is also produced by sweep block 0"), "{e}");
        let e = plan("worker: {seq_len: 4096}\nsweep:\n  models: gpt2\n").unwrap_err().to_string();
        assert!(e.contains("worker.seq_len"), "{e}");
        let list = (1..=50).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
        let e = plan(&format!(
            "sweep:\n  models: tiny\n  micro_batches: [{list}]\n  nodes: [{list}]\n  ranks_per_node: [{list}]\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("more than 100000 runs"), "{e}");
        // Exactly the limit is allowed: 50 × 50 × 40 runs.
        let forty = (1..=40).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
        let p = plan(&format!(
            "sweep:\n  models: tiny\n  stages: 0\n  micro_batches: [{list}]\n  nodes: [{list}]\n  ranks_per_node: [{forty}]\n"
        ))
        .unwrap();
        assert_eq!(p.runs.len(), MAX_RUNS);
    }

    /// Every worker key is one of `RunConfig`'s fields, and a spec setting every one of them away
    /// from its default gets exactly that configuration; a key this test leaves at its default
    /// fails it, so a new knob cannot miss the spec. Unknown keys, sweep axes and values of the
    /// wrong type are refused at their key.
    #[test]
    fn every_worker_key_reaches_the_run() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("text.txt"), "some text").unwrap();
        let base = RunConfig { offload: Offload::Optimizer, ..RunConfig::new(ModelPreset::TinyT5, ZeroStage::Z3) };
        let want = RunConfig {
            seq_len: 64,
            target_len: Some(20),
            grad_accum: 2,
            steps: 7,
            warmup: 1,
            seed: 9,
            data: Some(d.path().join("text.txt")),
            eval_every: Some(5),
            device: zerobench_schema::DeviceRequest::Cpu,
            optim: OptimConfig { lr: 1.5e-4, beta1: 0.8, beta2: 0.99, eps: 1e-6, weight_decay: 0.0 },
            engine: EngineConfig {
                bucket_mb: 12.5,
                prefetch: 2,
                loss_scale_power: 8,
                hpz: Some(1),
                comm_ctas: Some(8),
                copy_engines: None,
            },
            ..base.clone()
        };
        // Three keys are checked on their own: `copy_engines` and `cuda_graph` need a GPU device
        // (below; `cuda_graph` rules out offload too), and `delayed_update_after`
        // rules out `grad_accum` above 1 (its own test above).
        let elsewhere = ["copy_engines", "cuda_graph", "delayed_update_after"];
        let (mut spec_lines, mut walked) = (String::new(), Vec::new());
        let (wanted, unchanged) = (serde_json::to_value(&want).unwrap(), serde_json::to_value(&base).unwrap());
        for key in Worker::keys() {
            let at = |v: &serde_json::Value| {
                v.get(key).or_else(|| v["optim"].get(key)).or_else(|| v["engine"].get(key)).cloned()
            };
            if elsewhere.contains(&key) {
                continue;
            }
            let value = at(&wanted).unwrap_or_else(|| panic!("the test leaves `{key}` unset"));
            assert_ne!(Some(&value), at(&unchanged).as_ref(), "the test leaves `{key}` at its default");
            let text = if key == "data" { "text.txt".to_string() } else { value.to_string() };
            spec_lines.push_str(&format!("  {key}: {text}\n"));
            walked.push(key);
        }
        assert!(walked.len() >= 17, "{walked:?}");
        let text = format!("worker:\n{spec_lines}sweep:\n  models: tiny-t5\n  stages: 3\n  offload: optimizer\n");
        let p = Plan::build(Spec::parse(&text, &d.path().join("s.yaml")).unwrap()).unwrap();
        assert_eq!(p.runs[0].config, want);
        let p = plan("worker: {copy_engines: all}\nsweep:\n  models: tiny\n").unwrap();
        assert_eq!(p.runs[0].config.engine.copy_engines, Some(CopyEngines::All));
        // One GPU replays any stage (stage 3 keeps its parameters whole there), not offload.
        let p = plan("worker: {cuda_graph: true, warmup: 2}\nsweep:\n  models: tiny\n  stages: [0, 2, 3]\n").unwrap();
        assert!(p
            .runs
            .iter()
            .all(|r| r.config.cuda_graph && r.config.to_worker_args().contains(&"--cuda-graph".into())));
        let e = plan("worker: {cuda_graph: true}\nsweep:\n  models: tiny\n  stages: 3\n  offload: optimizer+params\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("worker.cuda_graph") && e.contains("--offload"), "{e}");

        let e = plan("worker:\n  steps: 3\n  stepz: 4\nsweep:\n  models: tiny\n").unwrap_err().to_string();
        assert!(
            e.starts_with(
                "s.yaml:3:3: worker.stepz: unknown key `stepz`, expected one of delayed_update_after, seq_len,"
            ),
            "{e}"
        );
        assert!(e.contains("weight_decay") && e.contains("copy_engines") && !e.contains("micro_batch"), "{e}");
        let e = plan("worker:\n  micro_batch: 4\nsweep:\n  models: tiny\n").unwrap_err().to_string();
        assert!(e.starts_with("s.yaml:2:3: worker.micro_batch: is a sweep axis") && e.contains("micro_batches"), "{e}");
        let e = plan("worker:\n  seed: 1\n  lr: fast\nsweep:\n  models: tiny\n").unwrap_err().to_string();
        assert!(e.starts_with("s.yaml:3:3: worker.lr: invalid type: string \"fast\", expected f64"), "{e}");
        let e = plan("worker:\n  steps: -2\nsweep:\n  models: tiny\n").unwrap_err().to_string();
        assert!(e.starts_with("s.yaml:2:3: worker.steps:"), "{e}");
        let e = plan("worker:\n  data: 5\nsweep:\n  models: tiny\n").unwrap_err().to_string();
        assert!(e.starts_with("s.yaml:2:3: worker.data:"), "{e}");
    }

    /// Gradient accumulation, hpZ, prefetch and bucket size can be sweep axes: every combination
    /// is a run, named by the values; a value the worker refuses is refused at its sweep key, and
    /// an axis the worker block also fixes is refused.
    #[test]
    fn engine_settings_are_sweep_axes() {
        let p = plan(
            "cluster: {gpus_per_node: 4}\nsweep:\n  models: tiny\n  stages: 3\n  gpus_per_node: 4\n  grad_accum: [1, 8]\n  hpz: [2, 4]\n  bucket_mb: 12.5\n",
        )
        .unwrap();
        let ids: Vec<&str> = p.runs.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "tiny_z3_offnone_mb1_1x4_ga1_hpz2_bk12p5",
                "tiny_z3_offnone_mb1_1x4_ga1_hpz4_bk12p5",
                "tiny_z3_offnone_mb1_1x4_ga8_hpz2_bk12p5",
                "tiny_z3_offnone_mb1_1x4_ga8_hpz4_bk12p5",
            ]
        );
        let r = &p.runs[2];
        assert_eq!((r.config.grad_accum, r.config.engine.hpz, r.config.engine.bucket_mb), (8, Some(2), 12.5));
        assert!(r.config.to_worker_args().join(" ").contains("--grad-accum 8"));
        // Without these axes the ids are as before.
        assert_eq!(plan("sweep: {models: tiny, stages: 0}\n").unwrap().runs[0].id, "tiny_z0_offnone_mb1_1x1");

        let e = plan(
            "cluster: {gpus_per_node: 4}\nsweep:\n  models: tiny\n  stages: 3\n  gpus_per_node: 4\n  hpz: [2, 3]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("s.yaml:6:3: sweep.hpz: run tiny_z3_offnone_mb1_1x4_hpz3: invalid --hpz"), "{e}");
        let e = plan("sweep:\n  models: tiny\n  prefetch: [1, 1]\n").unwrap_err().to_string();
        assert!(e.contains("sweep.prefetch[1]: 1 is listed twice"), "{e}");
        let e =
            plan("worker: {grad_accum: 2}\nsweep:\n  models: tiny\n  grad_accum: [1, 2]\n").unwrap_err().to_string();
        assert!(e.contains("sweep.grad_accum: worker.grad_accum fixes it for every run"), "{e}");
        let e = plan("sweep:\n  models: tiny\n  bucket_mb: [-1]\n").unwrap_err().to_string();
        assert!(e.contains("sweep.bucket_mb") && e.contains("--bucket-mb"), "{e}");
    }

    /// `trace` and `profile_step` in the worker block reach every run's worker argv; they are not
    /// part of the run's configuration.
    #[test]
    fn trace_and_profile_step_reach_the_worker() {
        let p =
            plan("worker: {trace: true, profile_step: 3, steps: 5}\nsweep:\n  models: tiny\n  stages: 0\n").unwrap();
        assert_eq!(p.spec.worker.observe_args(), ["--trace", "--profile-step", "3"]);
        let files = crate::render::render_run(&p, &p.runs[0], Path::new("/r")).unwrap();
        let argv = files.record.worker_argv.join(" ");
        assert!(argv.contains("--steps 5") && argv.contains("--trace --profile-step 3 --log-dir"), "{argv}");
        assert_eq!(p.runs[0].id, "tiny_z0_offnone_mb1_1x1");
        let e = plan("worker: {profile_step: soon}\nsweep: {models: tiny}\n").unwrap_err().to_string();
        assert!(e.starts_with("s.yaml:1:24: worker.profile_step: must be a whole number"), "{e}");
        assert!(plan("worker: {steps: 3}\nsweep: {models: tiny}\n").unwrap().spec.worker.observe_args().is_empty());
    }

    /// Nodes × ranks per node past what a run can have was a wrapping product (4294967295 ×
    /// 4294967295 planned as 1 rank): refused at the block's nodes, naming both.
    #[test]
    fn a_world_size_past_u32_is_refused() {
        let e = plan("sweep:\n  models: tiny\n  nodes: 4294967295\n  ranks_per_node: 4294967295\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sweep.nodes") && e.contains("4294967295 nodes × 4294967295 ranks per node"), "{e}");
        let e = plan("sweep:\n  models: tiny\n  nodes: 65536\n  ranks_per_node: 65536\n").unwrap_err().to_string();
        assert!(e.contains("more ranks than a run can have"), "{e}");
    }

    /// A run id past what a file name takes (a knob value spelled out in full) is refused at the
    /// sweep, naming its length, instead of failing at render without a place.
    #[test]
    fn a_run_id_too_long_for_a_file_name_is_refused() {
        let e = plan("sweep:\n  models: tiny\n  bucket_mb: [1e-300]\n").unwrap_err().to_string();
        assert!(e.contains(": sweep: run tiny_z") && e.contains("characters, more than 200"), "{e}");
        assert!(plan("sweep:\n  models: tiny\n  bucket_mb: [0.5]\n").is_ok());
    }
}
